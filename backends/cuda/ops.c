/* ops.c - the operators of the standard library on the GPU: sizes from the
 * regions of a part (as backends/cpu/xops.c reads them), then launches of
 * the kernels of gpu.h; one table maps each operator kind to its forward,
 * backward and, for a cross entropy split along its vocabulary, statistics. */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft/value.h"

_Static_assert((int)DT_F32 == (int)GPU_F32 && (int)DT_BF16 == (int)GPU_BF16 && (int)DT_F16 == (int)GPU_F16 &&
                   (int)DT_I32 == (int)GPU_I32,
               "gpu_dtype and weft_dtype agree");

/* ---- sizes ---------------------------------------------------------------------------- */

static int64_t ext(const tregion *r, int d) { return cx_dlen(&r->dims[d]); }
static int64_t last(const tregion *r) { return r->ndims ? ext(r, r->ndims - 1) : 1; }
static int64_t first(const tregion *r, int d) { return r->dims[d].n ? r->dims[d].iv[0].lo : 0; }

static const gtensor *tensor_of(const ccall *c, int arg) {
  const gop *o = &c->g->ops[c->op];
  return &c->g->tensors[arg < 0 ? o->output : o->inputs[arg]];
}

static int64_t whole_last(const ccall *c, int arg) {
  const gtensor *t = tensor_of(c, arg);
  return t->ndims ? t->dims[t->ndims - 1].size : 1;
}

static int64_t n0(const ccall *c) { return c->nin ? cx_numel(c->inr[0]) : 0; }

/* elements to bytes of the call's type */
static const void *at(const ccall *c, const void *p, int64_t elems) {
  return p ? (const char *)p + elems * gpu_dtype_size(c->dt) : NULL;
}

typedef bool (*ckern)(const ccall *c, char *err, size_t errlen);
typedef size_t (*cws)(const ccall *c);

struct ckernel {
  const char *kind;       /* the operator's name in stdlib/ops.plan */
  ckern forward, backward, stats;
  cws ws_forward, ws_backward;
  cws keep;               /* what a forward keeps for its backward, NULL: nothing */
  bool loss;
  int ids;                /* the argument holding ids, -1 none */
  unsigned f32_grads;     /* bit a: the backward writes din[a] in f32 if asked (ccall.f32din) */
  unsigned props;         /* K_* */
};

/* ckernel.props. K_OVERWRITES: its kernels write every element of their
 * outputs when not accumulating, forward and backward (each a grid over
 * all of them; test_kernels checks the GPT's backward on poisoned outputs:
 * check_overwrites and the products', attention's and cross entropy's).
 * K_PITCH_OUT: its result and the result's gradient may have padded rows
 * (ccall.pitch_out, pitch_dy); K_PITCH_IN0: its first input and that
 * input's gradient likewise (pitch_in0, pitch_din0). K_SCRATCH_DX: the
 * backward adds to its first input's gradient through scratch it owns, not
 * in place (H100, GPT-2 124M: LayerNorm's backward adding in place took
 * 5.6 ms a step against 0.6 ms writing scratch; the cause is not
 * established). K_GRAD_IN_PLACE: a loss whose forward, taking its first
 * input whole, can also write that input's gradient over it (ccall.grad_in_place).
 * K_PASSES_GRAD: its backward gives every input its result's gradient as
 * it is (a residual's add; pass_grads in exec.c). */
enum { K_OVERWRITES = 1, K_PITCH_OUT = 2, K_PITCH_IN0 = 4, K_SCRATCH_DX = 8, K_GRAD_IN_PLACE = 16, K_PASSES_GRAD = 32 };

static bool cannot_accumulate(const ccall *c, char *err, size_t errlen) {
  const gop *o = &c->g->ops[c->op];
  snprintf(err, errlen, "%s: %s cannot accumulate", o->name, o->decl ? o->decl->name : "");
  return false;
}

/* ---- matrix products ------------------------------------------------------------------ */

static void mkn(const ccall *c, bool transposed, int64_t *m, int64_t *k, int64_t *n) {
  *k = last(c->inr[0]);
  *m = cx_numel(c->inr[0]) / (*k ? *k : 1);
  *n = transposed ? ext(c->inr[1], 0) : ext(c->inr[1], 1);
}

/* The type of din[a]. */
static int din_dt(const ccall *c, int a) { return c->f32din >> a & 1u ? GPU_F32 : c->dt; }

/* out = op(a) op(b) (+ bias) (+ out); out of type odt. */
static bool gemm_to(const ccall *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                    const void *b, int64_t ldb, void *out, int64_t ldc, int odt, const void *bias, bool acc, char *err,
                    size_t errlen) {
  char e2[400];
  if (gpu_gemm(c->s, ta, tb, m, n, k, a, lda, c->dt, b, ldb, c->dt, out, ldc, odt, bias, acc, c->gemm_ws,
               gpu_gemm_ws(), c->deterministic, e2, sizeof e2))
    return true;
  snprintf(err, errlen, "%s: %s", c->g->ops[c->op].name, e2);
  return false;
}

static bool gemm(const ccall *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                 const void *b, int64_t ldb, void *out, int64_t ldc, const void *bias, bool acc, char *err,
                 size_t errlen) {
  return gemm_to(c, ta, tb, m, n, k, a, lda, b, ldb, out, ldc, c->dt, bias, acc, err, errlen);
}

/* out = op(a) op(b) (+ bias) then the call's epilogue (ccall.epi), packed */
static bool gemm_epi(const ccall *c, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                     const void *b, int64_t ldb, void *out, const void *bias, void *aux, char *err, size_t errlen) {
  char e2[400];
  if (gpu_gemm_epi(c->s, ta, tb, m, n, k, a, lda, c->dt, b, ldb, c->dt, out, c->dt, bias, c->epi, aux, c->gemm_ws,
                   gpu_gemm_ws(), c->deterministic, e2, sizeof e2))
    return true;
  snprintf(err, errlen, "%s: %s", c->g->ops[c->op].name, e2);
  return false;
}

static bool matmul_forward(const ccall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  return gemm(c, false, false, m, n, k, c->in[0], k, c->in[1], n, c->out, n, NULL, c->acc, err, errlen);
}

static bool matmul_backward(const ccall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  if (c->din[0] && !gemm(c, false, true, m, k, n, c->dy, n, c->in[1], n, c->din[0], k, NULL, c->acc, err, errlen))
    return false;
  return !c->din[1] ||
         gemm_to(c, true, false, k, n, m, c->in[0], k, c->dy, n, c->din[1], n, din_dt(c, 1), NULL, c->acc, err, errlen);
}

/* the result's rows (and its gradient's) may be padded (ccall.pitch_out,
 * pitch_dy): the logits of an LM head */
static bool matmul_t_forward(const ccall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, true, &m, &k, &n);
  return gemm(c, false, true, m, n, k, c->in[0], k, c->in[1], k, c->out, c->pitch_out ? c->pitch_out : n, NULL,
              c->acc, err, errlen);
}

