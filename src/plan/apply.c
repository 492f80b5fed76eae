/* apply.c - the apply stage: a list of primitive decisions (decisions.h)
 * applied to one graph and one cluster makes the plan IR: split trees,
 * stages, meshes, sub-operators and their devices; then the communication
 * (deps.c), micro-batch folding (fold.c) and data-parallel replicas. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/prof.h"
#include "weft/deps.h"
#include "weft/plan.h"

struct plan_builder {
  weft_plan *p;
  arena *a;               /* everything the plan holds */
  weft_diags *dg;
  plan_opts o;
  int *assigns;           /* indices in p->decisions of the DEC_ASSIGN, in order */
  int nassigns, acap;
  int before;             /* errors in dg when the plan began */
  bool failed;
};

/* Work limits, far above published plans (Megatron-LM's 1T model on 3072
 * devices makes 61,680 sub-operators, at most 48 per operator, and 512
 * micro-batches a pipeline): the dependencies of an operator's
 * sub-operators grow with the square of their number, and lowering with
 * that of the micro-batches. PLAN_BUILD_BYTES bounds the records of the
 * sub-operators really built (one micro-batch's when micro-batches are
 * folded): about 17 million, and what is derived from them takes several
 * times more. */
enum {
  PLAN_MAX_SUBS = 1 << 15, PLAN_MAX_MICROBATCHES = 4096,
  PLAN_MAX_COSHARD = 4096,   /* sub-operators of one operator on one device */
};
#define PLAN_BUILD_BYTES ((int64_t)1 << 30)
/* Bytes per unfolded sub-operator or communication, lowered (unfold_fits). */
#define PLAN_UNIT_BYTES 800.0

/* ---- splits ---------------------------------------------------------------------- */

static void add_split(plan_builder *b, popplan *pp, psplit sp) {
  psplit *n = arena_alloc(b->a, sizeof(psplit) * (size_t)(pp->nsplits + 1));
  if (pp->nsplits) memcpy(n, pp->splits, sizeof(psplit) * (size_t)pp->nsplits);
  n[pp->nsplits++] = sp;
  pp->splits = n;
}

/* The idim of op that DIM names: a signature name, or a model dimension name. */
static int find_idim(plan_builder *b, const weft_plan *p, int op, const char *dim, weft_loc loc) {
  const opspace *sp = p->ops[op].space;
  int sig = -1, model = -1, nmodel = 0;
  for (int i = 0; i < sp->nidims; i++) {
    const idim *d = &sp->idims[i];
    if (strcmp(d->sig, dim) == 0 && d->elem == 0 && sig < 0) sig = i;
    if (d->dim_name && strcmp(d->dim_name, dim) == 0) { if (model < 0) model = i; nmodel++; }
  }
  if (sig >= 0) {
    /* a group `b..` is named by its elements' model names, not by b */
    bool group = false;
    for (int i = 0; i < sp->nidims; i++) group |= strcmp(sp->idims[i].sig, dim) == 0 && sp->idims[i].elem > 0;
    if (!group) return sig;
  }
  if (nmodel == 1) return model;
  /* several, but one that splits (attention's queries s, not its keys t^) */
  if (nmodel > 1) {
    int free_one = -1, nfree = 0;
    for (int i = 0; i < sp->nidims; i++)
      if (sp->idims[i].dim_name && strcmp(sp->idims[i].dim_name, dim) == 0 && !sp->idims[i].nosplit) free_one = i, nfree++;
    if (nfree == 1) return free_one;
  }
  char list[512];
  size_t o = 0;
  list[0] = 0;
  for (int i = 0; i < sp->nidims && o < sizeof list - 64; i++) {
    const idim *d = &sp->idims[i];
    if (d->nosplit && !d->dim_name && strchr(d->sig, '@')) continue;
    const char *nm = nmodel > 1 ? (d->elem ? arena_printf(b->a, "%s[%d]", d->sig, d->elem) : d->sig)
                                 : (d->dim_name ? d->dim_name : d->sig);
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", nm);
  }
  weft_diag *g = nmodel > 1
      ? diag_add(b->dg, DIAG_ERROR, loc, "operator %s has several dimensions named '%s'", p->g->ops[op].name, dim)
      : diag_add(b->dg, DIAG_ERROR, loc, "operator %s has no dimension '%s'", p->g->ops[op].name, dim);
  diag_hint(g, b->dg, nmodel > 1 ? "name it by the operator's signature instead: %s" : "its dimensions: %s", list);
  return -1;
}

/* The size of the part of idim d that the levels so far leave to a leaf. */
static int64_t part_size(const popplan *pp, int d) {
  int64_t size = pp->space->idims[d].size;
  for (int i = 0; i < pp->nsplits; i++)
    if (pp->splits[i].idim == d) size /= pp->splits[i].parts;
  return size;
}


static bool apply_split(plan_builder *b, const decision *d) {
  weft_plan *p = b->p;
  const char *axis = d->axis;
  int parts = d->parts;
  if (parts < 1 || parts > 1000000) {
    diag_add(b->dg, DIAG_ERROR, d->loc, "a count must be a positive integer, got %d", parts);
    return false;
  }
  if (d->in_time && parts > PLAN_MAX_MICROBATCHES) {
    weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "%d micro-batches, more than weft supports (%d)", parts,
                            PLAN_MAX_MICROBATCHES);
    diag_hint(g, b->dg, "published pipelines run a few hundred (Megatron-LM's 1T model: 512); larger micro-batches make fewer");
    return false;
  }
  for (int k = 0; k < d->ops.n; k++) {
    int op = d->ops.ops[k];
    popplan *pp = &p->ops[op];
    for (int i = 0; i < pp->nsplits; i++)
      if (strcmp(pp->splits[i].axis, axis) == 0) {
        weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "operator %s is already split along axis '%s'", p->g->ops[op].name, axis);
        diag_hint(g, b->dg, "the first split is at line %d; name this level with `as AXIS`", pp->splits[i].loc.line);
        return false;
      }
    int64_t count = parts;
    for (int i = 0; i < pp->nsplits; i++) count *= pp->splits[i].parts;
    if (count > PLAN_MAX_SUBS) {
      weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "operator %s would have %" PRId64 " sub-operators, more than weft supports (%d)",
                         p->g->ops[op].name, count, PLAN_MAX_SUBS);
      diag_hint(g, b->dg, "the product of the parts of an operator's levels is its number of sub-operators");
      return false;
    }
    psplit sp = {.kind = SPLIT_REPLICA, .idim = -1, .parts = parts, .axis = axis, .loc = d->loc};
    if (d->kind == DEC_SPLIT) {
      int di = find_idim(b, p, op, d->name, d->loc);
      if (di < 0) return false;
      const idim *id = &pp->space->idims[di];
      if (id->nosplit) {
        weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "dimension %s of %s cannot be split", id->dim_name ? id->dim_name : id->sig,
                           p->g->ops[op].name);
        diag_hint(g, b->dg, "its signature marks it '^': %s needs it whole", p->g->ops[op].decl->name);
        return false;
      }
      if (id->reduce && d->in_time) {
        diag_add(b->dg, DIAG_ERROR, d->loc, "dimension %s of %s is a reduction: it cannot be split in time",
            id->dim_name ? id->dim_name : id->sig, p->g->ops[op].name);
        return false;
      }
      int64_t size = part_size(pp, di);
      if (size % parts != 0) {
        weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "%s: %s = %" PRId64 " is not divisible by %d", p->g->ops[op].name,
                           id->dim_name ? id->dim_name : id->sig, size, parts);
        diag_hint(g, b->dg, "every part of a split has the same size");
        return false;
      }
      /* a dimension the result lacks is summed over (k+ of matmul, the batch
       * of a loss): its parts hold partial sums */
      bool in_result = false;
      const tmap *om = &pp->space->output;
      for (int t = 0; t < om->ndims && !in_result; t++)
        for (int f = 0; f < om->nfactors[t] && !in_result; f++) in_result = om->factors[t][f] == di;
      sp.idim = di;
      sp.kind = d->in_time ? SPLIT_TIME : (id->reduce || !in_result) ? SPLIT_VALUE : SPLIT_DIM;
    }
    add_split(b, pp, sp);
  }
  return true;
}

