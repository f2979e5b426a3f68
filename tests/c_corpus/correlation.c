/* correlation (PolyBench/C 4.2 datamining), with sqrt and a guarded division. */
#include <math.h>

void kernel_correlation(int m, int n, double float_n, double data[n][m], double corr[m][m],
                        double mean[m], double stddev[m])
{
  int i, j, k;
  double eps = 0.1;
  for (j = 0; j < m; j++) {
    mean[j] = 0.0;
    for (i = 0; i < n; i++)
      mean[j] += data[i][j];
    mean[j] /= float_n;
  }
  for (j = 0; j < m; j++) {
    stddev[j] = 0.0;
    for (i = 0; i < n; i++)
      stddev[j] += (data[i][j] - mean[j]) * (data[i][j] - mean[j]);
    stddev[j] /= float_n;
    stddev[j] = sqrt(stddev[j]);
    stddev[j] = stddev[j] <= eps ? 1.0 : stddev[j];
  }
  for (i = 0; i < n; i++)
    for (j = 0; j < m; j++) {
      data[i][j] -= mean[j];
      data[i][j] /= sqrt(float_n) * stddev[j];
    }
  for (i = 0; i < m - 1; i++) {
    corr[i][i] = 1.0;
    for (j = i + 1; j < m; j++) {
      corr[i][j] = 0.0;
      for (k = 0; k < n; k++)
        corr[i][j] += (data[k][i] * data[k][j]);
      corr[j][i] = corr[i][j];
    }
  }
  corr[m - 1][m - 1] = 1.0;
}

double cost_correlation(int m, int n, double float_n, double data[n][m], double corr[m][m],
                        double mean[m], double stddev[m])
{
  kernel_correlation(m, n, float_n, data, corr, mean, stddev);
  double s = 0.0;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < m; j++)
      s += corr[i][j] * corr[i][j];
  return s;
}
