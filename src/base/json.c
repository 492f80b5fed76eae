/* json.c - the streaming JSON writer of json.h.
 * Strings are escaped per RFC 8259; numbers never print as NaN or Inf. */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

void json_init(json *j, FILE *out) {
  j->out = out;
  j->depth = 0;
  j->first[0] = true;
  j->after_key = false;
}

static void sep(json *j) {
  if (j->after_key) { j->after_key = false; return; }
  if (!j->first[j->depth]) fputc(',', j->out);
  j->first[j->depth] = false;
}

static void open(json *j, char ch) {
  sep(j);
  fputc(ch, j->out);
  if (j->depth < 63) j->depth++;
  j->first[j->depth] = true;
}

static void close_(json *j, char ch) {
  fputc(ch, j->out);
  if (j->depth > 0) j->depth--;
  if (j->depth == 0) fputc('\n', j->out);
}

void json_obj(json *j) { open(j, '{'); }
void json_end_obj(json *j) { close_(j, '}'); }
void json_arr(json *j) { open(j, '['); }
void json_end_arr(json *j) { close_(j, ']'); }

static void put_str(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", out); break;
    case '\\': fputs("\\\\", out); break;
    case '\n': fputs("\\n", out); break;
    case '\t': fputs("\\t", out); break;
    case '\r': fputs("\\r", out); break;
    default:
      if (*p < 0x20) fprintf(out, "\\u%04x", *p);
      else fputc(*p, out);
    }
  }
  fputc('"', out);
}

void json_key(json *j, const char *k) {
  sep(j);
  put_str(j->out, k);
  fputc(':', j->out);
  j->after_key = true;
}

void json_str(json *j, const char *s) { sep(j); if (s) put_str(j->out, s); else fputs("null", j->out); }
void json_int(json *j, int64_t v) { sep(j); fprintf(j->out, "%" PRId64, v); }
void json_num(json *j, double v) {
  sep(j);
  if (!isfinite(v)) fputs("null", j->out);
  else if (v == (double)(int64_t)v && fabs(v) < 9e15) fprintf(j->out, "%" PRId64, (int64_t)v);
  else {
    /* the shortest form that reads back as the same double */
    char buf[32];
    for (int prec = 15; prec <= 17; prec++) {
      snprintf(buf, sizeof buf, "%.*g", prec, v);
      if (strtod(buf, NULL) == v) break;
    }
    fputs(buf, j->out);
  }
}
void json_bool(json *j, bool v) { sep(j); fputs(v ? "true" : "false", j->out); }
void json_null(json *j) { sep(j); fputs("null", j->out); }
void json_raw(json *j, const char *text) { sep(j); fputs(text, j->out); }
