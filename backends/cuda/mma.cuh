/* mma.cuh - the tensor cores' warp product of PTX, mma.sync m16n8k16 with
 * 16-bit operands (bf16 or f16) and f32 sums, whose fragments are laid out
 * in the lanes as PTX documents them (unlike wmma's, which are unspecified):
 * a kernel that knows which element a lane holds keeps a product's result
 * in registers and works on it there (a softmax, a mask) without a trip
 * through shared memory. The CPU emulation computes the same product from
 * the same layouts, so a kernel written against them is tested here.
 *
 * Lane l of a warp: g = l / 4 (its group), t = l % 4 (its place in it).
 * A 16-bit pair is one 32-bit word, the lower column (or k) in the low half.
 *   A, 16 x 16 (rows m, columns k): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..),
 *     a[2] = (g, 2t+8..2t+9), a[3] = (g+8, 2t+8..)
 *   B, 16 x 8 (rows k, columns n): b[0] = (2t..2t+1, g), b[1] = (2t+8.., g)
 *   C and D, 16 x 8, f32: c[0], c[1] = (g, 2t), (g, 2t+1); c[2], c[3] =
 *     (g+8, 2t), (g+8, 2t+1)
 * So D's pairs (c[0], c[1]) and (c[2], c[3]) of two products side by side
 * (columns 0-7 and 8-15), packed to 16 bits, are the A operand of a product
 * with k over those 16 columns: a[0] = pack(c0[0], c0[1]), a[1] =
 * pack(c0[2], c0[3]), a[2] = pack(c1[0], c1[1]), a[3] = pack(c1[2], c1[3]). */
#ifndef WEFT_CUDA_MMA_CUH
#define WEFT_CUDA_MMA_CUH

#include "common.cuh"

#ifdef WEFT_CUDA_EMU
#include <cstdio>
#include <cstdlib>
#endif

/* Two elements in one word, lo in the low half, rounded to T. */
template <class T> DEV uint32_t pack2(float lo, float hi) {
  T a = from_f<T>(lo), b = from_f<T>(hi);
  uint16_t x, y;
  memcpy(&x, &a, 2);
  memcpy(&y, &b, 2);
  return (uint32_t)x | ((uint32_t)y << 16);
}

/* The two elements of a word. */
template <class T> DEV float lo16(uint32_t w) {
  uint16_t x = (uint16_t)(w & 0xffffu);
  T v;
  memcpy(&v, &x, 2);
  return to_f(v);
}
template <class T> DEV float hi16(uint32_t w) {
  uint16_t x = (uint16_t)(w >> 16);
  T v;
  memcpy(&v, &x, 2);
  return to_f(v);
}

/* The word of p[0], p[1] (p 4-byte aligned). */
template <class T> DEV uint32_t ld2(const T *p) {
  uint32_t w;
  memcpy(&w, p, 4);
  return w;
}

#ifdef WEFT_CUDA_EMU

/* Every lane puts its fragments in its warp's slots; after a warp barrier
 * each computes its own four sums from them (over k in order) and waits
 * again before the slots are taken by the next product. */
struct emu_mma_slot {
  uint32_t a[4], b[2];
};

template <class T> static inline void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  static thread_local emu_mma_slot slots[32][32];
  int w = emu_self->warp & 31, l = emu_self->lane;
  memcpy(slots[w][l].a, a, sizeof slots[w][l].a);
  memcpy(slots[w][l].b, b, sizeof slots[w][l].b);
  emu_syncwarp();
  const emu_mma_slot *s = slots[w];
  int g = l / 4, t = l % 4;
  float out[4];
  for (int e = 0; e < 4; e++) {
    int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    float sum = c[e];
    for (int k = 0; k < 16; k++) {
      /* A (row, k): lane row % 8 * 4 + (k % 8) / 2, word (row >= 8) + 2 (k >= 8), half k % 2 */
      const emu_mma_slot &sa = s[(row % 8) * 4 + (k % 8) / 2];
      uint32_t wa = sa.a[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
      float av = k % 2 ? hi16<T>(wa) : lo16<T>(wa);
      /* B (k, col): lane col * 4 + (k % 8) / 2, word k >= 8, half k % 2 */
      const emu_mma_slot &sb = s[col * 4 + (k % 8) / 2];
      uint32_t wb = sb.b[k >= 8 ? 1 : 0];
      float bv = k % 2 ? hi16<T>(wb) : lo16<T>(wb);
      sum += av * bv;
    }
    out[e] = sum;
  }
  emu_syncwarp();
  for (int e = 0; e < 4; e++) d[e] = out[e];
}

#else

template <class T> DEV void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);

