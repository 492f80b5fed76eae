/* main.c - the weft command line: parses arguments and calls the library.
 * Every command is a function cmd_NAME; `weft help COMMAND` prints its usage. */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "kernels.h"
#include "weft/deps.h"
#include "exec.h"
#include "native.h"
#include "net.h"
#include "run.h"
#include "weft/lower.h"
#include "weft/plan.h"
#include "base/prof.h"
#include "weft/sim.h"
#include "weft/validate.h"
#include "eval/eval.h"

typedef struct opts {
  const char **files;
  int nfiles;
  const char **sets;
  int nsets;
  const char *model;
  const char *plan;
  const char *stdlib_dir;
  bool json, dot, write, check, roundtrip, grid;
  int device;             /* weft lower --device N, or -1 */
  const char *trace;      /* weft estimate --trace FILE */
  const char *svg;        /* weft estimate --svg FILE */
  bool symbolic;          /* weft estimate --cost symbolic */
  int steps;              /* weft run --steps */
  uint64_t seed;          /* weft run --seed */
  const char *load, *inputs, *save, *resume;  /* weft run files */
  bool run_check;         /* weft run --check */
  bool allow_native;      /* weft run --allow-native */
  bool seed_given;        /* --seed on the command line (else a checkpoint's) */
  int color;              /* -1 auto, 0 never, 1 always */
  int max_errors;
} opts;

typedef struct command {
  const char *name;
  int (*run)(opts *o);
  const char *summary;
  const char *usage;
} command;

static int cmd_check(opts *o);
static int cmd_fmt(opts *o);
static int cmd_graph(opts *o);
static int cmd_explain(opts *o);
static int cmd_lower(opts *o);
static int cmd_estimate(opts *o);
static int cmd_run(opts *o);
static const command *find_command(const char *name);

static const char *const common_help =
    "  --set NAME=VALUE   override a top-level `param` of the file (repeatable)\n"
    "  --stdlib DIR       read the standard library from DIR (also WEFT_STDLIB)\n"
    "  --color WHEN       auto, always or never (NO_COLOR is honoured)\n"
    "  --max-errors N     stop reporting after N errors (default 50)\n";

static const command commands[] = {
    {"check", cmd_check, "check files: syntax, names, types, units, shapes",
     "usage: weft check [options] FILE...\n\n"
     "Parses and evaluates each FILE and everything it imports, builds the\n"
     "operator graph of every model the file defines and every cluster, and\n"
     "reports each problem at file:line:col. Prints a summary for a valid file.\n\n"
     "options:\n"
     "  --json             print one JSON object: files, diagnostics, summaries\n"},
    {"fmt", cmd_fmt, "print files in canonical form",
     "usage: weft fmt [-w | --check] FILE...\n\n"
     "Prints each FILE in canonical form (comments kept). FILE '-' reads stdin.\n\n"
     "options:\n"
     "  -w, --write        rewrite the files in place (atomically)\n"
     "  --check            print the names of files that are not canonical; exit 1 if any\n"
     "  --roundtrip        verify that fmt is idempotent and keeps the syntax tree\n"},
    {"graph", cmd_graph, "print a model's operator graph",
     "usage: weft graph [options] FILE\n\n"
     "Builds the operator graph of a model: tensors with shapes and dtypes,\n"
     "operators with FLOPs, the parameter count and bytes.\n\n"
     "options:\n"
     "  --model NAME       the model (default: the last one the file defines)\n"
     "  --json             print the graph as JSON\n"
     "  --dot              print the graph for Graphviz (dot -Tsvg)\n"},
    {"explain", cmd_explain, "how a plan splits and places operators, and what feeds them",
     "usage: weft explain [options] FILE OPERATOR...\n\n"
     "For each operator (a name or a glob: h.3.attn.c_proj, h.*.mlp.c_fc, all) of a\n"
     "plan: its dimensions, how the plan splits them, where its sub-operators\n"
     "run, and the communication that feeds its inputs and sums its gradients.\n\n"
     "options:\n"
     "  --plan NAME        the plan (default: the last one the file defines)\n"},
    {"lower", cmd_lower, "print the program each device runs for one training step",
     "usage: weft lower [options] FILE\n\n"
     "Checks a plan and prints its lowered program: per device, the ordered\n"
     "instructions of one training step (alloc, compute, send, recv, collective,\n"
     "step, free) with buffer sizes, dtypes and regions. The format is in\n"
     "docs/program.md; --json is what backends read, identical across runs.\n\n"
     "options:\n"
     "  --plan NAME        the plan (default: the last one the file defines)\n"
     "  --json             print the program as JSON\n"
     "  --device N         only device N\n"
     "  --grid             print the schedule as a grid in weft syntax, to paste and edit\n"},
    {"estimate", cmd_estimate, "estimate step time, throughput and memory of a plan",
     "usage: weft estimate [options] FILE\n\n"
     "Lowers a plan and runs its programs through the cost model of its cluster:\n"
     "a roofline per sub-operator, collectives by algorithm and placement, and a\n"
     "simulation of every device's streams. Prints step time, throughput, model\n"
     "FLOP/s per device and MFU, the pipeline bubble, peak memory per device and\n"
     "the bytes moved per link level. The model is described in docs/estimate.md.\n\n"
     "options:\n"
     "  --plan NAME        the plan (default: the last one the file defines)\n"
     "  --json             print one JSON object\n"
     "  --trace FILE       write the simulated timeline as Chrome trace JSON (Perfetto)\n"
     "  --svg FILE         write the schedule as an SVG picture, devices against time\n"
     "  --cost MODEL       roofline (default) or symbolic: FLOPs and bytes only, no hardware figures\n"},
    {"run", cmd_run, "train with a plan on the CPU backend, and prove it equals one device",
     "usage: weft run [options] FILE\n\n"
     "Lowers a plan and executes its programs: every device of the plan a thread\n"
     "with its own memory, send/recv and collectives over shared memory (under\n"
     "mpirun, over MPI between processes). Prints the loss of every step. Kernels\n"
     "compute in f32; bf16 tensors are held as f32. docs/run.md says more.\n\n"
     "options:\n"
     "  --plan NAME        the plan (default: the last one the file defines)\n"
     "  --backend NAME     cpu (the default and, for now, the only one)\n"
     "  --steps N          training steps (default 1)\n"
     "  --seed S           seed of the initial parameters and generated inputs (default 0)\n"
     "  --load FILE        parameters from a safetensors file, by the model's names\n"
     "  --inputs FILE      the batch from a safetensors file (tokens, labels for gpt), every step\n"
     "  --save FILE        write parameters and optimizer state after the last step (atomically)\n"
     "  --resume FILE      continue from a file --save wrote (parameters, state, step, seed)\n"
     "  --check            run the same steps on one device without the plan and compare\n"
     "                     the loss of every step and every parameter (relative 1e-5)\n"
     "  --allow-native     let operators with native kernels (kernel = \"lib.so:fn\") load them\n"
     "  --json             print one JSON object: steps, check, saved file\n"},
};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

