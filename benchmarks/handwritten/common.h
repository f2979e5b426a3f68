/* Shared definitions for the hand-written baselines.
 *
 * Every baseline is compiled twice by benchmarks/cbuild.py:
 *   cc -O3 -march=native -fopenmp -shared -fPIC -DBENCH_F32   (real = float)
 *   cc -O3 -march=native -fopenmp -shared -fPIC               (real = double)
 * No -ffast-math: like polyad's generated code, floating-point reductions
 * are vectorized by hand with LANES independent partial sums (gcc does not
 * reassociate a plain `s += ...` loop, and `#pragma omp simd reduction`
 * was measured slower than explicit partial sums with gcc 12).
 *
 * Conventions: arrays are C-contiguous row-major; sizes are int64_t;
 * scalar costs are returned as double (accumulated per row in `real`
 * partial sums, then across rows in double).
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef BENCH_F32
typedef float real;
#define RABS fabsf
#define LANES 32 /* two AVX-512 vectors of float */
#else
typedef double real;
#define RABS fabs
#define LANES 16 /* two AVX-512 vectors of double */
#endif

#define R(x) ((real)(x))

/* sign with sign(0) = 0 (the derivative polyad and Quasar give |x| at 0);
 * branch-free, vectorizes to two compares and a subtraction. */
static inline real sgn(real d) { return (real)(d > 0) - (real)(d < 0); }

static inline int64_t clampi(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Sum of LANES partial accumulators. */
static inline double lanes_sum(const real *acc)
{
    double s = 0;
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

#endif
