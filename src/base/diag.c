/* diag.c - the source table and the one place that prints diagnostics.
 * Messages are collected while a stage runs, then sorted and printed. */
#include "weft/diag.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/files.h"

int src_add(weft_srcs *s, arena *a, const char *path, const char *dir,
            const char *text, size_t len) {
  arena_grow(a, (void **)&s->items, &s->cap, s->n + 1, sizeof(weft_src));
  weft_src *f = &s->items[s->n];
  f->path = arena_strdup(a, path);
  f->dir = arena_strdup(a, dir ? dir : "");
  f->text = arena_strndup(a, text, len);
  f->len = len;
  int cap = 0, n = 0;
  int *starts = NULL;
  arena_grow(a, (void **)&starts, &cap, 1, sizeof(int));
  starts[n++] = 0;
  for (size_t i = 0; i < len; i++) {
    if (text[i] == '\n' && i + 1 <= len) {
      arena_grow(a, (void **)&starts, &cap, n + 1, sizeof(int));
      starts[n++] = (int)(i + 1);
    }
  }
  f->line_starts = starts;
  f->nlines = n;
  return s->n++;
}

int src_read(weft_srcs *s, arena *a, const char *path, char *why, size_t whylen) {
  size_t len = 0;
  char *buf = file_read_all(path, SRC_MAX_BYTES, &len, why, whylen);
  if (!buf) return -1;
  char *dir = arena_strdup(a, path);
  char *slash = strrchr(dir, '/');
  if (slash) slash[1] = 0; else dir[0] = 0;
  int id = src_add(s, a, path, dir, buf, len);
  free(buf);
  return id;
}

const char *src_line(const weft_src *s, int line, int *len) {
  if (line < 1 || line > s->nlines) { *len = 0; return ""; }
  size_t start = (size_t)s->line_starts[line - 1];
  size_t end = start;
  while (end < s->len && s->text[end] != '\n') end++;
  if (end > start && s->text[end - 1] == '\r') end--;
  *len = (int)(end - start);
  return s->text + start;
}

weft_diag *diag_vadd(weft_diags *d, diag_sev sev, weft_loc loc, const char *fmt, va_list ap) {
  static weft_diag sink;  /* absorbs hints once the error limit is reached */
  if (sev == DIAG_ERROR) d->errors++;
  if (sev == DIAG_WARNING) d->warnings++;
  int limit = d->max_errors > 0 ? d->max_errors : 50;
  if (sev == DIAG_ERROR && d->errors > limit) return &sink;
  arena_grow(d->arena, (void **)&d->items, &d->cap, d->n + 1, sizeof(weft_diag));
  weft_diag *g = &d->items[d->n];
  memset(g, 0, sizeof *g);
  g->sev = sev;
  g->loc = loc;
  g->seq = d->n++;
  va_list cp;
  va_copy(cp, ap);
  int n = vsnprintf(NULL, 0, fmt, cp);
  va_end(cp);
  char *msg = arena_alloc(d->arena, (size_t)(n < 0 ? 0 : n) + 1);
  vsnprintf(msg, (size_t)(n < 0 ? 0 : n) + 1, fmt, ap);
  g->msg = msg;
  return g;
}

weft_diag *diag_add(weft_diags *d, diag_sev sev, weft_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  weft_diag *g = diag_vadd(d, sev, loc, fmt, ap);
  va_end(ap);
  return g;
}

void diag_hint(weft_diag *g, weft_diags *d, const char *fmt, ...) {
  if (!g->msg) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *h = arena_alloc(d->arena, (size_t)(n < 0 ? 0 : n) + 1);
  va_start(ap, fmt);
  vsnprintf(h, (size_t)(n < 0 ? 0 : n) + 1, fmt, ap);
  va_end(ap);
  g->hint = h;
}

/* Diagnostics print in the order they were found: a stage reports in source
 * order already, and a note or a "see above" hint then follows what it
 * explains. */
static int diag_cmp(const void *pa, const void *pb) {
  const weft_diag *a = pa, *b = pb;
  return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static const char *sev_name(diag_sev s) {
  return s == DIAG_ERROR ? "error" : s == DIAG_WARNING ? "warning" : "note";
}

/* Prints a source line with control bytes and invalid UTF-8 made visible, so a
 * NUL or a stray byte in the input never garbles the terminal. Returns the
 * display column of each byte through cols (cols[i] = column before byte i). */
static void print_line(FILE *out, const char *p, int len, int *cols) {
  int c = 0;
  for (int i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)p[i];
    if (cols) cols[i] = c;
    if (ch == '\t') { fputs("    ", out); c += 4; }
    else if (ch < 0x20 || ch == 0x7f || ch >= 0x80) {
      /* UTF-8 continuation and lead bytes are shown as one '?' each when the
       * sequence is invalid; valid sequences pass through. */
      int n = ch >= 0xf0 && ch < 0xf8 ? 4 : ch >= 0xe0 && ch < 0xf0 ? 3 : ch >= 0xc2 && ch < 0xe0 ? 2 : 0;
      bool ok = n > 0 && i + n <= len;
      for (int k = 1; ok && k < n; k++) ok = ((unsigned char)p[i + k] & 0xc0) == 0x80;
      if (ok) {
        fwrite(p + i, 1, (size_t)n, out);
        for (int k = 1; k < n; k++) if (cols) cols[i + k] = c;
        i += n - 1;
        c += 1;
      } else {
        fputc('?', out);
        c += 1;
      }
    } else { fputc(ch, out); c += 1; }
  }
  if (cols) cols[len] = c;
}

