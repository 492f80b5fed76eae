/* unit.h - what several unit tests share: a plan built from source text.
 * Include after <cmocka.h>. */
#ifndef WEFT_TESTS_UNIT_H
#define WEFT_TESTS_UNIT_H

#include <stdio.h>
#include <string.h>

#include "weft/plan.h"
#include "weft/report.h"
#include "weft/workspace.h"

/* Plan `plan` of the source `text` (loaded as t.plan), or NULL with the
 * diagnostics printed; a text that does not load fails the test. */
static inline weft_plan *unit_plan(weft_ctx *c, const char *text, const char *plan) {
  if (weft_load_text(c, "t.plan", text, strlen(text)) != WEFT_OK) {
    diag_print(&c->diags, stderr, false);
    fail_msg("the text is rejected");
  }
  binding *b = env_lookup(c->main->env, plan);
  assert_non_null(b);
  weft_loc none = {0};
  weft_plan *p = weft_build_plan(c, b->val, none, NULL);
  if (!p) diag_print(&c->diags, stderr, false);
  return p;
}

#endif
