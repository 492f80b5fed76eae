/* estimate_print.c - what `weft estimate` prints: a short table, one JSON
 * object, a Chrome trace (chrome://tracing, Perfetto) and an SVG picture of
 * the schedule, devices against time. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "weft/sim.h"
#include "weft/units.h"
#include "weft/workspace.h"

static const char *human(double v, const char *unit, char *buf, size_t n) {
  static const char *const pre[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (fabs(v) >= 1000 && i < 6) { v /= 1000; i++; }
  snprintf(buf, n, "%.3g %s%s", v, pre[i], unit);
  return buf;
}

static const char *seconds(double s, char *buf, size_t n) {
  if (s == 0) snprintf(buf, n, "0");
  else if (s >= 1) snprintf(buf, n, "%.3f s", s);
  else if (s >= 1e-3) snprintf(buf, n, "%.3f ms", s * 1e3);
  else snprintf(buf, n, "%.3f us", s * 1e6);
  return buf;
}

static const char *hbytes(double b, char *buf, size_t n) { return unit_bytes_human((int64_t)b, buf, n); }

static int nstages_of(const weft_program *pr) { return pr->nstages; }

/* The simulated device with the highest peak (e->peak_device), or NULL. */
static const sim_dev *peak_dev(const weft_sim *s, const weft_estimate *e) {
  if (e->peak_device < 0 || e->peak_device >= s->pr->nprogs || s->index[e->peak_device] < 0) return NULL;
  return &s->dev[s->index[e->peak_device]];
}

/* ---- text ------------------------------------------------------------------ */

