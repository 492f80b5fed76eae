/* optim.c - SGD and AdamW as the model's `train` statement sets them: the
 * table of optimizers, their settings, their steps (kernels.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "optim.h"
#include "weft/value.h"

static int sgd_state(const xoptim *o) { return o->momentum != 0.0 ? 1 : 0; }

static void sgd_step(const xoptim *o, float *p, float *state, const float *grad, int64_t n, int64_t step) {
  k_sgd(p, o->momentum != 0.0 ? state : NULL, grad, n, o->lr, o->momentum, o->weight_decay);
}

static int adamw_state(const xoptim *o) { return 2; }

static void adamw_step(const xoptim *o, float *p, float *state, const float *grad, int64_t n, int64_t step) {
  k_adamw(p, state, state + n, grad, n, step, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay);
}

static const xoptimizer optimizers[] = {
  {"sgd", sgd_state, {"momentum_buffer"}, sgd_step},
  {"adamw", adamw_state, {"exp_avg", "exp_avg_sq"}, adamw_step},
};

bool xoptim_from_graph(const weft_graph *g, xoptim *o) {
  memset(o, 0, sizeof *o);
  for (size_t i = 0; g->optimizer && i < sizeof optimizers / sizeof optimizers[0]; i++)
    if (strcmp(optimizers[i].name, g->optimizer) == 0) o->kind = &optimizers[i];
  if (!o->kind) return false;
  /* the settings come with their defaults (docs/program.md, optimizer);
   * these stand in only for a graph made without them */
  o->lr = 1e-3, o->beta1 = 0.9, o->beta2 = 0.999, o->eps = 1e-8;
  const vrecord *r = g->optimizer_args;
  for (int i = 0; r && i < r->n; i++) {
    const value *v = &r->vals[i];
    double x = v->kind == V_FLOAT ? v->f : v->kind == V_INT ? (double)v->i : 0.0;
    const char *k = r->keys[i];
    if (strcmp(k, "lr") == 0) o->lr = x;
    else if (strcmp(k, "beta1") == 0) o->beta1 = x;
    else if (strcmp(k, "beta2") == 0) o->beta2 = x;
    else if (strcmp(k, "eps") == 0) o->eps = x;
    else if (strcmp(k, "weight_decay") == 0) o->weight_decay = x;
    else if (strcmp(k, "momentum") == 0) o->momentum = x;
  }
  return true;
}

int xoptim_state(const xoptim *o) { return o->kind->state(o); }

void xoptim_step(const xoptim *o, float *param, float *state, const float *grad, int64_t n, int64_t step) {
  o->kind->step(o, param, state, grad, n, step);
}

/* x to the nearest bf16, ties to even: the upper 16 bits of its f32. */
static float round_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  /* inf and NaN stay */
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}

/* x to the nearest f16, ties to even: 10 bits of mantissa for normal
 * numbers, multiples of 2^-24 below 2^-14, infinity from 65520 on. */
static float round_f16(float x) {
  if (isnan(x) || isinf(x)) return x;
  float a = fabsf(x);
  if (a >= 65520.0f) return copysignf(INFINITY, x);
  if (a < 0x1p-14f) return copysignf(rintf(a * 0x1p24f) * 0x1p-24f, x);  /* exact scaling; rintf ties to even */
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0xfffu + ((u >> 13) & 1u);
  u &= ~0x1fffu;
  memcpy(&x, &u, 4);
  return x;
}

void xoptim_round(float *v, int64_t n, weft_dtype dt) {
  if (dt == DT_BF16)
    for (int64_t i = 0; i < n; i++) v[i] = round_bf16(v[i]);
  else if (dt == DT_F16)
    for (int64_t i = 0; i < n; i++) v[i] = round_f16(v[i]);
}
