/* polyad_cuda.h: the runtime header of polyad's generated CUDA C.
 *
 * Generated kernels keep every form of block-level cooperation (reductions,
 * shared-memory accumulation, barriers) inside the small helpers below, so
 * that the same kernel text also compiles with a plain C++ compiler against
 * polyad_cuda_sim.h, which gives the helpers sequential CPU definitions
 * (polyad's target "cuda-sim"). Compiled by nvcc (__CUDACC__ defined) this
 * header is the real thing; otherwise it includes the simulator.
 *
 * Helpers a generated kernel calls (T is float, double, int32_t or int64_t):
 *   pa_reduce_add(T *global, T partial)   every thread of the block calls it
 *       once with its partial sum; the block sums them (warp shuffles, then
 *       shared memory) and thread 0 adds the block's sum with one atomicAdd.
 *   pa_reduce_mul(T *global, T partial)   the same for a product.
 *   pa_reduce_store(T *partials, T partial)   deterministic first pass: the
 *       block's sum goes to partials[linear block index] (no atomics); the
 *       host then calls pa_sum_partials(global, partials, n), which adds them
 *       in a fixed order.
 *   pa_privatize_begin(T *global, n, offset, smem_bytes) -> T *
 *       a zeroed block-private copy of a small scatter target in dynamic
 *       shared memory (or the global array itself when it does not fit);
 *       updates go to it with atomicAdd (shared-memory atomics);
 *   pa_privatize_end(T *global, T *block_copy, n)   adds the block's copy
 *       to the global array, one atomicAdd per nonzero element.
 *   pa_atomic_add(T *address, T value)    atomicAdd for every T; atomicAdd(int64_t *, int64_t)
 *       is defined too, so generated code spells every atomic update atomicAdd.
 * Host side, exported from every library (extern "C"): pa_last_error,
 * pa_device_count, pa_device_alloc/free, pa_copy_to_device/host, pa_device_zero,
 * pa_synchronize; launches go through PA_LAUNCH(kernel, grid, block, smem, args...).
 * Double-precision atomicAdd needs compute capability 6.0 or newer.
 */
#ifndef POLYAD_CUDA_H
#define POLYAD_CUDA_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- error state of the calling host thread ------------------------------ */
static thread_local char pa_error_text[1024];
static thread_local int pa_error_set;

static inline int pa_ok(void) { return !pa_error_set; }

static inline void pa_fail(const char *what, const char *message)
{
  if (pa_error_set)
    return;  /* the first error is the one worth reporting */
  snprintf(pa_error_text, sizeof pa_error_text, "%s: %s", what, message);
  pa_error_set = 1;
}

#ifdef __CUDACC__
/* ========================================================================= */
/* CUDA                                                                      */
/* ========================================================================= */
#include <cuda_runtime.h>

static inline int pa_check(cudaError_t err, const char *what)
{
  if (err != cudaSuccess) {
    pa_fail(what, cudaGetErrorString(err));
    /* the runtime also keeps a failed call's error as its "last error": clear it, or the
       next launch's cudaGetLastError() reports this failure again (e.g. one refused
       allocation would fail every later call; sticky errors stay, as they must) */
    cudaGetLastError();
    return 0;
  }
  return 1;
}

