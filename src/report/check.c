/* check.c - weft check: every file evaluated, its models built into graphs,
 * its clusters checked, its plans applied, lowered, validated and estimated,
 * and a summary of each (text or JSON). */
#include "common.h"
#include "weft/search.h"

typedef struct summary {
  weft_item items[256];
  weft_graph *graphs[256];
  value clusters[256];
  int nmodels, nclusters, nplans;
  weft_item citems[256];
  weft_item pitems[256];
  weft_plan *plans[256];
  weft_program *progs[256];
  weft_estimate est[256];
  bool est_ok[256];
  int nholes[256];        /* per plan: its open decisions (`?`), not built */
  weft_loc holes[256][16];
  const ast *search[256];  /* per plan: its `search` statement, not built */
  const char *open[256], *kept[256]; /* what it leaves to weft search, what it writes */
} summary;

/* Simulates the programs of a plan lowered without rule 5, once for two
 * things: the memory rule on the simulated peaks (false after its
 * diagnostic), and the estimated step, *est_ok false when the cluster lacks
 * a rate the model needs (then the peaks are the program order's). *peaks
 * gets every device's peak (c's arena). */
static bool estimate_quiet(weft_ctx *c, const weft_program *pr, weft_estimate *e, bool *est_ok, int64_t **peaks) {
  *est_ok = false;
  *peaks = arena_alloc(&c->arena, sizeof(int64_t) * (size_t)(pr->nprogs ? pr->nprogs : 1));
  weft_sim *s = sim_run_plan(pr, 0);
  if (!s) return true;
  for (int d = 0; d < pr->nprogs; d++) (*peaks)[d] = s->index[d] >= 0 ? s->dev[s->index[d]].peak : 0;
  bool fits = validate_memory_sim(s, &c->diags);
  if (s->hw) {
    sim_estimate(s, e);
    *est_ok = true;
  }
  sim_free(s);
  return fits;
}

