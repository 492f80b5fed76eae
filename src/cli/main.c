/* main.c - the weft command line: parses arguments and calls the library.
 * Every command is a task of the report layer (report.h); `weft help
 * COMMAND` prints its usage. */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weft/report.h"
#include "weft/search.h"
#include "weft/units.h"

typedef struct command {
  const char *name;
  int (*run)(const weft_opts *o);
  int min_files, max_files;  /* the files (and operators) it takes; max -1: any */
  const char *what_files;    /* said when the count is wrong */
  const char *summary;
  const char *usage;
} command;


static const char *const common_help =
    "  --set NAME=VALUE   override a top-level `param` of the file (repeatable)\n"
    "  --stdlib DIR       read the standard library from DIR (also WEFT_STDLIB)\n"
    "  --allow-path DIR   let `use` read files under DIR too (repeatable; default: the\n"
    "                     plan's own directory and the standard library)\n";
/* weft search's --max-memory is the devices' memory: its own budget is
 * WEFT_MAX_MEMORY alone */
static const char *const budget_help =
    "  --max-memory Q     the memory weft may use for its work, e.g. '4 GiB' (also\n"
    "                     WEFT_MAX_MEMORY; default: half of the machine's memory)\n";
static const char *const common_help_end =
    "  --color WHEN       auto, always or never (NO_COLOR is honoured)\n"
    "  --max-errors N     stop reporting after N errors (default 50)\n";

