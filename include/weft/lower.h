/* lower.h - the lowered program: what every device of a plan does in one
 * training step, in order. The only interface backends see (the format is
 * documented in docs/program.md). */
#ifndef WEFT_LOWER_H
#define WEFT_LOWER_H

#include "weft/plan.h"

/* What a buffer holds. */
typedef enum {
  LB_INPUT,               /* a part of a model input (tokens, labels), loaded by the backend */
  LB_PARAM,               /* a parameter's region (or its ZeRO shard) */
  LB_GRAD,                /* a parameter's gradient */
  LB_STATE,               /* optimizer state for a parameter region (AdamW: m and v) */
  LB_ACT,                 /* an activation (or partial sums of one) */
  LB_ACT_GRAD,            /* the gradient of an activation */
  LB_MASTER,              /* master weights of a 16-bit parameter region, in f32
                           * (copies 2: and an f32 copy of its 16-bit gradient) */
  LB_COMM,                /* a parameter or its gradient in transit: gathered from
                           * ZeRO shards before use, a reduce-scattered part
                           * before the step, a sum not taken in place */
  LB_ROLE_COUNT
} lbuf_role;

extern const char *const lbuf_role_names[LB_ROLE_COUNT];
/* The roles in the order memory is reported (parameters, master weights,
 * gradients, optimizer state, activations, their gradients, communication
 * buffers, inputs), and each one's name for people ("master weights"). */
extern const int lbuf_role_order[LB_ROLE_COUNT];
extern const char *const lbuf_role_titles[LB_ROLE_COUNT];

/* A buffer on one device: the packed elements of a region of a tensor. */
typedef struct lbuf {
  int device;
  int tensor;             /* graph tensor */
  uint8_t role;           /* lbuf_role */
  uint8_t dtype;          /* weft_dtype */
  bool persistent;        /* lives across steps: parameters, their gradients, optimizer state */
  bool stats;             /* LB_ACT: the statistics of a gather (pcomm.stats), in
                           * its index space, not the tensor's values */
  int copies;             /* LB_STATE: state tensors per element (AdamW 2);
                           * LB_MASTER: graph_master_copies; else 1 */
  tregion region;         /* the region of the tensor it holds */
  int64_t bytes;
} lbuf;

/* A region of a tensor inside a buffer (contained in the buffer's region). */
typedef struct lref {
  int buf;                /* -1: an argument this sub-operator does not apply */
  int arg;                /* LI_COMPUTE: the operator's input it is (or whose
                           * gradient it is); -1 for the result or its gradient */
  tregion region;
} lref;

typedef enum {
  LI_ALLOC,               /* buf */
  LI_FREE,                /* buf */
  LI_COMPUTE,             /* sub (forward sub-operator), dir, recompute: in, out */
  LI_SEND,                /* comm, peer: in[0] to peer */
  LI_RECV,                /* comm, peer: out[0] from peer */
  LI_COLLECTIVE,          /* comm (its kind and group): in (0 or 1), out (1) */
  LI_STEP,                /* the optimizer on param tensor: in = grad; out = param, state */
  LI_COPY,                /* out[0] assembled from the parts in (pieces on this device) */
  LI_KIND_COUNT
} lins_kind;

extern const char *const lins_kind_names[LI_KIND_COUNT];

/* A compute of a sub-operator whose parts gather per-row statistics
 * (pcomm.stats: a cross entropy split along its vocabulary) runs in two:
 * the statistics of its part, then, after the gather, the result (or the
 * gradients) from the gathered statistics. */
typedef enum {
  LP_WHOLE,               /* the sub-operator at once */
  LP_STATS,               /* its statistics: out[0] is this part's of the gather */
  LP_COMBINE,             /* its result or gradients: the last of in is the gathered statistics */
  LP_COUNT
} lins_part;

extern const char *const lins_part_names[LP_COUNT];

