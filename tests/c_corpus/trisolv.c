/* trisolv (PolyBench/C 4.2 linear-algebra/solvers): forward substitution L x = b. */
void kernel_trisolv(int n, double L[n][n], double x[n], double b[n])
{
  int i, j;
  for (i = 0; i < n; i++) {
    x[i] = b[i];
    for (j = 0; j < i; j++)
      x[i] -= L[i][j] * x[j];
    x[i] = x[i] / L[i][i];
  }
}

double cost_trisolv(int n, double L[n][n], double x[n], double b[n])
{
  kernel_trisolv(n, L, x, b);
  double s = 0.0;
  for (int i = 0; i < n; i++)
    s += x[i] * x[i];
  return s;
}
