/* search.h - plans written for a model and a cluster: tensor parallelism
 * chosen per operator from its signature (a dynamic program over each
 * repeated block, searched once), pipeline stages over the blocks (a
 * dynamic program over stage boundaries), data parallelism, micro-batches,
 * schedules, recomputation and ZeRO around them; a frontier of step time
 * against memory kept at every step; the best candidates built as decision
 * lists and simulated, their buckets searched with the simulator. The
 * method, and the papers each part comes from, are in docs/search.md. */
#ifndef WEFT_SEARCH_H
#define WEFT_SEARCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "weft/cost.h"
#include "weft/decisions.h"

enum { SEARCH_TIME, SEARCH_MEMORY };

/* What the search reports while it works. */
typedef struct search_progress {
  int64_t searched, pruned;
  double best_time;       /* seconds, the best so far (0: none yet) */
  double elapsed;
  const char *phase;      /* "search", "simulate", "buckets" */
} search_progress;

/* A list of the values one decision may take. */
typedef struct search_values {
  int n;
  int *v;
} search_values;

/* The space the search covers: the values each decision may take, every
 * combination tried that the model and the cluster allow. The search
 * starts from its own (tp: powers of two up to a node; pp: up to the
 * repeated blocks; cp: powers of two up to 64 where the model takes
 * context parallelism; ep: the divisors of the experts' count where the
 * model has experts; micro-batch sizes up to 64; every schedule,
 * recomputation and ZeRO stage; uneven stages) and a hook may narrow or
 * widen it. */
typedef struct search_space {
  search_values tp, pp;
  search_values cp;        /* context parallelism (models whose every operator splits along the sequence) */
  search_values ep;        /* expert parallelism (models with experts), inside the data-parallel devices */
  search_values mbs;       /* micro-batch sizes */
  bool schedule[SCHED_INTERLEAVED + 1];  /* SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED: of pipelines (pp > 1) */
  search_values interleave; /* stages per device of the interleaved schedule (2 or more) */
  bool recompute[3];       /* none, selective, full */
  bool zero[4];
  bool uneven;             /* a pipeline's stages may hold different numbers of blocks */
  bool nonuniform;         /* a pipeline's stages may have meshes of different shapes: each
                            * stage its own tp and dp on its own devices */
  bool frontier;           /* the inter-stage pass gives each pipeline's frontier of time
                            * against memory (its fastest under ever lower caps), not its
                            * fastest only */
} search_space;

struct search_plan;

/* Heuristics the search calls (weft search --heuristic: src/script), each
 * may be NULL. A hook that fails has put its diagnostics in the search's
 * and stops the search. */
typedef struct search_hooks {
  /* narrows or widens the space (new lists in a); false: failed */
  bool (*space)(void *ctx, search_space *s, arena *a);
  /* 1 keeps candidate c, 0 drops it, -1 failed; called for every candidate
   * costed, and again with the simulator's figures */
  int (*prune)(void *ctx, const struct search_plan *c);
  /* c's place in the order, lowest first, in place of its step time
   * (c->rank holds the order so far); false: failed */
  bool (*rank)(void *ctx, const struct search_plan *c, double *rank);
  void *ctx;
} search_hooks;

/* What a plan writes beside its `search` statement. The search keeps
 * every written decision in every candidate, in its place around the ones
 * it writes, and searches only what the plan leaves out: a written mesh
 * fixes tp, pp, dp (cp, ep), a written schedule, recomputation, ZeRO stage,
 * bucket size or split into micro-batches fixes that. search_fixed_read finds it in a plan's
 * decisions. */
typedef struct search_fixed {
  const weft_decisions *written; /* the plan's decisions */
  int at;                  /* `search` stands before written->items[at] */
  int mesh;                /* the written mesh, an index into written (-1: searched) */
  const char *mesh_name;
  int tp, pp, dp, cp, ep;  /* its axes' sizes (1: an axis it does not have) */
  int schedule;            /* the written schedule, a sched_kind (-1: searched) */
  int recompute;           /* the written recomputation, 1 selective, 2 full (-1: searched) */
  int zero;                /* the highest ZeRO stage written (-1: searched) */
  int64_t buckets;         /* the written bucket size in bytes (-1: searched) */
  int micro_batches;       /* a written split of every operator along the batch in
                            * time, before `search` (-1: searched) */
  int *tp_from;            /* per graph operator: the written split or replication
                            * along tp that it is in, an index into written (-1:
                            * searched); NULL when none is written */
  int tp_parts;            /* the parts they make, which fixes tp (0: none written) */
  int tp_written;          /* operators with one */
  int *stages;             /* the written stages before `search`, indices into written,
                            * in pipeline order (each a run of the operators' order) */
  int nstages;             /* their count, pp x interleave (0: searched) */
} search_fixed;

