/* eval.h - the evaluator's internals, shared by the files of src/eval
 * (expressions, models, clusters, plan bodies). Nothing outside src/eval
 * includes it: the stages after evaluation take what it built. */
#ifndef WEFT_EVAL_H
#define WEFT_EVAL_H

#include "weft/context.h"
#include "weft/graph.h"

/* The evaluator's internals shared between eval.c and model.c. */
value eval_expr(weft_ctx *c, env *e, const ast *n);
value eval_call_value(weft_ctx *c, value f, int nargs, const ast *const *args,
                      weft_loc loc, env *e);
bool eval_step(weft_ctx *c, weft_loc loc);
/* n steps at once: work that C does for the evaluator (a scan of every
 * operator), counted so that a loop that repeats it is projected whole. */
bool eval_steps(weft_ctx *c, weft_loc loc, int64_t n);
/* A boolean condition (`if`): false after a diagnostic. */
bool eval_condition(weft_ctx *c, env *e, const ast *x, bool *out);
/* `assert COND, MESSAGE`: false (and a diagnostic) when it fails. */
bool eval_assert(weft_ctx *c, env *e, const ast *s);
weft_diag *eval_error(weft_ctx *c, weft_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A dotted path (E_NAME/E_MEMBER) as a string, "h.3.attn"; NULL if n is not a
 * path or a {segment} fails (diagnostic reported, *failed set). */
const char *eval_path(weft_ctx *c, env *e, const ast *n, bool *failed);
/* Binds a model's or cluster's parameters (bound ones, then defaults) into
 * target; with args, the named arguments of a call as well. */
bool eval_bind_decl(weft_ctx *c, vdecl *d, env *target, weft_loc loc);
bool eval_bind_named(weft_ctx *c, vdecl *d, int nargs, const ast *const *args, env *argenv,
                     env *target, weft_loc loc);
enum {
  EVAL_MAX_STEPS = 50 * 1000 * 1000, /* bounds every loop and recursion */
  EVAL_MAX_DEPTH = 200,              /* function and sub-model calls */
  EVAL_MAX_LIST = 10 * 1000 * 1000,  /* elements of one list or range use */
  /* operators of a model: GPT-3 has about 1,000, Megatron-LM's 1T model
   * 1,700; what follows a model (plans, lowering) grows faster than it */
  MODEL_MAX_OPS = 100 * 1000,
  EVAL_LOOP_PROBE = 16,              /* iterations of a `for` before its end is projected */
};

/* A body of statements (a model's, a plan's, a cluster's): stmt runs one
 * statement of its kind; control.c runs the control statements around. */
typedef struct eval_body {
  bool (*stmt)(weft_ctx *c, void *ud, env *e, const ast *s);
  void *ud;
} eval_body;
/* Runs body's statements in order, stopping at the first that fails: what
 * follows would only report the consequences. */
bool eval_run_body(weft_ctx *c, const eval_body *b, env *e, const ast_list *body);
/* When s is `let`, `for`, `if` or `assert`: runs it (its bodies through b),
 * sets *handled and returns whether it succeeded. Else *handled is false.
 * b may be NULL for a body that allows neither `for` nor `if`. */
bool eval_control(weft_ctx *c, const eval_body *b, env *e, const ast *s, bool *handled);

/* Whether s[0..n) is an identifier. */
bool eval_is_ident(const char *s, size_t n);
/* The environment of built-ins every module's scope starts from. */
env *eval_global_env(weft_ctx *c);

/* The graph a model body is building, as expressions see it: a name is a
 * tensor of g under the innermost prefix first ("h.3.", then ""). model.c
 * keeps it as the first member of its state, which c->model points to. */
enum { MODEL_MAX_PREFIX = 256 };
typedef struct model_scope {
  weft_graph *g;
  const char *prefixes[MODEL_MAX_PREFIX]; /* [0] is the (sub-)model root, e.g. "h.3." */
  int nprefix;
} model_scope;

#endif
