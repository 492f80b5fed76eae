/* sched.c - the CUDA backend's plan of a step (sched.h): the programs of
 * all virtual devices walked together into one order of stream operations,
 * with events where data crosses streams and offsets in each device's pool
 * for buffers, messages and scratch. */
#include "sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t align_up(int64_t n) { return (n + CX_ALIGN - 1) / CX_ALIGN * CX_ALIGN; }

int sched_rank(const pcomm *cm, int dev) {
  for (int i = 0; i < cm->ngroup; i++)
    if (cm->group[i] == dev) return i;
  return -1;
}

static int buf_dt(const weft_program *pr, int buf) { return buf >= 0 ? pr->bufs[buf].dtype : GPU_F32; }

static void entry(sentry *e, int *n, int max, int64_t *bytes, const tregion *r, int dt, bool owned) {
  if (*n >= max) return;
  sentry *x = &e[(*n)++];
  x->off = *bytes;
  x->dt = dt;
  x->region = *r;
  x->owned = owned;
  *bytes += align_up(cx_numel(r) * gpu_dtype_size(dt));
}

int sched_entries(const weft_program *pr, const lins *in, int rank, sentry *e, int max, int64_t *bytes) {
  int n = 0;
  *bytes = 0;
  if (in->kind == LI_SEND) {
    entry(e, &n, max, bytes, &in->in[0].region, buf_dt(pr, in->in[0].buf), false);
    return n;
  }
  const pcomm *cm = lower_comm(pr, in->comm);
  bool has_in = in->nin > 0 && in->in[0].buf >= 0;
  switch (cm->kind) {
  case COMM_ALL_REDUCE:
    if (!has_in) return 0;
    for (int i = 0; i <= in->nbucket && i < in->nin; i++) {
      const pcomm *ci = lower_comm(pr, i ? in->bucket[i - 1] : in->comm);
      entry(e, &n, max, bytes, &ci->region, buf_dt(pr, in->in[i].buf), false);
    }
    return n;
  case COMM_REDUCE_SCATTER:
    /* part by part, in group order: member j takes entry j of every
     * message, and with parts of one size the message is NCCL's
     * reduce-scatter's input as it is */
    for (int j = 0; has_in && j < cm->ngroup && n < max; j++)
      entry(e, &n, max, bytes, &cm->parts[j], buf_dt(pr, in->in[0].buf), false);
    return n;
  case COMM_ALL_GATHER:
    if (has_in) entry(e, &n, max, bytes, &cm->parts[rank], buf_dt(pr, in->in[0].buf), false);
    return n;
  case COMM_BROADCAST:
    if (in->nin > 0) entry(e, &n, max, bytes, &cm->region, buf_dt(pr, in->out[0].buf), false);
    return n;
  case COMM_ALL_TO_ALL:
    if (!has_in) return 0;
    for (int j = 0; j < cm->ngroup && n < max; j++) {
      tregion x;
      if (!cx_intersect(&cm->sources[rank], &cm->parts[j], &x))
        for (int d = 0; d < x.ndims; d++) x.dims[d].n = 0;  /* an empty piece keeps its place */
      entry(e, &n, max, bytes, &x, buf_dt(pr, in->in[0].buf), true);
    }
    return n;
  default:
    return 0;
  }
}

void sched_entries_free(sentry *e, int n) {
  for (int i = 0; i < n; i++)
    if (e[i].owned) cx_region_free(&e[i].region);
}

/* ---- building ----------------------------------------------------------------------- */

typedef struct walk {
  csched *s;
  const weft_program *pr;
  const csched_cb *cb;
  cx_pool *pool;          /* per device */
  int *inst;              /* per (comm, epoch): a send's message or a collective's meeting, -1 */
  int *inst_event;        /* per (comm, epoch) of a send: the packing's event */
  int ncomm;
  int *held;              /* per buffer: forwards that hold it for their backward, and buffers
                           * that take its memory (csched_cb.share) */
  bool *deferred;         /* per buffer: freed while held, released when the last holder let go */
  int *ev;                /* scratch: events an allocation waits for */
  int nev, evcap;
  char *err;
  size_t errlen;
  bool failed;
} walk;

static void emit(walk *w, int kind, int dev, int ins, int arg, int member, int64_t ws) {
  csched *s = w->s;
  if (s->nops == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 1024;
    s->ops = cx_grow(s->ops, sizeof(sop) * (size_t)s->cap);
  }
  s->ops[s->nops++] = (sop){(uint8_t)kind, dev, ins, arg, member, ws};
}

static int new_event(walk *w) { return w->s->nevents++; }

