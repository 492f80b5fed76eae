/* plan.h - the plan IR: split trees, sub-operators with their regions and
 * devices, and the communication that preserves data dependencies. */
#ifndef WEFT_PLAN_H
#define WEFT_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "weft/cluster.h"
#include "weft/decisions.h"
#include "weft/graph.h"

/* ---- iteration spaces ------------------------------------------------------
 * An operator's iteration space is a list of idims: one per plain signature
 * dimension, one per element of a `b..` group, one per factor of a group
 * dimension `(3 n dh)`. Every tensor dimension an operator reads or writes is
 * a product of idims (outermost first): a plain dimension is one idim, a
 * group dimension several. */

typedef struct idim {
  const char *sig;        /* the signature's name ("m", "k", "n"; "3" for a literal factor) */
  int elem;               /* element within a `b..` group, else 0 */
  const char *dim_name;   /* the model's dimension name ("batch", "hidden") or NULL */
  int64_t size;
  bool reduce;            /* k+: splitting it gives partial sums of the result */
  bool nosplit;           /* h^, or a literal factor */
} idim;

/* How one tensor of an operator maps onto its idims. */
typedef struct tmap {
  int tensor;             /* graph tensor index */
  int ndims;
  int *nfactors;          /* per tensor dimension */
  int **factors;          /* per tensor dimension: idim indices, outermost first */
} tmap;

typedef struct opspace {
  int nidims;
  idim *idims;
  int ninputs;            /* tensor arguments, in signature order */
  tmap *inputs;
  tmap output;
} opspace;

/* Builds the iteration space of graph operator op (arena memory). */
opspace *opspace_build(arena *a, const weft_graph *g, int op);

/* ---- split trees ----------------------------------------------------------- */

typedef enum {
  SPLIT_DIM,      /* D: ranges of an idim, one part per device */
  SPLIT_VALUE,    /* V: ranges of a reduction idim: partial sums */
  SPLIT_TIME,     /* T: ranges of an idim, run one after another (micro-batches) */
  SPLIT_REPLICA,  /* R: the whole space, copies */
} split_kind;

typedef struct psplit {
  split_kind kind;
  int idim;               /* -1 for SPLIT_REPLICA */
  int parts;
  const char *axis;       /* "tp", "mb", or "#1" for an unnamed level */
  weft_loc loc;           /* the statement that made it */
} psplit;

/* A half-open range of indices. */
typedef struct irange {
  int64_t lo, hi;
} irange;

/* A region of one tensor dimension: sorted, disjoint intervals of the flat
 * index (a split of an inner factor of a group dimension is strided). */
typedef struct dregion {
  int n;
  irange *iv;
} dregion;

/* A region of a tensor: one dregion per tensor dimension. */
typedef struct tregion {
  int ndims;
  dregion *dims;
} tregion;

typedef enum { DIR_FORWARD, DIR_BACKWARD, DIR_OPTIMIZER } sub_dir;

/* A sub-operator: one leaf of a split tree, in one direction. */
typedef struct psub {
  int op;                 /* graph operator (for DIR_OPTIMIZER: graph tensor of the parameter) */
  sub_dir dir;
  int *coord;             /* one index per split level of its operator */
  irange *range;          /* per idim of the operator's space */
  int device;             /* -1 until assigned */
  int microbatch;         /* flattened SPLIT_TIME coordinates, 0 without */
  int order;              /* position in its device's order, -1 before ordering */
} psub;

/* The plan of one forward operator. */
typedef struct popplan {
  opspace *space;
  int nsplits;
  psplit *splits;         /* outermost first */
  int first, count;       /* its forward sub-operators: subs[first .. first+count) */
  bool assigned;
  weft_loc assign_loc;
  int recompute;          /* 0 none, 1 selective, 2 full */
  int rseg;               /* recomputation segment (ops recomputed together), -1 */
  int stage;              /* index in plan->stages, or -1 */
} popplan;

typedef struct pstage {
  const char *name;
  int nops;
  int *ops;
  weft_loc loc;
} pstage;

/* ---- communication --------------------------------------------------------- */

typedef enum {
  COMM_NONE,              /* the consumer already holds what it needs */
  COMM_SLICE,             /* local: a part of what the device holds */
  COMM_SEND,              /* point to point: one piece from one device to another */
  COMM_ALL_REDUCE,
  COMM_REDUCE_SCATTER,
  COMM_ALL_GATHER,
  COMM_ALL_TO_ALL,
  COMM_BROADCAST,
  COMM_KIND_COUNT
} comm_kind;

extern const char *const comm_kind_names[COMM_KIND_COUNT];

typedef enum {
  PHASE_FORWARD,          /* activations, to their consumers */
  PHASE_BACKWARD,         /* gradients of activations, back to their producers */
  PHASE_WEIGHTS,          /* gradients of parameters, summed (or reduce-scattered under ZeRO) */
  PHASE_PARAMS,           /* parameters gathered from their ZeRO shards */
  PHASE_COUNT
} comm_phase;

