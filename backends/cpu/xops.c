/* xops.c - the operators of the standard library on packed parts: sizes
 * come from the regions of the part, then one kernel call (kernels.h); one
 * table maps each operator kind to its forward and backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernels_swin.h"
#include "native.h"
#include "weft/workspace.h"
#include "xops.h"

/* ---- sizes -------------------------------------------------------------- */

static int64_t ext(const tregion *r, int d) {
  int64_t n = 0;
  for (int i = 0; i < r->dims[d].n; i++) n += r->dims[d].iv[i].hi - r->dims[d].iv[i].lo;
  return n;
}

static int64_t last(const tregion *r) { return r->ndims ? ext(r, r->ndims - 1) : 1; }

static int64_t numel(const tregion *r) { return tregion_numel(r); }

/* The first index of dimension d (a part of a plain dimension is one interval). */
static int64_t first(const tregion *r, int d) { return r->dims[d].n ? r->dims[d].iv[0].lo : 0; }

static const gtensor *tensor_of(const xcall *c, int arg) {
  const gop *o = &c->g->ops[c->op];
  return &c->g->tensors[arg < 0 ? o->output : o->inputs[arg]];
}

static int64_t whole_last(const xcall *c, int arg) {
  const gtensor *t = tensor_of(c, arg);
  return t->ndims ? t->dims[t->ndims - 1].size : 1;
}

double xop_attr(const weft_graph *g, int op, const char *name, double dflt) {
  return graph_op_attr(g, op, name, dflt);
}

/* The gradient of a loss's result: 1 where it is the step's loss, else
 * what the operators after it send back. */
static double dloss_of(const xcall *c) { return c->dy ? c->dy[0] : 1.0; }

/* ---- native kernels ------------------------------------------------------ */

/* An operator whose declaration names a kernel in a shared library: the
 * sizes are the extents of the part's idims; the kernel overwrites, so
 * accumulation goes through a zeroed part. */
static bool native(xcall *c, char *err, size_t errlen) {
  const opdecl *d = c->g->ops[c->op].decl;
  const char *spec = c->backward ? d->native_bwd : d->native_fwd;
  const gop *o = &c->g->ops[c->op];
  bool wanted = !c->backward;
  for (int i = 0; i < c->nin; i++) wanted |= c->din[i] != NULL;
  if (!wanted) return true;  /* only model inputs reach it: no gradient to make */
  if (!spec) {
    snprintf(err, errlen, "operator %s (%s) has a native forward but no kernel_backward", o->name, d->name);
    return false;
  }
  if (!c->allow_native) {
    snprintf(err, errlen, "operator %s runs native code (%s); weft run loads it only with --allow-native", o->name,
             spec);
    return false;
  }
  char e2[512];
  native_kernel *k = native_load(spec, d->native_dir, e2, sizeof e2);
  if (!k) {
    snprintf(err, errlen, "operator %s: %s", o->name, e2);
    return false;
  }
  if (c->nidims > NATIVE_MAX_SIZES || c->nin > NATIVE_MAX_INPUTS) {
    snprintf(err, errlen, "operator %s: too many dimensions or inputs for a native kernel", o->name);
    return false;
  }
  int64_t sizes[NATIVE_MAX_SIZES];
  for (int i = 0; i < c->nidims; i++) sizes[i] = c->ranges[2 * i + 1] - c->ranges[2 * i];
  if (!c->backward) {
    int64_t n = tregion_numel(c->outr);
    float *out = c->acc ? calloc((size_t)(n ? n : 1), sizeof(float)) : c->out;
    if (!out) weft_oom();
    native_forward(k, out, c->nin, (const float *const *)c->in, c->nidims, sizes);
    if (c->acc) {
      for (int64_t i = 0; i < n; i++) c->out[i] += out[i];
      free(out);
    }
    return true;
  }
  float *parts[XOP_MAX_INPUTS] = {0};
  for (int i = 0; i < c->nin; i++) {
    if (!c->din[i]) continue;
    int64_t n = tregion_numel(c->inr[i]);
    parts[i] = c->acc ? calloc((size_t)(n ? n : 1), sizeof(float)) : c->din[i];
    if (!parts[i]) weft_oom();
  }
  native_backward(k, parts, c->nin, c->dy, (const float *const *)c->in, c->nidims, sizes);
  for (int i = 0; i < c->nin && c->acc; i++) {
    if (!parts[i]) continue;
    int64_t n = tregion_numel(c->inr[i]);
    for (int64_t e = 0; e < n; e++) c->din[i][e] += parts[i][e];
    free(parts[i]);
  }
  return true;
}


/* ---- cross entropy -------------------------------------------------------- */

typedef struct ce_sizes {
  int64_t t, v, v_lo, t_total;
  bool split;             /* a shard of the vocabulary */
} ce_sizes;

