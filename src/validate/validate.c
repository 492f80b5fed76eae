/* validate.c - the validate stage: the rules of a sound plan (DESIGN.md,
 * "Semantics the checker must enforce") that are checked on its lowered
 * programs. Where each rule is checked:
 *
 * 1. coverage: when the plan is applied (src/plan/plan.c), sub-operators
 *    against the iteration space of their operator;
 * 2. placement: there too, each sub-operator on one device that exists;
 * 3. order: here, running all programs together (lower.h, lwalk): a
 *    device waiting at a collective its peers do not enter next, or no
 *    device able to go on; an order that contradicts the data flow, or a
 *    schedule that fits no pipeline, is lowering's;
 * 4. dependencies: while lowering emits each program (src/lower/lower.c),
 *    a task that reads what no earlier instruction provided;
 * 5. memory: here, on the simulated step (sim.h), which is run after
 *    lowering, never by it. */
#include <stdlib.h>
#include <string.h>

#include "base/prof.h"
#include "weft/validate.h"

/* ---- order and deadlock (rule 3) ------------------------------------------ */

static const char *ins_str(arena *s, const weft_plan *p, const lins *in) {
  switch (in->kind) {
  case LI_COMPUTE:
    return arena_printf(s, "%s of %s (micro-batch %d)", in->recompute ? "the recomputation" : in->dir == DIR_FORWARD ? "the forward" : "the backward",
                        p->g->ops[p->subs[in->sub].op].name, in->mb);
  case LI_SEND: case LI_RECV: {
    const pcomm *cm = &p->comms[in->comm];
    bool grad = cm->phase == PHASE_BACKWARD || cm->phase == PHASE_WEIGHTS;
    return arena_printf(s, "the %s %s%s %s %s device %d", in->kind == LI_SEND ? "send of" : "receive of",
                        grad ? "the gradient of " : "", p->g->tensors[cm->tensor].name, tregion_str(s, &cm->region),
                        in->kind == LI_SEND ? "to" : "from", in->peer);
  }
  case LI_COLLECTIVE: {
    const pcomm *cm = &p->comms[in->comm];
    bool grad = cm->phase == PHASE_BACKWARD || cm->phase == PHASE_WEIGHTS;
    return arena_printf(s, "the %s of %s%s %s", comm_kind_names[cm->kind], grad ? "the gradient of " : "",
                        p->g->tensors[cm->tensor].name, tregion_str(s, &cm->region));
  }
  default: return "an instruction";
  }
}

/* The block device d is in at instruction i: the next compute's stage,
 * micro-batch and direction ("b0 of stage s1"); with a grid, its cell. */
static const char *block_at(arena *s, const weft_program *pr, int d, int i, weft_loc *cell) {
  const weft_plan *p = pr->p;
  const lprog *pg = &pr->progs[d];
  for (int k = i; k < pg->n; k++) {
    if (pg->ops[k].kind != LI_COMPUTE) continue;
    lins view = lower_view(pr, pg, k);
    const lins *in = &view;
    int st = lower_stage_of(pr, p->subs[in->sub].op);
    char kind = in->dir == DIR_FORWARD && !in->recompute ? 'f' : 'b';
    if (p->grid)
      for (int r = 0; r < p->grid->list.n; r++) {
        const ast *row = p->grid->list.items[r];
        if (strcmp(row->name, pr->stage_names[st]) != 0) continue;
        for (int q = 0; q < row->list.n; q++) {
          const ast *c = row->list.items[q];
          const char *t = c->name ? c->name : c->text;
          if (t && t[0] == kind && atoi(t + 1) == in->mb && !strchr(t, '.')) *cell = c->loc;
        }
      }
    return arena_printf(s, " (before %c%d of stage %s)", kind, in->mb, pr->stage_names[st]);
  }
  return "";
}

/* Whether device d has a program of its own (else its replica's, renamed). */
static bool represents(const weft_plan *p, int d) { return !p->rep || p->rep[d] == d; }

/* How far device d's program went; a device without a walk of its own
 * (an empty program, a replica) did not go. */
static int walked(const lwalk *w, int d) {
  int k = w->walker[d];
  return k >= 0 && w->device[k] == d ? w->pc[k] : 0;
}

/* Runs every program together, sends never waiting, receives and
 * collectives blocking; false after an error at the first device that
 * cannot reach its end: what it waits at, and what the peer it waits for
 * does instead. */
