/* test_safetensors.c - the safetensors reader and writer (backends/cpu/
 * safetensors.c): round trips, byte-identical output, half-precision
 * conversions, every malformed-file check, strict JSON, metadata, odd
 * names, and saves that are killed or fail midway. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpu/safetensors.h"

/* ---- files and directories ----------------------------------------------- */

enum { ERRLEN = 512 };

/* A fresh directory under /tmp, removed (with its files) by rm_dir. */
static char *make_dir(void) {
  char *d = strdup("/tmp/weft-st-XXXXXX");
  assert_non_null(d);
  assert_non_null(mkdtemp(d));
  return d;
}

static void rm_dir(char *d) {
  DIR *dir = opendir(d);
  assert_non_null(dir);
  struct dirent *e;
  char p[512];
  while ((e = readdir(dir))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(p, sizeof p, "%s/%s", d, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      chmod(p, 0755);
      rmdir(p);
    } else {
      unlink(p);
    }
  }
  closedir(dir);
  assert_int_equal(rmdir(d), 0);
  free(d);
}

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  assert_non_null(p);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static void put_file(const char *path, const void *bytes, size_t n) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(bytes, 1, n, fp), n);
  assert_int_equal(fclose(fp), 0);
}

static unsigned char *get_file(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  fseek(fp, 0, SEEK_END);
  long len = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)len, fp), (size_t)len);
  fclose(fp);
  *n = (size_t)len;
  return b;
}

/* Entries of dir other than . and .. */
static int count_entries(const char *d) {
  DIR *dir = opendir(d);
  assert_non_null(dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(dir);
  return n;
}

/* A safetensors file written by hand: the length hlen (the header's own
 * length when hlen is -1), the header text, then data_len bytes of data
 * (0, 1, 2, ... mod 251). */
static void put_st(const char *path, long long hlen, const char *header, size_t hdr_bytes,
                   size_t data_len) {
  uint64_t len = hlen < 0 ? hdr_bytes : (uint64_t)hlen;
  size_t n = 8 + hdr_bytes + data_len;
  unsigned char *b = malloc(n);
  assert_non_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(len >> (8 * i));
  memcpy(b + 8, header, hdr_bytes);
  for (size_t i = 0; i < data_len; i++) b[8 + hdr_bytes + i] = (unsigned char)(i % 251);
  put_file(path, b, n);
  free(b);
}

static void expect_has(const char *err, const char *want) {
  if (!strstr(err, want)) fail_msg("message \"%s\" does not contain \"%s\"", err, want);
}

/* Opening a file with this header and data fails, with a message that names
 * the file and contains want (and want2 when given). */
static void expect_bad_header(const char *dir, const char *header, size_t data_len,
                              const char *want, const char *want2) {
  char *path = join(dir, "bad.safetensors");
  put_st(path, -1, header, strlen(header), data_len);
  char err[ERRLEN];
  st_file *f = st_open(path, err, sizeof err);
  if (f) fail_msg("opened a file with header %s", header);
  expect_has(err, path);
  expect_has(err, want);
  if (want2) expect_has(err, want2);
  unlink(path);
  free(path);
}

static void write_ok(st_writer *w, const char *path) {
  char err[ERRLEN];
  if (!st_write(w, path, err, sizeof err)) fail_msg("st_write: %s", err);
}

static st_file *open_ok(const char *path) {
  char err[ERRLEN];
  st_file *f = st_open(path, err, sizeof err);
  if (!f) fail_msg("st_open: %s", err);
  return f;
}

static const st_tensor *find_ok(const st_file *f, const char *name) {
  const st_tensor *t = st_find(f, name);
  if (!t) fail_msg("no tensor '%s'", name);
  return t;
}

static void expect_float_bits(const char *what, int i, float got, float want) {
  if (isnan(want) ? !isnan(got) : memcmp(&got, &want, sizeof got) != 0)
    fail_msg("%s[%d] = %a, want %a", what, i, (double)got, (double)want);
}

/* ---- round trips --------------------------------------------------------- */

static void test_round_trip(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "rt.safetensors");
  float f32[6] = {1, -2, 3.25f, 0, -0.5f, 1e-30f};
  uint16_t f16[4] = {0x3C00, 0xC100, 0x7BFF, 0x0001};
  uint16_t bf16[4] = {0x3F80, 0xC020, 0x7F7F, 0x0001};
  double f64[3] = {0.1, -1e300, 2};
  int32_t i32[5] = {0, 1, -1, INT32_MAX, INT32_MIN};
  int64_t i64[4] = {5, -6, INT32_MAX, INT32_MIN};
  uint8_t u8[3] = {0, 128, 255};
  int8_t i8[3] = {-128, 0, 127};
  uint8_t bools[4] = {1, 0, 0, 1};
  float scalar = 3.5f;

  struct { const char *name; st_dtype dt; int ndims; int64_t shape[3]; const void *data;
           size_t bytes; } in[] = {
    {"w.f32", ST_F32, 2, {2, 3}, f32, sizeof f32},
    {"w.f16", ST_F16, 1, {4}, f16, sizeof f16},
    {"w.bf16", ST_BF16, 2, {2, 2}, bf16, sizeof bf16},
    {"w.f64", ST_F64, 1, {3}, f64, sizeof f64},
    {"ids", ST_I32, 1, {5}, i32, sizeof i32},
    {"steps", ST_I64, 2, {2, 2}, i64, sizeof i64},
    {"bytes", ST_U8, 1, {3}, u8, sizeof u8},
    {"signed", ST_I8, 1, {3}, i8, sizeof i8},
    {"mask", ST_BOOL, 1, {4}, bools, sizeof bools},
    {"scalar", ST_F32, 0, {0}, &scalar, sizeof scalar},
    {"empty", ST_F32, 2, {0, 3}, NULL, 0},
    {"empty.i64", ST_I64, 3, {4, 0, 2}, NULL, 0},
  };
  int n = (int)(sizeof in / sizeof in[0]);
  st_writer *w = st_writer_new();
  for (int i = 0; i < n; i++) st_writer_add(w, in[i].name, in[i].dt, in[i].ndims, in[i].shape, in[i].data);
  write_ok(w, path);
  st_writer_free(w);

  st_file *f = open_ok(path);
  assert_int_equal(st_count(f), n);
  for (int i = 0; i < n; i++) {
    const st_tensor *t = find_ok(f, in[i].name);
    assert_string_equal(t->name, in[i].name);
    assert_int_equal(t->dtype, in[i].dt);
    assert_int_equal(t->ndims, in[i].ndims);
    for (int d = 0; d < t->ndims; d++) assert_int_equal(t->shape[d], in[i].shape[d]);
    assert_int_equal(t->end - t->begin, in[i].bytes);
    assert_int_equal((size_t)st_numel(t) * (size_t)st_dtype_size(t->dtype), in[i].bytes);
    if (in[i].bytes) assert_memory_equal(st_data(f, t), in[i].data, in[i].bytes);
  }
  assert_int_equal(st_numel(find_ok(f, "scalar")), 1);
  assert_int_equal(st_numel(find_ok(f, "empty")), 0);
  assert_null(st_find(f, "missing"));
  assert_null(st_find(f, ""));

  /* laid out in name order, back to back */
  uint64_t at = 0;
  const char *prev = "";
  for (int i = 0; i < n; i++) {
    const st_tensor *t = st_at(f, i);
    assert_true(strcmp(prev, t->name) < 0);
    assert_int_equal(t->begin, at);
    at = t->end;
    prev = t->name;
  }
  assert_null(st_at(f, n));

  char err[ERRLEN];
  float fo[6];
  assert_true(st_read_f32(f, find_ok(f, "w.f32"), fo, err, sizeof err));
  for (int i = 0; i < 6; i++) expect_float_bits("w.f32", i, fo[i], f32[i]);
  assert_true(st_read_f32(f, find_ok(f, "scalar"), fo, err, sizeof err));
  assert_true(fo[0] == 3.5f);
  assert_true(st_read_f32(f, find_ok(f, "empty"), fo, err, sizeof err));
  int32_t io[5];
  assert_true(st_read_i32(f, find_ok(f, "ids"), io, err, sizeof err));
  assert_memory_equal(io, i32, sizeof i32);
  assert_true(st_read_i32(f, find_ok(f, "empty.i64"), io, err, sizeof err));
  st_close(f);

  size_t len;
  unsigned char *b = get_file(path, &len);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
  assert_int_equal(hlen % 8, 0);
  assert_int_equal(len, 8 + hlen + at);
  free(b);
  free(path);
  rm_dir(dir);
}

