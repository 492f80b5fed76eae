/* exec.c - the CUDA backend's executor (exec.h): the plan of a step
 * (sched.h) turned into actions on device addresses once, when the program
 * is opened; then, each step, one host thread enqueues them on the streams
 * of the virtual devices, waits, and reads the loss.
 *
 * An action is a region move or sum (gpu_move, gpu_sum), a clearing, an
 * operator's kernels (ops.h) or an optimizer step, on addresses that are a
 * device's pool (or the model inputs) and an offset, fixed for the run. */
#include "exec.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ccl.h"
#include "choice.h"
#include "rendezvous.h"
#include "cpu/clip.h"
#include "gpu.h"
#include "nvtx.h"
#include "ops.h"
#include "sched.h"
#include "weft/value.h"

enum { ADDR_NONE = -1, ADDR_INPUTS = -2, ADDR_MIRROR = -3, ADDR_NORMS = -4 };
/* cclop.kind of a send's and a receive's between processes (beside comm_kind) */
enum { OP_SEND = -10, OP_RECV = -11 };

typedef struct caddr {
  int dev;                /* plan device (its pool), ADDR_INPUTS or ADDR_NONE */
  int64_t off;
} caddr;

static const caddr NOWHERE = {ADDR_NONE, 0};

/* A_MULTI: a group of steps and sums of squares in one launch (pgroup);
 * A_NONE: one of its members, launched with it. */
typedef enum { A_MOVE, A_SUM, A_ZERO, A_CALL, A_STEP, A_SUMSQ, A_NORM, A_CCL, A_MULTI, A_NONE } act_kind;

typedef struct cact {
  uint8_t kind;
  bool add;
  caddr dst, src;
  int dst_dt, src_dt;
  int nsrc;               /* A_SUM: sources in srcs[first .. first + nsrc) */
  int first;
  cx_move mv;
  int64_t bytes;          /* A_ZERO; A_SUMSQ: the mask's offset in masks, -1 none */
  int64_t n;              /* A_SUMSQ: elements */
  int idx;                /* A_CALL: calls[idx]; A_STEP: steps[idx]; A_SUMSQ: the plan device it counts for;
                           * A_CCL: cops[idx]; A_MULTI: groups[idx] */
} cact;

typedef struct pcall {
  ccall c;                /* all but its pointers */
  caddr in[CX_MAX_INPUTS], din[CX_MAX_INPUTS], out, dy, stats, ws;
  caddr keep, fwd_out;    /* what the forward keeps for its backward (ccall.keep, fwd_out) */
  int slot;               /* the loss share it writes, -1 */
  int dev;                /* its device: the gemm workspace is in its pool */
  int ins;                /* its instruction in dev's program */
  caddr epi;              /* fused with the next call (fuse_calls): ccall.epi_ptr */
  caddr epi_in;           /* and ccall.epi_in (a residual's other input) */
} pcall;

typedef struct pstep {
  caddr param, master, state, grad;
  int pdt, gdt, copies;
  int64_t n;
  int dev;
} pstep;

/* Steps and sums of squares that run back to back on one stream, with
 * nothing recorded or awaited between them, as one launch (gpu_msteps):
 * the entries mtab[first, first + n) of their plan, laid out; each
 * entry's tag its member (pment), a step with the sum of squares of its
 * gradient when the sum came just before it. */
typedef struct pment {
  int step;               /* steps[step], -1: a sum of squares only */
  bool sq;                /* counts its gradient in the norm */
  caddr grad;
  int gdt;
  int64_t n, mask;        /* mask: its offset in crun.masks, -1 */
  int group;
} pment;

typedef struct pgroup {
  int first, n;
  int dev;                /* the plan device whose norm its sums add to, -1 none */
  gpu_mslayout l;
  int64_t parts;          /* its scratch: doubles of crun.mparts from parts_at + parts */
} pgroup;

/* A collective through NCCL: a member's message reduced, scattered,
 * gathered or broadcast in place by its group's communicator on that
 * communicator's stream, which waits for the packing (event in) and is
 * waited for by the unpacking (event out). A message whose entries are of
 * one type is one call (a bucket too); else one call per entry, posted
 * together. */
typedef struct cclpart {
  int64_t off, count;     /* in the message: bytes from its start, elements */
  int dt;
} cclpart;

typedef struct cclop {
  int comm;               /* its communicator (crun.comms); -1 the world's (several processes) */
  int kind;               /* comm_kind, for messages; OP_SEND, OP_RECV */
  int dev, ins;           /* the member's instruction, for messages */
  caddr at;               /* the message */
  int first, nparts;      /* its calls in parts[first ..] */
  /* several processes: the sends and receives it posts together
   * (xfers[xfirst ..]), or a broadcast's (root >= 0) of one xfer */
  int xfirst, nx, root;
  bool detached;          /* NCCL's stream does not wait for compute (a receive into a mirror) */
  bool nowait;            /* compute does not wait for it (a send, a broadcast's root) */
  bool whole;             /* a reduce-scatter between processes whose parts NCCL's cannot take:
                           * an all-reduce of the whole message (mp_scatter_fits) */
  caddr gather;           /* an all-gather between processes (NCCL's): where the members'
                           * messages land, in rank order, gbytes each (mp_reduce) */
  int64_t gbytes;
  gpu_event *in, *out;
} cclop;

/* A send or receive of raw bytes to or from rank peer of the op's
 * communicator (several processes). */
typedef struct cclxfer {
  int peer;
  bool send;
  caddr at;
  int64_t bytes;
} cclxfer;

/* One order of a step's work (sched.h) and its actions: the plain one, and
 * the one that takes the norm before the steps, to clip by it. */
typedef struct cplan {
  csched s;
  bool built;
  cact *acts;
  int nacts, acap;
  caddr *srcs;
  int nsrcs, scap;
  pcall *calls;
  int ncalls, ccap;
  pstep *steps;
  int nsteps, stcap;
  int *first, *count;     /* per stream operation: its actions */
  gpu_event **ev;
  bool clip;
  cclop *cops;            /* collectives through NCCL, in the order they are enqueued */
  int ncops, cocap;
  cclpart *parts;
  int nparts, pcap;
  cclxfer *xfers;
  int nxfers, xcap;
  /* several processes: per message another process packs and this one
   * reads, its copy here (offset in crun.mirror, -1 none); per event
   * another process records, the op of this one that stands in (-1) */
  int64_t *mirror_off, mirror_bytes;
  int *alias;
  /* several processes: the zeros a member that brings nothing to an
   * all-reduce gives NCCL's, laid out as member `silent_as`'s message,
   * where it then takes the sum (mp_reduce, add_sum); dev ADDR_NONE none */
  caddr silent_at;
  int silent_as;
  /* the steps in groups (crun.fused) */
  pgroup *groups;
  int ngroups, gcap;
  pment *ments;
  int nments, mcap;
  gpu_mstep *mtab;        /* host: the groups' tables, one after another */
  int64_t tab_at;         /* where mtab is in crun.mtab (entries) */
  int64_t nparts_d, parts_at;  /* the doubles of scratch, and where they are in crun.mparts */
} cplan;

typedef struct cvdev {
  gpu_stream *stream;
  gpu_event *done;        /* recorded at the end of a pass */
  char *pool;
  int *slot;              /* per instruction: the loss share it writes, -1 */
  bool *stepped;          /* per buffer of its program: a parameter a step wrote */
  uint8_t *first;         /* per instruction: FIRST_WRITE, NO_CLEAR (first_writes), LOSS_WITH_GRAD,
                           * LOSS_GRAD_DONE (loss_in_place), GRAD_PASSED (pass_grads) */
} cvdev;

/* cvdev.first: a backward compute that writes its gradients instead of
 * adding them to buffers just cleared; an alloc whose buffer such a
 * compute writes first, which need not be cleared; a loss's forward that
 * writes its logits' gradient over them, and its backward, which then
 * does nothing; a backward whose gradients are its result's gradient's
 * memory, which does nothing either */
enum { FIRST_WRITE = 1, NO_CLEAR = 2, LOSS_WITH_GRAD = 4, LOSS_GRAD_DONE = 8, GRAD_PASSED = 16 };

struct backend_run {
  const weft_program *pr;
  const weft_graph *g;
  weft_world *w;
  backend_opts o;
  const ckernel **kern;   /* per operator */
  ckeep **keep;           /* per device, per instruction: what a forward keeps for its backward */
  cplan plan[2];          /* plain, clipping */
  cplan *P;               /* the one being prepared or run */
  char clip_err[512];     /* why there is no clipping plan */
  bool hung;              /* a pass passed --timeout: the GPU may still be busy */
  clip_own **own;         /* per device, per instruction: what a step counts in the norm */
  int64_t *mask_at;       /* per device's instruction base + i: its mask's offset, -1 */
  int64_t *ins_base;      /* per device: where its instructions start in mask_at */
  uint8_t *masks;         /* device: the masks */
  int64_t nmask_bytes;
  double *norms;          /* device: per plan device its sum of squares; then the norm */
  float *coef;            /* device: the clipping factor */
  int gpu;
  gpu_props props;
  cvdev *dev;             /* per plan device */
  int ndev;               /* virtual devices: plan devices with a program */
  gpu_event **ev;
  char *inputs;           /* the model inputs, whole, one after another */
  int64_t *input_off;     /* per tensor, -1 */
  int64_t input_bytes;
  double *slots;          /* device: the loss shares of a step */
  int nslots;
  int32_t *tables;        /* device: positions of strided dimensions */
  cx_tables tab;
  int optim;              /* 0 sgd, 1 adamw */
  gpu_optim settings;
  double lr0;             /* the model's learning rate */
  double clip;            /* this pass's bound, 0: none */
  bool eval;              /* this pass is an evaluation */
  bool inited, failed, sync_each;
  int64_t need;
  char perr[512];         /* a failure found while planning */
  bool pfail;
  /* the NCCL path (WEFT_CUDA_COMM=nccl): one communicator per distinct
   * group of the collectives it takes, split from one of every rank */
  bool nccl;
  int *comm_of;           /* per plan comm: its communicator, -1 the virtual-device path */
  int ncomms;
  int *comm_dev;          /* per communicator: its group (one device) */
  ccl_comm *world;
  ccl_comm **comms;
  gpu_stream **cstream;   /* per communicator: NCCL's stream */
  char ccl_what[96];      /* what communicates, for crun_describe */
  /* several processes (mp_*): this one runs plan device `mine` on GPU
   * `local`, every other device another process's; collectives and sends
   * between them through NCCL, one communicator per group (comm_grp) */
  int mine;               /* -1: one process runs every device */
  int rank, nprocs, local;
  long parent;            /* the process that started this one (mpirun, srun) */
  rdv_mpi *mpi;           /* MPI, under mpirun */
  int **comm_grp, *comm_n;/* per communicator: its plan devices in rank order */
  bool *comm_p2p;         /* per communicator: a pair's for sends (its sender rank 0) */
  gpu_stream *wstream;    /* the world communicator's stream: losses, norms, gathers */
  gpu_event *wdone;       /* recorded after the world's work */
  gpu_event **cend;       /* per communicator: the end of its stream's work in a pass */
  char *mirror;           /* device: messages of other processes */
  /* the steps of a stream that run back to back as one launch (pgroup);
   * WEFT_CUDA_FUSED_STEP=0: one launch per tensor */
  bool fused;
  bool fuse_calls;        /* WEFT_CUDA_FUSE: a linear and its GELU as one product (fuse_calls) */
  int nfused, nfirst, npadded; /* what fuse_calls, first_writes and pad_rows did (crun_describe) */
  int nin_place;          /* the losses loss_in_place took (crun_describe) */
  int npassed;            /* the backwards pass_grads took (crun_describe) */
  int nresid;             /* the linears fuse_calls fused with a residual's add (crun_describe) */
  bool fuse_resid;        /* WEFT_CUDA_FUSE_RESID: a linear and the residual's add after it too */
  int *share;             /* per buffer: the buffer whose memory it takes (csched_cb.share), -1 */
  int64_t *pitch;         /* per buffer: elements from a row to the next where padded (pad_rows), 0 */
  int64_t *pbytes;        /* per buffer: its bytes so, 0: lbuf's */
  gpu_mstep *mtab;        /* device: the plans' tables */
  double *mparts;         /* device: their scratch */
  /* a traced pass (backend_step.trace): an origin, then per schedule op
   * an event before its launches and one after; traced[k]: op k's were
   * recorded in this pass */
  bool tracing;
  gpu_event **tev;
  int ntev;
  bool *traced;
  /* per plan (plain, clipping): its ranges for a profiler, one per schedule
   * op, NULL when none collects them (nvtx.h) */
  cnvtx *nv[2];
};

static bool here(const crun *r, int dev) { return r->mine < 0 || dev == r->mine; }
static void mp_group(const crun *r, int k, char *buf, size_t n);

static int last_failure = 1;

int crun_failure(void) { return last_failure; }

bool crun_fail(char *err, size_t errlen, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  last_failure = status;
  return false;
}