static const command commands[] = {
    {"check", report_check, 1, -1, "no input files", "check files: syntax, names, types, units, shapes",
     "usage: weft check [options] FILE...\n\n"
     "Parses and evaluates each FILE and everything it imports, builds the\n"
     "operator graph of every model the file defines and every cluster, applies,\n"
     "lowers, validates and estimates every plan, and reports each problem at\n"
     "file:line:col. Prints a summary for a valid file.\n\n"
     "options:\n"
     "  --json             print one JSON object: files, diagnostics, summaries\n"},
    {"fmt", report_fmt, 1, -1, "no input files (use - for stdin)", "print files in canonical form",
     "usage: weft fmt [-w | --check | --roundtrip] FILE...\n\n"
     "Prints each FILE in canonical form (comments kept). FILE '-' reads stdin.\n\n"
     "options:\n"
     "  -w, --write        rewrite the files in place (atomically)\n"
     "  --check            print the names of files that are not canonical; exit 1 if any\n"
     "  --roundtrip        verify that fmt is idempotent and keeps the syntax tree\n"},
    {"graph", report_graph, 1, 1, "needs exactly one file", "print a model's operator graph",
     "usage: weft graph [options] FILE\n\n"
     "Builds the operator graph of a model: tensors with shapes and dtypes,\n"
     "operators with FLOPs, the parameter count and bytes.\n\n"
     "options:\n"
     "  --model NAME       the model (default: the last one the file defines)\n"
     "  --json             print the graph as JSON\n"
     "  --dot              print the graph for Graphviz (dot -Tsvg)\n"},
    {"explain", report_explain, 2, -1, "needs a file and at least one operator", "how a plan splits and places operators, and what feeds them",
     "usage: weft explain [options] FILE OPERATOR...\n\n"
     "For each operator (a name or a glob: h.3.attn.c_proj, h.*.mlp.c_fc, all) of a\n"
     "plan: its dimensions, how the plan splits them, where its sub-operators\n"
     "run, and the communication that feeds its inputs and sums its gradients.\n\n"
     "options:\n"
     "  --plan NAME        the plan (default: the last one the file defines)\n"},
    {"lower", report_lower, 1, 1, "needs one file", "print the program each device runs for one training step",
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
    {"estimate", report_estimate, 1, 1, "needs one file", "estimate step time, throughput and memory of a plan",
     "usage: weft estimate [options] FILE\n\n"
     "Lowers a plan and runs its programs through the cost model of its cluster:\n"
     "a roofline per sub-operator, collectives by algorithm and placement, and a\n"
     "simulation of every device's streams. Prints step time, throughput, model\n"
     "FLOP/s per device and MFU, the pipeline bubble, peak memory per device and\n"
     "the bytes moved per link level. The model is described in docs/estimate.md.\n\n"
     "options:\n"
     "  --plan NAME        the plan (default: the last one the file defines)\n"
     "  --json             print one JSON object\n"
     "  --trace FILE       write the simulated timeline as Chrome trace JSON (Perfetto), - stdout\n"
     "  --svg FILE         write the schedule as an SVG picture, devices against time, - stdout\n"
     "  --devices LIST     the devices the trace and the picture show: 0,8,16 or 0..8 (from 0 to 7),\n"
     "                     or all (default: 64 at most, spread over the simulated devices)\n"
     "  --cost MODEL       roofline (default) or symbolic: FLOPs and bytes only, no hardware figures\n"},
    {"run", report_run, 1, 1, "needs one file", "train with a plan on the CPU or a GPU, and prove it equals one device",
     "usage: weft run [options] FILE\n\n"
     "Lowers a plan and executes its programs: every device of the plan a thread\n"
     "with its own memory, send/recv and collectives over shared memory (under\n"
     "mpirun, over MPI between processes). Prints the loss of every step. Kernels\n"
     "compute in f32; bf16 tensors are held as f32. With --backend cuda, every\n"
     "device of the plan is a virtual device of one GPU, and bf16 tensors are\n"
     "bf16 there. docs/run.md says more.\n\n"
     "options:\n"
     "  --plan NAME        the plan (default: the last one the file defines)\n"
     "  --backend NAME     cpu (the default) or cuda (a plugin; weft backends lists them)\n"
     "  --steps N          training steps (default 1)\n"
     "  --seed S           seed of the initial parameters and generated inputs (default 0)\n"
     "  --load FILE        parameters from a safetensors file, by the model's names\n"
     "  --inputs FILE      the batch from a safetensors file (tokens, labels for gpt), every step\n"
     "  --save FILE        write parameters and optimizer state after the last step (atomically);\n"
     "                     DIR/ (ending in /): a sharded checkpoint, one shard per process and an index\n"
     "  --resume FILE      continue from a file or directory --save wrote (parameters, state, step, seed)\n"
     "  --check            run the same steps on one device without the plan and compare\n"
     "                     the loss of every step and every parameter (on the CPU relative 1e-5,\n"
     "                     1e-4 with 16-bit parameters)\n"
     "  --deterministic    no kernel whose sums may change order between runs (cuda)\n"
     "  --allow-native     let operators with native kernels (kernel = \"lib.so:fn\") load them\n"
     "  --allow-nonfinite  load NaN and infinite values, and train on through a loss or\n"
     "                     gradient that is not finite (else the run stops there, exit 1)\n"
     "  --timeout S        the longest a device or process waits for another (default 600);\n"
     "                     then the run fails, and under mpirun every process ends\n"
     "  --rendezvous R     cuda, several processes: how they share the NCCL communicator's id:\n"
     "                     mpi (the default under mpirun) or file:PATH (a shared file system)\n"
     "  --json             print one JSON object: steps, check, saved file\n"
     "training:\n"
     "  --data PATH        batches from token files (a file or a glob of shards): llm.c's\n"
     "                     .bin format, or raw uint16 (nanoGPT); a seeded order, resumable\n"
     "  --data-dtype T     uint16 (default) or uint32: tokens of files without a header\n"
     "  --val-data PATH    validation tokens: the loss is measured after the last step\n"
     "  --eval-every N     ... and after every N-th step\n"
     "  --eval-steps K     validation batches per measurement (default 10)\n"
     "  --lr X             the peak learning rate (default: the model's)\n"
     "  --lr-schedule S    constant (default), cosine or linear decay after the warmup\n"
     "  --warmup N         steps of linear warmup (default 0)\n"
     "  --lr-min X         the learning rate the decay ends at (default 0)\n"
     "  --decay-steps N    the step the decay ends at (default: the last of this run)\n"
     "  --clip X           clip gradients to a global L2 norm of X (default: no clipping)\n"
     "  --save-every N     also save a checkpoint every N steps, named FILE-stepN after --save\n"
     "  --keep K           keep the last K of those (default: all)\n"
     "  --log FILE         one JSON object per step: loss, lr, grad norm, tokens/s, val loss\n"
     "  --print-every N    a line every N steps (default 1)\n"
     "  --progress         a progress line with ETA on stderr even when it is not a terminal\n"
     "  --trace FILE       time every instruction of one step and write them as Chrome trace\n"
     "                     JSON (Perfetto), like weft estimate --trace's simulated timeline\n"
     "  --trace-step N     the step --trace times (default: the last of this run)\n"},
    {"search", report_search, 1, 1, "needs one file", "search plans for a model and write the best as a .plan",
     "usage: weft search [options] FILE\n\n"
     "Searches plans for FILE's model on a cluster: tensor parallelism chosen per\n"
     "operator, pipeline stages over its repeated blocks (each on a mesh of its\n"
     "own shape where that is faster), data, context and expert parallelism,\n"
     "micro-batches, schedules, recomputation and ZeRO. The\n"
     "fastest candidates are lowered and simulated; the best is written as a\n"
     ".plan that imports FILE, with the frontier of step time against memory\n"
     "as comments. The method is in docs/search.md.\n\n"
     "When FILE's last plan (or --plan NAME) has a `search` statement, the plan's\n"
     "written statements are kept and the search writes the rest in its place;\n"
     "when it has open decisions (?), the search fills them (with `search` too, it\n"
     "searches around the plan for every filling). --cluster puts such a plan on\n"
     "another cluster.\n\n"
     "options:\n"
     "  --plan NAME        the plan with `search` or ? to complete (default: the last one)\n"
     "  --model NAME       the model (default: the last one the file defines)\n"
     "  --cluster EXPR     the cluster, e.g. 'a100_dgx(nodes = 8)' (default: the file's last plan's)\n"
     "  -o FILE            write the plan to FILE (default: stdout)\n"
     "  --objective WHAT   time (default): the fastest that fits; memory: the smallest\n"
     "  --max-memory Q     bytes a device may use, e.g. '40 GiB' (default: the device's)\n"
     "  --top K            candidates to simulate at the end (default: 24, 4 above 64 devices)\n"
     "  --pick N           write plan N of the frontier instead of the objective's\n"
     "  --cost MODEL       model (default) or symbolic: FLOPs and bytes, no hardware figures\n"
     "  --time-limit S     stop searching after S seconds, with what was found\n"
     "  --no-buckets       keep the default gradient buckets instead of searching them\n"
     "  --progress         a progress line on stderr even when it is not a terminal\n"
     "  --json             print every plan of the frontier as JSON (with -o, write the plan too)\n"
     "  --heuristic H      a Lua heuristic: FILE.lua, or a name of stdlib/heuristics such as megatron\n"
     "                     (repeatable: they apply in order; docs/lua.md)\n"
     "  --lua-steps N      instructions the heuristics may run (default 100000000)\n"
     "  --lua-memory Q     memory the heuristics may hold, e.g. '64 MiB' (default 256 MiB)\n"},
    {"backends", report_backends, 0, 0, "takes no files", "list the backends that run plans and whether each can run here",
     "usage: weft backends [--kernels] [--json]\n\n"
     "Lists the backends of this build and the plugins weft knows (libweft_NAME.so,\n"
     "looked for as weft run looks for them), loading each: what it runs on, where\n"
     "it was loaded from, and whether it can run here (the GPU it would use, or why\n"
     "not). docs/run.md says more.\n\n"
     "options:\n"
     "  --kernels          list the kernels of each backend too\n"
     "  --json             print one JSON object\n"},
};
enum { NCOMMANDS = sizeof commands / sizeof commands[0] };

static void usage_main(FILE *out) {
  fprintf(out,
          "weft %s - parallelization plans for deep-learning training\n\n"
          "usage: weft COMMAND [options] FILE...\n\ncommands:\n", WEFT_VERSION);
  for (int i = 0; i < NCOMMANDS; i++) fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "  %-8s %s\n  %-8s %s\n", "help", "help on a command: weft help check", "version",
          "print the version");
  fprintf(out, "\ncommon options:\n%s%s%s\nexit status: 0 accepted, 1 input rejected, 2 weft failed\n", common_help,
          budget_help, common_help_end);
  fprintf(out, "environment: WEFT_PROFILE (set, not 0) prints the time and memory of each phase on stderr;\n"
               "  others in docs/cli.md\n");
}

