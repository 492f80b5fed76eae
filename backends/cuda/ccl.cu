/* ccl.cu - collective communication (ccl.h) on NCCL, with non-blocking
 * communicators polled against a timeout; in the emulation, a stand-in of
 * one rank; without nccl.h, nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ccl.h"
#include "common.cuh"

#if defined(WEFT_CUDA_EMU)

/* ---- the emulation's stand-in: one rank, every operation a copy -------------------------- */

#include <memory>
#include <vector>

struct ccl_comm {
  int color;
};

static size_t dt_size(int dt) { return dt == GPU_BF16 || dt == GPU_F16 ? 2 : 4; }

bool ccl_available(char *buf, size_t n) {
  snprintf(buf, n, "the emulation's stand-in for NCCL (one rank)");
  return true;
}

bool ccl_unique_id(unsigned char id[CCL_ID_BYTES], char *err, size_t errlen) {
  memset(id, 0, CCL_ID_BYTES);
  snprintf((char *)id, CCL_ID_BYTES, "emulated %ld", (long)getpid());
  return true;
}

ccl_comm *ccl_init(const unsigned char id[CCL_ID_BYTES], int nranks, int rank, double timeout_s, char *err,
                   size_t errlen) {
  if (nranks != 1 || rank != 0) {
    snprintf(err, errlen, "the emulation's stand-in for NCCL has one rank (asked for rank %d of %d)", rank, nranks);
    return NULL;
  }
  return new ccl_comm{0};
}

bool ccl_split(ccl_comm *parent, int color, int key, double timeout_s, ccl_comm **out, char *err, size_t errlen) {
  *out = color < 0 ? NULL : new ccl_comm{color};
  return true;
}

int ccl_rank(const ccl_comm *c) { return 0; }
int ccl_size(const ccl_comm *c) { return 1; }
void ccl_group_start(void) {}
bool ccl_group_end(ccl_comm *c, double timeout_s, char *err, size_t errlen) { return true; }

/* An operation of one rank is a copy, in two pieces of the stream's work
 * as NCCL's kernels read the input, then write the output: the first takes
 * the input and spoils the output (NaN), the second writes it. Work of
 * other streams may run between them, so a stream that does not wait for
 * the input's writer, or a reader that does not wait for the second, gets
 * a wrong result. */
static void copy_on(gpu_stream *s, void *dst, const void *src, size_t bytes) {
  auto held = std::make_shared<std::vector<unsigned char>>(bytes);
  emu_enqueue((emu_stream *)s, [held, dst, src, bytes] {
    memcpy(held->data(), src, bytes);
    memset(dst, 0xff, bytes);
  });
  emu_enqueue((emu_stream *)s, [held, dst, bytes] { memcpy(dst, held->data(), bytes); });
}

bool ccl_all_reduce(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, gpu_stream *s, char *err,
                    size_t errlen) {
  copy_on(s, dst, src, (size_t)count * dt_size(dt));
  return true;
}
bool ccl_reduce_scatter(ccl_comm *c, const void *src, void *dst, int64_t recv_count, int dt, gpu_stream *s,
                        char *err, size_t errlen) {
  copy_on(s, dst, src, (size_t)recv_count * dt_size(dt));
  return true;
}
bool ccl_all_gather(ccl_comm *c, const void *src, void *dst, int64_t send_count, int dt, gpu_stream *s, char *err,
                    size_t errlen) {
  copy_on(s, dst, src, (size_t)send_count * dt_size(dt));
  return true;
}
bool ccl_broadcast(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int root, gpu_stream *s,
                   char *err, size_t errlen) {
  if (root != 0) {
    snprintf(err, errlen, "NCCL stand-in: broadcast from rank %d of 1", root);
    return false;
  }
  copy_on(s, dst, src, (size_t)count * dt_size(dt));
  return true;
}
bool ccl_send(ccl_comm *c, const void *src, int64_t count, int dt, int peer, gpu_stream *s, char *err,
              size_t errlen) {
  snprintf(err, errlen, "NCCL stand-in: no send between ranks of one");
  return false;
}
bool ccl_recv(ccl_comm *c, void *dst, int64_t count, int dt, int peer, gpu_stream *s, char *err, size_t errlen) {
  snprintf(err, errlen, "NCCL stand-in: no receive between ranks of one");
  return false;
}

