/* run_trace.c - weft run --trace: the instructions of one step as the
 * backend ran them (backend_trace_fn), written as Chrome trace JSON in the
 * form of weft estimate --trace, so that the two timelines of a plan, the
 * simulated and the measured, open side by side in Perfetto. */
#include "run_trace.h"

typedef struct tspan {
  int device, ins, lane;
  double start, end;
} tspan;

struct run_trace {
  const weft_program *pr;
  tspan *s;
  int n, cap;
  const char *lanes[8];   /* the lanes' names, as the backend gave them */
  int nlanes;
  bool bad;               /* an instruction the program does not have */
};

run_trace *run_trace_new(const weft_program *pr) {
  run_trace *t = calloc(1, sizeof *t);
  if (!t) weft_oom();
  t->pr = pr;
  return t;
}

void run_trace_free(run_trace *t) {
  if (!t) return;
  free(t->s);
  free(t);
}

void run_trace_add(run_trace *t, int device, int ins, const char *lane, double start, double end) {
  const weft_program *pr = t->pr;
  if (device < 0 || device >= pr->nprogs || ins < 0 || ins >= pr->progs[device].n || !pr->progs[device].ins ||
      !(end >= start)) {
    t->bad = true;
    return;
  }
  int l = 0;
  while (l < t->nlanes && strcmp(t->lanes[l], lane ? lane : "") != 0) l++;
  if (l == t->nlanes) {
    if (t->nlanes == (int)(sizeof t->lanes / sizeof t->lanes[0])) l--;
    else t->lanes[t->nlanes++] = lane ? lane : "";
  }
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 256;
    t->s = realloc(t->s, (size_t)t->cap * sizeof(tspan));
    if (!t->s) weft_oom();
  }
  t->s[t->n++] = (tspan){device, ins, l, start, end};
}

int run_trace_count(const run_trace *t) { return t->n; }

static int span_cmp(const void *x, const void *y) {
  const tspan *a = x, *b = y;
  if (a->device != b->device) return a->device < b->device ? -1 : 1;
  if (a->start != b->start) return a->start < b->start ? -1 : 1;
  return a->ins < b->ins ? -1 : a->ins > b->ins;
}

static void print(run_trace *t, const run_trace_about *ab, FILE *out) {
  const weft_program *pr = t->pr;
  qsort(t->s, (size_t)t->n, sizeof(tspan), span_cmp);
  fprintf(out, "{\"displayTimeUnit\":\"ms\",\"otherData\":");
  json j;
  json_init(&j, out);
  json_obj(&j);
  json_key(&j, "command"), json_str(&j, "weft run");
  json_key(&j, "plan"), json_str(&j, ab->plan);
  json_key(&j, "step"), json_int(&j, ab->step);
  json_key(&j, "backend"), json_str(&j, ab->backend);
  json_key(&j, "machine"), json_str(&j, ab->machine ? ab->machine : "");
  json_key(&j, "times"), json_str(&j, ab->times ? ab->times : "");
  json_key(&j, "rank"), json_int(&j, ab->rank);
  json_key(&j, "processes"), json_int(&j, ab->processes > 0 ? ab->processes : 1);
  json_key(&j, "epoch_us"), json_int(&j, ab->epoch_us);
  json_end_obj(&j);
  fprintf(out, ",\"traceEvents\":[\n");
  bool first = true;
#define SEP() do { if (!first) fputs(",\n", out); first = false; } while (0)
  for (int k = 0; k < t->n; k++) {
    const tspan *s = &t->s[k];
    if (k == 0 || t->s[k - 1].device != s->device) {
      SEP();
      fprintf(out, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"device %d\"}}", s->device,
              s->device);
      SEP();
      fprintf(out, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}", s->device,
              s->device);
      for (int l = 0; l < t->nlanes; l++) {
        SEP();
        fprintf(out, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", s->device, l);
        json_init(&j, out);
        json_str(&j, t->lanes[l]);
        fputs("}}", out);
      }
    }
    SEP();
    fputc('{', out);
    char args[32];
    snprintf(args, sizeof args, "\"ins\":%d", s->ins);  /* its index in weft lower --device's program */
    lower_print_event(pr, &pr->progs[s->device].ins[s->ins], args, out);
    fprintf(out, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", s->device, s->lane, s->start * 1e6,
            (s->end - s->start) * 1e6);
  }
#undef SEP
  fprintf(out, "\n]}\n");
}

bool run_trace_write(run_trace *t, const char *path, const run_trace_about *ab, char *err, size_t errlen) {
  if (t->bad) {
    snprintf(err, errlen, "--trace %s: the backend reported an instruction the program does not have", path);
    return false;
  }
  file_out *out = file_out_open(path, err, errlen);
  if (!out) return false;
  print(t, ab, file_out_stream(out));
  return file_out_commit(out, err, errlen);
}

static int ins_cmp(const void *x, const void *y) {
  const tspan *a = x, *b = y;
  if (a->device != b->device) return a->device < b->device ? -1 : 1;
  return a->ins < b->ins ? -1 : a->ins > b->ins;
}

void run_trace_totals(run_trace *t, double *by_cat, double *span, int *instructions) {
  for (int c = 0; c < LCAT_COUNT; c++) by_cat[c] = 0;
  double lo = 0, hi = 0;
  qsort(t->s, (size_t)t->n, sizeof(tspan), ins_cmp);
  *instructions = 0;
  for (int k = 0; k < t->n; k++) {
    const tspan *s = &t->s[k];
    if (k == 0 || ins_cmp(s, s - 1) != 0) ++*instructions;
    int c = lower_category(t->pr, &t->pr->progs[s->device].ins[s->ins]);
    if (c >= 0) by_cat[c] += s->end - s->start;
    if (k == 0 || s->start < lo) lo = s->start;
    if (k == 0 || s->end > hi) hi = s->end;
  }
  *span = hi - lo;
}
