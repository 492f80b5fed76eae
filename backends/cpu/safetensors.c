/* safetensors.c - safetensors files for the CPU backend: st_open maps and
 * checks a file, st_write writes one atomically; see safetensors.h.
 *
 * The header's JSON is read by the small strict parser below, not by cJSON:
 * Debian's libcjson-dev ships only the shared library (no libcjson.a), and
 * ./weft is linked to run where the build's libraries are not; cJSON would
 * also keep duplicate keys silently, which a header must not have. The
 * parser takes RFC 8259 JSON and nothing more: strings must be UTF-8 and may
 * use every escape, \uXXXX with surrogate pairs included (a lone surrogate,
 * and \u0000, which no C string can hold, are rejected); a duplicate key in
 * any object is an error; nesting stops at ST_MAX_DEPTH. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/files.h"
#include "weft/arena.h"

enum {
  ST_MAX_DEPTH = 32,     /* a header needs 3; unknown fields get some room */
  ST_SHOWN = 120,        /* bytes of a name or key quoted in a message */
  ST_CHUNK = 1 << 20,    /* bytes per write(2) of tensor data */
};

/* The reference implementation's limit on the header; a header this large
 * would describe millions of tensors. */
#define ST_MAX_HEADER UINT64_C(100000000)

/* A name or key in a message, cut to ST_SHOWN bytes: "%.*s". */
#define ST_Q(s) (int)strnlen((s), ST_SHOWN), (s)

/* ---- dtypes -------------------------------------------------------------- */

static const struct {
  const char *name;      /* as in headers */
  int size;              /* bytes per element */
} st_dtypes[ST_DTYPE_COUNT] = {
  [ST_F32] = {"F32", 4},  [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
  [ST_F64] = {"F64", 8},  [ST_I32] = {"I32", 4}, [ST_I64] = {"I64", 8},
  [ST_U8] = {"U8", 1},    [ST_I8] = {"I8", 1},   [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(st_dtype dt) {
  return (unsigned)dt < ST_DTYPE_COUNT ? st_dtypes[dt].name : "?";
}

int st_dtype_size(st_dtype dt) {
  return (unsigned)dt < ST_DTYPE_COUNT ? st_dtypes[dt].size : 0;
}

/* ---- helpers ------------------------------------------------------------- */

/* err = "PATH: " followed by the formatted reason (cut to errlen). */
static void st_fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void st_fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  int n = snprintf(err, errlen, "%s: ", path);
  if (n < 0 || (size_t)n >= errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
  va_end(ap);
}

static void *st_alloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) weft_oom();
  return p;
}

static void *st_grow(void *p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return p;
  size_t ncap = *cap ? *cap : 8;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2 / elem) weft_oom();
    ncap *= 2;
  }
  p = realloc(p, ncap * elem);
  if (!p) weft_oom();
  *cap = ncap;
  return p;
}

static char *st_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = st_alloc(n);
  memcpy(d, s, n);
  return d;
}

static bool st_host_le(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

static uint16_t st_le16(const unsigned char *p) {
  return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static uint32_t st_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t st_le64(const unsigned char *p) {
  return (uint64_t)st_le32(p) | (uint64_t)st_le32(p + 4) << 32;
}

/* Two's complement reinterpretations, without implementation-defined casts. */
static int32_t st_s32(uint32_t u) {
  return u <= INT32_MAX ? (int32_t)u : -(int32_t)(~u) - 1;
}

static int64_t st_s64(uint64_t u) {
  return u <= INT64_MAX ? (int64_t)u : -(int64_t)(~u) - 1;
}

/* Length of the well-formed UTF-8 sequence at p (before end), 0 if there is
 * none: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t st_utf8_len(const unsigned char *p, const unsigned char *end) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;        /* range of the second byte */
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else return 0;
  if ((size_t)(end - p) < n) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  return n;
}

static bool st_utf8_valid(const char *s) {
  const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
  while (p < end) {
    size_t n = st_utf8_len(p, end);
    if (!n) return false;
    p += n;
  }
  return true;
}

/* ---- JSON ---------------------------------------------------------------- */

typedef enum { JV_NULL, JV_BOOL, JV_NUM, JV_STR, JV_ARR, JV_OBJ } jv_kind;

typedef struct jv jv;

/* A member of an object. */
typedef struct jv_member {
  const char *key;       /* decoded, NUL-terminated, no NUL inside */
  size_t keylen;
  size_t at;             /* offset of the key in the header, for messages */
  jv *val;
} jv_member;

/* A JSON value; numbers keep only what a header needs of them. */
struct jv {
  jv_kind kind;
  size_t at;             /* offset in the header where the value starts */
  union {
    bool b;              /* JV_BOOL */
    struct {
      bool is_int;       /* no fraction and no exponent */
      bool neg;          /* below zero (-0 is not) */
      bool big;          /* magnitude above UINT64_MAX */
      uint64_t mag;      /* magnitude, when is_int and not big */
    } num;
    struct { const char *s; size_t len; } str;
    struct { jv **v; size_t n; } arr;
    struct { jv_member *m; size_t n; } obj;
  } u;
};

/* The state of one parse. Items of the arrays and members of the objects
 * being read wait on two stacks shared by all levels, and are copied into
 * the node arena when their array or object closes. */
typedef struct jp {
  const unsigned char *base, *p, *end;  /* header text and cursor */
  arena *strs;           /* decoded strings: kept as names and metadata */
  arena *nodes;          /* values: dropped once the header is read */
  int depth;             /* objects and arrays open */
  jv **vs;               /* item stack */
  size_t vtop, vcap;
  jv_member *ms;         /* member stack */
  size_t mtop, mcap;
  bool failed;
  bool plain;            /* a JSON document, not a header: its top-level
                          * keys are keys, not tensor names */
  size_t fail_at;        /* offset of the first error */
  char msg[200];         /* the first error */
} jp;

static jv *jp_fail(jp *j, const unsigned char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static jv *jp_fail(jp *j, const unsigned char *at, const char *fmt, ...) {
  if (j->failed) return NULL;
  j->failed = true;
  j->fail_at = (size_t)(at - j->base);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->msg, sizeof j->msg, fmt, ap);
  va_end(ap);
  return NULL;
}

static void jp_ws(jp *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
}

static jv *jp_node(jp *j, jv_kind kind) {
  jv *v = arena_alloc(j->nodes, sizeof *v);
  v->kind = kind;
  v->at = (size_t)(j->p - j->base);
  return v;
}

static bool jp_hex4(const unsigned char *p, const unsigned char *end, uint32_t *out) {
  if (end - p < 4) return false;
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = p[i];
    int d = c >= '0' && c <= '9' ? c - '0'
          : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | (uint32_t)d;
  }
  *out = v;
  return true;
}

static size_t jp_utf8_put(char *out, uint32_t cp) {
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | cp >> 12);
    out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | cp >> 18);
  out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
  out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* string -> '"' (char | escape)* '"'. The decoded text is never longer than
 * the quoted one, so it is decoded in place into one allocation. */
