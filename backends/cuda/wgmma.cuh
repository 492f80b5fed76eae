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
 * (every lane its own elements from its warp's A fragments and the tile)
 * and holds it back until the wait that covers it, poisoning the
 * registers it owns meanwhile and checking at the wait that nothing
 * touched them or the tile (below). */
#ifndef WEFT_CUDA_WGMMA_CUH
#define WEFT_CUDA_WGMMA_CUH

#include "cpasync.cuh"
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

#include <vector>

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
/* The emulation keeps the products asynchronous as far as a kernel can
 * tell. A product's result is computed when it is issued but reaches D
 * only at the wg_wait that covers its group (wg_commit closes a group);
 * until then its D registers hold f32 NaNs of a payload of their own and
 * its A registers 16-bit NaNs, so that a kernel reading either early
 * spreads NaNs into its results. At the wait, D and A still holding the
 * poison and the shared memory the product read unchanged are checked;
 * else the launch fails, naming what was touched (emu_report), as a GPU
 * would not: PTX leaves it undefined. A product on a D or A that one in
 * flight holds (the next step of a sum over k, the same fragments again)
 * takes the pending values. */
struct wg_op {
  float (*d)[4];
  uint32_t *a; /* NULL: A from shared memory (sa) */
  uint32_t a_val[4];
  float out[8][4];
  wg_desc b, sa;
  bool mn;
  unsigned group;
  uint64_t seen; /* a hash of the shared memory the lane's part read */
};
struct wg_lane {
  uint64_t block; /* emu_block_serial of the block its products are of */
  unsigned committed;
  std::vector<wg_op> ops; /* in flight, in the order issued */
};
static const uint32_t WG_POISON_D = 0x7FC0DEADu, WG_POISON_A = 0xFFFFFFFFu;

static inline wg_lane &wg_me() {
  static thread_local wg_lane lanes[1024];
  wg_lane &L = lanes[emu_index() & 1023];
  if (L.block != emu_block_serial) L.block = emu_block_serial, L.committed = 0, L.ops.clear(); /* emu.cc reported any left */
  return L;
}

/* The last product in flight on D = d (on A = a); a range that overlaps
 * one in flight without being it is reported. */
static inline const wg_op *wg_on_d(const wg_lane &L, const float (*d)[4]) {
  for (size_t i = L.ops.size(); i-- > 0;) {
    if (L.ops[i].d == d) return &L.ops[i];
    if ((const float *)d < (const float *)(L.ops[i].d + 8) && (const float *)L.ops[i].d < (const float *)(d + 8))
      emu_report("wgmma (emulated): an accumulator that overlaps one in flight");
  }
  return nullptr;
}
static inline const wg_op *wg_on_a(const wg_lane &L, const uint32_t *a) {
  for (size_t i = L.ops.size(); i-- > 0;) {
    if (!L.ops[i].a) continue;
    if (L.ops[i].a == a) return &L.ops[i];
    if (a < L.ops[i].a + 4 && L.ops[i].a < a + 4) emu_report("wgmma (emulated): A registers that overlap a product's in flight");
  }
  return nullptr;
}

/* The address of B's element (k, n) as the hardware finds it: the
 * canonical layout of the 128-byte swizzle, then the swizzle of the
 * address's bits. */
static inline const unsigned char *wg_elem(const wg_desc &d, bool mn, int k, int n) {
  uintptr_t at = mn ? (uintptr_t)d.start + (k % 8) * 128 + (k / 8) * d.stride + (n / 64) * d.lead + (n % 64) * 2
                    : (uintptr_t)d.start + (n % 8) * 128 + (n / 8) * d.stride + k * 2;
  at ^= ((at >> 7) & 7) << 4;
  return (const unsigned char *)at;
}

/* f(p) for the address of every element the lane's part of o reads: its
 * 16 columns of B, and with A in shared memory its 2 rows of A. */
template <class F> static inline void wg_each_read(const wg_op &o, F f) {
  const int l = emu_self->lane, g = l / 4, t = l % 4, w = emu_self->warp & 3;
  for (int c = 0; c < 16; c++)
    for (int k = 0; k < 16; k++) f(wg_elem(o.b, o.mn, k, (c / 2) * 8 + 2 * t + (c & 1)));
  if (!o.a)
    for (int r = 0; r < 2; r++)
      for (int k = 0; k < 16; k++) f(wg_elem(o.sa, false, k, 16 * w + g + 8 * r));
}

/* A hash of the shared memory the lane's part of o reads. */
static inline uint64_t wg_seen(const wg_op &o) {
  uint64_t h = 0xcbf29ce484222325ull;
  wg_each_read(o, [&](const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    h = (h ^ v) * 0x100000001b3ull;
  });
  return h;
}

/* Whether the lane's part of o reads shared memory written through the
 * generic proxy and not fenced since (cpasync.cuh). */
static inline bool wg_unfenced(const wg_op &o) {
  bool any = false;
  wg_each_read(o, [&](const unsigned char *p) { any = any || cp_unfenced(p); });
  return any;
}

/* o, its result computed, in flight: its registers poisoned. */
static inline void wg_issue(wg_lane &L, wg_op &o) {
  if (wg_unfenced(o))
    emu_report("wgmma (emulated): a product read shared memory that cp.async or stores wrote with no fence.proxy.async "
               "(wg_proxy_fence) by their writer between");
  o.seen = wg_seen(o);
  L.ops.push_back(o);
  emu_self->wg++;
  for (int nb = 0; nb < 8; nb++)
    for (int e = 0; e < 4; e++) memcpy(&o.d[nb][e], &WG_POISON_D, 4);
  if (o.a)
    for (int i = 0; i < 4; i++) o.a[i] = WG_POISON_A;
}

/* Product i of the first n in flight done: checked, its result in D and
 * its A registers given back unless a later product holds them. */
static inline void wg_land(wg_lane &L, size_t i) {
  const wg_op &o = L.ops[i];
  if (wg_seen(o) != o.seen)
    emu_report("wgmma (emulated): shared memory that a product read was written before the wait for the product");
  bool d_held = false, a_held = false;
  for (size_t j = i + 1; j < L.ops.size(); j++) {
    d_held = d_held || L.ops[j].d == o.d;
    a_held = a_held || (o.a && L.ops[j].a == o.a);
  }
  for (int nb = 0; nb < 8; nb++)
    for (int e = 0; e < 4; e++) {
      uint32_t bits;
      memcpy(&bits, &o.d[nb][e], 4);
      if (bits != WG_POISON_D)
        emu_report("wgmma (emulated): the accumulator (D) of a product was written before the wait for the product");
      if (!d_held) o.d[nb][e] = o.out[nb][e];
    }
  if (o.a)
    for (int k = 0; k < 4; k++) {
      if (o.a[k] != WG_POISON_A)
        emu_report("wgmma (emulated): the A registers of a product were written before the wait for the product");
      if (!a_held) o.a[k] = o.a_val[k];
    }
}

static inline void wg_fence() {}
static inline void wg_fence(uint32_t (*)[4]) {}
static inline void wg_commit() { wg_me().committed++; }
template <int N> static inline void wg_wait() {
  wg_lane &L = wg_me();
  size_t n = 0;
  while (n < L.ops.size() && L.ops[n].group + N < L.committed) n++;
  for (size_t i = 0; i < n; i++) wg_land(L, i);
  L.ops.erase(L.ops.begin(), L.ops.begin() + (ptrdiff_t)n);
  emu_self->wg -= (unsigned)n;
}
static inline void wg_proxy_fence() { cp_proxy_fence(); }
/* D's use after the wait: one still in flight is reported. */
static inline void wg_hold(float (*d)[4]) {
  if (wg_on_d(wg_me(), d)) emu_report("wgmma (emulated): an accumulator (D) used before the wait for its product");
}
static inline void wg_copy(uint32_t (*dst)[4], const uint32_t (*src)[4]) {
  const wg_lane &L = wg_me();
  for (int i = 0; i < 4; i++)
    if (wg_on_a(L, src[i])) emu_report("wgmma (emulated): A registers copied while a product reads them");
  memcpy(dst, src, 16 * sizeof(uint32_t));
}

template <class T, bool MN> static inline void wg_mma(float (*d)[4], const uint32_t a[4], wg_desc b, bool add) {
  static thread_local emu_mma_slot slots[32][32];
  wg_lane &L = wg_me();
  wg_op o{};
  o.d = d, o.a = const_cast<uint32_t *>(a), o.b = b, o.mn = MN, o.group = L.committed;
  const wg_op *pa = wg_on_a(L, a), *pd = add ? wg_on_d(L, d) : nullptr;
  memcpy(o.a_val, pa ? pa->a_val : a, sizeof o.a_val);
  const float(*in)[4] = pd ? pd->out : d;
  int w = emu_self->warp & 31, l = emu_self->lane;
  memcpy(slots[w][l].a, o.a_val, sizeof slots[w][l].a);
  emu_syncwarp();
  const emu_mma_slot *s = slots[w];
  int g = l / 4, t = l % 4;
  for (int nb = 0; nb < 8; nb++)
    for (int e = 0; e < 4; e++) {
      int row = g + (e >= 2 ? 8 : 0), col = nb * 8 + 2 * t + (e & 1);
      float sum = add ? in[nb][e] : 0.0f;
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
      o.out[nb][e] = sum;
    }
  emu_syncwarp();
  wg_issue(L, o);
}

/* d (+)= A B with A too read from shared memory, K-major (a diagnostic of
 * the register layout of A: gpu_wgmma_check). */
template <class T> static inline void wg_mma_ss(float (*d)[4], wg_desc a, wg_desc b, bool add) {
  wg_lane &L = wg_me();
  wg_op o{};
  o.d = d, o.a = nullptr, o.b = b, o.sa = a, o.mn = false, o.group = L.committed;
  const wg_op *pd = add ? wg_on_d(L, d) : nullptr;
  const float(*in)[4] = pd ? pd->out : d;
  int w = emu_self->warp & 3, l = emu_self->lane, g = l / 4, t = l % 4;
  for (int nb = 0; nb < 8; nb++)
    for (int e = 0; e < 4; e++) {
      int row = 16 * w + g + (e >= 2 ? 8 : 0), col = nb * 8 + 2 * t + (e & 1);
      float sum = add ? in[nb][e] : 0.0f;
      for (int k = 0; k < 16; k++) {
        T av, bv;
        memcpy(&av, wg_elem(a, false, k, row), 2);
        memcpy(&bv, wg_elem(b, false, k, col), 2);
        sum += to_f(av) * to_f(bv);
      }
      o.out[nb][e] = sum;
    }
  wg_issue(L, o);
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
