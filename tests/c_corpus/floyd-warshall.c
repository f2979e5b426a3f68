/* floyd-warshall (PolyBench/C 4.2 medley), on double path lengths. */
void kernel_floyd_warshall(int n, double path[n][n])
{
  int i, j, k;
  for (k = 0; k < n; k++)
    for (i = 0; i < n; i++)
      for (j = 0; j < n; j++)
        path[i][j] = path[i][j] < path[i][k] + path[k][j] ? path[i][j] : path[i][k] + path[k][j];
}
