/* choice.c - the clock and ranges of the plugin's one-time choices
 * (choice.h). */
#include "choice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cx.h"
#include "nvtx.h"

static double counted[CHOICE_KINDS];
static int depth;
static double wait_s = CHOICE_WAIT_S;
static bool gave_up;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

choice_mark choice_begin(int kind, const char *what) {
  choice_mark m = {now_s(), kind, depth == 0};
  depth++;
  nvtx_push_choice(what);
  return m;
}

void choice_end(choice_mark m) {
  nvtx_pop_choice();
  if (depth > 0) depth--;
  if (m.outer && m.kind >= 0 && m.kind < CHOICE_KINDS) counted[m.kind] += now_s() - m.t0;
}

double choice_take(double *by_kind) {
  double all = 0;
  for (int k = 0; k < CHOICE_KINDS; k++) {
    all += counted[k];
    if (by_kind) by_kind[k] = counted[k];
    counted[k] = 0;
  }
  return all;
}

bool choice_settled(gpu_stream *s) {
  if (gave_up) return false;
  char err[256];
  gpu_event *e = gpu_event_new(err, sizeof err);
  if (!e) return false;
  gpu_record(e, s);
  const double t0 = now_s();
  const struct timespec nap = {0, 200000};
  int done;
  while ((done = gpu_event_done(e, err, sizeof err)) == 0 && now_s() - t0 <= wait_s) nanosleep(&nap, NULL);
  if (done < 0) gpu_raise(err);
  gave_up = done == 0;
  gpu_event_free(e);
  return done == 1;
}

void choice_wait_limit(double seconds) { wait_s = seconds > 0 && seconds < CHOICE_WAIT_S ? seconds : CHOICE_WAIT_S; }

double choice_wait_s(void) { return wait_s; }

bool choice_waits(void) { return !gave_up; }

/* ---- choices agreed between processes ---- */

typedef struct proposal {
  int kind;
  unsigned long long key;
  unsigned ok;
  int best, ref;
  void (*take)(void *, int);
  void *ctx;
} proposal;

static proposal *pending;
static int npending, cappending;
static int the_rank = -1;
static bool agreeing;

void choice_among(int rank, int nprocs) {
  const char *e = getenv("WEFT_CUDA_AGREE");
  the_rank = nprocs > 1 && rank >= 0 ? rank : -1;
  agreeing = the_rank >= 0 && !(e && strcmp(e, "0") == 0);
  if (!agreeing) npending = 0; /* a run closed: its proposals are gone with it */
}

int choice_rank(void) { return the_rank; }

bool choice_agreeing(void) { return agreeing; }

unsigned long long choice_hash(unsigned long long h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

int choice_propose(int kind, unsigned long long key, unsigned ok, int best, int ref, void (*take)(void *, int),
                   void *ctx) {
  if (!agreeing) {
    take(ctx, best);
    return best;
  }
  /* a call proposed again before the pass ends (one past the chooser's
   * room, which keeps nothing) waits once */
  for (int i = 0; i < npending; i++)
    if (pending[i].kind == kind && pending[i].key == key) return ref;
  if (npending == cappending) {
    cappending = cappending ? 2 * cappending : 16;
    pending = cx_grow(pending, sizeof(proposal) * (size_t)cappending);
  }
  pending[npending++] = (proposal){kind, key, ok | 1u << ref, best, ref, take, ctx};
  return ref;
}

int choice_pending(void) { return npending; }

void choice_proposals(int *out, int max) {
  memset(out, 0, sizeof(int) * (size_t)max * CHOICE_INTS);
  for (int i = 0; i < npending && i < max; i++) {
    int *o = out + i * CHOICE_INTS;
    o[0] = pending[i].kind + 1;
    o[1] = (int)(unsigned)(pending[i].key & 0xffffffffu), o[2] = (int)(unsigned)(pending[i].key >> 32);
    o[3] = (int)pending[i].ok, o[4] = pending[i].best;
  }
}

int choice_settle(const int *all, int nprocs, int per) {
  int other = 0;
  for (int i = 0; i < npending; i++) {
    const proposal *q = &pending[i];
    const int lo = (int)(unsigned)(q->key & 0xffffffffu), hi = (int)(unsigned)(q->key >> 32);
    unsigned ok = q->ok;
    int first = -1;
    for (int p = 0; p < nprocs; p++)
      for (int j = 0; j < per; j++) {
        const int *r = all + ((size_t)p * (size_t)per + (size_t)j) * CHOICE_INTS;
        if (r[0] != q->kind + 1 || r[1] != lo || r[2] != hi) continue;
        if (first < 0) first = r[4];
        ok &= (unsigned)r[3];
      }
    if (first < 0) first = q->best; /* its own record was not among them */
    const int option = first >= 0 && first < 32 && (ok >> first & 1u) ? first : q->ref;
    if (option != q->best) other++;
    q->take(q->ctx, option);
  }
  npending = 0;
  return other;
}
