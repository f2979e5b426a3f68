/* Deconvolution cost: separable clamped 5-tap blur + data fidelity.
 *
 *   t[m, n] = sum_k f[k] x[m, clamp(n + k - 2)]          (horizontal pass)
 *   B[m, n] = sum_k f[k] t[clamp(m + k - 2), n]          (vertical pass)
 *   C       = sum (B - y)^2
 *
 * Gradients, gather form (every output element computed once, no atomics):
 *   r  = 2 (B - y)
 *   u  = V^T r    (vertical adjoint: a row of u gathers at most 5 rows of r,
 *                  with coefficients that fold the clamped taps at the
 *                  borders; every row uses one branch-free loop)
 *   dx = H^T u    (horizontal adjoint: interior columns are the flipped
 *                  5-tap filter, the 2+2 border columns fold clamped taps)
 *   df[k] = sum r[m, n] t[clamp(m + k - 2), n] + sum u[m, n] x[m, clamp(n + k - 2)]
 *         (per-thread partial sums, combined once: a reduction into 5 values)
 *
 * Passes: (1) t = H x, (2) r = 2 (V t - y) [+ first df term], (3) per row:
 * u-row = V^T r into a thread-local row, then dx-row = H^T u-row [or the
 * second df term].  t and r are caller-provided workspaces (M*N each),
 * allocated once and reused across calls, as a careful engineer would.
 *
 * deconv_grad_*_lb (end of the file): the same gradients line-buffered, with
 * no full-size temporaries (reads x and y, writes dx: three passes over
 * memory instead of seven).  The benchmarks time both and compare polyad
 * with the faster.
 */
#include "common.h"
#include <omp.h>

#define TAPS 5

/* t-row = H x-row */
static void hblur_row(const real *restrict xr, const real *restrict f, real *restrict tr,
                      int64_t N)
{
    const real f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4];
    int64_t lo = min64(2, N), hi = max64(lo, N - 2);
    /* border columns [0, lo) and [hi, N): clamped taps */
    for (int64_t b = 0; b < 2; b++)
        for (int64_t n = b ? hi : 0; n < (b ? N : lo); n++) {
            real s = 0;
            for (int k = 0; k < TAPS; k++) s += f[k] * xr[clampi(n + k - 2, N)];
            tr[n] = s;
        }
    for (int64_t n = lo; n < hi; n++)
        tr[n] = f0 * xr[n - 2] + f1 * xr[n - 1] + f2 * xr[n] + f3 * xr[n + 1] + f4 * xr[n + 2];
}

/* Rows of t read by output row m of the vertical pass. */
static inline void vrows(const real *t, int64_t m, int64_t M, int64_t N, const real *p[TAPS])
{
    for (int k = 0; k < TAPS; k++) p[k] = t + clampi(m + k - 2, M) * N;
}

/* Vertical adjoint: row m' of V^T gathers source rows s in [m'-2, m'+2]
 * with coefficient sum_k f[k] [clamp(s + k - 2) == m'].  Always 5 pairs
 * (unused ones get coefficient 0 on row m'), so one loop serves all rows. */
static inline void vadj_pairs(const real *r, const real *f, int64_t m, int64_t M, int64_t N,
                              const real *p[TAPS], real c[TAPS])
{
    for (int j = 0; j < TAPS; j++) {
        int64_t s = m + j - 2;
        p[j] = r + m * N;
        c[j] = 0;
        if (s < 0 || s >= M) continue;
        p[j] = r + s * N;
        for (int k = 0; k < TAPS; k++)
            if (clampi(s + k - 2, M) == m) c[j] += f[k];
    }
}

/* Horizontal adjoint coefficient of u[n] in dx[n'] (border columns). */
static inline real hadj_coef(const real *f, int64_t n, int64_t np, int64_t N)
{
    real c = 0;
    for (int k = 0; k < TAPS; k++)
        if (clampi(n + k - 2, N) == np) c += f[k];
    return c;
}

/* dx-row = H^T u-row */
static void hadj_row(const real *restrict u, const real *restrict f, real *restrict dx, int64_t N)
{
    const real f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4];
    int64_t lo = min64(2, N), hi = max64(lo, N - 2);
    /* border columns [0, lo) and [hi, N): fold the clamped taps */
    for (int64_t b = 0; b < 2; b++)
        for (int64_t np = b ? hi : 0; np < (b ? N : lo); np++) {
            real s = 0;
            for (int64_t n = max64(0, np - 2); n <= min64(N - 1, np + 2); n++)
                s += hadj_coef(f, n, np, N) * u[n];
            dx[np] = s;
        }
    for (int64_t n = lo; n < hi; n++)
        dx[n] = f4 * u[n - 2] + f3 * u[n - 1] + f2 * u[n] + f1 * u[n + 1] + f0 * u[n + 2];
}

