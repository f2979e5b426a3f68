/* Row-wise log-sum-exp with exp/log and a max pass: a smooth cost with float math. */
#include <math.h>

double logsumexp_rows(int n, int m, const double x[n][m], double rowmax[n])
{
  double total = 0.0;
  for (int i = 0; i < n; i++) {
    rowmax[i] = x[i][0];
    for (int j = 1; j < m; j++)
      rowmax[i] = fmax(rowmax[i], x[i][j]);
  }
  for (int i = 0; i < n; i++) {
    double s = 0.0;
    for (int j = 0; j < m; j++)
      s += exp(x[i][j] - rowmax[i]);
    total += log(s) + rowmax[i];
  }
  return total;
}
