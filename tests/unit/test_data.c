/* test_data.c - the run layer's training data and learning-rate schedules
 * (src/report/data.h, schedule.h): token files in every format, sequences
 * and their labels, the seeded order, the refusals; the schedule's values
 * against its formula. */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "report/data.h"
#include "report/schedule.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/weft-test-data-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static const char *path_of(const char *name) {
  static char p[4][128];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
  return p[k];
}

static void put_le(unsigned char *b, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; i++) b[i] = (unsigned char)(v >> (8 * i));
}

/* Tokens 0..n-1 (mod m) in a file: raw, or under an llm.c header with magic. */
static void write_tokens(const char *name, int64_t n, int64_t first, int bytes, uint32_t magic, int64_t count) {
  FILE *f = fopen(path_of(name), "wb");
  assert_non_null(f);
  if (magic) {
    unsigned char h[1024] = {0};
    put_le(h, magic, 4);
    put_le(h + 4, magic == 20240520 ? 1 : 7, 4);
    put_le(h + 8, (uint32_t)count, 4);
    fwrite(h, 1, sizeof h, f);
  }
  for (int64_t i = 0; i < n; i++) {
    unsigned char b[4];
    put_le(b, (uint32_t)(first + i), bytes);
    fwrite(b, 1, (size_t)bytes, f);
  }
  fclose(f);
}

/* Every format: sequence k holds tokens k*seq .. k*seq + seq - 1 and its
 * labels the next ones; a remainder too short for a sequence is left. */
static void test_formats(void **state) {
  (void)state;
  char err[512];
  struct {
    const char *name;
    int bytes;
    uint32_t magic;
    int raw_bytes;
  } cases[] = {
      {"raw16.bin", 2, 0, 2}, {"raw32.bin", 4, 0, 4}, {"llmc16.bin", 2, 20240520, 4}, {"llmc32.bin", 4, 20240801, 2}};
  for (int c = 0; c < 4; c++) {
    write_tokens(cases[c].name, 45, 100, cases[c].bytes, cases[c].magic, 45);
    token_data *d = data_open(path_of(cases[c].name), 4, cases[c].raw_bytes, err, sizeof err);
    if (!d) fail_msg("%s", err);
    assert_int_equal(data_tokens(d), 45);
    assert_int_equal(data_sequences(d), 11);  /* (45 - 1) / 4 */
    int32_t tok[3 * 4], lab[3 * 4];
    assert_true(data_batch(d, 2, 3, false, 0, 1000, tok, lab, err, sizeof err));
    for (int b = 0; b < 3; b++)
      for (int t = 0; t < 4; t++) {
        assert_int_equal(tok[b * 4 + t], 100 + (2 + b) * 4 + t);
        assert_int_equal(lab[b * 4 + t], 100 + (2 + b) * 4 + t + 1);
      }
    /* position 11 is sequence 0 of the second epoch */
    assert_true(data_batch(d, 11, 1, false, 0, 1000, tok, lab, err, sizeof err));
    assert_int_equal(tok[0], 100);
    static const char *const formats[] = {"raw uint16", "raw uint32", "llm.c uint16", "llm.c uint32"};
    assert_string_equal(data_format(d), formats[c]);
    data_close(d);
  }
}

/* Shards in name order, numbered file after file; a file too short for a
 * sequence holds none. */
static void test_shards(void **state) {
  (void)state;
  char err[512];
  write_tokens("shard_a.bin", 9, 0, 2, 0, 0);     /* 2 sequences of 4 */
  write_tokens("shard_b.bin", 3, 500, 2, 0, 0);   /* none */
  write_tokens("shard_c.bin", 13, 1000, 2, 0, 0); /* 3 */
  char pat[128];
  snprintf(pat, sizeof pat, "%s/shard_*.bin", dir);
  token_data *d = data_open(pat, 4, 2, err, sizeof err);
  if (!d) fail_msg("%s", err);
  assert_int_equal(data_file_count(d), 3);
  assert_int_equal(data_sequences(d), 5);
  int32_t tok[5 * 4], lab[5 * 4];
  assert_true(data_batch(d, 0, 5, false, 0, 2000, tok, lab, err, sizeof err));
  int firsts[5] = {0, 4, 1000, 1004, 1008};
  for (int b = 0; b < 5; b++) {
    assert_int_equal(tok[b * 4], firsts[b]);
    assert_int_equal(lab[b * 4 + 3], firsts[b] + 4);
  }
  data_close(d);
}

/* The shuffled order: each epoch a permutation of all sequences, another
 * one each epoch and for another seed, the same for the same seed. */