/* ---- meshes, stages, orders, schedules ------------------------------------------- */

static bool apply_mesh(plan_builder *b, const decision *d) {
  weft_plan *p = b->p;
  int n = d->ndevices;
  bool *seen = arena_alloc(b->a, sizeof(bool) * (size_t)(p->ndevices ? p->ndevices : 1));
  for (int i = 0; i < n; i++) {
    if (d->devices[i] < 0 || d->devices[i] >= p->ndevices) {
      diag_add(b->dg, DIAG_ERROR, d->loc, "device %d does not exist: the cluster has devices 0 to %d", d->devices[i], p->ndevices - 1);
      return false;
    }
    if (seen[d->devices[i]]) { diag_add(b->dg, DIAG_ERROR, d->loc, "device %d is in the mesh twice", d->devices[i]); return false; }
    seen[d->devices[i]] = true;
  }
  int64_t prod = 1;
  for (int i = 0; i < d->naxes; i++) {
    if (d->sizes[i] < 1) {
      diag_add(b->dg, DIAG_ERROR, d->loc, "axis %s of mesh %s has size %d", d->axes[i], d->name, d->sizes[i]);
      return false;
    }
    prod *= d->sizes[i];
  }
  if (prod != n) {
    weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "mesh %s has %" PRId64 " positions but %d devices", d->name, prod, n);
    diag_hint(g, b->dg, "the product of the axis sizes must equal the number of devices");
    return false;
  }
  pmesh m = {.name = d->name, .naxes = d->naxes, .axes = d->axes, .sizes = d->sizes, .devices = d->devices,
             .loc = d->loc};
  arena_grow(b->a, (void **)&p->meshes, &p->mcap, p->nmeshes + 1, sizeof(pmesh));
  p->meshes[p->nmeshes++] = m;
  return true;
}

static bool apply_stage(plan_builder *b, const decision *d) {
  weft_plan *p = b->p;
  for (int k = 0; k < p->nstages; k++)
    if (strcmp(p->stages[k].name, d->name) == 0) {
      diag_add(b->dg, DIAG_ERROR, d->loc, "stage %s is defined twice", d->name);
      return false;
    }
  for (int k = 0; k < d->ops.n; k++) {
    popplan *pp = &p->ops[d->ops.ops[k]];
    if (pp->stage >= 0) {
      diag_add(b->dg, DIAG_ERROR, d->loc, "operator %s is already in stage %s", p->g->ops[d->ops.ops[k]].name, p->stages[pp->stage].name);
      return false;
    }
    pp->stage = p->nstages;
  }
  arena_grow(b->a, (void **)&p->stages, &p->stcap, p->nstages + 1, sizeof(pstage));
  p->stages[p->nstages++] = (pstage){d->name, d->ops.n, d->ops.ops, d->loc};
  return true;
}

static bool apply_order(plan_builder *b, const decision *d) {
  weft_plan *p = b->p;
  for (int k = 0; k < d->ops.n; k++)
    for (int j = 0; j < d->after.n; j++)
      if (d->after.ops[j] == d->ops.ops[k]) {
        diag_add(b->dg, DIAG_ERROR, d->loc, "operator %s is on both sides of `order`", p->g->ops[d->ops.ops[k]].name);
        return false;
      }
  arena_grow(b->a, (void **)&p->orders, &p->orcap, p->norders + 1, sizeof(porder));
  p->orders[p->norders++] = (porder){d->ops.n, d->after.n, d->ops.ops, d->after.ops, d->loc};
  return true;
}

/* `recompute`: the operators of one segment (decision.keys) are recomputed
 * together, right before the backward of the segment's last operator; what
 * flows into a segment from outside it is kept. Selective (Korthikanti et
 * al., 2022) recomputes only the operators that are cheap for the memory
 * they free: all but the matrix products (kind "matmul"), whose results
 * are kept. */
static bool apply_recompute(plan_builder *b, const decision *d) {
  weft_plan *p = b->p;
  if (d->mode != 1 && d->mode != 2) {
    diag_add(b->dg, DIAG_ERROR, d->loc, "recompute is selective (1) or full (2), got %d", d->mode);
    return false;
  }
  const char **keys = arena_alloc(b->a, sizeof(char *) * (size_t)(d->ops.n ? d->ops.n : 1));
  int nkeys = 0, base = p->nsegs;
  for (int k = 0; k < d->ops.n; k++) {
    int op = d->ops.ops[k];
    const char *kind = p->g->ops[op].kind;
    if (d->mode == 1 && kind && strcmp(kind, "matmul") == 0) continue;
    const char *key = d->keys ? d->keys[k] : p->g->ops[op].name;
    int id = -1;
    for (int j = 0; j < nkeys && id < 0; j++)
      if (strcmp(keys[j], key) == 0) id = j;
    if (id < 0) { keys[nkeys] = key; id = nkeys++; }
    p->ops[op].recompute = d->mode;
    p->ops[op].rseg = base + id;
  }
  p->nsegs = base + nkeys;
  return true;
}

/* ZeRO (`shard STATE SEL over AXIS`): each parameter the selected operators
 * read keeps one part of its optimizer state (stage 1), and also of its
 * gradient (2) and of its values (3), on each device of the group that sums
 * its gradient. The stages nest: a parameter keeps the highest asked. AXIS
 * is the axis its copies differ along, so the decision follows the splits
 * that make them. */
