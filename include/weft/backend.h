/* backend.h - what runs a plan's lowered program (lower.h) for real: each
 * backend is one table of functions, found by name in the registry. */
#ifndef WEFT_BACKEND_H
#define WEFT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weft/lower.h"

/* ---- the world ---------------------------------------------------------------
 * The whole tensors a run starts from and ends with: what one device would
 * hold, in host memory. Every backend reads its parameters, optimizer state
 * and inputs from a world and writes parameters and state back; checkpoints
 * are worlds on disk. */

enum { WORLD_MAX_META = 32 };

typedef struct weft_world {
  const weft_graph *g;
  float **param;          /* per graph tensor: a parameter's numel values, else NULL */
  float **state;          /* per parameter: optimizer state, state_copies x numel */
  void **input;           /* per model input: float or int32_t, numel values, else NULL */
  const char *optimizer;  /* the optimizer's name ("adamw"), NULL when the model does not train */
  int state_copies;       /* state tensors per element: 2 AdamW (m, then v), 1 SGD with momentum, 0 none */
  const char *const *state_names; /* each one's name in a checkpoint: optim.NAME.PARAM */
  int64_t step;           /* optimizer steps taken so far, at most WORLD_MAX_STEP */
  bool allow_nonfinite;   /* loading keeps NaN and infinities (--allow-nonfinite) */
  /* What a checkpoint records of a run besides its tensors (the position
   * in the training data, the schedule): entries "train.NAME" of its
   * metadata, written by world_save and read back by world_resume. */
  int nmeta;
  char *meta_key[WORLD_MAX_META], *meta_val[WORLD_MAX_META];
} weft_world;

/* The largest step count a checkpoint may hold: far beyond any training,
 * and small enough that no count of steps after it overflows. */
#define WORLD_MAX_STEP INT64_C(1000000000000000)

/* A run's recorded setting (world_set_meta), or NULL. */
const char *world_meta(const weft_world *w, const char *key);
/* Sets one (both copied; the same key again replaces it). False when
 * there are WORLD_MAX_META already. */
bool world_set_meta(weft_world *w, const char *key, const char *value);

/* Floating tensors are f32 whatever their dtype (bf16 and f16 are held as
 * f32); i32 inputs are int32_t. */
weft_world *world_new(const weft_graph *g);
void world_free(weft_world *w);
/* An exact copy. */
weft_world *world_clone(const weft_world *w);

/* Parameters from the seed: matrices and embeddings normal with std 0.02,
 * biases 0, norm weights 1 (by the operator argument that reads them);
 * inputs: ids uniform below the table or classes they index, floating
 * inputs standard normal. Each tensor has its own stream, keyed by its
 * name, so values depend only on the seed and the name. */
void world_init_params(weft_world *w, uint64_t seed);
void world_init_inputs(weft_world *w, uint64_t seed);
/* The bound the ids of i32 input t must lie below. */
int64_t world_id_bound(const weft_graph *g, int t);

/* Parameters from a safetensors file by their model names: every parameter
 * present with its shape, no other tensor (entries optim.* aside), every
 * value finite unless w->allow_nonfinite. False with a message naming the
 * file and tensor (and the first element that is not finite). */
bool world_load_params(weft_world *w, const char *path, char *err, size_t errlen);
/* Inputs by the model's input names, the same checks; ids must lie below
 * world_id_bound. */
bool world_load_inputs(weft_world *w, const char *path, char *err, size_t errlen);
/* A checkpoint world_save wrote: parameters, optimizer state, step count;
 * *seed gets the seed it recorded (unchanged when absent or seed NULL).
 * Its metadata is checked as data: format, model and optimizer those of w,
 * step and seed whole decimal numbers in range; the state in its domain
 * (exp_avg_sq >= 0) and finite, as the parameters. */
bool world_resume(weft_world *w, const char *path, uint64_t *seed, char *err, size_t errlen);
/* Parameters by name, optimizer state as optim.NAME.PARAM, step and seed
 * in the metadata; written to a temporary file, synced and renamed. */
bool world_save(const weft_world *w, const char *path, uint64_t seed, char *err, size_t errlen);

