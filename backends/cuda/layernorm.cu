/* layernorm.cu - LayerNorm over the last dimension, forward and backward.
 * CPU reference: k_layernorm and k_layernorm_backward in
 * backends/cpu/kernels.c (statistics there in double, here in f32 with two
 * passes over the row).
 *
 * One warp per row. The backward recomputes each row's statistics (the
 * forward keeps nothing), writes dx, and leaves the statistics in the
 * workspace for the weight and bias gradients: column sums over chunks of
 * rows, then over the chunks (k_chunks_done, common.cuh). */
#include "common.cuh"

enum { LN_WARPS = ROW_WARPS };

template <class T>
DEV void row_stats(const T *xr, int64_t h, float eps, float &mean, float &rstd) {
  int lane = threadIdx.x & 31;
  float sum = 0.0f;
  for (int64_t j = lane; j < h; j += 32) sum += to_f(xr[j]);
  mean = warp_sum(sum) / (float)h;
  float var = 0.0f;
  for (int64_t j = lane; j < h; j += 32) {
    float d = to_f(xr[j]) - mean;
    var += d * d;
  }
  rstd = 1.0f / sqrtf(warp_sum(var) / (float)h + eps);
}

template <class T>
__global__ void k_layernorm(T *y, const T *x, const T *w, const T *b, int64_t rows, int64_t h, float eps) {
  int64_t row = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T *xr = x + row * h;
  T *yr = y + row * h;
  float mean, rstd;
  row_stats(xr, h, eps, mean, rstd);
  for (int64_t j = threadIdx.x & 31; j < h; j += 32)
    yr[j] = from_f<T>((to_f(xr[j]) - mean) * rstd * to_f(w[j]) + to_f(b[j]));
}

void gpu_layernorm(gpu_stream *s, int dt, void *y, const void *x, const void *w, const void *b, int64_t rows,
                   int64_t h, double eps) {
  DISPATCH(dt, T, launch(k_layernorm<T>, (unsigned)((rows + LN_WARPS - 1) / LN_WARPS), 32 * LN_WARPS, 0, s, (T *)y,
                         (const T *)x, (const T *)w, (const T *)b, rows, h, (float)eps));
}

/* Rows per chunk of the column sums: at most 128 chunks of at least 64 rows. */
static int64_t chunk_rows(int64_t rows) {
  int64_t r = (rows + 127) / 128;
  return r < 64 ? 64 : r;
}

static int64_t chunks_of(int64_t rows) { return rows > 0 ? (rows + chunk_rows(rows) - 1) / chunk_rows(rows) : 0; }

size_t gpu_layernorm_backward_ws(int64_t rows, int64_t h) {
  return (size_t)(2 * rows + 2 * chunks_of(rows) * h + 1) * sizeof(float);
}

template <class T>
__global__ void k_layernorm_dx(T *dx, float *stats, const T *dy, const T *x, const T *w, int64_t rows, int64_t h,
                               float eps, bool acc) {
  int64_t row = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  const T *xr = x + row * h, *dyr = dy + row * h;
  float mean, rstd;
  row_stats(xr, h, eps, mean, rstd);
  if (lane == 0) stats[row] = mean, stats[rows + row] = rstd;
  if (!dx) return;
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = lane; j < h; j += 32) {
    float xhat = (to_f(xr[j]) - mean) * rstd, g = to_f(dyr[j]) * to_f(w[j]);
    sg += g;
    sgx += g * xhat;
  }
  float mg = warp_sum(sg) / (float)h, mgx = warp_sum(sgx) / (float)h;
  for (int64_t j = lane; j < h; j += 32) {
    float xhat = (to_f(xr[j]) - mean) * rstd, g = to_f(dyr[j]) * to_f(w[j]);
    put(&dx[row * h + j], rstd * (g - mg - xhat * mgx), acc);
  }
}

/* pw[c][j], pb[c][j]: sums over chunk c of dy * xhat and dy in column j. */
template <class T>
__global__ void k_layernorm_parts(float *pw, float *pb, const float *stats, const T *dy, const T *x, int64_t rows,
                                  int64_t h, int64_t per) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
  if (j >= h) return;
  int64_t lo = c * per, hi = lo + per < rows ? lo + per : rows;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t i = lo; i < hi; i++) {
    float d = to_f(dy[i * h + j]);
    sw += d * (to_f(x[i * h + j]) - stats[i]) * stats[rows + i];
    sb += d;
  }
  pw[c * h + j] = sw;
  if (pb) pb[c * h + j] = sb;
}

void gpu_layernorm_backward(gpu_stream *s, int dt, void *dx, void *dw, void *db, int gdt, const void *dy,
                            const void *x, const void *w, int64_t rows, int64_t h, double eps, bool acc_dx, bool acc,
                            void *ws) {
  float *stats = (float *)ws, *pw = stats + 2 * rows;
  int64_t chunks = chunks_of(rows), per = chunk_rows(rows);
  float *pb = pw + chunks * h;
  DISPATCH(dt, T, {
    launch(k_layernorm_dx<T>, (unsigned)((rows + LN_WARPS - 1) / LN_WARPS), 32 * LN_WARPS, 0, s, (T *)dx, stats,
           (const T *)dy, (const T *)x, (const T *)w, rows, h, (float)eps, acc_dx);
    if (dw || db) {
      launch(k_layernorm_parts<T>, dim3((unsigned)((h + 255) / 256), (unsigned)chunks), 256, 0, s, pw, pb,
             (const float *)stats, (const T *)dy, (const T *)x, rows, h, per);
      /* the weight's and bias's gradients in f32 where they are kept so */
      if (gdt == GPU_F32) chunks_done<float>(s, (float *)dw, pw, (float *)db, pb, chunks, h, acc);
      else chunks_done<T>(s, (T *)dw, pw, (T *)db, pb, chunks, h, acc);
    }
  });
}
