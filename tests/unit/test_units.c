/* test_units.c - unit words, dimension arithmetic, names and the printing of
 * quantities (src/base/units.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "weft/units.h"

static unit_dim dim(int byte, int sec, int flop) {
  return (unit_dim){(signed char)byte, (signed char)sec, (signed char)flop};
}

/* Relative comparison: unit scales such as 1e-6 are not exact in binary. */
static void assert_close(double got, double want) {
  double tol = 1e-12 * fabs(want);
  if (fabs(got - want) > tol) fail_msg("got %.17g, want %.17g", got, want);
}

static void expect_unit(const char *word, double scale, unit_dim d) {
  double s = -1;
  unit_dim got = {99, 99, 99};
  if (!unit_lookup(word, &s, &got)) fail_msg("unit '%s' not recognised", word);
  assert_close(s, scale);
  if (!unit_eq(got, d))
    fail_msg("unit '%s': dim {%d,%d,%d}, want {%d,%d,%d}", word, got.byte, got.sec,
             got.flop, d.byte, d.sec, d.flop);
}

static void test_lookup_bytes(void **state) {
  (void)state;
  expect_unit("B", 1, UNIT_BYTES);
  expect_unit("KB", 1e3, UNIT_BYTES);
  expect_unit("MB", 1e6, UNIT_BYTES);
  expect_unit("GB", 1e9, UNIT_BYTES);
  expect_unit("TB", 1e12, UNIT_BYTES);
  expect_unit("PB", 1e15, UNIT_BYTES);
  expect_unit("KiB", 1024, UNIT_BYTES);
  expect_unit("MiB", 1048576, UNIT_BYTES);
  expect_unit("GiB", 1073741824, UNIT_BYTES);
  expect_unit("TiB", 1099511627776.0, UNIT_BYTES);
  expect_unit("PiB", 1125899906842624.0, UNIT_BYTES);
  double s;
  unit_dim d;
  assert_true(unit_lookup("GiB", &s, &d));
  assert_true(s == 1073741824.0);   /* exact, not merely close */
}

static void test_lookup_bits(void **state) {
  (void)state;
  expect_unit("bit", 0.125, UNIT_BYTES);
  expect_unit("Kb", 125, UNIT_BYTES);
  expect_unit("Mb", 125e3, UNIT_BYTES);
  expect_unit("Gb", 125e6, UNIT_BYTES);
  expect_unit("Tb", 125e9, UNIT_BYTES);
  expect_unit("bit/s", 0.125, UNIT_BYTES_PER_S);
  expect_unit("Gb/s", 1.25e8, UNIT_BYTES_PER_S);
  /* 25 Gb/s is 3.125 GB/s */
  double s;
  unit_dim d;
  assert_true(unit_lookup("Gb/s", &s, &d));
  assert_true(25 * s == 3.125e9);
}

static void test_lookup_time_and_work(void **state) {
  (void)state;
  expect_unit("s", 1, UNIT_SECONDS);
  expect_unit("ms", 1e-3, UNIT_SECONDS);
  expect_unit("us", 1e-6, UNIT_SECONDS);
  expect_unit("ns", 1e-9, UNIT_SECONDS);
  expect_unit("FLOP", 1, UNIT_FLOPS);
  expect_unit("KFLOP", 1e3, UNIT_FLOPS);
  expect_unit("MFLOP", 1e6, UNIT_FLOPS);
  expect_unit("GFLOP", 1e9, UNIT_FLOPS);
  expect_unit("TFLOP", 1e12, UNIT_FLOPS);
  expect_unit("PFLOP", 1e15, UNIT_FLOPS);
}

static void test_lookup_rates(void **state) {
  (void)state;
  expect_unit("B/s", 1, UNIT_BYTES_PER_S);
  expect_unit("GB/s", 1e9, UNIT_BYTES_PER_S);
  expect_unit("TB/s", 1e12, UNIT_BYTES_PER_S);
  expect_unit("GiB/s", 1073741824, UNIT_BYTES_PER_S);
  expect_unit("FLOP/s", 1, UNIT_FLOPS_PER_S);
  expect_unit("TFLOP/s", 1e12, UNIT_FLOPS_PER_S);
  expect_unit("PFLOP/s", 1e15, UNIT_FLOPS_PER_S);
  expect_unit("ms/s", 1e-3, UNIT_NONE);   /* any unit may take /s */
}