static bool jp_string(jp *j, const char **out, size_t *outlen) {
  const unsigned char *open = j->p, *q = open + 1;
  while (q < j->end && *q != '"') q += (*q == '\\' && q + 1 < j->end) ? 2 : 1;
  if (q >= j->end) return jp_fail(j, open, "unterminated string");
  char *buf = arena_alloc(j->strs, (size_t)(q - open));
  size_t n = 0;
  const unsigned char *p = open + 1;
  while (p < q) {
    unsigned char c = *p;
    if (c == '\\') {
      unsigned char e = p[1];     /* before q: the scan above skipped it */
      const char *simple = strchr("\"\\/bfnrt", e);
      if (e && simple) {
        buf[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
        p += 2;
        continue;
      }
      if (e != 'u') return jp_fail(j, p, "invalid escape '\\%c' in a string", e >= 0x20 && e < 0x7F ? e : '?');
      uint32_t cp, lo;
      if (!jp_hex4(p + 2, q, &cp)) return jp_fail(j, p, "\\u must be followed by 4 hex digits");
      const unsigned char *esc = p;
      p += 6;
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (q - p >= 6 && p[0] == '\\' && p[1] == 'u' && jp_hex4(p + 2, q, &lo) &&
            lo >= 0xDC00 && lo <= 0xDFFF) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          p += 6;
        } else return jp_fail(j, esc, "unpaired surrogate \\u%04X in a string", (unsigned)cp);
      } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return jp_fail(j, esc, "unpaired surrogate \\u%04X in a string", (unsigned)cp);
      }
      if (cp == 0) return jp_fail(j, esc, "\\u0000 in a string");
      n += jp_utf8_put(buf + n, cp);
    } else if (c < 0x20) {
      return jp_fail(j, p, "control character 0x%02X in a string (it must be escaped)", c);
    } else {
      size_t k = st_utf8_len(p, q);
      if (!k) return jp_fail(j, p, "invalid UTF-8 in a string");
      memcpy(buf + n, p, k);
      n += k;
      p += k;
    }
  }
  buf[n] = '\0';
  *out = buf;
  *outlen = n;
  j->p = q + 1;
  return true;
}

/* number -> '-'? ('0' | [1-9][0-9]*) ('.' [0-9]+)? ([eE] [+-]? [0-9]+)? */
static jv *jp_number(jp *j) {
  jv *v = jp_node(j, JV_NUM);
  const unsigned char *start = j->p;
  bool minus = false;
  if (*j->p == '-') { minus = true; j->p++; }
  if (j->p == j->end || *j->p < '0' || *j->p > '9') return jp_fail(j, start, "invalid number");
  if (*j->p == '0' && j->p + 1 < j->end && j->p[1] >= '0' && j->p[1] <= '9')
    return jp_fail(j, start, "number with a leading zero");
  uint64_t mag = 0;
  bool big = false;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    unsigned d = (unsigned)(*j->p++ - '0');
    if (mag > (UINT64_MAX - d) / 10) big = true;
    else mag = mag * 10 + d;
  }
  bool is_int = true;
  if (j->p < j->end && *j->p == '.') {
    is_int = false;
    j->p++;
    if (j->p == j->end || *j->p < '0' || *j->p > '9') return jp_fail(j, start, "invalid number");
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  }
  if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
    is_int = false;
    j->p++;
    if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
    if (j->p == j->end || *j->p < '0' || *j->p > '9') return jp_fail(j, start, "invalid number");
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
  }
  v->u.num.is_int = is_int;
  v->u.num.big = big;
  v->u.num.mag = mag;
  v->u.num.neg = minus && (big || mag != 0);
  return v;
}

static jv *jp_value(jp *j);

/* Rejects a repeated key among the n members of an object just read. */
static int jp_member_cmp(const void *a, const void *b) {
  const jv_member *x = a, *y = b;
  size_t n = x->keylen < y->keylen ? x->keylen : y->keylen;
  int c = memcmp(x->key, y->key, n);
  if (c) return c;
  if (x->keylen != y->keylen) return x->keylen < y->keylen ? -1 : 1;
  return x->at < y->at ? -1 : x->at > y->at;
}

static bool jp_unique_keys(jp *j, const jv_member *m, size_t n, bool top) {
  const jv_member *dup = NULL;
  if (n <= 8) {
    for (size_t a = 1; a < n && !dup; a++)
      for (size_t b = 0; b < a && !dup; b++)
        if (m[a].keylen == m[b].keylen && memcmp(m[a].key, m[b].key, m[a].keylen) == 0)
          dup = &m[a];
  } else {
    jv_member *s = st_alloc(n * sizeof *s);
    memcpy(s, m, n * sizeof *s);
    qsort(s, n, sizeof *s, jp_member_cmp);
    size_t at = 0;
    for (size_t i = 1; i < n; i++)
      if (s[i].keylen == s[i - 1].keylen && memcmp(s[i].key, s[i - 1].key, s[i].keylen) == 0 &&
          (!dup || s[i].at < at)) {
        dup = &s[i];
        at = s[i].at;
      }
    if (dup) {
      for (size_t i = 0; i < n; i++)
        if (m[i].at == at) dup = &m[i];
    }
    free(s);
  }
  if (!dup) return true;
  if (top && !j->plain && strcmp(dup->key, "__metadata__") != 0)
    jp_fail(j, j->base + dup->at, "duplicate tensor name '%.*s'", ST_Q(dup->key));
  else
    jp_fail(j, j->base + dup->at, "duplicate key \"%.*s\"", ST_Q(dup->key));
  return false;
}

/* object -> '{' (string ':' value (',' string ':' value)*)? '}' */
static jv *jp_object(jp *j) {
  jv *v = jp_node(j, JV_OBJ);
  if (++j->depth > ST_MAX_DEPTH) return jp_fail(j, j->p, "nesting deeper than %d", ST_MAX_DEPTH);
  j->p++;
  size_t mark = j->mtop;
  jp_ws(j);
  if (j->p < j->end && *j->p == '}') {
    j->p++;
  } else {
    for (;;) {
      jp_ws(j);
      if (j->p == j->end || *j->p != '"') return jp_fail(j, j->p, "expected a string key");
      jv_member m = { .at = (size_t)(j->p - j->base) };
      if (!jp_string(j, &m.key, &m.keylen)) return NULL;
      jp_ws(j);
      if (j->p == j->end || *j->p != ':') return jp_fail(j, j->p, "expected ':' after a key");
      j->p++;
      if (!(m.val = jp_value(j))) return NULL;
      j->ms = st_grow(j->ms, &j->mcap, j->mtop + 1, sizeof *j->ms);
      j->ms[j->mtop++] = m;
      jp_ws(j);
      if (j->p < j->end && *j->p == ',') { j->p++; continue; }
      if (j->p < j->end && *j->p == '}') { j->p++; break; }
      return jp_fail(j, j->p, "expected ',' or '}' in an object");
    }
  }
  size_t n = j->mtop - mark;
  v->u.obj.n = n;
  v->u.obj.m = arena_alloc(j->nodes, n * sizeof *v->u.obj.m);
  if (n) memcpy(v->u.obj.m, j->ms + mark, n * sizeof *v->u.obj.m);
  j->mtop = mark;
  j->depth--;
  if (!jp_unique_keys(j, v->u.obj.m, n, j->depth == 0)) return NULL;
  return v;
}

