/* weft_mpi.c - libweft_mpi.so: MPI for `weft run` under mpirun, built with
 * mpicc; weft loads it with dlopen so that ./weft itself needs no MPI. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "weft_mpi.h"

enum { TAG_DATA = 7001, TAG_MORE = 7002 };
/* The largest piece one MPI call moves (counts are int). */
static const int64_t PIECE = (int64_t)1 << 30;

static char *errbuf;
static size_t errcap;
static double timeout_s;  /* 0: wait without limit */
static pid_t parent;      /* mpirun or srun's process; 0 when unknown */

static int fail(int rc, const char *what);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether a wait that began at t0 must end: the time is up, or the
 * process that started this one is gone (this one would be orphaned). */
static int expired(double t0, const char *what) {
  if (parent > 1 && getppid() != parent) {
    snprintf(errbuf, errcap, "MPI: the process that started this one (%ld) is gone, while waiting for %s", (long)parent,
             what);
    return 1;
  }
  if (timeout_s > 0 && now_s() - t0 > timeout_s) {
    snprintf(errbuf, errcap, "MPI: waited %.3g s for %s (--timeout): a process is stopped or too slow", timeout_s, what);
    return 1;
  }
  return 0;
}

/* Completes req, polling, unless the wait expires. */
static int wait_req(MPI_Request *req, const char *what) {
  double t0 = now_s();
  for (;;) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return fail(rc, what);
    if (done) return 0;
    if (expired(t0, what)) return 1;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

static int fail(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  if (errbuf) snprintf(errbuf, errcap, "MPI: %s: %s", what, msg);
  return 1;
}

static int init(int *rank, int *size, double timeout, char *err, size_t errlen) {
  errbuf = err, errcap = errlen;
  timeout_s = timeout;
  parent = getppid();
  int provided = 0;
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) return fail(rc, "MPI_Init_thread");
  if (provided < MPI_THREAD_FUNNELED) {
    snprintf(err, errlen, "MPI: this MPI library does not provide MPI_THREAD_FUNNELED (it gives level %d)", provided);
    return 1;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  return 0;
}

/* Sends under way: their requests (a size, then pieces) and buffers. */
typedef struct pending_send {
  MPI_Request req[8];
  int nreq;
  int64_t *size;          /* the size message's buffer */
  void *buf;
} pending_send;

static pending_send *sends;
static int nsends, capsends;

/* A message is its size (int64) with TAG_DATA, then its bytes in pieces of
 * at most PIECE with TAG_MORE; MPI keeps the order of messages between two
 * processes, and the receiver takes a message's pieces right after its
 * size. Messages over 7 pieces (7 GiB) are refused. */
static int isend(int dest, void *buf, int64_t bytes) {
  if (bytes > 7 * PIECE) {
    snprintf(errbuf, errcap, "MPI: a message of %lld bytes is too large", (long long)bytes);
    free(buf);
    return 1;
  }
  if (nsends == capsends) {
    capsends = capsends ? 2 * capsends : 16;
    sends = realloc(sends, (size_t)capsends * sizeof *sends);
    if (!sends) {
      snprintf(errbuf, errcap, "MPI: out of memory");
      return 1;
    }
  }
  pending_send *p = &sends[nsends];
  p->size = malloc(sizeof(int64_t));
  if (!p->size) {
    snprintf(errbuf, errcap, "MPI: out of memory");
    return 1;
  }
  *p->size = bytes;
  p->buf = buf;
  p->nreq = 0;
  int rc = MPI_Isend(p->size, 1, MPI_INT64_T, dest, TAG_DATA, MPI_COMM_WORLD, &p->req[p->nreq++]);
  for (int64_t off = 0; rc == MPI_SUCCESS && off < bytes; off += PIECE) {
    int64_t n = bytes - off < PIECE ? bytes - off : PIECE;
    rc = MPI_Isend((char *)buf + off, (int)n, MPI_BYTE, dest, TAG_MORE, MPI_COMM_WORLD, &p->req[p->nreq++]);
  }
  nsends++;
  return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Isend");
}

static int test_sends(int *pending) {
  int k = 0;
  for (int i = 0; i < nsends; i++) {
    int done = 0;
    int rc = MPI_Testall(sends[i].nreq, sends[i].req, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return fail(rc, "MPI_Testall");
    if (done) {
      free(sends[i].size);
      free(sends[i].buf);
    } else {
      sends[k++] = sends[i];
    }
  }
  nsends = k;
  *pending = k;
  return 0;
}

static int poll(void **buf, int64_t *bytes) {
  int flag = 0;
  MPI_Message msg;
  MPI_Status st;
  int rc = MPI_Improbe(MPI_ANY_SOURCE, TAG_DATA, MPI_COMM_WORLD, &flag, &msg, &st);
  if (rc != MPI_SUCCESS) return -fail(rc, "MPI_Improbe");
  if (!flag) return 0;
  int64_t n = 0;
  rc = MPI_Mrecv(&n, 1, MPI_INT64_T, &msg, &st);
  if (rc != MPI_SUCCESS) return -fail(rc, "MPI_Mrecv");
  char *b = malloc((size_t)(n > 0 ? n : 1));
  if (!b) {
    snprintf(errbuf, errcap, "MPI: out of memory for a message of %lld bytes", (long long)n);
    return -1;
  }
  for (int64_t off = 0; off < n; off += PIECE) {
    int64_t k = n - off < PIECE ? n - off : PIECE;
    MPI_Request req;
    rc = MPI_Irecv(b + off, (int)k, MPI_BYTE, st.MPI_SOURCE, TAG_MORE, MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS || wait_req(&req, "the rest of a message")) {
      free(b);
      return rc != MPI_SUCCESS ? -fail(rc, "MPI_Irecv") : -1;
    }
  }
  *buf = b;
  *bytes = n;
  return 1;
}

static int reduce(void *v, int64_t n, MPI_Datatype t, MPI_Op op, size_t size) {
  for (int64_t off = 0; off < n; off += PIECE / 8) {
    int64_t k = n - off < PIECE / 8 ? n - off : PIECE / 8;
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)v + (size_t)off * size, (int)k, t, op, MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS) return fail(rc, "MPI_Iallreduce");
    if (wait_req(&req, "the other processes in an all-reduce")) return 1;
  }
  return 0;
}

