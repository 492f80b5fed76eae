/* test_cuda_plan.c - the CUDA backend's planning, which needs no GPU
 * (backends/cuda/cx.c, sched.c): region moves as the kernels take them,
 * the pool allocator and its fences, and the plan of a step for virtual
 * devices: every program's order kept, every read of another stream's
 * data after a wait for it, no memory reused before its readers are done. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/clip.h"
#include "cuda/sched.h"
#include "weft/report.h"
#include "weft/workspace.h"

/* ---- region moves ----------------------------------------------------------------------- */

/* The holder offset of every element of r, computed the slow way. */
static void offsets(const tregion *holder, const tregion *r, int64_t *out) {
  int nd = r->ndims;
  int64_t n = cx_numel(r), idx[GPU_MAX_DIMS] = {0};
  for (int64_t e = 0; e < n; e++) {
    int64_t rem = e, off = 0, stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t len = cx_dlen(&r->dims[d]);
      idx[d] = rem % len, rem /= len;
    }
    for (int d = nd - 1; d >= 0; d--) {
      /* the idx[d]-th index of r's dimension d, then its position in the holder */
      int64_t k = idx[d], x = -1;
      for (int i = 0; i < r->dims[d].n && x < 0; i++) {
        int64_t len = r->dims[d].iv[i].hi - r->dims[d].iv[i].lo;
        if (k < len) x = r->dims[d].iv[i].lo + k;
        else k -= len;
      }
      int64_t pos = 0;
      for (int i = 0; i < holder->dims[d].n; i++) {
        const irange *iv = &holder->dims[d].iv[i];
        if (x >= iv->hi) pos += iv->hi - iv->lo;
        else {
          pos += x - iv->lo;
          break;
        }
      }
      off += pos * stride;
      stride *= cx_dlen(&holder->dims[d]);
    }
    out[e] = off;
  }
}

static void check_move(const tregion *r, const tregion *src, const tregion *dst, int want_nd, bool want_contiguous) {
  cx_tables t = {0};
  cx_move mv;
  char err[256];
  assert_true(cx_move_build(&mv, &t, r, src, dst, err, sizeof err));
  assert_int_equal(mv.m.nd, want_nd);
  assert_int_equal(mv.m.contiguous, want_contiguous);
  int64_t n = cx_numel(r), sn = cx_numel(src), dn = cx_numel(dst);
  assert_int_equal(mv.m.total, n);
  float *s = malloc(sizeof(float) * (size_t)sn), *d = calloc((size_t)dn, sizeof(float));
  for (int64_t i = 0; i < sn; i++) s[i] = (float)i;
  cx_move_host(d, s, &mv, &t, false);
  int64_t *os = malloc(sizeof(int64_t) * (size_t)n), *od = malloc(sizeof(int64_t) * (size_t)n);
  offsets(src, r, os);
  offsets(dst, r, od);
  for (int64_t e = 0; e < n; e++) assert_true(d[od[e]] == (float)os[e]);
  free(s), free(d), free(os), free(od), free(t.v);
}

static void test_moves(void **state) {
  (void)state;
  /* a [6][7][12] holder; rows 1..5 of it, whole inside: dims merge */
  irange h0[] = {{0, 6}}, h1[] = {{0, 7}}, h2[] = {{0, 12}};
  dregion hd[] = {{1, h0}, {1, h1}, {1, h2}};
  tregion holder = {3, hd};
  irange r0[] = {{1, 5}};
  dregion rd[] = {{1, r0}, {1, h1}, {1, h2}};
  tregion rows = {3, rd};
  check_move(&rows, &holder, &rows, 1, false);   /* one run, from offset 84 */
  check_move(&holder, &holder, &holder, 1, true);
  /* a strided last dimension (three heads' blocks of a fused q|k|v): the
   * rows and the whole middle dimension merge, the strided one keeps its table */
  irange s2[] = {{0, 2}, {4, 6}, {8, 10}};
  dregion sd[] = {{1, r0}, {1, h1}, {3, s2}};
  tregion strided = {3, sd};
  check_move(&strided, &holder, &strided, 2, false);
  check_move(&strided, &strided, &holder, 2, false);
  /* a middle dimension cut: no merge across it */
  irange c1[] = {{2, 5}};
  dregion cd[] = {{1, h0}, {1, c1}, {1, h2}};
  tregion cut = {3, cd};
  check_move(&cut, &holder, &cut, 2, false);
  /* a region outside its holder is refused */
  irange big[] = {{0, 9}};
  dregion bd[] = {{1, big}, {1, h1}, {1, h2}};
  tregion outside = {3, bd};
  cx_tables t = {0};
  cx_move mv;
  char err[256];
  assert_false(cx_move_build(&mv, &t, &outside, &holder, &outside, err, sizeof err));
  assert_non_null(strstr(err, "outside the buffer"));
  free(t.v);
}

/* ---- the pool --------------------------------------------------------------------------------- */