static bool failf(char *err, size_t errlen, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool failf(char *err, size_t errlen, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  last_failure = status;
  return false;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *crun_bytes(char *b, size_t n, double x) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (x >= 1024 && i < 4) x /= 1024, i++;
  snprintf(b, n, i ? "%.2f %s" : "%.0f %s", x, u[i]);
  return b;
}

static int64_t align_up(int64_t n) { return (n + CX_ALIGN - 1) / CX_ALIGN * CX_ALIGN; }

static void *addr(const crun *r, caddr a) {
  if (a.dev == ADDR_NONE) return NULL;
  if (a.dev == ADDR_INPUTS) return r->inputs + a.off;
  if (a.dev == ADDR_MIRROR) return r->mirror + a.off;
  if (a.dev == ADDR_NORMS) return (char *)r->norms + a.off;
  return r->dev[a.dev].pool + a.off;
}

/* What an instruction is, for messages. */
static void ins_name(const crun *r, int dev, int i, char *buf, size_t n) {
  if (i < 0) {
    snprintf(buf, n, "plan device %d", dev);
    return;
  }
  const lins *in = &r->pr->progs[dev].ins[i];
  static const char *const kinds[] = {"alloc", "free", "compute", "send", "recv", "collective", "step", "copy"};
  const char *k = in->kind < LI_KIND_COUNT ? kinds[in->kind] : "?";
  if (in->kind == LI_COMPUTE) {
    const gop *o = &r->g->ops[lower_compute_op(r->pr, in)];
    snprintf(buf, n, "plan device %d, instruction %d (%s %s, %s)", dev, i, in->dir == DIR_BACKWARD ? "backward" : "forward",
             o->name, o->decl ? o->decl->name : "?");
  } else if (in->kind == LI_STEP) {
    snprintf(buf, n, "plan device %d, instruction %d (step of %s)", dev, i, r->g->tensors[in->tensor].name);
  } else if (in->kind == LI_ALLOC || in->kind == LI_FREE) {
    snprintf(buf, n, "plan device %d, instruction %d (%s of %s)", dev, i, k, r->g->tensors[r->pr->bufs[in->buf].tensor].name);
  } else {
    snprintf(buf, n, "plan device %d, instruction %d (%s of comm %d)", dev, i, k, in->comm);
  }
}

/* ---- actions ----------------------------------------------------------------------- */

static cact *new_act(crun *r, int kind) {
  if (r->P->nacts == r->P->acap) {
    r->P->acap = r->P->acap ? 2 * r->P->acap : 1024;
    r->P->acts = cx_grow(r->P->acts, sizeof(cact) * (size_t)r->P->acap);
  }
  cact *a = &r->P->acts[r->P->nacts++];
  memset(a, 0, sizeof *a);
  a->kind = (uint8_t)kind;
  return a;
}

static bool plan_fail(crun *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool plan_fail(crun *r, const char *fmt, ...) {
  if (r->pfail) return false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->perr, sizeof r->perr, fmt, ap);
  va_end(ap);
  r->pfail = true;
  return false;
}

/* dst (+)= src over region R (src held as region sr, dst as dr). */
static bool add_move(crun *r, caddr dst, int ddt, const tregion *dr, caddr src, int sdt, const tregion *sr,
                     const tregion *R, bool add) {
  char e[256];
  cx_move mv;
  if (!cx_move_build(&mv, &r->tab, R, sr, dr, e, sizeof e)) return plan_fail(r, "%s", e);
  if (mv.m.total == 0) return true;
  cact *a = new_act(r, A_MOVE);
  a->dst = dst, a->dst_dt = ddt, a->src = src, a->src_dt = sdt, a->mv = mv, a->add = add;
  return true;
}

static void add_zero(crun *r, caddr dst, int64_t bytes) {
  cact *a = new_act(r, A_ZERO);
  a->dst = dst, a->bytes = bytes;
}

/* The scratch of one instruction: temporaries one after another. */
typedef struct scratch {
  int dev;
  int64_t base, used;
} scratch;

static caddr take_scratch(scratch *sc, int64_t bytes) {
  caddr a = {sc->dev, sc->base + sc->used};
  sc->used += align_up(bytes ? bytes : 1);
  return a;
}

static caddr buf_addr(const crun *r, int dev, int buf) { return (caddr){dev, r->P->s.off[buf]}; }

/* A ref as the kernel reads it: the buffer itself when the ref covers it
 * in the type wanted, else a temporary the buffer's part is moved into. */
static caddr ref_in(crun *r, scratch *sc, const lref *ref, int want, bool build) {
  if (ref->buf < 0) return NOWHERE;
  const lbuf *b = &r->pr->bufs[ref->buf];
  if (cx_equal(&b->region, &ref->region) && b->dtype == want) return buf_addr(r, sc->dev, ref->buf);
  caddr t = take_scratch(sc, cx_numel(&ref->region) * gpu_dtype_size(want));
  if (build) add_move(r, t, want, &ref->region, buf_addr(r, sc->dev, ref->buf), b->dtype, &b->region, &ref->region, false);
  return t;
}

/* ---- buffers with padded rows ------------------------------------------------------------- */

/* A buffer whose rows are not a multiple of 16 bytes (the logits over a
 * vocabulary of 50257) makes cuBLASLt stage every product that writes or
 * reads it (gpu_gemm: copies into and out of padded rows). Where every
 * instruction that touches a buffer of this device's own (not persistent,
 * not an input) is a compute that takes it whole, in its type, with its
 * rows padded (ckernel_pitched: an LM head's result and its gradient, a
 * cross entropy's logits and their gradient), the buffer is laid out with
 * its rows padded to 16 bytes: the products read and write it in place. */
static void pad_rows(crun *r) {
  const weft_program *pr = r->pr;
  r->pitch = cx_alloc(sizeof(int64_t) * (size_t)(pr->nbufs + 1));
  r->pbytes = cx_alloc(sizeof(int64_t) * (size_t)(pr->nbufs + 1));
  for (int d = 0; d < pr->nprogs; d++) {
    const lprog *lp = &pr->progs[d];
    if (!lp->n || !here(r, d)) continue;
    int nb = lp->buf_hi - lp->buf_lo;
    bool *ok = cx_alloc((size_t)nb + 1);
    for (int b = 0; b < nb; b++) {
      const lbuf *bf = &pr->bufs[lp->buf_lo + b];
      int64_t last = bf->region.ndims ? cx_dlen(&bf->region.dims[bf->region.ndims - 1]) : 0;
      int sz = bf->dtype == GPU_I32 ? 0 : gpu_dtype_size(bf->dtype);
      ok[b] = !bf->persistent && bf->role != LB_INPUT && sz > 0 && bf->region.ndims >= 2 && last > 0 &&
              (last * sz) % 16 != 0;
    }
    for (int i = 0; i < lp->n; i++) {
      const lins *in = &lp->ins[i];
      if (in->kind == LI_ALLOC || in->kind == LI_FREE) continue;
      const ckernel *k = NULL;
      int dt = -1;
      if (in->kind == LI_COMPUTE && in->part == LP_WHOLE) {
        int op = lower_compute_op(pr, in);
        k = r->kern[op], dt = ckernel_dtype(r->g, op);
      }
      for (int j = 0; j < in->nin + in->nout; j++) {
        bool out = j >= in->nin;
        const lref *ref = out ? &in->out[j - in->nin] : &in->in[j];
        int b = ref->buf - lp->buf_lo;
        if (ref->buf < 0 || b < 0 || b >= nb || !ok[b]) continue;
        const lbuf *bf = &pr->bufs[ref->buf];
        ok[b] = k && bf->dtype == dt && cx_equal(&bf->region, &ref->region) &&
                ckernel_pitched(k, in->dir == DIR_BACKWARD, ref->arg, out);
      }
    }
    for (int b = 0; b < nb; b++) {
      if (!ok[b]) continue;
      const lbuf *bf = &pr->bufs[lp->buf_lo + b];
      int64_t last = cx_dlen(&bf->region.dims[bf->region.ndims - 1]), q = 16 / gpu_dtype_size(bf->dtype);
      r->pitch[lp->buf_lo + b] = (last + q - 1) / q * q;
      r->npadded++;
      r->pbytes[lp->buf_lo + b] = cx_numel(&bf->region) / last * r->pitch[lp->buf_lo + b] * gpu_dtype_size(bf->dtype);
    }
    free(ok);
  }
}

/* The row pitch of the buffer a ref is, 0: packed. */
static int64_t ref_pitch(const crun *r, const lref *ref) { return r->pitch && ref->buf >= 0 ? r->pitch[ref->buf] : 0; }

/* ---- a loss's gradient from its forward ------------------------------------------------ */

static const lref *ref_at(const lref *refs, int n, int arg);
static int ref_buf(const lref *refs, int n, int arg);
static bool same_addr(caddr a, caddr b);
static bool refers(const lins *in, int buf, bool *as_in, bool *as_out);
static bool ins_adds(const crun *r, int dev, int i);

static bool touches(const lins *in, int buf) {
  bool as_in = false, as_out = false;
  return in->kind != LI_ALLOC && in->kind != LI_FREE && refers(in, buf, &as_in, &as_out);
}

/* A GPT's cross entropy reads its logits twice, forward for the loss and
 * backward for their gradient, which goes to a buffer of its own while the
 * logits are no longer needed. Where a loss's forward F
 * (ckernel_grad_in_place) takes a buffer L whole, in its type, that after F
 * only the backward B of the same part touches, and B writes (does not add)
 * the gradient of L to a buffer D that is L's shape, type and rows, that
 * nothing touches between its alloc (after L's) and B: F writes the
 * gradient over L as it takes the loss (LOSS_WITH_GRAD), B does nothing
 * (LOSS_GRAD_DONE), and D is L's memory, kept until both are freed
 * (csched_cb.share). One read of the logits instead of two, and one buffer
 * of their size fewer. */
static void loss_in_place(crun *r, int d) {
  const weft_program *pr = r->pr;
  const lprog *lp = &pr->progs[d];
  uint8_t *f = r->dev[d].first;
  for (int i = 0; i < lp->n; i++) {
    const lins *fw = &lp->ins[i];
    if (fw->kind != LI_COMPUTE || fw->dir != DIR_FORWARD || fw->part != LP_WHOLE || fw->recompute) continue;
    int op = lower_compute_op(pr, fw), dt = ckernel_dtype(r->g, op);
    if (!ckernel_grad_in_place(r->kern[op])) continue;
    const lref *x = ref_at(fw->in, fw->nin, 0);
    int L = x ? x->buf : -1;
    if (L < lp->buf_lo || L >= lp->buf_hi) continue;
    const lbuf *lb = &pr->bufs[L];
    if (lb->persistent || lb->role == LB_INPUT || lb->dtype != dt || !cx_equal(&lb->region, &x->region)) continue;
    /* the whole vocabulary (a shard's loss needs the others' statistics) */
    const gtensor *lt = &r->g->tensors[lb->tensor];
    if (!x->region.ndims || !lt->ndims ||
        cx_dlen(&x->region.dims[x->region.ndims - 1]) != lt->dims[lt->ndims - 1].size)
      continue;
    /* the next instruction that touches L: B; and none after it */
    int b = i + 1;
    while (b < lp->n && !touches(&lp->ins[b], L)) b++;
    if (b >= lp->n) continue;
    const lins *bw = &lp->ins[b];
    if (bw->kind != LI_COMPUTE || bw->dir != DIR_BACKWARD || bw->part != LP_WHOLE || !lower_same_part(pr, bw, fw) ||
        ins_adds(r, d, b) || ref_buf(bw->in, bw->nin, 0) != L)
      continue;
    bool alone = true;
    for (int j = b + 1; j < lp->n && alone; j++) alone = !touches(&lp->ins[j], L);
    /* B writes one gradient: L's, to D */
    for (int j = 0; j < bw->nout && alone; j++) alone = bw->out[j].buf < 0 || bw->out[j].arg == 0;
    const lref *o = ref_at(bw->out, bw->nout, 0);
    int D = o ? o->buf : -1;
    if (!alone || D < lp->buf_lo || D >= lp->buf_hi || D == L) continue;
    const lbuf *db = &pr->bufs[D];
    if (db->persistent || db->role == LB_INPUT || db->dtype != dt || !cx_equal(&db->region, &o->region) ||
        !cx_equal(&db->region, &lb->region) || (r->pitch && r->pitch[D] != r->pitch[L]))
      continue;
    /* D's alloc after L's, and nothing touching D until B */
    int la = -1, da = -1;
    for (int j = 0; j < b; j++) {
      const lins *in = &lp->ins[j];
      if (in->kind == LI_ALLOC && in->buf == L) la = j;
      if (in->kind == LI_ALLOC && in->buf == D) da = j;
    }
    if (la < 0 || da < la) continue;
    for (int j = da + 1; j < b && alone; j++) alone = !touches(&lp->ins[j], D);
    if (!alone) continue;
    r->share[D] = L;
    f[i] |= LOSS_WITH_GRAD;
    f[b] |= LOSS_GRAD_DONE;
    f[da] |= NO_CLEAR;
    r->nin_place += here(r, d);
  }
}

/* ---- gradients passed through ------------------------------------------------------ */

/* The buffer whose memory buffer b takes (csched_cb.share), b its own. */
static int share_root(const crun *r, int b) { return r->share[b] >= 0 ? r->share[b] : b; }

/* Whether ref is a whole activation gradient of dev's own, of the type dt,
 * its rows packed, that takes no other buffer's memory. */
static bool plain_grad(const crun *r, int d, const lref *ref, int dt) {
  const lprog *lp = &r->pr->progs[d];
  if (!ref || ref->buf < lp->buf_lo || ref->buf >= lp->buf_hi) return false;
  const lbuf *b = &r->pr->bufs[ref->buf];
  return b->role == LB_ACT_GRAD && !b->persistent && b->dtype == dt && cx_equal(&b->region, &ref->region) &&
         !(r->pitch && r->pitch[ref->buf]);
}

/* Two regions of the same extent in every dimension. */
static bool same_shape(const tregion *a, const tregion *b) {
  if (a->ndims != b->ndims) return false;
  for (int k = 0; k < a->ndims; k++)
    if (cx_dlen(&a->dims[k]) != cx_dlen(&b->dims[k])) return false;
  return true;
}

static int alloc_of(const lprog *lp, int buf, int before) {
  for (int j = before - 1; j >= 0; j--)
    if (lp->ins[j].kind == LI_ALLOC && lp->ins[j].buf == buf) return j;
  return -1;
}

/* A residual's backward B (ckernel_passes_grad) copies the gradient of its
 * result, G, into the gradients of its inputs. Where B writes them (first
 * written, first_writes), each a whole buffer of G's type and shape
 * allocated after G and untouched until B, and neither G nor any buffer
 * already in G's memory (an earlier B's) is touched after B:
 * the inputs' gradients take G's memory (csched_cb.share) and B does
 * nothing (GRAD_PASSED). Sharing memory, they must not tell apart: after
 * B they are only read until the first instruction that writes one of
 * them, which touches no other, and from then on only the one it wrote is
 * touched. In a GPT the gradient of the residual stream goes through a
 * layer's two adds without a copy: two launches fewer a layer, each
 * reading the stream's gradient and writing it twice, and two buffers of
 * its size fewer. */
static void pass_grads(crun *r, int d) {
  const weft_program *pr = r->pr;
  const lprog *lp = &pr->progs[d];
  uint8_t *f = r->dev[d].first;
  for (int i = 0; i < lp->n; i++) {
    const lins *bw = &lp->ins[i];
    if (bw->kind != LI_COMPUTE || bw->dir != DIR_BACKWARD || bw->part != LP_WHOLE || bw->recompute ||
        !(f[i] & FIRST_WRITE) || f[i] & (LOSS_GRAD_DONE | GRAD_PASSED))
      continue;
    int op = lower_compute_op(pr, bw), dt = ckernel_dtype(r->g, op);
    if (!ckernel_passes_grad(r->kern[op])) continue;
    const lref *gy = ref_at(bw->in, bw->nin, -1);
    if (!plain_grad(r, d, gy, dt)) continue;
    int G = gy->buf, ga = alloc_of(lp, G, i);
    int outs[CX_MAX_INPUTS], oa[CX_MAX_INPUTS], no = 0;
    bool ok = ga >= 0;
    for (int j = 0; j < bw->nout && ok; j++) {
      const lref *o = &bw->out[j];
      if (o->buf < 0) continue;
      ok = no < CX_MAX_INPUTS && o->arg >= 0 && o->buf != G && plain_grad(r, d, o, dt) && r->share[o->buf] < 0 &&
           same_shape(&o->region, &gy->region);
      for (int k = 0; k < no && ok; k++) ok = outs[k] != o->buf;
      if (!ok) break;
      oa[no] = alloc_of(lp, o->buf, i);
      ok = oa[no] > ga;
      for (int j2 = oa[no] + 1; j2 < i && ok; j2++) ok = !touches(&lp->ins[j2], o->buf);
      outs[no++] = o->buf;
    }
    if (!ok || !no) continue;
    /* the buffers that already take the memory G is in (an earlier pass's
     * gradients, the one whose memory it is): none touched after B, so
     * that they cannot see what G's gradients write there */
    int root = share_root(r, G), *others = cx_alloc(sizeof(int) * (size_t)(lp->buf_hi - lp->buf_lo + 1)), nothers = 0;
    for (int q = lp->buf_lo; q < lp->buf_hi; q++)
      if (q != G && (q == root || r->share[q] == root)) others[nothers++] = q;
    int writer = -1; /* the gradient the first writer after B wrote */
    for (int j = i + 1; j < lp->n && ok; j++) {
      const lins *in = &lp->ins[j];
      if (in->kind == LI_ALLOC || in->kind == LI_FREE) continue;
      ok = !touches(in, G);
      for (int q = 0; q < nothers && ok; q++) ok = !touches(in, others[q]);
      int wrote = -1, nw = 0;
      bool seen[CX_MAX_INPUTS];
      for (int k = 0; k < no; k++) {
        bool rd = false, wr = false;
        seen[k] = refers(in, outs[k], &rd, &wr);
        if (wr) wrote = k, nw++;
      }
      if (writer >= 0) {
        for (int k = 0; k < no && ok; k++) ok = !seen[k] || k == writer;
      } else if (nw) {
        ok = ok && nw == 1;
        for (int k = 0; k < no && ok; k++) ok = !seen[k] || k == wrote;
        writer = wrote;
      }
    }
    free(others);
    if (!ok) continue;
    for (int k = 0; k < no; k++) {
      r->share[outs[k]] = root;
      f[oa[k]] |= NO_CLEAR;
    }
    f[i] |= GRAD_PASSED;
    r->npassed += here(r, d);
  }
}

/* ---- computes ------------------------------------------------------------------------ */

static bool does_write(const lins *in, const ckernel *k);
static bool refers(const lins *in, int buf, bool *as_in, bool *as_out);

/* Whether instruction i of dev's program adds to its outputs. */
static bool ins_adds(const crun *r, int dev, int i) {
  return r->pr->progs[dev].ins[i].accumulate && !(r->dev[dev].first && r->dev[dev].first[i] & FIRST_WRITE);
}

/* A backward adds its gradients to their buffers, which their allocs
 * clear (every step, for the persistent ones). Where every gradient a
 * compute writes is a buffer whole that nothing touched since its alloc,
 * no two of them the same, and its kernel writes every element
 * (ckernel_overwrites), it writes them instead (FIRST_WRITE), and the
 * allocs do not clear them (NO_CLEAR): a GPT's activation gradients are
 * each written once by their first writer (a residual's by its add), the
 * weights' by their only one with one micro-batch. */
static void first_writes(crun *r, int d) {
  const lprog *lp = &r->pr->progs[d];
  int nb = lp->buf_hi - lp->buf_lo;
  int *alloc_at = cx_alloc(sizeof(int) * (size_t)(nb + 1)); /* its alloc, -1: touched since */
  for (int b = 0; b < nb; b++) alloc_at[b] = -1;
  uint8_t *f = r->dev[d].first;
  for (int i = 0; i < lp->n; i++) {
    const lins *in = &lp->ins[i];
    if (in->kind == LI_ALLOC || in->kind == LI_FREE) {
      int b = in->buf - lp->buf_lo;
      if (b >= 0 && b < nb) alloc_at[b] = in->kind == LI_ALLOC ? i : -1;
      continue;
    }
    if (in->kind == LI_COMPUTE && in->accumulate && in->nout > 0) {
      const ckernel *k = r->kern[lower_compute_op(r->pr, in)];
      bool ok = ckernel_overwrites(k) && does_write(in, k);
      for (int j = 0; j < in->nout && ok; j++) {
        const lref *o = &in->out[j];
        if (o->buf < 0) continue;
        int b = o->buf - lp->buf_lo;
        bool rd = false, wr = false;
        ok = b >= 0 && b < nb && alloc_at[b] >= 0 && cx_equal(&r->pr->bufs[o->buf].region, &o->region) &&
             !(refers(in, o->buf, &rd, &wr) && rd);
        for (int j2 = 0; j2 < j && ok; j2++) ok = in->out[j2].buf != o->buf;
      }
      if (ok) {
        f[i] |= FIRST_WRITE;
        r->nfirst += here(r, d);
        for (int j = 0; j < in->nout; j++)
          if (in->out[j].buf >= 0) f[alloc_at[in->out[j].buf - lp->buf_lo]] |= NO_CLEAR;
      }
    }
    for (int j = 0; j < in->nin + in->nout; j++) {
      int b = (j < in->nin ? in->in[j].buf : in->out[j - in->nin].buf) - lp->buf_lo;
      if (b >= 0 && b < nb) alloc_at[b] = -1;
    }
  }
  free(alloc_at);
}

static int64_t prep_compute(crun *r, int dev, int i, int64_t base, bool build) {
  const weft_program *pr = r->pr;
  const lins *in = &pr->progs[dev].ins[i];
  int op = lower_compute_op(pr, in);
  const gop *o = &r->g->ops[op];
  const ckernel *k = r->kern[op];
  uint8_t fl = r->dev[dev].first ? r->dev[dev].first[i] : 0;
  if (fl & LOSS_GRAD_DONE) return 0; /* its forward wrote the gradient (loss_in_place) */
  if (fl & GRAD_PASSED) return 0;    /* its gradients are its result's (pass_grads) */
  if (o->ninputs > CX_MAX_INPUTS) return plan_fail(r, "operator %s has more than %d inputs", o->name, CX_MAX_INPUTS), -1;
  scratch sc = {dev, base, 0};
  pcall pc;
  memset(&pc, 0, sizeof pc);
  ccall *c = &pc.c;
  c->g = r->g, c->op = op, c->k = k, c->backward = in->dir == DIR_BACKWARD, c->part = in->part;
  c->dt = ckernel_dtype(r->g, op), c->nin = o->ninputs, c->deterministic = r->o.deterministic;
  for (int a = 0; a < CX_MAX_INPUTS; a++) pc.in[a] = pc.din[a] = NOWHERE;
  pc.out = pc.dy = pc.stats = pc.ws = pc.keep = pc.fwd_out = pc.epi = pc.epi_in = NOWHERE;
  int nref = in->nin;
  if (in->part == LP_COMBINE && nref > 0) {
    const lref *ref = &in->in[--nref];
    pc.stats = ref_in(r, &sc, ref, GPU_F32, build);
    c->statsr = &ref->region;
  }
  for (int j = 0; j < nref; j++) {
    const lref *ref = &in->in[j];
    if (ref->arg >= 0 && ref->arg < c->nin) {
      pc.in[ref->arg] = ref_in(r, &sc, ref, ckernel_ids(k, ref->arg) ? GPU_I32 : c->dt, build);
      c->inr[ref->arg] = &ref->region;
      if (ref->arg == 0) c->pitch_in0 = ref_pitch(r, ref);
    } else {
      pc.dy = ref_in(r, &sc, ref, c->dt, build);
      c->dyr = &ref->region;
      c->pitch_dy = ref_pitch(r, ref);
    }
  }
  for (int a = 0; a < c->nin; a++)
    if (!c->inr[a]) return plan_fail(r, "%s: compute without input %d", o->name, a), -1;
  int out_dt = in->part == LP_STATS ? GPU_F32 : c->dt;
  /* An output is written in place when its buffer is exactly its region in
   * the call's type, or in f32 where the kernel writes that gradient in f32
   * (a weight's gradient kept in f32); any other goes through zeroed
   * scratch and is moved (added) into its buffer after the call, as is a
   * gradient added to that the kernel does not add to in place
   * (ckernel_adds_in_place: LayerNorm's input's). A kernel that cannot
   * write a weight's gradient in f32 writes all its outputs in place or
   * none. */
  /* added to its outputs: a backward's gradients, but where they were just
   * cleared (first_writes) */
  bool adds = ins_adds(r, dev, i);
  bool direct[CX_MAX_INPUTS + 1], any = false, all = true;
  for (int j = 0; j < in->nout && j <= CX_MAX_INPUTS; j++) {
    const lref *ref = &in->out[j];
    direct[j] = false;
    if (ref->buf < 0 || !cx_equal(&pr->bufs[ref->buf].region, &ref->region)) continue;
    int bdt = pr->bufs[ref->buf].dtype;
    if (bdt == out_dt) {
      direct[j] = !(adds && ref->arg >= 0 && !ckernel_adds_in_place(k, ref->arg));
    } else if (c->backward && bdt == GPU_F32 && ref->arg >= 0 && ref->arg < c->nin && ckernel_f32_grad(k, ref->arg)) {
      direct[j] = true;
      c->f32din |= 1u << ref->arg;
    }
    any |= direct[j];
  }
  for (int j = 0; j < in->nout; j++) all &= j <= CX_MAX_INPUTS && direct[j];
  if (!all && !c->f32din) {
    any = false;
    for (int j = 0; j < in->nout && j <= CX_MAX_INPUTS; j++) direct[j] = false;
  }
  int npost = 0;
  cact post[CX_MAX_INPUTS + 1];
  for (int j = 0; j < in->nout; j++) {
    const lref *ref = &in->out[j];
    caddr p = NOWHERE;
    if (ref->buf >= 0) {
      if (j <= CX_MAX_INPUTS && direct[j]) {
        p = buf_addr(r, dev, ref->buf);
      } else {
        p = take_scratch(&sc, cx_numel(&ref->region) * gpu_dtype_size(out_dt));
        if (build) {
          const lbuf *b = &pr->bufs[ref->buf];
          /* cleared unless the kernel writes all of it: it does not add,
           * or adds to the others and writes this one (ccall.own) */
          bool own = any && adds && ref->arg >= 0 && ref->arg < c->nin && !ckernel_adds_in_place(k, ref->arg);
          if (own) c->own |= 1u << ref->arg;
          if ((any && adds && !own) || !ckernel_overwrites(k) || !does_write(in, k))
            add_zero(r, p, cx_numel(&ref->region) * gpu_dtype_size(out_dt));
          /* written back after the call */
          char e[256];
          cx_move mv;
          if (!cx_move_build(&mv, &r->tab, &ref->region, &ref->region, &b->region, e, sizeof e))
            return plan_fail(r, "%s", e), -1;
          if (npost <= CX_MAX_INPUTS) {
            cact *a = &post[npost++];
            memset(a, 0, sizeof *a);
            a->kind = A_MOVE, a->dst = buf_addr(r, dev, ref->buf), a->dst_dt = b->dtype, a->src = p, a->src_dt = out_dt;
            a->mv = mv, a->add = adds;
          }
        }
      }
    }
    /* a buffer of padded rows is given as it is (pad_rows) */
    if (ref_pitch(r, ref) && !(j <= CX_MAX_INPUTS && direct[j]))
      return plan_fail(r, "%s: a buffer of padded rows through scratch", o->name), -1;
    if (ref->arg < 0) {
      pc.out = p;
      c->outr = &ref->region;
      c->pitch_out = ref_pitch(r, ref);
    } else if (ref->arg < c->nin) {
      pc.din[ref->arg] = p;
      if (ref->arg == 0) c->pitch_din0 = ref_pitch(r, ref);
    }
  }
  /* the kernel accumulates into what it writes in place; scratch starts at
   * zero, so it holds the call's own result either way */
  c->acc = any ? adds : false;
  if (fl & LOSS_WITH_GRAD) {
    /* the gradient over the logits, which are given as they are */
    int lb = ref_buf(in->in, in->nin, 0);
    if (lb < 0 || !same_addr(pc.in[0], buf_addr(r, dev, lb)))
      return plan_fail(r, "%s: the gradient in place of logits not given whole", o->name), -1;
    c->grad_in_place = true;
    pc.din[0] = pc.in[0];
    c->pitch_din0 = c->pitch_in0;
  }
  size_t ws = ccall_ws(c);
  if (ws) pc.ws = take_scratch(&sc, (int64_t)ws);
  pc.slot = r->dev[dev].slot ? r->dev[dev].slot[i] : -1;
  pc.dev = dev, pc.ins = i;
  const ckeep *kp = r->keep && r->keep[dev] ? &r->keep[dev][i] : NULL;
  if (build && kp && kp->pair >= 0 && r->P->s.keep_off && r->P->s.keep_off[dev][i] >= 0) {
    pc.keep = (caddr){dev, r->P->s.keep_off[dev][i]};
    if (kp->bytes == 0) pc.fwd_out = buf_addr(r, dev, r->keep[dev][kp->pair].hold);
  }
  if (build) {
    if (r->P->ncalls == r->P->ccap) {
      r->P->ccap = r->P->ccap ? 2 * r->P->ccap : 256;
      r->P->calls = cx_grow(r->P->calls, sizeof(pcall) * (size_t)r->P->ccap);
    }
    r->P->calls[r->P->ncalls] = pc;
    cact *a = new_act(r, A_CALL);
    a->idx = r->P->ncalls++;
    for (int j = 0; j < npost; j++) {
      if (post[j].mv.m.total == 0) continue;
      *new_act(r, A_MOVE) = post[j];
    }
  }
  return sc.used;
}

/* ---- copies and steps ------------------------------------------------------------------ */

static int64_t prep_copy(crun *r, int dev, int i, bool build) {
  const weft_program *pr = r->pr;
  const lins *in = &pr->progs[dev].ins[i];
  if (!build || in->nout < 1) return 0;
  const lbuf *ob = &pr->bufs[in->out[0].buf];
  for (int j = 0; j < in->nin; j++) {
    const lref *ref = &in->in[j];
    const lbuf *ib = &pr->bufs[ref->buf];
    add_move(r, buf_addr(r, dev, in->out[0].buf), ob->dtype, &ob->region, buf_addr(r, dev, ref->buf), ib->dtype,
             &ib->region, &ref->region, in->accumulate);
  }
  return 0;
}

/* The sum of squares of what step i of device dev counts of its gradient
 * (backends/cpu/clip.h), added to the device's share of the norm. */
static void add_sumsq(crun *r, int dev, int i, caddr grad, int gdt) {
  const clip_own *o = &r->own[dev][i];
  if (o->count == 0) return;
  cact *a = new_act(r, A_SUMSQ);
  a->src = grad, a->src_dt = gdt, a->n = o->n, a->idx = dev;
  a->bytes = o->mask ? r->mask_at[r->ins_base[dev] + i] : -1;
}

/* A step's gradient as the kernels read it: its buffer, or where its part
 * is moved to (the step's scratch, or the fixed area's when it is counted
 * before the steps). */
static int64_t prep_step(crun *r, int dev, int i, int64_t base, bool build) {
  const weft_program *pr = r->pr;
  const lins *in = &pr->progs[dev].ins[i];
  if (in->nin < 1 || in->nout < 1) return plan_fail(r, "a step without its gradient or parameter"), -1;
  const lref *gref = &in->in[0], *pref = &in->out[0], *sref = NULL, *mref = NULL;
  /* the state and the master weights come after the parameter, told apart by role */
  for (int j = 1; j < in->nout; j++) {
    int role = pr->bufs[in->out[j].buf].role;
    if (role == LB_STATE) sref = &in->out[j];
    else if (role == LB_MASTER) mref = &in->out[j];
  }
  const lbuf *gb = &pr->bufs[gref->buf], *pb = &pr->bufs[pref->buf];
  const lbuf *sb = sref ? &pr->bufs[sref->buf] : NULL, *mb = mref ? &pr->bufs[mref->buf] : NULL;
  int need = r->optim == 1 ? 2 : r->settings.momentum != 0.0 ? 1 : 0;
  if ((sb ? sb->copies : 0) < need)
    return plan_fail(r, "step of %s: optimizer state missing", r->g->tensors[in->tensor].name), -1;
  scratch sc = {dev, base, 0};
  pstep st;
  memset(&st, 0, sizeof st);
  st.n = cx_numel(&pref->region);
  st.pdt = pb->dtype;
  st.gdt = gb->dtype;
  st.dev = dev;
  st.grad = ref_in(r, &sc, gref, gb->dtype, build);
  bool pdirect = cx_equal(&pb->region, &pref->region);
  st.param = ref_in(r, &sc, pref, pb->dtype, build);
  /* the master weights: copy 0 of their buffer (an f32 copy of the
   * gradient may follow, which these kernels need not: they read the
   * gradient in its own type) */
  st.master = NOWHERE;
  bool mdirect = true;
  if (mref) {
    mdirect = cx_equal(&mb->region, &mref->region);
    st.master = ref_in(r, &sc, mref, GPU_F32, build);
  }
  st.copies = need;
  st.state = NOWHERE;
  bool sdirect = true;
  if (sb && need > 0) {
    sdirect = cx_equal(&sb->region, &sref->region);
    caddr sbuf = buf_addr(r, dev, sref->buf);
    int64_t bn = cx_numel(&sb->region);
    if (sdirect) {
      st.state = sbuf;
    } else {
      st.state = take_scratch(&sc, st.n * need * 4);
      for (int c = 0; c < need && build; c++)
        add_move(r, (caddr){dev, st.state.off + c * st.n * 4}, GPU_F32, &sref->region,
                 (caddr){dev, sbuf.off + c * bn * 4}, GPU_F32, &sb->region, &sref->region, false);
    }
  }
  if (build) {
    if (r->P->nsteps == r->P->stcap) {
      r->P->stcap = r->P->stcap ? 2 * r->P->stcap : 128;
      r->P->steps = cx_grow(r->P->steps, sizeof(pstep) * (size_t)r->P->stcap);
    }
    r->P->steps[r->P->nsteps] = st;
    /* the norm as the steps come; with clipping it was taken before them */
    if (!r->P->clip) add_sumsq(r, dev, i, st.grad, st.gdt);
    cact *a = new_act(r, A_STEP);
    a->idx = r->P->nsteps++;
    if (!pdirect)
      add_move(r, buf_addr(r, dev, pref->buf), pb->dtype, &pb->region, st.param, pb->dtype, &pref->region,
               &pref->region, false);
    if (!mdirect)
      add_move(r, buf_addr(r, dev, mref->buf), GPU_F32, &mb->region, st.master, GPU_F32, &mref->region,
               &mref->region, false);
    if (!sdirect) {
      caddr sbuf = buf_addr(r, dev, sref->buf);
      int64_t bn = cx_numel(&sb->region);
      for (int c = 0; c < need; c++)
        add_move(r, (caddr){dev, sbuf.off + c * bn * 4}, GPU_F32, &sb->region,
                 (caddr){dev, st.state.off + c * st.n * 4}, GPU_F32, &sref->region, &sref->region, false);
    }
    r->dev[dev].stepped[pref->buf - pr->progs[dev].buf_lo] = true;
    if (mref) r->dev[dev].stepped[mref->buf - pr->progs[dev].buf_lo] = true;
  }
  return sc.used;
}

/* Before the steps, to clip: the gradient of a later step counted (moved
 * into scratch at the end of the fixed area when it is a part). */
static void prep_norm_part(crun *r, int dev, int i) {
  const lins *in = &r->pr->progs[dev].ins[i];
  const lref *gref = &in->in[0];
  const lbuf *gb = &r->pr->bufs[gref->buf];
  if (r->own[dev][i].count == 0) return;
  scratch sc = {dev, r->P->s.fixed[dev] + (int64_t)gpu_gemm_ws() + (int64_t)gpu_sumsq_ws(), 0};
  caddr g = ref_in(r, &sc, gref, gb->dtype, true);
  add_sumsq(r, dev, i, g, gb->dtype);
}

static int64_t ins_ws(void *ctx, int dev, int i) {
  crun *r = ctx;
  if (!here(r, dev)) return 0;  /* another process's device: its scratch is its own */
  const lins *in = &r->pr->progs[dev].ins[i];
  if (in->kind == LI_COMPUTE) return prep_compute(r, dev, i, 0, false);
  if (in->kind == LI_STEP) return prep_step(r, dev, i, 0, false);
  return 0;
}

/* ---- messages ------------------------------------------------------------------------------- */

typedef struct entries {
  sentry *e;
  int n;
  int64_t bytes;
} entries;

static entries entries_of(const crun *r, const lins *in, int rank) {
  entries x;
  int max = 1;
  if (in->kind == LI_COLLECTIVE) {
    const pcomm *cm = lower_comm(r->pr, in->comm);
    max = in->nbucket + 1 > cm->ngroup ? in->nbucket + 1 : cm->ngroup;
  }
  x.e = cx_alloc(sizeof(sentry) * (size_t)max);
  x.n = sched_entries(r->pr, in, rank, x.e, max, &x.bytes);
  return x;
}

static void entries_free(entries *x) {
  sched_entries_free(x->e, x->n);
  free(x->e);
}

static caddr msg_at(const crun *r, int msg, int64_t off) {
  const smsg *m = &r->P->s.msgs[msg];
  if (!here(r, m->dev)) {
    /* another process's message: its copy here, placed when first asked */
    cplan *P = r->P;
    if (!P->mirror_off) {
      P->mirror_off = cx_alloc(sizeof(int64_t) * (size_t)(P->s.nmsgs + 1));
      for (int k = 0; k < P->s.nmsgs; k++) P->mirror_off[k] = -1;
    }
    if (P->mirror_off[msg] < 0) P->mirror_off[msg] = P->mirror_bytes, P->mirror_bytes += align_up(m->bytes);
    return (caddr){ADDR_MIRROR, P->mirror_off[msg] + off};
  }
  return (caddr){m->dev, m->off + off};
}

static void prep_send(crun *r, const sop *so) {
  const lins *in = &r->pr->progs[so->dev].ins[so->ins];
  const lref *ref = &in->in[0];
  const lbuf *b = &r->pr->bufs[ref->buf];
  add_move(r, msg_at(r, so->arg, 0), b->dtype, &ref->region, buf_addr(r, so->dev, ref->buf), b->dtype, &b->region,
           &ref->region, false);
}

/* The send whose message a receive takes: its instruction. */
static const lins *sender_of(const crun *r, int msg, int *dev) {
  for (int k = 0; k < r->P->s.nops; k++) {
    const sop *o = &r->P->s.ops[k];
    if (o->kind == SO_SEND && o->arg == msg) {
      *dev = o->dev;
      return &r->pr->progs[o->dev].ins[o->ins];
    }
  }
  return NULL;
}

static void prep_recv(crun *r, const sop *so) {
  const lins *in = &r->pr->progs[so->dev].ins[so->ins];
  int sdev;
  const lins *snd = sender_of(r, so->arg, &sdev);
  if (!snd) {
    plan_fail(r, "comm %d: a receive without its send", in->comm);
    return;
  }
  const lref *ref = &in->out[0];
  const lbuf *b = &r->pr->bufs[ref->buf];
  if (cx_numel(&snd->in[0].region) != cx_numel(&ref->region)) {
    plan_fail(r, "comm %d: %" PRId64 " elements sent, %" PRId64 " expected", in->comm, cx_numel(&snd->in[0].region),
              cx_numel(&ref->region));
    return;
  }
  add_move(r, buf_addr(r, so->dev, ref->buf), b->dtype, &b->region, msg_at(r, so->arg, 0),
           r->pr->bufs[snd->in[0].buf].dtype, &ref->region, &ref->region, false);
}

static void prep_pack(crun *r, const sop *so) {
  const scoll *c = &r->P->s.colls[so->arg];
  const lins *in = &r->pr->progs[so->dev].ins[so->ins];
  const pcomm *cm = lower_comm(r->pr, in->comm);
  entries x = entries_of(r, in, so->member);
  int msg = c->msg[so->member];
  for (int i = 0; i < x.n; i++) {
    const lref *src = cm->kind == COMM_BROADCAST ? &in->out[0] : cm->kind == COMM_ALL_REDUCE ? &in->in[i] : &in->in[0];
    const lbuf *b = &r->pr->bufs[src->buf];
    add_move(r, msg_at(r, msg, x.e[i].off), x.e[i].dt, &x.e[i].region, buf_addr(r, so->dev, src->buf), b->dtype,
             &b->region, &x.e[i].region, false);
  }
  entries_free(&x);
}

/* out (+)= the sum over the members that bring data, in group order, of
 * entry `entry` of their messages, over region R of it. */
static void add_sum(crun *r, const scoll *c, int entry, const tregion *R, const tregion *held, int dev,
                    const lref *out) {
  const lbuf *ob = &r->pr->bufs[out->buf];
  char e[256];
  cx_move mv;
  if (!cx_move_build(&mv, &r->tab, R, held, &ob->region, e, sizeof e)) {
    plan_fail(r, "%s", e);
    return;
  }
  cact *a = new_act(r, A_SUM);
  a->dst = buf_addr(r, dev, out->buf), a->dst_dt = ob->dtype, a->mv = mv, a->first = r->P->nsrcs;
  a->src_dt = -1;
  for (int m = 0; m < c->n; m++) {
    /* several processes: NCCL summed the members into this one's message,
     * or into the zeros it gave when it brings nothing (mp_reduce) */
    bool silent = r->mine >= 0 && c->dev[m] == r->mine && c->msg[m] < 0 && r->P->silent_at.dev != ADDR_NONE;
    if (c->msg[m] < 0 && !silent) continue;
    if (r->mine >= 0 && c->dev[m] != r->mine) continue;
    int as = silent ? r->P->silent_as : m;
    const lins *min = &r->pr->progs[c->dev[as]].ins[c->ins[as]];
    entries x = entries_of(r, min, as);
    if (entry < x.n) {
      if (a->src_dt >= 0 && a->src_dt != x.e[entry].dt)
        plan_fail(r, "comm %d: its members hold it in different types", c->comm);
      a->src_dt = x.e[entry].dt;
      if (r->P->nsrcs == r->P->scap) {
        r->P->scap = r->P->scap ? 2 * r->P->scap : 256;
        r->P->srcs = cx_grow(r->P->srcs, sizeof(caddr) * (size_t)r->P->scap);
      }
      r->P->srcs[r->P->nsrcs++] = silent ? (caddr){ADDR_MIRROR, r->P->silent_at.off + x.e[entry].off}
                                         : msg_at(r, c->msg[m], x.e[entry].off);
      a->nsrc++;
    }
    entries_free(&x);
  }
  if (a->src_dt < 0) a->src_dt = ob->dtype;
  if (a->nsrc > GPU_MAX_SRCS) plan_fail(r, "comm %d: more than %d members bring data", c->comm, GPU_MAX_SRCS);
}

/* The member's message through NCCL, in place, before it is unpacked. */
static int add_ccl(crun *r, const sop *so, const scoll *c, const lins *in, const pcomm *cm) {
  cplan *P = r->P;
  int member = so->member, msg = c->msg[member];
  caddr at = msg >= 0 ? msg_at(r, msg, 0) : NOWHERE;
  if (msg < 0 && P->silent_at.dev != ADDR_NONE) {
    /* the zeros of a member that brings nothing, as another's message */
    member = P->silent_as, msg = c->msg[member], at = P->silent_at;
    in = &r->pr->progs[c->dev[member]].ins[c->ins[member]];
  }
  if (msg < 0) return -1;
  entries x = entries_of(r, in, member);
  bool one = x.n > 0;
  for (int i = 1; i < x.n; i++) one &= x.e[i].dt == x.e[0].dt;
  int need = one ? 1 : x.n;
  if (P->ncops == P->cocap) {
    P->cocap = P->cocap ? 2 * P->cocap : 64;
    P->cops = cx_grow(P->cops, sizeof(cclop) * (size_t)P->cocap);
  }
  while (P->nparts + need > P->pcap) {
    P->pcap = P->pcap ? 2 * P->pcap : 64;
    P->parts = cx_grow(P->parts, sizeof(cclpart) * (size_t)P->pcap);
  }
  cclop *op = &P->cops[P->ncops];
  memset(op, 0, sizeof *op);
  op->comm = r->comm_of[in->comm], op->kind = cm->kind, op->dev = so->dev, op->ins = so->ins;
  op->at = at, op->first = P->nparts, op->nparts = need;
  if (one && x.n == 1) {
    P->parts[P->nparts++] = (cclpart){0, cx_numel(&x.e[0].region), x.e[0].dt};
  } else if (one) {
    int64_t sz = gpu_dtype_size(x.e[0].dt);
    P->parts[P->nparts++] = (cclpart){0, P->s.msgs[msg].bytes / sz, x.e[0].dt};
  } else {
    for (int i = 0; i < x.n; i++) P->parts[P->nparts++] = (cclpart){x.e[i].off, cx_numel(&x.e[i].region), x.e[i].dt};
  }
  entries_free(&x);
  cact *a = new_act(r, A_CCL);
  a->idx = P->ncops++;
  return a->idx;
}

/* ---- several processes: what crosses between them, through NCCL ----------------------------------
 * Every process plans the whole step as one process would (sched.h), and
 * runs the part of its device. A message another process packs and this
 * one reads has a copy here, its mirror (msg_at), that a receive fills; an
 * event another process records and this one waits for is the op of this
 * one that stands for it (cplan.alias), or nothing where NCCL already
 * orders the two (a collective's members). */

/* The communicator of devices grp[0 .. n) in that order, -1 none. */
static int mp_comm(const crun *r, const int *grp, int n, bool p2p) {
  for (int k = 0; k < r->ncomms; k++) {
    if (r->comm_n[k] != n || r->comm_p2p[k] != p2p) continue;
    bool same = true;
    for (int i = 0; i < n && same; i++) same = r->comm_grp[k][i] == grp[i];
    if (same) return k;
  }
  return -1;
}

/* A new op of sends and receives (or a broadcast's) on communicator comm. */
static int mp_op(crun *r, int comm, int kind, int dev, int ins) {
  cplan *P = r->P;
  if (P->ncops == P->cocap) {
    P->cocap = P->cocap ? 2 * P->cocap : 64;
    P->cops = cx_grow(P->cops, sizeof(cclop) * (size_t)P->cocap);
  }
  cclop *op = &P->cops[P->ncops];
  memset(op, 0, sizeof *op);
  op->comm = comm, op->kind = kind, op->dev = dev, op->ins = ins, op->root = -1, op->xfirst = P->nxfers;
  op->at = NOWHERE;
  cact *a = new_act(r, A_CCL);
  a->idx = P->ncops;
  return P->ncops++;
}

static void mp_xfer(crun *r, int op, int peer, bool send, caddr at, int64_t bytes) {
  cplan *P = r->P;
  if (bytes <= 0) return;
  if (P->nxfers == P->xcap) {
    P->xcap = P->xcap ? 2 * P->xcap : 64;
    P->xfers = cx_grow(P->xfers, sizeof(cclxfer) * (size_t)P->xcap);
  }
  P->xfers[P->nxfers++] = (cclxfer){peer, send, at, bytes};
  P->cops[op].nx++;
}

static int64_t entry_bytes(const sentry *e) { return cx_numel(&e->region) * gpu_dtype_size(e->dt); }

/* Whether NCCL's reduce-scatter takes this one as it is: the message
 * holds the parts one after another in group order (sched_entries), each
 * aligned, and NCCL gives rank m of the communicator (whose ranks are the
 * group's order, mp_open) elements [m x recvcount, (m + 1) x recvcount) of
 * the sum: the m-th part's place when the parts are of one size (then
 * recvcount counts each part's padding too). Parts of different sizes (a
 * dimension that does not split evenly) are not NCCL's. */
static bool mp_scatter_fits(crun *r, const pcomm *cm, int n, int msg) {
  if (n < 1 || !cm->parts) return false;
  for (int m = 1; m < n; m++)
    if (cx_numel(&cm->parts[m]) != cx_numel(&cm->parts[0])) return false;
  return r->P->s.msgs[msg].bytes % n == 0;
}

/* Places another process's message in this one's mirror at off, before
 * anything reads it there. */
static bool mirror_place(crun *r, int msg, int64_t off) {
  cplan *P = r->P;
  if (!P->mirror_off) {
    P->mirror_off = cx_alloc(sizeof(int64_t) * (size_t)(P->s.nmsgs + 1));
    for (int k = 0; k < P->s.nmsgs; k++) P->mirror_off[k] = -1;
  }
  if (P->mirror_off[msg] >= 0 && P->mirror_off[msg] != off) return false;
  P->mirror_off[msg] = off;
  return true;
}

/* An all-gather on NCCL's, where the members' messages are of one size
 * (NCCL takes the same count from every rank; each message an aligned
 * whole, so that every copy stays aligned): from this member's message
 * into a copy of all of them in rank order, whose m-th is member m's
 * mirror. False: not this way. */
static bool mp_gather_ccl(crun *r, const sop *so, const scoll *c, int k) {
  int me = so->member, msg = c->msg[me];
  bool same = msg >= 0;
  for (int m = 0; m < c->n && same; m++)
    same = c->msg[m] >= 0 && r->P->s.msgs[c->msg[m]].bytes == r->P->s.msgs[msg].bytes;
  if (!same) return false;
  int64_t each = r->P->s.msgs[msg].bytes;
  int64_t base = r->P->mirror_bytes;
  r->P->mirror_bytes += align_up(each * c->n);
  for (int m = 0; m < c->n; m++)
    if (m != me && !mirror_place(r, c->msg[m], base + m * each))
      return plan_fail(r, "comm %d: a member's message was placed before its all-gather", c->comm), true;
  int op = mp_op(r, k, COMM_ALL_GATHER, so->dev, so->ins);
  r->P->cops[op].at = msg_at(r, msg, 0);
  r->P->cops[op].gather = (caddr){ADDR_MIRROR, base};
  r->P->cops[op].gbytes = each;
  return true;
}

/* A member's collective with the other processes, before it takes its
 * result: an all-reduce on NCCL in place on its message; a reduce-scatter
 * on NCCL's in place (rank m's part of the sum lands where the message
 * holds part m) where its parts are of one size, else an all-reduce of the
 * whole (every member then takes its part of the sum); an all-gather where the
 * members' messages are of one size on NCCL's, into a copy of them all in
 * rank order whose m-th is member m's mirror, else, and an all-to-all, as
 * sends of its message (its pieces) to every other member and receives of
 * theirs into their mirrors, posted together. A broadcast's are at the
 * root's packing and at the others' wait for it (mp_pack, mp_wait). */
static bool mp_reduce(crun *r, const sop *so, const scoll *c, const lins *in, const pcomm *cm) {
  if (c->n < 2) return true;
  int k = mp_comm(r, c->dev, c->n, false), me = so->member, msg = c->msg[me];
  if (k < 0) return plan_fail(r, "comm %d: its group has no communicator", in->comm);
  switch (cm->kind) {
  case COMM_ALL_REDUCE:
  case COMM_REDUCE_SCATTER: {
    r->P->silent_at = NOWHERE;
    if (msg < 0 && cm->kind == COMM_ALL_REDUCE) {
      /* a member that takes the sum without adding to it (pcomm.silent)
       * gives NCCL zeros laid out as the first other member's message */
      int as = -1;
      for (int m = 0; m < c->n && as < 0; m++)
        if (c->msg[m] >= 0) as = m;
      if (as < 0) return plan_fail(r, "comm %d: no member brings anything to a sum", in->comm);
      int64_t bytes = r->P->s.msgs[c->msg[as]].bytes;
      r->P->silent_at = (caddr){ADDR_MIRROR, r->P->mirror_bytes}, r->P->silent_as = as;
      r->P->mirror_bytes += align_up(bytes);
      add_zero(r, r->P->silent_at, bytes);
    }
    if (msg < 0 && r->P->silent_at.dev == ADDR_NONE)
      return plan_fail(r, "comm %d: a member brings nothing to a sum", in->comm);
    int op = add_ccl(r, so, c, in, cm);
    if (op >= 0 && cm->kind == COMM_REDUCE_SCATTER)
      r->P->cops[op].whole = r->P->cops[op].nparts != 1 || !mp_scatter_fits(r, cm, c->n, msg);
    return true;
  }
  case COMM_ALL_GATHER:
    /* else as sends and receives */
    if (mp_gather_ccl(r, so, c, k)) return !r->pfail;
    /* fall through */
  case COMM_ALL_TO_ALL: {
    int op = mp_op(r, k, cm->kind, so->dev, so->ins);
    entries mine = {0};
    if (msg >= 0) mine = entries_of(r, in, me);
    for (int m = 0; m < c->n; m++) {
      if (m == me) continue;
      if (msg >= 0 && cm->kind == COMM_ALL_GATHER) mp_xfer(r, op, m, true, msg_at(r, msg, 0), r->P->s.msgs[msg].bytes);
      else if (msg >= 0 && m < mine.n) mp_xfer(r, op, m, true, msg_at(r, msg, mine.e[m].off), entry_bytes(&mine.e[m]));
      if (c->msg[m] < 0) continue;
      if (cm->kind == COMM_ALL_GATHER) {
        mp_xfer(r, op, m, false, msg_at(r, c->msg[m], 0), r->P->s.msgs[c->msg[m]].bytes);
      } else {
        entries x = entries_of(r, &r->pr->progs[c->dev[m]].ins[c->ins[m]], m);
        if (me < x.n) mp_xfer(r, op, m, false, msg_at(r, c->msg[m], x.e[me].off), entry_bytes(&x.e[me]));
        entries_free(&x);
      }
    }
    if (msg >= 0) entries_free(&mine);
    return true;
  }
  case COMM_BROADCAST:
    return true;
  default:
    return plan_fail(r, "comm %d: the CUDA backend does not run this kind of collective between processes", in->comm);
  }
}

/* A send to another process: NCCL's send of the message once packed; the
 * sender goes on, and what waits for the receiver's unpacking (the reuse of
 * the message's memory) waits for the send. */
static void mp_send(crun *r, int at, const sop *so) {
  const lins *in = &r->pr->progs[so->dev].ins[so->ins];
  if (here(r, in->peer)) return;
  int grp[2] = {so->dev, in->peer};
  int k = mp_comm(r, grp, 2, true);
  if (k < 0) {
    plan_fail(r, "comm %d: the devices %d and %d have no communicator", in->comm, so->dev, in->peer);
    return;
  }
  int op = mp_op(r, k, OP_SEND, so->dev, so->ins);
  r->P->cops[op].nowait = true;
  mp_xfer(r, op, 1, true, msg_at(r, so->arg, 0), r->P->s.msgs[so->arg].bytes);
  const csched *S = &r->P->s;
  for (int j = at + 1; j + 1 < S->nops; j++)
    if (S->ops[j].kind == SO_RECV && S->ops[j].arg == so->arg && S->ops[j + 1].kind == SO_RECORD) {
      r->P->alias[S->ops[j + 1].arg] = op;
      break;
    }
}

/* A broadcast's root, once it packed: NCCL's broadcast of its message to
 * the other processes; the root goes on, and the reuse of the message's
 * memory waits for the broadcast. */
static void mp_pack(crun *r, const sop *so) {
  const scoll *c = &r->P->s.colls[so->arg];
  const pcomm *cm = lower_comm(r->pr, c->comm);
  if (cm->kind != COMM_BROADCAST || c->n < 2 || c->msg[so->member] < 0) return;
  int k = mp_comm(r, c->dev, c->n, false);
  if (k < 0) {
    plan_fail(r, "comm %d: its group has no communicator", c->comm);
    return;
  }
  int op = mp_op(r, k, COMM_BROADCAST, so->dev, so->ins);
  r->P->cops[op].nowait = true, r->P->cops[op].root = so->member;
  int msg = c->msg[so->member];
  mp_xfer(r, op, -1, true, msg_at(r, msg, 0), r->P->s.msgs[msg].bytes);
  for (int m = 0; m < c->n; m++)
    if (m != so->member && c->done_ev[m] >= 0) r->P->alias[c->done_ev[m]] = op;
}

/* A wait for an event of another process: for a send's packing, NCCL's
 * receive of the message into its mirror; for a broadcast root's packing,
 * this member's part of the broadcast, into the root's mirror; the stream
 * then waits for it. Other waits of that kind are ordered by NCCL. */
static void mp_wait(crun *r, const sop *so, const int *rec) {
  const csched *S = &r->P->s;
  int at = rec[so->arg];
  if (at <= 0 || here(r, S->ops[at].dev)) return;
  const sop *src = &S->ops[at - 1];
  if (src->kind == SO_SEND) {
    int grp[2] = {src->dev, so->dev};
    int k = mp_comm(r, grp, 2, true);
    if (k < 0) {
      plan_fail(r, "the devices %d and %d have no communicator", src->dev, so->dev);
      return;
    }
    int op = mp_op(r, k, OP_RECV, so->dev, -1);
    r->P->cops[op].detached = true;
    mp_xfer(r, op, 0, false, msg_at(r, src->arg, 0), S->msgs[src->arg].bytes);
    return;
  }
  if (src->kind != SO_PACK) return;
  const scoll *c = &S->colls[src->arg];
  if (lower_comm(r->pr, c->comm)->kind != COMM_BROADCAST || c->msg[src->member] < 0) return;
  int k = mp_comm(r, c->dev, c->n, false);
  if (k < 0) {
    plan_fail(r, "comm %d: its group has no communicator", c->comm);
    return;
  }
  int op = mp_op(r, k, COMM_BROADCAST, so->dev, -1);
  r->P->cops[op].detached = true, r->P->cops[op].root = src->member;
  int msg = c->msg[src->member];
  mp_xfer(r, op, -1, false, msg_at(r, msg, 0), S->msgs[msg].bytes);
}

static void prep_reduce(crun *r, const sop *so) {
  const scoll *c = &r->P->s.colls[so->arg];
  const lins *in = &r->pr->progs[so->dev].ins[so->ins];
  const pcomm *cm = lower_comm(r->pr, in->comm);
  int me = so->member;
  r->P->silent_at = NOWHERE;
  if (r->mine >= 0) {
    if (!mp_reduce(r, so, c, in, cm)) return;
  } else if (r->comm_of && r->comm_of[in->comm] >= 0) {
    add_ccl(r, so, c, in, cm);
  }
  switch (cm->kind) {
  case COMM_ALL_REDUCE:
    if (in->nout != in->nbucket + 1) {
      plan_fail(r, "comm %d: a bucket of %d without a ref each", in->comm, in->nbucket + 1);
      return;
    }
    for (int i = 0; i <= in->nbucket; i++) {
      const pcomm *ci = lower_comm(r->pr, i ? in->bucket[i - 1] : in->comm);
      add_sum(r, c, i, &ci->region, &ci->region, so->dev, &in->out[i]);
    }
    return;
  case COMM_REDUCE_SCATTER:
    add_sum(r, c, me, &cm->parts[me], &cm->parts[me], so->dev, &in->out[0]);
    return;
  case COMM_ALL_GATHER:
  case COMM_BROADCAST:
  case COMM_ALL_TO_ALL: {
    const lbuf *ob = &r->pr->bufs[in->out[0].buf];
    for (int m = 0; m < c->n; m++) {
      if (c->msg[m] < 0) continue;
      if (cm->kind == COMM_BROADCAST && m != c->root) continue;
      const lins *min = &r->pr->progs[c->dev[m]].ins[c->ins[m]];
      entries x = entries_of(r, min, m);
      int k = cm->kind == COMM_ALL_TO_ALL ? me : 0;
      if (k < x.n)
        add_move(r, buf_addr(r, so->dev, in->out[0].buf), ob->dtype, &ob->region, msg_at(r, c->msg[m], x.e[k].off),
                 x.e[k].dt, &x.e[k].region, &x.e[k].region, false);
      entries_free(&x);
    }
    return;
  }
  default:
    plan_fail(r, "comm %d: the CUDA backend does not run this kind of collective", in->comm);
  }
}

/* ---- NCCL --------------------------------------------------------------------------------------- */

static const char *ccl_kind(int kind) {
  switch (kind) {
  case COMM_ALL_REDUCE: return "all-reduce";
  case COMM_REDUCE_SCATTER: return "reduce-scatter";
  case COMM_ALL_GATHER: return "all-gather";
  case COMM_BROADCAST: return "broadcast";
  case COMM_ALL_TO_ALL: return "all-to-all";
  default: return "collective";
  }
}

/* WEFT_CUDA_COMM=nccl: the collectives whose group is one device go
 * through NCCL, each group with its communicator (a process with one GPU
 * is one NCCL rank, and NCCL takes no two ranks on one GPU: larger groups
 * of one process stay on the virtual-device path). Unset or `virtual`:
 * every collective on the virtual-device path. */
static bool comm_choose(crun *r, char *err, size_t errlen) {
  const char *v = getenv("WEFT_CUDA_COMM");
  if (!v || !*v || strcmp(v, "virtual") == 0) return true;
  if (strcmp(v, "nccl") != 0) return failf(err, errlen, 1, "WEFT_CUDA_COMM=%s: expected `nccl` or `virtual`", v);
  const weft_plan *p = r->pr->p;
  int nd = r->pr->nprogs;
  r->nccl = true;
  r->comm_of = cx_alloc(sizeof(int) * (size_t)(p->ncomms + 1));
  r->comm_dev = cx_alloc(sizeof(int) * (size_t)(nd + 1));
  int *of_dev = cx_alloc(sizeof(int) * (size_t)(nd + 1));
  for (int d = 0; d < nd; d++) of_dev[d] = -1;
  for (int c = 0; c < p->ncomms; c++) {
    const pcomm *cm = &p->comms[c];
    r->comm_of[c] = -1;
    bool kind = cm->kind == COMM_ALL_REDUCE || cm->kind == COMM_REDUCE_SCATTER || cm->kind == COMM_ALL_GATHER ||
                cm->kind == COMM_BROADCAST;
    if (!kind || cm->ngroup != 1 || cm->group[0] < 0 || cm->group[0] >= nd) continue;
    int d = cm->group[0];
    if (of_dev[d] < 0) of_dev[d] = r->ncomms, r->comm_dev[r->ncomms++] = d;
    r->comm_of[c] = of_dev[d];
  }
  free(of_dev);
  return true;
}

/* The communicators, their streams and the collectives' events, once the
 * GPU is chosen: one communicator of every rank (here one), then one per
 * group split from it (every rank takes part in every split, a member
 * with its color). */
static bool comm_open(crun *r, char *err, size_t errlen) {
  if (!r->nccl) return true;
  char e[512];
  double t = r->o.timeout_s;
  if (!ccl_available(r->ccl_what, sizeof r->ccl_what))
    return failf(err, errlen, 2, "WEFT_CUDA_COMM=nccl: %s", r->ccl_what);
  unsigned char id[CCL_ID_BYTES];
  if (!ccl_unique_id(id, e, sizeof e) || !(r->world = ccl_init(id, 1, 0, t, e, sizeof e)))
    return failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
  r->comms = cx_alloc(sizeof(ccl_comm *) * (size_t)(r->ncomms + 1));
  r->cstream = cx_alloc(sizeof(gpu_stream *) * (size_t)(r->ncomms + 1));
  for (int k = 0; k < r->ncomms; k++)
    if (!ccl_split(r->world, 0, 0, t, &r->comms[k], e, sizeof e) || !(r->cstream[k] = gpu_stream_new(e, sizeof e)))
      return failf(err, errlen, 2, "GPU %d (%s), the communicator of group [%d]: %s", r->gpu, r->props.name,
                   r->comm_dev[k], e);
  for (int k = 0; k < 2; k++)
    for (int j = 0; r->plan[k].built && j < r->plan[k].ncops; j++) {
      cclop *op = &r->plan[k].cops[j];
      if (!(op->in = gpu_event_new(e, sizeof e)) || !(op->out = gpu_event_new(e, sizeof e)))
        return failf(err, errlen, 2, "GPU %d: %s", r->gpu, e);
    }
  return true;
}

/* Ends every communicator at once (ncclCommAbort). */
static void comm_abort(crun *r) {
  for (int k = 0; r->comms && k < r->ncomms; k++) ccl_abort(r->comms[k]), r->comms[k] = NULL;
  ccl_abort(r->world);
  r->world = NULL;
}

static void comm_close(crun *r, bool gpu) {
  if (r->hung) comm_abort(r);
  for (int k = 0; r->comms && k < r->ncomms; k++) {
    ccl_free(r->comms[k], r->o.timeout_s);
    if (gpu) gpu_stream_free(r->cstream[k]);
  }
  ccl_free(r->world, r->o.timeout_s);
  free(r->comms), free(r->cstream), free(r->comm_of), free(r->comm_dev);
}

/* Enqueues a collective on its communicator's stream, between the
 * packing and the unpacking on s. A reduce-scatter and an all-gather of a
 * message are in place as NCCL defines it: the rank's part of the result
 * is the message at rank x count (with a group of one rank, the message
 * itself); an all-gather between processes is out of place, from the
 * message into the copies of all (cclop.gather). */
static bool run_ccl(crun *r, const cclop *op, gpu_stream *s, char *err, size_t errlen) {
  ccl_comm *c = op->comm >= 0 ? r->comms[op->comm] : r->world;
  gpu_stream *cs = op->comm >= 0 ? r->cstream[op->comm] : r->wstream;
  if (!c || !cs) return failf(err, errlen, 2, "a collective of a communicator this process is not in");
  if (!op->detached) {
    gpu_record(op->in, s);
    gpu_wait(cs, op->in);
  }
  char *base = addr(r, op->at);
  int n = ccl_size(c), me = ccl_rank(c);
  bool ok = true;
  ccl_group_start();
  if (op->gbytes > 0)
    ok = ccl_all_gather(c, base, addr(r, op->gather), op->gbytes, CCL_U8, cs, err, errlen);
  for (int i = 0; i < op->nx && ok; i++) {
    const cclxfer *x = &r->P->xfers[op->xfirst + i];
    void *p = addr(r, x->at);
    if (op->root >= 0) ok = ccl_broadcast(c, p, p, x->bytes, CCL_U8, op->root, cs, err, errlen);
    else if (x->send) ok = ccl_send(c, p, x->bytes, CCL_U8, x->peer, cs, err, errlen);
    else ok = ccl_recv(c, p, x->bytes, CCL_U8, x->peer, cs, err, errlen);
  }
  for (int i = 0; i < op->nparts && ok; i++) {
    const cclpart *pt = &r->P->parts[op->first + i];
    void *p = base + pt->off;
    int64_t each = pt->count / n;
    if (op->kind == COMM_ALL_REDUCE || (op->kind == COMM_REDUCE_SCATTER && op->whole))
      ok = ccl_all_reduce(c, p, p, pt->count, pt->dt, cs, err, errlen);
    else if (op->kind == COMM_REDUCE_SCATTER)
      ok = ccl_reduce_scatter(c, p, p + me * each * gpu_dtype_size(pt->dt), each, pt->dt, cs, err, errlen);
    else if (op->kind == COMM_ALL_GATHER)
      ok = ccl_all_gather(c, p + me * each * gpu_dtype_size(pt->dt), p, each, pt->dt, cs, err, errlen);
    else ok = ccl_broadcast(c, p, p, pt->count, pt->dt, 0, cs, err, errlen);
  }
  char e[512];
  if (!ccl_group_end(c, r->o.timeout_s, e, sizeof e) && ok) ok = false, snprintf(err, errlen, "%s", e);
  gpu_record(op->out, cs);
  if (!op->nowait) gpu_wait(s, op->out);
  return ok;
}

/* The watchdog's message when a step passed --timeout on the NCCL path:
 * the first collective not done, its group and ranks; the communicators
 * are aborted. */
static bool ccl_timeout(crun *r, int dev, char *err, size_t errlen) {
  char e[512], what[256];
  const cclop *late = NULL;
  for (int j = 0; j < r->P->ncops && !late; j++)
    if (gpu_event_done(r->P->cops[j].out, e, sizeof e) <= 0) late = &r->P->cops[j];
  comm_abort(r);
  r->hung = true;
  if (!late)
    return failf(err, errlen, 2,
                 "GPU %d (%s), plan device %d: step %" PRId64 " did not finish within %g s (--timeout), its "
                 "collectives done; the communicators were aborted (ncclCommAbort)",
                 r->gpu, r->props.name, dev, r->w->step + 1, r->o.timeout_s);
  ins_name(r, late->dev, late->ins, what, sizeof what);
  if (r->mine >= 0 && late->comm < 0)
    return failf(err, errlen, 2,
                 "process %d of %d, GPU %d (%s): the NCCL all-reduce of the gradients' sums of squares (--clip) "
                 "through the world communicator (processes 0 to %d) did not finish within %g s (--timeout) in step "
                 "%" PRId64 "; one of the others stopped or is too slow; the communicators were aborted "
                 "(ncclCommAbort)",
                 r->rank, r->nprocs, r->gpu, r->props.name, r->nprocs - 1, r->o.timeout_s, r->w->step + 1);
  if (r->mine >= 0) {
    char grp[256], ranks[256];
    mp_group(r, late->comm, grp, sizeof grp);
    size_t at = 0;
    ranks[0] = 0;
    for (int i = 0; i < r->comm_n[late->comm] && at + 24 < sizeof ranks; i++) {
      int d = r->comm_grp[late->comm][i], p = -1;
      for (int q = 0, k = 0; q < r->pr->nprogs; q++)
        if (r->pr->progs[q].n) p = q == d ? k : p, k++;
      at += (size_t)snprintf(ranks + at, sizeof ranks - at, "%s%d", i ? ", " : "", p);
    }
    const char *kind = late->kind == OP_SEND ? "send" : late->kind == OP_RECV ? "receive" : ccl_kind(late->kind);
    return failf(err, errlen, 2,
                 "process %d of %d, GPU %d (%s), %s: the NCCL %s of group %s did not finish within %g s (--timeout) "
                 "in step %" PRId64 "; its processes: %s (this one %d), one of the others stopped or is too slow; the "
                 "communicators were aborted (ncclCommAbort)",
                 r->rank, r->nprocs, r->gpu, r->props.name, what, kind, grp, r->o.timeout_s, r->w->step + 1, ranks,
                 r->rank);
  }
  return failf(err, errlen, 2,
               "GPU %d (%s), %s: the NCCL %s of group [%d] did not finish within %g s (--timeout) in step %" PRId64
               "; its ranks: 0 of 1, this process; the communicators were aborted (ncclCommAbort)",
               r->gpu, r->props.name, what, ccl_kind(late->kind), r->comm_dev[late->comm], r->o.timeout_s,
               r->w->step + 1);
}

/* A communicator that failed (ncclCommGetAsyncError) ends the run. */
static bool ccl_healthy(crun *r, char *err, size_t errlen) {
  char e[512];
  for (int k = 0; k < r->ncomms; k++)
    if (r->comms[k] && ccl_status(r->comms[k], e, sizeof e) < 0) {
      comm_abort(r);
      r->hung = true;
      return failf(err, errlen, 2, "GPU %d (%s), the communicator of group [%d]: %s; the communicators were aborted",
                   r->gpu, r->props.name, r->comm_dev[k], e);
    }
  return true;
}


/* ---- several processes: ranks, communicators, sums ----------------------------------------------- */

/* The GPU of this process when WEFT_CUDA_DEVICE does not name one: its
 * rank among the processes of its machine (-1: the first GPU). */
static int local_gpu = -1;

/* The first of the variables that is set as a count, else -1. */
static int env_first(const char *const *vars, int n);

/* Where this process stands (crun_procs), its rank on this machine, and
 * whether MPI started it. */
static void mp_env(int *rank, int *size, int *local, bool *mpi) {
  static const char *const mlocal[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "MPI_LOCALRANKID"};
  static const char *const msizes[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
  crun_procs(rank, size);
  *mpi = *size > 1 && env_first(msizes, 3) > 1;
  static const char *const slocal[] = {"SLURM_LOCALID"};
  *local = *size > 1 ? (*mpi ? env_first(mlocal, 3) : env_first(slocal, 1)) : 0;
  if (*local < 0) *local = 0;
}

/* Several processes: which device this one runs, as the CPU backend
 * spreads devices over processes (blocks of consecutive devices with a
 * program, backends/cpu/net.c), one each; MPI joined under mpirun. */
static bool mp_begin(crun *r, char *err, size_t errlen) {
  int rank, size, local;
  bool mpi;
  mp_env(&rank, &size, &local, &mpi);
  r->mine = -1, r->rank = 0, r->nprocs = 1;
  if (size < 2) return true;
  const weft_program *pr = r->pr;
  int active = 0;
  for (int d = 0; d < pr->nprogs; d++) active += pr->progs[d].n > 0;
  if (active != size)
    return failf(err, errlen, 1,
                 "the CUDA backend runs one plan device per process: plan %s has %d device%s with a program, and %d "
                 "processes were started (start %d)",
                 pr->p->name, active, active == 1 ? "" : "s", size, active);
  if (mpi) {
    Dl_info di;
    char dir[RDV_MAX_PATH] = ".", e[512];
    if (dladdr((void *)crun_open, &di) && di.dli_fname) {
      snprintf(dir, sizeof dir, "%s", di.dli_fname);
      char *slash = strrchr(dir, '/');
      if (slash) *slash = 0;
      else snprintf(dir, sizeof dir, ".");
    }
    int mrank, msize;
    if (!(r->mpi = rdv_mpi_open(dir, r->o.timeout_s, &mrank, &msize, e, sizeof e)))
      return failf(err, errlen, 2, "started by mpirun, but %s", e);
    if (mrank != rank || msize != size)
      return failf(err, errlen, 2, "MPI says process %d of %d, the environment %d of %d", mrank, msize, rank, size);
  }
  r->rank = rank, r->nprocs = size, r->local = local, r->parent = (long)getppid();
  for (int d = 0, k = 0; d < pr->nprogs; d++) {
    if (!pr->progs[d].n) continue;
    if ((int)((int64_t)k * size / active) == rank) r->mine = d;
    k++;
  }
  if (!getenv("WEFT_CUDA_DEVICE") || !*getenv("WEFT_CUDA_DEVICE")) local_gpu = local;
  return true;
}

static int mp_new_comm(crun *r, const int *grp, int n, bool p2p) {
  int k = mp_comm(r, grp, n, p2p);
  if (k >= 0) return k;
  k = r->ncomms++;
  r->comm_grp = cx_grow(r->comm_grp, sizeof(int *) * (size_t)r->ncomms);
  r->comm_n = cx_grow(r->comm_n, sizeof(int) * (size_t)r->ncomms);
  r->comm_p2p = cx_grow(r->comm_p2p, sizeof(bool) * (size_t)r->ncomms);
  r->comm_grp[k] = cx_alloc(sizeof(int) * (size_t)n);
  memcpy(r->comm_grp[k], grp, sizeof(int) * (size_t)n);
  r->comm_n[k] = n, r->comm_p2p[k] = p2p;
  return k;
}

/* The communicators, the same list in every process: one per distinct
 * group of the collectives of more than one device, then one per pair of
 * a sender and its receiver (the sender rank 0). */
static void mp_choose(crun *r) {
  const weft_program *pr = r->pr;
  const weft_plan *p = pr->p;
  r->nccl = true;
  r->comm_of = cx_alloc(sizeof(int) * (size_t)(p->ncomms + 1));
  for (int c = 0; c < p->ncomms; c++) {
    const pcomm *cm = &p->comms[c];
    r->comm_of[c] = -1;
    if (cm->kind == COMM_SEND || cm->ngroup < 2) continue;
    r->comm_of[c] = mp_new_comm(r, cm->group, cm->ngroup, false);
  }
  for (int d = 0; d < pr->nprogs; d++)
    for (int i = 0; i < pr->progs[d].n; i++) {
      const lins *in = &pr->progs[d].ins[i];
      int grp[2] = {d, in->peer};
      if (in->kind == LI_SEND) mp_new_comm(r, grp, 2, true);
    }
}

static void mp_group(const crun *r, int k, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = 0;
  if (!r->comm_grp) {
    snprintf(buf, n, "[%d]", r->comm_dev ? r->comm_dev[k] : -1);
    return;
  }
  for (int i = 0; i < r->comm_n[k] && at + 16 < n; i++)
    at += (size_t)snprintf(buf + at, n - at, "%s%d", i ? ", " : "[", r->comm_grp[k][i]);
  snprintf(buf + at, n - at, "]");
}

/* The world communicator from process 0's id, shared through MPI or the
 * file of --rendezvous; then every group's, split from it (every process
 * takes part in every split), their streams and the ops' events. */
static bool mp_open(crun *r, char *err, size_t errlen) {
  char e[512], g[256];
  double t = r->o.timeout_s;
  if (!ccl_available(r->ccl_what, sizeof r->ccl_what))
    return failf(err, errlen, 2, "process %d of %d: %s", r->rank, r->nprocs, r->ccl_what);
  unsigned char id[CCL_ID_BYTES];
  memset(id, 0, sizeof id);
  if (r->rank == 0 && !ccl_unique_id(id, e, sizeof e)) return failf(err, errlen, 2, "process 0: %s", e);
  rdv rv;
  const char *spec = r->o.rendezvous && *r->o.rendezvous ? r->o.rendezvous : r->mpi ? "mpi" : NULL;
  if (!spec)
    return failf(err, errlen, 1,
                 "process %d of %d was not started by mpirun: the processes share the NCCL communicator's id through "
                 "a file on a shared file system (--rendezvous file:PATH)",
                 r->rank, r->nprocs);
  if (!rdv_parse(spec, &rv, e, sizeof e)) return failf(err, errlen, 1, "%s", e);
  if (!rdv_share(&rv, r->rank, r->nprocs, id, CCL_ID_BYTES, t, r->mpi ? rdv_mpi_bcast : NULL, r->mpi, e, sizeof e))
    return failf(err, errlen, 2, "process %d of %d: %s", r->rank, r->nprocs, e);
  if (!(r->world = ccl_init(id, r->nprocs, r->rank, t, e, sizeof e)))
    return failf(err, errlen, 2, "process %d of %d, GPU %d (%s): %s", r->rank, r->nprocs, r->gpu, r->props.name, e);
  rdv_done(&rv, r->rank);
  r->comms = cx_alloc(sizeof(ccl_comm *) * (size_t)(r->ncomms + 1));
  r->cstream = cx_alloc(sizeof(gpu_stream *) * (size_t)(r->ncomms + 1));
  r->cend = cx_alloc(sizeof(gpu_event *) * (size_t)(r->ncomms + 1));
  for (int k = 0; k < r->ncomms; k++) {
    int color = -1, key = 0;
    for (int i = 0; i < r->comm_n[k]; i++)
      if (r->comm_grp[k][i] == r->mine) color = k, key = i;
    mp_group(r, k, g, sizeof g);
    if (!ccl_split(r->world, color, key, t, &r->comms[k], e, sizeof e))
      return failf(err, errlen, 2, "process %d of %d, the communicator of group %s: %s", r->rank, r->nprocs, g, e);
    if (r->comms[k] && (!(r->cstream[k] = gpu_stream_new(e, sizeof e)) || !(r->cend[k] = gpu_event_new(e, sizeof e))))
      return failf(err, errlen, 2, "GPU %d: %s", r->gpu, e);
  }
  if (!(r->wstream = gpu_stream_new(e, sizeof e)) || !(r->wdone = gpu_event_new(e, sizeof e)))
    return failf(err, errlen, 2, "GPU %d: %s", r->gpu, e);
  int64_t mirror = 1;
  for (int k = 0; k < 2; k++) {
    if (r->plan[k].built && r->plan[k].mirror_bytes > mirror) mirror = r->plan[k].mirror_bytes;
    for (int j = 0; r->plan[k].built && j < r->plan[k].ncops; j++) {
      cclop *op = &r->plan[k].cops[j];
      if (!(op->in = gpu_event_new(e, sizeof e)) || !(op->out = gpu_event_new(e, sizeof e)))
        return failf(err, errlen, 2, "GPU %d: %s", r->gpu, e);
    }
  }
  if (!(r->mirror = gpu_alloc((size_t)mirror, e, sizeof e)))
    return failf(err, errlen, 2, "GPU %d (%s), the copies of other processes' messages: %s", r->gpu, r->props.name, e);
  return true;
}

/* The end of a pass waits for the communicators' streams too (a send or a
 * broadcast's root that compute did not wait for). */
static void mp_join(crun *r) {
  gpu_stream *s = r->dev[r->mine].stream;
  for (int k = 0; k < r->ncomms; k++)
    if (r->cstream && r->cstream[k]) gpu_record(r->cend[k], r->cstream[k]), gpu_wait(s, r->cend[k]);
}

/* Whether the process that started this one is gone: a wait for the
 * others would never end, nobody being left to end it. */
static bool mp_orphaned(crun *r, char *err, size_t errlen) {
  if (r->mine < 0 || r->parent <= 1 || (long)getppid() == r->parent) return false;
  comm_abort(r);
  r->hung = true;
  failf(err, errlen, 2, "process %d of %d: the process that started this one (%ld, mpirun or srun) is gone", r->rank,
        r->nprocs, r->parent);
  return true;
}

/* Waits for the world stream's work, at most --timeout; past it, the
 * communicators are aborted. */
static bool mp_settle(crun *r, const char *what, char *err, size_t errlen) {
  char e[512];
  gpu_record(r->wdone, r->wstream);
  double t0 = now();
  long nap_us = 20;
  for (;;) {
    int k = gpu_event_done(r->wdone, e, sizeof e);
    if (k < 0) return failf(err, errlen, 2, "GPU %d (%s), %s: %s", r->gpu, r->props.name, what, e);
    if (k > 0) return true;
    if (mp_orphaned(r, err, errlen)) return false;
    if (r->o.timeout_s > 0 && now() - t0 > r->o.timeout_s) {
      comm_abort(r);
      r->hung = true;
      return failf(err, errlen, 2,
                   "process %d of %d, GPU %d (%s): %s through the world communicator (processes 0 to %d) did not "
                   "finish within %g s (--timeout); the communicators were aborted (ncclCommAbort)",
                   r->rank, r->nprocs, r->gpu, r->props.name, what, r->nprocs - 1, r->o.timeout_s);
    }
    struct timespec ts = {0, nap_us * 1000};
    nanosleep(&ts, NULL);
    if (nap_us < 1000) nap_us *= 2;
  }
}

/* host[0 .. n) of type dt reduced over every process by op, in place. */
static bool mp_world(crun *r, void *host, int64_t n, int dt, int op, const char *what, char *err, size_t errlen) {
  char e[512];
  size_t bytes = (size_t)n * (dt == CCL_F64 ? 8 : (size_t)gpu_dtype_size(dt));
  void *d = gpu_alloc(bytes ? bytes : 1, e, sizeof e);
  if (!d) return failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
  bool ok = gpu_upload(d, host, bytes, r->wstream, e, sizeof e) ||
            failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
  ok = ok && ccl_all_reduce_op(r->world, d, d, n, dt, op, r->wstream, err, errlen);
  ok = ok && mp_settle(r, what, err, errlen);
  ok = ok && (gpu_download(host, d, bytes, r->wstream, e, sizeof e) ||
              failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e));
  if (!r->hung) gpu_free(d);
  return ok;
}

/* Each element from the lowest process that wrote it (a sum with zeros
 * elsewhere, which is exact), or the world's where none did. */
static bool mp_merge(crun *r, float *vals, const float *seen, int64_t n, char *err, size_t errlen) {
  float *owner = cx_alloc(sizeof(float) * (size_t)(n + 1));
  float me = (float)(r->nprocs - r->rank);
  for (int64_t i = 0; i < n; i++) owner[i] = seen && seen[i] != 0.0f ? me : 0.0f;
  bool ok = mp_world(r, owner, n, GPU_F32, CCL_MAX, "the owners of the parameters", err, errlen);
  for (int64_t i = 0; ok && i < n; i++)
    if (!(owner[i] == me || (owner[i] == 0.0f && r->rank == 0))) vals[i] = 0.0f;
  ok = ok && mp_world(r, vals, n, GPU_F32, CCL_SUM, "the parameters", err, errlen);
  free(owner);
  return ok;
}

/* What mp_copies_agree found over the parameters. */
typedef struct copies_found {
  int tensors;         /* parameters whose copies differ */
  int64_t elements;    /* elements that differ */
  double worst;        /* the largest relative difference */
  char names[160];     /* the first of those parameters */
} copies_found;

/* Whether the processes that hold copies of the same elements of
 * parameter t (a computation replicated across processes, such as an LM
 * head replicated over a tensor-parallel group) hold the same bits; what
 * differs is added to *f, and the lowest process's copy is kept
 * (mp_merge). Copies agree when their kernels do on every GPU: under
 * --deterministic always (no kernel chosen by timing, no sums by
 * atomics); otherwise the choices of kernels are agreed between the
 * processes (choice.h), but sums in an order that can change (split
 * reductions, fa-atomic), GPUs of different models or WEFT_CUDA_AGREE=0
 * may still let them drift apart by rounding. */
static bool mp_copies_agree(crun *r, int t, const float *vals, const float *seen, int64_t n, copies_found *f,
                            char *err, size_t errlen) {
  float *hi = cx_alloc(sizeof(float) * (size_t)(2 * n + 1)), *lo = hi + n;
  for (int64_t i = 0; i < n; i++) {
    bool mine = seen && seen[i] != 0.0f;
    hi[i] = mine ? vals[i] : -INFINITY, lo[i] = mine ? -vals[i] : -INFINITY;
  }
#ifdef WEFT_CUDA_EMU
  /* tests: WEFT_CUDA_EMU_SKEW=P has process P's copies compared one step
   * of rounding off (its values are left as they are) */
  const char *skew = getenv("WEFT_CUDA_EMU_SKEW");
  if (skew && *skew && atoi(skew) == r->rank)
    for (int64_t i = 0; i < n; i++)
      if (seen && seen[i] != 0.0f) hi[i] = nextafterf(hi[i], INFINITY), lo[i] = -hi[i];
#endif
  /* two reductions of n, so that the device holds no more for them than
   * mp_merge does */
  bool ok = mp_world(r, hi, n, GPU_F32, CCL_MAX, "the copies of the parameters", err, errlen) &&
            mp_world(r, lo, n, GPU_F32, CCL_MAX, "the copies of the parameters", err, errlen);
  int64_t differ = 0;
  for (int64_t i = 0; ok && i < n; i++) {
    if (hi[i] == -INFINITY || isnan(hi[i]) || isnan(lo[i]) || hi[i] == -lo[i]) continue;
    differ++;
    double d = fabs((double)hi[i] + (double)lo[i]), m = fmax(fabs((double)hi[i]), fabs((double)lo[i]));
    if (m > 0 && d / m > f->worst) f->worst = d / m;
  }
  if (differ) {
    size_t k = strlen(f->names);
    if (f->tensors < 3) snprintf(f->names + k, sizeof f->names - k, "%s%s", k ? ", " : "", r->g->tensors[t].name);
    f->tensors++, f->elements += differ;
  }
  free(hi);
  return ok;
}

/* Every process ends with the whole world (crun_read). */
static bool mp_gather(crun *r, float **seen, float **sseen, char *err, size_t errlen) {
  const weft_graph *g = r->g;
  bool ok = true;
  copies_found f = {0};
  for (int t = 0; ok && t < g->ntensors; t++) {
    if (!r->w->param[t]) continue;
    int64_t n = cx_tensor_numel(&g->tensors[t]);
    ok = mp_copies_agree(r, t, r->w->param[t], seen[t], n, &f, err, errlen) &&
         mp_merge(r, r->w->param[t], seen[t], n, err, errlen);
    for (int c = 0; ok && c < r->w->state_copies; c++) ok = mp_merge(r, r->w->state[t] + c * n, sseen[t], n, err, errlen);
  }
  if (ok && f.tensors && r->rank == 0)
    fprintf(stderr,
            "weft run: warning: the processes' copies of %d parameter%s (%s%s) differ in %" PRId64
            " element%s, by at most %.2g relative: a computation replicated across processes whose kernels do not "
            "give the same bits on every GPU (sums in an order that can change, GPUs of different models, or "
            "each process's own choices under WEFT_CUDA_AGREE=0; --deterministic makes them agree); the lowest "
            "process's copies are kept\n",
            f.tensors, f.tensors == 1 ? "" : "s", f.names, f.tensors > 3 ? ", ..." : "", f.elements,
            f.elements == 1 ? "" : "s", f.worst);
  return ok;
}

/* A failure of one process ends every process: MPI_Abort under mpirun
 * (without MPI, each process ends at its own --timeout). */
static void mp_abort(crun *r, const char *err) {
  if (!r->mpi) return;
  fprintf(stderr, "weft run: process %d: %s\n", r->rank, err);
  fflush(stdout);
  fflush(stderr);
  /* should mpirun be unable to end the run (it is gone), this one still ends */
  signal(SIGALRM, SIG_DFL);
  alarm(5);
  rdv_mpi_abort(r->mpi, 2);
  _exit(2);
}

bool crun_agree(crun *r, bool ok) {
  if (r->mine < 0) return ok;
  int32_t v = ok ? 0 : 1;
  char err[512];
  if (!mp_world(r, &v, 1, GPU_I32, CCL_MAX, "the processes' meeting", err, sizeof err)) mp_abort(r, err);
  return v == 0;
}

static void mp_close(crun *r, bool gpu) {
  for (int k = 0; k < r->ncomms && r->comm_grp; k++) free(r->comm_grp[k]);
  for (int k = 0; gpu && r->cend && k < r->ncomms; k++) gpu_event_free(r->cend[k]);
  if (gpu && r->wstream) gpu_stream_free(r->wstream), gpu_event_free(r->wdone), gpu_free(r->mirror);
  free(r->comm_grp), free(r->comm_n), free(r->comm_p2p), free(r->cend);
}

/* ---- planning ------------------------------------------------------------------------------------ */

typedef struct share {
  const lins *in;
  int device, at;
} share;

static int share_cmp(const void *x, const void *y, void *ctx) {
  const weft_program *pr = ctx;
  const share *a = x, *b = y;
  int oa = lower_compute_op(pr, a->in), ob = lower_compute_op(pr, b->in);
  if (oa != ob) return oa - ob;
  if (a->in->mb != b->in->mb) return a->in->mb - b->in->mb;
  const irange *ra = lower_compute_ranges(pr, a->in), *rb = lower_compute_ranges(pr, b->in);
  for (int i = 0; i < lower_op_idims(pr, oa); i++) {
    if (ra[i].lo != rb[i].lo) return ra[i].lo < rb[i].lo ? -1 : 1;
    if (ra[i].hi != rb[i].hi) return ra[i].hi < rb[i].hi ? -1 : 1;
  }
  return a->device != b->device ? a->device - b->device : a->at - b->at;
}

/* The shares of the loss: one slot per part of a loss operator, written
 * by the first of its copies (replicas compute the same share). */
static void loss_slots(crun *r) {
  const weft_program *pr = r->pr;
  int n = 0, cap = 16;
  share *sh = cx_alloc(sizeof(share) * (size_t)cap);
  for (int dv = 0; dv < pr->nprogs; dv++)
    for (int i = 0; i < pr->progs[dv].n; i++) {
      const lins *in = &pr->progs[dv].ins[i];
      if (in->kind != LI_COMPUTE || in->dir != DIR_FORWARD || in->recompute || in->part == LP_STATS ||
          !ckernel_is_loss(r->kern[lower_compute_op(pr, in)]))
        continue;
      if (n == cap) sh = cx_grow(sh, sizeof(share) * (size_t)(cap *= 2));
      sh[n++] = (share){in, dv, i};
    }
  qsort_r(sh, (size_t)n, sizeof(share), share_cmp, (void *)pr);
  r->nslots = 0;
  for (int k = 0; k < n; k++) {
    bool copy = k > 0 && lower_same_part(pr, sh[k - 1].in, sh[k].in);
    if (!copy) r->dev[sh[k].device].slot[sh[k].at] = r->nslots++;
  }
  free(sh);
}

bool crun_optimizer(const weft_graph *g, int *kind, gpu_optim *o, char *err, size_t errlen) {
  if (!g->optimizer) return failf(err, errlen, 1, "model %s does not train: it has no `train` statement", g->name);
  if (strcmp(g->optimizer, "adamw") == 0) *kind = 1;
  else if (strcmp(g->optimizer, "sgd") == 0) *kind = 0;
  else return failf(err, errlen, 1, "the CUDA backend has no optimizer %s", g->optimizer);
  weft_optim_settings st = graph_optimizer_settings(g);
  *o = (gpu_optim){st.lr, st.beta1, st.beta2, st.eps, st.weight_decay, st.momentum};
  return true;
}

/* The GPU of this process: WEFT_CUDA_DEVICE, or the first. */
bool crun_gpu(int *gpu, gpu_props *p, char *err, size_t errlen) {
  char e[400];
  int n = gpu_count(e, sizeof e);
  if (n < 0) return failf(err, errlen, 2, "%s", e);
  const char *env = getenv("WEFT_CUDA_DEVICE");
  *gpu = env && *env ? atoi(env) : local_gpu >= 0 ? local_gpu : 0;
  if (!(env && *env) && *gpu >= n)
    return failf(err, errlen, 2, "this process is process %d of its machine, but there %s %d CUDA device%s (one GPU a process)",
                 *gpu, n == 1 ? "is" : "are", n, n == 1 ? "" : "s");
  if (*gpu < 0 || *gpu >= n)
    return failf(err, errlen, 2, "WEFT_CUDA_DEVICE=%s, but there %s %d CUDA device%s", env, n == 1 ? "is" : "are", n,
                 n == 1 ? "" : "s");
  if (!gpu_properties(*gpu, p, e, sizeof e) || !gpu_use(*gpu, e, sizeof e))
    return failf(err, errlen, 2, "GPU %d: %s", *gpu, e);
  if (p->major < 8)
    return failf(err, errlen, 2,
                 "unsupported GPU: GPU %d (%s) has compute capability %d.%d; the CUDA backend is built for 8.0 and "
                 "later",
                 *gpu, p->name, p->major, p->minor);
  return true;
}

bool crun_probe(char *msg, size_t n) {
  int gpu;
  gpu_props p;
  char err[512];
  if (!crun_gpu(&gpu, &p, err, sizeof err)) {
    snprintf(msg, n, "%s", err);
    return false;
  }
  char t[32], f[32];
  int k = snprintf(msg, n, "GPU %d: %s (compute capability %d.%d), %s, %s free", gpu, p.name, p.major, p.minor,
                   crun_bytes(t, sizeof t, (double)p.total), crun_bytes(f, sizeof f, (double)p.free));
  /* which kernels run attention, and the cuDNN it would load (not on the
   * emulation, which has no cuDNN) */
  char at[384];
  gpu_attention_about(at, sizeof at);
  if (k > 0 && (size_t)k < n) k += snprintf(msg + k, n - (size_t)k, "; attention: %s", at);
#ifndef WEFT_CUDA_EMU
  char dn[768];
  gpu_cudnn_about(dn, sizeof dn);
  if (k > 0 && (size_t)k < n) snprintf(msg + k, n - (size_t)k, "; cuDNN: %s", dn);
#endif
  return true;
}

/* gpu: whether the GPU's streams, events and memory are freed too */
static void plan_free(cplan *P, bool gpu) {
  for (int k = 0; gpu && P->ev && k < P->s.nevents; k++) gpu_event_free(P->ev[k]);
  for (int k = 0; gpu && k < P->ncops; k++) gpu_event_free(P->cops[k].in), gpu_event_free(P->cops[k].out);
  free(P->cops), free(P->parts), free(P->xfers), free(P->mirror_off), free(P->alias);
  sched_free(&P->s);
  free(P->ev), free(P->acts), free(P->srcs), free(P->calls), free(P->steps), free(P->first), free(P->count);
  free(P->groups), free(P->ments), free(P->mtab);
  memset(P, 0, sizeof *P);
}

void crun_close(crun *r) {
  if (!r) return;
  /* a GPU still running a kernel that hangs would hold every free and
   * synchronization: its resources go with the process (the emulation's
   * never hang) */
  bool gpu = !r->hung || gpu_emulated();
  char e[256];
  if (gpu) gpu_sync(e, sizeof e);
  for (int d = 0; r->dev && d < r->pr->nprogs; d++) {
    cvdev *v = &r->dev[d];
    if (gpu) gpu_stream_free(v->stream), gpu_event_free(v->done), gpu_free(v->pool);
    free(v->slot), free(v->stepped), free(v->first);
  }
  comm_close(r, gpu);
  mp_close(r, gpu);
  choice_among(-1, 0);
  for (int k = 0; k < 2; k++) plan_free(&r->plan[k], gpu);
  if (gpu) {
    gpu_free(r->inputs), gpu_free(r->slots), gpu_free(r->tables), gpu_free(r->masks), gpu_free(r->norms);
    gpu_free(r->coef), gpu_free(r->mtab), gpu_free(r->mparts);
  }
  if (r->own) clip_owners_free(r->pr, r->own);
  if (r->keep)
    for (int d = 0; d < r->pr->nprogs; d++) free(r->keep[d]);
  free(r->keep);
  for (int i = 0; gpu && i < r->ntev; i++) gpu_event_free(r->tev[i]);
  free(r->tev), free(r->traced);
  nvtx_free(r->nv[0]), nvtx_free(r->nv[1]);
  free(r->pitch), free(r->pbytes), free(r->share);
  free(r->dev), free(r->kern), free(r->input_off), free(r->tab.v), free(r->mask_at), free(r->ins_base);
  if (r->mpi) rdv_mpi_close(r->mpi);
  free(r);
}

/* ---- what a forward keeps for its backward --------------------------------------------- */

static bool writes(const lins *in, int buf) {
  if ((in->kind == LI_ALLOC || in->kind == LI_FREE) && in->buf == buf) return in->kind == LI_ALLOC;
  for (int j = 0; j < in->nout; j++)
    if (in->out[j].buf == buf) return true;
  return false;
}

/* Pairs each backward compute whose kernels take what a forward keeps
 * (ccall_keep: the attention's per-row log-sum-exp) with the last forward
 * of the same part before it, the recomputation where there is one. The
 * forward's result must be its buffer whole, in the kernels' type, the
 * region of the backward's gradient of it, and written by nothing between
 * the two: the backward reads it there (sched.c holds it past its free). */
static void plan_keep(crun *r) {
  const weft_program *pr = r->pr;
  r->keep = cx_alloc(sizeof(ckeep *) * (size_t)(pr->nprogs + 1));
  for (int d = 0; d < pr->nprogs; d++) {
    const lprog *lp = &pr->progs[d];
    if (!lp->n) continue;
    ckeep *kp = r->keep[d] = cx_alloc(sizeof(ckeep) * (size_t)(lp->n + 1));
    for (int i = 0; i < lp->n; i++) kp[i] = (ckeep){0, -1, -1};
    for (int i = 0; i < lp->n; i++) {
      const lins *bw = &lp->ins[i];
      if (bw->kind != LI_COMPUTE || bw->dir != DIR_BACKWARD || bw->part != LP_WHOLE) continue;
      int op = lower_compute_op(pr, bw);
      const ckernel *k = r->kern[op];
      if (!ckernel_keeps(k)) continue;
      int j = i - 1;
      while (j >= 0 && !(lp->ins[j].kind == LI_COMPUTE && lp->ins[j].dir == DIR_FORWARD &&
                         lower_same_part(pr, &lp->ins[j], bw)))
        j--;
      if (j < 0 || kp[j].pair >= 0) continue;
      const lins *fw = &lp->ins[j];
      const gop *o = &r->g->ops[op];
      int dt = ckernel_dtype(r->g, op), ob = fw->nout == 1 ? fw->out[0].buf : -1;
      if (fw->part != LP_WHOLE || ob < 0 || o->ninputs > CX_MAX_INPUTS) continue;
      if (!cx_equal(&pr->bufs[ob].region, &fw->out[0].region) || pr->bufs[ob].dtype != dt) continue;
      const lref *dy = NULL;
      for (int a = 0; a < bw->nin; a++)
        if (bw->in[a].arg < 0 && bw->in[a].buf >= 0) dy = &bw->in[a];
      if (!dy || !cx_equal(&dy->region, &fw->out[0].region)) continue;
      bool clean = true;
      for (int m = j + 1; m < i && clean; m++) clean = !writes(&lp->ins[m], ob);
      if (!clean) continue;
      ccall c;
      memset(&c, 0, sizeof c);
      c.g = r->g, c.op = op, c.k = k, c.part = LP_WHOLE, c.dt = dt, c.nin = o->ninputs;
      for (int a = 0; a < fw->nin; a++)
        if (fw->in[a].arg >= 0 && fw->in[a].arg < c.nin) c.inr[fw->in[a].arg] = &fw->in[a].region;
      bool all = true;
      for (int a = 0; a < c.nin; a++) all &= c.inr[a] != NULL;
      size_t bytes = all ? ccall_keep(&c) : 0;
      if (!bytes) continue;
      kp[j] = (ckeep){(int64_t)bytes, i, ob};
      kp[i] = (ckeep){0, j, -1};
    }
  }
}

static bool refers(const lins *in, int buf, bool *as_in, bool *as_out) {
  for (int j = 0; j < in->nin; j++)
    if (in->in[j].buf == buf) *as_in = true;
  for (int j = 0; j < in->nout; j++)
    if (in->out[j].buf == buf) *as_out = true;
  return *as_in || *as_out;
}

/* Whether compute `in` writes its outputs: not a backward without the
 * gradient of its result to start from (but a loss's), which does nothing. */
static bool does_write(const lins *in, const ckernel *k) {
  bool dy = false;
  for (int j = 0; j < in->nin; j++) dy |= in->in[j].arg < 0 && in->in[j].buf >= 0 && in->part != LP_COMBINE;
  if (in->part == LP_COMBINE)
    for (int j = 0; j + 1 < in->nin; j++) dy |= in->in[j].arg < 0 && in->in[j].buf >= 0;
  return in->dir != DIR_BACKWARD || dy || ckernel_is_loss(k);
}

/* Whether the first instruction after alloc `at` that touches buf writes
 * all of it before anything reads it: a compute whose outputs are its
 * buffers whole, in its type, not added to (and not a backward that has
 * no gradient to start from), or a receive of the whole buffer. Then the
 * alloc need not clear it. */
static bool overwritten(const crun *r, int dev, int at, int buf) {
  const lprog *lp = &r->pr->progs[dev];
  const lbuf *b = &r->pr->bufs[buf];
  for (int i = at + 1; i < lp->n; i++) {
    const lins *in = &lp->ins[i];
    if (in->kind == LI_ALLOC || in->kind == LI_FREE) {
      if (in->buf == buf) return false;
      continue;
    }
    bool as_in = false, as_out = false;
    if (!refers(in, buf, &as_in, &as_out)) continue;
    if (as_in) return false;
    if (in->kind == LI_RECV) return cx_equal(&in->out[0].region, &b->region);
    if (in->kind != LI_COMPUTE || in->accumulate) return false;
    int op = lower_compute_op(r->pr, in);
    const ckernel *k = r->kern[op];
    int dt = in->part == LP_STATS ? GPU_F32 : ckernel_dtype(r->g, op);
    if (!does_write(in, k)) return false;
    for (int j = 0; j < in->nout; j++) {
      const lref *o = &in->out[j];
      if (o->buf < 0 || !cx_equal(&r->pr->bufs[o->buf].region, &o->region) || r->pr->bufs[o->buf].dtype != dt)
        return false;
    }
    return true;
  }
  return false;
}

/* Several processes: per event, the stream operation that records it
 * (-1 none); the plan's aliases start empty. */
static int *mp_events(crun *r) {
  cplan *P = r->P;
  int *rec = cx_alloc(sizeof(int) * (size_t)(P->s.nevents + 1));
  P->alias = cx_alloc(sizeof(int) * (size_t)(P->s.nevents + 1));
  for (int e = 0; e < P->s.nevents; e++) rec[e] = P->alias[e] = -1;
  for (int k = 0; k < P->s.nops; k++)
    if (P->s.ops[k].kind == SO_RECORD) rec[P->s.ops[k].arg] = k;
  return rec;
}

/* The plan device whose stream runs op so: with several processes, each
 * takes the clipping factor itself (mp_norm). */
static int op_dev(const crun *r, const sop *so) { return so->kind == SO_NORM && r->mine >= 0 ? r->mine : so->dev; }

/* Several processes, to clip: each counted what its device owns of the
 * gradients (clip_owners over every process's device, so that a copy of a
 * parameter on several counts once) into its entry of the devices' sums of
 * squares, the others' zero; an all-reduce of them over the world
 * communicator gives every process all of them before it takes the factor
 * from their sum, as the one process's first device does. */
static void mp_norm(crun *r) {
  cplan *P = r->P;
  int op = mp_op(r, -1, COMM_ALL_REDUCE, r->mine, -1);
  if (P->nparts == P->pcap) {
    P->pcap = P->pcap ? 2 * P->pcap : 64;
    P->parts = cx_grow(P->parts, sizeof(cclpart) * (size_t)P->pcap);
  }
  P->cops[op].at = (caddr){ADDR_NORMS, 0};
  P->cops[op].first = P->nparts, P->cops[op].nparts = 1;
  P->parts[P->nparts++] = (cclpart){0, r->pr->nprogs, CCL_F64};
}

static bool prepare(crun *r) {
  r->P->first = cx_alloc(sizeof(int) * (size_t)(r->P->s.nops + 1));
  r->P->count = cx_alloc(sizeof(int) * (size_t)(r->P->s.nops + 1));
  int *rec = r->mine >= 0 ? mp_events(r) : NULL;
  for (int k = 0; k < r->P->s.nops && !r->pfail; k++) {
    const sop *so = &r->P->s.ops[k];
    r->P->first[k] = r->P->nacts;
    r->P->count[k] = 0;
    if (!here(r, op_dev(r, so))) continue;  /* another process's */
    const lins *in = so->ins >= 0 ? &r->pr->progs[so->dev].ins[so->ins] : NULL;
    switch (so->kind) {
    case SO_ZERO: {
      const lbuf *b = &r->pr->bufs[so->arg];
      if ((b->persistent || !overwritten(r, so->dev, so->ins, so->arg)) && !(r->dev[so->dev].first[so->ins] & NO_CLEAR))
        add_zero(r, buf_addr(r, so->dev, so->arg), r->pbytes && r->pbytes[so->arg] ? r->pbytes[so->arg] : b->bytes ? b->bytes : 1);
      break;
    }
    case SO_INPUT: {
      const lbuf *b = &r->pr->bufs[so->arg];
      const gtensor *t = &r->g->tensors[b->tensor];
      dregion dims[GPU_MAX_DIMS];
      irange iv[GPU_MAX_DIMS];
      if (t->ndims > GPU_MAX_DIMS || r->input_off[b->tensor] < 0) {
        plan_fail(r, "input %s cannot be loaded", t->name);
        break;
      }
      tregion whole = cx_whole(t, dims, iv);
      add_move(r, buf_addr(r, so->dev, so->arg), b->dtype, &b->region, (caddr){ADDR_INPUTS, r->input_off[b->tensor]},
               t->dtype == DT_I32 ? GPU_I32 : GPU_F32, &whole, &b->region, false);
      break;
    }
    case SO_INS:
      if (in->kind == LI_COMPUTE) prep_compute(r, so->dev, so->ins, so->ws, true);
      else if (in->kind == LI_COPY) prep_copy(r, so->dev, so->ins, true);
      else if (in->kind == LI_STEP) prep_step(r, so->dev, so->ins, so->ws, true);
      break;
    case SO_SEND:
      prep_send(r, so);
      if (rec) mp_send(r, k, so);
      break;
    case SO_RECV: prep_recv(r, so); break;
    case SO_PACK:
      prep_pack(r, so);
      if (rec) mp_pack(r, so);
      break;
    case SO_WAIT:
      if (rec) mp_wait(r, so, rec);
      break;
    case SO_REDUCE: prep_reduce(r, so); break;
    case SO_NORM_PART: prep_norm_part(r, so->dev, so->ins); break;
    case SO_NORM:
      if (r->mine >= 0) mp_norm(r);
      new_act(r, A_NORM);
      break;
    default: break;
    }
    r->P->count[k] = r->P->nacts - r->P->first[k];
  }
  free(rec);
  return !r->pfail;
}

/* ---- calls fused ------------------------------------------------------------------------------ */

/* The buffer of the result (arg -1) or input arg among refs, -1 none. */
static const lref *ref_at(const lref *refs, int n, int arg) {
  for (int j = 0; j < n; j++)
    if (refs[j].arg == arg) return &refs[j];
  return NULL;
}

static int ref_buf(const lref *refs, int n, int arg) {
  const lref *r = ref_at(refs, n, arg);
  return r ? r->buf : -1;
}

static bool same_addr(caddr a, caddr b) { return a.dev == b.dev && a.off == b.off; }

/* Whether call pc is given buffer buf itself (direct) at p. */
static bool direct_at(const crun *r, const pcall *pc, caddr p, int buf) {
  return buf >= 0 && p.dev >= 0 && same_addr(p, buf_addr(r, pc->dev, buf));
}

/* The elements a region takes laid out with rows `pitch` apart (0: packed). */
static int64_t span(const tregion *rg, int64_t pitch) {
  if (!rg) return 0;
  int64_t n = cx_numel(rg), last = rg->ndims ? cx_dlen(&rg->dims[rg->ndims - 1]) : 1;
  return pitch && last ? n / last * pitch : n;
}

/* Whether bytes [p, p + n) of a pool meet anything call pc reads or
 * writes; late: but what it is done with before its last product (a
 * linear's backward fused: its input x, its scratch) and its din[0]. */
static bool call_meets(const pcall *pc, caddr p, int64_t n, bool late) {
  const ccall *c = &pc->c;
  caddr at[2 * CX_MAX_INPUTS + 3];
  int64_t len[2 * CX_MAX_INPUTS + 3];
  int k = 0;
  for (int a = 0; a < c->nin; a++) {
    int64_t e = c->inr[a] ? cx_numel(c->inr[a]) : 0;
    at[k] = a == 0 && late ? NOWHERE : pc->in[a];
    len[k++] = (a == 0 ? span(c->inr[a], c->pitch_in0) : e) * (ckernel_ids(c->k, a) ? 4 : gpu_dtype_size(c->dt));
    at[k] = a == 0 && late ? NOWHERE : pc->din[a];
    len[k++] = (a == 0 ? span(c->inr[a], c->pitch_din0) : e) * (c->f32din >> a & 1u ? 4 : gpu_dtype_size(c->dt));
  }
  at[k] = pc->out, len[k++] = span(c->outr, c->pitch_out) * gpu_dtype_size(c->dt);
  at[k] = pc->dy, len[k++] = span(c->dyr, c->pitch_dy) * gpu_dtype_size(c->dt);
  at[k] = late ? NOWHERE : pc->ws, len[k++] = (int64_t)ccall_ws(c);
  for (int j = 0; j < k; j++)
    if (at[j].dev == p.dev && at[j].dev >= 0 && len[j] > 0 && at[j].off < p.off + n && p.off < at[j].off + len[j]) {
      return true;
    }
  return false;
}

/* Whether buffer buf of dev's program is read or written by any
 * instruction but ins_w (its writer) and ins_r (its reader). */
static bool used_elsewhere(const crun *r, int dev, int buf, int ins_w, int ins_r) {
  const lprog *pg = &r->pr->progs[dev];
  for (int i = 0; i < pg->n; i++) {
    const lins *in = &pg->ins[i];
    if (i == ins_w || i == ins_r || in->kind == LI_ALLOC || in->kind == LI_FREE) continue;
    for (int j = 0; j < in->nin; j++)
      if (in->in[j].buf == buf) return true;
    for (int j = 0; j < in->nout; j++)
      if (in->out[j].buf == buf) return true;
  }
  return false;
}

/* Whether buffer buf of dev's program is touched by any instruction but
 * ins_w and ins_r, except read by a backward that reads only its result's
 * gradient (ckernel_passes_grad: a residual's add's), or held for a
 * backward (ckeep.hold). */
static bool read_elsewhere(const crun *r, int dev, int buf, int ins_w, int ins_r) {
  const lprog *pg = &r->pr->progs[dev];
  for (int i = 0; i < pg->n; i++) {
    const lins *in = &pg->ins[i];
    if (r->keep && r->keep[dev] && r->keep[dev][i].pair >= 0 && r->keep[dev][i].hold == buf) return true;
    if (i == ins_w || i == ins_r || !touches(in, buf)) continue;
    bool as_in = false, as_out = false;
    refers(in, buf, &as_in, &as_out);
    if (as_out || in->kind != LI_COMPUTE || in->dir != DIR_BACKWARD ||
        !ckernel_passes_grad(r->kern[lower_compute_op(r->pr, in)]))
      return true;
  }
  return false;
}

/* Two calls enqueued back to back on one stream that one product does
 * (ccall_fusion): a linear then the GELU of its result, forward, and
 * their backward; a linear then the residual's add of its result,
 * forward: the product adds the add's other input as it stores (cuBLASLt's
 * C, beta 1) and writes the add's result, and the linear's result is
 * not written at all, so nothing but the add may read it (the add's
 * backward reads only its result's gradient). The second's action goes (A_NONE); the first writes
 * what the second wrote, with nothing in between on the stream (no other
 * action, record or wait), on buffers given as they are. Forward, neither
 * accumulates, and the linear's result is still written (cuBLASLt's aux),
 * as the GELU's backward reads it. Backward, the gradient of the GELU's
 * result is not written, so nothing else may read or write it; the
 * gradient of its input is written, not added to: it is not accumulated,
 * or it was just cleared (the clearing between the two calls, which then
 * goes). What the fused product writes must not meet what the linear's
 * call reads or writes: its memory could have been another buffer's until
 * the GELU (backward, the linear's input x often: the product that writes
 * it runs after those that read x, see linear_backward). */
static void fuse_calls(crun *r) {
  enum { RECORDED = 1, WAITED = 2 };
  cplan *P = r->P;
  int nd = r->pr->nprogs;
  /* per device: its stream's last two actions, and the records and waits
   * between them (gap0) and since the last (gap) */
  int *last = cx_alloc(sizeof(int) * (size_t)(4 * nd + 1)), *before = last + nd, *gap = last + 2 * nd;
  int *gap0 = last + 3 * nd;
  for (int d = 0; d < nd; d++) last[d] = before[d] = -1, gap[d] = gap0[d] = 0;
  for (int k = 0; k < P->s.nops; k++) {
    const sop *so = &P->s.ops[k];
    int d = op_dev(r, so);
    if (!here(r, d)) continue;
    if (so->kind == SO_RECORD) gap[d] |= RECORDED;
    if (so->kind == SO_WAIT) gap[d] |= WAITED;
    for (int j = 0; j < P->count[k]; j++) {
      int ai = P->first[k] + j, prev = last[d], zero = -1, sync = gap[d];
      cact *b = &P->acts[ai];
      if (prev >= 0 && P->acts[prev].kind == A_ZERO) zero = prev, prev = before[d], sync |= gap0[d];
      before[d] = last[d], last[d] = ai, gap0[d] = gap[d], gap[d] = 0;
      if (prev < 0 || b->kind != A_CALL || P->acts[prev].kind != A_CALL || sync == (RECORDED | WAITED)) continue;
      pcall *pa = &P->calls[P->acts[prev].idx], *pb = &P->calls[b->idx];
      if (pa->dev != pb->dev) continue;
      int epi = ccall_fusion(&pa->c, &pb->c);
      if (epi == GPU_EPI_NONE || (zero >= 0 && epi != GPU_EPI_DGELU) || (epi == GPU_EPI_RESID && !r->fuse_resid))
        continue;
      const lprog *pg = &r->pr->progs[pa->dev];
      const lins *ia = &pg->ins[pa->ins], *ib = &pg->ins[pb->ins];
      caddr dst;  /* what the fused product writes in place of the linear's */
      int64_t bytes = cx_numel(pb->c.inr[0]) * gpu_dtype_size(pb->c.dt);
      int other = -1; /* GPU_EPI_RESID: the add's input that is not the linear's result */
      if (epi == GPU_EPI_RESID) {
        int mid = ref_buf(ia->out, ia->nout, -1);
        other = mid >= 0 && ref_buf(ib->in, ib->nin, 0) == mid ? 1 : mid >= 0 && ref_buf(ib->in, ib->nin, 1) == mid ? 0 : -1;
        if (other < 0 || ref_buf(ib->in, ib->nin, other) == mid || ins_adds(r, pa->dev, pa->ins) ||
            ins_adds(r, pb->dev, pb->ins) || !direct_at(r, pa, pa->out, mid) || pa->c.pitch_out ||
            !same_addr(pb->in[1 - other], pa->out) || !direct_at(r, pb, pb->out, ref_buf(ib->out, ib->nout, -1)) ||
            pb->in[other].dev != pb->dev || read_elsewhere(r, pa->dev, mid, pa->ins, pb->ins))
          continue;
        /* the other input and the result apart */
        caddr o = pb->in[other];
        if (o.off < pb->out.off + bytes && pb->out.off < o.off + bytes) continue;
        dst = pb->out;
      } else if (epi == GPU_EPI_GELU) {
        int mid = ref_buf(ia->out, ia->nout, -1);
        if (ins_adds(r, pa->dev, pa->ins) || ins_adds(r, pb->dev, pb->ins) || !direct_at(r, pa, pa->out, mid) ||
            ref_buf(ib->in, ib->nin, 0) != mid ||
            !same_addr(pb->in[0], pa->out) || !direct_at(r, pb, pb->out, ref_buf(ib->out, ib->nout, -1)))
          continue;
        dst = pb->out;
      } else {
        int mid = ref_buf(ia->out, ia->nout, 0), dx = ref_buf(ib->out, ib->nout, 0);
        if (!direct_at(r, pa, pa->din[0], mid) || ref_buf(ib->in, ib->nin, -1) != mid ||
            !same_addr(pb->dy, pa->din[0]) || !direct_at(r, pb, pb->in[0], ref_buf(ib->in, ib->nin, 0)) ||
            !direct_at(r, pb, pb->din[0], dx) || used_elsewhere(r, pa->dev, mid, pa->ins, pb->ins))
          continue;
        dst = pb->din[0];
        /* the GELU adds to its input's gradient: only to one just cleared */
        const cact *z = zero >= 0 ? &P->acts[zero] : NULL;
        bool badds = ins_adds(r, pb->dev, pb->ins);
        if (badds && !(z && same_addr(z->dst, dst) && z->bytes == bytes)) continue;
        if (!badds && z) continue;
      }
      if (call_meets(pa, dst, bytes, epi == GPU_EPI_DGELU)) continue;
      pa->c.epi = epi;
      if (epi == GPU_EPI_GELU) {
        pa->epi = pb->out;
      } else if (epi == GPU_EPI_RESID) {
        pa->epi = pb->out, pa->epi_in = pb->in[other];
      } else {
        pa->epi = pb->in[0];
        pa->din[0] = pb->din[0];
      }
      if (zero >= 0) P->acts[zero].kind = A_NONE;
      if (P == &r->plan[0]) *(epi == GPU_EPI_RESID ? &r->nresid : &r->nfused) += 1;
      if (sync & WAITED) {
        /* the stream waited between them (memory another stream read, now
         * the GELU's): the fused call runs in the GELU's place; it may pass
         * a wait, not a record (what others wait for is done before it) */
        b->idx = P->acts[prev].idx;
        P->acts[prev].kind = A_NONE;
      } else {
        b->kind = A_NONE;
        last[d] = prev;
      }
      before[d] = -1;
    }
  }
  free(last);
}

/* ---- steps in groups ------------------------------------------------------------------------ */

static int add_ment(cplan *P, pment m) {
  if (P->nments == P->mcap) {
    P->mcap = P->mcap ? 2 * P->mcap : 64;
    P->ments = cx_grow(P->ments, sizeof(pment) * (size_t)P->mcap);
  }
  P->ments[P->nments] = m;
  return P->nments++;
}

/* Groups the steps and sums of squares of each stream that run back to
 * back, in the order run_plan enqueues the work: a group ends at a record
 * or a wait on its stream and at any other work there, so that it is the
 * same work in the same order of its stream, enqueued at its first
 * member's place. A sum of squares of another device's norm starts
 * another group. */
static void fuse_steps(crun *r) {
  cplan *P = r->P;
  int nd = r->pr->nprogs;
  int *open = cx_alloc(sizeof(int) * (size_t)(nd + 1));
  for (int d = 0; d < nd; d++) open[d] = -1;
  for (int k = 0; k < P->s.nops; k++) {
    const sop *so = &P->s.ops[k];
    int d = op_dev(r, so);
    if (!here(r, d)) continue;
    if (so->kind == SO_RECORD || so->kind == SO_WAIT) open[d] = -1;
    int prev = -1;  /* the entry of the sum of squares just before, in this operation */
    for (int j = 0; j < P->count[k]; j++) {
      cact *a = &P->acts[P->first[k] + j];
      if (a->kind != A_STEP && a->kind != A_SUMSQ) {
        open[d] = prev = -1;
        continue;
      }
      if (a->kind == A_STEP && prev >= 0) {
        /* the step whose gradient was just counted: one read of it for both */
        pment *m = &P->ments[prev];
        const pstep *st = &P->steps[a->idx];
        prev = -1;
        if (m->grad.dev == st->grad.dev && m->grad.off == st->grad.off && m->gdt == st->gdt && m->n == st->n) {
          m->step = a->idx;
          a->kind = A_NONE;
          continue;
        }
      }
      prev = -1;
      pment m = {-1, false, NOWHERE, GPU_F32, 0, -1, open[d]};
      int sqdev = -1;
      if (a->kind == A_STEP) {
        const pstep *st = &P->steps[a->idx];
        m.step = a->idx, m.grad = st->grad, m.gdt = st->gdt, m.n = st->n;
      } else {
        sqdev = a->idx;
        m.sq = true, m.grad = a->src, m.gdt = a->src_dt, m.n = a->n, m.mask = a->bytes;
      }
      if (m.group >= 0 && sqdev >= 0 && P->groups[m.group].dev >= 0 && P->groups[m.group].dev != sqdev) m.group = -1;
      if (m.group < 0) {
        if (P->ngroups == P->gcap) {
          P->gcap = P->gcap ? 2 * P->gcap : 32;
          P->groups = cx_grow(P->groups, sizeof(pgroup) * (size_t)P->gcap);
        }
        memset(&P->groups[P->ngroups], 0, sizeof(pgroup));
        P->groups[P->ngroups].dev = -1;
        m.group = open[d] = P->ngroups++;
        a->kind = A_MULTI;
        a->idx = m.group;
      } else {
        a->kind = A_NONE;
      }
      if (sqdev >= 0) P->groups[m.group].dev = sqdev;
      int e = add_ment(P, m);
      P->groups[m.group].n++;
      if (sqdev >= 0) prev = e;
    }
  }
  free(open);
  /* the groups' tables one after another, each in the order of its members */
  P->mtab = cx_alloc(sizeof(gpu_mstep) * (size_t)(P->nments + 1));
  int at = 0;
  for (int g = 0; g < P->ngroups; g++) P->groups[g].first = at, at += P->groups[g].n, P->groups[g].n = 0;
  for (int e = 0; e < P->nments; e++) {
    const pment *m = &P->ments[e];
    pgroup *g = &P->groups[m->group];
    gpu_mstep *t = &P->mtab[g->first + g->n++];
    memset(t, 0, sizeof *t);
    t->n = m->n, t->gdt = m->gdt, t->tag = e;
    t->pdt = m->step >= 0 ? P->steps[m->step].pdt : GPU_F32;
    t->what = (m->step >= 0 ? GPU_MS_STEP : 0) | (m->sq ? GPU_MS_SQ : 0);
  }
  for (int g = 0; g < P->ngroups; g++) {
    pgroup *G = &P->groups[g];
    G->l = gpu_msteps_layout(P->mtab + G->first, G->n);
    G->parts = P->nparts_d;
    P->nparts_d += G->l.parts;
  }
}

/* The device addresses of the groups' tables, once the pools are there. */
static void fill_msteps(crun *r, cplan *P) {
  for (int i = 0; i < P->nments; i++) {
    gpu_mstep *t = &P->mtab[i];
    const pment *m = &P->ments[t->tag];
    t->grad = addr(r, m->grad);
    t->mask = m->sq && m->mask >= 0 ? r->masks + m->mask : NULL;
    if (m->step < 0) continue;
    const pstep *st = &P->steps[m->step];
    t->param = addr(r, st->param);
    t->master = addr(r, st->master);
    /* SGD without momentum keeps no buffer (gpu_sgd) */
    bool state = r->optim == 1 || (st->copies && r->settings.momentum != 0.0);
    t->state = state ? addr(r, st->state) : NULL;
  }
}

/* What a step counts in the norm (backends/cpu/clip.h), its masks as bytes
 * for the device, and the largest part of a gradient a count before the
 * steps moves into scratch. */
static int64_t plan_norm(crun *r, uint8_t **bytes) {
  const weft_program *pr = r->pr;
  bool *want = cx_alloc((size_t)pr->nprogs + 1);
  for (int d = 0; d < pr->nprogs; d++) want[d] = pr->progs[d].n > 0;
  r->own = clip_owners(pr, want);
  free(want);
  r->ins_base = cx_alloc(sizeof(int64_t) * (size_t)(pr->nprogs + 1));
  int64_t total = 0, part = 0;
  for (int d = 0; d < pr->nprogs; d++) r->ins_base[d] = total, total += pr->progs[d].n;
  r->mask_at = cx_alloc(sizeof(int64_t) * (size_t)(total + 1));
  int64_t cap = 0;
  *bytes = NULL;
  for (int d = 0; d < pr->nprogs; d++)
    for (int i = 0; i < pr->progs[d].n; i++) {
      r->mask_at[r->ins_base[d] + i] = -1;
      const lins *in = &pr->progs[d].ins[i];
      if (in->kind != LI_STEP || !r->own[d]) continue;
      const clip_own *o = &r->own[d][i];
      const lbuf *gb = &pr->bufs[in->in[0].buf];
      if (!cx_equal(&gb->region, &in->in[0].region)) {
        int64_t b = cx_numel(&in->in[0].region) * gpu_dtype_size(gb->dtype);
        if (b > part) part = b;
      }
      if (!o->mask) continue;
      if (r->nmask_bytes + o->n > cap) {
        while (r->nmask_bytes + o->n > cap) cap = cap ? 2 * cap : 4096;
        *bytes = cx_grow(*bytes, (size_t)cap);
      }
      memcpy(*bytes + r->nmask_bytes, o->mask, (size_t)o->n);
      r->mask_at[r->ins_base[d] + i] = r->nmask_bytes;
      r->nmask_bytes += o->n;
    }
  return align_up(part);
}

static bool build_plan(crun *r, cplan *P, const csched_cb *cb, bool *const *tail, char *err, size_t errlen) {
  char e[512];
  r->P = P;
  P->clip = tail != NULL;
  r->pfail = false;
  if (!sched_build(&P->s, r->pr, cb, tail, e, sizeof e)) return failf(err, errlen, 1, "%s", r->pfail ? r->perr : e);
  if (!prepare(r)) return failf(err, errlen, 1, "%s", r->perr);
  if (r->fuse_calls) fuse_calls(r);
  if (r->fused) fuse_steps(r);
  P->built = true;
  return true;
}

/* A count in the environment, -1 when unset or not one. */
static int env_count(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) return -1;
  char *end;
  long n = strtol(v, &end, 10);
  return *end || n < 0 || n > 1 << 24 ? -1 : (int)n;
}

