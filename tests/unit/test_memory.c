/* test_memory.c - the memory of mixed-precision training as Megatron-LM
 * counts it (its docs/distrib_optimizer.md): per parameter, 18 bytes for
 * bf16 (bf16 value, f32 gradient, f32 master weights, f32 AdamW m and v),
 * 16 for f32 and 20 for f16 (f16 gradient, and an f32 copy of it beside
 * the master weights); with the distributed optimizer (ZeRO-1) 6 + 12/dp,
 * 8 + 8/dp and 4 + 16/dp. Checked on the lowered programs of a GPT under
 * Megatron-style plans of several tp, pp and dp, device by device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "weft/lower.h"
#include "weft/report.h"
#include "weft/validate.h"
#include "weft/workspace.h"

/* A GPT whose every dimension divides among 2, 3 and 4 devices (hidden 96,
 * qkv 288, ffn 384, vocab 192, seq 24), so that ZeRO's parts are equal. */
static weft_program *lower_gpt(weft_ctx *c, const char *dtype, int tp, int pp, int dp, int zero) {
  char text[1024];
  snprintf(text, sizeof text,
           "use std\n"
           "model g = gpt(layers = 4, hidden = 96, heads = 4, seq = 24, vocab = 192, batch = 12, dtype = %s)\n"
           "plan p for g on a100_dgx(nodes = 2) {\n"
           "  megatron(layers = 4, tp = %d, pp = %d, dp = %d, micro_batches = 1, zero = %d)\n"
           "}\n",
           dtype, tp, pp, dp, zero);
  weft_plan *p = unit_plan(c, text, "p");
  weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
  if (pr && !validate_program(pr, NULL, &c->diags)) pr = NULL;
  if (!pr) diag_print(&c->diags, stderr, false);
  assert_non_null(pr);
  return pr;
}

/* The persistent bytes of device d by role, and per parameter tensor t the
 * elements of its value on d (n[t]). */
static void persistent(const weft_program *pr, int d, int64_t *by_role, int64_t *n) {
  const lprog *pg = lower_prog(pr, d);
  memset(by_role, 0, sizeof(int64_t) * LB_ROLE_COUNT);
  memset(n, 0, sizeof(int64_t) * (size_t)pr->p->g->ntensors);
  for (int b = pg->buf_lo; b < pg->buf_hi; b++) {
    const lbuf *x = &pr->bufs[b];
    if (!x->persistent) continue;
    by_role[x->role] += x->bytes;
    if (x->role == LB_PARAM) n[x->tensor] += tregion_numel(&x->region);
  }
}

typedef struct precision {
  const char *dtype;
  int param, grad;        /* bytes of the value and the gradient, never sharded by ZeRO-1 */
  int optim;              /* bytes the optimizer keeps: master weights (and gradient copy), m, v */
} precision;

static const precision precisions[] = {
    {"bf16", 2, 4, 12},   /* 18; 6 + 12/dp */
    {"f32", 4, 4, 8},     /* 16; 8 + 8/dp */
    {"f16", 2, 2, 16},    /* 20; 4 + 16/dp */
};

static const int configs[][3] = {
    /* tp, pp, dp */
    {1, 1, 1}, {2, 1, 2}, {1, 1, 4}, {4, 1, 3}, {1, 2, 2}, {2, 2, 2}, {2, 2, 3}, {1, 4, 2},
};

static void check_config(const precision *pc, int tp, int pp, int dp, int zero) {
  weft_ctx *c = weft_new();
  weft_program *pr = lower_gpt(c, pc->dtype, tp, pp, dp, zero);
  const weft_graph *g = pr->p->g;
  int wte = graph_find(g, "wte.weight");
  assert_true(wte >= 0);
  int64_t by_role[LB_ROLE_COUNT];
  int64_t *n = calloc((size_t)g->ntensors, sizeof(int64_t));
  assert_non_null(n);
  int devices = tp * pp * dp;
  for (int d = 0; d < devices; d++) {
    persistent(pr, d, by_role, n);
    int64_t params = 0;
    for (int t = 0; t < g->ntensors; t++) params += n[t];
    assert_true(params > 0);
    int64_t kept = by_role[LB_PARAM] + by_role[LB_GRAD] + by_role[LB_MASTER] + by_role[LB_STATE];
    assert_int_equal(by_role[LB_PARAM], pc->param * params);
    assert_int_equal(by_role[LB_GRAD], pc->grad * params);
    int64_t expect;
    if (zero == 0) {
      expect = (int64_t)(pc->param + pc->grad + pc->optim) * params;
    } else {
      /* what the optimizer keeps is shared by the dp devices that sum a
       * gradient; the embedding tied to the LM head on another pipeline
       * stage is summed by the 2 dp devices of both stages (Megatron-LM
       * keeps a copy per stage, each sharded over dp) */
      int64_t optim = 0;
      for (int t = 0; t < g->ntensors; t++) {
        int share = t == wte && pp > 1 ? 2 * dp : dp;
        assert_int_equal(n[t] * pc->optim % share, 0);
        optim += n[t] * pc->optim / share;
      }
      expect = (int64_t)(pc->param + pc->grad) * params + optim;
      if (pp == 1 || n[wte] == 0)
        assert_int_equal(expect * dp, (int64_t)(pc->param + pc->grad) * params * dp + (int64_t)pc->optim * params);
    }
    if (kept != expect)
      fail_msg("%s, tp %d pp %d dp %d zero %d, device %d: %lld bytes of parameters, gradients, master weights and "
               "optimizer state for %lld parameters; expected %lld",
               pc->dtype, tp, pp, dp, zero, d, (long long)kept, (long long)params, (long long)expect);
  }
  persistent(pr, 0, by_role, n);
  int64_t params0 = 0;
  for (int t = 0; t < g->ntensors; t++) params0 += n[t];
  printf("%-4s tp %d pp %d dp %d zero %d: device 0 keeps %.3f bytes per parameter\n", pc->dtype, tp, pp, dp, zero,
         (double)(by_role[LB_PARAM] + by_role[LB_GRAD] + by_role[LB_MASTER] + by_role[LB_STATE]) / (double)params0);
  free(n);
  weft_free(c);
}

static void test_megatron_bytes(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof precisions / sizeof precisions[0]; i++)
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++)
      for (int zero = 0; zero <= 1; zero++) check_config(&precisions[i], configs[k][0], configs[k][1], configs[k][2], zero);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_megatron_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