int ccl_status(ccl_comm *c, char *err, size_t errlen) { return 0; }
void ccl_abort(ccl_comm *c) { delete c; }
void ccl_free(ccl_comm *c, double timeout_s) { delete c; }

#elif defined(WEFT_NO_NCCL)

/* ---- a build without NCCL ------------------------------------------------------------------ */

static bool none(char *err, size_t errlen) {
  snprintf(err, errlen, "this build of the CUDA backend has no NCCL (nccl.h was not found when it was built)");
  return false;
}
bool ccl_available(char *buf, size_t n) { return none(buf, n); }
bool ccl_unique_id(unsigned char id[CCL_ID_BYTES], char *err, size_t errlen) { return none(err, errlen); }
ccl_comm *ccl_init(const unsigned char id[CCL_ID_BYTES], int nranks, int rank, double timeout_s, char *err,
                   size_t errlen) {
  none(err, errlen);
  return NULL;
}
bool ccl_split(ccl_comm *parent, int color, int key, double timeout_s, ccl_comm **out, char *err, size_t errlen) {
  *out = NULL;
  return none(err, errlen);
}
int ccl_rank(const ccl_comm *c) { return 0; }
int ccl_size(const ccl_comm *c) { return 1; }
void ccl_group_start(void) {}
bool ccl_group_end(ccl_comm *c, double timeout_s, char *err, size_t errlen) { return none(err, errlen); }
bool ccl_all_reduce(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, gpu_stream *s, char *err,
                    size_t errlen) {
  return none(err, errlen);
}
bool ccl_reduce_scatter(ccl_comm *c, const void *src, void *dst, int64_t recv_count, int dt, gpu_stream *s,
                        char *err, size_t errlen) {
  return none(err, errlen);
}
bool ccl_all_gather(ccl_comm *c, const void *src, void *dst, int64_t send_count, int dt, gpu_stream *s, char *err,
                    size_t errlen) {
  return none(err, errlen);
}
bool ccl_broadcast(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int root, gpu_stream *s,
                   char *err, size_t errlen) {
  return none(err, errlen);
}
bool ccl_send(ccl_comm *c, const void *src, int64_t count, int dt, int peer, gpu_stream *s, char *err,
              size_t errlen) {
  return none(err, errlen);
}
bool ccl_recv(ccl_comm *c, void *dst, int64_t count, int dt, int peer, gpu_stream *s, char *err, size_t errlen) {
  return none(err, errlen);
}
int ccl_status(ccl_comm *c, char *err, size_t errlen) { return none(err, errlen) ? 0 : -1; }
void ccl_abort(ccl_comm *c) {}
void ccl_free(ccl_comm *c, double timeout_s) {}

#else

/* ---- NCCL ----------------------------------------------------------------------------------- */

#include <nccl.h>

static double ccl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void ccl_nap(long *us) {
  struct timespec ts = {0, *us * 1000};
  nanosleep(&ts, NULL);
  if (*us < 1000) *us *= 2;
}

struct ccl_comm {
  ncclComm_t comm;
  int rank, size;
  double timeout_s;       /* the longest a call that answered ncclInProgress is polled */
};

static ncclDataType_t nccl_type(int dt) {
  switch (dt) {
  case GPU_BF16: return ncclBfloat16;
  case GPU_F16: return ncclFloat16;
  case GPU_I32: return ncclInt32;
  default: return ncclFloat32;
  }
}

