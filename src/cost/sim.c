/* sim.c - runs a lowered program against the hardware model. Each device
 * issues its instructions in program order onto streams (compute, activation
 * collectives, sends, receives, parameter collectives); an instruction starts
 * when its stream is free and the buffers it reads were last written. Every
 * device is walked as far as it can go (lower.h, lwalk); a collective waits
 * until all its members reached it, a receive until its send was issued.
 * The memory timeline it gives is also what the memory rule checks
 * (validate.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/vec.h"
#include "weft/sim.h"
#include "weft/units.h"

const char *const sim_stream_names[SS_COUNT] = {"compute", "collective", "send", "recv", "gradients"};

/* Lowering may keep programs only for representative devices: a device
 * whose program is that of its representative with devices renamed (a
 * data-parallel replica, plan.h `rep`). */
static int sim_rep(const weft_program *pr, int d) { return pr->p->rep ? pr->p->rep[d] : d; }

/* ---- state --------------------------------------------------------------- */

typedef struct bstate {
  double ready;           /* end of the last write */
  double last_use;        /* end of the last instruction that touched it */
  signed char writer;     /* instruction kind of the last writer, -1: none */
  bool pending;           /* allocated, not yet touched: its allocation time is its first use */
  bool used;
} bstate;

typedef struct cstate {   /* one collective instance (comm, epoch) */
  double arrive;          /* latest arrival */
  double start, end;
} cstate;

typedef struct sstate {   /* one send (comm, epoch), once posted */
  double start, arrive;
} sstate;

typedef struct ivl {
  double a, b;
} ivl;

typedef VEC(ivl) gaps;      /* busy intervals of a device's SS_GRAD stream, sorted */

/* An event of the memory timeline: a buffer becomes live (at >= 0, the
 * instruction that makes it live) or stops being live (at < 0). A buffer of
 * no bytes counts as a free: events of one instant sort frees first. */
typedef struct memev {
  double t;               /* when */
  int buf;                /* the buffer */
  int at;                 /* live from then: the instruction that makes it so; -1: a free */
} memev;

/* Per simulated device (a walker of the lwalk): the order of its walk and
 * what its streams hold. */
typedef struct dstate {
  int last;               /* walk positions 0 .. last are program indices; after, tail */
  int *tail;              /* the reordered tail of the program (walk_order) */
  bool p2p;               /* its program has a receive */
  double free_at[SS_COUNT];
  double clock;           /* latest start issued on the device */
  gaps grad;
  VEC(memev) mev;
} dstate;

/* What the walk reads of a communication, per comm, gathered in one pass
 * over the plan's communications before the walk (a comm's own record is
 * large, and the walk meets comms out of order). */
typedef struct ccomm {
  signed char stream;     /* the stream its collective runs on */
  uint8_t kind;           /* comm_kind */
  bool bcast;             /* a broadcast */
  bool edge;              /* pcomm.stage_edge */
  bool same_prev;         /* costs what the comm before it costs (same_cost) */
  bool costed;            /* comm_cost holds its cost */
  int src;                /* pcomm.src */
} ccomm;

typedef struct sim {
  weft_sim *out;
  const weft_program *pr;
  const hw_model *hw;
  lwalk walk;             /* who walks, where, and who meets whom */
  bool timeline;          /* SIM_TIMELINE: per-instruction times and the memory timeline */
  bool events;            /* memory events are recorded (with times, or for the timeline) */
  bstate *bufs;
  cstate *colls;          /* per comm * 2 + epoch */
  sstate *sends;
  dstate *ds;             /* per simulated device */
  kcost *wcost;           /* per work (lop.aux): its cost, once computed */
  bool *wcosted;
  ccomm *cc;              /* per comm */
  kcost *comm_cost;       /* per comm: its cost for one member, once computed */
} sim;

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz);
  if (!p) weft_oom();
  return p;
}

static void mem_push(sim *S, dstate *ds, double t, int buf, int at) {
  if (!S->events) return;
  /* a buffer of no bytes changes nothing: it sorts with the frees */
  vec_push(NULL, &ds->mev, ((memev){t, buf, at >= 0 && S->pr->bufs[buf].bytes > 0 ? at : -1}));
}

