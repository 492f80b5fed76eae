/* fmt.c - `weft fmt`: the canonical source of a parsed file, comments kept.
 * Statements are printed one per line with 2-space indentation; every
 * comment of the file comes back, placed by its position: own-line comments
 * before the statement that follows them, trailing comments after the line
 * they ended (aligned across consecutive lines of a block). Expressions are
 * printed on one line exactly as parsed (parentheses are E_PAREN nodes).
 * Schedule grids print a row per line, their columns aligned. */
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "weft/ast.h"

/* ---- growable strings ------------------------------------------------------- */

typedef struct sbuf {
  char *s;
  size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 128;
    while (cap < b->n + n + 1) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) weft_oom();
    b->s = ns;
    b->cap = cap;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }
static void sb_putc(sbuf *b, char c) { sb_add(b, &c, 1); }

/* ---- expressions -------------------------------------------------------------- */

static const char *binop(int op) {
  switch (op) {
  case '+': return " + ";
  case '-': return " - ";
  case '*': return " * ";
  case '/': return " / ";
  case '%': return " % ";
  case '<': return " < ";
  case '>': return " > ";
  case T_IDIV: return " // ";
  case T_EQ: return " == ";
  case T_NE: return " != ";
  case T_LE: return " <= ";
  case T_GE: return " >= ";
  case T_AND: return " and ";
  case T_OR: return " or ";
  default: return " ? ";
  }
}

static void put_escaped(sbuf *b, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '\n': sb_puts(b, "\\n"); break;
    case '\t': sb_puts(b, "\\t"); break;
    case '\\': sb_puts(b, "\\\\"); break;
    case '"': sb_puts(b, "\\\""); break;
    case '{': sb_puts(b, "\\{"); break;
    case '}': sb_puts(b, "\\}"); break;
    default: sb_putc(b, *s);
    }
  }
}

static void pe(sbuf *b, const ast *n);

static void pe_list(sbuf *b, const ast_list *l) {
  for (int i = 0; i < l->n; i++) {
    if (i) sb_puts(b, ", ");
    pe(b, l->items[i]);
  }
}

static void pe_type(sbuf *b, const ast *t) {
  if (t->a) pe(b, t->a);
  sb_putc(b, '[');
  pe_list(b, &t->list);
  sb_putc(b, ']');
}

static const char *suffix(int op) {
  return op == '+' ? "+" : op == '^' ? "^" : op == T_DOTDOT ? ".." : "";
}

static void pe_pattern(sbuf *b, const ast *p) {
  if (p->name) sb_puts(b, p->name);
  sb_putc(b, '[');
  for (int i = 0; i < p->list.n; i++) {
    const ast *d = p->list.items[i];
    if (i) sb_puts(b, ", ");
    if (d->name) {
      sb_puts(b, d->name);
      sb_puts(b, suffix(d->op));
      continue;
    }
    sb_putc(b, '(');
    for (int j = 0; j < d->list.n; j++) {
      const ast *f = d->list.items[j];
      if (j) sb_putc(b, ' ');
      sb_puts(b, f->kind == E_INT ? f->text : f->name);
      sb_puts(b, suffix(f->op));
    }
    sb_putc(b, ')');
  }
  sb_putc(b, ']');
}

static void pe_params(sbuf *b, const ast_list *l) {
  sb_putc(b, '(');
  for (int i = 0; i < l->n; i++) {
    const ast *p = l->items[i];
    if (i) sb_puts(b, ", ");
    sb_puts(b, p->name);
    if (p->a) {
      sb_puts(b, " = ");
      pe(b, p->a);
    }
  }
  sb_putc(b, ')');
}

/* A selector: a lone atom as is, several in braces: "{h, a}". */
static void pe_sel(sbuf *b, const ast *sel) {
  if (sel->list.n == 1) {
    pe(b, sel->list.items[0]);
    return;
  }
  sb_putc(b, '{');
  pe_list(b, &sel->list);
  sb_putc(b, '}');
}