static bool nccl_failed(ncclResult_t rc, ncclComm_t comm, const char *what, char *err, size_t errlen) {
  if (rc == ncclSuccess || rc == ncclInProgress) return false;
  const char *last = ncclGetLastError(comm);
  snprintf(err, errlen, "NCCL: %s: %s%s%s", what, ncclGetErrorString(rc), last && *last ? ": " : "",
           last ? last : "");
  return true;
}

/* Polls the communicator until it has taken what it was given (a call that
 * answered ncclInProgress), at most timeout_s. */
static bool settle(ncclComm_t comm, const char *what, double timeout_s, char *err, size_t errlen) {
  double t0 = ccl_now();
  long nap = 20;
  for (;;) {
    ncclResult_t st = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm, &st);
    if (nccl_failed(rc, comm, "ncclCommGetAsyncError", err, errlen)) return false;
    if (st == ncclSuccess) return true;
    if (nccl_failed(st, comm, what, err, errlen)) return false;
    if (timeout_s > 0 && ccl_now() - t0 > timeout_s) {
      snprintf(err, errlen, "NCCL: %s: not done after %g s (--timeout)", what, timeout_s);
      return false;
    }
    ccl_nap(&nap);
  }
}

bool ccl_available(char *buf, size_t n) {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) {
    snprintf(buf, n, "NCCL: ncclGetVersion failed");
    return false;
  }
  snprintf(buf, n, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
  return true;
}

bool ccl_unique_id(unsigned char id[CCL_ID_BYTES], char *err, size_t errlen) {
  static_assert(sizeof(ncclUniqueId) <= CCL_ID_BYTES, "ncclUniqueId is larger than CCL_ID_BYTES");
  ncclUniqueId u;
  if (nccl_failed(ncclGetUniqueId(&u), NULL, "ncclGetUniqueId", err, errlen)) return false;
  memset(id, 0, CCL_ID_BYTES);
  memcpy(id, &u, sizeof u);
  return true;
}