static void usage_main(FILE *out) {
  fprintf(out,
          "weft %s - parallelization plans for deep-learning training\n\n"
          "usage: weft COMMAND [options] FILE...\n\ncommands:\n", WEFT_VERSION);
  for (int i = 0; i < NCOMMANDS; i++) fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "  %-8s %s\n  %-8s %s\n", "help", "help on a command: weft help check", "version",
          "print the version");
  fprintf(out, "\ncommon options:\n%s\nexit status: 0 accepted, 1 input rejected, 2 weft failed\n", common_help);
  fprintf(out, "environment: WEFT_PROFILE=1 prints the time and memory of each phase on stderr (docs/cli.md)\n");
}

static bool use_color(opts *o) {
  if (o->color >= 0) return o->color;
  const char *term = getenv("TERM");
  return isatty(2) && !getenv("NO_COLOR") && term && strcmp(term, "dumb") != 0;
}

static weft_ctx *new_ctx(opts *o) {
  weft_ctx *c = weft_new();
  if (o->stdlib_dir) c->stdlib_dir = o->stdlib_dir;
  c->diags.max_errors = o->max_errors;
  for (int i = 0; i < o->nsets; i++) weft_set(c, o->sets[i]);
  return c;
}

static void report(weft_ctx *c, opts *o) {
  if (!o->json) diag_print(&c->diags, stderr, use_color(o));
}

/* ---- check -------------------------------------------------------------- */

static bool all_params_bound(const vdecl *d) {
  const ast_list *ps = &d->node->list;
  for (int i = 0; i < ps->n; i++)
    if (!ps->items[i]->a && !record_get(d->bound, ps->items[i]->name)) return false;
  return true;
}

static const char *grouped(char *buf, int64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
  int o = 0;
  for (int i = 0; i < n; i++) {
    buf[o++] = tmp[i];
    if (tmp[i] != '-' && (n - i - 1) % 3 == 0 && i != n - 1) buf[o++] = ',';
  }
  buf[o] = 0;
  return buf;
}

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

static int check_one(opts *o, const char *path, json *j) {
  weft_ctx *c = new_ctx(o);
  int64_t *peaks[256] = {0};  /* per plan: every device's simulated peak (estimate_quiet) */
  c->reps = true;  /* replicas' programs are checked through their representative's */
  int rc = c->diags.errors ? WEFT_REJECTED : weft_load(c, path);
  summary *s = calloc(1, sizeof *s);
  if (!s) weft_oom();
  if (rc == WEFT_OK && c->main->root && c->main->root->list.n == 0) {
    /* an empty file is almost always the wrong file */
    weft_loc start = {c->main->file, 1, 1, 1, 1};
    weft_diag *g = eval_error(c, start, "the file defines nothing: there is nothing to check");
    diag_hint(g, &c->diags, "a .plan file defines models and clusters; see docs/language.md");
    rc = WEFT_REJECTED;
  }
  if (rc == WEFT_OK) {
    s->nmodels = weft_items(c, V_MODEL, s->items, 256);
    if (s->nmodels > 256) s->nmodels = 256;
    for (int i = 0; i < s->nmodels; i++)
      if (all_params_bound(s->items[i].val.decl))
        s->graphs[i] = weft_build_graph(c, s->items[i].val, s->items[i].loc);
    s->nclusters = weft_items(c, V_CLUSTER, s->citems, 256);
    if (s->nclusters > 256) s->nclusters = 256;
    for (int i = 0; i < s->nclusters; i++) {
      s->clusters[i] = v_none();
      if (all_params_bound(s->citems[i].val.decl))
        s->clusters[i] = weft_build_cluster(c, s->citems[i].val, s->citems[i].loc);
    }
    s->nplans = weft_items(c, V_PLAN, s->pitems, 256);
    if (s->nplans > 256) s->nplans = 256;
    for (int i = 0; i < s->nplans; i++)
      if (all_params_bound(s->pitems[i].val.decl)) {
        s->plans[i] = weft_build_plan(c, s->pitems[i].val, s->pitems[i].loc);
        /* validated without the memory rule, which the simulation applies */
        if (s->plans[i]) s->progs[i] = lower_plan(s->plans[i], NULL, &c->arena, &c->diags);
        if (s->progs[i] && !validate_program(s->progs[i], &(validate_opts){.skip_memory = true}, &c->diags))
          s->progs[i] = NULL;
        if (s->progs[i] && !estimate_quiet(c, s->progs[i], &s->est[i], &s->est_ok[i], &peaks[i])) s->progs[i] = NULL;
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
    report(c, o);
    if (rc == WEFT_OK) {
      printf("%s: ok\n", path);
      for (int i = 0; i < s->nmodels; i++) {
        weft_graph *g = s->graphs[i];
        if (g)
          printf("  model %s: %d operator%s, %s parameters\n", s->items[i].name, g->nops, g->nops == 1 ? "" : "s",
                 grouped(b1, graph_param_count(g)));
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
                 grouped(b1, pr->instructions_all));
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
                   grouped(b1, bytes[k]));
          }
        }
      }
    }
  }
  free(s);
  weft_free(c);
  return rc;
}