static bool apply_shard(plan_builder *b, const decision *d) {
  weft_plan *p = b->p;
  if (d->state < 1 || d->state > 3) {
    diag_add(b->dg, DIAG_ERROR, d->loc, "ZeRO shards the optimizer state (1), gradients (2) or parameters (3), got %d", d->state);
    return false;
  }
  for (int k = 0; k < d->ops.n; k++) {
    const popplan *pp = &p->ops[d->ops.ops[k]];
    bool along = false;
    for (int i = 0; i < pp->nsplits && !along; i++) along = strcmp(pp->splits[i].axis, d->axis) == 0;
    if (!along) {
      weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "operator %s is not split along axis '%s'", p->g->ops[d->ops.ops[k]].name, d->axis);
      diag_hint(g, b->dg, "`shard` divides the copies of parameters made along an axis: "
                          "split the operator along it first");
      return false;
    }
    for (int a = 0; a < pp->space->ninputs; a++) {
      int t = pp->space->inputs[a].tensor;
      const gtensor *gt = &p->g->tensors[t];
      /* a scalar has no dimension to cut: its gradient stays all-reduced */
      if (gt->role != TENSOR_PARAM || gt->ndims == 0) continue;
      pzero *z = &p->zero[t];
      if (d->state >= z->stage) *z = (pzero){d->state, d->axis, d->loc};
    }
  }
  return true;
}

/* ---- micro-batch folding ------------------------------------------------------- */

/* Whether an assignment's devices depend on `axis` (then micro-batches may
 * be placed differently). */
static bool reads_axis(const decision *d, const char *axis) {
  for (int i = 0; i < d->nnames; i++)
    if (strcmp(d->names[i], axis) == 0) return true;
  for (int i = 0; i < d->nidx; i++)
    if (d->idx[i].axis && strcmp(d->idx[i].axis, axis) == 0) return true;
  return false;
}

/* Folding pays when there are many sub-operators; WEFT_FOLD=always or
 * never overrides (the tests compare both). */
enum { FOLD_MIN_SUBS = 1 << 16 };

/* Sets p->fold when micro-batches differ only by a shift (see plan.h). */
static void fold_setup(plan_builder *b) {
  weft_plan *p = b->p;
  const weft_graph *g = p->g;
  const char *mode = getenv("WEFT_FOLD");
  if (mode && strcmp(mode, "never") == 0) return;
  bool always = mode && strcmp(mode, "always") == 0;
  int nmb = 0;
  int64_t total = 0;
  int *tlevel = arena_alloc(b->a, sizeof(int) * (size_t)(g->nops ? g->nops : 1));
  int64_t *step = arena_alloc(b->a, sizeof(int64_t) * (size_t)(g->nops ? g->nops : 1));
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    int64_t count = 1;
    tlevel[op] = -1;
    for (int i = 0; i < pp->nsplits; i++) {
      count *= pp->splits[i].parts;
      if (pp->splits[i].kind != SPLIT_TIME) continue;
      if (tlevel[op] >= 0) return;  /* two time levels */
      tlevel[op] = i;
    }
    total += count;
    if (tlevel[op] < 0) return;
    const psplit *ts = &pp->splits[tlevel[op]];
    if (nmb == 0) nmb = ts->parts;
    if (ts->parts != nmb || nmb < 2) return;
    /* the part size at the time level */
    int64_t size = pp->space->idims[ts->idim].size;
    for (int i = 0; i <= tlevel[op]; i++) {
      if (pp->splits[i].idim != ts->idim) continue;
      if (size % pp->splits[i].parts) return;
      size /= pp->splits[i].parts;
    }
    step[op] = size;
  }
  if (nmb < 2 || (!always && total < FOLD_MIN_SUBS)) return;
  /* every tensor moves along one dimension, by the same offset for all its operators */
  int *tdim = arena_alloc(b->a, sizeof(int) * (size_t)(g->ntensors ? g->ntensors : 1));
  int64_t *tstep = arena_alloc(b->a, sizeof(int64_t) * (size_t)(g->ntensors ? g->ntensors : 1));
  bool *seen = arena_alloc(b->a, (size_t)(g->ntensors ? g->ntensors : 1));
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    int ti = pp->splits[tlevel[op]].idim;
    for (int k = -1; k < pp->space->ninputs; k++) {
      const tmap *m = k < 0 ? &pp->space->output : &pp->space->inputs[k];
      int dim = -1;
      int64_t st = 0;
      for (int d = 0; d < m->ndims; d++)
        for (int f = 0; f < m->nfactors[d]; f++) {
          if (m->factors[d][f] != ti) continue;
          if (dim >= 0) return;
          dim = d;
          st = step[op];
          for (int q = f + 1; q < m->nfactors[d]; q++) st *= pp->space->idims[m->factors[d][q]].size;
        }
      if (dim >= 0 && g->tensors[m->tensor].role == TENSOR_PARAM) return;
      if (seen[m->tensor] && (tdim[m->tensor] != dim || (dim >= 0 && tstep[m->tensor] != st))) return;
      seen[m->tensor] = true;
      tdim[m->tensor] = dim;
      tstep[m->tensor] = st;
    }
  }
  for (int t = 0; t < g->ntensors; t++)
    if (!seen[t]) tdim[t] = -1;
  /* device expressions that read the time axis place micro-batches apart */
  for (int a = 0; a < b->nassigns; a++) {
    const decision *d = &p->decisions.items[b->assigns[a]];
    for (int k = 0; k < d->ops.n; k++)
      if (reads_axis(d, p->ops[d->ops.ops[k]].splits[tlevel[d->ops.ops[k]]].axis)) return;
  }
  p->fold = (pfold){nmb, nmb, tlevel, step, tdim, tstep, NULL};
}

/* ---- replicas ------------------------------------------------------------------ */

/* Devices that run the same program with devices renamed. An axis qualifies
 * when every operator has a level on it with P parts, and the sub-operators
 * at coordinate j of that level sit on devices that are an image of those
 * at coordinate 0 under one renaming pi_j, the same for every operator.
 *
 * Data-parallel replicas (the first axis found): every operator splits a
 * dimension (or a sum) along it; point-to-point communication stays inside
 * a replica; a collective that leaves one reduces parameter gradients, or
 * gathers ZeRO's parts of parameters, over whole orbits {d, pi_1(d), ...}.
 * Under ZeRO each replica keeps its own part of what is sharded, parts
 * that differ by at most one index along one dimension, the larger ones
 * first in a group (deps.c, dregion_part): a representative with a lower
 * device than its replicas (as in meshes) holds at least what they do.
 *
 * Tensor-parallel peers (a second axis, tried on top of the first): each
 * operator splits a dimension evenly along it (every part the same size),
 * splits a sum, or replicates; point-to-point communication stays inside a
 * class (peer i of one stage sends to peer i of the next); a collective
 * that leaves a class spans whole orbits (a tensor-parallel group). The
 * peers of a group then run programs that differ only in which part of a
 * dimension they hold, and meet at every collective together: one of them
 * stands for the group in the lowering, the deadlock check, the memory rule
 * and the simulation. Where a part is applied once (a bias under a split
 * sum), coordinate 0 does the most work, so it is the one kept.
 *
 * deps derived the same communication for each class (in the same order),
 * so lowering the representatives alone decides rules 3 to 5 for all. */
/* The placement half: cls[d] gets device d's coordinate along the axis
 * and inv[d] the device at coordinate 0 that d is an image of (-1 for the
 * devices at 0 and those unused). */
/* The device of every sub-operator, in one array: reps_place reads them
 * many times over (once per axis tried), a few bytes of each large psub. */
