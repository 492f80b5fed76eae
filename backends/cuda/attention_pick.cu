/* attention_pick.cu - which implementation runs attention: WEFT_ATTN's,
 * else the one chosen, for each shape of heads on each device, the first
 * time it runs.
 *
 * WEFT_ATTN (read once):
 *   unset   the plugin's kernels (mma.sync, else wmma, else CUDA cores),
 *           with cuDNN's fused attention, the kernels on Hopper's
 *           warpgroup products (fa-wg, and fa-wgp, its backward
 *           pipelined, where the GPU runs them) and the backward with dq
 *           from a stored dS (fa-ds) timed
 *           against them for heads whose forward is at least
 *           ATTN_TUNE_FLOP (small heads cost more to plan in cuDNN than
 *           they could gain; the backward with dq by atomics, fa-atomic,
 *           lost to mma.sync's at every shape timed on an H200 and is
 *           timed only when named);
 *   auto    the same for heads of every size;
 *   auto:W,...  the ways W (fa, wmma, cudnn, core, fa-atomic, fa-wg,
 *           fa-wgp, fa-ds) timed against the plugin's kernels, for heads
 *           of every size;
 *   fa, wmma, cudnn, core, fa-atomic, fa-wg, fa-wgp, fa-ds  that way
 *           alone, where it takes the heads (the plugin's kernels where it
 *           does not; fa-atomic, fa-wgp and fa-ds are backwards: the
 *           forward is fa's).
 *
 * The choice, one for each shape of heads, type, device and kind of call
 * (forward or backward, the forward's log-sum-exp kept or not, a backward
 * that writes or adds), at most 64: once the work before the call is done
 * (waited for within a bound, choice.h), the plugin's first kernels that
 * take the heads (the reference) run the call into its own outputs; every
 * other way that takes them runs it into scratch memory allocated in the
 * stream's order for the occasion and freed after; each runs once untimed
 * and twice timed. A way whose results differ from the reference's by
 * more than the kernels' tests allow (relative L2 error 1e-2 for 16-bit
 * outputs, 2e-5 for f32; the log-sum-exp a tenth of that; WEFT_ATTN_TOL
 * sets the first), or in any element by more than compare's bound (but
 * see the judge below), or that refuses, or that writes a value not finite
 * where the reference's is finite, is not taken; of the rest the fastest
 * runs the heads from then on, this call included (it runs again on the
 * way taken). Two computations that round differently differ by both
 * their errors, and the worst elements of a backward at 1024 positions
 * and more can go past the bound while both are as near the exact sums
 * in relative L2, whichever is the further one: a way within the
 * tolerance with an element over its bound is judged by the plugin's
 * kernels on CUDA cores (core: f32 throughout), run once into the
 * scratch, and taken if its worst element from core's results is within
 * the bound or at most twice the reference's. One line on stderr says
 * what was timed and what was taken.
 * A kernel's failure is left for the executor's next check to report at
 * the instruction, as any kernel's is (cuDNN's refusals are its return
 * values, not CUDA's errors). Nothing is chosen by time under
 * --deterministic (whose bits must not depend on a timing), for a
 * backward that adds to its gradients (it cannot run twice), or where the
 * scratch memory is not there (said on stderr): the reference runs.
 * In a run of several processes the way is agreed between them
 * (choice.h), so that heads a computation they replicate runs get the
 * same way, and bits, in each: the reference runs the heads until the
 * pass ends, the way agreed from then on (WEFT_CUDA_AGREE=0: each
 * process's own). */
#include "attention.cuh"
#include "choice.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <thread>
#include <vector>

const char *const attention_way_names[ATTN_WAYS] = {"fa",        "wmma",  "cudnn",  "core",
                                                      "fa-atomic", "fa-wg", "fa-wgp", "fa-ds"};

