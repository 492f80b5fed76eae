/* ast.c - syntax tree nodes: construction, structural equality and the
 * S-expression dump used by tests and `weft parse --dump`. The parser (in
 * grammar/) rejects trees deeper than AST_MAX_DEPTH, so these may recurse. */
#include "weft/ast.h"

#include <math.h>
#include <string.h>

const char *const ast_kind_names[AST_KIND_COUNT] = {
#define AST_NAME(k) #k,
  AST_KINDS(AST_NAME)
#undef AST_NAME
};

ast *ast_new(arena *ar, ast_kind kind, weft_loc loc) {
  ast *n = arena_alloc(ar, sizeof *n);
  n->kind = kind;
  n->loc = loc;
  n->depth = 1;
  return n;
}

void ast_push(arena *ar, ast_list *l, ast *item) {
  arena_grow(ar, (void **)&l->items, &l->cap, l->n + 1, sizeof(ast *));
  l->items[l->n++] = item;
}

static bool str_eq(const char *a, const char *b) {
  if (!a || !b) return a == b;
  return strcmp(a, b) == 0;
}

static bool list_equal(const ast_list *a, const ast_list *b) {
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (!ast_equal(a->items[i], b->items[i])) return false;
  return true;
}

/* Every kind is compared field by field, so the plan statements need no
 * case of their own: an N_SEL of one atom is the same whether written "h"
 * or "{h}", and a grid cell compares as written ("f03" is not "f3"). */
bool ast_equal(const ast *x, const ast *y) {
  if (!x || !y) return x == y;
  if (x->kind != y->kind || x->op != y->op || x->ival != y->ival) return false;
  if (!(x->fval == y->fval || (isnan(x->fval) && isnan(y->fval)))) return false;
  if (!str_eq(x->name, y->name) || !str_eq(x->text, y->text)) return false;
  if (!ast_equal(x->a, y->a) || !ast_equal(x->b, y->b) || !ast_equal(x->c, y->c)) return false;
  if (!list_equal(&x->list, &y->list)) return false;
  /* the comments of a file are not part of its meaning */
  if (x->kind != S_FILE && !list_equal(&x->list2, &y->list2)) return false;
  return true;
}

/* ---- dump ------------------------------------------------------------------ */

const char *ast_op_name(int op) {
  /* single-character operators point into this table: no shared buffer */
  static const char chars[] = "+\0-\0*\0/\0%\0<\0>\0^\0{\0";
  switch (op) {
  case T_EQ: return "==";
  case T_NE: return "!=";
  case T_LE: return "<=";
  case T_GE: return ">=";
  case T_AND: return "and";
  case T_OR: return "or";
  case T_NOT: return "not";
  case T_IDIV: return "//";
  case T_DOTDOT: return "..";
  default:
    for (size_t i = 0; i + 1 < sizeof chars; i += 2)
      if (chars[i] == op) return chars + i;
    return "?";
  }
}

static void dump_str(const char *s, FILE *out) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", out);
    else if (*p == '\t') fputs("\\t", out);
    else if (*p < 0x20 || *p == 0x7f) fprintf(out, "\\x%02x", *p);
    else fputc(*p, out);
  }
  fputc('"', out);
}

static void dump(const ast *n, FILE *out);

static void dump_list(const ast_list *l, FILE *out) {
  for (int i = 0; i < l->n; i++) {
    fputc(' ', out);
    dump(l->items[i], out);
  }
}

/* "(tag a b ...)" with the list items appended. */
static void dump_body(const char *tag, const ast_list *l, FILE *out) {
  fprintf(out, "(%s", tag);
  dump_list(l, out);
  fputc(')', out);
}

/* " (p q ...)": a parameter list. */
static void dump_params(const ast_list *l, FILE *out) {
  fputs(" (", out);
  for (int i = 0; i < l->n; i++) {
    if (i) fputc(' ', out);
    dump(l->items[i], out);
  }
  fputc(')', out);
}

