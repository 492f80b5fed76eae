/* exec.c - the CPU executor: one thread per device runs its lowered program
 * (docs/program.md); messages and collectives go through a mailbox. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clip.h"
#include "exec.h"
#include "kernels.h"
#include "net.h"
#include "optim.h"
#include "weft/workspace.h"
#include "xops.h"

/* ---- regions ------------------------------------------------------------ */

/* Position of each index of dimension d of r inside the packed dimension of
 * holder (r's indices are a subset of holder's). out has ext(r, d) entries. */
static void positions(const dregion *holder, const dregion *r, int64_t *out) {
  int64_t k = 0, base = 0;
  int h = 0;
  for (int i = 0; i < r->n; i++)
    for (int64_t x = r->iv[i].lo; x < r->iv[i].hi; x++) {
      while (h < holder->n && holder->iv[h].hi <= x) base += holder->iv[h].hi - holder->iv[h].lo, h++;
      out[k++] = h < holder->n ? base + (x - holder->iv[h].lo) : -1;
    }
}

static int64_t dlen(const dregion *r) {
  int64_t n = 0;
  for (int i = 0; i < r->n; i++) n += r->iv[i].hi - r->iv[i].lo;
  return n;
}

/* Copies (or adds, for floats) the elements of region r from src, a packed
 * buffer of region sr, into dst, a packed buffer of region dr. Elements are
 * 4 bytes (f32 or i32). */
static void region_move(void *dst, const tregion *dr, const void *src, const tregion *sr,
                        const tregion *r, bool add) {
  int nd = r->ndims;
  if (nd == 0) {
    if (add) *(float *)dst += *(const float *)src;
    else memcpy(dst, src, 4);
    return;
  }
  int64_t *len = calloc((size_t)nd, sizeof(int64_t));
  int64_t **ps = calloc((size_t)nd, sizeof(int64_t *)), **pd = calloc((size_t)nd, sizeof(int64_t *));
  int64_t *ss = calloc((size_t)nd, sizeof(int64_t)), *sd = calloc((size_t)nd, sizeof(int64_t));
  int64_t *idx = calloc((size_t)nd, sizeof(int64_t));
  if (!len || !ps || !pd || !ss || !sd || !idx) weft_oom();
  int64_t total = 1;
  for (int d = 0; d < nd; d++) {
    len[d] = dlen(&r->dims[d]);
    total *= len[d];
    ps[d] = malloc((size_t)(len[d] + 1) * sizeof(int64_t));
    pd[d] = malloc((size_t)(len[d] + 1) * sizeof(int64_t));
    if (!ps[d] || !pd[d]) weft_oom();
    positions(&sr->dims[d], &r->dims[d], ps[d]);
    positions(&dr->dims[d], &r->dims[d], pd[d]);
  }
  ss[nd - 1] = sd[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; d--) {
    ss[d] = ss[d + 1] * dlen(&sr->dims[d + 1]);
    sd[d] = sd[d + 1] * dlen(&dr->dims[d + 1]);
  }
  if (total > 0) {
    int64_t inner = len[nd - 1];
    const int64_t *pis = ps[nd - 1], *pid = pd[nd - 1];
    for (;;) {
      int64_t os = 0, od = 0;
      for (int d = 0; d < nd - 1; d++) os += ps[d][idx[d]] * ss[d], od += pd[d][idx[d]] * sd[d];
      const float *s = (const float *)src + os;
      float *t = (float *)dst + od;
      int64_t k = 0;
      while (k < inner) {
        int64_t run = 1;
        while (k + run < inner && pis[k + run] == pis[k] + run && pid[k + run] == pid[k] + run) run++;
        if (add)
          for (int64_t q = 0; q < run; q++) t[pid[k] + q] += s[pis[k] + q];
        else
          memcpy(t + pid[k], s + pis[k], (size_t)run * 4);
        k += run;
      }
      int d = nd - 2;
      while (d >= 0 && ++idx[d] == len[d]) idx[d--] = 0;
      if (d < 0) break;
    }
  }
  for (int d = 0; d < nd; d++) free(ps[d]), free(pd[d]);
  free(len), free(ps), free(pd), free(ss), free(sd), free(idx);
}

