/* embedding.cu - token embeddings and learned positions, forward and
 * backward. CPU reference: k_embedding, k_embedding_backward,
 * k_add_position and k_add_position_backward in backends/cpu/kernels.c.
 *
 * The table's gradient is a scatter-add by id. Without atomics: the
 * vocabulary rows are dealt to partitions (row % parts), each partition's
 * tokens are listed in token order, and the block of a partition and a
 * range of columns adds the rows of its tokens, so each element sums its
 * tokens in order. */
#include "common.cuh"

template <class T>
__global__ void k_embedding(T *out, const int32_t *ids, const T *table, int64_t t, int64_t h, int64_t v_lo,
                            int64_t v_local, bool acc) {
  GRID_STRIDE(e, t * h) {
    int64_t i = e / h, j = e % h, row = (int64_t)ids[i] - v_lo;
    bool mine = row >= 0 && row < v_local;
    if (mine) put(&out[e], to_f(table[row * h + j]), acc);
    else if (!acc) out[e] = from_f<T>(0.0f);
  }
}

void gpu_embedding(gpu_stream *s, int dt, void *out, const int32_t *ids, const void *table, int64_t t, int64_t h,
                   int64_t v_lo, int64_t v_local, bool acc) {
  DISPATCH(dt, T, launch(k_embedding<T>, blocks_for(t * h, 256), 256, 0, s, (T *)out, ids, (const T *)table, t, h, v_lo,
                         v_local, acc));
}

enum { EMB_PARTS = 128, EMB_COLS = 256 };

template <class T>
__global__ void k_zero(T *x, int64_t n) {
  GRID_STRIDE(i, n) x[i] = from_f<T>(0.0f);
}

/* The tokens of each partition, in token order: cnt[p] of them from
 * list[off[p]] on. One block per partition counts its tokens, then (the
 * offsets the counts before it) writes their positions, a chunk of ids at a
 * time: each thread's place in the chunk is the tokens before it in its
 * warp (a ballot) and in the warps before its own. */
DEV bool emb_mine(const int32_t *ids, int64_t i, int64_t v_lo, int64_t v_local, int64_t part, int64_t parts) {
  int64_t row = (int64_t)ids[i] - v_lo;
  return row >= 0 && row < v_local && row % parts == part;
}

__global__ void k_emb_count(int32_t *cnt, const int32_t *ids, int64_t t, int64_t v_lo, int64_t v_local, int64_t parts) {
  __shared__ float sh[32];
  float n = 0.0f;  /* at most 2^24 tokens a block: exact in f32 */
  for (int64_t i = threadIdx.x; i < t; i += blockDim.x) n += emb_mine(ids, i, v_lo, v_local, blockIdx.x, parts) ? 1.0f : 0.0f;
  n = block_sum(n, sh);
  if (threadIdx.x == 0) cnt[blockIdx.x] = (int32_t)n;
}

__global__ void k_emb_fill(int32_t *list, int32_t *off, const int32_t *cnt, const int32_t *ids, int64_t t, int64_t v_lo,
                           int64_t v_local, int64_t parts) {
  enum { WARPS = EMB_COLS / 32 };
  __shared__ int32_t in_warp[WARPS];
  __shared__ int64_t first;
  const int64_t part = blockIdx.x;
  const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    int64_t o = 0;
    for (int64_t q = 0; q < part; q++) o += cnt[q];
    first = o;
    off[part] = (int32_t)o;
  }
  __syncthreads();
  int64_t base = first;
  for (int64_t i0 = 0; i0 < t; i0 += EMB_COLS) {
    int64_t i = i0 + threadIdx.x;
    bool mine = i < t && emb_mine(ids, i, v_lo, v_local, part, parts);
    unsigned m = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) in_warp[warp] = __popc(m);
    __syncthreads();
    int64_t before = __popc(m & ((1u << lane) - 1u)), all = 0;
    for (int w = 0; w < WARPS; w++) {
      if (w < warp) before += in_warp[w];
      all += in_warp[w];
    }
    if (mine) list[base + before] = (int32_t)i;
    base += all;
    __syncthreads();  /* every warp has read in_warp before the next chunk writes it */
  }
}

/* Block (column range, partition): the partition's tokens in token order,
 * each adding its row of dout to the table's row; sums in f32 (acc: the
 * f32 image of a 16-bit table). The block reads a chunk of its list (the
 * tokens and their rows) into shared memory at once, and takes its tokens
 * four at a time: their rows of dout read together and, where the four
 * rows of the table differ, those too, then each sum written; where two
 * are the same row, one after another. Every element adds its tokens in
 * token order, as the CPU's kernel does: the same bits. WEFT_EMB_KERNEL=old:
 * the first kernel (k_embedding_backward_old), a token at a time, each
 * reading its list entry, then its id, then the two rows. */