namespace {

/* A forward of at least this many flops (4 b h sq sk dh, half of it
 * causal) has cuDNN timed against the plugin's kernels by default: at
 * batch 4, 12 heads of 64 and 1024 positions, 6.4 GFLOP. */
const double ATTN_TUNE_FLOP = 4294967296.0;

struct pick_mode {
  bool read;
  int forced;         /* a way, or -1 */
  bool every;         /* auto: heads of every size */
  bool alt[ATTN_WAYS]; /* the ways timed against the reference */
};

pick_mode mode;

int way_named(const char *s, size_t n) {
  for (int w = 0; w < ATTN_WAYS; w++)
    if (strlen(attention_way_names[w]) == n && strncmp(s, attention_way_names[w], n) == 0) return w;
  return -1;
}

const pick_mode &the_mode(void) {
  if (mode.read) return mode;
  mode.read = true;
  mode.forced = -1;
  mode.every = false;
  for (int w = 0; w < ATTN_WAYS; w++)
    mode.alt[w] = w == ATTN_CUDNN || w == ATTN_FA_WG || w == ATTN_FA_WGP || w == ATTN_FA_DS;
  const char *e = getenv("WEFT_ATTN");
  if (!e || !*e) return mode;
  const int one = way_named(e, strlen(e));
  if (one >= 0) {
    mode.forced = one;
    const char *no = one == ATTN_FA_WG || one == ATTN_FA_WGP ? attention_wg_device_refusal() : NULL;
    if (no) fprintf(stderr, "weft: WEFT_ATTN=%s: its kernels do not run here (%s): the plugin's others run attention\n", e, no);
    return mode;
  }
  if (strcmp(e, "auto") == 0) {
    mode.every = true;
    return mode;
  }
  if (strncmp(e, "auto:", 5) == 0) {
    bool any = false, alt[ATTN_WAYS] = {};
    const char *p = e + 5;
    while (*p) {
      size_t n = strcspn(p, ",");
      int w = way_named(p, n);
      if (w < 0) {
        any = false;
        break;
      }
      alt[w] = any = true;
      p += n;
      if (*p == ',') p++;
    }
    if (any) {
      mode.every = true;
      memcpy(mode.alt, alt, sizeof alt);
      return mode;
    }
  }
  fprintf(stderr,
          "weft: WEFT_ATTN=%s is none of auto, auto:WAYS (of fa, wmma, cudnn, core, fa-atomic, fa-wg, fa-wgp, "
          "fa-ds, by commas), fa, wmma, cudnn, core, fa-atomic, fa-wg, fa-wgp, fa-ds; attention takes its default\n",
          e);
  return mode;
}

double forward_flop(const gpu_attn *a, bool causal) {
  double f = 4.0 * (double)a->b * (double)a->hq * (double)a->sq * (double)a->sk * (double)a->dh;
  return causal ? f / 2 : f;
}

/* The choice made for one shape of heads on one device. */
struct pick {
  int dev, dt;
  bool bwd, causal;
  bool kept, acc; /* the forward's log-sum-exp (and result) there; a backward that adds */
  gpu_attn a;
  int way; /* -1: the plugin's default */
};

pick picks[64];
int npicks;

bool same(const gpu_attn &x, const gpu_attn &y) {
  return x.b == y.b && x.sq == y.sq && x.hq == y.hq && x.dh == y.dh && x.r == y.r && x.q_row == y.q_row &&
         x.kv_row == y.kv_row && x.o_row == y.o_row && x.q_batch == y.q_batch && x.kv_batch == y.kv_batch &&
         x.o_batch == y.o_batch && x.sk == y.sk && x.qpos == y.qpos && x.det == y.det;
}

int current_device(void) {
#ifdef WEFT_CUDA_EMU
  return 0;
#else
  int dev = 0;
  cudaGetDevice(&dev);
  return dev;
#endif
}

pick *find(int dt, const gpu_attn *a, bool bwd, bool causal, bool kept, bool acc) {
  const int dev = current_device();
  for (int i = 0; i < npicks; i++)
    if (picks[i].dev == dev && picks[i].dt == dt && picks[i].bwd == bwd && picks[i].causal == causal &&
        picks[i].kept == kept && picks[i].acc == acc && same(picks[i].a, *a))
      return &picks[i];
  return NULL;
}

bool full(void) { return npicks == (int)(sizeof picks / sizeof picks[0]); }

/* A new pick for the call, running `way`; NULL when there is no room. */
pick *keep(int dt, const gpu_attn *a, bool bwd, bool causal, bool kept, bool acc, int way) {
  if (full()) return NULL;
  pick *p = &picks[npicks++];
  p->dev = current_device(), p->dt = dt, p->bwd = bwd, p->causal = causal, p->kept = kept, p->acc = acc;
  p->a = *a, p->way = way;
  return p;
}

/* The key of a call for the processes' agreement (choice.h): what find
 * compares but the device, the same in every process. */
unsigned long long call_key(int dt, const gpu_attn *a, bool bwd, bool causal, bool kept, bool acc) {
  const int64_t f[] = {dt,         bwd,         causal,      kept,       acc,         a->b,       a->sq,
                       a->hq,      a->dh,       a->r,        a->q_row,   a->kv_row,   a->o_row,   a->q_batch,
                       a->kv_batch, a->o_batch, a->sk,       a->qpos,    a->det};
  return choice_hash(CHOICE_HASH0, f, sizeof f);
}

/* choice_propose's takers: the way agreed for a pick; nothing, for a call
 * past the picks' room (the reference runs it). */
void take_way(void *ctx, int way) { ((pick *)ctx)->way = way; }
void take_nothing(void *ctx, int way) { (void)ctx, (void)way; }

/* Keeps `best` for the call, or, while the processes agree their choices,
 * proposes it (ok: the ways that passed) and keeps the reference until
 * they have. Every new call is proposed then, one that timed nothing
 * (best == ref, ok 0) too: what it runs, the reference, is a veto that
 * the others must meet, since what they time can differ (cuDNN found in
 * one process and not in another). */
int settle_or_propose(int dt, const gpu_attn *a, bool bwd, bool causal, bool kept, bool acc, unsigned ok, int best,
                      int ref) {
  pick *p = keep(dt, a, bwd, causal, kept, acc, ref);
  const unsigned long long key = call_key(dt, a, bwd, causal, kept, acc);
  if (!p) /* no room to keep it: the reference, each time */
    return choice_propose(CHOICE_ATTENTION, key, 0, ref, ref, take_nothing, NULL);
  return choice_propose(CHOICE_ATTENTION, key, ok, best, ref, take_way, p);
}

/* Whether way w takes the heads and the call: kept, the forward's
 * log-sum-exp (and, for a backward, its result) are there, which cuDNN
 * needs and the mma.sync backward reads. */
bool takes(int w, int dt, const gpu_attn *a, bool causal, bool bwd, bool kept) {
  if (!kept && (w == ATTN_CUDNN || (bwd && w != ATTN_WMMA && w != ATTN_CORE))) return false;
  return attention_way_takes(w, dt, a, causal, bwd);
}

/* The reference: the plugin's first kernels that take the call. */
int reference(int dt, const gpu_attn *a, bool causal, bool bwd, bool kept) {
  for (int w = ATTN_FA; w <= ATTN_CORE; w++)
    if (w != ATTN_CUDNN && takes(w, dt, a, causal, bwd, kept)) return w;
  return ATTN_CORE;
}

/* The ways to time against the reference ref: WEFT_ATTN's that take the
 * call. Their number. */
int others(int dt, const gpu_attn *a, bool causal, bool bwd, bool kept, int ref, int *out) {
  const pick_mode &m = the_mode();
  int n = 0;
  if (a->det || full() || a->b <= 0 || a->sq <= 0 || !(m.every || forward_flop(a, causal) >= ATTN_TUNE_FLOP))
    return 0;
  for (int w = 0; w < ATTN_WAYS; w++)
    if (m.alt[w] && w != ref && takes(w, dt, a, causal, bwd, kept)) out[n++] = w;
  return n;
}

/* ---- the comparison ----------------------------------------------------------------- */

/* One output of a call: where it lies (b rows of batch elements apart,
 * each of s rows of row elements apart, width elements each) and its type. */
struct region {
  int64_t b, batch, s, row, width;
  int dt;
  int64_t elems() const { return (b - 1) * batch + (s - 1) * row + width; }
  size_t bytes() const { return (size_t)elems() * (size_t)gpu_dtype_size(dt); }
};

/* How far got is from want over the region (both downloaded whole): the
 * relative L2 error, and the worst element's difference over its bound
 * 10 tol rms + 5 tol |want| (rms: want's root mean square), so that a few
 * rows gone wrong (a mask's last tile) show although they hardly move the
 * L2 error; both INFINITY where got is not finite and want is. */
struct diff {
  double rel, worst;
};

/* A part of the rows' sums: pass 0 the squares, pass 1 the worst. */
struct diff_part {
  double num, den, worst;
  int64_t count;
  bool lost; /* got not finite where want is */
};

template <class T>
void compare_rows(const void *want, const void *got, const region &r, int64_t lo, int64_t hi, int pass, double rms,
                  double tol, diff_part &p) {
  const T *w = (const T *)want, *g = (const T *)got;
  for (int64_t k = lo; k < hi && !p.lost; k++) {
    const int64_t at0 = (k / r.s) * r.batch + (k % r.s) * r.row;
    for (int64_t c = 0; c < r.width; c++) {
      const float x = to_f(w[at0 + c]), y = to_f(g[at0 + c]);
      if (!isfinite(y) && isfinite(x)) {
        p.lost = true;
        break;
      }
      if (!isfinite(x)) continue;
      const double d = fabs((double)y - x);
      if (pass == 0) {
        p.num += d * d, p.den += (double)x * x, p.count++;
      } else if (d > 0) {
        const double bound = 10 * tol * rms + 5 * tol * fabs((double)x);
        const double e = bound > 0 ? d / bound : INFINITY;
        p.worst = e > p.worst ? e : p.worst;
      }
    }
  }
}

/* The rows go in DIFF_PARTS parts, each its own sums, added in order (the
 * same sums on any machine), on as many threads as the host has up to
 * that, where the region is large (a backward at GPT-2's batch of 64 is
 * 150 million elements: seconds on one thread). */
enum { DIFF_PARTS = 16 };
const int64_t DIFF_THREADED = (int64_t)1 << 22;

diff compare(const void *want, const void *got, const region &r, double tol, unsigned threads = 0) {
  void (*rows)(const void *, const void *, const region &, int64_t, int64_t, int, double, double, diff_part &) =
      r.dt == GPU_F32 ? compare_rows<float> : r.dt == GPU_BF16 ? compare_rows<bf16> : compare_rows<f16>;
  const int64_t n = r.b * r.s, per = (n + DIFF_PARTS - 1) / DIFF_PARTS;
  unsigned hw = threads ? threads : r.b * r.s * r.width < DIFF_THREADED ? 1 : std::thread::hardware_concurrency();
  const unsigned nt = hw < 1 ? 1 : hw > (unsigned)DIFF_PARTS ? (unsigned)DIFF_PARTS : hw;
  diff_part parts[DIFF_PARTS];
  memset(parts, 0, sizeof parts);
  double rms = 0;
  for (int pass = 0; pass < 2; pass++) {
    /* thread t takes parts t, t + nt, ...; the calling thread is 0 */
    auto work = [&](unsigned t) {
      for (unsigned q = t; q < DIFF_PARTS; q += nt) {
        const int64_t lo = q * per, hi = lo + per < n ? lo + per : n;
        if (lo < hi) rows(want, got, r, lo, hi, pass, rms, tol, parts[q]);
      }
    };
    std::vector<std::thread> threads;
    for (unsigned t = 1; t < nt; t++) {
      try {
        threads.emplace_back(work, t);
      } catch (...) { /* no thread: the parts it had go to the calling one */
        work(t);
      }
    }
    work(0);
    for (auto &th : threads) th.join();
    double num = 0, den = 0, worst = 0;
    int64_t count = 0;
    for (int q = 0; q < DIFF_PARTS; q++) {
      if (parts[q].lost) return diff{INFINITY, INFINITY};
      num += parts[q].num, den += parts[q].den, count += parts[q].count;
      worst = parts[q].worst > worst ? parts[q].worst : worst;
    }
    if (pass == 1) return diff{den > 0 ? sqrt(num / den) : sqrt(num), worst};
    rms = count ? sqrt(den / (double)count) : 0;
  }
  return diff{0, 0};
}

/* The outputs of a call (at most 4: out and lse; dq, dk and dv), the
 * reference's and a scratch copy of each for the others, placed at the
 * reference's offset within 256 bytes so that a way sees the alignment
 * the real call has. */
struct outputs {
  int n;
  void *real[4];
  region reg[4];
  bool stats[4]; /* the log-sum-exp: compared at a tenth of the tolerance */
  void *scratch, *at[4];
  size_t total;