static ce_sizes ce_sizes_of(const xcall *c) {
  const tregion *lr = c->inr[0];
  ce_sizes s = {numel(c->inr[1]), last(lr), lr->ndims ? first(lr, lr->ndims - 1) : 0, tensor_numel(tensor_of(c, 1)),
                false};
  s.split = s.v < whole_last(c, 0);
  return s;
}

static bool ce_stats(xcall *c, char *err, size_t errlen) {
  ce_sizes s = ce_sizes_of(c);
  k_cross_entropy_stats(c->out, c->in[0], c->in[1], s.t, s.v_lo, s.v);
  return true;
}

/* The maxima, sums of exponentials and label logits of a shard's rows over
 * the whole vocabulary (g: 3 t floats), from the gathered statistics; false
 * when the compute came without them. */
static bool ce_merge(xcall *c, const ce_sizes *s, float *g, char *err, size_t errlen) {
  if (c->part != LP_COMBINE) {
    snprintf(err, errlen, "%s: a shard of the vocabulary without the statistics of the other shards",
             c->g->ops[c->op].name);
    return false;
  }
  k_cross_entropy_merge(g, g + s->t, g + 2 * s->t, c->stats, (int)(last(c->statsr) / 3), s->t);
  return true;
}

static bool ce_forward(xcall *c, char *err, size_t errlen) {
  ce_sizes s = ce_sizes_of(c);
  double loss;
  if (!s.split) {
    loss = k_cross_entropy(c->in[0], c->in[1], s.t, s.v, s.t_total);
  } else {
    float *g = malloc((size_t)(3 * s.t + 1) * sizeof(float));
    if (!g) weft_oom();
    bool ok = ce_merge(c, &s, g, err, errlen);
    loss = ok ? k_cross_entropy_combine(g, g + s.t, g + 2 * s.t, s.t, s.t_total) : 0;
    free(g);
    if (!ok) return false;
    /* Every shard holds the whole loss of its rows; the first writes it,
     * the others 0, so that the sum the program makes of the parts is the
     * loss. */
    if (s.v_lo != 0) loss = 0;
  }
  c->loss = loss;
  if (c->acc) *c->out += (float)loss;
  else *c->out = (float)loss;
  return true;
}

static bool ce_backward(xcall *c, char *err, size_t errlen) {
  if (!c->din[0]) return true;
  ce_sizes s = ce_sizes_of(c);
  if (!s.split) {
    k_cross_entropy_backward(c->din[0], c->in[0], c->in[1], s.t, s.v, s.t_total, dloss_of(c), c->acc);
    return true;
  }
  float *g = malloc((size_t)(3 * s.t + 1) * sizeof(float));
  if (!g) weft_oom();
  bool ok = ce_merge(c, &s, g, err, errlen);
  if (ok)
    k_cross_entropy_shard_backward(c->din[0], c->in[0], c->in[1], g, g + s.t, s.t, s.v_lo, s.v, s.t_total, dloss_of(c), c->acc);
  free(g);
  return ok;
}

/* ---- the other operators, forward then backward ---------------------------- */

#define IN(i) ((const float *)c->in[i])

static void put_loss(xcall *c, double loss) {
  c->loss = loss;
  if (c->acc) *c->out += (float)loss;
  else *c->out = (float)loss;
}

static bool mse_forward(xcall *c, char *err, size_t errlen) {
  put_loss(c, k_mse(IN(0), IN(1), numel(c->inr[0]), tensor_numel(tensor_of(c, 0))));
  return true;
}

static bool mse_backward(xcall *c, char *err, size_t errlen) {
  k_mse_backward(c->din[0], c->din[1], IN(0), IN(1), numel(c->inr[0]), tensor_numel(tensor_of(c, 0)), dloss_of(c), c->acc);
  return true;
}

/* ids [t], table rows [v_lo, v_lo + v) of h columns */
static bool embedding_forward(xcall *c, char *err, size_t errlen) {
  const tregion *tr = c->inr[1];
  k_embedding(c->out, c->in[0], IN(1), numel(c->inr[0]), ext(tr, 1), first(tr, 0), ext(tr, 0), c->acc);
  return true;
}

static bool embedding_backward(xcall *c, char *err, size_t errlen) {
  const tregion *tr = c->inr[1];
  if (c->din[1]) k_embedding_backward(c->din[1], c->dy, c->in[0], numel(c->inr[0]), ext(tr, 1), first(tr, 0), ext(tr, 0), c->acc);
  return true;
}

static bool cannot_accumulate(xcall *c, char *err, size_t errlen) {
  const gop *o = &c->g->ops[c->op];
  snprintf(err, errlen, "%s: %s cannot accumulate", o->name, o->decl ? o->decl->name : "");
  return false;
}

