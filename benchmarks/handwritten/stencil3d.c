/* 3-D 7-point stencil cost with clamped borders, and its gather-form adjoint.
 *
 *   (L x)[p,m,n] = 6 x[p,m,n] - x[p±1,m,n] - x[p,m±1,n] - x[p,m,n±1]   (clamped)
 *   C = sum (L x - y)^2,     dC/dx = L^T r,  r = 2 (L x - y)
 *
 * For a symmetric pair of clamped neighbours, sum_i r[i] ([clamp(i-1) = j] +
 * [clamp(i+1) = j]) = r[clamp(j-1)] + r[clamp(j+1)], so L^T = L: the
 * adjoint is the same clamped gather stencil applied to r (verified against
 * a scatter-form numpy transpose by run.py --check).
 *
 * Parallel over (p, m) rows; the four off-row neighbours are clamped row
 * pointers (no branches), n = 0 and n = N-1 are peeled.  Gradient: pass 1
 * writes r into a caller-provided workspace, pass 2 applies L to it.
 */
#include "common.h"

/* out[n] = 6 c[n] - a0[n] - a1[n] - a2[n] - a3[n] - c[clamp(n-1)] - c[clamp(n+1)] - (y ? y[n] : 0), times scale */
static inline void lap_row(const real *restrict c, const real *restrict a0,
                           const real *restrict a1, const real *restrict a2,
                           const real *restrict a3, const real *restrict yr, real scale,
                           real *restrict out, int64_t N)
{
    if (N == 1) {
        out[0] = scale * (R(4) * c[0] - a0[0] - a1[0] - a2[0] - a3[0] - yr[0]);
        return;
    }
    out[0] = scale * (R(5) * c[0] - a0[0] - a1[0] - a2[0] - a3[0] - c[1] - yr[0]);
    for (int64_t n = 1; n < N - 1; n++)
        out[n] = scale * (R(6) * c[n] - a0[n] - a1[n] - a2[n] - a3[n] - c[n - 1] - c[n + 1] - yr[n]);
    out[N - 1] = scale * (R(5) * c[N - 1] - a0[N - 1] - a1[N - 1] - a2[N - 1] - a3[N - 1]
                          - c[N - 2] - yr[N - 1]);
}

#define ROWS(base)                                                   \
    const real *c = base + (p * M + m) * N;                          \
    const real *a0 = base + ((p > 0 ? p - 1 : 0) * M + m) * N;       \
    const real *a1 = base + ((p < P - 1 ? p + 1 : p) * M + m) * N;   \
    const real *a2 = base + (p * M + (m > 0 ? m - 1 : 0)) * N;       \
    const real *a3 = base + (p * M + (m < M - 1 ? m + 1 : m)) * N;

double stencil3d_forward(const real *restrict x, const real *restrict y, int64_t P, int64_t M,
                         int64_t N)
{
    double total = 0;
    if (N <= 0) return 0;
#pragma omp parallel for collapse(2) schedule(static) reduction(+:total)
    for (int64_t p = 0; p < P; p++)
        for (int64_t m = 0; m < M; m++) {
            ROWS(x)
            const real *yr = y + (p * M + m) * N;
            real acc[LANES] = {0};
            double s = 0;
            if (N == 1) {
                real r = R(4) * c[0] - a0[0] - a1[0] - a2[0] - a3[0] - yr[0];
                total += r * r;
                continue;
            }
            real r0 = R(5) * c[0] - a0[0] - a1[0] - a2[0] - a3[0] - c[1] - yr[0];
            real rN = R(5) * c[N - 1] - a0[N - 1] - a1[N - 1] - a2[N - 1] - a3[N - 1] - c[N - 2] - yr[N - 1];
            s = (double)r0 * r0 + (double)rN * rN;
            int64_t n = 1;
            for (; n + LANES <= N - 1; n += LANES)
                for (int l = 0; l < LANES; l++) {
                    int64_t i = n + l;
                    real r = R(6) * c[i] - a0[i] - a1[i] - a2[i] - a3[i] - c[i - 1] - c[i + 1] - yr[i];
                    acc[l] += r * r;
                }
            for (; n < N - 1; n++) {
                real r = R(6) * c[n] - a0[n] - a1[n] - a2[n] - a3[n] - c[n - 1] - c[n + 1] - yr[n];
                s += r * r;
            }
            total += s + lanes_sum(acc);
        }
    return total;
}

void stencil3d_grad(const real *restrict x, const real *restrict y, int64_t P, int64_t M,
                    int64_t N, real *restrict dx, real *restrict r)
{
    if (N <= 0) return;
    real *zeros = calloc((size_t)N, sizeof(real));
#pragma omp parallel
    {
#pragma omp for collapse(2) schedule(static)
        for (int64_t p = 0; p < P; p++)
            for (int64_t m = 0; m < M; m++) {
                ROWS(x)
                lap_row(c, a0, a1, a2, a3, y + (p * M + m) * N, R(2), r + (p * M + m) * N, N);
            }
#pragma omp for collapse(2) schedule(static)
        for (int64_t p = 0; p < P; p++)
            for (int64_t m = 0; m < M; m++) {
                ROWS(r)
                lap_row(c, a0, a1, a2, a3, zeros, R(1), dx + (p * M + m) * N, N);
            }
    }
    free(zeros);
}
