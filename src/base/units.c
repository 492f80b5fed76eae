/* units.c - unit words, dimension arithmetic and readable printing of
 * quantities (bytes, seconds, FLOPs and their products); see units.h. */
#include "weft/units.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- unit words ---------------------------------------------------------- */

typedef struct unit_word {
  const char *word;
  double scale;      /* one unit in base units */
  unit_dim dim;
} unit_word;

/* Brace forms for static tables (compound literals are not constants). */
#define DIM_B {1, 0, 0}
#define DIM_S {0, 1, 0}
#define DIM_F {0, 0, 1}

static const unit_word unit_words[] = {
  {"B", 1.0, DIM_B},
  {"KB", 1e3, DIM_B},
  {"MB", 1e6, DIM_B},
  {"GB", 1e9, DIM_B},
  {"TB", 1e12, DIM_B},
  {"PB", 1e15, DIM_B},
  {"KiB", 1024.0, DIM_B},
  {"MiB", 1048576.0, DIM_B},
  {"GiB", 1073741824.0, DIM_B},
  {"TiB", 1099511627776.0, DIM_B},
  {"PiB", 1125899906842624.0, DIM_B},
  {"bit", 0.125, DIM_B},
  {"Kb", 125.0, DIM_B},
  {"Mb", 125e3, DIM_B},
  {"Gb", 125e6, DIM_B},
  {"Tb", 125e9, DIM_B},
  {"s", 1.0, DIM_S},
  {"ms", 1e-3, DIM_S},
  {"us", 1e-6, DIM_S},
  {"ns", 1e-9, DIM_S},
  {"FLOP", 1.0, DIM_F},
  {"KFLOP", 1e3, DIM_F},
  {"MFLOP", 1e6, DIM_F},
  {"GFLOP", 1e9, DIM_F},
  {"TFLOP", 1e12, DIM_F},
  {"PFLOP", 1e15, DIM_F},
};

bool unit_lookup(const char *word, double *scale, unit_dim *dim) {
  if (!word) return false;
  size_t len = strlen(word);
  bool rate = false;
  if (len > 2 && word[len - 2] == '/' && word[len - 1] == 's') {
    rate = true;
    len -= 2;
  }
  for (size_t i = 0; i < sizeof unit_words / sizeof unit_words[0]; i++) {
    const unit_word *u = &unit_words[i];
    if (strlen(u->word) != len || memcmp(u->word, word, len) != 0) continue;
    unit_dim d = u->dim;
    if (rate) d.sec--;
    *scale = u->scale;
    *dim = d;
    return true;
  }
  return false;
}

/* ---- dimension arithmetic ------------------------------------------------ */

unit_dim unit_mul(unit_dim a, unit_dim b) {
  return (unit_dim){(signed char)(a.byte + b.byte), (signed char)(a.sec + b.sec),
                    (signed char)(a.flop + b.flop)};
}

unit_dim unit_div(unit_dim a, unit_dim b) {
  return (unit_dim){(signed char)(a.byte - b.byte), (signed char)(a.sec - b.sec),
                    (signed char)(a.flop - b.flop)};
}

static bool exp_ok(long long e) { return e >= -UNIT_MAX_EXP && e <= UNIT_MAX_EXP; }

/* Builds a dimension from wide exponents, or fails when one is out of range. */
static bool make_dim(long long byte, long long sec, long long flop, unit_dim *out) {
  if (!exp_ok(byte) || !exp_ok(sec) || !exp_ok(flop)) return false;
  *out = (unit_dim){(signed char)byte, (signed char)sec, (signed char)flop};
  return true;
}

bool unit_mul_checked(unit_dim a, unit_dim b, unit_dim *out) {
  return make_dim((long long)a.byte + b.byte, (long long)a.sec + b.sec,
                  (long long)a.flop + b.flop, out);
}

bool unit_div_checked(unit_dim a, unit_dim b, unit_dim *out) {
  return make_dim((long long)a.byte - b.byte, (long long)a.sec - b.sec,
                  (long long)a.flop - b.flop, out);
}

bool unit_pow_checked(unit_dim d, int num, int den, unit_dim *out) {
  if (den <= 0) return false;
  long long e[3] = {(long long)d.byte * num, (long long)d.sec * num,
                    (long long)d.flop * num};
  for (int i = 0; i < 3; i++) {
    if (e[i] % den != 0) return false;
    e[i] /= den;
  }
  return make_dim(e[0], e[1], e[2], out);
}

bool unit_eq(unit_dim a, unit_dim b) {
  return a.byte == b.byte && a.sec == b.sec && a.flop == b.flop;
}

