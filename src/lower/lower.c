/* lower.c - the lower stage: from a plan (sub-operators on devices, the
 * communication that preserves dependencies) to one program per device.
 *
 * 1. The schedule gives each device an order of blocks: the forward or
 *    backward sub-operators of one stage for one micro-batch.
 * 2. Inside a block, operators run in data-flow order (adjusted by
 *    `order`); a recomputed segment runs its forward again right before
 *    the backward of its last operator; optimizer steps close the step.
 * 3. Every communication is anchored on each device taking part: after the
 *    last local task that produces what it moves, or, on a device that only
 *    receives, before the first task that reads it.
 * 4. Each device's tasks and communications are emitted in order against a
 *    store of the buffers the device holds: a task reading a region that no
 *    earlier instruction provided breaks rule 4 (dependencies).
 * 5. Buffers are freed after their last use, and the gradient all-reduces
 *    that follow each other are fused into buckets (bucket.c).
 * Rules 3 (order, deadlock) and 5 (memory) are checked on the programs
 * afterwards, by the validate stage (validate.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "weft/lower.h"
#include "base/htab.h"
#include "weft/deps.h"
#include "base/prof.h"
#include "base/vec.h"
#include "lower/works.h"

const char *const lbuf_role_names[LB_ROLE_COUNT] = {"input", "param", "grad", "state", "act", "act_grad", "master", "comm"};
const int lbuf_role_order[LB_ROLE_COUNT] = {LB_PARAM, LB_MASTER, LB_GRAD, LB_STATE, LB_ACT, LB_ACT_GRAD, LB_COMM, LB_INPUT};
const char *const lbuf_role_titles[LB_ROLE_COUNT] = {
  [LB_INPUT] = "inputs", [LB_PARAM] = "parameters", [LB_GRAD] = "gradients", [LB_STATE] = "optimizer state",
  [LB_ACT] = "activations", [LB_ACT_GRAD] = "gradients of activations", [LB_MASTER] = "master weights",
  [LB_COMM] = "communication buffers"};
_Static_assert(sizeof(void *) != 8 || sizeof(lins) == 64, "an instruction is 64 bytes on 64-bit machines");

const char *const lins_kind_names[LI_KIND_COUNT] = {"alloc", "free", "compute", "send", "recv", "collective", "step", "copy"};
const char *const lins_part_names[LP_COUNT] = {"whole", "stats", "combine"};


/* ---- small helpers --------------------------------------------------------------- */

typedef VEC(int) ivec;

int64_t lower_device_memory(const weft_plan *p) {
  const value *dev = record_get(p->cluster, "device");
  if (!dev || dev->kind != V_RECORD) return 0;
  const value *m = record_get(dev->rec, "memory");
  if (!m || m->kind != V_QUANTITY) return 0;
  return (int64_t)m->q.v;
}

/* Equality and containment of regions, at once when both share their
 * intervals (regions are kept once: sub_region, region_intern). */
static bool same_region(const tregion *x, const tregion *y) {
  return (x->dims == y->dims && x->ndims == y->ndims) || tregion_equal(x, y);
}

static bool holds_region(const tregion *outer, const tregion *inner) {
  return (outer->dims == inner->dims && outer->ndims == inner->ndims) || tregion_contains(outer, inner);
}

/* ---- tasks ------------------------------------------------------------------------- */

typedef enum { T_FWD, T_BWD, T_RECOMP, T_STEP } task_kind;

typedef struct task {
  task_kind kind;
  int sub;                /* forward sub-operator, or the parameter tensor for T_STEP */
} task;

typedef VEC(task) tasklist;

/* An anchor: a communication placed on one device, after task `at` (pos =
 * 2 at + 1) or before it (pos = 2 at). */
typedef struct anchor {
  int pos;
  int comm;
  int epoch;
} anchor;

typedef VEC(anchor) anchors;

/* Regions kept once per lowering: the sub-operators of every micro-batch,
 * operator and device name few distinct regions (GPT-3 on 1024 devices:
 * 2,235 for 2 million arguments). A region is found by what determines it:
 * per tensor dimension, the size and range of each of its idims. */
typedef struct rkey {
  int off, len;           /* a region's key: keys[off .. off + len) */
} rkey;

typedef struct rintern {
  VEC(tregion) v;         /* the regions (their intervals in the program's arena) */
  VEC(rkey) key;          /* per region */
  VEC(int64_t) keys;
  htab index;             /* the regions by the hash of their key */
} rintern;

typedef struct lstate {
  weft_diags *dg;         /* where errors go */
  weft_plan *p;
  weft_program *pr;
  arena *a;               /* the program's memory */
  arena scratch;
  arena tmp;              /* what lowering alone needs (tasks, anchors): freed
                           * before the simulation, which takes its memory */
  int nstages;
  int *stage_of;          /* per op: schedule stage */
  int *order;             /* ops in block order */
  int *rank;              /* position of each op in order */
  int nmb;
  /* sub-operators by (device, op): devop[d * nops + op] .. devop[.. + 1) index byd */
  int *dslot;             /* per device: its slot in byd_start, -1: no sub-operators */
  int *byd_start;
  int *byd;
  int *byd_per_mb;        /* per (device, op): subs of each micro-batch when every one has
                           * that many, in order (0: look them up) */
  tasklist *tasks;        /* per device */
  /* per forward sub: its task index for each kind, -1 */
  int *fpos, *bpos, *rpos;
  int **steppos;          /* per device: per param tensor, the step task, or NULL */
  anchors *anch;          /* per device */
  lins *ebuf;             /* the emission vector (emit) */
  int ecap;
  bool full;              /* programs keep their full instructions (lower_opts.full_programs) */
  arena *ra;              /* where refs go: the program's arena, or without
                           * full programs refa, emptied for each device */
  arena refa;
  lower_works *works;     /* the works of computes, copies and steps (lop.aux) */
  int **readers;          /* per tensor: ops reading it (-1 terminated) */
  int *sreg_off;          /* per sub: where the regions of its arguments start in sreg_v */
  tregion *sreg_v;        /* per sub, per argument (its inputs, then its result): its region */
  int *sreg_slab;         /* ... and its slab (slab_of) */
  size_t nsreg;
  bool *value_split;      /* per op: split along a reduction (applies_arg has work) */
  bool *shards_stats;     /* per op: its parts gather statistics (deps_stats_idim >= 0) */
  int *tshift;            /* per tensor that moves with micro-batches: log2 of its step, -1 not a power of 2 */
  struct store *st;       /* the emitter's store, kept from device to device (emit_device) */
  rintern regs;           /* the distinct regions of sub-operators */
  int *omit_start;        /* per device: its omissions (pcomm.omit) are
                           * [omit_start[d], omit_start[d + 1]) of omit_op and
                           * omit_comm; NULL when there are none */
  int *omit_op, *omit_comm;
  int *stats;             /* per sub: the gathers of its statistics (pcomm.stats),
                           * forward then backward, -1; NULL when there are none */
  bool failed;
} lstate;

static void task_add(lstate *L, int d, task_kind k, int sub) {
  tasklist *tl = &L->tasks[d];
  int i = tl->n;
  vec_push(&L->tmp, tl, ((task){k, sub}));
  if (k == T_FWD) L->fpos[sub] = i;
  else if (k == T_BWD) L->bpos[sub] = i;
  else if (k == T_RECOMP) L->rpos[sub] = i;
}

/* The subs of op on device d: [*lo, *hi) in L->byd. */
static void subs_on(const lstate *L, int d, int op, int *lo, int *hi) {
  if (L->dslot[d] < 0) { *lo = *hi = 0; return; }
  size_t k = (size_t)L->dslot[d] * (size_t)L->p->g->nops + (size_t)op;
  *lo = L->byd_start[k];
  *hi = L->byd_start[k + 1];
}

/* Those of micro-batch mb among them: a list is sorted by micro-batch. */
static void subs_of_mb(const lstate *L, int d, int op, int mb, int *lo, int *hi) {
  const psub *subs = L->p->subs;
  int x, end;
  subs_on(L, d, op, &x, &end);
  int c = x < end ? L->byd_per_mb[(size_t)L->dslot[d] * (size_t)L->p->g->nops + (size_t)op] : 0;
  if (c > 0) {
    *lo = x + mb * c < end ? x + mb * c : end;
    *hi = *lo + c < end ? *lo + c : end;
    return;
  }
  for (int y = end; x < y;) {   /* the first of micro-batch mb or later */
    int m = x + (y - x) / 2;
    if (subs[L->byd[m]].microbatch < mb) x = m + 1;
    else y = m;
  }
  *lo = x;
  for (int y = end; x < y;) {   /* the first after it */
    int m = x + (y - x) / 2;
    if (subs[L->byd[m]].microbatch <= mb) x = m + 1;
    else y = m;
  }
  *hi = x;
}

static bool index_subs(lstate *L) {
  weft_plan *p = L->p;
  if ((size_t)p->ndevices * (size_t)p->g->nops + 1 > (size_t)1 << 30) return false;
  /* the devices that hold sub-operators (the representatives, when the
   * plan keeps only theirs), each its slot of cells */
  L->dslot = malloc(sizeof(int) * (size_t)(p->ndevices ? p->ndevices : 1));
  if (!L->dslot) weft_oom();
  for (int d = 0; d < p->ndevices; d++) L->dslot[d] = -1;
  int nslots = 0;
  for (int s = 0; s < p->nsubs; s++)
    if (L->dslot[p->subs[s].device] < 0) L->dslot[p->subs[s].device] = nslots++;
  size_t cells = (size_t)nslots * (size_t)p->g->nops + 1;
  L->byd_start = calloc(cells, sizeof(int));
  L->byd = malloc(sizeof(int) * (size_t)(p->nsubs ? p->nsubs : 1));
  if (!L->byd_start || !L->byd) weft_oom();
  for (int s = 0; s < p->nsubs; s++) {
    const psub *sb = &p->subs[s];
    L->byd_start[(size_t)L->dslot[sb->device] * (size_t)p->g->nops + (size_t)sb->op + 1]++;
  }
  for (size_t k = 1; k < cells; k++) L->byd_start[k] += L->byd_start[k - 1];
  int *fill = malloc(sizeof(int) * cells);
  if (!fill) weft_oom();
  memcpy(fill, L->byd_start, sizeof(int) * cells);
  /* subs are made op by op in coordinate order: each (device, op) list
   * keeps that order among the subs of one micro-batch, and is sorted by
   * micro-batch (stably; most lists already are) for subs_of_mb */
  for (int s = 0; s < p->nsubs; s++) {
    const psub *sb = &p->subs[s];
    L->byd[fill[(size_t)L->dslot[sb->device] * (size_t)p->g->nops + (size_t)sb->op]++] = s;
  }
  free(fill);
  L->byd_per_mb = calloc(cells, sizeof(int));
  if (!L->byd_per_mb) weft_oom();
  for (size_t k = 0; k + 1 < cells; k++) {
    int a = L->byd_start[k], b = L->byd_start[k + 1];
    for (int i = a + 1; i < b; i++)
      for (int j = i; j > a && p->subs[L->byd[j - 1]].microbatch > p->subs[L->byd[j]].microbatch; j--) {
        int t = L->byd[j]; L->byd[j] = L->byd[j - 1]; L->byd[j - 1] = t;
      }
    int c = 0;
    while (a + c < b && p->subs[L->byd[a + c]].microbatch == 0) c++;
    bool even = c > 0 && (b - a) % c == 0;
    for (int i = a; i < b && even; i++) even = p->subs[L->byd[i]].microbatch == (i - a) / c;
    if (even) L->byd_per_mb[k] = c;
  }
  return true;
}

/* ---- operator order inside a block ----------------------------------------------- */

/* Kahn's algorithm over data edges and the first `norders` order
 * statements; lowest operator index first. False on a cycle. */
static bool topo_order(lstate *L, int norders, int *out) {
  const weft_graph *g = L->p->g;
  arena_reset(&L->scratch);
  arena *s = &L->scratch;
  int n = g->nops;
  int *indeg = arena_alloc(s, sizeof(int) * (size_t)(n ? n : 1));
  ivec *succ = arena_alloc(s, sizeof(ivec) * (size_t)(n ? n : 1));
  for (int op = 0; op < n; op++)
    for (int k = 0; k < g->ops[op].ninputs; k++) {
      int pr = g->tensors[g->ops[op].inputs[k]].producer;
      if (pr >= 0 && pr != op) { vec_push(s, &succ[pr], op); indeg[op]++; }
    }
  for (int i = 0; i < norders; i++) {
    const porder *o = &L->p->orders[i];
    for (int x = 0; x < o->na; x++)
      for (int y = 0; y < o->nb; y++) { vec_push(s, &succ[o->a[x]], o->b[y]); indeg[o->b[y]]++; }
  }
  /* a binary heap of ready operators */
  int *heap = arena_alloc(s, sizeof(int) * (size_t)(n ? n : 1));
  int hn = 0, m = 0;
  for (int op = 0; op < n; op++)
    if (!indeg[op]) heap[hn++] = op;  /* ascending: already a heap */
  while (hn) {
    int top = heap[0];
    heap[0] = heap[--hn];
    for (int i = 0;;) {
      int l = 2 * i + 1, r = l + 1, b = i;
      if (l < hn && heap[l] < heap[b]) b = l;
      if (r < hn && heap[r] < heap[b]) b = r;
      if (b == i) break;
      int t = heap[i]; heap[i] = heap[b]; heap[b] = t;
      i = b;
    }
    out[m++] = top;
    for (int k = 0; k < succ[top].n; k++) {
      int v = succ[top].v[k];
      if (--indeg[v] == 0) {
        int i = hn++;
        heap[i] = v;
        while (i > 0 && heap[(i - 1) / 2] > heap[i]) {
          int t = heap[i]; heap[i] = heap[(i - 1) / 2]; heap[(i - 1) / 2] = t;
          i = (i - 1) / 2;
        }
      }
    }
  }
  return m == n;
}

static bool block_order(lstate *L) {
  weft_plan *p = L->p;
  int n = p->g->nops;
  L->order = arena_alloc(L->a, sizeof(int) * (size_t)(n ? n : 1));
  L->rank = arena_alloc(L->a, sizeof(int) * (size_t)(n ? n : 1));
  for (int i = 1; i <= p->norders; i++)
    if (!topo_order(L, i, L->order)) {
      const porder *o = &p->orders[i - 1];
      weft_diag *g = diag_add(L->dg, DIAG_ERROR, o->loc, "this `order` contradicts the data flow: it closes a cycle");
      diag_hint(g, L->dg, "an operator cannot run before one whose result it reads (directly or not)");
      return false;
    }
  if (!topo_order(L, p->norders, L->order)) return false;
  for (int i = 0; i < n; i++) L->rank[L->order[i]] = i;
  return true;
}

/* ---- stages and the schedule ----------------------------------------------------- */

typedef struct block {
  int stage, mb;
  char kind;              /* 'f', 'b' */
} block;

typedef VEC(block) blist;

static void blist_add(arena *a, blist *l, int stage, int mb, char kind) { vec_push(a, l, ((block){stage, mb, kind})); }

/* The devices of each stage, sorted and distinct. */
static void stage_devices(lstate *L, ivec *devs) {
  weft_plan *p = L->p;
  bool *seen = calloc((size_t)L->nstages * (size_t)p->ndevices + 1, 1);
  if (!seen) weft_oom();
  for (int s = 0; s < p->nsubs; s++) {
    int st = L->stage_of[p->subs[s].op];
    int d = p->subs[s].device;
    if (!seen[(size_t)st * (size_t)p->ndevices + (size_t)d]) {
      seen[(size_t)st * (size_t)p->ndevices + (size_t)d] = true;
      vec_push(L->a, &devs[st], d);
    }
  }
  free(seen);
  for (int st = 0; st < L->nstages; st++)
    for (int i = 1; i < devs[st].n; i++)
      for (int j = i; j > 0 && devs[st].v[j - 1] > devs[st].v[j]; j--) {
        int t = devs[st].v[j]; devs[st].v[j] = devs[st].v[j - 1]; devs[st].v[j - 1] = t;
      }
}

