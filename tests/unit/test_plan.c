/* test_plan.c - unit tests of plans: split trees, regions (strided splits of
 * group dimensions), placement, and the derived communication. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "unit.h"

#include "weft/deps.h"
#include "weft/plan.h"
#include "weft/report.h"
#include "weft/workspace.h"

static weft_plan *build(weft_ctx *c, const char *text, const char *plan) { return unit_plan(c, text, plan); }

static int count(const weft_plan *p, comm_kind k, comm_phase ph) {
  int n = 0;
  for (int i = 0; i < p->ncomms; i++) n += p->comms[i].kind == k && p->comms[i].phase == ph;
  return n;
}

static const char *const mlp =
    "use std\n"
    "model mlp(batch = 8, dim = 16, hidden = 32) {\n"
    "  input x : f32[batch, dim]\n  input y : f32[batch, dim]\n"
    "  param w1 : f32[dim, hidden]\n  param w2 : f32[hidden, dim]\n"
    "  h = matmul(x, w1)\n  a = gelu(h)\n  o = matmul(a, w2)\n  loss = mse(o, y)\n"
    "  train sgd(lr = 0.1)\n}\n"
    "plan tp for mlp on cpus(2) {\n"
    "  mesh m = devices as [tp = 2]\n"
    "  split {h, a} on hidden into tp\n  split o on hidden into tp\n  replicate loss into tp\n"
    "  assign all -> m[tp]\n}\n"
    "plan dp for mlp on cpus(4) {\n"
    "  mesh m = devices as [dp = 4]\n  split all on batch into dp\n  assign all -> m[dp]\n}\n"
    "plan pipe for mlp on cpus(2) {\n"
    "  split all on batch into 2 as mb in time\n  assign {h, a} -> 0, {o, loss} -> 1\n}\n";

static void test_tensor_parallel(void **state) {
  (void)state;
  weft_ctx *c = weft_new();
  weft_plan *p = build(c, mlp, "tp");
  assert_non_null(p);
  assert_int_equal(p->nsubs, 8);
  /* h's second part holds columns 16..32 on device 1 */
  int h = p->g->tensors[graph_find(p->g, "h")].producer;
  psub *s = &p->subs[p->ops[h].first + 1];
  assert_int_equal(s->device, 1);
  tregion r;
  tregion_of(&c->arena, p, s, &p->ops[h].space->output, &r);
  assert_int_equal(r.dims[1].n, 1);
  assert_int_equal(r.dims[1].iv[0].lo, 16);
  assert_int_equal(r.dims[1].iv[0].hi, 32);
  /* o's parts are partial sums: one all-reduce forward, none between h, a, o */
  assert_int_equal(count(p, COMM_ALL_REDUCE, PHASE_FORWARD), 1);
  assert_int_equal(p->comms[0].tensor, graph_find(p->g, "o"));
  assert_int_equal(count(p, COMM_SEND, PHASE_FORWARD), 0);
  /* weights are split, not copied: no reduction of their gradients */
  assert_int_equal(count(p, COMM_ALL_REDUCE, PHASE_WEIGHTS), 0);
  weft_free(c);
}

static void test_data_parallel(void **state) {
  (void)state;
  weft_ctx *c = weft_new();
  weft_plan *p = build(c, mlp, "dp");
  assert_non_null(p);
  int64_t bytes[COMM_KIND_COUNT];
  int counts[COMM_KIND_COUNT];
  deps_totals(p, bytes, counts, PHASE_WEIGHTS);
  assert_int_equal(counts[COMM_ALL_REDUCE], 2);
  assert_int_equal(bytes[COMM_ALL_REDUCE], graph_param_bytes(p->g));
  deps_totals(p, bytes, counts, PHASE_FORWARD);
  for (int k = 0; k < COMM_KIND_COUNT; k++) assert_int_equal(counts[k], 0);
  weft_free(c);
}

/* Whether the parts of cm tile its region: as many elements as the region,
 * each inside it, no two overlapping. */
static void assert_parts_tile(weft_ctx *c, const pcomm *cm) {
  assert_non_null(cm->parts);
  int64_t total = 0;
  for (int m = 0; m < cm->ngroup; m++) {
    assert_true(tregion_contains(&cm->region, &cm->parts[m]));
    total += tregion_numel(&cm->parts[m]);
    for (int o = 0; o < m; o++) {
      tregion x;
      assert_false(tregion_intersect(&c->arena, &cm->parts[m], &cm->parts[o], &x));
    }
  }
  assert_int_equal(total, tregion_numel(&cm->region));
}

/* GPT-2 124M, data parallel on 8 devices: ZeRO turns each gradient
 * all-reduce into a reduce-scatter of the same buffer and gathers the
 * updated parameters back, the parameter bytes of one replica each way. */