static int sum_double(double *v, int64_t n) { return reduce(v, n, MPI_DOUBLE, MPI_SUM, sizeof *v); }
static int sum_float(float *v, int64_t n) { return reduce(v, n, MPI_FLOAT, MPI_SUM, sizeof *v); }
static int min_int(int *v, int64_t n) { return reduce(v, n, MPI_INT, MPI_MIN, sizeof *v); }

static int barrier(void) {
  MPI_Request req;
  int rc = MPI_Ibarrier(MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return fail(rc, "MPI_Ibarrier");
  return wait_req(&req, "the other processes at the end of the run");
}

static int bcast(void *buf, int64_t bytes, int root) {
  if (bytes > PIECE) {
    snprintf(errbuf, errcap, "MPI: a broadcast of %lld bytes is too large", (long long)bytes);
    return 1;
  }
  MPI_Request req;
  int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return fail(rc, "MPI_Ibcast");
  return wait_req(&req, "process 0's broadcast");
}

static void abort_all(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  _exit(code);
}

static int finalize(void) {
  int rc = MPI_Finalize();
  return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Finalize");
}

static const weft_mpi_api api = {WEFT_MPI_VERSION, init,    isend,   test_sends, poll,      sum_double,
                                 sum_float,        min_int, barrier, finalize,   abort_all, bcast};

const weft_mpi_api *weft_mpi_plugin(void) { return &api; }
