/* net.c - loads libweft_mpi.so when weft runs under mpirun, and frames the
 * executor's messages (a header, then the data) for it. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../mpi/mpi_load.h"
#include "../mpi/weft_mpi.h"
#include "net.h"
#include "weft/backend.h"
#include "weft/workspace.h"

/* A message waiting for the main thread to hand it to MPI. */
typedef struct outmsg {
  int proc;
  void *buf;
  int64_t len;
  struct outmsg *next;
} outmsg;

struct xnet {
  const weft_mpi_api *api;
  pthread_mutex_t mu;     /* guards the outbox */
  outmsg *head, **tail;
  void *lib;
  int rank, size;
  int *proc;              /* per device */
  int ndevices;
  double timeout_s;       /* the longest wait for another process; 0: none */
  pid_t parent;           /* the process that started this one */
  char err[512];
};

/* The header of a message on the wire. */
typedef struct wire {
  xkey key;
  int32_t consumers;
  int32_t has_data;
} wire;

/* A count or rank from the environment: digits only, below INT_MAX; -1 when
 * the variable is unset, empty or anything else. */
static int env_count(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) return -1;
  long long x = 0;
  for (const char *p = v; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    x = x * 10 + (*p - '0');
    if (x >= INT_MAX) return -1;
  }
  return (int)x;
}

/* The first of vars that is set as a count, else -1. */
static int env_first(const char *const *vars, int n) {
  for (int i = 0; i < n; i++) {
    int v = env_count(vars[i]);
    if (v >= 0) return v;
  }
  return -1;
}