/* x [b, s, h] */
static void bsh(const tregion *xr, int64_t *b, int64_t *s, int64_t *h) {
  int r = xr->ndims;
  *h = ext(xr, r - 1), *s = ext(xr, r - 2), *b = numel(xr) / (*s * *h);
}

static bool add_position_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t b, s, h;
  bsh(c->inr[0], &b, &s, &h);
  k_add_position(c->out, IN(0), IN(1), b, s, h);
  return true;
}

static bool add_position_backward(xcall *c, char *err, size_t errlen) {
  int64_t b, s, h;
  bsh(c->inr[0], &b, &s, &h);
  k_add_position_backward(c->din[0], c->din[1], c->dy, b, s, h, c->acc);
  return true;
}

/* a [m, k] (the rows of a group flattened), b's last or first dimension n */
static void mkn(const xcall *c, bool transposed, int64_t *m, int64_t *k, int64_t *n) {
  *k = last(c->inr[0]);
  *m = numel(c->inr[0]) / (*k ? *k : 1);
  *n = transposed ? ext(c->inr[1], 0) : ext(c->inr[1], 1);
}

static bool matmul_forward(xcall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  k_matmul(c->out, IN(0), IN(1), m, k, n, c->acc);
  return true;
}

static bool matmul_backward(xcall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  k_matmul_backward(c->din[0], c->din[1], c->dy, IN(0), IN(1), m, k, n, c->acc);
  return true;
}

static bool matmul_t_forward(xcall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, true, &m, &k, &n);
  k_matmul_t(c->out, IN(0), IN(1), m, k, n, c->acc);
  return true;
}

static bool matmul_t_backward(xcall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, true, &m, &k, &n);
  k_matmul_t_backward(c->din[0], c->din[1], c->dy, IN(0), IN(1), m, k, n, c->acc);
  return true;
}

static bool linear_forward(xcall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  k_linear(c->out, IN(0), IN(1), IN(2), m, k, n, c->acc);
  return true;
}

static bool linear_backward(xcall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  k_linear_backward(c->din[0], c->din[1], c->din[2], c->dy, IN(0), IN(1), m, k, n, c->acc);
  return true;
}

/* x [rows, h] */
static void rows_h(const xcall *c, int64_t *rows, int64_t *h) {
  *h = last(c->inr[0]);
  *rows = numel(c->inr[0]) / (*h ? *h : 1);
}

static bool layernorm_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t rows, h;
  rows_h(c, &rows, &h);
  k_layernorm(c->out, IN(0), IN(1), IN(2), rows, h, xop_attr(c->g, c->op, "eps", 1e-5));
  return true;
}

static bool layernorm_backward(xcall *c, char *err, size_t errlen) {
  int64_t rows, h;
  rows_h(c, &rows, &h);
  k_layernorm_backward(c->din[0], c->din[1], c->din[2], c->dy, IN(0), IN(1), rows, h,
                       xop_attr(c->g, c->op, "eps", 1e-5), c->acc);
  return true;
}

static bool rmsnorm_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t rows, h;
  rows_h(c, &rows, &h);
  k_rmsnorm(c->out, IN(0), IN(1), rows, h, xop_attr(c->g, c->op, "eps", 1e-6));
  return true;
}

static bool rmsnorm_backward(xcall *c, char *err, size_t errlen) {
  int64_t rows, h;
  rows_h(c, &rows, &h);
  k_rmsnorm_backward(c->din[0], c->din[1], c->dy, IN(0), IN(1), rows, h, xop_attr(c->g, c->op, "eps", 1e-6), c->acc);
  return true;
}

static int64_t n0(const xcall *c) { return c->nin ? numel(c->inr[0]) : 0; }

static bool gelu_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  k_gelu(c->out, IN(0), n0(c));
  return true;
}

static bool gelu_backward(xcall *c, char *err, size_t errlen) {
  if (c->din[0]) k_gelu_backward(c->din[0], c->dy, IN(0), n0(c), c->acc);
  return true;
}

static bool silu_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  k_silu(c->out, IN(0), n0(c));
  return true;
}

static bool silu_backward(xcall *c, char *err, size_t errlen) {
  if (c->din[0]) k_silu_backward(c->din[0], c->dy, IN(0), n0(c), c->acc);
  return true;
}

static bool swiglu_forward(xcall *c, char *err, size_t errlen) {
  k_swiglu(c->out, IN(0), IN(1), n0(c));
  return true;
}

static bool swiglu_backward(xcall *c, char *err, size_t errlen) {
  k_swiglu_backward(c->din[0], c->din[1], c->dy, IN(0), IN(1), n0(c), c->acc);
  return true;
}

static bool add_forward(xcall *c, char *err, size_t errlen) {
  k_add(c->out, IN(0), IN(1), n0(c));
  return true;
}

static bool add_backward(xcall *c, char *err, size_t errlen) {
  k_add_backward(c->din[0], c->din[1], c->dy, n0(c), c->acc);
  return true;
}