static void pass_h(const real *restrict x, const real *restrict f, real *restrict t,
                   int64_t M, int64_t N)
{
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) hblur_row(x + m * N, f, t + m * N, N);
}

double deconv_forward(const real *restrict x, const real *restrict f, const real *restrict y,
                      int64_t M, int64_t N, real *restrict t)
{
    if (M <= 0 || N <= 0) return 0;
    pass_h(x, f, t, M, N);
    const real f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4];
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+:total)
    for (int64_t m = 0; m < M; m++) {
        const real *p[TAPS];
        vrows(t, m, M, N, p);
        const real *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3], *p4 = p[4];
        const real *yr = y + m * N;
        real acc[LANES] = {0};
        double s = 0;
        int64_t n = 0;
        for (; n + LANES <= N; n += LANES)
            for (int l = 0; l < LANES; l++) {
                int64_t i = n + l;
                real d = f0 * p0[i] + f1 * p1[i] + f2 * p2[i] + f3 * p3[i] + f4 * p4[i] - yr[i];
                acc[l] += d * d;
            }
        for (; n < N; n++) {
            real d = f0 * p0[n] + f1 * p1[n] + f2 * p2[n] + f3 * p3[n] + f4 * p4[n] - yr[n];
            s += d * d;
        }
        total += s + lanes_sum(acc);
    }
    return total;
}

/* Shared by both gradients.  dx != NULL: compute dx; df != NULL: compute df. */
static void deconv_grad(const real *restrict x, const real *restrict f, const real *restrict y,
                        int64_t M, int64_t N, real *restrict dx, real *restrict df,
                        real *restrict t, real *restrict r)
{
    if (M <= 0 || N <= 0) {
        if (df) for (int k = 0; k < TAPS; k++) df[k] = 0;
        return;
    }
    const real f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4];
    double dfa[TAPS] = {0}; /* sum r * t[clamp(m + k - 2)] */
    double dfb[TAPS] = {0}; /* sum u * x[clamp(n + k - 2)] */
    pass_h(x, f, t, M, N);
#pragma omp parallel
    {
        /* pass 2: r = 2 (V t - y) [+ dfa] */
#pragma omp for schedule(static) reduction(+:dfa[:TAPS])
        for (int64_t m = 0; m < M; m++) {
            const real *p[TAPS];
            vrows(t, m, M, N, p);
            const real *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3], *p4 = p[4];
            const real *yr = y + m * N;
            real *rr = r + m * N;
            for (int64_t n = 0; n < N; n++)
                rr[n] = R(2) * (f0 * p0[n] + f1 * p1[n] + f2 * p2[n] + f3 * p3[n] + f4 * p4[n] - yr[n]);
            if (df) {
                real a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0}, a4[LANES] = {0};
                double s[TAPS] = {0};
                int64_t n = 0;
                for (; n + LANES <= N; n += LANES)
                    for (int l = 0; l < LANES; l++) {
                        real v = rr[n + l];
                        a0[l] += v * p0[n + l]; a1[l] += v * p1[n + l]; a2[l] += v * p2[n + l];
                        a3[l] += v * p3[n + l]; a4[l] += v * p4[n + l];
                    }
                for (; n < N; n++)
                    for (int k = 0; k < TAPS; k++) s[k] += rr[n] * p[k][n];
                dfa[0] += s[0] + lanes_sum(a0); dfa[1] += s[1] + lanes_sum(a1);
                dfa[2] += s[2] + lanes_sum(a2); dfa[3] += s[3] + lanes_sum(a3);
                dfa[4] += s[4] + lanes_sum(a4);
            }
        }
        /* pass 3: u-row = V^T r (thread-local), then dx-row = H^T u-row [or dfb] */
        real *u = malloc(sizeof(real) * (size_t)N);