/* The stream a collective of phase ph runs on. */
static int coll_stream(comm_phase ph) { return ph == PHASE_WEIGHTS || ph == PHASE_PARAMS ? SS_GRAD : SS_COLL; }

/* The stream an instruction runs on; -1 for bookkeeping. */
static int stream_of(const sim *S, const lop *in) {
  switch (in->kind) {
  case LI_COMPUTE: case LI_COPY: case LI_STEP: return SS_COMPUTE;
  case LI_SEND: return SS_SEND;
  case LI_RECV: return SS_RECV;
  case LI_COLLECTIVE: return S->cc[in->id].stream;
  default: return -1;
  }
}

/* The cost of a compute, copy or step: that of its work. */
static kcost work_cost(sim *S, int w) {
  if (!S->wcosted[w]) {
    S->wcost[w] = cost_work(S->hw, S->pr, lower_work_get(S->pr->works, w));
    S->wcosted[w] = true;
  }
  return S->wcost[w];
}

/* A bucket (lower.h): one collective of all its comms' bytes. */
static kcost bucket_cost(sim *S, const int *pool, const lop *in) {
  pcomm all = S->pr->p->comms[in->id];
  const int *bk = lop_bucket(pool, in);
  for (int k = 0; k < lop_nbucket(pool, in); k++) {
    const pcomm *cm = &S->pr->p->comms[bk[k]];
    all.size += cm->size;
    all.bytes += cm->bytes;
  }
  return cost_comm(S->hw, S->pr->p, &all, NULL);
}

/* Whether comms x and y cost the same: what cost_comm reads is equal (the
 * copies of one communication for successive micro-batches, which sit
 * next to each other and share their group). */
static bool same_cost(const pcomm *x, const pcomm *y) {
  return x->kind == y->kind && x->size == y->size && x->bytes == y->bytes && x->src == y->src && x->dst == y->dst &&
         x->ngroup == y->ngroup && x->group == y->group;
}

/* The cost of a send or collective for one member: the same for every
 * member and epoch, so computed once per comm, and taken from the comm
 * before it when that one costs the same. */
static kcost comm_cost(sim *S, int comm) {
  if (!S->cc[comm].costed) {
    if (comm > 0 && S->cc[comm - 1].costed && S->cc[comm].same_prev)
      S->comm_cost[comm] = S->comm_cost[comm - 1];
    else
      S->comm_cost[comm] = cost_comm(S->hw, S->pr->p, &S->pr->p->comms[comm], NULL);
    S->cc[comm].costed = true;
  }
  return S->comm_cost[comm];
}

/* When an instruction's inputs are there; *cause gets the kind of the
 * writer of the latest one. Outputs count too: a write waits for the
 * previous write of the same buffer. */
static double inputs_ready(const sim *S, const int *pool, const lop *in, int *cause) {
  double t = 0;
  *cause = -1;
  int n = lop_nin(pool, in) + lop_nout(pool, in);
  const int *bufs = n ? lop_bufs(pool, in) : NULL;
  for (int i = 0; i < n; i++) {
    int b = bufs[i];
    if (b < 0) continue;
    if (S->bufs[b].ready > t) { t = S->bufs[b].ready; *cause = S->bufs[b].writer; }
  }
  return t;
}

/* Instruction pc, running from start to end, touches its buffers: one
 * touched for the first time becomes live at start; every one is in use
 * until end, and those it writes are ready then. */
static void touch_all(sim *S, dstate *ds, int pc, const int *pool, const lop *in, double start, double end) {
  int nin = lop_nin(pool, in), n = nin + lop_nout(pool, in);
  const int *bufs = n ? lop_bufs(pool, in) : NULL;
  for (int i = 0; i < n; i++) {
    bool out = i >= nin;
    int b = bufs[i];
    if (b < 0) continue;
    bstate *bs = &S->bufs[b];
    if (bs->pending) {
      bs->pending = false;
      mem_push(S, ds, start, b, pc);
    }
    if (out && end >= bs->ready) {
      bs->ready = end;
      /* a gather that ends a transfer between pipeline stages counts as
       * the receive it completes */
      bool edge = in->kind == LI_COLLECTIVE && S->cc[in->id].edge;
      bs->writer = (signed char)(edge ? LI_RECV : in->kind);
    }
    bs->used = true;
    if (end > bs->last_use) bs->last_use = end;
  }
}

