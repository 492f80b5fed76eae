/* fixed.c - what a plan with a `search` statement writes, as the search
 * keeps it: a mesh whose shape fixes tp, pp, dp (cp, ep), the split into
 * micro-batches, a schedule, recomputation, ZeRO stages and buckets. The search writes the splits,
 * replications, stages and placement; a written one of those is an error
 * at its statement, as is what the search could not place around its own
 * statements (a second mesh, a mesh after `search`, a shard before it). */
#include <string.h>

#include "search_int.h"

static const char *const known_axes[] = {"dp", "pp", "tp", "cp", "ep"};

static bool read_mesh(const decision *d, int i, int at, const weft_cluster *cl, weft_diags *dg, search_fixed *f) {
  if (f->mesh >= 0) {
    weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "a plan with `search` writes at most one mesh, and %s is a second",
                            d->name);
    diag_hint(g, dg, "the search places every operator on mesh %s, whose shape it keeps", f->mesh_name);
    return false;
  }
  if (i >= at) {
    weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "mesh %s stands after `search`, whose statements place operators on it",
                            d->name);
    diag_hint(g, dg, "write the mesh before `search`");
    return false;
  }
  bool in_order = d->ndevices == cl->ndevices;
  for (int k = 0; k < d->ndevices && in_order; k++) in_order = d->devices[k] == k;
  if (!in_order) {
    weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "mesh %s must hold the cluster's %d devices in order for the search, "
                            "which places the plan on all of them", d->name, cl->ndevices);
    diag_hint(g, dg, "write it over every device: mesh %s = devices as [...]", d->name);
    return false;
  }
  int64_t positions = 1;
  for (int k = 0; k < d->naxes; k++) positions *= d->sizes[k];
  if (positions != d->ndevices) {
    weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "mesh %s has %lld positions but %d devices", d->name,
                            (long long)positions, d->ndevices);
    diag_hint(g, dg, "the product of the axis sizes must equal the number of devices");
    return false;
  }
  int sizes[5] = {1, 1, 1, 1, 1};
  for (int k = 0; k < d->naxes; k++) {
    int w = -1;
    for (int q = 0; q < 5; q++)
      if (strcmp(d->axes[k], known_axes[q]) == 0) w = q;
    if (w < 0) {
      weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "mesh %s has an axis '%s', which the search does not write",
                              d->name, d->axes[k]);
      diag_hint(g, dg, "the search's axes are dp (data), pp (pipeline), tp (tensor), cp (context) and ep (experts)");
      return false;
    }
    sizes[w] = d->sizes[k];
  }
  f->mesh = i;
  f->mesh_name = d->name;
  f->dp = sizes[0], f->pp = sizes[1], f->tp = sizes[2], f->cp = sizes[3], f->ep = sizes[4];
  return true;
}

/* The batch dimension as the search splits it: the first dimension of the
 * model's first input. */
static const char *batch_of(const weft_graph *g) {
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_INPUT && g->tensors[t].ndims > 0) return g->tensors[t].dims[0].name;
  return NULL;
}

/* A split of every operator along the batch, in time: the micro-batches. */
static bool read_micro_batches(const decision *d, int i, int at, const weft_graph *g, weft_diags *dg, search_fixed *f) {
  const char *batch = batch_of(g);
  if (i >= at || d->ops.n != g->nops || !batch || strcmp(d->name, batch) != 0) {
    weft_diag *e = diag_add(dg, DIAG_ERROR, d->loc, "beside `search` a split in time stands before it, of every "
                            "operator along the batch: the micro-batches");
    diag_hint(e, dg, "write `split all on %s into N in time` before `search`, or leave the micro-batches to it",
              batch ? batch : "batch");
    return false;
  }
  f->micro_batches = d->parts;
  return true;
}

/* A split or replication along tp, before `search`: those operators' part
 * of the tensor-parallel layout, which the search keeps. */
