/* Transpose of the deconvolution example's blur (examples/deconv.py:blur):
 *
 *   y = V H x,   H: horizontal clamped 5-tap filter f,  V: the same vertically
 *   x_t = H^T V^T w
 *
 * Gather form, no atomics: u = V^T w row by row (row m gathers the source rows
 * s in [m-2, m+2] with coefficient sum_k f[k] [clamp(s + k - 2) == m], which
 * folds the clamped taps at the borders), then x_t = H^T u per row (interior
 * columns: the flipped filter; the 2 + 2 border columns fold clamped taps).
 * u is a caller-provided workspace (M*N), allocated once and reused.
 */
#include "common.h"

#define TAPS 5

static void vt_row(const real *restrict w, const real *restrict f, real *restrict ur,
                   int64_t m, int64_t M, int64_t N)
{
    for (int64_t n = 0; n < N; n++) ur[n] = 0;
    for (int64_t s = m - 2; s <= m + 2; s++) {
        if (s < 0 || s >= M) continue;
        real c = 0;
        for (int k = 0; k < TAPS; k++)
            if (clampi(s + k - 2, M) == m) c += f[k];
        if (c == 0) continue;
        const real *restrict wr = w + s * N;
#pragma omp simd
        for (int64_t n = 0; n < N; n++) ur[n] += c * wr[n];
    }
}

static void ht_row(const real *restrict u, const real *restrict f, real *restrict xr, int64_t N)
{
    const real f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4];
    int64_t lo = min64(2, N), hi = max64(lo, N - 2);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t n = b ? hi : 0; n < (b ? N : lo); n++) {
            real s = 0;
            for (int64_t src = n - 2; src <= n + 2; src++) {
                if (src < 0 || src >= N) continue;
                for (int k = 0; k < TAPS; k++)
                    if (clampi(src + k - 2, N) == n) s += f[k] * u[src];
            }
            xr[n] = s;
        }
#pragma omp simd
    for (int64_t n = lo; n < hi; n++)
        xr[n] = f0 * u[n + 2] + f1 * u[n + 1] + f2 * u[n] + f3 * u[n - 1] + f4 * u[n - 2];
}

void blur_transpose(const real *restrict w, const real *restrict f, real *restrict u,
                    real *restrict xt, int64_t M, int64_t N)
{
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) vt_row(w, f, u + m * N, m, M, N);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) ht_row(u + m * N, f, xt + m * N, N);
}