static int *sub_devices(const weft_plan *p) {
  int *dev = malloc(sizeof(int) * (size_t)(p->nsubs ? p->nsubs : 1));
  if (!dev) weft_oom();
  for (int s = 0; s < p->nsubs; s++) dev[s] = p->subs[s].device;
  return dev;
}

static bool reps_place(const weft_plan *p, const int *sdev, const char *axis, int P, bool peers, int *cls, int *inv) {
  const weft_graph *g = p->g;
  int D = p->ndevices;
  for (int d = 0; d < D; d++) cls[d] = inv[d] = -1;
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    int lv = -1;
    for (int i = 0; i < pp->nsplits; i++)
      if (strcmp(pp->splits[i].axis, axis) == 0) lv = i;
    if (lv < 0 || pp->splits[lv].parts != P) return false;
    split_kind k = pp->splits[lv].kind;
    /* a dimension split, or the batch of a loss (partial sums nobody reads) */
    if (k != SPLIT_DIM && k != SPLIT_VALUE && !(peers && k == SPLIT_REPLICA)) return false;
    if (peers && k == SPLIT_DIM && pp->space->idims[pp->splits[lv].idim].size % P != 0) return false;
    int tl = p->fold.nmb ? p->fold.tlevel[op] : -1;
    int stride = 1;
    for (int i = lv + 1; i < pp->nsplits; i++)
      if (i != tl) stride *= pp->splits[i].parts;
    /* the subs at coordinate 0 of the level: runs of stride, P strides
     * apart; each run read in order, coordinate by coordinate (what is
     * set does not depend on the order, and a conflict is one in any) */
    const int *dev = sdev + pp->first;
    for (int base = 0; base < pp->count; base += stride * P) {
      int end = base + stride < pp->count ? base + stride : pp->count;
      for (int f = base; f < end; f++) {
        int r = dev[f];
        if (r < 0 || (cls[r] >= 0 && cls[r] != 0)) return false;
        cls[r] = 0;
      }
      for (int j = 1; j < P; j++)
        for (int f = base; f < end; f++) {
          int r = dev[f], q = dev[f + j * stride];
          if (q < 0 || (cls[q] >= 0 && cls[q] != j) || (inv[q] >= 0 && inv[q] != r)) return false;
          cls[q] = j;
          inv[q] = r;
        }
    }
  }
  return true;
}

static bool reps_along(const weft_plan *p, const int *sdev, const char *axis, int P, bool peers, int *cls, int *inv,
                       int *rep) {
  int D = p->ndevices;
  if (!reps_place(p, sdev, axis, P, peers, cls, inv)) return false;
  /* pi_j is one-to-one: every representative has one image per j */
  int *images = calloc((size_t)D, sizeof(int));
  if (!images) weft_oom();
  bool ok = true;
  for (int d = 0; d < D; d++) {
    rep[d] = cls[d] > 0 ? inv[d] : d;
    if (cls[d] > 0) images[inv[d]]++;
  }
  for (int d = 0; d < D && ok; d++)
    if (cls[d] == 0 && images[d] != P - 1) ok = false;
  free(images);
  /* communication stays in a class, or (a collective) spans whole orbits */
  char *in = calloc((size_t)D, 1);
  int *have = calloc((size_t)D, sizeof(int));  /* per representative: its members in the group */
  if (!in || !have) weft_oom();
  for (int i = 0; i < p->ncomms && ok; i++) {
    const pcomm *cm = &p->comms[i];
    bool inside = true;
    for (int k = 0; k < cm->ngroup; k++) inside &= cls[cm->group[k]] == cls[cm->group[0]];
    if (inside) continue;
    if (cm->kind == COMM_SEND || cm->kind == COMM_BROADCAST ||
        (!peers && cm->phase != PHASE_WEIGHTS && cm->phase != PHASE_PARAMS)) {
      ok = false;
      break;
    }
    for (int k = 0; k < cm->ngroup; k++) in[cm->group[k]] = 1, have[rep[cm->group[k]]]++;
    for (int k = 0; k < cm->ngroup && ok; k++) {
      int r = rep[cm->group[k]];
      if (!in[r]) ok = false;
      else if (cm->group[k] == r && have[r] != P) ok = false;
    }
    for (int k = 0; k < cm->ngroup; k++) in[cm->group[k]] = 0, have[rep[cm->group[k]]] = 0;
  }
  free(in);
  free(have);
  return ok;
}

/* Sets p->rep (the representative of each device: data-parallel replicas,
 * then tensor-parallel peers, above), or leaves it NULL; returns the axis of
 * the replicas (NULL: none). WEFT_REPS=never lowers every device;
 * WEFT_REPS=replicas keeps tensor-parallel peers. */
static const char *find_reps(plan_builder *b, weft_plan *p) {
  const weft_graph *g = p->g;
  const char *mode = getenv("WEFT_REPS");
  if (!b->o.reps || (mode && strcmp(mode, "never") == 0) || g->nops == 0) return NULL;
  int D = p->ndevices;
  int *cls = malloc(sizeof(int) * (size_t)D);
  int *inv = malloc(sizeof(int) * (size_t)D);
  int *rep = arena_alloc(b->a, sizeof(int) * (size_t)D);
  int *peer = malloc(sizeof(int) * (size_t)D);
  /* each device's coordinate along the replicas' axis and the peers' */
  int *coord[2] = {calloc((size_t)D, sizeof(int)), calloc((size_t)D, sizeof(int))};
  if (!cls || !inv || !peer || !coord[0] || !coord[1]) weft_oom();
  const popplan *p0 = &p->ops[0];
  const char *first = NULL;
  int *sdev = NULL;
  /* ZeRO-3 gathers parameters as each device's own timeline reaches them:
   * a peer that applies less (no bias under a split sum) runs ahead and
   * holds more gathered parameters at its peak than the one kept */
  bool zero3 = false;
  for (int t = 0; t < g->ntensors; t++) zero3 |= p->zero[t].stage >= 3;
  for (int pass = 0; pass < 2; pass++) {
    bool peers = pass == 1;
    if (peers && ((mode && strcmp(mode, "replicas") == 0) || zero3)) break;
    for (int cand = 0; cand < p0->nsplits; cand++) {
      const psplit *cs = &p0->splits[cand];
      bool kind_ok = cs->kind == SPLIT_DIM || cs->kind == SPLIT_VALUE || (peers && cs->kind == SPLIT_REPLICA);
      if (!kind_ok || cs->parts < 2 || cs->kind == SPLIT_TIME || (first && strcmp(cs->axis, first) == 0)) continue;
      if (!sdev) sdev = sub_devices(p);
      if (!reps_along(p, sdev, cs->axis, cs->parts, peers, cls, inv, peers ? peer : rep)) continue;
      memcpy(coord[pass], cls, sizeof(int) * (size_t)D);
      if (!peers) {
        first = cs->axis;
        p->rep = rep;
      } else if (p->rep) {
        for (int d = 0; d < D; d++) rep[d] = peer[rep[d]];
      } else {
        memcpy(rep, peer, sizeof(int) * (size_t)D);
        p->rep = rep;
      }
      break;
    }
  }
  /* the root stands for its class, and every class is represented by its
   * device at the root's coordinates (so that the representatives still
   * pair as the devices they stand for: peer i sends to peer i) */
  if (p->rep && b->o.rooted && b->o.root >= 0 && b->o.root < D) {
    int n = b->o.root;
    for (int d = 0; d < D; d++) inv[d] = -1;  /* per old representative: the new one */
    for (int d = 0; d < D; d++)
      if (coord[0][d] == coord[0][n] && coord[1][d] == coord[1][n]) inv[p->rep[d]] = d;
    for (int d = 0; d < D; d++)
      if (inv[p->rep[d]] >= 0) p->rep[d] = inv[p->rep[d]];
  }
  free(sdev);
  free(cls);
  free(inv);
  free(peer);
  free(coord[0]);
  free(coord[1]);
  return first;
}