static bool softmax_forward(xcall *c, char *err, size_t errlen) {
  int64_t v = last(c->inr[0]);
  k_softmax(c->out, IN(0), n0(c) / v, v);
  return true;
}

static bool softmax_backward(xcall *c, char *err, size_t errlen) {
  int64_t v = last(c->inr[0]);
  if (c->din[0]) k_softmax_backward(c->din[0], c->dy, IN(0), n0(c) / v, v, c->acc);
  return true;
}

/* x [b, s, heads * dh] with the part's heads, and where its sequence starts */
typedef struct rot_sizes {
  int64_t b, s, heads, dh, pos0;
  double base;
} rot_sizes;

static rot_sizes rotary_sizes(const xcall *c) {
  const tregion *xr = c->inr[0];
  int r = xr->ndims;
  rot_sizes z;
  int64_t heads_all = (int64_t)xop_attr(c->g, c->op, "n", 1);
  z.dh = whole_last(c, 0) / heads_all;
  z.heads = ext(xr, r - 1) / z.dh;
  z.s = ext(xr, r - 2);
  z.b = numel(xr) / (z.s * z.heads * z.dh);
  z.pos0 = first(xr, r - 2);
  z.base = xop_attr(c->g, c->op, "base", 10000.0);
  return z;
}

static bool rotary_forward(xcall *c, char *err, size_t errlen) {
  rot_sizes z = rotary_sizes(c);
  k_rotary(c->out, IN(0), z.b, z.s, z.heads, z.dh, z.pos0, z.base);
  return true;
}

static bool rotary_backward(xcall *c, char *err, size_t errlen) {
  rot_sizes z = rotary_sizes(c);
  if (c->din[0]) k_rotary_backward(c->din[0], c->dy, z.b, z.s, z.heads, z.dh, z.pos0, z.base, c->acc);
  return true;
}

/* qkv [b, s, (3 heads dh)] with the part's heads */
static void attention_sizes(const xcall *c, int64_t *b, int64_t *s, int64_t *heads, int64_t *dh) {
  const tregion *qr = c->inr[0];
  int r = qr->ndims;
  int64_t heads_all = (int64_t)xop_attr(c->g, c->op, "n", 1);
  *dh = whole_last(c, 0) / (3 * heads_all);
  *heads = ext(qr, r - 1) / (3 * *dh);
  *s = ext(qr, r - 2);
  *b = numel(qr) / (*s * 3 * *heads * *dh);
}

static bool causal_attention_forward(xcall *c, char *err, size_t errlen) {
  int64_t b, s, hl, dh;
  attention_sizes(c, &b, &s, &hl, &dh);
  k_causal_attention(c->out, IN(0), b, s, hl, dh);
  return true;
}

static bool causal_attention_backward(xcall *c, char *err, size_t errlen) {
  int64_t b, s, hl, dh;
  attention_sizes(c, &b, &s, &hl, &dh);
  if (c->din[0]) k_causal_attention_backward(c->din[0], c->dy, IN(0), b, s, hl, dh, c->acc);
  return true;
}

/* k [b, sk, (g dh)] with the part's groups, q [b, sq, (g r dh)] with the
 * part's queries, from position q0 (context parallelism: one interval of
 * the sequence); r query heads per group */
typedef struct gqa_dims {
  int64_t b, sq, sk, q0, gl, rr, dh;
} gqa_dims;

static bool gqa_sizes(const xcall *c, gqa_dims *z, char *err, size_t errlen) {
  const tregion *kr = c->inr[1], *qr = c->inr[0];
  int r = kr->ndims;
  int64_t g = (int64_t)xop_attr(c->g, c->op, "g", 1);
  z->rr = (int64_t)xop_attr(c->g, c->op, "r", 1);
  z->dh = whole_last(c, 1) / g;
  z->gl = ext(kr, r - 1) / z->dh;
  z->sk = ext(kr, r - 2);
  z->sq = ext(qr, r - 2);
  z->q0 = first(qr, r - 2);
  z->b = numel(kr) / (z->sk * z->gl * z->dh);
  if (qr->dims[r - 2].n > 1) {
    snprintf(err, errlen, "operator %s: its queries are a strided part of the sequence, which the CPU backend's attention "
                          "does not take (split the sequence into consecutive parts)", c->g->ops[c->op].name);
    return false;
  }
  return true;
}

static bool gqa_attention_forward(xcall *c, char *err, size_t errlen) {
  gqa_dims z;
  if (!gqa_sizes(c, &z, err, errlen)) return false;
  k_gqa_attention(c->out, IN(0), IN(1), IN(2), z.b, z.sq, z.sk, z.q0, z.gl, z.rr, z.dh);
  return true;
}

