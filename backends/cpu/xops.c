/* xops.c - the operators of the standard library on packed parts: sizes
 * come from the regions of the part, then one kernel call (kernels.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
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
  const vrecord *r = g->ops[op].attrs;
  for (int i = 0; r && i < r->n; i++) {
    if (strcmp(r->keys[i], name) != 0) continue;
    const value *v = &r->vals[i];
    if (v->kind == V_INT || v->kind == V_BOOL) return (double)v->i;
    if (v->kind == V_FLOAT) return v->f;
  }
  return dflt;
}

static const char *op_name(const weft_graph *g, int op) {
  const opdecl *d = g->ops[op].decl;
  return d ? d->name : "";
}

bool xop_is_loss(const weft_graph *g, int op) {
  const char *n = op_name(g, op);
  return strcmp(n, "cross_entropy") == 0 || strcmp(n, "mse") == 0;
}

/* ---- cross entropy split along the vocabulary --------------------------- */

/* The global row maxima and sums of every shard, and the label logits, for
 * a shard holding logits columns [v_lo, v_lo + v): combined through the
 * exchange. Returns false with a message. */
static bool ce_global(xcall *c, const float *logits, const int32_t *labels, int64_t t,
                      int64_t v_lo, int64_t v, float *gmax, float *gsum, float *target,
                      char *err, size_t errlen) {
  float *mine = malloc((size_t)(3 * t + 1) * sizeof(float));
  if (!mine) weft_oom();
  k_cross_entropy_shard_max(mine, logits, t, v);
  k_cross_entropy_shard_sumexp(mine + t, logits, mine, t, v);
  k_cross_entropy_shard_target(mine + 2 * t, logits, labels, t, v_lo, v);
  float *all = NULL;
  int p = c->exchange ? c->exchange(c->xctx, v_lo, mine, 3 * t, &all) : -1;
  free(mine);
  if (p < 1) {
    snprintf(err, errlen, "%s: the shards of a cross entropy split along the vocabulary did not meet",
             c->g->ops[c->op].name);
    free(all);
    return false;
  }
  float *smax = malloc((size_t)(p * t + 1) * sizeof(float));
  float *ssum = malloc((size_t)(p * t + 1) * sizeof(float));
  if (!smax || !ssum) weft_oom();
  for (int64_t i = 0; i < t; i++) target[i] = 0;
  for (int s = 0; s < p; s++) {
    const float *a = all + (int64_t)s * 3 * t;
    memcpy(smax + s * t, a, (size_t)t * sizeof(float));
    memcpy(ssum + s * t, a + t, (size_t)t * sizeof(float));
    for (int64_t i = 0; i < t; i++) target[i] += a[2 * t + i];
  }
  k_cross_entropy_merge(gmax, gsum, smax, ssum, p, t);
  free(smax);
  free(ssum);
  free(all);
  return true;
}

static bool cross_entropy(xcall *c, char *err, size_t errlen) {
  const tregion *lr = c->inr[0];
  int64_t v = last(lr), t = numel(c->inr[1]);
  int64_t v_lo = lr->ndims ? first(lr, lr->ndims - 1) : 0;
  const gtensor *lab = tensor_of(c, 1);
  int64_t t_total = tensor_numel(lab);
  const float *logits = c->in[0];
  const int32_t *labels = c->in[1];
  bool split = v < whole_last(c, 0);
  if (!c->backward) {
    double loss;
    if (!split) {
      loss = k_cross_entropy(logits, labels, t, v, t_total);
    } else {
      float *g = malloc((size_t)(3 * t + 1) * sizeof(float));
      if (!g) weft_oom();
      if (!ce_global(c, logits, labels, t, v_lo, v, g, g + t, g + 2 * t, err, errlen)) { free(g); return false; }
      loss = k_cross_entropy_combine(g, g + t, g + 2 * t, t, t_total);
      free(g);
    }
    /* Every shard of a vocabulary split holds the whole loss of its rows;
     * the first shard's counts, the others write 0, so that the sum the
     * program makes of the parts is the loss. */
    bool counts = !split || v_lo == 0;
    c->loss = counts ? loss : 0.0;
    c->loss_counts = counts;
    float val = counts ? (float)loss : 0.0f;
    if (c->acc) *c->out += val;
    else *c->out = val;
    return true;
  }
  if (!c->din[0]) return true;
  if (!split) {
    k_cross_entropy_backward(c->din[0], logits, labels, t, v, t_total, 1.0, c->acc);
    return true;
  }
  float *g = malloc((size_t)(3 * t + 1) * sizeof(float));
  if (!g) weft_oom();
  if (!ce_global(c, logits, labels, t, v_lo, v, g, g + t, g + 2 * t, err, errlen)) { free(g); return false; }
  k_cross_entropy_shard_backward(c->din[0], logits, labels, g, g + t, t, v_lo, v, t_total, 1.0, c->acc);
  free(g);
  return true;
}