extern const char *const comm_phase_names[PHASE_COUNT];

/* One communication that feeds consumers of a tensor. */
typedef struct pcomm {
  comm_kind kind;
  bool stats;             /* ALL_GATHER: the per-row statistics the vocabulary
                           * shards of consumer_op (a cross entropy) gather;
                           * region and parts in their own index space
                           * (docs/program.md), not tensor's values */
  int tensor;             /* graph tensor */
  comm_phase phase;       /* forward activations, their gradients, or parameter gradients */
  int ngroup;
  int *group;             /* devices taking part, in rank order */
  int src, dst;           /* COMM_SEND/COMM_BROADCAST: source (and destination) device */
  tregion region;         /* the region moved (whole tensor: all dims full) */
  tregion *parts;         /* REDUCE_SCATTER and ALL_TO_ALL: the part of region each
                           * member ends with; ALL_GATHER: the part each member
                           * starts with; in group order; NULL for other kinds */
  bool *silent;           /* ALL_REDUCE: per member, whether it takes the sum without
                           * adding its own (a further copy of a part another member
                           * brings); NULL: every member adds */
  tregion *sources;       /* ALL_TO_ALL: the part each member starts with; member
                           * i sends member j sources[i] ∩ parts[j] */
  int nomit;              /* a gradient's ALL_REDUCE (or ZeRO's REDUCE_SCATTER of a */
  int *omit;              /* parameter's): members that leave one consumer's part
                           * out of what they add (a copy of a replicated consumer
                           * that another member brings): nomit pairs (device,
                           * consumer operator) */
  tregion *from;          /* SEND of a gradient's piece that the sender may hold
                           * in several buffers (one consumer's region inside
                           * another's): the region of the buffer it is taken
                           * from; NULL: the sender's newest that holds it */
  int64_t size;           /* bytes of the region moved or reduced */
  int64_t bytes;          /* bytes each member sends (ring algorithms) */
  int level;              /* 0 inside a node, 1 across nodes */
  int producer_sub, consumer_sub;  /* for COMM_SEND: the sub-operators it joins, else -1 */
  int consumer_op;        /* the operator it feeds (forward), or -1 */
  int input;              /* which input of consumer_op */
  sub_dir dir;            /* PHASE_PARAMS: the direction of consumer_op's use it
                           * gathers for (ZeRO-3), or DIR_OPTIMIZER: after the
                           * optimizer step (ZeRO-1 and 2) */
  bool stage_edge;        /* part of a transfer between pipeline stages
                           * (scatter-gather's sends and gather) */
  const char *why;        /* a sentence for `weft explain` */
  int mb;                 /* the micro-batch it moves, when the plan was folded
                           * and the tensor moves with micro-batches; else -1 */
} pcomm;

/* `order A before B`: on every device that runs both, A's sub-operators of
 * a block come before B's. */
typedef struct porder {
  int na, nb;
  int *a, *b;
  weft_loc loc;
} porder;

/* ZeRO: how a parameter's data-parallel copies are sharded over an axis. */
typedef struct pzero {
  int stage;              /* 0 none; 1 optimizer state; 2 and gradients; 3 and parameters */
  const char *axis;       /* the axis its copies differ along ("dp") */
  weft_loc loc;           /* the `shard` statement */
} pzero;

/* Micro-batch folding. When every operator is split in time the same way
 * (one `in time` level of the same parts, the moving dimension of every
 * tensor agreed on by all its operators, device expressions blind to the
 * time axis), micro-batches differ only by a shift along that dimension:
 * sub-operators are made, placed and fed for micro-batch 0 alone, and
 * plan_unfold makes the others by shifting. */
typedef struct pfold {
  int nmb;                /* micro-batches folded; 0: the plan is not folded (any more) */
  int mbs;                /* micro-batches of a plan that was folded: tdim and
                           * tstep stay valid after plan_unfold; else 0 */
  int *tlevel;            /* per op: its time split level */
  int64_t *step;          /* per op: offset of the time idim per micro-batch */
  int *tdim;              /* per tensor: the dimension that moves, -1 none */
  int64_t *tstep;         /* per tensor: its flat offset per micro-batch */
  int *twin;              /* after plan_unfold: per sub-operator, the same one
                           * at micro-batch 0 (itself there); NULL when the
                           * plan was not folded */
} pfold;

