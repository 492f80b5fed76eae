/* moe.cu - the mixture of experts: routing, dispatch, combine and the
 * load-balancing loss, forward and backward. CPU reference: k_moe_route,
 * k_moe_dispatch, k_moe_combine, k_moe_aux_loss and their backwards in
 * backends/cpu/kernels.c (expert_matmul is a product per expert, in ops.c).
 *
 * Every launcher first routes the tokens again from the probabilities, as
 * the CPU's kernels do: one block per group, a thread per token for its
 * top k (and the weights combine gives them), then a warp per expert that
 * hands out its slots in the order of the CPU's loop (every token's first
 * choice in token order, then every second, ...), 32 choices at a time
 * through a ballot and the ranks of its bits. The routing also writes, for
 * each slot of each expert, the choice that took it (or -1): dispatch and
 * the gradient of the experts' rows are then gathers, one write per
 * element, and the other kernels read each token's k choices. No atomics:
 * every sum runs over the choices in their order, or over a warp's lanes
 * in a fixed tree. */
#include "common.cuh"

/* ---- routing --------------------------------------------------------------------------- */

/* The scratch of the routing, in ws, each part 256-byte aligned. */
struct moe_ws {
  int32_t *expert, *slot; /* [g][s][k] */
  int32_t *taken;         /* [e][g][c]: the choice (t k + j) in the slot, -1 none */
  int32_t *counts;        /* [g][e]: the choices of each expert, before dropping */
  float *w;               /* [g][s][k]: the weight combine gives each choice */
  float *div;             /* [g][s]: what the weights were divided by */
  float *a;               /* [g][s][k]: combine's backward, dy . ye of each choice */
  double *terms;          /* [g]: the load-balancing loss of each group */
};

static size_t moe_al(size_t b) { return (b + 255) & ~(size_t)255; }

static moe_ws moe_carve(const gpu_moe *z, void *ws) {
  size_t gsk = (size_t)(z->g * z->s * z->k), rows = (size_t)(z->e * z->g * z->c);
  char *p = (char *)ws;
  moe_ws m;
  m.expert = (int32_t *)p, p += moe_al(gsk * 4);
  m.slot = (int32_t *)p, p += moe_al(gsk * 4);
  m.taken = (int32_t *)p, p += moe_al(rows * 4);
  m.counts = (int32_t *)p, p += moe_al((size_t)(z->g * z->e) * 4);
  m.w = (float *)p, p += moe_al(gsk * 4);
  m.div = (float *)p, p += moe_al((size_t)(z->g * z->s) * 4);
  m.a = (float *)p, p += moe_al(gsk * 4);
  m.terms = (double *)p;
  return m;
}

size_t gpu_moe_ws(const gpu_moe *z) {
  size_t gsk = (size_t)(z->g * z->s * z->k), rows = (size_t)(z->e * z->g * z->c);
  return 4 * moe_al(gsk * 4) + moe_al(rows * 4) + moe_al((size_t)(z->g * z->e) * 4) +
         moe_al((size_t)(z->g * z->s) * 4) + moe_al((size_t)z->g * 8) + 256;
}

/* One block per group (blockDim a multiple of 32). slot, taken, counts, w
 * and div may be NULL: not wanted. */
template <class T>
__global__ void k_moe_route(int32_t *expert, int32_t *slot, int32_t *taken, int32_t *counts, float *w, float *div,
                            const T *probs, int64_t g, int64_t s, int64_t e, int64_t k, int64_t c, bool normalize) {
  int64_t gi = blockIdx.x;
  /* a token's k largest probabilities, ties to the lower expert, largest first */
  for (int64_t t = threadIdx.x; t < s; t += blockDim.x) {
    const T *p = probs + (gi * s + t) * e;
    int32_t *pick = expert + (gi * s + t) * k;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      float pb = 0.0f;
      for (int64_t x = 0; x < e; x++) {
        bool used = false;
        for (int64_t q = 0; q < j && !used; q++) used = pick[q] == x;
        float px = to_f(p[x]);
        if (!used && (best < 0 || px > pb)) best = x, pb = px;
      }
      pick[j] = (int32_t)best;
      sum += pb;
    }
    if (w) {
      float d = normalize && sum > 0.0f ? sum : 1.0f;
      for (int64_t j = 0; j < k; j++) w[(gi * s + t) * k + j] = to_f(p[pick[j]]) / d;
      div[gi * s + t] = d;
    }
  }
  __syncthreads();
  if (!slot && !counts) return;
  /* slots: a warp per expert, the choices in the CPU's order */
  int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  int64_t n = s * k;
  for (int64_t x = threadIdx.x >> 5; x < e; x += nw) {
    int64_t cnt = 0;
    for (int64_t i0 = 0; i0 < n; i0 += 32) {
      int64_t i = i0 + lane, j = i / s, t = i % s, at = (gi * s + t) * k + j;
      bool hit = i < n && expert[at] == x;
      unsigned m = __ballot_sync(0xffffffffu, hit);
      if (hit && slot) {
        int64_t r = cnt + __popc(m & ((1u << lane) - 1u));
        slot[at] = r < c ? (int32_t)r : -1;
        if (r < c && taken) taken[(x * g + gi) * c + r] = (int32_t)(t * k + j);
      }
      cnt += __popc(m);
    }
    if (taken)
      for (int64_t r = cnt + lane; r < c; r += 32) taken[(x * g + gi) * c + r] = -1;
    if (counts && lane == 0) counts[gi * e + x] = (int32_t)cnt;
  }
}