/* The pipeline: ranks of stages on the same devices. */
typedef struct pipeline {
  int nranks;
  int chunks;             /* stages per rank */
  int *rank_of;           /* per stage */
  int **stages;           /* per rank: its stages in order (chunk 0 first) */
} pipeline;

static bool make_pipeline(lstate *L, const ivec *devs, pipeline *pl) {
  weft_plan *p = L->p;
  pl->rank_of = arena_alloc(L->a, sizeof(int) * (size_t)L->nstages);
  pl->stages = arena_alloc(L->a, sizeof(int *) * (size_t)L->nstages);
  int *count = arena_alloc(L->a, sizeof(int) * (size_t)L->nstages);
  int *first = arena_alloc(L->a, sizeof(int) * (size_t)L->nstages);
  pl->nranks = 0;
  for (int st = 0; st < L->nstages; st++) {
    int r = -1;
    for (int q = 0; q < pl->nranks && r < 0; q++) {
      const ivec *o = &devs[first[q]];
      if (o->n == devs[st].n && memcmp(o->v, devs[st].v, sizeof(int) * (size_t)o->n) == 0) r = q;
    }
    if (r < 0) {
      /* a new rank: it must share no device with the others */
      for (int q = 0; q < pl->nranks; q++) {
        const ivec *o = &devs[first[q]];
        for (int i = 0; i < o->n; i++)
          for (int j = 0; j < devs[st].n; j++)
            if (o->v[i] == devs[st].v[j]) {
              weft_diag *g = diag_add(L->dg, DIAG_ERROR, p->sched_loc,
                                        "stages %s and %s share device %d but not all their devices: no pipeline "
                                        "schedule fits",
                                        L->pr->stage_names[first[q]], L->pr->stage_names[st], o->v[i]);
              diag_hint(g, L->dg, "place each stage on the same devices as the stages it shares a device with, "
                                         "or on devices of its own");
              return false;
            }
      }
      r = pl->nranks++;
      first[r] = st;
      pl->stages[r] = arena_alloc(L->a, sizeof(int) * (size_t)L->nstages);
    }
    pl->rank_of[st] = r;
    pl->stages[r][count[r]++] = st;
  }
  pl->chunks = count[0];
  if (pl->chunks > 1 && p->sched == SCHED_1F1B) {
    weft_diag *g = diag_add(L->dg, DIAG_WARNING, p->sched_loc,
                            "one_f_one_b with %d stages on each device runs them interleaved", pl->chunks);
    diag_hint(g, L->dg, "write `schedule interleaved` to say so");
  }
  /* interleaving deals the stages round-robin: stage k on rank k mod ranks */
  if (pl->chunks > 1 && p->sched != SCHED_GPIPE)
    for (int st = 0; st < L->nstages; st++)
      if (pl->rank_of[st] != st % pl->nranks) {
        int want = st % pl->nranks;
        weft_diag *g = diag_add(L->dg, DIAG_ERROR, p->sched_loc, "an interleaved schedule deals stages round-robin over its %d "
                                                      "device groups, but stage %s (number %d) runs on the devices of "
                                                      "stage %s, not on those of stage %s",
                                  pl->nranks, L->pr->stage_names[st], st, L->pr->stage_names[pl->stages[pl->rank_of[st]][0]],
                                  L->pr->stage_names[pl->stages[want][0]]);
        diag_hint(g, L->dg, "place stage k on the devices of stage k mod %d (declare the stages in pipeline order)",
                  pl->nranks);
        return false;
      }
  for (int r = 1; r < pl->nranks; r++)
    if (count[r] != pl->chunks) {
      weft_diag *g = diag_add(L->dg, DIAG_ERROR, p->sched_loc, "devices of stage %s run %d stage%s, those of stage %s run %d",
                                L->pr->stage_names[pl->stages[0][0]], pl->chunks, pl->chunks == 1 ? "" : "s",
                                L->pr->stage_names[pl->stages[r][0]], count[r]);
      diag_hint(g, L->dg, "a pipeline schedule needs the same number of stages on every device");
      return false;
    }
  return true;
}

/* 1F1B (PipeDream-Flush, Narayanan et al. 2021), generalised to `chunks`
 * stages per rank (the interleaved schedule): warm-up forwards, then one
 * forward and one backward in turn, then the remaining backwards. */
static void one_f_one_b(lstate *L, const pipeline *pl, int r, blist *out) {
  int P = pl->nranks, v = pl->chunks, M = L->nmb;
  int total = M * v;
  int warm;
  if (v == 1) warm = P - r - 1;
  else warm = (P - r - 1) * 2 + (v - 1) * P;
  if (warm > total) warm = total;
  /* the k-th forward (or backward) of this rank: its chunk and micro-batch */
  #define FWD_CHUNK(k) (v == 1 ? 0 : ((k) % (P * v)) / P)
  #define MB_OF(k) (v == 1 ? (k) : ((k) / (P * v)) * P + (k) % P)
  int nf = 0, nb = 0;
  for (; nf < warm; nf++) blist_add(L->a, out, pl->stages[r][FWD_CHUNK(nf)], MB_OF(nf), 'f');
  while (nf < total) {
    blist_add(L->a, out, pl->stages[r][FWD_CHUNK(nf)], MB_OF(nf), 'f');
    nf++;
    blist_add(L->a, out, pl->stages[r][v - 1 - FWD_CHUNK(nb)], MB_OF(nb), 'b');
    nb++;
  }
  for (; nb < total; nb++) blist_add(L->a, out, pl->stages[r][v - 1 - FWD_CHUNK(nb)], MB_OF(nb), 'b');
  #undef FWD_CHUNK
  #undef MB_OF
}

/* Every forward of every micro-batch, then every backward (GPipe). */
static void all_forward_then_backward(lstate *L, const int *stages, int n, blist *out) {
  for (int m = 0; m < L->nmb; m++)
    for (int i = 0; i < n; i++) blist_add(L->a, out, stages[i], m, 'f');
  for (int m = 0; m < L->nmb; m++)
    for (int i = n - 1; i >= 0; i--) blist_add(L->a, out, stages[i], m, 'b');
}

/* A hand-written grid: rows are stages (or devices), cells fN / bN / . in
 * time order. Checks each row and turns it into per-stage block lists. */
static bool read_grid(lstate *L, blist *rows) {
  weft_plan *p = L->p;
  const ast *s = p->grid;
  bool *rowseen = arena_alloc(L->a, sizeof(bool) * (size_t)L->nstages);
  bool ok = true;
  for (int i = 0; i < s->list.n; i++) {
    const ast *row = s->list.items[i];
    int st = -1;
    for (int k = 0; k < L->nstages && st < 0; k++)
      if (strcmp(L->pr->stage_names[k], row->name) == 0) st = k;
    if (st < 0) {
      weft_diag *g = diag_add(L->dg, DIAG_ERROR, row->loc, "'%s' is not a stage of plan %s", row->name, p->name);
      const char *best = diag_closest(row->name, L->pr->stage_names, L->nstages);
      if (best) diag_hint(g, L->dg, "did you mean '%s'?", best);
      else diag_hint(g, L->dg, "the rows of a schedule grid are the plan's stages (`stage s0 = ...`)");
      ok = false;
      continue;
    }
    if (rowseen[st]) {
      diag_add(L->dg, DIAG_ERROR, row->loc, "stage %s has two rows", row->name);
      ok = false;
      continue;
    }
    rowseen[st] = true;
    char *fseen = arena_alloc(L->a, (size_t)L->nmb + 1);
    char *bseen = arena_alloc(L->a, (size_t)L->nmb + 1);
    for (int k = 0; k < row->list.n; k++) {
      const ast *cell = row->list.items[k];
      const char *t = cell->name ? cell->name : cell->text;
      if (!t || strcmp(t, ".") == 0) { blist_add(L->a, &rows[st], -1, -1, '.'); continue; }
      char kind = t[0];
      if (strchr(t, '.')) {
        diag_add(L->dg, DIAG_ERROR, cell->loc, "cell '%s': a chunk number is for rows of devices; this row is stage %s", t,
                   row->name);
        ok = false;
        continue;
      }
      long long mb = strtoll(t + 1, NULL, 10);
      if (kind != 'f' && kind != 'b') {
        weft_diag *g = diag_add(L->dg, DIAG_ERROR, cell->loc, "cell '%s': %s cells are not supported", t,
                                  kind == 'w' ? "weight-gradient (w)" : "recomputation (r)");
        diag_hint(g, L->dg, kind == 'w' ? "a b cell computes the gradients of activations and weights"
                                               : "recomputation runs before the b cell of a recomputed operator");
        ok = false;
        continue;
      }
      if (mb >= L->nmb) {
        weft_diag *g = diag_add(L->dg, DIAG_ERROR, cell->loc, "cell '%s': micro-batch %lld does not exist", t, mb);
        diag_hint(g, L->dg, "the plan has %d micro-batch%s (0 to %d)", L->nmb, L->nmb == 1 ? "" : "es",
                  L->nmb - 1);
        ok = false;
        continue;
      }
      char *seen = kind == 'f' ? fseen : bseen;
      if (seen[mb]) {
        diag_add(L->dg, DIAG_ERROR, cell->loc, "cell '%s' appears twice in the row of stage %s", t, row->name);
        ok = false;
        continue;
      }
      if (kind == 'b' && !fseen[mb]) {
        weft_diag *g = diag_add(L->dg, DIAG_ERROR, cell->loc, "b%lld comes before f%lld in the row of stage %s", mb, mb, row->name);
        diag_hint(g, L->dg, "the backward of a micro-batch needs its forward");
        ok = false;
        continue;
      }
      seen[mb] = 1;
      blist_add(L->a, &rows[st], st, (int)mb, kind);
    }
    for (int m = 0; m < L->nmb && ok; m++)
      if (!fseen[m] || !bseen[m]) {
        weft_diag *g = diag_add(L->dg, DIAG_ERROR, row->loc, "the row of stage %s has no %c%d", row->name, fseen[m] ? 'b' : 'f', m);
        diag_hint(g, L->dg, "every row runs f and b of every micro-batch once (%d micro-batches)", L->nmb);
        ok = false;
      }
  }
  for (int st = 0; st < L->nstages && ok; st++)
    if (!rowseen[st]) {
      weft_diag *g = diag_add(L->dg, DIAG_ERROR, s->loc, "the schedule has no row for stage %s", L->pr->stage_names[st]);
      diag_hint(g, L->dg, "add a row: %s: f0 ... b0 ...", L->pr->stage_names[st]);
      ok = false;
    }
  return ok;
}

/* The grid of a schedule: each rank's blocks in its order, placed at the
 * first unit time slot where what they depend on is done (a forward after
 * the previous stage's forward of the micro-batch, a backward after the next
 * stage's backward), as a picture of the pipeline. */
static void make_cells(lstate *L, const pipeline *pl, blist *seq, int nseq) {
  weft_program *pr = L->pr;
  int S = L->nstages, M = L->nmb;
  size_t cells = (size_t)S * (size_t)M + 1;
  int *fend = arena_alloc(L->a, sizeof(int) * cells);
  int *bend = arena_alloc(L->a, sizeof(int) * cells);
  for (int i = 0; i < S * M; i++) fend[i] = bend[i] = -1;
  int *next = arena_alloc(L->a, sizeof(int) * (size_t)nseq);
  int *free_at = arena_alloc(L->a, sizeof(int) * (size_t)nseq);
  int left = 0;
  for (int r = 0; r < nseq; r++) left += seq[r].n;
  while (left > 0) {
    bool progressed = false;
    for (int r = 0; r < nseq; r++) {
      if (next[r] >= seq[r].n) continue;
      block b = seq[r].v[next[r]];
      int ready = free_at[r];
      bool ok = true;
      if (b.kind == 'f' && b.stage > 0) {
        int e = fend[(b.stage - 1) * M + b.mb];
        if (e < 0) ok = false; else if (e > ready) ready = e;
      }
      if (b.kind == 'b') {
        int e = fend[b.stage * M + b.mb];
        if (e < 0) ok = false; else if (e > ready) ready = e;
        if (b.stage + 1 < S) {
          e = bend[(b.stage + 1) * M + b.mb];
          if (e < 0) ok = false; else if (e > ready) ready = e;
        }
      }
      if (!ok) continue;
      arena_grow(L->a, (void **)&pr->cells, &pr->ccap, pr->ncells + 1, sizeof(lcell));
      pr->cells[pr->ncells++] = (lcell){b.stage, b.mb, ready, b.kind};
      (b.kind == 'f' ? fend : bend)[b.stage * M + b.mb] = ready + 1;
      free_at[r] = ready + 1;
      if (ready + 1 > pr->nslots) pr->nslots = ready + 1;
      next[r]++;
      left--;
      progressed = true;
    }
    if (!progressed) {
      /* an order no time line fits (a hand-written grid): place the rest
       * one after another; the check of the programs reports it */
      for (int r = 0; r < nseq; r++)
        for (; next[r] < seq[r].n; next[r]++, left--) {
          block b = seq[r].v[next[r]];
          arena_grow(L->a, (void **)&pr->cells, &pr->ccap, pr->ncells + 1, sizeof(lcell));
          pr->cells[pr->ncells++] = (lcell){b.stage, b.mb, free_at[r]++, b.kind};
          if (free_at[r] > pr->nslots) pr->nslots = free_at[r];
        }
    }
  }
  (void)pl;
}

/* The interlaced pipeline (SuperScaler, Lin et al. 2023): stages of devices
 * of their own (narrow) run 1F1B, and stages on every device of the
 * pipeline (wide: a shared embedding split over all of them) are
 * interleaved with them. Wide stages declared before the first narrow one
 * run their forwards first, one micro-batch per time slot, and their
 * backward of a micro-batch once every narrow stage has run its backward
 * of it; those declared after the last narrow one run as one more
 * position of the 1F1B pipeline, after the last narrow stage. Gives each
 * stage's row of cells in time order, as a grid does. */