typedef struct weft_plan {
  const char *name;
  weft_loc loc;
  weft_graph *g;
  const vrecord *cluster; /* the cluster's record (weft_build_cluster) */
  weft_decisions decisions; /* what the plan was built from, in order */
  int ndevices;
  int devices_per_node;
  popplan *ops;           /* per graph operator */
  psub *subs;
  int nsubs, scap;
  pmesh *meshes;
  int nmeshes, mcap;
  pstage *stages;
  int nstages, stcap;
  pcomm *comms;
  int ncomms, ccap;
  pzero *zero;            /* per graph tensor (parameters only) */
  sched_kind sched;
  weft_loc sched_loc;
  const struct ast *grid; /* SCHED_GRID: the S_SCHEDULE statement */
  porder *orders;
  int norders, orcap;
  int nsegs;              /* recomputation segments */
  pfold fold;             /* micro-batches folded until plan_unfold */
  int64_t nsubs_all;      /* forward sub-operators of the whole plan (subs
                           * may hold only some devices' after plan_unfold) */
  int used_devices;       /* devices holding a sub-operator */
  int comm_copies;        /* > 0: the forward and backward communication is
                           * one data-parallel replica's, which stands for
                           * comm_copies replicas (deps.h, deps_view) */
  int64_t comm_bytes[PHASE_COUNT][COMM_KIND_COUNT];  /* per step, all devices */
  int comm_count[PHASE_COUNT][COMM_KIND_COUNT];
  int64_t bucket_bytes;   /* `buckets SIZE`: gradient all-reduces of one group
                           * fused up to this many bytes; 0: not fused */
  weft_loc bucket_loc;
  bool *sum_grads;        /* per tensor: a producer sums the pieces of its
                           * gradient it holds, which its consumers gave in
                           * different layouts (deps.c); NULL: none */
  int *rep;               /* per device: the device whose program it runs,
                           * renamed (data-parallel replicas, tensor-parallel
                           * peers); NULL when every
                           * device is its own */
} weft_plan;

/* Gradient all-reduces are fused into buckets of up to this many bytes
 * unless the plan says otherwise (PyTorch DDP's default, 25 MiB). */
#define PLAN_DEFAULT_BUCKET ((int64_t)25 << 20)

/* Regions. */
void tregion_of(arena *a, const weft_plan *p, const psub *s, const tmap *m, tregion *out);
/* A copy in arena a. */
tregion tregion_copy(arena *a, const tregion *r);
bool tregion_equal(const tregion *x, const tregion *y);
bool tregion_contains(const tregion *outer, const tregion *inner);
/* Intersection; false when empty. */
bool tregion_intersect(arena *a, const tregion *x, const tregion *y, tregion *out);
/* Whether the intersection would be non-empty. */
bool tregion_overlaps(const tregion *x, const tregion *y);
int64_t tregion_numel(const tregion *r);
/* "[0:512, 1024:1536)" style text for messages. */
const char *tregion_str(arena *a, const tregion *r);

/* ---- apply: decisions to the plan IR ------------------------------------------
 * The only way into the plan IR. A plan is built against one graph and one
 * cluster, which many plans may share; everything it allocates comes from
 * the arena it is given, and its diagnostics go to dg. Decisions are
 * applied in order, each checked against those before it (a split names a
 * dimension of its operators, a shard an axis they are split along, ...);
 * plan_finish then makes the sub-operators, places them, derives the
 * communication (deps.h) and finds data-parallel replicas. */

typedef struct plan_opts {
  bool reps;              /* find data-parallel replicas and tensor-parallel
                           * peers (plan.h, rep): programs are lowered once
                           * per class */
  bool rooted;            /* with reps: device `root` represents its class, so
                           * that its own program is lowered exactly (a rank
                           * of a run, `weft lower --device N`) */
  int root;
} plan_opts;

typedef struct plan_builder plan_builder;

plan_builder *plan_begin(const weft_graph *g, const weft_cluster *cl, const char *name, weft_loc loc,
                         const plan_opts *o, arena *a, weft_diags *dg);
/* Applies one decision; false after a diagnostic (the builder is then done). */
bool plan_add(plan_builder *b, const decision *d);
/* The plan, or NULL after diagnostics. pl places the assignments given as
 * expressions (NULL when there are none). */
weft_plan *plan_finish(plan_builder *b, const dec_placer *pl);
/* All at once: begin, add every decision, finish. The plan is named and
 * placed as the list says. */
weft_plan *plan_apply(const weft_graph *g, const weft_cluster *cl, const weft_decisions *d, const plan_opts *o,
                      arena *a, weft_diags *dg);

int plan_devices_used(const weft_plan *p);
/* "h.0.attn.c_attn at tp = 1 (of 4)": a sub-operator by its coordinates, for messages. */
const char *plan_sub_where(arena *a, const weft_plan *p, const psub *s);

/* Makes the sub-operators and communication of every micro-batch from
 * those of micro-batch 0 (a folded plan; nothing otherwise). keep: per
 * device, whether its sub-operators are kept (NULL: all). */
void plan_unfold(arena *a, weft_plan *p, const bool *keep);
/* What plan_unfold would make: sub-operators and communications. */
void plan_unfold_size(const weft_plan *p, const bool *keep, int64_t *nsubs, int64_t *ncomms);
/* Region r of tensor t moved to micro-batch mb of a folded plan. */
tregion fold_shift(arena *a, const weft_plan *p, int t, const tregion *r, int mb);

/* Sub-operators of forward operator op. */
static inline psub *plan_subs_of(const weft_plan *p, int op) { return &p->subs[p->ops[op].first]; }

#endif
