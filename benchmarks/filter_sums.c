/* The conv layer's filter-gradient sums on their own, one thread: how fast the form
 * polyad emits runs, against the machine's multiply-add peak measured in the same run
 * and against the alternatives tried (benchmarks/README.md, "Issue 10, fourteenth
 * round").
 *
 *   gcc -O3 -march=native -mprefer-vector-width=512 -ffp-contract=fast -fopenmp \
 *       benchmarks/filter_sums.c -o /tmp/filter_sums && /tmp/filter_sums
 *
 * The sums: d_w[co, ci, kh, kw] += d_s[co, h, v] * x[ci, h + kh - 1, v + kw - 1] over the
 * interior rows h and columns v of B = 4 images of 512 x 512, CI = 4 -> CO = 8 channels
 * (the benchmark's 2048 f32 shape), float. d_s holds 3 rows per channel (row h in slot
 * h mod 3, 32 floats of padding), as the gradient's d_s_expanded_rows does.
 *
 * Variants (each reports the median of REPEATS runs and the fraction of the peak):
 *   emitted          polyad's code: channels co, co + 1 in one pass over the row (18
 *                    sums of 16 lanes, one array each), the lanes added after each pass;
 *                    x and d_s at 16 bytes past a 64-byte boundary, where numpy's and
 *                    malloc's allocations start
 *   emitted_aligned  the same with x and d_s on 64-byte boundaries
 *   kh_rows_4co      channels co .. co + 3 and the 3 taps kw of one row kh per pass (12
 *                    sums: 3 loads of x and 4 of d_s per 12 multiply-adds), the lanes kept
 *                    across rows (loaded and stored per pass, added once at the end)
 *   *_ds_rows_al     emitted and kh_rows_4co with d_s placed so that each row's element 1,
 *                    where the vector loops start, is on a 64-byte boundary (x as in
 *                    emitted): kh_rows_4co_ds_rows_al is the form the fifteenth round
 *                    tried in the gradient (benchmarks/README.md)
 * and fma_peak: 12 independent chains of 512-bit multiply-adds, the machine's peak. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <immintrin.h>

#define B 4
#define H 512
#define W 512
#define CI 4
#define CO 8
#define LANES 16
#define REPEATS 15
#define PAD (W + 32)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* polyad's form: per (pair of co, ci, row h) one pass over v with 18 lane arrays */
__attribute__((noinline)) static void emitted(const float *restrict x, const float *restrict ds, float *restrict dw)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 1; h < H - 1; h++)
            for (int64_t co = 0; co < CO; co += 2)
                for (int64_t ci = 0; ci < CI; ci++) {
                    float a0[LANES] = {0}, a1[LANES] = {0}, a2[LANES] = {0}, a3[LANES] = {0},
                          a4[LANES] = {0}, a5[LANES] = {0}, a6[LANES] = {0}, a7[LANES] = {0},
                          a8[LANES] = {0}, a9[LANES] = {0}, a10[LANES] = {0}, a11[LANES] = {0},
                          a12[LANES] = {0}, a13[LANES] = {0}, a14[LANES] = {0}, a15[LANES] = {0},
                          a16[LANES] = {0}, a17[LANES] = {0};
                    const float *r0 = x + ((b * CI + ci) * H + h - 1) * W, *r1 = r0 + W, *r2 = r1 + W;
                    const float *d0 = ds + (co * 3 + h % 3) * PAD, *d1 = ds + ((co + 1) * 3 + h % 3) * PAD;
                    for (int64_t v = 1; v + LANES - 1 < W - 1; v += LANES) {
#pragma omp simd
                        for (int64_t l = 0; l < LANES; l++) {
                            a0[l] += d0[v + l] * r0[v + l - 1];
                            a1[l] += d0[v + l] * r0[v + l];
                            a2[l] += d0[v + l] * r0[v + l + 1];
                            a3[l] += d0[v + l] * r1[v + l - 1];
                            a4[l] += d0[v + l] * r1[v + l];
                            a5[l] += d0[v + l] * r1[v + l + 1];
                            a6[l] += d0[v + l] * r2[v + l - 1];
                            a7[l] += d0[v + l] * r2[v + l];
                            a8[l] += d0[v + l] * r2[v + l + 1];
                            a9[l] += d1[v + l] * r0[v + l - 1];
                            a10[l] += d1[v + l] * r0[v + l];
                            a11[l] += d1[v + l] * r0[v + l + 1];
                            a12[l] += d1[v + l] * r1[v + l - 1];
                            a13[l] += d1[v + l] * r1[v + l];
                            a14[l] += d1[v + l] * r1[v + l + 1];
                            a15[l] += d1[v + l] * r2[v + l - 1];
                            a16[l] += d1[v + l] * r2[v + l];
                            a17[l] += d1[v + l] * r2[v + l + 1];
                        }
                    }
                    /* as polyad prints them: each sum's lanes one after another */
#define ADD_LANES(a, k)                                        \
    {                                                          \
        for (int l = 1; l < LANES; l++)                        \
            a[0] += a[l];                                      \
        dw[((co + (k) / 9) * CI + ci) * 9 + (k) % 9] += a[0];  \
    }
                    ADD_LANES(a0, 0) ADD_LANES(a1, 1) ADD_LANES(a2, 2) ADD_LANES(a3, 3)
                    ADD_LANES(a4, 4) ADD_LANES(a5, 5) ADD_LANES(a6, 6) ADD_LANES(a7, 7)
                    ADD_LANES(a8, 8) ADD_LANES(a9, 9) ADD_LANES(a10, 10) ADD_LANES(a11, 11)
                    ADD_LANES(a12, 12) ADD_LANES(a13, 13) ADD_LANES(a14, 14) ADD_LANES(a15, 15)
                    ADD_LANES(a16, 16) ADD_LANES(a17, 17)
#undef ADD_LANES
                }
}