  void add(void *p, const region &r, bool st) {
    if (!p) return;
    real[n] = p, reg[n] = r, stats[n] = st;
    n++;
  }
  bool alloc(gpu_stream *st) {
    size_t off[4];
    total = 0;
    for (int i = 0; i < n; i++) {
      off[i] = total + ((uintptr_t)real[i] & 255);
      total = (off[i] + reg[i].bytes() + 255) & ~(size_t)255;
    }
    /* outputs that lie in one span shorter than their sum (dq, dk and dv
     * as parts of the rows of one buffer, as a fused q|k|v has them) get
     * one copy of the span, each at its place in it */
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < n; i++) {
      uintptr_t p = (uintptr_t)real[i];
      lo = p < lo ? p : lo;
      hi = p + reg[i].bytes() > hi ? p + reg[i].bytes() : hi;
    }
    const size_t span = n ? (size_t)(hi - lo) + (lo & 255) : 0;
    if (n > 1 && span < total) {
      total = span;
      for (int i = 0; i < n; i++) off[i] = (lo & 255) + ((uintptr_t)real[i] - lo);
    }
    char err[256];
    scratch = total ? gpu_alloc_on(total, st, err, sizeof err) : NULL;
    if (!scratch) return false;
    for (int i = 0; i < n; i++) at[i] = (char *)scratch + off[i];
    return true;
  }
};

