/* adamw.cu - the optimizers: AdamW and SGD on f32 state, on f32 master
 * weights when a 16-bit parameter has them (the step works on the master
 * and rounds it into the parameter), with the gradients scaled by a
 * clipping factor; and the global norm of the gradients that factor comes
 * from. CPU reference: k_adamw and k_sgd in backends/cpu/kernels.c, whose
 * arithmetic (PyTorch's, in f32 with the scalar factors in double) this
 * follows operation for operation, each rounded on its own (no fused
 * multiply-adds), and grad_norm in backends/cpu/exec.c.
 *
 * Two ways to launch them: one tensor a launch (gpu_adamw, gpu_sgd,
 * gpu_sumsq), or a table of tensors in one launch (gpu_msteps) whose
 * blocks each take a part of one tensor, its step and its sum of squares
 * together; both compute the same bits. */
#include "common.cuh"

/* ---- one element's step ---------------------------------------------------------------------- */

/* f32 arithmetic rounded after each operation, as the CPU's: nvcc would
 * otherwise contract a product and a sum into one fused multiply-add. */
#ifdef WEFT_CUDA_EMU
static inline float f_mul(float a, float b) { return a * b; }
static inline float f_add(float a, float b) { return a + b; }
static inline float f_sub(float a, float b) { return a - b; }
static inline float f_div(float a, float b) { return a / b; }
static inline float f_sqrt(float a) { return sqrtf(a); }
#else
DEV float f_mul(float a, float b) { return __fmul_rn(a, b); }
DEV float f_add(float a, float b) { return __fadd_rn(a, b); }
DEV float f_sub(float a, float b) { return __fsub_rn(a, b); }
DEV float f_div(float a, float b) { return __fdiv_rn(a, b); }
DEV float f_sqrt(float a) { return __fsqrt_rn(a); }
#endif

/* The factors of a step, from its settings in double as the CPU takes them. */
struct optim_c {
  float decay, w1, b2, w2, step_size, bc2_sqrt, eps;  /* AdamW */
  float lr, mom, wd;                                  /* SGD */
};

static optim_c optim_consts(const gpu_optim *o, int64_t step, bool adamw) {
  optim_c c;
  memset(&c, 0, sizeof c);
  if (adamw) {
    c.decay = (float)(1.0 - o->lr * o->weight_decay);
    c.w1 = (float)(1.0 - o->beta1), c.b2 = (float)o->beta2, c.w2 = (float)(1.0 - o->beta2);
    double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
    c.step_size = (float)(o->lr / bc1), c.bc2_sqrt = (float)sqrt(bc2), c.eps = (float)o->eps;
  } else {
    c.lr = (float)o->lr, c.mom = (float)o->momentum, c.wd = (float)o->weight_decay;
  }
  return c;
}

/* AdamW on one element: p (the master's value or the parameter's), its
 * moments m and v, its gradient g (scaled already). */
DEV void adamw_elem(float &p, float &m, float &v, float g, const optim_c &c) {
  p = f_mul(p, c.decay);
  /* torch.lerp: the form depends on the weight, for accuracy near 1 */
  m = c.w1 < 0.5f ? f_add(m, f_mul(c.w1, f_sub(g, m))) : f_sub(g, f_mul(f_sub(g, m), f_sub(1.0f, c.w1)));
  v = f_add(f_mul(v, c.b2), f_mul(f_mul(c.w2, g), g));
  float denom = f_add(f_div(f_sqrt(v), c.bc2_sqrt), c.eps);
  p = f_sub(p, f_mul(c.step_size, f_div(m, denom)));
}

/* SGD on one element; b: its momentum, when it has one (mom). */
DEV void sgd_elem(float &p, float &b, bool mom, float d, const optim_c &c) {
  if (c.wd != 0.0f) d = f_add(d, f_mul(c.wd, p));
  if (mom) {
    b = f_add(f_mul(b, c.mom), d);
    d = b;
  }
  p = f_sub(p, f_mul(c.lr, d));
}

/* ---- one tensor a launch --------------------------------------------------------------------- */

template <class TP, class TG>
__global__ void k_adamw(TP *p, float *master, float *m, float *v, const TG *g, const float *scale, int64_t n,
                        optim_c c) {
  GRID_STRIDE(i, n) {
    float gi = to_f(g[i]);
    if (scale) gi = f_mul(gi, *scale);
    float pi = master ? master[i] : to_f(p[i]);
    float mi = m[i], vi = v[i];
    adamw_elem(pi, mi, vi, gi, c);
    m[i] = mi;
    v[i] = vi;
    if (master) master[i] = pi;
    p[i] = from_f<TP>(pi);
  }
}

void gpu_adamw(gpu_stream *s, void *param, int pdt, float *master, float *m, float *v, const void *grad, int gdt,
               const float *scale, int64_t n, int64_t step, const gpu_optim *o) {
  optim_c c = optim_consts(o, step, true);
  DISPATCH(pdt, TP, DISPATCH(gdt, TG, launch(k_adamw<TP, TG>, blocks_for(n, 256), 256, 0, s, (TP *)param, master, m,
                                             v, (const TG *)grad, scale, n, c)));
}