/* Earliest t' >= t with [t', t' + dur) free in g. */
static double fit(const gaps *g, double t, double dur) {
  for (int i = 0; i < g->n; i++) {
    if (t + dur <= g->v[i].a) return t;
    if (g->v[i].b > t) t = g->v[i].b;
  }
  return t;
}

static void occupy(gaps *g, double a, double b) {
  vec_reserve(NULL, g, g->n + 1);
  int i = g->n;
  while (i > 0 && g->v[i - 1].a > a) { g->v[i] = g->v[i - 1]; i--; }
  g->v[i] = (ivl){a, b};
  g->n++;
}

/* Runs the instruction at walk position walk.pc[k] of simulated device k; false
 * when it must wait for another device. */
static bool step_ins(sim *S, int k, const lprog *pg) {
  sim_dev *D = &S->out->dev[k];
  dstate *ds = &S->ds[k];
  int wpc = S->walk.pc[k];
  int pc = wpc <= ds->last ? wpc : ds->tail[wpc - ds->last - 1];
  const lop *in = &pg->ops[pc];
  const int *pool = pg->pool;
  /* a broadcast runs as sends from its root and receives elsewhere: the
   * root does not wait for the others */
  lop bc;
  if (in->kind == LI_COLLECTIVE && S->cc[in->id].bcast) {
    bc = *in;
    bool root = S->cc[in->id].src == D->device;
    bc.kind = root ? LI_SEND : LI_RECV;
    bc.aux = S->cc[in->id].src;
    in = &bc;
  }
  int st = stream_of(S, in);
  int cause = -1;
  double t0, t1;          /* the instruction's start and end */
  switch (in->kind) {
  case LI_ALLOC: {
    bstate *bs = &S->bufs[in->id];
    bs->ready = 0;
    bs->writer = -1;
    bs->last_use = 0;
    if (in->flags & LOP_PERSISTENT) mem_push(S, ds, 0, in->id, pc);
    else bs->pending = true;
    if (D->start) { D->start[pc] = D->end[pc] = ds->clock; D->stream[pc] = (signed char)st; }
    return true;
  }
  case LI_FREE: {
    bstate *bs = &S->bufs[in->id];
    double t = bs->used ? bs->last_use : ds->clock;
    if (bs->pending) { bs->pending = false; mem_push(S, ds, t, in->id, pc); }
    mem_push(S, ds, t, in->id, -1);
    if (D->start) { D->start[pc] = D->end[pc] = t; D->stream[pc] = (signed char)st; }
    return true;
  }
  case LI_COMPUTE: case LI_COPY: case LI_STEP: {
    kcost c = work_cost(S, in->aux);
    double ready = inputs_ready(S, pool, in, &cause);
    double free_at = ds->free_at[st];
    double start = ready > free_at ? ready : free_at;
    double gap = start - free_at;
    if (gap > 0) {
      if (cause == LI_RECV) D->wait_pipeline += gap;
      else if (cause == LI_COLLECTIVE) D->wait_comm += gap;
    }
    double end = start + c.seconds;
    touch_all(S, ds, pc, pool, in, start, end);
    ds->free_at[st] = end;
    D->busy[st] += c.seconds;
    D->flops += c.flops;
    D->bytes += c.bytes;
    t0 = start;
    t1 = end;
    if (end > D->compute_end) D->compute_end = end;
    break;
  }
  case LI_SEND: {
    int ckind = S->cc[in->id].kind;
    kcost c = comm_cost(S, in->id);
    double ready = inputs_ready(S, pool, in, &cause);
    double start = ready > ds->free_at[st] ? ready : ds->free_at[st];
    double end = start + c.seconds;
    touch_all(S, ds, pc, pool, in, start, end);
    ds->free_at[st] = end;
    D->busy[st] += c.seconds;
    D->sent[0] += c.net_bytes[0];
    D->sent[1] += c.net_bytes[1];
    D->sent_kind[ckind] += c.net_bytes[0] + c.net_bytes[1];
    sstate *ss = &S->sends[in->id * 2 + (in->epoch ? 1 : 0)];
    ss->start = start;
    ss->arrive = end;
    lower_walk_post(&S->walk, in->id, in->epoch);
    t0 = start;
    t1 = end;
    break;
  }
  case LI_RECV: {
    ds->p2p = true;
    sstate *ss = &S->sends[in->id * 2 + (in->epoch ? 1 : 0)];
    double posted = ds->free_at[st];
    double ready = inputs_ready(S, pool, in, &cause);
    if (ready > posted) posted = ready;
    double arrive = posted, from = posted;
    int peer = sim_rep(S->pr, in->aux);
    if (lower_walk_posted(&S->walk, in->id, in->epoch)) {
      arrive = ss->arrive > posted ? ss->arrive : posted;
      from = ss->start > posted ? ss->start : posted;
    } else if (peer == in->aux) {
      return false;       /* the sender has not got there yet */
    }
    /* a sender that is not simulated (its representative runs a renamed
     * program): its data is taken to be there when the receive is posted */
    touch_all(S, ds, pc, pool, in, posted, arrive);
    ds->free_at[st] = arrive;
    D->busy[st] += arrive - from;
    t0 = from;
    t1 = arrive;
    break;
  }
  case LI_COLLECTIVE: {
    int ckind = S->cc[in->id].kind;
    cstate *cs = &S->colls[in->id * 2 + (in->epoch ? 1 : 0)];
    kcost c = lop_nbucket(pool, in) ? bucket_cost(S, pool, in) : comm_cost(S, in->id);
    int met = lower_walk_meet(&S->walk, k, in->id, in->epoch);
    if (met & LW_NEW) {
      double ready = inputs_ready(S, pool, in, &cause);
      double arrive = st == SS_GRAD ? ready : (ready > ds->free_at[st] ? ready : ds->free_at[st]);
      if (arrive > cs->arrive) cs->arrive = arrive;
    }
    if (!(met & LW_ALL)) return false;
    if (met & LW_LAST) {
      double start = cs->arrive;
      if (st == SS_GRAD) {
        /* the earliest time free on every member's stream */
        int nm;
        const int *mem = lower_walk_members(&S->walk, in->id, &nm);
        for (bool moved = true; moved;) {
          moved = false;
          for (int i = 0; i < nm; i++) {
            double t = fit(&S->ds[mem[i]].grad, start, c.seconds);
            if (t > start) { start = t; moved = true; }
          }
        }
        for (int i = 0; i < nm; i++) occupy(&S->ds[mem[i]].grad, start, start + c.seconds);
      }
      cs->start = start;
      cs->end = start + c.seconds;
    }
    touch_all(S, ds, pc, pool, in, cs->start, cs->end);
    if (cs->end > ds->free_at[st]) ds->free_at[st] = cs->end;
    D->busy[st] += c.seconds;
    D->sent[0] += c.net_bytes[0];
    D->sent[1] += c.net_bytes[1];
    D->sent_kind[ckind] += c.net_bytes[0] + c.net_bytes[1];
    t0 = cs->start;
    t1 = cs->end;
    break;
  }
  default:
    if (D->start) { D->start[pc] = D->end[pc] = ds->clock; D->stream[pc] = (signed char)st; }
    return true;
  }
  if (D->start) { D->start[pc] = t0; D->end[pc] = t1; D->stream[pc] = (signed char)st; }
  if (t0 > ds->clock) ds->clock = t0;
  if (t1 > D->finish) D->finish = t1;
  return true;
}

