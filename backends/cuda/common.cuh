/* common.cuh - what every kernel file of the CUDA backend shares: storage
 * types and their conversions, launches, warp and block sums, and the
 * switch between nvcc and the CPU emulation (emu.h). */
#ifndef WEFT_CUDA_COMMON_CUH
#define WEFT_CUDA_COMMON_CUH

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#ifdef WEFT_CUDA_EMU
#include "emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include "gpu.h"

#define DEV __device__ __forceinline__
#define HD __host__ __device__ __forceinline__

/* ---- storage types ------------------------------------------------------------------- */

#ifdef WEFT_CUDA_EMU
struct bf16 {
  uint16_t x;
};
struct f16 {
  uint16_t x;
};

static inline uint32_t emu_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float emu_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float to_f(float v) { return v; }
static inline float to_f(bf16 v) { return emu_float((uint32_t)v.x << 16); }
static inline float to_f(f16 v) {
  uint32_t sign = (uint32_t)(v.x & 0x8000) << 16, e = (v.x >> 10) & 0x1f, m = v.x & 0x3ff;
  if (e == 0) {
    float f = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
    return sign ? -f : f;
  }
  if (e == 31) return emu_float(sign | 0x7f800000u | (m << 13));
  return emu_float(sign | ((e + 112) << 23) | (m << 13));
}

template <class T> static inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
/* Round to nearest, ties to even, as __float2bfloat16_rn. */
template <> inline bf16 from_f<bf16>(float v) {
  uint32_t u = emu_bits(v);
  bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.x = (uint16_t)((u >> 16) | 0x40);
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1);
  r.x = (uint16_t)(u >> 16);
  return r;
}
/* Round to nearest, ties to even, as __float2half_rn. */
template <> inline f16 from_f<f16>(float v) {
  uint32_t u = emu_bits(v), sign = (u >> 16) & 0x8000, ax = u & 0x7fffffffu;
  f16 r;
  if (ax >= 0x7f800000u) {
    r.x = (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    return r;
  }
  if (ax >= 0x477ff000u) {  /* 65520 and above round to infinity */
    r.x = (uint16_t)(sign | 0x7c00);
    return r;
  }
  uint32_t e = ax >> 23, q;
  if (ax < 0x38800000u) {   /* below 2^-14: a subnormal half */
    if (ax < 0x33000000u) {  /* at most 2^-25: rounds to zero */
      r.x = (uint16_t)sign;
      return r;
    }
    uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
    q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
  } else {
    uint32_t m = ax & 0x7fffffu, rem = m & 0x1fff;
    q = ((e - 112) << 10) | (m >> 13);
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
  }
  r.x = (uint16_t)(sign | q);
  return r;
}
#else
typedef __nv_bfloat16 bf16;
typedef __half f16;

HD float to_f(float v) { return v; }
HD float to_f(bf16 v) { return __bfloat162float(v); }
HD float to_f(f16 v) { return __half2float(v); }
template <class T> HD T from_f(float v);
template <> HD float from_f<float>(float v) { return v; }
template <> HD bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> HD f16 from_f<f16>(float v) { return __float2half_rn(v); }
#endif

/* exp in f32: the hardware's fast one on the GPU. */
#ifdef WEFT_CUDA_EMU
static inline float fexp(float x) { return expf(x); }
#else
DEV float fexp(float x) { return __expf(x); }
#endif

#ifdef WEFT_CUDA_EMU
#include "emu_wmma.h"
#endif

/* 16 bytes of T (E elements), loaded and stored whole; both at addresses
 * on 16 bytes (the emulation stops at one that is not). */
template <class T> struct alignas(16) pack16 {
  enum { E = 16 / (int)sizeof(T) };
  T e[E];
};
#ifdef WEFT_CUDA_EMU
static inline void pack16_aligned(const void *p) {
  if ((uintptr_t)p & 15) {
    fprintf(stderr, "a 16-byte access at %p, not aligned\n", p);
    abort();
  }
}
template <class T> static inline pack16<T> ld16(const T *p) {
  pack16_aligned(p);
  pack16<T> c;
  memcpy(&c, p, 16);
  return c;
}
template <class T> static inline void st16(T *p, const pack16<T> &c) {
  pack16_aligned(p);
  memcpy(p, &c, 16);
}
#else
template <class T> DEV pack16<T> ld16(const T *p) {
  uint4 u = *(const uint4 *)p;
  return *(const pack16<T> *)&u;
}
template <class T> DEV void st16(T *p, const pack16<T> &c) { *(uint4 *)p = *(const uint4 *)&c; }
#endif

/* x (+)= v, rounded once into the storage type. */
template <class T> DEV void put(T *x, float v, bool acc) { *x = from_f<T>(acc ? to_f(*x) + v : v); }

/* GELU with the tanh approximation (GPT-2's gelu_new) and its derivative:
 * the GELU kernels' and the emulation's of cuBLASLt's GELU epilogues. */
#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f
DEV float gelu_f(float v) { return 0.5f * v * (1.0f + tanhf(GELU_C * (v + GELU_A * v * v * v))); }
DEV float gelu_grad_f(float v) {
  float t = tanhf(GELU_C * (v + GELU_A * v * v * v));
  float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

/* Runs body with T the storage type of dt (f32, bf16 or f16). */
#define DISPATCH(dt, T, ...)                                                                   \
  do {                                                                                         \
    switch (dt) {                                                                              \
    case GPU_BF16: { typedef bf16 T; __VA_ARGS__; } break;                                     \
    case GPU_F16: { typedef f16 T; __VA_ARGS__; } break;                                       \
    default: { typedef float T; __VA_ARGS__; } break;                                          \
    }                                                                                          \
  } while (0)

/* ---- launches ------------------------------------------------------------------------ */

/* Dynamic shared memory of a kernel. */
#ifdef WEFT_CUDA_EMU
#define DYN_SMEM(T, name) T *name = (T *)emu_dyn_smem
#else
#define DYN_SMEM(T, name)                                                                      \
  extern __shared__ __align__(128) unsigned char weft_smem[];                                   \
  T *name = (T *)weft_smem
#endif

/* k<<<grid, block, smem, s>>>(args): nothing when the grid is empty. */
template <typename... KArgs, typename... Args>
static inline void launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, gpu_stream *s, Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
#ifdef WEFT_CUDA_EMU
  emu_launch((emu_stream *)s, grid, block, smem, [=]() { k(args...); }, (const void *)k);
#else
  k<<<grid, block, smem, (cudaStream_t)s>>>(args...);
#endif
}

/* Dynamic shared memory above the default 48 KiB for kernel k, asked for
 * before its launches: a launch that asks for more than it was allowed
 * fails, on a GPU and in the emulation (which also holds it to compute
 * capability 9.0's 227 KiB). */
template <typename... KArgs> static inline void allow_smem(void (*k)(KArgs...), size_t bytes) {
#ifdef WEFT_CUDA_EMU
  emu_allow_smem((const void *)k, bytes);
#else
  if (bytes > (48 << 10)) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
#endif
}

/* Blocks of `threads` for a grid-stride loop over n items. The emulation
 * runs few blocks, each thread taking many items: its threads are fibers,
 * and the loops are correct for any grid. */
#ifdef WEFT_CUDA_EMU
enum { MAX_STRIDE_BLOCKS = 4 };
#else
enum { MAX_STRIDE_BLOCKS = 8192 };
#endif

/* Threads of a block that takes one row (softmax, losses): any multiple of
 * 32 computes the same; the emulation runs fewer fibers. */
#ifdef WEFT_CUDA_EMU
enum { ROW_THREADS = 64, ROW_WARPS = 2 };
#else
enum { ROW_THREADS = 256, ROW_WARPS = 8 };
#endif
static inline unsigned blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? (n > 0 ? 1 : 0) : b > (int64_t)MAX_STRIDE_BLOCKS ? (int64_t)MAX_STRIDE_BLOCKS : b);
}

