/* 3x3 box blur with clamped borders: the min/max macro idiom reads x clamped. */
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define CLAMP(v, hi) MIN(MAX(v, 0), (hi) - 1)

void blur3x3(int h, int w, const double x[h][w], double y[h][w])
{
  for (int i = 0; i < h; i++)
    for (int j = 0; j < w; j++) {
      double s = 0.0;
      for (int di = -1; di <= 1; di++)
        for (int dj = -1; dj <= 1; dj++)
          s += x[CLAMP(i + di, h)][CLAMP(j + dj, w)];
      y[i][j] = s / 9.0;
    }
}

double cost_blur(int h, int w, const double x[h][w], double y[h][w], const double t[h][w])
{
  blur3x3(h, w, x, y);
  double c = 0.0;
  for (int i = 0; i < h; i++)
    for (int j = 0; j < w; j++)
      c += (y[i][j] - t[i][j]) * (y[i][j] - t[i][j]);
  return c;
}