bool unit_is_none(unit_dim d) { return d.byte == 0 && d.sec == 0 && d.flop == 0; }

bool unit_in_range(unit_dim d) {
  return exp_ok(d.byte) && exp_ok(d.sec) && exp_ok(d.flop);
}

/* ---- names ----------------------------------------------------------------- */

/* Appends to buf at *pos, never past n bytes (the text is cut, not overrun). */
static void put(char *buf, size_t n, size_t *pos, const char *s) {
  size_t len = strlen(s);
  if (*pos < n) {
    size_t room = n - *pos - 1;
    memcpy(buf + *pos, s, len < room ? len : room);
    buf[*pos + (len < room ? len : room)] = '\0';
  }
  *pos += len;
}

/* One factor of the base form: "B", "s^2". */
static void put_factor(char *buf, size_t n, size_t *pos, const char *sym, int e) {
  char tmp[16];
  if (e == 1) snprintf(tmp, sizeof tmp, "%s", sym);
  else snprintf(tmp, sizeof tmp, "%s^%d", sym, e);
  put(buf, n, pos, tmp);
}

/* The dimension in base symbols B, FLOP, s: "B^2/s", "1/s", "B/(FLOP*s)".
 * Returns the length the full text needs. */
static size_t base_form(unit_dim d, char *buf, size_t n) {
  const char *syms[3] = {"B", "FLOP", "s"};
  int exps[3] = {d.byte, d.flop, d.sec};
  size_t pos = 0;
  if (n > 0) buf[0] = '\0';
  int npos = 0, nneg = 0;
  for (int i = 0; i < 3; i++) {
    if (exps[i] > 0) npos++;
    if (exps[i] < 0) nneg++;
  }
  if (npos == 0 && nneg == 0) {
    put(buf, n, &pos, "1");
    return pos;
  }
  if (npos == 0) put(buf, n, &pos, "1");
  int k = 0;
  for (int i = 0; i < 3; i++) {
    if (exps[i] <= 0) continue;
    if (k++) put(buf, n, &pos, "*");
    put_factor(buf, n, &pos, syms[i], exps[i]);
  }
  if (nneg == 0) return pos;
  put(buf, n, &pos, nneg > 1 ? "/(" : "/");
  k = 0;
  for (int i = 0; i < 3; i++) {
    if (exps[i] >= 0) continue;
    if (k++) put(buf, n, &pos, "*");
    put_factor(buf, n, &pos, syms[i], -exps[i]);
  }
  if (nneg > 1) put(buf, n, &pos, ")");
  return pos;
}

const char *unit_dim_name(unit_dim d, char *buf, size_t n) {
  static const struct { unit_dim dim; const char *name; } named[] = {
    {{0, 0, 0}, "number"},
    {DIM_B, "bytes"},
    {DIM_S, "seconds"},
    {DIM_F, "FLOPs"},
    {{1, -1, 0}, "bytes/s"},
    {{0, -1, 1}, "FLOP/s"},
    {{0, -1, 0}, "1/s"},
  };
  if (!buf || n == 0) return "";
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
    if (unit_eq(d, named[i].dim)) {
      size_t pos = 0;
      buf[0] = '\0';
      put(buf, n, &pos, named[i].name);
      return buf;
    }
  }
  base_form(d, buf, n);
  return buf;
}

/* ---- printing ----------------------------------------------------------- */

int unit_format_number(double v, char *buf, size_t n) {
  if (isnan(v)) return snprintf(buf, n, "nan");
  if (isinf(v)) return snprintf(buf, n, v < 0 ? "-inf" : "inf");
  if (v == 0) return snprintf(buf, n, "0");   /* also -0 */
  if (v == floor(v) && fabs(v) < 9007199254740992.0) /* 2^53 */
    return snprintf(buf, n, "%.0f", v);
  char tmp[48];
  snprintf(tmp, sizeof tmp, "%.4g", v);
  char *e = strchr(tmp, 'e');
  if (!e) return snprintf(buf, n, "%s", tmp);
  /* "1.235e+07" -> "1.235e7", "1e-05" -> "1e-5": the form the lexer reads. */
  const char *p = e + 1;
  bool neg = false;
  if (*p == '+' || *p == '-') neg = (*p++ == '-');
  while (*p == '0' && p[1]) p++;
  *e = '\0';
  return snprintf(buf, n, "%se%s%s", tmp, neg ? "-" : "", p);
}

/* x as the %.4g text reads back: what a printed mantissa will show. */
static double round4(double x) {
  char tmp[48];
  snprintf(tmp, sizeof tmp, "%.4g", x);
  return strtod(tmp, NULL);
}

