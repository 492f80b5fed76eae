/* lower_print.c - the lowered program as text, as JSON (the backends'
 * input, docs/program.md), and the schedule as a grid in weft syntax. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "weft/lower.h"
#include "weft/units.h"
#include "weft/workspace.h"

/* ---- JSON --------------------------------------------------------------------- */

static void jstr(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p < 0x20) fprintf(out, "\\u%04x", *p);
    else fputc(*p, out);
  }
  fputc('"', out);
}

static void jregion(FILE *out, const tregion *r) {
  fputc('[', out);
  for (int d = 0; d < r->ndims; d++) {
    if (d) fputc(',', out);
    fputc('[', out);
    for (int i = 0; i < r->dims[d].n; i++)
      fprintf(out, "%s[%" PRId64 ",%" PRId64 "]", i ? "," : "", r->dims[d].iv[i].lo, r->dims[d].iv[i].hi);
    fputc(']', out);
  }
  fputc(']', out);
}

static void jref(FILE *out, const lref *r) {
  fprintf(out, "{\"buf\":%d,", r->buf);
  if (r->arg >= 0) fprintf(out, "\"arg\":%d,", r->arg);
  fprintf(out, "\"region\":");
  jregion(out, &r->region);
  fputc('}', out);
}

static void jrefs(FILE *out, const char *key, const lref *r, int n) {
  fprintf(out, ",\"%s\":[", key);
  for (int i = 0; i < n; i++) {
    if (i) fputc(',', out);
    jref(out, &r[i]);
  }
  fputc(']', out);
}

static void jvalue(FILE *out, value v) {
  switch (v.kind) {
  case V_INT: fprintf(out, "%" PRId64, v.i); break;
  case V_FLOAT: fprintf(out, "%.17g", v.f); break;
  case V_QUANTITY: fprintf(out, "%.17g", v.q.v); break;
  case V_BOOL: fputs(v.i ? "true" : "false", out); break;
  case V_STRING: jstr(out, v.s); break;
  default: fputs("null", out);
  }
}

static void jrecord(FILE *out, const vrecord *r) {
  fputc('{', out);
  for (int i = 0; r && i < r->n; i++) {
    if (i) fputc(',', out);
    jstr(out, r->keys[i]);
    fputc(':', out);
    jvalue(out, r->vals[i]);
  }
  fputc('}', out);
}

static void json_ins(FILE *out, const weft_program *pr, const lins *in) {
  const weft_plan *p = pr->p;
  switch (in->kind) {
  case LI_ALLOC: fprintf(out, "{\"i\":\"alloc\",\"buf\":%d}", in->buf); return;
  case LI_FREE: fprintf(out, "{\"i\":\"free\",\"buf\":%d}", in->buf); return;
  case LI_COMPUTE: {
    const psub *s = &p->subs[in->sub];
    const opspace *sp = p->ops[s->op].space;
    fprintf(out, "{\"i\":\"compute\",\"op\":%d,", s->op);
    if (in->part != LP_WHOLE) fprintf(out, "\"part\":\"%s\",", lins_part_names[in->part]);
    fprintf(out, "\"dir\":\"%s\",\"recompute\":%s,\"mb\":%d,\"accumulate\":%s,\"ranges\":[",
            in->dir == DIR_FORWARD ? "forward" : "backward", in->recompute ? "true" : "false", in->mb,
            in->accumulate ? "true" : "false");
    for (int d = 0; d < sp->nidims; d++)
      fprintf(out, "%s[%" PRId64 ",%" PRId64 "]", d ? "," : "", s->range[d].lo, s->range[d].hi);
    fputc(']', out);
    jrefs(out, "in", in->in, in->nin);
    jrefs(out, "out", in->out, in->nout);
    fputc('}', out);
    return;
  }
  case LI_SEND:
  case LI_RECV:
    fprintf(out, "{\"i\":\"%s\",\"comm\":%d,\"epoch\":%d,\"%s\":%d", in->kind == LI_SEND ? "send" : "recv", in->comm,
            in->epoch, in->kind == LI_SEND ? "to" : "from", in->peer);
    if (in->kind == LI_SEND) jrefs(out, "in", in->in, in->nin);
    else jrefs(out, "out", in->out, in->nout);
    fputc('}', out);
    return;
  case LI_COLLECTIVE: {
    const pcomm *cm = &p->comms[in->comm];
    fprintf(out, "{\"i\":\"collective\",\"kind\":\"%s\",\"comm\":%d,\"epoch\":%d,\"group\":[", comm_kind_names[cm->kind],
            in->comm, in->epoch);
    for (int k = 0; k < cm->ngroup; k++) fprintf(out, "%s%d", k ? "," : "", cm->group[k]);
    fputc(']', out);
    if (in->nbucket) {
      fprintf(out, ",\"bucket\":[");
      for (int k = 0; k < in->nbucket; k++) fprintf(out, "%s%d", k ? "," : "", in->bucket[k]);
      fputc(']', out);
    }
    jrefs(out, "in", in->in, in->nin);
    jrefs(out, "out", in->out, in->nout);
    fputc('}', out);
    return;
  }
  case LI_COPY:
    fprintf(out, "{\"i\":\"copy\",\"accumulate\":%s", in->accumulate ? "true" : "false");
    jrefs(out, "in", in->in, in->nin);
    jrefs(out, "out", in->out, in->nout);
    fputc('}', out);
    return;
  case LI_STEP:
    fprintf(out, "{\"i\":\"step\",\"param\":%d", in->tensor);
    jrefs(out, "in", in->in, in->nin);
    jrefs(out, "out", in->out, in->nout);
    fputc('}', out);
    return;
  default: fputs("{}", out);
  }
}

