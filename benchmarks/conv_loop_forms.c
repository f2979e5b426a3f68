/* The conv layer's inner loop in several forms, timed where its rows sit in the L1 cache.

   Why: polyad's conv kernels (forward, the gradient's recompute, its d_x gather) are
   loops over a row v that add the 9 taps of one input channel into the sums of a block
   of output channels, in plain C under 'omp simd' (what polyad emits). On an AVX-512
   Zen 4 the forward reaches about 30 % of the multiply-add peak at every size
   (benchmarks/README.md, thirty-fourth round). This program asks how much of that
   is the loop's form, with nothing else in the way: one thread, a row of W = 512
   floats, 4 input channels, the rows in L1.

   Forms (each computes the same sums; clf_error gives the largest relative difference
   of one pass's sums from a float64 computation of them):
     plain NB    the loop as polyad prints it, NB output channels per pass (1, 2, 4, 8):
                 'omp simd' over v, the NB sums of 9 products each in one statement;
     vector NB   the same with GCC vector types (vector_size(64)): 9 input vectors loaded
                 once per 16 values of v, each used by the NB sums;
     intrin NB   AVX-512 intrinsics, the 9 input vectors in registers, each sum as three
                 partial sums of 3 products (shorter chains of dependent adds);
     intrin 8a   the same, 8 channels, the sums' rows aligned to 64 bytes.

   benchmarks/conv_loop_forms.py builds this file with polyad's flags (benchmarks/cbuild.py)
   and prints the table: python benchmarks/conv_loop_forms.py. The intrinsic forms need
   AVX-512 (-march=native on such a CPU); elsewhere they are left out. GFLOP/s count a
   multiply-add as two operations. */
#include <math.h>
#include <time.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define W 512
#define CI 4
#define CO 8

static float X[CI][3][W + 32] __attribute__((aligned(64)));
static float S[CO][W + 48] __attribute__((aligned(64)));
static float Wt[CO][CI][9];

static double now(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* the taps of channels co0 .. co0 + NB - 1 for input channel ci */
#define TAPS(NB) \
  float wl[NB][9]; \
  for (int j = 0; j < NB; j++) \
    for (int k = 0; k < 9; k++) \
      wl[j][k] = Wt[co0 + j][ci][k];

#define PLAIN(NB) \
static void plain##NB(int co0) \
{ \
  for (int ci = 0; ci < CI; ci++) { \
    TAPS(NB) \
    const float *restrict x0 = X[ci][0], *restrict x1 = X[ci][1], *restrict x2 = X[ci][2]; \
    _Pragma("omp simd") \
    for (int v = 1; v < W - 1; v++) { \
      for (int j = 0; j < NB; j++) \
        S[j][v] += wl[j][0] * x0[v - 1] + wl[j][1] * x0[v] + wl[j][2] * x0[v + 1] \
                 + wl[j][3] * x1[v - 1] + wl[j][4] * x1[v] + wl[j][5] * x1[v + 1] \
                 + wl[j][6] * x2[v - 1] + wl[j][7] * x2[v] + wl[j][8] * x2[v + 1]; \
    } \
  } \
}
PLAIN(1) PLAIN(2) PLAIN(4) PLAIN(8)

typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));

#define VECTOR(NB) \
static void vector##NB(int co0) \
{ \
  for (int ci = 0; ci < CI; ci++) { \
    TAPS(NB) \
    const float *x0 = X[ci][0], *x1 = X[ci][1], *x2 = X[ci][2]; \
    int v = 1; \
    for (; v + 16 <= W - 1; v += 16) { \
      v16 a0 = *(const v16 *)(x0 + v - 1), a1 = *(const v16 *)(x0 + v); \
      v16 a2 = *(const v16 *)(x0 + v + 1), b0 = *(const v16 *)(x1 + v - 1); \
      v16 b1 = *(const v16 *)(x1 + v), b2 = *(const v16 *)(x1 + v + 1); \
      v16 c0 = *(const v16 *)(x2 + v - 1), c1 = *(const v16 *)(x2 + v); \
      v16 c2 = *(const v16 *)(x2 + v + 1); \
      for (int j = 0; j < NB; j++) \
        *(v16 *)(S[j] + v) += wl[j][0] * a0 + wl[j][1] * a1 + wl[j][2] * a2 \
                            + wl[j][3] * b0 + wl[j][4] * b1 + wl[j][5] * b2 \
                            + wl[j][6] * c0 + wl[j][7] * c1 + wl[j][8] * c2; \
    } \
    for (; v < W - 1; v++) \
      for (int j = 0; j < NB; j++) \
        S[j][v] += wl[j][0] * x0[v - 1] + wl[j][1] * x0[v] + wl[j][2] * x0[v + 1] \
                 + wl[j][3] * x1[v - 1] + wl[j][4] * x1[v] + wl[j][5] * x1[v + 1] \
                 + wl[j][6] * x2[v - 1] + wl[j][7] * x2[v] + wl[j][8] * x2[v + 1]; \
  } \
}
VECTOR(2) VECTOR(4) VECTOR(8)

#ifdef __AVX512F__
/* FIRST: the first v (1, or 16 for rows aligned to 64 bytes); the values of v left over
   at the ends are not computed (the same count for every form that uses it) */
