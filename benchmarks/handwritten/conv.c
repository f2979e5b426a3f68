/* Conv layer: NCHW, 3x3 "same" convolution with zero padding, ReLU,
 * squared-error loss.
 *
 *   z[b,co,h,v] = sum_{ci,kh,kw} w[co,ci,kh,kw] x[b,ci,h+kh-1,v+kw-1]   (x = 0 outside)
 *   C           = sum (max(z, 0) - y)^2
 *   d           = dC/dz = 2 (max(z, 0) - y) [z > 0]
 *   dw[co,ci,kh,kw] = sum_{b,h,v} d[b,co,h,v] x[b,ci,h+kh-1,v+kw-1]
 *   dx[b,ci,h,v]    = sum_{co,kh,kw} w[co,ci,kh,kw] d[b,co,h-kh+1,v-kw+1]   (gather)
 *
 * Parallel over image rows (b, h).  Rows of x outside the image are
 * skipped (no per-element test); the horizontal zero padding is peeled
 * (v = 0 and v = W-1), so interior loops are branch-free and vectorize.
 * dw is a reduction into CO*CI*9 values: per-thread partial sums (double)
 * combined once at the end (privatization, no atomics).  dx gathers from d,
 * which the first pass writes into a caller-provided workspace (the dw dot
 * products are fused into that pass).
 */
#include "common.h"

/* z[v] += a x[v-1] + b x[v] + c x[v+1], zero outside [0, W) */
static inline void tap3_acc(real *restrict z, const real *restrict xr, real a, real b, real c,
                            int64_t W)
{
    if (W == 1) { z[0] += b * xr[0]; return; }
    z[0] += b * xr[0] + c * xr[1];
    for (int64_t v = 1; v < W - 1; v++) z[v] += a * xr[v - 1] + b * xr[v] + c * xr[v + 1];
    z[W - 1] += a * xr[W - 2] + b * xr[W - 1];
}

/* z-row of output channel co at (b, h) */
static inline void z_row(const real *restrict x, const real *restrict w, int64_t b, int64_t co,
                         int64_t h, int64_t CI, int64_t H, int64_t W, real *restrict z)
{
    for (int64_t v = 0; v < W; v++) z[v] = 0;
    for (int64_t ci = 0; ci < CI; ci++)
        for (int64_t kh = 0; kh < 3; kh++) {
            int64_t hh = h + kh - 1;
            if (hh < 0 || hh >= H) continue; /* zero padding: the whole row is 0 */
            const real *wk = w + ((co * CI + ci) * 3 + kh) * 3;
            tap3_acc(z, x + ((b * CI + ci) * H + hh) * W, wk[0], wk[1], wk[2], W);
        }
}

double conv_forward(const real *restrict x, const real *restrict w, const real *restrict y,
                    int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W)
{
    double total = 0;
    if (W <= 0) return 0;
#pragma omp parallel reduction(+:total)
    {
        real *z = malloc(sizeof(real) * (size_t)W);
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t co = 0; co < CO; co++) {
                    z_row(x, w, b, co, h, CI, H, W, z);
                    const real *yr = y + ((b * CO + co) * H + h) * W;
                    real acc[LANES] = {0};
                    double s = 0;
                    int64_t v = 0;
                    for (; v + LANES <= W; v += LANES)
                        for (int l = 0; l < LANES; l++) {
                            real zz = z[v + l], r = (zz > 0 ? zz : R(0)) - yr[v + l];
                            acc[l] += r * r;
                        }
                    for (; v < W; v++) {
                        real zz = z[v], r = (zz > 0 ? zz : R(0)) - yr[v];
                        s += r * r;
                    }
                    total += s + lanes_sum(acc);
                }
        free(z);
    }
    return total;
}

/* d-row = 2 (max(z, 0) - y) [z > 0], in place over z */
static inline void d_row(real *restrict z, const real *restrict yr, int64_t W)
{
    for (int64_t v = 0; v < W; v++) {
        real zz = z[v];
        z[v] = zz > 0 ? R(2) * (zz - yr[v]) : R(0);
    }
}

/* Shared by the gradients.  dw != NULL: compute dw; dx != NULL: compute dx (then dbuf,
 * a B*CO*H*W workspace, receives d; otherwise d lives in a thread-local row). */