static bool matmul_t_backward(const ccall *c, char *err, size_t errlen) {
  int64_t m, k, n, ldy;
  mkn(c, true, &m, &k, &n);
  ldy = c->pitch_dy ? c->pitch_dy : n;
  if (c->din[0] && !gemm(c, false, false, m, k, n, c->dy, ldy, c->in[1], k, c->din[0], k, NULL, c->acc, err, errlen))
    return false;
  return !c->din[1] ||
         gemm_to(c, true, false, n, k, m, c->dy, ldy, c->in[0], k, c->din[1], k, din_dt(c, 1), NULL, c->acc, err,
                 errlen);
}

static bool linear_forward(const ccall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  /* fused with the GELU after it: out is its input, epi_ptr its result */
  if (c->epi == GPU_EPI_GELU)
    return gemm_epi(c, false, false, m, n, k, c->in[0], k, c->in[1], n, c->epi_ptr, c->in[2], c->out, err, errlen);
  /* fused with the residual's add after it: epi_ptr = the result + epi_in */
  if (c->epi == GPU_EPI_RESID)
    return gemm_epi(c, false, false, m, n, k, c->in[0], k, c->in[1], n, c->epi_ptr, c->in[2], (void *)c->epi_in, err,
                    errlen);
  return gemm(c, false, false, m, n, k, c->in[0], k, c->in[1], n, c->out, n, c->in[2], c->acc, err, errlen);
}

/* A linear's weight and bias gradients, dW = x^T dy and db = dy's column
 * sums: one product whose epilogue sums dy's columns as it reads them
 * (gpu_gemm_dbias), where both are written (not added to) and the sums
 * need not come in a fixed order (not --deterministic) and
 * WEFT_GEMM_DBIAS is not 0; else the product, then the column sums. */
static bool weight_grads(const ccall *c, int64_t m, int64_t k, int64_t n, char *err, size_t errlen) {
  static int dbias = -1;
  if (dbias < 0) dbias = !getenv("WEFT_GEMM_DBIAS") || strcmp(getenv("WEFT_GEMM_DBIAS"), "0") != 0;
  if (dbias && c->din[1] && c->din[2] && !c->acc && !c->deterministic) {
    bool fused = false;
    char e2[400];
    if (!gpu_gemm_dbias(c->s, true, false, k, n, m, c->in[0], k, c->dt, c->dy, n, c->dt, c->din[1], din_dt(c, 1),
                        c->din[2], din_dt(c, 2), c->gemm_ws, gpu_gemm_ws(), &fused, e2, sizeof e2)) {
      snprintf(err, errlen, "%s: %s", c->g->ops[c->op].name, e2);
      return false;
    }
    if (fused) return true;
  }
  if (c->din[1] &&
      !gemm_to(c, true, false, k, n, m, c->in[0], k, c->dy, n, c->din[1], n, din_dt(c, 1), NULL, c->acc, err, errlen))
    return false;
  if (c->din[2]) gpu_colsum(c->s, c->dt, c->din[2], din_dt(c, 2), c->dy, m, n, c->acc, c->ws);
  return true;
}

static bool linear_backward(const ccall *c, char *err, size_t errlen) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  if (c->epi == GPU_EPI_DGELU) {
    /* fused with the GELU's backward before it (ccall_fusion): the
     * weight's and the bias's gradients first, then din[0], the gradient of
     * the GELU's input (epi_ptr), which may lie where x or the scratch were */
    if (!weight_grads(c, m, k, n, err, errlen)) return false;
    return gemm_epi(c, false, true, m, k, n, c->dy, n, c->in[1], n, c->din[0], NULL, c->epi_ptr, err, errlen);
  }
  if (c->din[0] && !gemm(c, false, true, m, k, n, c->dy, n, c->in[1], n, c->din[0], k, NULL, c->acc, err, errlen))
    return false;
  return weight_grads(c, m, k, n, err, errlen);
}

static size_t linear_ws_backward(const ccall *c) {
  int64_t m, k, n;
  mkn(c, false, &m, &k, &n);
  return gpu_colsum_ws(m, n);
}

/* ---- embeddings ------------------------------------------------------------------------- */

static bool embedding_forward(const ccall *c, char *err, size_t errlen) {
  const tregion *tr = c->inr[1];
  gpu_embedding(c->s, c->dt, c->out, c->in[0], c->in[1], cx_numel(c->inr[0]), ext(tr, 1), first(tr, 0), ext(tr, 0),
                c->acc);
  return true;
}

static bool embedding_backward(const ccall *c, char *err, size_t errlen) {
  const tregion *tr = c->inr[1];
  if (c->din[1])
    gpu_embedding_backward(c->s, c->dt, c->din[1], din_dt(c, 1), c->dy, c->in[0], cx_numel(c->inr[0]), ext(tr, 1),
                           first(tr, 0), ext(tr, 0), c->acc, c->ws);
  return true;
}

static size_t embedding_ws_backward(const ccall *c) {
  const tregion *tr = c->inr[1];
  return gpu_embedding_backward_ws(c->dt, ext(tr, 0), ext(tr, 1), cx_numel(c->inr[0]));
}

static void bsh(const tregion *xr, int64_t *b, int64_t *s, int64_t *h) {
  int r = xr->ndims;
  *h = ext(xr, r - 1), *s = ext(xr, r - 2);
  *b = *s * *h != 0 ? cx_numel(xr) / (*s * *h) : 0;
}

static bool add_position_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t b, s, h;
  bsh(c->inr[0], &b, &s, &h);
  gpu_add_position(c->s, c->dt, c->out, c->in[0], c->in[1], b, s, h);
  return true;
}

static bool add_position_backward(const ccall *c, char *err, size_t errlen) {
  int64_t b, s, h;
  bsh(c->inr[0], &b, &s, &h);
  gpu_add_position_backward(c->s, c->dt, c->din[0], c->din[1], din_dt(c, 1), c->dy, b, s, h, c->acc);
  return true;
}

/* ---- normalisation ------------------------------------------------------------------------- */

static void rows_h(const ccall *c, int64_t *rows, int64_t *h) {
  *h = last(c->inr[0]);
  *rows = cx_numel(c->inr[0]) / (*h ? *h : 1);
}

static bool layernorm_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t rows, h;
  rows_h(c, &rows, &h);
  gpu_layernorm(c->s, c->dt, c->out, c->in[0], c->in[1], c->in[2], rows, h, cx_attr(c->g, c->op, "eps", 1e-5));
  return true;
}