template <class T>
__global__ void k_embedding_backward(float *__restrict__ acc, const T *__restrict__ dout,
                                     const int32_t *__restrict__ ids, const int32_t *__restrict__ list,
                                     const int32_t *off, const int32_t *cnt, int64_t h, int64_t v_lo) {
  __shared__ int32_t tok[EMB_COLS], row[EMB_COLS];
  int64_t j = (int64_t)blockIdx.x * EMB_COLS + threadIdx.x;
  bool on = j < h;
  int64_t part = blockIdx.y, lo = off[part], n = cnt[part];
  for (int64_t c0 = 0; c0 < n; c0 += EMB_COLS) {
    int m = n - c0 < EMB_COLS ? (int)(n - c0) : EMB_COLS;
    __syncthreads();
    if ((int)threadIdx.x < m) {
      int32_t i = list[lo + c0 + threadIdx.x];
      tok[threadIdx.x] = i;
      row[threadIdx.x] = (int32_t)((int64_t)ids[i] - v_lo);
    }
    __syncthreads();
    if (!on) continue;
    int k = 0;
    for (; k + 4 <= m; k += 4) {
      int64_t r0 = row[k], r1 = row[k + 1], r2 = row[k + 2], r3 = row[k + 3];
      float d0 = to_f(dout[tok[k] * h + j]), d1 = to_f(dout[tok[k + 1] * h + j]);
      float d2 = to_f(dout[tok[k + 2] * h + j]), d3 = to_f(dout[tok[k + 3] * h + j]);
      float *p0 = acc + r0 * h + j, *p1 = acc + r1 * h + j, *p2 = acc + r2 * h + j, *p3 = acc + r3 * h + j;
      if (r0 != r1 && r0 != r2 && r0 != r3 && r1 != r2 && r1 != r3 && r2 != r3) {
        float a0 = *p0, a1 = *p1, a2 = *p2, a3 = *p3;
        *p0 = a0 + d0, *p1 = a1 + d1, *p2 = a2 + d2, *p3 = a3 + d3;
      } else {
        *p0 += d0;
        *p1 += d1;
        *p2 += d2;
        *p3 += d3;
      }
    }
    for (; k < m; k++) acc[(int64_t)row[k] * h + j] += to_f(dout[(int64_t)tok[k] * h + j]);
  }
}

template <class T>
__global__ void k_embedding_backward_old(float *acc, const T *dout, const int32_t *ids, const int32_t *list,
                                         const int32_t *off, const int32_t *cnt, int64_t h, int64_t v_lo) {
  int64_t j = (int64_t)blockIdx.x * EMB_COLS + threadIdx.x;
  if (j >= h) return;
  int64_t part = blockIdx.y, lo = off[part], n = cnt[part];
  for (int64_t k = lo; k < lo + n; k++) {
    int64_t i = list[k], row = (int64_t)ids[i] - v_lo;
    acc[row * h + j] += to_f(dout[i * h + j]);
  }
}

/* read at every call: test_kernels and bench_kernels set it between calls */
static bool emb_old(void) {
  const char *e = getenv("WEFT_EMB_KERNEL");
  return e && strcmp(e, "old") == 0;
}

/* The sums of the partitions' tokens into acc, f32. */
template <class T>
static void emb_sums(gpu_stream *s, dim3 grid, float *acc, const T *dout, const int32_t *ids, const int32_t *list,
                     const int32_t *off, const int32_t *cnt, int64_t h, int64_t v_lo) {
  if (emb_old())
    launch(k_embedding_backward_old<T>, grid, EMB_COLS, 0, s, acc, dout, ids, list, off, cnt, h, v_lo);
  else
    launch(k_embedding_backward<T>, grid, EMB_COLS, 0, s, acc, dout, ids, list, off, cnt, h, v_lo);
}

template <class T>
__global__ void k_from_f32(T *dst, const float *src, int64_t n, bool acc) {
  GRID_STRIDE(i, n) put(&dst[i], src[i], acc);
}

static int64_t emb_parts(int64_t v_local) { return v_local < (int64_t)EMB_PARTS ? v_local : (int64_t)EMB_PARTS; }

/* The f32 sums of a 16-bit table, then the partitions' counts, offsets
 * and lists of tokens. */