typedef struct ladder {
  const char *const *syms;   /* ascending, each step a factor 1000 */
  const double *scales;
  int count;
  int home;                  /* the base unit (scale 1), used for zero */
} ladder;

static const char *const bytes_syms[] = {"B", "KB", "MB", "GB", "TB", "PB"};
static const char *const bytes_rate_syms[] = {"B/s", "KB/s", "MB/s", "GB/s",
                                              "TB/s", "PB/s"};
static const char *const flop_syms[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP",
                                        "TFLOP", "PFLOP"};
static const char *const flop_rate_syms[] = {"FLOP/s", "KFLOP/s", "MFLOP/s",
                                             "GFLOP/s", "TFLOP/s", "PFLOP/s"};
static const double decimal_scales[] = {1.0, 1e3, 1e6, 1e9, 1e12, 1e15};
static const char *const time_syms[] = {"ns", "us", "ms", "s"};
static const double time_scales[] = {1e-9, 1e-6, 1e-3, 1.0};
static const char *const binary_syms[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};

/* The step of l whose mantissa shows in [1, 1000): the largest one where the
 * rounded mantissa is at least 1; the smallest step for tiny values. */
static int ladder_pick(const ladder *l, double v) {
  double a = fabs(v);
  if (a == 0 || !isfinite(a)) return l->home;
  int pick = 0;
  for (int j = 0; j < l->count; j++)
    if (round4(a / l->scales[j]) >= 1.0) pick = j;
  return pick;
}

static int format_on(const ladder *l, int j, double v, char *buf, size_t n) {
  char num[48];
  unit_format_number(v / l->scales[j], num, sizeof num);
  return snprintf(buf, n, "%s %s", num, l->syms[j]);
}

/* Bytes: a binary prefix when v is a whole number of KiB (or larger) and that
 * reads well, else decimal. "1 TB" is a whole number of KiB too, but
 * 976562500 KiB reads worse than an exact "1 TB". */
static int format_bytes(double v, char *buf, size_t n) {
  ladder dec = {bytes_syms, decimal_scales, 6, 0};
  if (v != 0 && isfinite(v)) {
    int k = 0;
    double unit = 0;
    for (int i = 5; i >= 1; i--) {
      double p = ldexp(1.0, 10 * i);
      if (fmod(v, p) == 0) { k = i; unit = p; break; }
    }
    if (k > 0) {
      double q = v / unit;
      bool binary = fabs(q) < 1024;
      if (!binary) {
        int j = ladder_pick(&dec, v);
        double m = round4(v / dec.scales[j]) * dec.scales[j];
        binary = fabs(m - v) > 1e-12 * fabs(v);   /* decimal would round */
      }
      if (binary) {
        char num[48];
        unit_format_number(q, num, sizeof num);
        return snprintf(buf, n, "%s %s", num, binary_syms[k - 1]);
      }
    }
  }
  return format_on(&dec, ladder_pick(&dec, v), v, buf, n);
}

int unit_format(double v, unit_dim d, char *buf, size_t n) {
  if (unit_is_none(d)) return unit_format_number(v, buf, n);
  if (unit_eq(d, UNIT_BYTES)) return format_bytes(v, buf, n);
  const ladder *l = NULL;
  static const ladder rate = {bytes_rate_syms, decimal_scales, 6, 0};
  static const ladder flops = {flop_syms, decimal_scales, 6, 0};
  static const ladder flop_rate = {flop_rate_syms, decimal_scales, 6, 0};
  static const ladder time = {time_syms, time_scales, 4, 3};
  if (unit_eq(d, UNIT_BYTES_PER_S)) l = &rate;
  else if (unit_eq(d, UNIT_FLOPS)) l = &flops;
  else if (unit_eq(d, UNIT_FLOPS_PER_S)) l = &flop_rate;
  else if (unit_eq(d, UNIT_SECONDS)) l = &time;
  if (l) return format_on(l, ladder_pick(l, v), v, buf, n);
  /* No unit word: the number in base units, then the base form. */
  char num[48], form[96];
  unit_format_number(v, num, sizeof num);
  base_form(d, form, sizeof form);
  if (form[0] == '1' && form[1] == '/') return snprintf(buf, n, "%s%s", num, form + 1);
  return snprintf(buf, n, "%s %s", num, form);
}

const char *unit_bytes_human(int64_t b, char *buf, size_t n) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int i = 0;
  while (v >= 1024 && i < 4) { v /= 1024; i++; }
  if (i) snprintf(buf, n, "%.1f %s", v, u[i]);
  else snprintf(buf, n, "%lld B", (long long)b);
  return buf;
}