static bool read_tp(const decision *d, int i, int at, const weft_graph *g, weft_diags *dg, search_fixed *f) {
  if (i >= at) {
    weft_diag *e = diag_add(dg, DIAG_ERROR, d->loc, "a %s along tp beside `search` stands before it, which places "
                            "the operators it splits", d->kind == DEC_SPLIT ? "split" : "replication");
    diag_hint(e, dg, "write it before `search`");
    return false;
  }
  if (f->tp_parts && d->parts != f->tp_parts) {
    int first = -1;
    for (int op = 0; op < g->nops && first < 0; op++) first = f->tp_from[op];
    weft_loc l = f->written->items[first].loc;
    weft_diag *e = diag_add(dg, DIAG_ERROR, d->loc, "this makes %d parts along tp, and %d:%d makes %d", d->parts,
                            l.line, l.col, f->tp_parts);
    diag_hint(e, dg, "every split and replication along tp beside `search` makes as many parts: tp's size");
    return false;
  }
  if (!f->tp_from) {
    f->tp_from = arena_alloc(dg->arena, sizeof(int) * (size_t)(g->nops ? g->nops : 1));
    for (int op = 0; op < g->nops; op++) f->tp_from[op] = -1;
  }
  for (int k = 0; k < d->ops.n; k++) {
    int op = d->ops.ops[k];
    if (f->tp_from[op] >= 0) {
      weft_diag *e = diag_add(dg, DIAG_ERROR, d->loc, "%s is split along tp by an earlier statement too (%d:%d)",
                              g->ops[op].name, f->written->items[f->tp_from[op]].loc.line,
                              f->written->items[f->tp_from[op]].loc.col);
      diag_hint(e, dg, "beside `search` an operator is split along tp once, along one dimension");
      return false;
    }
    f->tp_from[op] = i;
    f->tp_written++;
  }
  f->tp_parts = d->parts;
  return true;
}

/* A stage before `search`: the pipeline's stages are the ones written. */
static bool read_stage(const decision *d, int i, int at, weft_diags *dg, search_fixed *f) {
  if (i >= at) {
    weft_diag *e = diag_add(dg, DIAG_ERROR, d->loc, "stage %s stands after `search`, whose statements place the "
                            "stages", d->name);
    diag_hint(e, dg, "write the stages before `search`");
    return false;
  }
  if (!f->stages) f->stages = arena_alloc(dg->arena, sizeof(int) * (size_t)(f->written->n + 1));
  f->stages[f->nstages++] = i;
  return true;
}

bool search_fixed_read(const weft_decisions *written, int at, const weft_graph *g, const weft_cluster *cl,
                       weft_diags *dg, search_fixed *out) {
  search_fixed *f = out;
  *f = (search_fixed){.written = written, .at = at, .mesh = -1, .tp = 1, .pp = 1, .dp = 1, .cp = 1, .ep = 1,
                      .schedule = -1, .recompute = -1, .zero = -1, .buckets = -1, .micro_batches = -1};
  int sched_at = -1;
  for (int i = 0; i < written->n; i++) {
    const decision *d = &written->items[i];
    switch (d->kind) {
    case DEC_MESH:
      if (!read_mesh(d, i, at, cl, dg, f)) return false;
      break;
    case DEC_SCHEDULE:
      if (d->sched != SCHED_GPIPE && d->sched != SCHED_1F1B && d->sched != SCHED_INTERLEAVED) {
        weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "%s cannot stand beside `search`, which writes the schedules "
                                "gpipe, one_f_one_b and interleaved", d->sched == SCHED_GRID ? "a schedule grid"
                                : "schedule interlaced");
        diag_hint(g, dg, "write one of those, or the whole plan without `search`");
        return false;
      }
      f->schedule = d->sched;
      sched_at = i;
      break;
    case DEC_RECOMPUTE:
      if (d->mode > f->recompute) f->recompute = d->mode;
      break;
    case DEC_SHARD:
      if (i < at || strcmp(d->axis, "dp") != 0) {
        weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, i < at ? "shard stands before `search`, which writes the split "
                                "along dp that it needs" : "shard over %s: the search's data-parallel axis is dp",
                                d->axis);
        diag_hint(g, dg, i < at ? "write it after `search`" : "write it `over dp`");
        return false;
      }
      if (d->state > f->zero) f->zero = d->state;
      break;
    case DEC_BUCKETS: f->buckets = d->bytes; break;
    case DEC_STAGE:
      if (!read_stage(d, i, at, dg, f)) return false;
      break;
    case DEC_SPLIT:
    case DEC_REPLICATE:
      if (d->kind == DEC_SPLIT && d->in_time && f->micro_batches < 0) {
        if (!read_micro_batches(d, i, at, g, dg, f)) return false;
        break;
      }
      if (!d->in_time && d->axis && strcmp(d->axis, "tp") == 0) {
        if (!read_tp(d, i, at, g, dg, f)) return false;
        break;
      }
      /* fall through */
    default: {
      weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "%s cannot stand beside `search`, which writes the stages, "
                              "placement, order and every split and replication but those along tp and the "
                              "micro-batches", dec_kind_names[d->kind]);
      diag_hint(g, dg, "a plan with `search` may write its mesh, splits and replications along tp, micro-batches, "
                "schedule, recompute, shard and buckets; write the rest without `search`, or leave it to the search");
      return false;
    }
    }
  }
  if (f->tp_parts && f->mesh >= 0 && f->tp != f->tp_parts) {
    const decision *d = &written->items[f->mesh];
    weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "mesh %s has tp = %d, and the plan splits along tp into %d",
                            f->mesh_name, f->tp, f->tp_parts);
    diag_hint(g, dg, "make the splits along tp as many parts as the mesh's tp axis");
    return false;
  }
  if (f->nstages && f->mesh >= 0 && f->nstages % f->pp) {
    const decision *d = &written->items[f->mesh];
    weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "mesh %s has pp = %d, and the plan writes %d stages, which its "
                            "positions do not share evenly", f->mesh_name, f->pp, f->nstages);
    diag_hint(g, dg, "write a multiple of pp stages (one per position, or as many per position for an "
              "interleaved schedule)");
    return false;
  }
  if (sched_at >= 0 && f->mesh >= 0 && f->pp == 1) {
    const decision *d = &written->items[sched_at];
    weft_diag *g = diag_add(dg, DIAG_ERROR, d->loc, "schedule %s orders the stages of a pipeline, and mesh %s has no "
                            "pp axis to make them", sched_kind_names[d->sched], f->mesh_name);
    diag_hint(g, dg, "give the mesh a pp axis, or leave the schedule to the search");
    return false;
  }
  return true;
}