static int cmd_check(opts *o) {
  if (o->nfiles == 0) {
    fprintf(stderr, "weft check: no input files\n%s", commands[0].usage);
    return WEFT_FAILED;
  }
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

/* ---- fmt ---------------------------------------------------------------- */

static char *read_stdin(size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (!buf) weft_oom();
  size_t got;
  while ((got = fread(buf + n, 1, cap - n, stdin)) > 0) {
    n += got;
    if (n == cap) {
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) weft_oom();
      buf = nb;
    }
  }
  *len = n;
  return buf;
}

/* The canonical text of one file, malloc'd; NULL after diagnostics. */
static char *fmt_text(weft_ctx *c, int file, ast **root_out) {
  weft_parse_opts po = {&c->arena, &c->srcs, &c->diags};
  ast *root = weft_parse(&po, file);
  if (!root) return NULL;
  char *out = NULL;
  size_t n = 0;
  FILE *mem = open_memstream(&out, &n);
  if (!mem) weft_oom();
  weft_fmt(root, &c->srcs.items[file], mem);
  fclose(mem);
  if (root_out) *root_out = root;
  return out;
}

static int write_atomically(const char *path, const char *text) {
  char *tmp = malloc(strlen(path) + 16);
  if (!tmp) weft_oom();
  sprintf(tmp, "%s.weft-tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) { fprintf(stderr, "weft: error: cannot write '%s': %s\n", tmp, strerror(errno)); free(tmp); return WEFT_FAILED; }
  size_t len = strlen(text);
  bool ok = fwrite(text, 1, len, f) == len;
  ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path) != 0) {
    fprintf(stderr, "weft: error: cannot write '%s': %s\n", path, strerror(errno));
    remove(tmp);
    free(tmp);
    return WEFT_FAILED;
  }
  free(tmp);
  return WEFT_OK;
}

static int fmt_one(opts *o, const char *path) {
  weft_ctx *c = new_ctx(o);
  int file;
  if (strcmp(path, "-") == 0) {
    size_t len;
    char *buf = read_stdin(&len);
    file = src_add(&c->srcs, &c->arena, "<stdin>", "", buf, len);
    free(buf);
  } else {
    file = src_read(&c->srcs, &c->arena, path);
    if (file < 0) {
      fprintf(stderr, "weft: error: cannot read '%s': %s\n", path, strerror(errno));
      weft_free(c);
      return WEFT_FAILED;
    }
  }
  ast *root = NULL;
  char *out = fmt_text(c, file, &root);
  int rc = WEFT_OK;
  if (!out) {
    report(c, o);
    rc = WEFT_REJECTED;
  } else if (o->roundtrip) {
    int f2 = src_add(&c->srcs, &c->arena, arena_printf(&c->arena, "%s (formatted)", path), "", out, strlen(out));
    ast *root2 = NULL;
    char *out2 = fmt_text(c, f2, &root2);
    if (!out2) {
      report(c, o);
      fprintf(stderr, "%s: fmt output does not parse\n", path);
      rc = WEFT_REJECTED;
    } else if (!ast_equal(root, root2)) {
      fprintf(stderr, "%s: fmt changes the syntax tree\n", path);
      rc = WEFT_REJECTED;
    } else if (strcmp(out, out2) != 0) {
      fprintf(stderr, "%s: fmt is not idempotent\n", path);
      rc = WEFT_REJECTED;
    } else if (root->list2.n != root2->list2.n) {
      fprintf(stderr, "%s: fmt loses comments (%d before, %d after)\n", path, root->list2.n, root2->list2.n);
      rc = WEFT_REJECTED;
    }
    free(out2);
  } else if (o->check) {
    const weft_src *s = &c->srcs.items[file];
    if (strlen(out) != s->len || memcmp(out, s->text, s->len) != 0) {
      printf("%s: not formatted\n", path);
      rc = WEFT_REJECTED;
    }
  } else if (o->write && strcmp(path, "-") != 0) {
    const weft_src *s = &c->srcs.items[file];
    if (strlen(out) != s->len || memcmp(out, s->text, s->len) != 0) rc = write_atomically(path, out);
  } else {
    fputs(out, stdout);
  }
  free(out);
  weft_free(c);
  return rc;
}

