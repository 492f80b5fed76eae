/* ref.c - the CUDA backend's reference for `weft run --check`: the same
 * steps on one GPU without the plan, every operator on whole tensors in
 * graph order, the backward in reverse, then the optimizer, with the same
 * kernels (ops.h) as the program's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec.h"
#include "ops.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct rtensor {
  void *val, *grad;
  float *master, *state;  /* 16-bit parameters' masters; optimizer state */
  int dt;
  dregion *dims;
  irange *iv;
  tregion whole;
  int64_t n;
} rtensor;

typedef struct rref {
  const weft_graph *g;
  rtensor *t;
  const ckernel **kern;
  gpu_stream *s;
  void *ws, *gemm_ws;
  double *slots;          /* device: one per loss operator */
  int nslots;
  int gpu;
  gpu_props props;
  int optim;
  gpu_optim settings;
  bool deterministic;
  double *norm;           /* device: the sum of squares of the gradients */
  float *coef;            /* device: the clipping factor */
  void *ws2;              /* the sum of squares' scratch */
} rref;

static void rref_free(rref *x) {
  char e[256];
  gpu_sync(e, sizeof e);
  for (int i = 0; x->t && i < x->g->ntensors; i++) {
    rtensor *t = &x->t[i];
    gpu_free(t->val), gpu_free(t->grad), gpu_free(t->master), gpu_free(t->state);
    free(t->dims), free(t->iv);
  }
  gpu_free(x->ws), gpu_free(x->gemm_ws), gpu_free(x->slots), gpu_free(x->norm), gpu_free(x->coef), gpu_free(x->ws2);
  gpu_stream_free(x->s);
  free(x->t), free(x->kern);
}

static void *dalloc(rref *x, int64_t bytes, bool *ok, char *err, size_t errlen) {
  if (!*ok) return NULL;
  char e[400];
  void *p = gpu_alloc((size_t)(bytes > 0 ? bytes : 4), e, sizeof e);
  if (!p) *ok = crun_fail(err, errlen, 2, "GPU %d (%s), the one-device reference: %s", x->gpu, x->props.name, e);
  return p;
}

/* A call of operator op on whole tensors. */
static ccall call_of(rref *x, int op, bool backward) {
  const gop *o = &x->g->ops[op];
  ccall c;
  memset(&c, 0, sizeof c);
  c.g = x->g, c.op = op, c.k = x->kern[op], c.backward = backward, c.part = LP_WHOLE;
  c.dt = ckernel_dtype(x->g, op), c.nin = o->ninputs, c.s = x->s, c.ws = x->ws, c.gemm_ws = x->gemm_ws;
  c.deterministic = x->deterministic;
  for (int i = 0; i < c.nin; i++) {
    rtensor *t = &x->t[o->inputs[i]];
    c.in[i] = t->val, c.inr[i] = &t->whole;
    if (backward) c.din[i] = t->grad;
  }
  rtensor *out = &x->t[o->output];
  c.outr = &out->whole;
  if (!backward) c.out = out->val;
  c.dyr = &out->whole;
  /* a loss that no operator reads (the model's, an auxiliary one) seeds
   * its own backward */
  bool read = false;
  for (int i = 0; i < x->g->nops && !read; i++)
    for (int a = 0; a < x->g->ops[i].ninputs; a++) read |= x->g->ops[i].inputs[a] == o->output;
  if (backward) c.dy = o->output == x->g->loss || (ckernel_is_loss(c.k) && !read) ? NULL : out->grad;
  c.acc = backward;
  return c;
}