/* array -> '[' (value (',' value)*)? ']' */
static jv *jp_array(jp *j) {
  jv *v = jp_node(j, JV_ARR);
  if (++j->depth > ST_MAX_DEPTH) return jp_fail(j, j->p, "nesting deeper than %d", ST_MAX_DEPTH);
  j->p++;
  size_t mark = j->vtop;
  jp_ws(j);
  if (j->p < j->end && *j->p == ']') {
    j->p++;
  } else {
    for (;;) {
      jv *item = jp_value(j);
      if (!item) return NULL;
      j->vs = st_grow(j->vs, &j->vcap, j->vtop + 1, sizeof *j->vs);
      j->vs[j->vtop++] = item;
      jp_ws(j);
      if (j->p < j->end && *j->p == ',') { j->p++; continue; }
      if (j->p < j->end && *j->p == ']') { j->p++; break; }
      return jp_fail(j, j->p, "expected ',' or ']' in an array");
    }
  }
  size_t n = j->vtop - mark;
  v->u.arr.n = n;
  v->u.arr.v = arena_alloc(j->nodes, n * sizeof *v->u.arr.v);
  if (n) memcpy(v->u.arr.v, j->vs + mark, n * sizeof *v->u.arr.v);
  j->vtop = mark;
  j->depth--;
  return v;
}

static jv *jp_literal(jp *j, const char *word, jv_kind kind, bool b) {
  size_t n = strlen(word);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
    return jp_fail(j, j->p, "invalid literal (expected %s)", word);
  jv *v = jp_node(j, kind);
  v->u.b = b;
  j->p += n;
  return v;
}

/* value -> object | array | string | number | true | false | null */
static jv *jp_value(jp *j) {
  jp_ws(j);
  if (j->p == j->end) return jp_fail(j, j->p, "unexpected end of the header");
  unsigned char c = *j->p;
  switch (c) {
  case '{': return jp_object(j);
  case '[': return jp_array(j);
  case '"': {
    jv *v = jp_node(j, JV_STR);
    return jp_string(j, &v->u.str.s, &v->u.str.len) ? v : NULL;
  }
  case 't': return jp_literal(j, "true", JV_BOOL, true);
  case 'f': return jp_literal(j, "false", JV_BOOL, false);
  case 'n': return jp_literal(j, "null", JV_NULL, false);
  default:
    if (c == '-' || (c >= '0' && c <= '9')) return jp_number(j);
    if (c >= 0x20 && c < 0x7F) return jp_fail(j, j->p, "unexpected character '%c'", c);
    return jp_fail(j, j->p, "unexpected byte 0x%02X", c);
  }
}

/* header -> ws object ws. */
static jv *jp_header(jp *j) {
  jp_ws(j);
  if (j->p == j->end || *j->p != '{') return jp_fail(j, j->p, "the header is not a JSON object");
  jv *root = jp_object(j);
  if (!root) return NULL;
  jp_ws(j);
  if (j->p != j->end) return jp_fail(j, j->p, "text after the header object");
  return root;
}

/* ---- reading ------------------------------------------------------------- */

/* A metadata entry. */
typedef struct st_kv {
  const char *key, *value;
} st_kv;

struct st_file {
  char *path;                  /* for the messages of the read functions */
  unsigned char *bytes;        /* the whole file */
  size_t size;
  bool mapped;                 /* bytes come from mmap, else from malloc */
  const unsigned char *data;   /* the data area, after the header */
  uint64_t data_len;
  st_tensor *tensors;          /* in header order */
  int ntensors;
  const st_tensor **by_name;   /* sorted by name (strcmp: byte order) */
  st_kv *meta;                 /* sorted by key */
  int nmeta;
  arena mem;                   /* names, metadata and the arrays above */
};

static int st_tensor_name_cmp(const void *a, const void *b) {
  return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

static int st_tensor_begin_cmp(const void *a, const void *b) {
  const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

static int st_kv_cmp(const void *a, const void *b) {
  return strcmp(((const st_kv *)a)->key, ((const st_kv *)b)->key);
}

static const jv *st_field(const jv *obj, const char *key) {
  for (size_t i = 0; i < obj->u.obj.n; i++)
    if (strcmp(obj->u.obj.m[i].key, key) == 0) return obj->u.obj.m[i].val;
  return NULL;
}

/* A non-negative integer of the header, below 2^63; false if it is not. */
static bool st_uint(const jv *v, uint64_t *out) {
  if (v->kind != JV_NUM || !v->u.num.is_int || v->u.num.neg || v->u.num.big ||
      v->u.num.mag > INT64_MAX)
    return false;
  *out = v->u.num.mag;
  return true;
}

/* Fills t from the header entry e, checked against the data area. */
static bool st_read_entry(st_file *f, st_tensor *t, const jv *e, char *err, size_t errlen) {
  const char *name = t->name, *path = f->path;
  if (e->kind != JV_OBJ) {
    st_fail(err, errlen, path, "tensor '%.*s': its entry is not an object", ST_Q(name));
    return false;
  }
  const jv *dt = st_field(e, "dtype"), *shape = st_field(e, "shape"),
           *offs = st_field(e, "data_offsets");
  const char *missing = !dt ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
  if (missing) {
    st_fail(err, errlen, path, "tensor '%.*s': no \"%s\"", ST_Q(name), missing);
    return false;
  }
  if (dt->kind != JV_STR) {
    st_fail(err, errlen, path, "tensor '%.*s': dtype is not a string", ST_Q(name));
    return false;
  }
  int d = 0;
  while (d < ST_DTYPE_COUNT && strcmp(dt->u.str.s, st_dtypes[d].name) != 0) d++;
  if (d == ST_DTYPE_COUNT) {
    st_fail(err, errlen, path, "tensor '%.*s': unknown or unsupported dtype \"%.*s\"",
            ST_Q(name), ST_Q(dt->u.str.s));
    return false;
  }
  t->dtype = (st_dtype)d;
  if (shape->kind != JV_ARR) {
    st_fail(err, errlen, path, "tensor '%.*s': shape is not an array", ST_Q(name));
    return false;
  }
  if (shape->u.arr.n > ST_MAX_DIMS) {
    st_fail(err, errlen, path, "tensor '%.*s': shape has %zu dims, more than %d",
            ST_Q(name), shape->u.arr.n, ST_MAX_DIMS);
    return false;
  }
  t->ndims = (int)shape->u.arr.n;
  uint64_t numel = 1;
  bool too_big = false;
  for (int i = 0; i < t->ndims; i++) {
    const jv *s = shape->u.arr.v[i];
    uint64_t n;
    if (s->kind == JV_NUM && s->u.num.is_int && s->u.num.neg) {
      st_fail(err, errlen, path, "tensor '%.*s': shape entry %d is negative", ST_Q(name), i);
      return false;
    }
    if (!st_uint(s, &n)) {
      st_fail(err, errlen, path, "tensor '%.*s': shape entry %d is not an integer below 2^63",
              ST_Q(name), i);
      return false;
    }
    t->shape[i] = (int64_t)n;
    if (n && numel > (uint64_t)INT64_MAX / n) too_big = true;
    else numel *= n;
  }
  uint64_t size = (uint64_t)st_dtypes[t->dtype].size;
  /* an empty dim makes the tensor empty whatever the others say */
  for (int i = 0; i < t->ndims; i++)
    if (t->shape[i] == 0) {
      too_big = false;
      numel = 0;
    }
  if (too_big || numel > UINT64_MAX / size) {
    st_fail(err, errlen, path, "tensor '%.*s': shape has more than 2^63 elements", ST_Q(name));
    return false;
  }
  uint64_t b, en;
  if (offs->kind != JV_ARR || offs->u.arr.n != 2 || !st_uint(offs->u.arr.v[0], &b) ||
      !st_uint(offs->u.arr.v[1], &en)) {
    st_fail(err, errlen, path, "tensor '%.*s': data_offsets is not [begin, end] of two "
            "non-negative integers", ST_Q(name));
    return false;
  }
  t->begin = b;
  t->end = en;
  if (en < b) {
    st_fail(err, errlen, path, "tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 "] end "
            "before they begin", ST_Q(name), b, en);
    return false;
  }
  if (en - b != numel * size) {
    st_fail(err, errlen, path, "tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %"
            PRIu64 " bytes, but %" PRIu64 " %s elements take %" PRIu64, ST_Q(name), b, en,
            en - b, numel, st_dtypes[t->dtype].name, numel * size);
    return false;
  }
  if (en > f->data_len) {
    st_fail(err, errlen, path, "tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 "] go past "
            "the end of the data area (%" PRIu64 " bytes)", ST_Q(name), b, en, f->data_len);
    return false;
  }
  return true;
}