static const char *rc_names[] = {"none", "selective", "full"};
static const char *zero_names[] = {"", "optimizer", "gradients", "parameters"};

const char *search_fixed_kept(arena *a, const search_fixed *f) {
  const char *t = "";
  if (f->mesh >= 0) {
    const decision *d = &f->written->items[f->mesh];
    t = arena_printf(a, "mesh %s [", d->name);
    for (int k = 0; k < d->naxes; k++) t = arena_printf(a, "%s%s%s = %d", t, k ? ", " : "", d->axes[k], d->sizes[k]);
    t = arena_printf(a, "%s]", t);
  }
  if (f->tp_written)
    t = arena_printf(a, "%s%sthe tensor-parallel layout of %d operator%s (tp = %d)", t, *t ? ", " : "", f->tp_written,
                     f->tp_written == 1 ? "" : "s", f->tp_parts);
  if (f->nstages) t = arena_printf(a, "%s%s%d stage%s", t, *t ? ", " : "", f->nstages, f->nstages == 1 ? "" : "s");
  if (f->schedule >= 0) t = arena_printf(a, "%s%sschedule %s", t, *t ? ", " : "", sched_kind_names[f->schedule]);
  if (f->recompute >= 0) t = arena_printf(a, "%s%srecompute %s", t, *t ? ", " : "", rc_names[f->recompute]);
  if (f->zero >= 0) t = arena_printf(a, "%s%sshard %s", t, *t ? ", " : "", zero_names[f->zero]);
  if (f->buckets >= 0) t = arena_printf(a, "%s%sbuckets", t, *t ? ", " : "");
  if (f->micro_batches >= 0) t = arena_printf(a, "%s%s%d micro-batches", t, *t ? ", " : "", f->micro_batches);
  return *t ? t : "nothing";
}

const char *search_fixed_open(arena *a, const search_fixed *f) {
  const char *splits = f->tp_written ? "the splits of the other operators" : "the splits";
  const char *stages = f->nstages ? "" : "stages and ";
  const char *t = f->mesh >= 0 ? arena_printf(a, "%s, %splacement on mesh %s", splits, stages, f->mesh_name)
                                : arena_printf(a, "the mesh, %s, %splacement", splits, stages);
  if (f->micro_batches < 0) t = arena_printf(a, "%s, micro-batches", t);
  if (f->schedule < 0) t = arena_printf(a, "%s, schedule", t);
  if (f->recompute < 0) t = arena_printf(a, "%s, recompute", t);
  if (f->zero < 0) t = arena_printf(a, "%s, ZeRO", t);
  if (f->buckets < 0) t = arena_printf(a, "%s, buckets", t);
  return t;
}