static bool interlaced_rows(lstate *L, const ivec *devs, blist *rows) {
  weft_plan *p = L->p;
  int S = L->nstages, M = L->nmb;
  bool *wide = arena_alloc(L->a, (size_t)S);
  bool *used = arena_alloc(L->a, (size_t)p->ndevices + 1);
  int nnarrow = 0, first = -1, last = -1, all = 0;
  /* narrow stages: those that hold no other stage's devices and more */
  for (int st = 0; st < S; st++) {
    for (int o = 0; o < S && !wide[st]; o++) {
      if (o == st || devs[o].n >= devs[st].n) continue;
      bool inside = true;
      for (int i = 0; i < devs[o].n && inside; i++) {
        bool has = false;
        for (int j = 0; j < devs[st].n && !has; j++) has = devs[st].v[j] == devs[o].v[i];
        inside = has;
      }
      wide[st] = inside;
    }
    if (wide[st]) continue;
    for (int i = 0; i < devs[st].n; i++) {
      if (used[devs[st].v[i]]) {
        weft_diag *g = diag_add(L->dg, DIAG_ERROR, p->sched_loc, "an interlaced schedule runs one pipeline stage per device "
                                                    "group, but stage %s shares device %d with an earlier stage",
                                  L->pr->stage_names[st], devs[st].v[i]);
        diag_hint(g, L->dg, "place the stages on devices of their own, and the stages split over all of them on every one");
        return false;
      }
      used[devs[st].v[i]] = true;
      all++;
    }
    if (first < 0) first = st;
    last = st;
    nnarrow++;
  }
  for (int st = 0; st < S; st++) {
    if (!wide[st]) continue;
    bool every = devs[st].n == all;
    for (int i = 0; i < devs[st].n && every; i++) every = used[devs[st].v[i]];
    if (!every) {
      weft_diag *g = diag_add(L->dg, DIAG_ERROR, p->sched_loc, "stage %s runs on devices of other stages but not on every "
                                                    "device of the pipeline", L->pr->stage_names[st]);
      diag_hint(g, L->dg, "an interlaced schedule takes stages of their own devices, and stages on all of those devices");
      return false;
    }
    if (st > first && st < last) {
      weft_diag *g = diag_add(L->dg, DIAG_ERROR, p->sched_loc, "stage %s runs on every device of the pipeline but comes "
                                                    "between its stages %s and %s",
                                L->pr->stage_names[st], L->pr->stage_names[first], L->pr->stage_names[last]);
      diag_hint(g, L->dg, "declare the stages on every device before the pipeline's first stage or after its last");
      return false;
    }
  }
  /* 1F1B over the narrow stages, plus one position for the wide stages
   * after them; cells placed at the first slot their inputs allow */
  int P = nnarrow + (last < S - 1 ? 1 : 0);
  int *pos_stage = arena_alloc(L->a, sizeof(int) * (size_t)(P + 1));
  int np = 0;
  for (int st = 0; st < S; st++)
    if (!wide[st]) pos_stage[np++] = st;
  size_t cells = (size_t)(P + 1) * (size_t)M + 1;
  int *fend = arena_alloc(L->a, sizeof(int) * cells), *bend = arena_alloc(L->a, sizeof(int) * cells);
  for (size_t i = 0; i < cells; i++) fend[i] = bend[i] = -1;
  blist *seq = arena_alloc(L->a, sizeof(blist) * (size_t)P);
  for (int r = 0; r < P; r++) {
    int warm = P - r - 1 < M ? P - r - 1 : M, nf = 0, nb = 0;
    for (; nf < warm; nf++) blist_add(L->a, &seq[r], r, nf, 'f');
    while (nf < M) {
      blist_add(L->a, &seq[r], r, nf++, 'f');
      blist_add(L->a, &seq[r], r, nb++, 'b');
    }
    for (; nb < M; nb++) blist_add(L->a, &seq[r], r, nb, 'b');
  }
  /* slot[r][t]: the cell of position r at time t */
  int cap = 4 * (P + 1) * (M + 1) + 2 * M;
  block *slot = arena_alloc(L->a, sizeof(block) * (size_t)(P + 1) * (size_t)cap);
  for (int i = 0; i < (P + 1) * cap; i++) slot[i] = (block){-1, -1, '.'};
  int *next = arena_alloc(L->a, sizeof(int) * (size_t)P), *free_at = arena_alloc(L->a, sizeof(int) * (size_t)P);
  int left = 2 * M * P, horizon = 0;
  while (left > 0) {
    for (int r = 0; r < P; r++) {
      if (next[r] >= seq[r].n) continue;
      block b = seq[r].v[next[r]];
      int ready = free_at[r];
      bool ok = true;
      if (b.kind == 'f' && r > 0) {
        int e = fend[(r - 1) * M + b.mb];
        if (e < 0) ok = false; else if (e > ready) ready = e;
      }
      if (b.kind == 'b') {
        int e = fend[r * M + b.mb];
        if (e < 0) ok = false; else if (e > ready) ready = e;
        if (r + 1 < P) {
          e = bend[(r + 1) * M + b.mb];
          if (e < 0) ok = false; else if (e > ready) ready = e;
        }
      }
      if (!ok) continue;
      slot[r * cap + ready] = (block){r, b.mb, b.kind};
      (b.kind == 'f' ? fend : bend)[r * M + b.mb] = ready + 1;
      free_at[r] = ready + 1;
      if (ready + 1 > horizon) horizon = ready + 1;
      next[r]++;
      left--;
    }
  }
  /* the wide stages before the pipeline: forwards first, each backward
   * after every position's backward of its micro-batch */
  block *pre = slot + P * cap;
  for (int m = 0; m < M; m++) pre[m] = (block){P, m, 'f'};
  for (int m = 0; m < M; m++) {
    int t = M;
    for (int r = 0; r < P; r++)
      if (bend[r * M + m] > t) t = bend[r * M + m];
    while (t < cap && pre[t].kind != '.') t++;
    pre[t] = (block){P, m, 'b'};
    if (t + 1 > horizon) horizon = t + 1;
  }
  for (int st = 0; st < S; st++) {
    const block *row = wide[st] ? (st < first ? pre : slot + (P - 1) * cap) : NULL;
    if (!row)
      for (int r = 0; r < nnarrow; r++)
        if (pos_stage[r] == st) row = slot + r * cap;
    for (int t = 0; t < horizon; t++) blist_add(L->a, &rows[st], row[t].kind == '.' ? -1 : st, row[t].mb, row[t].kind);
  }
  return true;
}

/* Each device's block order, from the schedule. */
static bool schedule_blocks(lstate *L, blist **per_device) {
  weft_plan *p = L->p;
  ivec *devs = arena_alloc(L->a, sizeof(ivec) * (size_t)L->nstages);
  stage_devices(L, devs);
  pipeline pl = {0};
  blist *seq = NULL;    /* per rank (or per stage for grids) */
  int nseq = 0;
  if (p->sched == SCHED_DEFAULT) {
    /* one rank per distinct device set is not needed: every device runs
     * every stage it holds, all forwards then all backwards */
    pl.nranks = 1;
    pl.chunks = L->nstages;
    pl.rank_of = arena_alloc(L->a, sizeof(int) * (size_t)L->nstages);
    pl.stages = arena_alloc(L->a, sizeof(int *));
    pl.stages[0] = arena_alloc(L->a, sizeof(int) * (size_t)L->nstages);
    for (int st = 0; st < L->nstages; st++) pl.stages[0][st] = st;
    seq = arena_alloc(L->a, sizeof(blist));
    nseq = 1;
    all_forward_then_backward(L, pl.stages[0], L->nstages, &seq[0]);
  } else if (p->sched == SCHED_GRID || p->sched == SCHED_INTERLACED) {
    seq = arena_alloc(L->a, sizeof(blist) * (size_t)L->nstages);
    nseq = L->nstages;
    if (!(p->sched == SCHED_GRID ? read_grid(L, seq) : interlaced_rows(L, devs, seq))) return false;
  } else {
    if (!make_pipeline(L, devs, &pl)) return false;
    if (p->sched == SCHED_INTERLEAVED && pl.chunks < 2) {
      weft_diag *g = diag_add(L->dg, DIAG_ERROR, p->sched_loc, "an interleaved schedule needs several stages per device; "
                                                    "each device here runs one");
      diag_hint(g, L->dg, "place stages i and i + pp on the same devices, or use one_f_one_b");
      return false;
    }
    if (pl.chunks > 1 && p->sched != SCHED_GPIPE && L->nmb % pl.nranks != 0) {
      weft_diag *g = diag_add(L->dg, DIAG_ERROR, p->sched_loc, "an interleaved schedule needs the micro-batches (%d) to be a "
                                                    "multiple of the pipeline's %d ranks",
                                L->nmb, pl.nranks);
      diag_hint(g, L->dg, "change the number of micro-batches or of stages");
      return false;
    }
    seq = arena_alloc(L->a, sizeof(blist) * (size_t)pl.nranks);
    nseq = pl.nranks;
    for (int r = 0; r < pl.nranks; r++) {
      if (p->sched == SCHED_GPIPE) all_forward_then_backward(L, pl.stages[r], pl.chunks, &seq[r]);
      else one_f_one_b(L, &pl, r, &seq[r]);
    }
  }
  /* per device: the blocks of the stages it holds, in the order of its
   * rank's sequence; for grids, rows merged by time slot */
  bool **holds = arena_alloc(L->a, sizeof(bool *) * (size_t)L->nstages);
  for (int st = 0; st < L->nstages; st++) {
    holds[st] = arena_alloc(L->a, (size_t)p->ndevices);
    for (int i = 0; i < devs[st].n; i++) holds[st][devs[st].v[i]] = true;
  }
  *per_device = arena_alloc(L->a, sizeof(blist) * (size_t)p->ndevices);
  if (p->sched == SCHED_GRID || p->sched == SCHED_INTERLACED) {
    int maxlen = 0;
    for (int st = 0; st < L->nstages; st++)
      if (seq[st].n > maxlen) maxlen = seq[st].n;
    for (int d = 0; d < p->ndevices; d++)
      for (int t = 0; t < maxlen; t++)
        for (int st = 0; st < L->nstages; st++)
          if (holds[st][d] && t < seq[st].n && seq[st].v[t].kind != '.')
            blist_add(L->a, &(*per_device)[d], st, seq[st].v[t].mb, seq[st].v[t].kind);
    /* the grid as written */
    for (int st = 0; st < L->nstages; st++)
      for (int t = 0; t < seq[st].n; t++) {
        if (seq[st].v[t].kind == '.') continue;
        arena_grow(L->a, (void **)&L->pr->cells, &L->pr->ccap, L->pr->ncells + 1, sizeof(lcell));
        L->pr->cells[L->pr->ncells++] = (lcell){st, seq[st].v[t].mb, t, seq[st].v[t].kind};
        if (t + 1 > L->pr->nslots) L->pr->nslots = t + 1;
      }
  } else {
    for (int r = 0; r < nseq; r++)
      for (int k = 0; k < seq[r].n; k++) {
        block b = seq[r].v[k];
        for (int i = 0; i < devs[b.stage].n; i++) blist_add(L->a, &(*per_device)[devs[b.stage].v[i]], b.stage, b.mb, b.kind);
      }
    if (p->sched == SCHED_DEFAULT) {
      /* the picture: stages one after another for each micro-batch */
      blist *rows = arena_alloc(L->a, sizeof(blist) * (size_t)L->nstages);
      for (int st = 0; st < L->nstages; st++) {
        for (int m = 0; m < L->nmb; m++) blist_add(L->a, &rows[st], st, m, 'f');
        for (int m = 0; m < L->nmb; m++) blist_add(L->a, &rows[st], st, m, 'b');
      }
      make_cells(L, &pl, rows, L->nstages);
    } else {
      make_cells(L, &pl, seq, nseq);
    }
  }
  return true;
}

/* ---- tasks of each device ------------------------------------------------------ */

static bool op_reads_param(const weft_graph *g, int op) {
  for (int k = 0; k < g->ops[op].ninputs; k++)
    if (g->tensors[g->ops[op].inputs[k]].role == TENSOR_PARAM) return true;
  return false;
}

/* Co-shard: a recomputed segment, consecutive in the block (`ops`), whose
 * last operators (positions at..at+len of `ops`) each have k > 1
 * sub-operators on device d for micro-batch mb, and whose others have at
 * most one there, where sub-operator j of each of the last reads of the
 * others of them only what their sub-operator j writes (parts of a split,
 * never partial sums), runs these as k chains: chain j is sub j of every
 * one of them, forward, and in the backward its recomputation right before
 * its backward, so that one chain's activations are live at a time. *pre
 * is the position of the segment's first operator. Returns k, or 0 when
 * the segment does not run so. */
static const tregion *sub_region(lstate *L, int sub, int k);

static int coshard_chains(lstate *L, int d, int mb, const ivec *seg, int stage, const ivec *ops, int *pre, int *at,
                          int *len) {
  weft_plan *p = L->p;
  const weft_graph *g = p->g;
  int k = 0, n = 0, first = -1, cnt = 0;
  if (seg->n == 0) return 0;
  {
    int lo, hi;   /* the usual case at once: the last operator is one part here */
    subs_of_mb(L, d, seg->v[seg->n - 1], mb, &lo, &hi);
    if (hi - lo < 2) return 0;
  }
  for (int q = 0; q < seg->n; q++) {
    int op = seg->v[q];
    if (L->stage_of[op] != stage) continue;
    int lo, hi;
    subs_of_mb(L, d, op, mb, &lo, &hi);
    int pos = -1;
    for (int i = 0; i < ops->n && pos < 0; i++)
      if (ops->v[i] == op) pos = i;
    if (pos < 0 || (first >= 0 && pos != first + cnt)) return 0;
    if (first < 0) first = pos;
    cnt++;
    if (hi - lo < 2) {
      if (n > 0) return 0;   /* a single part after the chains */
      continue;
    }
    if (k && hi - lo != k) return 0;
    k = hi - lo;
    n++;
  }
  if (n < 1) return 0;
  int start = first + cnt - n;
  for (int q = 0; q < n; q++) {
    int b = ops->v[start + q], blo, bhi;
    subs_of_mb(L, d, b, mb, &blo, &bhi);
    for (int in = 0; in < g->ops[b].ninputs; in++) {
      int a = g->tensors[g->ops[b].inputs[in]].producer;
      int alo, ahi;
      if (a < 0) continue;
      subs_of_mb(L, d, a, mb, &alo, &ahi);
      if (p->ops[a].rseg != p->ops[b].rseg || L->stage_of[a] != stage || ahi - alo != k) continue;
      int na = p->ops[a].space->ninputs;
      for (int j = 0; j < k; j++) {
        const tregion *out = sub_region(L, L->byd[alo + j], na);
        if (!holds_region(out, sub_region(L, L->byd[blo + j], in))) return 0;
        for (int j2 = 0; j2 < k; j2++)
          if (j2 != j && tregion_overlaps(out, sub_region(L, L->byd[alo + j2], na))) return 0;
      }
    }
  }
  *pre = first, *at = start, *len = n;
  return k;
}