static tregion whole_region(const gtensor *t, dregion *dims, irange *iv) {
  for (int d = 0; d < t->ndims; d++) {
    iv[d].lo = 0;
    iv[d].hi = t->dims[d].size;
    dims[d].n = 1;
    dims[d].iv = &iv[d];
  }
  return (tregion){t->ndims, dims};
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the mailbox ---------------------------------------------------------- */

enum { CLS_SEND, CLS_COLL };

typedef struct xmsg {
  xkey key;
  int remaining;          /* takers still to come */
  int64_t bytes;
  void *data;             /* NULL: zeros (a member without input) */
  struct xmsg *next;
} xmsg;

enum { MBOX_BUCKETS = 4096 };

typedef struct xmbox {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  xmsg *bucket[MBOX_BUCKETS];
  bool failed;            /* a device stopped with an error: everyone stops */
} xmbox;

static bool key_eq(const xkey *a, const xkey *b) {
  return a->step == b->step && a->cls == b->cls && a->id == b->id && a->epoch == b->epoch &&
         a->src == b->src && a->dst == b->dst;
}

static unsigned key_hash(const xkey *k) {
  uint64_t h = (uint64_t)k->step * 0x9e3779b97f4a7c15ull;
  h ^= (uint64_t)(unsigned)k->cls * 0xbf58476d1ce4e5b9ull + (uint64_t)(unsigned)k->id * 0x94d049bb133111ebull;
  h ^= (uint64_t)(unsigned)k->epoch * 31 + (uint64_t)(unsigned)k->src * 1000003 + (uint64_t)(unsigned)(k->dst + 1) * 7919;
  h ^= h >> 29;
  return (unsigned)(h % MBOX_BUCKETS);
}

/* Leaves a message for `consumers` takers; data is owned by the mailbox. */
static void mbox_put(xmbox *m, const xkey *k, int consumers, void *data, int64_t bytes) {
  xmsg *x = weft_xmalloc(sizeof *x);
  x->key = *k;
  x->remaining = consumers;
  x->bytes = bytes;
  x->data = data;
  pthread_mutex_lock(&m->mu);
  unsigned h = key_hash(k);
  x->next = m->bucket[h];
  m->bucket[h] = x;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* Waits for the message, at most timeout_s seconds (0: no limit); NULL
 * when the run failed meanwhile, or (*late set) when the time ran out. The
 * message stays valid until mbox_done. The condition variable waits on
 * CLOCK_MONOTONIC (xrun_open). */
static xmsg *mbox_take(xmbox *m, const xkey *k, double timeout_s, bool *late) {
  struct timespec end;
  clock_gettime(CLOCK_MONOTONIC, &end);
  double whole = floor(timeout_s);
  end.tv_sec += (time_t)whole;
  end.tv_nsec += (long)((timeout_s - whole) * 1e9);
  if (end.tv_nsec >= 1000000000L) end.tv_sec++, end.tv_nsec -= 1000000000L;
  *late = false;
  pthread_mutex_lock(&m->mu);
  unsigned h = key_hash(k);
  for (;;) {
    for (xmsg *x = m->bucket[h]; x; x = x->next)
      if (key_eq(&x->key, k)) {
        pthread_mutex_unlock(&m->mu);
        return x;
      }
    if (m->failed) break;
    if (timeout_s <= 0) pthread_cond_wait(&m->cv, &m->mu);
    else if (pthread_cond_timedwait(&m->cv, &m->mu, &end) == ETIMEDOUT) {
      *late = true;
      break;
    }
  }
  pthread_mutex_unlock(&m->mu);
  return NULL;
}

static void mbox_done(xmbox *m, xmsg *x) {
  pthread_mutex_lock(&m->mu);
  if (--x->remaining == 0) {
    xmsg **pp = &m->bucket[key_hash(&x->key)];
    while (*pp != x) pp = &(*pp)->next;
    *pp = x->next;
    free(x->data);
    free(x);
  }
  pthread_mutex_unlock(&m->mu);
}

static void mbox_fail(xmbox *m) {
  pthread_mutex_lock(&m->mu);
  m->failed = true;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* ---- the run ---------------------------------------------------------------- */

/* One device: its thread, its buffers. */
typedef struct xdev {
  xrun *run;
  int device;
  const lprog *prog;
  void **mem;             /* per buffer of its program (id - buf_lo) */
  int *slot;              /* per instruction: the loss slot a compute writes its share to, -1 */
  bool *stepped;          /* per buffer: a param buffer an optimizer step wrote */
  int64_t live, peak;     /* bytes of its buffers, at their dtypes' sizes: now, at most */
  int64_t live_role[LB_ROLE_COUNT], peak_role[LB_ROLE_COUNT];
  clip_own *own;          /* per instruction: what a step counts in the norm */
  int *order, nhead;      /* with clipping: the instructions before the norm
                           * (nhead), then those after it, in program order */
  double sq;              /* this pass: the sum of squares of what its steps count */
  double *span;           /* a traced pass: per instruction, its start and
                           * end from the pass's start (NaN: not run) */
  char err[512];
  bool failed;
} xdev;

struct backend_run {
  const weft_program *pr;
  const weft_graph *g;
  weft_world *w;
  backend_opts o;
  xnet *net;              /* under mpirun: this process runs its share of
                           * the devices; NULL: one process runs them all */
  backend_step cur;       /* the pass being run */
  backend_result res;
  double lr0;             /* the learning rate of the model's train statement */
  double coef;            /* this pass: the factor of every gradient (clipping) */
  bool split;             /* the devices' orders for clipping are known */
  clip_own **owners;      /* per device of the plan: clip_owners */
  xoptim optim;
  const xop **kern;       /* per operator: its kernels (xop_find), NULL for
                           * one no program runs */
  xmbox box;
  xdev *devs;
  int ndevs;              /* devices this process runs */
  int *local;             /* per device: index in devs, -1 when elsewhere */
  int64_t pass;           /* passes run (steps and evaluations): names messages */
  double *loss_slot;      /* per part of a loss: its share this step */
  int nloss;
  double *norm_slot;      /* per device of the plan: its sum of squares */
  double *sum_vec;        /* under mpirun: what the main thread sums over
                           * the processes when sum_wanted */
  int sum_len;
  pthread_barrier_t bar;
  int finished;           /* device threads done (under box.mu) */
  bool sum_wanted;        /* under mpirun: sum_vec awaits its sum over
                           * processes by the main thread (box.mu) */
  double t0;
  bool failed;
};

static bool dev_fail(xdev *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool dev_fail(xdev *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->err, sizeof d->err, fmt, ap);
  va_end(ap);
  d->failed = true;
  /* under mpirun the main thread, the one that talks MPI, sees the mailbox
   * fail and ends every process (progress) */
  mbox_fail(&d->run->box);
  return false;
}

/* The message k for device d; NULL (and the run failed) when it does not
 * come within the run's timeout. */
static xmsg *take(xdev *d, const xkey *k) {
  bool late;
  xmsg *m = mbox_take(&d->run->box, k, d->run->o.timeout_s, &late);
  if (late)
    dev_fail(d, "step %" PRId64 ": waited %.3g s for %s of comm %d from device %d; it did not come (--timeout)",
             d->run->w->step + 1, d->run->o.timeout_s, k->cls == CLS_SEND ? "the message" : "its share of the collective",
             k->id, k->src);
  return m;
}

static const lbuf *buf_of(const xrun *r, int id) { return &r->pr->bufs[id]; }

static void *mem_of(const xdev *d, int id) { return d->mem[id - d->prog->buf_lo]; }

/* A ref as a packed array: the buffer itself when the ref covers it, else
 * a gathered copy (*tmp set, the caller frees). */
static void *ref_in(const xdev *d, const lref *ref, void **tmp) {
  *tmp = NULL;
  if (ref->buf < 0) return NULL;
  const lbuf *b = buf_of(d->run, ref->buf);
  void *m = mem_of(d, ref->buf);
  if (tregion_equal(&b->region, &ref->region)) return m;
  *tmp = weft_xmalloc((size_t)tregion_numel(&ref->region) * 4);
  region_move(*tmp, &ref->region, m, &b->region, &ref->region, false);
  return *tmp;
}

/* Writes (or adds) a packed part into the ref's place in its buffer. */
static void ref_out(const xdev *d, const lref *ref, const void *part, bool add) {
  const lbuf *b = buf_of(d->run, ref->buf);
  region_move(mem_of(d, ref->buf), &b->region, part, &ref->region, &ref->region, add);
}

static void net_post(xrun *r, const xkey *k, const int *consumers, int n, void *data, int64_t bytes) {
  xnet *net = r->net;
  if (!net) {
    mbox_put(&r->box, k, n, data, bytes);
    return;
  }
  /* Local takers share one message; each other process gets a copy. */
  int me = xnet_rank(net), here = 0;
  for (int i = 0; i < n; i++) here += xnet_proc(net, consumers[i]) == me;
  for (int q = 0; q < xnet_size(net); q++) {
    if (q == me) continue;
    int there = 0;
    for (int i = 0; i < n; i++) there += xnet_proc(net, consumers[i]) == q;
    if (there && !xnet_post(net, q, k, there, data, bytes)) {
      fprintf(stderr, "weft run: process %d: %s\n", me, xnet_error(net));
      xnet_abort(net, WEFT_FAILED);
    }
  }
  if (here) mbox_put(&r->box, k, here, data, bytes);
  else free(data);
}

/* ---- instructions ---------------------------------------------------------- */

static bool do_alloc(xdev *d, const lins *in) {
  xrun *r = d->run;
  const lbuf *b = buf_of(r, in->buf);
  int64_t n = tregion_numel(&b->region) * b->copies;
  void **slot = &d->mem[in->buf - d->prog->buf_lo];
  if (b->persistent && *slot) {
    if (b->role == LB_GRAD) memset(*slot, 0, (size_t)n * 4);
    return true;
  }
  *slot = weft_xcalloc((size_t)n * 4);
  /* what it holds, measured as the program's dtypes count it */
  int64_t bytes = n * dtype_bytes[b->dtype];
  d->live += bytes;
  d->live_role[b->role] += bytes;
  if (d->live > d->peak) {
    d->peak = d->live;
    memcpy(d->peak_role, d->live_role, sizeof d->peak_role);
  }
  const gtensor *t = &r->g->tensors[b->tensor];
  dregion dims[16];
  irange iv[16];
  if (t->ndims > 16) return dev_fail(d, "tensor %s has more than 16 dimensions", t->name);
  tregion whole = whole_region(t, dims, iv);
  if (b->role == LB_INPUT) {
    region_move(*slot, &b->region, r->w->input[b->tensor], &whole, &b->region, false);
  } else if (b->role == LB_PARAM) {
    /* the world holds a parameter's master value: the parameter is its rounding */
    region_move(*slot, &b->region, r->w->param[b->tensor], &whole, &b->region, false);
    xoptim_round(*slot, n, t->dtype);
  } else if (b->role == LB_MASTER) {
    /* copy 0, the master weights; copy 1 (an f32 gradient) is written by the step */
    region_move(*slot, &b->region, r->w->param[b->tensor], &whole, &b->region, false);
  } else if (b->role == LB_STATE) {
    int64_t whole_n = tensor_numel(t), part_n = tregion_numel(&b->region);
    for (int c = 0; c < b->copies && c < r->w->state_copies; c++)
      region_move((float *)*slot + c * part_n, &b->region, r->w->state[b->tensor] + c * whole_n, &whole,
                  &b->region, false);
  }
  return true;
}

static bool do_free(xdev *d, const lins *in) {
  void **slot = &d->mem[in->buf - d->prog->buf_lo];
  if (*slot) {
    const lbuf *b = buf_of(d->run, in->buf);
    int64_t bytes = tregion_numel(&b->region) * b->copies * dtype_bytes[b->dtype];
    d->live -= bytes;
    d->live_role[b->role] -= bytes;
  }
  free(*slot);
  *slot = NULL;
  return true;
}

static bool do_compute(xdev *d, const lins *in) {
  xrun *r = d->run;
  int opi = lower_compute_op(r->pr, in);
  const gop *op = &r->g->ops[opi];
  xcall c = {0};
  c.g = r->g;
  c.op = opi;
  c.kern = r->kern[opi];
  c.backward = in->dir == DIR_BACKWARD;
  c.part = in->part;
  c.nin = op->ninputs;
  c.allow_native = r->o.allow_native;
  if (c.nin > XOP_MAX_INPUTS) return dev_fail(d, "%s: too many inputs", op->name);
  void *tmps[2 * XOP_MAX_INPUTS + 3] = {0};
  int ntmp = 0;
  int nref = in->nin;
  if (in->part == LP_COMBINE && nref > 0) {
    /* the gathered statistics come last */
    const lref *ref = &in->in[--nref];
    c.stats = ref_in(d, ref, &tmps[ntmp++]);
    c.statsr = &ref->region;
  }
  for (int i = 0; i < nref; i++) {
    const lref *ref = &in->in[i];
    void *t;
    if (ref->arg >= 0 && ref->arg < c.nin) {
      c.in[ref->arg] = ref_in(d, ref, &t);
      c.inr[ref->arg] = &ref->region;
    } else {
      c.dy = ref_in(d, ref, &t);
      c.dyr = &ref->region;
    }
    tmps[ntmp++] = t;
  }
  /* Regions of inputs not applied (buf -1) still size the call. */
  for (int i = 0; i < c.nin; i++)
    if (!c.inr[i]) return dev_fail(d, "%s: compute without input %d", op->name, i);
  /* Outputs: straight into the buffer when the ref covers it, else into a
   * zeroed part added or written afterwards. */
  bool direct = true;
  for (int i = 0; i < in->nout; i++) {
    const lref *ref = &in->out[i];
    if (ref->buf < 0 || !tregion_equal(&buf_of(r, ref->buf)->region, &ref->region)) direct = false;
  }
  float *parts[XOP_MAX_INPUTS + 1] = {0};
  for (int i = 0; i < in->nout; i++) {
    const lref *ref = &in->out[i];
    float *p = direct ? mem_of(d, ref->buf) : weft_xcalloc((size_t)tregion_numel(&ref->region) * 4);
    parts[i] = direct ? NULL : p;
    if (ref->arg < 0) {
      c.out = p;
      c.outr = &ref->region;
    } else if (ref->arg < c.nin) {
      c.din[ref->arg] = p;
    }
  }
  c.acc = direct ? in->accumulate : false;
  int64_t ranges[2 * 64];
  const irange *rg = lower_compute_ranges(r->pr, in);
  int ni = lower_op_idims(r->pr, opi);
  for (int i = 0; i < ni && i < 64; i++) ranges[2 * i] = rg[i].lo, ranges[2 * i + 1] = rg[i].hi;
  c.ranges = ranges;
  c.nidims = ni;
  bool ok = xop_run(&c, d->err, sizeof d->err);
  if (ok && !direct)
    for (int i = 0; i < in->nout; i++) ref_out(d, &in->out[i], parts[i], in->accumulate);
  for (int i = 0; i < in->nout; i++) free(parts[i]);
  for (int i = 0; i < ntmp; i++) free(tmps[i]);
  if (!ok) {
    char msg[sizeof d->err];
    snprintf(msg, sizeof msg, "%s", d->err[0] ? d->err : "a kernel failed");
    return dev_fail(d, "%s", msg);
  }
  int slot = d->slot[in - d->prog->ins];
  if (slot >= 0) r->loss_slot[slot] = c.loss;
  return true;
}

static bool do_send(xdev *d, const lins *in) {
  xrun *r = d->run;
  void *t;
  void *src = ref_in(d, &in->in[0], &t);
  int64_t bytes = tregion_numel(&in->in[0].region) * 4;
  void *data = t ? t : weft_xmalloc((size_t)bytes);
  if (!t) memcpy(data, src, (size_t)bytes);
  xkey k = {r->pass, CLS_SEND, in->comm, in->epoch, d->device, in->peer};
  net_post(r, &k, &in->peer, 1, data, bytes);
  return true;
}

static bool do_recv(xdev *d, const lins *in) {
  xrun *r = d->run;
  xkey k = {r->pass, CLS_SEND, in->comm, in->epoch, in->peer, d->device};
  xmsg *m = take(d, &k);
  if (!m) return false;
  int64_t bytes = tregion_numel(&in->out[0].region) * 4;
  if (m->bytes != bytes) {
    mbox_done(&r->box, m);
    return dev_fail(d, "comm %d: received %lld bytes, expected %lld", in->comm, (long long)m->bytes,
                    (long long)bytes);
  }
  ref_out(d, &in->out[0], m->data, false);
  mbox_done(&r->box, m);
  return true;
}

/* The sum over the members of group comm, in rank order (the same bits on
 * every member): this member's n values `mine` (NULL: zeros) and what each
 * other member posted under (comm, epoch, itself, dst). */
static bool sum_members(xdev *d, const lins *in, const pcomm *cm, int dst, const float *mine, int64_t n,
                        float *sum) {
  xrun *r = d->run;
  bool first = true;
  for (int i = 0; i < cm->ngroup; i++) {
    const float *x = mine;
    xmsg *m = NULL;
    if (cm->group[i] != d->device) {
      xkey k = {r->pass, CLS_COLL, in->comm, in->epoch, cm->group[i], dst};
      if (!(m = take(d, &k))) return false;
      if (m->data && m->bytes != n * 4) {
        mbox_done(&r->box, m);
        return dev_fail(d, "comm %d: a member sent %lld bytes, expected %lld", in->comm, (long long)m->bytes,
                        (long long)(n * 4));
      }
      x = m->data;
    }
    if (x) {
      if (first) memcpy(sum, x, (size_t)n * 4);
      else
        for (int64_t e = 0; e < n; e++) sum[e] += x[e];
      first = false;
    }
    if (m) mbox_done(&r->box, m);
  }
  return true;
}

/* An all-reduce, or a bucket of them on one group (lower.h): the regions
 * of its comms one after another in one message; a member without `in`
 * sends nothing and counts as zeros. The sum is taken in rank order, the
 * same on every member. */
static bool do_all_reduce(xdev *d, const lins *in) {
  xrun *r = d->run;
  int k = in->nbucket + 1;
  const pcomm *cm = lower_comm(r->pr, in->comm);
  if (in->nout != k || (in->nin != k && in->nin > 0 && k > 1))
    return dev_fail(d, "comm %d: a bucket of %d without a ref each", in->comm, k);
  const tregion **R = weft_xmalloc(sizeof(tregion *) * (size_t)k);
  int64_t n = 0;
  for (int i = 0; i < k; i++) {
    R[i] = &lower_comm(r->pr, i ? in->bucket[i - 1] : in->comm)->region;
    n += tregion_numel(R[i]);
  }
  float *mine = NULL;
  if (in->nin > 0 && in->in[0].buf >= 0) {
    mine = weft_xmalloc((size_t)n * 4);
    int64_t off = 0;
    for (int i = 0; i < k; i++) {
      const lref *ref = &in->in[i];
      const lbuf *b = buf_of(r, ref->buf);
      region_move(mine + off, R[i], mem_of(d, ref->buf), &b->region, R[i], false);
      off += tregion_numel(R[i]);
    }
  }
  int p = cm->ngroup, no = 0;
  int *others = weft_xmalloc((size_t)p * sizeof(int));
  for (int i = 0; i < p; i++)
    if (cm->group[i] != d->device) others[no++] = cm->group[i];
  xkey key = {r->pass, CLS_COLL, in->comm, in->epoch, d->device, -1};
  if (no) {
    float *copy = NULL;
    if (mine) {
      copy = weft_xmalloc((size_t)n * 4);
      memcpy(copy, mine, (size_t)n * 4);
    }
    net_post(r, &key, others, no, copy, copy ? n * 4 : 0);
  }
  float *sum = weft_xcalloc((size_t)n * 4);
  bool ok = sum_members(d, in, cm, -1, mine, n, sum);
  int64_t off = 0;
  for (int i = 0; ok && i < k; i++) {
    const lref *ref = &in->out[i];
    const lbuf *b = buf_of(r, ref->buf);
    region_move(mem_of(d, ref->buf), &b->region, sum + off, R[i], R[i], false);
    off += tregion_numel(R[i]);
  }
  free(sum), free(mine), free(others), free(R);
  return ok;
}

static bool do_collective(xdev *d, const lins *in) {
  xrun *r = d->run;
  const pcomm *cm = lower_comm(r->pr, in->comm);
  if (cm->kind == COMM_ALL_REDUCE) return do_all_reduce(d, in);
  int p = cm->ngroup, me = -1;
  for (int i = 0; i < p; i++)
    if (cm->group[i] == d->device) me = i;
  if (me < 0) return dev_fail(d, "comm %d: device %d is not in its group", in->comm, d->device);
  int *others = weft_xmalloc((size_t)p * sizeof(int));
  int no = 0;
  for (int i = 0; i < p; i++)
    if (i != me) others[no++] = cm->group[i];
  const lref *out = &in->out[0];
  bool ok = true;
  if (cm->kind == COMM_REDUCE_SCATTER) {
    /* each member gets its part of the sum: the others' pieces of it, added
     * in rank order */
    const tregion *R = &cm->region, *want = &cm->parts[me];
    int64_t wn = tregion_numel(want);
    float *mine = NULL;
    if (in->nin > 0 && in->in[0].buf >= 0) {
      mine = weft_xmalloc((size_t)tregion_numel(R) * 4);
      const lbuf *b = buf_of(r, in->in[0].buf);
      region_move(mine, R, mem_of(d, in->in[0].buf), &b->region, R, false);
    }
    for (int i = 0; i < p; i++) {
      if (i == me) continue;
      int64_t pn = tregion_numel(&cm->parts[i]);
      float *piece = NULL;
      if (mine) {
        piece = weft_xmalloc((size_t)pn * 4);
        region_move(piece, &cm->parts[i], mine, R, &cm->parts[i], false);
      }
      xkey k = {r->pass, CLS_COLL, in->comm, in->epoch, d->device, cm->group[i]};
      net_post(r, &k, &cm->group[i], 1, piece, piece ? pn * 4 : 0);
    }
    float *mypart = NULL;
    if (mine) {
      mypart = weft_xmalloc((size_t)wn * 4);
      region_move(mypart, want, mine, R, want, false);
    }
    float *sum = weft_xcalloc((size_t)wn * 4);
    ok = sum_members(d, in, cm, d->device, mypart, wn, sum);
    if (ok) {
      const lbuf *ob = buf_of(r, out->buf);
      region_move(mem_of(d, out->buf), &ob->region, sum, want, want, false);
    }
    free(sum), free(mypart), free(mine);
  } else if (cm->kind == COMM_ALL_GATHER) {
    const tregion *mine_r = &cm->parts[me];
    int64_t n = tregion_numel(mine_r);
    float *mine = weft_xmalloc((size_t)n * 4);
    const lbuf *ib = buf_of(r, in->in[0].buf);
    region_move(mine, mine_r, mem_of(d, in->in[0].buf), &ib->region, mine_r, false);
    xkey k = {r->pass, CLS_COLL, in->comm, in->epoch, d->device, -1};
    const lbuf *ob = buf_of(r, out->buf);
    void *om = mem_of(d, out->buf);
    region_move(om, &ob->region, mine, mine_r, mine_r, false);
    if (no) net_post(r, &k, others, no, mine, n * 4);
    else free(mine);
    for (int i = 0; i < p && ok; i++) {
      if (i == me) continue;
      xkey pk = {r->pass, CLS_COLL, in->comm, in->epoch, cm->group[i], -1};
      xmsg *m = take(d, &pk);
      if (!m) { ok = false; break; }
      if (m->bytes != tregion_numel(&cm->parts[i]) * 4)
        ok = dev_fail(d, "comm %d: a member sent %lld bytes", in->comm, (long long)m->bytes);
      else
        region_move(om, &ob->region, m->data, &cm->parts[i], &cm->parts[i], false);
      mbox_done(&r->box, m);
    }
  } else if (cm->kind == COMM_BROADCAST) {
    /* the root is the member with `in`; one root, so no sender in the key */
    const tregion *R = &cm->region;
    int64_t n = tregion_numel(R);
    const lbuf *ob = buf_of(r, out->buf);
    xkey k = {r->pass, CLS_COLL, in->comm, in->epoch, -1, -1};
    if (in->nin > 0) {
      float *copy = weft_xmalloc((size_t)n * 4);
      region_move(copy, R, mem_of(d, out->buf), &ob->region, R, false);
      if (no) net_post(r, &k, others, no, copy, n * 4);
      else free(copy);
    } else {
      xmsg *m = take(d, &k);
      if (!m) ok = false;
      else {
        if (m->bytes != n * 4) ok = dev_fail(d, "comm %d: the root sent %lld bytes", in->comm, (long long)m->bytes);
        else region_move(mem_of(d, out->buf), &ob->region, m->data, R, R, false);
        mbox_done(&r->box, m);
      }
    }
  } else if (cm->kind == COMM_ALL_TO_ALL) {
    /* member i sends member j sources[i] ∩ parts[j]; its own piece stays */
    const tregion *from = &cm->sources[me], *to = &cm->parts[me];
    const lbuf *ib = buf_of(r, in->in[0].buf), *ob = buf_of(r, out->buf);
    void *im = mem_of(d, in->in[0].buf), *om = mem_of(d, out->buf);
    arena a;
    arena_init(&a);
    for (int j = 0; j < p; j++) {
      tregion x;
      if (!tregion_intersect(&a, from, &cm->parts[j], &x)) continue;
      if (j == me) {
        region_move(om, &ob->region, im, &ib->region, &x, false);
        continue;
      }
      int64_t n = tregion_numel(&x);
      float *piece = weft_xmalloc((size_t)n * 4);
      region_move(piece, &x, im, &ib->region, &x, false);
      xkey k = {r->pass, CLS_COLL, in->comm, in->epoch, d->device, cm->group[j]};
      net_post(r, &k, &cm->group[j], 1, piece, n * 4);
    }
    for (int j = 0; j < p && ok; j++) {
      tregion x;
      if (j == me || !tregion_intersect(&a, &cm->sources[j], to, &x)) continue;
      xkey k = {r->pass, CLS_COLL, in->comm, in->epoch, cm->group[j], d->device};
      xmsg *m = take(d, &k);
      if (!m) { ok = false; break; }
      if (m->bytes != tregion_numel(&x) * 4)
        ok = dev_fail(d, "comm %d: a member sent %lld bytes, expected %lld", in->comm, (long long)m->bytes,
                      (long long)(tregion_numel(&x) * 4));
      else
        region_move(om, &ob->region, m->data, &x, &x, false);
      mbox_done(&r->box, m);
    }
    arena_free(&a);
  } else {
    ok = dev_fail(d, "comm %d: the CPU backend does not run %s", in->comm, comm_kind_names[cm->kind]);
  }
  free(others);
  return ok;
}

static bool do_copy(xdev *d, const lins *in) {
  const lref *out = &in->out[0];
  const lbuf *ob = buf_of(d->run, out->buf);
  for (int i = 0; i < in->nin; i++) {
    const lref *ref = &in->in[i];
    const lbuf *ib = buf_of(d->run, ref->buf);
    region_move(mem_of(d, out->buf), &ob->region, mem_of(d, ref->buf), &ib->region, &ref->region, in->accumulate);
  }
  return true;
}

/* The sum of squares of what step instruction i counts of its gradient. */
static double grad_sq(const xdev *d, int i, const float *grad) {
  const clip_own *o = &d->own[i];
  double s = 0;
  if (o->count == 0) return 0;
  for (int64_t e = 0; e < o->n; e++)
    if (!o->mask || o->mask[e]) s += (double)grad[e] * (double)grad[e];
  return s;
}


/* Copy `copy` of a ref's region as packed values: the buffer's own memory
 * when the ref covers the buffer, else a copy (*tmp set; the caller writes
 * it back with ref_back if it changed, and frees it). */
static float *ref_view(const xdev *d, const lref *ref, int copy, float **tmp) {
  const lbuf *b = buf_of(d->run, ref->buf);
  int64_t bn = tregion_numel(&b->region);
  float *m = (float *)mem_of(d, ref->buf) + copy * bn;
  *tmp = NULL;
  if (tregion_equal(&b->region, &ref->region)) return m;
  *tmp = weft_xmalloc((size_t)tregion_numel(&ref->region) * 4);
  region_move(*tmp, &ref->region, m, &b->region, &ref->region, false);
  return *tmp;
}

static void ref_back(const xdev *d, const lref *ref, int copy, const float *v) {
  const lbuf *b = buf_of(d->run, ref->buf);
  int64_t bn = tregion_numel(&b->region);
  region_move((float *)mem_of(d, ref->buf) + copy * bn, &b->region, v, &ref->region, &ref->region, false);
}

/* The optimizer on a parameter region: on its master weights when it has
 * them (reading an f32 copy of the gradient kept beside them when the
 * master buffer has room for one), the parameter then rounded from them;
 * else on the parameter, rounded to its dtype after. The state and master
 * buffers are the outs after the parameter, told apart by role. */
static bool do_step(xdev *d, const lins *in) {
  xrun *r = d->run;
  const lref *gref = &in->in[0], *pref = &in->out[0], *sref = NULL, *mref = NULL;
  for (int i = 1; i < in->nout; i++) {
    int role = buf_of(r, in->out[i].buf)->role;
    if (role == LB_STATE) sref = &in->out[i];
    else if (role == LB_MASTER) mref = &in->out[i];
  }
  const gtensor *t = &r->g->tensors[in->tensor];
  int64_t n = tregion_numel(&pref->region);
  int copies = sref ? buf_of(r, sref->buf)->copies : 0;
  if (copies < xoptim_state(&r->optim)) return dev_fail(d, "step of %s: optimizer state missing", t->name);
  float *gt, *grad = ref_view(d, gref, 0, &gt);
  /* a gradient that is not finite would spoil the parameter for good */
  for (int64_t i = 0; i < n && !r->o.allow_nonfinite; i++)
    if (!isfinite(grad[i])) {
      const char *what = isnan(grad[i]) ? "nan" : grad[i] > 0 ? "inf" : "-inf";
      free(gt);
      return dev_fail(d, "step %" PRId64 ": the gradient of %s holds %s (element %" PRId64 " of this device's part); "
                      "training stops before the optimizer takes it (--allow-nonfinite trains on)",
                      r->w->step + 1, t->name, what, i);
    }
  if (r->coef == 1.0) {
    /* the norm as the steps come (with clipping it was taken before them) */
    d->sq += grad_sq(d, (int)(in - d->prog->ins), grad);
  } else {
    float *scaled = gt ? gt : weft_xmalloc((size_t)n * 4);
    float c = (float)r->coef;
    for (int64_t e = 0; e < n; e++) scaled[e] = grad[e] * c;
    grad = scaled;
    gt = scaled;
  }
  /* the state: its copies one after the other, as the buffer keeps them */
  float *state = NULL, *st = NULL;
  if (sref) {
    state = ref_view(d, sref, 0, &st);
    if (st) {
      state = st = realloc(st, (size_t)(n * copies) * 4);
      if (!st) weft_oom();
      for (int c = 1; c < copies; c++) {
        float *x, *v = ref_view(d, sref, c, &x);
        memcpy(st + c * n, v, (size_t)n * 4);
        free(x);
      }
    }
  }
  float *wt, *weights = ref_view(d, mref ? mref : pref, 0, &wt);
  if (mref && buf_of(r, mref->buf)->copies > 1) {
    ref_back(d, mref, 1, grad);  /* the f32 gradient the step reads */
    float *x;
    grad = ref_view(d, mref, 1, &x);
    free(gt);
    gt = x;
  }
  xoptim_step(&r->optim, weights, state, grad, n, r->w->step + 1);
  if (wt) ref_back(d, mref ? mref : pref, 0, wt);
  if (mref) {
    float *pt, *param = ref_view(d, pref, 0, &pt);
    memcpy(param, weights, (size_t)n * 4);
    xoptim_round(param, n, t->dtype);
    if (pt) ref_back(d, pref, 0, pt);
    free(pt);
  } else if (t->dtype != DT_F32) {
    float *pt, *param = ref_view(d, pref, 0, &pt);
    xoptim_round(param, n, t->dtype);
    if (pt) ref_back(d, pref, 0, pt);
    free(pt);
  }
  for (int c = 0; st && c < copies; c++) ref_back(d, sref, c, st + c * n);
  free(gt), free(st), free(wt);
  d->stepped[pref->buf - d->prog->buf_lo] = true;
  if (mref) d->stepped[mref->buf - d->prog->buf_lo] = true;
  return true;
}

static bool run_kind(xdev *d, const lins *in);

static bool run_ins(xdev *d, const lins *in) {
  /* an evaluation runs the forward only (communications still meet) */
  if (d->run->cur.eval &&
      (in->kind == LI_STEP || (in->kind == LI_COMPUTE && (in->dir == DIR_BACKWARD || in->recompute))))
    return true;
  if (!d->span || in->kind == LI_ALLOC || in->kind == LI_FREE) return run_kind(d, in);
  /* a traced pass: the device's thread's wall time in it, waits included */
  size_t i = (size_t)(in - d->prog->ins);
  d->span[2 * i] = now() - d->run->t0;
  bool ok = run_kind(d, in);
  d->span[2 * i + 1] = now() - d->run->t0;
  return ok;
}

static bool run_kind(xdev *d, const lins *in) {
  switch (in->kind) {
  case LI_ALLOC: return do_alloc(d, in);
  case LI_FREE: return do_free(d, in);
  case LI_COMPUTE: return do_compute(d, in);
  case LI_SEND: return do_send(d, in);
  case LI_RECV: return do_recv(d, in);
  case LI_COLLECTIVE: return do_collective(d, in);
  case LI_COPY: return do_copy(d, in);
  case LI_STEP: return do_step(d, in);
  default: return dev_fail(d, "unknown instruction");
  }
}

/* Under mpirun, v summed over the processes by the main thread, which
 * talks MPI; the caller is the one thread of this process's devices that
 * runs while the others wait. */
static void procs_sum(xrun *r, double *v, int n) {
  if (!r->net) return;
  pthread_mutex_lock(&r->box.mu);
  r->sum_vec = v;
  r->sum_len = n;
  r->sum_wanted = true;
  pthread_cond_broadcast(&r->box.cv);
  while (r->sum_wanted) pthread_cond_wait(&r->box.cv, &r->box.mu);
  pthread_mutex_unlock(&r->box.mu);
}

/* The L2 norm of all gradients: each device's sum of squares, summed in
 * device order, the same bits in every process. */
static double grad_norm(xrun *r) {
  for (int i = 0; i < r->ndevs; i++) r->norm_slot[r->devs[i].device] = r->devs[i].sq;
  procs_sum(r, r->norm_slot, r->pr->nprogs);
  double s = 0;
  for (int dv = 0; dv < r->pr->nprogs; dv++) s += r->norm_slot[dv], r->norm_slot[dv] = 0;
  return sqrt(s);
}

/* The end of a pass, run by one thread while the others wait: the loss,
 * the norm, the time. */
static void end_step(xrun *r) {
  double *slots = r->loss_slot;
  procs_sum(r, slots, r->nloss);
  double loss = 0;
  for (int i = 0; i < r->nloss; i++) loss += slots[i];
  for (int i = 0; i < r->nloss; i++) slots[i] = 0;
  r->res.loss = loss;
  if (r->cur.eval) r->res.grad_norm = NAN;
  else if (r->coef == 1.0 && !(r->cur.clip > 0)) r->res.grad_norm = grad_norm(r);
  r->res.seconds = now() - r->t0;
  if (!r->cur.eval) r->w->step++;
  r->pass++;
}

/* Every device meets the others; one of them runs `serial` (unless a
 * device failed, which fails the pass) before any goes on. */
static void meet(xrun *r, void (*serial)(xrun *r)) {
  int rc = pthread_barrier_wait(&r->bar);
  if (rc == PTHREAD_BARRIER_SERIAL_THREAD) {
    bool any = false;
    for (int i = 0; i < r->ndevs; i++) any |= r->devs[i].failed;
    if (any) r->failed = true;
    else serial(r);
  }
  pthread_barrier_wait(&r->bar);
}

/* With clipping, between the instructions before the norm and those after. */
static void take_norm(xrun *r) {
  double norm = grad_norm(r);
  r->res.grad_norm = norm;
  double c = r->cur.clip / (norm + 1e-6);
  r->coef = c < 1.0 ? c : 1.0;
}

static void *dev_main(void *arg) {
  xdev *d = arg;
  xrun *r = d->run;
  const lprog *lp = d->prog;
  bool clip = r->cur.clip > 0 && !r->cur.eval;
  bool ok = !r->box.failed;
  d->sq = 0;
  if (!clip) {
    for (int i = 0; ok && i < lp->n; i++) ok = run_ins(d, &lp->ins[i]);
  } else {
    for (int k = 0; ok && k < d->nhead; k++) ok = run_ins(d, &lp->ins[d->order[k]]);
    /* the gradients the steps after the norm read are complete (clip.h) */
    for (int k = d->nhead; ok && k < lp->n; k++) {
      const lins *in = &lp->ins[d->order[k]];
      if (in->kind != LI_STEP) continue;
      void *gt;
      const float *grad = ref_in(d, &in->in[0], &gt);
      d->sq += grad_sq(d, d->order[k], grad);
      free(gt);
    }
    if (!ok && !d->failed) d->failed = true;
    meet(r, take_norm);
    for (int k = d->nhead; ok && !r->failed && k < lp->n; k++) ok = run_ins(d, &lp->ins[d->order[k]]);
  }
  if (!ok && !d->failed) d->failed = true;  /* stopped because another device failed */
  meet(r, end_step);
  pthread_mutex_lock(&r->box.mu);
  r->finished++;
  pthread_mutex_unlock(&r->box.mu);
  return NULL;
}

/* The kernels of every operator a compute runs, found once. */
static bool find_kernels(xrun *r, char *err, size_t errlen) {
  const weft_program *pr = r->pr;
  r->kern = weft_xcalloc((size_t)(r->g->nops + 1) * sizeof(const xop *));
  for (int dv = 0; dv < pr->nprogs; dv++)
    for (int i = 0; i < pr->progs[dv].n; i++) {
      const lins *in = &pr->progs[dv].ins[i];
      int op = in->kind == LI_COMPUTE ? lower_compute_op(pr, in) : -1;
      if (op >= 0 && !r->kern[op] && !(r->kern[op] = xop_find(r->g, op, err, errlen))) return false;
    }
  return true;
}

/* A compute that writes a share of a loss. */
typedef struct share {
  const lins *in;
  int device, at;         /* where it is: device, instruction */
} share;

/* By operator, micro-batch and ranges, then where they are. */
static int share_cmp(const void *x, const void *y, void *ctx) {
  const weft_program *share_pr = ctx;
  const share *a = x, *b = y;
  int oa = lower_compute_op(share_pr, a->in), ob = lower_compute_op(share_pr, b->in);
  if (oa != ob) return oa - ob;
  if (a->in->mb != b->in->mb) return a->in->mb - b->in->mb;
  const irange *ra = lower_compute_ranges(share_pr, a->in), *rb = lower_compute_ranges(share_pr, b->in);
  for (int i = 0; i < lower_op_idims(share_pr, oa); i++) {
    if (ra[i].lo != rb[i].lo) return ra[i].lo < rb[i].lo ? -1 : 1;
    if (ra[i].hi != rb[i].hi) return ra[i].hi < rb[i].hi ? -1 : 1;
  }
  return a->device != b->device ? a->device - b->device : a->at - b->at;
}

/* The shares of the loss: one slot per part of a loss operator, found in
 * every program (each process numbers them alike), written by the first
 * of its copies (replicas compute the same share). */
static void loss_slots(xrun *r) {
  const weft_program *pr = r->pr;
  int n = 0, cap = 16;
  share *sh = weft_xmalloc((size_t)cap * sizeof(share));
  for (int dv = 0; dv < pr->nprogs; dv++)
    for (int i = 0; i < pr->progs[dv].n; i++) {
      const lins *in = &pr->progs[dv].ins[i];
      if (in->kind != LI_COMPUTE || in->dir != DIR_FORWARD || in->recompute || in->part == LP_STATS ||
          !xop_is_loss(r->kern[lower_compute_op(pr, in)]))
        continue;
      if (n == cap) sh = realloc(sh, (size_t)(cap *= 2) * sizeof(share));
      if (!sh) weft_oom();
      sh[n++] = (share){in, dv, i};
    }
  qsort_r(sh, (size_t)n, sizeof(share), share_cmp, (void *)pr);
  r->nloss = 0;
  for (int k = 0; k < n; k++) {
    bool copy = k > 0 && lower_same_part(pr, sh[k - 1].in, sh[k].in);
    if (!copy) r->nloss++;
    int at = r->local[sh[k].device];
    if (!copy && at >= 0) r->devs[at].slot[sh[k].at] = r->nloss - 1;
  }
  free(sh);
  r->loss_slot = weft_xcalloc((size_t)(r->nloss + 1) * sizeof(double));
}

/* Under mpirun, every process ends with the whole world: each element is
 * taken from the lowest process that wrote it (a sum with zeros elsewhere,
 * which is exact), or kept where none did. */
static bool merge(xrun *r, float *vals, const float *seen, int64_t n) {
  xnet *net = r->net;
  int me = xnet_rank(net);
  int *owner = weft_xmalloc((size_t)n * sizeof(int));
  for (int64_t e = 0; e < n; e++) owner[e] = seen && seen[e] != 0.0f ? me : INT32_MAX;
  bool ok = xnet_min_int(net, owner, n);
  for (int64_t e = 0; e < n; e++) {
    int o = owner[e] == INT32_MAX ? 0 : owner[e];
    if (o != me) vals[e] = 0.0f;
  }
  ok = ok && xnet_sum_float(net, vals, n);
  free(owner);
  return ok;
}

/* Parameters (their master weights, when they have them) and optimizer
 * state back into the world, from the buffers that were stepped (a copy
 * that was not stepped holds an old value, and is never read). Copies must
 * agree; a difference is a fault of the plan's execution and is reported. */
static bool gather(xrun *r, char *err, size_t errlen) {
  const weft_graph *g = r->g;
  bool ok = true;
  /* 1 where a copy was written: parameters, state */
  float **seen = weft_xcalloc((size_t)g->ntensors * sizeof(float *));
  float **sseen = weft_xcalloc((size_t)g->ntensors * sizeof(float *));
  for (int i = 0; i < r->ndevs; i++) {
    xdev *d = &r->devs[i];
    for (int id = d->prog->buf_lo; id < d->prog->buf_hi; id++) {
      const lbuf *b = buf_of(r, id);
      void *m = mem_of(d, id);
      if (!m || !b->persistent) continue;
      const gtensor *t = &g->tensors[b->tensor];
      dregion dims[16];
      irange iv[16];
      tregion whole = whole_region(t, dims, iv);
      int64_t n = tensor_numel(t), part = tregion_numel(&b->region);
      float *mask = weft_xmalloc((size_t)part * 4);
      for (int64_t e = 0; e < part; e++) mask[e] = 1.0f;
      /* a parameter's value is its master's when it has master weights */
      int home = graph_has_master(g, b->tensor) ? LB_MASTER : LB_PARAM;
      if (b->role == home && d->stepped[id - d->prog->buf_lo]) {
        if (!seen[b->tensor]) seen[b->tensor] = weft_xcalloc((size_t)n * 4);
        float *before = weft_xmalloc((size_t)part * 4), *was = weft_xmalloc((size_t)part * 4);
        const float *mine = m;
        region_move(before, &b->region, r->w->param[b->tensor], &whole, &b->region, false);
        region_move(was, &b->region, seen[b->tensor], &whole, &b->region, false);
        for (int64_t e = 0; e < part && ok; e++)
          if (was[e] != 0.0f && memcmp(&before[e], &mine[e], 4) != 0 && ok) {
            snprintf(err, errlen, "copies of parameter %s differ after the run (%.9g and %.9g on device %d)",
                     t->name, (double)before[e], (double)mine[e], d->device);
            ok = false;
          }
        region_move(r->w->param[b->tensor], &whole, mine, &b->region, &b->region, false);
        region_move(seen[b->tensor], &whole, mask, &b->region, &b->region, false);
        free(before), free(was);
      } else if (b->role == LB_STATE) {
        if (!sseen[b->tensor]) sseen[b->tensor] = weft_xcalloc((size_t)n * 4);
        for (int c = 0; c < b->copies && c < r->w->state_copies; c++)
          region_move(r->w->state[b->tensor] + c * n, &whole, (float *)m + c * part, &b->region, &b->region,
                      false);
        region_move(sseen[b->tensor], &whole, mask, &b->region, &b->region, false);
      }
      free(mask);
    }
  }
  /* Every process merges every tensor, in the same order, whatever it found. */
  for (int t = 0; r->net && t < g->ntensors; t++) {
    if (!r->w->param[t]) continue;
    int64_t n = tensor_numel(&g->tensors[t]);
    bool m = merge(r, r->w->param[t], seen[t], n);
    for (int c = 0; m && c < r->w->state_copies; c++) m = merge(r, r->w->state[t] + c * n, sseen[t], n);
    if (!m) {
      fprintf(stderr, "weft run: %s\n", xnet_error(r->net));
      xnet_abort(r->net, WEFT_FAILED);
    }
  }
  for (int t = 0; t < g->ntensors; t++) free(seen[t]), free(sseen[t]);
  free(seen), free(sseen);
  return ok;
}

static void deliver(void *ctx, const xkey *k, int consumers, void *data, int64_t bytes) {
  mbox_put(ctx, k, consumers, data, bytes);
}

/* The main thread under mpirun: hands what arrives from other processes to
 * the mailbox until this process's devices are done. */
static void progress(xrun *r) {
  xnet *net = r->net;
  long wait_ns = 1000;
  for (;;) {
    pthread_mutex_lock(&r->box.mu);
    bool done = r->finished == r->ndevs, sum = r->sum_wanted, failed = r->box.failed;
    pthread_mutex_unlock(&r->box.mu);
    if (failed) {
      /* the other processes would wait for this one forever: all end now */
      for (int i = 0; i < r->ndevs; i++)
        if (r->devs[i].failed && r->devs[i].err[0]) {
          fprintf(stderr, "weft run: device %d: %s\n", r->devs[i].device, r->devs[i].err);
          break;
        }
      xnet_abort(net, WEFT_REJECTED);
    }
    int got = 0;
    bool ok = xnet_flush(net, NULL) && xnet_poll(net, deliver, &r->box, &got);
    if (ok && sum) {
      /* every message of the step is out before the processes meet */
      ok = xnet_drain(net, deliver, &r->box) && xnet_sum_double(net, r->sum_vec, r->sum_len);
      pthread_mutex_lock(&r->box.mu);
      r->sum_wanted = false;
      pthread_cond_broadcast(&r->box.cv);
      pthread_mutex_unlock(&r->box.mu);
    }
    /* a wait that no device makes: mpirun going away */
    if (ok && xnet_expired(net, now(), "the devices of this process")) ok = false;
    if (!ok) {
      fprintf(stderr, "weft run: %s\n", xnet_error(net));
      xnet_abort(net, WEFT_FAILED);
    }
    if (done) break;
    if (got || sum) {
      wait_ns = 1000;
      continue;
    }
    struct timespec ts = {0, wait_ns};
    nanosleep(&ts, NULL);
    if (wait_ns < 200000) wait_ns *= 2;
  }
  if (!xnet_drain(net, deliver, &r->box)) {
    fprintf(stderr, "weft run: %s\n", xnet_error(net));
    xnet_abort(net, WEFT_FAILED);
  }
}

void xrun_close(xrun *r) {
  if (!r) return;
  for (int i = 0; i < r->ndevs; i++) {
    xdev *d = &r->devs[i];
    for (int b = 0; b < d->prog->buf_hi - d->prog->buf_lo; b++) free(d->mem[b]);
    free(d->mem);
    free(d->stepped);
    free(d->slot);
    free(d->order);
  }
  clip_owners_free(r->pr, r->owners);
  for (int h = 0; h < MBOX_BUCKETS; h++)
    for (xmsg *x = r->box.bucket[h], *nx; x; x = nx) nx = x->next, free(x->data), free(x);
  pthread_mutex_destroy(&r->box.mu);
  pthread_cond_destroy(&r->box.cv);
  xnet_stop(r->net);
  free(r->devs), free(r->local), free(r->loss_slot), free(r->norm_slot), free(r->kern);
  free(r);
}

xrun *xrun_open(const weft_program *pr, weft_world *w, const backend_opts *o, char *err, size_t errlen) {
  for (int d = 0; d < pr->nprogs; d++)
    if (pr->progs[d].n && !pr->progs[d].ins) {
      /* a library caller's mistake, not a user's */
      snprintf(err, errlen, "the programs were lowered without their full instructions (lower_opts.full_programs)");
      return NULL;
    }
  k_blas_single();
  xrun *r = weft_xcalloc(sizeof *r);
  r->pr = pr;
  r->g = lower_graph(pr);
  r->w = w;
  r->o = *o;
  pthread_mutex_init(&r->box.mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&r->box.cv, &ca);
  pthread_condattr_destroy(&ca);
  r->local = weft_xmalloc((size_t)pr->nprogs * sizeof(int));
  r->devs = weft_xcalloc((size_t)pr->nprogs * sizeof(xdev));
  bool ok = xoptim_from_graph(r->g, &r->optim);
  if (!ok) snprintf(err, errlen, "model %s does not train: it has no `train` statement", r->g->name);
  ok = ok && find_kernels(r, err, errlen);
  err[0] = ok ? 0 : err[0];
  if (ok) {
    r->net = xnet_start(o->timeout_s, err, errlen);
    ok = r->net || !err[0];
  }
  if (r->net) {
    bool *active = weft_xcalloc((size_t)pr->nprogs);
    for (int dv = 0; dv < pr->nprogs; dv++) active[dv] = pr->progs[dv].n > 0;
    xnet_assign(r->net, active, pr->nprogs);
    free(active);
  }
  for (int dv = 0; dv < pr->nprogs && ok; dv++) {
    r->local[dv] = -1;
    const lprog *lp = &pr->progs[dv];
    if (lp->n == 0) continue;
    if (r->net && xnet_proc(r->net, dv) != xnet_rank(r->net)) continue;
    xdev *d = &r->devs[r->ndevs];
    r->local[dv] = r->ndevs++;
    d->run = r;
    d->device = dv;
    d->prog = lp;
    int nb = lp->buf_hi - lp->buf_lo;
    d->mem = weft_xcalloc((size_t)(nb + 1) * sizeof(void *));
    d->stepped = weft_xcalloc((size_t)(nb + 1));
    d->slot = weft_xmalloc((size_t)(lp->n + 1) * sizeof(int));
    for (int i = 0; i < lp->n; i++) d->slot[i] = -1;
  }
  if (!ok) {
    xrun_close(r);
    return NULL;
  }
  r->lr0 = r->optim.lr;
  loss_slots(r);
  r->norm_slot = weft_xcalloc((size_t)(pr->nprogs + 1) * sizeof(double));
  bool *want = weft_xcalloc((size_t)pr->nprogs + 1);
  for (int dv = 0; dv < pr->nprogs; dv++) want[dv] = r->local[dv] >= 0;
  r->owners = clip_owners(pr, want);
  free(want);
  for (int i = 0; i < r->ndevs; i++) r->devs[i].own = r->owners[r->devs[i].device];
  return r;
}

/* The order of each device's instructions for clipping (clip_tail). */
static bool split_programs(xrun *r, char *err, size_t errlen) {
  bool **tail = clip_tail(r->pr, err, errlen);
  if (!tail) return false;
  for (int i = 0; i < r->ndevs; i++) {
    xdev *d = &r->devs[i];
    const bool *t = tail[d->device];
    d->order = weft_xmalloc((size_t)(d->prog->n + 1) * sizeof(int));
    int k = 0;
    for (int j = 0; j < d->prog->n; j++)
      if (!t[j]) d->order[k++] = j;
    d->nhead = k;
    for (int j = 0; j < d->prog->n; j++)
      if (t[j]) d->order[k++] = j;
  }
  clip_tail_free(r->pr, tail);
  r->split = true;
  return true;
}

bool xrun_steps(xrun *r, const backend_step *st, backend_result *out, char *err, size_t errlen) {
  if (r->failed) {
    snprintf(err, errlen, "a step of this run failed before");
    return false;
  }
  if (r->ndevs == 0) {
    /* a process without devices (more processes than devices) */
    *out = (backend_result){0, st->eval ? NAN : 0, 0, 0};
    if (!st->eval) r->w->step++;
    return true;
  }
  r->cur = *st;
  r->optim.lr = isnan(st->lr) ? r->lr0 : st->lr;
  r->coef = 1.0;
  r->res = (backend_result){0};
  if (st->clip > 0 && !st->eval && !r->split && !split_programs(r, err, errlen)) return false;
  for (int i = 0; i < r->ndevs; i++) {
    xdev *d = &r->devs[i];
    free(d->span);
    d->span = NULL;
    if (!st->trace || !r->o.on_trace) continue;
    d->span = weft_xmalloc(2 * (size_t)(d->prog->n + 1) * sizeof(double));
    for (int k = 0; k < 2 * d->prog->n; k++) d->span[k] = NAN;
  }
  pthread_barrier_init(&r->bar, NULL, (unsigned)r->ndevs);
  pthread_t *th = weft_xmalloc((size_t)r->ndevs * sizeof(pthread_t));
  r->t0 = now();
  r->finished = 0;
  for (int i = 0; i < r->ndevs; i++)
    if (pthread_create(&th[i], NULL, dev_main, &r->devs[i]) != 0) {
      /* The barrier would never fill: a thread that cannot start fails the run. */
      fprintf(stderr, "weft run: cannot start a thread for device %d: %s\n", r->devs[i].device, strerror(errno));
      if (r->net) xnet_abort(r->net, WEFT_FAILED);
      exit(WEFT_FAILED);
    }
  if (r->net) progress(r);
  for (int i = 0; i < r->ndevs; i++) pthread_join(th[i], NULL);
  free(th);
  pthread_barrier_destroy(&r->bar);
  for (int i = 0; i < r->ndevs; i++) {
    xdev *d = &r->devs[i];
    for (int k = 0; d->span && !r->failed && k < d->prog->n; k++)
      if (!isnan(d->span[2 * k + 1]))
        r->o.on_trace(r->o.ctx, d->device, k, "thread", d->span[2 * k], d->span[2 * k + 1]);
    free(d->span);
    d->span = NULL;
  }
  if (!r->failed) {
    *out = r->res;
    return true;
  }
  const xdev *first = NULL;
  for (int i = 0; i < r->ndevs && !first; i++)
    if (r->devs[i].failed && r->devs[i].err[0]) first = &r->devs[i];
  snprintf(err, errlen, "device %d: %s", first ? first->device : -1, first ? first->err : "stopped");
  return false;
}

bool xrun_agree(xrun *r, bool ok) {
  if (!r->net) return ok;
  int v = ok;
  if (!xnet_min_int(r->net, &v, 1)) {
    fprintf(stderr, "weft run: %s\n", xnet_error(r->net));
    xnet_abort(r->net, WEFT_FAILED);
  }
  return v != 0;
}

bool xrun_read(xrun *r, char *err, size_t errlen) {
  for (int i = 0; r->o.on_memory && i < r->ndevs; i++)
    r->o.on_memory(r->o.ctx, r->devs[i].device, r->devs[i].peak, r->devs[i].peak_role);
  return gather(r, err, errlen);
}

/* ---- the reference: one device, no plan --------------------------------- */

bool xrun_reference(const weft_graph *g, weft_world *w, const backend_step *st, backend_result *out,
                    const backend_opts *o, char *err, size_t errlen) {
  k_blas_single();
  xoptim opt;
  if (!xoptim_from_graph(g, &opt)) {
    snprintf(err, errlen, "model %s does not train: it has no `train` statement", g->name);
    return false;
  }
  if (!isnan(st->lr)) opt.lr = st->lr;
  int nt = g->ntensors;
  void **val = weft_xcalloc((size_t)nt * sizeof(void *));
  float **grad = weft_xcalloc((size_t)nt * sizeof(float *));
  dregion(*dims)[16] = weft_xcalloc((size_t)nt * sizeof *dims);
  irange(*ivs)[16] = weft_xcalloc((size_t)nt * sizeof *ivs);
  tregion *whole = weft_xcalloc((size_t)nt * sizeof(tregion));
  bool ok = true;
  /* Whole iteration ranges per operator, for native kernels. */
  arena a;
  arena_init(&a);
  int64_t **ranges = weft_xcalloc((size_t)(g->nops + 1) * sizeof(int64_t *));
  int *nidims = weft_xcalloc((size_t)(g->nops + 1) * sizeof(int));
  const xop **kern = weft_xcalloc((size_t)(g->nops + 1) * sizeof(const xop *));
  for (int op = 0; op < g->nops && ok; op++) ok = (kern[op] = xop_find(g, op, err, errlen)) != NULL;
  /* the tensors some operator reads: a loss that none reads (the model's,
   * an auxiliary one) seeds its own backward */
  bool *read = weft_xcalloc((size_t)(nt + 1) * sizeof(bool));
  for (int op = 0; op < g->nops; op++)
    for (int i = 0; i < g->ops[op].ninputs; i++) read[g->ops[op].inputs[i]] = true;
  for (int op = 0; op < g->nops; op++) {
    const opdecl *d = g->ops[op].decl;
    if (!d || !d->native_fwd) continue;
    opspace *sp = opspace_build(&a, g, op);
    nidims[op] = sp->nidims;
    ranges[op] = weft_xcalloc((size_t)(2 * sp->nidims + 1) * sizeof(int64_t));
    for (int i = 0; i < sp->nidims; i++) ranges[op][2 * i + 1] = sp->idims[i].size;
  }
  for (int t = 0; t < nt; t++) {
    if (g->tensors[t].ndims > 16) {
      snprintf(err, errlen, "tensor %s has more than 16 dimensions", g->tensors[t].name);
      ok = false;
      break;
    }
    whole[t] = whole_region(&g->tensors[t], dims[t], ivs[t]);
  }
  double t0 = now();
  if (ok) {
    for (int t = 0; t < nt; t++) {
      const gtensor *x = &g->tensors[t];
      size_t n = (size_t)tensor_numel(x);
      if (x->role == TENSOR_PARAM && x->dtype != DT_F32 && dtype_is_float(x->dtype)) {
        /* the model reads a 16-bit parameter rounded to its dtype (from its
         * master weights, which the world holds, when it has them) */
        val[t] = weft_xmalloc(n * 4);
        memcpy(val[t], w->param[t], n * 4);
        xoptim_round(val[t], (int64_t)n, x->dtype);
      } else if (x->role == TENSOR_PARAM) {
        val[t] = w->param[t];
      } else if (x->role == TENSOR_INPUT) val[t] = w->input[t];
      else val[t] = weft_xcalloc(n * 4);
      if (x->dtype != DT_I32 && x->role != TENSOR_INPUT) grad[t] = weft_xcalloc(n * 4);
    }
    double loss = 0;
    for (int op = 0; op < g->nops && ok; op++) {
      const gop *x = &g->ops[op];
      xcall c = {0};
      c.g = g, c.op = op, c.kern = kern[op], c.nin = x->ninputs, c.allow_native = o->allow_native;
      for (int i = 0; i < c.nin; i++) c.in[i] = val[x->inputs[i]], c.inr[i] = &whole[x->inputs[i]];
      c.out = val[x->output], c.outr = &whole[x->output];
      c.ranges = ranges[op], c.nidims = nidims[op];
      ok = xop_run(&c, err, errlen);
      if (xop_is_loss(kern[op])) loss += c.loss;  /* every loss operator adds its share */
    }
    for (int op = g->nops - 1; op >= 0 && ok && !st->eval; op--) {
      const gop *x = &g->ops[op];
      xcall c = {0};
      c.g = g, c.op = op, c.kern = kern[op], c.nin = x->ninputs, c.backward = true, c.acc = true, c.allow_native = o->allow_native;
      for (int i = 0; i < c.nin; i++) {
        c.in[i] = val[x->inputs[i]], c.inr[i] = &whole[x->inputs[i]];
        c.din[i] = grad[x->inputs[i]];
      }
      c.dy = x->output == g->loss || (xop_is_loss(kern[op]) && !read[x->output]) ? NULL : grad[x->output];
      c.dyr = &whole[x->output];
      c.ranges = ranges[op], c.nidims = nidims[op];
      ok = xop_run(&c, err, errlen);
    }
    double sq = 0;
    for (int t = 0; t < nt && ok && !st->eval; t++) {
      if (g->tensors[t].role != TENSOR_PARAM) continue;
      int64_t n = tensor_numel(&g->tensors[t]);
      for (int64_t e = 0; e < n; e++) sq += (double)grad[t][e] * (double)grad[t][e];
    }
    for (int t = 0; t < nt && ok && !st->eval && !o->allow_nonfinite; t++) {
      if (g->tensors[t].role != TENSOR_PARAM) continue;
      int64_t n = tensor_numel(&g->tensors[t]);
      for (int64_t e = 0; e < n && ok; e++)
        if (!isfinite(grad[t][e])) {
          snprintf(err, errlen, "step %" PRId64 ": the gradient of %s holds %s at element %" PRId64 "; training stops "
                   "before the optimizer takes it (--allow-nonfinite trains on)", w->step + 1, g->tensors[t].name,
                   isnan(grad[t][e]) ? "nan" : grad[t][e] > 0 ? "inf" : "-inf", e);
          ok = false;
        }
    }
    double norm = sqrt(sq), coef = st->clip > 0 ? st->clip / (norm + 1e-6) : 1.0;
    for (int t = 0; t < nt && ok && !st->eval; t++) {
      if (g->tensors[t].role != TENSOR_PARAM) continue;
      int64_t n = tensor_numel(&g->tensors[t]);
      if (coef < 1.0)
        for (int64_t e = 0; e < n; e++) grad[t][e] *= (float)coef;
      /* a 16-bit parameter without master weights steps from its rounding */
      bool master = graph_has_master(g, t);
      if (!master) xoptim_round(w->param[t], n, g->tensors[t].dtype);
      xoptim_step(&opt, w->param[t], w->state[t], grad[t], n, w->step + 1);
      if (!master) xoptim_round(w->param[t], n, g->tensors[t].dtype);
    }
    for (int t = 0; t < nt; t++) {
      if (g->tensors[t].role == TENSOR_ACT || (g->tensors[t].role == TENSOR_PARAM && val[t] != w->param[t])) free(val[t]);
      val[t] = NULL;
      free(grad[t]);
      grad[t] = NULL;
    }
    if (ok) {
      if (!st->eval) w->step++;
      *out = (backend_result){loss, st->eval ? NAN : norm, now() - t0, 0};
    }
  }
  for (int op = 0; op < g->nops; op++) free(ranges[op]);
  free(ranges), free(nidims), free(kern), free(read);
  arena_free(&a);
  free(val), free(grad), free(dims), free(ivs), free(whole);
  return ok;
}
