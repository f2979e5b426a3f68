/* atax: y = A^T (A x) (PolyBench/C 4.2 linear-algebra/kernels). */
void kernel_atax(int m, int n, double A[m][n], double x[n], double y[n], double tmp[m])
{
  int i, j;
  for (i = 0; i < n; i++)
    y[i] = 0;
  for (i = 0; i < m; i++) {
    tmp[i] = 0.0;
    for (j = 0; j < n; j++)
      tmp[i] = tmp[i] + A[i][j] * x[j];
    for (j = 0; j < n; j++)
      y[j] = y[j] + A[i][j] * tmp[i];
  }
}

/* a scalar cost on atax, for gradients */
double cost_atax(int m, int n, double A[m][n], double x[n], double y[n], double tmp[m])
{
  kernel_atax(m, n, A, x, y, tmp);
  double s = 0.0;
  for (int i = 0; i < n; i++)
    s += y[i] * y[i];
  return s;
}
