/* weft_mpi.h - the interface of libweft_mpi.so, the plugin through which
 * `weft run` under mpirun talks MPI (weft itself does not link MPI). */
#ifndef WEFT_MPI_H
#define WEFT_MPI_H

#include <stddef.h>
#include <stdint.h>

#define WEFT_MPI_VERSION 4

/* Every function returns 0 on success, else nonzero with a message in the
 * err buffer given to init (kept by the plugin). Only the thread that
 * called init calls the others (MPI_THREAD_FUNNELED). */
typedef struct weft_mpi_api {
  int version;                                   /* WEFT_MPI_VERSION */
  /* MPI_Init_thread; this process's rank and the number of processes.
   * Every wait of the functions below (a collective, a send that needs its
   * receiver) gives up after timeout_s seconds (0: never) with a message,
   * and when the process that started this one (mpirun, srun) is gone. */
  int (*init)(int *rank, int *size, double timeout_s, char *err, size_t errlen);
  /* Starts sending bytes to process dest (any size; sent in pieces) and
   * takes buf, which must come from malloc: it is freed once sent. */
  int (*isend)(int dest, void *buf, int64_t bytes);
  /* Completes what it can of the sends started; *pending gets how many are
   * still under way. */
  int (*test_sends)(int *pending);
  /* A message from any process if one is there: *buf malloc'd (the caller
   * frees), *bytes its size; returns 1 when one was received, 0 when none
   * waits, -1 on error. */
  int (*poll)(void **buf, int64_t *bytes);
  /* Element-wise over all processes, in place. */
  int (*sum_double)(double *v, int64_t n);
  int (*sum_float)(float *v, int64_t n);
  int (*min_int)(int *v, int64_t n);
  int (*barrier)(void);
  int (*finalize)(void);
  /* MPI_Abort: ends every process of the run with status code; does not
   * return. */
  void (*abort)(int code);
  /* ---- version 4 ---- */
  /* Process root's bytes into every process's buf (MPI_Ibcast, polled
   * with the same limit). */
  int (*bcast)(void *buf, int64_t bytes, int root);
} weft_mpi_api;

/* The one symbol weft looks up with dlsym. */
const weft_mpi_api *weft_mpi_plugin(void);

#endif
