/* Total-variation cost (clamped borders) and its gather-form gradient.
 *
 *   C(g) = sum (g - b)^2 + lam |g[m, n-1] - g[m, n]| + lam |g[m-1, n] - g[m, n]|
 *
 * with g[m, -1] = g[m, 0] and g[-1, n] = g[0, n] (clamped), so the border
 * differences are 0.  Gradient (sign(0) = 0):
 *
 *   dC/dg[m,n] = 2 (g - b)
 *              + lam (sign(g[m,n] - g[m,n+1]) - sign(g[m,n-1] - g[m,n]))
 *              + lam (sign(g[m,n] - g[m+1,n]) - sign(g[m-1,n] - g[m,n]))
 *
 * where a neighbour outside the image is the pixel itself (clamping), which
 * makes that difference 0.  Rows: the row above/below is a clamped row
 * pointer (no branch); columns: n = 0 and n = N-1 are peeled, the interior
 * loop has no border test.
 */
#include "common.h"

double tv_forward(const real *restrict g, const real *restrict b, real lam, int64_t M, int64_t N)
{
    double total = 0;
    if (N <= 0) return 0;
#pragma omp parallel for schedule(static) reduction(+:total)
    for (int64_t m = 0; m < M; m++) {
        const real *gr = g + m * N, *br = b + m * N;
        const real *gu = g + (m > 0 ? m - 1 : 0) * N; /* clamped row above */
        real acc[LANES] = {0};
        real d0 = gr[0] - br[0];
        double s = d0 * d0 + lam * RABS(gu[0] - gr[0]); /* n = 0: horizontal difference is 0 */
        int64_t n = 1;
        for (; n + LANES <= N; n += LANES)
            for (int l = 0; l < LANES; l++) {
                real d = gr[n + l] - br[n + l];
                acc[l] += d * d + lam * RABS(gr[n + l - 1] - gr[n + l])
                          + lam * RABS(gu[n + l] - gr[n + l]);
            }
        for (; n < N; n++) {
            real d = gr[n] - br[n];
            s += d * d + lam * RABS(gr[n - 1] - gr[n]) + lam * RABS(gu[n] - gr[n]);
        }
        total += s + lanes_sum(acc);
    }
    return total;
}

void tv_gradient(const real *restrict g, const real *restrict b, real lam, int64_t M, int64_t N,
                 real *restrict dg)
{
    if (N <= 0) return;
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const real *gr = g + m * N, *br = b + m * N;
        const real *gu = g + (m > 0 ? m - 1 : 0) * N;     /* clamped row above */
        const real *gd = g + (m < M - 1 ? m + 1 : m) * N; /* clamped row below */
        real *out = dg + m * N;
        if (N == 1) {
            out[0] = R(2) * (gr[0] - br[0]) + lam * (sgn(gr[0] - gd[0]) - sgn(gu[0] - gr[0]));
            continue;
        }
        /* n = 0: left neighbour is the pixel itself */
        out[0] = R(2) * (gr[0] - br[0]) + lam * sgn(gr[0] - gr[1])
                 + lam * (sgn(gr[0] - gd[0]) - sgn(gu[0] - gr[0]));
        for (int64_t n = 1; n < N - 1; n++) {
            real c = gr[n];
            out[n] = R(2) * (c - br[n])
                     + lam * (sgn(c - gr[n + 1]) - sgn(gr[n - 1] - c))
                     + lam * (sgn(c - gd[n]) - sgn(gu[n] - c));
        }
        /* n = N-1: right neighbour is the pixel itself */
        int64_t n = N - 1;
        out[n] = R(2) * (gr[n] - br[n]) - lam * sgn(gr[n - 1] - gr[n])
                 + lam * (sgn(gr[n] - gd[n]) - sgn(gu[n] - gr[n]));
    }
}