/* Event order of the memory timeline: by time and, at one instant, frees
 * first: the memory a kernel released is reused by the next. */
static inline bool memev_before(const memev *x, const memev *y) {
  if (x->t != y->t) return x->t < y->t;
  return (x->at >= 0) < (y->at >= 0);
}

/* Stable sort of a device's events in memev_before's order. Events are
 * pushed in nearly increasing time (GPT-3 on 1024 devices: under two
 * places out of order per event), so an insertion sort does it in about
 * one pass; when it meets more disorder than that, a merge sort, which
 * keeps runs already in order, finishes. */
static void memev_sort(memev *v, int n) {
  int64_t budget = 8 * (int64_t)n + 1024;
  int done = 1;
  for (; done < n && budget > 0; done++) {
    memev x = v[done];
    int j = done;
    while (j > 0 && memev_before(&x, &v[j - 1])) { v[j] = v[j - 1]; j--; budget--; }
    v[j] = x;
  }
  if (done >= n) return;
  int sorted = 1;
  while (sorted < n && !memev_before(&v[sorted], &v[sorted - 1])) sorted++;
  if (sorted >= n) return;
  memev *tmp = malloc(sizeof(memev) * (size_t)n);
  if (!tmp) weft_oom();
  /* runs of 16 by insertion, then passes of doubling width */
  const int run = 16;
  for (int lo = 0; lo < n; lo += run) {
    int hi = lo + run < n ? lo + run : n;
    for (int i = lo + 1; i < hi; i++) {
      memev x = v[i];
      int j = i;
      while (j > lo && memev_before(&x, &v[j - 1])) { v[j] = v[j - 1]; j--; }
      v[j] = x;
    }
  }
  memev *src = v, *dst = tmp;
  for (int w = run; w < n; w *= 2) {
    for (int lo = 0; lo < n; lo += 2 * w) {
      int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      int i = lo, j = mid, o = lo;
      if (mid < hi && !memev_before(&src[mid], &src[mid - 1])) {
        memcpy(dst + lo, src + lo, sizeof(memev) * (size_t)(hi - lo));
        continue;
      }
      while (i < mid && j < hi) dst[o++] = memev_before(&src[j], &src[i]) ? src[j++] : src[i++];
      while (i < mid) dst[o++] = src[i++];
      while (j < hi) dst[o++] = src[j++];
    }
    memev *t = src; src = dst; dst = t;
  }
  if (src != v) memcpy(v, src, sizeof(memev) * (size_t)n);
  free(tmp);
}