template <class TP, class TG>
__global__ void k_sgd(TP *p, float *master, float *buf, const TG *g, const float *scale, int64_t n, optim_c c) {
  GRID_STRIDE(i, n) {
    float pi = master ? master[i] : to_f(p[i]);
    float d = to_f(g[i]);
    if (scale) d = f_mul(d, *scale);
    float bi = buf ? buf[i] : 0.0f;
    sgd_elem(pi, bi, buf != NULL, d, c);
    if (buf) buf[i] = bi;
    if (master) master[i] = pi;
    p[i] = from_f<TP>(pi);
  }
}

void gpu_sgd(gpu_stream *s, void *param, int pdt, float *master, float *buf, const void *grad, int gdt,
             const float *scale, int64_t n, const gpu_optim *o) {
  float *b = o->momentum != 0.0 ? buf : NULL;
  optim_c c = optim_consts(o, 0, false);
  DISPATCH(pdt, TP, DISPATCH(gdt, TG, launch(k_sgd<TP, TG>, blocks_for(n, 256), 256, 0, s, (TP *)param, master, b,
                                             (const TG *)grad, scale, n, c)));
}

/* ---- the global norm of the gradients -------------------------------------------------------- */

/* A tensor's sum of squares: SQ_BLOCKS blocks of ROW_THREADS threads, each
 * thread's elements strided by the grid, each block's sum a part; then the
 * parts summed by one block. gpu_msteps keeps this order exactly. */
enum { SQ_BLOCKS = 4 * ROW_WARPS * ROW_WARPS };
static_assert((int)SQ_BLOCKS <= (int)ROW_THREADS, "a thread of k_sumsq_done takes one part");

size_t gpu_sumsq_ws(void) { return SQ_BLOCKS * sizeof(double); }

/* sum += x * x: exact in double for an f32 x, so a fused multiply-add
 * gives the same bits. */
DEV void sq_add(double &sum, float x) {
  double v = x;
  sum += v * v;
}

