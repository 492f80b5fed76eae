/* sim.h - the simulator of a lowered program: every device runs its
 * instructions on a compute stream and communication streams, each
 * instruction starting when its stream is free and what it reads is there;
 * collectives start when every member has arrived, a receive ends when the
 * matching send's data has arrived. One run gives the step time, busy and
 * idle time per device, the pipeline bubble and the memory timeline. */
#ifndef WEFT_SIM_H
#define WEFT_SIM_H

#include "weft/cost.h"

typedef enum {
  SS_COMPUTE,             /* sub-operators, copies, optimizer steps */
  SS_COLL,                /* collectives of activations and their gradients */
  SS_SEND,                /* point-to-point sends */
  SS_RECV,                /* point-to-point receives */
  SS_GRAD,                /* collectives of parameters and their gradients, in the order they are ready */
  SS_COUNT
} sim_stream;

extern const char *const sim_stream_names[SS_COUNT];

/* Live bytes after an event of the memory timeline. */
typedef struct sim_mem {
  double t;
  int64_t live;
} sim_mem;

typedef struct sim_dev {
  int device;
  int weight;             /* devices it stands for (itself and its data-parallel replicas) */
  int n;                  /* instructions */
  double *start, *end;    /* per instruction (SIM_TIMELINE, else NULL); alloc and free take no time */
  signed char *stream;    /* per instruction (SIM_TIMELINE), -1 for alloc and free */
  double busy[SS_COUNT];
  double finish;          /* its last instruction's end */
  double compute_end;     /* its last compute's end */
  double wait_pipeline;   /* compute idle waiting for a receive, plus the tail of a pipeline stage */
  double wait_comm;       /* compute idle waiting for a collective */
  double flops, bytes;    /* work and memory traffic of its kernels */
  double sent[2];         /* bytes it sends: inside its node, across nodes */
  double sent_kind[COMM_KIND_COUNT];
  int64_t peak;           /* most bytes live at once in the simulated timeline */
  double peak_t;
  int peak_at;            /* the instruction whose allocation reaches the peak, -1 none */
  int64_t peak_by_role[LB_ROLE_COUNT];  /* the bytes live at the peak, by buffer role */
  int nmem;
  sim_mem *mem;           /* the timeline, sorted by time (SIM_TIMELINE, else NULL) */
} sim_dev;

typedef struct weft_sim {
  const weft_program *pr;
  const hw_model *hw;     /* NULL: symbolic, no times; else &hwm */
  hw_model hwm;           /* the simulation's copy of the hardware model */
  int ndev;               /* simulated devices (those with a program that represent themselves) */
  sim_dev *dev;
  int *index;             /* per device of the cluster: its entry in dev, or that of its representative; -1 none */
  double step_time;
  int devices_used;       /* devices with a program, replicas included */
} weft_sim;

/* What a run keeps beyond the figures: SIM_TIMELINE, the start and end of
 * every instruction and the memory timeline (for the trace and the picture). */
enum { SIM_TIMELINE = 1 };

/* Runs the program; NULL only when the programs cannot finish (which
 * validate_program rules out, walking them the same way: lower.h, lwalk).
 * hw NULL counts FLOPs and bytes only, and
 * the peaks are the program order's. sim_run keeps the timeline. */
weft_sim *sim_run(const weft_program *pr, const hw_model *hw);
weft_sim *sim_run_with(const weft_program *pr, const hw_model *hw, unsigned flags);
/* The run the memory rule uses: with the hardware model of the plan's
 * cluster when it has one (hw_from_plan), else symbolic. */
weft_sim *sim_run_plan(const weft_program *pr, unsigned flags);
void sim_free(weft_sim *s);

/* What an instruction is, for a message ("the forward of h.0.mlp,
 * micro-batch 3"); peers are not named (a replica's are renamed). */
const char *sim_ins_what(const weft_program *pr, const lprog *pg, int i, char *buf, size_t n);
/* Where a device's peak is reached: "instruction 57 (the forward of h.0.attn,
 * micro-batch 0), 1.2 ms into the simulated step"; "" when unknown. */
const char *sim_peak_where(const weft_sim *s, const sim_dev *D, char *buf, size_t n);
/* Bytes by buffer role: "parameters 3.8 GiB, gradients ..., inputs 1.0 MiB". */
const char *sim_roles_text(const int64_t *by_role, char *buf, size_t n);

/* ---- the estimate: figures for people and for the search ---------------- */

typedef struct weft_estimate {
  bool symbolic;
  double step_time;
  double tokens;          /* per step */
  double model_flops;     /* per step, forward and backward once */
  double hw_flops;        /* per step, as run (recomputation included) */
  double tflops_per_device, mfu, bubble_fraction;
  double peak_rate;       /* dense FLOP/s of the model's dtype */
  int64_t peak_max;
  int peak_device;
  int64_t device_memory;
  bool fits;
  int over_devices;       /* devices whose peak exceeds device_memory */
  double comm_kind[COMM_KIND_COUNT];  /* bytes sent per step, all devices */
  double comm_level[2];
  /* --cost symbolic: the step on the nominal machine (cost.h, hw_nominal),
   * a scalar that orders plans without a cluster's figures; -1 unset */
  double symbolic_step;
  double symbolic_bubble;
} weft_estimate;

void sim_estimate(const weft_sim *s, weft_estimate *e);

/* Output (estimate_print.c). */
void estimate_print_text(const weft_sim *s, const weft_estimate *e, FILE *out);
void estimate_print_json(const weft_sim *s, const weft_estimate *e, FILE *out);
/* The devices a trace or a picture shows: a device of the cluster and its
 * entry in weft_sim.dev (its own, or its representative's: the same
 * timeline with devices renamed). */
typedef struct sim_row {
  int device, sim;
} sim_row;

/* Rows for the devices want[0..n) (NULL: the simulated devices, or 64 of
 * them spread evenly when there are more); out holds n or 64 rows. Returns
 * the count; a device the plan does not use gives no row. */
int sim_rows(const weft_sim *s, const int *want, int n, sim_row *out);
enum { SIM_ROWS_DEFAULT = 64 };

/* Chrome trace JSON: one process per row's device, one thread per stream. */
void estimate_print_trace(const weft_sim *s, const sim_row *rows, int nrows, FILE *out);
/* The space-time picture: the rows' devices against time. */
void estimate_print_svg(const weft_sim *s, const sim_row *rows, int nrows, FILE *out);

#endif
