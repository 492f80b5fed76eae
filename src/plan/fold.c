/* fold.c - unfolding micro-batches: a folded plan (plan.h, pfold) holds the
 * sub-operators and the communication of micro-batch 0 only; the others are
 * the same shifted along each tensor's moving dimension. plan_unfold makes
 * them, in the order an unfolded plan would have made its sub-operators. */
#include <stdlib.h>
#include <string.h>

#include "weft/plan.h"

/* The dimensions that do not move share r's intervals (regions are not
 * changed once made): a region split along the sequence holds thousands. */
tregion fold_shift(arena *a, const weft_plan *p, int t, const tregion *r, int mb) {
  int d = p->fold.nmb ? p->fold.tdim[t] : -1;
  if (d < 0 || mb == 0 || d >= r->ndims) return *r;
  tregion c = {r->ndims, arena_alloc(a, sizeof(dregion) * (size_t)r->ndims)};
  memcpy(c.dims, r->dims, sizeof(dregion) * (size_t)r->ndims);
  const dregion *x = &r->dims[d];
  c.dims[d].iv = arena_alloc(a, sizeof(irange) * (size_t)(x->n ? x->n : 1));
  int64_t off = p->fold.tstep[t] * mb;
  for (int i = 0; i < x->n; i++) c.dims[d].iv[i] = (irange){x->iv[i].lo + off, x->iv[i].hi + off};
  return c;
}

/* Communication that happens once per micro-batch: activations and their
 * gradients. Parameter gradients and gathers happen once per step. */
static bool per_microbatch(const pcomm *cm) { return cm->phase == PHASE_FORWARD || cm->phase == PHASE_BACKWARD; }

static bool comm_kept(const pcomm *cm, const bool *keep) {
  if (!keep) return true;
  for (int i = 0; i < cm->ngroup; i++)
    if (cm->group[i] >= 0 && keep[cm->group[i]]) return true;
  return false;
}

void plan_unfold_size(const weft_plan *p, const bool *keep, int64_t *nsubs, int64_t *ncomms) {
  int64_t nmb = p->fold.nmb ? p->fold.nmb : 1, n = 0, nc = 0;
  for (int op = 0; op < p->g->nops; op++) {
    const popplan *pp = &p->ops[op];
    for (int f = 0; f < pp->count; f++) {
      const psub *src = &p->subs[pp->first + f];
      n += !keep || (src->device >= 0 && keep[src->device]);
    }
  }
  for (int i = 0; i < p->ncomms; i++)
    if (comm_kept(&p->comms[i], keep)) nc += per_microbatch(&p->comms[i]) ? nmb : 1;
  *nsubs = n * nmb;
  *ncomms = nc;
}