enum { MOE_THREADS = ROW_THREADS };

static void moe_route(gpu_stream *st, int dt, const moe_ws &m, const void *probs, const gpu_moe *z, bool slots,
                      bool weights, bool counts) {
  DISPATCH(dt, T,
           launch(k_moe_route<T>, (unsigned)z->g, MOE_THREADS, 0, st, m.expert, slots ? m.slot : (int32_t *)NULL,
                  slots ? m.taken : (int32_t *)NULL, counts ? m.counts : (int32_t *)NULL,
                  weights ? m.w : (float *)NULL, weights ? m.div : (float *)NULL, (const T *)probs, z->g, z->s, z->e,
                  z->k, z->c, z->normalize));
}

void gpu_moe_route(gpu_stream *st, int dt, int32_t *expert, int32_t *slot, const void *probs, const gpu_moe *z,
                   void *ws) {
  moe_ws m = moe_carve(z, ws);
  m.expert = expert, m.slot = slot;
  moe_route(st, dt, m, probs, z, true, false, false);
}

/* ---- dispatch ---------------------------------------------------------------------------- */

/* out[e][g][c][h]: the row of the token in each slot, zeros where none. */
template <class T>
__global__ void k_moe_dispatch(T *out, const T *x, const int32_t *taken, int64_t g, int64_t s, int64_t h, int64_t k,
                               int64_t c, int64_t n) {
  GRID_STRIDE(i, n) {
    int64_t r = i / h, q = i % h, gi = r / c % g;
    int32_t o = taken[r];
    out[i] = o >= 0 ? x[(gi * s + o / k) * h + q] : from_f<T>(0.0f);
  }
}

/* dx[g][s] (+)= the sum over the token's kept choices of their rows of dout. */
template <class T>
__global__ void k_moe_dispatch_backward(T *dx, const T *dout, const int32_t *expert, const int32_t *slot, int64_t g,
                                        int64_t s, int64_t h, int64_t k, int64_t c, bool acc) {
  GRID_STRIDE(i, g * s * h) {
    int64_t tok = i / h, q = i % h, gi = tok / s;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
      int32_t sl = slot[tok * k + j];
      if (sl >= 0) sum += to_f(dout[((expert[tok * k + j] * g + gi) * c + sl) * h + q]);
    }
    put(&dx[i], sum, acc);
  }
}

void gpu_moe_dispatch(gpu_stream *st, int dt, void *out, const void *x, const void *probs, const gpu_moe *z,
                      void *ws) {
  moe_ws m = moe_carve(z, ws);
  moe_route(st, dt, m, probs, z, true, false, false);
  int64_t n = z->e * z->g * z->c * z->h;
  DISPATCH(dt, T, launch(k_moe_dispatch<T>, blocks_for(n, 256), 256, 0, st, (T *)out, (const T *)x,
                         (const int32_t *)m.taken, z->g, z->s, z->h, z->k, z->c, n));
}

void gpu_moe_dispatch_backward(gpu_stream *st, int dt, void *dx, void *dprobs, const void *dout, const void *probs,
                               const gpu_moe *z, bool acc, void *ws) {
  /* the routing is piecewise constant: its probabilities get no gradient */
  if (dprobs && !acc) gpu_zero(dprobs, (size_t)(z->g * z->s * z->e) * (size_t)gpu_dtype_size(dt), st);
  if (!dx) return;
  moe_ws m = moe_carve(z, ws);
  moe_route(st, dt, m, probs, z, true, false, false);
  DISPATCH(dt, T, launch(k_moe_dispatch_backward<T>, blocks_for(z->g * z->s * z->h, 256), 256, 0, st, (T *)dx,
                         (const T *)dout, (const int32_t *)m.expert, (const int32_t *)m.slot, z->g, z->s, z->h, z->k,
                         z->c, acc));
}

