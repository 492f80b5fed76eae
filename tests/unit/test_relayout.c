/* test_relayout.c - the search's model of changing a tensor's layout
 * between two operators (relayout_kind, src/search/space.c) against the
 * communication that the plan stage derives for the same layouts by
 * dependency preservation (src/plan/deps.c): for every pair of ways to
 * split a producer and its consumer over a tensor-parallel group, the
 * collective the search prices is the one the plan moves the tensor with,
 * forward and backward, and nothing moves where it prices nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "search/search_int.h"
#include "weft/cost.h"
#include "weft/plan.h"
#include "weft/report.h"
#include "weft/workspace.h"

static const char *const model_text = "gpt(layers = 1, hidden = 64, heads = 4, seq = 16, vocab = 128, batch = 8)";

/* The producer and consumer: the first MLP product and its activation, a
 * tensor [batch, seq, ffn] between them; how each may be split. */
static const char *const producers[] = {"ffn", "hidden", "seq", ""};
static const char *const consumers[] = {"ffn", "seq", ""};

/* The comm kinds the plan moves tensor t with in phase ph, as bits. */
static unsigned kinds_of(const weft_plan *p, int t, comm_phase ph) {
  unsigned k = 0;
  for (int i = 0; i < p->ncomms; i++)
    if (p->comms[i].tensor == t && p->comms[i].phase == ph) k |= 1u << p->comms[i].kind;
  return k;
}

/* The configuration of op over tp devices along dim ("" replicated). */
static const opcfg *config(arena *a, const sshape *s, const hw_model *hw, int op, int tp, const char *dim) {
  opcfg *cfg;
  int n = op_configs(a, s, hw, false, op, tp, 1, &cfg);
  for (int i = 0; i < n; i++)
    if (idim_is(s->space[op], cfg[i].idim, dim)) return &cfg[i];
  fail_msg("%s has no configuration along '%s'", s->g->ops[op].name, dim);
  return NULL;
}

static const char *statement(const char *op, const char *dim, int tp) {
  static char b[2][128];
  static int k;
  k ^= 1;
  if (*dim) snprintf(b[k], sizeof b[k], "  split %s on %s into %d as tp\n", op, dim, tp);
  else snprintf(b[k], sizeof b[k], "  replicate %s into %d as tp\n", op, tp);
  return b[k];
}

static void test_kinds_agree(void **state) {
  int checked = 0, moved = 0;
  for (int tp = 2; tp <= 4; tp *= 2)
    for (size_t i = 0; i < sizeof producers / sizeof *producers; i++)
      for (size_t j = 0; j < sizeof consumers / sizeof *consumers; j++) {
        char text[2048];
        snprintf(text, sizeof text,
                 "use std\nmodel m = %s\nplan p for m on cpus(%d) {\n  mesh d = devices as [tp = %d]\n%s%s"
                 "  replicate {tok, emb, h.0.ln_1, h.0.attn.*, h.0.res_1, h.0.ln_2, h.0.mlp.c_proj, h.0.res_2, ln_f, "
                 "lm_head, loss} into %d as tp\n  assign all -> d[tp]\n}\n",
                 model_text, tp, tp, statement("h.0.mlp.c_fc", producers[i], tp),
                 statement("h.0.mlp.act", consumers[j], tp), tp);
        weft_ctx *c = weft_new();
        weft_plan *p = unit_plan(c, text, "p");
        if (!p) fail_msg("the plan of c_fc along '%s', act along '%s' does not build", producers[i], consumers[j]);
        const weft_graph *g = p->g;
        int prod = -1, cons = -1;
        for (int op = 0; op < g->nops; op++) {
          if (strcmp(g->ops[op].name, "h.0.mlp.c_fc") == 0) prod = op;
          if (strcmp(g->ops[op].name, "h.0.mlp.act") == 0) cons = op;
        }
        assert_true(prod >= 0 && cons >= 0);
        sshape s;
        const char *why = "";
        assert_true(sshape_build(&c->arena, g, &s, &why));
        hw_model hw;
        weft_loc none = {0};
        weft_cluster cl = weft_cluster_of(p->cluster);
        assert_true(hw_from_cluster(&c->diags, g, &cl, "test", none, &hw));
        const opcfg *x = config(&c->arena, &s, &hw, prod, tp, producers[i]);
        const opcfg *y = config(&c->arena, &s, &hw, cons, tp, consumers[j]);
        int fwd = relayout_kind(x->out, y->in[0]);
        layout gneed = x->gout.kind == L_D ? x->gout : (layout){L_R, 0, 0};
        int bwd = relayout_kind(y->gin[0], gneed);
        unsigned pf = kinds_of(p, g->ops[prod].output, PHASE_FORWARD);
        unsigned pb = kinds_of(p, g->ops[prod].output, PHASE_BACKWARD);
        if (pf != (fwd < 0 ? 0u : 1u << fwd) || pb != (bwd < 0 ? 0u : 1u << bwd))
          fail_msg("tp %d, c_fc along '%s', act along '%s': the search prices %d forward and %d backward, the plan "
                   "moves kinds 0x%x and 0x%x",
                   tp, producers[i], consumers[j], fwd, bwd, pf, pb);
        moved += (fwd >= 0) + (bwd >= 0);
        checked++;
        weft_free(c);
      }
  assert_int_equal(checked, 24);
  assert_true(moved >= 12);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kinds_agree),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