void estimate_print_text(const weft_sim *s, const weft_estimate *e, FILE *out) {
  const weft_program *pr = s->pr;
  const weft_plan *p = pr->p;
  char b1[64], b2[64], b3[64];
  int ns = nstages_of(pr);
  fprintf(out, "plan %s: model %s on %d of %d devices, schedule %s, %d stage%s, %d micro-batch%s\n", p->name,
          p->g->name, s->devices_used, pr->nprogs, sched_kind_names[p->sched], ns, ns == 1 ? "" : "s", pr->nmb,
          pr->nmb == 1 ? "" : "es");
  if (e->symbolic) {
    fprintf(out, "  cost model: symbolic (FLOPs and bytes; no hardware figures)\n");
    if (e->symbolic_step >= 0)
      fprintf(out, "  symbolic step     %s on the nominal machine (1 PFLOP/s, 2 TB/s, links of 100 and 10 GB/s), bubble %.1f%%\n",
              seconds(e->symbolic_step, b1, sizeof b1), 100 * e->symbolic_bubble);
    fprintf(out, "  model FLOPs       %s per step (forward and backward), %s as run\n", human(e->model_flops, "FLOP", b1, sizeof b1),
            human(e->hw_flops, "FLOP", b2, sizeof b2));
  } else {
    const hw_model *hw = s->hw;
    fprintf(out, "  cluster           %s: %s, %d per node\n", hw->cluster, hw->device, hw->devices_per_node);
    fprintf(out, "  step time         %s\n", seconds(e->step_time, b1, sizeof b1));
    fprintf(out, "  throughput        %s tokens/s\n", human(e->step_time > 0 ? e->tokens / e->step_time : 0, "", b1, sizeof b1));
    fprintf(out, "  model FLOPs       %s per step (forward and backward), %s as run\n", human(e->model_flops, "FLOP", b1, sizeof b1),
            human(e->hw_flops, "FLOP", b2, sizeof b2));
    fprintf(out, "  per device        %s of model FLOPs, MFU %.1f%% of %s\n", human(e->tflops_per_device * 1e12, "FLOP/s", b2, sizeof b2),
            100 * e->mfu, human(e->peak_rate, "FLOP/s", b1, sizeof b1));
    fprintf(out, "  pipeline bubble   %.1f%%\n", 100 * e->bubble_fraction);
  }
  fprintf(out, "  peak memory       %s on device %d of %s: %s\n", hbytes((double)e->peak_max, b1, sizeof b1), e->peak_device,
          e->device_memory > 0 ? hbytes((double)e->device_memory, b2, sizeof b2) : "unknown",
          e->fits ? "fits" : "DOES NOT FIT");
  const sim_dev *pd = peak_dev(s, e);
  if (!e->fits && pd) {
    /* what does not fit, where */
    char where[600];
    sim_peak_where(s, pd, where, sizeof where);
    fprintf(out, "  over memory       device %d by %s, %d of %d devices over%s%s\n", pd->device,
            hbytes((double)(e->peak_max - e->device_memory), b1, sizeof b1), e->over_devices, s->devices_used,
            where[0] ? "; its peak at " : "", where);
  }
  if (pd) {
    char roles[600];
    fprintf(out, "  at the peak       %s\n", sim_roles_text(pd->peak_by_role, roles, sizeof roles));
  }
  fprintf(out, "  communication     %s inside nodes, %s across nodes per step", hbytes(e->comm_level[0], b1, sizeof b1),
          hbytes(e->comm_level[1], b2, sizeof b2));
  bool any = false;
  for (int k = 0; k < COMM_KIND_COUNT; k++)
    if (e->comm_kind[k] > 0) {
      fprintf(out, "%s%s %s", any ? ", " : " (", comm_kind_names[k], hbytes(e->comm_kind[k], b3, sizeof b3));
      any = true;
    }
  fprintf(out, "%s\n", any ? ")" : "");
  /* one row per simulated device, or the first and last few; the device
   * column as wide as its widest label ("16 x192") */
  int w = 6;
  for (int k = 0; k < s->ndev; k++) {
    char dev[32];
    int n = s->dev[k].weight > 1 ? snprintf(dev, sizeof dev, "%d x%d", s->dev[k].device, s->dev[k].weight)
                                 : snprintf(dev, sizeof dev, "%d", s->dev[k].device);
    if (n > w) w = n;
  }
  if (e->symbolic)
    fprintf(out, "\n  %*s %12s %12s %12s %12s %10s\n", w, "device", "FLOPs", "mem traffic", "sent (node)", "sent (net)", "peak");
  else
    fprintf(out, "\n  %*s %10s %10s %10s %10s %10s %10s\n", w, "device", "compute", "coll", "p2p", "grads", "bubble", "peak");
  for (int k = 0; k < s->ndev; k++) {
    if (s->ndev > 12 && k == 6) fprintf(out, "  %*s (%d more; --json lists every device)\n", w, "...", s->ndev - 12);
    if (s->ndev > 12 && k >= 6 && k < s->ndev - 6) continue;
    const sim_dev *D = &s->dev[k];
    char c[6][32], dev[32];
    if (D->weight > 1) snprintf(dev, sizeof dev, "%d x%d", D->device, D->weight);
    else snprintf(dev, sizeof dev, "%d", D->device);
    if (e->symbolic) {
      fprintf(out, "  %*s %12s %12s %12s %12s %10s\n", w, dev, human(D->flops, "", c[0], 32), hbytes(D->bytes, c[1], 32),
              hbytes(D->sent[0], c[2], 32), hbytes(D->sent[1], c[3], 32), hbytes((double)D->peak, c[4], 32));
    } else {
      fprintf(out, "  %*s %10s %10s %10s %10s %10s %10s\n", w, dev, seconds(D->busy[SS_COMPUTE], c[0], 32),
              seconds(D->busy[SS_COLL], c[1], 32), seconds(D->busy[SS_SEND] + D->busy[SS_RECV], c[2], 32),
              seconds(D->busy[SS_GRAD], c[3], 32), seconds(D->wait_pipeline, c[4], 32), hbytes((double)D->peak, c[5], 32));
    }
  }
  /* what each device holds at its peak, by role */
  static const char *const heads[LB_ROLE_COUNT] = {
    [LB_PARAM] = "params", [LB_MASTER] = "master", [LB_GRAD] = "grads", [LB_STATE] = "opt state",
    [LB_ACT] = "acts", [LB_ACT_GRAD] = "act grads", [LB_COMM] = "comm", [LB_INPUT] = "inputs"};
  fprintf(out, "\n  %*s", w, "memory");
  for (int i = 0; i < LB_ROLE_COUNT; i++) fprintf(out, " %10s", heads[lbuf_role_order[i]]);
  fprintf(out, "\n");
  for (int k = 0; k < s->ndev; k++) {
    if (s->ndev > 12 && k == 6) fprintf(out, "  %*s\n", w, "...");
    if (s->ndev > 12 && k >= 6 && k < s->ndev - 6) continue;
    const sim_dev *D = &s->dev[k];
    char c[32], dev[32];
    if (D->weight > 1) snprintf(dev, sizeof dev, "%d x%d", D->device, D->weight);
    else snprintf(dev, sizeof dev, "%d", D->device);
    fprintf(out, "  %*s", w, dev);
    for (int i = 0; i < LB_ROLE_COUNT; i++) fprintf(out, " %10s", hbytes((double)D->peak_by_role[lbuf_role_order[i]], c, 32));
    fprintf(out, "\n");
  }
}