/* ---- combine ------------------------------------------------------------------------------ */

/* y[g][s] = the sum over the token's kept choices j of w_j ye[e_j][g][slot_j]. */
template <class T>
__global__ void k_moe_combine(T *y, const T *ye, const int32_t *expert, const int32_t *slot, const float *w,
                              int64_t g, int64_t s, int64_t h, int64_t k, int64_t c) {
  GRID_STRIDE(i, g * s * h) {
    int64_t tok = i / h, q = i % h, gi = tok / s;
    float sum = 0.0f;
    for (int64_t j = 0; j < k; j++) {
      int32_t sl = slot[tok * k + j];
      if (sl >= 0) sum += w[tok * k + j] * to_f(ye[((expert[tok * k + j] * g + gi) * c + sl) * h + q]);
    }
    y[i] = from_f<T>(sum);
  }
}

/* dye[e][g][c] (+)= w_j dy of the choice in the slot; zeros where none. */
template <class T>
__global__ void k_moe_combine_dye(T *dye, const T *dy, const int32_t *taken, const float *w, int64_t g, int64_t s,
                                  int64_t h, int64_t k, int64_t c, int64_t n, bool acc) {
  GRID_STRIDE(i, n) {
    int64_t r = i / h, q = i % h, gi = r / c % g;
    int32_t o = taken[r];
    if (o >= 0) {
      int64_t tok = gi * s + o / k;
      put(&dye[i], w[tok * k + o % k] * to_f(dy[tok * h + q]), acc);
    } else if (!acc) {
      dye[i] = from_f<T>(0.0f);
    }
  }
}

/* A warp per token: a_j = dy . ye of each kept choice (0 for a dropped
 * one), then dprobs of its chosen experts a_j / div, less mix / div with
 * normalize (mix = sum_j w_j a_j); the other experts' 0. */
template <class T>
__global__ void k_moe_combine_dprobs(T *dprobs, float *a, const T *dy, const T *ye, const int32_t *expert,
                                     const int32_t *slot, const float *w, const float *div, int64_t g, int64_t s,
                                     int64_t h, int64_t e, int64_t k, int64_t c, bool normalize, bool acc) {
  int lane = threadIdx.x & 31;
  int64_t tok = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (tok >= g * s) return;
  int64_t gi = tok / s;
  const T *d = dy + tok * h;
  float mix = 0.0f;
  for (int64_t j = 0; j < k; j++) {
    int32_t sl = slot[tok * k + j];
    float part = 0.0f;
    if (sl >= 0) {
      const T *row = ye + ((expert[tok * k + j] * g + gi) * c + sl) * h;
      for (int64_t q = lane; q < h; q += 32) part += to_f(d[q]) * to_f(row[q]);
    }
    float aj = warp_sum(part);
    mix += w[tok * k + j] * aj;
    if (lane == 0) a[tok * k + j] = aj;
  }
  __syncwarp();
  float dv = div[tok];
  for (int64_t x = lane; x < e; x += 32) {
    int64_t j = 0;
    while (j < k && expert[tok * k + j] != x) j++;
    T *dp = dprobs + tok * e + x;
    if (j < k) {
      float gj = a[tok * k + j] / dv;
      if (normalize) gj -= mix / dv;
      put(dp, gj, acc);
    } else if (!acc) {
      *dp = from_f<T>(0.0f);
    }
  }
}

void gpu_moe_combine(gpu_stream *st, int dt, void *y, const void *ye, const void *probs, const gpu_moe *z, void *ws) {
  moe_ws m = moe_carve(z, ws);
  moe_route(st, dt, m, probs, z, true, true, false);
  int64_t n = z->g * z->s * z->h;
  DISPATCH(dt, T, launch(k_moe_combine<T>, blocks_for(n, 256), 256, 0, st, (T *)y, (const T *)ye,
                         (const int32_t *)m.expert, (const int32_t *)m.slot, (const float *)m.w, z->g, z->s, z->h,
                         z->k, z->c));
}

