/* cpasync.cuh - the backward attention kernels' copies to shared memory
 * (cp.async: 16 bytes, or 4, a thread at a time, committed in groups and
 * waited for by count) and 2^x, as the GPU runs them and as the CPU
 * emulation does (copies at once, exp2f). */
#ifndef WEFT_CUDA_CPASYNC_CUH
#define WEFT_CUDA_CPASYNC_CUH

#include "common.cuh"

#ifdef WEFT_CUDA_EMU
#include <cstdio>
#include <cstdlib>
#include <cstring>
#endif

/* 2^x, the hardware's approximation on the GPU (2^-inf = 0). */
#ifdef WEFT_CUDA_EMU
inline float fexp2(float x) { return exp2f(x); }
#else
DEV float fexp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
#endif

#ifdef WEFT_CUDA_EMU
inline void fa_aligned(const void *p) {
  if ((uintptr_t)p & 15) {
    fprintf(stderr, "cp.async: a 16-byte copy at %p, not aligned\n", p);
    abort();
  }
}
/* The emulation copies at once: the waits that follow only order more. */
inline void cp16(void *dst, const void *src) {
  fa_aligned(dst), fa_aligned(src);
  memcpy(dst, src, 16);
}
inline void cp4(void *dst, const void *src) { memcpy(dst, src, 4); }
inline void cp_commit() {}
template <int N> inline void cp_wait() {}
inline void zero16(void *dst) {
  fa_aligned(dst);
  memset(dst, 0, 16);
}
#else
DEV void cp16(void *dst, const void *src) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
DEV void cp4(void *dst, const void *src) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}
DEV void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Until at most N of this thread's groups are still in flight. */
template <int N> DEV void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
DEV void zero16(void *dst) { *(uint4 *)dst = make_uint4(0u, 0u, 0u, 0u); }
#endif

/* lse and D of the 64 rows of a tile from lse and dsum, by a block of 128
 * threads (one number each); rows from `left` on get lse = +inf (so P =
 * exp(s - lse) = 0 there) and D = 0. */
constexpr int STATS_ROWS = 64;
DEV void stats_to(float *Ls, float *Ds, const float *lse, const float *dsum, int left) {
  int rr = (int)threadIdx.x % STATS_ROWS;
  bool d = (int)threadIdx.x >= STATS_ROWS;
  float *dst = d ? Ds + rr : Ls + rr;
  if (rr < left)
    cp4(dst, (d ? dsum : lse) + rr);
  else
    *dst = d ? 0.0f : INFINITY;
}

#endif