static int cmd_fmt(opts *o) {
  if (o->nfiles == 0) {
    fprintf(stderr, "weft fmt: no input files (use - for stdin)\n%s", commands[1].usage);
    return WEFT_FAILED;
  }
  int worst = WEFT_OK;
  for (int i = 0; i < o->nfiles; i++) {
    int rc = fmt_one(o, o->files[i]);
    if (rc > worst) worst = rc;
  }
  return worst;
}

/* ---- graph -------------------------------------------------------------- */

static int cmd_graph(opts *o) {
  if (o->nfiles != 1) {
    fprintf(stderr, "weft graph: needs exactly one file\n%s", commands[2].usage);
    return WEFT_FAILED;
  }
  weft_ctx *c = new_ctx(o);
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
        weft_diag *d = eval_error(c, none, "%s defines no model '%s'", o->files[0], o->model);
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
        weft_diag *d = eval_error(c, none, "%s defines no model", o->files[0]);
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
  report(c, o);
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

/* ---- explain ------------------------------------------------------------ */

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
         grouped(b1, cm->size), cm->level ? ", across nodes" : "");
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

/* Loads o->files[0] and builds the plan --plan names (default: the last
 * one the file defines). NULL with *rc set after diagnostics. */
static weft_plan *pick_plan(weft_ctx *c, opts *o, int *rc) {
  *rc = c->diags.errors ? WEFT_REJECTED : weft_load(c, o->files[0]);
  weft_plan *p = NULL;
  weft_loc none = {0};
  if (*rc != WEFT_OK) return NULL;
  weft_item items[256];
  int n = weft_items(c, V_PLAN, items, 256);
  if (n > 256) n = 256;
  int pick = n - 1;
  if (o->plan) {
    pick = -1;
    for (int i = 0; i < n; i++)
      if (strcmp(items[i].name, o->plan) == 0) pick = i;
  }
  if (pick < 0) {
    weft_diag *d = o->plan ? eval_error(c, none, "%s defines no plan '%s'", o->files[0], o->plan)
                           : eval_error(c, none, "%s defines no plan", o->files[0]);
    const char *names[256];
    for (int i = 0; i < n; i++) names[i] = items[i].name;
    const char *best = o->plan ? diag_closest(o->plan, names, n) : NULL;
    if (best) diag_hint(d, &c->diags, "did you mean '%s'?", best);
    *rc = WEFT_REJECTED;
    return NULL;
  }
  p = weft_build_plan(c, items[pick].val, items[pick].loc);
  if (!p) *rc = WEFT_REJECTED;
  return p;
}

static int cmd_explain(opts *o) {
  if (o->nfiles < 2) {
    fprintf(stderr, "weft explain: needs a file and at least one operator\n%s", commands[3].usage);
    return WEFT_FAILED;
  }
  weft_ctx *c = new_ctx(o);
  int rc = WEFT_OK;
  weft_plan *p = pick_plan(c, o, &rc);
  weft_loc none = {0};
  if (p) {
    int *ops = calloc((size_t)(p->g->nops ? p->g->nops : 1), sizeof(int));
    if (!ops) weft_oom();
    int printed = 0;
    for (int f = 1; f < o->nfiles; f++) {
      int n = o->files[f][0] ? plan_select_text(p, o->files[f], ops, p->g->nops) : 0;
      if (n == 0) {
        const char **names = calloc((size_t)p->g->nops + 1, sizeof(char *));
        if (!names) weft_oom();
        for (int i = 0; i < p->g->nops; i++) names[i] = p->g->ops[i].name;
        weft_diag *d = eval_error(c, none, "'%s' matches no operator of model %s", o->files[f], p->g->name);
        const char *best = diag_closest(o->files[f], names, p->g->nops);
        if (best) diag_hint(d, &c->diags, "did you mean '%s'?", best);
        free(names);
        rc = WEFT_REJECTED;
        continue;
      }
      for (int i = 0; i < n; i++) {
        if (printed++) printf("\n");
        explain_op(c, p, ops[i]);
      }
    }
    free(ops);
  }
  report(c, o);
  weft_free(c);
  return rc;
}

static int cmd_lower(opts *o) {
  if (o->nfiles != 1) {
    fprintf(stderr, "weft lower: needs one file\n%s", commands[4].usage);
    return WEFT_FAILED;
  }
  if (o->grid && o->json) {
    fprintf(stderr, "weft lower: --grid and --json exclude each other\n");
    return WEFT_FAILED;
  }
  weft_ctx *c = new_ctx(o);
  int rc = WEFT_OK;
  weft_plan *p = pick_plan(c, o, &rc);
  lower_opts lo = {.full_programs = true};  /* printed */
  weft_program *pr = p ? lower_plan(p, &lo, &c->arena, &c->diags) : NULL;
  if (pr && !validate_program(pr, NULL, &c->diags)) pr = NULL;
  if (p && !pr) rc = WEFT_REJECTED;
  if (pr && o->device >= pr->nprogs) {
    weft_loc none = {0};
    eval_error(c, none, "--device %d: the plan's cluster has devices 0 to %d", o->device, pr->nprogs - 1);
    rc = WEFT_REJECTED;
    pr = NULL;
  }
  report(c, o);
  if (o->json && !pr) {
    diag_print_json(&c->diags, stdout);
    printf("\n");
  }
  if (pr) {
    if (o->grid) lower_print_grid(pr, stdout);
    else if (o->json) lower_print_json(pr, o->device, stdout);
    else lower_print_text(pr, o->device, stdout);
  }
  weft_free(c);
  return rc;
}

/* ---- estimate ----------------------------------------------------------- */