/* An allocation in dev's pool; the stream waits for the reads that the
 * memory it reuses was freed with. */
/* A buffer's bytes in its pool (at least one). */
static int64_t buf_bytes(const walk *w, int buf) {
  int64_t b = w->cb->bytes && w->cb->bytes[buf] > 0 ? w->cb->bytes[buf] : w->pr->bufs[buf].bytes;
  return b ? b : 1;
}

static int64_t alloc_in(walk *w, int dev, int64_t bytes) {
  w->nev = 0;
  int64_t off = cx_pool_alloc(&w->pool[dev], bytes, &w->ev, &w->nev, &w->evcap);
  for (int i = 0; i < w->nev; i++) emit(w, SO_WAIT, dev, -1, w->ev[i], 0, -1);
  return off;
}

static int new_msg(walk *w, int dev, int64_t bytes) {
  csched *s = w->s;
  if (s->nmsgs == s->mcap) {
    s->mcap = s->mcap ? 2 * s->mcap : 256;
    s->msgs = cx_grow(s->msgs, sizeof(smsg) * (size_t)s->mcap);
  }
  int64_t off = alloc_in(w, dev, bytes);
  s->msgs[s->nmsgs] = (smsg){dev, off, bytes};
  return s->nmsgs++;
}

static void free_msg(walk *w, int msg, const int *ev, int nev) {
  const smsg *m = &w->s->msgs[msg];
  cx_pool_release(&w->pool[m->dev], m->off, m->bytes, ev, nev);
}

/* The bytes of the message member `rank` of in packs; -1 when it brings none. */
static int64_t msg_bytes(walk *w, const lins *in, int rank) {
  int max = 1;
  if (in->kind == LI_COLLECTIVE) {
    const pcomm *cm = lower_comm(w->pr, in->comm);
    max = in->nbucket + 1 > cm->ngroup ? in->nbucket + 1 : cm->ngroup;
  }
  sentry *e = cx_alloc(sizeof(sentry) * (size_t)max);
  int64_t bytes;
  int n = sched_entries(w->pr, in, rank, e, max, &bytes);
  sched_entries_free(e, n);
  free(e);
  return n ? bytes : -1;
}

static bool fail(walk *w, const char *fmt, int a, int b) {
  if (!w->failed) snprintf(w->err, w->errlen, fmt, a, b);
  w->failed = true;
  return false;
}

static int slot_of(walk *w, const lins *in) { return in->comm * 2 + (in->epoch ? 1 : 0); }

static scoll *meeting(walk *w, const lins *in) {
  csched *s = w->s;
  int k = slot_of(w, in);
  if (w->inst[k] >= 0) return &s->colls[w->inst[k]];
  if (s->ncolls == s->ccap) {
    s->ccap = s->ccap ? 2 * s->ccap : 64;
    s->colls = cx_grow(s->colls, sizeof(scoll) * (size_t)s->ccap);
  }
  const pcomm *cm = lower_comm(w->pr, in->comm);
  scoll *c = &s->colls[s->ncolls];
  memset(c, 0, sizeof *c);
  c->comm = in->comm, c->epoch = in->epoch, c->n = cm->ngroup, c->root = -1;
  c->dev = cx_alloc(sizeof(int) * (size_t)(c->n + 1));
  c->ins = cx_alloc(sizeof(int) * (size_t)(c->n + 1));
  c->msg = cx_alloc(sizeof(int) * (size_t)(c->n + 1));
  c->pack_ev = cx_alloc(sizeof(int) * (size_t)(c->n + 1));
  c->done_ev = cx_alloc(sizeof(int) * (size_t)(c->n + 1));
  c->fence = cx_alloc(sizeof(int) * (size_t)(c->n + 1));
  for (int i = 0; i < c->n; i++)
    c->dev[i] = cm->group[i], c->ins[i] = c->msg[i] = c->pack_ev[i] = c->done_ev[i] = -1;
  w->inst[k] = s->ncolls++;
  return c;
}