static bool st_read_meta(st_file *f, const jv *m, char *err, size_t errlen) {
  if (m->kind != JV_OBJ) {
    st_fail(err, errlen, f->path, "__metadata__ is not an object");
    return false;
  }
  if (m->u.obj.n > INT_MAX) {
    st_fail(err, errlen, f->path, "too many metadata entries");
    return false;
  }
  f->nmeta = (int)m->u.obj.n;
  f->meta = arena_alloc(&f->mem, m->u.obj.n * sizeof *f->meta);
  for (size_t i = 0; i < m->u.obj.n; i++) {
    const jv_member *e = &m->u.obj.m[i];
    if (e->val->kind != JV_STR) {
      st_fail(err, errlen, f->path, "__metadata__ value of \"%.*s\" is not a string", ST_Q(e->key));
      return false;
    }
    f->meta[i] = (st_kv){ e->key, e->val->u.str.s };
  }
  if (f->nmeta > 1) qsort(f->meta, (size_t)f->nmeta, sizeof *f->meta, st_kv_cmp);
  return true;
}

/* Builds the tensor table of f from its parsed header. */
static bool st_build(st_file *f, const jv *root, char *err, size_t errlen) {
  size_t n = 0;
  for (size_t i = 0; i < root->u.obj.n; i++)
    if (strcmp(root->u.obj.m[i].key, "__metadata__") != 0) n++;
  if (n > INT_MAX) {
    st_fail(err, errlen, f->path, "too many tensors");
    return false;
  }
  f->tensors = arena_alloc(&f->mem, n * sizeof *f->tensors);
  f->by_name = arena_alloc(&f->mem, n * sizeof *f->by_name);
  for (size_t i = 0; i < root->u.obj.n; i++) {
    const jv_member *m = &root->u.obj.m[i];
    if (strcmp(m->key, "__metadata__") == 0) {
      if (!st_read_meta(f, m->val, err, errlen)) return false;
      continue;
    }
    st_tensor *t = &f->tensors[f->ntensors];
    t->name = m->key;
    if (!st_read_entry(f, t, m->val, err, errlen)) return false;
    f->by_name[f->ntensors++] = t;
  }
  if (n > 1) qsort(f->by_name, n, sizeof *f->by_name, st_tensor_name_cmp);
  for (size_t i = 1; i < n; i++)     /* the parser rejects these already */
    if (strcmp(f->by_name[i]->name, f->by_name[i - 1]->name) == 0) {
      st_fail(err, errlen, f->path, "duplicate tensor name '%.*s'", ST_Q(f->by_name[i]->name));
      return false;
    }
  /* Overlaps: in order of begin, each non-empty range must start at or after
   * the furthest end seen so far. */
  const st_tensor **by_begin = st_alloc(n * sizeof *by_begin);
  memcpy(by_begin, f->by_name, n * sizeof *by_begin);
  if (n > 1) qsort(by_begin, n, sizeof *by_begin, st_tensor_begin_cmp);
  const st_tensor *furthest = NULL;
  bool ok = true;
  for (size_t i = 0; i < n && ok; i++) {
    const st_tensor *t = by_begin[i];
    if (t->begin == t->end) continue;
    if (furthest && t->begin < furthest->end) {
      st_fail(err, errlen, f->path, "tensors '%.*s' and '%.*s' overlap (data_offsets [%" PRIu64
              ", %" PRIu64 "] and [%" PRIu64 ", %" PRIu64 "])", ST_Q(furthest->name),
              ST_Q(t->name), furthest->begin, furthest->end, t->begin, t->end);
      ok = false;
    }
    if (!furthest || t->end > furthest->end) furthest = t;
  }
  free(by_begin);
  return ok;
}

/* Reads the whole of fd into f->bytes: mapped when the system allows. */
static bool st_load(st_file *f, int fd, char *err, size_t errlen) {
  void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m != MAP_FAILED) {
    f->bytes = m;
    f->mapped = true;
    return true;
  }
  f->bytes = st_alloc(f->size);
  size_t got = 0;
  while (got < f->size) {
    ssize_t r = pread(fd, f->bytes + got, f->size - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      st_fail(err, errlen, f->path, "cannot read: %s", r < 0 ? strerror(errno) : "file shrank");
      return false;
    }
    got += (size_t)r;
  }
  return true;
}

st_file *st_open(const char *path, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  /* a FIFO or a device is refused without blocking */
  char why[256];
  int64_t fsize = 0;
  int fd = file_open_read(path, 0, &fsize, why, sizeof why);
  if (fd < 0) {
    st_fail(err, errlen, path, "cannot open: %s", why);
    return NULL;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    st_fail(err, errlen, path, "cannot stat: %s", strerror(errno));
    close(fd);
    return NULL;
  }
  if (sb.st_size < 8) {
    st_fail(err, errlen, path, "file is %lld bytes, shorter than the 8-byte header length",
            (long long)sb.st_size);
    close(fd);
    return NULL;
  }
  if ((uint64_t)sb.st_size > SIZE_MAX) {
    st_fail(err, errlen, path, "file too large to map");
    close(fd);
    return NULL;
  }
  st_file *f = st_alloc(sizeof *f);
  memset(f, 0, sizeof *f);
  arena_init(&f->mem);
  f->path = st_strdup(path);
  f->size = (size_t)sb.st_size;
  bool ok = st_load(f, fd, err, errlen);
  close(fd);
  if (!ok) {
    st_close(f);
    return NULL;
  }
  uint64_t hlen = st_le64(f->bytes);
  if (hlen > ST_MAX_HEADER) {
    st_fail(err, errlen, path, "header length %" PRIu64 " is over the limit of %" PRIu64
            " bytes (100 MB)", hlen, ST_MAX_HEADER);
    st_close(f);
    return NULL;
  }
  if (hlen > f->size - 8) {
    st_fail(err, errlen, path, "header length %" PRIu64 " is larger than the file (%zu bytes "
            "after the length)", hlen, f->size - 8);
    st_close(f);
    return NULL;
  }
  f->data = f->bytes + 8 + hlen;
  f->data_len = f->size - 8 - hlen;

  arena nodes;
  arena_init(&nodes);
  jp j = { .base = f->bytes + 8, .p = f->bytes + 8, .end = f->bytes + 8 + hlen,
           .strs = &f->mem, .nodes = &nodes };
  jv *root = jp_header(&j);
  free(j.vs);
  free(j.ms);
  if (!root) {
    st_fail(err, errlen, path, "invalid header JSON at byte %zu of the file: %s",
            8 + j.fail_at, j.msg);
  } else if (!st_build(f, root, err, errlen)) {
    root = NULL;
  }
  arena_free(&nodes);
  if (!root) {
    st_close(f);
    return NULL;
  }
  return f;
}

