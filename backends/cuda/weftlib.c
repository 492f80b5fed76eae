/* weftlib.c - the functions of weft's library that the CPU backend's
 * clip.c, built into the CUDA plugin, calls: the plugin links nothing of
 * weft, whose binary exports no symbols. */
#include <stdio.h>
#include <stdlib.h>

#include "cx.h"
#include "weft/arena.h"
#include "weft/graph.h"

int64_t tregion_numel(const tregion *r) { return cx_numel(r); }

int64_t tensor_numel(const gtensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndims; i++) n *= t->dims[i].size;
  return n;
}

void weft_oom(void) {
  fprintf(stderr, "weft: error: out of memory\n");
  abort();
}