/* 4 channels co and the 3 taps kw of one filter row kh per pass; the lanes of every
 * sum live in `kept` across the rows h and are added once at the end */
__attribute__((noinline)) static void kh_rows_4co(const float *restrict x, const float *restrict ds, float *restrict dw,
                        float *restrict kept)
{
    for (int64_t i = 0; i < CO * CI * 9 * LANES; i++)
        kept[i] = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 1; h < H - 1; h++)
            for (int64_t co = 0; co < CO; co += 4)
                for (int64_t ci = 0; ci < CI; ci++)
                    for (int64_t kh = 0; kh < 3; kh++) {
                        float a0[LANES], a1[LANES], a2[LANES], a3[LANES], a4[LANES], a5[LANES],
                              a6[LANES], a7[LANES], a8[LANES], a9[LANES], a10[LANES], a11[LANES];
#define KEPT(k) (kept + (((co + (k) / 3) * CI + ci) * 9 + kh * 3 + (k) % 3) * LANES)
#define LOAD(a, k) for (int l = 0; l < LANES; l++) a[l] = KEPT(k)[l];
#define STORE(a, k) for (int l = 0; l < LANES; l++) KEPT(k)[l] = a[l];
                        LOAD(a0, 0) LOAD(a1, 1) LOAD(a2, 2) LOAD(a3, 3) LOAD(a4, 4) LOAD(a5, 5)
                        LOAD(a6, 6) LOAD(a7, 7) LOAD(a8, 8) LOAD(a9, 9) LOAD(a10, 10) LOAD(a11, 11)
                        const float *r = x + ((b * CI + ci) * H + h - 1 + kh) * W;
                        const float *d0 = ds + (co * 3 + h % 3) * PAD, *d1 = d0 + 3 * PAD,
                                    *d2 = d1 + 3 * PAD, *d3 = d2 + 3 * PAD;
                        for (int64_t v = 1; v + LANES - 1 < W - 1; v += LANES) {
#pragma omp simd
                            for (int64_t l = 0; l < LANES; l++) {
                                a0[l] += d0[v + l] * r[v + l - 1];
                                a1[l] += d0[v + l] * r[v + l];
                                a2[l] += d0[v + l] * r[v + l + 1];
                                a3[l] += d1[v + l] * r[v + l - 1];
                                a4[l] += d1[v + l] * r[v + l];
                                a5[l] += d1[v + l] * r[v + l + 1];
                                a6[l] += d2[v + l] * r[v + l - 1];
                                a7[l] += d2[v + l] * r[v + l];
                                a8[l] += d2[v + l] * r[v + l + 1];
                                a9[l] += d3[v + l] * r[v + l - 1];
                                a10[l] += d3[v + l] * r[v + l];
                                a11[l] += d3[v + l] * r[v + l + 1];
                            }
                        }
                        STORE(a0, 0) STORE(a1, 1) STORE(a2, 2) STORE(a3, 3) STORE(a4, 4) STORE(a5, 5)
                        STORE(a6, 6) STORE(a7, 7) STORE(a8, 8) STORE(a9, 9) STORE(a10, 10) STORE(a11, 11)
#undef KEPT
#undef LOAD
#undef STORE
                    }
    for (int64_t e = 0; e < CO * CI * 9; e++)
        for (int l = 0; l < LANES; l++)
            dw[e] += kept[e * LANES + l];
}