template <> DEV void mma16816<bf16>(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

template <> DEV void mma16816<f16>(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

#endif

/* The 16-bit words of n-block nb of a product's result (c0..c3 its four
 * sums) as A fragments: pp[j] the A operand over columns 16 j to 16 j + 15. */
template <class T> DEV void pack_c(uint32_t (*pp)[4], int nb, float c0, float c1, float c2, float c3) {
  pp[nb >> 1][(nb & 1) * 2] = pack2<T>(c0, c1);
  pp[nb >> 1][(nb & 1) * 2 + 1] = pack2<T>(c2, c3);
}

/* Fragment loads from a row-major 16-bit matrix p (row stride ld elements,
 * even), this lane's words. A: the 16 x 16 tile at p. B from a matrix
 * stored [n][k] (each column of B a row of p, as K for Q K^T): the 16 x 8
 * tile of k rows, n columns at p. B from a matrix stored [k][n] (as V for
 * P V): two elements of one word are in two rows, so two loads. */
template <class T> DEV void load_a(uint32_t a[4], const T *p, int ld, int lane) {
  int g = lane >> 2, t = lane & 3;
  a[0] = ld2(p + g * ld + 2 * t);
  a[1] = ld2(p + (g + 8) * ld + 2 * t);
  a[2] = ld2(p + g * ld + 2 * t + 8);
  a[3] = ld2(p + (g + 8) * ld + 2 * t + 8);
}

template <class T> DEV void load_b_nk(uint32_t b[2], const T *p, int ld, int lane) {
  int g = lane >> 2, t = lane & 3;
  b[0] = ld2(p + g * ld + 2 * t);
  b[1] = ld2(p + g * ld + 2 * t + 8);
}

template <class T> DEV uint32_t pair16(T lo, T hi) {
  uint16_t x, y;
  memcpy(&x, &lo, 2);
  memcpy(&y, &hi, 2);
  return (uint32_t)x | ((uint32_t)y << 16);
}

template <class T> DEV void load_b_kn(uint32_t b[2], const T *p, int ld, int lane) {
  int g = lane >> 2, t = lane & 3;
  b[0] = pair16(p[(2 * t) * ld + g], p[(2 * t + 1) * ld + g]);
  b[1] = pair16(p[(2 * t + 8) * ld + g], p[(2 * t + 9) * ld + g]);
}

/* ldmatrix .x4 from shared memory: lanes 8i to 8i + 7 give the addresses
 * of the 8 rows of matrix i (8 16-bit elements each, 16 bytes, 16-byte
 * aligned); r[i] gets this lane's word of matrix i: elements (g, 2t) and
 * (g, 2t + 1) of it, or with .trans (2t, g) and (2t + 1, g). For the A
 * operand of a 16 x 16 tile at p (row stride ld), or the B operand of two
 * n-blocks of a tile stored [k][n] with .trans, lane l gives
 * p + (l % 16) * ld + (l / 16) * 8: then r = a[0..3], or r[0], r[1] =
 * b of columns 0-7 and r[2], r[3] = b of columns 8-15. For B of a tile
 * stored [n][k] (16 rows n, 16 columns k) without .trans, lane l gives
 * p + ((l % 8) + (l / 16) * 8) * ld + ((l / 8) % 2) * 8: then r[0], r[1] =
 * b of rows n 0-7 and r[2], r[3] = b of rows n 8-15. */
#ifdef WEFT_CUDA_EMU
/* The passes through shared memory an ldmatrix .x4 of these 32 row
 * addresses takes: each matrix's 8 rows of 16 bytes go in one pass where
 * they lie in the 8 distinct 16-byte columns of the 32 four-byte banks
 * (address bits 4-6), or are the same row (a broadcast); rows in one such
 * column at distinct addresses take a pass each. 4 without conflicts. */
static inline long ldsm_wavefronts(const void *const rows[32]) {
  long passes = 0;
  for (int i = 0; i < 4; i++) {
    int most = 0;
    for (int a = 0; a < 8; a++) {
      const uintptr_t pa = (uintptr_t)rows[8 * i + a];
      bool seen = false; /* counted already: an earlier row at the same address */
      for (int b = 0; b < a && !seen; b++) seen = (uintptr_t)rows[8 * i + b] == pa;
      if (seen) continue;
      int same_column = 0;
      for (int b = 0; b < 8; b++) {
        const uintptr_t pb = (uintptr_t)rows[8 * i + b];
        bool first = true; /* the first row of its address */
        for (int c = 0; c < b && first; c++) first = (uintptr_t)rows[8 * i + c] != pb;
        if (first && ((pb >> 4) & 7) == ((pa >> 4) & 7)) same_column++;
      }
      most = same_column > most ? same_column : most;
    }
    passes += most;
  }
  return passes;
}

template <bool TRANS> static inline void ldsm_x4(uint32_t r[4], const void *row) {
  static thread_local const void *rows[32][32];
  int w = emu_self->warp & 31, l = emu_self->lane;
  rows[w][l] = row;
  emu_syncwarp();
  int g = l / 4, t = l % 4;
  uint32_t got[4];
  for (int i = 0; i < 4; i++) {
    if ((uintptr_t)rows[w][8 * i] & 15) {
      fprintf(stderr, "ldmatrix: a row at %p, not 16-byte aligned\n", rows[w][8 * i]);
      abort();
    }
    uint16_t lo, hi;
    if (!TRANS) {
      const uint16_t *p = (const uint16_t *)rows[w][8 * i + g];
      lo = p[2 * t], hi = p[2 * t + 1];
    } else {
      lo = ((const uint16_t *)rows[w][8 * i + 2 * t])[g];
      hi = ((const uint16_t *)rows[w][8 * i + 2 * t + 1])[g];
    }
    got[i] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
  if (l == 0) emu_smem_wavefronts(4, ldsm_wavefronts(&rows[w][0]));
  emu_syncwarp();
  for (int i = 0; i < 4; i++) r[i] = got[i];
}
#else
template <bool TRANS> DEV void ldsm_x4(uint32_t r[4], const void *row) {
  unsigned a = (unsigned)__cvta_generic_to_shared(row);
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
#endif

#endif
