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

/* ---- the emulation's stand-in: processes of one machine that meet through files ---------------
 * The id names a directory (made by ccl_unique_id). A rank posts its part
 * of an operation as a file NAME.SEQ.RANK, written under another name and
 * renamed into place, where NAME is its communicator's and SEQ counts the
 * communicator's operations; the operation's second half waits (as work
 * of the emulated stream that lets the process's other streams go on) for
 * the files of every rank it needs, then writes its output. A rank that
 * finished operation SEQ knows that every rank posted it, so had finished
 * SEQ - 1: it removes its own file of SEQ - 1 then. A send is a file
 * NAME.pSRC-DST.N its receiver removes once read. With one rank this is a
 * copy in two pieces, as NCCL's kernels read the input, then write the
 * output: the first spoils the output (NaN), so a stream that does not wait
 * for the input's writer, or a reader that does not wait for the second,
 * gets a wrong result. */

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

extern std::string emu_error;

struct ccl_state {
  bool aborted;
};

struct ccl_comm {
  std::string dir, name;
  int rank, size;
  bool world;
  long seq, splits;
  std::vector<long> sent, got;   /* per peer: sends posted, receives posted */
  std::shared_ptr<ccl_state> st;
};

static const char ID_PREFIX[] = "weft-emulated-nccl ";

/* WEFT_CUDA_EMU_CCL=FILE: at exit, each process appends a line of the
 * calls it made, as NCCL's names them ("rank 0 of 2: ncclAllReduce 3
 * ncclReduceScatter 8 ..."), for the tests that check which calls a plan
 * maps to. */
enum { C_ALL_REDUCE, C_REDUCE_SCATTER, C_ALL_GATHER, C_BROADCAST, C_SEND, C_RECV, C_NCALLS };
static long calls[C_NCALLS];
static int tally_rank = -1, tally_size;

static void write_calls(void) {
  static const char *const names[C_NCALLS] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
                                              "ncclBroadcast", "ncclSend",          "ncclRecv"};
  const char *path = getenv("WEFT_CUDA_EMU_CCL");
  FILE *f = path && *path ? fopen(path, "a") : NULL;
  if (!f) return;
  char line[512];
  int k = snprintf(line, sizeof line, "rank %d of %d:", tally_rank, tally_size);
  for (int i = 0; i < C_NCALLS && k > 0 && (size_t)k < sizeof line; i++)
    k += snprintf(line + k, sizeof line - (size_t)k, " %s %ld", names[i], calls[i]);
  fprintf(f, "%s\n", line);
  fclose(f);
}

static void count_call(int which) {
  const char *path = getenv("WEFT_CUDA_EMU_CCL");
  if (path && *path) calls[which]++;
}

static size_t dt_size(int dt) {
  if (dt == CCL_F64) return 8;
  if (dt == CCL_U8) return 1;
  return dt == GPU_BF16 || dt == GPU_F16 ? 2 : 4;
}

static double ccl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static std::string part_path(const ccl_comm *c, const std::string &what, int rank) {
  return c->dir + "/" + c->name + "." + what + "." + std::to_string(rank);
}

static bool put_file(const std::string &path, const void *p, size_t n) {
  std::string tmp = path + ".tmp";
  FILE *f = fopen(tmp.c_str(), "wb");
  if (!f) return false;
  bool ok = (n == 0 || fwrite(p, 1, n, f) == n);
  ok = fclose(f) == 0 && ok;
  return ok && rename(tmp.c_str(), path.c_str()) == 0;
}

static bool have_file(const std::string &path) { return access(path.c_str(), F_OK) == 0; }

static bool get_file(const std::string &path, std::vector<unsigned char> &out) {
  FILE *f = fopen(path.c_str(), "rb");
  if (!f) return false;
  out.clear();
  unsigned char buf[65536];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + k);
  fclose(f);
  return true;
}

static void stream_fail(const std::string &what) {
  if (emu_error.empty()) emu_error = "the stand-in for NCCL: " + what;
}