void lower_print_json(const weft_program *pr, int device, FILE *out) {
  const weft_plan *p = pr->p;
  const weft_graph *g = p->g;
  fprintf(out, "{\"format\":\"weft-program\",\"version\":1,\"plan\":");
  jstr(out, p->name);
  fprintf(out, ",\"model\":");
  jstr(out, g->name);
  fprintf(out, ",\"devices\":%d,\"devices_per_node\":%d,\"schedule\":\"%s\",\"micro_batches\":%d,\n", pr->nprogs,
          p->devices_per_node, sched_kind_names[p->sched], pr->nmb);
  fprintf(out, "\"optimizer\":");
  if (g->optimizer) {
    fprintf(out, "{\"name\":");
    jstr(out, g->optimizer);
    fprintf(out, ",\"args\":");
    jrecord(out, g->optimizer_args);
    fputc('}', out);
  } else {
    fputs("null", out);
  }
  fprintf(out, ",\"loss\":%d,\n\"tensors\":[\n", g->loss);
  static const char *const roles[] = {"input", "param", "act"};
  for (int t = 0; t < g->ntensors; t++) {
    const gtensor *x = &g->tensors[t];
    fprintf(out, "%s{\"id\":%d,\"name\":", t ? ",\n" : "", t);
    jstr(out, x->name);
    fprintf(out, ",\"role\":\"%s\",\"dtype\":\"%s\",\"shape\":[", roles[x->role], dtype_names[x->dtype]);
    for (int d = 0; d < x->ndims; d++) fprintf(out, "%s%" PRId64, d ? "," : "", x->dims[d].size);
    fprintf(out, "],\"producer\":%d}", x->producer);
  }
  fprintf(out, "],\n\"ops\":[\n");
  for (int op = 0; op < g->nops; op++) {
    const gop *o = &g->ops[op];
    const opspace *sp = p->ops[op].space;
    fprintf(out, "%s{\"id\":%d,\"name\":", op ? ",\n" : "", op);
    jstr(out, o->name);
    fprintf(out, ",\"kind\":");
    jstr(out, o->decl && o->decl->name ? o->decl->name : "?");
    fprintf(out, ",\"inputs\":[");
    for (int k = 0; k < o->ninputs; k++) fprintf(out, "%s%d", k ? "," : "", o->inputs[k]);
    fprintf(out, "],\"output\":%d,\"attrs\":", o->output);
    jrecord(out, o->attrs);
    fprintf(out, ",\"dims\":[");
    for (int d = 0; d < sp->nidims; d++) {
      fprintf(out, "%s{\"sig\":", d ? "," : "");
      jstr(out, sp->idims[d].sig);
      fprintf(out, ",\"elem\":%d,\"size\":%" PRId64 ",\"reduce\":%s}", sp->idims[d].elem, sp->idims[d].size,
              sp->idims[d].reduce ? "true" : "false");
    }
    fprintf(out, "],\"recompute\":%d}", p->ops[op].recompute);
  }
  fprintf(out, "],\n\"comms\":[\n");
  for (int i = 0; i < p->ncomms; i++) {
    const pcomm *cm = &p->comms[i];
    fprintf(out, "%s{\"id\":%d,\"kind\":\"%s\",%s\"phase\":\"%s\",\"tensor\":%d,\"group\":[", i ? ",\n" : "", i,
            comm_kind_names[cm->kind], cm->stats ? "\"stats\":true," : "", comm_phase_names[cm->phase], cm->tensor);
    for (int k = 0; k < cm->ngroup; k++) fprintf(out, "%s%d", k ? "," : "", cm->group[k]);
    fprintf(out, "],\"region\":");
    jregion(out, &cm->region);
    if (cm->parts) {
      fprintf(out, ",\"parts\":[");
      for (int k = 0; k < cm->ngroup; k++) {
        if (k) fputc(',', out);
        jregion(out, &cm->parts[k]);
      }
      fputc(']', out);
    }
    if (cm->sources) {
      fprintf(out, ",\"sources\":[");
      for (int k = 0; k < cm->ngroup; k++) {
        if (k) fputc(',', out);
        jregion(out, &cm->sources[k]);
      }
      fputc(']', out);
    }
    fprintf(out, ",\"size\":%" PRId64 ",\"bytes\":%" PRId64 ",\"level\":%d}", cm->size, cm->bytes, cm->level);
  }
  fprintf(out, "],\n\"buffers\":[\n");
  bool first = true;
  for (int b = 0; b < pr->nbufs; b++) {
    const lbuf *x = &pr->bufs[b];
    if (device >= 0 && x->device != device) continue;
    fprintf(out, "%s{\"id\":%d,\"device\":%d,\"tensor\":%d,\"role\":\"%s\",%s\"dtype\":\"%s\",\"copies\":%d,\"bytes\":%" PRId64
                 ",\"persistent\":%s,\"region\":",
            first ? "" : ",\n", b, x->device, x->tensor, lbuf_role_names[x->role], x->stats ? "\"stats\":true," : "",
            dtype_names[x->dtype], x->copies, x->bytes, x->persistent ? "true" : "false");
    jregion(out, &x->region);
    fputc('}', out);
    first = false;
  }
  fprintf(out, "],\n\"programs\":[\n");
  first = true;
  for (int d = 0; d < pr->nprogs; d++) {
    if (device >= 0 && d != device) continue;
    const lprog *pg = &pr->progs[d];
    fprintf(out, "%s{\"device\":%d,\"peak_bytes\":%" PRId64 ",\"persistent_bytes\":%" PRId64 ",\"instructions\":[",
            first ? "" : ",\n", d, pg->peak, pg->persistent);
    for (int i = 0; i < pg->n; i++) {
      fputs(i ? ",\n " : "\n ", out);
      json_ins(out, pr, &pg->ins[i]);
    }
    fputs("]}", out);
    first = false;
  }
  fprintf(out, "]}\n");
}