int st_count(const st_file *f) { return f->ntensors; }

const st_tensor *st_at(const st_file *f, int i) {
  return i >= 0 && i < f->ntensors ? &f->tensors[i] : NULL;
}

const st_tensor *st_find(const st_file *f, const char *name) {
  int lo = 0, hi = f->ntensors;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(f->by_name[mid]->name, name);
    if (c == 0) return f->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

const char *st_meta(const st_file *f, const char *key) {
  st_kv probe = { key, NULL };
  const st_kv *e = f->nmeta ? bsearch(&probe, f->meta, (size_t)f->nmeta, sizeof *f->meta, st_kv_cmp)
                            : NULL;
  return e ? e->value : NULL;
}

int st_meta_count(const st_file *f) { return f->nmeta; }

const char *st_meta_key(const st_file *f, int i) {
  return i >= 0 && i < f->nmeta ? f->meta[i].key : NULL;
}

int64_t st_numel(const st_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndims; i++) n *= t->shape[i];
  return n;
}

const void *st_data(const st_file *f, const st_tensor *t) { return f->data + t->begin; }

/* IEEE half to float, exactly: subnormal halves are normal floats. */
static float st_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = h >> 10 & 0x1F, mant = h & 0x3FF;
  float v;
  if (exp == 0) {
    v = ldexpf((float)mant, -24);
    return sign ? -v : v;
  }
  uint32_t bits = exp == 0x1F ? sign | 0x7F800000u | mant << 13
                              : sign | (exp + 127 - 15) << 23 | mant << 13;
  memcpy(&v, &bits, sizeof v);
  return v;
}

static float st_bf16(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

bool st_read_f32(const st_file *f, const st_tensor *t, float *out, char *err, size_t errlen) {
  const unsigned char *p = f->data + t->begin;
  int64_t n = st_numel(t);
  switch (t->dtype) {
  case ST_F32:
    if (st_host_le()) {
      if (n) memcpy(out, p, (size_t)n * sizeof *out);
    } else {
      for (int64_t i = 0; i < n; i++) {
        uint32_t bits = st_le32(p + 4 * i);
        memcpy(&out[i], &bits, sizeof bits);
      }
    }
    return true;
  case ST_F16:
    for (int64_t i = 0; i < n; i++) out[i] = st_f16(st_le16(p + 2 * i));
    return true;
  case ST_BF16:
    for (int64_t i = 0; i < n; i++) out[i] = st_bf16(st_le16(p + 2 * i));
    return true;
  case ST_F64:
    for (int64_t i = 0; i < n; i++) {
      uint64_t bits = st_le64(p + 8 * i);
      double d;
      memcpy(&d, &bits, sizeof d);
      out[i] = (float)d;
    }
    return true;
  default:
    st_fail(err, errlen, f->path, "tensor '%.*s': dtype %s cannot be read as f32",
            ST_Q(t->name), st_dtype_name(t->dtype));
    return false;
  }
}

bool st_read_i32(const st_file *f, const st_tensor *t, int32_t *out, char *err, size_t errlen) {
  const unsigned char *p = f->data + t->begin;
  int64_t n = st_numel(t);
  switch (t->dtype) {
  case ST_I32:
    for (int64_t i = 0; i < n; i++) out[i] = st_s32(st_le32(p + 4 * i));
    return true;
  case ST_I64:
    for (int64_t i = 0; i < n; i++) {
      int64_t v = st_s64(st_le64(p + 8 * i));
      if (v < INT32_MIN || v > INT32_MAX) {
        st_fail(err, errlen, f->path, "tensor '%.*s': element %" PRId64 " is %" PRId64
                ", outside int32", ST_Q(t->name), i, v);
        return false;
      }
      out[i] = (int32_t)v;
    }
    return true;
  case ST_U8:
    for (int64_t i = 0; i < n; i++) out[i] = p[i];
    return true;
  case ST_I8:
    for (int64_t i = 0; i < n; i++) out[i] = p[i] < 0x80 ? p[i] : (int32_t)p[i] - 256;
    return true;
  case ST_BOOL:
    for (int64_t i = 0; i < n; i++) {
      if (p[i] > 1) {
        st_fail(err, errlen, f->path, "tensor '%.*s': element %" PRId64 " is %u, not a BOOL "
                "(0 or 1)", ST_Q(t->name), i, p[i]);
        return false;
      }
      out[i] = p[i];
    }
    return true;
  default:
    st_fail(err, errlen, f->path, "tensor '%.*s': dtype %s cannot be read as i32",
            ST_Q(t->name), st_dtype_name(t->dtype));
    return false;
  }
}

void st_close(st_file *f) {
  if (!f) return;
  if (f->mapped) munmap(f->bytes, f->size);
  else free(f->bytes);
  arena_free(&f->mem);
  free(f->path);
  free(f);
}

/* ---- writing ------------------------------------------------------------- */

/* A tensor to write. */
typedef struct st_entry {
  char *name;            /* owned copy */
  st_dtype dtype;        /* checked by st_write */
  int ndims;             /* as given: checked by st_write */
  int64_t shape[ST_MAX_DIMS];
  const void *data;      /* borrowed */
} st_entry;

/* A metadata entry to write. */
typedef struct st_wmeta {
  char *key, *value;     /* owned copies */
} st_wmeta;

struct st_writer {
  st_entry *t;           /* tensors, in the order added until st_write sorts them */
  size_t n, cap;
  st_wmeta *meta;        /* in the order set until st_write sorts them */
  size_t nmeta, mcap;
};

st_writer *st_writer_new(void) {
  st_writer *w = st_alloc(sizeof *w);
  memset(w, 0, sizeof *w);
  return w;
}

void st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndims,
                   const int64_t *shape, const void *data) {
  w->t = st_grow(w->t, &w->cap, w->n + 1, sizeof *w->t);
  st_entry *e = &w->t[w->n++];
  memset(e, 0, sizeof *e);
  e->name = st_strdup(name);
  e->dtype = dt;
  e->ndims = ndims;
  e->data = data;
  for (int i = 0; i < ndims && i < ST_MAX_DIMS; i++) e->shape[i] = shape[i];
}

void st_writer_meta(st_writer *w, const char *key, const char *value) {
  for (size_t i = 0; i < w->nmeta; i++)
    if (strcmp(w->meta[i].key, key) == 0) {
      free(w->meta[i].value);
      w->meta[i].value = st_strdup(value);
      return;
    }
  w->meta = st_grow(w->meta, &w->mcap, w->nmeta + 1, sizeof *w->meta);
  w->meta[w->nmeta++] = (st_wmeta){ st_strdup(key), st_strdup(value) };
}

void st_writer_free(st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
  for (size_t i = 0; i < w->nmeta; i++) {
    free(w->meta[i].key);
    free(w->meta[i].value);
  }
  free(w->t);
  free(w->meta);
  free(w);
}

/* A growing byte string, for the header. */
typedef struct st_buf {
  char *p;
  size_t len, cap;
} st_buf;