static int check_one(const weft_opts *o, const char *path, json *j) {
  /* replicas' programs are checked through their representative's */
  plan_opts check_opts = {.reps = true};
  weft_ctx *c = report_ctx(o);
  int64_t *peaks[256] = {0};  /* per plan: every device's simulated peak (estimate_quiet) */
  int rc = c->diags.errors ? WEFT_REJECTED : weft_load(c, path);
  summary *s = calloc(1, sizeof *s);
  if (!s) weft_oom();
  if (rc == WEFT_OK && c->main->root && c->main->root->list.n == 0) {
    /* an empty file is almost always the wrong file */
    weft_loc start = {c->main->file, 1, 1, 1, 1};
    weft_diag *g = report_error(c, start, "the file defines nothing: there is nothing to check");
    diag_hint(g, &c->diags, "a .plan file defines models and clusters; see docs/language.md");
    rc = WEFT_REJECTED;
  }
  if (rc == WEFT_OK) {
    s->nmodels = weft_items(c, V_MODEL, s->items, 256);
    if (s->nmodels > 256) s->nmodels = 256;
    for (int i = 0; i < s->nmodels; i++)
      if (report_bound(s->items[i].val.decl))
        s->graphs[i] = weft_build_graph(c, s->items[i].val, s->items[i].loc);
    s->nclusters = weft_items(c, V_CLUSTER, s->citems, 256);
    if (s->nclusters > 256) s->nclusters = 256;
    for (int i = 0; i < s->nclusters; i++) {
      s->clusters[i] = v_none();
      if (report_bound(s->citems[i].val.decl))
        s->clusters[i] = weft_build_cluster(c, s->citems[i].val, s->citems[i].loc);
    }
    s->nplans = weft_items(c, V_PLAN, s->pitems, 256);
    if (s->nplans > 256) s->nplans = 256;
    for (int i = 0; i < s->nplans; i++) {
      if (!report_bound(s->pitems[i].val.decl)) continue;
      s->nholes[i] = report_holes(s->pitems[i].val.decl->node, s->holes[i], 16);
      s->search[i] = report_search_stmt(s->pitems[i].val.decl->node);
      if (s->search[i] && !s->nholes[i]) {
        /* what it writes is checked as the search keeps it; the rest is open */
        weft_plan_src src;
        search_fixed fx;
        if (weft_eval_plan(c, s->pitems[i].val, s->pitems[i].loc, &src) && src.search_at >= 0 &&
            search_fixed_read(&src.decisions, src.search_at, src.graph, &src.cluster, &c->diags, &fx)) {
          s->open[i] = search_fixed_open(&c->arena, &fx);
          s->kept[i] = search_fixed_kept(&c->arena, &fx);
        }
        if (src.decisions.placer.done) src.decisions.placer.done(src.decisions.placer.ctx);
        continue;
      }
      if (s->nholes[i] == 0) {
        s->plans[i] = weft_build_plan(c, s->pitems[i].val, s->pitems[i].loc, &check_opts);
        /* validated without the memory rule, which the simulation applies */
        if (s->plans[i]) s->progs[i] = lower_plan(s->plans[i], NULL, &c->arena, &c->diags);
        if (s->progs[i] && !validate_program(s->progs[i], &(validate_opts){.skip_memory = true}, &c->diags))
          s->progs[i] = NULL;
        if (s->progs[i] && !estimate_quiet(c, s->progs[i], &s->est[i], &s->est_ok[i], &peaks[i])) s->progs[i] = NULL;
      }
    }
    if (c->diags.errors) rc = WEFT_REJECTED;
  }
  char b1[64];
  if (j) {
    json_obj(j);
    json_key(j, "file");
    json_str(j, path);
    json_key(j, "ok");
    json_bool(j, rc == WEFT_OK);
    json_key(j, "diagnostics");
    /* diag_print_json writes a complete array */
    json_raw(j, "");
    diag_print_json(&c->diags, stdout);
    if (rc == WEFT_OK) {
      json_key(j, "models");
      json_arr(j);
      for (int i = 0; i < s->nmodels; i++) {
        json_obj(j);
        json_key(j, "name");
        json_str(j, s->items[i].name);
        json_key(j, "built");
        json_bool(j, s->graphs[i] != NULL);
        if (s->graphs[i]) {
          json_key(j, "operators");
          json_int(j, s->graphs[i]->nops);
          json_key(j, "parameters");
          json_int(j, graph_param_count(s->graphs[i]));
          json_key(j, "parameter_bytes");
          json_int(j, graph_param_bytes(s->graphs[i]));
          json_key(j, "forward_flops");
          json_num(j, graph_forward_flops(s->graphs[i]));
        }
        json_end_obj(j);
      }
      json_end_arr(j);
      json_key(j, "clusters");
      json_arr(j);
      for (int i = 0; i < s->nclusters; i++) {
        json_obj(j);
        json_key(j, "name");
        json_str(j, s->citems[i].name);
        json_key(j, "built");
        json_bool(j, s->clusters[i].kind == V_RECORD);
        if (s->clusters[i].kind == V_RECORD) {
          json_key(j, "devices");
          json_int(j, record_get(s->clusters[i].rec, "devices")->i);
        }
        json_end_obj(j);
      }
      json_end_arr(j);
      json_key(j, "plans");
      json_arr(j);
      for (int i = 0; i < s->nplans; i++) {
        weft_plan *p = s->plans[i];
        json_obj(j);
        json_key(j, "name");
        json_str(j, s->pitems[i].name);
        json_key(j, "built");
        json_bool(j, p != NULL);
        if (s->nholes[i]) {
          json_key(j, "open");
          json_arr(j);
          for (int h = 0; h < s->nholes[i] && h < 16; h++) {
            json_obj(j);
            json_key(j, "line"), json_int(j, s->holes[i][h].line);
            json_key(j, "col"), json_int(j, s->holes[i][h].col);
            json_end_obj(j);
          }
          json_end_arr(j);
        }
        if (s->search[i] && (s->open[i] || s->nholes[i])) {
          json_key(j, "search");
          json_obj(j);
          json_key(j, "line"), json_int(j, s->search[i]->loc.line);
          json_key(j, "col"), json_int(j, s->search[i]->loc.col);
          if (s->open[i]) {
            json_key(j, "open"), json_str(j, s->open[i]);
            json_key(j, "written"), json_str(j, s->kept[i]);
          }
          json_end_obj(j);
        }
        if (p) {
          json_key(j, "model");
          json_str(j, p->g->name);
          json_key(j, "devices");
          json_int(j, p->ndevices);
          json_key(j, "devices_used");
          json_int(j, p->used_devices);
          json_key(j, "sub_operators");
          json_int(j, p->nsubs_all);
          json_key(j, "schedule");
          json_str(j, sched_kind_names[p->sched]);
          json_key(j, "micro_batches");
          json_int(j, s->progs[i] ? s->progs[i]->nmb : 0);
          json_key(j, "comm_bytes");
          json_obj(j);
          for (int ph = 0; ph < PHASE_COUNT; ph++) {
            int64_t bytes[COMM_KIND_COUNT];
            int counts[COMM_KIND_COUNT];
            deps_totals(p, bytes, counts, (comm_phase)ph);
            json_key(j, comm_phase_names[ph]);
            json_obj(j);
            for (int k = 0; k < COMM_KIND_COUNT; k++) {
              if (!counts[k]) continue;
              json_key(j, comm_kind_names[k]);
              json_int(j, bytes[k]);
            }
            json_end_obj(j);
          }
          json_end_obj(j);
          if (s->progs[i]) {
            json_key(j, "instructions");
            json_int(j, s->progs[i]->instructions_all);
            json_key(j, "peak_memory_bytes");
            json_arr(j);
            for (int d = 0; d < s->progs[i]->nprogs; d++) json_int(j, peaks[i][d]);
            json_end_arr(j);
            json_key(j, "device_memory_bytes");
            json_int(j, lower_device_memory(p));
            json_key(j, "step_time_s");
            if (s->est_ok[i]) json_num(j, s->est[i].step_time);
            else json_null(j);
            json_key(j, "mfu");
            if (s->est_ok[i]) json_num(j, s->est[i].mfu);
            else json_null(j);
          }
        }
        json_end_obj(j);
      }
      json_end_arr(j);
    }
    json_end_obj(j);
  } else {
    report_diags(c, o);
    if (rc == WEFT_OK) {
      printf("%s: ok\n", path);
      for (int i = 0; i < s->nmodels; i++) {
        weft_graph *g = s->graphs[i];
        if (g)
          printf("  model %s: %d operator%s, %s parameters\n", s->items[i].name, g->nops, g->nops == 1 ? "" : "s",
                 report_grouped(b1, graph_param_count(g)));
        else
          printf("  model %s: not built (it has parameters without defaults)\n", s->items[i].name);
      }
      for (int i = 0; i < s->nclusters; i++) {
        if (s->clusters[i].kind != V_RECORD) {
          printf("  cluster %s: not built (it has parameters without defaults)\n", s->citems[i].name);
          continue;
        }
        const vrecord *r = s->clusters[i].rec;
        const vrecord *dev = record_get(r, "device")->rec;
        char mem[64];
        const value *m = record_get(dev, "memory");
        unit_format(m->q.v, m->q.d, mem, sizeof mem);
        printf("  cluster %s: %" PRId64 " x %s (%s)\n", s->citems[i].name, record_get(r, "devices")->i,
               record_get(dev, "name")->s, mem);
      }
      for (int i = 0; i < s->nplans; i++) {
        weft_plan *p = s->plans[i];
        if (!p && s->nholes[i]) {
          printf("  plan %s: not built: %d open decision%s (?) at", s->pitems[i].name, s->nholes[i],
                 s->nholes[i] == 1 ? "" : "s");
          for (int h = 0; h < s->nholes[i] && h < 16; h++)
            printf("%s %d:%d", h ? "," : "", s->holes[i][h].line, s->holes[i][h].col);
          printf("%s", s->nholes[i] > 16 ? ", ..." : "");
          if (s->search[i]) printf(" and `search` at %d:%d", s->search[i]->loc.line, s->search[i]->loc.col);
          printf("; weft search fills them\n");
          continue;
        }
        if (!p && s->search[i] && s->open[i]) {
          printf("  plan %s: not built: `search` at %d:%d leaves open %s; written: %s\n", s->pitems[i].name,
                 s->search[i]->loc.line, s->search[i]->loc.col, s->open[i], s->kept[i]);
          continue;
        }
        if (!p) {
          printf("  plan %s: not built (it has parameters without defaults)\n", s->pitems[i].name);
          continue;
        }
        printf("  plan %s: model %s on %d of %d devices, %" PRId64 " forward sub-operators placed\n", s->pitems[i].name,
               p->g->name, p->used_devices, p->ndevices, p->nsubs_all);
        const weft_program *pr = s->progs[i];
        if (pr) {
          printf("    schedule: %s, %d stage%s, %d micro-batch%s, %s instructions\n", sched_kind_names[p->sched],
                 pr->nstages, pr->nstages == 1 ? "" : "s", pr->nmb, pr->nmb == 1 ? "" : "es",
                 report_grouped(b1, pr->instructions_all));
          /* the peaks the memory rule checked: the simulated step's */
          const int64_t *pk = peaks[i];
          int dmax = 0, dmin = -1;
          for (int d = 0; d < pr->nprogs; d++) {
            if (pk[d] > pk[dmax]) dmax = d;
            if (lower_prog(pr, d)->n && (dmin < 0 || pk[d] < pk[dmin])) dmin = d;
          }
          char m1[64], m2[64], m3[64];
          unit_bytes_human(pr->nprogs ? pk[dmax] : 0, m1, sizeof m1);
          unit_bytes_human(dmin >= 0 ? pk[dmin] : 0, m2, sizeof m2);
          unit_bytes_human(lower_device_memory(p), m3, sizeof m3);
          printf("    peak memory: %s on device %d (least %s on device %d) of %s\n", m1, dmax, m2,
                 dmin >= 0 ? dmin : 0, m3);
          if (s->est_ok[i]) {
            const weft_estimate *e = &s->est[i];
            char t[64];
            unit_format(e->step_time, (unit_dim){0, 1, 0}, t, sizeof t);
            char r[64];
            unit_format(e->tflops_per_device * 1e12, (unit_dim){0, -1, 1}, r, sizeof r);
            printf("    estimate: step %s, %s per device (MFU %.1f%%), bubble %.1f%% (weft estimate)\n", t, r,
                   100 * e->mfu, 100 * e->bubble_fraction);
          } else {
            printf("    estimate: none, the cluster has no compute rate for the model's dtype\n");
          }
        }
        for (int ph = 0; ph < PHASE_COUNT; ph++) {
          int64_t bytes[COMM_KIND_COUNT];
          int counts[COMM_KIND_COUNT];
          deps_totals(p, bytes, counts, (comm_phase)ph);
          for (int k = 0; k < COMM_KIND_COUNT; k++) {
            if (!counts[k]) continue;
            static const char *const label[PHASE_COUNT] = {"forward: ", "backward:", "weights: ", "params:  "};
            printf("    %s %-14s %5d x, %s bytes per step\n", label[ph], comm_kind_names[k], counts[k],
                   report_grouped(b1, bytes[k]));
          }
        }
      }
    }
  }
  free(s);
  weft_free(c);
  return rc;
}

int report_check(const weft_opts *o) {
  int worst = WEFT_OK;
  json j;
  if (o->json) {
    json_init(&j, stdout);
    json_obj(&j);
    json_key(&j, "files");
    json_arr(&j);
  }
  for (int i = 0; i < o->nfiles; i++) {
    int rc = check_one(o, o->files[i], o->json ? &j : NULL);
    if (rc > worst) worst = rc;
  }
  if (o->json) {
    json_end_arr(&j);
    json_key(&j, "ok");
    json_bool(&j, worst == WEFT_OK);
    json_end_obj(&j);
  }
  return worst;
}