typedef struct lins {
  /* 64 bytes: programs of thousands of devices hold millions of these */
  uint8_t kind;           /* lins_kind */
  uint8_t dir;            /* LI_COMPUTE: sub_dir, forward or backward */
  uint8_t epoch;          /* 0; 1: the repeat of a forward communication for recomputation */
  bool recompute;         /* LI_COMPUTE: a forward run again before the backward */
  bool accumulate;        /* LI_COMPUTE backward: gradient outputs are added to */
  uint8_t part;           /* LI_COMPUTE: lins_part */
  uint16_t nbucket;       /* LI_COLLECTIVE: more all-reduces fused with comm
                           * (`buckets`, at most LINS_MAX_BUCKET): bucket[0..nbucket)
                           * on the same group; in[i] and out[i] belong to comm
                           * (i = 0), then to bucket[i - 1] */
  int buf;                /* LI_ALLOC, LI_FREE */
  int sub;                /* LI_COMPUTE */
  int mb;                 /* LI_COMPUTE: micro-batch */
  int comm;               /* LI_SEND, LI_RECV, LI_COLLECTIVE */
  int peer;               /* LI_SEND: destination; LI_RECV: source */
  int tensor;             /* LI_STEP: the parameter */
  int nin, nout;
  lref *in, *out;
  int *bucket;
} lins;

/* The most all-reduces one bucket fuses (lins.nbucket + 1). */
enum { LINS_MAX_BUCKET = 65535 };

/* An instruction as the analyses read it: the deadlock check, buckets,
 * the simulation, the memory timeline and the estimate's pictures. Every
 * program has these, one per instruction and at the same index as ins;
 * the full instructions (ins, with their regions) are kept only for the
 * commands that print or run them (lower_opts.full_programs). 16 bytes. */
enum { LOP_RECOMPUTE = 1, LOP_ACCUMULATE = 2, LOP_WHOLE = 4, LOP_PERSISTENT = 8, LOP_STATS = 16, LOP_COMBINE = 32 };

typedef struct lop {
  uint8_t kind;           /* lins_kind */
  uint8_t dir;            /* lins.dir */
  uint8_t epoch;          /* lins.epoch */
  uint8_t flags;          /* LOP_RECOMPUTE, LOP_ACCUMULATE; LOP_WHOLE: a
                           * collective in place on the whole of a
                           * persistent buffer (its one in and out);
                           * LOP_PERSISTENT: an alloc or free of a
                           * persistent buffer; LOP_STATS, LOP_COMBINE:
                           * lins.part */
  int id;                 /* what the kind names: LI_ALLOC, LI_FREE: buf;
                           * LI_COMPUTE: sub; LI_SEND, LI_RECV, LI_COLLECTIVE:
                           * comm; LI_STEP: tensor; else -1 */
  int aux;                /* LI_COMPUTE, LI_COPY, LI_STEP: its work, what it
                           * computes and moves (lwork, below);
                           * LI_SEND, LI_RECV: peer; else -1. (A compute's
                           * micro-batch is its sub-operator's.) */
  int refs;               /* where its entry is in the program's pool
                           * (lprog.pool, -1: none): its buffers and the
                           * bucket's comms (below) */
} lop;

/* A lop's pool entry: a head, then the bufs of in and of out (-1: an
 * argument not applied), then a bucket's comms. The head is one int,
 * nin | nout << 15, when both are under 2^15 and there is no bucket;
 * else -1, then nin, nout and nbucket. */