static bool gqa_attention_backward(xcall *c, char *err, size_t errlen) {
  gqa_dims z;
  if (!gqa_sizes(c, &z, err, errlen)) return false;
  k_gqa_attention_backward(c->din[0], c->din[1], c->din[2], c->dy, IN(0), IN(1), IN(2), z.b, z.sq, z.sk, z.q0, z.gl, z.rr,
                           z.dh, c->acc);
  return true;
}

/* ---- mixture of experts ---------------------------------------------------- */

/* The parts of a routed layer: g groups of s tokens of h features, e
 * experts (always whole), k choices per token, c slots per expert. */
typedef struct moe_sizes {
  int64_t g, s, h, e, k, c;
} moe_sizes;

/* probs [g, s, e] is input `pa`; the tokens' rows are x [g, s, h] (dispatch)
 * or the experts' rows ye [e, g, c, h] (combine). */
static moe_sizes moe_sizes_of(const xcall *c, int pa, const tregion *rows, bool expert_rows) {
  const tregion *pr = c->inr[pa];
  moe_sizes z = {ext(pr, 0), ext(pr, 1), 0, ext(pr, 2), (int64_t)xop_attr(c->g, c->op, "k", 1), 0};
  z.h = ext(rows, 3 - !expert_rows);
  z.c = expert_rows ? ext(rows, 2) : 0;
  return z;
}

/* A token chooses k distinct experts of the e: an operator declared with
 * another k is refused before a kernel reads past its probabilities. */
static bool moe_k_ok(const xcall *c, const moe_sizes *z, char *err, size_t errlen) {
  if (z->k >= 1 && z->k <= z->e) return true;
  snprintf(err, errlen, "operator %s: k (%lld) must be between 1 and the number of experts (%lld)",
           c->g->ops[c->op].name, (long long)z->k, (long long)z->e);
  return false;
}

static bool moe_dispatch_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  moe_sizes z = moe_sizes_of(c, 1, c->outr, true);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  k_moe_dispatch(c->out, IN(0), IN(1), z.g, z.s, z.h, z.e, z.k, z.c);
  return true;
}

static bool moe_dispatch_backward(xcall *c, char *err, size_t errlen) {
  moe_sizes z = moe_sizes_of(c, 1, c->dyr, true);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  k_moe_dispatch_backward(c->din[0], c->dy, IN(1), z.g, z.s, z.h, z.e, z.k, z.c, c->acc);
  /* the routing is piecewise constant: its probabilities get no gradient */
  if (c->din[1] && !c->acc) memset(c->din[1], 0, (size_t)numel(c->inr[1]) * sizeof(float));
  return true;
}

static bool moe_combine_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  moe_sizes z = moe_sizes_of(c, 1, c->inr[0], true);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  k_moe_combine(c->out, IN(0), IN(1), z.g, z.s, z.h, z.e, z.k, z.c, xop_attr(c->g, c->op, "normalize", 1) != 0);
  return true;
}

static bool moe_combine_backward(xcall *c, char *err, size_t errlen) {
  moe_sizes z = moe_sizes_of(c, 1, c->inr[0], true);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  k_moe_combine_backward(c->din[0], c->din[1], c->dy, IN(0), IN(1), z.g, z.s, z.h, z.e, z.k, z.c,
                         xop_attr(c->g, c->op, "normalize", 1) != 0, c->acc);
  return true;
}

/* x [e, g, c, k] (the rows of an expert flattened), w [e, k, n] */
static void emkn(const xcall *c, int64_t *e, int64_t *m, int64_t *k, int64_t *n) {
  *e = ext(c->inr[1], 0), *k = ext(c->inr[1], 1), *n = ext(c->inr[1], 2);
  *m = *e && *k ? numel(c->inr[0]) / (*e * *k) : 0;
}

static bool expert_matmul_forward(xcall *c, char *err, size_t errlen) {
  int64_t e, m, k, n;
  emkn(c, &e, &m, &k, &n);
  k_expert_matmul(c->out, IN(0), IN(1), e, m, k, n, c->acc);
  return true;
}

static bool expert_matmul_backward(xcall *c, char *err, size_t errlen) {
  int64_t e, m, k, n;
  emkn(c, &e, &m, &k, &n);
  k_expert_matmul_backward(c->din[0], c->din[1], c->dy, IN(0), IN(1), e, m, k, n, c->acc);
  return true;
}

/* An auxiliary loss: this part's share, which the step's loss adds. */
static bool moe_aux_loss_forward(xcall *c, char *err, size_t errlen) {
  moe_sizes z = moe_sizes_of(c, 0, c->inr[0], false);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  put_loss(c, k_moe_aux_loss(IN(0), z.g, z.s, z.e, z.k, tensor_of(c, 0)->dims[0].size,
                             xop_attr(c->g, c->op, "alpha", 0.01)));
  return true;
}