static void test_order(void **state) {
  (void)state;
  char err[512];
  write_tokens("order.bin", 1001, 0, 2, 0, 0);
  token_data *d = data_open(path_of("order.bin"), 10, 2, err, sizeof err), *e = data_open(path_of("order.bin"), 10, 2, err, sizeof err);
  assert_non_null(d);
  int64_t n = data_sequences(d);
  assert_int_equal(n, 100);
  int64_t a[300], b[100];
  for (int64_t i = 0; i < 3 * n; i++) a[i] = data_order(d, i, true, 7);
  for (int ep = 0; ep < 3; ep++) {
    int seen[100] = {0};
    for (int64_t i = 0; i < n; i++) {
      assert_true(a[ep * n + i] >= 0 && a[ep * n + i] < n);
      seen[a[ep * n + i]]++;
    }
    for (int64_t i = 0; i < n; i++) assert_int_equal(seen[i], 1);
  }
  int same01 = 0, fixed = 0, same_seed = 0;
  for (int64_t i = 0; i < n; i++) same01 += a[i] == a[n + i], fixed += a[i] == i;
  assert_true(same01 < 10 && fixed < 10);
  /* read back out of order, from another handle: the same */
  for (int64_t i = n - 1; i >= 0; i--) assert_int_equal(data_order(e, 2 * n + i, true, 7), a[2 * n + i]);
  for (int64_t i = 0; i < n; i++) b[i] = data_order(e, i, true, 8), same_seed += b[i] == a[i];
  assert_true(same_seed < 10);
  for (int64_t i = 0; i < n; i++) assert_int_equal(data_order(d, i, false, 7), i);
  /* a batch follows the order */
  int32_t tok[2 * 10], lab[2 * 10];
  assert_true(data_batch(d, n + 5, 2, true, 7, 2000, tok, lab, err, sizeof err));
  assert_int_equal(tok[0], a[n + 5] * 10);
  assert_int_equal(tok[10], a[n + 6] * 10);
  data_close(d);
  data_close(e);
}

static void expect_refused(const char *pattern, int64_t seq, int raw, const char *want) {
  char err[512] = "";
  token_data *d = data_open(pattern, seq, raw, err, sizeof err);
  assert_null(d);
  if (!strstr(err, want)) fail_msg("expected '%s' in '%s'", want, err);
}

static void test_refused(void **state) {
  (void)state;
  char err[512];
  FILE *f = fopen(path_of("odd.bin"), "wb");
  fputs("abc", f);
  fclose(f);
  expect_refused(path_of("odd.bin"), 4, 2, "3 bytes are not a whole number of uint16 tokens (no llm.c header)");
  write_tokens("short_header.bin", 10, 0, 2, 20240520, 11);
  expect_refused(path_of("short_header.bin"), 4, 2, "its llm.c header says 11 tokens of 2 bytes, but 20 bytes follow the header");
  write_tokens("tiny.bin", 4, 0, 2, 0, 0);
  expect_refused(path_of("tiny.bin"), 4, 2, "4 tokens hold no sequence of 4 tokens and the next one");
  expect_refused(dir, 4, 2, "not a regular file");
  expect_refused(path_of("none.bin"), 4, 2, "No such file or directory");
  char pat[128];
  snprintf(pat, sizeof pat, "%s/none*.bin", dir);
  expect_refused(pat, 4, 2, "no file matches");
  /* a token at or above the vocabulary is refused where it is */
  write_tokens("big.bin", 9, 60, 2, 0, 0);
  token_data *d = data_open(path_of("big.bin"), 4, 2, err, sizeof err);
  assert_non_null(d);
  int32_t tok[4], lab[4];
  assert_true(data_batch(d, 0, 1, false, 0, 65, tok, lab, err, sizeof err));
  assert_false(data_batch(d, 1, 1, false, 0, 65, tok, lab, err, sizeof err));
  assert_non_null(strstr(err, "big.bin: token 5 is 65; ids must lie below the model's vocabulary, 65"));
  data_close(d);
}

/* Each schedule's values against its formula written out here. */
static void test_schedule(void **state) {
  (void)state;
  lr_schedule s = {LR_COSINE, 1e-3, 1e-4, 10, 110};
  for (int64_t k = 0; k < 10; k++) assert_true(fabs(lr_at(&s, k) - 1e-3 * (k + 1) / 10) < 1e-18);
  assert_true(lr_at(&s, 10) == 1e-3);                                  /* the peak, after the warmup */
  assert_true(fabs(lr_at(&s, 60) - 5.5e-4) < 1e-15);                   /* halfway: the mean */
  assert_true(fabs(lr_at(&s, 35) - (1e-4 + 9e-4 * (1 + cos(M_PI / 4)) / 2)) < 1e-15);
  assert_true(lr_at(&s, 110) == 1e-4 && lr_at(&s, 1000) == 1e-4);      /* the floor, and after */
  s.kind = LR_LINEAR;
  assert_true(fabs(lr_at(&s, 35) - (1e-3 - 9e-4 * 0.25)) < 1e-15);
  assert_true(fabs(lr_at(&s, 109) - (1e-3 - 9e-4 * 0.99)) < 1e-15);
  assert_true(lr_at(&s, 200) == 1e-4);
  s.kind = LR_CONSTANT;
  assert_true(lr_at(&s, 0) == 1e-4 && lr_at(&s, 50) == 1e-3 && lr_at(&s, 5000) == 1e-3);
  /* no warmup: the first step has the peak; a decay over 0 steps is the floor */
  lr_schedule c = {LR_COSINE, 2e-3, 0, 0, 4};
  assert_true(lr_at(&c, 0) == 2e-3 && fabs(lr_at(&c, 2) - 1e-3) < 1e-18);
  lr_schedule z = {LR_COSINE, 2e-3, 1e-5, 3, 2};
  assert_true(fabs(lr_at(&z, 2) - 2e-3) < 1e-18 && lr_at(&z, 3) == 1e-5);
  lr_kind k;
  assert_true(lr_kind_parse("linear", &k) && k == LR_LINEAR);
  assert_false(lr_kind_parse("step", &k));
  assert_string_equal(lr_kind_name(LR_COSINE), "cosine");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_formats), cmocka_unit_test(test_shards), cmocka_unit_test(test_order),
      cmocka_unit_test(test_refused), cmocka_unit_test(test_schedule),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
