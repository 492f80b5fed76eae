/* data.c - files of token ids cut into sequences and batches (data.h). */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/files.h"
#include "data.h"
#include "weft/workspace.h"

enum { LLMC_HEADER = 256 * 4, LLMC_MAGIC_U16 = 20240520, LLMC_MAGIC_U32 = 20240801 };

typedef struct tfile {
  char *path;
  int fd;
  int bytes;              /* per token: 2 or 4 */
  bool header;            /* llm.c's */
  int64_t ntokens;
  int64_t first, nseq;    /* its sequences' numbers in the whole */
} tfile;

struct token_data {
  tfile *files;
  int nfiles;
  int64_t seq, nseq, ntokens;
  int64_t epoch;          /* whose permutation perm holds; -1 none */
  uint64_t perm_seed;
  int64_t *perm;
  uint8_t *buf;           /* one sequence and its next token, as stored */
};

static uint32_t le32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* Reads exactly n bytes at off; false at the end of the file or an error. */
static bool read_at(int fd, void *buf, size_t n, int64_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + (int64_t)got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += (size_t)r;
  }
  return true;
}

static bool open_file(tfile *f, const char *path, int raw_bytes, char *err, size_t errlen) {
  f->path = strdup(path);
  if (!f->path) weft_oom();
  /* a regular file only, opened without blocking (base/files.h) */
  char why[256];
  int64_t size = 0;
  f->fd = file_open_read(path, 0, &size, why, sizeof why);
  if (f->fd < 0) {
    snprintf(err, errlen, "%s: %s", path, why);
    return false;
  }
  uint8_t h[LLMC_HEADER];
  uint32_t magic = size >= LLMC_HEADER && read_at(f->fd, h, sizeof h, 0) ? le32(h) : 0;
  if (magic == LLMC_MAGIC_U16 || magic == LLMC_MAGIC_U32) {
    f->header = true;
    f->bytes = magic == LLMC_MAGIC_U16 ? 2 : 4;
    int64_t count = (int32_t)le32(h + 8);
    if (count < 0 || size - LLMC_HEADER != count * f->bytes) {
      snprintf(err, errlen, "%s: its llm.c header says %" PRId64 " tokens of %d bytes, but %" PRId64
               " bytes follow the header", path, count, f->bytes, size - LLMC_HEADER);
      return false;
    }
    f->ntokens = count;
  } else {
    f->bytes = raw_bytes;
    if (size % raw_bytes != 0) {
      snprintf(err, errlen, "%s: %" PRId64 " bytes are not a whole number of uint%d tokens (no llm.c header)", path,
               size, 8 * raw_bytes);
      return false;
    }
    f->ntokens = size / raw_bytes;
  }
  return true;
}

token_data *data_open(const char *pattern, int64_t seq, int raw_bytes, char *err, size_t errlen) {
  token_data *d = calloc(1, sizeof *d);
  if (!d) weft_oom();
  d->seq = seq;
  d->epoch = -1;
  glob_t gl = {0};
  const char *one[1] = {pattern};
  const char *const *paths = one;
  size_t npaths = 1;
  if (strpbrk(pattern, "*?[")) {
    int rc = glob(pattern, GLOB_ERR, NULL, &gl);
    if (rc != 0) {
      snprintf(err, errlen, "%s: %s", pattern, rc == GLOB_NOMATCH ? "no file matches" : "cannot list the files");
      globfree(&gl);
      free(d);
      return NULL;
    }
    paths = (const char *const *)gl.gl_pathv;
    npaths = gl.gl_pathc;
  }
  d->files = calloc(npaths, sizeof(tfile));
  if (!d->files) weft_oom();
  bool ok = true;
  for (size_t i = 0; i < npaths && ok; i++) {
    tfile *f = &d->files[d->nfiles++];
    f->fd = -1;
    ok = open_file(f, paths[i], raw_bytes, err, errlen);
    if (!ok) break;
    f->first = d->nseq;
    f->nseq = f->ntokens > seq ? (f->ntokens - 1) / seq : 0;
    d->nseq += f->nseq;
    d->ntokens += f->ntokens;
  }
  globfree(&gl);
  if (ok && d->nseq == 0) {
    snprintf(err, errlen, "%s: %" PRId64 " tokens hold no sequence of %" PRId64 " tokens and the next one (the model's seq)",
             pattern, d->ntokens, seq);
    ok = false;
  }
  if (!ok) {
    data_close(d);
    return NULL;
  }
  d->buf = weft_xmalloc((size_t)(seq + 1) * 4);
  return d;
}