static ncclConfig_t nonblocking(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

ccl_comm *ccl_init(const unsigned char id[CCL_ID_BYTES], int nranks, int rank, double timeout_s, char *err,
                   size_t errlen) {
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  ncclConfig_t cfg = nonblocking();
  ncclComm_t comm = NULL;
  char what[96];
  snprintf(what, sizeof what, "joining the communicator as rank %d of %d", rank, nranks);
  ncclResult_t rc = ncclCommInitRankConfig(&comm, nranks, u, rank, &cfg);
  if (nccl_failed(rc, comm, what, err, errlen) || !comm || !settle(comm, what, timeout_s, err, errlen)) {
    if (comm) ncclCommAbort(comm);
    return NULL;
  }
  ccl_comm *c = (ccl_comm *)calloc(1, sizeof *c);
  c->comm = comm, c->rank = rank, c->size = nranks, c->timeout_s = timeout_s;
  return c;
}

bool ccl_split(ccl_comm *parent, int color, int key, double timeout_s, ccl_comm **out, char *err, size_t errlen) {
  ncclConfig_t cfg = nonblocking();
  ncclComm_t comm = NULL;
  *out = NULL;
  ncclResult_t rc = ncclCommSplit(parent->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, &cfg);
  if (nccl_failed(rc, parent->comm, "ncclCommSplit", err, errlen) ||
      !settle(parent->comm, "ncclCommSplit", timeout_s, err, errlen) ||
      (comm && !settle(comm, "ncclCommSplit", timeout_s, err, errlen))) {
    if (comm) ncclCommAbort(comm);
    return false;
  }
  if (!comm) return true;
  ccl_comm *c = (ccl_comm *)calloc(1, sizeof *c);
  c->comm = comm, c->timeout_s = timeout_s;
  if (nccl_failed(ncclCommUserRank(comm, &c->rank), comm, "ncclCommUserRank", err, errlen) ||
      nccl_failed(ncclCommCount(comm, &c->size), comm, "ncclCommCount", err, errlen)) {
    ncclCommAbort(comm);
    free(c);
    return false;
  }
  *out = c;
  return true;
}

int ccl_rank(const ccl_comm *c) { return c->rank; }
int ccl_size(const ccl_comm *c) { return c->size; }

void ccl_group_start(void) { ncclGroupStart(); }

bool ccl_group_end(ccl_comm *c, double timeout_s, char *err, size_t errlen) {
  ncclResult_t rc = ncclGroupEnd();
  if (nccl_failed(rc, c->comm, "ncclGroupEnd", err, errlen)) return false;
  return rc == ncclSuccess || settle(c->comm, "a group of operations", timeout_s, err, errlen);
}

/* An operation's answer: posted, or being taken (polled before the next
 * call, as NCCL asks of non-blocking communicators). */
static bool posted(ccl_comm *c, ncclResult_t rc, const char *what, char *err, size_t errlen) {
  if (nccl_failed(rc, c->comm, what, err, errlen)) return false;
  return rc == ncclSuccess || settle(c->comm, what, c->timeout_s, err, errlen);
}

bool ccl_all_reduce(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, gpu_stream *s, char *err,
                    size_t errlen) {
  return posted(c, ncclAllReduce(src, dst, (size_t)count, nccl_type(dt), ncclSum, c->comm, (cudaStream_t)s),
                "ncclAllReduce", err, errlen);
}
bool ccl_reduce_scatter(ccl_comm *c, const void *src, void *dst, int64_t recv_count, int dt, gpu_stream *s,
                        char *err, size_t errlen) {
  return posted(c,
                ncclReduceScatter(src, dst, (size_t)recv_count, nccl_type(dt), ncclSum, c->comm, (cudaStream_t)s),
                "ncclReduceScatter", err, errlen);
}
bool ccl_all_gather(ccl_comm *c, const void *src, void *dst, int64_t send_count, int dt, gpu_stream *s, char *err,
                    size_t errlen) {
  return posted(c, ncclAllGather(src, dst, (size_t)send_count, nccl_type(dt), c->comm, (cudaStream_t)s),
                "ncclAllGather", err, errlen);
}
bool ccl_broadcast(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int root, gpu_stream *s,
                   char *err, size_t errlen) {
  return posted(c, ncclBroadcast(src, dst, (size_t)count, nccl_type(dt), root, c->comm, (cudaStream_t)s),
                "ncclBroadcast", err, errlen);
}
bool ccl_send(ccl_comm *c, const void *src, int64_t count, int dt, int peer, gpu_stream *s, char *err,
              size_t errlen) {
  return posted(c, ncclSend(src, (size_t)count, nccl_type(dt), peer, c->comm, (cudaStream_t)s), "ncclSend", err,
                errlen);
}
bool ccl_recv(ccl_comm *c, void *dst, int64_t count, int dt, int peer, gpu_stream *s, char *err, size_t errlen) {
  return posted(c, ncclRecv(dst, (size_t)count, nccl_type(dt), peer, c->comm, (cudaStream_t)s), "ncclRecv", err,
                errlen);
}

int ccl_status(ccl_comm *c, char *err, size_t errlen) {
  ncclResult_t st = ncclSuccess;
  if (nccl_failed(ncclCommGetAsyncError(c->comm, &st), c->comm, "ncclCommGetAsyncError", err, errlen)) return -1;
  if (st == ncclInProgress) return 1;
  return nccl_failed(st, c->comm, "an operation of the communicator", err, errlen) ? -1 : 0;
}

void ccl_abort(ccl_comm *c) {
  if (!c) return;
  ncclCommAbort(c->comm);
  free(c);
}

void ccl_free(ccl_comm *c, double timeout_s) {
  if (!c) return;
  char e[256];
  ncclResult_t rc = ncclCommFinalize(c->comm);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    ncclCommAbort(c->comm);
  } else if (!settle(c->comm, "ncclCommFinalize", timeout_s, e, sizeof e)) {
    ncclCommAbort(c->comm);
  } else {
    ncclCommDestroy(c->comm);
  }
  free(c);
}

#endif
