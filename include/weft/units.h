/* units.h - physical quantities: a double in base units (bytes, seconds, FLOPs)
 * and the integer exponents of those dimensions; unit words in and out. */
#ifndef WEFT_UNITS_H
#define WEFT_UNITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Exponents of the three base dimensions: 80 GiB is {1,0,0}, 900 GB/s is
 * {1,-1,0}, 312 TFLOP/s is {0,-1,1}. All zero is a plain number. */
typedef struct unit_dim {
  signed char byte, sec, flop;
} unit_dim;

/* The largest exponent magnitude a quantity may carry; arithmetic that goes
 * beyond it fails (the _checked functions return false). */
enum { UNIT_MAX_EXP = 8 };

/* Compound literals: for expressions, not for static initializers. */
#define UNIT_NONE         ((unit_dim){0, 0, 0})
#define UNIT_BYTES        ((unit_dim){1, 0, 0})
#define UNIT_SECONDS      ((unit_dim){0, 1, 0})
#define UNIT_FLOPS        ((unit_dim){0, 0, 1})
#define UNIT_BYTES_PER_S  ((unit_dim){1, -1, 0})
#define UNIT_FLOPS_PER_S  ((unit_dim){0, -1, 1})

/* A unit word as the lexer passes it ("GiB", "Gb/s", "TFLOP/s", "us"): sets
 * *scale (the value of 1 unit in base units: GiB 1073741824, Gb/s 1.25e8) and
 * *dim. Returns false, leaving both untouched, for any other word. */
bool unit_lookup(const char *word, double *scale, unit_dim *dim);

/* Exponent arithmetic. The plain forms do not check the range; use them only
 * on dimensions known to be small. The _checked forms store the result in
 * *out and return false when an exponent would pass +-UNIT_MAX_EXP (then *out
 * is left untouched). */
unit_dim unit_mul(unit_dim a, unit_dim b);
unit_dim unit_div(unit_dim a, unit_dim b);
bool unit_mul_checked(unit_dim a, unit_dim b, unit_dim *out);
bool unit_div_checked(unit_dim a, unit_dim b, unit_dim *out);
/* d raised to num/den (den > 0): sqrt is (1, 2). Fails when an exponent is
 * not divisible by den, or when the result is out of range. */
bool unit_pow_checked(unit_dim d, int num, int den, unit_dim *out);

bool unit_eq(unit_dim a, unit_dim b);
bool unit_is_none(unit_dim d);
/* Within +-UNIT_MAX_EXP on every axis. */
bool unit_in_range(unit_dim d);

/* A name for messages, written to buf (n bytes) and returned: "number",
 * "bytes", "seconds", "FLOPs", "bytes/s", "FLOP/s", "1/s", else a form in
 * base symbols such as "B^2/s" or "B*FLOP/s^2". */
const char *unit_dim_name(unit_dim d, char *buf, size_t n);

/* A plain number: integers below 2^53 in full ("1048576"), others with up to
 * four significant digits ("3.125", "0.0005", "1.235e7"). Returns what
 * snprintf returns. */
int unit_format_number(double v, char *buf, size_t n);

/* A quantity in its most readable unit: "80 GiB", "1.5 GB", "900 GB/s",
 * "312 TFLOP/s", "2 us", "1.5 ms"; a dimension without a unit word falls back
 * to base symbols ("4 B^2/s", "5/s"). Where a unit word exists, the output
 * reads back as the same quantity (to four significant digits). Returns what
 * snprintf returns. */
int unit_format(double v, unit_dim d, char *buf, size_t n);

/* A byte count for people: "512 B", "3.5 KiB", "1.2 GiB" (one decimal,
 * binary prefixes). Returns buf. */
const char *unit_bytes_human(int64_t b, char *buf, size_t n);

#endif