static void make_tasks(lstate *L, blist *per_device) {
  weft_plan *p = L->p;
  const weft_graph *g = p->g;
  int nops = g->nops;
  /* per stage, its operators in block order */
  ivec *ops_of = arena_alloc(L->a, sizeof(ivec) * (size_t)L->nstages);
  for (int i = 0; i < nops; i++) vec_push(L->a, &ops_of[L->stage_of[L->order[i]]], L->order[i]);
  /* per segment: its operators in block order, and its last one */
  ivec *seg_ops = arena_alloc(L->a, sizeof(ivec) * (size_t)(p->nsegs ? p->nsegs : 1));
  for (int i = 0; i < nops; i++) {
    int op = L->order[i];
    if (p->ops[op].rseg >= 0) vec_push(L->a, &seg_ops[p->ops[op].rseg], op);
  }
  bool *redone = arena_alloc(L->a, (size_t)(p->nsegs ? p->nsegs : 1));
  int nparams = 0;
  for (int t = 0; t < g->ntensors; t++) nparams += g->tensors[t].role == TENSOR_PARAM;
  for (int d = 0; d < p->ndevices; d++) {
    const blist *bl = &per_device[d];
    if (L->dslot[d] >= 0) {
      /* room for its tasks at once (each forward sub-operator runs at most
       * forward, recomputed and backward; a step per parameter): the list
       * is not copied as it grows */
      size_t k = (size_t)L->dslot[d] * (size_t)nops;
      int64_t room = 3 * (int64_t)(L->byd_start[k + (size_t)nops] - L->byd_start[k]) + nparams;
      if (room < INT32_MAX / 2) vec_reserve(&L->tmp, &L->tasks[d], (int)room);
    }
    for (int k = 0; k < bl->n; k++) {
      block b = bl->v[k];
      const ivec *ops = &ops_of[b.stage];
      if (b.kind == 'f') {
        for (int i = 0; i < ops->n; i++) {
          int seg = p->ops[ops->v[i]].rseg, pre, at, n, k;
          if (seg >= 0 && (k = coshard_chains(L, d, b.mb, &seg_ops[seg], b.stage, ops, &pre, &at, &n)) > 0 && at == i) {
            /* the segment's operators in this stage, chain by chain */
            for (int j = 0; j < k; j++)
              for (int q = 0; q < n; q++) {
                int lo, hi;
                subs_of_mb(L, d, ops->v[i + q], b.mb, &lo, &hi);
                task_add(L, d, T_FWD, L->byd[lo + j]);
              }
            i += n - 1;
            continue;
          }
          int lo, hi;
          subs_of_mb(L, d, ops->v[i], b.mb, &lo, &hi);
          for (int j = lo; j < hi; j++) task_add(L, d, T_FWD, L->byd[j]);
        }
        continue;
      }
      memset(redone, 0, (size_t)(p->nsegs ? p->nsegs : 1));
      for (int i = ops->n - 1; i >= 0; i--) {
        int op = ops->v[i];
        int seg = p->ops[op].rseg, pre, at, n, k;
        if (seg >= 0 && !redone[seg] && (k = coshard_chains(L, d, b.mb, &seg_ops[seg], b.stage, ops, &pre, &at, &n)) > 0 &&
            at + n - 1 == i) {
          /* co-shard: the segment's single parts recomputed, then each
           * chain recomputed and its backward */
          redone[seg] = true;
          for (int q = pre; q < at; q++) {
            int lo, hi;
            subs_of_mb(L, d, ops->v[q], b.mb, &lo, &hi);
            for (int j = lo; j < hi; j++) task_add(L, d, T_RECOMP, L->byd[j]);
          }
          for (int j = 0; j < k; j++) {
            for (int q = 0; q < n; q++) {
              int lo, hi;
              subs_of_mb(L, d, ops->v[at + q], b.mb, &lo, &hi);
              task_add(L, d, T_RECOMP, L->byd[lo + j]);
            }
            for (int q = n - 1; q >= 0; q--) {
              int lo, hi;
              subs_of_mb(L, d, ops->v[at + q], b.mb, &lo, &hi);
              task_add(L, d, T_BWD, L->byd[lo + j]);
            }
          }
          i = at;   /* the single parts' backward follows, as usual */
          continue;
        }
        if (seg >= 0 && !redone[seg]) {
          redone[seg] = true;
          for (int q = 0; q < seg_ops[seg].n; q++) {
            int rop = seg_ops[seg].v[q];
            if (L->stage_of[rop] != b.stage) continue;
            int lo, hi;
            subs_of_mb(L, d, rop, b.mb, &lo, &hi);
            for (int j = lo; j < hi; j++) task_add(L, d, T_RECOMP, L->byd[j]);
          }
        }
        int lo, hi;
        subs_of_mb(L, d, op, b.mb, &lo, &hi);
        for (int j = lo; j < hi; j++) task_add(L, d, T_BWD, L->byd[j]);
      }
    }
    /* optimizer steps: the parameters the device reads, in tensor order */
    if (g->loss < 0) continue;
    bool any = false;
    for (int op = 0; op < nops && !any; op++) {
      int lo, hi;
      subs_on(L, d, op, &lo, &hi);
      any = hi > lo && op_reads_param(g, op);
    }
    if (!any) continue;
    for (int t = 0; t < g->ntensors; t++) {
      if (g->tensors[t].role != TENSOR_PARAM) continue;
      bool reads = false;
      for (int q = 0; L->readers[t][q] >= 0 && !reads; q++) {
        int lo, hi;
        subs_on(L, d, L->readers[t][q], &lo, &hi);
        reads = hi > lo;
      }
      if (!reads) continue;
      if (!L->steppos[d]) {
        L->steppos[d] = arena_alloc(&L->tmp, sizeof(int) * (size_t)g->ntensors);
        for (int x = 0; x < g->ntensors; x++) L->steppos[d][x] = -1;
      }
      L->steppos[d][t] = L->tasks[d].n;
      task_add(L, d, T_STEP, t);
    }
  }
}

/* ---- anchoring communication ---------------------------------------------------- */

static void anchor_add(lstate *L, int d, int pos, int comm, int epoch) {
  vec_push(&L->tmp, &L->anch[d], ((anchor){pos, comm, epoch}));
}

static const tregion *member_part(const pcomm *cm, int i) { return cm->parts ? &cm->parts[i] : &cm->region; }

/* The latest task on device d among the subs of op whose region of tmap m
 * overlaps r, of the given kind; -1 if none. `latest` false: the earliest. */
static int find_task(lstate *L, int d, int op, const tmap *m, const tregion *r, int mb, task_kind kind, bool latest) {
  weft_plan *p = L->p;
  int lo, hi, best = -1;
  /* a region that moves with micro-batches meets only its own micro-batch's */
  if (mb >= 0) subs_of_mb(L, d, op, mb, &lo, &hi);
  else subs_on(L, d, op, &lo, &hi);
  const int *pos = kind == T_FWD ? L->fpos : kind == T_BWD ? L->bpos : L->rpos;
  for (int j = lo; j < hi; j++) {
    int s = L->byd[j];
    if (pos[s] < 0) continue;
    if (best >= 0 && (latest ? pos[s] <= best : pos[s] >= best)) continue;
    const opspace *sp = p->ops[op].space;
    const tregion *x = sub_region(L, s, m == &sp->output ? sp->ninputs : (int)(m - sp->inputs));
    if (!tregion_overlaps(x, r)) continue;
    best = pos[s];
  }
  return best;
}

static const tmap *input_map(const popplan *pp, int tensor, int k) {
  if (k >= 0) return &pp->space->inputs[k];
  for (int i = 0; i < pp->space->ninputs; i++)
    if (pp->space->inputs[i].tensor == tensor) return &pp->space->inputs[i];
  return NULL;
}

static int max_i(int a, int b) { return a > b ? a : b; }
static int min_pos(int a, int b) { return a < 0 ? b : b < 0 ? a : (a < b ? a : b); }

/* Producing and consuming tasks of comm cm (epoch e) on member device d and
 * its part r: the anchor position, or -1 when the device does neither. */
static int anchor_of(lstate *L, const pcomm *cm, int e, int d, const tregion *r, bool as_sender, bool as_receiver) {
  weft_plan *p = L->p;
  const weft_graph *g = p->g;
  int prod = -1, cons = -1;
  int t = cm->tensor;
  task_kind fk = e ? T_RECOMP : T_FWD;
  switch (cm->phase) {
  case PHASE_FORWARD: {
    int pop = g->tensors[t].producer;
    if (as_sender && pop >= 0) prod = find_task(L, d, pop, &p->ops[pop].space->output, r, cm->mb, fk, true);
    if (as_receiver && cm->consumer_op >= 0) {
      const tmap *m = input_map(&p->ops[cm->consumer_op], t, cm->input);
      if (m) cons = find_task(L, d, cm->consumer_op, m, r, cm->mb, fk, false);
    }
    break;
  }
  case PHASE_BACKWARD: {
    if (as_sender)
      for (int q = 0; L->readers[t][q] >= 0; q++) {
        int op = L->readers[t][q];
        const tmap *m = input_map(&p->ops[op], t, -1);
        prod = max_i(prod, find_task(L, d, op, m, r, cm->mb, T_BWD, true));
      }
    int pop = g->tensors[t].producer;
    if (as_receiver && pop >= 0) cons = find_task(L, d, pop, &p->ops[pop].space->output, r, cm->mb, T_BWD, false);
    break;
  }
  case PHASE_WEIGHTS:
    /* right before the optimizer step: reduced as soon as the last local
     * contribution is made, a gradient shared by the first and last
     * pipeline stages (tied embeddings) would make the last stage wait for
     * the first while the first waits for the last stage's backward */
    if (L->steppos[d]) return 2 * L->steppos[d][t];
    if (as_sender)
      for (int q = 0; L->readers[t][q] >= 0; q++) {
        int op = L->readers[t][q];
        const tmap *m = input_map(&p->ops[op], t, -1);
        prod = max_i(prod, find_task(L, d, op, m, r, cm->mb, T_BWD, true));
      }
    break;
  case PHASE_PARAMS:
    if (cm->dir == DIR_OPTIMIZER) {
      if (L->steppos[d]) prod = L->steppos[d][t];
    } else if (cm->consumer_op >= 0) {
      const tmap *m = input_map(&p->ops[cm->consumer_op], t, cm->input);
      if (m && cm->dir == DIR_FORWARD) cons = find_task(L, d, cm->consumer_op, m, r, cm->mb, T_FWD, false);
      if (m && cm->dir == DIR_BACKWARD)
        cons = min_pos(find_task(L, d, cm->consumer_op, m, r, cm->mb, T_RECOMP, false),
                       find_task(L, d, cm->consumer_op, m, r, cm->mb, T_BWD, false));
    }
    break;
  default: break;
  }
  if (prod >= 0) return 2 * prod + 1;
  if (cons >= 0) return 2 * cons;
  return -1;
}

/* Whether device d has a program of its own (else its replica's, renamed). */
static bool represents(const weft_plan *p, int d) { return !p->rep || p->rep[d] == d; }

static bool comm_repeats(const weft_plan *p, const pcomm *cm) {
  if (cm->phase != PHASE_FORWARD || cm->consumer_op < 0) return false;
  int pop = p->g->tensors[cm->tensor].producer;
  if (pop < 0) return false;
  int seg = p->ops[cm->consumer_op].rseg;
  return seg >= 0 && p->ops[pop].rseg == seg;
}

static void anchor_comms(lstate *L) {
  weft_plan *p = L->p;
  for (int ci = 0; ci < p->ncomms; ci++) {
    const pcomm *cm = &p->comms[ci];
    if (cm->stats) continue;  /* emitted inside the compute (emit_compute) */
    int epochs = comm_repeats(p, cm) ? 2 : 1;
    for (int e = 0; e < epochs; e++) {
      arena_reset(&L->scratch);
      if (cm->kind == COMM_SEND) {
        int ps = anchor_of(L, cm, e, cm->src, &cm->region, true, false);
        int pd = anchor_of(L, cm, e, cm->dst, &cm->region, false, true);
        if (e == 1 && (ps < 0 || pd < 0)) continue;
        anchor_add(L, cm->src, ps >= 0 ? ps : 2 * L->tasks[cm->src].n, ci, e);
        anchor_add(L, cm->dst, pd >= 0 ? pd : 2 * L->tasks[cm->dst].n, ci, e);
        continue;
      }
      int *pos = arena_alloc(&L->scratch, sizeof(int) * (size_t)cm->ngroup);
      bool any = false;
      for (int i = 0; i < cm->ngroup; i++) {
        int d = cm->group[i];
        pos[i] = -1;
        if (!represents(p, d)) continue;
        /* a gather's member holds its part and needs the whole (a ZeRO
         * member whose part is empty only needs it) */
        const tregion *r = cm->kind == COMM_ALL_GATHER ? member_part(cm, i)
                           : cm->kind == COMM_ALL_TO_ALL ? &cm->sources[i]
                                                         : &cm->region;
        if (cm->kind == COMM_ALL_GATHER && tregion_numel(r) == 0) r = &cm->region;
        pos[i] = anchor_of(L, cm, e, d, r, true, true);
        if (pos[i] >= 0) any = true;
      }
      if (e == 1 && !any) continue;
      for (int i = 0; i < cm->ngroup; i++) {
        int d = cm->group[i];
        if (represents(p, d)) anchor_add(L, d, pos[i] >= 0 ? pos[i] : 2 * L->tasks[d].n, ci, e);
      }
    }
  }
  for (int d = 0; d < p->ndevices; d++) {
    anchors *an = &L->anch[d];
    /* insertion sort is too slow for long programs: a merge sort by (pos, comm, epoch) */
    if (an->n < 2) continue;
    anchor *tmp = malloc(sizeof(anchor) * (size_t)an->n);
    if (!tmp) weft_oom();
    for (int w = 1; w < an->n; w *= 2)
      for (int lo = 0; lo < an->n; lo += 2 * w) {
        int mid = lo + w < an->n ? lo + w : an->n, hi = lo + 2 * w < an->n ? lo + 2 * w : an->n;
        int i = lo, j = mid, k = lo;
        while (i < mid || j < hi) {
          bool left = j >= hi || (i < mid && (an->v[i].pos < an->v[j].pos ||
                                              (an->v[i].pos == an->v[j].pos &&
                                               (an->v[i].epoch < an->v[j].epoch ||
                                                (an->v[i].epoch == an->v[j].epoch && an->v[i].comm <= an->v[j].comm)))));
          tmp[k++] = left ? an->v[i++] : an->v[j++];
        }
        memcpy(an->v + lo, tmp + lo, sizeof(anchor) * (size_t)(hi - lo));
      }
    free(tmp);
  }
}

/* ---- emission -------------------------------------------------------------------- */

/* What a device holds: buffers by tensor, newest first. */
typedef struct held {
  int buf;
  bool grad;              /* a gradient (of a parameter or an activation) */
  bool partial;           /* partial sums, not yet reduced */
  bool live;
  int maker;              /* the compute that wrote it: op * 4 + kind, with its micro-batch */
  int maker_mb;
  int next;               /* next held of the same tensor, -1 */
  const dregion *dims;    /* its buffer's region's: a lookup of the same
                           * (shared) region matches without reading the buffer */
} held;

typedef struct store {
  VEC(held) h;            /* on the heap; h, slabs and shead keep their memory from device to device */
  int *head;              /* per tensor */
  /* tensors that move with micro-batches (plan.h, pfold): one list per
   * (tensor, micro-batch slab), so that looking up one micro-batch's
   * buffers does not pass every other's */
  htab slabs;             /* by tensor << 32 | slab, a key that is its own hash */
  VEC(int) shead;         /* per entry of slabs: its list head */
  int *grid;              /* when (micro-batches x tensors) is not too many:
                           * the list heads at [slab * ntensors + tensor],
                           * INT32_MIN where never used; else slabs */
  int *gused;             /* the entries of grid in use */
  int gn;
  int last;               /* the entry of slabs found last (lookups come in
                           * runs), -1: none */
  uint64_t lastkey;       /* ... its key, and the region and tensor it was for */
  const dregion *lastdims;
  int lastt;
} store;

typedef struct emitter {
  lstate *L;
  int d;
  lprog *prog;
  store st;
} emitter;

static int new_buf(emitter *E, int tensor, lbuf_role role, const tregion *r, bool persistent) {
  weft_program *pr = E->L->pr;
  const gtensor *t = &E->L->p->g->tensors[tensor];
  arena_grow(E->L->a, (void **)&pr->bufs, &pr->bcap, pr->nbufs + 1, sizeof(lbuf));
  lbuf *b = &pr->bufs[pr->nbufs];
  b->device = E->d;
  b->tensor = tensor;
  b->role = role;
  b->region = *r;         /* lives as long as the program: see ref_region */
  b->dtype = role == LB_STATE || role == LB_MASTER ? DT_F32
             : role == LB_GRAD ? graph_grad_dtype(E->L->p->g, tensor) : t->dtype;
  b->copies = 1;
  b->persistent = persistent;
  b->stats = false;
  b->bytes = tregion_numel(r) * dtype_bytes[b->dtype];
  return pr->nbufs++;
}

/* The micro-batch slab of region r of tensor t, -1 for a tensor that does
 * not move with micro-batches: the held buffers of (t, slab) are listed
 * together. */
static int slab_of(const lstate *L, int t, const tregion *r) {
  const weft_plan *p = L->p;
  int d = p->fold.mbs ? p->fold.tdim[t] : -1;
  if (d < 0 || d >= r->ndims || r->dims[d].n == 0) return -1;
  int64_t lo = r->dims[d].iv[0].lo;
  int sh = L->tshift[t];    /* a step of 2^sh (often 1): no division */
  return (int)(sh >= 0 ? lo >> sh : lo / p->fold.tstep[t]);
}