/* Writes a picture or trace to path; false (and a message) when it cannot. */
static bool write_file(const char *path, const weft_sim *s, void (*print)(const weft_sim *, FILE *)) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "weft estimate: cannot write %s: %s\n", path, strerror(errno));
    return false;
  }
  print(s, f);
  bool ok = !ferror(f);
  if (fclose(f) != 0) ok = false;
  if (!ok) fprintf(stderr, "weft estimate: cannot write %s: %s\n", path, strerror(errno));
  return ok;
}

static int cmd_estimate(opts *o) {
  if (o->nfiles != 1) {
    fprintf(stderr, "weft estimate: needs one file\n%s", find_command("estimate")->usage);
    return WEFT_FAILED;
  }
  weft_ctx *c = new_ctx(o);
  c->reps = true;  /* replicas run their representative's program */
  int rc = WEFT_OK;
  prof_mark("start");
  weft_plan *p = pick_plan(c, o, &rc);
  /* a plan that does not fit is estimated all the same, and rejected */
  weft_program *pr = p ? lower_plan(p, NULL, &c->arena, &c->diags) : NULL;
  if (pr && !validate_program(pr, &(validate_opts){.skip_memory = true}, &c->diags)) pr = NULL;
  if (p && !pr) rc = WEFT_REJECTED;
  hw_model hw;
  if (pr && !o->symbolic && !hw_from_plan(&c->diags, p, pr, &hw)) {
    rc = WEFT_REJECTED;
    pr = NULL;
  }
  weft_sim *s = NULL;
  if (pr) {
    /* per-instruction times only for the pictures that draw them */
    s = sim_run_with(pr, o->symbolic ? NULL : &hw, o->trace || o->svg ? SIM_TIMELINE : 0);
    prof_mark("simulate");
    if (s && !validate_memory_sim(s, &c->diags)) rc = WEFT_REJECTED;
  }
  report(c, o);
  if (o->json && !pr) {
    diag_print_json(&c->diags, stdout);
    printf("\n");
  }
  if (pr) {
    if (!s) {
      fprintf(stderr, "weft estimate: the programs of plan %s do not finish in the simulation\n", p->name);
      rc = WEFT_FAILED;
    } else {
      weft_estimate e;
      sim_estimate(s, &e);
      if (o->json) estimate_print_json(s, &e, stdout);
      else estimate_print_text(s, &e, stdout);
      if (o->trace && !write_file(o->trace, s, estimate_print_trace)) rc = WEFT_FAILED;
      if (o->svg && !write_file(o->svg, s, estimate_print_svg)) rc = WEFT_FAILED;
      prof_mark("report");
      sim_free(s);
    }
  }
  weft_free(c);
  prof_mark("free");
  return rc;
}

/* ---- run -------------------------------------------------------------- */

/* Losses of a run, step by step. */
typedef struct run_log {
  bool print;             /* a line per step on stdout */
  int64_t items;          /* tokens (or samples) per step */
  const char *unit;
  int n, cap;
  int64_t *step;
  double *loss, *time;
} run_log;

static void run_on_step(void *ctx, int64_t step, double loss, double seconds) {
  run_log *l = ctx;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->step = realloc(l->step, (size_t)l->cap * sizeof(int64_t));
    l->loss = realloc(l->loss, (size_t)l->cap * sizeof(double));
    l->time = realloc(l->time, (size_t)l->cap * sizeof(double));
    if (!l->step || !l->loss || !l->time) weft_oom();
  }
  l->step[l->n] = step, l->loss[l->n] = loss, l->time[l->n] = seconds, l->n++;
  if (l->print) {
    char b[32];
    printf("step %-4" PRId64 " loss %.6f  %.3f s  %s %s/s\n", step, loss, seconds,
           grouped(b, (int64_t)(seconds > 0 ? (double)l->items / seconds : 0)), l->unit);
    fflush(stdout);
  }
}

static void run_log_free(run_log *l) { free(l->step), free(l->loss), free(l->time); }

static int run_fail(const char *what, const char *msg) __attribute__((unused));
static int run_fail(const char *what, const char *msg) {
  fprintf(stderr, "weft run: %s%s%s\n", what ? what : "", what ? ": " : "", msg);
  return WEFT_REJECTED;
}

