/* json.h - a small streaming JSON writer for --json output.
 * Commas and nesting are tracked here so that callers only name values. */
#ifndef WEFT_JSON_H
#define WEFT_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct json {
  FILE *out;
  int depth;
  bool first[64];        /* no value written yet at this depth */
  bool after_key;
} json;

void json_init(json *j, FILE *out);
void json_obj(json *j);
void json_end_obj(json *j);
void json_arr(json *j);
void json_end_arr(json *j);
void json_key(json *j, const char *k);
void json_str(json *j, const char *s);
void json_int(json *j, int64_t v);
void json_num(json *j, double v);
void json_bool(json *j, bool v);
void json_null(json *j);
/* Writes already-formatted JSON text as one value. */
void json_raw(json *j, const char *text);

#endif
