/* rendezvous.c - the id of a run's NCCL communicator shared through MPI or
 * through a file (rendezvous.h). */
#include "rendezvous.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi/mpi_load.h"
#include "mpi/weft_mpi.h"

static const char FORMAT[] = "weft rendezvous 1";
enum { KEY_MAX = 200 };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool rdv_parse(const char *spec, rdv *r, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  if (strcmp(spec, "mpi") == 0) {
    r->kind = RDV_MPI;
    return true;
  }
  if (strncmp(spec, "file:", 5) == 0 && spec[5]) {
    if (strlen(spec + 5) + 32 >= sizeof r->path) {
      snprintf(err, errlen, "--rendezvous: the file's name is longer than %d bytes", RDV_MAX_PATH - 32);
      return false;
    }
    r->kind = RDV_FILE;
    snprintf(r->path, sizeof r->path, "%s", spec + 5);
    return true;
  }
  snprintf(err, errlen, "--rendezvous %s: expected `mpi` or `file:PATH`", spec);
  return false;
}

/* Printable characters without spaces, at most KEY_MAX: what a key may be. */
static void clean_key(char *dst, size_t n, const char *src) {
  size_t k = 0;
  for (; *src && k + 1 < n && k < KEY_MAX; src++) dst[k++] = *src > ' ' && *src < 127 ? *src : '_';
  dst[k] = 0;
}

const char *rdv_key(char *buf, size_t n) {
  const char *k = getenv("WEFT_RENDEZVOUS_KEY");
  const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
  char tmp[2 * KEY_MAX];
  if (k && *k) snprintf(tmp, sizeof tmp, "%s", k);
  else if (job && *job) snprintf(tmp, sizeof tmp, "slurm-%.*s.%.*s", 90, job, 90, step && *step ? step : "x");
  else tmp[0] = 0;
  clean_key(buf, n, tmp);
  return buf;
}

bool rdv_file_publish(const char *path, const char *key, int nprocs, const void *id, size_t n, char *err,
                      size_t errlen) {
  char tmp[RDV_MAX_PATH + 64];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) {
    snprintf(err, errlen, "rendezvous file:%s: cannot write %s: %s", path, tmp, strerror(errno));
    return false;
  }
  char k[KEY_MAX + 1];
  clean_key(k, sizeof k, key);
  fprintf(f, "%s\nprocesses %d\nkey %s\nid ", FORMAT, nprocs, k);
  for (size_t i = 0; i < n; i++) fprintf(f, "%02x", ((const unsigned char *)id)[i]);
  fputc('\n', f);
  bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    snprintf(err, errlen, "rendezvous file:%s: cannot write it: %s", path, strerror(errno));
    unlink(tmp);
    return false;
  }
  return true;
}

/* What a file holds: 1 the id of key, 0 another key's (or none yet), -1 a
 * file that cannot be used (err says why). */
static int read_id(const char *path, const char *key, int nprocs, void *id, size_t n, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    snprintf(err, errlen, "rendezvous file:%s: %s", path, strerror(errno));
    return -1;
  }
  char buf[2 * RDV_MAX_ID + 2 * KEY_MAX + 128];
  ssize_t got = 0, k;
  while (got < (ssize_t)sizeof buf - 1 && (k = read(fd, buf + got, sizeof buf - 1 - (size_t)got)) > 0) got += k;
  close(fd);
  buf[got] = 0;
  int procs = 0;
  char fkey[KEY_MAX + 2] = "", hex[2 * RDV_MAX_ID + 2] = "";
  const char *p = buf;
  int used = 0;
  bool shape = strncmp(p, FORMAT, sizeof FORMAT - 1) == 0 && p[sizeof FORMAT - 1] == '\n';
  if (shape) p += sizeof FORMAT;
  shape = shape && sscanf(p, "processes %d\n%n", &procs, &used) == 1 && used > 0;
  if (shape) p += used;
  /* an empty key leaves the line "key " */
  shape = shape && strncmp(p, "key ", 4) == 0;
  if (shape) {
    p += 4;
    const char *e = strchr(p, '\n');
    shape = e && e - p <= KEY_MAX;
    if (shape) memcpy(fkey, p, (size_t)(e - p)), fkey[e - p] = 0, p = e + 1;
  }
  shape = shape && sscanf(p, "id %1025[0-9a-f]\n", hex) == 1;
  if (!shape) {
    snprintf(err, errlen, "rendezvous file:%s: not a rendezvous file of weft (remove it, or name another)", path);
    return -1;
  }
  char want[KEY_MAX + 1];
  clean_key(want, sizeof want, key);
  if (strcmp(fkey, want) != 0) return 0;
  if (procs != nprocs) {
    snprintf(err, errlen, "rendezvous file:%s: written by process 0 of %d processes, but this run has %d", path, procs,
             nprocs);
    return -1;
  }
  if (strlen(hex) != 2 * n) {
    snprintf(err, errlen, "rendezvous file:%s: its id has %zu bytes, not %zu", path, strlen(hex) / 2, n);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    ((unsigned char *)id)[i] = (unsigned char)v;
  }
  return 1;
}