template <class T>
__global__ void k_sumsq_parts(double *parts, const T *x, const uint8_t *mask, int64_t n) {
  __shared__ double sh[32];
  double sum = 0.0;
  GRID_STRIDE(i, n) {
    if (mask && !mask[i]) continue;
    sq_add(sum, to_f(x[i]));
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

/* ---- a table of tensors in one launch -------------------------------------------------------- */

/* A tensor's blocks: as k_sumsq_parts's that hold elements (the others'
 * parts are zeros, which k_sumsq_done adds exactly), so that with
 * ROW_THREADS threads each thread takes the same elements in the same
 * order. A tensor with a step only takes as many. */
static int64_t entry_blocks(int64_t n) {
  int64_t b = (n + ROW_THREADS - 1) / ROW_THREADS;
  return b < (int64_t)SQ_BLOCKS ? b : (int64_t)SQ_BLOCKS;
}

gpu_mslayout gpu_msteps_layout(gpu_mstep *t, int n) {
  gpu_mslayout l = {0, 0, 0};
  /* the sums of the counted tensors first, in the order the table came in */
  for (int i = 0; i < n; i++) t[i].rank = t[i].what & GPU_MS_SQ ? l.nsq++ : -1;
  /* the largest tensors' blocks first: they run longest, and the blocks
   * of a launch start about in their order */
  for (int i = 1; i < n; i++) {
    gpu_mstep x = t[i];
    int j = i;
    for (; j > 0 && t[j - 1].n < x.n; j--) t[j] = t[j - 1];
    t[j] = x;
  }
  l.parts = l.nsq;
  for (int i = 0; i < n; i++) {
    t[i].first = (int32_t)l.blocks;
    t[i].blocks = (int32_t)entry_blocks(t[i].n);
    l.blocks += t[i].blocks;
    t[i].part = -1;
    if (t[i].what & GPU_MS_SQ) t[i].part = (int32_t)l.parts, l.parts += t[i].blocks;
  }
  return l;
}

/* The elements of entry e that this thread takes, from i0 by stride: its
 * step (when it has one) and the sum of squares of its gradient (when it
 * counts it), element by element in order. Loads run a few elements ahead
 * of the arithmetic. */
enum { MS_AHEAD = 4 };

template <bool ADAMW, class TP, class TG>
DEV double mstep_run(const gpu_mstep &e, int64_t i0, int64_t stride, const optim_c &c, const float *scale) {
  TP *p = (TP *)e.param;
  const TG *g = (const TG *)e.grad;
  float *master = e.master, *m = e.state, *v = e.state ? e.state + e.n : NULL;
  const uint8_t *mask = e.mask;
  bool step = e.what & GPU_MS_STEP, sq = e.what & GPU_MS_SQ;
  double sum = 0.0;
  float sc = step && scale ? *scale : 1.0f;  /* read once the norm it comes from is taken */
  for (int64_t i = i0; i < e.n; i += MS_AHEAD * stride) {
    float gi[MS_AHEAD] = {}, pi[MS_AHEAD] = {}, mi[MS_AHEAD] = {}, vi[MS_AHEAD] = {};
    bool in[MS_AHEAD] = {}, counted[MS_AHEAD] = {};
#pragma unroll
    for (int k = 0; k < MS_AHEAD; k++) {
      int64_t j = i + k * stride;
      in[k] = j < e.n;
      if (!in[k]) continue;
      gi[k] = to_f(g[j]);
      counted[k] = sq && (!mask || mask[j]);
      if (!step) continue;
      pi[k] = master ? master[j] : to_f(p[j]);
      if (m) mi[k] = m[j];
      if (ADAMW) vi[k] = v[j];
    }
#pragma unroll
    for (int k = 0; k < MS_AHEAD; k++) {
      int64_t j = i + k * stride;
      if (!in[k]) continue;
      if (counted[k]) sq_add(sum, gi[k]);
      if (!step) continue;
      float d = scale ? f_mul(gi[k], sc) : gi[k];
      if (ADAMW) {
        adamw_elem(pi[k], mi[k], vi[k], d, c);
        m[j] = mi[k];
        v[j] = vi[k];
      } else {
        sgd_elem(pi[k], mi[k], m != NULL, d, c);
        if (m) m[j] = mi[k];
      }
      if (master) master[j] = pi[k];
      p[j] = from_f<TP>(pi[k]);
    }
  }
  return sum;
}

template <bool ADAMW, class TP>
DEV double mstep_g(const gpu_mstep &e, int64_t i0, int64_t stride, const optim_c &c, const float *scale) {
  switch (e.gdt) {
  case GPU_BF16: return mstep_run<ADAMW, TP, bf16>(e, i0, stride, c, scale);
  case GPU_F16: return mstep_run<ADAMW, TP, f16>(e, i0, stride, c, scale);
  default: return mstep_run<ADAMW, TP, float>(e, i0, stride, c, scale);
  }
}

template <bool ADAMW>
__global__ void __launch_bounds__(ROW_THREADS, 4) k_msteps(const gpu_mstep *t, int n, optim_c c, const float *scale, double *parts) {
  __shared__ double sh[32];
  /* the entry whose blocks hold this one: the last that starts at or before it */
  int lo = 0, hi = n - 1, b = (int)blockIdx.x;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (t[mid].first <= b) lo = mid;
    else hi = mid - 1;
  }
  gpu_mstep e = t[lo];
  int64_t vb = b - e.first, i0 = vb * blockDim.x + threadIdx.x, stride = (int64_t)e.blocks * blockDim.x;
  double sum;
  switch (e.pdt) {
  case GPU_BF16: sum = mstep_g<ADAMW, bf16>(e, i0, stride, c, scale); break;
  case GPU_F16: sum = mstep_g<ADAMW, f16>(e, i0, stride, c, scale); break;
  default: sum = mstep_g<ADAMW, float>(e, i0, stride, c, scale); break;
  }
  if (e.what & GPU_MS_SQ) {
    sum = block_sum_d(sum, sh);
    if (threadIdx.x == 0) parts[e.part + vb] = sum;
  }
}

/* Each counted tensor's sum of its parts as k_sumsq_done takes it (thread
 * j of ROW_THREADS holding part j, zero past the tensor's blocks; each
 * warp's sum, then the sum of those), by one warp a tensor, into
 * parts[rank]; then *acc += those sums in the order the table came in. */
enum { MS_DONE_THREADS = 4 * 32 * ROW_WARPS };

__global__ void k_msteps_done(double *acc, const gpu_mstep *t, int n, double *parts, int nsq) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int e = w; e < n; e += nw) {
    if (!(t[e].what & GPU_MS_SQ)) continue;
    int part = t[e].part, nb = t[e].blocks;
    double mine = 0.0;
#pragma unroll
    for (int k = 0; k < ROW_WARPS; k++) {
      int j = k * 32 + lane;
      double x = 0.0;
      if (j < nb) x += parts[part + j];
      double s = warp_sum_d(x);
      if (lane == k) mine = s;
    }
    double r = warp_sum_d(lane < ROW_WARPS ? mine : 0.0);
    if (lane == 0) parts[t[e].rank] = r;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double a = *acc;
    for (int k = 0; k < nsq; k++) a += parts[k];
    *acc = a;
  }
}

void gpu_msteps(gpu_stream *s, bool adamw, const gpu_mstep *t, int n, const gpu_mslayout *l, int64_t step,
                const gpu_optim *o, const float *scale, double *parts, double *acc) {
  optim_c c = optim_consts(o, step, adamw);
  if (adamw) launch(k_msteps<true>, (unsigned)l->blocks, ROW_THREADS, 0, s, t, n, c, scale, parts);
  else launch(k_msteps<false>, (unsigned)l->blocks, ROW_THREADS, 0, s, t, n, c, scale, parts);
  if (l->nsq) launch(k_msteps_done, 1, MS_DONE_THREADS, 0, s, acc, t, n, parts, l->nsq);
}