static void test_zero(void **state) {
  (void)state;
  const char *text =
      "use std\n"
      "model gpt2 = gpt()\n"
      "plan dp for gpt2 on h100_dgx(nodes = 1) {\n"
      "  mesh m = devices as [dp = 8]\n  split all on batch into dp\n  assign all -> m[dp]\n}\n"
      "plan z1 for gpt2 on h100_dgx(nodes = 1) {\n"
      "  mesh m = devices as [dp = 8]\n  split all on batch into dp\n  zero(1)\n  assign all -> m[dp]\n}\n"
      "plan z3 for gpt2 on h100_dgx(nodes = 1) {\n"
      "  mesh m = devices as [dp = 8]\n  split all on batch into dp\n  zero(3)\n  assign all -> m[dp]\n}\n";
  weft_ctx *c = weft_new();
  int64_t bytes[COMM_KIND_COUNT];
  int counts[COMM_KIND_COUNT];
  weft_plan *p = build(c, text, "dp");
  assert_non_null(p);
  assert_int_equal(graph_param_bytes(p->g), 497759232);
  deps_totals(p, bytes, counts, PHASE_WEIGHTS);
  assert_int_equal(bytes[COMM_ALL_REDUCE], 497759232);
  assert_int_equal(counts[COMM_REDUCE_SCATTER], 0);
  deps_totals(p, bytes, counts, PHASE_PARAMS);
  for (int k = 0; k < COMM_KIND_COUNT; k++) assert_int_equal(counts[k], 0);

  p = build(c, text, "z1");
  assert_non_null(p);
  deps_totals(p, bytes, counts, PHASE_WEIGHTS);
  assert_int_equal(counts[COMM_ALL_REDUCE], 0);
  assert_int_equal(bytes[COMM_REDUCE_SCATTER], 497759232);
  deps_totals(p, bytes, counts, PHASE_PARAMS);
  assert_int_equal(bytes[COMM_ALL_GATHER], 497759232);
  for (int i = 0; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    assert_int_equal(cm->ngroup, 8);
    assert_parts_tile(c, cm);
    if (cm->phase == PHASE_PARAMS) assert_int_equal(cm->dir, DIR_OPTIMIZER);
  }
  /* the tied embedding table, 50257 x 768, is cut along its second dimension */
  int wte = graph_find(p->g, "wte.weight");
  for (int i = 0; i < p->ncomms; i++)
    if (p->comms[i].tensor == wte) {
      assert_int_equal(p->comms[i].parts[1].dims[0].iv[0].hi, 50257);
      assert_int_equal(p->comms[i].parts[1].dims[1].iv[0].lo, 96);
      assert_int_equal(p->comms[i].parts[1].dims[1].iv[0].hi, 192);
    }

  /* stage 3: the same reduce-scatters, and a gather before each use, forward
   * and backward; the table is read twice */
  p = build(c, text, "z3");
  assert_non_null(p);
  deps_totals(p, bytes, counts, PHASE_WEIGHTS);
  assert_int_equal(bytes[COMM_REDUCE_SCATTER], 497759232);
  deps_totals(p, bytes, counts, PHASE_PARAMS);
  assert_int_equal(bytes[COMM_ALL_GATHER], 2 * (497759232 + 50257 * 768 * 4));
  int fwd = 0, bwd = 0;
  for (int i = 0; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    if (cm->phase != PHASE_PARAMS) continue;
    assert_true(cm->consumer_op >= 0);
    assert_int_equal(p->g->ops[cm->consumer_op].inputs[cm->input], cm->tensor);
    fwd += cm->dir == DIR_FORWARD;
    bwd += cm->dir == DIR_BACKWARD;
  }
  assert_int_equal(fwd, bwd);
  assert_int_equal(fwd + bwd, counts[COMM_ALL_GATHER]);
  weft_free(c);
}

/* Megatron sequence parallelism: the all-reduces of activations become a
 * reduce-scatter into sequence parts after each row-parallel projection and
 * an all-gather before each column-parallel one; backward mirrors them. */