/* Waits at most timeout_s for every rank's file of what (host side). */
static bool await_all(const ccl_comm *c, const std::string &what, double timeout_s, char *err, size_t errlen) {
  double t0 = ccl_now();
  long nap = 100;
  for (int r = 0; r < c->size;) {
    if (have_file(part_path(c, what, r))) {
      r++;
      continue;
    }
    if (timeout_s > 0 && ccl_now() - t0 > timeout_s) {
      snprintf(err, errlen, "the stand-in for NCCL: rank %d of %d waited %g s for rank %d (%s; --timeout)", c->rank,
               c->size, timeout_s, r, what.c_str());
      return false;
    }
    struct timespec ts = {0, nap * 1000};
    nanosleep(&ts, NULL);
    if (nap < 20000) nap *= 2;
  }
  return true;
}

bool ccl_available(char *buf, size_t n) {
  snprintf(buf, n, "the emulation's stand-in for NCCL (processes of one machine, through files)");
  return true;
}

bool ccl_unique_id(unsigned char id[CCL_ID_BYTES], char *err, size_t errlen) {
  const char *t = getenv("TMPDIR");
  std::string tmpl = std::string(t && *t && strlen(t) < 64 ? t : "/tmp") + "/weft-nccl-XXXXXX";
  char dir[96];
  snprintf(dir, sizeof dir, "%s", tmpl.c_str());
  if (!mkdtemp(dir)) {
    snprintf(err, errlen, "the stand-in for NCCL: cannot make a directory %s: %s", dir, strerror(errno));
    return false;
  }
  memset(id, 0, CCL_ID_BYTES);
  snprintf((char *)id, CCL_ID_BYTES, "%s%s", ID_PREFIX, dir);
  return true;
}

ccl_comm *ccl_init(const unsigned char id[CCL_ID_BYTES], int nranks, int rank, double timeout_s, char *err,
                   size_t errlen) {
  char text[CCL_ID_BYTES + 1];
  memcpy(text, id, CCL_ID_BYTES);
  text[CCL_ID_BYTES] = 0;
  if (strncmp(text, ID_PREFIX, sizeof ID_PREFIX - 1) != 0 || nranks < 1 || rank < 0 || rank >= nranks) {
    snprintf(err, errlen, "the stand-in for NCCL: not its id, or rank %d of %d", rank, nranks);
    return NULL;
  }
  ccl_comm *c = new ccl_comm();
  c->dir = text + sizeof ID_PREFIX - 1;
  c->name = "w", c->rank = rank, c->size = nranks, c->world = true;
  c->sent.assign((size_t)nranks, 0), c->got.assign((size_t)nranks, 0);
  c->st = std::make_shared<ccl_state>();
  if (tally_rank < 0 && getenv("WEFT_CUDA_EMU_CCL") && *getenv("WEFT_CUDA_EMU_CCL")) atexit(write_calls);
  tally_rank = rank, tally_size = nranks;
  /* joining is collective, as ncclCommInitRank */
  if (!put_file(part_path(c, "join", rank), "", 0) || !await_all(c, "join", timeout_s, err, errlen)) {
    if (!err[0] || !strstr(err, "waited"))
      snprintf(err, errlen, "the stand-in for NCCL: cannot join in %s: %s", c->dir.c_str(), strerror(errno));
    delete c;
    return NULL;
  }
  return c;
}

