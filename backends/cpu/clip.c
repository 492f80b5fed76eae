/* clip.c - the global norm of the gradients over a lowered program (clip.h):
 * which step counts which element, and which instructions wait for the norm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "weft/workspace.h"

/* The flat index in the whole tensor of each element of region r, in the
 * packed (row-major) order of r. out has tregion_numel(r) entries. */
static void flat_indices(const gtensor *t, const tregion *r, int64_t *out) {
  int nd = r->ndims;
  if (nd == 0) {
    out[0] = 0;
    return;
  }
  int64_t stride[16], len[16], pos[16];
  stride[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; d--) stride[d] = stride[d + 1] * t->dims[d + 1].size;
  for (int d = 0; d < nd; d++) {
    len[d] = 0;
    for (int i = 0; i < r->dims[d].n; i++) len[d] += r->dims[d].iv[i].hi - r->dims[d].iv[i].lo;
    if (len[d] == 0) return;
    pos[d] = 0;
  }
  /* the index of position p along dimension d */
  int64_t k = 0;
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) {
      int64_t p = pos[d];
      const dregion *dr = &r->dims[d];
      int i = 0;
      while (p >= dr->iv[i].hi - dr->iv[i].lo) p -= dr->iv[i].hi - dr->iv[i].lo, i++;
      off += (dr->iv[i].lo + p) * stride[d];
    }
    out[k++] = off;
    int d = nd - 1;
    while (d >= 0 && ++pos[d] == len[d]) pos[d--] = 0;
    if (d < 0) break;
  }
}

clip_own **clip_owners(const weft_program *pr, const bool *want) {
  const weft_graph *g = lower_graph(pr);
  uint8_t **taken = weft_xcalloc((size_t)g->ntensors * sizeof(uint8_t *));
  clip_own **own = weft_xcalloc((size_t)pr->nprogs * sizeof(clip_own *));
  for (int dv = 0; dv < pr->nprogs; dv++) {
    const lprog *lp = &pr->progs[dv];
    if (want[dv]) own[dv] = weft_xcalloc((size_t)(lp->n + 1) * sizeof(clip_own));
    for (int i = 0; i < lp->n; i++) {
      const lins *in = &lp->ins[i];
      if (in->kind != LI_STEP || in->nin < 1) continue;
      const gtensor *t = &g->tensors[in->tensor];
      if (t->ndims > 16) continue;
      const tregion *r = &in->in[0].region;
      int64_t n = tregion_numel(r);
      if (!taken[in->tensor]) taken[in->tensor] = weft_xcalloc((size_t)tensor_numel(t));
      uint8_t *tk = taken[in->tensor];
      int64_t *idx = weft_xcalloc((size_t)n * sizeof(int64_t));
      flat_indices(t, r, idx);
      uint8_t *mask = weft_xcalloc((size_t)n);
      int64_t count = 0;
      for (int64_t e = 0; e < n; e++)
        if (!tk[idx[e]]) tk[idx[e]] = 1, mask[e] = 1, count++;
      free(idx);
      if (!want[dv] || count == 0 || count == n) {
        free(mask);
        mask = NULL;
      }
      if (want[dv]) own[dv][i] = (clip_own){n, count, mask};
    }
  }
  for (int t = 0; t < g->ntensors; t++) free(taken[t]);
  free(taken);
  return own;
}

void clip_owners_free(const weft_program *pr, clip_own **own) {
  if (!own) return;
  for (int dv = 0; dv < pr->nprogs; dv++) {
    if (!own[dv]) continue;
    for (int i = 0; i < pr->progs[dv].n; i++) free(own[dv][i].mask);
    free(own[dv]);
  }
  free(own);
}

/* Whether an instruction names a buffer marked in taint; with set, marks
 * every buffer it names. */
static bool touches(const lins *in, bool *taint, bool set) {
  bool any = false;
  if ((in->kind == LI_ALLOC || in->kind == LI_FREE) && in->buf >= 0) {
    any |= taint[in->buf];
    if (set) taint[in->buf] = true;
  }
  for (int k = 0; k < in->nin; k++)
    if (in->in[k].buf >= 0) {
      any |= taint[in->in[k].buf];
      if (set) taint[in->in[k].buf] = true;
    }
  for (int k = 0; k < in->nout; k++)
    if (in->out[k].buf >= 0) {
      any |= taint[in->out[k].buf];
      if (set) taint[in->out[k].buf] = true;
    }
  return any;
}

static bool is_comm(const lins *in) {
  return in->kind == LI_SEND || in->kind == LI_RECV || in->kind == LI_COLLECTIVE;
}

bool **clip_tail(const weft_program *pr, char *err, size_t errlen) {
  const weft_graph *g = lower_graph(pr);
  int ncomm = 0;
  for (int dv = 0; dv < pr->nprogs; dv++)
    for (int i = 0; i < pr->progs[dv].n; i++) {
      const lins *in = &pr->progs[dv].ins[i];
      if (is_comm(in) && in->comm >= ncomm) ncomm = in->comm + 1;
    }
  /* per communication and epoch: after the norm on every member */
  bool *late = weft_xcalloc((size_t)ncomm * 256);
  bool **tail = weft_xcalloc((size_t)pr->nprogs * sizeof(bool *));
  for (int dv = 0; dv < pr->nprogs; dv++) tail[dv] = weft_xcalloc((size_t)pr->progs[dv].n + 1);
  bool *taint = weft_xcalloc((size_t)pr->nbufs + 1);
  /* until no communication is newly found late: each pass over a program
   * only adds to its tail */
  for (bool changed = true; changed;) {
    changed = false;
    for (int dv = 0; dv < pr->nprogs; dv++) {
      const lprog *lp = &pr->progs[dv];
      for (int b = lp->buf_lo; b < lp->buf_hi; b++) taint[b] = false;
      for (int i = 0; i < lp->n; i++) {
        const lins *in = &lp->ins[i];
        bool t = tail[dv][i] || in->kind == LI_STEP || (is_comm(in) && late[in->comm * 256 + in->epoch]) ||
                 touches(in, taint, false);
        if (!t) continue;
        tail[dv][i] = true;
        touches(in, taint, true);
        if (is_comm(in) && !late[in->comm * 256 + in->epoch]) late[in->comm * 256 + in->epoch] = changed = true;
      }
    }
  }
  /* A step's gradient must be complete when the norm is taken: nothing
   * after that point may write it before the step reads it. */
  bool ok = true;
  for (int dv = 0; dv < pr->nprogs && ok; dv++) {
    const lprog *lp = &pr->progs[dv];
    for (int b = lp->buf_lo; b < lp->buf_hi; b++) taint[b] = false;
    for (int i = 0; i < lp->n && ok; i++) {
      const lins *in = &lp->ins[i];
      if (!tail[dv][i]) continue;
      if (in->kind == LI_STEP) {
        if (in->nin > 0 && in->in[0].buf >= 0 && taint[in->in[0].buf]) {
          snprintf(err, errlen, "clipping: device %d completes the gradient of %s after an optimizer step, "
                   "which the norm must wait for", dv, g->tensors[in->tensor].name);
          ok = false;
        }
        continue;
      }
      for (int k = 0; k < in->nout; k++)
        if (in->out[k].buf >= 0) taint[in->out[k].buf] = true;
    }
  }
  free(late);
  free(taint);
  if (!ok) {
    clip_tail_free(pr, tail);
    return NULL;
  }
  return tail;
}

void clip_tail_free(const weft_program *pr, bool **tail) {
  if (!tail) return;
  for (int dv = 0; dv < pr->nprogs; dv++) free(tail[dv]);
  free(tail);
}
