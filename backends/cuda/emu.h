/* emu.h - the CUDA execution model on the CPU, so that the backend's kernels
 * and executor run in tests on machines without a GPU.
 *
 * A kernel's source is compiled as plain C++ against this header. A launch
 * runs its blocks one after another; the threads of a block are fibers
 * (each with its own stack) on one OS thread, switched only at barriers
 * (__syncthreads, __syncwarp, the shuffles), so a block's shared memory is
 * plain static storage. Threads that wait at different barriers are
 * reported, not left to hang. Streams keep their work queued until
 * something waits for it, then run it in an order drawn at random among
 * those the streams and events allow (WEFT_CUDA_EMU_SEED), so that a
 * missing wait between two streams shows as a wrong result. */
#ifndef WEFT_CUDA_EMU_H
#define WEFT_CUDA_EMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* One emulated thread. */
struct emu_thread {
  dim3 tid;
  int lane, warp;
  unsigned mma;   /* the warp matrix products it asked for (emu_wmma.h) */
  unsigned wg;    /* its warpgroup products in flight (wgmma.cuh): none at its end */
};

extern emu_thread *emu_self;
/* The running thread's index in its block. */
static inline int emu_index() { return emu_self->warp * 32 + emu_self->lane; }
/* Numbers the blocks run, from 1. */
extern uint64_t emu_block_serial;
extern dim3 emu_block_idx, emu_block_dim, emu_grid_dim;
extern unsigned char *emu_dyn_smem;

#define threadIdx (emu_self->tid)
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim
#define warpSize 32

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define __restrict__

/* Barriers: every live thread of the block (or warp) arrives, then all go on. */
void emu_syncthreads();
void emu_syncwarp();
#define __syncthreads() emu_syncthreads()
#define __syncwarp(...) emu_syncwarp()

/* Lane `src` of this thread's warp gets what this thread offers. */
uint64_t emu_exchange(uint64_t mine, int src);
/* Every lane of this thread's warp offers a value; all meet once, and each
 * gets the warp's 32 values (valid until its next shuffle but one). */
const uint64_t *emu_gather(uint64_t mine);

/* A butterfly of xor shuffles, v = op(v, the value of lane ^ o) for o = 16,
 * 8, 4, 2, 1, after one meeting instead of five: for an op that commutes
 * (a sum, a maximum) every lane ends with lane 0's value, whose sums are
 * those of lanes l and l + o at each step. The bits of the five shuffles. */
template <class V, class Op> static inline V emu_butterfly(V v, Op op) {
  static_assert(sizeof(V) <= 8, "a shuffle moves at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(V));
  const uint64_t *all = emu_gather(bits);
  V a[32];
  for (int l = 0; l < 32; l++) std::memcpy(&a[l], &all[l], sizeof(V));
  for (int o = 16; o > 0; o >>= 1)
    for (int l = 0; l < o; l++) a[l] = op(a[l], a[l + o]);
  return a[0];
}

template <class T> static inline T emu_shfl_from(T v, int src) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = emu_exchange(bits, src);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  int lane = emu_self->lane;
  return emu_shfl_from(v, (lane & ~(width - 1)) + (src & (width - 1)));
}

template <class T> static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  int lane = emu_self->lane, src = lane ^ mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return emu_shfl_from(v, src);
}

template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = emu_self->lane, src = lane + (int)delta;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return emu_shfl_from(v, src);
}

/* The lanes of this thread's warp whose p is true, as bits (one barrier). */
unsigned emu_ballot(bool p);
static inline unsigned __ballot_sync(unsigned mask, int p) { return emu_ballot(p != 0) & mask; }
static inline int __popc(unsigned m) { return __builtin_popcount(m); }

/* A kernel's misuse that a GPU would not report but the emulation sees (a
 * warpgroup product's operand written while the product was in flight,
 * wgmma.cuh): kept as a fault is, the first one, for the runtime's next
 * check; the kernel runs on. */
void emu_report(const char *what);

/* Threads switch only at barriers: a read-modify-write is atomic. */
template <class T> static inline T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }

/* ---- streams and launches --------------------------------------------------------- */

struct emu_stream;
/* Queues a block-by-block run of body on s (NULL: the default stream);
 * kernel: the kernel's function, counted under WEFT_CUDA_EMU_LAUNCHES. */
void emu_launch(emu_stream *s, dim3 grid, dim3 block, size_t smem, std::function<void()> body,
                const void *kernel = nullptr);
/* The emulated GPU: compute capability 9.0, whose blocks may ask for 227
 * KiB of dynamic shared memory, unless WEFT_CUDA_EMU_CC names another
 * (7.0, 7.5, 8.0, 8.6, 8.7, 8.9, 9.0, 10.0 or 12.0, with that capability's
 * most: 7.5 64 KiB, 8.0 163 KiB, 8.6 99 KiB, ...), so that what the backend
 * does on an A100, a consumer GPU or one it refuses runs here too. known:
 * false where WEFT_CUDA_EMU_CC names none of them (gpu_count then fails). */
struct emu_gpu {
  int major, minor;
  size_t smem_most;
  bool known;
};
emu_gpu emu_device();
/* The capabilities WEFT_CUDA_EMU_CC may name, "7.0, 7.5, ...". */
std::string emu_device_names();
/* cudaFuncSetAttribute's cudaFuncAttributeMaxDynamicSharedMemorySize: a
 * launch of kernel with more dynamic shared memory than 48 KiB or this
 * fails, as more than emu_device()'s most does. */
void emu_allow_smem(const void *kernel, size_t bytes);
/* Counts a call of fn under WEFT_CUDA_EMU_LAUNCHES as a launch (gpu_zero's
 * clearings), without running anything. */
void emu_count(const void *fn);
/* Shared memory's banks: a warp's access that the hardware serves in
 * `wavefronts` passes where `ideal` would do without bank conflicts,
 * counted for the running kernel (the emulated ldmatrix, mma.cuh); with
 * WEFT_CUDA_EMU_BANKS=FILE, written to FILE at exit. */
void emu_smem_wavefronts(long ideal, long wavefronts);
/* What kernel's launches so far counted: accesses, wavefronts and the
 * wavefronts without conflicts (false: none). */
bool emu_smem_counts(const void *kernel, long counts[3]);
/* Queues host work on s. */
void emu_enqueue(emu_stream *s, std::function<void()> work);
/* Queues host work on s that may run only once ready() answers true: work
 * that waits for another process (the stand-in for NCCL across processes),
 * so that the streams of this one go on meanwhile. */
void emu_enqueue_when(emu_stream *s, std::function<bool()> ready, std::function<void()> work);
/* Runs what can run now; true when nothing is left queued (false: some
 * work waits for another process). */
bool emu_progress();
/* Whether the point of a stream that emu_record numbered has run. */
bool emu_recorded(uint64_t id);

#endif