void data_close(token_data *d) {
  if (!d) return;
  for (int i = 0; i < d->nfiles; i++) {
    if (d->files[i].fd >= 0) close(d->files[i].fd);
    free(d->files[i].path);
  }
  free(d->files), free(d->perm), free(d->buf);
  free(d);
}

int64_t data_sequences(const token_data *d) { return d->nseq; }
int64_t data_tokens(const token_data *d) { return d->ntokens; }
int data_file_count(const token_data *d) { return d->nfiles; }

const char *data_format(const token_data *d) {
  static const char *const names[2][2] = {{"raw uint16", "raw uint32"}, {"llm.c uint16", "llm.c uint32"}};
  const tfile *f = &d->files[0];
  for (int i = 1; i < d->nfiles; i++)
    if (d->files[i].header != f->header || d->files[i].bytes != f->bytes) return "mixed";
  return names[f->header][f->bytes == 4];
}

/* splitmix64's finaliser: the draws of a shuffle are this of a counter
 * mixed with the seed and the epoch, so that they need no state. */
static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The permutation of epoch e: Fisher-Yates, each draw uniform by rejection. */
static void shuffle_epoch(token_data *d, uint64_t seed, int64_t e) {
  int64_t n = d->nseq;
  if (!d->perm) d->perm = weft_xmalloc((size_t)n * sizeof(int64_t));
  for (int64_t i = 0; i < n; i++) d->perm[i] = i;
  uint64_t base = mix(mix(seed ^ 0x7765667464617461ull) ^ (uint64_t)e), k = 0;
  for (int64_t i = n - 1; i > 0; i--) {
    uint64_t m = (uint64_t)i + 1, limit = UINT64_MAX - UINT64_MAX % m, x;
    do x = mix(base ^ k++);
    while (x >= limit);
    int64_t j = (int64_t)(x % m), t = d->perm[i];
    d->perm[i] = d->perm[j];
    d->perm[j] = t;
  }
  d->epoch = e;
  d->perm_seed = seed;
}

int64_t data_order(token_data *d, int64_t pos, bool shuffle, uint64_t seed) {
  int64_t e = pos / d->nseq, i = pos % d->nseq;
  if (!shuffle) return i;
  if (d->epoch != e || d->perm_seed != seed) shuffle_epoch(d, seed, e);
  return d->perm[i];
}

bool data_batch(token_data *d, int64_t pos, int64_t batch, bool shuffle, uint64_t seed, int64_t vocab,
                int32_t *tokens, int32_t *labels, char *err, size_t errlen) {
  int64_t T = d->seq;
  for (int64_t b = 0; b < batch; b++) {
    int64_t s = data_order(d, pos + b, shuffle, seed);
    int lo = 0, hi = d->nfiles - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (d->files[mid].first <= s) lo = mid;
      else hi = mid - 1;
    }
    /* the last file that starts at or before s: it holds s (one without
     * sequences starts where the next one does) */
    const tfile *f = &d->files[lo];
    int64_t at = (s - f->first) * T;
    if (!read_at(f->fd, d->buf, (size_t)((T + 1) * f->bytes), (f->header ? LLMC_HEADER : 0) + at * f->bytes)) {
      snprintf(err, errlen, "%s: cannot read tokens %" PRId64 " to %" PRId64 " (was the file changed?)", f->path, at,
               at + T);
      return false;
    }
    for (int64_t t = 0; t <= T; t++) {
      const uint8_t *p = d->buf + t * f->bytes;
      int64_t id = f->bytes == 2 ? (int64_t)(p[0] | p[1] << 8) : (int64_t)le32(p);
      if (id >= vocab) {
        snprintf(err, errlen, "%s: token %" PRId64 " is %" PRId64 "; ids must lie below the model's vocabulary, %" PRId64,
                 f->path, at + t, id, vocab);
        return false;
      }
      if (t < T) tokens[b * T + t] = (int32_t)id;
      if (t > 0) labels[b * T + t - 1] = (int32_t)id;
    }
  }
  return true;
}