/* Downloads every output of the reference (real) or of the scratch; a
 * failure of the GPU's is left for the executor to report. */
bool download(const outputs &o, bool real, void **host, gpu_stream *s) {
  char err[256];
  for (int i = 0; i < o.n; i++) {
    host[i] = malloc(o.reg[i].bytes());
    if (!host[i]) return false;
    if (!gpu_download(host[i], real ? o.real[i] : o.at[i], o.reg[i].bytes(), s, err, sizeof err)) {
      gpu_raise(err);
      return false;
    }
  }
  return true;
}

/* How far the outputs got are from want: the largest relative L2 error
 * and worst element of them (the log-sum-exp held to a tenth of tol). */
diff differs(const outputs &o, void *const *want, void *const *got, double tol) {
  diff d = {0, 0};
  for (int j = 0; j < o.n; j++) {
    const diff e = compare(want[j], got[j], o.reg[j], o.stats[j] ? tol / 10 : tol);
    const double rel = o.stats[j] ? e.rel * 10 : e.rel;
    d.rel = rel > d.rel || isnan(rel) ? rel : d.rel;
    d.worst = e.worst > d.worst || isnan(e.worst) ? e.worst : d.worst;
  }
  return d;
}

/* tests: WEFT_CUDA_EMU_SPOIL=ref (or way) moves the element of least
 * magnitude of the reference's first output (or of each other way's) by
 * a fifth of its tensor's root mean square, as read back: within the
 * tolerance, over the element's bound, so that the judge decides. */
