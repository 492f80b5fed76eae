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
  weft_optim_settings st = graph_optimizer_settings(g);
  o->lr = st.lr, o->beta1 = st.beta1, o->beta2 = st.beta2, o->eps = st.eps;
  o->weight_decay = st.weight_decay, o->momentum = st.momentum;
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