/* Whether the communication of the replicas along axis (cls and inv from
 * reps_place) can be derived for one replica (deps.h, deps_view), which v
 * then describes: each pi_j keeps the order of devices and maps the nodes
 * of replica 0 one to one onto nodes (so what deps decides by comparing
 * devices or nodes is decided alike), and every tensor that is
 * communicated moves with the replica along one dimension by one offset
 * for every operator that touches it, while parameters do not move (the
 * analysis of micro-batch folding, fold_setup, for this level). */
static bool view_fits(plan_builder *b, weft_plan *p, const char *axis, int P, const int *cls, const int *inv,
                      deps_view *v) {
  const weft_graph *g = p->g;
  int D = p->ndevices, dpn = p->devices_per_node, nnodes = dpn ? (D + dpn - 1) / dpn : 1;
  /* per replica-0 device (in increasing order), its image in replica j */
  int *at = malloc(sizeof(int) * (size_t)D), *img = malloc(sizeof(int) * (size_t)D);
  int *fwd = malloc(sizeof(int) * (size_t)nnodes), *back = malloc(sizeof(int) * (size_t)nnodes);
  if (!at || !img || !fwd || !back) weft_oom();
  int n0 = 0;
  for (int d = 0; d < D; d++) at[d] = cls[d] == 0 ? n0++ : -1;
  bool ok = n0 > 0 && (int64_t)n0 * P <= D;
  for (int i = 0; ok && i < n0 * P; i++) img[i] = -1;
  for (int d = 0; d < D && ok; d++) {
    if (cls[d] == 0) img[at[d]] = d;
    else if (cls[d] > 0) img[cls[d] * n0 + at[inv[d]]] = d;
  }
  for (int j = 1; j < P && ok; j++) {
    for (int k = 0; k < nnodes; k++) fwd[k] = back[k] = -1;
    for (int k = 0; k < n0 && ok; k++) {
      int d = img[k], q = img[j * n0 + k];
      if (q < 0 || (k && q <= img[j * n0 + k - 1])) { ok = false; break; }
      int x = dpn ? d / dpn : 0, y = dpn ? q / dpn : 0;
      if ((fwd[x] >= 0 && fwd[x] != y) || (back[y] >= 0 && back[y] != x)) ok = false;
      fwd[x] = y;
      back[y] = x;
    }
  }
  free(at);
  free(img);
  free(fwd);
  free(back);
  if (!ok) return false;
  int *level = arena_alloc(b->a, sizeof(int) * (size_t)(g->nops ? g->nops : 1));
  int *stride = arena_alloc(b->a, sizeof(int) * (size_t)(g->nops ? g->nops : 1));
  int *tdim = malloc(sizeof(int) * (size_t)(g->ntensors ? g->ntensors : 1));
  int64_t *tstep = malloc(sizeof(int64_t) * (size_t)(g->ntensors ? g->ntensors : 1));
  bool *seen = calloc((size_t)(g->ntensors ? g->ntensors : 1), 1), *read = calloc((size_t)(g->ntensors ? g->ntensors : 1), 1);
  if (!tdim || !tstep || !seen || !read) weft_oom();
  for (int op = 0; op < g->nops && ok; op++) {
    const popplan *pp = &p->ops[op];
    int lv = -1;
    for (int i = 0; i < pp->nsplits; i++)
      if (strcmp(pp->splits[i].axis, axis) == 0) lv = i;
    if (lv < 0 || pp->splits[lv].idim < 0) { ok = false; break; }
    int tl = p->fold.nmb ? p->fold.tlevel[op] : -1, id = pp->splits[lv].idim;
    level[op] = lv;
    stride[op] = 1;
    for (int i = lv + 1; i < pp->nsplits; i++)
      if (i != tl) stride[op] *= pp->splits[i].parts;
    /* coordinate j of the level is coordinate 0 moved by j parts of the idim */
    int64_t step = pp->space->idims[id].size;
    for (int i = 0; i <= lv; i++)
      if (pp->splits[i].idim == id) step /= pp->splits[i].parts;
    for (int k = -1; k < pp->space->ninputs && ok; k++) {
      const tmap *m = k < 0 ? &pp->space->output : &pp->space->inputs[k];
      int dim = -1;
      int64_t st = 0;
      for (int d = 0; d < m->ndims; d++)
        for (int f = 0; f < m->nfactors[d]; f++) {
          if (m->factors[d][f] != id) continue;
          if (dim >= 0) ok = false;
          dim = d;
          st = step;
          for (int q = f + 1; q < m->nfactors[d]; q++) st *= pp->space->idims[m->factors[d][q]].size;
        }
      if (k >= 0) read[m->tensor] = true;
      if (g->tensors[m->tensor].role == TENSOR_PARAM) {
        if (dim >= 0) ok = false;
        continue;
      }
      if (seen[m->tensor] && (tdim[m->tensor] != dim || tstep[m->tensor] != st)) ok = false;
      seen[m->tensor] = true;
      tdim[m->tensor] = dim;
      tstep[m->tensor] = st;
    }
  }
  /* an activation read by another operator moves (partial sums of the
   * replicas' batch, read, would be summed across them) */
  for (int t = 0; t < g->ntensors && ok; t++)
    if (g->tensors[t].producer >= 0 && read[t] && tdim[t] < 0) ok = false;
  free(tdim);
  free(tstep);
  free(seen);
  free(read);
  if (!ok) return false;
  int c = 0;
  if (b->o.rooted && b->o.root >= 0 && b->o.root < D && cls[b->o.root] > 0) c = cls[b->o.root];
  *v = (deps_view){.P = P, .c = c, .level = level, .stride = stride};
  return true;
}

/* The axis of data-parallel replicas whose communication deps_derive can
 * derive for one replica (view_fits), or NULL. WEFT_DEPS=all derives every
 * device's (the tests compare). */