static void test_lookup_rejects(void **state) {
  (void)state;
  const char *bad[] = {"sx", "gib", "GB/ms", "", "/s", "GB/", "GB/s/s", "Gib",
                       "kb", "KiBs", "b", "bits", "Pb", "flop", "GB /s", "mss",
                       "EB", "min", "h", "us/", "s/s/s"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    double s = 42;
    unit_dim d = {7, 7, 7};
    if (unit_lookup(bad[i], &s, &d)) fail_msg("'%s' accepted", bad[i]);
    assert_true(s == 42);                 /* untouched on failure */
    assert_true(unit_eq(d, dim(7, 7, 7)));
  }
  double s;
  unit_dim d;
  assert_false(unit_lookup(NULL, &s, &d));
}

static void test_dim_arithmetic(void **state) {
  (void)state;
  /* 80 GiB / (2 TB/s) is a time */
  assert_true(unit_eq(unit_div(UNIT_BYTES, UNIT_BYTES_PER_S), UNIT_SECONDS));
  /* rate * time is bytes */
  assert_true(unit_eq(unit_mul(UNIT_BYTES_PER_S, UNIT_SECONDS), UNIT_BYTES));
  /* FLOPs / (FLOP/s) */
  assert_true(unit_eq(unit_div(UNIT_FLOPS, UNIT_FLOPS_PER_S), UNIT_SECONDS));
  assert_true(unit_is_none(unit_div(UNIT_BYTES, UNIT_BYTES)));
  assert_false(unit_is_none(UNIT_SECONDS));
  assert_true(unit_is_none(UNIT_NONE));
  assert_true(unit_eq(unit_mul(UNIT_BYTES, UNIT_BYTES), dim(2, 0, 0)));
  assert_false(unit_eq(UNIT_BYTES, UNIT_FLOPS));
  assert_false(unit_eq(UNIT_BYTES_PER_S, UNIT_BYTES));

  unit_dim out = UNIT_NONE;
  assert_true(unit_mul_checked(UNIT_FLOPS, UNIT_BYTES_PER_S, &out));
  assert_true(unit_eq(out, dim(1, -1, 1)));
  assert_true(unit_div_checked(UNIT_NONE, UNIT_SECONDS, &out));
  assert_true(unit_eq(out, dim(0, -1, 0)));

  assert_true(unit_pow_checked(dim(2, -4, 0), 1, 2, &out));   /* sqrt */
  assert_true(unit_eq(out, dim(1, -2, 0)));
  assert_true(unit_pow_checked(UNIT_BYTES, 3, 1, &out));
  assert_true(unit_eq(out, dim(3, 0, 0)));
  assert_true(unit_pow_checked(UNIT_SECONDS, -1, 1, &out));
  assert_true(unit_eq(out, dim(0, -1, 0)));
  out = dim(5, 5, 5);
  assert_false(unit_pow_checked(UNIT_BYTES, 1, 2, &out));     /* sqrt(B) */
  assert_true(unit_eq(out, dim(5, 5, 5)));
  assert_false(unit_pow_checked(UNIT_BYTES, 1, 0, &out));
  assert_true(unit_in_range(dim(8, -8, 8)));
  assert_false(unit_in_range(dim(9, 0, 0)));
  assert_false(unit_in_range(dim(0, 0, -9)));
}

