/* ast.h - the syntax tree of .plan files, as the parser builds it.
 * Nodes live in the parse arena and are never freed alone; locations are exact. */
#ifndef WEFT_AST_H
#define WEFT_AST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "weft/diag.h"

typedef struct ast ast;

typedef struct ast_list {
  ast **items;
  int n, cap;
} ast_list;

/* Every kind, with the fields it uses. Unused fields are zero.
 * "body" means list of statements; "args" a list of N_ARG. */
#define AST_KINDS(X)                                                            \
  /* expressions */                                                             \
  X(E_INT)      /* ival; text = literal as written ("1_000") */                 \
  X(E_FLOAT)    /* fval; text = literal as written */                           \
  X(E_QUANTITY) /* fval = number; text = number as written; name = unit ("GB/s") */ \
  X(E_STRING)   /* list: parts, each E_STRPART or an interpolated expression */ \
  X(E_STRPART)  /* text = literal characters, escapes already decoded */        \
  X(E_BOOL)     /* ival = 0 or 1 */                                             \
  X(E_HOLE)     /* ?: an open decision, a number weft search fills */            \
  X(E_NAME)     /* name */                                                      \
  X(E_MEMBER)   /* a = base; then name (a.b) or b = E_INT segment (a.3) or      \
                   b = expression with op = '{' (a.{expr}) */                   \
  X(E_CALL)     /* a = callee; list = args (N_ARG) */                           \
  X(E_INDEX)    /* a[b]; with several indices, a[i, j, ...]: b = NULL and      \
                   list = the indices (two or more) */                          \
  X(E_UNARY)    /* op = '-' or T_NOT; a */                                      \
  X(E_BINARY)   /* op = '+' '-' '*' '/' '%' T_IDIV T_EQ T_NE '<' T_LE '>' T_GE  \
                   T_AND T_OR; a, b */                                          \
  X(E_RANGE)    /* a..b */                                                      \
  X(E_IF)       /* if a then b else c */                                        \
  X(E_LIST)     /* list = items */                                              \
  X(E_RECORD)   /* list = fields (N_FIELD) */                                   \
  X(E_PAREN)    /* (a): kept so that fmt prints what was written */             \
  /* parts */                                                                   \
  X(N_ARG)      /* name = keyword or NULL; a = value */                         \
  X(N_FIELD)    /* name; a = value */                                           \
  X(N_PARAM)    /* name; a = default or NULL (fn/model/cluster parameters) */   \
  X(N_TYPE)     /* a = dtype expression or NULL; list = dimension expressions */ \
  X(N_OPARG)    /* name; b = N_PATTERN for a tensor argument, or NULL for an    \
                   attribute; a = attribute default or NULL */                  \
  X(N_PATTERN)  /* name = dtype ("i32") or NULL; list = N_DIM */                \
  X(N_DIM)      /* name; op = 0, '+', '^' or T_DOTDOT; or, for a group          \
                   "(3 n dh)", name = NULL and list = factors (E_INT or E_NAME) \
                   whose op is 0, '+' or '^' ("(3 n^ dh)") */                   \
  X(N_SEL)      /* selector: list = atoms, each a path (E_NAME, E_MEMBER; a     \
                   segment "*" or "**" is E_MEMBER name "*"/"**", a leading one \
                   E_NAME "*"/"**") or E_INDEX of a path and a range expression \
                   (h[0..6]); "{a, b}" and a lone atom both give N_SEL */       \
  X(N_PLACE)    /* one "SEL -> EXPR" of assign: a = N_SEL; b = device expr */   \
  X(N_ROW)      /* a schedule grid row: name = label as written ("s0", "3");    \
                   list = N_CELL */                                             \
  X(N_CELL)     /* a grid cell: text = as written ("f3", "b12", "f3.1", ".");   \
                   op = 'f', 'b', 'r', 'w', or '.' when idle; ival = micro-batch \
                   number (0 when idle); a = E_INT chunk ("f3.1") or NULL */    \
  /* statements */                                                              \
  X(S_FILE)     /* list = items; list2 = comments (N_COMMENT) */                \
  X(N_COMMENT)  /* text = comment without the leading '#' and newline */        \
  X(S_USE)      /* name = module ("std") or text = path string */               \
  X(S_PARAM)    /* name; a = default (top-level parameter) */                   \
  X(S_LET)      /* name; a */                                                   \
  X(S_FN)       /* name; list = N_PARAM; a = body expression */                 \
  X(S_OP)       /* name; list = N_OPARG; b = result N_PATTERN; list2 = body     \
                   (S_ASSIGN) */                                                \
  X(S_MODEL)    /* name; list = N_PARAM; list2 = body; ival = 1 if it had "()" */ \
  X(S_MODELDEF) /* model NAME = expr: name; a */                                \
  X(S_CLUSTER)  /* name; list = N_PARAM; list2 = body; ival = 1 if it had "()" */ \
  X(S_INPUT)    /* a = path expression (E_NAME/E_MEMBER); b = N_TYPE */         \
  X(S_TPARAM)   /* model parameter: a = path; b = N_TYPE */                     \
  X(S_ASSIGN)   /* a = path; b = value */                                       \
  X(S_BLOCK)    /* a = path; list = body */                                     \
  X(S_FOR)      /* name = variable; a = iterable; list = body */                \
  X(S_IF)       /* a = condition; list = then body; list2 = else body;          \
                   b = S_IF when written "else if" (then list2 is empty) */     \
  X(S_OUTPUT)   /* a */                                                         \
  X(S_TRAIN)    /* a = E_CALL of the optimizer */                               \
  X(S_ASSERT)   /* a = condition; b = message or NULL */                        \
  X(S_DEVICE)   /* list = body */                                               \
  X(S_LINK)     /* name; list = body */                                         \
  /* plan statements: the parser accepts them in any body; the evaluator      \
     checks where they may stand */                                           \
  X(S_PLAN)     /* name; list = N_PARAM; a = model expr; b = cluster expr;      \
                   list2 = body; ival = 1 if it had "()" */                     \
  X(S_STRATEGY) /* name; list = N_PARAM; list2 = body; ival = 1 if "()" */      \
  X(S_MESH)     /* name; a = device-set expr; list = axes (N_FIELD) */          \
  X(S_SPLIT)    /* a = N_SEL; name = dimension; b = count expr; text = axis or  \
                   NULL ("as AXIS"); ival = 1 for "in time" */                  \
  X(S_REPLICATE) /* a = N_SEL; b = count expr; text = axis or NULL */           \
  X(S_PLACE)    /* assign: list = N_PLACE */                                    \
  X(S_STAGE)    /* list = N_FIELD (name = stage; a = N_SEL) */                  \
  X(S_ORDER)    /* a before b: a, b = N_SEL */                                  \
  X(S_SCHEDULE) /* list = N_ROW (grid in body), or name: a generator */        \
  X(S_RECOMPUTE) /* a = N_SEL; name = "selective", "full" or NULL */            \
  X(S_SHARD)    /* shard STATE SEL over AXIS (ZeRO): name = state as written    \
                   ("optimizer", checked when evaluated); a = N_SEL;            \
                   text = axis */                                               \
  X(S_BUCKETS)  /* buckets SIZE: a = the bytes expression */                    \
  X(S_SEARCH)   /* search: what the plan does not write, left to weft search */ \
  X(S_CALL)     /* a strategy called as a statement: a = E_CALL */

