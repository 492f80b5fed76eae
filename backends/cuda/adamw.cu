/* adamw.cu - the optimizers: AdamW and SGD on f32 state, on f32 master
 * weights when a 16-bit parameter has them (the step works on the master
 * and rounds it into the parameter), with the gradients scaled by a
 * clipping factor; and the global norm of the gradients that factor comes
 * from. CPU reference: k_adamw and k_sgd in backends/cpu/kernels.c, whose
 * arithmetic (PyTorch's, in f32 with the scalar factors in double) this
 * follows, and grad_norm in backends/cpu/exec.c. */
#include "common.cuh"

template <class TP, class TG>
__global__ void k_adamw(TP *p, float *master, float *m, float *v, const TG *g, const float *scale, int64_t n,
                        float decay, float w1, float b2, float w2, float step_size, float bc2_sqrt, float eps) {
  GRID_STRIDE(i, n) {
    float gi = to_f(g[i]);
    if (scale) gi *= *scale;
    float pi = master ? master[i] : to_f(p[i]);
    pi *= decay;
    float mi = m[i];
    /* torch.lerp: the form depends on the weight, for accuracy near 1 */
    mi = w1 < 0.5f ? mi + w1 * (gi - mi) : gi - (gi - mi) * (1.0f - w1);
    float vi = v[i] * b2 + w2 * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi -= step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    if (master) master[i] = pi;
    p[i] = from_f<TP>(pi);
  }
}

void gpu_adamw(gpu_stream *s, void *param, int pdt, float *master, float *m, float *v, const void *grad, int gdt,
               const float *scale, int64_t n, int64_t step, const gpu_optim *o) {
  float decay = (float)(1.0 - o->lr * o->weight_decay);
  float w1 = (float)(1.0 - o->beta1), b2 = (float)o->beta2, w2 = (float)(1.0 - o->beta2);
  double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
  float step_size = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2), eps = (float)o->eps;
  DISPATCH(pdt, TP, DISPATCH(gdt, TG, launch(k_adamw<TP, TG>, blocks_for(n, 256), 256, 0, s, (TP *)param, master, m,
                                             v, (const TG *)grad, scale, n, decay, w1, b2, w2, step_size, bc2_sqrt,
                                             eps)));
}

template <class TP, class TG>
__global__ void k_sgd(TP *p, float *master, float *buf, const TG *g, const float *scale, int64_t n, float lr,
                      float mom, float wd) {
  GRID_STRIDE(i, n) {
    float pi = master ? master[i] : to_f(p[i]);
    float d = to_f(g[i]);
    if (scale) d *= *scale;
    if (wd != 0.0f) d += wd * pi;
    if (buf) {
      buf[i] = buf[i] * mom + d;
      d = buf[i];
    }
    pi -= lr * d;
    if (master) master[i] = pi;
    p[i] = from_f<TP>(pi);
  }
}

void gpu_sgd(gpu_stream *s, void *param, int pdt, float *master, float *buf, const void *grad, int gdt,
             const float *scale, int64_t n, const gpu_optim *o) {
  float *b = o->momentum != 0.0 ? buf : NULL;
  DISPATCH(pdt, TP, DISPATCH(gdt, TG, launch(k_sgd<TP, TG>, blocks_for(n, 256), 256, 0, s, (TP *)param, master, b,
                                             (const TG *)grad, scale, n, (float)o->lr, (float)o->momentum,
                                             (float)o->weight_decay)));
}

/* ---- the global norm of the gradients ------------------------------------------------------- */

enum { SQ_BLOCKS = 4 * ROW_WARPS * ROW_WARPS };

size_t gpu_sumsq_ws(void) { return SQ_BLOCKS * sizeof(double); }

template <class T>
__global__ void k_sumsq_parts(double *parts, const T *x, const uint8_t *mask, int64_t n) {
  __shared__ double sh[32];
  double sum = 0.0;
  GRID_STRIDE(i, n) {
    if (mask && !mask[i]) continue;
    double v = to_f(x[i]);
    sum += v * v;
  }
  sum = block_sum_d(sum, sh);
  if (threadIdx.x == 0) parts[blockIdx.x] = sum;
}

__global__ void k_sumsq_done(double *acc, const double *parts, int n) {
  __shared__ double sh[32];
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += parts[i];
  sum = block_sum_d(sum, sh);
  if (threadIdx.x == 0) *acc += sum;
}

void gpu_sumsq(gpu_stream *s, int dt, double *acc, const void *x, const uint8_t *mask, int64_t n, void *ws) {
  double *parts = (double *)ws;
  DISPATCH(dt, T, launch(k_sumsq_parts<T>, SQ_BLOCKS, ROW_THREADS, 0, s, parts, (const T *)x, mask, n));
  launch(k_sumsq_done, 1, ROW_THREADS, 0, s, acc, (const double *)parts, (int)SQ_BLOCKS);
}

__global__ void k_clip_coef(float *coef, double *norm, const double *norms, int n, double clip) {
  if (threadIdx.x != 0) return;
  double sq = 0.0;
  for (int i = 0; i < n; i++) sq += norms[i];
  double nm = sqrt(sq), c = clip / (nm + 1e-6);
  *norm = nm;
  *coef = (float)(c < 1.0 ? c : 1.0);
}

void gpu_clip_coef(gpu_stream *s, float *coef, double *norm, const double *norms, int n, double clip) {
  launch(k_clip_coef, 1, 32, 0, s, coef, norm, norms, n, clip);
}