static int cmd_run(opts *o) {
  if (o->nfiles != 1) {
    fprintf(stderr, "weft run: needs one file\n%s", find_command("run")->usage);
    return WEFT_FAILED;
  }
  if (o->load && o->resume) {
    fprintf(stderr, "weft run: --load and --resume exclude each other (a checkpoint holds the parameters)\n");
    return WEFT_FAILED;
  }
  char err[1024] = "";
  xnet *net = xnet_start(err, sizeof err);
  if (!net && err[0]) return run_fail(NULL, err);
  /* Under mpirun, process 0 speaks for all. */
  bool speak = !net || xnet_rank(net) == 0;
  weft_ctx *c = new_ctx(o);
  int rc = WEFT_OK;
  weft_plan *p = pick_plan(c, o, &rc);
  lower_opts lo = {.full_programs = true};  /* run */
  weft_program *pr = p ? lower_plan(p, &lo, &c->arena, &c->diags) : NULL;
  if (pr && !validate_program(pr, NULL, &c->diags)) pr = NULL;
  if (p && !pr) rc = WEFT_REJECTED;
  if (speak) report(c, o);
  if (!pr) {
    xnet_stop(net);
    if (o->json && speak) {
      diag_print_json(&c->diags, stdout);
      printf("\n");
    }
    weft_free(c);
    return rc;
  }
  const weft_graph *g = p->g;
  /* Native code runs only when the command line allows it; then every
   * kernel is loaded now, so that a missing one is reported where it is named. */
  for (int i = 0; i < g->nops; i++) {
    const opdecl *d = g->ops[i].decl;
    bool seen = false;
    for (int j = 0; j < i && !seen; j++) seen = g->ops[j].decl == d;
    if (!d || !d->native_fwd || seen) continue;
    if (!o->allow_native) {
      weft_diag *e = eval_error(c, d->native_loc, "operator %s runs native code from \"%s\"", d->name, d->native_fwd);
      diag_hint(e, &c->diags, "weft run loads native kernels only with --allow-native");
      rc = WEFT_REJECTED;
      continue;
    }
    for (int k = 0; k < 2; k++) {
      const char *spec = k ? d->native_bwd : d->native_fwd;
      if (!spec) continue;
      if (!native_load(spec, d->native_dir, err, sizeof err)) {
        eval_error(c, k ? d->native_bwd_loc : d->native_loc, "cannot load the kernel of operator %s: %s", d->name, err);
        rc = WEFT_REJECTED;
      }
    }
  }
  if (rc != WEFT_OK) {
    if (speak) report(c, o);
    xnet_stop(net);
    weft_free(c);
    return rc;
  }
  xworld *w = xworld_new(g);
  uint64_t seed = o->seed;
  bool ok = true;
  if (!g->optimizer) ok = run_fail(NULL, "the plan's model has no `train` statement: nothing to run") == 0;
  if (ok && o->resume) ok = xworld_resume(w, o->resume, o->seed_given ? NULL : &seed, err, sizeof err);
  else if (ok && o->load) ok = xworld_load_params(w, o->load, err, sizeof err);
  else if (ok) xworld_init_params(w, seed);
  if (ok && o->inputs) ok = xworld_load_inputs(w, o->inputs, err, sizeof err);
  else if (ok) xworld_init_inputs(w, seed);
  if (!ok) {
    if (err[0] && speak) run_fail(NULL, err);
    xnet_stop(net);
    xworld_free(w);
    weft_free(c);
    return WEFT_REJECTED;
  }
  xworld *ref = o->run_check ? xworld_clone(w) : NULL;
  run_log log = {0};
  log.print = !o->json && speak;
  log.items = xworld_step_items(g, &log.unit);
  int active = 0;
  for (int d = 0; d < pr->nprogs; d++) active += pr->progs[d].n > 0;
  char procs[64] = "";
  if (net) snprintf(procs, sizeof procs, " in %d processes", xnet_size(net));
  if (!o->json && speak)
    printf("plan %s (model %s): %d device%s%s, %d micro-batch%s, cpu backend, %d step%s from step %" PRId64 "\n",
           p->name, g->name, active, active == 1 ? "" : "s", procs, pr->nmb, pr->nmb == 1 ? "" : "es", o->steps,
           o->steps == 1 ? "" : "s", w->step + 1);
  fflush(stdout);
  xrun_opts ro = {.steps = o->steps, .on_step = run_on_step, .ctx = &log, .allow_native = o->allow_native, .net = net};
  ok = xrun_program(pr, w, &ro, err, sizeof err);
  if (!ok) rc = run_fail(NULL, err);
  /* --check: the same steps on one device. */
  run_log rlog = {0};
  double loss_err = 0, param_err = 0, tensor_err = 0;
  const char *worst = NULL;
  bool check_ok = true;
  if (ok && ref) {
    xrun_opts rro = {.steps = o->steps, .on_step = run_on_step, .ctx = &rlog, .allow_native = o->allow_native};
    ok = xrun_reference(g, ref, &rro, err, sizeof err);
    if (!ok) rc = run_fail("one-device reference", err);
  }
  if (ok && ref) {
    for (int i = 0; i < log.n && i < rlog.n; i++) {
      double e = fabs(log.loss[i] - rlog.loss[i]) / (fabs(rlog.loss[i]) > 0 ? fabs(rlog.loss[i]) : 1.0);
      if (e > loss_err) loss_err = e;
    }
    param_err = xworld_diff_all(w, ref);
    tensor_err = xworld_diff(w, ref, false, &worst);
    check_ok = log.n == rlog.n && loss_err <= 1e-5 && param_err <= 1e-5;
    if (!o->json && speak) {
      printf("check against one device: losses within %.2g, parameters within %.2g (relative L2; worst tensor %s "
             "%.2g): %s\n",
             loss_err, param_err, worst ? worst : "-", tensor_err, check_ok ? "match" : "MISMATCH (tolerance 1e-5)");
      if (!check_ok)
        for (int i = 0; i < log.n && i < rlog.n; i++)
          printf("  step %" PRId64 ": plan %.9g, one device %.9g\n", log.step[i], log.loss[i], rlog.loss[i]);
    }
    if (!check_ok) rc = WEFT_REJECTED;
  }
  bool saved = false;
  if (ok && o->save && speak) {
    if (xworld_save(w, o->save, seed, err, sizeof err)) {
      saved = true;
      if (!o->json) printf("saved %s (step %" PRId64 ")\n", o->save, w->step);
    } else {
      rc = run_fail("--save", err);
    }
  }
  if (o->json && speak) {
    json j;
    json_init(&j, stdout);
    json_obj(&j);
    json_key(&j, "plan"), json_str(&j, p->name);
    json_key(&j, "model"), json_str(&j, g->name);
    json_key(&j, "backend"), json_str(&j, "cpu");
    json_key(&j, "devices"), json_int(&j, active);
    json_key(&j, "micro_batches"), json_int(&j, pr->nmb);
    json_key(&j, "ok"), json_bool(&j, ok && check_ok && rc == WEFT_OK);
    if (!ok) json_key(&j, "error"), json_str(&j, err);
    json_key(&j, "steps");
    json_arr(&j);
    for (int i = 0; i < log.n; i++) {
      json_obj(&j);
      json_key(&j, "step"), json_int(&j, log.step[i]);
      json_key(&j, "loss"), json_num(&j, log.loss[i]);
      json_key(&j, "time_s"), json_num(&j, log.time[i]);
      json_key(&j, log.unit[0] == 't' ? "tokens_per_s" : "samples_per_s");
      json_num(&j, log.time[i] > 0 ? (double)log.items / log.time[i] : 0);
      if (ref && i < rlog.n) json_key(&j, "reference_loss"), json_num(&j, rlog.loss[i]);
      json_end_obj(&j);
    }
    json_end_arr(&j);
    if (ref && ok) {
      json_key(&j, "check");
      json_obj(&j);
      json_key(&j, "match"), json_bool(&j, check_ok);
      json_key(&j, "tolerance"), json_num(&j, 1e-5);
      json_key(&j, "max_loss_rel_err"), json_num(&j, loss_err);
      json_key(&j, "max_param_rel_err"), json_num(&j, param_err);
      json_key(&j, "worst_tensor"), worst ? json_str(&j, worst) : json_null(&j);
      json_key(&j, "worst_tensor_rel_err"), json_num(&j, tensor_err);
      json_end_obj(&j);
    }
    if (saved) json_key(&j, "saved"), json_str(&j, o->save);
    json_end_obj(&j);
    printf("\n");
  }
  xnet_stop(net);
  run_log_free(&log);
  run_log_free(&rlog);
  xworld_free(ref);
  xworld_free(w);
  weft_free(c);
  return rc;
}