static void pe(sbuf *b, const ast *n) {
  switch (n->kind) {
  case E_INT:
  case E_FLOAT: sb_puts(b, n->text); break;
  case E_QUANTITY:
    sb_puts(b, n->text);
    sb_putc(b, ' ');
    sb_puts(b, n->name);
    break;
  case E_STRING:
    sb_putc(b, '"');
    for (int i = 0; i < n->list.n; i++) {
      const ast *p = n->list.items[i];
      if (p->kind == E_STRPART) {
        put_escaped(b, p->text);
      } else {
        sb_putc(b, '{');
        pe(b, p);
        sb_putc(b, '}');
      }
    }
    sb_putc(b, '"');
    break;
  case E_STRPART: put_escaped(b, n->text); break;
  case E_BOOL: sb_puts(b, n->ival ? "true" : "false"); break;
  case E_HOLE: sb_puts(b, "?"); break;
  case E_NAME: sb_puts(b, n->name); break;
  case E_MEMBER:
    pe(b, n->a);
    /* "1 .2" must not print as the float 1.2 */
    if (n->a->kind == E_INT && n->b && n->op != '{') sb_putc(b, ' ');
    sb_putc(b, '.');
    if (n->op == '{') {
      sb_putc(b, '{');
      pe(b, n->b);
      sb_putc(b, '}');
    } else if (n->b) {
      sb_puts(b, n->b->text);
    } else {
      sb_puts(b, n->name);
    }
    break;
  case E_CALL:
    pe(b, n->a);
    sb_putc(b, '(');
    pe_list(b, &n->list);
    sb_putc(b, ')');
    break;
  case E_INDEX:
    pe(b, n->a);
    sb_putc(b, '[');
    if (n->b) pe(b, n->b);
    else pe_list(b, &n->list);
    sb_putc(b, ']');
    break;
  case E_UNARY:
    sb_puts(b, n->op == T_NOT ? "not " : "-");
    if (n->op == '-' && n->a->kind == E_UNARY && n->a->op == '-') sb_putc(b, ' ');  /* "- -x" */
    pe(b, n->a);
    break;
  case E_BINARY:
    pe(b, n->a);
    sb_puts(b, binop(n->op));
    pe(b, n->b);
    break;
  case E_RANGE:
    pe(b, n->a);
    sb_puts(b, "..");
    pe(b, n->b);
    break;
  case E_IF:
    sb_puts(b, "if ");
    pe(b, n->a);
    sb_puts(b, " then ");
    pe(b, n->b);
    sb_puts(b, " else ");
    pe(b, n->c);
    break;
  case E_LIST:
    sb_putc(b, '[');
    pe_list(b, &n->list);
    sb_putc(b, ']');
    break;
  case E_RECORD:
    if (n->list.n == 0) {
      sb_puts(b, "{}");
      break;
    }
    sb_puts(b, "{ ");
    pe_list(b, &n->list);
    sb_puts(b, " }");
    break;
  case E_PAREN:
    sb_putc(b, '(');
    pe(b, n->a);
    sb_putc(b, ')');
    break;
  case N_ARG:
  case N_FIELD:
  case N_PARAM:
    if (n->name) {
      sb_puts(b, n->name);
      if (n->a) sb_puts(b, " = ");
    }
    if (n->a) pe(b, n->a);
    break;
  case N_TYPE: pe_type(b, n); break;
  case N_PATTERN: pe_pattern(b, n); break;
  case N_SEL: pe_sel(b, n); break;
  case N_OPARG:
    sb_puts(b, n->name);
    if (n->b) {
      sb_puts(b, ": ");
      pe_pattern(b, n->b);
    }
    if (n->a) {
      sb_puts(b, " = ");
      pe(b, n->a);
    }
    break;
  default:
    sb_puts(b, "?");
    break;
  }
}

/* ---- lines and comments --------------------------------------------------------- */

/* Display width: UTF-8 continuation bytes take no column. */
static int width_of(const char *s) {
  int w = 0;
  for (; *s; s++)
    if (((unsigned char)*s & 0xc0) != 0x80) w++;
  return w;
}

typedef struct fline {
  int indent;
  char *code;            /* NULL: a blank line */
  const char *comment;   /* trailing comment text (after '#'), or NULL */
  int block;             /* trailing comments align within runs of one block */
} fline;

typedef struct fmtx {
  arena ar;
  fline *lines;
  int nlines, cap;
  const ast_list *comments;
  int ci;                /* first comment not yet printed */
  int nblocks;
  /* the schedule grid being printed (grids do not nest): the width of the
   * widest "label:" and of the widest cell of each column */
  int label_w;
  int *col_w;
  int ncols;
} fmtx;

typedef struct pos {
  int line, col;
} pos;

static const pos POS_END = { INT_MAX, INT_MAX };

