/* format.c - weft fmt: files printed in canonical form, rewritten in place
 * atomically, checked, or round-tripped. */
#include "common.h"

static char *read_stdin(size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) weft_oom();
  size_t got;
  while ((got = fread(buf + n, 1, cap - n, stdin)) > 0) {
    n += got;
    if (n == cap) {
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) weft_oom();
      buf = nb;
    }
  }
  *len = n;
  return buf;
}

/* The canonical text of one file, malloc'd; NULL after diagnostics. */
static char *fmt_text(weft_ctx *c, int file, ast **root_out) {
  weft_parse_opts po = {&c->arena, &c->srcs, &c->diags};
  ast *root = weft_parse(&po, file);
  if (!root) return NULL;
  char *out = NULL;
  size_t n = 0;
  FILE *mem = open_memstream(&out, &n);
  if (!mem) weft_oom();
  weft_fmt(root, &c->srcs.items[file], mem);
  fclose(mem);
  if (root_out) *root_out = root;
  return out;
}

static int write_atomically(const char *path, const char *text) {
  char err[PATH_MAX + 256];
  if (file_write_text(path, text, strlen(text), err, sizeof err)) return WEFT_OK;
  fprintf(stderr, "weft: error: %s\n", err);
  return WEFT_FAILED;
}

static int fmt_one(const weft_opts *o, const char *path) {
  weft_ctx *c = report_ctx(o);
  int file;
  if (strcmp(path, "-") == 0) {
    size_t len;
    char *buf = read_stdin(&len);
    file = src_add(&c->srcs, &c->arena, "<stdin>", "", buf, len);
    free(buf);
  } else {
    char why[256];
    file = src_read(&c->srcs, &c->arena, path, why, sizeof why);
    if (file < 0) {
      fprintf(stderr, "weft: error: cannot read '%s': %s\n", path, why);
      weft_free(c);
      return WEFT_FAILED;
    }
  }
  ast *root = NULL;
  char *out = fmt_text(c, file, &root);
  int rc = WEFT_OK;
  if (!out) {
    report_diags(c, o);
    rc = WEFT_REJECTED;
  } else if (o->roundtrip) {
    int f2 = src_add(&c->srcs, &c->arena, arena_printf(&c->arena, "%s (formatted)", path), "", out, strlen(out));
    ast *root2 = NULL;
    char *out2 = fmt_text(c, f2, &root2);
    if (!out2) {
      report_diags(c, o);
      fprintf(stderr, "%s: fmt output does not parse\n", path);
      rc = WEFT_REJECTED;
    } else if (!ast_equal(root, root2)) {
      fprintf(stderr, "%s: fmt changes the syntax tree\n", path);
      rc = WEFT_REJECTED;
    } else if (strcmp(out, out2) != 0) {
      fprintf(stderr, "%s: fmt is not idempotent\n", path);
      rc = WEFT_REJECTED;
    } else if (root->list2.n != root2->list2.n) {
      fprintf(stderr, "%s: fmt loses comments (%d before, %d after)\n", path, root->list2.n, root2->list2.n);
      rc = WEFT_REJECTED;
    }
    free(out2);
  } else if (o->check) {
    const weft_src *s = &c->srcs.items[file];
    if (strlen(out) != s->len || memcmp(out, s->text, s->len) != 0) {
      printf("%s: not formatted\n", path);
      rc = WEFT_REJECTED;
    }
  } else if (o->write && strcmp(path, "-") != 0) {
    const weft_src *s = &c->srcs.items[file];
    if (strlen(out) != s->len || memcmp(out, s->text, s->len) != 0) rc = write_atomically(path, out);
  } else {
    fputs(out, stdout);
  }
  free(out);
  weft_free(c);
  return rc;
}

int report_fmt(const weft_opts *o) {
  int worst = WEFT_OK;
  for (int i = 0; i < o->nfiles; i++) {
    int rc = fmt_one(o, o->files[i]);
    if (rc > worst) worst = rc;
  }
  return worst;
}