/* The head of the list of held buffers of tensor t that may hold r. */
static int *chain(emitter *E, int t, const tregion *r) {
  lstate *L = E->L;
  store *st = &E->st;
  int slab;
  size_t at = (size_t)((uintptr_t)r - (uintptr_t)L->sreg_v) / sizeof(tregion);
  if ((uintptr_t)r >= (uintptr_t)L->sreg_v && at < L->nsreg && &L->sreg_v[at] == r) {
    /* a sub-operator's region: its slab was found with it (sub_regions) */
    slab = L->sreg_slab[at];
  } else {
    /* regions are shared (a sub-operator's, a buffer's): the same dims,
     * the same slab, without reading them */
    if (st->last >= 0 && r->dims == st->lastdims && t == st->lastt) return &st->shead.v[st->last];
    slab = slab_of(L, t, r);
  }
  if (slab < 0) return &st->head[t];
  if (st->grid && slab < L->p->fold.mbs) {
    int64_t i = (int64_t)slab * L->p->g->ntensors + t;
    if (st->grid[i] == INT32_MIN) {
      st->grid[i] = -1;
      st->gused[st->gn++] = (int)i;
    }
    return &st->grid[i];
  }
  uint64_t key = ((uint64_t)(uint32_t)t << 32) | (uint64_t)(uint32_t)slab;
  int e = st->last >= 0 && st->lastkey == key ? st->last : htab_find(&st->slabs, key, NULL, NULL);
  if (e < 0) {
    e = htab_add(&st->slabs, key);
    vec_push(NULL, &st->shead, -1);
  }
  st->last = e;
  st->lastkey = key;
  st->lastdims = r->dims;
  st->lastt = t;
  return &st->shead.v[e];
}

static void hold(emitter *E, int buf, bool grad, bool partial) {
  store *st = &E->st;
  int t = E->L->pr->bufs[buf].tensor;
  int *head = chain(E, t, &E->L->pr->bufs[buf].region);
  held x = {buf, grad, partial, true, -1, -1, *head, E->L->pr->bufs[buf].region.dims};
  *head = st->h.n;
  vec_push(NULL, &st->h, x);
}

/* The newest live buffer of tensor t (value or gradient) whose region
 * contains r; -1 if none. `partial`: 0 complete only, 1 partial only. */
static int find_held(emitter *E, int t, bool grad, const tregion *r, int partial, int *hidx) {
  const store *st = &E->st;
  for (int i = *chain(E, t, r); i >= 0; i = st->h.v[i].next) {
    const held *h = &st->h.v[i];
    if (!h->live || h->grad != grad) continue;
    if (partial >= 0 && h->partial != (partial == 1)) continue;
    if (h->dims != r->dims && !holds_region(&E->L->pr->bufs[h->buf].region, r)) continue;
    if (hidx) *hidx = i;
    return h->buf;
  }
  return -1;
}

static int new_buf(emitter *E, int tensor, lbuf_role role, const tregion *r, bool persistent);
static lins *emit(emitter *E, lins_kind k);
static int held_buf(emitter *E, int t, lbuf_role role, const tregion *r, bool persistent, bool grad, bool partial);
static lref ref(emitter *E, int buf, const tregion *r);

/* A region held in several pieces on this device (parts of one operator
 * placed together): copied into one buffer. -1 if the pieces do not cover it. */
static int assemble(emitter *E, int t, bool grad, const tregion *r) {
  lstate *L = E->L;
  const store *st = &E->st;
  int n = 0;
  int64_t covered = 0;
  for (int i = *chain(E, t, r); i >= 0; i = st->h.v[i].next) {
    const held *h = &st->h.v[i];
    tregion x;
    if (!h->live || h->grad != grad || h->partial) continue;
    if (tregion_intersect(&L->scratch, &L->pr->bufs[h->buf].region, r, &x)) { covered += tregion_numel(&x); n++; }
  }
  if (n < 2 || covered != tregion_numel(r)) return -1;
  lref *in = arena_alloc(L->ra, sizeof(lref) * (size_t)n);
  int k = 0;
  for (int i = *chain(E, t, r); i >= 0; i = st->h.v[i].next) {
    const held *h = &st->h.v[i];
    tregion x;
    if (!h->live || h->grad != grad || h->partial) continue;
    if (tregion_intersect(L->ra, &L->pr->bufs[h->buf].region, r, &x)) in[k++] = ref(E, h->buf, &x);
  }
  const lbuf *any = &L->pr->bufs[in[0].buf];
  int b = held_buf(E, t, any->role, r, false, grad, false);
  lins *c = emit(E, LI_COPY);
  c->nin = k;
  c->in = in;
  c->nout = 1;
  c->out = arena_alloc(L->ra, sizeof(lref));
  c->out[0] = ref(E, b, r);
  return b;
}

/* Order of the pieces sum_pieces adds: by the device each came from (a
 * received one's sender), then by where its region starts, so that the
 * copies of a replicated producer add the same terms in the same order and
 * stay equal to the bit. */
typedef struct spiece {
  int origin, hidx;
  const tregion *x;
} spiece;

static int spiece_cmp(const spiece *a, const spiece *b) {
  if (a->origin != b->origin) return a->origin < b->origin ? -1 : 1;
  for (int k = 0; k < a->x->ndims && k < b->x->ndims; k++) {
    int64_t la = a->x->dims[k].n ? a->x->dims[k].iv[0].lo : 0, lb = b->x->dims[k].n ? b->x->dims[k].iv[0].lo : 0;
    if (la != lb) return la < lb ? -1 : 1;
  }
  int64_t na = tregion_numel(a->x), nb = tregion_numel(b->x);
  return (na < nb) - (na > nb);
}

/* The gradient of region r of tensor t as the sum of the pieces this
 * device holds of it, which its consumers gave in different layouts
 * (deps.c, grads_sum_pieces): in spiece order, the pieces that tile r are
 * copied into one buffer and the others added to it; the pieces inside r
 * are used up. -1 when there is one piece or none, or the pieces do not
 * cover r. */
static int sum_pieces(emitter *E, int t, const tregion *r) {
  lstate *L = E->L;
  store *st = &E->st;
  int n = 0, nfirst = 0;
  int64_t covered = 0;
  for (int i = *chain(E, t, r); i >= 0; i = st->h.v[i].next) {
    const held *h = &st->h.v[i];
    if (h->live && h->grad && !h->partial && tregion_overlaps(&L->pr->bufs[h->buf].region, r)) n++;
  }
  if (n < 2) return -1;
  spiece *sp = arena_alloc(L->ra, sizeof(spiece) * (size_t)n);
  bool *first = arena_alloc(L->ra, (size_t)n);
  n = 0;
  for (int i = *chain(E, t, r); i >= 0; i = st->h.v[i].next) {
    const held *h = &st->h.v[i];
    if (!h->live || !h->grad || h->partial) continue;
    tregion *x = arena_alloc(L->ra, sizeof(tregion));
    if (!tregion_intersect(L->ra, &L->pr->bufs[h->buf].region, r, x)) continue;
    spiece e = {h->maker <= -2 ? -2 - h->maker : E->d, i, x};
    int j = n++;
    for (; j > 0 && spiece_cmp(&e, &sp[j - 1]) < 0; j--) sp[j] = sp[j - 1];
    sp[j] = e;
  }
  for (int j = 0; j < n; j++) {
    /* the first of the pieces that tile r, in order, that meets none before it */
    bool meets = false;
    for (int k = 0; k < j && !meets; k++) meets = first[k] && tregion_overlaps(sp[k].x, sp[j].x);
    first[j] = !meets;
    if (first[j]) covered += tregion_numel(sp[j].x), nfirst++;
  }
  if (covered != tregion_numel(r) || nfirst == n) return -1;
  lref *in = arena_alloc(L->ra, sizeof(lref) * (size_t)n);
  int k = 0;
  for (int j = 0; j < n; j++)
    if (first[j]) in[k++] = ref(E, st->h.v[sp[j].hidx].buf, sp[j].x);
  for (int j = 0; j < n; j++)
    if (!first[j]) in[k++] = ref(E, st->h.v[sp[j].hidx].buf, sp[j].x);
  for (int j = 0; j < n; j++)
    if (holds_region(r, &L->pr->bufs[st->h.v[sp[j].hidx].buf].region)) st->h.v[sp[j].hidx].live = false;
  int b = held_buf(E, t, LB_ACT_GRAD, r, false, true, false);
  lins *c = emit(E, LI_COPY);
  c->nin = nfirst;
  c->in = in;
  c->nout = 1;
  c->out = arena_alloc(L->ra, sizeof(lref));
  c->out[0] = ref(E, b, r);
  c = emit(E, LI_COPY);
  c->accumulate = true;
  c->nin = n - nfirst;
  c->in = in + nfirst;
  c->nout = 1;
  c->out = arena_alloc(L->ra, sizeof(lref));
  c->out[0] = ref(E, b, r);
  return b;
}

/* Live buffers of tensor t with exactly region r stop being found. */
static void supersede(emitter *E, int t, bool grad, const tregion *r) {
  store *st = &E->st;
  for (int i = *chain(E, t, r); i >= 0; i = st->h.v[i].next)
    if (st->h.v[i].live && st->h.v[i].grad == grad && same_region(&E->L->pr->bufs[st->h.v[i].buf].region, r))
      st->h.v[i].live = false;
}

/* Instructions are emitted into one growing vector, reused from device to
 * device; finish_program keeps each program in the arena at its final size. */
static lins *emit(emitter *E, lins_kind k) {
  lprog *pg = E->prog;
  if (pg->n + 1 > pg->cap) {
    vec_grow(NULL, (void **)&pg->ins, &pg->cap, pg->n + 1, sizeof(lins));
    E->L->ebuf = pg->ins;
    E->L->ecap = pg->cap;
  }
  lins *in = &pg->ins[pg->n++];
  memset(in, 0, sizeof *in);
  in->kind = k;
  in->buf = in->sub = in->comm = in->peer = in->tensor = -1;
  return in;
}

static void emit_alloc(emitter *E, int buf) { emit(E, LI_ALLOC)->buf = buf; }

/* A new buffer of tensor t's region r, allocated and held: what most
 * instructions that write something start with. */
static int held_buf(emitter *E, int t, lbuf_role role, const tregion *r, bool persistent, bool grad, bool partial) {
  int b = new_buf(E, t, role, r, persistent);
  emit_alloc(E, b);
  hold(E, b, grad, partial);
  return b;
}

/* A ref's region. Every region the emitter names lives as long as the
 * program: a sub-operator's (sub_region), the plan's communication's, a
 * buffer's, or a copy's pieces (assemble); buffers and refs share it. */
static tregion ref_region(const tregion *r) { return *r; }

static lref ref(emitter *E, int buf, const tregion *r) { (void)E; return (lref){buf, -1, ref_region(r)}; }

static lref aref(emitter *E, int buf, int arg, const tregion *r) { (void)E; return (lref){buf, arg, ref_region(r)}; }

/* Whether sub-operator s applies tensor argument m: under a value split, an
 * argument without the split dimension (a bias) is applied by the first
 * part only. */
static bool applies_arg(const popplan *pp, const psub *s, const tmap *m) {
  for (int i = 0; i < pp->nsplits; i++) {
    if (pp->splits[i].kind != SPLIT_VALUE || s->coord[i] == 0) continue;
    bool has = false;
    for (int d = 0; d < m->ndims && !has; d++)
      for (int f = 0; f < m->nfactors[d]; f++)
        if (m->factors[d][f] == pp->splits[i].idim) has = true;
    if (!has) return false;
  }
  return true;
}

/* The persistent buffer of a parameter (its region or its ZeRO shard). */
static int param_home(emitter *E, int t, const tregion *r) {
  for (int i = E->st.head[t]; i >= 0; i = E->st.h.v[i].next) {
    const held *h = &E->st.h.v[i];
    const lbuf *b = &E->L->pr->bufs[h->buf];
    if (h->live && !h->grad && b->persistent && holds_region(&b->region, r)) return h->buf;
  }
  return -1;
}

static lref *refs(emitter *E, int n) { return arena_alloc(E->L->ra, sizeof(lref) * (size_t)(n ? n : 1)); }

/* A parameter's region on this device: found, or a new persistent buffer
 * (a ZeRO-3 parameter must have been gathered). */
static int param_buf(emitter *E, int t, const tregion *r, bool create) {
  int b = find_held(E, t, false, r, 0, NULL);
  if (b >= 0 || !create) return b;
  b = held_buf(E, t, LB_PARAM, r, true, false, false);
  return b;
}

static void missing(emitter *E, const psub *s, const char *what, int t, bool grad, const tregion *r) {
  lstate *L = E->L;
  if (L->failed) return;
  L->failed = true;
  weft_plan *p = L->p;
  weft_loc at = p->sched == SCHED_GRID ? p->sched_loc : p->ops[s->op].assigned ? p->ops[s->op].assign_loc : p->loc;
  weft_diag *g = diag_add(L->dg, DIAG_ERROR, at, "%s of %s (micro-batch %d) on device %d reads %s%s %s, which no earlier "
                                      "instruction on device %d provides",
                            what, p->g->ops[s->op].name, s->microbatch, E->d, grad ? "the gradient of " : "",
                            p->g->tensors[t].name, tregion_str(&L->scratch, r), E->d);
  diag_hint(g, L->dg, p->sched == SCHED_GRID ? "the schedule grid runs it before what it depends on"
                                                    : "weft lower --grid shows the order; explain shows the communication");
}

/* The key of the region of tmap m of sub-operator s: per dimension, its
 * number of idims, then each one's size and range. Returns its length;
 * -1 when it does not fit in key (then there is no key). */
static int region_key(const weft_plan *p, const psub *s, const tmap *m, int64_t *key, int max) {
  const opspace *sp = p->ops[s->op].space;
  int n = 0;
  for (int d = 0; d < m->ndims; d++) {
    if (n + 1 + 3 * m->nfactors[d] > max) return -1;
    key[n++] = m->nfactors[d];
    for (int i = 0; i < m->nfactors[d]; i++) {
      int f = m->factors[d][i];
      key[n++] = sp->idims[f].size;
      key[n++] = s->range[f].lo;
      key[n++] = s->range[f].hi;
    }
  }
  return n;
}

typedef struct rlookup {
  const rintern *ri;
  const int64_t *key;
  int len;
} rlookup;

static bool same_key(const void *ctx, int e) {
  const rlookup *k = ctx;
  const rkey *x = &k->ri->key.v[e];
  return x->len == k->len && memcmp(k->ri->keys.v + x->off, k->key, sizeof(int64_t) * (size_t)k->len) == 0;
}

/* The region of tmap m of sub-operator s, kept once (tregion_of the first
 * time its key is seen). */
static tregion region_intern(lstate *L, const psub *s, const tmap *m) {
  rintern *ri = &L->regs;
  int64_t key[96];
  int kn = region_key(L->p, s, m, key, 96);
  if (kn < 0) {
    tregion x;
    tregion_of(L->a, L->p, s, m, &x);
    return x;
  }
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < kn; i++) h = (h ^ (uint64_t)key[i]) * 0x100000001b3ull;
  /* the multiplications carry low bits up only: fold the high ones down */
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  rlookup k = {ri, key, kn};
  int e = htab_find(&ri->index, h, same_key, &k);
  if (e >= 0) return ri->v.v[e];
  vec_reserve(NULL, &ri->keys, ri->keys.n + kn);
  memcpy(ri->keys.v + ri->keys.n, key, sizeof(int64_t) * (size_t)kn);
  vec_push(NULL, &ri->key, ((rkey){ri->keys.n, kn}));
  ri->keys.n += kn;
  /* computed in scratch, kept at its size (tregion_of reserves an interval
   * per combination of outer factors; most merge) */
  tregion x;
  tregion_of(&L->scratch, L->p, s, m, &x);
  vec_push(NULL, &ri->v, tregion_copy(L->a, &x));
  htab_add(&ri->index, h);
  return ri->v.v[ri->v.n - 1];
}

static void store_free(struct store *st);

static void rintern_free(rintern *ri) {
  vec_free(&ri->v);
  vec_free(&ri->key);
  vec_free(&ri->keys);
  htab_free(&ri->index);
}

/* The regions of every argument of every sub-operator, found once, in the
 * order sub-operators lie in memory: anchoring, and the forward,
 * recomputation and backward of a sub-operator, read the same regions.
 * They live with the program, so that buffers and refs share them. */
