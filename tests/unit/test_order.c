/* test_order.c - the intra-block dynamic program (src/search/space.c) in
 * the order PaSE's GenerateSeq gives: the same best cost as in the
 * operators' own order, on every range the search costs (a block, the
 * head, the tail, a whole model without blocks), for every
 * tensor-parallel degree, with dependent sets no wider. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "search/search_int.h"
#include "weft/cost.h"
#include "weft/report.h"
#include "weft/workspace.h"

/* The best cost of a range, in the terms the program minimises. */
static double total(const sshape *s, const rangecost *r) {
  return r->fwd + r->bwd + r->tpsum * s->tpsum_weight + r->params * s->param_weight;
}

static void compare(const char *model, const char *cluster, int *ranges) {
  weft_ctx *c = weft_new();
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  fprintf(f, "use std\nmodel g = %s\nlet c = %s\n", model, cluster);
  fclose(f);
  assert_int_equal(weft_load_text(c, "t.plan", text, n), WEFT_OK);
  free(text);
  weft_loc none = {0};
  weft_graph *g = weft_build_graph(c, env_lookup(c->main->env, "g")->val, none);
  assert_non_null(g);
  value cv = weft_build_cluster(c, env_lookup(c->main->env, "c")->val, none);
  assert_int_equal(cv.kind, V_RECORD);
  weft_cluster cl = weft_cluster_of(cv.rec);
  hw_model hw;
  assert_true(hw_from_cluster(&c->diags, g, &cl, "test", none, &hw));
  hw.devices_per_node = cl.devices_per_node > 0 ? cl.devices_per_node : 1;
  sshape s;
  const char *why = "";
  assert_true(sshape_build(&c->arena, g, &s, &why));
  s.tpsum_weight = 1;
  /* the ranges the search costs */
  int lo[4], hi[4], nr = 0;
  if (s.layers > 0) {
    lo[nr] = 0, hi[nr++] = s.head_end;
    lo[nr] = s.block_start[0], hi[nr++] = s.block_start[0] + s.block_ops;
    lo[nr] = s.tail_start, hi[nr++] = g->nops;
  }
  lo[nr] = 0, hi[nr++] = g->nops;
  layout R = {L_R, 0, 0};
  for (int tp = 1; tp <= 8; tp *= 2)
    for (int i = 0; i < nr; i++) {
      if (hi[i] <= lo[i]) continue;
      int *order = arena_alloc(&c->arena, sizeof(int) * (size_t)(hi[i] - lo[i]));
      int wide_seq = range_order(&c->arena, &s, lo[i], hi[i], false, order);
      int wide_prog = range_order(&c->arena, &s, lo[i], hi[i], true, order);
      assert_true(wide_seq <= wide_prog);
      rangecost a, b;
      s.program_order = true;
      bool ok_a = range_best(&c->arena, &s, &hw, false, lo[i], hi[i], tp, 1, R, R, &a);
      s.program_order = false;
      bool ok_b = range_best(&c->arena, &s, &hw, false, lo[i], hi[i], tp, 1, R, R, &b);
      assert_int_equal(ok_a, ok_b);
      if (!ok_a) continue;
      double ta = total(&s, &a), tb = total(&s, &b);
      if (!(tb <= ta * (1 + 1e-9) && ta <= tb * (1 + 1e-9)))
        fail_msg("%s, ops [%d, %d), tp %d: %.9g in GenerateSeq's order, %.9g in program order", model, lo[i], hi[i],
                 tp, tb, ta);
      (*ranges)++;
    }
  weft_free(c);
}

static void test_same_cost(void **state) {
  int ranges = 0;
  compare("gpt(layers = 2, hidden = 256, heads = 8, seq = 128, vocab = 1024, batch = 8)", "a100_dgx(nodes = 1)", &ranges);
  compare("llama(layers = 2, hidden = 256, heads = 8, kv_heads = 4, ffn = 704, seq = 128, vocab = 1024, batch = 8)",
          "a100_dgx(nodes = 1)", &ranges);
  compare("mlp(batch = 16, dim = 64, hidden = 256)", "a100_dgx(nodes = 1)", &ranges);
  compare("t5(layers = 2, dec_layers = 2, hidden = 256, heads = 8, ffn = 1024, seq = 64, dec_seq = 32, vocab = 1024, batch = 8)", "a100_dgx(nodes = 1)",
          &ranges);
  assert_true(ranges >= 20);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_cost),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