/* The exact bytes of a small file: the format as this writer puts it. */
static void test_exact_bytes(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "x.safetensors");
  float x[2] = {1.0f, -2.0f};
  uint8_t m = 7;
  st_writer *w = st_writer_new();
  st_writer_add(w, "x", ST_F32, 1, (int64_t[]){2}, x);
  st_writer_add(w, "m", ST_U8, 0, NULL, &m);
  st_writer_meta(w, "format", "pt");
  write_ok(w, path);
  st_writer_free(w);
  const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"m\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},"
                    "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]}}";
  size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
  size_t len;
  unsigned char *b = get_file(path, &len);
  assert_int_equal(len, 8 + padded + 9);
  for (int i = 0; i < 8; i++) assert_int_equal(b[i], (unsigned char)(padded >> (8 * i)));
  assert_memory_equal(b + 8, hdr, hl);
  for (size_t i = hl; i < padded; i++) assert_int_equal(b[8 + i], ' ');
  const unsigned char data[9] = {7, 0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0};
  assert_memory_equal(b + 8 + padded, data, 9);
  free(b);
  free(path);
  rm_dir(dir);
}

static void add_set(st_writer *w, bool reversed, const float *a, const int64_t *b, const uint16_t *c) {
  for (int k = 0; k < 3; k++) {
    int i = reversed ? 2 - k : k;
    if (i == 0) st_writer_add(w, "layer.0.w", ST_F32, 2, (int64_t[]){2, 2}, a);
    if (i == 1) st_writer_add(w, "Layer.0.b", ST_I64, 1, (int64_t[]){3}, b);
    if (i == 2) st_writer_add(w, "layer.10.w", ST_BF16, 1, (int64_t[]){1}, c);
    if (i == 0) st_writer_meta(w, "step", "12");
    if (i == 2) st_writer_meta(w, "optimizer", "adamw");
  }
}

static void test_same_content_same_bytes(void **state) {
  (void)state;
  char *dir = make_dir(), *p1 = join(dir, "one.safetensors"), *p2 = join(dir, "two.safetensors");
  float a[4] = {1, 2, 3, 4};
  int64_t b[3] = {7, 8, 9};
  uint16_t c[1] = {0x4000};
  st_writer *w1 = st_writer_new(), *w2 = st_writer_new();
  add_set(w1, false, a, b, c);
  add_set(w2, true, a, b, c);
  st_writer_meta(w2, "step", "11");
  st_writer_meta(w2, "step", "12");          /* replaces */
  write_ok(w1, p1);
  write_ok(w2, p2);
  size_t n1, n2;
  unsigned char *b1 = get_file(p1, &n1), *b2 = get_file(p2, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  free(b2);
  /* writing again gives the same bytes too */
  write_ok(w1, p2);
  b2 = get_file(p2, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  st_writer_free(w1);
  st_writer_free(w2);

  st_file *f = open_ok(p1);
  assert_string_equal(st_at(f, 0)->name, "Layer.0.b");
  assert_string_equal(st_at(f, 1)->name, "layer.0.w");
  assert_string_equal(st_at(f, 2)->name, "layer.10.w");
  assert_string_equal(st_meta(f, "step"), "12");
  st_close(f);
  free(b1);
  free(b2);
  free(p1);
  free(p2);
  rm_dir(dir);
}

/* ---- conversions --------------------------------------------------------- */

static void test_half_conversions(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "h.safetensors");
  const uint16_t h[] = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x8000, 0x7C00,
                        0xFC00, 0x7E00, 0x3555, 0x8001};
  const float hw[] = {1.0f, -2.5f, 65504.0f, 0x1p-24f, 0x3FFp-24f, 0x1p-14f, -0.0f, INFINITY,
                      -INFINITY, NAN, 0x1.554p-2f, -0x1p-24f};
  const uint16_t bf[] = {0x3F80, 0xC020, 0x7F7F, 0x0001, 0x8001, 0x7F80, 0xFF80, 0x7FC0,
                         0x3EAB, 0x0080};
  const float bw[] = {1.0f, -2.5f, 0x1.FEp127f, 0x1p-133f, -0x1p-133f, INFINITY, -INFINITY,
                      NAN, 0.333984375f, 0x1p-126f};
  const double d[] = {1.0, -2.5, 0.1, 1e300, -1e-300, 65504.0, 0x1.000001p0};
  const float dw[] = {1.0f, -2.5f, 0.1f, INFINITY, -0.0f, 65504.0f, 1.0f};
  enum { NH = sizeof h / sizeof h[0], NB = sizeof bf / sizeof bf[0], ND = sizeof d / sizeof d[0] };
  st_writer *w = st_writer_new();
  st_writer_add(w, "h", ST_F16, 1, (int64_t[]){NH}, h);
  st_writer_add(w, "b", ST_BF16, 1, (int64_t[]){NB}, bf);
  st_writer_add(w, "d", ST_F64, 1, (int64_t[]){ND}, d);
  write_ok(w, path);
  st_writer_free(w);
  st_file *f = open_ok(path);
  char err[ERRLEN];
  float out[16];
  assert_true(st_read_f32(f, find_ok(f, "h"), out, err, sizeof err));
  for (int i = 0; i < NH; i++) expect_float_bits("f16", i, out[i], hw[i]);
  assert_true(st_read_f32(f, find_ok(f, "b"), out, err, sizeof err));
  for (int i = 0; i < NB; i++) expect_float_bits("bf16", i, out[i], bw[i]);
  assert_true(st_read_f32(f, find_ok(f, "d"), out, err, sizeof err));
  for (int i = 0; i < ND; i++) expect_float_bits("f64", i, out[i], dw[i]);
  st_close(f);
  free(path);
  rm_dir(dir);
}

