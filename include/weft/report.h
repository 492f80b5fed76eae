/* report.h - the layer the command line calls: each function drives the
 * stages (evaluate, apply, lower, validate, estimate, run) for one task and
 * reports its result, as text or JSON. Tools and tests may call it too. */
#ifndef WEFT_REPORT_H
#define WEFT_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "weft/backend.h"
#include "weft/plan.h"
#include "weft/workspace.h"

/* What a task is asked to do: the command line's arguments, parsed. */
typedef struct weft_opts {
  const char **files;     /* the files (explain: the file, then operators) */
  int nfiles;
  const char **sets;      /* --set NAME=VALUE */
  int nsets;
  const char *model;      /* graph --model */
  const char *plan;       /* --plan */
  const char *stdlib_dir; /* --stdlib */
  const char **allow_paths; /* --allow-path DIR: more directories `use` may read */
  int nallow_paths;
  bool json, dot, write, check, roundtrip, grid;
  int device;             /* lower --device N, or -1 */
  const char *trace;      /* estimate --trace FILE, run --trace FILE */
  int64_t trace_step;     /* run --trace-step N, 0: the last step */
  const char *svg;        /* estimate --svg FILE */
  const char *devices;    /* estimate --devices LIST, or NULL */
  bool symbolic;          /* estimate --cost symbolic */
  int steps;              /* run --steps */
  uint64_t seed;          /* run --seed */
  const char *load, *inputs, *save, *resume;  /* run's files */
  bool run_check;         /* run --check */
  bool allow_native;      /* run --allow-native */
  bool deterministic;     /* run --deterministic */
  bool kernels;           /* backends --kernels */
  bool allow_nonfinite;   /* run --allow-nonfinite */
  double timeout;         /* run --timeout SECONDS, 0: the default */
  const char *rendezvous; /* run --rendezvous: how processes share a communicator's id (cuda) */
  const weft_backend *backend; /* run --backend, NULL: the first of the build */
  bool seed_given;        /* --seed given (else a checkpoint's) */
  /* run: the schedule, clipping, data, evaluation, logs (docs/run.md). A
   * setting whose _set flag is false was not given: the checkpoint's, else
   * the default, is taken */
  double lr, lr_min, clip;
  int64_t warmup, decay_steps;
  bool lr_set, lr_min_set, clip_set, warmup_set, decay_set;
  const char *lr_schedule;  /* constant, cosine, linear; NULL: not given */
  const char *data, *val_data; /* token files (a glob of shards) */
  int data_bytes;         /* tokens of files without a header: 2 (0: 2) or 4 */
  int64_t eval_every;     /* 0: evaluate after the last step only */
  int64_t eval_steps;     /* validation batches; 0: 10 */
  int64_t save_every;     /* 0: no checkpoint during the run */
  int64_t keep;           /* periodic checkpoints kept; 0: all */
  int64_t print_every;    /* 0: 1 */
  const char *log;        /* JSON lines, one per step */
  int color;              /* -1 auto, 0 never, 1 always */
  int max_errors;
  /* weft search */
  const char *cluster;    /* --cluster EXPR */
  const char *output;     /* -o FILE */
  int objective;          /* SEARCH_TIME or SEARCH_MEMORY */
  const char *max_memory; /* --max-memory QUANTITY, as written */
  int top;                /* --top K */
  int pick;               /* --pick N, -1: the objective's */
  double time_limit;      /* --time-limit SECONDS */
  int progress;           /* search, run: -1 on a terminal, 0 never, 1 always */
  bool no_buckets;        /* --no-buckets */
  const char **heuristics; /* --heuristic FILE.lua or NAME, in order */
  int nheuristics;
  int64_t lua_steps;      /* --lua-steps N, 0: the default */
  const char *lua_memory; /* --lua-memory QUANTITY, as written */
} weft_opts;

/* The tasks, one per command. Each returns the exit status: WEFT_OK,
 * WEFT_REJECTED (the input, with diagnostics) or WEFT_FAILED. */
int report_check(const weft_opts *o);
int report_fmt(const weft_opts *o);
int report_graph(const weft_opts *o);
int report_explain(const weft_opts *o);
int report_lower(const weft_opts *o);
int report_estimate(const weft_opts *o);
int report_run(const weft_opts *o);
int report_search(const weft_opts *o);
int report_backends(const weft_opts *o);

/* Evaluates a plan value and applies its decisions: the plan, or NULL after
 * diagnostics in c. o may be NULL. */
weft_plan *weft_build_plan(weft_ctx *c, value plan, weft_loc use, const plan_opts *o);

#endif