static bool validate_order(const weft_program *pr, weft_diags *dg) {
  const weft_plan *p = pr->p;
  lwalk w;
  lower_walk_init(&w, pr);
  for (int k; (k = lower_walk_next(&w)) >= 0;) {
    int d = w.device[k];
    const lprog *pg = &pr->progs[d];
    for (; w.pc[k] < pg->n; w.pc[k]++) {
      const lop *in = &pg->ops[w.pc[k]];
      if (in->kind == LI_SEND) {
        lower_walk_post(&w, in->id, in->epoch);
      } else if (in->kind == LI_RECV) {
        if (!lower_walk_posted(&w, in->id, in->epoch)) break;
      } else if (in->kind == LI_COLLECTIVE && w.wc[in->id].bcast) {
        /* the root posts and goes on, as a send; the others wait for it */
        if (d == w.wc[in->id].src) lower_walk_post(&w, in->id, in->epoch);
        else if (!lower_walk_posted(&w, in->id, in->epoch)) break;
      } else if (in->kind == LI_COLLECTIVE) {
        if (!(lower_walk_meet(&w, k, in->id, in->epoch) & LW_ALL)) break;
      }
    }
  }
  bool ok = true;
  arena s;
  arena_init(&s);
  for (int k = 0; k < w.n && ok; k++) {
    int d = w.device[k];
    const lprog *pg = &pr->progs[d];
    if (w.pc[k] >= pg->n) continue;
    ok = false;
    lins here = lower_view(pr, pg, w.pc[k]), there;
    const lins *in = &here;
    /* what the device waits for, and what its peer does instead */
    int peer = -1;
    const lins *other = NULL;
    if (in->kind == LI_RECV) peer = in->peer;
    else if (in->kind == LI_COLLECTIVE) {
      const pcomm *cm = &p->comms[in->comm];
      for (int i = 0; i < cm->ngroup && peer < 0; i++) {
        int m = cm->group[i];
        if (m == d || !represents(p, m)) continue;
        const lprog *mp = &pr->progs[m];
        int mpc = walked(&w, m);
        if (mpc >= mp->n || mp->ops[mpc].kind != LI_COLLECTIVE || mp->ops[mpc].id != in->comm ||
            mp->ops[mpc].epoch != in->epoch)
          peer = m;
      }
    }
    if (peer >= 0 && walked(&w, peer) < pr->progs[peer].n) {
      there = lower_view(pr, &pr->progs[peer], walked(&w, peer));
      other = &there;
    }
    weft_loc at = p->sched != SCHED_DEFAULT ? p->sched_loc : p->loc;
    const char *where = block_at(&s, pr, d, w.pc[k], &at);
    const char *other_where = peer >= 0 ? block_at(&s, pr, peer, walked(&w, peer), &(weft_loc){0}) : "";
    weft_diag *g;
    if (in->kind == LI_COLLECTIVE && other && other->kind == LI_COLLECTIVE) {
      g = diag_add(dg, DIAG_ERROR, at, "devices %d and %d enter collectives in different orders: device %d is at %s%s, device %d "
                               "at %s%s",
                   d, peer, d, ins_str(&s, p, in), where, peer, ins_str(&s, p, other), other_where);
      diag_hint(g, dg, "members of a collective must run their shared collectives in one order; "
                       "make their schedules agree");
    } else if (other) {
      g = diag_add(dg, DIAG_ERROR, at, "deadlock: device %d waits at %s%s while device %d waits at %s%s", d, ins_str(&s, p, in),
                   where, peer, ins_str(&s, p, other), other_where);
      diag_hint(g, dg, "the schedule orders blocks so that each waits for the other; weft lower --grid "
                       "prints the order");
    } else {
      g = diag_add(dg, DIAG_ERROR, at, "deadlock: device %d waits forever at %s%s", d, ins_str(&s, p, in), where);
      diag_hint(g, dg, "weft lower --grid prints the order");
    }
  }
  arena_free(&s);
  lower_walk_free(&w);
  return ok;
}

/* ---- memory (rule 5) ---------------------------------------------------------
 * The peak each device's memory reaches is that of the simulated step
 * (sim.h), the model weft estimate reports: buffers live from their first
 * use to the end of their last, in time, not in program order. */

bool validate_memory_sim(const weft_sim *s, weft_diags *dg) {
  const weft_program *pr = s->pr;
  const weft_plan *p = pr->p;
  int64_t cap = lower_device_memory(p);
  if (cap <= 0) return true;
  /* the first simulated device with the most (weft estimate's peak
   * device); replicas count with their representative */
  int wk = -1, over = 0;
  for (int k = 0; k < s->ndev; k++) {
    if (s->dev[k].peak <= cap) continue;
    over += s->dev[k].weight;
    if (wk < 0 || s->dev[k].peak > s->dev[wk].peak) wk = k;
  }
  if (wk < 0) return true;
  const sim_dev *D = &s->dev[wk];
  char b1[64], b2[64], overs[64] = "", where[600], roles[400];
  if (over > 1) snprintf(overs, sizeof overs, " (%d devices do not fit)", over);
  weft_diag *g = diag_add(dg, DIAG_ERROR, p->loc, "device %d needs %s at its peak, more than its %s of memory%s", D->device,
                            unit_bytes_human(D->peak, b1, sizeof b1), unit_bytes_human(cap, b2, sizeof b2), overs);
  diag_hint(g, dg, "split more (tensor or pipeline parallelism), recompute activations, use more "
                          "micro-batches, or shard with ZeRO");
  sim_peak_where(s, D, where, sizeof where);
  diag_add(dg, DIAG_NOTE, p->loc, "at the peak of device %d%s%s: %s", D->device, where[0] ? ", reached at " : "",
           where, sim_roles_text(D->peak_by_role, roles, sizeof roles));
  return false;
}

/* Rule 5, simulating the program on its cluster's hardware model (or
 * symbolically when the cluster lacks rates). */
static bool validate_memory(const weft_program *pr, weft_diags *dg) {
  if (lower_device_memory(pr->p) <= 0) return true;
  weft_sim *s = sim_run_plan(pr, 0);
  bool fits = !s || validate_memory_sim(s, dg);
  sim_free(s);
  return fits;
}

bool validate_program(const weft_program *pr, const validate_opts *o, weft_diags *dg) {
  bool ok = validate_order(pr, dg);
  /* (the phase keeps the name WEFT_PROFILE has always given it) */
  prof_mark("lower: deadlock check");
  if (ok && !(o && o->skip_memory)) ok = validate_memory(pr, dg);
  return ok;
}
