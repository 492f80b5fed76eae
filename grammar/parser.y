/* parser.y - the grammar of .plan files: a pure LALR(1) parser that builds
 * the tree of interp/ast.h in the parse arena. One statement grammar serves
 * every context (top level, model, cluster, op, device, link, plan and
 * strategy bodies); the evaluator rejects a statement in the wrong place.
 * Errors are reported with positions and the parser resynchronises at the
 * next statement. */

%code top {
#include <stdlib.h>
#include <string.h>
}

%code requires {
#include "weft/ast.h"
typedef struct weft_pctx weft_pctx;
}

%code provides {
enum { WEFT_MAX_NEST = 256 };

/* State shared by the scanner and the parser for one parse. */
struct weft_pctx {
  arena *ar;
  weft_diags *diags;
  const weft_src *src;
  int file;
  int start_token;           /* first token to hand out: START_FILE or START_EXPR */
  int line, col;             /* position of the next byte to scan */
  int nest;                  /* open brackets, for the nesting limit */
  int parens;                /* open '(' '[' and interpolations: no statement inside */
  bool grid;                 /* the parser read "schedule {": the scanner reads a grid */
  int last_line;             /* end line of the previous token */
  bool tok_bol;              /* the last token read is the first on its line */
  bool tok_stmt_kw;          /* the last token read is a statement keyword */
  int syntax_errors;
  bool fatal;                /* stop: the scanner returns end of file from now on */
  bool deep_reported;
  int unterminated_line;     /* line of the last "unterminated string" error */
  int ninterp;               /* open string interpolations */
  int interp_braces[WEFT_MAX_NEST + 2];  /* '{' open inside each interpolation */
  weft_loc str_start[WEFT_MAX_NEST + 2]; /* opening quote of each open string */
  char *buf;                 /* characters of the string part being read (malloc) */
  size_t blen, bcap;
  bool bopen;
  weft_loc bloc;
  ast_list comments;
  ast *result;
};

int weft_yylex(WEFT_YYSTYPE *lval, weft_loc *lloc, void *scanner);
}