bool ccl_split(ccl_comm *parent, int color, int key, double timeout_s, ccl_comm **out, char *err, size_t errlen) {
  *out = NULL;
  std::string what = "split" + std::to_string(parent->splits++);
  int mine[2] = {color, key};
  if (!put_file(part_path(parent, what, parent->rank), mine, sizeof mine) ||
      !await_all(parent, what, timeout_s, err, errlen))
    return false;
  /* the ranks of this color, ordered by key, then by rank */
  std::vector<std::pair<int, int>> members;
  for (int r = 0; r < parent->size; r++) {
    std::vector<unsigned char> b;
    int ck[2];
    if (!get_file(part_path(parent, what, r), b) || b.size() != sizeof ck) {
      snprintf(err, errlen, "the stand-in for NCCL: rank %d's part of a split is unreadable", r);
      return false;
    }
    memcpy(ck, b.data(), sizeof ck);
    if (ck[0] == color && color >= 0) members.push_back({ck[1], r});
  }
  if (color < 0) return true;
  std::sort(members.begin(), members.end());
  ccl_comm *c = new ccl_comm();
  c->dir = parent->dir;
  c->name = parent->name + "." + what + "c" + std::to_string(color);
  c->size = (int)members.size();
  for (int i = 0; i < c->size; i++)
    if (members[(size_t)i].second == parent->rank) c->rank = i;
  c->world = false;
  c->sent.assign((size_t)c->size, 0), c->got.assign((size_t)c->size, 0);
  c->st = parent->st;
  *out = c;
  return true;
}

int ccl_rank(const ccl_comm *c) { return c->rank; }
int ccl_size(const ccl_comm *c) { return c->size; }
void ccl_group_start(void) {}
bool ccl_group_end(ccl_comm *c, double timeout_s, char *err, size_t errlen) { return true; }

enum { K_REDUCE, K_SCATTER, K_GATHER, K_BCAST };

static void sum_into(void *acc, const void *x, int64_t n, int dt, int op) {
  for (int64_t i = 0; i < n; i++) {
    if (dt == CCL_F64) {
      double a = ((double *)acc)[i], b = ((const double *)x)[i];
      ((double *)acc)[i] = op == CCL_MAX ? (a > b ? a : b) : a + b;
    } else if (dt == GPU_I32) {
      int32_t a = ((int32_t *)acc)[i], b = ((const int32_t *)x)[i];
      ((int32_t *)acc)[i] = op == CCL_MAX ? (a > b ? a : b) : a + b;
    } else {
      float a, b;
      if (dt == GPU_BF16) a = to_f(((bf16 *)acc)[i]), b = to_f(((const bf16 *)x)[i]);
      else if (dt == GPU_F16) a = to_f(((f16 *)acc)[i]), b = to_f(((const f16 *)x)[i]);
      else a = ((float *)acc)[i], b = ((const float *)x)[i];
      float v = op == CCL_MAX ? (a > b ? a : b) : a + b;
      if (dt == GPU_BF16) ((bf16 *)acc)[i] = from_f<bf16>(v);
      else if (dt == GPU_F16) ((f16 *)acc)[i] = from_f<f16>(v);
      else ((float *)acc)[i] = v;
    }
  }
}

/* A collective: in elements of each rank's part (all_reduce: count; the
 * scatter: recv_count x size; the gather: send_count; broadcast: count,
 * the root's), out those of the result: the scatter gives rank r elements
 * [r x recv_count, (r + 1) x recv_count) of the sum, the gather puts rank
 * r's at r x send_count, ranks as the communicator orders them. Input and
 * output overlap only as NCCL allows (in place: the same address; the
 * scatter's output at rank x recv_count of its input, the gather's input
 * at rank x send_count of its output), else the call is refused. */