static void test_exponent_overflow(void **state) {
  (void)state;
  unit_dim out = dim(1, 2, 3);
  unit_dim b8 = dim(8, 0, 0);
  /* up to the limit is fine */
  assert_true(unit_mul_checked(dim(4, 0, 0), dim(4, 0, 0), &out));
  assert_true(unit_eq(out, b8));
  assert_true(unit_div_checked(dim(0, -4, 0), dim(0, 4, 0), &out));
  assert_true(unit_eq(out, dim(0, -8, 0)));
  /* one past it fails and leaves *out alone */
  out = dim(1, 2, 3);
  assert_false(unit_mul_checked(b8, UNIT_BYTES, &out));
  assert_true(unit_eq(out, dim(1, 2, 3)));
  assert_false(unit_div_checked(dim(0, -8, 0), UNIT_SECONDS, &out));
  assert_false(unit_mul_checked(dim(0, 0, -5), dim(0, 0, -5), &out));
  assert_false(unit_div_checked(UNIT_NONE, dim(0, 0, -9), &out));
  assert_false(unit_pow_checked(dim(3, 0, 0), 3, 1, &out));   /* B^9 */
  assert_false(unit_pow_checked(UNIT_BYTES, 1000000, 1, &out));
  assert_false(unit_pow_checked(dim(127, 0, 0), 1 << 30, 1, &out));
  assert_true(unit_eq(out, dim(1, 2, 3)));
  /* repeated squaring stops at the limit, never wraps around */
  unit_dim d = UNIT_BYTES;
  int steps = 0;
  while (unit_mul_checked(d, d, &d)) steps++;
  assert_int_equal(steps, 3);   /* B^2, B^4, B^8, then B^16 fails */
  assert_true(unit_eq(d, b8));
}

static void expect_name(unit_dim d, const char *want) {
  char buf[64];
  const char *got = unit_dim_name(d, buf, sizeof buf);
  assert_ptr_equal(got, buf);
  assert_string_equal(got, want);
}

static void test_dim_names(void **state) {
  (void)state;
  expect_name(UNIT_NONE, "number");
  expect_name(UNIT_BYTES, "bytes");
  expect_name(UNIT_SECONDS, "seconds");
  expect_name(UNIT_FLOPS, "FLOPs");
  expect_name(UNIT_BYTES_PER_S, "bytes/s");
  expect_name(UNIT_FLOPS_PER_S, "FLOP/s");
  expect_name(dim(0, -1, 0), "1/s");
  expect_name(dim(2, -1, 0), "B^2/s");
  expect_name(dim(2, 0, 0), "B^2");
  expect_name(dim(0, 2, 0), "s^2");
  expect_name(dim(1, 1, 0), "B*s");
  expect_name(dim(1, -2, 0), "B/s^2");
  expect_name(dim(-1, 0, 1), "FLOP/B");
  expect_name(dim(1, 0, -1), "B/FLOP");
  expect_name(dim(1, -1, 1), "B*FLOP/s");
  expect_name(dim(1, -1, -1), "B/(FLOP*s)");
  expect_name(dim(-1, -1, 0), "1/(B*s)");
  expect_name(dim(-8, 8, -8), "s^8/(B^8*FLOP^8)");

  /* a short buffer is cut, never overrun, and stays terminated */
  char small[4];
  memset(small, 'x', sizeof small);
  unit_dim_name(dim(2, -1, 1), small, sizeof small);
  assert_string_equal(small, "B^2");
  memset(small, 'x', sizeof small);
  unit_dim_name(UNIT_SECONDS, small, sizeof small);
  assert_string_equal(small, "sec");
  char one[1] = {'x'};
  unit_dim_name(UNIT_BYTES, one, 1);
  assert_int_equal(one[0], '\0');
}

typedef struct fmt_case {
  double v;
  unit_dim d;
  const char *want;
} fmt_case;