static void test_int_conversions(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "i.safetensors");
  const int64_t ok64[] = {0, -1, INT32_MAX, INT32_MIN};
  const int64_t big64[] = {0, (int64_t)INT32_MAX + 1};
  const int8_t i8[] = {-128, -1, 0, 127};
  const uint8_t u8[] = {0, 1, 200, 255};
  const uint8_t bools[] = {0, 1};
  const uint8_t badbool[] = {1, 2};
  const float f[] = {1};
  const int32_t i32[] = {-7};
  st_writer *w = st_writer_new();
  st_writer_add(w, "ok64", ST_I64, 1, (int64_t[]){4}, ok64);
  st_writer_add(w, "big64", ST_I64, 1, (int64_t[]){2}, big64);
  st_writer_add(w, "i8", ST_I8, 1, (int64_t[]){4}, i8);
  st_writer_add(w, "u8", ST_U8, 1, (int64_t[]){4}, u8);
  st_writer_add(w, "bools", ST_BOOL, 1, (int64_t[]){2}, bools);
  st_writer_add(w, "badbool", ST_BOOL, 1, (int64_t[]){2}, badbool);
  st_writer_add(w, "f", ST_F32, 1, (int64_t[]){1}, f);
  st_writer_add(w, "i32", ST_I32, 1, (int64_t[]){1}, i32);
  write_ok(w, path);
  st_writer_free(w);
  st_file *fl = open_ok(path);
  char err[ERRLEN];
  int32_t out[4];
  assert_true(st_read_i32(fl, find_ok(fl, "ok64"), out, err, sizeof err));
  for (int i = 0; i < 4; i++) assert_int_equal(out[i], ok64[i]);
  assert_true(st_read_i32(fl, find_ok(fl, "i8"), out, err, sizeof err));
  for (int i = 0; i < 4; i++) assert_int_equal(out[i], i8[i]);
  assert_true(st_read_i32(fl, find_ok(fl, "u8"), out, err, sizeof err));
  for (int i = 0; i < 4; i++) assert_int_equal(out[i], u8[i]);
  assert_true(st_read_i32(fl, find_ok(fl, "bools"), out, err, sizeof err));
  assert_int_equal(out[0], 0);
  assert_int_equal(out[1], 1);

  assert_false(st_read_i32(fl, find_ok(fl, "big64"), out, err, sizeof err));
  expect_has(err, path);
  expect_has(err, "'big64'");
  expect_has(err, "element 1 is 2147483648");
  assert_false(st_read_i32(fl, find_ok(fl, "badbool"), out, err, sizeof err));
  expect_has(err, "'badbool'");
  assert_false(st_read_i32(fl, find_ok(fl, "f"), out, err, sizeof err));
  expect_has(err, "F32");
  float fo[1];
  assert_false(st_read_f32(fl, find_ok(fl, "i32"), fo, err, sizeof err));
  expect_has(err, "'i32'");
  expect_has(err, "I32");
  st_close(fl);
  free(path);
  rm_dir(dir);
}

/* ---- malformed files ----------------------------------------------------- */

static void test_short_and_long_headers(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "s.safetensors");
  char err[ERRLEN];
  put_file(path, "\x10\0\0\0\0", 5);
  assert_null(st_open(path, err, sizeof err));
  expect_has(err, path);
  expect_has(err, "5 bytes, shorter than");

  put_file(path, "", 0);
  assert_null(st_open(path, err, sizeof err));
  expect_has(err, "0 bytes");

  put_st(path, 100, "{}      ", 8, 2);
  assert_null(st_open(path, err, sizeof err));
  expect_has(err, path);
  expect_has(err, "header length 100 is larger than the file");

  put_st(path, 200000000, "{}      ", 8, 0);
  assert_null(st_open(path, err, sizeof err));
  expect_has(err, "100 MB");

  assert_null(st_open(dir, err, sizeof err));
  expect_has(err, "not a regular file");
  char *missing = join(dir, "missing.safetensors");
  assert_null(st_open(missing, err, sizeof err));
  expect_has(err, missing);
  expect_has(err, "cannot open");
  free(missing);
  free(path);
  rm_dir(dir);
}