/* Emits what device dev's instruction i needs now; false when it must wait. */
static bool step(walk *w, int dev, int i) {
  csched *s = w->s;
  const weft_program *pr = w->pr;
  const lins *in = &pr->progs[dev].ins[i];
  switch (in->kind) {
  case LI_ALLOC: {
    const lbuf *b = &pr->bufs[in->buf];
    if (b->persistent) {
      if (b->role == LB_GRAD) emit(w, SO_ZERO, dev, i, in->buf, 0, -1);
      return true;
    }
    int with = w->cb->share ? w->cb->share[in->buf] : -1;
    if (with >= 0 && s->off[with] < 0) return fail(w, "buffer %d takes the memory of buffer %d, not allocated", in->buf, with);
    /* the memory's owner, never a buffer that takes another's: the holds
     * are counted on the owner alone */
    if (with >= 0 && w->cb->share[with] >= 0)
      return fail(w, "buffer %d takes the memory of buffer %d, which takes another's", in->buf, with);
    if (with >= 0) {
      /* the memory of a buffer still allocated, which stays until both are freed */
      s->off[in->buf] = s->off[with];
      w->held[with]++;
    } else {
      s->off[in->buf] = alloc_in(w, dev, buf_bytes(w, in->buf));
    }
    emit(w, b->role == LB_INPUT ? SO_INPUT : SO_ZERO, dev, i, in->buf, 0, -1);
    return true;
  }
  case LI_FREE: {
    const lbuf *b = &pr->bufs[in->buf];
    int with = w->cb->share ? w->cb->share[in->buf] : -1;
    if (with >= 0) {
      if (--w->held[with] == 0 && w->deferred[with]) {
        w->deferred[with] = false;
        cx_pool_release(&w->pool[dev], s->off[with], buf_bytes(w, with), NULL, 0);
      }
      return true;
    }
    if (w->held && w->held[in->buf] > 0) {
      w->deferred[in->buf] = true;
      return true;
    }
    if (!b->persistent && s->off[in->buf] >= 0) cx_pool_release(&w->pool[dev], s->off[in->buf], buf_bytes(w, in->buf), NULL, 0);
    return true;
  }
  case LI_COMPUTE:
  case LI_COPY:
  case LI_STEP: {
    const ckeep *kp = w->cb->keep && w->cb->keep[dev] ? &w->cb->keep[dev][i] : NULL;
    if (kp && kp->pair >= 0 && kp->bytes > 0) {
      /* a forward: the area it keeps, and its result held, until its backward */
      s->keep_off[dev][i] = alloc_in(w, dev, kp->bytes);
      if (kp->hold >= 0) w->held[kp->hold]++;
    }
    int64_t ws = w->cb->ins_ws ? w->cb->ins_ws(w->cb->ctx, dev, i) : 0;
    if (ws < 0) return fail(w, "device %d, instruction %d: its scratch cannot be sized", dev, i);
    int64_t off = ws > 0 ? alloc_in(w, dev, ws) : -1;
    emit(w, SO_INS, dev, i, 0, 0, off);
    if (ws > 0) cx_pool_release(&w->pool[dev], off, ws, NULL, 0);
    if (kp && kp->pair >= 0 && kp->bytes == 0 && s->keep_off[dev][kp->pair] >= 0) {
      /* the backward of a forward that kept: both released */
      const ckeep *fk = &w->cb->keep[dev][kp->pair];
      s->keep_off[dev][i] = s->keep_off[dev][kp->pair];
      cx_pool_release(&w->pool[dev], s->keep_off[dev][i], fk->bytes, NULL, 0);
      int hb = fk->hold;
      if (hb >= 0 && --w->held[hb] == 0 && w->deferred[hb]) {
        w->deferred[hb] = false;
        cx_pool_release(&w->pool[dev], s->off[hb], buf_bytes(w, hb), NULL, 0);
      }
    }
    return true;
  }
  case LI_SEND: {
    int64_t bytes = msg_bytes(w, in, 0);
    int m = new_msg(w, dev, bytes > 0 ? bytes : 1);
    emit(w, SO_SEND, dev, i, m, 0, -1);
    int e = new_event(w);
    emit(w, SO_RECORD, dev, -1, e, 0, -1);
    w->inst[slot_of(w, in)] = m;
    w->inst_event[slot_of(w, in)] = e;
    return true;
  }
  case LI_RECV: {
    int k = slot_of(w, in), m = w->inst[k];
    if (m < 0) return false;
    emit(w, SO_WAIT, dev, -1, w->inst_event[k], 0, -1);
    emit(w, SO_RECV, dev, i, m, 0, -1);
    int done = new_event(w);
    emit(w, SO_RECORD, dev, -1, done, 0, -1);
    free_msg(w, m, &done, 1);
    return true;
  }
  case LI_COLLECTIVE: {
    const pcomm *cm = lower_comm(pr, in->comm);
    int rank = sched_rank(cm, dev);
    if (rank < 0) return fail(w, "device %d is not in the group of comm %d", dev, in->comm);
    scoll *c = meeting(w, in);
    int ci = (int)(c - s->colls);
    if (c->done) return true;
    if (cm->kind == COMM_BROADCAST) {
      if (in->nin > 0) {
        /* the root posts and goes on */
        c->root = rank;
        c->ins[rank] = i;
        c->msg[rank] = new_msg(w, dev, msg_bytes(w, in, rank));
        emit(w, SO_PACK, dev, i, ci, rank, -1);
        c->pack_ev[rank] = new_event(w);
        emit(w, SO_RECORD, dev, -1, c->pack_ev[rank], 0, -1);
      } else {
        if (c->root < 0) return false;
        c->ins[rank] = i;
        emit(w, SO_WAIT, dev, -1, c->pack_ev[c->root], 0, -1);
        emit(w, SO_REDUCE, dev, i, ci, rank, -1);
        c->done_ev[rank] = new_event(w);
        emit(w, SO_RECORD, dev, -1, c->done_ev[rank], 0, -1);
        c->taken++;
      }
      if (c->root >= 0 && c->taken == c->n - 1) {
        int nev = 0;
        for (int m = 0; m < c->n; m++)
          if (c->done_ev[m] >= 0) c->fence[nev++] = c->done_ev[m];
        free_msg(w, c->msg[c->root], c->fence, nev);
        c->done = true;
      }
      return true;
    }
    if (c->ins[rank] < 0) {
      c->ins[rank] = i;
      c->arrived++;
      int64_t bytes = msg_bytes(w, in, rank);
      if (bytes > 0) {
        c->msg[rank] = new_msg(w, dev, bytes);
        emit(w, SO_PACK, dev, i, ci, rank, -1);
        c->pack_ev[rank] = new_event(w);
        emit(w, SO_RECORD, dev, -1, c->pack_ev[rank], 0, -1);
      }
    }
    if (c->arrived < c->n) return false;
    /* the last to arrive: every member takes its result, in group order */
    for (int m = 0; m < c->n; m++) {
      for (int j = 0; j < c->n; j++)
        if (j != m && c->pack_ev[j] >= 0) emit(w, SO_WAIT, c->dev[m], -1, c->pack_ev[j], 0, -1);
      emit(w, SO_REDUCE, c->dev[m], c->ins[m], ci, m, -1);
      c->done_ev[m] = new_event(w);
      emit(w, SO_RECORD, c->dev[m], -1, c->done_ev[m], 0, -1);
      c->fence[m] = c->done_ev[m];
    }
    for (int m = 0; m < c->n; m++)
      if (c->msg[m] >= 0) free_msg(w, c->msg[m], c->fence, c->n);
    c->done = true;
    return true;
  }
  default:
    return fail(w, "device %d, instruction %d: an instruction the CUDA backend does not know", dev, i);
  }
}