/* ---- sharded checkpoints ------------------------------------------------------
 * A directory of shards, model-RRRRR-of-NNNNN.safetensors, one per process
 * of the run that saved it, each with the pieces of parameters and
 * optimizer state the devices of its process hold (boxes of the whole
 * tensors, the box recorded in its metadata), and the index
 * model.safetensors.index.json (safetensors.h): the run's metadata and the
 * box and shard of every piece. The devices of a program are spread over
 * the processes in blocks of consecutive devices, as the CPU backend runs
 * them; an element no device holds is saved by process 0. */

/* Whether a --save or --resume path names a set: it ends in '/'. */
bool world_sharded_path(const char *path);
/* Whether a set may be written at path: a new name in a directory weft may
 * write in, or a directory (not a link to one) that holds only a set's
 * files. False with "PATH: reason". */
bool world_sharded_target(const char *path, char *err, size_t errlen);
/* Meets every process of the run: true when every one passed ok. */
typedef bool (*world_agree_fn)(void *ctx, bool ok);
/* Writes the set of w as process rank of nprocs, which all call it with
 * the same w, pr and path: process 0 makes the directory .BASE.partial
 * beside path (removing one a killed save left), every process writes its
 * shard there, then process 0 the index, and puts the directory in place
 * of path in one rename (exchanged with the previous set, which is then
 * removed; where the file system cannot exchange, the previous set is
 * moved to .BASE.old first). Until that rename path holds the previous
 * set, whole. agree (NULL for one process) lets them meet between the
 * steps, so that all fail when one does. */
bool world_save_sharded(const weft_world *w, const weft_program *pr, int rank, int nprocs, const char *path,
                        uint64_t seed, world_agree_fn agree, void *ctx, char *err, size_t errlen);
/* Reads a set into w for process rank of nprocs running pr (another plan
 * and another count of processes than the run that saved it, as may be):
 * the pieces that meet what its devices hold, or all of them with `whole`;
 * the index and every piece read are checked as world_resume checks a
 * file (and every element of every tensor must lie in some piece). */
bool world_resume_sharded(weft_world *w, const weft_program *pr, int rank, int nprocs, bool whole, const char *path,
                          uint64_t *seed, char *err, size_t errlen);
/* Removes a set (a directory of a set's files only); absent is no error. */
bool world_remove_sharded(const char *path, char *err, size_t errlen);

/* The largest per-tensor relative L2 difference of parameters (and state
 * when `state`), ||a - b|| / ||b||; *worst names the tensor. */
double world_diff(const weft_world *a, const weft_world *b, bool state, const char **worst);
/* The relative L2 difference of all parameters taken as one vector. */
double world_diff_all(const weft_world *a, const weft_world *b);
/* Tokens (elements of the first i32 input) or samples (first dimension of
 * the first input) in a step; *unit is "tokens" or "samples". */
int64_t world_step_items(const weft_graph *g, const char **unit);

/* ---- backends ------------------------------------------------------------- */

/* The version of this table: a plugin built against another is refused.
 * 2: passes (backend_step, backend_result), on_memory; 3: kernels, probe,
 * tolerance, failure, describe, and backend_opts' deterministic,
 * allow_nonfinite and timeout_s; 4: agree; 5: backend_opts' rendezvous;
 * 6: devices_apart; 7: backend_step's trace, backend_opts' on_trace;
 * 8: backend_opts' label; 9: backend_result's setup_seconds. */
#define WEFT_BACKEND_VERSION 9

/* What a device's buffers took, as the backend measured it while the steps
 * ran: the most bytes of program buffers live at once (an element at the
 * size of its buffer's dtype, whatever the backend stores it in) and, at
 * that point, the bytes of each buffer role (lower.h, lbuf_role). */
typedef void (*backend_memory_fn)(void *ctx, int device, int64_t peak, const int64_t *by_role);

/* A piece of an instruction's work in a traced pass, as the backend ran
 * it: the plan device, the instruction's index in that device's program,
 * the lane it ran on (what the backend calls it, "thread", "stream": a
 * string that lasts as long as the run), and when it started and ended,
 * in seconds from the pass's start. An instruction may come in several
 * pieces (a collective's packing and its sum, launched apart). What the
 * times cover is the backend's (docs/run.md, Traces). */