/* Regions shifted by micro-batches, each made once: (region, shift) ->
 * region. Shifting an interned region shares the copies as interning
 * would: parts that read one region at micro-batch 0 read one at every. */
typedef struct skey {
  const dregion *dims;
  int mb;
} skey;

typedef struct shifted {
  VEC(skey) key;
  VEC(tregion) v;         /* per key */
  htab index;
} shifted;

typedef struct slookup {
  const shifted *sh;
  skey k;
} slookup;

static bool same_shift(const void *ctx, int e) {
  const slookup *x = ctx;
  return x->sh->key.v[e].dims == x->k.dims && x->sh->key.v[e].mb == x->k.mb;
}

static tregion shift_region(lstate *L, shifted *sh, int t, const tregion *r0, int mb) {
  const weft_plan *p = L->p;
  int d = p->fold.mbs ? p->fold.tdim[t] : -1;
  if (mb == 0 || d < 0 || d >= r0->ndims) return *r0;
  slookup k = {sh, {r0->dims, mb}};
  uint64_t h = (uint64_t)(uintptr_t)r0->dims ^ (uint64_t)mb << 48;
  int e = htab_find(&sh->index, h, same_shift, &k);
  if (e >= 0) return sh->v.v[e];
  tregion x = tregion_copy(L->a, r0);
  int64_t off = p->fold.tstep[t] * mb;
  for (int i = 0; i < x.dims[d].n; i++) {
    x.dims[d].iv[i].lo += off;
    x.dims[d].iv[i].hi += off;
  }
  vec_push(NULL, &sh->key, k.k);
  vec_push(NULL, &sh->v, x);
  htab_add(&sh->index, h);
  return x;
}

static void sub_regions(lstate *L) {
  const weft_plan *p = L->p;
  L->sreg_off = malloc(sizeof(int) * (size_t)(p->nsubs + 1));
  if (!L->sreg_off) weft_oom();
  int64_t n = 0;
  for (int i = 0; i < p->nsubs; i++) {
    L->sreg_off[i] = (int)n;
    n += p->ops[p->subs[i].op].space->ninputs + 1;
    if (n > INT32_MAX) weft_oom();
  }
  L->sreg_off[p->nsubs] = (int)n;
  L->sreg_v = malloc(sizeof(tregion) * (size_t)(n ? n : 1));
  if (!L->sreg_v) weft_oom();
  shifted sh = {0};
  for (int i = 0; i < p->nsubs; i++) {
    const psub *s = &p->subs[i];
    const opspace *sp = p->ops[s->op].space;
    tregion *r = &L->sreg_v[L->sreg_off[i]];
    int tw = p->fold.twin ? p->fold.twin[i] : i;
    if (tw != i) {
      /* a folded plan's later micro-batch: its twin's regions, those of
       * tensors that move with micro-batches shifted */
      const tregion *r0 = &L->sreg_v[L->sreg_off[tw]];
      for (int k = 0; k <= sp->ninputs; k++) {
        int t = k < sp->ninputs ? sp->inputs[k].tensor : sp->output.tensor;
        r[k] = shift_region(L, &sh, t, &r0[k], s->microbatch - p->subs[tw].microbatch);
      }
      continue;
    }
    for (int k = 0; k < sp->ninputs; k++) r[k] = region_intern(L, s, &sp->inputs[k]);
    r[sp->ninputs] = region_intern(L, s, &sp->output);
  }
  vec_free(&sh.key);
  vec_free(&sh.v);
  htab_free(&sh.index);
  L->nsreg = (size_t)n;
  L->sreg_slab = malloc(sizeof(int) * (size_t)(n ? n : 1));
  if (!L->sreg_slab) weft_oom();
  for (int i = 0; i < p->nsubs; i++) {
    const opspace *sp = p->ops[p->subs[i].op].space;
    int o = L->sreg_off[i];
    for (int k = 0; k <= sp->ninputs; k++)
      L->sreg_slab[o + k] = slab_of(L, k < sp->ninputs ? sp->inputs[k].tensor : sp->output.tensor, &L->sreg_v[o + k]);
  }
}

/* The region of argument k of sub-operator sub (k = its inputs: the result). */
static const tregion *sub_region(lstate *L, int sub, int k) { return &L->sreg_v[L->sreg_off[sub] + k]; }

/* Whether regions x and y of one tensor cover the same rows: all their
 * dimensions but the last. */
static bool same_rows(const tregion *x, const tregion *y) {
  if (x->ndims != y->ndims) return false;
  for (int d = 0; d + 1 < x->ndims; d++) {
    const dregion *a = &x->dims[d], *b = &y->dims[d];
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
      if (a->iv[i].lo != b->iv[i].lo || a->iv[i].hi != b->iv[i].hi) return false;
  }
  return true;
}

/* Finds, for each sub-operator whose part gathers statistics, the gathers
 * (pcomm.stats) it takes part in: the one of its device whose rows are its
 * own, for the forward and for the backward. */
static void stats_index(lstate *L) {
  const weft_plan *p = L->p;
  for (int ci = 0; ci < p->ncomms; ci++) {
    const pcomm *cm = &p->comms[ci];
    if (!cm->stats) continue;
    if (!L->stats) {
      L->stats = malloc(sizeof(int) * 2 * (size_t)(p->nsubs ? p->nsubs : 1));
      if (!L->stats) weft_oom();
      for (int i = 0; i < 2 * p->nsubs; i++) L->stats[i] = -1;
    }
    for (int m = 0; m < cm->ngroup; m++) {
      int lo, hi;
      if (cm->mb >= 0) subs_of_mb(L, cm->group[m], cm->consumer_op, cm->mb, &lo, &hi);
      else subs_on(L, cm->group[m], cm->consumer_op, &lo, &hi);
      for (int j = lo; j < hi; j++)
        if (same_rows(sub_region(L, L->byd[j], 0), &cm->parts[m]))
          L->stats[2 * L->byd[j] + (cm->phase == PHASE_BACKWARD)] = ci;
    }
  }
}

/* The statistics of task tk's part, gathered with those of the other
 * vocabulary shards of its rows by comm ci: a buffer, the compute of this
 * part's statistics into its place (reading the task's refs in), the
 * gather in place. Returns the ref to all of them, which the rest of the
 * compute reads. */
static lref emit_stats(emitter *E, const task *tk, int ci, const lref *in, int nin) {
  lstate *L = E->L;
  const pcomm *cm = &L->p->comms[ci];
  const tregion *mine = &cm->region;
  for (int m = 0; m < cm->ngroup; m++)
    if (cm->group[m] == E->d) mine = &cm->parts[m];
  int b = new_buf(E, cm->tensor, LB_ACT, &cm->region, false);
  L->pr->bufs[b].stats = true;
  L->pr->bufs[b].dtype = DT_F32;
  L->pr->bufs[b].bytes = tregion_numel(&cm->region) * dtype_bytes[DT_F32];
  emit_alloc(E, b);
  lins *c = emit(E, LI_COMPUTE);
  c->sub = tk->sub;
  c->dir = tk->kind == T_BWD ? DIR_BACKWARD : DIR_FORWARD;
  c->recompute = tk->kind == T_RECOMP;
  c->mb = L->p->subs[tk->sub].microbatch;
  c->part = LP_STATS;
  c->nin = nin;
  c->in = refs(E, nin + 1);
  memcpy(c->in, in, sizeof(lref) * (size_t)nin);
  c->nout = 1;
  c->out = c->in + nin;
  c->out[0] = ref(E, b, mine);
  c = emit(E, LI_COLLECTIVE);
  c->comm = ci;
  c->epoch = tk->kind == T_RECOMP;
  c->nin = c->nout = 1;
  c->in = refs(E, 2);
  c->in[0] = ref(E, b, mine);
  c->out = c->in + 1;
  c->out[0] = ref(E, b, &cm->region);
  return ref(E, b, &cm->region);
}

/* Shards of a vocabulary split that share a device cannot gather their
 * statistics (deps.c made no gather for them). */
static void shards_share(emitter *E, const psub *s) {
  lstate *L = E->L;
  if (L->failed) return;
  L->failed = true;
  const weft_plan *p = L->p;
  weft_loc at = p->ops[s->op].assigned ? p->ops[s->op].assign_loc : p->loc;
  weft_diag *g = diag_add(L->dg, DIAG_ERROR, at, "%s is split along its vocabulary, but shards of the same rows "
                          "(micro-batch %d) share device %d", p->g->ops[s->op].name, s->microbatch, E->d);
  diag_hint(g, L->dg, "the shards gather each other's statistics of every row: place them on different devices");
}

/* The consumers whose gradient contributions devices leave out of an
 * all-reduce (pcomm.omit: another member brings the same copy), by device. */
static void omit_index(lstate *L) {
  const weft_plan *p = L->p;
  int n = 0;
  for (int ci = 0; ci < p->ncomms; ci++) n += p->comms[ci].nomit;
  L->omit_start = NULL;
  if (!n) return;
  L->omit_start = arena_alloc(L->a, sizeof(int) * (size_t)(p->ndevices + 1));
  L->omit_op = arena_alloc(L->a, sizeof(int) * (size_t)n);
  L->omit_comm = arena_alloc(L->a, sizeof(int) * (size_t)n);
  memset(L->omit_start, 0, sizeof(int) * (size_t)(p->ndevices + 1));
  for (int ci = 0; ci < p->ncomms; ci++)
    for (int k = 0; k < p->comms[ci].nomit; k++) L->omit_start[p->comms[ci].omit[2 * k] + 1]++;
  for (int d = 0; d < p->ndevices; d++) L->omit_start[d + 1] += L->omit_start[d];
  int *fill = arena_alloc(&L->scratch, sizeof(int) * (size_t)p->ndevices);
  memcpy(fill, L->omit_start, sizeof(int) * (size_t)p->ndevices);
  for (int ci = 0; ci < p->ncomms; ci++)
    for (int k = 0; k < p->comms[ci].nomit; k++) {
      int at = fill[p->comms[ci].omit[2 * k]]++;
      L->omit_op[at] = p->comms[ci].omit[2 * k + 1];
      L->omit_comm[at] = ci;
    }
}

/* Whether device d leaves op's gradient of region r of tensor t out: a
 * copy of a replicated consumer whose part another member of the
 * all-reduce brings. */
static bool omits(const lstate *L, int d, int op, int t, const tregion *r) {
  if (!L->omit_start) return false;
  for (int i = L->omit_start[d]; i < L->omit_start[d + 1]; i++) {
    const pcomm *cm = &L->p->comms[L->omit_comm[i]];
    if (L->omit_op[i] == op && cm->tensor == t && tregion_overlaps(&cm->region, r)) return true;
  }
  return false;
}

static void emit_compute(emitter *E, const task *tk) {
  lstate *L = E->L;
  weft_plan *p = L->p;
  const weft_graph *g = p->g;
  const psub *s = &p->subs[tk->sub];
  const popplan *pp = &p->ops[s->op];
  const opspace *sp = pp->space;
  int sc = L->stats ? L->stats[2 * tk->sub + (tk->kind == T_BWD)] : -1;
  if (sc < 0 && L->shards_stats[s->op]) {
    shards_share(E, s);
    return;
  }
  int xs = sc >= 0;       /* the gathered statistics, one more ref */
  int nin = sp->ninputs + (tk->kind == T_BWD ? 1 : 0);
  /* the refs it reads and writes, in one piece: a forward writes one, a
   * backward at most one per input */
  lref *in = refs(E, nin + xs + (tk->kind == T_BWD ? sp->ninputs : 1));
  int ni = 0;
  for (int k = 0; k < sp->ninputs; k++) {
    const tmap *m = &sp->inputs[k];
    int t = m->tensor;
    const tregion *need = sub_region(L, tk->sub, k);
    /* ids and labels are read by every part; only floating arguments
     * (a bias) are added once */
    if (L->value_split[s->op] && !applies_arg(pp, s, m) && dtype_is_float(g->tensors[t].dtype)) {
      in[ni++] = aref(E, -1, k, need);
      continue;
    }
    int b;
    if (g->tensors[t].role == TENSOR_PARAM) {
      b = param_buf(E, t, need, p->zero[t].stage < 3);
    } else if (g->tensors[t].role == TENSOR_INPUT) {
      b = find_held(E, t, false, need, 0, NULL);
      if (b < 0) {
        b = held_buf(E, t, LB_INPUT, need, false, false, false);
      }
    } else {
      b = find_held(E, t, false, need, 0, NULL);
      if (b < 0) b = assemble(E, t, false, need);
    }
    if (b < 0) {
      missing(E, s, tk->kind == T_FWD ? "the forward" : tk->kind == T_BWD ? "the backward" : "the recomputation", t,
              false, need);
      return;
    }
    in[ni++] = aref(E, b, k, need);
  }
  lref stats = xs ? emit_stats(E, tk, sc, in, sp->ninputs) : (lref){.buf = -1, .arg = -1};
  int tout = sp->output.tensor;
  const tregion *outr = sub_region(L, tk->sub, sp->ninputs);
  if (tk->kind != T_BWD) {
    bool partial = false;
    for (int i = 0; i < pp->nsplits; i++) partial |= pp->splits[i].kind == SPLIT_VALUE && pp->splits[i].parts > 1;
    /* value parts of one operator on one device (co-shard) add up in one
     * buffer before any reduction across devices */
    int maker = s->op * 4 + (int)tk->kind, b = -1;
    for (int i = partial ? *chain(E, tout, outr) : -1; i >= 0 && b < 0; i = E->st.h.v[i].next) {
      const held *h = &E->st.h.v[i];
      if (h->live && h->partial && h->maker == maker && h->maker_mb == s->microbatch &&
          same_region(&L->pr->bufs[h->buf].region, outr))
        b = h->buf;
    }
    bool acc = b >= 0;
    if (!acc) {
      supersede(E, tout, false, outr);
      b = held_buf(E, tout, LB_ACT, outr, false, false, partial);
      E->st.h.v[E->st.h.n - 1].maker = maker;
      E->st.h.v[E->st.h.n - 1].maker_mb = s->microbatch;
    }
    lins *c = emit(E, LI_COMPUTE);
    c->accumulate = acc;
    c->sub = tk->sub;
    c->dir = DIR_FORWARD;
    c->recompute = tk->kind == T_RECOMP;
    c->mb = s->microbatch;
    if (xs) in[ni++] = stats, c->part = LP_COMBINE;
    c->nin = ni;
    c->in = in;
    c->nout = 1;
    c->out = in + nin + xs;
    c->out[0] = ref(E, b, outr);
    return;
  }
  /* backward: the gradient of the output (the loss seeds itself) */
  if (tout != g->loss) {
    int b = p->sum_grads && p->sum_grads[tout] ? sum_pieces(E, tout, outr) : -1;
    if (b < 0) b = find_held(E, tout, true, outr, -1, NULL);
    if (b < 0) b = assemble(E, tout, true, outr);
    bool consumed = L->readers[tout][0] >= 0;
    if (b < 0 && consumed) {
      missing(E, s, "the backward", tout, true, outr);
      return;
    }
    if (b >= 0) in[ni++] = ref(E, b, outr);
  }
  if (xs) in[ni++] = stats;
  lref *out = in + nin + xs;
  int no = 0;
  for (int k = 0; k < sp->ninputs; k++) {
    const tmap *m = &sp->inputs[k];
    int t = m->tensor;
    if (g->tensors[t].role == TENSOR_INPUT || !dtype_is_float(g->tensors[t].dtype)) continue;
    if (L->value_split[s->op] && !applies_arg(pp, s, m)) continue;
    const tregion *need = sub_region(L, tk->sub, k);
    if (omits(L, E->d, s->op, t, need)) continue;
    bool param = g->tensors[t].role == TENSOR_PARAM;
    int b = -1;
    for (int i = *chain(E, t, need); i >= 0 && b < 0; i = E->st.h.v[i].next) {
      const held *h = &E->st.h.v[i];
      if (h->live && h->grad && same_region(&L->pr->bufs[h->buf].region, need)) b = h->buf;
    }
    if (b < 0 && param) {
      /* a gradient accumulator for a region this device reads; under ZeRO-2
       * and 3 it lives until its reduce-scatter */
      b = find_held(E, t, true, need, -1, NULL);
    }
    if (b < 0) {
      b = held_buf(E, t, param ? LB_GRAD : LB_ACT_GRAD, need, param && p->zero[t].stage < 2, true, false);
    }
    out[no++] = aref(E, b, k, need);
  }
  lins *c = emit(E, LI_COMPUTE);
  c->sub = tk->sub;
  c->dir = DIR_BACKWARD;
  c->mb = s->microbatch;
  c->part = xs ? LP_COMBINE : LP_WHOLE;
  c->accumulate = true;
  c->nin = ni;
  c->in = in;
  c->nout = no;
  c->out = out;
}