static void test_bad_entries(void **state) {
  (void)state;
  char *dir = make_dir();
#define T(name, rest) "{\"" name "\":{" rest "}}"
  expect_bad_header(dir, T("w", "\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]"), 16,
                    "tensor 'w'", "dtype \"Q4\"");
  expect_bad_header(dir, T("w", "\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]"), 16,
                    "tensor 'w'", "unsupported dtype");
  expect_bad_header(dir, T("w", "\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]"), 16,
                    "tensor 'w'", "dtype is not a string");
  expect_bad_header(dir, T("neg", "\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]"), 16,
                    "tensor 'neg'", "shape entry 1 is negative");
  expect_bad_header(dir, T("deep", "\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                                   "\"data_offsets\":[0,1]"), 16,
                    "tensor 'deep'", "9 dims, more than 8");
  expect_bad_header(dir, T("w", "\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]"), 16,
                    "tensor 'w'", "not an integer");
  expect_bad_header(dir, T("w", "\"dtype\":\"U8\",\"shape\":[99999999999999999999],"
                                "\"data_offsets\":[0,2]"), 16,
                    "tensor 'w'", "not an integer below 2^63");
  expect_bad_header(dir, T("w", "\"dtype\":\"U8\",\"shape\":\"2\",\"data_offsets\":[0,2]"), 16,
                    "tensor 'w'", "shape is not an array");
  expect_bad_header(dir, T("huge", "\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
                                   "\"data_offsets\":[0,4]"), 16,
                    "tensor 'huge'", "more than 2^63 elements");
  expect_bad_header(dir, T("w", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]"), 16,
                    "tensor 'w'", "hold 4 bytes, but 2 F32 elements take 8");
  expect_bad_header(dir, T("w", "\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0]"), 16,
                    "tensor 'w'", "data_offsets is not [begin, end]");
  expect_bad_header(dir, T("w", "\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,-4]"), 16,
                    "tensor 'w'", "data_offsets is not [begin, end]");
  expect_bad_header(dir, T("w", "\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":{}"), 16,
                    "tensor 'w'", "data_offsets is not [begin, end]");
  expect_bad_header(dir, T("w", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]"), 16,
                    "tensor 'w'", "end before they begin");
  expect_bad_header(dir, T("far", "\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[4,20]"), 16,
                    "tensor 'far'", "past the end of the data area (16 bytes)");
  expect_bad_header(dir, T("w", "\"shape\":[1],\"data_offsets\":[0,4]"), 16,
                    "tensor 'w'", "no \"dtype\"");
  expect_bad_header(dir, T("w", "\"dtype\":\"F32\",\"data_offsets\":[0,4]"), 16,
                    "tensor 'w'", "no \"shape\"");
  expect_bad_header(dir, T("w", "\"dtype\":\"F32\",\"shape\":[1]"), 16,
                    "tensor 'w'", "no \"data_offsets\"");
  expect_bad_header(dir, "{\"w\":[1]}", 16, "tensor 'w'", "not an object");
#undef T
  expect_bad_header(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16,
                    "tensors 'a' and 'b' overlap", "[0, 8] and [4, 12]");
  /* the overlap is found whatever the order in the header, and also with a
   * tensor that lies inside another */
  expect_bad_header(dir, "{\"z\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]},"
                          "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]},"
                          "\"y\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[0,10]}}", 16,
                    "'y' and 'z' overlap", NULL);
  expect_bad_header(dir, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                          "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 16,
                    "duplicate tensor name 'a'", NULL);
  expect_bad_header(dir, "{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value of \"k\"",
                    "not a string");
  expect_bad_header(dir, "{\"__metadata__\":[]}", 0, "__metadata__ is not an object", NULL);
  expect_bad_header(dir, "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0,
                    "duplicate key \"k\"", NULL);
  /* more than 8 keys: found by sorting them */
  expect_bad_header(dir, "{\"__metadata__\":{\"a\":\"\",\"b\":\"\",\"c\":\"\",\"d\":\"\",\"e\":\"\","
                          "\"f\":\"\",\"g\":\"\",\"h\":\"\",\"i\":\"\",\"e\":\"\",\"a\":\"\"}}", 0,
                    "duplicate key \"e\"", NULL);
  expect_bad_header(dir, "{\"__metadata__\":{},\"__metadata__\":{}}", 0,
                    "duplicate key \"__metadata__\"", NULL);
  rm_dir(dir);
}

static void test_strict_json(void **state) {
  (void)state;
  char *dir = make_dir();
  static const struct { const char *header, *want; } bad[] = {
    {"", "not a JSON object"},
    {"[1]", "not a JSON object"},
    {"\xEF\xBB\xBF{}", "not a JSON object"},
    {"{\"a\":", "unexpected end"},
    {"{\"a\":1,}", "expected a string key"},
    {"{'a':1}", "expected a string key"},
    {"{\"a\" 1}", "expected ':'"},
    {"{\"a\":1 \"b\":2}", "expected ',' or '}'"},
    {"{\"a\":[1 2]}", "expected ',' or ']'"},
    {"{\"a\":[1,]}", "unexpected character ']'"},
    {"{\"a\":\"\\x\"}", "invalid escape '\\x'"},
    {"{\"a\":\"\\u12\"}", "4 hex digits"},
    {"{\"a\":\"\\ud800\"}", "unpaired surrogate \\uD800"},
    {"{\"a\":\"\\ud800\\u0041\"}", "unpaired surrogate"},
    {"{\"a\":\"\\udc00x\"}", "unpaired surrogate \\uDC00"},
    {"{\"a\":\"\\u0000\"}", "\\u0000"},
    {"{\"a\":\"tab\there\"}", "control character 0x09"},
    {"{\"a\":\"\xFF\"}", "invalid UTF-8"},
    {"{\"a\":\"\xC0\xAF\"}", "invalid UTF-8"},             /* overlong '/' */
    {"{\"a\":\"\xE0\x80\xAF\"}", "invalid UTF-8"},         /* overlong, 3 bytes */
    {"{\"a\":\"\xF0\x80\x80\xAF\"}", "invalid UTF-8"},     /* overlong, 4 bytes */
    {"{\"a\":\"\x80\"}", "invalid UTF-8"},                 /* a lone continuation */
    {"{\"a\":\"\xED\xA0\x80\"}", "invalid UTF-8"},         /* a surrogate */
    {"{\"a\":\"\xF4\x90\x80\x80\"}", "invalid UTF-8"},     /* above U+10FFFF */
    {"{\"a\":\"\xE2\x82\"}", "invalid UTF-8"},             /* cut short */
    {"{\"a\":\"open", "unterminated string"},
    {"{\"a\":01}", "leading zero"},
    {"{\"a\":1.}", "invalid number"},
    {"{\"a\":-}", "invalid number"},
    {"{\"a\":1e}", "invalid number"},
    {"{\"a\":+1}", "unexpected character '+'"},
    {"{\"a\":tru}", "invalid literal"},
    {"{\"a\":nul}", "invalid literal"},
    {"{} x", "text after the header object"},
    {"{}{}", "text after the header object"},
    {"{}\0\0\0\0\0\0", "text after the header object"},
    {"{\"a\":\x01}", "unexpected byte 0x01"},
  };
  char *path = join(dir, "j.safetensors");
  char err[ERRLEN];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t len = strlen(bad[i].header);
    if (strncmp(bad[i].header, "{}\0", 3) == 0) len = 8;
    put_st(path, -1, bad[i].header, len, 0);
    if (st_open(path, err, sizeof err)) fail_msg("opened header %s", bad[i].header);
    expect_has(err, path);
    expect_has(err, "invalid header JSON at byte");
    expect_has(err, bad[i].want);
  }
  /* nesting: 32 levels are read (an unknown field is ignored), 33 are not */
  char deep[256];
  for (int levels = 32; levels <= 33; levels++) {
    int n = snprintf(deep, sizeof deep, "{\"__metadata__\":{},\"t\":{\"dtype\":\"U8\",\"shape\":[],"
                     "\"data_offsets\":[0,1],\"x\":");
    for (int i = 0; i < levels - 2; i++) deep[n++] = '[';
    for (int i = 0; i < levels - 2; i++) deep[n++] = ']';
    deep[n++] = '}';
    deep[n++] = '}';
    deep[n] = '\0';
    put_st(path, -1, deep, (size_t)n, 1);
    st_file *f = st_open(path, err, sizeof err);
    if (levels == 32) {
      if (!f) fail_msg("32 levels: %s", err);
      st_close(f);
    } else {
      assert_null(f);
      expect_has(err, "nesting deeper than 32");
    }
  }
  /* what JSON allows: whitespace everywhere, exponents in unknown fields,
   * every escape */
  const char *good = "\t\r\n {\"w\" : {\"x\":[1e5,-0.5E-3,true,false,null,{}],\"dtype\" : \"U8\","
                     " \"shape\":[ ], \"data_offsets\" : [ 0 , 1 ] } ,"
                     " \"\\u00f1\\ud83d\\ude00\\\"q\\\\\\/\\b\\f\\n\\r\\t\\u0041\":"
                     "{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[1,1]}}\n  ";
  put_st(path, -1, good, strlen(good), 1);
  st_file *f = open_ok(path);
  assert_int_equal(st_count(f), 2);
  assert_non_null(st_find(f, "w"));
  const st_tensor *t = find_ok(f, "\xC3\xB1\xF0\x9F\x98\x80\"q\\/\b\f\n\r\tA");
  assert_int_equal(t->ndims, 1);
  assert_int_equal(t->shape[0], 0);
  st_close(f);
  free(path);
  rm_dir(dir);
}