static bool layernorm_backward(const ccall *c, char *err, size_t errlen) {
  int64_t rows, h;
  rows_h(c, &rows, &h);
  /* the weight's and bias's gradients of one type, f32 where kept so */
  int gdt = c->din[1] ? din_dt(c, 1) : din_dt(c, 2);
  if (c->din[1] && c->din[2] && din_dt(c, 2) != gdt) {
    snprintf(err, errlen, "%s: its weight's and bias's gradients are of different types", c->g->ops[c->op].name);
    return false;
  }
  gpu_layernorm_backward(c->s, c->dt, c->din[0], c->din[1], c->din[2], gdt, c->dy, c->in[0], c->in[1], rows, h,
                         cx_attr(c->g, c->op, "eps", 1e-5), c->acc && !(c->own & 1u), c->acc, c->ws);
  return true;
}

static size_t layernorm_ws_backward(const ccall *c) {
  int64_t rows, h;
  rows_h(c, &rows, &h);
  return gpu_layernorm_backward_ws(rows, h);
}

static bool rmsnorm_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t rows, h;
  rows_h(c, &rows, &h);
  gpu_rmsnorm(c->s, c->dt, c->out, c->in[0], c->in[1], rows, h, cx_attr(c->g, c->op, "eps", 1e-6));
  return true;
}

static bool rmsnorm_backward(const ccall *c, char *err, size_t errlen) {
  int64_t rows, h;
  rows_h(c, &rows, &h);
  gpu_rmsnorm_backward(c->s, c->dt, c->din[0], c->din[1], c->dy, c->in[0], c->in[1], rows, h,
                       cx_attr(c->g, c->op, "eps", 1e-6), c->acc, c->ws);
  return true;
}

static size_t rmsnorm_ws_backward(const ccall *c) {
  int64_t rows, h;
  rows_h(c, &rows, &h);
  return gpu_rmsnorm_backward_ws(rows, h);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

static bool gelu_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  gpu_gelu(c->s, c->dt, c->out, c->in[0], n0(c));
  return true;
}

static bool gelu_backward(const ccall *c, char *err, size_t errlen) {
  gpu_gelu_backward(c->s, c->dt, c->din[0], c->dy, c->in[0], n0(c), c->acc);
  return true;
}

static bool silu_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  gpu_silu(c->s, c->dt, c->out, c->in[0], n0(c));
  return true;
}

static bool silu_backward(const ccall *c, char *err, size_t errlen) {
  gpu_silu_backward(c->s, c->dt, c->din[0], c->dy, c->in[0], n0(c), c->acc);
  return true;
}

static bool swiglu_forward(const ccall *c, char *err, size_t errlen) {
  gpu_swiglu(c->s, c->dt, c->out, c->in[0], c->in[1], n0(c));
  return true;
}

static bool swiglu_backward(const ccall *c, char *err, size_t errlen) {
  gpu_swiglu_backward(c->s, c->dt, c->din[0], c->din[1], c->dy, c->in[0], c->in[1], n0(c), c->acc);
  return true;
}

static bool add_forward(const ccall *c, char *err, size_t errlen) {
  gpu_add(c->s, c->dt, c->out, c->in[0], c->in[1], n0(c));
  return true;
}

static bool add_backward(const ccall *c, char *err, size_t errlen) {
  gpu_add_backward(c->s, c->dt, c->din[0], c->din[1], c->dy, n0(c), c->acc);
  return true;
}

static bool softmax_forward(const ccall *c, char *err, size_t errlen) {
  int64_t v = last(c->inr[0]);
  gpu_softmax(c->s, c->dt, c->out, c->in[0], v ? n0(c) / v : 0, v);
  return true;
}

static bool softmax_backward(const ccall *c, char *err, size_t errlen) {
  int64_t v = last(c->inr[0]);
  gpu_softmax_backward(c->s, c->dt, c->din[0], c->dy, c->in[0], v ? n0(c) / v : 0, v, c->acc);
  return true;
}

/* ---- rotary ---------------------------------------------------------------------------------- */

typedef struct rot_sizes {
  int64_t b, s, heads, dh, pos0;
  double base;
} rot_sizes;

static rot_sizes rotary_sizes(const ccall *c) {
  const tregion *xr = c->inr[0];
  int r = xr->ndims;
  rot_sizes z;
  int64_t heads_all = (int64_t)cx_attr(c->g, c->op, "n", 1);
  z.dh = whole_last(c, 0) / heads_all;
  z.heads = ext(xr, r - 1) / z.dh;
  z.s = ext(xr, r - 2);
  z.b = z.s * z.heads * z.dh != 0 ? cx_numel(xr) / (z.s * z.heads * z.dh) : 0;
  z.pos0 = first(xr, r - 2);
  z.base = cx_attr(c->g, c->op, "base", 10000.0);
  return z;
}

static bool rotary_forward(const ccall *c, char *err, size_t errlen) {
  rot_sizes z = rotary_sizes(c);
  gpu_rotary(c->s, c->dt, c->out, c->in[0], z.b, z.s, z.heads, z.dh, z.pos0, z.base, 1.0, false);
  return true;
}

static bool rotary_backward(const ccall *c, char *err, size_t errlen) {
  rot_sizes z = rotary_sizes(c);
  gpu_rotary(c->s, c->dt, c->din[0], c->dy, z.b, z.s, z.heads, z.dh, z.pos0, z.base, -1.0, c->acc);
  return true;
}

/* ---- attention ------------------------------------------------------------------------------- */

/* causal_attention: qkv [b, s, (3 heads dh)] with the part's heads */
static gpu_attn causal_geometry(const ccall *c) {
  const tregion *qr = c->inr[0];
  int r = qr->ndims;
  int64_t heads_all = (int64_t)cx_attr(c->g, c->op, "n", 1);
  gpu_attn a;
  memset(&a, 0, sizeof a);
  a.det = c->deterministic;
  a.dh = whole_last(c, 0) / (3 * heads_all);
  a.hq = ext(qr, r - 1) / (3 * a.dh);
  a.sq = ext(qr, r - 2);
  a.b = a.sq * 3 * a.hq * a.dh != 0 ? cx_numel(qr) / (a.sq * 3 * a.hq * a.dh) : 0;
  a.r = 1;
  a.q_row = a.kv_row = 3 * a.hq * a.dh;
  a.o_row = a.hq * a.dh;
  a.q_batch = a.kv_batch = a.sq * a.q_row;
  a.o_batch = a.sq * a.o_row;
  a.sk = a.sq, a.qpos = 0;
  return a;
}

static bool causal_attention_forward(const ccall *c, char *err, size_t errlen) {
  gpu_attn a = causal_geometry(c);
  if (a.dh > GPU_ATTN_MAX_DH) {
    snprintf(err, errlen, "%s: heads of %lld (the CUDA backend's attention takes at most %d)", c->g->ops[c->op].name,
             (long long)a.dh, GPU_ATTN_MAX_DH);
    return false;
  }
  int64_t c3 = a.hq * a.dh;
  gpu_attention(c->s, c->dt, c->out, c->in[0], at(c, c->in[0], c3), at(c, c->in[0], 2 * c3), &a, (float *)c->keep);
  return true;
}

