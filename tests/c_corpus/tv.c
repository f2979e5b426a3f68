/* The TV cost of DESIGN section 1, written in C (clamped borders by min/max helpers). */
#include <math.h>

static inline long imax(long a, long b) { return a > b ? a : b; }
static inline long imin(long a, long b) { return a < b ? a : b; }

double tv_cost(long M, long N, const double g[M][N], const double b[M][N], double lam)
{
  double C = 0.0;
  for (long m = 0; m < M; m++)
    for (long n = 0; n < N; n++) {
      C += (g[m][n] - b[m][n]) * (g[m][n] - b[m][n]);
      C += lam * fabs(g[m][imin(imax(n - 1, 0), N - 1)] - g[m][n]);
      C += lam * fabs(g[imin(imax(m - 1, 0), M - 1)][n] - g[m][n]);
    }
  return C;
}