#ifdef WEFT_CUDA_EMU
float host_value(const void *p, int dt, int64_t i) {
  if (dt == GPU_F32) return ((const float *)p)[i];
  if (dt == GPU_BF16) return to_f(((const bf16 *)p)[i]);
  return to_f(((const f16 *)p)[i]);
}
#endif

void spoil(const outputs &o, void *const *host, bool ref) {
#ifdef WEFT_CUDA_EMU
  const char *e = getenv("WEFT_CUDA_EMU_SPOIL");
  if (!e || strcmp(e, ref ? "ref" : "way") != 0 || o.n == 0 || !host[0]) return;
  const region &r = o.reg[0];
  double sq = 0;
  int64_t count = 0, least = -1;
  for (int64_t bi = 0; bi < r.b; bi++)
    for (int64_t i = 0; i < r.s; i++)
      for (int64_t c = 0; c < r.width; c++) {
        const int64_t at = bi * r.batch + i * r.row + c;
        const float x = host_value(host[0], r.dt, at);
        sq += (double)x * x, count++;
        if (least < 0 || fabsf(x) < fabsf(host_value(host[0], r.dt, least))) least = at;
      }
  if (least < 0) return;
  const float y = host_value(host[0], r.dt, least) + (float)(0.2 * sqrt(sq / (double)count));
  if (r.dt == GPU_F32) ((float *)host[0])[least] = y;
  else if (r.dt == GPU_BF16) ((bf16 *)host[0])[least] = from_f<bf16>(y);
  else ((f16 *)host[0])[least] = from_f<f16>(y);
#else
  (void)o, (void)host, (void)ref;
#endif
}

double tolerance(int dt) {
  const char *e = getenv("WEFT_ATTN_TOL");
  if (e && *e) {
    char *end;
    double t = strtod(e, &end);
    if (*end == 0 && t >= 0) return t;
  }
  return dt == GPU_F32 ? 2e-5 : 1e-2;
}

/* ---- timing ------------------------------------------------------------------------- */

/* Runs call(real) once untimed and twice timed on stream s: the
 * milliseconds of one, -1 where it refused or failed. */
template <class F> double timed(gpu_stream *s, F call) {
  char err[256];
  if (!call()) return -1;
  gpu_event *e0 = gpu_event_timed(err, sizeof err), *e1 = gpu_event_timed(err, sizeof err);
  double ms = -1;
  if (e0 && e1) {
    gpu_record(e0, s);
    bool ok = call() && call();
    gpu_record(e1, s);
    ms = ok ? gpu_elapsed_ms(e0, e1, err, sizeof err) : -1;
    if (ok && ms < 0) gpu_raise(err);
    if (ms >= 0) ms /= 2;
  }
  if (e0) gpu_event_free(e0);
  if (e1) gpu_event_free(e1);
  return ms;
}

const char *dt_name(int dt) { return dt == GPU_F32 ? "f32" : dt == GPU_BF16 ? "bf16" : "f16"; }