void diag_print(weft_diags *d, FILE *out, bool color) {
  if (d->n > 1) qsort(d->items, (size_t)d->n, sizeof(weft_diag), diag_cmp);
  const char *bold = color ? "\033[1m" : "", *reset = color ? "\033[0m" : "";
  const char *red = color ? "\033[1;31m" : "", *mag = color ? "\033[1;35m" : "";
  const char *cyan = color ? "\033[1;36m" : "", *green = color ? "\033[1;32m" : "";
  for (int i = 0; i < d->n; i++) {
    weft_diag *g = &d->items[i];
    const char *sc = g->sev == DIAG_ERROR ? red : g->sev == DIAG_WARNING ? mag : cyan;
    const weft_src *s = g->loc.line > 0 && g->loc.file >= 0 && g->loc.file < d->srcs->n
                            ? &d->srcs->items[g->loc.file] : NULL;
    if (s)
      fprintf(out, "%s%s:%d:%d:%s %s%s:%s %s%s%s\n", bold, s->path, g->loc.line, g->loc.col,
              reset, sc, sev_name(g->sev), reset, bold, g->msg, reset);
    else
      fprintf(out, "%sweft:%s %s%s:%s %s\n", bold, reset, sc, sev_name(g->sev), reset, g->msg);
    if (s) {
      int len;
      const char *line = src_line(s, g->loc.line, &len);
      if (len > 4000) len = 4000;  /* a million-byte line is not printed whole */
      int *cols = malloc(sizeof(int) * ((size_t)len + 1));
      if (!cols) weft_oom();
      fputs("  ", out);
      print_line(out, line, len, cols);
      fputc('\n', out);
      int c0 = g->loc.col - 1;
      if (c0 < 0) c0 = 0;
      if (c0 > len) c0 = len;
      int c1 = g->loc.end_line == g->loc.line ? g->loc.end_col : len;
      if (c1 > len) c1 = len;
      if (c1 <= c0) c1 = c0 + 1;
      int from = cols[c0], to = c1 <= len ? cols[c1 - 1 < len ? c1 : len] : cols[len] + 1;
      if (c1 - 1 < len && c1 <= len) to = cols[c1 - 1] + 1;
      if (to <= from) to = from + 1;
      free(cols);
      fprintf(out, "  %*s%s^", from, "", green);
      for (int k = from + 1; k < to; k++) fputc('~', out);
      fprintf(out, "%s\n", reset);
    }
    if (g->hint) fprintf(out, "  %shint:%s %s\n", cyan, reset, g->hint);
  }
  int limit = d->max_errors > 0 ? d->max_errors : 50;
  if (d->errors > limit)
    fprintf(out, "weft: note: %d more errors not shown\n", d->errors - limit);
}

static void json_str(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", out);
    else if (*p < 0x20) fprintf(out, "\\u%04x", *p);
    else fputc(*p, out);
  }
  fputc('"', out);
}

void diag_print_json(weft_diags *d, FILE *out) {
  if (d->n > 1) qsort(d->items, (size_t)d->n, sizeof(weft_diag), diag_cmp);
  fputc('[', out);
  for (int i = 0; i < d->n; i++) {
    weft_diag *g = &d->items[i];
    if (i) fputc(',', out);
    fprintf(out, "{\"severity\":\"%s\",", sev_name(g->sev));
    if (g->loc.line > 0 && g->loc.file >= 0 && g->loc.file < d->srcs->n) {
      fputs("\"file\":", out);
      json_str(out, d->srcs->items[g->loc.file].path);
      fprintf(out, ",\"line\":%d,\"col\":%d,\"end_line\":%d,\"end_col\":%d,", g->loc.line,
              g->loc.col, g->loc.end_line, g->loc.end_col);
    }
    fputs("\"message\":", out);
    json_str(out, g->msg);
    if (g->hint) { fputs(",\"hint\":", out); json_str(out, g->hint); }
    fputc('}', out);
  }
  fputs("]", out);
}

/* Damerau-free Levenshtein distance, capped: names are short. */
static int edit_distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 64 || lb > 64) return 1000;
  int prev[65], cur[65];
  for (int j = 0; j <= lb; j++) prev[j] = j;
  for (int i = 1; i <= la; i++) {
    cur[0] = i;
    for (int j = 1; j <= lb; j++) {
      int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
      int del = prev[j] + 1, ins = cur[j - 1] + 1;
      cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
    memcpy(prev, cur, sizeof(int) * (size_t)(lb + 1));
  }
  return prev[lb];
}

const char *diag_closest(const char *s, const char *const *names, int n) {
  const char *best = NULL;
  int bestd = 1000;
  int len = (int)strlen(s);
  int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3;
  for (int i = 0; i < n; i++) {
    if (!names[i] || strcmp(names[i], s) == 0) continue;
    int dd = edit_distance(s, names[i]);
    if (dd < bestd) { bestd = dd; best = names[i]; }
  }
  return bestd <= limit ? best : NULL;
}