#pragma omp for schedule(static) reduction(+:dfb[:TAPS])
        for (int64_t m = 0; m < M; m++) {
            const real *p[TAPS];
            real c[TAPS];
            vadj_pairs(r, f, m, M, N, p, c);
            const real *q0 = p[0], *q1 = p[1], *q2 = p[2], *q3 = p[3], *q4 = p[4];
            const real c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4];
            for (int64_t n = 0; n < N; n++)
                u[n] = c0 * q0[n] + c1 * q1[n] + c2 * q2[n] + c3 * q3[n] + c4 * q4[n];
            if (dx) hadj_row(u, f, dx + m * N, N);
            if (df) {
                const real *xr = x + m * N;
                int64_t lo = min64(2, N), hi = max64(lo, N - 2);
                double s[TAPS] = {0};
                for (int64_t b = 0; b < 2; b++)
                    for (int64_t n = b ? hi : 0; n < (b ? N : lo); n++)
                        for (int k = 0; k < TAPS; k++) s[k] += u[n] * xr[clampi(n + k - 2, N)];
                real a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0}, a4[LANES] = {0};
                int64_t n = lo;
                for (; n + LANES <= hi; n += LANES)
                    for (int l = 0; l < LANES; l++) {
                        int64_t i = n + l;
                        real v = u[i];
                        a0[l] += v * xr[i - 2]; a1[l] += v * xr[i - 1]; a2[l] += v * xr[i];
                        a3[l] += v * xr[i + 1]; a4[l] += v * xr[i + 2];
                    }
                for (; n < hi; n++)
                    for (int k = 0; k < TAPS; k++) s[k] += u[n] * xr[n + k - 2];
                dfb[0] += s[0] + lanes_sum(a0); dfb[1] += s[1] + lanes_sum(a1);
                dfb[2] += s[2] + lanes_sum(a2); dfb[3] += s[3] + lanes_sum(a3);
                dfb[4] += s[4] + lanes_sum(a4);
            }
        }
        free(u);
    }
    if (df)
        for (int k = 0; k < TAPS; k++) df[k] = (real)(dfa[k] + dfb[k]);
}

void deconv_grad_x(const real *restrict x, const real *restrict f, const real *restrict y,
                   int64_t M, int64_t N, real *restrict dx, real *restrict t, real *restrict r)
{
    deconv_grad(x, f, y, M, N, dx, NULL, t, r);
}

void deconv_grad_f(const real *restrict x, const real *restrict f, const real *restrict y,
                   int64_t M, int64_t N, real *restrict df, real *restrict t, real *restrict r)
{
    deconv_grad(x, f, y, M, N, NULL, df, t, r);
}

void deconv_grad_xf(const real *restrict x, const real *restrict f, const real *restrict y,
                    int64_t M, int64_t N, real *restrict dx, real *restrict df,
                    real *restrict t, real *restrict r)
{
    deconv_grad(x, f, y, M, N, dx, df, t, r);
}

/* ------------------------------------------------------------------------
 * Line-buffered gradient: the version a careful engineer writes when memory
 * traffic matters.  No full-size temporaries: each thread takes a contiguous
 * block of output rows and walks it top to bottom with two small rings of
 * rows (RING rows of t = H x, RING rows of r = 2 (V t - y)) and one row u;
 * output row m needs r rows m-2..m+2, which need t rows m-4..m+4, so every
 * row of t and r is computed once per thread (twice only in the 4-row halo
 * between two threads' blocks).  Memory traffic: read x and y, write dx
 * (the minimum), against t and r written and read back by the version above.
 * df: the r-side terms are summed only for the thread's own rows (halo rows
 * belong to the neighbour), per-thread partial sums reduced once.
 * ------------------------------------------------------------------------ */

#define RING 8 /* a power of two > 5: the live window of t rows and of r rows */

typedef struct {
    real *rows;          /* RING rows of N */
    int64_t tag[RING];   /* which row each slot holds, -1 when empty */
} row_ring;

/* sum_n v[n] p_k[n] for k < TAPS over n in [0, len), LANES partial sums, added to out[k] */
static void dot5(const real *restrict v, const real *const p[TAPS], int64_t len, double out[TAPS])
{
    const real *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3], *p4 = p[4];
    real a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0}, a4[LANES] = {0};
    double s[TAPS] = {0};
    int64_t n = 0;
    for (; n + LANES <= len; n += LANES)
        for (int l = 0; l < LANES; l++) {
            real w = v[n + l];
            a0[l] += w * p0[n + l]; a1[l] += w * p1[n + l]; a2[l] += w * p2[n + l];
            a3[l] += w * p3[n + l]; a4[l] += w * p4[n + l];
        }
    for (; n < len; n++)
        for (int k = 0; k < TAPS; k++) s[k] += v[n] * p[k][n];
    out[0] += s[0] + lanes_sum(a0); out[1] += s[1] + lanes_sum(a1);
    out[2] += s[2] + lanes_sum(a2); out[3] += s[3] + lanes_sum(a3);
    out[4] += s[4] + lanes_sum(a4);
}

/* Row clamp(j) of t = H x, computed into the ring when not there. */
static const real *t_row(row_ring *T, const real *x, const real *f, int64_t j, int64_t M,
                         int64_t N)
{
    j = clampi(j, M);
    int slot = (int)(j & (RING - 1));
    real *row = T->rows + (int64_t)slot * N;
    if (T->tag[slot] != j) {
        hblur_row(x + j * N, f, row, N);
        T->tag[slot] = j;
    }
    return row;
}