/* Bytes live at a device's peak, by role, as a JSON object. */
static void json_roles(json *j, const int64_t *by_role) {
  json_obj(j);
  for (int i = 0; i < LB_ROLE_COUNT; i++) {
    int r = lbuf_role_order[i];
    json_key(j, lbuf_role_names[r]);
    json_int(j, by_role[r]);
  }
  json_end_obj(j);
}

/* ---- JSON ------------------------------------------------------------------ */

void estimate_print_json(const weft_sim *s, const weft_estimate *e, FILE *out) {
  const weft_program *pr = s->pr;
  const weft_plan *p = pr->p;
  json j;
  json_init(&j, out);
  json_obj(&j);
  json_key(&j, "plan"); json_str(&j, p->name);
  json_key(&j, "model"); json_str(&j, p->g->name);
  json_key(&j, "cost"); json_str(&j, e->symbolic ? "symbolic" : "roofline");
  json_key(&j, "devices"); json_int(&j, pr->nprogs);
  json_key(&j, "devices_used"); json_int(&j, s->devices_used);
  json_key(&j, "devices_simulated"); json_int(&j, s->ndev);
  json_key(&j, "schedule"); json_str(&j, sched_kind_names[p->sched]);
  json_key(&j, "stages"); json_int(&j, pr->nstages);
  json_key(&j, "micro_batches"); json_int(&j, pr->nmb);
  json_key(&j, "tokens_per_step"); json_num(&j, e->tokens);
  json_key(&j, "model_flops_per_step"); json_num(&j, e->model_flops);
  json_key(&j, "hardware_flops_per_step"); json_num(&j, e->hw_flops);
  if (e->symbolic_step >= 0) {
    json_key(&j, "symbolic_step_s"); json_num(&j, e->symbolic_step);
    json_key(&j, "symbolic_bubble_fraction"); json_num(&j, e->symbolic_bubble);
  }
  if (!e->symbolic) {
    json_key(&j, "cluster"); json_str(&j, s->hw->cluster);
    json_key(&j, "step_time_s"); json_num(&j, e->step_time);
    json_key(&j, "tokens_per_s"); json_num(&j, e->step_time > 0 ? e->tokens / e->step_time : 0);
    json_key(&j, "tflops_per_device"); json_num(&j, e->tflops_per_device);
    json_key(&j, "peak_flops_per_device"); json_num(&j, e->peak_rate);
    json_key(&j, "mfu"); json_num(&j, e->mfu);
    json_key(&j, "bubble_fraction"); json_num(&j, e->bubble_fraction);
  }
  const sim_dev *pd = peak_dev(s, e);
  json_key(&j, "peak_memory_bytes");
  json_obj(&j);
  json_key(&j, "max"); json_int(&j, e->peak_max);
  json_key(&j, "device"); json_int(&j, e->peak_device);
  if (pd) { json_key(&j, "by_role"); json_roles(&j, pd->peak_by_role); }
  json_key(&j, "per_device");
  json_arr(&j);
  for (int d = 0; d < pr->nprogs; d++) json_int(&j, s->index[d] >= 0 ? s->dev[s->index[d]].peak : 0);
  json_end_arr(&j);
  json_end_obj(&j);
  json_key(&j, "device_memory_bytes"); json_int(&j, e->device_memory);
  json_key(&j, "fits"); json_bool(&j, e->fits);
  /* null when it fits; else the device with the highest peak, and where */
  json_key(&j, "over_memory");
  if (e->fits || !pd) json_null(&j);
  else {
    json_obj(&j);
    json_key(&j, "device"); json_int(&j, pd->device);
    json_key(&j, "excess_bytes"); json_int(&j, e->peak_max - e->device_memory);
    json_key(&j, "devices"); json_int(&j, e->over_devices);
    json_key(&j, "instruction"); json_int(&j, pd->peak_at);
    if (!e->symbolic) { json_key(&j, "time_s"); json_num(&j, pd->peak_t); }
    json_key(&j, "by_role"); json_roles(&j, pd->peak_by_role);
    json_end_obj(&j);
  }
  json_key(&j, "comm_bytes");
  json_obj(&j);
  json_key(&j, "by_kind");
  json_obj(&j);
  for (int k = 0; k < COMM_KIND_COUNT; k++)
    if (k != COMM_NONE && k != COMM_SLICE) { json_key(&j, comm_kind_names[k]); json_num(&j, e->comm_kind[k]); }
  json_end_obj(&j);
  json_key(&j, "by_level");
  json_obj(&j);
  json_key(&j, "node"); json_num(&j, e->comm_level[0]);
  json_key(&j, "cluster"); json_num(&j, e->comm_level[1]);
  json_end_obj(&j);
  json_end_obj(&j);
  json_key(&j, "per_device");
  json_arr(&j);
  for (int k = 0; k < s->ndev; k++) {
    const sim_dev *D = &s->dev[k];
    json_obj(&j);
    json_key(&j, "device"); json_int(&j, D->device);
    json_key(&j, "stands_for"); json_int(&j, D->weight);
    json_key(&j, "flops"); json_num(&j, D->flops);
    json_key(&j, "memory_traffic_bytes"); json_num(&j, D->bytes);
    json_key(&j, "sent_bytes");
    json_obj(&j);
    json_key(&j, "node"); json_num(&j, D->sent[0]);
    json_key(&j, "cluster"); json_num(&j, D->sent[1]);
    json_end_obj(&j);
    if (!e->symbolic) {
      json_key(&j, "busy_s");
      json_obj(&j);
      for (int st = 0; st < SS_COUNT; st++) { json_key(&j, sim_stream_names[st]); json_num(&j, D->busy[st]); }
      json_end_obj(&j);
      json_key(&j, "idle_s"); json_num(&j, e->step_time - D->busy[SS_COMPUTE]);
      json_key(&j, "bubble_s"); json_num(&j, D->wait_pipeline);
      json_key(&j, "comm_wait_s"); json_num(&j, D->wait_comm);
      json_key(&j, "peak_time_s"); json_num(&j, D->peak_t);
    }
    json_key(&j, "peak_memory_bytes"); json_int(&j, D->peak);
    json_key(&j, "peak_by_role"); json_roles(&j, D->peak_by_role);
    json_end_obj(&j);
  }
  json_end_arr(&j);
  json_end_obj(&j);
  fputc('\n', out);
}

