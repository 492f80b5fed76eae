/* model_graph.c - weft graph: a model's operator graph as text, JSON or
 * Graphviz. */
#include "common.h"

int report_graph(const weft_opts *o) {
  weft_ctx *c = report_ctx(o);
  int rc = c->diags.errors ? WEFT_REJECTED : weft_load(c, o->files[0]);
  weft_graph *g = NULL;
  if (rc == WEFT_OK) {
    weft_loc none = {0}, at = {0};
    value m = v_none();
    if (o->model) {
      binding *b = env_lookup(c->main->env, o->model);
      if (!b || b->val.kind != V_MODEL) {
        weft_item items[256];
        int n = weft_items(c, V_MODEL, items, 256);
        const char *names[256];
        for (int i = 0; i < n && i < 256; i++) names[i] = items[i].name;
        weft_diag *d = report_error(c, none, "%s defines no model '%s'", o->files[0], o->model);
        const char *best = diag_closest(o->model, names, n < 256 ? n : 256);
        if (best) diag_hint(d, &c->diags, "did you mean '%s'?", best);
        rc = WEFT_REJECTED;
      } else {
        m = b->val;
        at = b->loc;
      }
    } else {
      weft_item items[256];
      int n = weft_items(c, V_MODEL, items, 256);
      if (n == 0) {
        weft_diag *d = report_error(c, none, "%s defines no model", o->files[0]);
        diag_hint(d, &c->diags, "write `model NAME { ... }`, or `model NAME = gpt(...)` with `use std`");
        rc = WEFT_REJECTED;
      } else {
        m = items[(n < 256 ? n : 256) - 1].val;
        at = items[(n < 256 ? n : 256) - 1].loc;
      }
    }
    if (rc == WEFT_OK) {
      g = weft_build_graph(c, m, at);
      if (!g) rc = WEFT_REJECTED;
    }
  }
  report_diags(c, o);
  if (g) {
    if (o->json) graph_print_json(g, stdout);
    else if (o->dot) graph_print_dot(g, stdout);
    else graph_print_text(g, stdout);
  } else if (o->json) {
    diag_print_json(&c->diags, stdout);
    fputc('\n', stdout);
  }
  weft_free(c);
  return rc;
}