/* ---- text ----------------------------------------------------------------------- */

static const char *size_str(char *buf, size_t n, int64_t bytes) { return unit_bytes_human(bytes, buf, n); }

static void text_refs(FILE *out, arena *a, const lref *r, int n) {
  for (int i = 0; i < n; i++)
    if (r[i].buf < 0) fprintf(out, " -%s", tregion_str(a, &r[i].region));
    else fprintf(out, " b%d%s", r[i].buf, tregion_str(a, &r[i].region));
}

void lower_print_text(const weft_program *pr, int device, FILE *out) {
  const weft_plan *p = pr->p;
  const weft_graph *g = p->g;
  arena a;
  arena_init(&a);
  char s1[64], s2[64];
  fprintf(out, "plan %s: model %s, schedule %s, %d stage%s, %d micro-batch%s\n", p->name, g->name,
          sched_kind_names[p->sched], pr->nstages, pr->nstages == 1 ? "" : "s", pr->nmb, pr->nmb == 1 ? "" : "es");
  for (int d = 0; d < pr->nprogs; d++) {
    if (device >= 0 && d != device) continue;
    const lprog *pg = &pr->progs[d];
    if (!pg->n && device < 0) continue;
    fprintf(out, "\ndevice %d: %d instructions, peak %s (persistent %s)\n", d, pg->n, size_str(s1, sizeof s1, pg->peak),
            size_str(s2, sizeof s2, pg->persistent));
    for (int i = 0; i < pg->n; i++) {
      arena_reset(&a);
      const lins *in = &pg->ins[i];
      fprintf(out, "  %5d  ", i);
      switch (in->kind) {
      case LI_ALLOC: {
        const lbuf *b = &pr->bufs[in->buf];
        fprintf(out, "alloc      b%d %s %s%s %s%s %s\n", in->buf, b->stats ? "stats" : lbuf_role_names[b->role], g->tensors[b->tensor].name,
                tregion_str(&a, &b->region), dtype_names[b->dtype], b->copies > 1 ? arena_printf(&a, " x%d", b->copies) : "",
                size_str(s1, sizeof s1, b->bytes));
        break;
      }
      case LI_FREE: fprintf(out, "free       b%d\n", in->buf); break;
      case LI_COMPUTE: {
        const psub *s = &p->subs[in->sub];
        fprintf(out, "%-10s %s%s%s mb%d in", in->recompute ? "recompute" : in->dir == DIR_FORWARD ? "forward" : "backward",
                g->ops[s->op].name, in->part != LP_WHOLE ? " " : "", in->part != LP_WHOLE ? lins_part_names[in->part] : "",
                in->mb);
        text_refs(out, &a, in->in, in->nin);
        fprintf(out, " %s", in->accumulate ? "+=" : "->");
        text_refs(out, &a, in->out, in->nout);
        fputc('\n', out);
        break;
      }
      case LI_SEND:
        fprintf(out, "send       %s", g->tensors[p->comms[in->comm].tensor].name);
        text_refs(out, &a, in->in, in->nin);
        fprintf(out, " -> %d%s\n", in->peer, in->epoch ? " (again, for recomputation)" : "");
        break;
      case LI_RECV:
        fprintf(out, "recv       %s", g->tensors[p->comms[in->comm].tensor].name);
        text_refs(out, &a, in->out, in->nout);
        fprintf(out, " <- %d%s\n", in->peer, in->epoch ? " (again, for recomputation)" : "");
        break;
      case LI_COLLECTIVE: {
        const pcomm *cm = &p->comms[in->comm];
        fprintf(out, "%-10s %s%s", comm_kind_names[cm->kind], g->tensors[cm->tensor].name, cm->stats ? " stats" : "");
        for (int k = 0; k < in->nbucket; k++) fprintf(out, ", %s", g->tensors[p->comms[in->bucket[k]].tensor].name);
        text_refs(out, &a, in->in, in->nin);
        fprintf(out, " ->");
        text_refs(out, &a, in->out, in->nout);
        fprintf(out, " group [");
        for (int k = 0; k < cm->ngroup; k++) fprintf(out, "%s%d", k ? ", " : "", cm->group[k]);
        fprintf(out, "]%s\n", in->epoch ? " (again, for recomputation)" : "");
        break;
      }
      case LI_COPY:
        fprintf(out, "%s", in->accumulate ? "add       " : "copy      ");
        text_refs(out, &a, in->in, in->nin);
        fprintf(out, " ->");
        text_refs(out, &a, in->out, in->nout);
        fputc('\n', out);
        break;
      case LI_STEP:
        fprintf(out, "step       %s %s grad", g->optimizer ? g->optimizer : "?", g->tensors[in->tensor].name);
        text_refs(out, &a, in->in, in->nin);
        fprintf(out, " ->");
        text_refs(out, &a, in->out, in->nout);
        fputc('\n', out);
        break;
      default: fputc('\n', out);
      }
    }
  }
  arena_free(&a);
}