static void sb_put(st_buf *b, const char *s, size_t n) {
  b->p = st_grow(b->p, &b->cap, b->len + n + 1, 1);
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_str(st_buf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(st_buf *b, uint64_t v) {
  char num[24];
  sb_put(b, num, (size_t)snprintf(num, sizeof num, "%" PRIu64, v));
}

/* A JSON string: quotes, backslashes and control characters escaped, the
 * rest (UTF-8 included) as it is. */
static void sb_json(st_buf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    unsigned char c = *p;
    const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                    : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                    : c == '\f' ? "\\f" : NULL;
    if (esc) {
      sb_str(b, esc);
    } else if (c < 0x20) {
      char u[8];
      snprintf(u, sizeof u, "\\u%04x", c);
      sb_str(b, u);
    } else {
      sb_put(b, (const char *)p, 1);
    }
  }
  sb_put(b, "\"", 1);
}

static int st_entry_cmp(const void *a, const void *b) {
  return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int st_wmeta_cmp(const void *a, const void *b) {
  return strcmp(((const st_wmeta *)a)->key, ((const st_wmeta *)b)->key);
}

/* Checks the writer's tensors (sorted) and sums their bytes. */
static bool st_check(const st_writer *w, const char *path, uint64_t *total,
                     char *err, size_t errlen) {
  *total = 0;
  for (size_t i = 0; i < w->n; i++) {
    const st_entry *e = &w->t[i];
    const char *why = NULL;
    if (!st_utf8_valid(e->name)) why = "the name is not valid UTF-8";
    else if (strcmp(e->name, "__metadata__") == 0) why = "the name is reserved";
    else if (i > 0 && strcmp(e->name, w->t[i - 1].name) == 0) why = "added twice";
    else if ((unsigned)e->dtype >= ST_DTYPE_COUNT) why = "unknown dtype";
    else if (e->ndims < 0 || e->ndims > ST_MAX_DIMS) why = "ndims must be within [0, 8]";
    if (why) {
      st_fail(err, errlen, path, "tensor '%.*s': %s", ST_Q(e->name), why);
      return false;
    }
    uint64_t numel = 1;
    bool over = false;
    for (int d = 0; d < e->ndims; d++) {
      if (e->shape[d] < 0) {
        st_fail(err, errlen, path, "tensor '%.*s': dim %d is negative", ST_Q(e->name), d);
        return false;
      }
      uint64_t s = (uint64_t)e->shape[d];
      if (s && numel > (uint64_t)INT64_MAX / s) over = true;
      else numel *= s;
    }
    for (int d = 0; d < e->ndims; d++)
      if (e->shape[d] == 0) {
        over = false;
        numel = 0;
      }
    uint64_t bytes = numel * (uint64_t)st_dtypes[e->dtype].size;
    if (over || numel > (uint64_t)INT64_MAX / 8 || *total > UINT64_MAX / 2 - bytes) {
      st_fail(err, errlen, path, "tensor '%.*s': too many elements", ST_Q(e->name));
      return false;
    }
    if (bytes && !e->data) {
      st_fail(err, errlen, path, "tensor '%.*s': no data", ST_Q(e->name));
      return false;
    }
    *total += bytes;
  }
  for (size_t i = 0; i < w->nmeta; i++)
    if (!st_utf8_valid(w->meta[i].key) || !st_utf8_valid(w->meta[i].value)) {
      st_fail(err, errlen, path, "metadata \"%.*s\": not valid UTF-8", ST_Q(w->meta[i].key));
      return false;
    }
  return true;
}

/* The header: JSON padded with spaces to a multiple of 8 bytes. */
static void st_header(const st_writer *w, st_buf *b) {
  sb_str(b, "{");
  if (w->nmeta) {
    sb_str(b, "\"__metadata__\":{");
    for (size_t i = 0; i < w->nmeta; i++) {
      if (i) sb_str(b, ",");
      sb_json(b, w->meta[i].key);
      sb_str(b, ":");
      sb_json(b, w->meta[i].value);
    }
    sb_str(b, "}");
  }
  uint64_t at = 0;
  for (size_t i = 0; i < w->n; i++) {
    const st_entry *e = &w->t[i];
    uint64_t numel = 1;
    for (int d = 0; d < e->ndims; d++) numel *= (uint64_t)e->shape[d];
    uint64_t bytes = numel * (uint64_t)st_dtypes[e->dtype].size;
    if (i || w->nmeta) sb_str(b, ",");
    sb_json(b, e->name);
    sb_str(b, ":{\"dtype\":\"");
    sb_str(b, st_dtypes[e->dtype].name);
    sb_str(b, "\",\"shape\":[");
    for (int d = 0; d < e->ndims; d++) {
      if (d) sb_str(b, ",");
      sb_u64(b, (uint64_t)e->shape[d]);
    }
    sb_str(b, "],\"data_offsets\":[");
    sb_u64(b, at);
    sb_str(b, ",");
    sb_u64(b, at + bytes);
    sb_str(b, "]}");
    at += bytes;
  }
  sb_str(b, "}");
  while (b->len % 8) sb_str(b, " ");
}

/* Writes n bytes, through short writes and interrupted calls. */
static bool st_write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t r = write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) { errno = EIO; return false; }
    p += r;
    n -= (size_t)r;
  }
  return true;
}

/* The test hook: WEFT_TEST_SAVE_PAUSE milliseconds, or 0. */
static long st_pause_ms(void) {
  const char *s = getenv("WEFT_TEST_SAVE_PAUSE");
  if (!s || !*s) return 0;
  char *end;
  long ms = strtol(s, &end, 10);
  return *end == '\0' && ms > 0 ? ms : 0;
}

static void st_sleep_ms(long ms) {
  struct timespec ts = { ms / 1000, ms % 1000 * 1000000L };
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Header, then the data of every tensor in order: the temporary file's
 * contents. Sleeps for the test hook once half of the data is written. */
static bool st_write_contents(const st_writer *w, int fd, const st_buf *hdr, uint64_t total) {
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)hdr->len >> (8 * i));
  if (!st_write_all(fd, len, 8) || !st_write_all(fd, hdr->p, hdr->len)) return false;
  long pause = st_pause_ms();
  uint64_t half = total / 2, written = 0;
  bool paused = pause == 0;
  bool swap = !st_host_le();
  unsigned char *tmp = NULL;
  bool ok = true;
  for (size_t i = 0; i < w->n && ok; i++) {
    const st_entry *e = &w->t[i];
    uint64_t numel = 1;
    for (int d = 0; d < e->ndims; d++) numel *= (uint64_t)e->shape[d];
    size_t esize = (size_t)st_dtypes[e->dtype].size;
    uint64_t bytes = numel * esize, done = 0;
    while (done < bytes && ok) {
      if (!paused && written >= half) { st_sleep_ms(pause); paused = true; }
      uint64_t chunk = bytes - done < ST_CHUNK ? bytes - done : ST_CHUNK;
      if (!paused && half - written < chunk) chunk = half - written;
      const unsigned char *src = (const unsigned char *)e->data + done;
      if (swap && esize > 1) {
        /* whole elements only, so that each is reversed in one piece */
        chunk -= chunk % esize;
        if (!chunk) chunk = esize;
        if (!tmp) tmp = st_alloc(ST_CHUNK + 8);
        for (uint64_t k = 0; k < chunk; k += esize)
          for (size_t b = 0; b < esize; b++) tmp[k + b] = src[k + esize - 1 - b];
        src = tmp;
      }
      ok = st_write_all(fd, src, (size_t)chunk);
      done += chunk;
      written += chunk;
    }
  }
  if (ok && !paused) st_sleep_ms(pause);
  free(tmp);
  return ok;
}