static void test_pool(void **state) {
  (void)state;
  cx_pool p;
  cx_pool_init(&p, 1000 * CX_ALIGN);
  int *ev = NULL, nev = 0, cap = 0;
  int64_t a = cx_pool_alloc(&p, 100, &ev, &nev, &cap);
  int64_t b = cx_pool_alloc(&p, 3 * CX_ALIGN, &ev, &nev, &cap);
  assert_int_equal(a, 1000 * CX_ALIGN);
  assert_int_equal(b, a + CX_ALIGN);   /* rounded up to the alignment */
  assert_int_equal(p.top, 4 * CX_ALIGN);
  assert_int_equal(nev, 0);
  /* a freed by another stream's read: who reuses it waits for event 7 */
  int seven = 7, eight = 8;
  cx_pool_release(&p, a, 100, &seven, 1);
  int64_t c = cx_pool_alloc(&p, 50, &ev, &nev, &cap);
  assert_int_equal(c, a);
  assert_int_equal(nev, 1);
  assert_int_equal(ev[0], 7);
  /* the fence is spent: the next reuse of it waits for nothing */
  nev = 0;
  cx_pool_release(&p, c, 50, NULL, 0);
  int64_t d = cx_pool_alloc(&p, 10, &ev, &nev, &cap);
  assert_int_equal(d, a);
  assert_int_equal(nev, 0);
  /* neighbours merge, their fences with them; a larger block fits */
  cx_pool_release(&p, d, 10, &eight, 1);
  cx_pool_release(&p, b, 3 * CX_ALIGN, &seven, 1);
  assert_int_equal(p.nfr, 1);
  int64_t e = cx_pool_alloc(&p, 4 * CX_ALIGN, &ev, &nev, &cap);
  assert_int_equal(e, a);
  assert_int_equal(nev, 2);
  assert_int_equal(p.top, 4 * CX_ALIGN);
  /* nothing free fits: the pool grows, from the free block at its top */
  cx_pool_release(&p, e, 4 * CX_ALIGN, NULL, 0);
  int64_t f = cx_pool_alloc(&p, 6 * CX_ALIGN, &ev, &nev, &cap);
  assert_int_equal(f, a);
  assert_int_equal(p.top, 6 * CX_ALIGN);
  free(ev);
  cx_pool_free_all(&p);
}

/* ---- the plan of a step -------------------------------------------------------------------------- */

static weft_program *lowered(weft_ctx *c, const char *path, const char *plan, const char *const *sets, int nsets) {
  for (int i = 0; i < nsets; i++) assert_true(weft_set(c, sets[i]));
  if (weft_load(c, path) != WEFT_OK) fail_msg("%s does not load", path);
  binding *b = env_lookup(c->main->env, plan);
  assert_non_null(b);
  weft_loc none = {0};
  weft_plan *p = weft_build_plan(c, b->val, none, NULL);
  assert_non_null(p);
  lower_opts lo = {.full_programs = true};
  weft_program *pr = lower_plan(p, &lo, &c->arena, &c->diags);
  assert_non_null(pr);
  return pr;
}

static int64_t scratch(void *ctx, int dev, int ins) {
  (void)ctx, (void)dev;
  return ins % 3 == 0 ? 1000 : 0;
}

/* Replays the plan: per device, its instructions in program order, each
 * once; every wait after the record of its event; a receive and a
 * collective's results after waits for what the others packed. */
static void check_plan(const weft_program *pr) {
  csched s;
  char err[512];
  csched_cb cb = {.ctx = NULL, .ins_ws = scratch, .fixed = 4096, .keep = NULL};
  if (!sched_build(&s, pr, &cb, NULL, err, sizeof err)) fail_msg("%s", err);
  int nd = pr->nprogs, vdev = 0;
  int *next = calloc((size_t)nd, sizeof(int));
  bool *recorded = calloc((size_t)s.nevents + 1, 1);
  int *recorded_on = calloc((size_t)s.nevents + 1, sizeof(int));
  /* per device: events it has waited for */
  bool **waited = calloc((size_t)nd, sizeof(bool *));
  for (int d = 0; d < nd; d++) waited[d] = calloc((size_t)s.nevents + 1, 1);
  int *send_event = calloc((size_t)s.nmsgs + 1, sizeof(int));
  for (int k = 0; k < s.nops; k++) {
    const sop *o = &s.ops[k];
    assert_true(o->dev >= 0 && o->dev < nd);
    if (o->kind == SO_RECORD) {
      assert_false(recorded[o->arg]);
      recorded[o->arg] = true;
      recorded_on[o->arg] = o->dev;
      if (k > 0 && s.ops[k - 1].kind == SO_SEND) send_event[s.ops[k - 1].arg] = o->arg;
      continue;
    }
    if (o->kind == SO_WAIT) {
      assert_true(recorded[o->arg]);
      waited[o->dev][o->arg] = true;
      continue;
    }
    if (o->kind == SO_RECV) assert_true(waited[o->dev][send_event[o->arg]]);
    if (o->kind == SO_REDUCE) {
      const scoll *c = &s.colls[o->arg];
      for (int m = 0; m < c->n; m++)
        if (m != o->member && c->pack_ev[m] >= 0) assert_true(waited[o->dev][c->pack_ev[m]]);
    }
    if (o->ins < 0) continue;
    /* the instructions of a device come in its program's order; a
     * collective's member may pack and take its result at the same one */
    assert_true(o->ins == next[o->dev] - 1 || o->ins >= next[o->dev]);
    for (int i = next[o->dev]; i < o->ins; i++) {
      const lins *in = &pr->progs[o->dev].ins[i];
      /* what was skipped needs nothing on the stream */
      bool quiet = in->kind == LI_FREE || (in->kind == LI_ALLOC && pr->bufs[in->buf].persistent);
      if (!quiet) fail_msg("device %d: instruction %d skipped before %d", o->dev, i, o->ins);
    }
    next[o->dev] = o->ins + 1;
  }
  for (int d = 0; d < nd; d++) {
    free(waited[d]);
    if (!pr->progs[d].n) continue;
    vdev++;
    /* the pool holds what lives across steps and the peak of the rest */
    int64_t persistent = 0;
    for (int b = pr->progs[d].buf_lo; b < pr->progs[d].buf_hi; b++)
      if (pr->bufs[b].persistent) persistent += pr->bufs[b].bytes;
    assert_true(s.persistent[d] >= persistent + 4096);
    assert_true(s.pool[d] >= s.persistent[d]);
    assert_true(s.pool[d] - s.persistent[d] + persistent >= pr->progs[d].peak / 2);
  }
  assert_true(vdev > 1);
  free(next), free(recorded), free(recorded_on), free(waited), free(send_event);
  sched_free(&s);
}

