/* fuzz_safetensors.c - libFuzzer target: any bytes as a safetensors file,
 * opened and read the ways weft run reads one: every tensor converted, then
 * the file as --load, --inputs and --resume of a small model (header,
 * offsets, dtypes, shapes, metadata and values checked); the answer is a
 * message or data, never a crash or a read outside the file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/safetensors.h"
#include "weft/backend.h"
#include "weft/workspace.h"

/* the model the file is read for, built once: a parameter, optimizer state,
 * a float input and an integer one */
static const char model_text[] =
    "use std\n"
    "model m(batch = 2, seq = 3, vocab = 5, dim = 4) {\n"
    "  input tokens : i32[batch, seq]\n"
    "  input y : f32[batch, seq, dim]\n"
    "  param wte : f32[vocab, dim]\n"
    "  param w : f32[dim, dim]\n"
    "  e = embedding(tokens, wte)\n"
    "  h = matmul(e, w)\n"
    "  loss = mse(h, y)\n"
    "  train adamw(lr = 0.01)\n"
    "}\n";

static const weft_graph *model(void) {
  static weft_ctx *c;
  static const weft_graph *g;
  if (!c) {
    c = weft_new();
    weft_item it;
    if (weft_load_text(c, "model.plan", model_text, sizeof model_text - 1) == WEFT_OK &&
        weft_items(c, V_MODEL, &it, 1) == 1)
      g = weft_build_graph(c, it.val, it.loc);
    if (!g) {
      fprintf(stderr, "fuzz_safetensors: the model does not build\n");
      abort();
    }
  }
  return g;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(fd, data + off, size - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  char path[64], err[1024];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  st_file *f = st_open(path, err, sizeof err);
  if (f) {
    for (int i = 0; i < st_count(f); i++) {
      const st_tensor *t = st_at(f, i);
      int64_t n = st_numel(t);
      if (st_find(f, t->name) != t) abort();
      if (t->end - t->begin > size || (uint64_t)n > 2 * size + 1) {
        if (n > 0 && st_dtype_size(t->dtype) > 0) abort(); /* a tensor past the file */
        continue;
      }
      void *out = malloc((size_t)(n ? n : 1) * 4);
      if (!out) return 0;
      if (!st_read_f32(f, t, out, err, sizeof err)) st_read_i32(f, t, out, err, sizeof err);
      free(out);
    }
    for (int i = 0; i < st_meta_count(f); i++) st_meta(f, st_meta_key(f, i));
    st_close(f);
  }
  const weft_graph *g = model();
  weft_world *w = world_new(g);
  uint64_t seed = 0;
  world_load_params(w, path, err, sizeof err);
  world_load_inputs(w, path, err, sizeof err);
  w->allow_nonfinite = size % 2;
  world_resume(w, path, &seed, err, sizeof err);
  if (w->step < 0 || w->step > WORLD_MAX_STEP) abort();
  world_free(w);
  close(fd);
  return 0;
}
