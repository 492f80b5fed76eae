/* embedding.cu - token embeddings and learned positions, forward and
 * backward. CPU reference: k_embedding, k_embedding_backward,
 * k_add_position and k_add_position_backward in backends/cpu/kernels.c.
 *
 * The table's gradient is a scatter-add by id. Without atomics: the
 * vocabulary rows are dealt to partitions (row % parts), and the block of a
 * partition and a range of columns reads every id in token order and adds
 * the rows of its own tokens, so each element sums its tokens in order. */
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

/* Block (column range, partition): the tokens whose row falls in the
 * partition, in token order, a chunk of ids at a time through shared
 * memory; sums in f32 (acc: the f32 image of a 16-bit table). */
template <class T>
__global__ void k_embedding_backward(float *acc, const T *dout, const int32_t *ids, int64_t t, int64_t h,
                                     int64_t v_lo, int64_t v_local) {
  __shared__ int32_t chunk[EMB_COLS];
  int64_t j = (int64_t)blockIdx.x * EMB_COLS + threadIdx.x;
  int64_t part = blockIdx.y;
  for (int64_t i0 = 0; i0 < t; i0 += EMB_COLS) {
    __syncthreads();
    if (i0 + threadIdx.x < t) chunk[threadIdx.x] = ids[i0 + threadIdx.x];
    __syncthreads();
    int64_t n = t - i0 < (int64_t)EMB_COLS ? t - i0 : (int64_t)EMB_COLS;
    for (int64_t q = 0; q < n; q++) {
      int64_t row = (int64_t)chunk[q] - v_lo;
      if (row < 0 || row >= v_local || row % EMB_PARTS != part || j >= h) continue;
      acc[row * h + j] += to_f(dout[(i0 + q) * h + j]);
    }
  }
}

template <class T>
__global__ void k_from_f32(T *dst, const float *src, int64_t n, bool acc) {
  GRID_STRIDE(i, n) put(&dst[i], src[i], acc);
}

size_t gpu_embedding_backward_ws(int dt, int64_t v_local, int64_t h) {
  return dt == GPU_F32 ? 0 : (size_t)(v_local * h) * sizeof(float);
}

void gpu_embedding_backward(gpu_stream *s, int dt, void *dtable, const void *dout, const int32_t *ids, int64_t t,
                            int64_t h, int64_t v_lo, int64_t v_local, bool acc, void *ws) {
  if (!dtable) return;
  int64_t parts = v_local < (int64_t)EMB_PARTS ? v_local : (int64_t)EMB_PARTS;
  dim3 grid((unsigned)((h + EMB_COLS - 1) / EMB_COLS), (unsigned)parts);
  if (dt == GPU_F32) {
    if (!acc) launch(k_zero<float>, blocks_for(v_local * h, 256), 256, 0, s, (float *)dtable, v_local * h);
    launch(k_embedding_backward<float>, grid, EMB_COLS, 0, s, (float *)dtable, (const float *)dout, ids, t, h, v_lo,
           v_local);
    return;
  }
  float *sum = (float *)ws;
  launch(k_zero<float>, blocks_for(v_local * h, 256), 256, 0, s, sum, v_local * h);
  DISPATCH(dt, T, {
    launch(k_embedding_backward<T>, grid, EMB_COLS, 0, s, sum, (const T *)dout, ids, t, h, v_lo, v_local);
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

/* dtable[j] (+)= the sum over the batch of dy[., j], in batch order. */
template <class T>
__global__ void k_batch_sum(T *dtable, const T *dy, int64_t b, int64_t plane, bool acc) {
  GRID_STRIDE(j, plane) {
    float sum = 0.0f;
    for (int64_t i = 0; i < b; i++) sum += to_f(dy[i * plane + j]);
    put(&dtable[j], sum, acc);
  }
}

void gpu_add_position_backward(gpu_stream *s, int dt, void *dx, void *dtable, const void *dy, int64_t b, int64_t sq,
                               int64_t h, bool acc) {
  int64_t plane = sq * h;
  DISPATCH(dt, T, {
    if (dx) launch(k_copy_or_add<T>, blocks_for(b * plane, 256), 256, 0, s, (T *)dx, (const T *)dy, b * plane, acc);
    if (dtable) launch(k_batch_sum<T>, blocks_for(plane, 256), 256, 0, s, (T *)dtable, (const T *)dy, b, plane, acc);
  });
}
