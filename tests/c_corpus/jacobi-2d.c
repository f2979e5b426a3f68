/* jacobi-2d in PolyBench's macro style: N and TSTEPS are #defines (polyad keeps them
   symbolic with sizes={"N": "n", "TSTEPS": "tsteps"}). */
#ifndef N
#define N 64
#endif
#ifndef TSTEPS
#define TSTEPS 10
#endif

void kernel_jacobi_2d(double A[N][N], double B[N][N])
{
  int t, i, j;
  for (t = 0; t < TSTEPS; t++) {
    for (i = 1; i < N - 1; i++)
      for (j = 1; j < N - 1; j++)
        B[i][j] = 0.2 * (A[i][j] + A[i][j - 1] + A[i][1 + j] + A[1 + i][j] + A[i - 1][j]);
    for (i = 1; i < N - 1; i++)
      for (j = 1; j < N - 1; j++)
        A[i][j] = 0.2 * (B[i][j] + B[i][j - 1] + B[i][1 + j] + B[1 + i][j] + B[i - 1][j]);
  }
}

double cost_jacobi_2d(double A[N][N], double B[N][N])
{
  kernel_jacobi_2d(A, B);
  double s = 0.0;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      s += A[i][j] * A[i][j];
  return s;
}