static void dump(const ast *n, FILE *out) {
  if (!n) { fputs("_", out); return; }
  switch (n->kind) {
  case E_INT: fprintf(out, "%lld", (long long)n->ival); break;
  case E_FLOAT: fputs(n->text ? n->text : "?", out); break;
  case E_QUANTITY: fprintf(out, "(q %s %s)", n->text, n->name); break;
  case E_STRING:
    fputs("(str", out);
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case E_STRPART: dump_str(n->text, out); break;
  case E_BOOL: fputs(n->ival ? "true" : "false", out); break;
  case E_HOLE: fputs("?", out); break;
  case E_NAME: fputs(n->name, out); break;
  case E_MEMBER:
    fputs(n->op == '{' ? "(.{} " : "(. ", out);
    dump(n->a, out);
    fputc(' ', out);
    if (n->b) dump(n->b, out); else fputs(n->name, out);
    fputc(')', out);
    break;
  case E_CALL:
    fputs("(call ", out);
    dump(n->a, out);
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case E_INDEX:
    fputs("(index ", out);
    dump(n->a, out);
    if (n->b) {
      fputc(' ', out);
      dump(n->b, out);
    } else {
      dump_list(&n->list, out);
    }
    fputc(')', out);
    break;
  case E_UNARY:
    fprintf(out, "(%s ", ast_op_name(n->op));
    dump(n->a, out);
    fputc(')', out);
    break;
  case E_BINARY:
  case E_RANGE:
    fprintf(out, "(%s ", n->kind == E_RANGE ? ".." : ast_op_name(n->op));
    dump(n->a, out);
    fputc(' ', out);
    dump(n->b, out);
    fputc(')', out);
    break;
  case E_IF:
    fputs("(if ", out);
    dump(n->a, out);
    fputc(' ', out);
    dump(n->b, out);
    fputc(' ', out);
    dump(n->c, out);
    fputc(')', out);
    break;
  case E_LIST: dump_body("list", &n->list, out); break;
  case E_RECORD: dump_body("record", &n->list, out); break;
  case E_PAREN:
    fputs("(paren ", out);
    dump(n->a, out);
    fputc(')', out);
    break;
  case N_ARG:
  case N_FIELD:
  case N_PARAM:
    if (n->name && n->a) {
      fprintf(out, "(= %s ", n->name);
      dump(n->a, out);
      fputc(')', out);
    } else if (n->b && n->a) {
      fputs("(= ", out);
      dump(n->b, out);
      fputc(' ', out);
      dump(n->a, out);
      fputc(')', out);
    } else if (n->name) {
      fputs(n->name, out);
    } else {
      dump(n->a, out);
    }
    break;
  case N_TYPE:
    fputs("(type ", out);
    dump(n->a, out);
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case N_OPARG:
    fprintf(out, "(arg %s", n->name);
    if (n->b) { fputc(' ', out); dump(n->b, out); }
    if (n->a) { fputs(" = ", out); dump(n->a, out); }
    fputc(')', out);
    break;
  case N_PATTERN:
    fprintf(out, "(pattern %s", n->name ? n->name : "_");
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case N_DIM:
    if (!n->name) {
      fputs("(group", out);
      for (int i = 0; i < n->list.n; i++) {
        fputc(' ', out);
        dump(n->list.items[i], out);
        if (n->list.items[i]->op) fputs(ast_op_name(n->list.items[i]->op), out);
      }
      fputc(')', out);
    } else {
      fprintf(out, "%s%s", n->name, n->op ? ast_op_name(n->op) : "");
    }
    break;
  case N_SEL: dump_body("sel", &n->list, out); break;
  case N_PLACE:
    fputs("(-> ", out);
    dump(n->a, out);
    fputc(' ', out);
    dump(n->b, out);
    fputc(')', out);
    break;
  case N_ROW:
    fprintf(out, "(row %s", n->name);
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case N_CELL: fputs(n->text, out); break;
  case S_FILE: dump_body("file", &n->list, out); break;
  case N_COMMENT:
    fputs("(comment ", out);
    dump_str(n->text, out);
    fputc(')', out);
    break;
  case S_USE:
    fputs("(use ", out);
    if (n->name) fputs(n->name, out); else dump_str(n->text, out);
    fputc(')', out);
    break;
  case S_PARAM:
  case S_LET:
  case S_MODELDEF:
    fprintf(out, "(%s %s ", n->kind == S_PARAM ? "param" : n->kind == S_LET ? "let" : "model=",
            n->name);
    dump(n->a, out);
    fputc(')', out);
    break;
  case S_FN:
    fprintf(out, "(fn %s (", n->name);
    for (int i = 0; i < n->list.n; i++) {
      if (i) fputc(' ', out);
      dump(n->list.items[i], out);
    }
    fputs(") ", out);
    dump(n->a, out);
    fputc(')', out);
    break;
  case S_OP:
    fprintf(out, "(op %s (", n->name);
    for (int i = 0; i < n->list.n; i++) {
      if (i) fputc(' ', out);
      dump(n->list.items[i], out);
    }
    fputs(") ", out);
    dump(n->b, out);
    dump_list(&n->list2, out);
    fputc(')', out);
    break;
  case S_MODEL:
  case S_CLUSTER:
    fprintf(out, "(%s %s", n->kind == S_MODEL ? "model" : "cluster", n->name);
    if (n->ival) dump_params(&n->list, out);
    dump_list(&n->list2, out);
    fputc(')', out);
    break;
  case S_INPUT:
  case S_TPARAM:
  case S_ASSIGN:
    fprintf(out, "(%s ", n->kind == S_INPUT ? "input" : n->kind == S_TPARAM ? "tparam" : "=");
    dump(n->a, out);
    fputc(' ', out);
    dump(n->b, out);
    fputc(')', out);
    break;
  case S_BLOCK:
    fputs("(block ", out);
    dump(n->a, out);
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case S_FOR:
    fprintf(out, "(for %s ", n->name);
    dump(n->a, out);
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case S_IF:
    fputs("(if ", out);
    dump(n->a, out);
    fputs(" (then", out);
    dump_list(&n->list, out);
    fputc(')', out);
    if (n->b) {
      fputs(" (else ", out);
      dump(n->b, out);
      fputc(')', out);
    } else if (n->list2.n) {
      fputs(" (else", out);
      dump_list(&n->list2, out);
      fputc(')', out);
    }
    fputc(')', out);
    break;
  case S_OUTPUT:
  case S_TRAIN:
    fprintf(out, "(%s ", n->kind == S_OUTPUT ? "output" : "train");
    dump(n->a, out);
    fputc(')', out);
    break;
  case S_ASSERT:
    fputs("(assert ", out);
    dump(n->a, out);
    if (n->b) { fputc(' ', out); dump(n->b, out); }
    fputc(')', out);
    break;
  case S_DEVICE: dump_body("device", &n->list, out); break;
  case S_LINK:
    fprintf(out, "(link %s", n->name);
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case S_PLAN:
  case S_STRATEGY:
    fprintf(out, "(%s %s", n->kind == S_PLAN ? "plan" : "strategy", n->name);
    if (n->ival) dump_params(&n->list, out);
    if (n->kind == S_PLAN) {
      fputs(" (for ", out);
      dump(n->a, out);
      fputs(") (on ", out);
      dump(n->b, out);
      fputc(')', out);
    }
    dump_list(&n->list2, out);
    fputc(')', out);
    break;
  case S_MESH:
    fprintf(out, "(mesh %s ", n->name);
    dump(n->a, out);
    dump_list(&n->list, out);
    fputc(')', out);
    break;
  case S_SPLIT:
  case S_REPLICATE:
    fputs(n->kind == S_SPLIT ? "(split " : "(replicate ", out);
    dump(n->a, out);
    if (n->kind == S_SPLIT) fprintf(out, " %s", n->name);
    fputc(' ', out);
    dump(n->b, out);
    if (n->text) fprintf(out, " (as %s)", n->text);
    if (n->ival) fputs(" (in time)", out);
    fputc(')', out);
    break;
  case S_PLACE: dump_body("assign", &n->list, out); break;
  case S_STAGE: dump_body("stage", &n->list, out); break;
  case S_ORDER:
    fputs("(order ", out);
    dump(n->a, out);
    fputc(' ', out);
    dump(n->b, out);
    fputc(')', out);
    break;
  case S_SCHEDULE:
    if (n->name) fprintf(out, "(schedule %s)", n->name);
    else dump_body("schedule", &n->list, out);
    break;
  case S_RECOMPUTE:
    fputs("(recompute ", out);
    dump(n->a, out);
    if (n->name) fprintf(out, " %s", n->name);
    fputc(')', out);
    break;
  case S_SHARD:
    fprintf(out, "(shard %s ", n->name);
    dump(n->a, out);
    fprintf(out, " (over %s))", n->text);
    break;
  case S_BUCKETS:
    fputs("(buckets ", out);
    dump(n->a, out);
    fputc(')', out);
    break;
  case S_SEARCH: fputs("(search)", out); break;
  case S_CALL:
    fputs("(do ", out);
    dump(n->a, out);
    fputc(')', out);
    break;
  case AST_KIND_COUNT: break;
  }
}

void ast_dump(const ast *n, FILE *out) { dump(n, out); }