static bool causal_attention_backward(const ccall *c, char *err, size_t errlen) {
  if (!c->din[0]) return true;
  gpu_attn a = causal_geometry(c);
  int64_t c3 = a.hq * a.dh;
  void *dq = c->din[0];
  gpu_attention_backward(c->s, c->dt, dq, (void *)at(c, dq, c3), (void *)at(c, dq, 2 * c3), c->dy, c->in[0],
                         at(c, c->in[0], c3), at(c, c->in[0], 2 * c3), &a, c->acc, (const float *)c->keep, c->fwd_out,
                         c->ws);
  return true;
}

static size_t causal_attention_ws_backward(const ccall *c) {
  gpu_attn a = causal_geometry(c);
  return gpu_attention_backward_ws(c->dt, &a, c->acc);
}

static size_t causal_attention_keep(const ccall *c) {
  gpu_attn a = causal_geometry(c);
  return gpu_attention_stats_bytes(&a);
}

/* gqa_attention: k [b, sk, (g dh)] with the part's groups, q [b, sq, (g r
 * dh)] with the part's queries from position qpos (context parallelism:
 * one interval of the sequence); r query heads per group */
static gpu_attn gqa_geometry(const ccall *c) {
  const tregion *kr = c->inr[1], *qr = c->inr[0];
  int r = kr->ndims;
  int64_t g = (int64_t)cx_attr(c->g, c->op, "g", 1);
  gpu_attn a;
  memset(&a, 0, sizeof a);
  a.det = c->deterministic;
  a.r = (int64_t)cx_attr(c->g, c->op, "r", 1);
  a.dh = whole_last(c, 1) / g;
  int64_t gl = ext(kr, r - 1) / a.dh;
  a.sk = ext(kr, r - 2);
  a.sq = ext(qr, r - 2);
  a.qpos = first(qr, r - 2);
  a.b = a.sk * gl * a.dh != 0 ? cx_numel(kr) / (a.sk * gl * a.dh) : 0;
  a.hq = gl * a.r;
  a.q_row = a.o_row = a.hq * a.dh;
  a.kv_row = gl * a.dh;
  a.q_batch = a.o_batch = a.sq * a.q_row;
  a.kv_batch = a.sk * a.kv_row;
  return a;
}

/* The kernels take the queries as one interval of the sequence. */
static bool gqa_takes(const ccall *c, const gpu_attn *a, char *err, size_t errlen) {
  const tregion *qr = c->inr[0];
  if (qr->dims[qr->ndims - 2].n > 1) {
    snprintf(err, errlen, "%s: its queries are a strided part of the sequence, which the CUDA backend's attention does "
                          "not take (split the sequence into consecutive parts)", c->g->ops[c->op].name);
    return false;
  }
  if (a->dh > GPU_ATTN_MAX_DH) {
    snprintf(err, errlen, "%s: heads of %lld (the CUDA backend's attention takes at most %d)", c->g->ops[c->op].name,
             (long long)a->dh, GPU_ATTN_MAX_DH);
    return false;
  }
  return true;
}

static bool gqa_attention_forward(const ccall *c, char *err, size_t errlen) {
  gpu_attn a = gqa_geometry(c);
  if (!gqa_takes(c, &a, err, errlen)) return false;
  gpu_attention(c->s, c->dt, c->out, c->in[0], c->in[1], c->in[2], &a, (float *)c->keep);
  return true;
}

static bool gqa_attention_backward(const ccall *c, char *err, size_t errlen) {
  gpu_attn a = gqa_geometry(c);
  if (!gqa_takes(c, &a, err, errlen)) return false;
  gpu_attention_backward(c->s, c->dt, c->din[0], c->din[1], c->din[2], c->dy, c->in[0], c->in[1], c->in[2], &a,
                         c->acc, (const float *)c->keep, c->fwd_out, c->ws);
  return true;
}

static size_t gqa_attention_ws_backward(const ccall *c) {
  gpu_attn a = gqa_geometry(c);
  return gpu_attention_backward_ws(c->dt, &a, c->acc);
}

static size_t gqa_attention_keep(const ccall *c) {
  gpu_attn a = gqa_geometry(c);
  return gpu_attention_stats_bytes(&a);
}

/* ---- attention without a mask (T5) ----------------------------------------------------------- */

/* q [b.., sq, (n dh)] and k, v [b.., sk, (n dh)] with the part's heads;
 * any rows of the queries (each attends to all the keys) */
static gpu_attn full_geometry(const ccall *c) {
  const tregion *kr = c->inr[1], *qr = c->inr[0];
  int r = kr->ndims;
  int64_t n = (int64_t)cx_attr(c->g, c->op, "n", 1);
  if (n < 1) n = 1;
  gpu_attn a;
  memset(&a, 0, sizeof a);
  a.det = c->deterministic;
  a.r = 1;
  a.dh = whole_last(c, 1) / n;
  a.hq = a.dh ? ext(kr, r - 1) / a.dh : 0;
  a.sk = ext(kr, r - 2);
  a.sq = ext(qr, qr->ndims - 2);
  a.b = a.sk * a.hq * a.dh != 0 ? cx_numel(kr) / (a.sk * a.hq * a.dh) : 0;
  a.q_row = a.o_row = a.kv_row = a.hq * a.dh;
  a.q_batch = a.o_batch = a.sq * a.q_row;
  a.kv_batch = a.sk * a.kv_row;
  a.qpos = 0;
  return a;
}

static bool full_takes(const ccall *c, const gpu_attn *a, char *err, size_t errlen) {
  if (a->dh <= GPU_ATTN_MAX_DH) return true;
  snprintf(err, errlen, "%s: heads of %lld (the CUDA backend's attention takes at most %d)", c->g->ops[c->op].name,
           (long long)a->dh, GPU_ATTN_MAX_DH);
  return false;
}

static bool attention_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  gpu_attn a = full_geometry(c);
  if (!full_takes(c, &a, err, errlen)) return false;
  gpu_attention_full(c->s, c->dt, c->out, c->in[0], c->in[1], c->in[2], &a, (float *)c->keep);
  return true;
}

static bool attention_backward(const ccall *c, char *err, size_t errlen) {
  gpu_attn a = full_geometry(c);
  if (!full_takes(c, &a, err, errlen)) return false;
  gpu_attention_full_backward(c->s, c->dt, c->din[0], c->din[1], c->din[2], c->dy, c->in[0], c->in[1], c->in[2], &a,
                              c->acc, (const float *)c->keep, c->fwd_out, c->ws);
  return true;
}

static size_t attention_ws_backward(const ccall *c) {
  gpu_attn a = full_geometry(c);
  return gpu_attention_full_backward_ws(c->dt, &a, c->acc);
}

static size_t attention_keep(const ccall *c) {
  gpu_attn a = full_geometry(c);
  return gpu_attention_stats_bytes(&a);
}