/* ---- what an instruction is, for pictures --------------------------------- */


/* ---- rows -------------------------------------------------------------------- */

int sim_rows(const weft_sim *s, const int *want, int n, sim_row *out) {
  int m = 0;
  if (want) {
    for (int i = 0; i < n; i++) {
      int d = want[i];
      if (d < 0 || d >= s->pr->nprogs || s->index[d] < 0) continue;
      out[m++] = (sim_row){d, s->index[d]};
    }
    return m;
  }
  int every = s->ndev > SIM_ROWS_DEFAULT ? (s->ndev + SIM_ROWS_DEFAULT - 1) / SIM_ROWS_DEFAULT : 1;
  for (int k = 0; k < s->ndev; k += every) out[m++] = (sim_row){s->dev[k].device, k};
  return m;
}

/* ---- Chrome trace ---------------------------------------------------------- */

void estimate_print_trace(const weft_sim *s, const sim_row *rows, int nrows, FILE *out) {
  const weft_program *pr = s->pr;
  fprintf(out, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
  bool first = true;
#define SEP() do { if (!first) fputs(",\n", out); first = false; } while (0)
  for (int r = 0; r < nrows; r++) {
    const sim_dev *D = &s->dev[rows[r].sim];
    int dv = rows[r].device;
    SEP();
    fprintf(out, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"device %d", dv, dv);
    if (dv != D->device) fprintf(out, " (device %d's timeline, renamed)", D->device);
    else if (D->weight > 1) fprintf(out, " (and %d device%s it stands for)", D->weight - 1, D->weight > 2 ? "s" : "");
    fprintf(out, "\"}}");
    SEP();
    fprintf(out, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}", dv, dv);
    for (int st = 0; st < SS_COUNT; st++) {
      SEP();
      fprintf(out, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}", dv, st,
              sim_stream_names[st]);
    }
    const lprog *pg = lower_prog(pr, D->device);
    for (int i = 0; i < D->n; i++) {
      if (D->stream[i] < 0) continue;
      lins view = lower_view(pr, pg, i);
      const lins *in = &view;
      int cat = lower_category(pr, in);
      if (cat < 0) continue;
      double dur = D->end[i] - D->start[i];
      if (dur <= 0 && in->kind == LI_COLLECTIVE) continue;   /* a group of one */
      SEP();
      fputc('{', out);
      lower_print_event(pr, in, NULL, out);
      fprintf(out, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.4f,\"dur\":%.4f}", dv, D->stream[i],
              D->start[i] * 1e6, dur * 1e6);
    }
    for (int i = 0; i < D->nmem; i++) {
      SEP();
      fprintf(out, "{\"name\":\"memory\",\"ph\":\"C\",\"pid\":%d,\"ts\":%.4f,\"args\":{\"bytes\":%" PRId64 "}}", dv,
              D->mem[i].t * 1e6, D->mem[i].live);
    }
  }
#undef SEP
  fprintf(out, "\n]}\n");
}