static bool moe_aux_loss_backward(xcall *c, char *err, size_t errlen) {
  moe_sizes z = moe_sizes_of(c, 0, c->inr[0], false);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  k_moe_aux_loss_backward(c->din[0], IN(0), z.g, z.s, z.e, z.k, tensor_of(c, 0)->dims[0].size,
                          xop_attr(c->g, c->op, "alpha", 0.01), dloss_of(c), c->acc);
  return true;
}

/* ---- attention without a mask (T5) ---------------------------------------- */

/* q [b.., sq, (n dh)] and k, v [b.., sk, (n dh)] with the part's heads; any
 * rows of the queries (no mask: each query attends to all the keys). */
static void attention_dims(const xcall *c, int64_t *b, int64_t *sq, int64_t *sk, int64_t *nl, int64_t *dh) {
  const tregion *kr = c->inr[1], *qr = c->inr[0];
  int r = kr->ndims;
  int64_t n = (int64_t)xop_attr(c->g, c->op, "n", 1);
  *dh = whole_last(c, 1) / n;
  *nl = ext(kr, r - 1) / *dh;
  *sk = ext(kr, r - 2);
  *sq = ext(qr, r - 2);
  int64_t per = *sk * *nl * *dh;
  *b = per ? numel(kr) / per : 0;
}

static bool attention_forward(xcall *c, char *err, size_t errlen) {
  (void)err, (void)errlen;
  int64_t b, sq, sk, nl, dh;
  attention_dims(c, &b, &sq, &sk, &nl, &dh);
  k_attention(c->out, IN(0), IN(1), IN(2), b, sq, sk, nl, dh);
  return true;
}

static bool attention_backward(xcall *c, char *err, size_t errlen) {
  (void)err, (void)errlen;
  int64_t b, sq, sk, nl, dh;
  attention_dims(c, &b, &sq, &sk, &nl, &dh);
  k_attention_backward(c->din[0], c->din[1], c->din[2], c->dy, IN(0), IN(1), IN(2), b, sq, sk, nl, dh, c->acc);
  return true;
}

/* ---- Swin Transformer -------------------------------------------------------- */

/* x [b, c, hn p, wn p] -> [b, hn, wn, c p p]; p whole */
static bool patchify_sizes(const xcall *c, int64_t z[5], char *err, size_t errlen) {
  const tregion *xr = c->inr[0];
  int64_t p = (int64_t)xop_attr(c->g, c->op, "p", 1);
  z[0] = ext(xr, 0), z[1] = ext(xr, 1), z[2] = ext(xr, 2) / p, z[3] = ext(xr, 3) / p, z[4] = p;
  return true;
}

static bool patchify_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t z[5];
  if (!patchify_sizes(c, z, err, errlen)) return false;
  k_patchify(c->out, IN(0), z[0], z[1], z[2], z[3], z[4]);
  return true;
}

static bool patchify_backward(xcall *c, char *err, size_t errlen) {
  int64_t z[5];
  if (!patchify_sizes(c, z, err, errlen)) return false;
  k_patchify_backward(c->din[0], c->dy, z[0], z[1], z[2], z[3], z[4], c->acc);
  return true;
}

/* The grid of windows: x [b, hn ws, wn ws, c] (partition) or [b, hn, wn,
 * ws ws, c] (reverse); the grid is never split. */
typedef struct win_sizes {
  int64_t b, hn, wn, ws, c, shift;
} win_sizes;

static win_sizes win_sizes_of(const xcall *c, bool windows) {
  const tregion *xr = c->inr[0];
  win_sizes z = {ext(xr, 0), 0, 0, (int64_t)xop_attr(c->g, c->op, "ws", 1), last(xr),
                 (int64_t)xop_attr(c->g, c->op, "shift", 0)};
  z.hn = windows ? ext(xr, 1) : ext(xr, 1) / z.ws;
  z.wn = windows ? ext(xr, 2) : ext(xr, 2) / z.ws;
  return z;
}

static bool window_partition_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  win_sizes z = win_sizes_of(c, false);
  k_window_partition(c->out, IN(0), z.b, z.hn, z.wn, z.ws, z.c, z.shift);
  return true;
}

static bool window_partition_backward(xcall *c, char *err, size_t errlen) {
  win_sizes z = win_sizes_of(c, false);
  k_window_partition_backward(c->din[0], c->dy, z.b, z.hn, z.wn, z.ws, z.c, z.shift, c->acc);
  return true;
}

static bool window_reverse_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  win_sizes z = win_sizes_of(c, true);
  k_window_reverse(c->out, IN(0), z.b, z.hn, z.wn, z.ws, z.c, z.shift);
  return true;
}

static bool window_reverse_backward(xcall *c, char *err, size_t errlen) {
  win_sizes z = win_sizes_of(c, true);
  k_window_reverse_backward(c->din[0], c->dy, z.b, z.hn, z.wn, z.ws, z.c, z.shift, c->acc);
  return true;
}

