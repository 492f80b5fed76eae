/* choice.c - the clock and ranges of the plugin's one-time choices
 * (choice.h). */
#include "choice.h"

#include <stdio.h>
#include <time.h>

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