typedef void (*backend_trace_fn)(void *ctx, int device, int ins, const char *lane, double start, double end);

/* An instruction as the run names it on timelines (weft run --trace,
 * weft estimate --trace; lower.h, lower_event_name and lower_category),
 * for a backend that labels its work for a profiler. */
typedef struct backend_label {
  char name[256];         /* "h.0.attn.core backward mb0", "step wte.weight", "all-reduce h.0.ln_1 (gradient)",
                           * "alloc h.0.ln_1.weight" */
  const char *category;   /* "forward", ... (lower_category_names); "memory" for an alloc or a free */
  int cat;                /* its index (lower_cat), -1 for memory */
  uint32_t rgb;           /* its colour in pictures, 0xRRGGBB */
} backend_label;
typedef void (*backend_label_fn)(void *ctx, int device, int ins, backend_label *out);

typedef struct backend_opts {
  bool allow_native;      /* operators with native kernels may load them */
  bool deterministic;     /* no kernel whose sums may run in another order
                           * from run to run (`weft run --deterministic`) */
  bool allow_nonfinite;   /* train on through a gradient that is NaN or
                           * infinite; else the pass fails at it */
  double timeout_s;       /* the longest a device or process waits for
                           * another (a message, a collective, a pass's
                           * end) before the run fails; 0: no limit */
  /* NULL, or called by `read` once for every device this process ran,
   * with what it measured (a backend that does not measure never calls it) */
  backend_memory_fn on_memory;
  void *ctx;
  /* how the processes of a run share the id of a communicator
   * (`weft run --rendezvous`): "mpi", "file:PATH", or NULL (MPI's when
   * mpirun started them) */
  const char *rendezvous;
  /* NULL, or called after a pass whose backend_step asks for a trace, once
   * for every piece of work of the instructions this process's devices ran
   * in it (of an allocation or a free only where it does work of its own,
   * such as clearing the buffer), with ctx */
  backend_trace_fn on_trace;
  /* NULL, or names instruction ins of a device's program (with ctx), for
   * a backend that labels its work for profilers (the CUDA backend's NVTX
   * ranges) */
  backend_label_fn label;
} backend_opts;

/* One pass of a run: a training step, or an evaluation of the loss. The
 * run layer (weft run) decides each one: the batch in the world's inputs,
 * the learning rate of the schedule, clipping. */
typedef struct backend_step {
  double lr;              /* the optimizer's learning rate for this step; NaN:
                           * the one of the model's `train` statement */
  double clip;            /* > 0: before the update, every gradient is
                           * multiplied by min(1, clip / (norm + 1e-6)), norm
                           * the L2 norm of all gradients together */
  bool eval;              /* the forward only: the loss of the world's inputs;
                           * nothing is updated and w->step stays */
  bool trace;             /* time every instruction and report them through
                           * backend_opts' on_trace (`weft run --trace`) */
} backend_step;

/* What a pass measured. */
typedef struct backend_result {
  double loss;            /* the loss of the batch */
  double grad_norm;       /* the L2 norm of all gradients together before
                           * clipping, every element of every parameter
                           * counted once however many devices hold a copy;
                           * NaN for an evaluation */
  double seconds;         /* its wall time */
  double setup_seconds;   /* of that time, one-time work that later passes
                           * do not repeat (a GPU backend choosing its
                           * kernels by timing them); 0 when none */
} backend_result;

/* A program opened on a world. */
typedef struct backend_run backend_run;