static int env_first(const char *const *vars, int n) {
  for (int i = 0; i < n; i++) {
    int v = env_count(vars[i]);
    if (v >= 0) return v;
  }
  return -1;
}

void crun_procs(int *rank, int *size) {
  static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
  static const char *const ranks[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  *rank = 0, *size = 1;
  for (int i = 0; i < 3; i++) {
    int n = env_count(sizes[i]), k = env_count(ranks[i]);
    if (n < 0 && k < 0) continue;
    if (n > 1 && k >= 0 && k < n) *rank = k, *size = n;
    return;
  }
  /* srun without MPI, inside a job step (a batch script is one process) */
  if (env_count("SLURM_STEP_ID") < 0 && env_count("SLURM_STEPID") < 0) return;
  int n = env_count("SLURM_NTASKS"), k = env_count("SLURM_PROCID");
  if (n > 1 && k >= 0 && k < n) *rank = k, *size = n;
}

crun *crun_open(const weft_program *pr, weft_world *w, const backend_opts *o, char *err, size_t errlen) {
  for (int d = 0; d < pr->nprogs; d++)
    if (pr->progs[d].n && !pr->progs[d].ins) {
      failf(err, errlen, 2, "the programs were lowered without their full instructions (lower_opts.full_programs)");
      return NULL;
    }
  crun *r = cx_alloc(sizeof *r);
  r->pr = pr, r->g = lower_graph(pr), r->w = w, r->o = *o;
  choice_wait_limit(o->timeout_s);
  r->P = &r->plan[0];
  r->sync_each = getenv("WEFT_CUDA_SYNC") && strcmp(getenv("WEFT_CUDA_SYNC"), "0") != 0;
  r->fused = !getenv("WEFT_CUDA_FUSED_STEP") || strcmp(getenv("WEFT_CUDA_FUSED_STEP"), "0") != 0;
  r->fuse_calls = !getenv("WEFT_CUDA_FUSE") || strcmp(getenv("WEFT_CUDA_FUSE"), "0") != 0;
  r->fuse_resid = !getenv("WEFT_CUDA_FUSE_RESID") || strcmp(getenv("WEFT_CUDA_FUSE_RESID"), "0") != 0;
  const weft_graph *g = r->g;
  uint8_t *mask_bytes = NULL;
  if (!mp_begin(r, err, errlen)) goto fail;
  /* several processes agree their choices of kernels (choice.h) */
  choice_among(r->mine >= 0 ? r->rank : -1, r->nprocs);
  if (!crun_optimizer(g, &r->optim, &r->settings, err, errlen)) goto fail;
  r->lr0 = r->settings.lr;
  r->kern = cx_alloc(sizeof(const ckernel *) * (size_t)(g->nops + 1));
  r->dev = cx_alloc(sizeof(cvdev) * (size_t)(pr->nprogs + 1));
  for (int d = 0; d < pr->nprogs; d++) {
    const lprog *lp = &pr->progs[d];
    if (!lp->n) continue;
    r->ndev += here(r, d);
    r->dev[d].slot = cx_alloc(sizeof(int) * (size_t)(lp->n + 1));
    for (int i = 0; i < lp->n; i++) r->dev[d].slot[i] = -1;
    r->dev[d].stepped = cx_alloc((size_t)(lp->buf_hi - lp->buf_lo + 1));
    r->dev[d].first = cx_alloc((size_t)lp->n + 1);
    for (int i = 0; i < lp->n; i++) {
      const lins *in = &lp->ins[i];
      if (in->kind != LI_COMPUTE) continue;
      int op = lower_compute_op(pr, in);
      if (!r->kern[op] && !(r->kern[op] = ckernel_find(g, op, err, errlen))) {
        last_failure = 1;
        goto fail;
      }
    }
    if (!getenv("WEFT_CUDA_FIRST_WRITE") || strcmp(getenv("WEFT_CUDA_FIRST_WRITE"), "0") != 0) first_writes(r, d);
  }
  loss_slots(r);
  if (r->mine >= 0) mp_choose(r);
  else if (!comm_choose(r, err, errlen)) goto fail;
  /* the model inputs, whole, as the world holds them */
  r->input_off = cx_alloc(sizeof(int64_t) * (size_t)(g->ntensors + 1));
  for (int t = 0; t < g->ntensors; t++) {
    r->input_off[t] = -1;
    if (g->tensors[t].role != TENSOR_INPUT) continue;
    r->input_off[t] = r->input_bytes;
    r->input_bytes += align_up(cx_tensor_numel(&g->tensors[t]) * 4);
  }
  /* each device keeps apart cuBLASLt's workspace, the norm's, and room
   * for a part of a gradient the norm counts before the steps */
  int64_t part = plan_norm(r, &mask_bytes);
  plan_keep(r);
  if (!getenv("WEFT_CUDA_PAD_ROWS") || strcmp(getenv("WEFT_CUDA_PAD_ROWS"), "0") != 0) pad_rows(r);
  r->share = cx_alloc(sizeof(int) * (size_t)(pr->nbufs + 1));
  for (int b = 0; b < pr->nbufs; b++) r->share[b] = -1;
  if (!getenv("WEFT_CUDA_LOSS_IN_PLACE") || strcmp(getenv("WEFT_CUDA_LOSS_IN_PLACE"), "0") != 0)
    for (int d = 0; d < pr->nprogs; d++)
      if (pr->progs[d].n && here(r, d)) loss_in_place(r, d);
  if (!getenv("WEFT_CUDA_PASS_GRADS") || strcmp(getenv("WEFT_CUDA_PASS_GRADS"), "0") != 0)
    for (int d = 0; d < pr->nprogs; d++)
      if (pr->progs[d].n && here(r, d)) pass_grads(r, d);
  /* the GPU first: a kernel's scratch may be sized by a library that
   * plans for the device it runs on (cuDNN's attention) */
  if (!crun_gpu(&r->gpu, &r->props, err, errlen)) goto fail;
  csched_cb cb = {r, ins_ws, (int64_t)gpu_gemm_ws() + (int64_t)gpu_sumsq_ws() + part, (const ckeep *const *)r->keep,
                  r->pbytes, r->share};
  char e[512];
  if (!build_plan(r, &r->plan[0], &cb, NULL, err, errlen)) goto fail;
  /* the order that takes the norm before the steps, to clip by it */
  bool **tail = clip_tail(pr, e, sizeof e);
  if (!tail || !build_plan(r, &r->plan[1], &cb, tail, r->clip_err, sizeof r->clip_err)) {
    if (!tail) snprintf(r->clip_err, sizeof r->clip_err, "%s", e);
    plan_free(&r->plan[1], true);
  }
  if (tail) clip_tail_free(pr, tail);
  /* build_plan marked the buffers the steps write; the plain plan's count */
  r->P = &r->plan[0];
  for (int k = 0; k < 2; k++)
    if (r->plan[k].built) r->nv[k] = nvtx_new(r->plan[k].s.nops);
  /* everything at once, or nothing: each pool the larger of the two plans' */
  int64_t pools = 0, largest = 0;
  int64_t *pool = cx_alloc(sizeof(int64_t) * (size_t)(pr->nprogs + 1));
  for (int d = 0; d < pr->nprogs; d++) {
    pool[d] = here(r, d) ? r->plan[0].s.pool[d] : 0;
    if (here(r, d) && r->plan[1].built && r->plan[1].s.pool[d] > pool[d]) pool[d] = r->plan[1].s.pool[d];
    pools += align_up(pool[d]);
    if (pool[d] > largest) largest = pool[d];
  }
  /* the groups of steps: their tables and scratch, the plans' one after another */
  int64_t ntab = 0, nparts = 0;
  for (int k = 0; k < 2; k++) {
    cplan *P = &r->plan[k];
    if (!P->built) continue;
    P->tab_at = ntab, P->parts_at = nparts;
    ntab += P->nments, nparts += P->nparts_d;
  }
  r->need = pools + r->input_bytes + align_up((r->nslots + 1) * 8) + align_up(r->tab.n * 4 + 4) +
            align_up(r->nmask_bytes + 1) + align_up((pr->nprogs + 2) * 8) + CX_ALIGN +
            align_up((ntab + 1) * (int64_t)sizeof(gpu_mstep)) + align_up((nparts + 1) * 8);
  if (r->need > r->props.free) {
    char a[32], b[32], c[32];
    failf(err, errlen, 2,
          "GPU %d (%s): the plan needs %s (%d virtual device%s, pools of up to %s), %s free", r->gpu, r->props.name,
          crun_bytes(a, sizeof a, (double)r->need), r->ndev, r->ndev == 1 ? "" : "s",
          crun_bytes(b, sizeof b, (double)largest), crun_bytes(c, sizeof c, (double)r->props.free));
    free(pool);
    goto fail;
  }
  for (int d = 0; d < pr->nprogs; d++) {
    if (!pr->progs[d].n || !here(r, d)) continue;
    cvdev *v = &r->dev[d];
    if (!(v->pool = gpu_alloc((size_t)pool[d], e, sizeof e))) {
      failf(err, errlen, 2, "GPU %d (%s), the pool of plan device %d: %s", r->gpu, r->props.name, d, e);
      free(pool);
      goto fail;
    }
    if (!(v->stream = gpu_stream_new(e, sizeof e)) || !(v->done = gpu_event_new(e, sizeof e))) {
      failf(err, errlen, 2, "GPU %d: %s", r->gpu, e);
      free(pool);
      goto fail;
    }
    char sn[48];
    snprintf(sn, sizeof sn, "weft device %d", d);
    nvtx_name_stream(r->nv[0], v->stream, sn);
  }
  free(pool);
  if (!(r->inputs = gpu_alloc((size_t)(r->input_bytes + 4), e, sizeof e)) ||
      !(r->slots = gpu_alloc((size_t)((r->nslots + 1) * 8), e, sizeof e)) ||
      !(r->tables = gpu_alloc((size_t)(r->tab.n * 4 + 4), e, sizeof e)) ||
      !(r->masks = gpu_alloc((size_t)(r->nmask_bytes + 1), e, sizeof e)) ||
      !(r->norms = gpu_alloc((size_t)(pr->nprogs + 2) * 8, e, sizeof e)) ||
      !(r->coef = gpu_alloc(CX_ALIGN, e, sizeof e)) ||
      !(r->mtab = gpu_alloc((size_t)(ntab + 1) * sizeof(gpu_mstep), e, sizeof e)) ||
      !(r->mparts = gpu_alloc((size_t)(nparts + 1) * 8, e, sizeof e))) {
    failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
    goto fail;
  }
  for (int k = 0; k < 2; k++) {
    cplan *P = &r->plan[k];
    if (!P->built) continue;
    P->ev = cx_alloc(sizeof(gpu_event *) * (size_t)(P->s.nevents + 1));
    for (int j = 0; j < P->s.nevents; j++)
      if (!(P->ev[j] = gpu_event_new(e, sizeof e))) {
        failf(err, errlen, 2, "GPU %d: %s", r->gpu, e);
        goto fail;
      }
  }
  if (r->mine >= 0 ? !mp_open(r, err, errlen) : !comm_open(r, err, errlen)) goto fail;
  if ((r->tab.n && !gpu_upload(r->tables, r->tab.v, (size_t)r->tab.n * 4, NULL, e, sizeof e)) ||
      (r->nmask_bytes && !gpu_upload(r->masks, mask_bytes, (size_t)r->nmask_bytes, NULL, e, sizeof e))) {
    failf(err, errlen, 2, "GPU %d: %s", r->gpu, e);
    goto fail;
  }
  for (int k = 0; k < 2; k++) {
    cplan *P = &r->plan[k];
    if (!P->built || !P->nments) continue;
    fill_msteps(r, P);
    if (!gpu_upload(r->mtab + P->tab_at, P->mtab, sizeof(gpu_mstep) * (size_t)P->nments, NULL, e, sizeof e)) {
      failf(err, errlen, 2, "GPU %d: %s", r->gpu, e);
      goto fail;
    }
  }
  free(mask_bytes);
  return r;
fail:
  free(mask_bytes);
  if (r->mpi) mp_abort(r, err);
  crun_close(r);
  return NULL;
}

void crun_describe(crun *r, char *buf, size_t n) {
  int64_t peak = 0;
  for (int d = 0; d < r->pr->nprogs; d++)
    if (r->pr->progs[d].peak > peak) peak = r->pr->progs[d].peak;
  char a[32], b[32];
  int k = snprintf(buf, n, "%s (compute capability %d.%d), %d virtual device%s, %s of device memory (%s free at the start)",
                   r->props.name, r->props.major, r->props.minor, r->ndev, r->ndev == 1 ? "" : "s",
                   crun_bytes(a, sizeof a, (double)r->need), crun_bytes(b, sizeof b, (double)r->props.free));
  if (r->mine >= 0 && k > 0 && (size_t)k < n)
    k += snprintf(buf + k, n - (size_t)k, "; process %d of %d runs plan device %d, collectives and sends between "
                  "processes through %s, %d communicator%s", r->rank, r->nprocs, r->mine, r->ccl_what, r->ncomms,
                  r->ncomms == 1 ? "" : "s");
  else if (r->nccl && k > 0 && (size_t)k < n)
    k += snprintf(buf + k, n - (size_t)k, "; collectives of groups of one through %s, %d communicator%s", r->ccl_what,
                  r->ncomms, r->ncomms == 1 ? "" : "s");
  /* what the executor fused (docs/run.md, How it executes) */
  const char *sep = "; fused: ";
  if (r->nfused > 0 && k > 0 && (size_t)k < n)
    k += snprintf(buf + k, n - (size_t)k, "%s%d linear and GELU product%s", sep, r->nfused, r->nfused == 1 ? "" : "s"),
        sep = ", ";
  if (r->nresid > 0 && k > 0 && (size_t)k < n)
    k += snprintf(buf + k, n - (size_t)k, "%s%d linear and residual product%s", sep, r->nresid, r->nresid == 1 ? "" : "s"),
        sep = ", ";
  if (r->nfirst > 0 && k > 0 && (size_t)k < n)
    k += snprintf(buf + k, n - (size_t)k, "%s%d backward compute%s writing gradients first", sep, r->nfirst,
                  r->nfirst == 1 ? "" : "s"),
        sep = ", ";
  if (r->npadded > 0 && k > 0 && (size_t)k < n)
    k += snprintf(buf + k, n - (size_t)k, "%s%d buffer%s of padded rows", sep, r->npadded, r->npadded == 1 ? "" : "s"),
        sep = ", ";
  if (r->nin_place > 0 && k > 0 && (size_t)k < n)
    k += snprintf(buf + k, n - (size_t)k, "%s%d loss%s writing the gradient over the logits", sep, r->nin_place,
                  r->nin_place == 1 ? "" : "es"),
        sep = ", ";
  if (r->npassed > 0 && k > 0 && (size_t)k < n)
    snprintf(buf + k, n - (size_t)k, "%s%d residual backward%s passing the gradient through", sep, r->npassed,
             r->npassed == 1 ? "" : "s");
}

/* ---- running ------------------------------------------------------------------------------------ */

static bool run_act(crun *r, const cact *a, gpu_stream *s, char *err, size_t errlen) {
  switch (a->kind) {
  case A_MOVE: {
    gpu_rmove m = cx_move_at(&a->mv, r->tables);
    gpu_move(s, addr(r, a->dst), a->dst_dt, addr(r, a->src), a->src_dt, &m, a->add);
    return true;
  }
  case A_SUM: {
    gpu_rmove m = cx_move_at(&a->mv, r->tables);
    gpu_srcs src;
    src.n = a->nsrc;
    for (int i = 0; i < a->nsrc && i < GPU_MAX_SRCS; i++) src.p[i] = addr(r, r->P->srcs[a->first + i]);
    gpu_sum(s, addr(r, a->dst), a->dst_dt, &src, a->src_dt, &m, a->add);
    return true;
  }
  case A_ZERO:
    gpu_zero(addr(r, a->dst), (size_t)a->bytes, s);
    return true;
  case A_CALL: {
    const pcall *pc = &r->P->calls[a->idx];
    ccall c = pc->c;
    for (int i = 0; i < c.nin; i++) c.in[i] = addr(r, pc->in[i]), c.din[i] = addr(r, pc->din[i]);
    c.out = addr(r, pc->out);
    c.dy = addr(r, pc->dy);
    c.stats = addr(r, pc->stats);
    c.ws = addr(r, pc->ws);
    c.keep = addr(r, pc->keep);
    c.fwd_out = addr(r, pc->fwd_out);
    c.epi_ptr = addr(r, pc->epi);
    c.epi_in = addr(r, pc->epi_in);
    c.slot = pc->slot >= 0 ? r->slots + pc->slot : NULL;
    c.gemm_ws = r->dev[pc->dev].pool + r->P->s.fixed[pc->dev];
    c.s = s;
    return ccall_run(&c, err, errlen);
  }
  case A_STEP: {
    const pstep *st = &r->P->steps[a->idx];
    float *state = addr(r, st->state);
    const float *scale = r->P->clip ? r->coef : NULL;
    if (r->optim == 1)
      gpu_adamw(s, addr(r, st->param), st->pdt, addr(r, st->master), state, state + st->n, addr(r, st->grad), st->gdt,
                scale, st->n, r->w->step + 1, &r->settings);
    else
      gpu_sgd(s, addr(r, st->param), st->pdt, addr(r, st->master), st->copies ? state : NULL, addr(r, st->grad),
              st->gdt, scale, st->n, &r->settings);
    return true;
  }
  case A_SUMSQ: {
    int dev = a->idx;
    void *ws = r->dev[dev].pool + r->P->s.fixed[dev] + gpu_gemm_ws();
    gpu_sumsq(s, a->src_dt, r->norms + dev, addr(r, a->src), a->bytes >= 0 ? r->masks + a->bytes : NULL, a->n, ws);
    return true;
  }
  case A_MULTI: {
    const pgroup *g = &r->P->groups[a->idx];
    gpu_msteps(s, r->optim == 1, r->mtab + r->P->tab_at + g->first, g->n, &g->l, r->w->step + 1, &r->settings,
               r->P->clip ? r->coef : NULL, r->mparts + r->P->parts_at + g->parts, g->dev >= 0 ? r->norms + g->dev : NULL);
    return true;
  }
  case A_NORM:
    gpu_clip_coef(s, r->coef, r->norms + r->pr->nprogs, r->norms, r->pr->nprogs, r->clip);
    return true;
  case A_CCL:
    return run_ccl(r, &r->P->cops[a->idx], s, err, errlen);
  case A_NONE:  /* launched with its group */
  default:
    return true;
  }
}

/* Parameters, masters and optimizer state from the world, once. */
static bool init_state(crun *r, char *err, size_t errlen) {
  const weft_program *pr = r->pr;
  const weft_graph *g = r->g;
  char e[512];
  int64_t most = 1;
  for (int b = 0; b < pr->nbufs; b++)
    if (pr->bufs[b].persistent) {
      int64_t n = cx_numel(&pr->bufs[b].region) * (pr->bufs[b].copies > 1 ? pr->bufs[b].copies : 1);
      if (n > most) most = n;
    }
  float *host = cx_alloc(sizeof(float) * (size_t)most);
  float *stage = gpu_alloc(sizeof(float) * (size_t)most, e, sizeof e);
  if (!stage) {
    free(host);
    return failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
  }
  bool ok = true;
  for (int d = 0; d < pr->nprogs && ok; d++) {
    const lprog *lp = &pr->progs[d];
    if (!lp->n || !here(r, d)) continue;
    gpu_stream *s = r->dev[d].stream;
    for (int b = lp->buf_lo; b < lp->buf_hi && ok; b++) {
      const lbuf *bf = &pr->bufs[b];
      if (!bf->persistent) continue;
      const gtensor *t = &g->tensors[bf->tensor];
      dregion dims[GPU_MAX_DIMS];
      irange iv[GPU_MAX_DIMS];
      char *dst = r->dev[d].pool + r->P->s.off[b];
      int64_t n = cx_numel(&bf->region);
      if (t->ndims > GPU_MAX_DIMS) {
        ok = failf(err, errlen, 1, "tensor %s has more than %d dimensions", t->name, GPU_MAX_DIMS);
        break;
      }
      tregion whole = cx_whole(t, dims, iv);
      cx_move mv;
      cx_tables tab = {0};
      if (!cx_move_build(&mv, &tab, &bf->region, &whole, &bf->region, e, sizeof e)) {
        ok = failf(err, errlen, 2, "%s: %s", t->name, e);
        break;
      }
      if ((bf->role == LB_PARAM || bf->role == LB_MASTER) && r->w->param[bf->tensor]) {
        /* the world holds a parameter's master value: the parameter is its
         * rounding, the master's copy 0 the value (its copy 1 the step writes) */
        cx_move_host(host, r->w->param[bf->tensor], &mv, &tab, false);
        if (bf->role == LB_MASTER) gpu_zero(dst, (size_t)(bf->bytes ? bf->bytes : 1), s);
        /* f32 goes in as it is; a 16-bit parameter through the stage, rounded there */
        bool f32 = bf->role == LB_MASTER || bf->dtype == GPU_F32;
        ok = gpu_upload(f32 ? (void *)dst : (void *)stage, host, (size_t)n * 4, s, e, sizeof e);
        if (ok && !f32) gpu_convert(s, dst, bf->dtype, stage, GPU_F32, n, false);
        ok = ok && gpu_stream_sync(s, e, sizeof e);
      } else if (bf->role == LB_STATE && r->w->state[bf->tensor]) {
        int64_t wn = cx_tensor_numel(t);
        for (int c = 0; c < bf->copies && ok; c++) {
          if (c < r->w->state_copies) cx_move_host(host, r->w->state[bf->tensor] + c * wn, &mv, &tab, false);
          else memset(host, 0, (size_t)n * 4);
          ok = gpu_upload(dst + c * n * 4, host, (size_t)n * 4, s, e, sizeof e);
        }
      } else {
        gpu_zero(dst, (size_t)(bf->bytes ? bf->bytes : 1), s);
        ok = gpu_stream_sync(s, e, sizeof e);
      }
      free(tab.v);
      if (!ok && !err[0]) failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
    }
  }
  gpu_free(stage);
  free(host);
  if (ok) r->inited = true;
  return ok;
}

static bool upload_inputs(crun *r, char *err, size_t errlen) {
  char e[512];
  for (int t = 0; t < r->g->ntensors; t++) {
    if (r->input_off[t] < 0 || !r->w->input[t]) continue;
    if (!gpu_upload(r->inputs + r->input_off[t], r->w->input[t], (size_t)cx_tensor_numel(&r->g->tensors[t]) * 4, NULL, e,
                    sizeof e))
      return failf(err, errlen, 2, "GPU %d (%s): the model input %s: %s", r->gpu, r->props.name,
                   r->g->tensors[t].name, e);
  }
  size_t nz = (size_t)(r->nslots > r->pr->nprogs + 2 ? r->nslots + 1 : r->pr->nprogs + 2);
  double *zero = cx_alloc(sizeof(double) * nz);
  bool ok = gpu_upload(r->slots, zero, sizeof(double) * (size_t)(r->nslots + 1), NULL, e, sizeof e) &&
            gpu_upload(r->norms, zero, sizeof(double) * (size_t)(r->pr->nprogs + 2), NULL, e, sizeof e);
  free(zero);
  return ok || failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
}

/* Whether an evaluation skips this stream operation: the backward, the
 * recomputation, the steps (communications still meet). */
static bool eval_skips(const crun *r, const sop *so) {
  if (so->kind == SO_NORM_PART || so->kind == SO_NORM) return true;
  if (so->kind != SO_INS) return false;
  const lins *in = &r->pr->progs[so->dev].ins[so->ins];
  return in->kind == LI_STEP || (in->kind == LI_COMPUTE && (in->dir == DIR_BACKWARD || in->recompute));
}

static bool kernel_failed(crun *r, const char *e, char *err, size_t errlen) {
  return failf(err, errlen, 2,
               "GPU %d (%s): a kernel of step %" PRId64 " failed: %s (WEFT_CUDA_SYNC=1 names its instruction)", r->gpu,
               r->props.name, r->w->step + 1, e);
}

/* Waits for every stream to finish the pass, at most the run's timeout
 * (--timeout): a kernel that hangs fails the run instead of holding it. */
static bool pass_end(crun *r, char *err, size_t errlen) {
  char e[512];
  int nd = r->pr->nprogs;
  if (r->mine >= 0) mp_join(r);
  for (int d = 0; d < nd; d++)
    if (r->dev[d].stream) gpu_record(r->dev[d].done, r->dev[d].stream);
  double t0 = now();
  long nap_us = 20;
  for (int d = 0; d < nd;) {
    int k = r->dev[d].stream ? gpu_event_done(r->dev[d].done, e, sizeof e) : 1;
    if (k < 0) return kernel_failed(r, e, err, errlen);
    if (k > 0) { d++; continue; }
    if (r->ncomms && !ccl_healthy(r, err, errlen)) return false;
    if (mp_orphaned(r, err, errlen)) return false;
    if (r->o.timeout_s > 0 && now() - t0 > r->o.timeout_s) {
      if (r->ncomms) return ccl_timeout(r, d, err, errlen);
      r->hung = true;
      return failf(err, errlen, 2,
                   "GPU %d (%s), plan device %d: step %" PRId64 " did not finish within %g s (--timeout); a kernel "
                   "may hang (WEFT_CUDA_SYNC=1 names the instruction)",
                   r->gpu, r->props.name, d, r->w->step + 1, r->o.timeout_s);
    }
    struct timespec ts = {0, nap_us * 1000};
    nanosleep(&ts, NULL);
    if (nap_us < 1000) nap_us *= 2;
  }
  return gpu_sync(e, sizeof e) || kernel_failed(r, e, err, errlen);
}

/* Several processes: the loss's shares and the devices' sums of squares
 * of every process (each wrote its own; the others' are zero). */
static bool mp_sums(crun *r, char *err, size_t errlen) {
  char what[64], e[512];
  snprintf(what, sizeof what, "the loss of step %" PRId64, r->w->step + 1);
  /* the slot past the loss's: the choices of kernels proposed (choice.h),
   * which all processes then agree when any did */
  double pending = choice_pending();
  bool ok = gpu_upload(r->slots + r->nslots, &pending, sizeof pending, NULL, e, sizeof e) ||
            failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
  ok = ok && ccl_all_reduce_op(r->world, r->slots, r->slots, r->nslots + 1, CCL_F64, CCL_SUM, r->wstream, err, errlen);
  /* with clipping, the pass summed the norms already (mp_norm) */
  if (ok && !r->eval && !r->P->clip)
    ok = ccl_all_reduce_op(r->world, r->norms, r->norms, r->pr->nprogs, CCL_F64, CCL_SUM, r->wstream, err, errlen);
  return ok && mp_settle(r, what, err, errlen);
}

/* After a pass in which some process proposed choices of kernels: every
 * process's proposals gathered (a sum of rows, each process's its own,
 * zeros elsewhere, which is exact), and each settles its own by them
 * (choice_settle, the same rule over the same records everywhere). */
static bool mp_choices(crun *r, char *err, size_t errlen) {
  int32_t most = choice_pending();
  if (!mp_world(r, &most, 1, GPU_I32, CCL_MAX, "the number of choices of kernels proposed", err, errlen))
    return false;
  const size_t row = (size_t)most * CHOICE_INTS;
  int32_t *all = cx_alloc(sizeof(int32_t) * (row * (size_t)r->nprocs + 1));
  choice_proposals(all + row * (size_t)r->rank, most);
  bool ok = mp_world(r, all, (int64_t)(row * (size_t)r->nprocs), GPU_I32, CCL_SUM, "the choices of kernels proposed",
                     err, errlen);
  if (ok) {
    int mine = choice_pending(), other = choice_settle(all, r->nprocs, most);
    if (other)
      fprintf(stderr,
              "weft: process %d takes another choice of kernels than its own fastest for %d of its %d calls: the "
              "processes' agreed ones, so that what they replicate gives the same bits in each\n",
              r->rank, other, mine);
  }
  free(all);
  return ok;
}

/* A traced pass's events: an origin and two per schedule op, created
 * once (timed events cost more to record than the executor's own). */
static bool trace_begin(crun *r, char *err, size_t errlen) {
  int want = 2 * r->P->s.nops + 1;
  if (want > r->ntev) {
    gpu_event **more = cx_alloc(sizeof(gpu_event *) * (size_t)want);
    if (r->ntev) memcpy(more, r->tev, sizeof(gpu_event *) * (size_t)r->ntev);
    free(r->tev);
    r->tev = more;
    for (; r->ntev < want; r->ntev++)
      if (!(r->tev[r->ntev] = gpu_event_timed(err, errlen))) return false;
  }
  free(r->traced);
  r->traced = cx_alloc(sizeof(bool) * (size_t)(r->P->s.nops + 1));
  /* the origin, on a stream with nothing queued: every op's launches come after it */
  for (int d = 0; d < r->pr->nprogs; d++)
    if (here(r, d) && r->dev[d].stream) {
      gpu_record(r->tev[0], r->dev[d].stream);
      break;
    }
  return true;
}

/* After the pass: each op's span on its stream, from after its waits to
 * the end of its launches, as on_trace wants it. */
static bool trace_end(crun *r, char *err, size_t errlen) {
  const cplan *P = r->P;
  for (int k = 0; k < P->s.nops; k++) {
    const sop *so = &P->s.ops[k];
    if (!r->traced[k] || so->ins < 0) continue;
    char e[512] = "";
    double a = gpu_elapsed_ms(r->tev[0], r->tev[1 + 2 * k], e, sizeof e),
           b = e[0] ? 0 : gpu_elapsed_ms(r->tev[0], r->tev[2 + 2 * k], e, sizeof e);
    if (e[0]) return failf(err, errlen, 2, "GPU %d (%s), the trace: %s", r->gpu, r->props.name, e);
    /* (the emulation may run an op's work before the origin's) */
    a = a > 0 ? a : 0, b = b > a ? b : a;
    r->o.on_trace(r->o.ctx, so->dev, so->ins, "stream", a * 1e-3, b * 1e-3);
  }
  return true;
}

/* Schedule op k's range (nvtx.h): "device D: " and the instruction as
 * the run labels it (weft run --trace's name), its category's colour. */
static void range_name(const crun *r, cnvtx *nv, int k, const sop *so) {
  backend_label lb = {.category = "executor", .cat = NVTX_EXEC, .rgb = 0x8c8c8c};
  if (so->ins >= 0 && r->o.label) {
    r->o.label(r->o.ctx, so->dev, so->ins, &lb);
    if (lb.cat < 0) lb.cat = NVTX_MEMORY;
  } else if (so->ins >= 0) {
    ins_name(r, so->dev, so->ins, lb.name, sizeof lb.name);
  } else {
    snprintf(lb.name, sizeof lb.name, "%s", so->kind == SO_NORM ? "clipping factor" : "executor");
  }
  char name[300];
  snprintf(name, sizeof name, "device %d: %s", so->dev, lb.name);
  nvtx_name(nv, k, lb.cat, lb.category, lb.rgb, name);
}

static bool run_plan(crun *r, char *err, size_t errlen) {
  char e[512], what[256];
  if (r->tracing && !trace_begin(r, err, errlen)) return false;
  if (!upload_inputs(r, err, errlen)) return false;
  const cplan *P = r->P;
  for (int k = 0; k < P->s.nops; k++) {
    const sop *so = &P->s.ops[k];
    if (!here(r, op_dev(r, so))) continue;  /* another process's */
    gpu_stream *s = r->dev[op_dev(r, so)].stream;
    if (so->kind == SO_RECORD) gpu_record(P->ev[so->arg], s);
    else if (so->kind == SO_WAIT && P->alias && P->alias[so->arg] >= 0) gpu_wait(s, P->cops[P->alias[so->arg]].out);
    else if (so->kind == SO_WAIT) gpu_wait(s, P->ev[so->arg]);
    if (r->eval && eval_skips(r, so)) continue;
    bool timed = r->tracing && P->count[k] > 0;
    if (timed) gpu_record(r->tev[1 + 2 * k], s), r->traced[k] = true;
    cnvtx *nv = P->count[k] > 0 ? r->nv[P == &r->plan[1]] : NULL;
    if (nv && !nvtx_named(nv, k)) range_name(r, nv, k, so);
    nvtx_push(nv, k);
    for (int j = 0; j < P->count[k]; j++)
      if (!run_act(r, &P->acts[P->first[k] + j], s, e, sizeof e)) {
        nvtx_pop(nv);
        ins_name(r, so->dev, so->ins, what, sizeof what);
        return failf(err, errlen, 1, "%s: %s", what, e);
      }
    nvtx_pop(nv);
    if (timed) gpu_record(r->tev[2 + 2 * k], s);
    if (P->count[k] || r->sync_each) {
      ins_name(r, so->dev, so->ins, what, sizeof what);
      bool ok = (!r->sync_each || gpu_stream_sync(s, e, sizeof e)) && gpu_check("CUDA", e, sizeof e);
      if (!ok) return failf(err, errlen, 2, "GPU %d (%s), %s: %s", r->gpu, r->props.name, what, e);
    }
  }
  return pass_end(r, err, errlen) && (!r->tracing || trace_end(r, err, errlen));
}

bool crun_pass(crun *r, const backend_step *st, backend_result *out, char *err, size_t errlen) {
  if (r->failed) return failf(err, errlen, 1, "a step of this run failed before");
  r->eval = st->eval;
  r->clip = st->clip > 0 && !st->eval ? st->clip : 0;
  r->settings.lr = isnan(st->lr) ? r->lr0 : st->lr;
  if (r->clip > 0 && !r->plan[1].built)
    return failf(err, errlen, 1, "gradients cannot be clipped under this plan: %s", r->clip_err);
  r->P = &r->plan[r->clip > 0 ? 1 : 0];
  r->tracing = st->trace && r->o.on_trace;
  if (!r->inited && !init_state(r, err, errlen)) {
    r->failed = true;
    return false;
  }
  double t0 = now();
  choice_take(NULL); /* the choices before the pass are not its time */
  int nd = r->pr->nprogs;
  double *host = cx_alloc(sizeof(double) * (size_t)(r->nslots + nd + 2));
  char e[512];
  /* WEFT_CUDA_PROFILE_STEP=N: a profiler started with collection off sees
   * step N alone (bench/gpu_profile.sh), not the setup and the first
   * steps' timing of cuBLASLt's algorithms */
  const char *ps = getenv("WEFT_CUDA_PROFILE_STEP");
  const bool prof = ps && atoll(ps) == r->w->step + 1;
  if (prof) gpu_sync(e, sizeof e), gpu_profiler(true);
  cnvtx *nv = r->nv[r->P == &r->plan[1]];
  if (nv) {
    char pass[64];
    if (r->eval) snprintf(pass, sizeof pass, "evaluation");
    else snprintf(pass, sizeof pass, "step %" PRId64, r->w->step + 1);
    nvtx_push_text(nv, NVTX_PASS, "pass", 0x4a4a4a, pass);
  }
  bool ok = run_plan(r, err, errlen);
  if (prof) gpu_sync(e, sizeof e), gpu_profiler(false);
  if (ok && r->mine >= 0) ok = mp_sums(r, err, errlen);
  if (ok && !gpu_download(host, r->slots, sizeof(double) * (size_t)(r->nslots + 1), NULL, e, sizeof e))
    ok = failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
  double loss = 0, sq = 0;
  for (int i = 0; ok && i < r->nslots; i++) loss += host[i];
  if (ok && r->mine >= 0 && host[r->nslots] > 0) ok = mp_choices(r, err, errlen);
  if (ok && !r->eval && !gpu_download(host, r->norms, sizeof(double) * (size_t)nd, NULL, e, sizeof e))
    ok = failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
  /* the devices' sums of squares in device order, as the CPU backend takes them */
  for (int d = 0; ok && !r->eval && d < nd; d++) sq += host[d];
  free(host);
  nvtx_pop(nv);
  if (!ok) {
    r->failed = true;
    if (r->mine >= 0) mp_abort(r, err);
    return false;
  }
  if (!r->eval) r->w->step++;
  double by_kind[CHOICE_KINDS];
  const double chose = choice_take(by_kind);
  /* a tenth of a second or more of it: what it went to, one line */
  if (chose >= 0.1)
    fprintf(stderr, "weft: choosing kernels took %.3f s of the pass: products %.3f s, attention %.3f s, cuDNN's "
            "plans apart from attention's timing %.3f s\n", chose, by_kind[CHOICE_GEMM], by_kind[CHOICE_ATTENTION],
            by_kind[CHOICE_CUDNN]);
  *out = (backend_result){loss, r->eval ? NAN : sqrt(sq), now() - t0, chose};
  return true;
}

/* Whether parameter t has master weights (graph_has_master): a 16-bit
 * parameter, unless `train` says `master = false`. */
static bool has_master(const weft_graph *g, int t) {
  weft_dtype dt = g->tensors[t].dtype;
  return g->master != 0 && (dt == DT_BF16 || dt == DT_F16);
}

/* Parameters (their master weights when they have them) and optimizer
 * state back into the world, from the buffers the optimizer stepped;
 * copies must agree. */
bool crun_read(crun *r, char *err, size_t errlen) {
  const weft_program *pr = r->pr;
  const weft_graph *g = r->g;
  if (!r->inited) return true;
  if (r->hung) return failf(err, errlen, 2, "GPU %d (%s): a step did not finish (--timeout)", r->gpu, r->props.name);
  char e[512];
  int64_t most = 1;
  for (int b = 0; b < pr->nbufs; b++) {
    int64_t n = cx_numel(&pr->bufs[b].region) * (pr->bufs[b].copies > 1 ? pr->bufs[b].copies : 1);
    if (pr->bufs[b].persistent && n > most) most = n;
  }
  float *host = cx_alloc(sizeof(float) * (size_t)most), *before = cx_alloc(sizeof(float) * (size_t)most);
  float *stage = gpu_alloc(sizeof(float) * (size_t)most, e, sizeof e);
  float **seen = cx_alloc(sizeof(float *) * (size_t)(g->ntensors + 1));
  float **sseen = cx_alloc(sizeof(float *) * (size_t)(g->ntensors + 1));
  bool ok = stage != NULL;
  if (!ok) failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
  for (int d = 0; d < pr->nprogs && ok; d++) {
    const lprog *lp = &pr->progs[d];
    if (!lp->n || !here(r, d)) continue;
    gpu_stream *s = r->dev[d].stream;
    for (int b = lp->buf_lo; b < lp->buf_hi && ok; b++) {
      const lbuf *bf = &pr->bufs[b];
      if (!bf->persistent) continue;
      /* a parameter's value is its master's when it has master weights */
      int home = has_master(g, bf->tensor) ? LB_MASTER : LB_PARAM;
      bool param = bf->role == home && r->dev[d].stepped[b - lp->buf_lo];
      if (!param && bf->role != LB_STATE) continue;
      const gtensor *t = &g->tensors[bf->tensor];
      dregion dims[GPU_MAX_DIMS];
      irange iv[GPU_MAX_DIMS];
      tregion whole = cx_whole(t, dims, iv);
      int64_t n = cx_numel(&bf->region), wn = cx_tensor_numel(t);
      cx_move mv;
      cx_tables tab = {0};
      if (!cx_move_build(&mv, &tab, &bf->region, &bf->region, &whole, e, sizeof e)) {
        ok = failf(err, errlen, 2, "%s: %s", t->name, e);
        break;
      }
      char *src = r->dev[d].pool + r->P->s.off[b];
      if (param) {
        if (bf->role != LB_MASTER) gpu_convert(s, stage, GPU_F32, src, bf->dtype, n, false), src = (char *)stage;
        ok = gpu_download(host, src, (size_t)n * 4, s, e, sizeof e);
        if (!ok) {
          failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
          free(tab.v);
          break;
        }
        if (!seen[bf->tensor]) seen[bf->tensor] = cx_alloc(sizeof(float) * (size_t)wn);
        /* a copy written before must hold the same bits */
        cx_move back;
        cx_tables btab = {0};
        cx_move_build(&back, &btab, &bf->region, &whole, &bf->region, e, sizeof e);
        float *was = cx_alloc(sizeof(float) * (size_t)n);
        cx_move_host(before, r->w->param[bf->tensor], &back, &btab, false);
        cx_move_host(was, seen[bf->tensor], &back, &btab, false);
        for (int64_t i = 0; i < n && ok; i++)
          if (was[i] != 0.0f && memcmp(&before[i], &host[i], 4) != 0)
            ok = failf(err, errlen, 1, "copies of parameter %s differ after the run (%.9g and %.9g on device %d)",
                       t->name, (double)before[i], (double)host[i], d);
        free(was);
        free(btab.v);
        cx_move_host(r->w->param[bf->tensor], host, &mv, &tab, false);
        for (int64_t i = 0; i < n; i++) host[i] = 1.0f;
        cx_move_host(seen[bf->tensor], host, &mv, &tab, false);
      } else {
        ok = gpu_download(host, src, (size_t)(n * bf->copies) * 4, s, e, sizeof e);
        if (!ok) failf(err, errlen, 2, "GPU %d (%s): %s", r->gpu, r->props.name, e);
        for (int c = 0; ok && c < bf->copies && c < r->w->state_copies; c++)
          cx_move_host(r->w->state[bf->tensor] + c * wn, host + c * n, &mv, &tab, false);
        if (ok && r->mine >= 0) {
          if (!sseen[bf->tensor]) sseen[bf->tensor] = cx_alloc(sizeof(float) * (size_t)wn);
          for (int64_t i = 0; i < n; i++) host[i] = 1.0f;
          cx_move_host(sseen[bf->tensor], host, &mv, &tab, false);
        }
      }
      free(tab.v);
    }
  }
  gpu_free(stage);
  /* every process the same calls, whatever it found */
  if (r->mine >= 0) {
    char e2[512] = "";
    if (!mp_gather(r, seen, sseen, e2, sizeof e2)) mp_abort(r, e2);
    if (!r->mpi && e2[0] && ok) ok = failf(err, errlen, 2, "%s", e2);
  }
  for (int t = 0; t < g->ntensors; t++) free(seen[t]), free(sseen[t]);
  free(seen), free(sseen), free(host), free(before);
  return ok;
}