static const char *find_view(plan_builder *b, weft_plan *p, deps_view *v) {
  const char *mode = getenv("WEFT_REPS"), *dm = getenv("WEFT_DEPS");
  if (!b->o.reps || (mode && strcmp(mode, "never") == 0) || (dm && strcmp(dm, "all") == 0) || p->g->nops == 0)
    return NULL;
  int D = p->ndevices;
  int *cls = malloc(sizeof(int) * (size_t)(D ? D : 1)), *inv = malloc(sizeof(int) * (size_t)(D ? D : 1));
  if (!cls || !inv) weft_oom();
  const popplan *p0 = &p->ops[0];
  const char *axis = NULL;
  int *sdev = NULL;
  for (int cand = 0; cand < p0->nsplits && !axis; cand++) {
    const psplit *cs = &p0->splits[cand];
    if ((cs->kind != SPLIT_DIM && cs->kind != SPLIT_VALUE) || cs->parts < 2) continue;
    if (!sdev) sdev = sub_devices(p);
    if (reps_place(p, sdev, cs->axis, cs->parts, false, cls, inv) && view_fits(b, p, cs->axis, cs->parts, cls, inv, v))
      axis = cs->axis;
  }
  free(sdev);
  free(cls);
  free(inv);
  return axis;
}

/* ---- sub-operators and placement ------------------------------------------------ */

static bool make_subs(plan_builder *b, weft_plan *p) {
  /* every sub-operator of the plan (nsubs_all), and those built: one
   * micro-batch's when micro-batches are folded (plan.h, pfold) */
  int64_t total = 0, built = 0, bytes = 0;
  for (int op = 0; op < p->g->nops; op++) {
    const popplan *pp = &p->ops[op];
    int tl = p->fold.nmb ? p->fold.tlevel[op] : -1;
    int64_t count = 1, folded = 1;
    for (int i = 0; i < pp->nsplits; i++) {
      count *= pp->splits[i].parts;
      if (i != tl) folded *= pp->splits[i].parts;
    }
    total += count;
    built += folded;
    bytes += folded * (int64_t)(sizeof(psub) + sizeof(int) * (size_t)pp->nsplits +
                                sizeof(irange) * (size_t)pp->space->nidims);
  }
  if (built >= INT32_MAX || bytes > PLAN_BUILD_BYTES) {
    char need[32], most[32];
    weft_diag *g = diag_add(b->dg, DIAG_ERROR, p->loc,
                            "plan %s would build %" PRId64 " sub-operators (%s; %" PRId64 " in all), more than the %s of "
                            "sub-operators weft builds",
                            p->name, built, unit_bytes_human(bytes, need, sizeof need), total,
                            unit_bytes_human(PLAN_BUILD_BYTES, most, sizeof most));
    diag_hint(g, b->dg, "fewer parts; micro-batches cost nothing when they differ only by their offset (docs/design/plans.md, section 8)");
    return false;
  }
  arena_grow(b->a, (void **)&p->subs, &p->scap, (int)built + 1, sizeof(psub));
  p->nsubs_all = total;
  total = built;
  for (int op = 0; op < p->g->nops; op++) {
    popplan *pp = &p->ops[op];
    int tl = p->fold.nmb ? p->fold.tlevel[op] : -1;
    int64_t count = 1;
    for (int i = 0; i < pp->nsplits; i++) count *= i == tl ? 1 : pp->splits[i].parts;
    pp->first = p->nsubs;
    pp->count = (int)count;
    int *coord = arena_alloc(b->a, sizeof(int) * (size_t)(pp->nsplits ? pp->nsplits : 1));
    /* the coordinates and ranges of the operator's subs, each in one piece */
    int *coords = arena_alloc(b->a, sizeof(int) * (size_t)(count * pp->nsplits + 1));
    irange *ranges = arena_alloc(b->a, sizeof(irange) * (size_t)(count * pp->space->nidims + 1));
    for (int64_t k = 0; k < count; k++) {
      arena_grow(b->a, (void **)&p->subs, &p->scap, p->nsubs + 1, sizeof(psub));
      psub *s = &p->subs[p->nsubs++];
      memset(s, 0, sizeof *s);
      s->op = op;
      s->dir = DIR_FORWARD;
      s->device = -1;
      s->order = -1;
      s->coord = coords + k * pp->nsplits;
      memcpy(s->coord, coord, sizeof(int) * (size_t)pp->nsplits);
      s->range = ranges + k * pp->space->nidims;
      for (int d = 0; d < pp->space->nidims; d++) s->range[d] = (irange){0, pp->space->idims[d].size};
      int mb = 0;
      for (int i = 0; i < pp->nsplits; i++) {
        const psplit *sp = &pp->splits[i];
        if (sp->kind == SPLIT_TIME) mb = mb * sp->parts + coord[i];
        if (sp->idim < 0) continue;
        irange *r = &s->range[sp->idim];
        int64_t part = (r->hi - r->lo) / sp->parts;
        r->lo += part * coord[i];
        r->hi = r->lo + part;
      }
      s->microbatch = mb;
      for (int i = pp->nsplits - 1; i >= 0; i--) {
        if (i != tl && ++coord[i] < pp->splits[i].parts) break;
        coord[i] = 0;
      }
    }
  }
  return true;
}

/* "h.0.attn.c_attn at part = 4, tp = 1": a sub-operator by its coordinates. */
const char *plan_sub_where(arena *a, const weft_plan *p, const psub *s) {
  const popplan *pp = &p->ops[s->op];
  const char *t = arena_printf(a, "%s", p->g->ops[s->op].name);
  for (int i = 0; i < pp->nsplits; i++)
    t = arena_printf(a, "%s%s %s = %d (of %d)", t, i ? "," : " at", pp->splits[i].axis[0] == '#' ? "level" : pp->splits[i].axis,
                     s->coord[i], pp->splits[i].parts);
  return t;
}

/* Places the sub-operators of an assignment given as data: mesh[idx]. */
static bool device_of_data(plan_builder *b, const decision *d, const psub *s, int *dev) {
  weft_plan *p = b->p;
  const popplan *pp = &p->ops[s->op];
  if (d->mesh < 0) {
    int v = d->nidx ? d->idx[0].value : -1;
    if (v < 0 || v >= p->ndevices) {
      diag_add(b->dg, DIAG_ERROR, d->loc, "device %d does not exist: the cluster has devices 0 to %d", v, p->ndevices - 1);
      return false;
    }
    *dev = v;
    return true;
  }
  if (d->mesh >= p->nmeshes) {
    diag_add(b->dg, DIAG_ERROR, d->loc, "assignment to mesh %d, but the plan has %d", d->mesh, p->nmeshes);
    return false;
  }
  const pmesh *m = &p->meshes[d->mesh];
  if (d->nidx != m->naxes) {
    diag_add(b->dg, DIAG_ERROR, d->loc, "mesh %s has %d axes, indexed with %d", m->name, m->naxes, d->nidx);
    return false;
  }
  int64_t flat = 0;
  for (int i = 0; i < d->nidx; i++) {
    int64_t v = d->idx[i].value;
    if (d->idx[i].axis) {
      int lv = -1;
      for (int k = 0; k < pp->nsplits && lv < 0; k++)
        if (strcmp(pp->splits[k].axis, d->idx[i].axis) == 0) lv = k;
      if (lv < 0) {
        char have[256];
        size_t o = 0;
        have[0] = 0;
        for (int k = 0; k < pp->nsplits && o < sizeof have - 32; k++)
          o += (size_t)snprintf(have + o, sizeof have - o, "%s%s", k ? ", " : "", pp->splits[k].axis);
        weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "operator %s is not split along axis '%s'", p->g->ops[s->op].name, d->idx[i].axis);
        diag_hint(g, b->dg, pp->nsplits ? "its levels: %s; split or replicate it along this axis, or assign it apart"
                                        : "it is not split at all%s; split or replicate it, or assign it apart",
                  have);
        return false;
      }
      v = s->coord[lv];
    }
    if (v < 0 || v >= m->sizes[i]) {
      weft_diag *g = diag_add(b->dg, DIAG_ERROR, d->loc, "index %d of mesh %s must be 0 to %d (axis %s), got %" PRId64, i, m->name,
                         m->sizes[i] - 1, m->axes[i], v);
      diag_hint(g, b->dg, "for the sub-operator of %s", plan_sub_where(b->a, p, s));
      return false;
    }
    flat = flat * m->sizes[i] + v;
  }
  *dev = m->devices[flat];
  return true;
}