/* 12 independent chains of 512-bit multiply-adds: `count` instructions */
__attribute__((noinline)) static float fma_peak(int64_t count)
{
    __m512 a[12];
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps(0.001f * i);
    const __m512 m = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(0.0001f);
    for (int64_t it = 0; it < count / 12; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], m, c);
    }
    float s = 0;
    for (int i = 0; i < 12; i++)
        s += _mm512_reduce_add_ps(a[i]);
    return s;
}

static int by_value(const void *p, const void *q)
{
    double a = *(const double *)p, b = *(const double *)q;
    return (a > b) - (a < b);
}

static double median(double *t, int n)
{
    qsort(t, n, sizeof *t, by_value);
    return t[n / 2];
}

int main(void)
{
    size_t nx = (size_t)B * CI * H * W, nds = (size_t)CO * 3 * PAD;
    char *xbuf = aligned_alloc(64, sizeof(float) * nx + 64);
    char *dbuf = aligned_alloc(64, sizeof(float) * nds + 64);
    float *dw = calloc(CO * CI * 9, sizeof(float));
    float *kept = aligned_alloc(64, sizeof(float) * CO * CI * 9 * LANES);
    for (size_t i = 0; i < nx + 16; i++)
        ((float *)xbuf)[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < nds + 16; i++)
        ((float *)dbuf)[i] = (float)(i % 5) * 0.1f;
    /* multiply-adds of 16 lanes the sums make */
    const double fmas = (double)B * (H - 2) * CO * CI * 9 * ((W - 2) / LANES);
    double t_peak[REPEATS], t_em[REPEATS], t_al[REPEATS], t_kh[REPEATS], t_em_rows[REPEATS],
        t_kh_rows[REPEATS];
    /* d_s's element 1 on a 64-byte boundary (rows of PAD floats keep it on every row) */
    float *ds_rows_al = (float *)(dbuf + 64 - sizeof(float));
    float sink = 0;
    for (int r = 0; r < REPEATS; r++) {
        double t = now();
        sink += fma_peak((int64_t)fmas);
        t_peak[r] = now() - t;
        t = now();
        emitted((float *)(xbuf + 16), (float *)(dbuf + 16), dw);
        t_em[r] = now() - t;
        t = now();
        emitted((float *)xbuf, (float *)dbuf, dw);
        t_al[r] = now() - t;
        t = now();
        kh_rows_4co((float *)(xbuf + 16), (float *)(dbuf + 16), dw, kept);
        t_kh[r] = now() - t;
        t = now();
        emitted((float *)(xbuf + 16), ds_rows_al, dw);
        t_em_rows[r] = now() - t;
        t = now();
        kh_rows_4co((float *)(xbuf + 16), ds_rows_al, dw, kept);
        t_kh_rows[r] = now() - t;
    }
    double peak = median(t_peak, REPEATS);
    const char *names[] = {"fma_peak", "emitted", "emitted_aligned", "kh_rows_4co",
                           "emitted_ds_rows_al", "kh_rows_4co_ds_rows_al"};
    double *times[] = {t_peak, t_em, t_al, t_kh, t_em_rows, t_kh_rows};
    printf("filter-gradient sums, B=%d %d->%d channels %dx%d, float, 1 thread, median of %d\n",
           B, CI, CO, H, W, REPEATS);
    printf("%-22s %9s %12s\n", "variant", "ms", "of the peak");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        double m = median(times[i], REPEATS);
        printf("%-22s %9.2f %11.0f%%\n", names[i], m * 1e3, 100 * peak / m);
    }
    printf("(checksum %g %g)\n", (double)dw[3], (double)sink);
    return 0;
}