static bool pos_lt(pos a, pos b) { return a.line < b.line || (a.line == b.line && a.col < b.col); }
static pos start_of(weft_loc l) { return (pos){ l.line, l.col }; }
static pos end_of(weft_loc l) { return (pos){ l.end_line, l.end_col }; }
static bool has_loc(weft_loc l) { return l.line > 0; }

static void add_line(fmtx *F, int indent, const char *code, const char *comment, int block) {
  arena_grow(&F->ar, (void **)&F->lines, &F->cap, F->nlines + 1, sizeof(fline));
  fline *l = &F->lines[F->nlines++];
  l->indent = indent;
  l->code = code ? arena_strdup(&F->ar, code) : NULL;
  l->comment = comment;
  l->block = block;
}

static const ast *peek_comment(fmtx *F) {
  return F->ci < F->comments->n ? F->comments->items[F->ci] : NULL;
}

/* The next comment if it starts before p. */
static const ast *comment_before(fmtx *F, pos p) {
  const ast *c = peek_comment(F);
  return c && pos_lt(start_of(c->loc), p) ? c : NULL;
}

/* Whether a comment not yet printed starts strictly between a and b. */
static bool comment_within(fmtx *F, pos a, pos b) {
  for (int k = F->ci; k < F->comments->n; k++) {
    pos p = start_of(F->comments->items[k]->loc);
    if (!pos_lt(p, b)) return false;
    if (pos_lt(a, p)) return true;
  }
  return false;
}

/* The next comment when it is on `line` strictly between after and before. */
static const char *take_trailing(fmtx *F, int line, pos after, pos before) {
  const ast *c = peek_comment(F);
  if (!c || c->loc.line != line) return NULL;
  pos p = start_of(c->loc);
  if (!pos_lt(after, p) || !pos_lt(p, before)) return NULL;
  F->ci++;
  return c->text;
}

typedef struct blockst {
  int indent, id;
  bool first;            /* nothing printed in this block yet */
  int last_line;         /* source line of the last thing printed */
} blockst;

static void own_comment(fmtx *F, blockst *B, const ast *c, bool allow_blank) {
  if (allow_blank && !B->first && c->loc.line > B->last_line + 1) add_line(F, 0, NULL, NULL, B->id);
  char *code = arena_printf(&F->ar, "#%s", c->text);
  add_line(F, B->indent, code, NULL, B->id);
  B->first = false;
  if (c->loc.line > B->last_line) B->last_line = c->loc.line;
  F->ci++;
}

static void print_stmts(fmtx *F, const ast_list *l, int indent, pos lim, pos close);

/* The body of a statement: its list and the span of its braces. */
static const ast_list *body_of(const ast *s) {
  switch (s->kind) {
  case S_OP:
  case S_MODEL:
  case S_CLUSTER:
  case S_PLAN:
  case S_STRATEGY: return &s->list2;
  case S_BLOCK:
  case S_FOR:
  case S_IF:
  case S_DEVICE:
  case S_LINK: return &s->list;
  case S_SCHEDULE: return s->name ? NULL : &s->list;
  default: return NULL;
  }
}

/* Column widths of the grid of schedule s, into F. */
static void grid_widths(fmtx *F, const ast *s) {
  F->label_w = 0;
  F->ncols = 0;
  for (int i = 0; i < s->list.n; i++) {
    const ast *row = s->list.items[i];
    int w = width_of(row->name) + 1;
    if (w > F->label_w) F->label_w = w;
    if (row->list.n > F->ncols) F->ncols = row->list.n;
  }
  F->col_w = arena_alloc(&F->ar, sizeof(int) * (size_t)(F->ncols ? F->ncols : 1));
  for (int i = 0; i < s->list.n; i++) {
    const ast *row = s->list.items[i];
    for (int j = 0; j < row->list.n; j++) {
      int w = width_of(row->list.items[j]->text);
      if (w > F->col_w[j]) F->col_w[j] = w;
    }
  }
}

static void pad(sbuf *b, int n) {
  for (; n > 0; n--) sb_putc(b, ' ');
}

/* A grid row, "s0: f0 .  b0", padded to the widths of F; no trailing blank. */
static void row_text(const fmtx *F, sbuf *b, const ast *row) {
  sb_puts(b, row->name);
  sb_putc(b, ':');
  for (int j = 0; j < row->list.n; j++) {
    if (j == 0) pad(b, F->label_w - (width_of(row->name) + 1) + 1);
    else pad(b, F->col_w[j - 1] - width_of(row->list.items[j - 1]->text) + 1);
    sb_puts(b, row->list.items[j]->text);
  }
}