static bool place(plan_builder *b, const dec_placer *pl) {
  weft_plan *p = b->p;
  /* the names of all split levels, for the device of each sub-operator */
  const char **levels = NULL;
  int nlevels = 0, lcap = 0;
  for (int op = 0; op < p->g->nops; op++)
    for (int i = 0; i < p->ops[op].nsplits; i++) {
      const char *ax = p->ops[op].splits[i].axis;
      bool seen = false;
      for (int k = 0; k < nlevels && !seen; k++) seen = strcmp(levels[k], ax) == 0;
      if (seen) continue;
      arena_grow(b->a, (void **)&levels, &lcap, nlevels + 1, sizeof(char *));
      levels[nlevels++] = ax;
    }
  for (int a = 0; a < b->nassigns; a++) {
    const decision *d = &p->decisions.items[b->assigns[a]];
    if (d->expr && (!pl || !pl->device)) {
      diag_add(b->dg, DIAG_ERROR, d->loc, "an assignment given as an expression needs the front end that wrote it");
      return false;
    }
    /* an expression reads the coordinates of a sub-operator along named
     * axes and nothing of its operator: operators with the same levels (the
     * same axes and parts, in order) get the same devices, evaluated once */
    int ntmpl = 0;
    const popplan **tmpl = arena_alloc(b->a, sizeof(popplan *) * (size_t)(d->ops.n ? d->ops.n : 1));
    for (int k = 0; k < d->ops.n; k++) {
      popplan *pp = &p->ops[d->ops.ops[k]];
      const popplan *same = NULL;
      for (int q = 0; q < ntmpl && !same; q++) {
        const popplan *o = tmpl[q];
        bool eq = o->nsplits == pp->nsplits && o->count == pp->count;
        for (int i = 0; i < pp->nsplits && eq; i++)
          eq = o->splits[i].parts == pp->splits[i].parts && strcmp(o->splits[i].axis, pp->splits[i].axis) == 0;
        if (eq) same = o;
      }
      if (same) {
        for (int i = 0; i < pp->count; i++) p->subs[pp->first + i].device = p->subs[same->first + i].device;
        pp->assigned = true;
        pp->assign_loc = d->loc;
        continue;
      }
      tmpl[ntmpl++] = pp;
      /* the operator's levels, as the front end sees them */
      const char **axes = arena_alloc(b->a, sizeof(char *) * (size_t)(pp->nsplits ? pp->nsplits : 1));
      int *parts = arena_alloc(b->a, sizeof(int) * (size_t)(pp->nsplits ? pp->nsplits : 1));
      for (int i = 0; i < pp->nsplits; i++) axes[i] = pp->splits[i].axis, parts[i] = pp->splits[i].parts;
      for (int i = 0; i < pp->count; i++) {
        psub *s = &p->subs[pp->first + i];
        dec_sub ds = {d->ops.ops[k], pp->nsplits, axes, parts, s->coord, levels, nlevels};
        bool ok = d->expr ? pl->device(pl->ctx, d, &ds, &s->device) : device_of_data(b, d, s, &s->device);
        if (!ok) return false;
      }
      pp->assigned = true;
      pp->assign_loc = d->loc;
    }
  }
  /* rule 2: every sub-operator on exactly one device */
  bool ok = true;
  int unplaced = 0;
  for (int op = 0; op < p->g->nops && unplaced < 5; op++) {
    if (p->ops[op].assigned) continue;
    weft_diag *g = diag_add(b->dg, DIAG_ERROR, p->loc, "operator %s is not placed: no `assign` selects it", p->g->ops[op].name);
    diag_hint(g, b->dg, "add `assign %s -> DEVICE`, or `assign all -> m[...]`", p->g->ops[op].name);
    ok = false;
    unplaced++;
  }
  return ok;
}

/* ---- the builder ------------------------------------------------------------------- */

plan_builder *plan_begin(const weft_graph *g, const weft_cluster *cl, const char *name, weft_loc loc,
                         const plan_opts *o, arena *a, weft_diags *dg) {
  plan_builder *b = arena_alloc(a, sizeof *b);
  weft_plan *p = arena_alloc(a, sizeof *p);
  b->p = p;
  b->a = a;
  b->dg = dg;
  if (o) b->o = *o;
  b->before = dg->errors;
  p->name = name;
  p->bucket_bytes = PLAN_DEFAULT_BUCKET;
  p->loc = loc;
  p->g = (weft_graph *)g;
  p->cluster = cl->rec;
  p->ndevices = cl->ndevices;
  p->devices_per_node = cl->devices_per_node;
  p->ops = arena_alloc(a, sizeof(popplan) * (size_t)(g->nops ? g->nops : 1));
  p->zero = arena_alloc(a, sizeof(pzero) * (size_t)(g->ntensors ? g->ntensors : 1));
  for (int op = 0; op < g->nops; op++) {
    p->ops[op].space = opspace_build(a, g, op);
    p->ops[op].stage = -1;
    p->ops[op].rseg = -1;
  }
  return b;
}