static bool setup(rref *x, weft_world *w, const backend_opts *o, char *err, size_t errlen) {
  const weft_graph *g = x->g;
  x->deterministic = o->deterministic;
  if (!crun_optimizer(g, &x->optim, &x->settings, err, errlen)) return false;
  x->kern = calloc((size_t)g->nops + 1, sizeof *x->kern);
  x->t = calloc((size_t)g->ntensors + 1, sizeof *x->t);
  if (!x->kern || !x->t) return crun_fail(err, errlen, 2, "out of host memory");
  for (int op = 0; op < g->nops; op++) {
    char e[400];
    if (!(x->kern[op] = ckernel_find(g, op, e, sizeof e))) return crun_fail(err, errlen, 1, "%s", e);
    const gop *p = &g->ops[op];
    int dt = ckernel_dtype(g, op);
    for (int i = 0; i <= p->ninputs; i++) {
      const gtensor *t = &g->tensors[i < p->ninputs ? p->inputs[i] : p->output];
      bool ids = i < p->ninputs && ckernel_ids(x->kern[op], i);
      if (!ids && t->dtype != (weft_dtype)dt && !(i == p->ninputs && ckernel_is_loss(x->kern[op])))
        return crun_fail(err, errlen, 1,
                         "the one-device reference runs operators whose tensors share one type: %s reads %s as %s",
                         p->name, t->name, t->dtype == DT_BF16 ? "bf16" : t->dtype == DT_F16 ? "f16" : t->dtype == DT_I32 ? "i32" : "f32");
    }
  }
  if (!crun_gpu(&x->gpu, &x->props, err, errlen)) return false;
  char e[400];
  if (!(x->s = gpu_stream_new(e, sizeof e))) return crun_fail(err, errlen, 2, "GPU %d: %s", x->gpu, e);
  bool ok = true;
  size_t ws = 0;
  for (int i = 0; i < g->ntensors && ok; i++) {
    const gtensor *gt = &g->tensors[i];
    rtensor *t = &x->t[i];
    t->dims = calloc((size_t)gt->ndims + 1, sizeof *t->dims);
    t->iv = calloc((size_t)gt->ndims + 1, sizeof *t->iv);
    if (!t->dims || !t->iv) return crun_fail(err, errlen, 2, "out of host memory");
    t->whole = cx_whole(gt, t->dims, t->iv);
    t->n = cx_tensor_numel(gt);
    t->dt = gt->dtype;
    t->val = dalloc(x, t->n * gpu_dtype_size(t->dt), &ok, err, errlen);
    if (gt->dtype != DT_I32 && gt->role != TENSOR_INPUT) t->grad = dalloc(x, t->n * gpu_dtype_size(t->dt), &ok, err, errlen);
    /* the model reads a 16-bit parameter rounded to its dtype, from its
     * master weights (which the world holds) when it has them */
    if (gt->role == TENSOR_PARAM && g->master && (t->dt == DT_BF16 || t->dt == DT_F16))
      t->master = dalloc(x, t->n * 4, &ok, err, errlen);
    if (gt->role == TENSOR_PARAM && w->state_copies) t->state = dalloc(x, t->n * 4 * w->state_copies, &ok, err, errlen);
  }
  for (int op = 0; op < g->nops && ok; op++)
    for (int b = 0; b < 2; b++) {
      ccall c = call_of(x, op, b);
      size_t n = ccall_ws(&c);
      if (n > ws) ws = n;
    }
  x->ws = dalloc(x, (int64_t)ws, &ok, err, errlen);
  x->gemm_ws = dalloc(x, (int64_t)gpu_gemm_ws(), &ok, err, errlen);
  /* every loss operator adds its share (the model's and the auxiliary ones) */
  for (int op = 0; op < g->nops; op++) x->nslots += ckernel_is_loss(x->kern[op]);
  x->slots = dalloc(x, (x->nslots + 1) * 8, &ok, err, errlen);
  x->norm = dalloc(x, 8, &ok, err, errlen);
  x->coef = dalloc(x, 4, &ok, err, errlen);
  x->ws2 = dalloc(x, (int64_t)gpu_sumsq_ws(), &ok, err, errlen);
  if (!ok) return false;
  /* parameters, masters and state from the world, through one staging copy */
  int64_t most = 1;
  for (int i = 0; i < g->ntensors; i++)
    if (x->t[i].n * (w->state_copies > 1 ? w->state_copies : 1) > most) most = x->t[i].n * (w->state_copies > 1 ? w->state_copies : 1);
  float *stage = dalloc(x, most * 4, &ok, err, errlen);
  for (int i = 0; i < g->ntensors && ok; i++) {
    rtensor *t = &x->t[i];
    if (g->tensors[i].role != TENSOR_PARAM) continue;
    ok = gpu_upload(stage, w->param[i], (size_t)t->n * 4, x->s, e, sizeof e);
    if (ok) gpu_convert(x->s, t->val, t->dt, stage, GPU_F32, t->n, false);
    if (ok && t->master) ok = gpu_upload(t->master, w->param[i], (size_t)t->n * 4, x->s, e, sizeof e);
    if (ok && t->state) ok = gpu_upload(t->state, w->state[i], (size_t)(t->n * w->state_copies) * 4, x->s, e, sizeof e);
    ok = ok && gpu_stream_sync(x->s, e, sizeof e);
    if (!ok) crun_fail(err, errlen, 2, "GPU %d: %s", x->gpu, e);
  }
  gpu_free(stage);
  return ok;
}