static void emit_step(emitter *E, int t) {
  lstate *L = E->L;
  const weft_plan *p = L->p;
  /* every live gradient of t on this device, each with its parameter region */
  for (int i = E->st.head[t]; i >= 0; i = E->st.h.v[i].next) {
    const held *h = &E->st.h.v[i];
    if (!h->live || !h->grad) continue;
    /* copies: new buffers move the arrays h and the region are in */
    int gb = h->buf;
    tregion rv = L->pr->bufs[gb].region;
    const tregion *r = &rv;
    int pb = param_home(E, t, r);
    if (pb < 0) pb = param_buf(E, t, r, true);
    int state = -1, master = -1;
    int copies = p->g->optimizer ? p->g->optimizer_state : 0;
    if (copies) {
      state = new_buf(E, t, LB_STATE, r, true);
      L->pr->bufs[state].copies = copies;
      L->pr->bufs[state].bytes *= copies;
      emit_alloc(E, state);
    }
    int mcopies = graph_master_copies(p->g, t);
    if (mcopies) {
      master = new_buf(E, t, LB_MASTER, r, true);
      L->pr->bufs[master].copies = mcopies;
      L->pr->bufs[master].bytes *= mcopies;
      emit_alloc(E, master);
    }
    lins *c = emit(E, LI_STEP);
    c->tensor = t;
    c->nin = 1;
    c->in = refs(E, 4);
    c->in[0] = ref(E, gb, r);
    c->nout = 1;
    c->out = c->in + 1;
    c->out[0] = ref(E, pb, r);
    if (state >= 0) c->out[c->nout++] = ref(E, state, r);
    if (master >= 0) c->out[c->nout++] = ref(E, master, r);
  }
}

static void comm_missing(emitter *E, const pcomm *cm, const tregion *r) {
  lstate *L = E->L;
  if (L->failed) return;
  L->failed = true;
  weft_diag *g = diag_add(L->dg, DIAG_ERROR, L->p->loc, "the %s of %s %s (%s) on device %d has nothing to send: no earlier "
                                             "instruction on device %d provides it",
                            comm_kind_names[cm->kind], L->p->g->tensors[cm->tensor].name, tregion_str(&L->scratch, r),
                            comm_phase_names[cm->phase], E->d, E->d);
  diag_hint(g, L->dg, "weft explain shows why the communication is needed");
}

static int member_index(const pcomm *cm, int d) {
  for (int i = 0; i < cm->ngroup; i++)
    if (cm->group[i] == d) return i;
  return -1;
}

/* A buffer a communication writes: a parameter or gradient that only
 * passes through (not the persistent home of one) is a communication
 * buffer, in the dtype of what it holds. */
static int comm_buf(emitter *E, int t, lbuf_role role, const tregion *r, bool persistent, bool grad, bool partial) {
  int b = held_buf(E, t, role, r, persistent, grad, partial);
  if (!persistent && (role == LB_PARAM || role == LB_GRAD)) E->L->pr->bufs[b].role = LB_COMM;
  return b;
}

static void emit_comm(emitter *E, int ci, int epoch) {
  lstate *L = E->L;
  const weft_plan *p = L->p;
  const pcomm *cm = &p->comms[ci];
  int t = cm->tensor;
  bool grad = cm->phase == PHASE_BACKWARD || cm->phase == PHASE_WEIGHTS;
  lbuf_role role = cm->phase == PHASE_FORWARD ? LB_ACT
                   : cm->phase == PHASE_BACKWARD ? LB_ACT_GRAD
                   : cm->phase == PHASE_WEIGHTS ? LB_GRAD : LB_PARAM;
  if (cm->kind == COMM_SEND) {
    if (E->d == cm->src) {
      int b = -1;
      /* a piece of one consumer's gradient, beside another's that holds
       * its region too: from the buffer of that consumer's region */
      for (int i = cm->from ? *chain(E, t, cm->from) : -1; i >= 0 && b < 0; i = E->st.h.v[i].next) {
        const held *h = &E->st.h.v[i];
        if (h->live && h->grad == grad && same_region(&L->pr->bufs[h->buf].region, cm->from)) b = h->buf;
      }
      if (b < 0) b = find_held(E, t, grad, &cm->region, grad ? -1 : 0, NULL);
      if (b < 0) b = assemble(E, t, grad, &cm->region);
      if (b < 0) { comm_missing(E, cm, &cm->region); return; }
      lins *c = emit(E, LI_SEND);
      c->comm = ci;
      c->epoch = epoch;
      c->peer = cm->dst;
      c->nin = 1;
      c->in = refs(E, 1);
      c->in[0] = ref(E, b, &cm->region);
    } else {
      if (!grad) supersede(E, t, false, &cm->region);
      int b = comm_buf(E, t, role, &cm->region, false, grad, false);
      if (grad) E->st.h.v[E->st.h.n - 1].maker = -2 - cm->src;  /* where it came from (sum_pieces) */
      lins *c = emit(E, LI_RECV);
      c->comm = ci;
      c->epoch = epoch;
      c->peer = cm->src;
      c->nout = 1;
      c->out = refs(E, 1);
      c->out[0] = ref(E, b, &cm->region);
    }
    return;
  }
  int mi = member_index(cm, E->d);
  lins *c = NULL;
  lref in = {.buf = -1, .arg = -1}, out = {.buf = -1, .arg = -1};
  switch (cm->kind) {
  case COMM_ALL_REDUCE: {
    int hidx = -1;
    int b = find_held(E, t, grad, &cm->region, grad ? -1 : 1, &hidx);
    if (b >= 0 && same_region(&L->pr->bufs[b].region, &cm->region)) {
      /* in place: the partial sums become the sum */
      E->st.h.v[hidx].partial = false;
      in = out = ref(E, b, &cm->region);
      if (cm->silent && cm->silent[mi]) in = (lref){.buf = -1, .arg = -1};  /* takes the sum only */
    } else {
      if (b >= 0) in = ref(E, b, &cm->region);
      int nb = comm_buf(E, t, role, &cm->region, false, grad, false);
      out = ref(E, nb, &cm->region);
    }
    break;
  }
  case COMM_REDUCE_SCATTER: {
    const tregion *part = member_part(cm, mi);
    int hidx = -1;
    int b = find_held(E, t, grad, &cm->region, grad ? -1 : 1, &hidx);
    if (b >= 0) {
      in = ref(E, b, &cm->region);
      /* the whole gradient or partial sum is consumed: only the part stays */
      E->st.h.v[hidx].live = false;
    }
    /* ZeRO-2 and 3 keep only their part of the gradient; ZeRO-1 keeps the
     * whole and its part lives until the step */
    bool persistent = cm->phase == PHASE_WEIGHTS && p->zero[t].stage >= 2;
    int nb = comm_buf(E, t, role, part, persistent, grad, false);
    out = ref(E, nb, part);
    break;
  }
  case COMM_ALL_GATHER: {
    const tregion *part = member_part(cm, mi);
    int b;
    if (cm->phase == PHASE_PARAMS) {
      /* from the parameter's persistent home: its shard (ZeRO-3), or the
       * whole parameter whose part the step updated (ZeRO-1 and 2) */
      b = param_home(E, t, part);
      if (b < 0) b = param_buf(E, t, part, true);
    } else {
      b = find_held(E, t, grad, part, grad ? -1 : 0, NULL);
    }
    if (b < 0) { comm_missing(E, cm, part); return; }
    in = ref(E, b, part);
    if (cm->phase == PHASE_PARAMS && cm->dir == DIR_OPTIMIZER && holds_region(&L->pr->bufs[b].region, &cm->region)) {
      out = ref(E, b, &cm->region);  /* the updated parts into the whole parameter, in place */
    } else {
      int nb = comm_buf(E, t, role, &cm->region, false, grad, false);
      out = ref(E, nb, &cm->region);
    }
    break;
  }
  case COMM_BROADCAST: {
    if (E->d == cm->src) {
      /* the root sends what it holds, in place */
      int b = find_held(E, t, grad, &cm->region, grad ? -1 : 0, NULL);
      if (b < 0) b = assemble(E, t, grad, &cm->region);
      if (b < 0) { comm_missing(E, cm, &cm->region); return; }
      in = out = ref(E, b, &cm->region);
    } else {
      if (!grad) supersede(E, t, false, &cm->region);
      int nb = comm_buf(E, t, role, &cm->region, false, grad, false);
      out = ref(E, nb, &cm->region);
    }
    break;
  }
  case COMM_ALL_TO_ALL: {
    /* from the member's part in one layout to its part in the other */
    const tregion *from = &cm->sources[mi], *to = &cm->parts[mi];
    int b = find_held(E, t, grad, from, grad ? -1 : 0, NULL);
    if (b < 0) b = assemble(E, t, grad, from);
    if (b < 0) { comm_missing(E, cm, from); return; }
    in = ref(E, b, from);
    if (!grad) supersede(E, t, false, to);
    int nb = comm_buf(E, t, role, to, false, grad, false);
    out = ref(E, nb, to);
    break;
  }
  default: {
    int b = find_held(E, t, grad, &cm->region, -1, NULL);
    if (b >= 0) in = ref(E, b, &cm->region);
    int nb = comm_buf(E, t, role, &cm->region, false, grad, false);
    out = ref(E, nb, &cm->region);
  }
  }
  c = emit(E, LI_COLLECTIVE);
  c->comm = ci;
  c->epoch = epoch;
  c->nin = in.buf >= 0 ? 1 : 0;
  c->in = refs(E, 2);
  if (in.buf >= 0) c->in[0] = in;
  c->nout = 1;
  c->out = c->in + 1;
  c->out[0] = out;
}

static void lop_of(lstate *L, lprog *pg, const lins *in, lop *o);

/* Last uses: free each non-persistent buffer after its last reference;
 * hoist persistent allocations to the start; measure the peak. */
static void finish_program(lstate *L, lprog *pg) {
  weft_program *pr = L->pr;
  arena_reset(&L->scratch);
  int n = pg->n;
  /* last reference per buffer of this device (ids buf_lo .. buf_hi - 1) */
  int nb = pg->buf_hi - pg->buf_lo;
  int *last0 = arena_alloc(&L->scratch, sizeof(int) * (size_t)(nb ? nb : 1));
#define last(b) last0[(b) - pg->buf_lo]
  for (int b = pg->buf_lo; b < pg->buf_hi; b++) last(b) = -1;
  int np = 0, room = 0;   /* the lops' pool: what it holds, room for buckets */
  /* the allocations of persistent buffers, hoisted to the start */
  int *pers = arena_alloc(&L->scratch, sizeof(int) * (size_t)(n ? n : 1)), npers = 0;
  for (int i = 0; i < n; i++) {
    const lins *in = &pg->ins[i];
    if (in->kind == LI_ALLOC) {
      last(in->buf) = i;
      if (pr->bufs[in->buf].persistent) pers[npers++] = i;
    }
    for (int k = 0; k < in->nin; k++)
      if (in->in[k].buf >= 0) last(in->in[k].buf) = i;
    for (int k = 0; k < in->nout; k++)
      if (in->out[k].buf >= 0) last(in->out[k].buf) = i;
    if (in->nin + in->nout + in->nbucket > 0) np += lop_entry_size(in->nin, in->nout, in->nbucket);
    /* a bucket of k all-reduces takes 3k + 3 more (pages never written
     * cost nothing) */
    if (in->kind == LI_COLLECTIVE && in->nin == 1 && in->nout == 1) room += 5;
  }
  int *nfree = arena_alloc(&L->scratch, sizeof(int) * (size_t)(n + 1));
  int extra = 0;
  for (int b = pg->buf_lo; b < pg->buf_hi; b++) {
    if (pr->bufs[b].persistent) last(b) = -3;  /* never freed */
    else if (last(b) >= 0) { nfree[last(b)]++; extra++; }
  }
  /* the lops always; the full instructions when they are kept */
  pg->ops = arena_alloc(L->a, sizeof(lop) * (size_t)(n + extra + 1));
  pg->pool = arena_alloc(L->a, sizeof(int) * (size_t)(np + room + 1));
  pg->npool = 0;
  pg->pcap = np + room + 1;
  lins *out = L->full ? arena_alloc(L->a, sizeof(lins) * (size_t)(n + extra + 1)) : NULL;
  int m = 0;
#define put(x) (out ? (void)(out[m] = *(x)) : (void)0, lop_of(L, pg, (x), &pg->ops[m]), m++)
  for (int k = 0; k < npers; k++) put(&pg->ins[pers[k]]);
  int64_t live = 0;
  int64_t by_role[LB_ROLE_COUNT] = {0};
  for (int i = 0; i < m; i++) {
    const lbuf *b = &pr->bufs[pg->ops[i].id];
    live += b->bytes;
    by_role[b->role] += b->bytes;
  }
  pg->persistent = live;
  pg->peak = live;
  pg->peak_at = m ? m - 1 : 0;
  memcpy(pg->peak_by_role, by_role, sizeof by_role);
  for (int i = 0; i < n; i++) {
    const lins *in = &pg->ins[i];
    if (in->kind == LI_ALLOC && pr->bufs[in->buf].persistent) continue;
    put(in);
    if (in->kind == LI_ALLOC) {
      live += pr->bufs[in->buf].bytes;
      by_role[pr->bufs[in->buf].role] += pr->bufs[in->buf].bytes;
      if (live > pg->peak) {
        pg->peak = live;
        pg->peak_at = m - 1;
        memcpy(pg->peak_by_role, by_role, sizeof by_role);
      }
    }
    if (nfree[i]) {
      /* buffers whose last use this is, in buffer order */
      for (int k = 0; k < in->nin + in->nout + 1 && nfree[i]; k++) {
        int b = k < in->nin ? in->in[k].buf : k < in->nin + in->nout ? in->out[k - in->nin].buf : in->buf;
        if (b < 0 || last(b) != i) continue;
        last(b) = -2;  /* freed once even when referenced twice */
        lins f = {.kind = LI_FREE, .buf = b, .sub = -1, .comm = -1, .peer = -1, .tensor = -1};
        put(&f);
        live -= pr->bufs[b].bytes;
        by_role[pr->bufs[b].role] -= pr->bufs[b].bytes;
        nfree[i]--;
      }
    }
  }
#undef put
  pg->n = m;
  pg->ins = out;
  pg->cap = out ? n + extra + 1 : 0;
  pr->instructions += m;
}
#undef last

