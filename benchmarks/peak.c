/* The machine's multiply-add peak, for the benchmarks that compute more than they move
 * (the conv layer): every thread runs LANES independent chains a = a * m + c, LANES
 * (PEAK_LANES_F32, PEAK_LANES_F64) being enough vectors of lanes to hide the latency of
 * a fused multiply-add and few enough to stay in registers (peak.py sizes them for the
 * host's vector unit). Built with polyad's flags, so the compiler vectorizes and
 * contracts them as it does polyad's C. */
#include <omp.h>
#include <stdint.h>

/* the threads a parallel region runs, as the peak counts them */
int peak_threads(void)
{
  return omp_get_max_threads();
}

#define PEAK(NAME, T, LANES)                                           \
  double NAME(int64_t n)                                               \
  {                                                                    \
    double checksum = 0;                                               \
    _Pragma("omp parallel reduction(+:checksum)")                      \
    {                                                                  \
      T a[LANES];                                                      \
      const T m = (T)0.999999, c = (T)1e-7;                            \
      _Pragma("omp simd")                                              \
      for (int k = 0; k < LANES; k++)                                  \
        a[k] = (T)1 + (T)k * (T)1e-3;                                  \
      for (int64_t i = 0; i < n; i++) {                                \
        _Pragma("omp simd")                                            \
        for (int k = 0; k < LANES; k++)                                \
          a[k] = a[k] * m + c;                                         \
      }                                                                \
      for (int k = 0; k < LANES; k++)                                  \
        checksum += a[k];                                              \
    }                                                                  \
    return checksum;                                                   \
  }

PEAK(peak_f32, float, PEAK_LANES_F32)
PEAK(peak_f64, double, PEAK_LANES_F64)