enum { LOP_SHORT = 1 << 15 };
static inline int lop_nin(const int *pool, const lop *o) {
  if (o->refs < 0) return 0;
  int h = pool[o->refs];
  return h >= 0 ? h & (LOP_SHORT - 1) : pool[o->refs + 1];
}
static inline int lop_nout(const int *pool, const lop *o) {
  if (o->refs < 0) return 0;
  int h = pool[o->refs];
  return h >= 0 ? h >> 15 : pool[o->refs + 2];
}
static inline int lop_nbucket(const int *pool, const lop *o) {
  return o->refs < 0 || pool[o->refs] >= 0 ? 0 : pool[o->refs + 3];
}
static inline const int *lop_bufs(const int *pool, const lop *o) {
  return pool + o->refs + (pool[o->refs] >= 0 ? 1 : 4);
}
static inline const int *lop_bucket(const int *pool, const lop *o) {
  return lop_bufs(pool, o) + lop_nin(pool, o) + lop_nout(pool, o);
}
/* The ints of an entry. */
static inline int lop_entry_size(int nin, int nout, int nbucket) {
  return (nbucket == 0 && nin < LOP_SHORT && nout < LOP_SHORT ? 1 : 4) + nin + nout + nbucket;
}
/* Writes an entry's head at r; returns where its bufs go. */
static inline int *lop_put_head(int *r, int nin, int nout, int nbucket) {
  if (nbucket == 0 && nin < LOP_SHORT && nout < LOP_SHORT) {
    r[0] = nin | nout << 15;
    return r + 1;
  }
  r[0] = -1;
  r[1] = nin;
  r[2] = nout;
  r[3] = nbucket;
  return r + 4;
}

typedef struct lprog {
  int device;
  lins *ins;              /* NULL unless full programs are kept */
  int n, cap;
  lop *ops;               /* n of them */
  int *pool;              /* their buffers and buckets (lop.refs) */
  int npool, pcap;        /* used, and room for buckets (lower_buckets) */
  int64_t peak;           /* bytes live at the peak */
  int peak_at;            /* instruction index of the peak */
  int64_t peak_by_role[LB_ROLE_COUNT];
  int64_t persistent;     /* bytes of persistent buffers */
  int buf_lo, buf_hi;     /* its buffers: ids buf_lo .. buf_hi - 1 */
} lprog;

/* One cell of the schedule grid: a block, the forward ('f'), backward ('b')
 * or recomputation ('r') of one stage for one micro-batch. */
typedef struct lcell {
  int stage, mb, slot;
  char kind;
} lcell;

/* What a compute, copy or step instruction computes and moves, without
 * the hardware: instructions that do the same work (the parts of a split,
 * every micro-batch, every layer) share one, which the cost model prices
 * once (cost.h, cost_work). */
typedef struct lwork {
  uint8_t kind;           /* LI_COMPUTE, LI_COPY or LI_STEP */
  bool bwd;               /* a backward */
  bool grad0, grad1;      /* it writes the gradients of arguments 0, 1 */
  int sub;                /* LI_COMPUTE: a sub-operator of its class (its
                           * operator, the sizes of its ranges) */
  int kernels;            /* LI_COPY: its pieces; LI_STEP: 1 */
  double bytes;           /* read and written (accumulation reads too) */
} lwork;

/* The works of a program, one id each (lop.aux). */
typedef struct lower_works lower_works;

typedef struct weft_program {
  const weft_plan *p;
  int nprogs;             /* the cluster's devices; a device without work has an empty program */
  lprog *progs;
  lbuf *bufs;
  int nbufs, bcap;
  int nstages;            /* stages of the schedule (1 without stages) */
  const char **stage_names;
  int nmb;                /* micro-batches */
  lcell *cells;           /* the schedule as a grid, one cell per stage block */
  int ncells, ccap;
  int nslots;
  lower_works *works;     /* what its computes, copies and steps do (lwork) */
  int64_t instructions;   /* over the programs held */
  int64_t instructions_all; /* over all devices, replicas included */
} weft_program;

/* The program device d runs: its own, or under data-parallel replicas
 * (plan.h, rep) its representative's with devices renamed. */
static inline const lprog *lower_prog(const weft_program *pr, int d) {
  return &pr->progs[pr->p->rep ? pr->p->rep[d] : d];
}

/* ---- what a backend reads of a program ---------------------------------------
 * A backend reads the programs, their buffers and instructions (above), and
 * through these the rest of what docs/program.md documents as the program:
 * the model's graph (tensors, operators, the optimizer), what a compute
 * runs, and the communications its collectives name. Nothing else of the
 * plan (weft_plan) is the program's. */

/* The model: its tensors, operators and optimizer ("tensors", "ops",
 * "optimizer", "loss" in JSON). */
static inline const weft_graph *lower_graph(const weft_program *pr) { return pr->p->g; }

