/* eval.h - the evaluator's internals, shared by the files of src/eval
 * (expressions, models, clusters, plan bodies). Nothing outside src/eval
 * includes it: the stages after evaluation take what it built. */
#ifndef WEFT_EVAL_H
#define WEFT_EVAL_H

#include "weft/workspace.h"

/* The evaluator's internals shared between eval.c and model.c. */
value eval_expr(weft_ctx *c, env *e, const ast *n);
value eval_call_value(weft_ctx *c, value f, int nargs, const ast *const *args,
                      weft_loc loc, env *e);
bool eval_step(weft_ctx *c, weft_loc loc);
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
/* Statement lists in model bodies (model.c). */
bool model_exec_body(weft_ctx *c, env *e, const ast_list *body);
opdecl *opdecl_build(weft_ctx *c, env *e, const ast *n);

#endif