/* A file another writer might make: no padding to 8, members in another
 * order, an unknown field, unaligned data and a hole in the data area. */
static void test_foreign_layout(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "f.safetensors");
  const char *hdr = "{\"b\":{\"data_offsets\":[5,13],\"shape\":[2],\"dtype\":\"F32\",\"note\":\"x\"},"
                    "\"a\":{\"dtype\":\"F64\",\"shape\":[1,1],\"data_offsets\":[20,28]}}";
  size_t hl = strlen(hdr);
  unsigned char file[512];
  for (int i = 0; i < 8; i++) file[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(file + 8, hdr, hl);
  unsigned char *data = file + 8 + hl;
  memset(data, 0xEE, 28);
  const unsigned char b_bytes[8] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x20, 0xC0}; /* 1, -2.5 */
  const unsigned char a_bytes[8] = {0, 0, 0, 0, 0, 0, 0x10, 0x40};                  /* 4.0 */
  memcpy(data + 5, b_bytes, 8);
  memcpy(data + 20, a_bytes, 8);
  put_file(path, file, 8 + hl + 28);
  st_file *f = open_ok(path);
  assert_int_equal(st_count(f), 2);
  assert_string_equal(st_at(f, 0)->name, "b");
  assert_string_equal(st_at(f, 1)->name, "a");
  char err[ERRLEN];
  float out[2];
  assert_true(st_read_f32(f, find_ok(f, "b"), out, err, sizeof err));
  assert_true(out[0] == 1.0f && out[1] == -2.5f);
  assert_true(st_read_f32(f, find_ok(f, "a"), out, err, sizeof err));
  assert_true(out[0] == 4.0f);
  assert_int_equal(st_meta_count(f), 0);
  assert_null(st_meta(f, "format"));
  st_close(f);
  free(path);
  rm_dir(dir);
}

/* ---- metadata and names -------------------------------------------------- */

static void test_metadata(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "m.safetensors");
  static const char *kv[][2] = {
    {"format", "pt"},
    {"step", "1200"},
    {"empty", ""},
    {"", "empty key"},
    {"quote\"back\\slash", "line\nbreak\ttab\x01\x1f end"},
    {"\xC3\xBC" "ber", "\xE2\x9C\x93 \xF0\x9F\x98\x80"},
    {"json", "{\"lr\": 0.01, \"betas\": [0.9, 0.999]}"},
  };
  enum { N = sizeof kv / sizeof kv[0] };
  st_writer *w = st_writer_new();
  for (int i = N - 1; i >= 0; i--) st_writer_meta(w, kv[i][0], kv[i][1]);
  write_ok(w, path);
  st_writer_free(w);
  st_file *f = open_ok(path);
  assert_int_equal(st_count(f), 0);
  assert_int_equal(st_meta_count(f), N);
  for (int i = 0; i < N; i++) {
    const char *v = st_meta(f, kv[i][0]);
    if (!v) fail_msg("no metadata \"%s\"", kv[i][0]);
    assert_string_equal(v, kv[i][1]);
  }
  for (int i = 1; i < N; i++) assert_true(strcmp(st_meta_key(f, i - 1), st_meta_key(f, i)) < 0);
  assert_null(st_meta(f, "absent"));
  assert_null(st_meta_key(f, N));
  st_close(f);

  /* a file without metadata has no "__metadata__" at all */
  w = st_writer_new();
  write_ok(w, path);
  st_writer_free(w);
  size_t len;
  unsigned char *b = get_file(path, &len);
  assert_int_equal(len, 16);
  assert_memory_equal(b + 8, "{}      ", 8);
  free(b);
  free(path);
  rm_dir(dir);
}