/* The communication a send, recv or collective names ("comms"): of it, a
 * backend reads kind, stats, phase, tensor, group, region, parts and
 * sources, size, bytes and level. */
static inline const pcomm *lower_comm(const weft_program *pr, int comm) { return &pr->p->comms[comm]; }

/* The operator a compute runs ("op"). */
static inline int lower_compute_op(const weft_program *pr, const lins *in) { return pr->p->subs[in->sub].op; }

/* The part of its iteration space a compute runs ("ranges"): one range per
 * idim of its operator, lower_op_idims of them. */
static inline const irange *lower_compute_ranges(const weft_program *pr, const lins *in) {
  return pr->p->subs[in->sub].range;
}

/* The idims of operator op's iteration space ("dims" of "ops"). */
static inline int lower_op_idims(const weft_program *pr, int op) { return pr->p->ops[op].space->nidims; }
static inline const idim *lower_op_idim(const weft_program *pr, int op, int i) { return &pr->p->ops[op].space->idims[i]; }

/* Whether two computes run the same part of one operator for the same
 * micro-batch: copies of a part (replicas) that compute the same values. */
static inline bool lower_same_part(const weft_program *pr, const lins *a, const lins *b) {
  int op = lower_compute_op(pr, a);
  if (op != lower_compute_op(pr, b) || a->mb != b->mb) return false;
  const irange *x = lower_compute_ranges(pr, a), *y = lower_compute_ranges(pr, b);
  for (int i = 0; i < lower_op_idims(pr, op); i++)
    if (x[i].lo != y[i].lo || x[i].hi != y[i].hi) return false;
  return true;
}

/* Instruction i of a program read back from its lop: every field but the
 * refs (in, out and bucket are NULL; nin, nout and nbucket are kept). */
lins lower_view(const weft_program *pr, const lprog *pg, int i);

int lower_works_count(const lower_works *w);
const lwork *lower_work_get(const lower_works *w, int id);
/* The work of a compute, copy or step instruction with its refs (a full
 * instruction), measured and not kept. */
lwork lower_work_measure(const weft_program *pr, const lins *ins);

/* What a lowering keeps. */
typedef struct lower_opts {
  bool full_programs;     /* the full instructions (lprog.ins), for the
                           * commands that print or run programs; else only
                           * the lops the analyses read */
} lower_opts;

/* Orders every device's sub-operators by the plan's schedule, places the
 * communication, and emits each device's program, checking dependencies
 * (rule 4) as it goes. Order and deadlock freedom (rule 3) and memory
 * (rule 5) are the validate stage's (validate.h): a program is sound once
 * validate_program accepts it. NULL after diagnostics in dg; the program
 * lives in a. */
weft_program *lower_plan(weft_plan *p, const lower_opts *o, arena *a, weft_diags *dg);

/* Fuses the gradient all-reduces of each group into buckets (plan.h,
 * bucket_bytes); lower_plan calls it once the programs are emitted. */
void lower_buckets(arena *a, weft_program *pr);

/* Output. `device` < 0: every device. */
void lower_print_text(const weft_program *pr, int device, FILE *out);
void lower_print_json(const weft_program *pr, int device, FILE *out);
void lower_print_grid(const weft_program *pr, FILE *out);

/* What an instruction is on a timeline (weft estimate --trace and --svg,
 * weft run --trace): its category, -1 for an alloc or a free ... */
typedef enum { LCAT_FWD, LCAT_BWD, LCAT_RECOMP, LCAT_OPT, LCAT_COLL, LCAT_P2P, LCAT_GRAD, LCAT_COUNT } lower_cat;
extern const char *const lower_category_names[LCAT_COUNT];
/* each one's colour in pictures (weft estimate --svg, the CUDA backend's
 * NVTX ranges), 0xRRGGBB */
extern const uint32_t lower_category_rgb[LCAT_COUNT];
int lower_category(const weft_program *pr, const lins *in);
/* ... and its fields in a Chrome trace event: "name" (the operator,
 * direction and micro-batch; the tensor a step updates; the kind and
 * tensor of a communication), "cat", and "args" (the micro-batch; a
 * communication's bytes and group, then `args`, more members of it, when
 * not NULL). Written without braces. */