void gpu_moe_combine_backward(gpu_stream *st, int dt, void *dye, void *dprobs, const void *dy, const void *ye,
                              const void *probs, const gpu_moe *z, bool acc, void *ws) {
  if (!dye && !dprobs) return;
  moe_ws m = moe_carve(z, ws);
  moe_route(st, dt, m, probs, z, true, true, false);
  int64_t n = z->e * z->g * z->c * z->h, tokens = z->g * z->s;
  DISPATCH(dt, T, {
    if (dye)
      launch(k_moe_combine_dye<T>, blocks_for(n, 256), 256, 0, st, (T *)dye, (const T *)dy,
             (const int32_t *)m.taken, (const float *)m.w, z->g, z->s, z->h, z->k, z->c, n, acc);
    if (dprobs) {
      const int per = MOE_THREADS / 32;
      launch(k_moe_combine_dprobs<T>, (unsigned)((tokens + per - 1) / per), MOE_THREADS, 0, st, (T *)dprobs, m.a,
             (const T *)dy, (const T *)ye, (const int32_t *)m.expert, (const int32_t *)m.slot, (const float *)m.w,
             (const float *)m.div, z->g, z->s, z->h, z->e, z->k, z->c, (bool)z->normalize, acc);
    }
  });
}

/* ---- the load-balancing loss -------------------------------------------------------------- */

/* terms[g] = sum over experts of f_e P_e: f_e = counts / (s k), P_e the
 * mean of the group's probabilities of e (each summed in token order, in
 * double). A block per group. */
template <class T>
__global__ void k_moe_aux_terms(double *terms, const int32_t *counts, const T *probs, int64_t s, int64_t e,
                                int64_t k) {
  __shared__ double sh[32];
  int64_t gi = blockIdx.x;
  double sum = 0.0;
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x) {
    double pm = 0.0;
    for (int64_t t = 0; t < s; t++) pm += (double)to_f(probs[(gi * s + t) * e + x]);
    sum += (double)counts[gi * e + x] / (double)(s * k) * (pm / (double)s);
  }
  sum = block_sum_d(sum, sh);
  if (threadIdx.x == 0) terms[gi] = sum;
}

/* *slot = scale * the sum of the groups' terms in order; out (+)= the same. */
template <class T>
__global__ void k_moe_aux_sum(double *slot, T *out, const double *terms, int64_t g, double scale, bool acc) {
  __shared__ double sh[32];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < g; i += blockDim.x) sum += terms[i];
  sum = block_sum_d(sum, sh) * scale;
  if (threadIdx.x == 0) {
    if (slot) *slot = sum;
    if (out) put(out, (float)sum, acc);
  }
}

/* dprobs[g][s][e] (+)= dloss * coef * counts[g][e] (coef = alpha e / (s k s
 * g_total)); dloss 1 when NULL. */
template <class T>
__global__ void k_moe_aux_backward(T *dprobs, const T *dloss, const int32_t *counts, int64_t g, int64_t s, int64_t e,
                                   float coef, bool acc) {
  float dl = dloss ? to_f(*dloss) : 1.0f;
  GRID_STRIDE(i, g * s * e) {
    int64_t gi = i / (s * e), x = i % e;
    put(&dprobs[i], dl * coef * (float)counts[gi * e + x], acc);
  }
}

void gpu_moe_aux_loss(gpu_stream *st, int dt, double *slot, void *out, const void *probs, const gpu_moe *z,
                      int64_t g_total, double alpha, bool acc, void *ws) {
  moe_ws m = moe_carve(z, ws);
  moe_route(st, dt, m, probs, z, false, false, true);
  DISPATCH(dt, T, {
    launch(k_moe_aux_terms<T>, (unsigned)z->g, MOE_THREADS, 0, st, m.terms, (const int32_t *)m.counts,
           (const T *)probs, z->s, z->e, z->k);
    double scale = g_total > 0 ? alpha * (double)z->e / (double)g_total : 0.0;
    launch(k_moe_aux_sum<T>, 1, MOE_THREADS, 0, st, slot, (T *)out, (const double *)m.terms, z->g, scale, acc);
  });
}

void gpu_moe_aux_loss_backward(gpu_stream *st, int dt, void *dprobs, const void *dloss, const void *probs,
                               const gpu_moe *z, int64_t g_total, double alpha, bool acc, void *ws) {
  if (!dprobs) return;
  moe_ws m = moe_carve(z, ws);
  moe_route(st, dt, m, probs, z, false, false, true);
  double sk = (double)(z->s * z->k), coef = g_total > 0 && sk > 0 ? alpha * (double)z->e / (sk * (double)z->s * (double)g_total) : 0.0;
  int64_t n = z->g * z->s * z->e;
  DISPATCH(dt, T, launch(k_moe_aux_backward<T>, blocks_for(n, 256), 256, 0, st, (T *)dprobs, (const T *)dloss,
                         (const int32_t *)m.counts, z->g, z->s, z->e, (float)coef, acc));
}
