/* polyad's stand-in for <math.h>: the declarations the C frontend maps to
   intrinsics (pycparser cannot parse the system header). */
#ifndef POLYAD_FAKE_MATH_H
#define POLYAD_FAKE_MATH_H
double exp(double); float expf(float); double exp2(double); float exp2f(float);
double log(double); float logf(float); double log2(double); float log2f(float);
double log10(double); float log10f(float);
double sin(double); float sinf(float); double cos(double); float cosf(float);
double tan(double); float tanf(float); double sinh(double); float sinhf(float);
double cosh(double); float coshf(float); double tanh(double); float tanhf(float);
double asin(double); float asinf(float); double acos(double); float acosf(float);
double atan(double); float atanf(float); double asinh(double); float asinhf(float);
double acosh(double); float acoshf(float); double atanh(double); float atanhf(float);
double sqrt(double); float sqrtf(float); double erf(double); float erff(float);
double erfc(double); float erfcf(float); double floor(double); float floorf(float);
double ceil(double); float ceilf(float); double fabs(double); float fabsf(float);
double pow(double, double); float powf(float, float);
double atan2(double, double); float atan2f(float, float);
double fmin(double, double); float fminf(float, float);
double fmax(double, double); float fmaxf(float, float);
#define M_PI 3.14159265358979323846
#define M_E 2.7182818284590452354
#define INFINITY (1.0f / 0.0f)
#endif