static void test_format_table(void **state) {
  (void)state;
  const double GiB = 1073741824.0;
  const fmt_case cases[] = {
    /* plain numbers */
    {0, {0, 0, 0}, "0"},
    {-0.0, {0, 0, 0}, "0"},
    {42, {0, 0, 0}, "42"},
    {-7, {0, 0, 0}, "-7"},
    {1048576, {0, 0, 0}, "1048576"},
    {123456789012, {0, 0, 0}, "123456789012"},
    {3.125, {0, 0, 0}, "3.125"},
    {0.5, {0, 0, 0}, "0.5"},
    {1.0 / 3, {0, 0, 0}, "0.3333"},
    {2.50000001, {0, 0, 0}, "2.5"},
    {1e-5, {0, 0, 0}, "1e-5"},
    {12345.67, {0, 0, 0}, "1.235e4"},
    {-0.000123456, {0, 0, 0}, "-0.0001235"},
    {1e20, {0, 0, 0}, "1e20"},
    /* bytes: binary when a whole number of KiB.. */
    {80 * GiB, {1, 0, 0}, "80 GiB"},
    {16 * GiB, {1, 0, 0}, "16 GiB"},
    {1024, {1, 0, 0}, "1 KiB"},
    {4096, {1, 0, 0}, "4 KiB"},
    {1.5 * GiB, {1, 0, 0}, "1536 MiB"},
    {1025 * 1024.0, {1, 0, 0}, "1025 KiB"},
    {2 * 1125899906842624.0, {1, 0, 0}, "2 PiB"},
    {-80 * GiB, {1, 0, 0}, "-80 GiB"},
    /* ..otherwise decimal */
    {0, {1, 0, 0}, "0 B"},
    {1, {1, 0, 0}, "1 B"},
    {512, {1, 0, 0}, "512 B"},
    {0.125, {1, 0, 0}, "0.125 B"},
    {1000, {1, 0, 0}, "1 KB"},
    {1536, {1, 0, 0}, "1.536 KB"},
    {1.5e9, {1, 0, 0}, "1.5 GB"},
    {999.9e6, {1, 0, 0}, "999.9 MB"},
    {999.99e6, {1, 0, 0}, "1 GB"},
    {1e12, {1, 0, 0}, "1 TB"},     /* 976562500 KiB: decimal reads better */
    {3e15, {1, 0, 0}, "3 PB"},
    {5e18, {1, 0, 0}, "5000 PB"},
    /* byte rates: decimal */
    {900e9, {1, -1, 0}, "900 GB/s"},
    {3.125e9, {1, -1, 0}, "3.125 GB/s"},   /* 25 Gb/s */
    {25 * 1.25e8, {1, -1, 0}, "3.125 GB/s"},
    {25 * 1.25e8 / 8, {1, -1, 0}, "390.6 MB/s"},
    {2039e9, {1, -1, 0}, "2.039 TB/s"},
    {3.35e12, {1, -1, 0}, "3.35 TB/s"},
    {GiB, {1, -1, 0}, "1.074 GB/s"},
    {0, {1, -1, 0}, "0 B/s"},
    {500, {1, -1, 0}, "500 B/s"},
    /* work and compute */
    {312e12, {0, -1, 1}, "312 TFLOP/s"},
    {19.5e12, {0, -1, 1}, "19.5 TFLOP/s"},
    {989.4e12, {0, -1, 1}, "989.4 TFLOP/s"},
    {100e9, {0, -1, 1}, "100 GFLOP/s"},
    {1e15, {0, -1, 1}, "1 PFLOP/s"},
    {6e18, {0, 0, 1}, "6000 PFLOP"},
    {2.5e6, {0, 0, 1}, "2.5 MFLOP"},
    {7, {0, 0, 1}, "7 FLOP"},
    /* time: the prefix that gives [1, 1000) */
    {2e-6, {0, 1, 0}, "2 us"},
    {1.5e-3, {0, 1, 0}, "1.5 ms"},
    {5e-6, {0, 1, 0}, "5 us"},
    {3e-9, {0, 1, 0}, "3 ns"},
    {0.25e-9, {0, 1, 0}, "0.25 ns"},
    {1, {0, 1, 0}, "1 s"},
    {0.999, {0, 1, 0}, "999 ms"},
    {0.99999, {0, 1, 0}, "1 s"},
    {90, {0, 1, 0}, "90 s"},
    {3600, {0, 1, 0}, "3600 s"},
    {0, {0, 1, 0}, "0 s"},
    {-2e-6, {0, 1, 0}, "-2 us"},
    /* no unit word: base units */
    {5, {0, -1, 0}, "5/s"},
    {4, {2, -1, 0}, "4 B^2/s"},
    {0.5, {-1, 0, 1}, "0.5 FLOP/B"},
    {3, {1, 1, 0}, "3 B*s"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char buf[64];
    int len = unit_format(cases[i].v, cases[i].d, buf, sizeof buf);
    if (strcmp(buf, cases[i].want) != 0)
      fail_msg("case %zu: %.17g formatted as '%s', want '%s'", i, cases[i].v, buf,
               cases[i].want);
    assert_int_equal(len, (int)strlen(buf));
  }
}

/* Every formatted quantity with a unit word reads back through unit_lookup. */
static void test_format_reparses(void **state) {
  (void)state;
  const fmt_case cases[] = {
    {80 * 1073741824.0, {1, 0, 0}, NULL}, {1.5e9, {1, 0, 0}, NULL},
    {3.125e9, {1, -1, 0}, NULL},          {312e12, {0, -1, 1}, NULL},
    {1.5e-3, {0, 1, 0}, NULL},            {2.5e6, {0, 0, 1}, NULL},
    {1.5 * 1073741824.0, {1, 0, 0}, NULL}, {5e-9, {0, 1, 0}, NULL},
    {123456789, {1, 0, 0}, NULL},         {1e12, {1, 0, 0}, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char buf[64], word[32];
    double num;
    unit_format(cases[i].v, cases[i].d, buf, sizeof buf);
    assert_int_equal(sscanf(buf, "%lf %31s", &num, word), 2);
    double scale;
    unit_dim d;
    if (!unit_lookup(word, &scale, &d)) fail_msg("'%s' does not read back", buf);
    assert_true(unit_eq(d, cases[i].d));
    double back = num * scale;
    if (fabs(back - cases[i].v) > 5e-4 * fabs(cases[i].v))
      fail_msg("'%s' reads back as %.17g, want %.17g", buf, back, cases[i].v);
  }
}

static void test_format_small_buffer(void **state) {
  (void)state;
  char buf[5];
  int len = unit_format(80 * 1073741824.0, UNIT_BYTES, buf, sizeof buf);
  assert_int_equal(len, 6);                 /* "80 GiB" needed */
  assert_string_equal(buf, "80 G");
  len = unit_format(4, dim(2, -1, 0), buf, sizeof buf);
  assert_int_equal(len, 7);
  assert_string_equal(buf, "4 B^");
  len = unit_format_number(1234567, buf, sizeof buf);
  assert_int_equal(len, 7);
  assert_string_equal(buf, "1234");
}

static void test_format_special(void **state) {
  (void)state;
  char buf[64];
  unit_format(NAN, UNIT_NONE, buf, sizeof buf);
  assert_string_equal(buf, "nan");
  unit_format(INFINITY, UNIT_BYTES, buf, sizeof buf);
  assert_string_equal(buf, "inf B");
  unit_format(-INFINITY, UNIT_SECONDS, buf, sizeof buf);
  assert_string_equal(buf, "-inf s");
  unit_format(1e-30, UNIT_SECONDS, buf, sizeof buf);
  assert_string_equal(buf, "1e-21 ns");
  unit_format(1e300, UNIT_BYTES, buf, sizeof buf);
  assert_string_equal(buf, "1e285 PB");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_lookup_bytes),
    cmocka_unit_test(test_lookup_bits),
    cmocka_unit_test(test_lookup_time_and_work),
    cmocka_unit_test(test_lookup_rates),
    cmocka_unit_test(test_lookup_rejects),
    cmocka_unit_test(test_dim_arithmetic),
    cmocka_unit_test(test_exponent_overflow),
    cmocka_unit_test(test_dim_names),
    cmocka_unit_test(test_format_table),
    cmocka_unit_test(test_format_reparses),
    cmocka_unit_test(test_format_small_buffer),
    cmocka_unit_test(test_format_special),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
