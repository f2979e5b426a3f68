/* Hand-written reverse-mode derivatives (vector-Jacobian products) of three PolyBench
   kernels with respect to an input, written for benchmarks/polybench.py: the sequential
   C a careful engineer writes for the cotangent of the input from the cotangents of the
   outputs (the 'bar' arrays), with the primal arrays as they were before the kernel ran. */

/* gemm (C = alpha A B + beta C), cotangent of A: A_bar = alpha C_bar B^T. */
void vjp_gemm_A(int ni, int nj, int nk, double alpha, double C_bar[ni][nj],
                double B[nk][nj], double A_bar[ni][nk])
{
  int i, j, k;
  for (i = 0; i < ni; i++)
    for (k = 0; k < nk; k++) {
      double s = 0.0;
      for (j = 0; j < nj; j++)
        s += C_bar[i][j] * B[k][j];
      A_bar[i][k] = alpha * s;
    }
}

/* mvt (x1 += A y1, x2 += A^T y2), cotangent of A: x1_bar y1^T + y2 x2_bar^T. */
void vjp_mvt_A(int n, double y_1[n], double y_2[n], double x1_bar[n], double x2_bar[n],
               double A_bar[n][n])
{
  int i, j;
  for (i = 0; i < n; i++)
    for (j = 0; j < n; j++)
      A_bar[i][j] = x1_bar[i] * y_1[j] + y_2[i] * x2_bar[j];
}

/* jacobi-2d (tsteps sweeps B = 0.2 * 5-point(A) then A = 0.2 * 5-point(B) on the interior),
   cotangent of the initial A from the cotangents of the final A and B: the sweeps are
   linear, so the adjoint runs the transposed sweeps in reverse order, in place on the
   cotangent arrays (A_bar enters as the final A's cotangent and leaves as the result). */
void vjp_jacobi_2d_A(int tsteps, int n, double A_bar[n][n], double B_bar[n][n])
{
  int t, i, j;
  for (t = tsteps - 1; t >= 0; t--) {
    for (i = 1; i < n - 1; i++)
      for (j = 1; j < n - 1; j++) {
        double g = 0.2 * A_bar[i][j];
        A_bar[i][j] = 0.0;
        B_bar[i][j] += g;
        B_bar[i][j - 1] += g;
        B_bar[i][j + 1] += g;
        B_bar[i + 1][j] += g;
        B_bar[i - 1][j] += g;
      }
    for (i = 1; i < n - 1; i++)
      for (j = 1; j < n - 1; j++) {
        double g = 0.2 * B_bar[i][j];
        B_bar[i][j] = 0.0;
        A_bar[i][j] += g;
        A_bar[i][j - 1] += g;
        A_bar[i][j + 1] += g;
        A_bar[i + 1][j] += g;
        A_bar[i - 1][j] += g;
      }
  }
}