bool rdv_file_await(const char *path, const char *key, int rank, int nprocs, void *id, size_t n, double timeout_s,
                    char *err, size_t errlen) {
  double t0 = now_s();
  long nap_us = 1000;
  for (;;) {
    int k = read_id(path, key, nprocs, id, n, err, errlen);
    if (k != 0) return k > 0;
    if (timeout_s > 0 && now_s() - t0 > timeout_s) {
      snprintf(err, errlen,
               "rendezvous file:%s: process %d of %d waited %g s for process 0 to write the communicator's id%s%s; it "
               "did not come (--timeout)",
               path, rank, nprocs, timeout_s, key[0] ? " under key " : "", key);
      return false;
    }
    struct timespec ts = {nap_us / 1000000, (nap_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    if (nap_us < 100000) nap_us *= 2;
  }
}

bool rdv_share(const rdv *r, int rank, int nprocs, void *id, size_t n, double timeout_s, rdv_bcast_fn bcast,
               void *ctx, char *err, size_t errlen) {
  if (n > RDV_MAX_ID) {
    snprintf(err, errlen, "rendezvous: an id of %zu bytes (at most %d)", n, RDV_MAX_ID);
    return false;
  }
  if (r->kind == RDV_MPI) {
    if (!bcast) {
      snprintf(err, errlen, "rendezvous mpi: this run was not started by mpirun (or srun with MPI)");
      return false;
    }
    return bcast(ctx, id, n, err, errlen) == 0;
  }
  char key[KEY_MAX + 1];
  rdv_key(key, sizeof key);
  if (rank == 0) return rdv_file_publish(r->path, key, nprocs, id, n, err, errlen);
  return rdv_file_await(r->path, key, rank, nprocs, id, n, timeout_s, err, errlen);
}

void rdv_done(const rdv *r, int rank) {
  if (r->kind == RDV_FILE && rank == 0) unlink(r->path);
}

/* ---- MPI ------------------------------------------------------------------------------ */

struct rdv_mpi {
  void *lib;
  const weft_mpi_api *api;
  char err[512];          /* the plugin's messages */
};

rdv_mpi *rdv_mpi_open(const char *dir, double timeout_s, int *rank, int *size, char *err, size_t errlen) {
  char tried[4 * RDV_MAX_PATH + 128], why[512];
  void *lib;
  const weft_mpi_api *api;
  mpi_load_status st = mpi_load(dir, &lib, &api, tried, sizeof tried, why, sizeof why);
  if (st == MPI_LOAD_MISSING) {
    snprintf(err, errlen, "the MPI plugin could not be loaded (%s; tried %s); WEFT_MPI_PLUGIN names it", why,
             tried[0] ? tried : "nothing");
    return NULL;
  }
  if (st == MPI_LOAD_WRONG) {
    snprintf(err, errlen, "%s", why);
    return NULL;
  }
  rdv_mpi *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  m->lib = lib, m->api = api;
  if (api->init(rank, size, timeout_s, m->err, sizeof m->err) != 0) {
    snprintf(err, errlen, "%s", m->err);
    free(m);
    return NULL;
  }
  return m;
}

int rdv_mpi_bcast(void *ctx, void *buf, size_t n, char *err, size_t errlen) {
  rdv_mpi *m = ctx;
  if (m->api->bcast(buf, (int64_t)n, 0) == 0) return 0;
  snprintf(err, errlen, "rendezvous mpi: %s", m->err);
  return 1;
}

void rdv_mpi_abort(rdv_mpi *m, int code) { m->api->abort(code); }

void rdv_mpi_close(rdv_mpi *m) {
  if (!m) return;
  m->api->finalize();
  free(m);
}