typedef struct search_opts {
  int objective;          /* SEARCH_TIME: the fastest that fits; SEARCH_MEMORY: the smallest */
  double max_memory;      /* bytes a device may need; 0: the cluster's device memory */
  int top;                /* candidates lowered and simulated at the end (0: chosen by size) */
  bool symbolic;          /* rank by FLOPs and bytes per device, without the cluster's rates */
  double time_limit;      /* seconds for the search proper; 0: none */
  bool buckets;           /* search the gradient buckets of the best (DisCo) */
  void (*progress)(void *ctx, const search_progress *p);
  void *ctx;
  const search_hooks *hooks; /* NULL: none */
  const search_fixed *fixed; /* what a plan with `search` writes (NULL: nothing) */
} search_opts;

/* A pipeline stage: a range of operators (in graph order) on a range of
 * the mesh's pipeline positions. */
typedef struct search_stage {
  int first_op, last_op;  /* inclusive */
  int position;           /* its place on the pipeline axis */
  int layers;             /* repeated blocks it holds */
  int tp, dp;             /* a non-uniform plan's: the stage's own mesh [dp, tp]
                           * (0: the plan's) */
  int micro_batch_size;   /* a non-uniform plan's: rows per device per micro-batch */
  int recompute;          /* its blocks' recomputation: 0 none, 1 selective, 2 full (the
                           * plan's recompute gives the most common stage's) */
} search_stage;

/* One candidate: what it decides, and its figures. */
typedef struct search_plan {
  int tp, pp, dp, cp;
  int ep;                 /* expert groups: the experts split over ep, every other operator's
                           * batch over dp x ep (dp: the replicas of an expert group) */
  int micro_batches, micro_batch_size;
  sched_kind schedule;
  int interleave;         /* stages per pipeline position */
  int recompute;          /* 0 none, 1 selective, 2 full */
  int zero;               /* 0 to 3 */
  bool sequence_parallel; /* operators between tensor-parallel ones split along the sequence */
  bool nonuniform;        /* each stage on a mesh of its own shape (stages[k].tp, .dp): tp,
                           * dp and micro_batch_size then give the most common stage's */
  int64_t bucket_bytes;
  int nstages;
  search_stage *stages;
  const char **op_split;  /* per graph operator: the dimension its tensor-parallel
                           * level splits, "" replicated, NULL not split */
  double analytic_time;   /* seconds per step (symbolic: a weighted sum of FLOPs and bytes) */
  int64_t analytic_memory;/* bytes, the most any device needs */
  int64_t analytic_weights;/* of which parameters, gradients, master weights and
                           * optimizer state, on the device that keeps the most */
  bool simulated;
  double step_time;       /* the simulator's, when simulated */
  int64_t peak_memory;
  bool fits;
  double rank;            /* its place in the hooks' order (search_hooks.rank), else its step time */
  weft_decisions decisions;
  const char **selectors; /* per decision: its selector as weft source */
  int body_from, body_to; /* decisions [body_from, body_to) are the search's, the others
                           * a plan's written ones (body_to 0: all are the search's) */
} search_plan;

typedef struct search_result {
  search_plan *plans;     /* the simulated ones, non-dominated in (time, memory), fastest first */
  int nplans;
  int best;               /* the one the objective picks, -1 none fits */
  search_plan *simulated; /* every candidate simulated, fastest first */
  int nsimulated;
  int64_t searched, pruned;
  int rejected;           /* candidates built that lowering or validation refused */
  double search_s, simulate_s;
  int layers;             /* repeated blocks found (0: none) */
  const char *block;      /* their name ("h", "layers") */
  bool ranked;            /* plans are in the order of search_hooks.rank, the frontier
                           * is of rank against memory */
} search_result;

/* Searches plans of graph g on cluster cl. Everything lives in a; false
 * after diagnostics in dg (a cluster without rates, a model without a
 * batch dimension, ...). */
bool search_run(const weft_graph *g, const weft_cluster *cl, const search_opts *o, arena *a, weft_diags *dg,
                search_result *out);

/* What a plan with `search` writes: its decisions written[0..n), `search`
 * before written[at]. False after diagnostics in dg at the statements that
 * the search cannot keep (a split, a second mesh, a shard before
 * `search`, ...). */
bool search_fixed_read(const weft_decisions *written, int at, const weft_graph *g, const weft_cluster *cl,
                       weft_diags *dg, search_fixed *out);
/* What the search keeps of them ("mesh m [dp = 4, tp = 2], recompute full",
 * "nothing") and what it searches ("micro-batches, recompute, ..."). */
const char *search_fixed_kept(arena *a, const search_fixed *f);
const char *search_fixed_open(arena *a, const search_fixed *f);

/* The body of a plan's statements as weft source, one a line, indented by
 * two spaces: what the plan's decisions say, with its selectors (of a
 * candidate of a plan with `search`, the statements the search writes). */
void search_print_body(const search_plan *sp, const weft_graph *g, FILE *out);
/* "tp 2, pp 2, dp 2, 8 micro-batches of 1, one_f_one_b, ..." */
const char *search_describe(arena *a, const search_plan *sp);

#endif