typedef enum {
#define AST_ENUM(k) k,
  AST_KINDS(AST_ENUM)
#undef AST_ENUM
  AST_KIND_COUNT
} ast_kind;

/* Operator codes above the ASCII range, for E_UNARY/E_BINARY/N_DIM. */
enum { T_EQ = 256, T_NE, T_LE, T_GE, T_AND, T_OR, T_NOT, T_IDIV, T_DOTDOT };

struct ast {
  ast_kind kind;
  weft_loc loc;
  int op;
  int depth;            /* 1 + the deepest child: bounds every recursive walk */
  const char *name;
  const char *text;
  int64_t ival;
  double fval;
  ast *a, *b, *c;
  ast_list list, list2;
  /* Statements with a body: the span '{' .. '}' of the body (list, or list2
   * for S_OP/S_MODEL/S_CLUSTER/S_PLAN/S_STRATEGY; the grid of S_SCHEDULE);
   * body2: the else body of S_IF. fmt places
   * comments with them; like loc, ast_equal ignores them. */
  weft_loc body, body2;
};

/* Deeper trees are rejected by the parser, so walkers may recurse. */
enum { AST_MAX_DEPTH = 512 };

extern const char *const ast_kind_names[AST_KIND_COUNT];
/* "==", "and", "+" for the operator codes of E_UNARY/E_BINARY/N_DIM. */
const char *ast_op_name(int op);

ast *ast_new(arena *ar, ast_kind kind, weft_loc loc);
void ast_push(arena *ar, ast_list *l, ast *item);

/* Structural equality of every field but locations, depth and comments:
 * the test of parse(fmt(x)) == parse(x). */
bool ast_equal(const ast *x, const ast *y);
/* An S-expression dump, for tests and `weft parse --dump` debugging. */
void ast_dump(const ast *n, FILE *out);

/* Parses file `file` of srcs. Returns an S_FILE, or NULL when there were
 * syntax errors (all reported to diags, up to diags->max_errors). */
typedef struct weft_parse_opts {
  arena *arena;
  weft_srcs *srcs;
  weft_diags *diags;
} weft_parse_opts;
ast *weft_parse(weft_parse_opts *o, int file);

/* Parses a single expression (for --set values); NULL on error. */
ast *weft_parse_expr(weft_parse_opts *o, int file);

/* Canonical source of a parsed file, comments kept (interp/fmt.c). */
void weft_fmt(const ast *file, const weft_src *src, FILE *out);
/* The same into a malloc'd NUL-terminated string (the caller frees it). */
char *weft_fmt_string(const ast *file, const weft_src *src, size_t *len);
/* `weft fmt --roundtrip FILE`: reads and parses path, formats it, parses the
 * result again and checks the two trees are ast_equal, every comment is kept
 * and formatting again changes nothing. Returns 0 when all hold; 1 when one
 * fails (a line "PATH: what failed" goes to err; a parse error of the
 * formatted text is also in diags, under the file "PATH (formatted)"); 2 when
 * the file cannot be read (message to err) or has errors (in diags). */
int weft_fmt_roundtrip(const char *path, weft_srcs *srcs, arena *ar, weft_diags *diags,
                       FILE *err);

#endif