xprocs xnet_env(void) {
  static const char *const mpi_size[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
  static const char *const mpi_rank[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  static const char *const mpi_local[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "MPI_LOCALRANKID"};
  xprocs p = {0, 1, 0, XPROCS_ALONE};
  int size = env_first(mpi_size, 3), rank = env_first(mpi_rank, 3);
  if (size > 1 && rank >= 0 && rank < size) {
    int local = env_first(mpi_local, 3);
    return (xprocs){rank, size, local >= 0 ? local : 0, XPROCS_MPI};
  }
  /* srun without MPI: its variables, inside a job step only (a batch
   * script has SLURM_NTASKS and SLURM_PROCID too, but it is one process) */
  if (env_count("SLURM_STEP_ID") < 0 && env_count("SLURM_STEPID") < 0) return p;
  size = env_count("SLURM_NTASKS"), rank = env_count("SLURM_PROCID");
  if (size > 1 && rank >= 0 && rank < size) {
    int local = env_count("SLURM_LOCALID");
    return (xprocs){rank, size, local >= 0 ? local : 0, XPROCS_SLURM};
  }
  return p;
}

void xnet_procs(int *rank, int *size) {
  xprocs p = xnet_env();
  *rank = p.rank;
  *size = p.size;
}

xnet *xnet_start(double timeout_s, char *err, size_t errlen) {
  err[0] = 0;
  xprocs env = xnet_env();
  if (env.from == XPROCS_ALONE) return NULL;
  if (env.from == XPROCS_SLURM) {
    snprintf(err, errlen,
             "started by srun as task %d of %d without MPI (SLURM_PROCID, SLURM_NTASKS): the processes of a run talk "
             "through MPI, which srun starts with --mpi=pmix (or run under mpirun); weft has no transport without it",
             env.rank, env.size);
    return NULL;
  }
  char tried[4 * PATH_MAX + 128] = "", why[512];
  void *lib;
  const weft_mpi_api *api;
  mpi_load_status st = mpi_load(NULL, &lib, &api, tried, sizeof tried, why, sizeof why);
  if (st == MPI_LOAD_MISSING) {
    snprintf(err, errlen,
             "started by mpirun, but the MPI plugin could not be loaded (%s; tried %s); `make` builds "
             "libweft_mpi.so beside weft when mpicc is installed, WEFT_MPI_PLUGIN names another",
             why, tried);
    return NULL;
  }
  if (st == MPI_LOAD_WRONG) {
    snprintf(err, errlen, "%s", why);
    return NULL;
  }
  xnet *n = calloc(1, sizeof *n);
  if (!n) weft_oom();
  n->api = api;
  n->lib = lib;
  pthread_mutex_init(&n->mu, NULL);
  n->tail = &n->head;
  n->timeout_s = timeout_s;
  n->parent = getppid();
  if (api->init(&n->rank, &n->size, timeout_s, n->err, sizeof n->err) != 0) {
    snprintf(err, errlen, "%s", n->err);
    free(n);
    return NULL;
  }
  return n;
}

int xnet_rank(const xnet *n) { return n->rank; }
int xnet_size(const xnet *n) { return n->size; }
const char *xnet_error(const xnet *n) { return n->err; }

void xnet_stop(xnet *n) {
  if (!n) return;
  if (!xnet_drain(n, NULL, NULL) || n->api->barrier() != 0) {
    /* MPI_Finalize would wait for the missing process too */
    fprintf(stderr, "weft run: %s\n", n->err);
    xnet_abort(n, WEFT_FAILED);
  }
  n->api->finalize();
  free(n->proc);
  pthread_mutex_destroy(&n->mu);
  free(n);
}

void xnet_assign(xnet *n, const bool *active, int ndevices) {
  free(n->proc);
  n->proc = calloc((size_t)(ndevices ? ndevices : 1), sizeof(int));
  if (!n->proc) weft_oom();
  n->ndevices = ndevices;
  int total = 0, k = 0;
  for (int d = 0; d < ndevices; d++) total += active[d];
  for (int d = 0; d < ndevices; d++) {
    n->proc[d] = total ? (int)((int64_t)k * n->size / total) : 0;
    if (active[d]) k++;
  }
}

int xnet_proc(const xnet *n, int device) { return n->proc[device]; }

bool xnet_post(xnet *n, int proc, const xkey *k, int consumers, const void *data, int64_t bytes) {
  size_t len = sizeof(wire) + (size_t)(data ? bytes : 0);
  char *buf = malloc(len);
  outmsg *m = malloc(sizeof *m);
  if (!buf || !m) weft_oom();
  wire w = {*k, consumers, data != NULL};
  memcpy(buf, &w, sizeof w);
  if (data) memcpy(buf + sizeof w, data, (size_t)bytes);
  m->proc = proc, m->buf = buf, m->len = (int64_t)len, m->next = NULL;
  pthread_mutex_lock(&n->mu);
  *n->tail = m;
  n->tail = &m->next;
  pthread_mutex_unlock(&n->mu);
  return true;
}

bool xnet_flush(xnet *n, int *pending) {
  pthread_mutex_lock(&n->mu);
  outmsg *m = n->head;
  n->head = NULL;
  n->tail = &n->head;
  pthread_mutex_unlock(&n->mu);
  bool ok = true;
  while (m) {
    outmsg *next = m->next;
    if (ok && n->api->isend(m->proc, m->buf, m->len) != 0) ok = false;
    else if (!ok) free(m->buf);
    free(m);
    m = next;
  }
  int p = 0;
  if (ok && n->api->test_sends(&p) != 0) ok = false;
  if (pending) *pending = p;
  return ok;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool xnet_expired(xnet *n, double t0, const char *what) {
  if (n->parent > 1 && getppid() != n->parent) {
    snprintf(n->err, sizeof n->err, "the process that started this one (%ld, mpirun or srun) is gone, while waiting "
             "for %s", (long)n->parent, what);
    return true;
  }
  if (n->timeout_s > 0 && now_s() - t0 > n->timeout_s) {
    snprintf(n->err, sizeof n->err, "waited %.3g s for %s (--timeout): a process is stopped or too slow", n->timeout_s,
             what);
    return true;
  }
  return false;
}

void xnet_abort(xnet *n, int code) {
  fflush(stdout);
  fflush(stderr);
  /* MPI_Abort asks mpirun to end every process; should mpirun be unable
   * to (it is gone, or waits for a stopped process), this one still ends */
  signal(SIGALRM, SIG_DFL);
  alarm(5);
  n->api->abort(code);
  _exit(code);
}

bool xnet_drain(xnet *n, void (*deliver)(void *ctx, const xkey *k, int consumers, void *data, int64_t bytes),
                void *ctx) {
  int pending = 1;
  double t0 = now_s();
  while (pending) {
    if (!xnet_flush(n, &pending)) return false;
    if (!pending) break;
    if (xnet_expired(n, t0, "other processes to take this one's messages")) return false;
    /* a send may wait for its receiver, which may wait for one of ours */
    int got = 0;
    if (deliver && !xnet_poll(n, deliver, ctx, &got)) return false;
    if (!got) {
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
  }
  return true;
}

bool xnet_poll(xnet *n, void (*deliver)(void *ctx, const xkey *k, int consumers, void *data, int64_t bytes),
               void *ctx, int *received) {
  *received = 0;
  for (;;) {
    void *buf = NULL;
    int64_t len = 0;
    int rc = n->api->poll(&buf, &len);
    if (rc < 0) return false;
    if (rc == 0) return true;
    if (len < (int64_t)sizeof(wire)) {
      snprintf(n->err, sizeof n->err, "MPI: a message of %lld bytes is shorter than its header", (long long)len);
      free(buf);
      return false;
    }
    wire w;
    memcpy(&w, buf, sizeof w);
    int64_t bytes = len - (int64_t)sizeof w;
    void *data = NULL;
    if (w.has_data) {
      data = malloc((size_t)(bytes ? bytes : 1));
      if (!data) weft_oom();
      memcpy(data, (char *)buf + sizeof w, (size_t)bytes);
    }
    free(buf);
    deliver(ctx, &w.key, w.consumers, data, w.has_data ? bytes : 0);
    ++*received;
  }
}

bool xnet_sum_double(xnet *n, double *v, int64_t len) { return n->api->sum_double(v, len) == 0; }
bool xnet_sum_float(xnet *n, float *v, int64_t len) { return n->api->sum_float(v, len) == 0; }
bool xnet_min_int(xnet *n, int *v, int64_t len) { return n->api->min_int(v, len) == 0; }
