/* Hand-written CUDA baselines for benchmarks/cuda.py (float32, row-major):
 * the TV gradient in gather form (one thread per output element, 32x8 blocks)
 * and a grid-stride copy kernel (the bandwidth reference).
 *
 * TV cost (clamped borders): sum (g-b)^2 + lam |g[m,n-1]-g[m,n]| + lam |g[m-1,n]-g[m,n]|. */
#include <cuda_runtime.h>
#include <stdint.h>

static __device__ __forceinline__ float sgn(float x) { return (float)((x > 0.f) - (x < 0.f)); }

static __global__ void tv_grad_kernel(const float *__restrict__ g, const float *__restrict__ b,
                                      float lam, float *__restrict__ d, int M, int N)
{
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int m = blockIdx.y * blockDim.y + threadIdx.y;
  if (m >= M || n >= N)
    return;
  const int64_t i = (int64_t)m * N + n;
  const float c = g[i];
  float r = 2.f * (c - b[i]);
  if (n >= 1)
    r -= lam * sgn(g[i - 1] - c);
  if (n + 1 < N)
    r += lam * sgn(c - g[i + 1]);
  if (m >= 1)
    r -= lam * sgn(g[i - N] - c);
  if (m + 1 < M)
    r += lam * sgn(c - g[i + N]);
  d[i] = r;
}

static __global__ void copy_kernel(const float4 *__restrict__ src, float4 *__restrict__ dst,
                                   int64_t n4)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
       i += (int64_t)blockDim.x * gridDim.x)
    dst[i] = src[i];
}

extern "C" int tv_grad(const float *g, const float *b, float lam, float *d, int M, int N)
{
  dim3 block(32, 8), grid((N + 31) / 32, (M + 7) / 8);
  tv_grad_kernel<<<grid, block>>>(g, b, lam, d, M, N);
  return (int)cudaGetLastError();
}

/* n: float count, a multiple of 4 */
extern "C" int copy_f32(const float *src, float *dst, int64_t n)
{
  copy_kernel<<<1024, 256>>>((const float4 *)src, (float4 *)dst, n / 4);
  return (int)cudaGetLastError();
}