/* ---- native kernels ------------------------------------------------------ */

/* An operator whose declaration names a kernel in a shared library: the
 * sizes are the extents of the part's idims; the kernel overwrites, so
 * accumulation goes through a zeroed part. */
static bool native(xcall *c, const opdecl *d, char *err, size_t errlen) {
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

/* ---- the table ---------------------------------------------------------- */

bool xop_run(xcall *c, char *err, size_t errlen) {
  const char *name = op_name(c->g, c->op);
  const float *const *in = (const float *const *)c->in;
  float **d = c->din;
  bool b = c->backward, acc = c->acc;
  const float *dy = c->dy;
  /* A backward without the gradient of its result adds nothing. */
  if (b && !dy && !xop_is_loss(c->g, c->op)) return true;
  const opdecl *decl = c->g->ops[c->op].decl;
  if (decl && decl->native_fwd) return native(c, decl, err, errlen);
  if (strcmp(name, "cross_entropy") == 0) return cross_entropy(c, err, errlen);
  if (strcmp(name, "mse") == 0) {
    int64_t n = numel(c->inr[0]), total = tensor_numel(tensor_of(c, 0));
    if (!b) {
      c->loss = k_mse(in[0], in[1], n, total);
      c->loss_counts = true;
      float val = (float)c->loss;
      if (acc) *c->out += val;
      else *c->out = val;
    } else {
      k_mse_backward(d[0], d[1], in[0], in[1], n, total, 1.0, acc);
    }
    return true;
  }
  if (strcmp(name, "embedding") == 0) {
    const tregion *tr = c->inr[1];
    int64_t t = numel(c->inr[0]), h = ext(tr, 1), v_lo = first(tr, 0), v = ext(tr, 0);
    if (!b) k_embedding(c->out, c->in[0], in[1], t, h, v_lo, v, acc);
    else if (d[1]) k_embedding_backward(d[1], dy, c->in[0], t, h, v_lo, v, acc);
    return true;
  }
  if (strcmp(name, "add_position") == 0) {
    const tregion *xr = c->inr[0];
    int r = xr->ndims;
    int64_t h = ext(xr, r - 1), s = ext(xr, r - 2), bb = numel(xr) / (s * h);
    if (!b) {
      if (acc) { snprintf(err, errlen, "%s: add_position cannot accumulate", c->g->ops[c->op].name); return false; }
      k_add_position(c->out, in[0], in[1], bb, s, h);
    } else {
      k_add_position_backward(d[0], d[1], dy, bb, s, h, acc);
    }
    return true;
  }
  if (strcmp(name, "matmul") == 0 || strcmp(name, "matmul_t") == 0) {
    bool t = name[6] == '_';
    int64_t k = last(c->inr[0]), m = numel(c->inr[0]) / (k ? k : 1);
    int64_t n = t ? ext(c->inr[1], 0) : ext(c->inr[1], 1);
    if (!b) (t ? k_matmul_t : k_matmul)(c->out, in[0], in[1], m, k, n, acc);
    else (t ? k_matmul_t_backward : k_matmul_backward)(d[0], d[1], dy, in[0], in[1], m, k, n, acc);
    return true;
  }
  if (strcmp(name, "linear") == 0 || strcmp(name, "qkv_linear") == 0) {
    int64_t k = last(c->inr[0]), m = numel(c->inr[0]) / (k ? k : 1), n = ext(c->inr[1], 1);
    if (!b) k_linear(c->out, in[0], in[1], in[2], m, k, n, acc);
    else k_linear_backward(d[0], d[1], d[2], dy, in[0], in[1], m, k, n, acc);
    return true;
  }
  if (strcmp(name, "layernorm") == 0 || strcmp(name, "rmsnorm") == 0) {
    bool ln = name[0] == 'l';
    double eps = xop_attr(c->g, c->op, "eps", ln ? 1e-5 : 1e-6);
    int64_t h = last(c->inr[0]), rows = numel(c->inr[0]) / (h ? h : 1);
    if (!b) {
      if (acc) { snprintf(err, errlen, "%s: a norm cannot accumulate", c->g->ops[c->op].name); return false; }
      if (ln) k_layernorm(c->out, in[0], in[1], in[2], rows, h, eps);
      else k_rmsnorm(c->out, in[0], in[1], rows, h, eps);
    } else {
      if (ln) k_layernorm_backward(d[0], d[1], d[2], dy, in[0], in[1], rows, h, eps, acc);
      else k_rmsnorm_backward(d[0], d[1], dy, in[0], in[1], rows, h, eps, acc);
    }
    return true;
  }
  int64_t n0 = c->nin ? numel(c->inr[0]) : 0;
  if (strcmp(name, "gelu") == 0 || strcmp(name, "silu") == 0) {
    bool ge = name[0] == 'g';
    if (!b) {
      if (acc) { snprintf(err, errlen, "%s cannot accumulate", name); return false; }
      (ge ? k_gelu : k_silu)(c->out, in[0], n0);
    } else if (d[0]) {
      (ge ? k_gelu_backward : k_silu_backward)(d[0], dy, in[0], n0, acc);
    }
    return true;
  }
  if (strcmp(name, "swiglu") == 0) {
    if (!b) k_swiglu(c->out, in[0], in[1], n0);
    else k_swiglu_backward(d[0], d[1], dy, in[0], in[1], n0, acc);
    return true;
  }
  if (strcmp(name, "add") == 0) {
    if (!b) k_add(c->out, in[0], in[1], n0);
    else k_add_backward(d[0], d[1], dy, n0, acc);
    return true;
  }
  if (strcmp(name, "softmax") == 0) {
    int64_t v = last(c->inr[0]);
    if (!b) k_softmax(c->out, in[0], n0 / v, v);
    else if (d[0]) k_softmax_backward(d[0], dy, in[0], n0 / v, v, acc);
    return true;
  }
  if (strcmp(name, "rotary") == 0) {
    const tregion *xr = c->inr[0];
    int r = xr->ndims;
    int64_t heads_all = (int64_t)xop_attr(c->g, c->op, "n", 1);
    int64_t dh = whole_last(c, 0) / heads_all, hl = ext(xr, r - 1) / dh, s = ext(xr, r - 2);
    int64_t bb = numel(xr) / (s * hl * dh), pos0 = first(xr, r - 2);
    double base = xop_attr(c->g, c->op, "base", 10000.0);
    if (!b) k_rotary(c->out, in[0], bb, s, hl, dh, pos0, base);
    else if (d[0]) k_rotary_backward(d[0], dy, bb, s, hl, dh, pos0, base, acc);
    return true;
  }
  if (strcmp(name, "causal_attention") == 0) {
    const tregion *qr = c->inr[0];
    int r = qr->ndims;
    int64_t heads_all = (int64_t)xop_attr(c->g, c->op, "n", 1);
    int64_t dh = whole_last(c, 0) / (3 * heads_all), hl = ext(qr, r - 1) / (3 * dh), s = ext(qr, r - 2);
    int64_t bb = numel(qr) / (s * 3 * hl * dh);
    if (!b) k_causal_attention(c->out, in[0], bb, s, hl, dh);
    else if (d[0]) k_causal_attention_backward(d[0], dy, in[0], bb, s, hl, dh, acc);
    return true;
  }
  if (strcmp(name, "gqa_attention") == 0) {
    const tregion *kr = c->inr[1];
    int r = kr->ndims;
    int64_t g = (int64_t)xop_attr(c->g, c->op, "g", 1), rr = (int64_t)xop_attr(c->g, c->op, "r", 1);
    int64_t dh = whole_last(c, 1) / g, gl = ext(kr, r - 1) / dh, s = ext(kr, r - 2);
    int64_t bb = numel(kr) / (s * gl * dh);
    if (!b) k_gqa_attention(c->out, in[0], in[1], in[2], bb, s, gl, rr, dh);
    else k_gqa_attention_backward(d[0], d[1], d[2], dy, in[0], in[1], in[2], bb, s, gl, rr, dh, acc);
    return true;
  }
  snprintf(err, errlen, "operator %s (%s) has no kernel on the CPU backend", c->g->ops[c->op].name, name);
  return false;
}