#define INTRIN(NAME, NB, FIRST) \
static void NAME(int co0) \
{ \
  for (int ci = 0; ci < CI; ci++) { \
    TAPS(NB) \
    const float *x0 = X[ci][0], *x1 = X[ci][1], *x2 = X[ci][2]; \
    for (int v = FIRST; v + 16 <= W - 1; v += 16) { \
      __m512 xv[9]; \
      xv[0] = _mm512_loadu_ps(x0 + v - 1); \
      xv[1] = _mm512_loadu_ps(x0 + v); \
      xv[2] = _mm512_loadu_ps(x0 + v + 1); \
      xv[3] = _mm512_loadu_ps(x1 + v - 1); \
      xv[4] = _mm512_loadu_ps(x1 + v); \
      xv[5] = _mm512_loadu_ps(x1 + v + 1); \
      xv[6] = _mm512_loadu_ps(x2 + v - 1); \
      xv[7] = _mm512_loadu_ps(x2 + v); \
      xv[8] = _mm512_loadu_ps(x2 + v + 1); \
      for (int j = 0; j < NB; j++) { \
        __m512 a = _mm512_loadu_ps(S[j] + v); \
        __m512 b = _mm512_mul_ps(_mm512_set1_ps(wl[j][3]), xv[3]); \
        __m512 c = _mm512_mul_ps(_mm512_set1_ps(wl[j][6]), xv[6]); \
        for (int k = 0; k < 3; k++) \
          a = _mm512_fmadd_ps(_mm512_set1_ps(wl[j][k]), xv[k], a); \
        for (int k = 4; k < 6; k++) \
          b = _mm512_fmadd_ps(_mm512_set1_ps(wl[j][k]), xv[k], b); \
        for (int k = 7; k < 9; k++) \
          c = _mm512_fmadd_ps(_mm512_set1_ps(wl[j][k]), xv[k], c); \
        _mm512_storeu_ps(S[j] + v, _mm512_add_ps(a, _mm512_add_ps(b, c))); \
      } \
    } \
  } \
}
INTRIN(intrin2, 2, 1) INTRIN(intrin4, 4, 1) INTRIN(intrin8, 8, 1) INTRIN(intrin8a, 8, 16)
#endif

struct form {
  const char *name;
  void (*pass)(int);
  int block;   /* output channels per pass */
  int first;   /* first value of v computed */
  int whole;   /* only whole vectors of 16 values of v */
};

static const struct form forms[] = {
  {"plain 1", plain1, 1, 1, 0}, {"plain 2", plain2, 2, 1, 0},
  {"plain 4", plain4, 4, 1, 0}, {"plain 8", plain8, 8, 1, 0},
  {"vector 2", vector2, 2, 1, 0}, {"vector 4", vector4, 4, 1, 0},
  {"vector 8", vector8, 8, 1, 0},
#ifdef __AVX512F__
  {"intrin 2", intrin2, 2, 1, 1}, {"intrin 4", intrin4, 4, 1, 1},
  {"intrin 8", intrin8, 8, 1, 1}, {"intrin 8a", intrin8a, 8, 16, 1},
#endif
};

static void fill_inputs(void)
{
  for (int c = 0; c < CI; c++)
    for (int r = 0; r < 3; r++)
      for (int v = 0; v < W + 32; v++)
        X[c][r][v] = (float)((v * 7 + r + c) % 13) * 0.1f;
  for (int o = 0; o < CO; o++)
    for (int c = 0; c < CI; c++)
      for (int k = 0; k < 9; k++)
        Wt[o][c][k] = (float)((o + c + k) % 5) * 0.01f;
}

/* one past the last value of v form f computes */
static int last_value(const struct form *f)
{
  return f->whole ? f->first + (W - 1 - f->first) / 16 * 16 : W - 1;
}

/* how many forms this build has */
int clf_count(void)
{
  return (int)(sizeof forms / sizeof forms[0]);
}

/* the name of form f */
const char *clf_name(int f)
{
  return forms[f].name;
}

/* the largest relative difference between one pass of form f from zero sums and the
   same sums in float64 */
double clf_error(int f)
{
  const struct form *form = &forms[f];
  fill_inputs();
  for (int o = 0; o < CO; o++)
    for (int v = 0; v < W + 48; v++)
      S[o][v] = 0.0f;
  form->pass(0);
  double worst = 0.0;
  for (int j = 0; j < form->block; j++)
    for (int v = form->first; v < last_value(form); v++) {
      double want = 0.0;
      for (int c = 0; c < CI; c++)
        for (int k = 0; k < 9; k++)
          want += (double)Wt[j][c][k] * X[c][k / 3][v - 1 + k % 3];
      const double err = fabs(S[j][v] - want) / (1.0 + fabs(want));
      worst = err > worst ? err : worst;
    }
  return worst;
}

/* GFLOP/s of form f over `passes` channel-passes (in blocks of its channels), the best
   of `rounds` */
double clf_gflops(int f, int passes, int rounds)
{
  const struct form *form = &forms[f];
  fill_inputs();
  const int calls = passes / form->block;
  double best = 1e30;
  for (int r = 0; r < rounds; r++) {
    const double t0 = now();
    for (int i = 0; i < calls; i++)
      form->pass(0);
    const double dt = now() - t0;
    best = dt < best ? dt : best;
  }
  const double flops = 2.0 * 9 * CI * (last_value(form) - form->first) * (double)calls
                       * form->block;
  return flops / best / 1e9;
}
