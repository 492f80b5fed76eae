/* wgmma.cuh - Hopper's warpgroup product (PTX wgmma.mma_async, sm_90a
 * only): the four warps of a warpgroup (128 threads, warp w of it rows
 * 16 w to 16 w + 15) compute D (64 x 64, f32) (+)= A B with A (64 x 16,
 * 16-bit) in registers and B (16 x 64) read by the tensor cores from
 * shared memory, as a matrix descriptor says where and how it lies.
 *
 * Registers (PTX's figures for m64nNk16): each warp's 16 rows of A are an
 * mma.sync m16n8k16 A fragment (mma.cuh: a[0..3]), and its 16 rows of D
 * are eight m16n8 C fragments side by side, d[nb][0..3] columns 8 nb to
 * 8 nb + 7: so a product's result, packed to 16 bits, is the A operand of
 * the next, as with mma.sync.
 *
 * Shared memory: a tile of 64 rows of 64 16-bit elements (128 bytes a
 * row), on 1024 bytes, in the 128-byte swizzle: the 16-byte chunk c of
 * row r lies at chunk c ^ (r % 8) of the row (wg_at). Of one such tile,
 * rows r holding a matrix X[r][c]:
 *   B = X^T (K-major: k the columns; X's rows are B's columns n, as K for
 *     S = Q K^T): wg_kmajor(tile) + 32 bytes for each step of 16 in k;
 *   B = X (MN-major: k the rows; as V for O = P V): wg_mnmajor(tile) +
 *     2048 bytes (16 rows) for each step of 16 in k.
 * The descriptor (64 bits): the start address, the leading and stride
 * byte offsets, each >> 4 in 14 bits (bits 0, 16, 32), the swizzle in
 * bits 62-63 (1: 128 bytes). K-major: stride 1024 (from 8 rows of n to the
 * next), leading offset not used (1); MN-major: stride 1024 (8 rows of k to
 * the next), leading offset from 64 columns of n to the next (not used at
 * n = 64). The swizzle works on the address's bits (bits 4-6 ^= bits 7-9),
 * so a start 32 bytes into a row reads the row's chunks 2 and 3 as the
 * tile's loader placed them.
 *
 * The product is asynchronous: wg_fence() before products whose A or D
 * registers other instructions wrote (wg_fence(a) with A fragments
 * computed just before), wg_commit() after a group of them,
 * wg_wait<N>() until at most N groups are in flight, and only then D (or
 * the A registers) may be read or written (wg_hold on D after the wait
 * keeps the compiler from moving a use of it before). Shared memory that
 * plain stores or cp.async wrote needs wg_proxy_fence() by the writers
 * before the barrier after which the products read it.
 *
 * The CPU emulation computes the same product from the same layouts
 * (every lane its own elements from its warp's A fragments and the tile),
 * at once: its fence, commit and wait order nothing more. */
#ifndef WEFT_CUDA_WGMMA_CUH
#define WEFT_CUDA_WGMMA_CUH

#include "mma.cuh"

/* The byte offset of element (r, c) of a swizzled tile of 64 x 64. */
DEV int wg_at(int r, int c) { return r * 128 + ((((c >> 3) ^ r) & 7) << 4) + (c & 7) * 2; }

/* A pointer to shared memory moved up to the next 1024 bytes of its
 * shared address (a tile's alignment; the emulation's, of its address). */
#ifdef WEFT_CUDA_EMU
template <class P> static inline P *wg_align(P *p) { return (P *)(((uintptr_t)p + 1023) & ~(uintptr_t)1023); }
#else
template <class P> DEV P *wg_align(P *p) {
  const uint32_t at = (uint32_t)__cvta_generic_to_shared(p);
  return (P *)((unsigned char *)p + ((1024 - (at & 1023)) & 1023));
}
#endif

#ifdef WEFT_CUDA_EMU