static void test_odd_names(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "n.safetensors");
  const char *names[] = {
    "say \"hi\"",
    "gr\xC3\xB6\xC3\x9F\x65.\xE6\x9D\x83\xE9\x87\x8D",      /* größe.权重 */
    "back\\slash/and\nnewline",
    "emoji \xF0\x9F\xA7\xB5",
    "",
  };
  enum { N = sizeof names / sizeof names[0] };
  float v[N];
  st_writer *w = st_writer_new();
  for (int i = 0; i < N; i++) {
    v[i] = (float)i + 0.5f;
    st_writer_add(w, names[i], ST_F32, 0, NULL, &v[i]);
  }
  write_ok(w, path);
  st_writer_free(w);
  st_file *f = open_ok(path);
  assert_int_equal(st_count(f), N);
  char err[ERRLEN];
  for (int i = 0; i < N; i++) {
    float out;
    assert_true(st_read_f32(f, find_ok(f, names[i]), &out, err, sizeof err));
    assert_true(out == v[i]);
  }
  st_close(f);
  free(path);
  rm_dir(dir);
}

static void test_writer_rejects(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "r.safetensors");
  float x[4] = {0};
  char err[ERRLEN];
  struct { const char *name; st_dtype dt; int ndims; int64_t shape[9]; const void *data;
           const char *want; } bad[] = {
    {"neg", ST_F32, 2, {2, -2}, x, "tensor 'neg': dim 1 is negative"},
    {"nine", ST_F32, 9, {1, 1, 1, 1, 1, 1, 1, 1, 1}, x, "tensor 'nine': ndims"},
    {"minus", ST_F32, -1, {0}, x, "tensor 'minus': ndims"},
    {"bad\xFF", ST_F32, 0, {0}, x, "not valid UTF-8"},
    {"__metadata__", ST_F32, 0, {0}, x, "reserved"},
    {"nodata", ST_F32, 1, {4}, NULL, "tensor 'nodata': no data"},
    {"dtype", (st_dtype)ST_DTYPE_COUNT, 1, {1}, x, "tensor 'dtype': unknown dtype"},
    {"big", ST_F64, 3, {1 << 30, 1 << 30, 1 << 30}, x, "tensor 'big': too many elements"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st_writer *w = st_writer_new();
    st_writer_add(w, "fine", ST_F32, 1, (int64_t[]){4}, x);
    st_writer_add(w, bad[i].name, bad[i].dt, bad[i].ndims, bad[i].shape, bad[i].data);
    assert_false(st_write(w, path, err, sizeof err));
    expect_has(err, path);
    expect_has(err, bad[i].want);
    st_writer_free(w);
    assert_int_equal(count_entries(dir), 0);
  }
  st_writer *w = st_writer_new();
  st_writer_add(w, "twice", ST_F32, 1, (int64_t[]){4}, x);
  st_writer_add(w, "twice", ST_F32, 1, (int64_t[]){2}, x);
  assert_false(st_write(w, path, err, sizeof err));
  expect_has(err, "tensor 'twice': added twice");
  st_writer_free(w);
  w = st_writer_new();
  st_writer_meta(w, "k", "\xC3");
  assert_false(st_write(w, path, err, sizeof err));
  expect_has(err, "metadata \"k\": not valid UTF-8");
  st_writer_free(w);
  assert_int_equal(count_entries(dir), 0);
  free(path);
  rm_dir(dir);
}

/* ---- atomic saves -------------------------------------------------------- */

enum { BIG = 1 << 18 };     /* floats in the "new" checkpoint: 1 MiB */

/* The older checkpoint: one small tensor and its metadata. */
static void write_old(const char *path) {
  float old[3] = {1, 2, 3};
  st_writer *w = st_writer_new();
  st_writer_add(w, "w", ST_F32, 1, (int64_t[]){3}, old);
  st_writer_meta(w, "step", "100");
  write_ok(w, path);
  st_writer_free(w);
}

static void expect_old(const char *path) {
  st_file *f = open_ok(path);
  assert_int_equal(st_count(f), 1);
  assert_string_equal(st_meta(f, "step"), "100");
  float out[3];
  char err[ERRLEN];
  assert_true(st_read_f32(f, find_ok(f, "w"), out, err, sizeof err));
  assert_true(out[0] == 1 && out[1] == 2 && out[2] == 3);
  st_close(f);
}

static st_writer *new_writer(float *big) {
  for (int i = 0; i < BIG; i++) big[i] = (float)i;
  st_writer *w = st_writer_new();
  st_writer_add(w, "w", ST_F32, 1, (int64_t[]){BIG}, big);
  st_writer_add(w, "m", ST_F32, 2, (int64_t[]){BIG / 2, 2}, big);
  st_writer_meta(w, "step", "200");
  return w;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The hook pauses the save, and the save completes after it. */
static void test_pause_hook(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "p.safetensors");
  float *big = malloc(BIG * sizeof *big);
  assert_non_null(big);
  st_writer *w = new_writer(big);
  setenv("WEFT_TEST_SAVE_PAUSE", "150", 1);
  double t0 = now_ms();
  write_ok(w, path);
  double took = now_ms() - t0;
  unsetenv("WEFT_TEST_SAVE_PAUSE");
  assert_true(took >= 150);
  st_file *f = open_ok(path);
  assert_string_equal(st_meta(f, "step"), "200");
  assert_memory_equal(st_data(f, find_ok(f, "w")), big, BIG * sizeof *big);
  st_close(f);
  assert_int_equal(count_entries(dir), 1);
  st_writer_free(w);
  free(big);
  free(path);
  rm_dir(dir);
}

