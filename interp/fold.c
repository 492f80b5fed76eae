/* fold.c - unfolding micro-batches: a folded plan (plan.h, pfold) holds the
 * sub-operators and the communication of micro-batch 0 only; the others are
 * the same shifted along each tensor's moving dimension. plan_unfold makes
 * them, in the order an unfolded plan would have made its sub-operators. */
#include <string.h>

#include "plan.h"

tregion fold_shift(arena *a, const weft_plan *p, int t, const tregion *r, int mb) {
  tregion c = tregion_copy(a, r);
  int d = p->fold.nmb ? p->fold.tdim[t] : -1;
  if (d < 0 || mb == 0 || d >= c.ndims) return c;
  int64_t off = p->fold.tstep[t] * mb;
  for (int i = 0; i < c.dims[d].n; i++) {
    c.dims[d].iv[i].lo += off;
    c.dims[d].iv[i].hi += off;
  }
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

void plan_unfold(arena *a, weft_plan *p, const bool *keep) {
  /* what moves in one step, before any device's communication is dropped */
  for (int i = 0; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    int copies = p->fold.nmb && per_microbatch(cm) ? p->fold.nmb : 1;
    p->comm_bytes[cm->phase][cm->kind] += cm->size * copies;
    p->comm_count[cm->phase][cm->kind] += copies;
  }
  int nmb = p->fold.nmb;
  if (!nmb && !keep) return;
  if (!nmb) nmb = 1;
  const weft_graph *g = p->g;
  int nfold = p->nsubs;
  /* index of (folded sub f, micro-batch m) among the new subs, -1 dropped */
  int *at = arena_alloc(a, sizeof(int) * (size_t)nfold * (size_t)nmb + 1);
  int64_t n = 0;
  for (int op = 0; op < g->nops; op++) n += (int64_t)p->ops[op].count * nmb;
  psub *subs = arena_alloc(a, sizeof(psub) * (size_t)(n ? n : 1));
  int ns = 0;
  for (int op = 0; op < g->nops; op++) {
    popplan *pp = &p->ops[op];
    int tl = p->fold.nmb ? p->fold.tlevel[op] : -1;
    int ti = tl >= 0 ? pp->splits[tl].idim : -1;
    int first = ns;
    /* the full odometer, micro-batch level included; the folded subs are
     * those at micro-batch 0, in the same order */
    int64_t count = (int64_t)pp->count * nmb;
    int *coord = arena_alloc(a, sizeof(int) * (size_t)(pp->nsplits ? pp->nsplits : 1));
    for (int64_t k = 0; k < count; k++) {
      /* the folded index: the odometer over the other levels */
      int f = 0, mb = tl >= 0 ? coord[tl] : 0;
      for (int i = 0; i < pp->nsplits; i++)
        if (i != tl) f = f * pp->splits[i].parts + coord[i];
      const psub *src = &p->subs[pp->first + f];
      int fi = pp->first + f;
      if (!keep || (src->device >= 0 && keep[src->device])) {
        psub *s = &subs[ns];
        *s = *src;
        s->coord = arena_alloc(a, sizeof(int) * (size_t)(pp->nsplits ? pp->nsplits : 1));
        memcpy(s->coord, coord, sizeof(int) * (size_t)pp->nsplits);
        if (mb) {
          s->range = arena_alloc(a, sizeof(irange) * (size_t)(pp->space->nidims ? pp->space->nidims : 1));
          memcpy(s->range, src->range, sizeof(irange) * (size_t)pp->space->nidims);
          s->range[ti].lo += p->fold.step[op] * mb;
          s->range[ti].hi += p->fold.step[op] * mb;
        }
        if (tl >= 0) s->microbatch = mb;
        at[(size_t)fi * (size_t)nmb + (size_t)mb] = ns++;
      } else {
        at[(size_t)fi * (size_t)nmb + (size_t)mb] = -1;
      }
      for (int i = pp->nsplits - 1; i >= 0; i--) {
        if (++coord[i] < pp->splits[i].parts) break;
        coord[i] = 0;
      }
    }
    pp->first = first;
    pp->count = ns - first;
  }
  /* communication: each per-micro-batch one again for every micro-batch */
  int nc = 0, cap = 0;
  pcomm *comms = NULL;
  for (int i = 0; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    int copies = per_microbatch(cm) ? nmb : 1;
    if (!comm_kept(cm, keep)) continue;
    for (int mb = 0; mb < copies; mb++) {
      arena_grow(a, (void **)&comms, &cap, nc + 1, sizeof(pcomm));
      pcomm *c = &comms[nc++];
      *c = *cm;
      if (copies > 1 && p->fold.tdim[cm->tensor] >= 0) c->mb = mb;
      if (mb) {
        c->region = fold_shift(a, p, cm->tensor, &cm->region, mb);
        if (cm->parts) {
          c->parts = arena_alloc(a, sizeof(tregion) * (size_t)cm->ngroup);
          for (int m = 0; m < cm->ngroup; m++) c->parts[m] = fold_shift(a, p, cm->tensor, &cm->parts[m], mb);
        }
      }
      if (cm->producer_sub >= 0) c->producer_sub = at[(size_t)cm->producer_sub * (size_t)nmb + (size_t)mb];
      if (cm->consumer_sub >= 0) c->consumer_sub = at[(size_t)cm->consumer_sub * (size_t)nmb + (size_t)mb];
    }
  }
  p->subs = subs;
  p->nsubs = p->scap = ns;
  p->comms = comms;
  p->ncomms = p->ccap = nc;
  p->fold.nmb = 0;
}