static size_t emb_sums_bytes(int dt, int64_t v_local, int64_t h) {
  return dt == GPU_F32 ? 0 : ((size_t)(v_local * h) * sizeof(float) + 255) / 256 * 256;
}

size_t gpu_embedding_backward_ws(int dt, int64_t v_local, int64_t h, int64_t t) {
  return emb_sums_bytes(dt, v_local, h) + (size_t)(2 * EMB_PARTS + t) * sizeof(int32_t);
}

void gpu_embedding_backward(gpu_stream *s, int dt, void *dtable, int gdt, const void *dout, const int32_t *ids,
                            int64_t t, int64_t h, int64_t v_lo, int64_t v_local, bool acc, void *ws) {
  if (!dtable) return;
  int64_t parts = emb_parts(v_local);
  int32_t *cnt = (int32_t *)((char *)ws + emb_sums_bytes(dt, v_local, h)), *off = cnt + EMB_PARTS,
          *list = off + EMB_PARTS;
  launch(k_emb_count, (unsigned)parts, EMB_COLS, 0, s, cnt, ids, t, v_lo, v_local, parts);
  launch(k_emb_fill, (unsigned)parts, EMB_COLS, 0, s, list, off, (const int32_t *)cnt, ids, t, v_lo, v_local, parts);
  dim3 grid((unsigned)((h + EMB_COLS - 1) / EMB_COLS), (unsigned)parts);
  if (dt == GPU_F32 || gdt == GPU_F32) {
    /* an f32 gradient (a 16-bit table's kept in f32 too) takes the sums itself */
    if (!acc) launch(k_zero<float>, blocks_for(v_local * h, 256), 256, 0, s, (float *)dtable, v_local * h);
    DISPATCH(dt, T,
             emb_sums<T>(s, grid, (float *)dtable, (const T *)dout, ids, (const int32_t *)list, (const int32_t *)off,
                         (const int32_t *)cnt, h, v_lo));
    return;
  }
  float *sum = (float *)ws;
  launch(k_zero<float>, blocks_for(v_local * h, 256), 256, 0, s, sum, v_local * h);
  DISPATCH(dt, T, {
    emb_sums<T>(s, grid, sum, (const T *)dout, ids, (const int32_t *)list, (const int32_t *)off, (const int32_t *)cnt,
                h, v_lo);
    launch(k_from_f32<T>, blocks_for(v_local * h, 256), 256, 0, s, (T *)dtable, (const float *)sum, v_local * h, acc);
  });
}

template <class T>
__global__ void k_add_position(T *y, const T *x, const T *table, int64_t n, int64_t plane) {
  GRID_STRIDE(e, n) y[e] = from_f<T>(to_f(x[e]) + to_f(table[e % plane]));
}

void gpu_add_position(gpu_stream *s, int dt, void *y, const void *x, const void *table, int64_t b, int64_t sq,
                      int64_t h) {
  DISPATCH(dt, T, launch(k_add_position<T>, blocks_for(b * sq * h, 256), 256, 0, s, (T *)y, (const T *)x,
                         (const T *)table, b * sq * h, sq * h));
}

template <class T>
__global__ void k_copy_or_add(T *dst, const T *src, int64_t n, bool acc) {
  GRID_STRIDE(i, n) put(&dst[i], to_f(src[i]), acc);
}

/* dtable[j] (+)= the sum over the batch of dy[., j], in batch order; the
 * table's gradient of type G (f32 for a 16-bit table's kept in f32). */
template <class G, class T>
__global__ void k_batch_sum(G *dtable, const T *dy, int64_t b, int64_t plane, bool acc) {
  GRID_STRIDE(j, plane) {
    float sum = 0.0f;
    for (int64_t i = 0; i < b; i++) sum += to_f(dy[i * plane + j]);
    put(&dtable[j], sum, acc);
  }
}

void gpu_add_position_backward(gpu_stream *s, int dt, void *dx, void *dtable, int gdt, const void *dy, int64_t b,
                               int64_t sq, int64_t h, bool acc) {
  int64_t plane = sq * h;
  DISPATCH(dt, T, {
    if (dx) launch(k_copy_or_add<T>, blocks_for(b * plane, 256), 256, 0, s, (T *)dx, (const T *)dy, b * plane, acc);
    if (dtable && gdt == GPU_F32)
      launch(k_batch_sum<float, T>, blocks_for(plane, 256), 256, 0, s, (float *)dtable, (const T *)dy, b, plane, acc);
    else if (dtable)
      launch(k_batch_sum<T, T>, blocks_for(plane, 256), 256, 0, s, (T *)dtable, (const T *)dy, b, plane, acc);
  });
}
