/* prof.h - phase timings for users who ask why a command is slow: with
 * WEFT_PROFILE set in the environment, each phase prints one line to
 * stderr (CPU seconds, user and system, since the last mark, and the peak
 * resident memory so far). Without it a mark costs one branch. */
#ifndef WEFT_PROF_H
#define WEFT_PROF_H

void prof_mark(const char *phase);
/* A line of figures under the last phase (printf format). */
void prof_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