bool search_fixed_want(arena *a, sshape *s, const search_fixed *f, weft_diags *dg) {
  const weft_graph *g = s->g;
  s->want = arena_alloc(a, sizeof(char *) * (size_t)(g->nops ? g->nops : 1));
  int *from = arena_alloc(a, sizeof(int) * (size_t)(g->nops ? g->nops : 1));
  for (int op = 0; op < g->nops; op++) s->want[op] = NULL, from[op] = -1;
  for (int op = 0; op < g->nops; op++) {
    int i = f->tp_from[op];
    if (i < 0) continue;
    const decision *d = &f->written->items[i];
    const char *dim = d->kind == DEC_REPLICATE ? "" : d->name;
    /* the blocks are searched once: a block's operator takes what any
     * block writes, and the blocks must agree */
    int at = op;
    if (s->layers > 0 && op >= s->head_end && op < s->tail_start) {
      int l = 0;
      while (l + 1 < s->layers && s->block_start[l + 1] <= op) l++;
      at = s->block_start[0] + (op - s->block_start[l]);
    }
    if (s->want[at] && strcmp(s->want[at], dim) != 0) {
      const decision *e = &f->written->items[from[at]];
      weft_diag *x = diag_add(dg, DIAG_ERROR, d->loc, "%s is %s here, and %s %s at %d:%d: the search gives every "
                              "%s the same layout", g->ops[op].name, *dim ? arena_printf(a, "split on %s", dim)
                              : "replicated", g->ops[at].name, *s->want[at] ? arena_printf(a, "split on %s",
                              s->want[at]) : "replicated", e->loc.line, e->loc.col, s->block_name);
      diag_hint(x, dg, "write the same for the operator of every %s (%s.*...), or the plan without `search`",
                s->block_name, s->block_name);
      return false;
    }
    /* a dimension the search splits along */
    const opspace *sp = s->space[op];
    bool ok = !*dim;
    for (int c = 0; c < sp->nidims && !ok; c++) {
      const idim *x = &sp->idims[c];
      ok = idim_is(sp, c, dim) && !x->nosplit && !strchr(x->sig, '@') && x->size % f->tp_parts == 0 &&
           !(x->dim_name && strcmp(x->dim_name, s->batch) == 0);
    }
    if (!ok) {
      weft_diag *x = diag_add(dg, DIAG_ERROR, d->loc, "the search does not split %s on %s into %d", g->ops[op].name,
                              dim, f->tp_parts);
      diag_hint(x, dg, "split it along a dimension other than the batch that %d parts divide, or leave it to the "
                "search", f->tp_parts);
      return false;
    }
    s->want[at] = dim;
    from[at] = i;
  }
  /* every block as the first */
  for (int l = 1; l < s->layers; l++)
    for (int k = 0; k < s->block_ops; k++) s->want[s->block_start[l] + k] = s->want[s->block_start[0] + k];
  return true;
}

bool search_fixed_layers(arena *a, const sshape *s, const search_fixed *f, weft_diags *dg, int **layers) {
  const weft_graph *g = s->g;
  int *out = arena_alloc(a, sizeof(int) * (size_t)f->nstages);
  int next = 0;  /* the first operator the next stage must hold */
  for (int k = 0; k < f->nstages; k++) {
    const decision *d = &f->written->items[f->stages[k]];
    /* a run of the operators' order, from where the last one ended */
    int lo = g->nops, hi = -1;
    for (int q = 0; q < d->ops.n; q++) {
      if (d->ops.ops[q] < lo) lo = d->ops.ops[q];
      if (d->ops.ops[q] > hi) hi = d->ops.ops[q];
    }
    bool run = d->ops.n == hi - lo + 1 && lo == next;
    bool last = k == f->nstages - 1;
    if (run && last && hi != g->nops - 1) {
      weft_diag *e = diag_add(dg, DIAG_ERROR, d->loc, "the stages written beside `search` end before %s, which no "
                              "stage holds", g->ops[hi + 1].name);
      diag_hint(e, dg, "let the last stage hold the rest of the model");
      return false;
    }
    /* whole blocks, the head in the first stage and the tail in the last */
    int l0 = 0, l1 = 0;
    if (run && s->layers > 0) {
      while (l0 < s->layers && s->block_start[l0] < lo) l0++;
      l1 = l0;
      while (l1 < s->layers && s->block_start[l1] + s->block_ops - 1 <= hi) l1++;
      bool starts = k == 0 ? lo == 0 : l0 < s->layers && s->block_start[l0] == lo;
      int end = l1 == s->layers ? s->tail_start - 1 : s->block_start[l1] - 1;
      bool ends = last ? hi == g->nops - 1 : hi == end && l1 < s->layers;
      run = starts && ends && (k == 0 || lo >= s->head_end) && (last || hi < s->tail_start);
    } else if (run) {
      /* a model without blocks: one stage */
      run = f->nstages == 1;
    }
    if (!run) {
      weft_diag *e = diag_add(dg, DIAG_ERROR, d->loc, "stage %s is not %s", d->name,
                              s->layers > 0 ? arena_printf(a, "a run of whole %s blocks following the stage before "
                                                              "it (the first stage holds what comes before the blocks, "
                                                              "the last what comes after)", s->block_name)
                                            : "the whole model (its operators have no repeated blocks to stage)");
      diag_hint(e, dg, "beside `search` the written stages cut the model at block boundaries, in order: "
                "stage a = {%s..., %s[0..K]}, stage b = ...", s->layers > 0 ? g->ops[0].name : "...",
                s->layers > 0 ? s->block_name : "h");
      return false;
    }
    out[k] = s->layers > 0 ? l1 - l0 : 0;
    next = hi + 1;
  }
  *layers = out;
  return true;
}
