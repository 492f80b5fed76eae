/* fuzz_check.c - libFuzzer target: any bytes through the parser, the
 * evaluator, graph building and fmt must end in diagnostics, never a crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "weft/plan.h"
#include "weft/report.h"
#include "weft/workspace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  weft_ctx *c = weft_new();
  c->diags.max_errors = 20;
  if (weft_load_text(c, "fuzz.plan", (const char *)data, size) == WEFT_OK) {
    weft_item items[16];
    int n = weft_items(c, V_MODEL, items, 16);
    for (int i = 0; i < n && i < 16; i++) {
      const ast_list *ps = &items[i].val.decl->node->list;
      bool bound = true;
      for (int k = 0; k < ps->n; k++) bound &= ps->items[k]->a != NULL;
      if (bound) weft_build_graph(c, items[i].val, items[i].loc);
    }
    n = weft_items(c, V_CLUSTER, items, 16);
    for (int i = 0; i < n && i < 16; i++) weft_build_cluster(c, items[i].val, items[i].loc);
    n = weft_items(c, V_PLAN, items, 16);
    for (int i = 0; i < n && i < 16; i++) {
      const ast_list *ps = &items[i].val.decl->node->list;
      bool bound = true;
      for (int k = 0; k < ps->n; k++) bound &= ps->items[k]->a != NULL;
      if (bound) weft_build_plan(c, items[i].val, items[i].loc, NULL);
    }
  }
  /* fmt of whatever parses */
  weft_parse_opts po = {&c->arena, &c->srcs, &c->diags};
  ast *root = weft_parse(&po, 0);
  if (root) {
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
      weft_fmt(root, &c->srcs.items[0], devnull);
      fclose(devnull);
    }
  }
  FILE *devnull = fopen("/dev/null", "w");
  if (devnull) {
    diag_print(&c->diags, devnull, false);
    fclose(devnull);
  }
  weft_free(c);
  return 0;
}
