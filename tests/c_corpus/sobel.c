/* Sobel gradient magnitude in float, clamped borders through a helper function. */
#include <math.h>

static inline int clampi(int v, int lo, int hi)
{
  return v < lo ? lo : (v > hi ? hi : v);
}

void sobel(int h, int w, const float img[h][w], float mag[h][w])
{
  for (int i = 0; i < h; i++)
    for (int j = 0; j < w; j++) {
      float gx = img[clampi(i - 1, 0, h - 1)][clampi(j + 1, 0, w - 1)]
               - img[clampi(i - 1, 0, h - 1)][clampi(j - 1, 0, w - 1)]
               + 2.0f * (img[i][clampi(j + 1, 0, w - 1)] - img[i][clampi(j - 1, 0, w - 1)])
               + img[clampi(i + 1, 0, h - 1)][clampi(j + 1, 0, w - 1)]
               - img[clampi(i + 1, 0, h - 1)][clampi(j - 1, 0, w - 1)];
      float gy = img[clampi(i + 1, 0, h - 1)][clampi(j - 1, 0, w - 1)]
               - img[clampi(i - 1, 0, h - 1)][clampi(j - 1, 0, w - 1)]
               + 2.0f * (img[clampi(i + 1, 0, h - 1)][j] - img[clampi(i - 1, 0, h - 1)][j])
               + img[clampi(i + 1, 0, h - 1)][clampi(j + 1, 0, w - 1)]
               - img[clampi(i - 1, 0, h - 1)][clampi(j + 1, 0, w - 1)];
      mag[i][j] = sqrtf(gx * gx + gy * gy);
    }
}