/* The lop of instruction in (lower.h), its buffers appended to pg's pool. */
static void lop_of(lstate *L, lprog *pg, const lins *in, lop *o) {
  weft_program *pr = L->pr;
  o->kind = in->kind;
  o->dir = in->dir;
  o->epoch = in->epoch;
  o->flags = (uint8_t)((in->recompute ? LOP_RECOMPUTE : 0) | (in->accumulate ? LOP_ACCUMULATE : 0) |
                       (in->part == LP_STATS ? LOP_STATS : in->part == LP_COMBINE ? LOP_COMBINE : 0));
  o->aux = -1;
  switch (in->kind) {
  case LI_ALLOC: case LI_FREE:
    o->id = in->buf;
    if (pr->bufs[in->buf].persistent) o->flags |= LOP_PERSISTENT;
    break;
  case LI_COMPUTE: o->id = in->sub; break;
  case LI_SEND: case LI_RECV: o->id = in->comm; o->aux = in->peer; break;
  case LI_COLLECTIVE: o->id = in->comm; break;
  case LI_STEP: o->id = in->tensor; break;
  default: o->id = -1; break;
  }
  /* (what buckets ask of an in-place all-reduce of a persistent buffer) */
  if (in->kind == LI_COLLECTIVE && in->nin == 1 && in->nout == 1 && in->out[0].buf >= 0 &&
      in->in[0].buf == in->out[0].buf && pr->bufs[in->out[0].buf].persistent &&
      tregion_equal(&pr->bufs[in->out[0].buf].region, &in->out[0].region))
    o->flags |= LOP_WHOLE;
  if (in->kind == LI_COMPUTE || in->kind == LI_COPY || in->kind == LI_STEP) o->aux = lower_work_of(L->works, pr, in);
  o->refs = -1;
  if (in->nin + in->nout + in->nbucket == 0) return;
  o->refs = pg->npool;
  int *r = lop_put_head(pg->pool + pg->npool, in->nin, in->nout, in->nbucket);
  for (int k = 0; k < in->nin; k++) *r++ = in->in[k].buf;
  for (int k = 0; k < in->nout; k++) *r++ = in->out[k].buf;
  for (int k = 0; k < in->nbucket; k++) *r++ = in->bucket[k];
  pg->npool = (int)(r - pg->pool);
}

static void emit_device(lstate *L, int d) {
  weft_plan *p = L->p;
  emitter E = {.L = L, .d = d, .prog = &L->pr->progs[d]};
  E.prog->buf_lo = L->pr->nbufs;
  E.prog->ins = L->ebuf;
  E.prog->cap = L->ecap;
  E.prog->n = 0;
  if (L->tasks[d].n == 0 && L->anch[d].n == 0) {
    /* nothing to emit (a device another one represents, or an unused one) */
    E.prog->buf_hi = L->pr->nbufs;
    return;
  }
  arena_reset(&L->scratch);
  if (!L->full) arena_reset(&L->refa);
  /* the store of the previous device, emptied */
  E.st = *L->st;
  E.st.h.n = 0;
  htab_truncate(&E.st.slabs, 0);
  E.st.shead.n = 0;
  int64_t ngrid = (int64_t)p->fold.mbs * p->g->ntensors;
  if (!E.st.grid && ngrid > 0 && ngrid <= (1 << 24)) {
    E.st.grid = malloc(sizeof(int) * (size_t)ngrid);
    E.st.gused = malloc(sizeof(int) * (size_t)ngrid);
    if (!E.st.grid || !E.st.gused) weft_oom();
    for (int64_t i = 0; i < ngrid; i++) E.st.grid[i] = INT32_MIN;
  }
  for (int u = 0; u < E.st.gn; u++) E.st.grid[E.st.gused[u]] = INT32_MIN;
  E.st.gn = 0;
  E.st.last = -1;
  E.st.head = arena_alloc(&L->scratch, sizeof(int) * (size_t)(p->g->ntensors ? p->g->ntensors : 1));
  for (int t = 0; t < p->g->ntensors; t++) E.st.head[t] = -1;
  const tasklist *tl = &L->tasks[d];
  const anchors *an = &L->anch[d];
  int a = 0;
  for (int i = 0; i <= tl->n && !L->failed; i++) {
    while (a < an->n && an->v[a].pos <= 2 * i && !L->failed) { emit_comm(&E, an->v[a].comm, an->v[a].epoch); a++; }
    if (i == tl->n || L->failed) break;
    const task *tk = &tl->v[i];
    if (tk->kind == T_STEP) emit_step(&E, tk->sub);
    else emit_compute(&E, tk);
    while (a < an->n && an->v[a].pos == 2 * i + 1 && !L->failed) { emit_comm(&E, an->v[a].comm, an->v[a].epoch); a++; }
  }
  while (a < an->n && !L->failed) { emit_comm(&E, an->v[a].comm, an->v[a].epoch); a++; }
  E.prog->buf_hi = L->pr->nbufs;
  *L->st = E.st;
}

static void store_free(store *st) {
  free(st->grid);
  free(st->gused);
  vec_free(&st->h);
  htab_free(&st->slabs);
  vec_free(&st->shead);
}

_Static_assert(sizeof(lop) == 16, "a lop is 16 bytes");

lins lower_view(const weft_program *pr, const lprog *pg, int i) {
  const lop *o = &pg->ops[i];
  lins in = {.kind = o->kind, .dir = o->dir, .epoch = o->epoch, .recompute = (o->flags & LOP_RECOMPUTE) != 0,
             .accumulate = (o->flags & LOP_ACCUMULATE) != 0,
             .part = o->flags & LOP_STATS ? LP_STATS : o->flags & LOP_COMBINE ? LP_COMBINE : LP_WHOLE, .buf = -1, .sub = -1, .mb = 0, .comm = -1, .peer = -1,
             .tensor = -1};
  switch (o->kind) {
  case LI_ALLOC: case LI_FREE: in.buf = o->id; break;
  case LI_COMPUTE: in.sub = o->id; in.mb = pr->p->subs[o->id].microbatch; break;
  case LI_SEND: case LI_RECV: in.comm = o->id; in.peer = o->aux; break;
  case LI_COLLECTIVE: in.comm = o->id; break;
  case LI_STEP: in.tensor = o->id; break;
  default: break;
  }
  in.nin = lop_nin(pg->pool, o);
  in.nout = lop_nout(pg->pool, o);
  in.nbucket = (uint16_t)lop_nbucket(pg->pool, o);
  return in;
}

/* The working state of one lowering, freed on success and on failure. */
static void lstate_free(lstate *L) {
  free(L->ebuf);
  L->ebuf = NULL;
  free(L->dslot);
  free(L->byd_start);
  free(L->byd);
  free(L->byd_per_mb);
  free(L->fpos);
  free(L->bpos);
  free(L->rpos);
  free(L->sreg_off);
  free(L->sreg_v);
  free(L->sreg_slab);
  free(L->stats);
  rintern_free(&L->regs);
  arena_free(&L->scratch);
  arena_free(&L->refa);
  arena_free(&L->tmp);
  lower_works_free(L->works);
  L->works = NULL;
}

/* ---- the whole ------------------------------------------------------------------- */

weft_program *lower_plan(weft_plan *p, const lower_opts *o, arena *a, weft_diags *dg) {
  const weft_graph *g = p->g;
  weft_program *pr = arena_alloc(a, sizeof *pr);
  pr->p = p;
  lstate L = {.dg = dg, .p = p, .pr = pr, .a = a, .full = o && o->full_programs};
  arena_init(&L.scratch);
  arena_init(&L.refa);
  arena_init(&L.tmp);
  L.ra = L.full ? L.a : &L.refa;
  L.works = lower_works_new();
  int before = dg->errors;
  /* stages of the schedule */
  L.stage_of = arena_alloc(L.a, sizeof(int) * (size_t)(g->nops ? g->nops : 1));
  if (p->nstages == 0 || p->sched == SCHED_DEFAULT) {
    L.nstages = p->nstages ? p->nstages : 1;
    for (int op = 0; op < g->nops; op++) L.stage_of[op] = p->ops[op].stage >= 0 ? p->ops[op].stage : 0;
    if (p->sched != SCHED_DEFAULT) {
      weft_diag *d = diag_add(dg, DIAG_ERROR, p->sched_loc, "a pipeline schedule needs stages");
      diag_hint(d, dg, "declare them: stage s0 = h[0..6], s1 = h[6..12]");
      goto fail;
    }
  } else {
    L.nstages = p->nstages;
    for (int op = 0; op < g->nops; op++) {
      if (p->ops[op].stage < 0) {
        weft_diag *d = diag_add(dg, DIAG_ERROR, p->sched_loc, "operator %s is in no stage", g->ops[op].name);
        diag_hint(d, dg, "a schedule orders stages: every operator must be in one");
        goto fail;
      }
      L.stage_of[op] = p->ops[op].stage;
    }
  }
  /* a generated schedule runs stages in the order they are declared: no
   * stage may read what a later one produces */
  if (p->nstages > 1 && p->sched != SCHED_GRID)
    for (int op = 0; op < g->nops; op++)
      for (int k = 0; k < g->ops[op].ninputs; k++) {
        int pop = g->tensors[g->ops[op].inputs[k]].producer;
        if (pop < 0 || L.stage_of[pop] <= L.stage_of[op]) continue;
        const pstage *a = &p->stages[L.stage_of[op]], *b = &p->stages[L.stage_of[pop]];
        weft_diag *d = diag_add(dg, DIAG_ERROR, a->loc, "stage %s comes before stage %s, but its operator %s reads %s, which %s computes",
                                  a->name, b->name, g->ops[op].name, g->tensors[g->ops[op].inputs[k]].name, b->name);
        diag_hint(d, dg, "stages run in the order they are declared: declare %s before %s", b->name, a->name);
        goto fail;
      }
  pr->nstages = L.nstages;
  pr->stage_names = arena_alloc(L.a, sizeof(char *) * (size_t)L.nstages);
  for (int st = 0; st < L.nstages; st++) pr->stage_names[st] = p->nstages ? p->stages[st].name : "all";
  for (int s = 0; s < p->nsubs; s++)
    if (p->subs[s].microbatch + 1 > L.nmb) L.nmb = p->subs[s].microbatch + 1;
  if (L.nmb == 0) L.nmb = 1;
  pr->nmb = L.nmb;
  /* readers of each tensor */
  L.readers = arena_alloc(L.a, sizeof(int *) * (size_t)(g->ntensors ? g->ntensors : 1));
  {
    int *cnt = arena_alloc(L.a, sizeof(int) * (size_t)(g->ntensors ? g->ntensors : 1));
    for (int op = 0; op < g->nops; op++)
      for (int k = 0; k < g->ops[op].ninputs; k++) cnt[g->ops[op].inputs[k]]++;
    for (int t = 0; t < g->ntensors; t++) {
      L.readers[t] = arena_alloc(L.a, sizeof(int) * (size_t)(cnt[t] + 1));
      L.readers[t][0] = -1;
      cnt[t] = 0;
    }
    for (int op = 0; op < g->nops; op++)
      for (int k = 0; k < g->ops[op].ninputs; k++) {
        int t = g->ops[op].inputs[k];
        bool dup = false;
        for (int q = 0; q < cnt[t]; q++) dup |= L.readers[t][q] == op;
        if (dup) continue;
        L.readers[t][cnt[t]++] = op;
        L.readers[t][cnt[t]] = -1;
      }
  }
  if (!index_subs(&L)) {
    diag_add(dg, DIAG_ERROR, p->loc, "the plan is too large to lower (%d devices x %d operators)", p->ndevices, g->nops);
    goto fail;
  }
  if (!block_order(&L)) goto fail;
  blist *per_device;
  if (!schedule_blocks(&L, &per_device)) goto fail;
  L.tasks = arena_alloc(&L.tmp, sizeof(tasklist) * (size_t)p->ndevices);
  L.anch = arena_alloc(&L.tmp, sizeof(anchors) * (size_t)p->ndevices);
  L.steppos = arena_alloc(&L.tmp, sizeof(int *) * (size_t)p->ndevices);
  L.fpos = malloc(sizeof(int) * (size_t)(p->nsubs ? p->nsubs : 1));
  L.bpos = malloc(sizeof(int) * (size_t)(p->nsubs ? p->nsubs : 1));
  L.rpos = malloc(sizeof(int) * (size_t)(p->nsubs ? p->nsubs : 1));
  if (!L.fpos || !L.bpos || !L.rpos) weft_oom();
  for (int s = 0; s < p->nsubs; s++) L.fpos[s] = L.bpos[s] = L.rpos[s] = -1;
  L.tshift = arena_alloc(L.a, sizeof(int) * (size_t)(g->ntensors ? g->ntensors : 1));
  for (int t = 0; t < g->ntensors; t++) {
    int64_t st = p->fold.mbs ? p->fold.tstep[t] : 0;
    L.tshift[t] = -1;
    for (int b = 0; b < 62 && st > 0; b++)
      if (st == (int64_t)1 << b) L.tshift[t] = b;
  }
  sub_regions(&L);
  L.value_split = arena_alloc(L.a, (size_t)(g->nops ? g->nops : 1));
  for (int op = 0; op < g->nops; op++)
    for (int i = 0; i < p->ops[op].nsplits; i++) L.value_split[op] |= p->ops[op].splits[i].kind == SPLIT_VALUE;
  L.shards_stats = arena_alloc(L.a, (size_t)(g->nops ? g->nops : 1));
  for (int op = 0; op < g->nops; op++) L.shards_stats[op] = deps_stats_idim(p, op) >= 0;
  stats_index(&L);
  omit_index(&L);
  make_tasks(&L, per_device);
  if (g->loss < 0)
    for (int d = 0; d < p->ndevices; d++) {
      /* inference: forward blocks only */
      tasklist *tl = &L.tasks[d];
      int m = 0;
      for (int i = 0; i < tl->n; i++)
        if (tl->v[i].kind == T_FWD) { L.fpos[tl->v[i].sub] = m; tl->v[m++] = tl->v[i]; }
        else if (tl->v[i].kind == T_BWD) L.bpos[tl->v[i].sub] = -1;
        else if (tl->v[i].kind == T_RECOMP) L.rpos[tl->v[i].sub] = -1;
      tl->n = m;
    }
  anchor_comms(&L);
  prof_mark("lower: order");
  /* about one buffer per task and communication: reserved at once, the
   * array of buffers seldom moves (pages never touched cost nothing) */
  int64_t guess = 0;
  for (int d = 0; d < p->ndevices; d++) guess += L.tasks[d].n + L.anch[d].n;
  if (2 * guess + 16 < INT32_MAX / 2) {
    pr->bcap = (int)(2 * guess + 16);
    pr->bufs = arena_alloc(L.a, sizeof(lbuf) * (size_t)pr->bcap);
  }
  pr->nprogs = p->ndevices;
  pr->progs = arena_alloc(L.a, sizeof(lprog) * (size_t)p->ndevices);
  store st = {0};
  L.st = &st;
  for (int d = 0; d < p->ndevices && !L.failed; d++) {
    pr->progs[d].device = d;
    emit_device(&L, d);
    if (!L.failed) finish_program(&L, &pr->progs[d]);
  }
  free(L.ebuf);
  L.ebuf = NULL;
  store_free(&st);
  pr->works = lower_works_keep(L.a, L.works);
  L.works = NULL;
  prof_mark("lower: emit");
  {
    int64_t pool = 0;
    for (int d = 0; d < p->ndevices; d++) pool += pr->progs[d].npool;
    prof_note("%" PRId64 " instructions (%.1f MB of lops, %.1f MB of pool), %d buffers (%.1f MB), %d works",
              pr->instructions, (double)pr->instructions * (double)sizeof(lop) / 1e6, (double)pool * 4 / 1e6, pr->nbufs,
              (double)pr->nbufs * (double)sizeof(lbuf) / 1e6, lower_works_count(pr->works));
  }
  if (L.failed) goto fail;
  lower_buckets(L.a, pr);
  prof_mark("lower: buckets");
  for (int d = 0; d < p->ndevices; d++) pr->instructions_all += lower_prog(pr, d)->n;
  lstate_free(&L);
  return dg->errors > before ? NULL : pr;
fail:
  lstate_free(&L);
  return NULL;
}

int64_t lower_peak(const weft_program *pr, int *device) {
  int64_t best = -1;
  int at = 0;
  for (int d = 0; d < pr->nprogs; d++)
    if (pr->progs[d].peak > best) { best = pr->progs[d].peak; at = d; }
  if (device) *device = at;
  return best < 0 ? 0 : best;
}