/* ---- grid -------------------------------------------------------------------------- */

static int cell_cmp(const void *x, const void *y) {
  const lcell *a = x, *b = y;
  if (a->stage != b->stage) return a->stage - b->stage;
  return a->slot - b->slot;
}

void lower_print_grid(const weft_program *pr, FILE *out) {
  int n = pr->ncells;
  lcell *c = malloc(sizeof(lcell) * (size_t)(n ? n : 1));
  if (!c) weft_oom();
  memcpy(c, pr->cells, sizeof(lcell) * (size_t)n);
  qsort(c, (size_t)n, sizeof(lcell), cell_cmp);
  int width = 1;
  for (int i = 0; i < n; i++) {
    int w = snprintf(NULL, 0, "%c%d", c[i].kind, c[i].mb);
    if (w > width) width = w;
  }
  int lw = 0;
  for (int st = 0; st < pr->nstages; st++) {
    int w = (int)strlen(pr->stage_names[st]);
    if (w > lw) lw = w;
  }
  if (!pr->p->nstages)
    fprintf(out, "# plan %s has no stages: one row for all its operators; declare stages to edit it\n", pr->p->name);
  fprintf(out, "schedule {\n");
  int i = 0;
  for (int st = 0; st < pr->nstages; st++) {
    fprintf(out, "  %s:%*s", pr->stage_names[st], lw - (int)strlen(pr->stage_names[st]), "");
    int slot = 0;
    /* trailing idle cells are left out */
    for (; i < n && c[i].stage == st; i++) {
      for (; slot < c[i].slot; slot++) fprintf(out, " %-*s", width, ".");
      char cell[32];
      snprintf(cell, sizeof cell, "%c%d", c[i].kind, c[i].mb);
      if (i + 1 < n && c[i + 1].stage == st) fprintf(out, " %-*s", width, cell);
      else fprintf(out, " %s", cell);
      slot = c[i].slot + 1;
    }
    fputc('\n', out);
  }
  fprintf(out, "}\n");
  free(c);
}