/* choose's timing and comparison, the work before it done. */
template <class F>
int timed_choice(gpu_stream *s, int dt, const gpu_attn *a, bool bwd, bool causal, bool kept, int ref, const int *alt,
                 int n, outputs &o, F run) {
  if (!o.alloc(s)) {
    fprintf(stderr, "weft: attention %s, b%lld h%lld s%lld d%lld: no memory for the %zu bytes of scratch to time %s "
            "against; %s runs them\n", bwd ? "backward" : "forward", (long long)a->b, (long long)a->hq,
            (long long)a->sq, (long long)a->dh, o.total, attention_way_names[alt[0]], attention_way_names[ref]);
    return settle_or_propose(dt, a, bwd, causal, kept, false, 0, ref, ref);
  }
  double ms_ref = timed(s, [&] { return run(ref, true); });
  void *want[4] = {NULL, NULL, NULL, NULL};
  bool have = ms_ref >= 0 && download(o, true, want, s);
  if (have) spoil(o, want, true);
  char line[1024];
  int len = snprintf(line, sizeof line, "weft: attention %s, b%lld h%lld s%lld d%lld %s%s: %s %.3f ms",
                     bwd ? "backward" : "forward", (long long)a->b, (long long)a->hq, (long long)a->sq,
                     (long long)a->dh, dt_name(dt), causal ? " causal" : "", attention_way_names[ref], ms_ref);
  int best = ref;
  double best_ms = ms_ref;
  unsigned passed = 0;
  const double tol = tolerance(dt);
  /* tests: WEFT_CUDA_EMU_PICK=P, in a run of several processes, has
   * process P take the last of the other ways that pass, the others the
   * first, whatever the times, so that the processes' choices differ */
  int order = 0; /* 1: the first that passes, 2: the last */
#ifdef WEFT_CUDA_EMU
  const char *pk = getenv("WEFT_CUDA_EMU_PICK");
  if (pk && *pk && choice_rank() >= 0) order = atoi(pk) == choice_rank() ? 2 : 1;
#endif
  /* the judge: core's sums in f32, run into the scratch (once) when a way
   * has an element over its bound (judged: its outputs; ref_far: the
   * reference's distance from them) */
  void *judged[4] = {NULL, NULL, NULL, NULL};
  diff ref_far = {0, 0};
  bool judge_tried = false;
  for (int i = 0; i < n && have; i++) {
    const int w = alt[i];
    double ms = timed(s, [&] { return run(w, false); });
    const char *verdict = NULL;
    diff far = {0, 0};
    char judged_line[200] = "";
    void *got[4] = {NULL, NULL, NULL, NULL};
    if (ms < 0) {
      verdict = "refused";
    } else if (download(o, false, got, s)) {
      spoil(o, got, false);
      far = differs(o, want, got, tol);
    } else {
      verdict = "not read back";
    }
    if (!verdict && !(far.rel <= tol)) verdict = "over the tolerance";
    if (!verdict && !(far.worst <= 1.0)) verdict = "an element over its bound";
    /* two computations that round differently differ by both their
     * errors, most in their largest rows: a way within the tolerance
     * with an element over its bound is judged by core's sums in f32,
     * and taken if its worst element there is within its bound or at
     * most twice the reference's (core itself has no judge) */
    if (verdict && far.rel <= tol && isfinite(far.worst) && w != ATTN_CORE && ref != ATTN_CORE) {
      if (!judged[0] && !judge_tried) {
        judge_tried = true;
        if (attention_way_takes(ATTN_CORE, dt, a, causal, bwd) && run(ATTN_CORE, false) &&
            download(o, false, judged, s))
          ref_far = differs(o, judged, want, tol);
        else
          for (int j = 0; j < o.n; j++) free(judged[j]), judged[j] = NULL;
      }
      if (judged[0]) {
        const diff own = differs(o, judged, got, tol);
        const bool near = own.worst <= fmax(1.0, 2 * ref_far.worst);
        snprintf(judged_line, sizeof judged_line,
                 " (from %s's f32 sums: %s's worst element %.2g of its bound, rel err %.1e; %s's %.2g, rel err %.1e)",
                 attention_way_names[ATTN_CORE], attention_way_names[ref], ref_far.worst / 1.0, ref_far.rel,
                 attention_way_names[w], own.worst / 1.0, own.rel);
        verdict = near ? NULL : "further than twice the reference from the sums in f32";
      }
    }
    for (int j = 0; j < o.n; j++) free(got[j]);
    if (len > 0 && (size_t)len < sizeof line) {
      if (ms < 0)
        len += snprintf(line + len, sizeof line - (size_t)len, "; %s %s", attention_way_names[w], verdict);
      else
        len += snprintf(line + len, sizeof line - (size_t)len,
                        "; %s %.3f ms, rel err %.1e, worst element %.2g of its bound%s%s%s", attention_way_names[w],
                        ms, far.rel, far.worst / 1.0, judged_line, verdict ? ", " : "",
                        verdict ? verdict : "");
    }
    if (!verdict) passed |= 1u << w;
    if (!verdict && (order == 2 || (order == 1 && best == ref) || (order == 0 && ms < best_ms)))
      best = w, best_ms = ms;
  }
  for (int j = 0; j < o.n; j++) free(judged[j]);
  for (int j = 0; j < o.n; j++) free(want[j]);
  gpu_free_on(o.scratch, s);
  if (len > 0 && (size_t)len < sizeof line) {
    if (choice_agreeing())
      snprintf(line + len, sizeof line - (size_t)len,
               "%s: process %d proposes %s, %s runs them until the processes agree (tolerance %.0e)",
               have ? "" : " (not read back)", choice_rank(), attention_way_names[best], attention_way_names[ref], tol);
    else
      snprintf(line + len, sizeof line - (size_t)len, "%s: %s runs them (tolerance %.0e)",
               have ? "" : " (not read back)", attention_way_names[best], tol);
  }
  fprintf(stderr, "%s\n", line);
  return settle_or_propose(dt, a, bwd, causal, kept, false, passed, best, ref);
}