/* ---- the Swin Transformer ------------------------------------------------------------------- */

/* x [b, c, hn p, wn p] -> [b, hn, wn, c p p]; p whole */
static void patchify_sizes(const ccall *c, int64_t z[5]) {
  const tregion *xr = c->inr[0];
  int64_t p = (int64_t)cx_attr(c->g, c->op, "p", 1);
  if (p < 1) p = 1;
  z[0] = ext(xr, 0), z[1] = ext(xr, 1), z[2] = ext(xr, 2) / p, z[3] = ext(xr, 3) / p, z[4] = p;
}

static bool patchify_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t z[5];
  patchify_sizes(c, z);
  gpu_patch_move(c->s, c->dt, c->out, c->in[0], z[0], z[1], z[2], z[3], z[4], true, false);
  return true;
}

static bool patchify_backward(const ccall *c, char *err, size_t errlen) {
  int64_t z[5];
  patchify_sizes(c, z);
  gpu_patch_move(c->s, c->dt, c->din[0], c->dy, z[0], z[1], z[2], z[3], z[4], false, c->acc);
  return true;
}

/* The grid of windows: x [b, hn ws, wn ws, c] (partition) or [b, hn, wn,
 * ws ws, c] (reverse); the grid is never split. */
typedef struct win_sizes {
  int64_t b, hn, wn, ws, c, shift;
} win_sizes;

static win_sizes win_sizes_of(const ccall *c, bool windows) {
  const tregion *xr = c->inr[0];
  win_sizes z = {ext(xr, 0), 0, 0, (int64_t)cx_attr(c->g, c->op, "ws", 1), last(xr),
                 (int64_t)cx_attr(c->g, c->op, "shift", 0)};
  if (z.ws < 1) z.ws = 1;
  z.hn = windows ? ext(xr, 1) : ext(xr, 1) / z.ws;
  z.wn = windows ? ext(xr, 2) : ext(xr, 2) / z.ws;
  return z;
}

static bool window_partition_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  win_sizes z = win_sizes_of(c, false);
  gpu_window_move(c->s, c->dt, c->out, c->in[0], z.b, z.hn, z.wn, z.ws, z.c, z.shift, true, false);
  return true;
}

static bool window_partition_backward(const ccall *c, char *err, size_t errlen) {
  win_sizes z = win_sizes_of(c, false);
  gpu_window_move(c->s, c->dt, c->din[0], c->dy, z.b, z.hn, z.wn, z.ws, z.c, z.shift, false, c->acc);
  return true;
}

static bool window_reverse_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  win_sizes z = win_sizes_of(c, true);
  gpu_window_move(c->s, c->dt, c->out, c->in[0], z.b, z.hn, z.wn, z.ws, z.c, z.shift, false, false);
  return true;
}

static bool window_reverse_backward(const ccall *c, char *err, size_t errlen) {
  win_sizes z = win_sizes_of(c, true);
  gpu_window_move(c->s, c->dt, c->din[0], c->dy, z.b, z.hn, z.wn, z.ws, z.c, z.shift, true, c->acc);
  return true;
}

/* qkv [b, hn, wn, s, (3 heads dh)] with the part's windows and heads, table
 * [(2 ws - 1)^2, heads]: s a square, the table's rows to match, the shift
 * inside a window, and a window that fits the device's shared memory. */
static bool window_attention_sizes(const ccall *c, gpu_swin_attn *z, char *err, size_t errlen) {
  const tregion *qr = c->inr[0], *tr = c->inr[1];
  const gtensor *qt = tensor_of(c, 0);
  int64_t heads_all = (int64_t)cx_attr(c->g, c->op, "n", 1), s = ext(qr, 3);
  if (heads_all < 1) heads_all = 1;
  int64_t ws = (int64_t)llround(sqrt((double)s));
  *z = (gpu_swin_attn){ext(qr, 0), ext(qr, 1), ext(qr, 2), ws, ext(tr, 1), whole_last(c, 0) / (3 * heads_all),
                       first(qr, 1), first(qr, 2), qt->dims[1].size, qt->dims[2].size,
                       (int64_t)cx_attr(c->g, c->op, "shift", 0)};
  const char *name = c->g->ops[c->op].name;
  if (ws * ws != s) {
    snprintf(err, errlen, "%s: a window of %lld tokens is not a square", name, (long long)s);
    return false;
  }
  if (ext(tr, 0) != (2 * ws - 1) * (2 * ws - 1)) {
    snprintf(err, errlen, "%s: its relative position table has %lld rows, a window of %lld x %lld needs %lld", name,
             (long long)ext(tr, 0), (long long)ws, (long long)ws, (long long)((2 * ws - 1) * (2 * ws - 1)));
    return false;
  }
  if (z->shift < 0 || z->shift >= ws) {
    snprintf(err, errlen, "%s: shift %lld must be at least 0 and less than the window (%lld)", name,
             (long long)z->shift, (long long)ws);
    return false;
  }
  size_t need = 0;
  if (!gpu_window_attention_takes(ws, z->dh, &need)) {
    snprintf(err, errlen, "%s: windows of %lld x %lld with heads of %lld need %zu bytes of shared memory, more than "
                          "the device gives a block", name, (long long)ws, (long long)ws, (long long)z->dh, need);
    return false;
  }
  return true;
}

static bool window_attention_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  gpu_swin_attn z;
  if (!window_attention_sizes(c, &z, err, errlen)) return false;
  gpu_window_attention(c->s, c->dt, c->out, c->in[0], c->in[1], &z);
  return true;
}

static bool window_attention_backward(const ccall *c, char *err, size_t errlen) {
  gpu_swin_attn z;
  if (!window_attention_sizes(c, &z, err, errlen)) return false;
  gpu_window_attention_backward(c->s, c->dt, c->din[0], c->din[1], din_dt(c, 1), c->dy, c->in[0], c->in[1], &z, c->acc,
                                c->ws);
  return true;
}

static size_t window_attention_ws_backward(const ccall *c) {
  char e[256];
  gpu_swin_attn z;
  return window_attention_sizes(c, &z, e, sizeof e) ? gpu_window_attention_backward_ws(&z) : 0;
}

/* x [b, 2 hn, 2 wn, c] */
static void merge_sizes(const ccall *c, int64_t *b, int64_t *hn, int64_t *wn, int64_t *ch) {
  const tregion *xr = c->inr[0];
  *b = ext(xr, 0), *hn = ext(xr, 1) / 2, *wn = ext(xr, 2) / 2, *ch = ext(xr, 3);
}

static bool patch_merge_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  int64_t b, hn, wn, ch;
  merge_sizes(c, &b, &hn, &wn, &ch);
  gpu_patch_merge(c->s, c->dt, c->out, c->in[0], b, hn, wn, ch, true, false);
  return true;
}