/* ---- an instruction on a timeline ------------------------------------------- */

const char *const lower_category_names[LCAT_COUNT] = {"forward", "backward", "recompute", "optimizer", "collective",
                                                      "send/recv", "gradient sync"};
const uint32_t lower_category_rgb[LCAT_COUNT] = {0x4e79a7, 0xf28e2b, 0x59a14f, 0x9c755f, 0xe15759, 0x76b7b2, 0xb07aa1};

int lower_category(const weft_program *pr, const lins *in) {
  switch (in->kind) {
  case LI_COMPUTE: return in->recompute ? LCAT_RECOMP : in->dir == DIR_BACKWARD ? LCAT_BWD : LCAT_FWD;
  case LI_COPY: return in->dir == DIR_BACKWARD ? LCAT_BWD : LCAT_FWD;
  case LI_STEP: return LCAT_OPT;
  case LI_SEND: case LI_RECV: return LCAT_P2P;
  case LI_COLLECTIVE: {
    comm_phase ph = lower_comm(pr, in->comm)->phase;
    return ph == PHASE_WEIGHTS || ph == PHASE_PARAMS ? LCAT_GRAD : LCAT_COLL;
  }
  default: return -1;
  }
}

/* s inside a JSON string */
static void jchars(FILE *out, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p < 0x20) fprintf(out, "\\u%04x", *p);
    else fputc(*p, out);
  }
}

int lower_event_name(const weft_program *pr, const lins *in, char *buf, size_t n) {
  const weft_graph *g = lower_graph(pr);
  if (in->kind == LI_COMPUTE)
    return snprintf(buf, n, "%s %s mb%d", g->ops[lower_compute_op(pr, in)].name,
                    in->recompute ? "recompute" : in->dir == DIR_BACKWARD ? "backward" : "forward", in->mb);
  if (in->kind == LI_STEP) return snprintf(buf, n, "step %s", g->tensors[in->tensor].name);
  if (in->kind == LI_COPY) return snprintf(buf, n, "copy");
  if (in->kind == LI_SEND || in->kind == LI_RECV || in->kind == LI_COLLECTIVE) {
    const pcomm *cm = lower_comm(pr, in->comm);
    return snprintf(buf, n, "%s %s%s", in->kind == LI_SEND ? "send" : in->kind == LI_RECV ? "recv" : comm_kind_names[cm->kind],
                    g->tensors[cm->tensor].name,
                    cm->phase == PHASE_BACKWARD || cm->phase == PHASE_WEIGHTS ? " (gradient)" : "");
  }
  /* on a backend that clears a buffer when it is allocated */
  return snprintf(buf, n, "%s %s", in->kind == LI_ALLOC ? "alloc" : "free",
                  in->buf >= 0 && in->buf < pr->nbufs ? g->tensors[pr->bufs[in->buf].tensor].name : "");
}

void lower_print_event(const weft_program *pr, const lins *in, const char *args, FILE *out) {
  int cat = lower_category(pr, in);
  char buf[512], *name = buf;
  int len = lower_event_name(pr, in, buf, sizeof buf);
  /* a name of any length, as the names of the graph may be */
  if (len >= (int)sizeof buf && (name = malloc((size_t)len + 1))) lower_event_name(pr, in, name, (size_t)len + 1);
  fputs("\"name\":\"", out);
  jchars(out, name ? name : buf);
  if (name != buf) free(name);
  fprintf(out, "\",\"cat\":\"%s\"", cat >= 0 ? lower_category_names[cat] : "memory");
  bool comm = in->kind == LI_SEND || in->kind == LI_RECV || in->kind == LI_COLLECTIVE;
  if (in->kind != LI_COMPUTE && !comm && !(args && *args)) return;
  fputs(",\"args\":{", out);
  if (in->kind == LI_COMPUTE) fprintf(out, "\"mb\":%d", in->mb);
  else if (comm)
    fprintf(out, "\"bytes\":%" PRId64 ",\"group\":%d", lower_comm(pr, in->comm)->size, lower_comm(pr, in->comm)->ngroup);
  if (args && *args) fprintf(out, "%s%s", in->kind == LI_COMPUTE || comm ? "," : "", args);
  fputc('}', out);
}