/* Row s (0 <= s < M) of r = 2 (V t - y); its df terms are added to dfa when
 * the row is the thread's own (own_lo <= s < own_hi). */
static const real *r_row(row_ring *R_, row_ring *T, const real *x, const real *f,
                         const real *y, int64_t s, int64_t M, int64_t N, int64_t own_lo,
                         int64_t own_hi, double *dfa)
{
    int slot = (int)(s & (RING - 1));
    real *row = R_->rows + (int64_t)slot * N;
    if (R_->tag[slot] == s) return row;
    const real *p[TAPS];
    for (int k = 0; k < TAPS; k++) p[k] = t_row(T, x, f, s + k - 2, M, N);
    const real *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3], *p4 = p[4];
    const real f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4];
    const real *yr = y + s * N;
    for (int64_t n = 0; n < N; n++)
        row[n] = R(2) * (f0 * p0[n] + f1 * p1[n] + f2 * p2[n] + f3 * p3[n] + f4 * p4[n] - yr[n]);
    if (dfa && s >= own_lo && s < own_hi) dot5(row, p, N, dfa);
    R_->tag[slot] = s;
    return row;
}

static void deconv_grad_lb(const real *restrict x, const real *restrict f, const real *restrict y,
                           int64_t M, int64_t N, real *restrict dx, real *restrict df)
{
    if (M <= 0 || N <= 0) {
        if (df) for (int k = 0; k < TAPS; k++) df[k] = 0;
        return;
    }
    double dfa[TAPS] = {0}, dfb[TAPS] = {0};
#pragma omp parallel reduction(+:dfa[:TAPS], dfb[:TAPS])
    {
        int nth = omp_get_num_threads(), tid = omp_get_thread_num();
        int64_t m0 = M * tid / nth, m1 = M * (tid + 1) / nth;
        real *buf = malloc(sizeof(real) * (size_t)N * (2 * RING + 1));
        row_ring T = {buf, {0}}, Rr = {buf + (int64_t)RING * N, {0}};
        real *u = buf + (int64_t)2 * RING * N;
        for (int k = 0; k < RING; k++) T.tag[k] = Rr.tag[k] = -1;
        for (int64_t m = m0; m < m1; m++) {
            /* u-row = V^T r: rows s = m-2..m+2 inside the image, clamped taps folded */
            const real *q[TAPS];
            real c[TAPS];
            for (int j = 0; j < TAPS; j++) {
                int64_t s = m + j - 2;
                c[j] = 0;
                q[j] = NULL;
                if (s < 0 || s >= M) continue;
                q[j] = r_row(&Rr, &T, x, f, y, s, M, N, m0, m1, df ? dfa : NULL);
                for (int k = 0; k < TAPS; k++)
                    if (clampi(s + k - 2, M) == m) c[j] += f[k];
            }
            for (int j = 0; j < TAPS; j++)
                if (!q[j]) q[j] = q[2]; /* coefficient 0: any valid row */
            const real *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3], *q4 = q[4];
            const real c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4];
            for (int64_t n = 0; n < N; n++)
                u[n] = c0 * q0[n] + c1 * q1[n] + c2 * q2[n] + c3 * q3[n] + c4 * q4[n];
            if (dx) hadj_row(u, f, dx + m * N, N);
            if (df) {
                const real *xr = x + m * N;
                int64_t lo = min64(2, N), hi = max64(lo, N - 2);
                for (int64_t b = 0; b < 2; b++)
                    for (int64_t n = b ? hi : 0; n < (b ? N : lo); n++)
                        for (int k = 0; k < TAPS; k++) dfb[k] += u[n] * xr[clampi(n + k - 2, N)];
                if (hi > lo) {
                    const real *p[TAPS];
                    for (int k = 0; k < TAPS; k++) p[k] = xr + lo + k - 2;
                    dot5(u + lo, p, hi - lo, dfb);
                }
            }
        }
        free(buf);
    }
    if (df)
        for (int k = 0; k < TAPS; k++) df[k] = (real)(dfa[k] + dfb[k]);
}

void deconv_grad_x_lb(const real *restrict x, const real *restrict f, const real *restrict y,
                      int64_t M, int64_t N, real *restrict dx)
{
    deconv_grad_lb(x, f, y, M, N, dx, NULL);
}

void deconv_grad_f_lb(const real *restrict x, const real *restrict f, const real *restrict y,
                      int64_t M, int64_t N, real *restrict df)
{
    deconv_grad_lb(x, f, y, M, N, NULL, df);
}

void deconv_grad_xf_lb(const real *restrict x, const real *restrict f, const real *restrict y,
                       int64_t M, int64_t N, real *restrict dx, real *restrict df)
{
    deconv_grad_lb(x, f, y, M, N, dx, df);
}