/* Times ref and the ways others[n] (run(way, real outputs?) runs one),
 * compares each with ref, says so, and keeps the fastest that agrees. */
template <class F>
int choose(gpu_stream *s, int dt, const gpu_attn *a, bool bwd, bool causal, bool kept, int ref, const int *alt, int n,
           outputs &o, F run) {
  const bool waits = choice_waits();
  if (!choice_settled(s)) {
    if (waits)
      fprintf(stderr,
              "weft: attention %s, b%lld h%lld s%lld d%lld: the work before it did not end within %g s; nothing "
              "is timed, %s runs them\n",
              bwd ? "backward" : "forward", (long long)a->b, (long long)a->hq, (long long)a->sq, (long long)a->dh,
              choice_wait_s(), attention_way_names[ref]);
    return settle_or_propose(dt, a, bwd, causal, kept, false, 0, ref, ref);
  }
  char what[160];
  snprintf(what, sizeof what, "timing attention's ways: %s, b%lld h%lld s%lld d%lld %s%s", bwd ? "backward" : "forward",
           (long long)a->b, (long long)a->hq, (long long)a->sq, (long long)a->dh, dt_name(dt), causal ? " causal" : "");
  const choice_mark mark = choice_begin(CHOICE_ATTENTION, what);
  const int way = timed_choice(s, dt, a, bwd, causal, kept, ref, alt, n, o, run);
  choice_end(mark);
  return way;
}

region heads(const gpu_attn *a, int64_t batch, int64_t row, int64_t h, int dt) {
  region r = {a->b, batch, a->sq, row, h * a->dh, dt};
  return r;
}

} // namespace

void gpu_attention_compare(const void *want, const void *got, int dt, int64_t b, int64_t batch, int64_t s,
                           int64_t row, int64_t width, double tol, unsigned threads, double *rel, double *worst) {
  const region r = {b, batch, s, row, width, dt};
  const diff d = compare(want, got, r, tol, threads);
  *rel = d.rel, *worst = d.worst;
}

int attention_forced(void) { return the_mode().forced; }

void gpu_attention_about(char *buf, size_t n) {
  const pick_mode &m = the_mode();
  /* the warpgroup ways where this GPU runs none of their kernels (the
   * switch, another GPU than compute capability 9.0), and why */
  const char *wg_out = attention_wg_device_refusal();
  auto kept_out = [wg_out](int w) { return wg_out && (w == ATTN_FA_WG || w == ATTN_FA_WGP); };
  if (m.forced >= 0) {
    char why[160] = "";
    if (kept_out(m.forced)) snprintf(why, sizeof why, ", which it takes none of here (%s)", wg_out);
    snprintf(buf, n, "%s, where it takes the heads (WEFT_ATTN=%s)%s", attention_way_names[m.forced],
             attention_way_names[m.forced], why);
    return;
  }
  char ways[96] = "";
  for (int w = 0, k = 0; w < ATTN_WAYS; w++)
    if (m.alt[w] && !kept_out(w))
      k += snprintf(ways + k, sizeof ways - (size_t)k, "%s%s", k ? ", " : "", attention_way_names[w]);
  char off[160] = "";
  if (wg_out) snprintf(off, sizeof off, " (fa-wg and fa-wgp kept out: %s)", wg_out);
  if (!ways[0])
    snprintf(buf, n, "the plugin's kernels%s", off);
  else if (m.every)
    snprintf(buf, n, "the plugin's kernels, %s timed against them for heads of every size (WEFT_ATTN=%s)%s", ways,
             getenv("WEFT_ATTN"), off);
  else
    snprintf(buf, n, "the plugin's kernels, %s timed against them for heads of 2^32 flops and more%s", ways, off);
}