static bool collective(ccl_comm *c, int kind, const void *src, void *dst, int64_t n, int dt, int op, int root,
                       gpu_stream *s, char *err, size_t errlen) {
  size_t z = dt_size(dt);
  int size = c->size, me = c->rank;
  size_t in_bytes = (size_t)n * z * (kind == K_SCATTER ? (size_t)size : 1);
  size_t out_bytes = (size_t)n * z * (kind == K_GATHER ? (size_t)size : 1);
  static const char *const names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast"};
  if (n < 0) {
    snprintf(err, errlen, "the stand-in for NCCL: a %s of %lld elements", names[kind], (long long)n);
    return false;
  }
  const char *a = (const char *)src, *b = (const char *)dst;
  bool overlap = n > 0 && a < b + out_bytes && b < a + in_bytes;
  bool in_place = kind == K_SCATTER ? b == a + (size_t)me * out_bytes
                  : kind == K_GATHER ? a == b + (size_t)me * in_bytes
                                     : a == b;
  if (overlap && !in_place) {
    snprintf(err, errlen,
             "the stand-in for NCCL: rank %d of %d: the %s's input and output overlap, and not in place as NCCL "
             "defines it",
             me, size, names[kind]);
    return false;
  }
  count_call(kind == K_REDUCE ? C_ALL_REDUCE : kind == K_SCATTER ? C_REDUCE_SCATTER
             : kind == K_GATHER ? C_ALL_GATHER : C_BROADCAST);
  long seq = c->seq++;
  std::string what = std::to_string(seq);
  std::string mine = part_path(c, what, me);
  std::vector<std::string> parts;
  for (int r = 0; r < size; r++) parts.push_back(part_path(c, what, r));
  std::string prev = seq > 0 ? part_path(c, std::to_string(seq - 1), me) : std::string();
  auto st = c->st;
  bool posts = kind != K_BCAST || me == root;
  emu_enqueue((emu_stream *)s, [=] {
    if (st->aborted) return;
    if (!put_file(mine, posts ? src : "", posts ? in_bytes : 0)) stream_fail("cannot write " + mine);
    memset(dst, 0xff, out_bytes);
  });
  emu_enqueue_when(
      (emu_stream *)s,
      [=] {
        if (st->aborted) return true;
        for (const std::string &p : parts)
          if (!have_file(p)) return false;
        return true;
      },
      [=] {
        if (st->aborted) return;
        std::vector<unsigned char> b;
        std::vector<unsigned char> acc;
        for (int r = 0; r < size; r++) {
          if (kind == K_BCAST && r != root) continue;
          if (!get_file(parts[(size_t)r], b) || b.size() != in_bytes) {
            stream_fail("rank " + std::to_string(r) + "'s part of an operation is not whole: " + parts[(size_t)r]);
            return;
          }
          if (kind == K_GATHER) {
            acc.insert(acc.end(), b.begin(), b.end());
          } else if (kind == K_BCAST || acc.empty()) {
            acc = b;
          } else {
            sum_into(acc.data(), b.data(), (int64_t)(in_bytes / z), dt, op);
          }
        }
        if (kind == K_SCATTER) memcpy(dst, acc.data() + (size_t)me * out_bytes, out_bytes);
        else memcpy(dst, acc.data(), out_bytes);
        if (!prev.empty()) unlink(prev.c_str());
      });
  return true;
}

bool ccl_all_reduce(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, gpu_stream *s, char *err,
                    size_t errlen) {
  return collective(c, K_REDUCE, src, dst, count, dt, CCL_SUM, 0, s, err, errlen);
}
bool ccl_all_reduce_op(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int op, gpu_stream *s,
                       char *err, size_t errlen) {
  return collective(c, K_REDUCE, src, dst, count, dt, op, 0, s, err, errlen);
}
bool ccl_reduce_scatter(ccl_comm *c, const void *src, void *dst, int64_t recv_count, int dt, gpu_stream *s,
                        char *err, size_t errlen) {
  return collective(c, K_SCATTER, src, dst, recv_count, dt, CCL_SUM, 0, s, err, errlen);
}
bool ccl_all_gather(ccl_comm *c, const void *src, void *dst, int64_t send_count, int dt, gpu_stream *s, char *err,
                    size_t errlen) {
  return collective(c, K_GATHER, src, dst, send_count, dt, CCL_SUM, 0, s, err, errlen);
}
bool ccl_broadcast(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int root, gpu_stream *s,
                   char *err, size_t errlen) {
  if (root < 0 || root >= c->size) {
    snprintf(err, errlen, "the stand-in for NCCL: broadcast from rank %d of %d", root, c->size);
    return false;
  }
  return collective(c, K_BCAST, src, dst, count, dt, CCL_SUM, root, s, err, errlen);
}