struct wg_desc {
  const unsigned char *start;
  uint32_t lead, stride;
};
static inline wg_desc wg_make(const void *p, uint32_t lead, uint32_t stride) {
  if ((uintptr_t)p & 15) {
    fprintf(stderr, "wgmma: a matrix at %p, not 16-byte aligned\n", p);
    abort();
  }
  return wg_desc{(const unsigned char *)p, lead, stride};
}
static inline wg_desc wg_add(wg_desc d, int bytes) {
  d.start += bytes;
  return d;
}
static inline void wg_fence() {}
static inline void wg_fence(uint32_t (*)[4]) {}
static inline void wg_commit() {}
template <int N> static inline void wg_wait() {}
static inline void wg_proxy_fence() {}
static inline void wg_hold(float (*)[4]) {}
static inline void wg_copy(uint32_t (*dst)[4], const uint32_t (*src)[4]) { memcpy(dst, src, 16 * sizeof(uint32_t)); }

/* The address of B's element (k, n) as the hardware finds it: the
 * canonical layout of the 128-byte swizzle, then the swizzle of the
 * address's bits. */
static inline const unsigned char *wg_elem(const wg_desc &d, bool mn, int k, int n) {
  uintptr_t at = mn ? (uintptr_t)d.start + (k % 8) * 128 + (k / 8) * d.stride + (n / 64) * d.lead + (n % 64) * 2
                    : (uintptr_t)d.start + (n % 8) * 128 + (n / 8) * d.stride + k * 2;
  at ^= ((at >> 7) & 7) << 4;
  return (const unsigned char *)at;
}

template <class T, bool MN> static inline void wg_mma(float (*d)[4], const uint32_t a[4], wg_desc b, bool add) {
  static thread_local emu_mma_slot slots[32][32];
  int w = emu_self->warp & 31, l = emu_self->lane;
  memcpy(slots[w][l].a, a, sizeof slots[w][l].a);
  emu_syncwarp();
  const emu_mma_slot *s = slots[w];
  int g = l / 4, t = l % 4;
  float out[8][4];
  for (int nb = 0; nb < 8; nb++)
    for (int e = 0; e < 4; e++) {
      int row = g + (e >= 2 ? 8 : 0), col = nb * 8 + 2 * t + (e & 1);
      float sum = add ? d[nb][e] : 0.0f;
      for (int k = 0; k < 16; k++) {
        const emu_mma_slot &sa = s[(row % 8) * 4 + (k % 8) / 2];
        uint32_t wa = sa.a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
        float av = k % 2 ? hi16<T>(wa) : lo16<T>(wa);
        uint16_t bits;
        memcpy(&bits, wg_elem(b, MN, k, col), 2);
        T bv;
        memcpy(&bv, &bits, 2);
        sum += av * to_f(bv);
      }
      out[nb][e] = sum;
    }
  emu_syncwarp();
  for (int nb = 0; nb < 8; nb++)
    for (int e = 0; e < 4; e++) d[nb][e] = out[nb][e];
}

/* d (+)= A B with A too read from shared memory, K-major (a diagnostic of
 * the register layout of A: gpu_wgmma_check). */
template <class T> static inline void wg_mma_ss(float (*d)[4], wg_desc a, wg_desc b, bool add) {
  int w = emu_self->warp & 3, l = emu_self->lane, g = l / 4, t = l % 4;
  for (int nb = 0; nb < 8; nb++)
    for (int e = 0; e < 4; e++) {
      int row = 16 * w + g + (e >= 2 ? 8 : 0), col = nb * 8 + 2 * t + (e & 1);
      float sum = add ? d[nb][e] : 0.0f;
      for (int k = 0; k < 16; k++) {
        T av, bv;
        memcpy(&av, wg_elem(a, false, k, row), 2);
        memcpy(&bv, wg_elem(b, false, k, col), 2);
        sum += to_f(av) * to_f(bv);
      }
      d[nb][e] = sum;
    }
}

#else