static bool patch_merge_backward(const ccall *c, char *err, size_t errlen) {
  int64_t b, hn, wn, ch;
  merge_sizes(c, &b, &hn, &wn, &ch);
  gpu_patch_merge(c->s, c->dt, c->din[0], c->dy, b, hn, wn, ch, false, c->acc);
  return true;
}

/* x [b, h, w, c]: the part's tokens, divided by the whole grid's count */
static void pool_sizes(const ccall *c, int64_t *b, int64_t *hw, int64_t *ch, int64_t *count) {
  const tregion *xr = c->inr[0];
  const gtensor *t = tensor_of(c, 0);
  *b = ext(xr, 0), *hw = ext(xr, 1) * ext(xr, 2), *ch = ext(xr, 3);
  *count = t->dims[1].size * t->dims[2].size;
}

static bool mean_pool_forward(const ccall *c, char *err, size_t errlen) {
  int64_t b, hw, ch, count;
  pool_sizes(c, &b, &hw, &ch, &count);
  gpu_mean_pool(c->s, c->dt, c->out, c->in[0], b, hw, ch, count, c->acc);
  return true;
}

static bool mean_pool_backward(const ccall *c, char *err, size_t errlen) {
  int64_t b, hw, ch, count;
  pool_sizes(c, &b, &hw, &ch, &count);
  gpu_mean_pool_backward(c->s, c->dt, c->din[0], c->dy, b, hw, ch, count, c->acc);
  return true;
}

/* ---- losses ------------------------------------------------------------------------------------ */

typedef struct ce_sizes {
  int64_t t, v, v_lo, t_total;
  bool split;
} ce_sizes;

static ce_sizes ce_sizes_of(const ccall *c) {
  const tregion *lr = c->inr[0];
  ce_sizes s = {cx_numel(c->inr[1]), last(lr), lr->ndims ? first(lr, lr->ndims - 1) : 0,
                cx_tensor_numel(tensor_of(c, 1)), false};
  s.split = s.v < whole_last(c, 0);
  return s;
}

static bool ce_stats(const ccall *c, char *err, size_t errlen) {
  ce_sizes s = ce_sizes_of(c);
  gpu_cross_entropy_stats(c->s, c->dt, c->out, c->in[0], c->in[1], s.t, s.v_lo, s.v);
  return true;
}

static bool ce_need_stats(const ccall *c, char *err, size_t errlen) {
  if (c->part == LP_COMBINE && c->stats) return true;
  snprintf(err, errlen, "%s: a shard of the vocabulary without the statistics of the other shards",
           c->g->ops[c->op].name);
  return false;
}

static bool ce_forward(const ccall *c, char *err, size_t errlen) {
  ce_sizes s = ce_sizes_of(c);
  if (c->grad_in_place) {
    if (s.split || c->din[0] != c->in[0]) {
      snprintf(err, errlen, "%s: the gradient in place of a shard of the vocabulary, or elsewhere than the logits",
               c->g->ops[c->op].name);
      return false;
    }
    gpu_cross_entropy_in_place(c->s, c->dt, c->slot, c->out, c->din[0], c->pitch_in0, c->in[1], s.t, s.v, s.t_total,
                               c->acc, c->ws);
    return true;
  }
  if (!s.split) {
    gpu_cross_entropy(c->s, c->dt, c->slot, c->out, c->in[0], c->pitch_in0, c->in[1], s.t, s.v, s.t_total, c->acc,
                      c->ws);
    return true;
  }
  if (!ce_need_stats(c, err, errlen)) return false;
  gpu_cross_entropy_combine(c->s, c->dt, c->slot, c->out, c->stats, (int)(last(c->statsr) / 3), s.t, s.t_total,
                            s.v_lo == 0, c->acc, c->ws);
  return true;
}

static bool ce_backward(const ccall *c, char *err, size_t errlen) {
  if (!c->din[0]) return true;
  ce_sizes s = ce_sizes_of(c);
  if (!s.split) {
    gpu_cross_entropy_backward(c->s, c->dt, c->din[0], c->pitch_din0, c->in[0], c->pitch_in0, c->in[1], s.t, s.v,
                               s.t_total, c->acc);
    return true;
  }
  if (!ce_need_stats(c, err, errlen)) return false;
  gpu_cross_entropy_shard_backward(c->s, c->dt, c->din[0], c->in[0], c->in[1], c->stats, (int)(last(c->statsr) / 3),
                                   s.t, s.v_lo, s.v, s.t_total, c->acc);
  return true;
}

static size_t ce_ws_forward(const ccall *c) { return gpu_loss_ws(ce_sizes_of(c).t); }

static bool mse_forward(const ccall *c, char *err, size_t errlen) {
  gpu_mse(c->s, c->dt, c->slot, c->out, c->in[0], c->in[1], n0(c), cx_tensor_numel(tensor_of(c, 0)), c->acc, c->ws);
  return true;
}

static bool mse_backward(const ccall *c, char *err, size_t errlen) {
  gpu_mse_backward(c->s, c->dt, c->din[0], c->din[1], c->in[0], c->in[1], n0(c), cx_tensor_numel(tensor_of(c, 0)),
                   c->acc);
  return true;
}

static size_t mse_ws_forward(const ccall *c) { return gpu_loss_ws(0); }

/* ---- mixture of experts (moe.cu) ----------------------------------------------------------- */

/* As xops.c: probs [g, s, e] is input pa (experts always whole); the rows
 * are the tokens' x [g, s, h] or the experts' [e, g, c, h] (c their slots). */
static gpu_moe moe_sizes(const ccall *c, int pa, const tregion *rows, bool expert_rows) {
  const tregion *pr = c->inr[pa];
  if (!pr || !rows) return (gpu_moe){0, 0, 0, 0, 0, 0, false};
  gpu_moe z = {ext(pr, 0), ext(pr, 1), 0, ext(pr, 2), (int64_t)cx_attr(c->g, c->op, "k", 1), 0,
               cx_attr(c->g, c->op, "normalize", 1) != 0};
  z.h = ext(rows, 3 - !expert_rows);
  z.c = expert_rows ? ext(rows, 2) : 0;
  return z;
}

/* A token chooses k distinct experts of the e. */
static bool moe_k_ok(const ccall *c, const gpu_moe *z, char *err, size_t errlen) {
  if (z->k >= 1 && z->k <= z->e) return true;
  snprintf(err, errlen, "operator %s: k (%lld) must be between 1 and the number of experts (%lld)",
           c->g->ops[c->op].name, (long long)z->k, (long long)z->e);
  return false;
}

static bool moe_dispatch_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  gpu_moe z = moe_sizes(c, 1, c->outr, true);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  gpu_moe_dispatch(c->s, c->dt, c->out, c->in[0], c->in[1], &z, c->ws);
  return true;
}

