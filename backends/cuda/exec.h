/* exec.h - the CUDA backend's executor: a lowered program opened on one GPU,
 * every plan device a virtual device with its own stream and pool, and the
 * plan-free reference; weft reaches it through the backend table (cuda.c). */
#ifndef WEFT_CUDA_EXEC_H
#define WEFT_CUDA_EXEC_H

#include "cuda/gpu.h"
#include "weft/backend.h"

typedef struct backend_run crun;

crun *crun_open(const weft_program *pr, weft_world *w, const backend_opts *o, char *err, size_t errlen);
bool crun_pass(crun *r, const backend_step *st, backend_result *out, char *err, size_t errlen);
bool crun_read(crun *r, char *err, size_t errlen);
void crun_close(crun *r);
void crun_describe(crun *r, char *buf, size_t n);
/* Meets every process of the run: true when all passed ok. */
bool crun_agree(crun *r, bool ok);
bool crun_reference(const weft_graph *g, weft_world *w, const backend_step *st, backend_result *out,
                    const backend_opts *o, char *err, size_t errlen);

/* Where this process stands among those mpirun or srun started, as the
 * CPU backend reads it: MPI's variables (Open MPI's, PMIx's, PMI's), else
 * Slurm's inside a job step (SLURM_PROCID, SLURM_NTASKS). With several,
 * each runs one plan device on the GPU of its rank on its machine. */
void crun_procs(int *rank, int *size);

/* What the last failure calls for: 1 when the input was refused, 2 when the
 * machine failed (no device, out of memory, a CUDA error). */
int crun_failure(void);
/* The GPU weft would use: its name and memory, or why there is none. */
bool crun_probe(char *msg, size_t n);

/* Shared with the reference (ref.c): the GPU of this process
 * (WEFT_CUDA_DEVICE, else the first), made current; the model's optimizer
 * (kind 1 AdamW, 0 SGD) and its settings; a message with the exit status
 * it calls for; bytes for people. */
bool crun_gpu(int *gpu, gpu_props *p, char *err, size_t errlen);
bool crun_optimizer(const weft_graph *g, int *kind, gpu_optim *o, char *err, size_t errlen);
bool crun_fail(char *err, size_t errlen, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
const char *crun_bytes(char *b, size_t n, double x);

#endif