/* ---- arguments ---------------------------------------------------------- */

static const command *find_command(const char *name) {
  for (int i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

static void help_command(const command *cmd, FILE *out) {
  fputs(cmd->usage, out);
  /* fmt reads syntax only: parameters and the standard library do not matter */
  if (cmd->run == report_fmt) fputs(common_help_end, out);
  else fprintf(out, "%s%s%s", common_help, cmd->run == report_search ? "" : budget_help, common_help_end);
}

static int unknown_command(const char *name) {
  const char *names[NCOMMANDS + 2] = {"help", "version"};
  for (int i = 0; i < NCOMMANDS; i++) names[i + 2] = commands[i].name;
  const char *best = diag_closest(name, names, NCOMMANDS + 2);
  fprintf(stderr, "weft: unknown command '%s'", name);
  if (best) fprintf(stderr, "; did you mean '%s'?", best);
  fprintf(stderr, "\nrun 'weft --help' for the list of commands\n");
  return WEFT_FAILED;
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

/* A size in bytes: "4 GiB", "512MiB", "2e9" (bytes). False when it is not
 * a positive quantity of bytes. */
static bool parse_bytes(const char *text, size_t *out) {
  char *end;
  double v = strtod(text, &end);
  if (end == text || !(v > 0)) return false;
  while (*end == ' ') end++;
  double scale = 1;
  unit_dim dim = UNIT_BYTES;
  if (*end && (!unit_lookup(end, &scale, &dim) || !unit_eq(dim, UNIT_BYTES))) return false;
  v *= scale;
  if (!(v >= 1 << 20) || v > 1e18) return false;
  *out = (size_t)v;
  return true;
}

/* A number of weft run's training options: finite, at least lo (above it
 * when strict); false after the message. */
static bool opt_real(const char *name, const char *v, double lo, bool strict, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (*end || !*v || errno || !isfinite(x) || x < lo || (strict && x == lo)) {
    fprintf(stderr, "weft: error: %s needs a %s number\n", name, strict ? "positive" : "non-negative");
    return false;
  }
  *out = x;
  return true;
}

/* A count of weft run's options, at least lo. */
static bool opt_count(const char *name, const char *v, int64_t lo, int64_t *out) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (*end || !*v || errno || n < lo || n > 1000000000000LL) {
    fprintf(stderr, "weft: error: %s needs a %s count\n", name, lo > 0 ? "positive" : "non-negative");
    return false;
  }
  *out = n;
  return true;
}

/* weft run's training options (report.h); 1: taken, 0: not one of them,
 * -1: a bad value (reported). */
static int run_option(int argc, char **argv, int *i, weft_opts *o) {
  static const char *const reals[] = {"--lr", "--lr-min", "--clip"};
  static const char *const counts[] = {"--warmup", "--decay-steps", "--eval-every", "--eval-steps",
                                       "--save-every", "--keep", "--print-every"};
  static const char *const paths[] = {"--data", "--val-data", "--log"};
  const char *a = argv[*i], *v;
  for (int k = 0; k < 3; k++)
    if (is_opt(a, reals[k])) {
      if (!(v = opt_value(argc, argv, i, reals[k]))) return -1;
      double *x[] = {&o->lr, &o->lr_min, &o->clip};
      bool *set[] = {&o->lr_set, &o->lr_min_set, &o->clip_set};
      if (!opt_real(reals[k], v, 0, k == 0, x[k])) return -1;
      *set[k] = true;
      return 1;
    }
  for (int k = 0; k < 7; k++)
    if (is_opt(a, counts[k])) {
      if (!(v = opt_value(argc, argv, i, counts[k]))) return -1;
      int64_t *x[] = {&o->warmup, &o->decay_steps, &o->eval_every, &o->eval_steps, &o->save_every, &o->keep, &o->print_every};
      if (!opt_count(counts[k], v, k < 2 ? 0 : 1, x[k])) return -1;
      if (k == 0) o->warmup_set = true;
      if (k == 1) o->decay_set = true;
      return 1;
    }
  for (int k = 0; k < 3; k++)
    if (is_opt(a, paths[k])) {
      if (!(v = opt_value(argc, argv, i, paths[k]))) return -1;
      const char **x[] = {&o->data, &o->val_data, &o->log};
      *x[k] = v;
      return 1;
    }
  if (is_opt(a, "--lr-schedule")) {
    if (!(v = opt_value(argc, argv, i, "--lr-schedule"))) return -1;
    if (strcmp(v, "constant") && strcmp(v, "cosine") && strcmp(v, "linear")) {
      fprintf(stderr, "weft: error: --lr-schedule needs constant, cosine or linear\n");
      return -1;
    }
    o->lr_schedule = v;
    return 1;
  }
  if (is_opt(a, "--data-dtype")) {
    if (!(v = opt_value(argc, argv, i, "--data-dtype"))) return -1;
    if (strcmp(v, "uint16") && strcmp(v, "uint32")) {
      fprintf(stderr, "weft: error: --data-dtype needs uint16 or uint32\n");
      return -1;
    }
    o->data_bytes = v[4] == '1' ? 2 : 4;
    return 1;
  }
  if (strcmp(a, "--progress") == 0) {
    o->progress = 1;
    return 1;
  }
  if (is_opt(a, "--trace-step")) {
    if (!(v = opt_value(argc, argv, i, "--trace-step"))) return -1;
    return opt_count("--trace-step", v, 1, &o->trace_step) ? 1 : -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  /* Blocks of up to 32 MiB (the arenas' are 16) come from the heap, and
   * what is freed stays there for the next phase: every page a phase frees
   * and the next one faults in again costs microseconds (0.1 s in 125,000
   * faults of an estimate of GPT-3 on 1024 devices). */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  backend_startup();
  size_t budget = arena_default_budget();
  const char *env_budget = getenv("WEFT_MAX_MEMORY");
  if (env_budget && *env_budget && !parse_bytes(env_budget, &budget)) {
    fprintf(stderr, "weft: error: WEFT_MAX_MEMORY needs bytes of at least 1 MiB, such as '4 GiB', got '%s'\n", env_budget);
    return WEFT_FAILED;
  }
  arena_budget_set(budget);
  if (argc < 2) {
    usage_main(stderr);
    return WEFT_FAILED;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) { usage_main(stdout); return 0; }
  bool asks_help = argc == 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0);
  if (strcmp(name, "version") == 0 && asks_help) {
    printf("usage: weft version (or weft --version)\n\nPrints weft's version: weft %s\n", WEFT_VERSION);
    return 0;
  }
  if (strcmp(name, "--version") == 0 || strcmp(name, "version") == 0) {
    if (argc > 2) {
      fprintf(stderr, "weft version: takes no arguments, got '%s'\n", argv[2]);
      return WEFT_FAILED;
    }
    printf("weft %s\n", WEFT_VERSION);
    return 0;
  }
  if (strcmp(name, "help") == 0) {
    if (argc > 3) {
      fprintf(stderr, "weft help: takes one command, got '%s' after '%s'\n", argv[3], argv[2]);
      return WEFT_FAILED;
    }
    if (argc < 3) { usage_main(stdout); return 0; }
    if (strcmp(argv[2], "help") == 0 || asks_help) {
      printf("usage: weft help [COMMAND]\n\nPrints the list of commands, or the usage and options of COMMAND\n"
             "(also: weft COMMAND --help).\n");
      return 0;
    }
    if (strcmp(argv[2], "version") == 0) {
      printf("usage: weft version (or weft --version)\n\nPrints weft's version: weft %s\n", WEFT_VERSION);
      return 0;
    }
    const command *cmd = find_command(argv[2]);
    if (!cmd) return unknown_command(argv[2]);
    help_command(cmd, stdout);
    return 0;
  }
  const command *cmd = find_command(name);
  if (!cmd) return unknown_command(name);
  weft_opts o = {0};
  o.color = -1;
  o.max_errors = 50;
  o.device = -1;
  o.steps = 1;
  o.pick = -1;
  o.progress = -1;
  o.files = calloc((size_t)argc, sizeof(char *));
  o.sets = calloc((size_t)argc, sizeof(char *));
  o.heuristics = calloc((size_t)argc, sizeof(char *));
  o.allow_paths = calloc((size_t)argc, sizeof(char *));
  if (!o.files || !o.sets || !o.heuristics || !o.allow_paths) weft_oom();
  int rc = WEFT_FAILED;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    const char *v;
    int r;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { help_command(cmd, stdout); rc = 0; goto done; }
    else if (strcmp(a, "--json") == 0 && cmd->run != report_explain && cmd->run != report_fmt) o.json = true;
    else if (strcmp(a, "--dot") == 0 && cmd->run == report_graph) o.dot = true;
    else if ((strcmp(a, "-w") == 0 || strcmp(a, "--write") == 0) && cmd->run == report_fmt) o.write = true;
    else if (strcmp(a, "--check") == 0 && cmd->run == report_fmt) o.check = true;
    else if (strcmp(a, "--roundtrip") == 0 && cmd->run == report_fmt) o.roundtrip = true;
    else if (is_opt(a, "--set")) { if (!(v = opt_value(argc, argv, &i, "--set"))) goto done; o.sets[o.nsets++] = v; }
    else if (is_opt(a, "--model") && (cmd->run == report_graph || cmd->run == report_search)) { if (!(v = opt_value(argc, argv, &i, "--model"))) goto done; o.model = v; }
    else if (strcmp(a, "--grid") == 0 && cmd->run == report_lower) o.grid = true;
    else if (is_opt(a, "--device") && cmd->run == report_lower) {
      if (!(v = opt_value(argc, argv, &i, "--device"))) goto done;
      char *end;
      long n = strtol(v, &end, 10);
      if (*end || !*v || n < 0 || n > 1000000) { fprintf(stderr, "weft: error: --device needs a device number\n"); goto done; }
      o.device = (int)n;
    }
    else if (is_opt(a, "--trace") && (cmd->run == report_estimate || cmd->run == report_run)) { if (!(v = opt_value(argc, argv, &i, "--trace"))) goto done; o.trace = v; }
    else if (is_opt(a, "--svg") && cmd->run == report_estimate) { if (!(v = opt_value(argc, argv, &i, "--svg"))) goto done; o.svg = v; }
    else if (is_opt(a, "--devices") && cmd->run == report_estimate) { if (!(v = opt_value(argc, argv, &i, "--devices"))) goto done; o.devices = v; }
    else if (is_opt(a, "--cost") && (cmd->run == report_estimate || cmd->run == report_search)) {
      if (!(v = opt_value(argc, argv, &i, "--cost"))) goto done;
      if (strcmp(v, "symbolic") == 0) o.symbolic = true;
      else if (strcmp(v, "roofline") == 0 || strcmp(v, "model") == 0) o.symbolic = false;
      else { fprintf(stderr, "weft: error: --cost needs roofline (or model) or symbolic\n"); goto done; }
    }
    else if (cmd->run == report_search && (is_opt(a, "--top") || is_opt(a, "--pick"))) {
      bool top = is_opt(a, "--top");
      if (!(v = opt_value(argc, argv, &i, top ? "--top" : "--pick"))) goto done;
      char *end;
      long n = strtol(v, &end, 10);
      if (*end || !*v || n < (top ? 1 : 0) || n > 100000) {
        fprintf(stderr, "weft: error: %s needs a %s number\n", top ? "--top" : "--pick", top ? "positive" : "non-negative");
        goto done;
      }
      if (top) o.top = (int)n;
      else o.pick = (int)n;
    }
    else if (cmd->run == report_search && is_opt(a, "--time-limit")) {
      if (!(v = opt_value(argc, argv, &i, "--time-limit"))) goto done;
      char *end;
      double t = strtod(v, &end);
      if (*end || !*v || !(t > 0) || t > 1e6) { fprintf(stderr, "weft: error: --time-limit needs seconds\n"); goto done; }
      o.time_limit = t;
    }
    else if (cmd->run == report_search && is_opt(a, "--objective")) {
      if (!(v = opt_value(argc, argv, &i, "--objective"))) goto done;
      if (strcmp(v, "time") == 0) o.objective = SEARCH_TIME;
      else if (strcmp(v, "memory") == 0) o.objective = SEARCH_MEMORY;
      else { fprintf(stderr, "weft: error: --objective needs time or memory\n"); goto done; }
    }
    else if (cmd->run == report_search && is_opt(a, "--cluster")) { if (!(v = opt_value(argc, argv, &i, "--cluster"))) goto done; o.cluster = v; }
    else if (cmd->run == report_search && is_opt(a, "--max-memory")) { if (!(v = opt_value(argc, argv, &i, "--max-memory"))) goto done; o.max_memory = v; }
    else if (cmd->run == report_search && strcmp(a, "-o") == 0) { if (!(v = opt_value(argc, argv, &i, "-o"))) goto done; o.output = v; }
    else if (cmd->run == report_search && strcmp(a, "--progress") == 0) o.progress = 1;
    else if (cmd->run == report_search && strcmp(a, "--no-buckets") == 0) o.no_buckets = true;
    else if (cmd->run == report_search && is_opt(a, "--heuristic")) { if (!(v = opt_value(argc, argv, &i, "--heuristic"))) goto done; o.heuristics[o.nheuristics++] = v; }
    else if (cmd->run == report_search && is_opt(a, "--lua-memory")) { if (!(v = opt_value(argc, argv, &i, "--lua-memory"))) goto done; o.lua_memory = v; }
    else if (cmd->run == report_search && is_opt(a, "--lua-steps")) {
      if (!(v = opt_value(argc, argv, &i, "--lua-steps"))) goto done;
      char *end;
      errno = 0;
      long long n = strtoll(v, &end, 10);
      if (*end || !*v || errno || n < 1 || n > 1000000000000000LL) {
        fprintf(stderr, "weft: error: --lua-steps needs a number of instructions (1 to 10^15)\n");
        goto done;
      }
      o.lua_steps = n;
    }
    else if (cmd->run == report_run && (is_opt(a, "--steps") || is_opt(a, "--seed"))) {
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
    else if (cmd->run == report_run && is_opt(a, "--load")) { if (!(v = opt_value(argc, argv, &i, "--load"))) goto done; o.load = v; }
    else if (cmd->run == report_run && is_opt(a, "--inputs")) { if (!(v = opt_value(argc, argv, &i, "--inputs"))) goto done; o.inputs = v; }
    else if (cmd->run == report_run && is_opt(a, "--save")) { if (!(v = opt_value(argc, argv, &i, "--save"))) goto done; o.save = v; }
    else if (cmd->run == report_run && is_opt(a, "--resume")) { if (!(v = opt_value(argc, argv, &i, "--resume"))) goto done; o.resume = v; }
    else if (cmd->run == report_run && (r = run_option(argc, argv, &i, &o)) != 0) { if (r < 0) goto done; }
    else if (cmd->run == report_run && strcmp(a, "--check") == 0) o.run_check = true;
    else if (cmd->run == report_run && strcmp(a, "--allow-native") == 0) o.allow_native = true;
    else if (cmd->run == report_run && strcmp(a, "--deterministic") == 0) o.deterministic = true;
    else if (cmd->run == report_backends && strcmp(a, "--kernels") == 0) o.kernels = true;
    else if (cmd->run == report_run && strcmp(a, "--allow-nonfinite") == 0) o.allow_nonfinite = true;
    else if (cmd->run == report_run && is_opt(a, "--rendezvous")) { if (!(v = opt_value(argc, argv, &i, "--rendezvous"))) goto done; o.rendezvous = v; }
    else if (cmd->run == report_run && is_opt(a, "--timeout")) {
      if (!(v = opt_value(argc, argv, &i, "--timeout"))) goto done;
      char *end;
      double t = strtod(v, &end);
      if (*end || !*v || !(t > 0) || t > 1e7) { fprintf(stderr, "weft: error: --timeout needs seconds (above 0)\n"); goto done; }
      o.timeout = t;
    }
    else if (cmd->run == report_run && is_opt(a, "--backend")) {
      if (!(v = opt_value(argc, argv, &i, "--backend"))) goto done;
      char err[512];
      if (!(o.backend = backend_find(v, err, sizeof err))) {
        fprintf(stderr, "weft run: %s\n", err);
        goto done;
      }
    }
    else if (is_opt(a, "--plan") && (cmd->run == report_explain || cmd->run == report_lower || cmd->run == report_estimate || cmd->run == report_run || cmd->run == report_search)) { if (!(v = opt_value(argc, argv, &i, "--plan"))) goto done; o.plan = v; }
    else if (is_opt(a, "--stdlib")) { if (!(v = opt_value(argc, argv, &i, "--stdlib"))) goto done; o.stdlib_dir = v; }
    else if (is_opt(a, "--max-memory")) {
      if (!(v = opt_value(argc, argv, &i, "--max-memory"))) goto done;
      if (!parse_bytes(v, &budget)) {
        fprintf(stderr, "weft: error: --max-memory needs bytes of at least 1 MiB, such as '4 GiB', got '%s'\n", v);
        goto done;
      }
      arena_budget_set(budget);
    }
    else if (is_opt(a, "--allow-path")) { if (!(v = opt_value(argc, argv, &i, "--allow-path"))) goto done; o.allow_paths[o.nallow_paths++] = v; }
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
  if (o.grid && o.json) { fprintf(stderr, "weft lower: --grid and --json exclude each other\n"); goto done; }
  if (o.load && o.resume) {
    fprintf(stderr, "weft run: --load and --resume exclude each other (a checkpoint holds the parameters)\n");
    goto done;
  }
  if (o.save_every && !o.save) {
    fprintf(stderr, "weft run: --save-every needs --save FILE (its checkpoints are named after FILE)\n");
    goto done;
  }
  if (o.keep && !o.save_every) {
    fprintf(stderr, "weft run: --keep needs --save-every\n");
    goto done;
  }
  if ((o.eval_every || o.eval_steps) && !o.val_data) {
    fprintf(stderr, "weft run: --eval-every and --eval-steps need --val-data\n");
    goto done;
  }
  if (o.data && o.inputs) {
    fprintf(stderr, "weft run: --data and --inputs exclude each other (both give the batches)\n");
    goto done;
  }
  if (o.nfiles < cmd->min_files || (cmd->max_files >= 0 && o.nfiles > cmd->max_files)) {
    fprintf(stderr, "weft %s: %s\n%s", cmd->name, cmd->what_files, cmd->usage);
    goto done;
  }
  rc = cmd->run(&o);
done:
  free(o.files);
  free(o.sets);
  free(o.heuristics);
  free(o.allow_paths);
  return rc;
}
