/* decisions.h - a plan as data: the list of primitive decisions (meshes,
 * splits, replications, stages, assignments, orders, schedules, recompute,
 * ZeRO shards, buckets) that `plan_apply` (plan.h) turns into the plan IR.
 *
 * Three front ends make decision lists: the evaluator of `plan` blocks
 * (src/eval/plan_eval.c, with the source location of every statement), the
 * search, and Lua policies. All go through the same apply, so a plan that
 * was written, searched or scripted is the same kind of object.
 *
 * Ownership: a decision points at arrays (operators, devices, names) that
 * the caller keeps alive as long as the plan built from it: in practice,
 * both live in one arena. */
#ifndef WEFT_DECISIONS_H
#define WEFT_DECISIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "weft/graph.h"

/* A device mesh: devices arranged along named axes ([dp = 2, tp = 4]). */
typedef struct pmesh {
  const char *name;
  int naxes;
  const char **axes;
  int *sizes;
  int *devices;           /* row-major, product of sizes */
  weft_loc loc;
} pmesh;

/* The schedule: how each device orders its blocks, a block being the
 * forward or backward sub-operators of one stage for one micro-batch. */
typedef enum {
  SCHED_DEFAULT,          /* every forward, then every backward (no statement) */
  SCHED_GPIPE,
  SCHED_1F1B,
  SCHED_INTERLEAVED,      /* 1F1B over several stages per device */
  SCHED_GRID,             /* a hand-written grid */
  SCHED_INTERLACED,       /* 1F1B over stages of their own devices, stages on all of them interleaved */
} sched_kind;

extern const char *const sched_kind_names[];

typedef enum {
  DEC_MESH,               /* name, axes and sizes, devices */
  DEC_SPLIT,              /* ops along dim into parts, level axis; in_time: micro-batches */
  DEC_REPLICATE,          /* ops into parts copies, level axis */
  DEC_STAGE,              /* a stage named name: ops */
  DEC_ASSIGN,             /* ops onto devices: a mesh indexed per sub-operator, or an expression */
  DEC_ORDER,              /* ops before after, on every device running both */
  DEC_SCHEDULE,           /* sched (and grid) */
  DEC_RECOMPUTE,          /* ops recomputed, in segments (keys), selective or full */
  DEC_SHARD,              /* ZeRO: the state of the parameters ops read, over axis */
  DEC_BUCKETS,            /* gradient all-reduces fused up to bytes */
  DEC_KIND_COUNT
} dec_kind;

extern const char *const dec_kind_names[DEC_KIND_COUNT];

/* Graph operators, by index. */
typedef struct dec_ops {
  int n;
  int *ops;
} dec_ops;

/* One index of an assignment's mesh: the sub-operator's coordinate along
 * its split level `axis`, or, when axis is NULL, the number value. */
typedef struct dec_index {
  const char *axis;
  int value;
} dec_index;

typedef struct decision {
  dec_kind kind;
  weft_loc loc;           /* the statement that made it; {0} when built in C */
  dec_ops ops;            /* the operators it concerns (DEC_ORDER: those before) */
  const char *name;       /* DEC_MESH, DEC_STAGE: its name; DEC_SPLIT: the
                           * dimension, a signature or a model dimension name */
  const char *axis;       /* DEC_SPLIT, DEC_REPLICATE: the axis of the level;
                           * DEC_SHARD: the axis the parameters' copies differ along */
  int parts;              /* DEC_SPLIT, DEC_REPLICATE */
  bool in_time;           /* DEC_SPLIT: parts run one after another */
  /* DEC_MESH */
  int naxes;
  const char **axes;
  int *sizes;
  int ndevices;
  int *devices;
  /* DEC_ASSIGN, as data: mesh `mesh` (an index into the meshes decided so
   * far) at idx[0..nidx), one index per axis; mesh -1: the device idx[0].value. */
  int mesh;
  int nidx;
  dec_index *idx;
  /* DEC_ASSIGN, as an expression of the language: evaluated for every
   * sub-operator by the front end that made it (weft_decisions.placer); the
   * names it mentions tell folding whether it reads the time axis. */
  const void *expr;
  int nnames;
  const char **names;
  /* DEC_ORDER */
  dec_ops after;
  /* DEC_SCHEDULE */
  sched_kind sched;
  const struct ast *grid; /* SCHED_GRID: the S_SCHEDULE statement */
  /* DEC_RECOMPUTE: per operator, its segment (operators with one key are
   * recomputed together); mode 1 selective, 2 full */
  const char **keys;
  int mode;
  /* DEC_SHARD: 1 optimizer state, 2 and gradients, 3 and parameters */
  int state;
  /* DEC_BUCKETS */
  int64_t bytes;
} decision;

/* A sub-operator as a front end places it: its operator and its
 * coordinate along each of the operator's split levels. */
typedef struct dec_sub {
  int op;
  int nsplits;
  const char *const *axes;  /* per level: its axis ("tp"; "#1" for an unnamed level) */
  const int *parts;         /* per level: its parts */
  const int *coord;         /* per level: the sub-operator's coordinate */
  const char *const *levels;  /* the axes of every split level of the plan */
  int nlevels;
} dec_sub;

/* How the front end that evaluated an assignment given as an expression
 * (decision.expr) places it: the device of one sub-operator, false after
 * a diagnostic. done, when not NULL, is called once apply is over. */
typedef struct dec_placer {
  bool (*device)(void *ctx, const decision *d, const dec_sub *s, int *device);
  void (*done)(void *ctx);
  void *ctx;
} dec_placer;

/* A plan as data: its decisions in order. */
typedef struct weft_decisions {
  const char *name;       /* the plan's name (NULL: "plan") */
  weft_loc loc;           /* where it was written ({0}: built in C) */
  decision *items;
  int n, cap;
  dec_placer placer;      /* for assignments given as expressions */
} weft_decisions;

/* Appends a decision of kind k (zeroed, mesh -1) and returns it. */
decision *dec_add(arena *a, weft_decisions *d, dec_kind k);

/* The operators of g whose names match a glob ("h.*.mlp.c_fc", "**.c_proj",
 * "all"): a name matches the pattern or lies under it ("h.3" selects
 * "h.3.attn.c_attn"). In a's memory; n is 0 when nothing matches. */
dec_ops dec_select(arena *a, const weft_graph *g, const char *pattern);

/* Shorthands for lists built in C. */
decision *dec_mesh(arena *a, weft_decisions *d, const char *name, int naxes, const char *const *axes,
                   const int *sizes, int first_device);
decision *dec_split(arena *a, weft_decisions *d, dec_ops ops, const char *dim, int parts, const char *axis);
decision *dec_replicate(arena *a, weft_decisions *d, dec_ops ops, int parts, const char *axis);
/* ops onto mesh `mesh` at idx (one per axis of the mesh). */
decision *dec_assign(arena *a, weft_decisions *d, dec_ops ops, int mesh, int nidx, const dec_index *idx);

#endif