%code {
void weft_yyerror(weft_loc *loc, void *scanner, weft_pctx *P, const char *msg);

#define YYLLOC_DEFAULT(Cur, Rhs, N)                                   \
  do {                                                                \
    if (N) {                                                          \
      (Cur).file = YYRHSLOC(Rhs, 1).file;                             \
      (Cur).line = YYRHSLOC(Rhs, 1).line;                             \
      (Cur).col = YYRHSLOC(Rhs, 1).col;                               \
      (Cur).end_line = YYRHSLOC(Rhs, N).end_line;                     \
      (Cur).end_col = YYRHSLOC(Rhs, N).end_col;                       \
    } else {                                                          \
      (Cur).file = YYRHSLOC(Rhs, 0).file;                             \
      (Cur).line = (Cur).end_line = YYRHSLOC(Rhs, 0).end_line;        \
      (Cur).col = YYRHSLOC(Rhs, 0).end_col + 1;                       \
      (Cur).end_col = YYRHSLOC(Rhs, 0).end_col;                       \
    }                                                                 \
  } while (0)

/* Legitimate plans stay far below this; pathological input (a million
 * prefix minus signs) gets a positioned error instead of a huge stack. */
#define YYMAXDEPTH 100000

/* 1 + the deepest child; a tree deeper than AST_MAX_DEPTH is an error that
 * stops the parse, so every later walker may recurse. */
static ast *fin(weft_pctx *P, ast *n) {
  int d = 0;
  if (n->a && n->a->depth > d) d = n->a->depth;
  if (n->b && n->b->depth > d) d = n->b->depth;
  if (n->c && n->c->depth > d) d = n->c->depth;
  for (int i = 0; i < n->list.n; i++)
    if (n->list.items[i]->depth > d) d = n->list.items[i]->depth;
  for (int i = 0; i < n->list2.n; i++)
    if (n->list2.items[i]->depth > d) d = n->list2.items[i]->depth;
  n->depth = d + 1;
  if (n->depth > AST_MAX_DEPTH && !P->deep_reported) {
    P->deep_reported = true;
    P->fatal = true;
    diag_add(P->diags, DIAG_ERROR, n->loc, "nesting too deep (more than %d levels)", AST_MAX_DEPTH);
  }
  return n;
}

static ast *mk(weft_pctx *P, ast_kind k, weft_loc loc, ast *a, ast *b) {
  ast *n = ast_new(P->ar, k, loc);
  n->a = a;
  n->b = b;
  return fin(P, n);
}

static ast *mkname(weft_pctx *P, ast_kind k, weft_loc loc, const char *name, ast *a, ast *b) {
  ast *n = mk(P, k, loc, a, b);
  n->name = name;
  return n;
}

static ast *mkop(weft_pctx *P, ast_kind k, weft_loc loc, int op, ast *a, ast *b) {
  ast *n = mk(P, k, loc, a, b);
  n->op = op;
  return n;
}

/* A node whose children are lists: fin runs once the lists are attached. */
static ast *mklists(weft_pctx *P, ast_kind k, weft_loc loc, const char *name, ast *a, ast *b,
                    ast_list l1, ast_list l2) {
  ast *n = ast_new(P->ar, k, loc);
  n->name = name;
  n->a = a;
  n->b = b;
  n->list = l1;
  n->list2 = l2;
  return fin(P, n);
}

static ast_list list1(weft_pctx *P, ast *x) {
  ast_list l = {0};
  if (x) ast_push(P->ar, &l, x);
  return l;
}

static ast_list listpush(weft_pctx *P, ast_list l, ast *x) {
  if (x) ast_push(P->ar, &l, x);
  return l;
}

/* a[i] (b = i), or a[i, j, ...] (list = the indices). */
static ast *mk_index(weft_pctx *P, weft_loc loc, ast *a, ast_list idx) {
  if (idx.n == 1) return mk(P, E_INDEX, loc, a, idx.items[0]);
  return mklists(P, E_INDEX, loc, NULL, a, NULL, idx, (ast_list){0});
}

/* The integer value of digits with optional underscores (already checked by
 * the scanner); -1 when it does not fit. */
static int64_t int_of_text(const char *s) {
  int64_t v = 0;
  for (; *s; s++) {
    if (*s == '_') continue;
    if (*s < '0' || *s > '9') return -1;
    int d = *s - '0';
    if (v > (INT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  return v;
}

/* "(2 s)" in a pattern scans as the quantity "2 s": split it back into the
 * factors 2 and s. */
static ast_list split_quantity(weft_pctx *P, ast_list l, ast *q, int op) {
  const char *t = q->text;
  bool digits = t[0] != 0;
  for (const char *c = t; *c; c++)
    if (!(*c >= '0' && *c <= '9') && *c != '_') digits = false;
  if (!digits || strchr(q->name, '/') || int_of_text(t) < 0) {
    diag_add(P->diags, DIAG_ERROR, q->loc, "expected a dimension name or an integer");
    return l;
  }
  weft_loc nl = q->loc;
  nl.end_line = nl.line;
  nl.end_col = nl.col + (int)strlen(t) - 1;
  ast *num = mk(P, E_INT, nl, NULL, NULL);
  num->text = t;
  num->ival = int_of_text(t);
  weft_loc ul = q->loc;
  ul.line = ul.end_line;
  ul.col = ul.end_col - (int)strlen(q->name) + 1;
  ast *unit = mkname(P, E_NAME, ul, q->name, NULL, NULL);
  unit->op = op;
  l = listpush(P, l, num);
  return listpush(P, l, unit);
}
}

%define api.pure full
%define api.prefix {weft_yy}
%define api.token.prefix {TK_}
%define api.location.type {weft_loc}
%define parse.error custom
%define parse.lac full
%locations
%param {void *scanner}
%parse-param {weft_pctx *P}

%initial-action {
  @$.file = P->file;
  @$.line = @$.end_line = 1;
  @$.col = 1;
  @$.end_col = 0;
}

%union {
  ast *node;
  const char *str;
  ast_list list;
  int op;
}

%token START_FILE START_EXPR
%token <str> IDENT
%token <node> INT FLOAT QUANTITY STR_PART CELL
%token <str> ROW_LABEL
%token STR_BEGIN STR_END INTERP_BEGIN INTERP_END
%token USE PARAM LET FN OP MODEL CLUSTER DEVICE LINK INPUT OUTPUT BLOCK
%token FOR IN IF THEN ELSE TRAIN ASSERT TRUE FALSE AND OR NOT PLAN
%token STRATEGY MESH SPLIT REPLICATE ASSIGN STAGE ORDER SCHEDULE RECOMPUTE SHARD BUCKETS SEARCH
%token ON INTO AS TIME BEFORE SELECTIVE FULL OVER
%token EQ NE LE GE IDIV ARROW DOTDOT STARSTAR

/* The conflicts of the grammar, all resolved towards the longer statement:
 * - "assert c, x" takes x as the message, and "assign a -> d, b -> e" and
 *   "stage s = a, t = b" take the next item, rather than ending the
 *   statement at a ',' separator;
 * - "split ... into n as x", "replicate ... into n as x" and "recompute
 *   s full" take the soft keyword as part of the statement rather than as
 *   the name that starts the next one ("as = 1"). */
%precedence LIST_END
%precedence ','
%precedence STMT_END
%precedence AS SELECTIVE FULL

%type <node> stmt if_stmt path type pattern dim factor param oparg arg field string
%type <node> selector sel_atom sel_path place stage_item row
%type <node> expr or_e and_e not_e cmp_e range_e add_e mul_e un_e post_e primary
%type <list> stmts body params param_list opargs oparg_list args arg_list
%type <list> exprs expr_list fields field_list dims dim_list factors str_parts
%type <list> sel_atoms place_list stage_list grid rows cells index_list
%type <op> cmpop fsuffix
%type <str> name callee as_axis
%type <op> in_time

%%

top:
    START_FILE stmts {
      weft_loc l = { P->file, 1, 1, @2.end_line, @2.end_col };
      if (l.end_line < 1) { l.end_line = 1; l.end_col = 0; }
      P->result = mklists(P, S_FILE, l, NULL, NULL, NULL, $2, P->comments);
    }
  | START_EXPR expr { P->result = $2; }
  ;

stmts:
    %empty { $$ = (ast_list){0}; }
  | stmts sync stmt { $$ = listpush(P, $1, $3); }
  | stmts ';' { $$ = $1; yyerrok; }
  | stmts ',' { $$ = $1; }
  | stmts error { $$ = $1; }
  ;

/* Bison reports no new error until three tokens have been read after the
 * last one. A statement keyword outside brackets or at the start of a line,
 * or a name that starts a line outside any bracket, starts a fresh
 * statement: errors from there on are new and reported. */
sync:
    %empty {
      if (yyerrstatus && ((P->tok_stmt_kw && (P->parens == 0 || P->tok_bol)) ||
                          (P->tok_bol && P->parens == 0))) {
        yyerrok;
        P->parens = 0;
      }
    }
  ;

body: '{' stmts '}' { $$ = $2; } ;

stmt:
    USE IDENT { $$ = mkname(P, S_USE, @$, $2, NULL, NULL); }
  | USE string {
      $$ = mk(P, S_USE, @$, NULL, NULL);
      size_t len = 0;
      bool ok = true;
      for (int i = 0; i < $2->list.n; i++) {
        if ($2->list.items[i]->kind == E_STRPART) len += strlen($2->list.items[i]->text);
        else ok = false;
      }
      if (!ok) diag_add(P->diags, DIAG_ERROR, @2, "a module path cannot contain interpolation");
      char *t = arena_alloc(P->ar, len + 1);
      for (int i = 0; i < $2->list.n; i++)
        if ($2->list.items[i]->kind == E_STRPART) strcat(t, $2->list.items[i]->text);
      $$->text = t;
    }
  | PARAM name '=' expr { $$ = mkname(P, S_PARAM, @$, $2, $4, NULL); }
  | PARAM path ':' type { $$ = mk(P, S_TPARAM, @$, $2, $4); }
  | INPUT path ':' type { $$ = mk(P, S_INPUT, @$, $2, $4); }
  | LET name '=' expr { $$ = mkname(P, S_LET, @$, $2, $4, NULL); }
  | FN name '(' params ')' '=' expr {
      $$ = mklists(P, S_FN, @$, $2, $7, NULL, $4, (ast_list){0});
    }
  | OP name '(' opargs ')' ARROW pattern body {
      $$ = mklists(P, S_OP, @$, $2, NULL, $7, $4, $8);
      $$->body = @8;
    }
  | MODEL name body {
      $$ = mklists(P, S_MODEL, @$, $2, NULL, NULL, (ast_list){0}, $3);
      $$->body = @3;
    }
  | MODEL name '(' params ')' body {
      $$ = mklists(P, S_MODEL, @$, $2, NULL, NULL, $4, $6);
      $$->ival = 1;
      $$->body = @6;
    }
  | MODEL name '=' expr { $$ = mkname(P, S_MODELDEF, @$, $2, $4, NULL); }
  | CLUSTER name body {
      $$ = mklists(P, S_CLUSTER, @$, $2, NULL, NULL, (ast_list){0}, $3);
      $$->body = @3;
    }
  | CLUSTER name '(' params ')' body {
      $$ = mklists(P, S_CLUSTER, @$, $2, NULL, NULL, $4, $6);
      $$->ival = 1;
      $$->body = @6;
    }
  | path '=' expr { $$ = mk(P, S_ASSIGN, @$, $1, $3); }
  | BLOCK path body {
      $$ = mklists(P, S_BLOCK, @$, NULL, $2, NULL, $3, (ast_list){0});
      $$->body = @3;
    }
  | FOR name IN expr body {
      $$ = mklists(P, S_FOR, @$, $2, $4, NULL, $5, (ast_list){0});
      $$->body = @5;
    }
  | if_stmt { $$ = $1; }
  | OUTPUT expr { $$ = mk(P, S_OUTPUT, @$, $2, NULL); }
  | TRAIN expr {
      $$ = mk(P, S_TRAIN, @$, $2, NULL);
      if ($2->kind != E_CALL) {
        weft_diag *g = diag_add(P->diags, DIAG_ERROR, @2, "expected an optimizer call after 'train'");
        diag_hint(g, P->diags, "write it as a call: train sgd(lr = 0.1)");
      }
    }
  | ASSERT expr %prec LIST_END { $$ = mk(P, S_ASSERT, @$, $2, NULL); }
  | ASSERT expr ',' expr { $$ = mk(P, S_ASSERT, @$, $2, $4); }
  | DEVICE body {
      $$ = mklists(P, S_DEVICE, @$, NULL, NULL, NULL, $2, (ast_list){0});
      $$->body = @2;
    }
  | LINK name body {
      $$ = mklists(P, S_LINK, @$, $2, NULL, NULL, $3, (ast_list){0});
      $$->body = @3;
    }
  /* ---- plans ---- */
  | PLAN name FOR expr ON expr body {
      $$ = mklists(P, S_PLAN, @$, $2, $4, $6, (ast_list){0}, $7);
      $$->body = @7;
    }
  | PLAN name '(' params ')' FOR expr ON expr body {
      $$ = mklists(P, S_PLAN, @$, $2, $7, $9, $4, $10);
      $$->ival = 1;
      $$->body = @10;
    }
  | STRATEGY name body {
      $$ = mklists(P, S_STRATEGY, @$, $2, NULL, NULL, (ast_list){0}, $3);
      $$->body = @3;
    }
  | STRATEGY name '(' params ')' body {
      $$ = mklists(P, S_STRATEGY, @$, $2, NULL, NULL, $4, $6);
      $$->ival = 1;
      $$->body = @6;
    }
  | MESH name '=' expr AS '[' fields ']' {
      $$ = mklists(P, S_MESH, @$, $2, $4, NULL, $7, (ast_list){0});
    }
  | SPLIT selector ON name INTO expr as_axis in_time {
      $$ = mkname(P, S_SPLIT, @$, $4, $2, $6);
      $$->text = $7;
      $$->ival = $8;
    }
  | REPLICATE selector INTO expr as_axis {
      $$ = mk(P, S_REPLICATE, @$, $2, $4);
      $$->text = $5;
    }
  | ASSIGN place_list %prec LIST_END {
      $$ = mklists(P, S_PLACE, @$, NULL, NULL, NULL, $2, (ast_list){0});
    }
  | STAGE stage_list %prec LIST_END {
      $$ = mklists(P, S_STAGE, @$, NULL, NULL, NULL, $2, (ast_list){0});
    }
  | ORDER selector BEFORE selector { $$ = mk(P, S_ORDER, @$, $2, $4); }
  | SCHEDULE grid {
      $$ = mklists(P, S_SCHEDULE, @$, NULL, NULL, NULL, $2, (ast_list){0});
      $$->body = @2;
    }
  | SCHEDULE name { $$ = mkname(P, S_SCHEDULE, @$, $2, NULL, NULL); }
  | RECOMPUTE selector %prec STMT_END { $$ = mk(P, S_RECOMPUTE, @$, $2, NULL); }
  | RECOMPUTE selector SELECTIVE { $$ = mkname(P, S_RECOMPUTE, @$, "selective", $2, NULL); }
  | RECOMPUTE selector FULL { $$ = mkname(P, S_RECOMPUTE, @$, "full", $2, NULL); }
  | SHARD name selector OVER name {
      $$ = mkname(P, S_SHARD, @$, $2, $3, NULL);
      $$->text = $5;
    }
  | BUCKETS expr { $$ = mk(P, S_BUCKETS, @$, $2, NULL); }
  | SEARCH { $$ = mk(P, S_SEARCH, @$, NULL, NULL); }
  | callee '(' args ')' {
      ast *f = mkname(P, E_NAME, @1, $1, NULL, NULL);
      ast *call = mklists(P, E_CALL, @$, NULL, f, NULL, $3, (ast_list){0});
      $$ = mk(P, S_CALL, @$, call, NULL);
    }
  ;

/* "as AXIS" after the count of split and replicate. */
as_axis:
    %empty %prec STMT_END { $$ = NULL; }
  | AS name { $$ = $2; }
  ;

in_time:
    %empty { $$ = 0; }
  | IN TIME { $$ = 1; }
  ;

place_list:
    place { $$ = list1(P, $1); }
  | place_list ',' place { $$ = listpush(P, $1, $3); }
  ;

place: selector ARROW expr { $$ = mk(P, N_PLACE, @$, $1, $3); } ;

stage_list:
    stage_item { $$ = list1(P, $1); }
  | stage_list ',' stage_item { $$ = listpush(P, $1, $3); }
  ;

/* A stage named by a string ("s{k}") when a loop makes the stages. */
stage_item:
    name '=' selector { $$ = mkname(P, N_FIELD, @$, $1, $3, NULL); }
  | string '=' selector { $$ = mk(P, N_FIELD, @$, $3, $1); }
  ;

/* A strategy call as a statement. The keywords whose statement takes an
 * expression (assert, train, output) are left out: "assert (x)" stays an
 * assertion. */
callee:
    IDENT { $$ = $1; }
  | MODEL { $$ = "model"; }
  | CLUSTER { $$ = "cluster"; }
  | DEVICE { $$ = "device"; }
  | LINK { $$ = "link"; }
  | INPUT { $$ = "input"; }
  | BLOCK { $$ = "block"; }
  | OP { $$ = "op"; }
  | STRATEGY { $$ = "strategy"; }
  | MESH { $$ = "mesh"; }
  | SPLIT { $$ = "split"; }
  | REPLICATE { $$ = "replicate"; }
  | ASSIGN { $$ = "assign"; }
  | STAGE { $$ = "stage"; }
  | ORDER { $$ = "order"; }
  | SCHEDULE { $$ = "schedule"; }
  | RECOMPUTE { $$ = "recompute"; }
  | SHARD { $$ = "shard"; }
  | ON { $$ = "on"; }
  | INTO { $$ = "into"; }
  | AS { $$ = "as"; }
  | TIME { $$ = "time"; }
  | BEFORE { $$ = "before"; }
  | SELECTIVE { $$ = "selective"; }
  | FULL { $$ = "full"; }
  | OVER { $$ = "over"; }
  ;

/* ---- selectors and schedule grids -------------------------------------- */

/* An atom, or a set of atoms in braces; both give an N_SEL. */
selector:
    sel_atom { $$ = mklists(P, N_SEL, @$, NULL, NULL, NULL, list1(P, $1), (ast_list){0}); }
  | '{' sel_atoms '}' { $$ = mklists(P, N_SEL, @$, NULL, NULL, NULL, $2, (ast_list){0}); }
  | '{' sel_atoms ',' '}' { $$ = mklists(P, N_SEL, @$, NULL, NULL, NULL, $2, (ast_list){0}); }
  ;

sel_atoms:
    sel_atom { $$ = list1(P, $1); }
  | sel_atoms ',' sel_atom { $$ = listpush(P, $1, $3); }
  ;

sel_atom:
    sel_path { $$ = $1; }
  | sel_path '[' expr ']' { $$ = mk(P, E_INDEX, @$, $1, $3); }
  ;

/* A path whose segments may be globs: '*' one segment, '**' any number. */
sel_path:
    name { $$ = mkname(P, E_NAME, @$, $1, NULL, NULL); }
  | '*' { $$ = mkname(P, E_NAME, @$, "*", NULL, NULL); }
  | STARSTAR { $$ = mkname(P, E_NAME, @$, "**", NULL, NULL); }
  | sel_path '.' name { $$ = mkname(P, E_MEMBER, @$, $3, $1, NULL); }
  | sel_path '.' INT { $$ = mk(P, E_MEMBER, @$, $1, $3); }
  | sel_path '.' '{' expr '}' { $$ = mkop(P, E_MEMBER, @$, '{', $1, $4); }
  | sel_path '.' '*' { $$ = mkname(P, E_MEMBER, @$, "*", $1, NULL); }
  | sel_path '.' STARSTAR { $$ = mkname(P, E_MEMBER, @$, "**", $1, NULL); }
  ;

/* "schedule {": once the '{' is read, the scanner switches to the grid
 * (grid_on is reduced without reading a lookahead) until the '}'. */
grid: '{' grid_on rows '}' { $$ = $3; } ;

grid_on: %empty { P->grid = true; } ;

rows:
    %empty { $$ = (ast_list){0}; }
  | rows row { $$ = listpush(P, $1, $2); }
  | rows error { $$ = $1; }
  ;

row: ROW_LABEL cells { $$ = mklists(P, N_ROW, @$, $1, NULL, NULL, $2, (ast_list){0}); } ;

cells:
    %empty { $$ = (ast_list){0}; }
  | cells CELL { $$ = listpush(P, $1, $2); }
  ;

if_stmt:
    IF expr body {
      $$ = mklists(P, S_IF, @$, NULL, $2, NULL, $3, (ast_list){0});
      $$->body = @3;
    }
  | IF expr body ELSE body {
      $$ = mklists(P, S_IF, @$, NULL, $2, NULL, $3, $5);
      $$->body = @3;
      $$->body2 = @5;
    }
  | IF expr body ELSE if_stmt {
      $$ = mklists(P, S_IF, @$, NULL, $2, $5, $3, (ast_list){0});
      $$->body = @3;
    }
  ;

/* ---- names, types and shape patterns ---------------------------------- */

/* Keywords that only start statements are names everywhere else, so that a
 * parameter can be called `cluster` or a field `model`. */
name:
    IDENT { $$ = $1; }
  | MODEL { $$ = "model"; }
  | CLUSTER { $$ = "cluster"; }
  | DEVICE { $$ = "device"; }
  | LINK { $$ = "link"; }
  | INPUT { $$ = "input"; }
  | OUTPUT { $$ = "output"; }
  | BLOCK { $$ = "block"; }
  | TRAIN { $$ = "train"; }
  | OP { $$ = "op"; }
  | ASSERT { $$ = "assert"; }
  | STRATEGY { $$ = "strategy"; }
  | MESH { $$ = "mesh"; }
  | SPLIT { $$ = "split"; }
  | REPLICATE { $$ = "replicate"; }
  | ASSIGN { $$ = "assign"; }
  | STAGE { $$ = "stage"; }
  | ORDER { $$ = "order"; }
  | SCHEDULE { $$ = "schedule"; }
  | RECOMPUTE { $$ = "recompute"; }
  | SHARD { $$ = "shard"; }
  | BUCKETS { $$ = "buckets"; }
  | SEARCH { $$ = "search"; }
  | ON { $$ = "on"; }
  | INTO { $$ = "into"; }
  | AS { $$ = "as"; }
  | TIME { $$ = "time"; }
  | BEFORE { $$ = "before"; }
  | SELECTIVE { $$ = "selective"; }
  | FULL { $$ = "full"; }
  | OVER { $$ = "over"; }
  ;

path:
    name { $$ = mkname(P, E_NAME, @$, $1, NULL, NULL); }
  | path '.' name { $$ = mkname(P, E_MEMBER, @$, $3, $1, NULL); }
  | path '.' INT { $$ = mk(P, E_MEMBER, @$, $1, $3); }
  | path '.' '{' expr '}' { $$ = mkop(P, E_MEMBER, @$, '{', $1, $4); }
  ;

type:
    '[' exprs ']' { $$ = mklists(P, N_TYPE, @$, NULL, NULL, NULL, $2, (ast_list){0}); }
  | IDENT '[' exprs ']' {
      ast *dt = mkname(P, E_NAME, @1, $1, NULL, NULL);
      $$ = mklists(P, N_TYPE, @$, NULL, dt, NULL, $3, (ast_list){0});
    }
  ;

pattern:
    '[' dims ']' { $$ = mklists(P, N_PATTERN, @$, NULL, NULL, NULL, $2, (ast_list){0}); }
  | IDENT '[' dims ']' { $$ = mklists(P, N_PATTERN, @$, $1, NULL, NULL, $3, (ast_list){0}); }
  ;

dims:
    %empty { $$ = (ast_list){0}; }
  | error { $$ = (ast_list){0}; }
  | dim_list { $$ = $1; }
  | dim_list ',' { $$ = $1; }
  ;

dim_list:
    dim { $$ = list1(P, $1); }
  | dim_list ',' dim { $$ = listpush(P, $1, $3); }
  ;

dim:
    IDENT { $$ = mkname(P, N_DIM, @$, $1, NULL, NULL); }
  | IDENT '+' { $$ = mkname(P, N_DIM, @$, $1, NULL, NULL); $$->op = '+'; }
  | IDENT '^' { $$ = mkname(P, N_DIM, @$, $1, NULL, NULL); $$->op = '^'; }
  | IDENT DOTDOT { $$ = mkname(P, N_DIM, @$, $1, NULL, NULL); $$->op = T_DOTDOT; }
  | '(' factors ')' { $$ = mklists(P, N_DIM, @$, NULL, NULL, NULL, $2, (ast_list){0}); }
  ;

/* Factors of a group, space-separated; each may carry '+' or '^' (kept in
 * the factor's op). */
factors:
    factor { $$ = list1(P, $1); }
  | QUANTITY fsuffix { $$ = split_quantity(P, (ast_list){0}, $1, $2); }
  | factors factor { $$ = listpush(P, $1, $2); }
  | factors QUANTITY fsuffix { $$ = split_quantity(P, $1, $2, $3); }
  ;

factor:
    INT fsuffix { $$ = $1; $$->op = $2; $$->loc = @$; }
  | IDENT fsuffix { $$ = mkname(P, E_NAME, @$, $1, NULL, NULL); $$->op = $2; }
  ;

fsuffix:
    %empty { $$ = 0; }
  | '+' { $$ = '+'; }
  | '^' { $$ = '^'; }
  ;

/* ---- parameter and argument lists ------------------------------------- */

params:
    %empty { $$ = (ast_list){0}; }
  | error { $$ = (ast_list){0}; }
  | param_list { $$ = $1; }
  | param_list ',' { $$ = $1; }
  ;

param_list:
    param { $$ = list1(P, $1); }
  | param_list ',' param { $$ = listpush(P, $1, $3); }
  ;

param:
    name { $$ = mkname(P, N_PARAM, @$, $1, NULL, NULL); }
  | name '=' expr { $$ = mkname(P, N_PARAM, @$, $1, $3, NULL); }
  ;

opargs:
    %empty { $$ = (ast_list){0}; }
  | error { $$ = (ast_list){0}; }
  | oparg_list { $$ = $1; }
  | oparg_list ',' { $$ = $1; }
  ;

oparg_list:
    oparg { $$ = list1(P, $1); }
  | oparg_list ',' oparg { $$ = listpush(P, $1, $3); }
  ;

oparg:
    name ':' pattern { $$ = mkname(P, N_OPARG, @$, $1, NULL, $3); }
  | name { $$ = mkname(P, N_OPARG, @$, $1, NULL, NULL); }
  | name '=' expr { $$ = mkname(P, N_OPARG, @$, $1, $3, NULL); }
  ;

args:
    %empty { $$ = (ast_list){0}; }
  | error { $$ = (ast_list){0}; }
  | arg_list { $$ = $1; }
  | arg_list ',' { $$ = $1; }
  ;

arg_list:
    arg { $$ = list1(P, $1); }
  | arg_list ',' arg { $$ = listpush(P, $1, $3); }
  ;

arg:
    expr { $$ = mk(P, N_ARG, @$, $1, NULL); }
  | name '=' expr { $$ = mkname(P, N_ARG, @$, $1, $3, NULL); }
  ;

exprs:
    %empty { $$ = (ast_list){0}; }
  | error { $$ = (ast_list){0}; }
  | expr_list { $$ = $1; }
  | expr_list ',' { $$ = $1; }
  ;

expr_list:
    expr { $$ = list1(P, $1); }
  | expr_list ',' expr { $$ = listpush(P, $1, $3); }
  ;

fields:
    %empty { $$ = (ast_list){0}; }
  | error { $$ = (ast_list){0}; }
  | field_list { $$ = $1; }
  | field_list ',' { $$ = $1; }
  ;

field_list:
    field { $$ = list1(P, $1); }
  | field_list ',' field { $$ = listpush(P, $1, $3); }
  ;

field: name '=' expr { $$ = mkname(P, N_FIELD, @$, $1, $3, NULL); } ;

/* ---- expressions, loosest first ---------------------------------------- */

expr:
    IF expr THEN expr ELSE expr {
      ast *n = mk(P, E_IF, @$, $2, $4);
      n->c = $6;
      $$ = fin(P, n);
    }
  | or_e { $$ = $1; }
  ;

or_e:
    or_e OR and_e { $$ = mkop(P, E_BINARY, @$, T_OR, $1, $3); }
  | and_e { $$ = $1; }
  ;

and_e:
    and_e AND not_e { $$ = mkop(P, E_BINARY, @$, T_AND, $1, $3); }
  | not_e { $$ = $1; }
  ;

not_e:
    NOT not_e { $$ = mkop(P, E_UNARY, @$, T_NOT, $2, NULL); }
  | cmp_e { $$ = $1; }
  ;

cmp_e:
    range_e cmpop range_e { $$ = mkop(P, E_BINARY, @$, $2, $1, $3); }
  | range_e { $$ = $1; }
  ;

cmpop:
    EQ { $$ = T_EQ; }
  | NE { $$ = T_NE; }
  | '<' { $$ = '<'; }
  | LE { $$ = T_LE; }
  | '>' { $$ = '>'; }
  | GE { $$ = T_GE; }
  ;

range_e:
    add_e DOTDOT add_e { $$ = mk(P, E_RANGE, @$, $1, $3); }
  | add_e { $$ = $1; }
  ;

add_e:
    add_e '+' mul_e { $$ = mkop(P, E_BINARY, @$, '+', $1, $3); }
  | add_e '-' mul_e { $$ = mkop(P, E_BINARY, @$, '-', $1, $3); }
  | mul_e { $$ = $1; }
  ;

mul_e:
    mul_e '*' un_e { $$ = mkop(P, E_BINARY, @$, '*', $1, $3); }
  | mul_e '/' un_e { $$ = mkop(P, E_BINARY, @$, '/', $1, $3); }
  | mul_e IDIV un_e { $$ = mkop(P, E_BINARY, @$, T_IDIV, $1, $3); }
  | mul_e '%' un_e { $$ = mkop(P, E_BINARY, @$, '%', $1, $3); }
  | un_e { $$ = $1; }
  ;

un_e:
    '-' un_e { $$ = mkop(P, E_UNARY, @$, '-', $2, NULL); }
  | post_e { $$ = $1; }
  ;

post_e:
    primary { $$ = $1; }
  | post_e '(' args ')' { $$ = mklists(P, E_CALL, @$, NULL, $1, NULL, $3, (ast_list){0}); }
  | post_e '[' index_list ']' { $$ = mk_index(P, @$, $1, $3); }
  | post_e '[' index_list ',' ']' { $$ = mk_index(P, @$, $1, $3); }
  | post_e '.' name { $$ = mkname(P, E_MEMBER, @$, $3, $1, NULL); }
  | post_e '.' INT { $$ = mk(P, E_MEMBER, @$, $1, $3); }
  | post_e '.' '{' expr '}' { $$ = mkop(P, E_MEMBER, @$, '{', $1, $4); }
  ;

primary:
    INT { $$ = $1; }
  | FLOAT { $$ = $1; }
  | QUANTITY { $$ = $1; }
  | string { $$ = $1; }
  | TRUE { $$ = mk(P, E_BOOL, @$, NULL, NULL); $$->ival = 1; }
  | FALSE { $$ = mk(P, E_BOOL, @$, NULL, NULL); }
  | '?' { $$ = mk(P, E_HOLE, @$, NULL, NULL); }
  | name { $$ = mkname(P, E_NAME, @$, $1, NULL, NULL); }
  | '(' expr ')' { $$ = mk(P, E_PAREN, @$, $2, NULL); }
  | '(' error ')' { $$ = mk(P, E_PAREN, @$, NULL, NULL); }
  | '[' exprs ']' { $$ = mklists(P, E_LIST, @$, NULL, NULL, NULL, $2, (ast_list){0}); }
  | '{' fields '}' { $$ = mklists(P, E_RECORD, @$, NULL, NULL, NULL, $2, (ast_list){0}); }
  ;

index_list:
    expr { $$ = list1(P, $1); }
  | index_list ',' expr { $$ = listpush(P, $1, $3); }
  ;

string: STR_BEGIN str_parts STR_END {
      $$ = mklists(P, E_STRING, @$, NULL, NULL, NULL, $2, (ast_list){0});
    }
  ;

str_parts:
    %empty { $$ = (ast_list){0}; }
  | str_parts STR_PART { $$ = listpush(P, $1, $2); }
  | str_parts INTERP_BEGIN expr INTERP_END { $$ = listpush(P, $1, $3); }
  ;

%%

/* ---- error messages ----------------------------------------------------- */

/* The source text of a one-line token, shortened and made printable. */
static void token_text(weft_pctx *P, weft_loc l, char *out, size_t cap) {
  out[0] = 0;
  const weft_src *s = P->src;
  if (!s || l.line < 1 || l.line > s->nlines || l.end_line != l.line || l.end_col < l.col) return;
  size_t start = (size_t)s->line_starts[l.line - 1] + (size_t)l.col - 1;
  size_t n = (size_t)(l.end_col - l.col + 1);
  if (start >= s->len) return;
  if (start + n > s->len) n = s->len - start;
  size_t o = 0;
  for (size_t i = 0; i < n && o + 8 < cap; i++) {
    unsigned char c = (unsigned char)s->text[start + i];
    if (i >= 32) { memcpy(out + o, "...", 3); o += 3; break; }
    if (c == '\t') out[o++] = ' ';
    else if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    else out[o++] = (char)c;
  }
  out[o] = 0;
}

static const char *sym_display(yysymbol_kind_t k) {
  switch (k) {
  case YYSYMBOL_YYEOF: return "end of file";
  case YYSYMBOL_IDENT: return "identifier";
  case YYSYMBOL_INT: case YYSYMBOL_FLOAT: return "number";
  case YYSYMBOL_QUANTITY: return "quantity";
  case YYSYMBOL_STR_BEGIN: return "string";
  case YYSYMBOL_STR_PART: return "string text";
  case YYSYMBOL_STR_END: return "end of string";
  case YYSYMBOL_INTERP_BEGIN: return "'{'";
  case YYSYMBOL_INTERP_END: return "'}'";
  case YYSYMBOL_USE: return "'use'";
  case YYSYMBOL_PARAM: return "'param'";
  case YYSYMBOL_LET: return "'let'";
  case YYSYMBOL_FN: return "'fn'";
  case YYSYMBOL_OP: return "'op'";
  case YYSYMBOL_MODEL: return "'model'";
  case YYSYMBOL_CLUSTER: return "'cluster'";
  case YYSYMBOL_DEVICE: return "'device'";
  case YYSYMBOL_LINK: return "'link'";
  case YYSYMBOL_INPUT: return "'input'";
  case YYSYMBOL_OUTPUT: return "'output'";
  case YYSYMBOL_BLOCK: return "'block'";
  case YYSYMBOL_FOR: return "'for'";
  case YYSYMBOL_IN: return "'in'";
  case YYSYMBOL_IF: return "'if'";
  case YYSYMBOL_THEN: return "'then'";
  case YYSYMBOL_ELSE: return "'else'";
  case YYSYMBOL_TRAIN: return "'train'";
  case YYSYMBOL_ASSERT: return "'assert'";
  case YYSYMBOL_TRUE: return "'true'";
  case YYSYMBOL_FALSE: return "'false'";
  case YYSYMBOL_AND: return "'and'";
  case YYSYMBOL_OR: return "'or'";
  case YYSYMBOL_NOT: return "'not'";
  case YYSYMBOL_PLAN: return "'plan'";
  case YYSYMBOL_STRATEGY: return "'strategy'";
  case YYSYMBOL_MESH: return "'mesh'";
  case YYSYMBOL_SPLIT: return "'split'";
  case YYSYMBOL_REPLICATE: return "'replicate'";
  case YYSYMBOL_ASSIGN: return "'assign'";
  case YYSYMBOL_STAGE: return "'stage'";
  case YYSYMBOL_ORDER: return "'order'";
  case YYSYMBOL_SCHEDULE: return "'schedule'";
  case YYSYMBOL_RECOMPUTE: return "'recompute'";
  case YYSYMBOL_SHARD: return "'shard'";
  case YYSYMBOL_BUCKETS: return "'buckets'";
  case YYSYMBOL_SEARCH: return "'search'";
  case YYSYMBOL_ON: return "'on'";
  case YYSYMBOL_INTO: return "'into'";
  case YYSYMBOL_AS: return "'as'";
  case YYSYMBOL_TIME: return "'time'";
  case YYSYMBOL_BEFORE: return "'before'";
  case YYSYMBOL_SELECTIVE: return "'selective'";
  case YYSYMBOL_FULL: return "'full'";
  case YYSYMBOL_OVER: return "'over'";
  case YYSYMBOL_ROW_LABEL: return "row label";
  case YYSYMBOL_CELL: return "schedule cell";
  case YYSYMBOL_EQ: return "'=='";
  case YYSYMBOL_NE: return "'!='";
  case YYSYMBOL_LE: return "'<='";
  case YYSYMBOL_GE: return "'>='";
  case YYSYMBOL_IDIV: return "'//'";
  case YYSYMBOL_ARROW: return "'->'";
  case YYSYMBOL_DOTDOT: return "'..'";
  case YYSYMBOL_STARSTAR: return "'**'";
  default: return yysymbol_name(k);
  }
}

/* Whether k is the single-character token c. */
static bool sym_is_char(yysymbol_kind_t k, char c) {
  const char *n = yysymbol_name(k);
  return n[0] == '\'' && n[1] == c && n[2] == '\'' && n[3] == 0;
}

/* Keywords that are also names (the `name` rule). */
static bool sym_is_soft(yysymbol_kind_t k) {
  switch (k) {
  case YYSYMBOL_MODEL: case YYSYMBOL_CLUSTER: case YYSYMBOL_DEVICE: case YYSYMBOL_LINK:
  case YYSYMBOL_INPUT: case YYSYMBOL_OUTPUT: case YYSYMBOL_BLOCK: case YYSYMBOL_TRAIN:
  case YYSYMBOL_OP: case YYSYMBOL_ASSERT:
  case YYSYMBOL_STRATEGY: case YYSYMBOL_MESH: case YYSYMBOL_SPLIT: case YYSYMBOL_REPLICATE:
  case YYSYMBOL_ASSIGN: case YYSYMBOL_STAGE: case YYSYMBOL_ORDER: case YYSYMBOL_SCHEDULE:
  case YYSYMBOL_RECOMPUTE: case YYSYMBOL_SHARD: case YYSYMBOL_ON: case YYSYMBOL_INTO: case YYSYMBOL_AS:
  case YYSYMBOL_TIME: case YYSYMBOL_BEFORE: case YYSYMBOL_SELECTIVE: case YYSYMBOL_FULL: case YYSYMBOL_OVER:
  case YYSYMBOL_BUCKETS: case YYSYMBOL_SEARCH:
    return true;
  default:
    return false;
  }
}

static bool sym_starts_expr(yysymbol_kind_t k) {
  switch (k) {
  case YYSYMBOL_INT: case YYSYMBOL_FLOAT: case YYSYMBOL_QUANTITY: case YYSYMBOL_STR_BEGIN:
  case YYSYMBOL_TRUE: case YYSYMBOL_FALSE: case YYSYMBOL_IDENT: case YYSYMBOL_NOT:
  case YYSYMBOL_IF:
    return true;
  default:
    /* the keywords that are names outside statement starts */
    return sym_is_soft(k) || sym_is_char(k, '(') || sym_is_char(k, '[') || sym_is_char(k, '{') ||
           sym_is_char(k, '-') || sym_is_char(k, '?');
  }
}

static bool sym_starts_stmt(yysymbol_kind_t k) {
  switch (k) {
  case YYSYMBOL_USE: case YYSYMBOL_PARAM: case YYSYMBOL_LET: case YYSYMBOL_FN: case YYSYMBOL_OP:
  case YYSYMBOL_MODEL: case YYSYMBOL_CLUSTER: case YYSYMBOL_DEVICE: case YYSYMBOL_LINK:
  case YYSYMBOL_INPUT: case YYSYMBOL_OUTPUT: case YYSYMBOL_BLOCK: case YYSYMBOL_FOR:
  case YYSYMBOL_IF: case YYSYMBOL_TRAIN: case YYSYMBOL_ASSERT: case YYSYMBOL_IDENT:
  case YYSYMBOL_PLAN: case YYSYMBOL_STRATEGY: case YYSYMBOL_MESH: case YYSYMBOL_SPLIT:
  case YYSYMBOL_REPLICATE: case YYSYMBOL_ASSIGN: case YYSYMBOL_STAGE: case YYSYMBOL_ORDER:
  case YYSYMBOL_SCHEDULE: case YYSYMBOL_RECOMPUTE: case YYSYMBOL_SHARD: case YYSYMBOL_BUCKETS:
  case YYSYMBOL_SEARCH:
    return true;
  default:
    return false;
  }
}

/* Binary and postfix operators: what may follow a complete operand. */
static bool sym_is_operator(yysymbol_kind_t k) {
  switch (k) {
  case YYSYMBOL_EQ: case YYSYMBOL_NE: case YYSYMBOL_LE: case YYSYMBOL_GE: case YYSYMBOL_IDIV:
  case YYSYMBOL_AND: case YYSYMBOL_OR: case YYSYMBOL_DOTDOT:
    return true;
  default:
    for (const char *c = "+-*/%<>([."; *c; c++)
      if (sym_is_char(k, *c)) return true;
    return false;
  }
}

static int yyreport_syntax_error(const yypcontext_t *ctx, void *scanner, weft_pctx *P) {
  (void)scanner;
  if (P->fatal) return 0;
  P->syntax_errors++;
  weft_loc loc = *yypcontext_location(ctx);
  yysymbol_kind_t tok = yypcontext_token(ctx);
  enum { MAXEXP = 64 };
  yysymbol_kind_t exp[MAXEXP];
  int n = yypcontext_expected_tokens(ctx, exp, MAXEXP);
  if (n < 0) n = 0;

  bool has_expr = false, has_stmt = false, has_oper = false, has_ident = false;
  for (int i = 0; i < n; i++) {
    if (exp[i] == YYSYMBOL_INT) has_expr = true;
    if (exp[i] == YYSYMBOL_LET) has_stmt = true;
    if (exp[i] == YYSYMBOL_IDIV) has_oper = true;
    if (exp[i] == YYSYMBOL_IDENT) has_ident = true;
  }
  const char *items[MAXEXP + 3];
  int ni = 0;
  if (has_oper) items[ni++] = "an operator";
  if (has_stmt) items[ni++] = "a statement";
  if (has_expr) items[ni++] = "an expression";
  for (int i = 0; i < n; i++) {
    yysymbol_kind_t k = exp[i];
    if (has_stmt && (sym_starts_stmt(k) || k == YYSYMBOL_YYEOF)) continue;
    if (has_stmt && (sym_is_char(k, ';') || sym_is_char(k, ','))) continue;
    if (has_expr && sym_starts_expr(k)) continue;
    if (has_oper && sym_is_operator(k)) continue;
    if (k == YYSYMBOL_YYerror || k == YYSYMBOL_YYUNDEF) continue;
    if (sym_is_soft(k) && has_ident) continue;  /* "identifier" covers them */
    const char *d = sym_display(k);
    bool dup = false;
    for (int j = 0; j < ni; j++) dup |= strcmp(items[j], d) == 0;
    if (!dup) items[ni++] = d;
  }

  char what[160];
  char text[64];
  token_text(P, loc, text, sizeof text);
  const char *tn = sym_display(tok);
  if ((tok == YYSYMBOL_IDENT || tok == YYSYMBOL_INT || tok == YYSYMBOL_FLOAT ||
       tok == YYSYMBOL_QUANTITY || tok == YYSYMBOL_CELL || tok == YYSYMBOL_ROW_LABEL) && text[0])
    snprintf(what, sizeof what, "%s '%s'", tn, text);
  else
    snprintf(what, sizeof what, "%s", tn);

  char exps[512];
  size_t o = 0;
  exps[0] = 0;
  if (ni > 0 && ni <= 6) {
    o += (size_t)snprintf(exps + o, sizeof exps - o, ", expected ");
    for (int i = 0; i < ni && o < sizeof exps; i++) {
      const char *sep = i == 0 ? "" : i == ni - 1 ? " or " : ", ";
      o += (size_t)snprintf(exps + o, sizeof exps - o, "%s%s", sep, items[i]);
    }
  }
  weft_diag *g = diag_add(P->diags, DIAG_ERROR, loc, "unexpected %s%s", what, exps);
  bool want_ident = has_ident;
  const char *td = sym_display(tok);
  bool keyword = td[0] == '\'' && td[1] >= 'a' && td[1] <= 'z';
  if (keyword && want_ident && !has_expr && !has_stmt)
    diag_hint(g, P->diags, "%s is a keyword and cannot be used as a name", td);
  else if (has_oper && !has_stmt && sym_is_char(tok, '='))
    diag_hint(g, P->diags, "use '==' to compare");
  else if (tok == YYSYMBOL_INT && loc.line > 0 && !has_oper && has_stmt)
    diag_hint(g, P->diags, "a statement starts with a keyword or a name");
  return 0;
}

void weft_yyerror(weft_loc *loc, void *scanner, weft_pctx *P, const char *msg) {
  (void)scanner;
  if (P->fatal) return;
  if (strcmp(msg, "memory exhausted") == 0) {
    P->fatal = true;
    diag_add(P->diags, DIAG_ERROR, *loc, "nesting too deep for the parser");
    return;
  }
  diag_add(P->diags, DIAG_ERROR, *loc, "%s", msg);
}