static bool step(rref *x, weft_world *w, const backend_step *st, double *loss, double *norm, char *err,
                 size_t errlen) {
  const weft_graph *g = x->g;
  char e[400];
  /* inputs as the world holds them (ids int32, the rest f32), in each tensor's type */
  for (int i = 0; i < g->ntensors; i++) {
    rtensor *t = &x->t[i];
    if (g->tensors[i].role == TENSOR_INPUT) {
      if (t->dt == DT_I32 || t->dt == DT_F32) {
        if (!gpu_upload(t->val, w->input[i], (size_t)t->n * 4, x->s, e, sizeof e))
          return crun_fail(err, errlen, 2, "GPU %d: %s", x->gpu, e);
      } else {
        void *stage = gpu_alloc((size_t)t->n * 4 + 4, e, sizeof e);
        if (!stage || !gpu_upload(stage, w->input[i], (size_t)t->n * 4, x->s, e, sizeof e))
          return crun_fail(err, errlen, 2, "GPU %d: %s", x->gpu, e);
        gpu_convert(x->s, t->val, t->dt, stage, GPU_F32, t->n, false);
        bool ok = gpu_stream_sync(x->s, e, sizeof e);
        gpu_free(stage);
        if (!ok) return crun_fail(err, errlen, 2, "GPU %d: %s", x->gpu, e);
      }
    } else if (g->tensors[i].role == TENSOR_ACT) {
      gpu_zero(t->val, (size_t)(t->n * gpu_dtype_size(t->dt)), x->s);
    }
    if (t->grad) gpu_zero(t->grad, (size_t)(t->n * gpu_dtype_size(t->dt)), x->s);
  }
  gpu_zero(x->slots, (size_t)(x->nslots + 1) * 8, x->s);
  int slot = 0;
  for (int op = 0; op < g->nops; op++) {
    ccall c = call_of(x, op, false);
    if (ckernel_is_loss(x->kern[op])) c.slot = x->slots + slot++;
    if (!ccall_run(&c, e, sizeof e)) return crun_fail(err, errlen, 1, "%s", e);
    if (!gpu_check(g->ops[op].name, e, sizeof e)) return crun_fail(err, errlen, 2, "GPU %d, the one-device reference, forward %s", x->gpu, e);
  }
  for (int op = g->nops - 1; op >= 0 && !st->eval; op--) {
    ccall c = call_of(x, op, true);
    if (!ccall_run(&c, e, sizeof e)) return crun_fail(err, errlen, 1, "%s", e);
    if (!gpu_check(g->ops[op].name, e, sizeof e)) return crun_fail(err, errlen, 2, "GPU %d, the one-device reference, backward %s", x->gpu, e);
  }
  /* the norm of all gradients, tensor after tensor; the clipping factor */
  *norm = NAN;
  if (!st->eval) {
    gpu_zero(x->norm, 8, x->s);
    for (int i = 0; i < g->ntensors; i++)
      if (g->tensors[i].role == TENSOR_PARAM) gpu_sumsq(x->s, x->t[i].dt, x->norm, x->t[i].grad, NULL, x->t[i].n, x->ws2);
    double sq = 0;
    if (!gpu_download(&sq, x->norm, 8, x->s, e, sizeof e)) return crun_fail(err, errlen, 2, "GPU %d: %s", x->gpu, e);
    *norm = sqrt(sq);
    double c = st->clip > 0 ? st->clip / (*norm + 1e-6) : 1.0;
    float coef = (float)(c < 1.0 ? c : 1.0);
    if (!gpu_upload(x->coef, &coef, 4, x->s, e, sizeof e)) return crun_fail(err, errlen, 2, "GPU %d: %s", x->gpu, e);
  }
  for (int i = 0; i < g->ntensors && !st->eval; i++) {
    rtensor *t = &x->t[i];
    if (g->tensors[i].role != TENSOR_PARAM) continue;
    if (x->optim == 1)
      gpu_adamw(x->s, t->val, t->dt, t->master, t->state, t->state + t->n, t->grad, t->dt, x->coef, t->n, w->step + 1,
                &x->settings);
    else
      gpu_sgd(x->s, t->val, t->dt, t->master, t->state, t->grad, t->dt, x->coef, t->n, &x->settings);
  }
  double *slots = calloc((size_t)x->nslots + 1, sizeof *slots);
  if (!slots) return crun_fail(err, errlen, 2, "out of host memory");
  bool ok = gpu_sync(e, sizeof e) && gpu_download(slots, x->slots, (size_t)(x->nslots + 1) * 8, x->s, e, sizeof e);
  *loss = 0;
  for (int i = 0; i < x->nslots; i++) *loss += slots[i];
  free(slots);
  return ok || crun_fail(err, errlen, 2, "GPU %d (%s), the one-device reference: %s", x->gpu, x->props.name, e);
}