/* ---- SVG ------------------------------------------------------------------- */

typedef struct svg_block {
  int cat, mb;
  double a, b;            /* pixels */
} svg_block;

static void svg_flush(FILE *out, const svg_block *bl, double y, double h, bool label, double font) {
  if (bl->cat < 0) return;
  double w = bl->b - bl->a;
  if (w < 0.3) w = 0.3;
  fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#%06x\"/>\n", bl->a, y, w, h,
          (unsigned)lower_category_rgb[bl->cat]);
  if (label && bl->mb >= 0) {
    int digits = bl->mb >= 100 ? 3 : bl->mb >= 10 ? 2 : 1;
    if (w >= digits * font * 0.62 + 2)
      fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.1f\" text-anchor=\"middle\" fill=\"#fff\">%d</text>\n",
              bl->a + w / 2, y + h / 2 + font * 0.35, font, bl->mb);
  }
}

void estimate_print_svg(const weft_sim *s, const sim_row *sel, int nsel, FILE *out) {
  const weft_program *pr = s->pr;
  const weft_plan *p = pr->p;
  int rows = nsel;
  const double W = 1400, left = 90, right = 20, top = 58, plotw = W - left - right;
  double rh = rows > 0 ? 900.0 / rows : 20;
  if (rh > 30) rh = 30;
  if (rh < 6) rh = 6;
  double H = top + rows * rh + 50;
  double T = s->step_time > 0 ? s->step_time : 1;
  double sx = plotw / T;
  double font = rh * 0.55 < 11 ? rh * 0.55 : 11;
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n", W, H, W, H);
  fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
  char b1[64];
  fprintf(out, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">plan ", left);
  for (const char *c = p->name; *c; c++) {
    if (*c == '<') fputs("&lt;", out);
    else if (*c == '&') fputs("&amp;", out);
    else fputc(*c, out);
  }
  int used = s->devices_used;
  bool stands = false;
  for (int k = 0; k < rows; k++) stands |= sel[k].device == s->dev[sel[k].sim].device && s->dev[sel[k].sim].weight > 1;
  fprintf(out, ": %d of %d device%s shown%s, %d micro-batch%s, step %s</text>\n", rows, used, used == 1 ? "" : "s",
          stands ? " (* stands for others: its replicas and peers run its timeline renamed)" : "", pr->nmb,
          pr->nmb == 1 ? "" : "es", seconds(s->step_time, b1, sizeof b1));
  /* legend */
  double lx = left;
  for (int c = 0; c < LCAT_COUNT; c++) {
    fprintf(out, "<rect x=\"%.0f\" y=\"28\" width=\"12\" height=\"12\" fill=\"#%06x\"/>", lx, (unsigned)lower_category_rgb[c]);
    fprintf(out, "<text x=\"%.0f\" y=\"38\" font-size=\"11\">%s</text>\n", lx + 16, lower_category_names[c]);
    lx += 16 + 7.0 * (double)strlen(lower_category_names[c]) + 18;
  }
  for (int k = 0; k < rows; k++) {
    const sim_dev *D = &s->dev[sel[k].sim];
    double y = top + k * rh;
    double ch = rh * 0.62, cy = y + rh * 0.05, gy = cy + ch + rh * 0.03, gh = rh * 0.25;
    if (k % 2) fprintf(out, "<rect x=\"%.0f\" y=\"%.2f\" width=\"%.0f\" height=\"%.2f\" fill=\"#f3f3f3\"/>\n", left, y, plotw, rh);
    if (rh >= 8 || k % 4 == 0)
      fprintf(out, "<text x=\"%.0f\" y=\"%.2f\" font-size=\"%.1f\" text-anchor=\"end\">dev %d%s</text>\n", left - 6,
              y + rh / 2 + font * 0.35, font < 9 ? 9 : font, sel[k].device,
              sel[k].device == D->device && D->weight > 1 ? "*" : "");
    const lprog *pg = lower_prog(pr, D->device);
    /* compute lane: runs of one kind and micro-batch merge into a block */
    svg_block cur = {-1, -1, 0, 0};
    svg_block lane[3] = {{-1, -1, 0, 0}, {-1, -1, 0, 0}, {-1, -1, 0, 0}};
    for (int i = 0; i < D->n; i++) {
      if (D->stream[i] < 0) continue;
      lins view = lower_view(pr, pg, i);
      const lins *in = &view;
      int cat = lower_category(pr, in);
      if (cat < 0) continue;
      double a = left + D->start[i] * sx, b = left + D->end[i] * sx;
      if (D->stream[i] == SS_COMPUTE) {
        int mb = in->kind == LI_COMPUTE ? in->mb : -1;
        if (cur.cat == cat && cur.mb == mb && a - cur.b < 1.0) { if (b > cur.b) cur.b = b; continue; }
        svg_flush(out, &cur, cy, ch, true, font);
        cur = (svg_block){cat, mb, a, b};
      } else {
        if (b - a <= 0) continue;
        int l = cat == LCAT_COLL ? 0 : cat == LCAT_P2P ? 1 : 2;
        svg_block *c = &lane[l];
        if (c->cat == cat && a - c->b < 1.0) { if (b > c->b) c->b = b; continue; }
        svg_flush(out, c, gy, gh, false, font);
        *c = (svg_block){cat, -1, a, b};
      }
    }
    svg_flush(out, &cur, cy, ch, true, font);
    for (int l = 0; l < 3; l++) svg_flush(out, &lane[l], gy, gh, false, font);
  }
  /* time axis */
  double ay = top + rows * rh + 6;
  fprintf(out, "<line x1=\"%.0f\" y1=\"%.2f\" x2=\"%.0f\" y2=\"%.2f\" stroke=\"#333\"/>\n", left, ay, left + plotw, ay);
  double step = pow(10, floor(log10(T)));
  if (T / step < 4) step /= 2;
  if (T / step < 4) step /= 2.5;
  for (double t = 0; t <= T * 1.0001; t += step) {
    double x = left + t * sx;
    fprintf(out, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#333\"/>", x, ay, x, ay + 5);
    fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", x, ay + 18,
            seconds(t, b1, sizeof b1));
  }
  fprintf(out, "<text x=\"%.0f\" y=\"%.2f\" font-size=\"11\" text-anchor=\"end\">time</text>\n", left + plotw, ay + 34);
  fprintf(out, "</svg>\n");
}
