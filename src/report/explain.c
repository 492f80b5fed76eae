/* explain.c - weft explain: how a plan splits and places operators, and the
 * communication that feeds them, with the reason for each. */
#include "common.h"

static const char *split_kind_text(split_kind k) {
  switch (k) {
  case SPLIT_DIM: return "parts";
  case SPLIT_VALUE: return "partial sums";
  case SPLIT_TIME: return "micro-batches, in time";
  default: return "replicas";
  }
}

static void explain_comm(weft_ctx *c, const weft_plan *p, const pcomm *cm) {
  char b1[64];
  printf("      %s%s", cm->phase == PHASE_BACKWARD ? "backward: " : "", comm_kind_names[cm->kind]);
  if (cm->kind == COMM_SEND) printf(" from device %d to device %d", cm->src, cm->dst);
  else {
    printf(" over devices");
    for (int i = 0; i < cm->ngroup && i < 16; i++) printf("%s%d", i ? ", " : " ", cm->group[i]);
    if (cm->ngroup > 16) printf(", ... (%d)", cm->ngroup);
  }
  printf(" of %s %s: %s bytes%s\n", p->g->tensors[cm->tensor].name, tregion_str(&c->arena, &cm->region),
         report_grouped(b1, cm->size), cm->level ? ", across nodes" : "");
  printf("        why: %s\n", cm->why);
}

static void explain_op(weft_ctx *c, const weft_plan *p, int op) {
  const gop *o = &p->g->ops[op];
  const popplan *pp = &p->ops[op];
  const opspace *sp = pp->space;
  printf("%s = %s(...)\n  dimensions:", o->name, o->decl->name);
  for (int i = 0; i < sp->nidims; i++) {
    const idim *d = &sp->idims[i];
    if (strchr(d->sig, '@')) continue;  /* literal factors */
    printf(" %s%s%s=%" PRId64 "%s%s%s", d->sig, d->elem || (i + 1 < sp->nidims && strcmp(sp->idims[i + 1].sig, d->sig) == 0 && sp->idims[i + 1].elem) ? arena_printf(&c->arena, "[%d]", d->elem) : "",
           d->reduce ? "+" : d->nosplit ? "^" : "", d->size, d->dim_name ? " (" : "", d->dim_name ? d->dim_name : "",
           d->dim_name ? ")" : "");
  }
  printf("\n");
  if (!pp->nsplits) printf("  not split\n");
  for (int i = 0; i < pp->nsplits; i++) {
    const psplit *s = &pp->splits[i];
    const idim *d = s->idim >= 0 ? &sp->idims[s->idim] : NULL;
    printf("  level %d: %s%s%s into %d as %s: %s (line %d)\n", i + 1, d ? "split " : "replicate",
           d ? (d->dim_name ? d->dim_name : d->sig) : "", d ? "" : "", s->parts, s->axis, split_kind_text(s->kind),
           s->loc.line);
  }
  printf("  %d sub-operator%s:", pp->count, pp->count == 1 ? "" : "s");
  for (int i = 0; i < pp->count && i < 16; i++) {
    const psub *s = &p->subs[pp->first + i];
    tregion r;
    tregion_of(&c->arena, p, s, &sp->output, &r);
    printf("\n    device %d: %s %s", s->device, p->g->tensors[sp->output.tensor].name, tregion_str(&c->arena, &r));
  }
  if (pp->count > 16) printf("\n    ... (%d more)", pp->count - 16);
  int nres = 0;
  for (int i = 0; i < p->ncomms; i++) nres += p->comms[i].phase != PHASE_WEIGHTS && p->comms[i].tensor == sp->output.tensor;
  printf("\n  result %s: %s\n", p->g->tensors[sp->output.tensor].name,
         nres ? "reaches its consumers (and its gradient comes back) through"
              : "its consumers read it where it is, and its gradient comes back, with no communication");
  for (int i = 0; i < p->ncomms; i++)
    if (p->comms[i].phase != PHASE_WEIGHTS && p->comms[i].tensor == sp->output.tensor) {
      explain_comm(c, p, &p->comms[i]);
      if (p->comms[i].phase == PHASE_FORWARD) printf("        for: %s\n", p->g->ops[p->comms[i].consumer_op].name);
    }
  printf("  inputs:\n");
  for (int k = 0; k < sp->ninputs; k++) {
    int t = sp->inputs[k].tensor;
    const gtensor *gt = &p->g->tensors[t];
    int n = 0;
    for (int i = 0; i < p->ncomms; i++) n += p->comms[i].consumer_op == op && p->comms[i].input == k;
    const char *from = gt->role == TENSOR_INPUT ? "model input" : gt->role == TENSOR_PARAM ? "parameter" : "from";
    printf("    %s (%s%s%s): %s\n", gt->name, from, gt->producer >= 0 ? " " : "",
           gt->producer >= 0 ? p->g->ops[gt->producer].name : "",
           n ? "" : gt->producer >= 0 ? "no communication: each sub-operator finds what it reads on its device"
                                      : "read where it is stored");
    for (int i = 0; i < p->ncomms; i++)
      if (p->comms[i].consumer_op == op && p->comms[i].input == k) explain_comm(c, p, &p->comms[i]);
    if (gt->role == TENSOR_PARAM) {
      bool any = false;
      for (int i = 0; i < p->ncomms; i++)
        if (p->comms[i].phase == PHASE_WEIGHTS && p->comms[i].tensor == t) {
          if (!any) printf("      gradient:\n");
          any = true;
          explain_comm(c, p, &p->comms[i]);
        }
      if (!any) printf("      gradient: no communication\n");
    }
  }
}

int report_explain(const weft_opts *o) {
  weft_ctx *c = report_ctx(o);
  int rc = WEFT_OK;
  weft_plan *p = report_plan(c, o, &rc, NULL);
  weft_loc none = {0};
  if (p) {
    int printed = 0;
    for (int f = 1; f < o->nfiles; f++) {
      dec_ops sel = o->files[f][0] ? dec_select(&c->arena, p->g, o->files[f]) : (dec_ops){0};
      int n = sel.n;
      if (n == 0) {
        const char **names = calloc((size_t)p->g->nops + 1, sizeof(char *));
        if (!names) weft_oom();
        for (int i = 0; i < p->g->nops; i++) names[i] = p->g->ops[i].name;
        weft_diag *d = report_error(c, none, "'%s' matches no operator of model %s", o->files[f], p->g->name);
        const char *best = diag_closest(o->files[f], names, p->g->nops);
        if (best) diag_hint(d, &c->diags, "did you mean '%s'?", best);
        free(names);
        rc = WEFT_REJECTED;
        continue;
      }
      for (int i = 0; i < n; i++) {
        if (printed++) printf("\n");
        explain_op(c, p, sel.ops[i]);
      }
    }
  }
  report_diags(c, o);
  weft_free(c);
  return rc;
}