static void test_kill_during_save(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "ckpt.safetensors");
  char *ref = join(dir, "ref.safetensors");
  float *big = malloc(BIG * sizeof *big);
  assert_non_null(big);
  st_writer *w = new_writer(big);
  write_ok(w, ref);                        /* the complete new file, for its size */
  size_t ref_len;
  free(get_file(ref, &ref_len));
  unlink(ref);
  write_old(path);
  size_t old_len;
  unsigned char *old_bytes = get_file(path, &old_len);

  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("WEFT_TEST_SAVE_PAUSE", "2000", 1);
    char err[ERRLEN];
    _exit(st_write(w, path, err, sizeof err) ? 0 : 1);
  }
  usleep(200 * 1000);
  assert_int_equal(kill(pid, SIGKILL), 0);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  /* the path holds the old file, byte for byte */
  size_t len;
  unsigned char *now = get_file(path, &len);
  assert_int_equal(len, old_len);
  assert_memory_equal(now, old_bytes, len);
  free(now);
  expect_old(path);

  /* and beside it the killed save's temporary, half written */
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  int temps = 0;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
        strcmp(e->d_name, "ckpt.safetensors") == 0)
      continue;
    size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, ".ckpt.safetensors.", 18) != 0 || n < 4 ||
        strcmp(e->d_name + n - 4, ".tmp") != 0)
      fail_msg("unexpected file %s", e->d_name);
    char *tmp = join(dir, e->d_name);
    struct stat sb;
    assert_int_equal(stat(tmp, &sb), 0);
    uint64_t data = 2 * (uint64_t)BIG * sizeof(float);
    assert_int_equal((uint64_t)sb.st_size, ref_len - data + data / 2);
    char err[ERRLEN];
    assert_null(st_open(tmp, err, sizeof err));    /* not a valid file */
    unlink(tmp);
    free(tmp);
    temps++;
  }
  closedir(d);
  assert_int_equal(temps, 1);

  /* a save that is not killed replaces the file */
  write_ok(w, path);
  st_file *f = open_ok(path);
  assert_string_equal(st_meta(f, "step"), "200");
  st_close(f);
  assert_int_equal(count_entries(dir), 1);
  st_writer_free(w);
  free(old_bytes);
  free(big);
  free(ref);
  free(path);
  rm_dir(dir);
}

/* A file open for reading keeps its contents when a save replaces it. */
static void test_open_file_survives_save(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "o.safetensors");
  write_old(path);
  st_file *f = open_ok(path);
  float *big = malloc(BIG * sizeof *big);
  assert_non_null(big);
  st_writer *w = new_writer(big);
  write_ok(w, path);
  st_writer_free(w);
  free(big);
  float out[3];
  char err[ERRLEN];
  assert_true(st_read_f32(f, find_ok(f, "w"), out, err, sizeof err));
  assert_true(out[0] == 1 && out[1] == 2 && out[2] == 3);
  st_close(f);
  f = open_ok(path);
  assert_string_equal(st_meta(f, "step"), "200");
  st_close(f);
  free(path);
  rm_dir(dir);
}

static void test_failed_save_leaves_target(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "t.safetensors");
  char err[ERRLEN];
  float x[2] = {5, 6};
  st_writer *w = st_writer_new();
  st_writer_add(w, "w", ST_F32, 1, (int64_t[]){2}, x);

  /* a directory that does not exist */
  char *nodir = join(dir, "no/such/dir/t.safetensors");
  assert_false(st_write(w, nodir, err, sizeof err));
  expect_has(err, nodir);
  expect_has(err, "its directory");
  expect_has(err, "No such file or directory");
  free(nodir);
  assert_int_equal(count_entries(dir), 0);

  /* the target is a directory: refused before a temporary is made */
  char *sub = join(dir, "sub");
  assert_int_equal(mkdir(sub, 0755), 0);
  assert_false(st_write(w, sub, err, sizeof err));
  expect_has(err, "a directory, not a regular file");
  assert_int_equal(count_entries(dir), 1);
  struct stat sb;
  assert_int_equal(stat(sub, &sb), 0);
  assert_true(S_ISDIR(sb.st_mode));
  rmdir(sub);
  free(sub);

  /* a write that fails midway (the file size limit) */
  write_old(path);
  size_t old_len;
  unsigned char *old_bytes = get_file(path, &old_len);
  float *big = malloc(BIG * sizeof *big);
  assert_non_null(big);
  st_writer *bw = new_writer(big);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = { 64 * 1024, 64 * 1024 };
    setrlimit(RLIMIT_FSIZE, &rl);
    char cerr[ERRLEN];
    bool ok = st_write(bw, path, cerr, sizeof cerr);
    _exit(ok ? 1 : strstr(cerr, "cannot write the temporary file") ? 0 : 2);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  size_t len;
  unsigned char *now = get_file(path, &len);
  assert_int_equal(len, old_len);
  assert_memory_equal(now, old_bytes, len);
  free(now);
  assert_int_equal(count_entries(dir), 1);
  st_writer_free(bw);
  free(big);

  /* a directory without write permission (root may write anyway) */
  if (geteuid() != 0) {
    assert_int_equal(chmod(dir, 0555), 0);
    assert_false(st_write(w, path, err, sizeof err));
    expect_has(err, "cannot write in its directory");
    assert_int_equal(chmod(dir, 0755), 0);
    now = get_file(path, &len);
    assert_int_equal(len, old_len);
    assert_memory_equal(now, old_bytes, len);
    free(now);
    assert_int_equal(count_entries(dir), 1);
  }
  expect_old(path);
  free(old_bytes);
  st_writer_free(w);
  free(path);
  rm_dir(dir);
}

/* Targets that are not files are refused and left as they are; a link to
 * a regular file is written through; a killed save's temporary goes with
 * the next save to the same name. */