void lower_print_event(const weft_program *pr, const lins *in, const char *args, FILE *out);
/* Its "name" alone, as snprintf writes it (what it would take, less the
 * 0, if n is too small). */
int lower_event_name(const weft_program *pr, const lins *in, char *buf, size_t n);

/* The schedule stage of operator op: the plan's, 0 without stages. */
static inline int lower_stage_of(const weft_program *pr, int op) {
  int st = pr->p->ops[op].stage;
  return st >= 0 ? st : 0;
}

/* ---- walking the programs together -----------------------------------------
 * The deadlock check (validate.h) and the simulator (sim.h) both run every
 * program as far as it can go: a send posts its data and goes on, a
 * receive waits for it, a broadcast's root posts and its other members
 * wait, and a collective waits until each of its members has arrived. An
 * lwalk is what they share: who walks, where each one is, who meets whom
 * at each (comm, epoch), and whom to go on with next.
 *
 * Walkers are the devices with a program of their own that is not empty,
 * in device order; a data-parallel replica (plan.h, rep) walks as its
 * representative, and a collective's members are the walkers of its
 * devices, each once. Walkers go on from a stack, so that the members a
 * collective or a send frees walk on together, while what they touch is
 * in the caches; all start on it, walker 0 on top. */
/* Per comm, in one record (a walk meets comms out of order: one cache line
 * per comm), with what the walkers read of the plan's comm, gathered in
 * one pass when the walk starts. */
typedef struct lwalk_comm {
  int arrived[2];         /* per epoch: members counted */
  int moff, mcount;       /* its members in mpool (moff -1: not yet found) */
  int src, dst;           /* pcomm.src and dst */
  int ngroup;             /* pcomm.ngroup and group */
  const int *group;
  bool posted[2];         /* per epoch: a send's or broadcast's data is there */
  bool bcast;             /* a broadcast */
} lwalk_comm;

typedef struct lwalk {
  const weft_program *pr;
  int n;                  /* walkers */
  int *device;            /* per walker: its device */
  int *walker;            /* per device of the cluster: its walker, or its
                           * representative's; -1: none */
  int *pc;                /* per walker: how far it went (in the order the
                           * caller walks its program), from 0 */
  /* the rest is the walk's own (lower_walk_*) */
  int *stack, sp;
  bool *queued;           /* per walker: on the stack */
  bool *parked;           /* per walker: counted at the collective it waits at */
  lwalk_comm *wc;         /* per comm: what the walk keeps of it, and its
                           * source and whether it is a broadcast */
  int *mpool, mn, mcap;   /* the members of comms, each comm's in one run */
  int *stamp, stampv;     /* per walker: to take each member once */
} lwalk;

void lower_walk_init(lwalk *w, const weft_program *pr);
void lower_walk_free(lwalk *w);
/* The walker to go on with, -1 when none can. */
int lower_walk_next(lwalk *w);
/* A send, or a broadcast at its root, posts its data: the receivers (the
 * destination; every member of a broadcast) may go on. */
void lower_walk_post(lwalk *w, int comm, int epoch);
bool lower_walk_posted(const lwalk *w, int comm, int epoch);
/* Walker k at collective (comm, epoch): LW_NEW when this call counted its
 * arrival, LW_ALL when every member has arrived and k goes on, LW_LAST
 * when this call made it so (the others may go on); 0: k waits. */
enum { LW_NEW = 1, LW_ALL = 2, LW_LAST = 4 };
int lower_walk_meet(lwalk *w, int k, int comm, int epoch);
/* The members of comm, each once, in the order of its group. */
const int *lower_walk_members(lwalk *w, int comm, int *n);

/* The largest peak over devices, and its device. */
int64_t lower_peak(const weft_program *pr, int *device);
/* The memory of one device from the cluster, 0 if unknown. */
int64_t lower_device_memory(const weft_plan *p);

#endif
