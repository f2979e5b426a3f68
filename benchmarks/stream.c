/* STREAM-like kernels (OpenMP), built by benchmarks/stream.py with the same
 * flags as the baselines.  Bytes counted as in STREAM: no write-allocate
 * traffic (copy/scale: 2 arrays, add/triad: 3 arrays of doubles). */
#include <stdint.h>

void stream_init(double *restrict a, double *restrict b, double *restrict c, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.5; }
}

void stream_triad(double *restrict a, const double *restrict b, const double *restrict c,
                  double s, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

void stream_copy(double *restrict a, const double *restrict b, int64_t n)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = b[i];
}

/* read-only sum (the access pattern of a forward cost): 1 array read */
double stream_sum(const double *restrict b, int64_t n)
{
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+:total)
    for (int64_t i = 0; i < n / 16 * 16; i += 16) {
        double acc[16];
        for (int l = 0; l < 16; l++) acc[l] = b[i + l];
        double s = 0;
        for (int l = 0; l < 16; l++) s += acc[l];
        total += s;
    }
    return total;
}