/* A body with no statements and no comments before `lim` prints as "{}". */
static bool body_empty(fmtx *F, const ast_list *l, pos lim) {
  return l->n == 0 && !comment_before(F, lim);
}

/* Prints "HEAD {" (with the comment trailing that brace), the body, and
 * leaves the closing "}" to the caller in *tail. lim: where the body's
 * comments end (its '}' or the start of the next body of an if chain). */
static void print_body(fmtx *F, blockst *B, const char *head, const ast_list *l, weft_loc body,
                       pos lim, sbuf *tail) {
  if (body_empty(F, l, lim)) {
    sb_puts(tail, head);
    sb_puts(tail, "{}");
    return;
  }
  pos first = l->n ? start_of(l->items[0]->loc) : lim;
  const char *tc = take_trailing(F, body.line, start_of(body), pos_lt(first, lim) ? first : lim);
  char *code = arena_printf(&F->ar, "%s{", head);
  add_line(F, B->indent, code, tc, B->id);
  print_stmts(F, l, B->indent + 1, lim, end_of(body));
  sb_puts(tail, "}");
}

static void stmt_head(const fmtx *F, sbuf *b, const ast *s) {
  switch (s->kind) {
  case S_USE:
    if (s->name) {
      sb_puts(b, "use ");
      sb_puts(b, s->name);
    } else {
      sb_puts(b, "use \"");
      put_escaped(b, s->text);
      sb_putc(b, '"');
    }
    break;
  case S_PARAM:
  case S_LET:
  case S_MODELDEF:
    sb_puts(b, s->kind == S_PARAM ? "param " : s->kind == S_LET ? "let " : "model ");
    sb_puts(b, s->name);
    sb_puts(b, " = ");
    pe(b, s->a);
    break;
  case S_TPARAM:
  case S_INPUT:
    sb_puts(b, s->kind == S_TPARAM ? "param " : "input ");
    pe(b, s->a);
    sb_puts(b, " : ");
    pe_type(b, s->b);
    break;
  case S_FN:
    sb_puts(b, "fn ");
    sb_puts(b, s->name);
    pe_params(b, &s->list);
    sb_puts(b, " = ");
    pe(b, s->a);
    break;
  case S_OP:
    sb_puts(b, "op ");
    sb_puts(b, s->name);
    sb_putc(b, '(');
    pe_list(b, &s->list);
    sb_puts(b, ") -> ");
    pe_pattern(b, s->b);
    sb_putc(b, ' ');
    break;
  case S_MODEL:
  case S_CLUSTER:
    sb_puts(b, s->kind == S_MODEL ? "model " : "cluster ");
    sb_puts(b, s->name);
    if (s->ival) pe_params(b, &s->list);
    sb_putc(b, ' ');
    break;
  case S_ASSIGN:
    pe(b, s->a);
    sb_puts(b, " = ");
    pe(b, s->b);
    break;
  case S_BLOCK:
    sb_puts(b, "block ");
    pe(b, s->a);
    sb_putc(b, ' ');
    break;
  case S_FOR:
    sb_puts(b, "for ");
    sb_puts(b, s->name);
    sb_puts(b, " in ");
    pe(b, s->a);
    sb_putc(b, ' ');
    break;
  case S_IF:
    sb_puts(b, "if ");
    pe(b, s->a);
    sb_putc(b, ' ');
    break;
  case S_OUTPUT:
  case S_TRAIN:
    sb_puts(b, s->kind == S_OUTPUT ? "output " : "train ");
    pe(b, s->a);
    break;
  case S_ASSERT:
    sb_puts(b, "assert ");
    pe(b, s->a);
    if (s->b) {
      sb_puts(b, ", ");
      pe(b, s->b);
    }
    break;
  case S_DEVICE: sb_puts(b, "device "); break;
  case S_LINK:
    sb_puts(b, "link ");
    sb_puts(b, s->name);
    sb_putc(b, ' ');
    break;
  case S_PLAN:
  case S_STRATEGY:
    sb_puts(b, s->kind == S_PLAN ? "plan " : "strategy ");
    sb_puts(b, s->name);
    if (s->ival) pe_params(b, &s->list);
    if (s->kind == S_PLAN) {
      sb_puts(b, " for ");
      pe(b, s->a);
      sb_puts(b, " on ");
      pe(b, s->b);
    }
    sb_putc(b, ' ');
    break;
  case S_MESH:
    sb_puts(b, "mesh ");
    sb_puts(b, s->name);
    sb_puts(b, " = ");
    pe(b, s->a);
    sb_puts(b, " as [");
    pe_list(b, &s->list);
    sb_putc(b, ']');
    break;
  case S_SPLIT:
  case S_REPLICATE:
    sb_puts(b, s->kind == S_SPLIT ? "split " : "replicate ");
    pe_sel(b, s->a);
    if (s->kind == S_SPLIT) {
      sb_puts(b, " on ");
      sb_puts(b, s->name);
    }
    sb_puts(b, " into ");
    pe(b, s->b);
    if (s->text) {
      sb_puts(b, " as ");
      sb_puts(b, s->text);
    }
    if (s->ival) sb_puts(b, " in time");
    break;
  case S_PLACE:
    sb_puts(b, "assign ");
    for (int i = 0; i < s->list.n; i++) {
      if (i) sb_puts(b, ", ");
      pe_sel(b, s->list.items[i]->a);
      sb_puts(b, " -> ");
      pe(b, s->list.items[i]->b);
    }
    break;
  case S_STAGE:
    sb_puts(b, "stage ");
    for (int i = 0; i < s->list.n; i++) {
      if (i) sb_puts(b, ", ");
      if (s->list.items[i]->name) sb_puts(b, s->list.items[i]->name);
      else pe(b, s->list.items[i]->b);
      sb_puts(b, " = ");
      pe_sel(b, s->list.items[i]->a);
    }
    break;
  case S_ORDER:
    sb_puts(b, "order ");
    pe_sel(b, s->a);
    sb_puts(b, " before ");
    pe_sel(b, s->b);
    break;
  case S_SCHEDULE:
    sb_puts(b, "schedule ");
    if (s->name) sb_puts(b, s->name);
    break;
  case S_RECOMPUTE:
    sb_puts(b, "recompute ");
    pe_sel(b, s->a);
    if (s->name) {
      sb_putc(b, ' ');
      sb_puts(b, s->name);
    }
    break;
  case S_BUCKETS:
    sb_puts(b, "buckets ");
    pe(b, s->a);
    break;
  case S_SEARCH: sb_puts(b, "search"); break;
  case S_SHARD:
    sb_puts(b, "shard ");
    sb_puts(b, s->name);
    sb_putc(b, ' ');
    pe_sel(b, s->a);
    sb_puts(b, " over ");
    sb_puts(b, s->text);
    break;
  case S_CALL: pe(b, s->a); break;
  case N_ROW: row_text(F, b, s); break;
  default: sb_puts(b, "?"); break;
  }
}

