/* heuristic_files.h - the Lua heuristics of stdlib/heuristics compiled into
 * the binary; build/stdlib/heuristics.c (written by stdlib/embed) defines them. */
#ifndef WEFT_HEURISTIC_FILES_H
#define WEFT_HEURISTIC_FILES_H

#include "eval/stdlib_files.h"

/* In the order the files were given to embed (the Makefile sorts them). */
extern const weft_embedded_file weft_heuristic_files[];
extern const int weft_heuristic_count;

#endif