static void test_sequence_parallel(void **state) {
  (void)state;
  const char *text =
      "use std\n"
      "model g = gpt(layers = 2, hidden = 64, heads = 4, seq = 16, vocab = 128, batch = 4)\n"
      "plan tp for g on cpus(2) {\n"
      "  mesh m = devices as [tp = 2]\n  megatron_tp(tp)\n  assign all -> m[tp]\n}\n"
      "plan sp for g on cpus(2) {\n"
      "  mesh m = devices as [tp = 2]\n  megatron_tp(tp, sequence_parallel = true)\n  assign all -> m[tp]\n}\n";
  weft_ctx *c = weft_new();
  int64_t bytes[COMM_KIND_COUNT], sp_bytes[COMM_KIND_COUNT];
  int counts[COMM_KIND_COUNT], sp_counts[COMM_KIND_COUNT];
  weft_plan *p = build(c, text, "tp");
  assert_non_null(p);
  deps_totals(p, bytes, counts, PHASE_FORWARD);
  /* two a layer, and the vocabulary-parallel embedding's */
  assert_int_equal(counts[COMM_ALL_REDUCE], 5);
  p = build(c, text, "sp");
  assert_non_null(p);
  for (int ph = PHASE_FORWARD; ph <= PHASE_BACKWARD; ph++) {
    deps_totals(p, sp_bytes, sp_counts, (comm_phase)ph);
    assert_int_equal(sp_counts[COMM_ALL_REDUCE], 0);
    assert_int_equal(sp_counts[COMM_SEND], 0);
    assert_int_equal(sp_counts[COMM_REDUCE_SCATTER], 5);
    /* and the loss's vocabulary shards gather their statistics (pcomm.stats) */
    assert_int_equal(sp_counts[COMM_ALL_GATHER], 6);
    /* the same buffers as the all-reduces they replace */
    assert_int_equal(sp_bytes[COMM_REDUCE_SCATTER], bytes[COMM_ALL_REDUCE]);
  }
  int res_1 = p->g->tensors[graph_find(p->g, "h.0.res_1")].producer;
  int found = 0;
  for (int i = 0; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    if (cm->phase != PHASE_FORWARD && cm->phase != PHASE_BACKWARD) continue;
    assert_parts_tile(c, cm);
    /* after attention's projection each device gets the sum of its half of
     * the sequence */
    if (cm->kind == COMM_REDUCE_SCATTER && cm->phase == PHASE_FORWARD && cm->consumer_op == res_1) {
      assert_int_equal(cm->parts[1].dims[1].iv[0].lo, 8);
      assert_int_equal(cm->parts[1].dims[1].iv[0].hi, 16);
      found++;
    }
  }
  assert_int_equal(found, 1);
  weft_free(c);
}

static void test_pipeline(void **state) {
  (void)state;
  weft_ctx *c = weft_new();
  weft_plan *p = build(c, mlp, "pipe");
  assert_non_null(p);
  /* two micro-batches of a, sent forward; their gradients sent back */
  assert_int_equal(count(p, COMM_SEND, PHASE_FORWARD), 2);
  assert_int_equal(count(p, COMM_SEND, PHASE_BACKWARD), 2);
  for (int i = 0; i < p->ncomms; i++)
    if (p->comms[i].kind == COMM_SEND && p->comms[i].phase == PHASE_FORWARD) {
      assert_int_equal(p->comms[i].src, 0);
      assert_int_equal(p->comms[i].dst, 1);
      assert_int_equal(p->comms[i].size, 4 * 32 * 4);  /* half the batch of a */
    }
  weft_free(c);
}

/* A split of n in (3 n dh) takes every part's share of all three blocks. */
static void test_strided_heads(void **state) {
  (void)state;
  const char *text =
      "use std\n"
      "model at(b = 2, s = 4, heads = 4, dh = 2) {\n"
      "  input x : [b, s, heads * dh]\n  param w : [heads * dh, 3 * heads * dh]\n  param bias : [3 * heads * dh]\n"
      "  qkv = qkv_linear(x, w, bias, n = heads)\n  y = causal_attention(qkv, n = heads)\n}\n"
      "plan tp for at on cpus(2) {\n"
      "  split {qkv, y} on n into 2\n  assign all -> 0\n}\n";
  weft_ctx *c = weft_new();
  weft_plan *p = build(c, text, "tp");
  assert_non_null(p);
  int q = p->g->tensors[graph_find(p->g, "qkv")].producer;
  psub *s = &p->subs[p->ops[q].first + 1];
  tregion r;
  tregion_of(&c->arena, p, s, &p->ops[q].space->output, &r);
  /* 3 blocks of 8 columns; the second half of the heads of each block */
  assert_int_equal(r.dims[2].n, 3);
  assert_int_equal(r.dims[2].iv[0].lo, 4);
  assert_int_equal(r.dims[2].iv[0].hi, 8);
  assert_int_equal(r.dims[2].iv[2].lo, 20);
  assert_int_equal(r.dims[2].iv[2].hi, 24);
  /* attention reads exactly what the projection wrote: no communication */
  assert_int_equal(count(p, COMM_SEND, PHASE_FORWARD), 0);
  assert_int_equal(count(p, COMM_ALL_GATHER, PHASE_FORWARD), 0);
  weft_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tensor_parallel),
      cmocka_unit_test(test_data_parallel),
      cmocka_unit_test(test_zero),
      cmocka_unit_test(test_sequence_parallel),
      cmocka_unit_test(test_pipeline),
      cmocka_unit_test(test_strided_heads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