static bool moe_dispatch_backward(const ccall *c, char *err, size_t errlen) {
  gpu_moe z = moe_sizes(c, 1, c->dyr, true);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  gpu_moe_dispatch_backward(c->s, c->dt, c->din[0], c->din[1], c->dy, c->in[1], &z, c->acc, c->ws);
  return true;
}

static size_t moe_dispatch_ws_forward(const ccall *c) {
  gpu_moe z = moe_sizes(c, 1, c->outr, true);
  return gpu_moe_ws(&z);
}

static size_t moe_dispatch_ws_backward(const ccall *c) {
  gpu_moe z = moe_sizes(c, 1, c->dyr, true);
  return gpu_moe_ws(&z);
}

static bool moe_combine_forward(const ccall *c, char *err, size_t errlen) {
  if (c->acc) return cannot_accumulate(c, err, errlen);
  gpu_moe z = moe_sizes(c, 1, c->inr[0], true);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  gpu_moe_combine(c->s, c->dt, c->out, c->in[0], c->in[1], &z, c->ws);
  return true;
}

static bool moe_combine_backward(const ccall *c, char *err, size_t errlen) {
  gpu_moe z = moe_sizes(c, 1, c->inr[0], true);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  gpu_moe_combine_backward(c->s, c->dt, c->din[0], c->din[1], c->dy, c->in[0], c->in[1], &z, c->acc, c->ws);
  return true;
}

static size_t moe_combine_ws(const ccall *c) {
  gpu_moe z = moe_sizes(c, 1, c->inr[0], true);
  return gpu_moe_ws(&z);
}

/* x [e, g, c, k] (an expert's rows flattened), w [e, k, n]: a product per
 * expert. */
static void emkn(const ccall *c, int64_t *e, int64_t *m, int64_t *k, int64_t *n) {
  *e = ext(c->inr[1], 0), *k = ext(c->inr[1], 1), *n = ext(c->inr[1], 2);
  *m = *e && *k ? cx_numel(c->inr[0]) / (*e * *k) : 0;
}

static void *at_dt(void *p, int dt, int64_t elems) { return p ? (char *)p + elems * gpu_dtype_size(dt) : NULL; }

static bool expert_matmul_forward(const ccall *c, char *err, size_t errlen) {
  int64_t e, m, k, n;
  emkn(c, &e, &m, &k, &n);
  for (int64_t x = 0; x < e && m > 0; x++)
    if (!gemm(c, false, false, m, n, k, at(c, c->in[0], x * m * k), k, at(c, c->in[1], x * k * n), n,
              at_dt(c->out, c->dt, x * m * n), n, NULL, c->acc, err, errlen))
      return false;
  return true;
}

static bool expert_matmul_backward(const ccall *c, char *err, size_t errlen) {
  int64_t e, m, k, n;
  emkn(c, &e, &m, &k, &n);
  for (int64_t x = 0; x < e && m > 0; x++) {
    const void *dy = at(c, c->dy, x * m * n);
    if (c->din[0] && !gemm(c, false, true, m, k, n, dy, n, at(c, c->in[1], x * k * n), n,
                           at_dt(c->din[0], c->dt, x * m * k), k, NULL, c->acc, err, errlen))
      return false;
    if (c->din[1] && !gemm_to(c, true, false, k, n, m, at(c, c->in[0], x * m * k), k, dy, n,
                              at_dt(c->din[1], din_dt(c, 1), x * k * n), n, din_dt(c, 1), NULL, c->acc, err, errlen))
      return false;
  }
  return true;
}

/* An auxiliary loss: this part's share, which the step's loss adds. */
static bool moe_aux_loss_forward(const ccall *c, char *err, size_t errlen) {
  gpu_moe z = moe_sizes(c, 0, c->inr[0], false);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  gpu_moe_aux_loss(c->s, c->dt, c->slot, c->out, c->in[0], &z, tensor_of(c, 0)->dims[0].size,
                   cx_attr(c->g, c->op, "alpha", 0.01), c->acc, c->ws);
  return true;
}

static bool moe_aux_loss_backward(const ccall *c, char *err, size_t errlen) {
  gpu_moe z = moe_sizes(c, 0, c->inr[0], false);
  if (!moe_k_ok(c, &z, err, errlen)) return false;
  gpu_moe_aux_loss_backward(c->s, c->dt, c->din[0], c->dy, c->in[0], &z, tensor_of(c, 0)->dims[0].size,
                            cx_attr(c->g, c->op, "alpha", 0.01), c->acc, c->ws);
  return true;
}

static size_t moe_aux_loss_ws(const ccall *c) {
  gpu_moe z = moe_sizes(c, 0, c->inr[0], false);
  return gpu_moe_ws(&z);
}

/* ---- the table ------------------------------------------------------------------------------------ */

#define KERNELS(name) #name, name##_forward, name##_backward, NULL

static const ckernel kernels[] = {
    {KERNELS(matmul), NULL, NULL, NULL, false, -1, 1u << 1, K_OVERWRITES},
    {KERNELS(matmul_t), NULL, NULL, NULL, false, -1, 1u << 1, K_OVERWRITES | K_PITCH_OUT},
    {"linear", linear_forward, linear_backward, NULL, NULL, linear_ws_backward, NULL, false, -1, 1u << 1 | 1u << 2,
     K_OVERWRITES},
    {"qkv_linear", linear_forward, linear_backward, NULL, NULL, linear_ws_backward, NULL, false, -1, 1u << 1 | 1u << 2,
     K_OVERWRITES},
    {KERNELS(embedding), NULL, embedding_ws_backward, NULL, false, 0, 1u << 1, K_OVERWRITES},
    {KERNELS(add_position), NULL, NULL, NULL, false, -1, 1u << 1, K_OVERWRITES},
    {KERNELS(layernorm), NULL, layernorm_ws_backward, NULL, false, -1, 1u << 1 | 1u << 2, K_OVERWRITES | K_SCRATCH_DX},
    {KERNELS(rmsnorm), NULL, rmsnorm_ws_backward, NULL, false, -1, 0, K_OVERWRITES},
    {KERNELS(gelu), NULL, NULL, NULL, false, -1, 0, K_OVERWRITES},
    {KERNELS(silu), NULL, NULL, NULL, false, -1, 0, K_OVERWRITES},
    {KERNELS(swiglu), NULL, NULL, NULL, false, -1, 0, K_OVERWRITES},
    {KERNELS(add), NULL, NULL, NULL, false, -1, 0, K_OVERWRITES | K_PASSES_GRAD},
    {KERNELS(softmax), NULL, NULL, NULL, false, -1, 0, K_OVERWRITES},
    {KERNELS(rotary), NULL, NULL, NULL, false, -1, 0, K_OVERWRITES},
    {KERNELS(causal_attention), NULL, causal_attention_ws_backward, causal_attention_keep, false, -1, 0, K_OVERWRITES},
    {KERNELS(gqa_attention), NULL, gqa_attention_ws_backward, gqa_attention_keep, false, -1, 0, K_OVERWRITES},
    {KERNELS(attention), NULL, attention_ws_backward, attention_keep, false, -1, 0, K_OVERWRITES},
    /* the Swin Transformer */
    {KERNELS(patchify), NULL, NULL, NULL, false, -1, 0, 0},
    {KERNELS(window_partition), NULL, NULL, NULL, false, -1, 0, 0},
    {KERNELS(window_reverse), NULL, NULL, NULL, false, -1, 0, 0},
    {KERNELS(window_attention), NULL, window_attention_ws_backward, NULL, false, -1, 1u << 1, 0},
    {KERNELS(patch_merge), NULL, NULL, NULL, false, -1, 0, 0},
    {KERNELS(mean_pool), NULL, NULL, NULL, false, -1, 0, 0},
    {"cross_entropy", ce_forward, ce_backward, ce_stats, ce_ws_forward, NULL, NULL, true, 1, 0,
     K_OVERWRITES | K_PITCH_IN0 | K_GRAD_IN_PLACE},
    {KERNELS(mse), mse_ws_forward, NULL, NULL, true, -1, 0, 0},
    {KERNELS(moe_dispatch), moe_dispatch_ws_forward, moe_dispatch_ws_backward, NULL, false, -1, 0, 0},
    {KERNELS(moe_combine), moe_combine_ws, moe_combine_ws, NULL, false, -1, 0, 0},
    {KERNELS(expert_matmul), NULL, NULL, NULL, false, -1, 1u << 1, 0},
    {KERNELS(moe_aux_loss), moe_aux_loss_ws, moe_aux_loss_ws, NULL, true, -1, 0, 0},
};