/* A link or device body of `key = value` entries written on one line stays
 * on one line, "link pcie { level = "node", bandwidth = 32 GB/s }": the
 * idiom of cluster descriptions. Any other body gets a line per statement. */
static bool one_line_body(fmtx *F, const ast *s) {
  if (s->kind != S_LINK && s->kind != S_DEVICE) return false;
  if (s->list.n == 0 || s->body.line != s->body.end_line) return false;
  for (int i = 0; i < s->list.n; i++)
    if (s->list.items[i]->kind != S_ASSIGN) return false;
  return !comment_within(F, start_of(s->body), end_of(s->body));
}

/* The name the statement s starts with, when it starts with one (an
 * assignment to a path or a strategy call); else NULL. */
static const char *first_name(const ast *s) {
  const ast *p = s->kind == S_ASSIGN ? s->a : s->kind == S_CALL ? s->a->a : NULL;
  while (p && (p->kind == E_MEMBER || p->kind == E_INDEX)) p = p->a;
  return p && p->kind == E_NAME ? p->name : NULL;
}

/* Whether s must end with ';' because the statement after it starts with
 * the word that would otherwise continue it: "replicate x into n" then
 * "as = 1", or "recompute x" then "full = 1". */
static bool needs_semicolon(const ast *s, const ast *after) {
  const char *w = after ? first_name(after) : NULL;
  if (!w) return false;
  if ((s->kind == S_SPLIT || s->kind == S_REPLICATE) && !s->text && !s->ival)
    return strcmp(w, "as") == 0;
  if (s->kind == S_RECOMPUTE && !s->name)
    return strcmp(w, "selective") == 0 || strcmp(w, "full") == 0;
  return false;
}

