/* rendezvous.h - how the processes of a run share the id of their NCCL
 * communicator (ncclUniqueId, bytes process 0 makes): through MPI's
 * broadcast, or through a file on a file system every process sees. Plain
 * host C with no CUDA, so that it is built and tested anywhere.
 *
 * The file: process 0 writes it under a temporary name beside PATH and
 * renames it into place, so that a reader sees all of it or nothing; the
 * others poll for it at most the run's timeout. It holds a format line,
 * the number of processes, a key that tells one run from another (an
 * earlier run's file is left alone until its key is replaced) and the id
 * in hexadecimal. Process 0 removes it once every process has joined. */
#ifndef WEFT_CUDA_RENDEZVOUS_H
#define WEFT_CUDA_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>

enum { RDV_MAX_ID = 512, RDV_MAX_PATH = 4096 };

typedef enum { RDV_MPI, RDV_FILE } rdv_kind;

typedef struct rdv {
  rdv_kind kind;
  char path[RDV_MAX_PATH];  /* RDV_FILE: the file */
} rdv;

/* "mpi" or "file:PATH" (PATH not empty). False with a message. */
bool rdv_parse(const char *spec, rdv *r, char *err, size_t errlen);
/* What tells this run's file from another's: WEFT_RENDEZVOUS_KEY, else
 * Slurm's job and step (SLURM_JOB_ID.SLURM_STEP_ID), else "" (any file). */
const char *rdv_key(char *buf, size_t n);

/* Process 0 of nprocs: writes id (n bytes) with key into path, atomically. */
bool rdv_file_publish(const char *path, const char *key, int nprocs, const void *id, size_t n, char *err,
                      size_t errlen);
/* Another process: waits at most timeout_s (0: no limit) for a file of
 * this key at path, and reads its n bytes of id. A file of another key is
 * waited past; one that is not such a file, or of another count of
 * processes, fails at once. The message of a timeout names the process,
 * the file and the wait. */
bool rdv_file_await(const char *path, const char *key, int rank, int nprocs, void *id, size_t n, double timeout_s,
                    char *err, size_t errlen);

/* Broadcast of n bytes from process 0 (MPI's); 0 on success, else nonzero
 * with a message. */
typedef int (*rdv_bcast_fn)(void *ctx, void *buf, size_t n, char *err, size_t errlen);

/* Process rank of nprocs ends with the id process 0 holds in id: through
 * bcast (RDV_MPI) or the file (RDV_FILE). */
bool rdv_share(const rdv *r, int rank, int nprocs, void *id, size_t n, double timeout_s, rdv_bcast_fn bcast,
               void *ctx, char *err, size_t errlen);
/* Once every process joined: process 0 removes the file (RDV_FILE). */
void rdv_done(const rdv *r, int rank);

/* MPI for the rendezvous and for ending every process: the MPI plugin
 * (libweft_mpi.so) loaded from WEFT_MPI_PLUGIN, else WEFT_PLUGIN_DIR, else
 * dir (the directory of the plugin that asks), and joined; its waits give
 * up after timeout_s. NULL with a message. */
typedef struct rdv_mpi rdv_mpi;
rdv_mpi *rdv_mpi_open(const char *dir, double timeout_s, int *rank, int *size, char *err, size_t errlen);
/* An rdv_bcast_fn: ctx is the rdv_mpi. */
int rdv_mpi_bcast(void *ctx, void *buf, size_t n, char *err, size_t errlen);
/* MPI_Abort: ends every process of the run; does not return. */
void rdv_mpi_abort(rdv_mpi *m, int code);
/* Leaves MPI (MPI_Finalize) and frees m. */
void rdv_mpi_close(rdv_mpi *m);

#endif