/* The peak of a device's memory (where and what is live there), and with
 * SIM_TIMELINE the timeline itself. */
static void memory_timeline(sim *S, int k) {
  sim_dev *D = &S->out->dev[k];
  dstate *ds = &S->ds[k];
  const lbuf *bufs = S->pr->bufs;
  memev_sort(ds->mev.v, ds->mev.n);
  if (S->timeline) D->mem = xcalloc((size_t)ds->mev.n, sizeof(sim_mem));
  int64_t live = 0, by_role[LB_ROLE_COUNT] = {0};
  for (int i = 0; i < ds->mev.n; i++) {
    const memev *ev = &ds->mev.v[i];
    const lbuf *b = &bufs[ev->buf];
    int64_t delta = ev->at >= 0 ? b->bytes : -b->bytes;
    live += delta;
    by_role[b->role] += delta;
    if (live > D->peak) {
      D->peak = live;
      D->peak_t = ev->t;
      D->peak_at = ev->at;
      memcpy(D->peak_by_role, by_role, sizeof by_role);
    }
    if (!D->mem) continue;
    /* one point per instant: the live bytes after all its events */
    if (D->nmem && D->mem[D->nmem - 1].t == ev->t) D->mem[D->nmem - 1].live = live;
    else D->mem[D->nmem++] = (sim_mem){ev->t, live};
  }
}

/* The order a device's instructions are walked in: the program's, except
 * that after its last compute or transfer of activations the gradient
 * reductions come first and in
 * reverse, last layer first, as data-parallel training launches them (the
 * program lists them by parameter, right before each optimizer step).
 * Reversing keeps the members of a collective in one order. Positions up to
 * ds->last are the program's; ds->tail holds the rest. */