bool st_write(st_writer *w, const char *path, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (w->n > 1) qsort(w->t, w->n, sizeof *w->t, st_entry_cmp);
  if (w->nmeta > 1) qsort(w->meta, w->nmeta, sizeof *w->meta, st_wmeta_cmp);
  uint64_t total;
  if (!st_check(w, path, &total, err, errlen)) return false;
  const char *slash = strrchr(path, '/');
  if (!*(slash ? slash + 1 : path)) {
    st_fail(err, errlen, path, "not a file name");
    return false;
  }
  st_buf hdr = {0};
  st_header(w, &hdr);
  if (hdr.len > ST_MAX_HEADER) {
    st_fail(err, errlen, path, "the header would be over the limit of 100 MB");
    free(hdr.p);
    return false;
  }

  /* The temporary beside the target, removed on failure and by a signal;
   * the target is refused first when it is not a regular file or a new name */
  file_out *out = file_out_open(path, err, errlen);
  if (!out) {
    free(hdr.p);
    return false;
  }
  if (!st_write_contents(w, file_out_fd(out), &hdr, total)) {
    int e = errno;
    st_fail(err, errlen, path, "cannot write the temporary file %s: %s", file_out_tmp(out), strerror(e));
    file_out_abort(out);
    free(hdr.p);
    return false;
  }
  free(hdr.p);
  return file_out_commit(out, err, errlen);
}

/* ---- the index of a sharded checkpoint ---------------------------------- */

struct st_index_mem {
  arena mem;
};