static void test_save_targets(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "t.safetensors");
  char err[ERRLEN];
  float x[2] = {5, 6};
  st_writer *w = st_writer_new();
  st_writer_add(w, "w", ST_F32, 1, (int64_t[]){2}, x);

  char *fifo = join(dir, "fifo");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_false(st_write(w, fifo, err, sizeof err));
  expect_has(err, "a FIFO, not a regular file");
  struct stat sb;
  assert_int_equal(lstat(fifo, &sb), 0);
  assert_true(S_ISFIFO(sb.st_mode));
  assert_null(st_open(fifo, err, sizeof err));      /* and not read: no blocking open */
  expect_has(err, "a FIFO, not a regular file");

  assert_false(st_write(w, "/dev/null", err, sizeof err));
  expect_has(err, "a character device, not a regular file");
  assert_int_equal(stat("/dev/null", &sb), 0);
  assert_true(S_ISCHR(sb.st_mode));

  char *dlink = join(dir, "dlink");
  assert_int_equal(symlink("/dev/null", dlink), 0);
  assert_false(st_write(w, dlink, err, sizeof err));
  expect_has(err, "a symbolic link to a character device");

  /* a link to a regular file: the file is replaced, the link stays */
  write_old(path);
  char *flink = join(dir, "flink");
  assert_int_equal(symlink("t.safetensors", flink), 0);
  write_ok(w, flink);
  assert_int_equal(lstat(flink, &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  st_file *f = open_ok(path);
  assert_non_null(st_find(f, "w"));
  assert_null(st_meta(f, "step"));
  st_close(f);

  /* a temporary of a process that is gone is removed by the next save;
   * one of a live process (this one's parent) is kept */
  char *stale = join(dir, ".t.safetensors.999999999.1.tmp");
  char live_name[64];
  snprintf(live_name, sizeof live_name, ".t.safetensors.%ld.2.tmp", (long)getppid());
  char *live = join(dir, live_name);
  put_file(stale, "x", 1);
  put_file(live, "y", 1);
  write_ok(w, path);
  assert_int_equal(access(stale, F_OK), -1);
  assert_int_equal(access(live, F_OK), 0);
  unlink(live);
  unlink(flink), unlink(dlink), unlink(fifo);
  free(stale), free(live), free(flink), free(dlink), free(fifo);
  st_writer_free(w);
  free(path);
  rm_dir(dir);
}

/* ---- the index of a sharded checkpoint ------------------------------------- */

static void test_shard_names(void **state) {
  (void)state;
  int r = 0, n = 0;
  assert_true(st_shard_name_ok("model-00002-of-00004.safetensors", &r, &n));
  assert_int_equal(r, 2);
  assert_int_equal(n, 4);
  const char *bad[] = {"model-00005-of-00004.safetensors", "model-00000-of-00004.safetensors",
                       "model-0002-of-00004.safetensors",  "model- 0002-of-00004.safetensors",
                       "model-+0002-of-00004.safetensors", "model-00002-of-00004.safetensorsx",
                       "../model-00001-of-00001.safetensors", "model-00001-of-00001.safetensor", ""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_false(st_shard_name_ok(bad[i], NULL, NULL));
}

static void test_index_round_trip(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "model.safetensors.index.json"), err[ERRLEN];
  const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  st_piece pw[2] = {{0, "w[0:2, 0:1]", {0, 0}, {2, 1}}, {1, "w[0:2, 1:2]", {0, 1}, {2, 2}}};
  st_piece pb[1] = {{1, "b \"q\"", {0}, {3}}};
  st_itensor ts[2] = {{"w", 2, {2, 2}, 2, pw}, {"b \"q\"", 1, {3}, 1, pb}};
  const char *keys[] = {"format", "step"}, *vals[] = {"weft-checkpoint", "12"};
  st_index ix = {2, keys, vals, 28, 2, files, 2, ts, NULL};
  assert_true(st_index_write(&ix, path, err, sizeof err));
  st_index *r = st_index_read(path, err, sizeof err);
  assert_non_null(r);
  assert_int_equal(r->total_size, 28);
  assert_string_equal(st_index_meta(r, "step"), "12");
  assert_null(st_index_meta(r, "seed"));
  assert_int_equal(r->nfiles, 2);
  assert_int_equal(r->ntensors, 2);
  assert_string_equal(r->tensors[1].name, "b \"q\"");
  assert_int_equal(r->tensors[0].npieces, 2);
  const st_piece *q = &r->tensors[0].pieces[1];
  assert_string_equal(r->files[q->file], files[1]);
  assert_string_equal(q->entry, "w[0:2, 1:2]");
  assert_int_equal(q->start[1], 1);
  assert_int_equal(q->stop[0], 2);
  st_index_free(r);
  unlink(path);
  free(path);
  rm_dir(dir);
}

static void test_index_rejects(void **state) {
  (void)state;
  char *dir = make_dir(), *path = join(dir, "i.json"), err[ERRLEN];
  const char *head = "{\"metadata\": {\"step\": \"1\"}, \"weight_map\": {\"w\": \"model-00001-of-00001.safetensors\"}, ";
  struct { const char *tensors, *says; } cases[] = {
      {"\"tensors\": {\"w\": {\"shape\": [2], \"pieces\": [{\"file\": \"model-00001-of-00001.safetensors\", "
       "\"entry\": \"w\", \"start\": [0], \"stop\": [3]}]}}}",
       "tensors.w.pieces[0]: dim 0: [0, 3) does not lie in the shape's [0, 2)"},
      {"\"tensors\": {\"w\": {\"shape\": [2], \"pieces\": [{\"file\": \"/etc/passwd\", "
       "\"entry\": \"w\", \"start\": [0], \"stop\": [2]}]}}}",
       "is not a shard's name"},
      {"\"tensors\": {\"w\": {\"shape\": [2], \"pieces\": []}}}", "tensors.w: pieces is not an array of pieces"},
      {"\"tensors\": {\"w\": {\"shape\": [-2], \"pieces\": []}}}", "shape is not an array of at most 8 counts"},
      {"\"tensors\": {\"w\": {\"shape\": [2], \"pieces\": [{\"file\": \"model-00001-of-00001.safetensors\", "
       "\"entry\": \"w\", \"start\": [0, 0], \"stop\": [2, 2]}]}}}",
       "start and stop are not arrays of 1 counts"},
      {"\"tensors\": {\"v\": {\"shape\": [2], \"pieces\": [{\"file\": \"model-00001-of-00001.safetensors\", "
       "\"entry\": \"v\", \"start\": [0], \"stop\": [2]}]}}}",
       "weight_map: \"w\" is not mapped to a file that holds a piece of it"},
      {"\"tensors\": {}, \"extra\": 1}", "the index: unknown member \"extra\""},
      {"\"tensors\": {}, \"tensors\": {}}", "duplicate key \"tensors\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s", head, cases[i].tensors);
    put_file(path, text, strlen(text));
    assert_null(st_index_read(path, err, sizeof err));
    if (!strstr(err, cases[i].says)) fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, cases[i].says);
  }
  unlink(path);
  free(path);
  rm_dir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_round_trip),
    cmocka_unit_test(test_exact_bytes),
    cmocka_unit_test(test_same_content_same_bytes),
    cmocka_unit_test(test_half_conversions),
    cmocka_unit_test(test_int_conversions),
    cmocka_unit_test(test_short_and_long_headers),
    cmocka_unit_test(test_bad_entries),
    cmocka_unit_test(test_strict_json),
    cmocka_unit_test(test_foreign_layout),
    cmocka_unit_test(test_metadata),
    cmocka_unit_test(test_odd_names),
    cmocka_unit_test(test_writer_rejects),
    cmocka_unit_test(test_pause_hook),
    cmocka_unit_test(test_kill_during_save),
    cmocka_unit_test(test_open_file_survives_save),
    cmocka_unit_test(test_failed_save_leaves_target),
    cmocka_unit_test(test_save_targets),
    cmocka_unit_test(test_shard_names),
    cmocka_unit_test(test_index_round_trip),
    cmocka_unit_test(test_index_rejects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