#undef KERNELS

const ckernel *ckernel_find(const weft_graph *g, int op, char *err, size_t errlen) {
  const opdecl *d = g->ops[op].decl;
  if (d && d->native_fwd) {
    snprintf(err, errlen, "operator %s (%s) runs native code, which the CUDA backend does not run", g->ops[op].name,
             d->name);
    return NULL;
  }
  for (size_t i = 0; d && i < sizeof kernels / sizeof kernels[0]; i++)
    if (strcmp(kernels[i].kind, d->name) == 0) return &kernels[i];
  snprintf(err, errlen, "operator %s (%s) has no kernel on the CUDA backend", g->ops[op].name, d ? d->name : "?");
  return NULL;
}

bool ckernel_is_loss(const ckernel *k) { return k && k->loss; }

int ccall_fusion(const ccall *a, const ccall *b) {
  if (!a->k || !b->k || strcmp(a->k->kind, "linear") != 0) return GPU_EPI_NONE;
  if (a->part != LP_WHOLE || b->part != LP_WHOLE || a->dt != b->dt || a->backward != b->backward ||
      a->epi != GPU_EPI_NONE || !b->inr[0])
    return GPU_EPI_NONE;
  if (ckernel_passes_grad(b->k)) {
    /* the residual's add, forward: both its inputs of the linear's result's shape */
    const tregion *r = a->outr;
    if (a->backward || !r || b->nin != 2 || !b->inr[1] || !b->outr) return GPU_EPI_NONE;
    for (int i = 0; i < 2; i++)
      if (cx_numel(b->inr[i]) != cx_numel(r) || last(b->inr[i]) != last(r)) return GPU_EPI_NONE;
    return cx_numel(b->outr) == cx_numel(r) ? GPU_EPI_RESID : GPU_EPI_NONE;
  }
  if (strcmp(b->k->kind, "gelu") != 0) return GPU_EPI_NONE;
  /* forward: the GELU's input is the linear's result; backward: the
   * gradient of the GELU's result is the linear's of its input */
  const tregion *r = a->backward ? a->inr[0] : a->outr, *q = a->backward ? b->dyr : b->inr[0];
  if (!r || !q || cx_numel(r) != cx_numel(q) || last(r) != last(q) || cx_numel(b->inr[0]) != cx_numel(q))
    return GPU_EPI_NONE;
  return a->backward ? GPU_EPI_DGELU : GPU_EPI_GELU;
}

bool ckernel_pitched(const ckernel *k, bool backward, int arg, bool out) {
  if (!k) return false;
  if (k->props & K_PITCH_OUT) return arg == -1 && out != backward;
  if (k->props & K_PITCH_IN0) return arg == 0 && (!out || backward);
  return false;
}

bool ckernel_overwrites(const ckernel *k) { return k && k->props & K_OVERWRITES; }

bool ckernel_grad_in_place(const ckernel *k) { return k && k->props & K_GRAD_IN_PLACE; }

bool ckernel_passes_grad(const ckernel *k) { return k && k->props & K_PASSES_GRAD; }

/* WEFT_CUDA_LN_IN_PLACE=1: LayerNorm's backward adds in place too (its
 * vectorized kernel reads and adds 16 bytes at a time; bench/gpu.sh times
 * it against scratch). */
static bool scratch_dx(const ckernel *k) {
  static int in_place = -1;
  if (in_place < 0) {
    const char *e = getenv("WEFT_CUDA_LN_IN_PLACE");
    in_place = e && strcmp(e, "1") == 0;
  }
  return k && k->props & K_SCRATCH_DX && !in_place;
}

bool ckernel_adds_in_place(const ckernel *k, int arg) { return !(arg == 0 && scratch_dx(k)); }

bool ckernel_ids(const ckernel *k, int arg) { return k->ids == arg; }

bool ckernel_f32_grad(const ckernel *k, int arg) { return arg >= 0 && arg < 32 && (k->f32_grads >> arg & 1u); }

int ckernel_dtype(const weft_graph *g, int op) {
  const gop *o = &g->ops[op];
  for (int i = 0; i < o->ninputs; i++) {
    weft_dtype dt = g->tensors[o->inputs[i]].dtype;
    if (dt != DT_I32) return dt;
  }
  weft_dtype dt = g->tensors[o->output].dtype;
  return dt == DT_I32 ? DT_F32 : dt;
}

size_t ccall_ws(const ccall *c) {
  if (c->part == LP_STATS) return 0;
  cws f = c->backward ? c->k->ws_backward : c->k->ws_forward;
  return f ? f(c) : 0;
}

bool ckernel_keeps(const ckernel *k) { return k && k->keep; }

size_t ccall_keep(const ccall *c) {
  if (c->part != LP_WHOLE || !c->k->keep) return 0;
  return c->k->keep(c);
}

bool ccall_run(const ccall *c, char *err, size_t errlen) {
  if (c->part == LP_STATS) {
    if (c->k->stats) return c->k->stats(c, err, errlen);
    snprintf(err, errlen, "%s: its parts gather no statistics", c->g->ops[c->op].name);
    return false;
  }
  /* a backward without the gradient of its result adds nothing */
  if (c->backward && !c->dy && !c->k->loss) return true;
  return (c->backward ? c->k->backward : c->k->forward)(c, err, errlen);
}
