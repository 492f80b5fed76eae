/* emu_wmma.h - the warp matrix products of CUDA (nvcuda::wmma) for the CPU
 * emulation (emu.h): common.cuh includes it after the storage types. A
 * fragment holds, in every lane, the whole tile it stands for (in f32; a/b
 * tiles rounded as their type is) as its elements x[0, num_elements), row
 * by row, where on the GPU a lane holds a few in an order of its own;
 * loads, products and stores are what the warp computes together, done by
 * each lane alike. As on the GPU, the lanes load together: none goes on to
 * a store before all have read. */
#ifndef WEFT_CUDA_EMU_WMMA_H
#define WEFT_CUDA_EMU_WMMA_H

#include <string.h>
#include <type_traits>

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
  static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
  static constexpr int num_elements = rows * cols;
  float x[rows * cols];   /* element (i, j) at x[i * cols + j] */
};

template <class Use, int M, int N, int K, class T, class L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float x) {
  for (float &e : f.x) e = x;
}

template <class Use, int M, int N, int K, class T, class L, class P>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const P *p, unsigned ldm) {
  typedef fragment<Use, M, N, K, T, L> F;
  emu_syncwarp();
  for (int i = 0; i < F::rows; i++)
    for (int j = 0; j < F::cols; j++)
      f.x[i * F::cols + j] = to_f(std::is_same<L, col_major>::value ? p[i + (size_t)j * ldm] : p[(size_t)i * ldm + j]);
  emu_syncwarp();
}

template <int M, int N, int K>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm, layout_t l) {
  emu_syncwarp();
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) f.x[i * N + j] = l == mem_col_major ? p[i + (size_t)j * ldm] : p[(size_t)i * ldm + j];
  emu_syncwarp();
}

template <int M, int N, int K>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm, layout_t l) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) (l == mem_col_major ? p[i + (size_t)j * ldm] : p[(size_t)i * ldm + j]) = f.x[i * N + j];
  emu_syncwarp();
}

/* o = a b + c: row by row, each element's sum over k in order (as one
 * element at a time would add), the columns together so that the compiler
 * vectorizes */
template <int M, int N, int K>
static inline void tile_mma(float *__restrict o, const float *__restrict a, const float *__restrict b,
                            const float *__restrict c) {
  for (int i = 0; i < M; i++) {
    float *__restrict oi = o + i * N;
    for (int j = 0; j < N; j++) oi[j] = c[i * N + j];
    for (int k = 0; k < K; k++) {
      const float av = a[i * K + k];
      const float *bk = b + k * N;
      for (int j = 0; j < N; j++) oi[j] += av * bk[j];
    }
  }
}

template <int M, int N, int K, class T, class LA, class LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, T, LA> &a,
                            const fragment<matrix_b, M, N, K, T, LB> &b, const fragment<accumulator, M, N, K, float> &c) {
  /* The lanes of a warp each hold the whole tiles and ask for the same
   * products in the same order: a lane's n-th product in a block is the
   * warp's n-th, and is computed by the first lane to ask for it; the
   * others take its result from a small ring per warp (where it was
   * overwritten, or its inputs' corners differ from the asker's, the asker
   * computes it again). The kernels run on one thread (emu_self). */
  enum { RING = 8 };
  struct alignas(64) slot_t {
    float out[M * N];
    uint64_t block;
    unsigned seq;
    float corner[6];
  };
  static slot_t ring[32][RING];
  const unsigned seq = emu_self->mma++;
  slot_t *slot = &ring[emu_self->warp & 31][seq % RING];
  const float corner[6] = {a.x[0], a.x[M * K - 1], b.x[0], b.x[K * N - 1], c.x[0], c.x[M * N - 1]};
  if (slot->block == emu_block_serial && slot->seq == seq && !memcmp(slot->corner, corner, sizeof corner)) {
    memcpy(d.x, slot->out, sizeof slot->out);
    return;
  }
  slot->block = emu_block_serial, slot->seq = seq;
  memcpy(slot->corner, corner, sizeof corner);
  tile_mma<M, N, K>(slot->out, a.x, b.x, c.x);
  memcpy(d.x, slot->out, sizeof slot->out);
}
}  // namespace wmma
}  // namespace nvcuda

#endif
