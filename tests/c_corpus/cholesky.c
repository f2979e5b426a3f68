/* cholesky (PolyBench/C 4.2 linear-algebra/solvers): in place, lower triangle. */
#include <math.h>

void kernel_cholesky(int n, double A[n][n])
{
  int i, j, k;
  for (i = 0; i < n; i++) {
    for (j = 0; j < i; j++) {
      for (k = 0; k < j; k++)
        A[i][j] -= A[i][k] * A[j][k];
      A[i][j] /= A[j][j];
    }
    for (k = 0; k < i; k++)
      A[i][i] -= A[i][k] * A[i][k];
    A[i][i] = sqrt(A[i][i]);
  }
}