typedef struct weft_backend {
  int version;            /* WEFT_BACKEND_VERSION */
  const char *name;       /* what `weft run --backend` names */
  const char *summary;    /* one line: what it runs on */
  /* Where this process stands among those mpirun or srun started (rank 0
   * of 1 when alone), read before any is joined: process 0 speaks for all. */
  void (*procs)(int *rank, int *size);
  /* Loads native kernel "LIB:SYMBOL" (relative to dir) now, so that one
   * that is missing is reported where the plan names it. NULL when the
   * backend runs no native kernels. */
  bool (*load_native)(const char *spec, const char *dir, char *err, size_t errlen);
  /* Opens the program on w, joining the other processes of the run: the
   * parameters, optimizer state and inputs are read from w when the first
   * step starts. NULL with a message. */
  backend_run *(*open)(const weft_program *pr, weft_world *w, const backend_opts *o, char *err, size_t errlen);
  /* Runs one pass: reads the world's inputs (they may change between
   * passes), and for a training step updates the parameters and adds one
   * to w->step. False with a message; a run that failed runs no more. */
  bool (*run)(backend_run *r, const backend_step *s, backend_result *out, char *err, size_t errlen);
  /* Parameters and optimizer state back into w; under several processes
   * every one ends with the whole. False when copies of a parameter differ. */
  bool (*read)(backend_run *r, char *err, size_t errlen);
  /* Frees the run and leaves the other processes. */
  void (*close)(backend_run *r);
  /* The same pass without a plan, every operator on whole tensors on one
   * device in graph order, the backward in reverse, then the optimizer:
   * what `weft run --check` compares with. NULL when the backend has none. */
  bool (*reference)(const weft_graph *g, weft_world *w, const backend_step *s, backend_result *out,
                    const backend_opts *o, char *err, size_t errlen);
  /* Called once when weft starts, before any work (NULL: nothing to do):
   * stops what linking the backend started, such as a thread pool that
   * would spin beside every command. */
  void (*startup)(void);
  /* ---- version 3 ---- */
  /* What it runs, one line per kernel family, NULL-terminated (`weft
   * backends --kernels`); NULL: not listed. */
  const char *const *kernels;
  /* Whether it can run here: true with the machine it would use, false
   * with why not (no device). NULL: it always can. */
  bool (*probe)(char *msg, size_t msglen);
  /* --check's relative tolerance for model g (losses and parameters);
   * NULL: 1e-5. */
  double (*tolerance)(const weft_graph *g);
  /* The exit status the last failed open, run or read calls for: 1 when
   * it refused the input, 2 when the machine failed (no device, out of
   * memory, a device error). NULL: 1. */
  int (*failure)(void);
  /* The machine an open run uses, one line for people; NULL: none. */
  void (*describe)(backend_run *r, char *buf, size_t n);
  /* ---- version 4 ---- */
  /* Meets every process of an open run, between passes: true when every
   * one passed ok (a process that cannot meet the others ends the run).
   * NULL: the run has one process. */
  bool (*agree)(backend_run *r, bool ok);
  /* ---- version 6 ---- */
  /* Whether the devices' buffers live in memory of their own (a GPU's),
   * which the backend checks when it opens a run, not in this machine's:
   * `weft run` then counts only what the host holds (parameters,
   * optimizer state, inputs) against --max-memory. */
  bool devices_apart;
  /* ---- version 7 ---- */
  /* What the times of a traced pass cover (backend_trace_fn), one line
   * for people; NULL: the backend does not trace. */
  const char *trace_about;
} weft_backend;

/* The backend called name: one of this build's, or a plugin, libweft_NAME.so
 * beside the weft binary (or in WEFT_PLUGIN_DIR), loaded now: a backend that
 * needs libraries weft must run without, like CUDA's, whose table is the
 * plugin's symbol weft_backend_NAME. NULL with a message that lists the
 * backends there are. */
const weft_backend *backend_find(const char *name, char *err, size_t errlen);

/* This build's backends, plugins aside; the first is the default. */
const weft_backend *const *backend_builtin(int *n);
/* The names of the plugins the registry knows ("cuda"). */
const char *const *backend_plugins(int *n);
/* The file a plugin's table was loaded from (empty for a built-in one). */
void backend_origin(const weft_backend *b, char *path, size_t n);
/* Opens a plugin library: FILE in $WEFT_PLUGIN_DIR, beside the weft binary,
 * or in ../lib/weft from it (where `make install` puts plugins). NULL when
 * none loads; *found tells whether one existed; tried lists the places. */
void *backend_dlopen(const char *file, int flags, char *tried, size_t n, bool *found);
/* Runs the startup of every built-in backend. */
void backend_startup(void);

#endif
