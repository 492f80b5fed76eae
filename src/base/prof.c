/* prof.c - phase timings (prof.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "prof.h"

static int enabled = -1;

static bool on(void) {
  if (enabled < 0) {
    const char *v = getenv("WEFT_PROFILE");
    enabled = v && *v && *v != '0';
  }
  return enabled;
}
static double last_user, last_sys;

static double secs(struct timeval tv) { return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6; }

void prof_mark(const char *phase) {
  if (!on()) return;
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return;
  double u = secs(ru.ru_utime), s = secs(ru.ru_stime);
  fprintf(stderr, "weft profile: %-24s user %6.3f s  sys %6.3f s  peak RSS %7.1f MiB\n", phase, u - last_user,
          s - last_sys, (double)ru.ru_maxrss / 1024.0);
  last_user = u;
  last_sys = s;
}

void prof_note(const char *fmt, ...) {
  if (!on()) return;
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "weft profile:   %s\n", line);
}