/* Parameters (masters when 16-bit) and state back into the world. */
static bool read_back(rref *x, weft_world *w, char *err, size_t errlen) {
  const weft_graph *g = x->g;
  char e[400];
  for (int i = 0; i < g->ntensors; i++) {
    rtensor *t = &x->t[i];
    if (g->tensors[i].role != TENSOR_PARAM) continue;
    bool ok;
    if (t->master) {
      ok = gpu_download(w->param[i], t->master, (size_t)t->n * 4, x->s, e, sizeof e);
    } else if (t->dt == DT_F32) {
      ok = gpu_download(w->param[i], t->val, (size_t)t->n * 4, x->s, e, sizeof e);
    } else {
      float *stage = gpu_alloc((size_t)t->n * 4 + 4, e, sizeof e);
      ok = stage != NULL;
      if (ok) gpu_convert(x->s, stage, GPU_F32, t->val, t->dt, t->n, false);
      ok = ok && gpu_download(w->param[i], stage, (size_t)t->n * 4, x->s, e, sizeof e);
      gpu_free(stage);
    }
    if (ok && t->state) ok = gpu_download(w->state[i], t->state, (size_t)(t->n * w->state_copies) * 4, x->s, e, sizeof e);
    if (!ok) return crun_fail(err, errlen, 2, "GPU %d: %s", x->gpu, e);
  }
  return true;
}

bool crun_reference(const weft_graph *g, weft_world *w, const backend_step *st, backend_result *out,
                    const backend_opts *o, char *err, size_t errlen) {
  rref x;
  memset(&x, 0, sizeof x);
  x.g = g;
  bool ok = setup(&x, w, o, err, errlen);
  if (ok && !isnan(st->lr)) x.settings.lr = st->lr;
  double t0 = now(), loss = 0, norm = NAN;
  ok = ok && step(&x, w, st, &loss, &norm, err, errlen);
  if (ok && !st->eval) {
    ok = read_back(&x, w, err, errlen);
    if (ok) w->step++;
  }
  if (ok) *out = (backend_result){loss, st->eval ? NAN : norm, now() - t0, 0};
  rref_free(&x);
  return ok;
}