/* Prints statement s of block B; next: where the following statement
 * (succ) starts, lim: the block's closing brace. */
static void print_stmt(fmtx *F, blockst *B, const ast *s, const ast *succ, pos next, pos lim) {
  if (!B->first && s->loc.line > B->last_line + 1) add_line(F, 0, NULL, NULL, B->id);
  const ast_list *body = body_of(s);
  /* comments inside the statement's head (or its one-line expression) move
   * before it */
  pos head_end = body && has_loc(s->body) ? start_of(s->body) : end_of(s->loc);
  if (!body) head_end.col++;
  for (const ast *c; (c = comment_before(F, head_end));) own_comment(F, B, c, false);

  sbuf head = {0}, tail = {0};
  if (s->kind == S_SCHEDULE && !s->name) grid_widths(F, s);
  stmt_head(F, &head, s);
  if (!body) {
    sb_puts(&tail, head.s);
    if (needs_semicolon(s, succ)) sb_putc(&tail, ';');
  } else if (one_line_body(F, s)) {
    sb_puts(&tail, head.s);
    sb_puts(&tail, "{ ");
    for (int i = 0; i < s->list.n; i++) {
      if (i) sb_puts(&tail, ", ");
      stmt_head(F, &tail, s->list.items[i]);
    }
    sb_puts(&tail, " }");
  } else if (s->kind != S_IF) {
    print_body(F, B, head.s, body, s->body, end_of(s->body), &tail);
  } else {
    /* if c { } else if d { } else { }: one chain of bodies */
    const ast *cur = s;
    sbuf prefix = {0};
    sb_puts(&prefix, head.s);
    for (;;) {
      bool has_else = cur->b || cur->list2.n > 0;
      pos nlim = cur->b ? start_of(cur->b->body) : has_else ? start_of(cur->body2) : end_of(cur->body);
      if (!has_else && has_loc(cur->body2) &&
          comment_within(F, start_of(cur->body2), end_of(cur->body2))) {
        has_else = true;  /* an empty else body that holds comments */
        nlim = start_of(cur->body2);
      }
      sbuf t = {0};
      print_body(F, B, prefix.s, &cur->list, cur->body, nlim, &t);
      prefix.n = 0;
      sb_puts(&prefix, t.s);
      free(t.s);
      if (cur->b) {
        sb_puts(&prefix, " else if ");
        pe(&prefix, cur->b->a);
        sb_putc(&prefix, ' ');
        cur = cur->b;
        continue;
      }
      if (has_else) {
        sb_puts(&prefix, " else ");
        sbuf t2 = {0};
        print_body(F, B, prefix.s, &cur->list2, cur->body2, end_of(cur->body2), &t2);
        prefix.n = 0;
        sb_puts(&prefix, t2.s);
        free(t2.s);
      }
      break;
    }
    sb_puts(&tail, prefix.s);
    free(prefix.s);
  }
  pos after = end_of(s->loc);
  pos before = pos_lt(lim, next) ? lim : next;
  if (next.line <= s->loc.end_line) before = (pos){ s->loc.end_line, 0 };  /* no trailing */
  const char *tc = take_trailing(F, s->loc.end_line, after, before);
  add_line(F, B->indent, tail.s, tc, B->id);
  free(head.s);
  free(tail.s);
  B->first = false;
  B->last_line = s->loc.end_line;
}

/* lim: where the block's comments end; close: its '}' (comments between
 * close and lim, before an else, join the end of the block). */
static void print_stmts(fmtx *F, const ast_list *l, int indent, pos lim, pos close) {
  blockst B = { indent, F->nblocks++, true, 0 };
  for (int i = 0; i < l->n; i++) {
    const ast *s = l->items[i];
    for (const ast *c; (c = comment_before(F, start_of(s->loc)));) own_comment(F, &B, c, true);
    const ast *after = i + 1 < l->n ? l->items[i + 1] : NULL;
    pos next = after ? start_of(after->loc) : POS_END;
    print_stmt(F, &B, s, after, next, lim);
  }
  for (const ast *c; (c = comment_before(F, lim));)
    own_comment(F, &B, c, pos_lt(start_of(c->loc), close));
}