static void walk_order(const weft_plan *p, const lprog *pg, dstate *ds) {
  /* last: the last instruction that is not bookkeeping, a copy, a step or
   * a parameter collective; found from the end, reading only the tail */
  int last = pg->n - 1;
  for (; last >= 0; last--) {
    const lop *in = &pg->ops[last];
    bool tail = in->kind == LI_ALLOC || in->kind == LI_FREE || in->kind == LI_STEP || in->kind == LI_COPY ||
                (in->kind == LI_COLLECTIVE &&
                 (p->comms[in->id].phase == PHASE_WEIGHTS || p->comms[in->id].phase == PHASE_PARAMS));
    if (!tail) break;
  }
  ds->last = last;
  ds->tail = xcalloc((size_t)(pg->n - last), sizeof(int));
  int *o = ds->tail, n = 0;
  for (int i = last + 1; i < pg->n; i++)
    if (pg->ops[i].kind == LI_ALLOC) o[n++] = i;
  for (int i = pg->n - 1; i > last; i--)
    if (pg->ops[i].kind == LI_COLLECTIVE && p->comms[pg->ops[i].id].phase == PHASE_WEIGHTS) o[n++] = i;
  for (int i = last + 1; i < pg->n; i++) {
    const lop *in = &pg->ops[i];
    if (in->kind == LI_ALLOC || (in->kind == LI_COLLECTIVE && p->comms[in->id].phase == PHASE_WEIGHTS)) continue;
    o[n++] = i;
  }
}

weft_sim *sim_run_with(const weft_program *pr, const hw_model *hw, unsigned flags) {
  weft_sim *out = xcalloc(1, sizeof *out);
  out->pr = pr;
  if (hw) {
    out->hwm = *hw;
    out->hw = &out->hwm;
  }
  hw = out->hw;
  bool timeline = (flags & SIM_TIMELINE) != 0;
  int nd = pr->nprogs;
  sim S = {0};
  lower_walk_init(&S.walk, pr);
  out->ndev = S.walk.n;
  out->index = xcalloc((size_t)nd, sizeof(int));
  memcpy(out->index, S.walk.walker, sizeof(int) * (size_t)nd);
  out->dev = xcalloc((size_t)out->ndev, sizeof(sim_dev));
  for (int k = 0; k < out->ndev; k++) {
    sim_dev *D = &out->dev[k];
    D->device = S.walk.device[k];
    D->n = lower_prog(pr, D->device)->n;
    D->peak_at = -1;
    if (timeline) {
      D->start = xcalloc((size_t)D->n, sizeof(double));
      D->end = xcalloc((size_t)D->n, sizeof(double));
      D->stream = xcalloc((size_t)D->n, 1);
    }
  }
  for (int d = 0; d < nd; d++)
    if (out->index[d] >= 0) { out->dev[out->index[d]].weight++; out->devices_used++; }
  S.out = out;
  S.pr = pr;
  S.hw = hw;
  S.timeline = timeline;
  /* without times every event falls at 0 and the peak is the program
   * order's: events only make the timeline */
  S.events = hw || timeline;
  S.bufs = xcalloc((size_t)pr->nbufs, sizeof(bstate));
  int ncomms = pr->p->ncomms;
  S.colls = xcalloc((size_t)ncomms * 2, sizeof(cstate));
  S.sends = xcalloc((size_t)ncomms * 2, sizeof(sstate));
  int n = out->ndev;
  S.ds = xcalloc((size_t)n, sizeof(dstate));
  for (int k = 0; k < n; k++) {
    const lprog *pg = lower_prog(pr, out->dev[k].device);
    walk_order(pr->p, pg, &S.ds[k]);
    /* a buffer makes at most two events: its allocation and its free */
    if (S.events && pg->buf_hi > pg->buf_lo) vec_reserve(NULL, &S.ds[k].mev, 2 * (pg->buf_hi - pg->buf_lo) + 2);
  }
  int nworks = lower_works_count(pr->works);
  S.wcost = xcalloc((size_t)nworks, sizeof(kcost));
  S.wcosted = xcalloc((size_t)nworks, sizeof(bool));
  S.cc = xcalloc((size_t)ncomms, sizeof(ccomm));
  for (int i = 0; i < ncomms; i++) {
    const pcomm *cm = &pr->p->comms[i];
    ccomm *c = &S.cc[i];
    c->stream = (signed char)coll_stream(cm->phase);
    c->kind = (uint8_t)cm->kind;
    c->bcast = cm->kind == COMM_BROADCAST;
    c->edge = cm->stage_edge;
    c->same_prev = i > 0 && same_cost(&pr->p->comms[i - 1], cm);
    c->src = cm->src;
  }
  S.comm_cost = xcalloc((size_t)ncomms, sizeof(kcost));

  /* each device runs until it waits; those it frees go on next */
  for (int k; (k = lower_walk_next(&S.walk)) >= 0;) {
    const lprog *pg = lower_prog(pr, out->dev[k].device);
    while (S.walk.pc[k] < out->dev[k].n && step_ins(&S, k, pg)) S.walk.pc[k]++;
  }
  bool stuck = false;
  for (int k = 0; k < n; k++) stuck |= S.walk.pc[k] < out->dev[k].n;
  lower_walk_free(&S.walk);
  for (int k = 0; k < n; k++) {
    sim_dev *D = &out->dev[k];
    if (S.events) memory_timeline(&S, k);
    if (!hw) {
      const lprog *pg = lower_prog(pr, D->device);
      D->peak = pg->peak;
      D->peak_t = 0;
      D->peak_at = pg->peak_at;
      memcpy(D->peak_by_role, pg->peak_by_role, sizeof D->peak_by_role);
    }
    if (D->finish > out->step_time) out->step_time = D->finish;
  }
  /* a pipeline stage idles from its last compute to the end of the step */
  for (int k = 0; k < n; k++) {
    sim_dev *D = &out->dev[k];
    /* every instruction was run, so a receive in its program set p2p */
    if (S.ds[k].p2p) D->wait_pipeline += out->step_time - D->compute_end;
  }
  for (int k = 0; k < n; k++) { vec_free(&S.ds[k].grad); vec_free(&S.ds[k].mev); free(S.ds[k].tail); }
  free(S.ds);
  free(S.bufs); free(S.colls); free(S.sends);
  free(S.wcost); free(S.wcosted); free(S.cc); free(S.comm_cost);
  if (stuck) {
    sim_free(out);
    return NULL;
  }
  return out;
}

