/* cpasync.cuh - the backward attention kernels' copies to shared memory
 * (cp.async: 16 bytes, or 4, a thread at a time, committed in groups and
 * waited for by count) and 2^x, as the GPU runs them and as the CPU
 * emulation does (copies held back until their wait, exp2f). */
#ifndef WEFT_CUDA_CPASYNC_CUH
#define WEFT_CUDA_CPASYNC_CUH

#include "common.cuh"

#ifdef WEFT_CUDA_EMU
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>
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

/* The emulation holds the copies back as a GPU may: a copy reads its
 * source when issued but lands at the cp_wait that covers its group
 * (cp_commit closes one); until then its destination holds 0xFF bytes
 * (16-bit and f32 NaNs), so that a kernel reading it early, its own thread
 * or another after a barrier, spreads NaNs into its results, and a store
 * there before the copy lands is reported (emu_report). Copies a block
 * never waited for end with it. Shared memory written through the generic
 * proxy (a copy landed, zero16) is noted until its writer's
 * fence.proxy.async (wg_proxy_fence), which a warpgroup product reading it
 * asks for (wgmma.cuh). */
struct cp_op {
  unsigned char *dst;
  unsigned char bytes[16];
  int n;
  unsigned group;
};
struct cp_lane {
  uint64_t block;
  unsigned committed;
  std::vector<cp_op> ops;           /* in flight, in the order issued */
  std::vector<const void *> unfenced; /* 16-byte chunks it wrote since its last proxy fence */
};
struct cp_block {
  uint64_t block;
  std::unordered_map<uintptr_t, int> unfenced; /* chunk -> the thread that wrote it */
};
inline cp_block &cp_shared() {
  static thread_local cp_block b;
  if (b.block != emu_block_serial) b.block = emu_block_serial, b.unfenced.clear();
  return b;
}
inline cp_lane &cp_me() {
  static thread_local cp_lane lanes[1024];
  cp_lane &L = lanes[emu_index() & 1023];
  if (L.block != emu_block_serial) L.block = emu_block_serial, L.committed = 0, L.ops.clear(), L.unfenced.clear();
  return L;
}
/* The 16-byte chunk at p written through the generic proxy. */
inline void cp_generic(const void *p) {
  const uintptr_t c = (uintptr_t)p & ~(uintptr_t)15;
  cp_shared().unfenced[c] = emu_index();
  cp_me().unfenced.push_back((const void *)c);
}
/* Whether the chunk at p was written through the generic proxy by a thread
 * that has not fenced since. */
inline bool cp_unfenced(const void *p) {
  const cp_block &b = cp_shared();
  return !b.unfenced.empty() && b.unfenced.count((uintptr_t)p & ~(uintptr_t)15);
}
inline void cp_proxy_fence() {
  cp_lane &L = cp_me();
  cp_block &b = cp_shared();
  const int me = emu_index();
  for (const void *c : L.unfenced) {
    auto it = b.unfenced.find((uintptr_t)c);
    if (it != b.unfenced.end() && it->second == me) b.unfenced.erase(it);
  }
  L.unfenced.clear();
}
inline void cp_issue(void *dst, const void *src, int n) {
  cp_lane &L = cp_me();
  cp_op o;
  o.dst = (unsigned char *)dst, o.n = n, o.group = L.committed;
  memcpy(o.bytes, src, (size_t)n);
  L.ops.push_back(o);
  memset(dst, 0xFF, (size_t)n);
}
inline void cp16(void *dst, const void *src) {
  fa_aligned(dst), fa_aligned(src);
  cp_issue(dst, src, 16);
}
inline void cp4(void *dst, const void *src) { cp_issue(dst, src, 4); }
inline void cp_commit() { cp_me().committed++; }
template <int N> inline void cp_wait() {
  cp_lane &L = cp_me();
  size_t n = 0;
  while (n < L.ops.size() && L.ops[n].group + N < L.committed) n++;
  for (size_t i = 0; i < n; i++) {
    const cp_op &o = L.ops[i];
    for (int b = 0; b < o.n; b++)
      if (o.dst[b] != 0xFF) {
        emu_report("cp.async (emulated): shared memory that a copy in flight writes was written before the wait for the copy");
        break;
      }
    memcpy(o.dst, o.bytes, (size_t)o.n);
    cp_generic(o.dst);
  }
  L.ops.erase(L.ops.begin(), L.ops.begin() + (ptrdiff_t)n);
}
inline void zero16(void *dst) {
  fa_aligned(dst);
  memset(dst, 0, 16);
  cp_generic(dst);
}
/* 16 bytes at dst that plain stores wrote (for the proxy fence's check). */
inline void stored16(const void *dst) { cp_generic(dst); }
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
DEV void stored16(const void *) {}
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
