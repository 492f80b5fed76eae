/* stdlib_files.h - the standard library's .plan files compiled into the binary.
 * build/stdlib/embedded.c (written by stdlib/embed) defines the two tables. */
#ifndef WEFT_STDLIB_FILES_H
#define WEFT_STDLIB_FILES_H

/* Not named stdlib.h: the build passes -Isrc/eval at times, which would put such a file
 * in place of the C library's <stdlib.h> for every source. */

#include <stddef.h>

typedef struct weft_embedded_file {
  const char *name;   /* the file's basename: "clusters.plan" */
  const char *text;   /* its bytes, NUL-terminated (text[len] == '\0') */
  size_t len;         /* bytes in text, not counting the terminator */
} weft_embedded_file;

/* In the order the files were given to embed (the Makefile sorts them). */
extern const weft_embedded_file weft_stdlib_files[];
extern const int weft_stdlib_count;

#endif