#define PA_LAUNCH(kernel, grid, block, smem, ...)                      \
  do {                                                                 \
    if (pa_ok()) {                                                     \
      kernel<<<(grid), (block), (smem)>>>(__VA_ARGS__);                \
      pa_check(cudaGetLastError(), "launching " #kernel);              \
    }                                                                  \
  } while (0)

static __device__ __forceinline__ int pa_thread_rank(void)
{
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

static __device__ __forceinline__ int pa_block_threads(void)
{
  return blockDim.x * blockDim.y * blockDim.z;
}

static __device__ __forceinline__ int64_t pa_block_rank(void)
{
  return blockIdx.x + (int64_t)gridDim.x * (blockIdx.y + (int64_t)gridDim.y * blockIdx.z);
}

static __device__ __forceinline__ float pa_atomic_add(float *p, float v) { return atomicAdd(p, v); }
static __device__ __forceinline__ double pa_atomic_add(double *p, double v) { return atomicAdd(p, v); }
static __device__ __forceinline__ int32_t pa_atomic_add(int32_t *p, int32_t v) { return atomicAdd(p, v); }
static __device__ __forceinline__ int64_t pa_atomic_add(int64_t *p, int64_t v)
{
  /* two's complement: the unsigned sum has the bits of the signed one */
  return (int64_t)atomicAdd((unsigned long long *)p, (unsigned long long)v);
}
/* CUDA has no atomicAdd for int64_t (long): generated code calls atomicAdd on every type. */
static __device__ __forceinline__ int64_t atomicAdd(int64_t *p, int64_t v) { return pa_atomic_add(p, v); }

/* Atomic multiply by compare-and-swap on the value's bits. */
static __device__ inline double pa_atomic_mul(double *p, double v)
{
  unsigned long long *bits = (unsigned long long *)p, old = *bits, seen;
  do {
    seen = old;
    old = atomicCAS(bits, seen, __double_as_longlong(__longlong_as_double(seen) * v));
  } while (old != seen);
  return __longlong_as_double(old);
}
static __device__ inline float pa_atomic_mul(float *p, float v)
{
  unsigned int *bits = (unsigned int *)p, old = *bits, seen;
  do {
    seen = old;
    old = atomicCAS(bits, seen, __float_as_uint(__uint_as_float(seen) * v));
  } while (old != seen);
  return __uint_as_float(old);
}
static __device__ inline int64_t pa_atomic_mul(int64_t *p, int64_t v)
{
  unsigned long long *bits = (unsigned long long *)p, old = *bits, seen;
  do {
    seen = old;
    old = atomicCAS(bits, seen, (unsigned long long)((int64_t)seen * v));
  } while (old != seen);
  return (int64_t)old;
}
static __device__ inline int32_t pa_atomic_mul(int32_t *p, int32_t v)
{
  unsigned int *bits = (unsigned int *)p, old = *bits, seen;
  do {
    seen = old;
    old = atomicCAS(bits, seen, (unsigned int)((int32_t)seen * v));
  } while (old != seen);
  return (int32_t)old;
}

struct pa_add_op {
  template <typename T> __device__ static T apply(T a, T b) { return a + b; }
  template <typename T> __device__ static T neutral(void) { return (T)0; }
};
struct pa_mul_op {
  template <typename T> __device__ static T apply(T a, T b) { return a * b; }
  template <typename T> __device__ static T neutral(void) { return (T)1; }
};

/* Combine one value per thread of the block; the result is valid in thread 0.
 * Every thread of the block must call it (it synchronizes the block); blocks
 * are whole warps (polyad launches 256 threads). The order is fixed by the
 * block shape, so the result is the same on every run. */
template <typename Op, typename T>
static __device__ T pa_block_combine(T v)
{
  __shared__ T warp_values[32];
  const int rank = pa_thread_rank(), lane = rank & 31, warp = rank >> 5;
  for (int offset = 16; offset > 0; offset >>= 1)
    v = Op::apply(v, __shfl_down_sync(0xffffffffu, v, offset));
  __syncthreads();  /* an earlier call's readers are done with warp_values */
  if (lane == 0)
    warp_values[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (pa_block_threads() + 31) >> 5;
    v = lane < warps ? warp_values[lane] : Op::template neutral<T>();
    for (int offset = 16; offset > 0; offset >>= 1)
      v = Op::apply(v, __shfl_down_sync(0xffffffffu, v, offset));
  }
  return v;
}

template <typename T>
static __device__ void pa_reduce_add(T *global, T partial)
{
  T block_sum = pa_block_combine<pa_add_op>(partial);
  if (pa_thread_rank() == 0)
    pa_atomic_add(global, block_sum);
}

template <typename T>
static __device__ void pa_reduce_mul(T *global, T partial)
{
  T block_product = pa_block_combine<pa_mul_op>(partial);
  if (pa_thread_rank() == 0)
    pa_atomic_mul(global, block_product);
}

template <typename T>
static __device__ void pa_reduce_store(T *partials, T partial)
{
  T block_sum = pa_block_combine<pa_add_op>(partial);
  if (pa_thread_rank() == 0)
    partials[pa_block_rank()] = block_sum;
}

/* Second pass of the deterministic reduction: one block sums the partials in
 * a fixed order (strided per thread, then the block tree) and adds the total. */
template <typename T>
static __global__ void pa_sum_partials_kernel(T *global, const T *partials, int64_t n)
{
  T v = 0;
  for (int64_t i = pa_thread_rank(); i < n; i += pa_block_threads())
    v += partials[i];
  v = pa_block_combine<pa_add_op>(v);
  if (pa_thread_rank() == 0)
    *global += v;
}

template <typename T>
static void pa_sum_partials(T *global, const T *partials, int64_t n)
{
  PA_LAUNCH(pa_sum_partials_kernel<T>, dim3(1), dim3(256), 0, global, partials, n);
}

static __device__ __forceinline__ unsigned char *pa_dynamic_shared(void)
{
  extern __shared__ __align__(16) unsigned char pa_shared_bytes[];
  return pa_shared_bytes;
}

template <typename T>
static __device__ T *pa_privatize_begin(T *global, int64_t n, int64_t offset, int64_t smem_bytes)
{
  if (offset + n * (int64_t)sizeof(T) > smem_bytes)
    return global;  /* too large for shared memory: atomics on the global array */
  T *block_copy = (T *)(pa_dynamic_shared() + offset);
  for (int64_t i = pa_thread_rank(); i < n; i += pa_block_threads())
    block_copy[i] = 0;
  __syncthreads();
  return block_copy;
}

template <typename T>
static __device__ void pa_privatize_end(T *global, T *block_copy, int64_t n)
{
  if (block_copy == global)
    return;
  __syncthreads();
  for (int64_t i = pa_thread_rank(); i < n; i += pa_block_threads())
    if (block_copy[i] != 0)
      pa_atomic_add(&global[i], block_copy[i]);
}

/* ---- host API -------------------------------------------------------- */
extern "C" int pa_device_count(void)
{
  int n = 0;
  if (!pa_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount"))
    return -1;
  return n;
}

/* Allocations are stream-ordered (cudaMallocAsync on the legacy default stream,
 * which every launch and copy here uses) from the device's default pool, whose
 * release threshold is raised once so that freed blocks stay in the pool: a
 * call's temporaries and scalars then cost no cudaMalloc/cudaFree (each of
 * which synchronizes the device) after the first call, as with PyTorch's
 * caching allocator. Devices without memory pools fall back to cudaMalloc. */
static int pa_pool_state;  /* 0 unknown, 1 pools, 2 plain cudaMalloc */

static int pa_use_pool(void)
{
  if (pa_pool_state == 0) {
    int dev = 0, supported = 0;
    cudaMemPool_t pool;
    pa_pool_state = 2;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess &&
        supported && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
      uint64_t keep = UINT64_MAX;
      if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess)
        pa_pool_state = 1;
    }
    cudaGetLastError();  /* a refused query above is not the caller's error */
  }
  return pa_pool_state == 1;
}

extern "C" void *pa_device_alloc(int64_t bytes)
{
  void *p = NULL;
  size_t n = bytes > 0 ? (size_t)bytes : 1;
  if (!pa_check(pa_use_pool() ? cudaMallocAsync(&p, n, 0) : cudaMalloc(&p, n), "cudaMalloc"))
    return NULL;
  return p;
}

extern "C" void pa_device_free(void *p)
{
  if (p)
    pa_check(pa_use_pool() ? cudaFreeAsync(p, 0) : cudaFree(p), "cudaFree");
}

extern "C" int pa_copy_to_device(void *dst, const void *src, int64_t bytes)
{
  return bytes <= 0 || pa_check(cudaMemcpy(dst, src, (size_t)bytes, cudaMemcpyHostToDevice),
                                "cudaMemcpy to the device");
}

extern "C" int pa_copy_to_host(void *dst, const void *src, int64_t bytes)
{
  return bytes <= 0 || pa_check(cudaMemcpy(dst, src, (size_t)bytes, cudaMemcpyDeviceToHost),
                                "cudaMemcpy to the host");
}

extern "C" int pa_device_zero(void *p, int64_t bytes)
{
  return bytes <= 0 || pa_check(cudaMemset(p, 0, (size_t)bytes), "cudaMemset");
}

extern "C" int pa_synchronize(void)
{
  return pa_check(cudaDeviceSynchronize(), "running the kernel");
}

/* Shared memory a block may use without opting in (48 KiB on every GPU since sm_30). */
#define PA_SHARED_LIMIT 49152

#else
/* ========================================================================= */
/* no nvcc: the sequential CPU simulator                                     */
/* ========================================================================= */
#include "polyad_cuda_sim.h"
#endif

/* ---- host API common to both ------------------------------------------- */
extern "C" const char *pa_last_error(void)
{
  return pa_error_set ? pa_error_text : NULL;
}

extern "C" void pa_clear_error(void)
{
  pa_error_set = 0;
  pa_error_text[0] = 0;
}

/* min, max, floor division and modulo of ISL's loop bounds (host and device code) */
static __host__ __device__ inline int64_t pa_imin(int64_t a, int64_t b) { return b < a ? b : a; }
static __host__ __device__ inline int64_t pa_imax(int64_t a, int64_t b) { return b > a ? b : a; }
static __host__ __device__ inline int64_t pa_ifloord(int64_t a, int64_t b)
{
  return (a >= 0) ? a / b : -((-a + b - 1) / b);
}
static __host__ __device__ inline int64_t pa_ifmod(int64_t a, int64_t b)
{
  return a - b * pa_ifloord(a, b);
}

/* Offsets of block-private arrays in dynamic shared memory stay 16-byte aligned. */
static __host__ __device__ inline int64_t pa_align16(int64_t bytes)
{
  return (bytes + 15) & ~(int64_t)15;
}

/* Blocks along one grid dimension for `extent` iterations of `threads`
 * threads each: grid-stride loops cover whatever a capped grid leaves. */
static inline unsigned int pa_blocks(int64_t extent, int threads)
{
  int64_t blocks = (extent + threads - 1) / threads;
  return (unsigned int)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

#endif /* POLYAD_CUDA_H */