static void conv_grad(const real *restrict x, const real *restrict w, const real *restrict y,
                      int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W,
                      real *restrict dw, real *restrict dx, real *restrict dbuf)
{
    const int64_t K = CO * CI * 9;
    double *acc = calloc((size_t)K, sizeof(double)); /* combined partial sums of dw */
    if (W > 0)
#pragma omp parallel
    {
        double *priv = dw ? calloc((size_t)K, sizeof(double)) : NULL; /* this thread's dw */
        real *drow = malloc(sizeof(real) * (size_t)W);
        /* pass 1: d = dC/dz, row by row [into the workspace], [+ dw] */
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t co = 0; co < CO; co++) {
                    real *d = dx ? dbuf + ((b * CO + co) * H + h) * W : drow;
                    z_row(x, w, b, co, h, CI, H, W, d);
                    d_row(d, y + ((b * CO + co) * H + h) * W, W);
                    if (!dw) continue;
                    for (int64_t ci = 0; ci < CI; ci++)
                        for (int64_t kh = 0; kh < 3; kh++) {
                            int64_t hh = h + kh - 1;
                            if (hh < 0 || hh >= H) continue;
                            const real *xr = x + ((b * CI + ci) * H + hh) * W;
                            double *out = priv + ((co * CI + ci) * 3 + kh) * 3;
                            /* kw = 0: sum_v d[v] x[v-1]; 1: d[v] x[v]; 2: d[v] x[v+1] */
                            double s0 = 0, s1 = d[0] * xr[0], s2 = W > 1 ? d[0] * xr[1] : 0;
                            if (W > 1) {
                                s0 += d[W - 1] * xr[W - 2];
                                s1 += d[W - 1] * xr[W - 1];
                            }
                            real a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0};
                            int64_t v = 1;
                            for (; v + LANES <= W - 1; v += LANES)
                                for (int l = 0; l < LANES; l++) {
                                    int64_t i = v + l;
                                    a0[l] += d[i] * xr[i - 1];
                                    a1[l] += d[i] * xr[i];
                                    a2[l] += d[i] * xr[i + 1];
                                }
                            for (; v < W - 1; v++) {
                                s0 += d[v] * xr[v - 1];
                                s1 += d[v] * xr[v];
                                s2 += d[v] * xr[v + 1];
                            }
                            out[0] += s0 + lanes_sum(a0);
                            out[1] += s1 + lanes_sum(a1);
                            out[2] += s2 + lanes_sum(a2);
                        }
                }
        if (dw) {
#pragma omp critical
            for (int64_t k = 0; k < K; k++) acc[k] += priv[k];
        }
        /* pass 2: dx[b,ci,h,v] = sum_{co,kh} (w[..,2] d[v-1] + w[..,1] d[v] + w[..,0] d[v+1])
         * over the d-row h - kh + 1 (the implicit barrier of pass 1 orders it) */
        if (dx) {
#pragma omp for collapse(2) schedule(static)
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t ci = 0; ci < CI; ci++) {
                        real *out = dx + ((b * CI + ci) * H + h) * W;
                        for (int64_t v = 0; v < W; v++) out[v] = 0;
                        for (int64_t co = 0; co < CO; co++)
                            for (int64_t kh = 0; kh < 3; kh++) {
                                int64_t hd = h - kh + 1;
                                if (hd < 0 || hd >= H) continue;
                                const real *wk = w + ((co * CI + ci) * 3 + kh) * 3;
                                tap3_acc(out, dbuf + ((b * CO + co) * H + hd) * W,
                                         wk[2], wk[1], wk[0], W);
                            }
                    }
        }
        free(drow);
        free(priv);
    }
    if (dw)
        for (int64_t k = 0; k < K; k++) dw[k] = (real)acc[k];
    free(acc);
}

void conv_grad_w(const real *restrict x, const real *restrict w, const real *restrict y,
                 int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W, real *restrict dw)
{
    conv_grad(x, w, y, B, CI, CO, H, W, dw, NULL, NULL);
}

void conv_grad_x(const real *restrict x, const real *restrict w, const real *restrict y,
                 int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W, real *restrict dx,
                 real *restrict dbuf)
{
    conv_grad(x, w, y, B, CI, CO, H, W, NULL, dx, dbuf);
}

void conv_grad_wx(const real *restrict x, const real *restrict w, const real *restrict y,
                  int64_t B, int64_t CI, int64_t CO, int64_t H, int64_t W, real *restrict dw,
                  real *restrict dx, real *restrict dbuf)
{
    conv_grad(x, w, y, B, CI, CO, H, W, dw, dx, dbuf);
}