void plan_unfold(arena *a, weft_plan *p, const bool *keep) {
  /* what moves in one step, before any device's communication is dropped
   * (one replica's standing for every replica's: deps.h, deps_view) */
  for (int i = 0; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    int copies = p->fold.nmb && per_microbatch(cm) ? p->fold.nmb : 1;
    if (p->comm_copies && per_microbatch(cm)) copies *= p->comm_copies;
    p->comm_bytes[cm->phase][cm->kind] += cm->size * copies;
    p->comm_count[cm->phase][cm->kind] += copies;
  }
  int nmb = p->fold.nmb;
  if (!nmb && !keep) return;
  if (!nmb) nmb = 1;
  const weft_graph *g = p->g;
  int nfold = p->nsubs;
  /* index of (folded sub f, micro-batch m) among the new subs: for kept
   * folded sub f (slot[f] >= 0, else dropped) at at[slot[f] * nmb + m] */
  int *slot = arena_alloc(a, sizeof(int) * (size_t)(nfold ? nfold : 1));
  int nkept = 0;
  for (int f = 0; f < nfold; f++) {
    int dv = p->subs[f].device;
    slot[f] = !keep || (dv >= 0 && keep[dv]) ? nkept++ : -1;
  }
  int *at = arena_alloc(a, sizeof(int) * (size_t)nkept * (size_t)nmb + 1);
  /* the new subs, and the coordinates and ranges they do not share with
   * their folded sub, each in one piece */
  int64_t n = 0, ncoord = 0, nrange = 0;
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    int kept = 0;
    for (int f = 0; f < pp->count; f++) {
      const psub *src = &p->subs[pp->first + f];
      kept += !keep || (src->device >= 0 && keep[src->device]);
    }
    n += (int64_t)kept * nmb;
    ncoord += (int64_t)kept * nmb * pp->nsplits;
    nrange += (int64_t)kept * (nmb - 1) * pp->space->nidims;
  }
  psub *subs = arena_alloc(a, sizeof(psub) * (size_t)(n ? n : 1));
  int most = 1;  /* the longest row of an operator's levels after the time level */
  for (int op = 0; op < g->nops; op++) {
    const popplan *pp = &p->ops[op];
    int tl = p->fold.nmb ? p->fold.tlevel[op] : -1, inner = 1;
    for (int i = tl + 1; tl >= 0 && i < pp->nsplits; i++) inner *= pp->splits[i].parts;
    if (inner > most) most = inner;
  }
  int *row = malloc(sizeof(int) * (size_t)most);
  if (!row) weft_oom();
  int *twin = p->fold.nmb ? arena_alloc(a, sizeof(int) * (size_t)(n ? n : 1)) : NULL;
  int *coords = arena_alloc(a, sizeof(int) * (size_t)(ncoord ? ncoord : 1));
  irange *ranges = arena_alloc(a, sizeof(irange) * (size_t)(nrange ? nrange : 1));
  int ns = 0;
  for (int op = 0; op < g->nops; op++) {
    popplan *pp = &p->ops[op];
    int tl = p->fold.nmb ? p->fold.tlevel[op] : -1;
    int ti = tl >= 0 ? pp->splits[tl].idim : -1;
    int first = ns, nsp = pp->nsplits, nid = pp->space->nidims;
    /* the order of the full odometer, micro-batch level included: the
     * levels before the time level, then the micro-batch, then the levels
     * after it; the folded subs are those at micro-batch 0, in the order
     * of the other levels (folded index f = outer * inner + j) */
    int64_t inner = 1;
    for (int i = tl + 1; tl >= 0 && i < nsp; i++) inner *= pp->splits[i].parts;
    int64_t outer = pp->count / (inner ? inner : 1);
    for (int64_t o = 0; o < outer; o++) {
      /* the kept ones of this row (most rows keep none) */
      int nrow = 0;
      for (int64_t j = 0; j < inner; j++)
        if (slot[pp->first + (int)(o * inner + j)] >= 0) row[nrow++] = pp->first + (int)(o * inner + j);
      for (int mb = 0; nrow && mb < nmb; mb++)
        for (int q = 0; q < nrow; q++) {
          int fi = row[q];
          const psub *src = &p->subs[fi];
          psub *s = &subs[ns];
          *s = *src;
          s->coord = coords;
          coords += nsp;
          memcpy(s->coord, src->coord, sizeof(int) * (size_t)nsp);
          if (tl >= 0) s->coord[tl] = mb;
          if (mb) {
            s->range = ranges;
            ranges += nid;
            memcpy(s->range, src->range, sizeof(irange) * (size_t)nid);
            s->range[ti].lo += p->fold.step[op] * mb;
            s->range[ti].hi += p->fold.step[op] * mb;
          }
          if (tl >= 0) s->microbatch = mb;
          /* micro-batch 0 of this folded sub came just before (or is this) */
          if (twin) twin[ns] = mb ? at[(size_t)slot[fi] * (size_t)nmb] : ns;
          at[(size_t)slot[fi] * (size_t)nmb + (size_t)mb] = ns++;
        }
    }
    pp->first = first;
    pp->count = ns - first;
  }
  free(row);
  /* communication: each per-micro-batch one again for every micro-batch */
  int nc = 0, cap = 0;
  for (int i = 0; i < p->ncomms; i++)
    if (comm_kept(&p->comms[i], keep)) cap += per_microbatch(&p->comms[i]) ? nmb : 1;
  pcomm *comms = arena_alloc(a, sizeof(pcomm) * (size_t)(cap ? cap : 1));
  for (int i = 0; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    int copies = per_microbatch(cm) ? nmb : 1;
    if (!comm_kept(cm, keep)) continue;
    for (int mb = 0; mb < copies; mb++) {
      pcomm *c = &comms[nc++];
      *c = *cm;
      if (copies > 1 && p->fold.tdim[cm->tensor] >= 0) c->mb = mb;
      if (mb) {
        c->region = fold_shift(a, p, cm->tensor, &cm->region, mb);
        if (cm->sources) {
          c->sources = arena_alloc(a, sizeof(tregion) * (size_t)cm->ngroup);
          for (int m = 0; m < cm->ngroup; m++) c->sources[m] = fold_shift(a, p, cm->tensor, &cm->sources[m], mb);
        }
        if (cm->from) {
          c->from = arena_alloc(a, sizeof(tregion));
          *c->from = fold_shift(a, p, cm->tensor, cm->from, mb);
        }
        if (cm->parts) {
          c->parts = arena_alloc(a, sizeof(tregion) * (size_t)cm->ngroup);
          for (int m = 0; m < cm->ngroup; m++) c->parts[m] = fold_shift(a, p, cm->tensor, &cm->parts[m], mb);
        }
      }
      if (cm->producer_sub >= 0)
        c->producer_sub = slot[cm->producer_sub] < 0 ? -1 : at[(size_t)slot[cm->producer_sub] * (size_t)nmb + (size_t)mb];
      if (cm->consumer_sub >= 0)
        c->consumer_sub = slot[cm->consumer_sub] < 0 ? -1 : at[(size_t)slot[cm->consumer_sub] * (size_t)nmb + (size_t)mb];
    }
  }
  p->subs = subs;
  p->nsubs = p->scap = ns;
  p->fold.twin = twin;
  p->comms = comms;
  p->ncomms = p->ccap = nc;
  p->fold.nmb = 0;
}