static void test_plan_tensor_data_parallel(void **state) {
  (void)state;
  weft_ctx *c = weft_new();
  check_plan(lowered(c, "examples/mlp.plan", "tp2_dp2", NULL, 0));
  weft_free(c);
}

static void test_plan_pipeline(void **state) {
  (void)state;
  const char *sets[] = {"layers=8", "hidden=64", "heads=4", "seq=16", "vocab=256", "batch=8"};
  weft_ctx *c = weft_new();
  check_plan(lowered(c, "examples/gpt2.plan", "tp2_pp2", sets, 6));
  weft_free(c);
  c = weft_new();
  check_plan(lowered(c, "examples/gpt2.plan", "ulysses", sets, 6));
  weft_free(c);
  c = weft_new();
  check_plan(lowered(c, "examples/gpt2.plan", "dp_zero3", sets, 6));
  weft_free(c);
}

/* The order that takes the norm before the steps (clipping): every step
 * of every device after the factor is taken, every count of a gradient
 * before it, and every device waits for it. */
static void test_clip_order(void **state) {
  (void)state;
  const char *sets[] = {"layers=8", "hidden=64", "heads=4", "seq=16", "vocab=256", "batch=8"};
  weft_ctx *c = weft_new();
  weft_program *pr = lowered(c, "examples/gpt2.plan", "tp2_pp2", sets, 6);
  char err[512];
  bool **tail = clip_tail(pr, err, sizeof err);
  if (!tail) fail_msg("%s", err);
  csched s;
  csched_cb cb = {.ctx = NULL, .ins_ws = scratch, .fixed = 4096, .keep = NULL};
  if (!sched_build(&s, pr, &cb, tail, err, sizeof err)) fail_msg("%s", err);
  int norm_at = -1, parts = 0, nd = pr->nprogs;
  int *ready_wait = calloc((size_t)nd, sizeof(int));
  for (int k = 0; k < s.nops; k++) {
    const sop *o = &s.ops[k];
    if (o->kind == SO_NORM) {
      assert_int_equal(norm_at, -1);
      norm_at = k;
    } else if (o->kind == SO_NORM_PART) {
      assert_int_equal(norm_at, -1);
      assert_int_equal(pr->progs[o->dev].ins[o->ins].kind, LI_STEP);
      parts++;
    } else if (o->kind == SO_INS && pr->progs[o->dev].ins[o->ins].kind == LI_STEP) {
      assert_true(norm_at >= 0 && k > norm_at);
      /* its device waited for the factor (or took it) */
      assert_true(ready_wait[o->dev] || s.ops[norm_at].dev == o->dev);
    } else if (o->kind == SO_WAIT && norm_at >= 0 && k <= norm_at + 1 + nd) {
      ready_wait[o->dev] = 1;
    }
  }
  assert_true(norm_at >= 0);
  assert_true(parts > 0);
  /* the persistent buffers lie where the plain order puts them */
  csched plain;
  assert_true(sched_build(&plain, pr, &cb, NULL, err, sizeof err));
  for (int b = 0; b < pr->nbufs; b++)
    if (pr->bufs[b].persistent) assert_int_equal(plain.off[b], s.off[b]);
  free(ready_wait);
  sched_free(&s);
  sched_free(&plain);
  clip_tail_free(pr, tail);
  weft_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_moves),
      cmocka_unit_test(test_pool),
      cmocka_unit_test(test_plan_tensor_data_parallel),
      cmocka_unit_test(test_plan_pipeline),
      cmocka_unit_test(test_clip_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
