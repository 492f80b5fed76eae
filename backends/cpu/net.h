/* net.h - several processes for `weft run` under mpirun: MPI through the
 * plugin libweft_mpi.so, loaded at run time (backends/mpi/weft_mpi.h). */
#ifndef WEFT_NET_H
#define WEFT_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct xnet xnet;

/* A message between devices: (step, class, id, epoch, src, dst) names it;
 * dst is -1 for one posted to several devices. */
typedef struct xkey {
  int64_t step;
  int cls, id, epoch, src, dst;
} xkey;

/* Where this process stands among those its launcher started, from the
 * environment, before MPI starts: MPI's variables (Open MPI's
 * OMPI_COMM_WORLD_*, PMIx's PMIX_*, PMI's PMI_*) when they name more than
 * one process, else Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID)
 * inside a job step of srun (SLURM_STEP_ID set), else 0 of 1. A value that
 * is not a count, or a rank not below the size, counts as unset. */
typedef enum { XPROCS_ALONE, XPROCS_MPI, XPROCS_SLURM } xprocs_from;
typedef struct xprocs {
  int rank, size;
  int local;          /* the rank among the processes of this node */
  xprocs_from from;
} xprocs;
xprocs xnet_env(void);
/* Its rank and size (the backend's procs). */
void xnet_procs(int *rank, int *size);

/* Under mpirun (or srun with MPI) with more than one process (xnet_env),
 * loads the plugin and starts MPI. NULL with err empty when this process
 * runs alone; NULL with a message when it should not (several processes
 * that srun started without MPI included: there is no other transport). The
 * plugin is found through WEFT_MPI_PLUGIN, else beside the weft binary.
 * Every wait for another process gives up after timeout_s seconds (0:
 * never), or once the process that started this one is gone. */
xnet *xnet_start(double timeout_s, char *err, size_t errlen);
int xnet_rank(const xnet *n);
int xnet_size(const xnet *n);
/* Waits for every process, then ends MPI. */
void xnet_stop(xnet *n);

/* Spreads the devices with programs over the processes, in blocks of
 * consecutive devices. */
void xnet_assign(xnet *n, const bool *active, int ndevices);
int xnet_proc(const xnet *n, int device);
/* Queues a message to process proc for `consumers` of its devices; any
 * thread. Only the thread that started MPI calls the functions below
 * (MPI_THREAD_FUNNELED). */
bool xnet_post(xnet *n, int proc, const xkey *k, int consumers, const void *data, int64_t bytes);
/* Hands the queued messages to MPI and completes what it can; *pending
 * gets the sends still under way. */
bool xnet_flush(xnet *n, int *pending);
/* Flushes until every send has completed, receiving meanwhile (deliver
 * as for xnet_poll; NULL when nothing more can arrive). */
bool xnet_drain(xnet *n, void (*deliver)(void *ctx, const xkey *k, int consumers, void *data, int64_t bytes),
                void *ctx);
/* Receives what arrived and hands each message to deliver (data malloc'd,
 * owned by the callee; NULL when bytes is 0 and the message carries no
 * data). Returns false on an MPI error. */
bool xnet_poll(xnet *n, void (*deliver)(void *ctx, const xkey *k, int consumers, void *data, int64_t bytes),
               void *ctx, int *received);
bool xnet_sum_double(xnet *n, double *v, int64_t len);
bool xnet_sum_float(xnet *n, float *v, int64_t len);
bool xnet_min_int(xnet *n, int *v, int64_t len);
const char *xnet_error(const xnet *n);
/* Whether a wait for what, begun at t0 (CLOCK_MONOTONIC seconds), must
 * end: the timeout passed, or mpirun is gone; the reason in xnet_error. */
bool xnet_expired(xnet *n, double t0, const char *what);
/* Ends every process of the run (MPI_Abort) with status code, so that no
 * process is left waiting for this one. */
_Noreturn void xnet_abort(xnet *n, int code);

#endif
