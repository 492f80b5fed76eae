/* rmsnorm.cu - RMSNorm over the last dimension, forward and backward.
 * CPU reference: k_rmsnorm and k_rmsnorm_backward in backends/cpu/kernels.c.
 * One warp per row, as layernorm.cu; the weight gradient in two passes. */
#include "common.cuh"

enum { RMS_WARPS = ROW_WARPS };

template <class T>
DEV float rms_scale(const T *xr, int64_t h, float eps) {
  float ss = 0.0f;
  for (int64_t j = threadIdx.x & 31; j < h; j += 32) {
    float v = to_f(xr[j]);
    ss += v * v;
  }
  return 1.0f / sqrtf(warp_sum(ss) / (float)h + eps);
}

template <class T>
__global__ void k_rmsnorm(T *y, const T *x, const T *w, int64_t rows, int64_t h, float eps) {
  int64_t row = (int64_t)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T *xr = x + row * h;
  T *yr = y + row * h;
  float r = rms_scale(xr, h, eps);
  for (int64_t j = threadIdx.x & 31; j < h; j += 32) yr[j] = from_f<T>(to_f(xr[j]) * r * to_f(w[j]));
}

void gpu_rmsnorm(gpu_stream *s, int dt, void *y, const void *x, const void *w, int64_t rows, int64_t h, double eps) {
  DISPATCH(dt, T, launch(k_rmsnorm<T>, (unsigned)((rows + RMS_WARPS - 1) / RMS_WARPS), 32 * RMS_WARPS, 0, s, (T *)y,
                         (const T *)x, (const T *)w, rows, h, (float)eps));
}

static int64_t chunk_rows(int64_t rows) {
  int64_t r = (rows + 127) / 128;
  return r < 64 ? 64 : r;
}

static int64_t chunks_of(int64_t rows) { return rows > 0 ? (rows + chunk_rows(rows) - 1) / chunk_rows(rows) : 0; }

size_t gpu_rmsnorm_backward_ws(int64_t rows, int64_t h) {
  return (size_t)(rows + chunks_of(rows) * h + 1) * sizeof(float);
}

template <class T>
__global__ void k_rmsnorm_dx(T *dx, float *scale, const T *dy, const T *x, const T *w, int64_t rows, int64_t h,
                             float eps, bool acc) {
  int64_t row = (int64_t)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  const T *xr = x + row * h, *dyr = dy + row * h;
  float r = rms_scale(xr, h, eps);
  if (lane == 0) scale[row] = r;
  if (!dx) return;
  float sgx = 0.0f;
  for (int64_t j = lane; j < h; j += 32) sgx += to_f(dyr[j]) * to_f(w[j]) * to_f(xr[j]) * r;
  float mgx = warp_sum(sgx) / (float)h;
  for (int64_t j = lane; j < h; j += 32) {
    float xhat = to_f(xr[j]) * r;
    put(&dx[row * h + j], r * (to_f(dyr[j]) * to_f(w[j]) - xhat * mgx), acc);
  }
}

template <class T>
__global__ void k_rmsnorm_parts(float *pw, const float *scale, const T *dy, const T *x, int64_t rows, int64_t h,
                                int64_t per) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
  if (j >= h) return;
  int64_t lo = c * per, hi = lo + per < rows ? lo + per : rows;
  float sw = 0.0f;
  for (int64_t i = lo; i < hi; i++) sw += to_f(dy[i * h + j]) * to_f(x[i * h + j]) * scale[i];
  pw[c * h + j] = sw;
}

void gpu_rmsnorm_backward(gpu_stream *s, int dt, void *dx, void *dw, const void *dy, const void *x, const void *w,
                          int64_t rows, int64_t h, double eps, bool acc, void *ws) {
  float *scale = (float *)ws, *pw = scale + rows;
  int64_t chunks = chunks_of(rows), per = chunk_rows(rows);
  DISPATCH(dt, T, {
    launch(k_rmsnorm_dx<T>, (unsigned)((rows + RMS_WARPS - 1) / RMS_WARPS), 32 * RMS_WARPS, 0, s, (T *)dx, scale,
           (const T *)dy, (const T *)x, (const T *)w, rows, h, (float)eps, acc);
    if (dw) {
      launch(k_rmsnorm_parts<T>, dim3((unsigned)((h + 255) / 256), (unsigned)chunks), 256, 0, s, pw,
             (const float *)scale, (const T *)dy, (const T *)x, rows, h, per);
      chunks_done<T>(s, (T *)dw, pw, (T *)NULL, (const float *)NULL, chunks, h, acc);
    }
  });
}