weft_sim *sim_run(const weft_program *pr, const hw_model *hw) { return sim_run_with(pr, hw, SIM_TIMELINE); }

weft_sim *sim_run_plan(const weft_program *pr, unsigned flags) {
  hw_model hw;
  bool timed = hw_from_plan(NULL, pr->p, pr, &hw);
  return sim_run_with(pr, timed ? &hw : NULL, flags);
}

void sim_free(weft_sim *s) {
  if (!s) return;
  for (int k = 0; k < s->ndev; k++) {
    free(s->dev[k].start);
    free(s->dev[k].end);
    free(s->dev[k].stream);
    free(s->dev[k].mem);
  }
  free(s->dev);
  free(s->index);
  free(s);
}

/* ---- the estimate ---------------------------------------------------------- */

/* Tokens of one step: the elements of the first integer model input (the
 * token ids), else the first dimension of the first input (samples). */
static double step_tokens(const weft_graph *g) {
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_INPUT && g->tensors[t].dtype == DT_I32) return (double)tensor_numel(&g->tensors[t]);
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_INPUT) return g->tensors[t].ndims ? (double)g->tensors[t].dims[0].size : 1;
  return 0;
}

void sim_estimate(const weft_sim *s, weft_estimate *e) {
  memset(e, 0, sizeof *e);
  e->symbolic_step = -1;
  const weft_plan *p = s->pr->p;
  e->symbolic = s->hw == NULL;
  e->step_time = s->step_time;
  e->tokens = step_tokens(p->g);
  e->model_flops = cost_model_flops(p->g);
  e->peak_device = -1;
  double busy_wait = 0, weight = 0;
  for (int k = 0; k < s->ndev; k++) {
    const sim_dev *D = &s->dev[k];
    e->hw_flops += D->flops * D->weight;
    for (int c = 0; c < COMM_KIND_COUNT; c++) e->comm_kind[c] += D->sent_kind[c] * D->weight;
    e->comm_level[0] += D->sent[0] * D->weight;
    e->comm_level[1] += D->sent[1] * D->weight;
    busy_wait += D->wait_pipeline * D->weight;
    weight += D->weight;
    if (D->peak > e->peak_max || e->peak_device < 0) { e->peak_max = D->peak; e->peak_device = D->device; }
  }
  e->device_memory = lower_device_memory(p);
  if (e->device_memory > 0)
    for (int d = 0; d < s->pr->nprogs; d++)
      if (s->index[d] >= 0 && s->dev[s->index[d]].peak > e->device_memory) e->over_devices++;
  e->fits = e->over_devices == 0;
  weft_dtype dt = cost_model_dtype(p->g);
  e->peak_rate = s->hw ? s->hw->peak[dt] : 0;
  if (e->step_time > 0 && s->devices_used > 0) {
    e->tflops_per_device = e->model_flops / e->step_time / s->devices_used / 1e12;
    if (e->peak_rate > 0) e->mfu = e->tflops_per_device * 1e12 / e->peak_rate;
    e->bubble_fraction = weight > 0 ? busy_wait / (weight * e->step_time) : 0;
  }
}

