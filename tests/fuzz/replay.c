/* replay.c - runs a libFuzzer target without libFuzzer, for make check:
 * every seed file of the directories given, and from each a fixed number
 * of variants (bytes flipped, dropped, repeated and spliced from another
 * seed, by a fixed pseudo-random sequence), so that the run is the same
 * every time. A crash ends the run (AddressSanitizer with SANITIZE=1). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { VARIANTS = 24, MAX_SEEDS = 256 };

typedef struct seed {
  char *name;
  uint8_t *data;
  size_t size;
} seed;

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

static int by_name(const void *a, const void *b) { return strcmp(((const seed *)a)->name, ((const seed *)b)->name); }

static int load(const char *dir, seed *out, int n) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: cannot open %s\n", dir);
    exit(2);
  }
  struct dirent *e;
  while ((e = readdir(d)) && n < MAX_SEEDS) {
    if (e->d_name[0] == '.') continue;
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    char *path = malloc(len);
    snprintf(path, len, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) { free(path); continue; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)(size > 0 ? size : 1));
    size_t got = fread(buf, 1, (size_t)(size > 0 ? size : 0), f);
    fclose(f);
    out[n++] = (seed){path, buf, got};
  }
  closedir(d);
  return n;
}

/* A variant of s: up to 8 edits. */
static size_t mutate(const seed *s, const seed *other, uint8_t *out, size_t cap) {
  size_t n = s->size < cap ? s->size : cap;
  memcpy(out, s->data, n);
  int edits = 1 + (int)(next() % 8);
  for (int k = 0; k < edits; k++) {
    size_t at = n ? (size_t)(next() % n) : 0;
    switch (next() % 5) {
    case 0: if (n) out[at] ^= (uint8_t)(1u << (next() % 8)); break;
    case 1: if (n) out[at] = (uint8_t)next(); break;
    case 2: if (n > 1) { memmove(out + at, out + at + 1, n - at - 1); n--; } break;
    case 3: if (n < cap) { memmove(out + at + 1, out + at, n - at); out[at] = out[at ? at - 1 : 0]; n++; } break;
    default:
      if (other->size) {
        size_t from = (size_t)(next() % other->size), len = 1 + (size_t)(next() % 64);
        if (from + len > other->size) len = other->size - from;
        if (at + len > cap) len = cap - at;
        memcpy(out + at, other->data + from, len);
        if (at + len > n) n = at + len;
      }
    }
  }
  return n;
}

int main(int argc, char **argv) {
  seed *seeds = calloc(MAX_SEEDS, sizeof *seeds);
  int n = 0;
  for (int i = 1; i < argc; i++) n = load(argv[i], seeds, n);
  if (n == 0) {
    fprintf(stderr, "replay: no seeds\n");
    return 2;
  }
  qsort(seeds, (size_t)n, sizeof *seeds, by_name);
  size_t cap = 1 << 16;
  uint8_t *buf = malloc(cap);
  int runs = 0;
  for (int i = 0; i < n; i++) {
    LLVMFuzzerTestOneInput(seeds[i].data, seeds[i].size), runs++;
    for (int v = 0; v < VARIANTS; v++) {
      size_t len = mutate(&seeds[i], &seeds[(i + 1 + v) % n], buf, cap);
      LLVMFuzzerTestOneInput(buf, len), runs++;
    }
  }
  printf("%d inputs from %d seeds\n", runs, n);
  for (int i = 0; i < n; i++) free(seeds[i].name), free(seeds[i].data);
  free(seeds);
  free(buf);
  return 0;
}
