/* jacobi-1d (PolyBench/C 4.2 stencils): tsteps is an int parameter, n a size. */
void kernel_jacobi_1d(int tsteps, int n, double A[n], double B[n])
{
  int t, i;
  for (t = 0; t < tsteps; t++) {
    for (i = 1; i < n - 1; i++)
      B[i] = 0.33333 * (A[i - 1] + A[i] + A[i + 1]);
    for (i = 1; i < n - 1; i++)
      A[i] = 0.33333 * (B[i - 1] + B[i] + B[i + 1]);
  }
}

double cost_jacobi_1d(int tsteps, int n, double A[n], double B[n])
{
  kernel_jacobi_1d(tsteps, n, A, B);
  double s = 0.0;
  for (int i = 0; i < n; i++)
    s += A[i] * A[i] + 0.5 * B[i];
  return s;
}