static void emit(fmtx *F, FILE *out) {
  int i = 0;
  while (i < F->nlines) {
    /* a run of lines of one block, each with a trailing comment */
    int j = i, width = 0;
    while (j < F->nlines && F->lines[j].code && F->lines[j].comment &&
           F->lines[j].block == F->lines[i].block) {
      int w = F->lines[j].indent * 2 + width_of(F->lines[j].code);
      if (w > width) width = w;
      j++;
    }
    if (j == i) {
      fline *l = &F->lines[i];
      if (l->code) fprintf(out, "%*s%s", l->indent * 2, "", l->code);
      fputc('\n', out);
      i++;
      continue;
    }
    for (; i < j; i++) {
      fline *l = &F->lines[i];
      int w = l->indent * 2 + width_of(l->code);
      fprintf(out, "%*s%s%*s#%s\n", l->indent * 2, "", l->code, width - w + 2, "", l->comment);
    }
  }
}

void weft_fmt(const ast *file, const weft_src *src, FILE *out) {
  (void)src;
  fmtx F;
  memset(&F, 0, sizeof F);
  arena_init(&F.ar);
  F.comments = &file->list2;
  print_stmts(&F, &file->list, 0, POS_END, POS_END);
  emit(&F, out);
  arena_free(&F.ar);
}

char *weft_fmt_string(const ast *file, const weft_src *src, size_t *len) {
  char *buf = NULL;
  size_t n = 0;
  FILE *m = open_memstream(&buf, &n);
  if (!m) weft_oom();
  weft_fmt(file, src, m);
  if (fclose(m) != 0 || !buf) weft_oom();
  if (len) *len = n;
  return buf;
}

/* ---- the roundtrip check ---------------------------------------------------------- */

static int cmp_text(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool same_comments(const ast *x, const ast *y) {
  if (x->list2.n != y->list2.n) return false;
  int n = x->list2.n;
  if (n == 0) return true;
  const char **a = malloc(sizeof(char *) * (size_t)n * 2);
  if (!a) weft_oom();
  const char **b = a + n;
  for (int i = 0; i < n; i++) {
    a[i] = x->list2.items[i]->text;
    b[i] = y->list2.items[i]->text;
  }
  qsort(a, (size_t)n, sizeof *a, cmp_text);
  qsort(b, (size_t)n, sizeof *b, cmp_text);
  bool same = true;
  for (int i = 0; i < n && same; i++) same = strcmp(a[i], b[i]) == 0;
  free(a);
  return same;
}

static int first_diff_line(const char *a, const char *b) {
  int line = 1;
  for (; *a && *a == *b; a++, b++)
    if (*a == '\n') line++;
  return line;
}

int weft_fmt_roundtrip(const char *path, weft_srcs *srcs, arena *ar, weft_diags *diags,
                       FILE *err) {
  char why[256];
  int f = src_read(srcs, ar, path, why, sizeof why);
  if (f < 0) {
    fprintf(err, "%s: cannot read the file: %s\n", path, why);
    return 2;
  }
  weft_parse_opts o = { ar, srcs, diags };
  ast *t1 = weft_parse(&o, f);
  if (!t1) return 2;
  size_t n1;
  char *out1 = weft_fmt_string(t1, &srcs->items[f], &n1);
  char *path2 = arena_printf(ar, "%s (formatted)", path);
  int f2 = src_add(srcs, ar, path2, srcs->items[f].dir, out1, n1);
  ast *t2 = weft_parse(&o, f2);
  int rc = 0;
  if (!t2) {
    fprintf(err, "%s: the formatted text does not parse\n", path);
    rc = 1;
  } else if (!ast_equal(t1, t2)) {
    fprintf(err, "%s: the formatted text parses to a different tree\n", path);
    rc = 1;
  } else if (!same_comments(t1, t2)) {
    fprintf(err, "%s: the formatted text does not keep every comment (%d before, %d after)\n",
            path, t1->list2.n, t2->list2.n);
    rc = 1;
  } else {
    size_t n2;
    char *out2 = weft_fmt_string(t2, &srcs->items[f2], &n2);
    if (n1 != n2 || memcmp(out1, out2, n1) != 0) {
      fprintf(err, "%s: fmt is not idempotent (formatting twice differs at line %d)\n", path,
              first_diff_line(out1, out2));
      rc = 1;
    }
    free(out2);
  }
  free(out1);
  return rc;
}
