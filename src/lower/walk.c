/* walk.c - walking all programs of a lowering together (lower.h, lwalk):
 * who walks, who meets whom at each collective, whom to go on with. The
 * deadlock check and the simulator differ in what an instruction does,
 * not in when a device may go on. */
#include <stdlib.h>

#include "base/vec.h"
#include "weft/lower.h"

static void *zalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  if (!p) weft_oom();
  return p;
}

static int rep_of(const weft_program *pr, int d) { return pr->p->rep ? pr->p->rep[d] : d; }

/* Walker k may go on. */
static void wake(lwalk *w, int k) {
  if (k < 0 || w->queued[k]) return;
  w->queued[k] = true;
  w->stack[w->sp++] = k;
}

void lower_walk_init(lwalk *w, const weft_program *pr) {
  *w = (lwalk){.pr = pr};
  int nd = pr->nprogs;
  w->walker = zalloc((size_t)nd, sizeof(int));
  for (int d = 0; d < nd; d++) w->walker[d] = -1;
  for (int d = 0; d < nd; d++)
    if (rep_of(pr, d) == d && lower_prog(pr, d)->n > 0) w->walker[d] = w->n++;
  w->device = zalloc((size_t)w->n, sizeof(int));
  for (int d = 0; d < nd; d++) {
    int r = rep_of(pr, d);
    if (w->walker[d] >= 0) w->device[w->walker[d]] = d;
    else if (r >= 0 && r < nd && r != d) w->walker[d] = w->walker[r];
  }
  w->pc = zalloc((size_t)w->n, sizeof(int));
  w->stack = zalloc((size_t)w->n, sizeof(int));
  w->queued = zalloc((size_t)w->n, sizeof(bool));
  w->parked = zalloc((size_t)w->n, sizeof(bool));
  w->stamp = zalloc((size_t)w->n, sizeof(int));
  for (int k = w->n - 1; k >= 0; k--) wake(w, k);
  int nc = pr->p->ncomms;
  w->wc = zalloc((size_t)nc, sizeof(lwalk_comm));
  for (int c = 0; c < nc; c++) {
    const pcomm *cm = &pr->p->comms[c];
    w->wc[c].moff = -1;
    w->wc[c].src = cm->src;
    w->wc[c].dst = cm->dst;
    w->wc[c].ngroup = cm->ngroup;
    w->wc[c].group = cm->group;
    w->wc[c].bcast = cm->kind == COMM_BROADCAST;
  }
}

void lower_walk_free(lwalk *w) {
  free(w->walker);
  free(w->device);
  free(w->pc);
  free(w->stack);
  free(w->queued);
  free(w->parked);
  free(w->stamp);
  free(w->wc);
  free(w->mpool);
  *w = (lwalk){0};
}

int lower_walk_next(lwalk *w) {
  if (w->sp == 0) return -1;
  int k = w->stack[--w->sp];
  w->queued[k] = false;
  return k;
}

void lower_walk_post(lwalk *w, int comm, int epoch) {
  lwalk_comm *c = &w->wc[comm];
  c->posted[epoch ? 1 : 0] = true;
  if (c->bcast) {
    for (int i = 0; i < c->ngroup; i++) wake(w, w->walker[c->group[i]]);
  } else {
    wake(w, w->walker[c->dst]);
  }
}

bool lower_walk_posted(const lwalk *w, int comm, int epoch) { return w->wc[comm].posted[epoch ? 1 : 0]; }

const int *lower_walk_members(lwalk *w, int comm, int *n) {
  lwalk_comm *c = &w->wc[comm];
  if (c->moff < 0 && comm > 0 && w->wc[comm - 1].moff >= 0 && w->wc[comm - 1].group == c->group &&
      w->wc[comm - 1].ngroup == c->ngroup) {
    /* the same group as the comm before it (its copy for another
     * micro-batch): the same members */
    c->moff = w->wc[comm - 1].moff;
    c->mcount = w->wc[comm - 1].mcount;
  }
  if (c->moff < 0) {
    if (w->mn + c->ngroup > w->mcap) vec_grow(NULL, (void **)&w->mpool, &w->mcap, w->mn + c->ngroup, sizeof(int));
    int m = 0;
    w->stampv++;
    for (int i = 0; i < c->ngroup; i++) {
      int k = w->walker[c->group[i]];
      if (k < 0 || w->stamp[k] == w->stampv) continue;
      w->stamp[k] = w->stampv;
      w->mpool[w->mn + m++] = k;
    }
    w->wc[comm].moff = w->mn;
    w->wc[comm].mcount = m;
    w->mn += m;
  }
  *n = w->wc[comm].mcount;
  return w->mpool + w->wc[comm].moff;
}

int lower_walk_meet(lwalk *w, int k, int comm, int epoch) {
  int n = w->wc[comm].mcount;
  if (w->wc[comm].moff < 0) lower_walk_members(w, comm, &n);
  int *arrived = &w->wc[comm].arrived[epoch ? 1 : 0], r = 0;
  if (!w->parked[k]) {
    w->parked[k] = true;
    ++*arrived;
    r |= LW_NEW;
    if (*arrived == n) {
      r |= LW_LAST;
      const int *mem = w->mpool + w->wc[comm].moff;
      for (int i = 0; i < n; i++)
        if (mem[i] != k) wake(w, mem[i]);
    }
  }
  if (*arrived < n) return r;
  w->parked[k] = false;
  return r | LW_ALL;
}