typedef uint64_t wg_desc;
DEV wg_desc wg_make(const void *p, uint32_t lead, uint32_t stride) {
  uint32_t at = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((at & 0x3FFFF) >> 4) | (uint64_t)((lead & 0x3FFFF) >> 4) << 16 |
         (uint64_t)((stride & 0x3FFFF) >> 4) << 32 | (uint64_t)1 << 62;
}
/* The start moved by bytes (a multiple of 16, within the 14 bits). */
DEV wg_desc wg_add(wg_desc d, int bytes) { return d + (uint64_t)(bytes >> 4); }
DEV void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
/* The same, with the 16 words of A fragments a[0..3] written before it
 * (so that the compiler does not compute them between it and the
 * products, where ptxas would have to fence again). */
DEV void wg_fence(uint32_t (*a)[4]) {
  asm volatile("wgmma.fence.sync.aligned;\n"
               : "+r"(a[0][0]), "+r"(a[0][1]), "+r"(a[0][2]), "+r"(a[0][3]), "+r"(a[1][0]), "+r"(a[1][1]),
                 "+r"(a[1][2]), "+r"(a[1][3]), "+r"(a[2][0]), "+r"(a[2][1]), "+r"(a[2][2]), "+r"(a[2][3]),
                 "+r"(a[3][0]), "+r"(a[3][1]), "+r"(a[3][2]), "+r"(a[3][3])
               :
               : "memory");
}
DEV void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> DEV void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
DEV void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
DEV void wg_hold(float (*d)[4]) {
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
}

/* dst = src, 16 words into registers of their own (an asm's results, which
 * the compiler cannot take for src's): to read A fragments while a product
 * still reads them, which PTX leaves undefined. */
DEV void wg_copy(uint32_t (*dst)[4], const uint32_t (*src)[4]) {
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) asm volatile("mov.b32 %0, %1;\n" : "=r"(dst[i][e]) : "r"(src[i][e]));
}

#define WG_D32(d)                                                                                                    \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),          \
      "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),      \
      "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),      \
      "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),      \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define WG_OPS                                                                                                       \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29," \
  "%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, "
#define WG_MMA(TY, MN)                                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY    \
               " " WG_OPS #MN ";\n}\n"                                                                               \
               : WG_D32(d)                                                                                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"((int)add))

/* d (+)= A B: MN, B's k its rows (N-major, the transpose of K-major). */
template <class T, bool MN> DEV void wg_mma(float (*d)[4], const uint32_t a[4], wg_desc b, bool add);
template <> DEV void wg_mma<bf16, false>(float (*d)[4], const uint32_t a[4], wg_desc b, bool add) { WG_MMA("bf16", 0); }
template <> DEV void wg_mma<bf16, true>(float (*d)[4], const uint32_t a[4], wg_desc b, bool add) { WG_MMA("bf16", 1); }
template <> DEV void wg_mma<f16, false>(float (*d)[4], const uint32_t a[4], wg_desc b, bool add) { WG_MMA("f16", 0); }
template <> DEV void wg_mma<f16, true>(float (*d)[4], const uint32_t a[4], wg_desc b, bool add) { WG_MMA("f16", 1); }
#define WG_MMA_SS(TY)                                                                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY    \
               " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"  \
               "%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                     \
               : WG_D32(d)                                                                                           \
               : "l"(a), "l"(b), "r"((int)add))

/* d (+)= A B with A too read from shared memory, K-major (a diagnostic of
 * the register layout of A: gpu_wgmma_check). */
template <class T> DEV void wg_mma_ss(float (*d)[4], wg_desc a, wg_desc b, bool add);
template <> DEV void wg_mma_ss<bf16>(float (*d)[4], wg_desc a, wg_desc b, bool add) { WG_MMA_SS("bf16"); }
template <> DEV void wg_mma_ss<f16>(float (*d)[4], wg_desc a, wg_desc b, bool add) { WG_MMA_SS("f16"); }
#undef WG_MMA_SS
#undef WG_MMA
#undef WG_OPS
#undef WG_D32

#endif

/* The descriptors of a swizzled tile as B, K-major and MN-major. */
DEV wg_desc wg_kmajor(const void *tile) { return wg_make(tile, 16, 1024); }
DEV wg_desc wg_mnmajor(const void *tile) { return wg_make(tile, 8192, 1024); }

#endif
