/* fuzz_set.c - libFuzzer target: any text as the value of --set for one
 * of the parameters of a Megatron-style plan (the first byte picks which),
 * through evaluation, the plan and lowering; the answer is diagnostics at
 * the --set or a plan, never a crash, and no work beyond weft's limits. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft/lower.h"
#include "weft/report.h"
#include "weft/validate.h"
#include "weft/workspace.h"

static const char plan_text[] =
    "use std\n"
    "param layers = 4\n"
    "param hidden = 64\n"
    "param heads = 4\n"
    "param seq = 16\n"
    "param vocab = 128\n"
    "param global_batch = 16\n"
    "param micro_batch = 4\n"
    "param tp = 2\n"
    "param pp = 2\n"
    "param dp = 2\n"
    "param interleave = 1\n"
    "param recompute = \"none\"\n"
    "param sequence_parallel = false\n"
    "param zero = 0\n"
    "param nodes = 1\n"
    "param dtype = f32\n"
    "param memory = 80 GiB\n"
    "model g = gpt(layers = layers, hidden = hidden, heads = heads, seq = seq, vocab = vocab, batch = global_batch, dtype = dtype)\n"
    "plan p for g on a100_dgx(nodes = nodes) {\n"
    "  assert memory > 0 GiB, \"memory\"\n"
    "  megatron(layers = layers, tp = tp, pp = pp, dp = dp, micro_batches = global_batch // (dp * micro_batch),\n"
    "           recompute = recompute, sequence_parallel = sequence_parallel, zero = zero, interleave = interleave)\n"
    "}\n";

static const char *const names[] = {"layers", "hidden", "heads", "seq", "vocab", "global_batch", "micro_batch",
                                    "tp", "pp", "dp", "interleave", "recompute", "sequence_parallel", "zero",
                                    "nodes", "dtype", "memory", "unknown"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0 || size > 4096) return 0;
  arena_budget_set((size_t)1 << 30);
  const char *name = names[data[0] % (sizeof names / sizeof names[0])];
  size_t n = strlen(name);
  char *set = malloc(n + size + 1);
  if (!set) return 0;
  memcpy(set, name, n);
  set[n] = '=';
  memcpy(set + n + 1, data + 1, size - 1);
  set[n + size] = 0;
  weft_ctx *c = weft_new();
  c->diags.max_errors = 20;
  if (weft_set(c, set) && weft_load_text(c, "fuzz.plan", plan_text, sizeof plan_text - 1) == WEFT_OK) {
    weft_item it;
    if (weft_items(c, V_PLAN, &it, 1) == 1) {
      weft_plan *p = weft_build_plan(c, it.val, it.loc, &(plan_opts){.reps = true});
      weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
      if (pr) validate_program(pr, NULL, &c->diags);
    }
  }
  FILE *sink = fopen("/dev/null", "w");
  if (sink) {
    diag_print(&c->diags, sink, false);
    fclose(sink);
  }
  weft_free(c);
  free(set);
  return 0;
}