bool plan_add(plan_builder *b, const decision *d) {
  weft_plan *p = b->p;
  if (b->failed) return false;
  for (int k = 0; k < d->ops.n; k++)
    if (d->ops.ops[k] < 0 || d->ops.ops[k] >= p->g->nops) {
      diag_add(b->dg, DIAG_ERROR, d->loc, "%s: operator %d does not exist (model %s has %d)", dec_kind_names[d->kind], d->ops.ops[k],
          p->g->name, p->g->nops);
      b->failed = true;
      return false;
    }
  *dec_add(b->a, &p->decisions, d->kind) = *d;
  bool ok = true;
  switch (d->kind) {
  case DEC_MESH: ok = apply_mesh(b, d); break;
  case DEC_SPLIT: case DEC_REPLICATE: ok = apply_split(b, d); break;
  case DEC_STAGE: ok = apply_stage(b, d); break;
  case DEC_ASSIGN:
    arena_grow(b->a, (void **)&b->assigns, &b->acap, b->nassigns + 1, sizeof(int));
    b->assigns[b->nassigns++] = p->decisions.n - 1;
    break;
  case DEC_ORDER: ok = apply_order(b, d); break;
  case DEC_SCHEDULE:
    p->sched = d->sched;
    p->sched_loc = d->loc;
    p->grid = d->sched == SCHED_GRID ? d->grid : NULL;
    break;
  case DEC_RECOMPUTE: ok = apply_recompute(b, d); break;
  case DEC_SHARD: ok = apply_shard(b, d); break;
  case DEC_BUCKETS:
    if (d->bytes < 0) {
      diag_add(b->dg, DIAG_ERROR, d->loc, "buckets of %" PRId64 " bytes", d->bytes);
      ok = false;
    }
    p->bucket_bytes = d->bytes;
    p->bucket_loc = d->loc;
    break;
  default:
    diag_add(b->dg, DIAG_ERROR, d->loc, "unknown decision %d", (int)d->kind);
    ok = false;
  }
  if (!ok) b->failed = true;
  return ok;
}

/* Whether no device holds more sub-operators of one operator than
 * PLAN_MAX_COSHARD: what they exchange among themselves grows with the
 * square of their number (a split into 10,000 parts on one device takes
 * seconds to lower, into 32,768 more than a minute). */
static bool coshard_fits(plan_builder *b, weft_plan *p) {
  int *on = calloc((size_t)p->ndevices + 1, sizeof(int));
  if (!on) weft_oom();
  bool ok = true;
  for (int op = 0; op < p->g->nops && ok; op++) {
    const popplan *pp = &p->ops[op];
    if (pp->count <= PLAN_MAX_COSHARD) continue;
    for (int f = 0; f < pp->count && ok; f++) {
      int dv = p->subs[pp->first + f].device;
      if (dv < 0 || dv >= p->ndevices || ++on[dv] <= PLAN_MAX_COSHARD) continue;
      int n = 0;
      for (int k = 0; k < pp->count; k++) n += p->subs[pp->first + k].device == dv;
      weft_diag *g = diag_add(b->dg, DIAG_ERROR, pp->assign_loc.line ? pp->assign_loc : p->loc,
                              "%d sub-operators of %s on device %d, more than weft supports on one device (%d)", n,
                              p->g->ops[op].name, dv, PLAN_MAX_COSHARD);
      diag_hint(g, b->dg, "fewer parts per device (co-shard), or more devices");
      ok = false;
    }
    for (int f = 0; f < pp->count; f++) {
      int dv = p->subs[pp->first + f].device;
      if (dv >= 0 && dv < p->ndevices) on[dv] = 0;
    }
  }
  free(on);
  return ok;
}

/* Whether the unfolded plan, and the program lowered from it, fit what is
 * left of the memory budget: about PLAN_UNIT_BYTES per sub-operator and
 * communication (their instructions and buffers included: 740 bytes each
 * for Megatron-LM's 1T model on 3072 devices), and int indexes. */
static bool unfold_fits(plan_builder *b, weft_plan *p, const bool *keep) {
  int64_t nsubs, ncomms;
  plan_unfold_size(p, keep, &nsubs, &ncomms);
  double need = (double)(nsubs + ncomms) * PLAN_UNIT_BYTES;
  size_t budget = arena_budget(), held = arena_held();
  double left = budget ? (double)(budget > held ? budget - held : 0) : 1e300;
  if (need <= left && nsubs < INT32_MAX / 2 && ncomms < INT32_MAX / 2) return true;
  char b1[32], b2[32], b3[32];
  weft_diag *g = diag_add(b->dg, DIAG_ERROR, p->loc, "the plan unfolds into %" PRId64 " sub-operators and %" PRId64
                          " communications (%d micro-batches, %d devices); lowering them needs about %s, more than the %s "
                          "left of the memory budget of %s", nsubs, ncomms, p->fold.nmb ? p->fold.nmb : 1, p->ndevices,
                          unit_bytes_human((int64_t)fmin(need, 9e18), b1, sizeof b1),
                          unit_bytes_human((int64_t)fmin(left, 9e18), b2, sizeof b2),
                          unit_bytes_human((int64_t)budget, b3, sizeof b3));
  diag_hint(g, b->dg, "fewer micro-batches or devices, or a larger budget (--max-memory)");
  return false;
}

weft_plan *plan_finish(plan_builder *b, const dec_placer *pl) {
  weft_plan *p = b->p;
  if (b->failed) return NULL;
  fold_setup(b);
  if (!make_subs(b, p)) return NULL;
  if (!place(b, pl)) return NULL;
  if (b->dg->errors > b->before || !coshard_fits(b, p)) return NULL;
  prof_mark("sub-operators");
  prof_note("%d sub-operators made, %" PRId64 " with every micro-batch, on %d devices", p->nsubs, p->nsubs_all, p->ndevices);
  /* one replica's communication when the replicas' are its images; if
   * the replicas found after it are not those, every device's */
  deps_view v;
  const char *view = find_view(b, p, &v);
  deps_derive(b->a, p, view ? &v : NULL);
  prof_mark("communication");
  p->used_devices = plan_devices_used(p);
  const char *axis = find_reps(b, p);
  if (view && (!axis || strcmp(axis, view) != 0)) {
    p->ncomms = 0;
    p->comm_copies = 0;
    p->rep = NULL;
    deps_derive(b->a, p, NULL);
    prof_mark("communication, every replica");
    find_reps(b, p);
  }
  bool *keep = NULL;
  if (p->rep) {
    keep = arena_alloc(b->a, (size_t)p->ndevices);
    for (int dv = 0; dv < p->ndevices; dv++) keep[dv] = p->rep[dv] == dv;
  }
  if (!unfold_fits(b, p, keep)) return NULL;
  plan_unfold(b->a, p, keep);
  prof_mark("unfold");
  prof_note("%d sub-operators and %d communications kept, of %d devices", p->nsubs, p->ncomms, p->ndevices);
  return p;
}

weft_plan *plan_apply(const weft_graph *g, const weft_cluster *cl, const weft_decisions *d, const plan_opts *o,
                      arena *a, weft_diags *dg) {
  plan_builder *b = plan_begin(g, cl, d->name ? d->name : "plan", d->loc, o, a, dg);
  weft_plan *p = NULL;
  int i = 0;
  while (i < d->n && plan_add(b, &d->items[i])) i++;
  if (i == d->n) p = plan_finish(b, &d->placer);
  if (d->placer.done) d->placer.done(d->placer.ctx);
  return p;
}

/* ---- reports ------------------------------------------------------------------------- */

int plan_devices_used(const weft_plan *p) {
  bool *used = calloc((size_t)(p->ndevices ? p->ndevices : 1), 1);
  if (!used) weft_oom();
  int n = 0;
  for (int i = 0; i < p->nsubs; i++)
    if (p->subs[i].device >= 0 && !used[p->subs[i].device]) { used[p->subs[i].device] = true; n++; }
  free(used);
  return n;
}