static std::string p2p_path(const ccl_comm *c, int from, int to, long n) {
  return c->dir + "/" + c->name + ".p" + std::to_string(from) + "-" + std::to_string(to) + "." + std::to_string(n);
}

bool ccl_send(ccl_comm *c, const void *src, int64_t count, int dt, int peer, gpu_stream *s, char *err,
              size_t errlen) {
  if (peer < 0 || peer >= c->size || peer == c->rank) {
    snprintf(err, errlen, "the stand-in for NCCL: a send from rank %d to rank %d of %d", c->rank, peer, c->size);
    return false;
  }
  count_call(C_SEND);
  std::string path = p2p_path(c, c->rank, peer, c->sent[(size_t)peer]++);
  size_t bytes = (size_t)count * dt_size(dt);
  auto st = c->st;
  emu_enqueue((emu_stream *)s, [=] {
    if (!st->aborted && !put_file(path, src, bytes)) stream_fail("cannot write " + path);
  });
  return true;
}

bool ccl_recv(ccl_comm *c, void *dst, int64_t count, int dt, int peer, gpu_stream *s, char *err, size_t errlen) {
  if (peer < 0 || peer >= c->size || peer == c->rank) {
    snprintf(err, errlen, "the stand-in for NCCL: a receive by rank %d from rank %d of %d", c->rank, peer, c->size);
    return false;
  }
  count_call(C_RECV);
  std::string path = p2p_path(c, peer, c->rank, c->got[(size_t)peer]++);
  size_t bytes = (size_t)count * dt_size(dt);
  auto st = c->st;
  emu_enqueue_when(
      (emu_stream *)s, [=] { return st->aborted || have_file(path); },
      [=] {
        if (st->aborted) return;
        std::vector<unsigned char> b;
        if (!get_file(path, b) || b.size() != bytes) {
          stream_fail("a message of " + std::to_string(bytes) + " bytes is not whole: " + path);
          return;
        }
        memcpy(dst, b.data(), bytes);
        unlink(path.c_str());
      });
  return true;
}

int ccl_status(ccl_comm *c, char *err, size_t errlen) { return 0; }

static void remove_dir(const std::string &dir) {
  DIR *d = opendir(dir.c_str());
  for (struct dirent *x; d && (x = readdir(d));)
    if (strcmp(x->d_name, ".") && strcmp(x->d_name, "..")) unlink((dir + "/" + x->d_name).c_str());
  if (d) closedir(d);
  rmdir(dir.c_str());
}

/* The files go with the world (a process that still writes one fails, as
 * it would on an aborted communicator). */
void ccl_abort(ccl_comm *c) {
  if (!c) return;
  c->st->aborted = true;
  if (c->world) remove_dir(c->dir);
  delete c;
}

/* The world's end is collective: every rank posts that it is done, and
 * rank 0 removes the directory once all have (or after timeout_s). */
void ccl_free(ccl_comm *c, double timeout_s) {
  if (!c) return;
  if (c->world && !c->st->aborted) {
    char e[256];
    bool all = put_file(part_path(c, "bye", c->rank), "", 0) && (c->rank != 0 || await_all(c, "bye", timeout_s, e, sizeof e));
    if (c->rank == 0 && all) remove_dir(c->dir);
  }
  delete c;
}

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
bool ccl_all_reduce_op(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int op, gpu_stream *s,
                       char *err, size_t errlen) {
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
  case CCL_F64: return ncclFloat64;
  case CCL_U8: return ncclUint8;
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
bool ccl_all_reduce_op(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int op, gpu_stream *s,
                       char *err, size_t errlen) {
  return posted(c,
                ncclAllReduce(src, dst, (size_t)count, nccl_type(dt), op == CCL_MAX ? ncclMax : ncclSum, c->comm,
                              (cudaStream_t)s),
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
