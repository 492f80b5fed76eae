/* diag.h - source files and diagnostics: positions, messages, hints.
 * Diagnostics are values collected in a weft_diags and printed by one function. */
#ifndef WEFT_DIAG_H
#define WEFT_DIAG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "weft/arena.h"

/* A span of source: 1-based lines and columns (columns count bytes);
 * end is inclusive of the last character. file indexes weft_srcs. */
typedef struct weft_loc {
  int file;
  int line, col;
  int end_line, end_col;
} weft_loc;

typedef struct weft_src {
  const char *path;       /* as the user named it, or "<std>/ops.plan" */
  const char *dir;        /* directory for relative `use`, "" for none */
  const char *text;       /* contents, NUL-terminated (NULs inside are kept) */
  size_t len;
  int *line_starts;       /* byte offset of each line's start */
  int nlines;
} weft_src;

typedef struct weft_srcs {
  weft_src *items;
  int n, cap;
} weft_srcs;

typedef enum { DIAG_ERROR, DIAG_WARNING, DIAG_NOTE } diag_sev;

typedef struct weft_diag {
  diag_sev sev;
  weft_loc loc;           /* loc.line == 0: no position (a whole-file or CLI error) */
  const char *msg;
  const char *hint;       /* NULL or one line shown as "hint: ..." */
  int seq;                /* order of emission, keeps the sort stable */
} weft_diag;

typedef struct weft_diags {
  arena *arena;
  weft_srcs *srcs;
  weft_diag *items;
  int n, cap;
  int errors, warnings;
  int max_errors;         /* stop collecting (and say so) after this many */
} weft_diags;

/* Adds a file; text is copied into the arena. Returns its index. */
int src_add(weft_srcs *s, arena *a, const char *path, const char *dir,
            const char *text, size_t len);
/* The largest source file weft reads (16 MiB): a plan is text written by
 * people or by weft search, a few kilobytes. */
#define SRC_MAX_BYTES ((int64_t)16 << 20)
/* Reads a regular file into the table (a FIFO or a device is refused
 * without blocking); -1 and the reason in why when it cannot be read. */
int src_read(weft_srcs *s, arena *a, const char *path, char *why, size_t whylen);
/* One line of a file without its newline, and its length. */
const char *src_line(const weft_src *s, int line, int *len);

weft_diag *diag_add(weft_diags *d, diag_sev sev, weft_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
weft_diag *diag_vadd(weft_diags *d, diag_sev sev, weft_loc loc, const char *fmt, va_list ap);
void diag_hint(weft_diag *g, weft_diags *d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sorts by file, line, column, emission and prints every diagnostic:
 * "path:line:col: error: msg", the source line, a caret line, "hint: ...". */
void diag_print(weft_diags *d, FILE *out, bool color);
/* The same as a JSON array, for --json. */
void diag_print_json(weft_diags *d, FILE *out);

/* "did you mean" support: the closest of names[0..n) to s, or NULL. */
const char *diag_closest(const char *s, const char *const *names, int n);

#endif