/* "PATH: WHERE: reason" */
static void ix_fail(char *err, size_t errlen, const char *path, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void ix_fail(char *err, size_t errlen, const char *path, const char *where, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  st_fail(err, errlen, path, "%s: %s", where, msg);
}

bool st_shard_name_ok(const char *name, int *shard, int *of) {
  int r = 0, n = 0, used = 0;
  if (strlen(name) != strlen("model-00000-of-00000.safetensors")) return false;
  if (sscanf(name, "model-%5d-of-%5d.safetensors%n", &r, &n, &used) != 2 || used != (int)strlen(name)) return false;
  for (int i = 6; i < 11; i++)
    if (name[i] < '0' || name[i] > '9' || name[i + 9] < '0' || name[i + 9] > '9') return false;
  if (r < 1 || n < 1 || r > n) return false;
  if (shard) *shard = r;
  if (of) *of = n;
  return true;
}

/* Non-negative integers of an array of n (n == -1: any length up to
 * ST_MAX_DIMS; its length in *len). */
static bool ix_ints(const jv *a, int64_t *out, int *len) {
  if (a->kind != JV_ARR || a->u.arr.n > ST_MAX_DIMS) return false;
  for (size_t i = 0; i < a->u.arr.n; i++) {
    uint64_t v;
    if (!st_uint(a->u.arr.v[i], &v)) return false;
    out[i] = (int64_t)v;
  }
  *len = (int)a->u.arr.n;
  return true;
}

static bool ix_keys_only(const jv *obj, const char *const *keys, int n, const char **bad) {
  for (size_t i = 0; i < obj->u.obj.n; i++) {
    bool known = false;
    for (int k = 0; k < n && !known; k++) known = strcmp(obj->u.obj.m[i].key, keys[k]) == 0;
    if (!known) {
      *bad = obj->u.obj.m[i].key;
      return false;
    }
  }
  return true;
}

static bool ix_build(st_index *ix, const jv *root, const char *path, char *err, size_t errlen) {
  arena *mem = &ix->mem->mem;
  const char *bad = NULL;
  static const char *const top[] = {"metadata", "weight_map", "tensors"};
  if (!ix_keys_only(root, top, 3, &bad)) {
    ix_fail(err, errlen, path, "the index", "unknown member \"%.*s\"", ST_Q(bad));
    return false;
  }
  const jv *meta = st_field(root, "metadata"), *wmap = st_field(root, "weight_map"), *ts = st_field(root, "tensors");
  const char *missing = !meta ? "metadata" : !wmap ? "weight_map" : !ts ? "tensors" : NULL;
  if (missing) {
    ix_fail(err, errlen, path, "the index", "no \"%s\"", missing);
    return false;
  }
  if (meta->kind != JV_OBJ || wmap->kind != JV_OBJ || ts->kind != JV_OBJ) {
    ix_fail(err, errlen, path, "the index", "%s is not an object",
            meta->kind != JV_OBJ ? "metadata" : wmap->kind != JV_OBJ ? "weight_map" : "tensors");
    return false;
  }
  if (meta->u.obj.n > 4096 || ts->u.obj.n > 1000000) {
    ix_fail(err, errlen, path, "the index", "too many entries");
    return false;
  }
  ix->nmeta = 0;
  ix->meta_key = arena_alloc(mem, (meta->u.obj.n + 1) * sizeof(char *));
  ix->meta_val = arena_alloc(mem, (meta->u.obj.n + 1) * sizeof(char *));
  for (size_t i = 0; i < meta->u.obj.n; i++) {
    const jv_member *m = &meta->u.obj.m[i];
    if (strcmp(m->key, "total_size") == 0) {
      uint64_t v;
      if (!st_uint(m->val, &v)) {
        ix_fail(err, errlen, path, "metadata.total_size", "not a count of bytes");
        return false;
      }
      ix->total_size = (int64_t)v;
      continue;
    }
    if (m->val->kind != JV_STR) {
      ix_fail(err, errlen, path, "metadata", "the value of \"%.*s\" is not a string", ST_Q(m->key));
      return false;
    }
    ix->meta_key[ix->nmeta] = m->key;
    ix->meta_val[ix->nmeta++] = m->val->u.str.s;
  }
  ix->ntensors = (int)ts->u.obj.n;
  ix->tensors = arena_alloc(mem, (ts->u.obj.n + 1) * sizeof *ix->tensors);
  ix->files = arena_alloc(mem, sizeof(char *));
  int fcap = 1;
  for (size_t i = 0; i < ts->u.obj.n; i++) {
    const jv_member *m = &ts->u.obj.m[i];
    st_itensor *t = &ix->tensors[i];
    memset(t, 0, sizeof *t);
    t->name = m->key;
    char where[200];
    snprintf(where, sizeof where, "tensors.%.*s", ST_Q(m->key));
    static const char *const tkeys[] = {"shape", "pieces"};
    const jv *shape = m->val->kind == JV_OBJ ? st_field(m->val, "shape") : NULL;
    const jv *pieces = m->val->kind == JV_OBJ ? st_field(m->val, "pieces") : NULL;
    if (!shape || !pieces || !ix_keys_only(m->val, tkeys, 2, &bad)) {
      ix_fail(err, errlen, path, where, "not an object of \"shape\" and \"pieces\"");
      return false;
    }
    if (!ix_ints(shape, t->shape, &t->ndims)) {
      ix_fail(err, errlen, path, where, "shape is not an array of at most %d counts", ST_MAX_DIMS);
      return false;
    }
    if (pieces->kind != JV_ARR || pieces->u.arr.n == 0 || pieces->u.arr.n > 1000000) {
      ix_fail(err, errlen, path, where, "pieces is not an array of pieces");
      return false;
    }
    t->npieces = (int)pieces->u.arr.n;
    t->pieces = arena_alloc(mem, pieces->u.arr.n * sizeof *t->pieces);
    for (size_t k = 0; k < pieces->u.arr.n; k++) {
      const jv *p = pieces->u.arr.v[k];
      st_piece *q = &t->pieces[k];
      snprintf(where, sizeof where, "tensors.%.*s.pieces[%zu]", ST_Q(m->key), k);
      static const char *const pkeys[] = {"file", "entry", "start", "stop"};
      const jv *file = p->kind == JV_OBJ ? st_field(p, "file") : NULL, *entry = p->kind == JV_OBJ ? st_field(p, "entry") : NULL;
      const jv *start = p->kind == JV_OBJ ? st_field(p, "start") : NULL, *stop = p->kind == JV_OBJ ? st_field(p, "stop") : NULL;
      if (!file || !entry || !start || !stop || !ix_keys_only(p, pkeys, 4, &bad) || file->kind != JV_STR ||
          entry->kind != JV_STR) {
        ix_fail(err, errlen, path, where, "not an object of \"file\", \"entry\" (strings), \"start\" and \"stop\"");
        return false;
      }
      if (!st_shard_name_ok(file->u.str.s, NULL, NULL)) {
        ix_fail(err, errlen, path, where, "file \"%.*s\" is not a shard's name (model-NNNNN-of-NNNNN.safetensors)",
                ST_Q(file->u.str.s));
        return false;
      }
      int ns = 0, ne = 0;
      if (!ix_ints(start, q->start, &ns) || !ix_ints(stop, q->stop, &ne) || ns != t->ndims || ne != t->ndims) {
        ix_fail(err, errlen, path, where, "start and stop are not arrays of %d counts (the tensor's dims)", t->ndims);
        return false;
      }
      for (int d = 0; d < t->ndims; d++)
        if (q->start[d] > q->stop[d] || q->stop[d] > t->shape[d]) {
          ix_fail(err, errlen, path, where, "dim %d: [%" PRId64 ", %" PRId64 ") does not lie in the shape's [0, %" PRId64 ")",
                  d, q->start[d], q->stop[d], t->shape[d]);
          return false;
        }
      q->entry = entry->u.str.s;
      q->file = -1;
      for (int f = 0; f < ix->nfiles && q->file < 0; f++)
        if (strcmp(ix->files[f], file->u.str.s) == 0) q->file = f;
      if (q->file < 0) {
        if (ix->nfiles == fcap) {
          const char **nf = arena_alloc(mem, (size_t)fcap * 2 * sizeof(char *));
          memcpy(nf, ix->files, (size_t)fcap * sizeof(char *));
          ix->files = nf;
          fcap *= 2;
        }
        q->file = ix->nfiles;
        ix->files[ix->nfiles++] = file->u.str.s;
      }
    }
  }
  /* the weight map: the tensors, each to a file of one of its pieces */
  if (wmap->u.obj.n != ts->u.obj.n) {
    ix_fail(err, errlen, path, "weight_map", "%zu tensors, but \"tensors\" has %zu", wmap->u.obj.n, ts->u.obj.n);
    return false;
  }
  for (size_t i = 0; i < wmap->u.obj.n; i++) {
    const jv_member *m = &wmap->u.obj.m[i];
    const st_itensor *t = NULL;
    for (int k = 0; k < ix->ntensors && !t; k++)
      if (strcmp(ix->tensors[k].name, m->key) == 0) t = &ix->tensors[k];
    bool held = false;
    for (int k = 0; t && m->val->kind == JV_STR && k < t->npieces && !held; k++)
      held = strcmp(ix->files[t->pieces[k].file], m->val->u.str.s) == 0;
    if (!held) {
      ix_fail(err, errlen, path, "weight_map", "\"%.*s\" is not mapped to a file that holds a piece of it", ST_Q(m->key));
      return false;
    }
  }
  return true;
}

st_index *st_index_read(const char *path, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  char why[256];
  size_t len = 0;
  char *text = file_read_all(path, (int64_t)ST_MAX_HEADER, &len, why, sizeof why);
  if (!text) {
    st_fail(err, errlen, path, "cannot read: %s", why);
    return NULL;
  }
  st_index *ix = st_alloc(sizeof *ix);
  memset(ix, 0, sizeof *ix);
  ix->mem = st_alloc(sizeof *ix->mem);
  arena_init(&ix->mem->mem);
  arena nodes;
  arena_init(&nodes);
  jp j = {.base = (const unsigned char *)text, .p = (const unsigned char *)text, .end = (const unsigned char *)text + len,
          .strs = &ix->mem->mem, .nodes = &nodes, .plain = true};
  jv *root = jp_header(&j);
  free(j.vs);
  free(j.ms);
  bool ok = root != NULL;
  if (!ok) st_fail(err, errlen, path, "invalid JSON at byte %zu: %s", j.fail_at, j.msg);
  else ok = ix_build(ix, root, path, err, errlen);
  arena_free(&nodes);
  free(text);
  if (!ok) {
    st_index_free(ix);
    return NULL;
  }
  return ix;
}

const char *st_index_meta(const st_index *ix, const char *key) {
  for (int i = 0; i < ix->nmeta; i++)
    if (strcmp(ix->meta_key[i], key) == 0) return ix->meta_val[i];
  return NULL;
}

void st_index_free(st_index *ix) {
  if (!ix) return;
  if (ix->mem) arena_free(&ix->mem->mem);
  free(ix->mem);
  free(ix);
}

static void sb_ints(st_buf *b, const int64_t *v, int n) {
  sb_str(b, "[");
  for (int d = 0; d < n; d++) {
    if (d) sb_str(b, ", ");
    sb_u64(b, (uint64_t)v[d]);
  }
  sb_str(b, "]");
}

bool st_index_write(const st_index *ix, const char *path, char *err, size_t errlen) {
  st_buf b = {0};
  sb_str(&b, "{\n  \"metadata\": {\n    \"total_size\": ");
  sb_u64(&b, (uint64_t)ix->total_size);
  for (int i = 0; i < ix->nmeta; i++) {
    sb_str(&b, ",\n    ");
    sb_json(&b, ix->meta_key[i]);
    sb_str(&b, ": ");
    sb_json(&b, ix->meta_val[i]);
  }
  sb_str(&b, "\n  },\n  \"weight_map\": {");
  for (int i = 0; i < ix->ntensors; i++) {
    sb_str(&b, i ? ",\n    " : "\n    ");
    sb_json(&b, ix->tensors[i].name);
    sb_str(&b, ": ");
    sb_json(&b, ix->files[ix->tensors[i].pieces[0].file]);
  }
  sb_str(&b, "\n  },\n  \"tensors\": {");
  for (int i = 0; i < ix->ntensors; i++) {
    const st_itensor *t = &ix->tensors[i];
    sb_str(&b, i ? ",\n    " : "\n    ");
    sb_json(&b, t->name);
    sb_str(&b, ": {\"shape\": ");
    sb_ints(&b, t->shape, t->ndims);
    sb_str(&b, ", \"pieces\": [");
    for (int k = 0; k < t->npieces; k++) {
      const st_piece *q = &t->pieces[k];
      sb_str(&b, k ? ",\n      " : "\n      ");
      sb_str(&b, "{\"file\": ");
      sb_json(&b, ix->files[q->file]);
      sb_str(&b, ", \"entry\": ");
      sb_json(&b, q->entry);
      sb_str(&b, ", \"start\": ");
      sb_ints(&b, q->start, t->ndims);
      sb_str(&b, ", \"stop\": ");
      sb_ints(&b, q->stop, t->ndims);
      sb_str(&b, "}");
    }
    sb_str(&b, "]}");
  }
  sb_str(&b, "\n  }\n}\n");
  bool ok = file_write_text(path, b.p, b.len, err, errlen);
  free(b.p);
  return ok;
}