/* qkv [b, hn, wn, s, (3 heads dh)] with the part's windows and heads, table
 * [(2 ws - 1)^2, heads]: s must be a square and the table's rows match it. */
static bool window_attention_sizes(const xcall *c, swin_attn_dims *z, char *err, size_t errlen) {
  const tregion *qr = c->inr[0], *tr = c->inr[1];
  const gtensor *qt = tensor_of(c, 0);
  int64_t heads_all = (int64_t)xop_attr(c->g, c->op, "n", 1), s = ext(qr, 3);
  int64_t ws = (int64_t)llround(sqrt((double)s));
  *z = (swin_attn_dims){ext(qr, 0), ext(qr, 1), ext(qr, 2), ws, ext(tr, 1), whole_last(c, 0) / (3 * heads_all),
                        first(qr, 1), first(qr, 2), qt->dims[1].size, qt->dims[2].size,
                        (int64_t)xop_attr(c->g, c->op, "shift", 0)};
  const char *name = c->g->ops[c->op].name;
  if (ws * ws != s) {
    snprintf(err, errlen, "operator %s: a window of %lld tokens is not a square", name, (long long)s);
    return false;
  }
  if (ext(tr, 0) != (2 * ws - 1) * (2 * ws - 1)) {
    snprintf(err, errlen, "operator %s: its relative position table has %lld rows, a window of %lld x %lld needs %lld",
             name, (long long)ext(tr, 0), (long long)ws, (long long)ws, (long long)((2 * ws - 1) * (2 * ws - 1)));
    return false;
  }
  if (z->shift < 0 || z->shift >= ws) {
    snprintf(err, errlen, "operator %s: shift %lld must be at least 0 and less than the window (%lld)", name,
             (long long)z->shift, (long long)ws);
    return false;
  }
  return true;
}

static bool window_attention_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  swin_attn_dims z;
  if (!window_attention_sizes(c, &z, err, errlen)) return false;
  k_window_attention(c->out, IN(0), IN(1), &z);
  return true;
}

static bool window_attention_backward(xcall *c, char *err, size_t errlen) {
  swin_attn_dims z;
  if (!window_attention_sizes(c, &z, err, errlen)) return false;
  k_window_attention_backward(c->din[0], c->din[1], c->dy, IN(0), IN(1), &z, c->acc);
  return true;
}

/* x [b, 2 hn, 2 wn, c] */
static void merge_sizes(const xcall *c, int64_t *b, int64_t *hn, int64_t *wn, int64_t *ch) {
  const tregion *xr = c->inr[0];
  *b = ext(xr, 0), *hn = ext(xr, 1) / 2, *wn = ext(xr, 2) / 2, *ch = ext(xr, 3);
}

static bool patch_merge_forward(xcall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t b, hn, wn, ch;
  merge_sizes(c, &b, &hn, &wn, &ch);
  k_patch_merge(c->out, IN(0), b, hn, wn, ch);
  return true;
}

static bool patch_merge_backward(xcall *c, char *err, size_t errlen) {
  int64_t b, hn, wn, ch;
  merge_sizes(c, &b, &hn, &wn, &ch);
  k_patch_merge_backward(c->din[0], c->dy, b, hn, wn, ch, c->acc);
  return true;
}

/* x [b, h, w, c]: the part's tokens, divided by the whole grid's count */
static void pool_sizes(const xcall *c, int64_t *b, int64_t *hw, int64_t *ch, int64_t *count) {
  const tregion *xr = c->inr[0];
  const gtensor *t = tensor_of(c, 0);
  *b = ext(xr, 0), *hw = ext(xr, 1) * ext(xr, 2), *ch = ext(xr, 3);
  *count = t->dims[1].size * t->dims[2].size;
}

static bool mean_pool_forward(xcall *c, char *err, size_t errlen) {
  int64_t b, hw, ch, count;
  pool_sizes(c, &b, &hw, &ch, &count);
  k_mean_pool(c->out, IN(0), b, hw, ch, count, c->acc);
  return true;
}

static bool mean_pool_backward(xcall *c, char *err, size_t errlen) {
  int64_t b, hw, ch, count;
  pool_sizes(c, &b, &hw, &ch, &count);
  k_mean_pool_backward(c->din[0], c->dy, b, hw, ch, count, c->acc);
  return true;
}

#undef IN

/* ---- the table ------------------------------------------------------------ */

typedef bool (*xkernel)(xcall *c, char *err, size_t errlen);