/* Walks the programs together over the instructions of one phase (all
 * of them when tail is NULL; else those whose tail entry is `phase`). */
static void walk_phase(walk *w, int *pc, bool *const *tail, bool phase) {
  const weft_program *pr = w->pr;
  int nd = pr->nprogs;
  for (;;) {
    bool progress = false, left = false;
    for (int d = 0; d < nd && !w->failed; d++) {
      const lprog *lp = &pr->progs[d];
      for (;;) {
        while (pc[d] < lp->n && tail && tail[d][pc[d]] != phase) pc[d]++;
        if (pc[d] >= lp->n || w->failed || !step(w, d, pc[d])) break;
        pc[d]++;
        progress = true;
      }
      if (pc[d] < lp->n) left = true;
    }
    if (!left || w->failed) return;
    if (!progress) {
      int d = 0;
      while (d < nd && pc[d] >= pr->progs[d].n) d++;
      fail(w, "the programs do not meet: device %d waits at instruction %d", d, d < nd ? pc[d] : -1);
      return;
    }
  }
}

bool sched_build(csched *s, const weft_program *pr, const csched_cb *cb, bool *const *tail, char *err,
                 size_t errlen) {
  memset(s, 0, sizeof *s);
  s->pr = pr;
  int nd = pr->nprogs, nb = pr->nbufs;
  s->off = cx_alloc(sizeof(int64_t) * (size_t)(nb + 1));
  s->fixed = cx_alloc(sizeof(int64_t) * (size_t)(nd + 1));
  s->persistent = cx_alloc(sizeof(int64_t) * (size_t)(nd + 1));
  s->pool = cx_alloc(sizeof(int64_t) * (size_t)(nd + 1));
  for (int b = 0; b < nb; b++) s->off[b] = -1;
  int ncomm = 0;
  for (int d = 0; d < nd; d++)
    for (int i = 0; i < pr->progs[d].n; i++) {
      const lins *in = &pr->progs[d].ins[i];
      if ((in->kind == LI_SEND || in->kind == LI_RECV || in->kind == LI_COLLECTIVE) && in->comm >= ncomm)
        ncomm = in->comm + 1;
    }
  /* each pool: persistent buffers, the fixed area, then the rest */
  for (int d = 0; d < nd; d++) {
    const lprog *lp = &pr->progs[d];
    int64_t at = 0;
    for (int b = lp->buf_lo; b < lp->buf_hi; b++)
      if (pr->bufs[b].persistent) s->off[b] = at, at += align_up(pr->bufs[b].bytes ? pr->bufs[b].bytes : 1);
    s->fixed[d] = at;
    if (lp->n) at += align_up(cb->fixed);
    s->persistent[d] = at;
  }
  walk w;
  memset(&w, 0, sizeof w);
  w.s = s, w.pr = pr, w.cb = cb, w.err = err, w.errlen = errlen, w.ncomm = ncomm;
  if (cb->keep) {
    s->keep_off = cx_alloc(sizeof(int64_t *) * (size_t)(nd + 1));
    for (int d = 0; d < nd; d++) {
      s->keep_off[d] = cx_alloc(sizeof(int64_t) * (size_t)(pr->progs[d].n + 1));
      for (int i = 0; i < pr->progs[d].n; i++) s->keep_off[d][i] = -1;
    }
  }
  if (cb->keep || cb->share) {
    w.held = cx_alloc(sizeof(int) * (size_t)(nb + 1));
    w.deferred = cx_alloc((size_t)nb + 1);
  }
  w.pool = cx_alloc(sizeof(cx_pool) * (size_t)(nd + 1));
  for (int d = 0; d < nd; d++) cx_pool_init(&w.pool[d], s->persistent[d]);
  w.inst = cx_alloc(sizeof(int) * (size_t)(2 * ncomm + 1));
  w.inst_event = cx_alloc(sizeof(int) * (size_t)(2 * ncomm + 1));
  for (int k = 0; k < 2 * ncomm; k++) w.inst[k] = w.inst_event[k] = -1;
  int *pc = cx_alloc(sizeof(int) * (size_t)(nd + 1));
  walk_phase(&w, pc, tail, false);
  if (tail && !w.failed) {
    /* the norm: each device counts its later steps' gradients, the first
     * device with a program takes the factor, every device waits for it */
    int first = -1, *counted = cx_alloc(sizeof(int) * (size_t)(nd + 1));
    for (int d = 0; d < nd; d++) {
      const lprog *lp = &pr->progs[d];
      if (!lp->n) continue;
      if (first < 0) first = d;
      for (int i = 0; i < lp->n; i++)
        if (tail[d][i] && lp->ins[i].kind == LI_STEP) emit(&w, SO_NORM_PART, d, i, 0, 0, -1);
      counted[d] = new_event(&w);
      emit(&w, SO_RECORD, d, -1, counted[d], 0, -1);
    }
    if (first >= 0) {
      for (int d = 0; d < nd; d++)
        if (pr->progs[d].n && d != first) emit(&w, SO_WAIT, first, -1, counted[d], 0, -1);
      emit(&w, SO_NORM, first, -1, 0, 0, -1);
      int ready = new_event(&w);
      emit(&w, SO_RECORD, first, -1, ready, 0, -1);
      for (int d = 0; d < nd; d++)
        if (pr->progs[d].n && d != first) emit(&w, SO_WAIT, d, -1, ready, 0, -1);
    }
    free(counted);
    for (int d = 0; d < nd; d++) pc[d] = 0;
    walk_phase(&w, pc, tail, true);
  }
  for (int d = 0; d < nd; d++) {
    s->pool[d] = pr->progs[d].n ? s->persistent[d] + w.pool[d].top : 0;
    cx_pool_free_all(&w.pool[d]);
  }
  free(w.pool), free(w.inst), free(w.inst_event), free(w.ev), free(w.held), free(w.deferred), free(pc);
  if (w.failed) {
    sched_free(s);
    return false;
  }
  return true;
}

void sched_free(csched *s) {
  for (int i = 0; i < s->ncolls; i++) {
    scoll *c = &s->colls[i];
    free(c->dev), free(c->ins), free(c->msg), free(c->pack_ev), free(c->done_ev), free(c->fence);
  }
  if (s->keep_off)
    for (int d = 0; d < s->pr->nprogs; d++) free(s->keep_off[d]);
  free(s->colls), free(s->ops), free(s->msgs), free(s->off), free(s->fixed), free(s->persistent),
      free(s->pool), free(s->keep_off);
  memset(s, 0, sizeof *s);
}
