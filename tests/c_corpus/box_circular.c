/* 1-2-1 smoothing on a periodic (torus) grid: (i - 1 + h) % h reads x circular. */
void smooth_periodic(int h, int w, const double x[h][w], double y[h][w])
{
  for (int i = 0; i < h; i++)
    for (int j = 0; j < w; j++)
      y[i][j] = 0.5 * x[i][j]
              + 0.125 * (x[(i - 1 + h) % h][j] + x[(i + 1) % h][j]
                         + x[i][(j - 1 + w) % w] + x[i][(j + 1) % w]);
}
