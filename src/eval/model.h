/* model.h - model bodies to operator graphs (model.c), as the loading of
 * modules (workspace.c) calls them: operator declarations and the check of a
 * model's statements when it is defined. */
#ifndef WEFT_MODEL_H
#define WEFT_MODEL_H

#include "eval.h"

/* An `op` declaration: its signature and entries checked; NULL after
 * diagnostics. */
opdecl *opdecl_build(weft_ctx *c, env *e, const ast *n);
/* Whether a `model` declaration's body holds only statements a model may. */
bool model_check_decl(weft_ctx *c, const ast *n);

#endif