#define GRID_STRIDE(i, n)                                                                      \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---- sums ------------------------------------------------------------------------------ */

/* Every lane ends with the same bits: each step adds the same two values.
 * (The emulation computes the five steps at once, emu_butterfly.) */
#ifdef WEFT_CUDA_EMU
static inline float warp_sum(float v) {
  return emu_butterfly(v, [](float x, float y) { return x + y; });
}
static inline double warp_sum_d(double v) {
  return emu_butterfly(v, [](double x, double y) { return x + y; });
}
static inline float warp_max(float v) {
  return emu_butterfly(v, [](float x, float y) { return fmaxf(x, y); });
}
#else
DEV float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
DEV double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
DEV float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
#endif

/* The warp reduction WARP over the block, on every thread; sh holds 32
 * values, none is the reduction's identity. Every thread of the block
 * calls it. */
template <class V, V (*WARP)(V)>
DEV V block_reduce(V v, V *sh, V none) {
  v = WARP(v);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  V r = lane < nw ? sh[lane] : none;
  return WARP(r);
}
DEV float block_sum(float v, float *sh) { return block_reduce<float, warp_sum>(v, sh, 0.0f); }
DEV double block_sum_d(double v, double *sh) { return block_reduce<double, warp_sum_d>(v, sh, 0.0); }
DEV float block_max(float v, float *sh) { return block_reduce<float, warp_max>(v, sh, -INFINITY); }

/* The column sums of chunked partial sums: o1[j] (+)= the sum over c of
 * p1[c * h + j], and o2 from p2 likewise when o2 is not NULL (o1 NULL:
 * only o2). A warp per column: lane l adds chunks l, l + 32, ... in order,
 * then the warp's sum, so every run adds in the same order. */
template <class T>
__global__ void k_chunks_done(T *o1, const float *p1, T *o2, const float *p2, int64_t chunks, int64_t h, bool acc) {
  int64_t j = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (j >= h) return;
  int lane = threadIdx.x & 31;
  for (int o = 0; o < 2; o++) {
    T *out = o ? o2 : o1;
    const float *part = o ? p2 : p1;
    if (!out) continue;
    float sum = 0.0f;
    for (int64_t c = lane; c < chunks; c += 32) sum += part[c * h + j];
    sum = warp_sum(sum);
    if (lane == 0) put(&out[j], sum, acc);
  }
}

template <class T>
static inline void chunks_done(gpu_stream *s, T *o1, const float *p1, T *o2, const float *p2, int64_t chunks,
                               int64_t h, bool acc) {
  launch(k_chunks_done<T>, (unsigned)((h + 7) / 8), 256, 0, s, o1, p1, o2, p2, chunks, h, acc);
}

/* A running maximum m and sum s of exp(x - m), merged with another. */
DEV void softmax_merge(float &m, float &s, float m2, float s2) {
  float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = (m == -INFINITY ? 0.0f : s * fexp(m - mx)) + (m2 == -INFINITY ? 0.0f : s2 * fexp(m2 - mx));
  m = mx;
}

/* The maximum and the sum of exp(x - max) of a row, on every thread of the
 * block; sh holds 64 values. */
DEV void block_softmax_stats(float &m, float &s, float *sh) {
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    softmax_merge(m, s, m2, s2);
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) sh[w] = m, sh[32 + w] = s;
  __syncthreads();
  m = lane < nw ? sh[lane] : -INFINITY;
  s = lane < nw ? sh[32 + lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    softmax_merge(m, s, m2, s2);
  }
}

#endif