/* ---- the memory rule ------------------------------------------------------- */

const char *sim_ins_what(const weft_program *pr, const lprog *pg, int i, char *buf, size_t n) {
  const weft_plan *p = pr->p;
  lins view = lower_view(pr, pg, i);
  const lins *in = &view;
  const weft_graph *g = p->g;
  switch (in->kind) {
  case LI_COMPUTE:
    snprintf(buf, n, "the %s of %s, micro-batch %d",
             in->recompute ? "recomputation" : in->dir == DIR_BACKWARD ? "backward" : "forward",
             g->ops[p->subs[in->sub].op].name, in->mb);
    break;
  case LI_SEND: case LI_RECV: case LI_COLLECTIVE: {
    const pcomm *cm = &p->comms[in->comm];
    bool grad = cm->phase == PHASE_BACKWARD || cm->phase == PHASE_WEIGHTS;
    snprintf(buf, n, "the %s of %s%s", in->kind == LI_SEND ? "send" : in->kind == LI_RECV ? "receive" : comm_kind_names[cm->kind],
             grad ? "the gradient of " : "", g->tensors[cm->tensor].name);
    break;
  }
  case LI_STEP: snprintf(buf, n, "the optimizer step of %s", g->tensors[in->tensor].name); break;
  case LI_COPY: {
    const lop *o = &pg->ops[i];
    int b = lop_nout(pg->pool, o) ? lop_bufs(pg->pool, o)[lop_nin(pg->pool, o)] : -1;
    snprintf(buf, n, "a copy of %s", b >= 0 ? g->tensors[pr->bufs[b].tensor].name : "a tensor");
    break;
  }
  case LI_ALLOC: case LI_FREE: {
    static const char *const what[LB_ROLE_COUNT] = {
      [LB_INPUT] = "an input", [LB_PARAM] = "a parameter", [LB_GRAD] = "a gradient",
      [LB_STATE] = "optimizer state", [LB_ACT] = "an activation", [LB_ACT_GRAD] = "the gradient of an activation",
      [LB_MASTER] = "master weights", [LB_COMM] = "a communication buffer"};
    const lbuf *b = &pr->bufs[in->buf];
    snprintf(buf, n, "the allocation of %s, %s", g->tensors[b->tensor].name, what[b->role]);
    break;
  }
  default: snprintf(buf, n, "an instruction");
  }
  return buf;
}

const char *sim_peak_where(const weft_sim *s, const sim_dev *D, char *buf, size_t n) {
  const lprog *pg = lower_prog(s->pr, D->device);
  buf[0] = 0;
  if (D->peak_at < 0 || D->peak_at >= pg->n) return buf;
  char what[400], t[64];
  sim_ins_what(s->pr, pg, D->peak_at, what, sizeof what);
  if (!s->hw) snprintf(buf, n, "instruction %d (%s)", D->peak_at, what);
  else {
    unit_format(D->peak_t, UNIT_SECONDS, t, sizeof t);
    snprintf(buf, n, "instruction %d (%s), %s into the simulated step", D->peak_at, what, t);
  }
  return buf;
}

const char *sim_roles_text(const int64_t *by_role, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = 0;
  for (int i = 0; i < LB_ROLE_COUNT && at < n; i++) {
    int r = lbuf_role_order[i];
    /* the roles a plan without mixed precision or ZeRO never has are left out when empty */
    if (!by_role[r] && (r == LB_MASTER || r == LB_COMM)) continue;
    char b[64];
    int k = snprintf(buf + at, n - at, "%s%s %s", at ? ", " : "", lbuf_role_titles[r], unit_bytes_human(by_role[r], b, sizeof b));
    if (k < 0) break;
    at += (size_t)k;
  }
  return buf;
}
