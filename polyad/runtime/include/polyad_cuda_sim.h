/* polyad_cuda_sim.h: sequential CPU definitions of the CUDA built-ins and of
 * polyad's device helpers, so that a C++ compiler runs the same generated
 * kernel text that nvcc compiles (polyad's target "cuda-sim", in the spirit
 * of Numba's CUDA simulator). Included by polyad_cuda.h when __CUDACC__ is
 * not defined; never included directly.
 *
 * A launch runs its blocks one after the other and, inside a block, its
 * threads one after the other, each from the kernel's first line to its last.
 * That is a valid CUDA execution order only for code without barriers, so
 * generated kernels keep every barrier inside the helpers, and the helpers
 * here do directly what their CUDA versions achieve with cooperation:
 * a block reduction adds each thread's partial straight into the target,
 * a privatized array is the global array itself, atomics are plain updates.
 * "Device" memory is host memory.
 */
#ifndef POLYAD_CUDA_SIM_H
#define POLYAD_CUDA_SIM_H

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;

/* The launch being simulated (per host thread: concurrent calls stay apart). */
static thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;

static inline int pa_thread_rank(void)
{
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

static inline int64_t pa_block_rank(void)
{
  return blockIdx.x + (int64_t)gridDim.x * (blockIdx.y + (int64_t)gridDim.y * blockIdx.z);
}

template <typename Body>
static void pa_sim_launch(dim3 grid, dim3 block, Body body)
{
  gridDim = grid;
  blockDim = block;
  for (unsigned int bz = 0; bz < grid.z; ++bz)
    for (unsigned int by = 0; by < grid.y; ++by)
      for (unsigned int bx = 0; bx < grid.x; ++bx) {
        blockIdx = uint3(bx, by, bz);
        for (unsigned int tz = 0; tz < block.z; ++tz)
          for (unsigned int ty = 0; ty < block.y; ++ty)
            for (unsigned int tx = 0; tx < block.x; ++tx) {
              threadIdx = uint3(tx, ty, tz);
              body();
            }
      }
}

#define PA_LAUNCH(kernel, grid, block, smem, ...)                                  \
  do {                                                                             \
    if (pa_ok())                                                                   \
      pa_sim_launch((grid), (block), [&]() { kernel(__VA_ARGS__); });              \
  } while (0)

template <typename T> static inline T pa_atomic_add(T *p, T v) { T old = *p; *p = old + v; return old; }
template <typename T> static inline T pa_atomic_mul(T *p, T v) { T old = *p; *p = old * v; return old; }
static inline float atomicAdd(float *p, float v) { return pa_atomic_add(p, v); }
static inline double atomicAdd(double *p, double v) { return pa_atomic_add(p, v); }
static inline int32_t atomicAdd(int32_t *p, int32_t v) { return pa_atomic_add(p, v); }
static inline int64_t atomicAdd(int64_t *p, int64_t v) { return pa_atomic_add(p, v); }
static inline uint32_t atomicOr(uint32_t *p, uint32_t v) { uint32_t old = *p; *p = old | v; return old; }

/* Threads run one after the other, so each adds its partial directly. */
template <typename T> static inline void pa_reduce_add(T *global, T partial) { *global += partial; }
template <typename T> static inline void pa_reduce_mul(T *global, T partial) { *global *= partial; }
template <typename T> static inline void pa_reduce_store(T *partials, T partial)
{
  partials[pa_block_rank()] += partial;  /* the host zeroes the partials before the launch */
}

template <typename T>
static inline void pa_sum_partials(T *global, const T *partials, int64_t n)
{
  T total = 0;
  for (int64_t i = 0; i < n; ++i)
    total += partials[i];
  *global += total;
}

template <typename T>
static inline T *pa_privatize_begin(T *global, int64_t n, int64_t offset, int64_t smem_bytes)
{
  (void)n; (void)offset; (void)smem_bytes;
  return global;
}

template <typename T>
static inline void pa_privatize_end(T *global, T *block_copy, int64_t n)
{
  (void)global; (void)block_copy; (void)n;
}

/* ---- host API: "device" memory is host memory ---------------------------- */
extern "C" int pa_device_count(void) { return 1; }

extern "C" void *pa_device_alloc(int64_t bytes)
{
  void *p = malloc(bytes > 0 ? (size_t)bytes : 1);
  if (!p)
    pa_fail("pa_device_alloc", "out of memory");
  return p;
}

extern "C" void pa_device_free(void *p) { free(p); }

extern "C" int pa_copy_to_device(void *dst, const void *src, int64_t bytes)
{
  if (bytes > 0)
    memcpy(dst, src, (size_t)bytes);
  return 1;
}

extern "C" int pa_copy_to_host(void *dst, const void *src, int64_t bytes)
{
  if (bytes > 0)
    memcpy(dst, src, (size_t)bytes);
  return 1;
}

extern "C" int pa_device_zero(void *p, int64_t bytes)
{
  if (bytes > 0)
    memset(p, 0, (size_t)bytes);
  return 1;
}

extern "C" int pa_synchronize(void) { return pa_ok(); }

#define PA_SHARED_LIMIT 49152

#endif /* POLYAD_CUDA_SIM_H */