/* ---- arguments ---------------------------------------------------------- */

static const command *find_command(const char *name) {
  for (int i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

static void help_command(const command *cmd, FILE *out) {
  fputs(cmd->usage, out);
  fprintf(out, "%s", common_help);
}

/* An option's value: "--opt=v" or "--opt v". */
static const char *opt_value(int argc, char **argv, int *i, const char *name) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) == 0 && argv[*i][n] == '=') return argv[*i] + n + 1;
  if (*i + 1 >= argc) {
    fprintf(stderr, "weft: error: %s needs a value\n", name);
    return NULL;
  }
  return argv[++*i];
}

static bool is_opt(const char *arg, const char *name) {
  size_t n = strlen(name);
  return strncmp(arg, name, n) == 0 && (arg[n] == 0 || arg[n] == '=');
}

int main(int argc, char **argv) {
  /* Blocks of up to 32 MiB (the arenas' are 16) come from the heap, and
   * what is freed stays there for the next phase: every page a phase frees
   * and the next one faults in again costs microseconds (0.1 s in 125,000
   * faults of an estimate of GPT-3 on 1024 devices). */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  k_blas_single();
  if (argc < 2) {
    usage_main(stderr);
    return WEFT_FAILED;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) { usage_main(stdout); return 0; }
  if (strcmp(name, "--version") == 0 || strcmp(name, "version") == 0) { printf("weft %s\n", WEFT_VERSION); return 0; }
  if (strcmp(name, "help") == 0) {
    if (argc < 3) { usage_main(stdout); return 0; }
    const command *cmd = find_command(argv[2]);
    if (!cmd) {
      const char *names[NCOMMANDS];
      for (int i = 0; i < NCOMMANDS; i++) names[i] = commands[i].name;
      const char *best = diag_closest(argv[2], names, NCOMMANDS);
      fprintf(stderr, "weft: unknown command '%s'", argv[2]);
      if (best) fprintf(stderr, "; did you mean '%s'?", best);
      fprintf(stderr, "\nrun 'weft --help' for the list of commands\n");
      return WEFT_FAILED;
    }
    help_command(cmd, stdout);
    return 0;
  }
  const command *cmd = find_command(name);
  if (!cmd) {
    const char *names[NCOMMANDS];
    for (int i = 0; i < NCOMMANDS; i++) names[i] = commands[i].name;
    const char *best = diag_closest(name, names, NCOMMANDS);
    fprintf(stderr, "weft: unknown command '%s'", name);
    if (best) fprintf(stderr, "; did you mean '%s'?", best);
    fprintf(stderr, "\nrun 'weft --help' for the list of commands\n");
    return WEFT_FAILED;
  }
  opts o = {0};
  o.color = -1;
  o.max_errors = 50;
  o.device = -1;
  o.steps = 1;
  o.files = calloc((size_t)argc, sizeof(char *));
  o.sets = calloc((size_t)argc, sizeof(char *));
  if (!o.files || !o.sets) weft_oom();
  int rc = WEFT_FAILED;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    const char *v;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { help_command(cmd, stdout); rc = 0; goto done; }
    else if (strcmp(a, "--json") == 0) o.json = true;
    else if (strcmp(a, "--dot") == 0 && cmd->run == cmd_graph) o.dot = true;
    else if ((strcmp(a, "-w") == 0 || strcmp(a, "--write") == 0) && cmd->run == cmd_fmt) o.write = true;
    else if (strcmp(a, "--check") == 0 && cmd->run == cmd_fmt) o.check = true;
    else if (strcmp(a, "--roundtrip") == 0 && cmd->run == cmd_fmt) o.roundtrip = true;
    else if (is_opt(a, "--set")) { if (!(v = opt_value(argc, argv, &i, "--set"))) goto done; o.sets[o.nsets++] = v; }
    else if (is_opt(a, "--model") && cmd->run == cmd_graph) { if (!(v = opt_value(argc, argv, &i, "--model"))) goto done; o.model = v; }
    else if (strcmp(a, "--grid") == 0 && cmd->run == cmd_lower) o.grid = true;
    else if (is_opt(a, "--device") && cmd->run == cmd_lower) {
      if (!(v = opt_value(argc, argv, &i, "--device"))) goto done;
      char *end;
      long n = strtol(v, &end, 10);
      if (*end || !*v || n < 0 || n > 1000000) { fprintf(stderr, "weft: error: --device needs a device number\n"); goto done; }
      o.device = (int)n;
    }
    else if (is_opt(a, "--trace") && cmd->run == cmd_estimate) { if (!(v = opt_value(argc, argv, &i, "--trace"))) goto done; o.trace = v; }
    else if (is_opt(a, "--svg") && cmd->run == cmd_estimate) { if (!(v = opt_value(argc, argv, &i, "--svg"))) goto done; o.svg = v; }
    else if (is_opt(a, "--cost") && cmd->run == cmd_estimate) {
      if (!(v = opt_value(argc, argv, &i, "--cost"))) goto done;
      if (strcmp(v, "symbolic") == 0) o.symbolic = true;
      else if (strcmp(v, "roofline") == 0) o.symbolic = false;
      else { fprintf(stderr, "weft: error: --cost needs roofline or symbolic\n"); goto done; }
    }
    else if (cmd->run == cmd_run && (is_opt(a, "--steps") || is_opt(a, "--seed"))) {
      bool st = is_opt(a, "--steps");
      if (!(v = opt_value(argc, argv, &i, st ? "--steps" : "--seed"))) goto done;
      char *end;
      errno = 0;
      unsigned long long n = strtoull(v, &end, 10);
      if (*end || !*v || v[0] == '-' || errno || (st && n > 100000000)) {
        fprintf(stderr, "weft: error: %s needs a %s\n", st ? "--steps" : "--seed",
                st ? "number of steps (0 to 100000000)" : "non-negative integer");
        goto done;
      }
      if (st) o.steps = (int)n;
      else o.seed = n, o.seed_given = true;
    }
    else if (cmd->run == cmd_run && is_opt(a, "--load")) { if (!(v = opt_value(argc, argv, &i, "--load"))) goto done; o.load = v; }
    else if (cmd->run == cmd_run && is_opt(a, "--inputs")) { if (!(v = opt_value(argc, argv, &i, "--inputs"))) goto done; o.inputs = v; }
    else if (cmd->run == cmd_run && is_opt(a, "--save")) { if (!(v = opt_value(argc, argv, &i, "--save"))) goto done; o.save = v; }
    else if (cmd->run == cmd_run && is_opt(a, "--resume")) { if (!(v = opt_value(argc, argv, &i, "--resume"))) goto done; o.resume = v; }
    else if (cmd->run == cmd_run && strcmp(a, "--check") == 0) o.run_check = true;
    else if (cmd->run == cmd_run && strcmp(a, "--allow-native") == 0) o.allow_native = true;
    else if (cmd->run == cmd_run && is_opt(a, "--backend")) {
      if (!(v = opt_value(argc, argv, &i, "--backend"))) goto done;
      if (strcmp(v, "cpu") != 0) {
        fprintf(stderr, "weft run: backend '%s' is not available; this build runs plans on: cpu\n", v);
        goto done;
      }
    }
    else if (is_opt(a, "--plan") && (cmd->run == cmd_explain || cmd->run == cmd_lower || cmd->run == cmd_estimate || cmd->run == cmd_run)) { if (!(v = opt_value(argc, argv, &i, "--plan"))) goto done; o.plan = v; }
    else if (is_opt(a, "--stdlib")) { if (!(v = opt_value(argc, argv, &i, "--stdlib"))) goto done; o.stdlib_dir = v; }
    else if (is_opt(a, "--max-errors")) {
      if (!(v = opt_value(argc, argv, &i, "--max-errors"))) goto done;
      char *end;
      long n = strtol(v, &end, 10);
      if (*end || n < 1 || n > 100000) { fprintf(stderr, "weft: error: --max-errors needs a positive number\n"); goto done; }
      o.max_errors = (int)n;
    } else if (is_opt(a, "--color")) {
      if (!(v = opt_value(argc, argv, &i, "--color"))) goto done;
      if (strcmp(v, "auto") == 0) o.color = -1;
      else if (strcmp(v, "always") == 0) o.color = 1;
      else if (strcmp(v, "never") == 0) o.color = 0;
      else { fprintf(stderr, "weft: error: --color needs auto, always or never\n"); goto done; }
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "weft %s: unknown option '%s'\nrun 'weft %s --help' for its options\n", cmd->name, a, cmd->name);
      goto done;
    } else {
      o.files[o.nfiles++] = a;
    }
  }
  if (o.dot && o.json) { fprintf(stderr, "weft graph: --json and --dot exclude each other\n"); goto done; }
  if ((o.write ? 1 : 0) + (o.check ? 1 : 0) + (o.roundtrip ? 1 : 0) > 1) {
    fprintf(stderr, "weft fmt: -w, --check and --roundtrip exclude each other\n");
    goto done;
  }
  rc = cmd->run(&o);
done:
  free(o.files);
  free(o.sets);
  return rc;
}