bool attention_cudnn_considered(int dt, const gpu_attn *a, bool causal) {
  const pick_mode &m = the_mode();
  if (m.forced >= 0) return m.forced == ATTN_CUDNN;
  return m.alt[ATTN_CUDNN] && !a->det && (m.every || forward_flop(a, causal) >= ATTN_TUNE_FLOP);
}

/* Whether a backward way with a workspace of its own is to be asked for
 * these heads: named, or timed for them (a backward that adds is not). */
static bool backward_considered(int way, int dt, const gpu_attn *a, bool causal, bool acc) {
  const pick_mode &m = the_mode();
  if (!attention_way_takes(way, dt, a, causal, true)) return false;
  if (m.forced >= 0) return m.forced == way;
  return !acc && m.alt[way] && (m.every || forward_flop(a, causal) >= ATTN_TUNE_FLOP);
}

bool attention_fa_atomic_considered(int dt, const gpu_attn *a, bool causal, bool acc) {
  return backward_considered(ATTN_FA_ATOMIC, dt, a, causal, acc);
}

bool attention_fa_ds_considered(int dt, const gpu_attn *a, bool causal, bool acc) {
  return backward_considered(ATTN_FA_DS, dt, a, causal, acc);
}

int attention_pick_forward(gpu_stream *s, int dt, void *out, const void *q, const void *k, const void *v,
                           const gpu_attn *a, float *lse, bool causal) {
  const pick_mode &m = the_mode();
  if (m.forced >= 0) return m.forced;
  if (const pick *p = find(dt, a, false, causal, lse != NULL, false)) return p->way;
  const int ref = reference(dt, a, causal, false, lse != NULL);
  int alt[ATTN_WAYS];
  const int n = others(dt, a, causal, false, lse != NULL, ref, alt);
  if (n == 0) return settle_or_propose(dt, a, false, causal, lse != NULL, false, 0, ref, ref);
  outputs o;
  memset(&o, 0, sizeof o);
  o.add(out, heads(a, a->o_batch, a->o_row, a->hq, dt), false);
  region st = {1, 0, 1, 0, a->b * a->hq * a->sq, GPU_F32};
  o.add(lse, st, true);
  return choose(s, dt, a, false, causal, lse != NULL, ref, alt, n, o, [&](int w, bool real) {
    return attention_forward_by(w, s, dt, real ? out : o.at[0], q, k, v, a,
                                lse ? (float *)(real ? o.real[1] : o.at[1]) : NULL, causal);
  });
}

int attention_pick_backward(gpu_stream *s, int dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const gpu_attn *a, bool acc, const float *lse,
                            const void *out, void *ws, bool causal) {
  const pick_mode &m = the_mode();
  if (m.forced >= 0) return m.forced;
  const bool kept = lse && out;
  if (const pick *p = find(dt, a, true, causal, kept, acc)) return p->way;
  const int ref = reference(dt, a, causal, true, kept);
  int alt[ATTN_WAYS];
  const int n = acc ? 0 : others(dt, a, causal, true, kept, ref, alt);
  if (n == 0) return settle_or_propose(dt, a, true, causal, kept, acc, 0, ref, ref);
  outputs o;
  memset(&o, 0, sizeof o);
  const int64_t hkv = a->hq / a->r;
  /* the outputs present, in the order dq, dk, dv, their slots noted */
  int slot[3] = {-1, -1, -1};
  void *grads[3] = {dq, dk, dv};
  for (int i = 0; i < 3; i++) {
    if (!grads[i]) continue;
    slot[i] = o.n;
    o.add(grads[i], i == 0 ? heads(a, a->q_batch, a->q_row, a->hq, dt) : heads(a, a->kv_batch, a->kv_row, hkv, dt),
          false);
    if (i > 0) o.reg[o.n - 1].s = a->sk;
  }
  return choose(s, dt, a, true, causal, kept, ref, alt, n, o, [&](int w, bool real) {
    void *g[3];
    for (int i = 0; i < 3; i++) g[i] = slot[i] < 0 ? NULL : real ? o.real[slot[i]] : o.at[slot[i]];
    return attention_backward_by(w, s, dt, g[0], g[1], g[2], dout, q, k, v, a, false, lse, out, ws, causal);
  });
}