struct xop {
  const char *kind;       /* the operator's name in stdlib/ops.plan */
  xkernel forward, backward;
  xkernel stats;          /* the statistics the parts of one split gather
                           * (LP_STATS), NULL when they gather none */
  bool loss;              /* xop_is_loss */
  const char *params;     /* per tensor argument, how a parameter read there
                           * starts (xop_param_init); NULL: every one normal */
  int ids;                /* the argument holding ids, -1 none */
  int bound_arg, bound_dim; /* the argument whose dimension bounds them (-1: its last) */
};

#define KERNELS(name) #name, name##_forward, name##_backward, NULL

static const xop xops[] = {
  {KERNELS(matmul), false, NULL, -1, 0, 0},
  {KERNELS(matmul_t), false, NULL, -1, 0, 0},
  {"linear", linear_forward, linear_backward, NULL, false, "wwb", -1, 0, 0},
  {"qkv_linear", linear_forward, linear_backward, NULL, false, "wwb", -1, 0, 0},
  {KERNELS(embedding), false, NULL, 0, 1, 0},
  {KERNELS(add_position), false, NULL, -1, 0, 0},
  {KERNELS(layernorm), false, "wnb", -1, 0, 0},
  {KERNELS(rmsnorm), false, "wn", -1, 0, 0},
  {KERNELS(gelu), false, NULL, -1, 0, 0},
  {KERNELS(silu), false, NULL, -1, 0, 0},
  {KERNELS(swiglu), false, NULL, -1, 0, 0},
  {KERNELS(add), false, NULL, -1, 0, 0},
  {KERNELS(softmax), false, NULL, -1, 0, 0},
  {KERNELS(rotary), false, NULL, -1, 0, 0},
  {KERNELS(causal_attention), false, NULL, -1, 0, 0},
  {KERNELS(gqa_attention), false, NULL, -1, 0, 0},
  {"cross_entropy", ce_forward, ce_backward, ce_stats, true, NULL, 1, 0, -1},
  {KERNELS(mse), true, NULL, -1, 0, 0},
  {KERNELS(moe_dispatch), false, NULL, -1, 0, 0},
  {KERNELS(moe_combine), false, NULL, -1, 0, 0},
  {KERNELS(expert_matmul), false, NULL, -1, 0, 0},
  {KERNELS(moe_aux_loss), true, NULL, -1, 0, 0},
  {KERNELS(attention), false, NULL, -1, 0, 0},
  /* Swin Transformer */
  {KERNELS(patchify), false, NULL, -1, 0, 0},
  {KERNELS(window_partition), false, NULL, -1, 0, 0},
  {KERNELS(window_reverse), false, NULL, -1, 0, 0},
  {KERNELS(window_attention), false, NULL, -1, 0, 0},
  {KERNELS(patch_merge), false, NULL, -1, 0, 0},
  {KERNELS(mean_pool), false, NULL, -1, 0, 0},
};

#undef KERNELS

/* Operators that name kernels in a shared library, whatever their kind. */
static const xop native_op = {"native", native, native, NULL, false, NULL, -1, 0, 0};

static const xop *by_kind(const weft_graph *g, int op) {
  const opdecl *d = g->ops[op].decl;
  if (!d) return NULL;
  if (d->native_fwd) return &native_op;
  for (size_t i = 0; i < sizeof xops / sizeof xops[0]; i++)
    if (strcmp(xops[i].kind, d->name) == 0) return &xops[i];
  return NULL;
}

const xop *xop_find(const weft_graph *g, int op, char *err, size_t errlen) {
  const xop *k = by_kind(g, op);
  if (!k) {
    const opdecl *d = g->ops[op].decl;
    snprintf(err, errlen, "operator %s (%s) has no kernel on the CPU backend", g->ops[op].name, d ? d->name : "?");
  }
  return k;
}

bool xop_is_loss(const xop *k) { return k && k->loss; }

bool xop_run(xcall *c, char *err, size_t errlen) {
  if (c->part == LP_STATS) {
    if (c->kern->stats) return c->kern->stats(c, err, errlen);
    snprintf(err, errlen, "%s: its parts gather no statistics", c->g->ops[c->op].name);
    return false;
  }
  /* A backward without the gradient of its result adds nothing. */
  if (c->backward && !c->dy && !c->kern->loss) return true;
  return (c->backward ? c->kern->backward : c->kern->forward)(c, err, errlen);
}

char xop_param_init(const weft_graph *g, int op, int arg) {
  const xop *k = by_kind(g, op);
  if (!k || !k->params || arg >= (int)strlen(k->params)) return 'w';
  return k->params[arg];
}

int64_t xop_id_bound(const weft_graph *g, int op, int arg) {
  const xop *k = by_kind(g, op);
  if (!k || k->ids != arg) return 0;
  const gtensor *t = &g->tensors[g->ops[op].inputs[k->bound_arg]];
  int d = k->bound_dim < 0 ? t->ndims - 1 : k->bound_dim;
  return d >= 0 && d < t->ndims ? t->dims[d].size : 0;
}
