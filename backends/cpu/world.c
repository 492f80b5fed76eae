/* world.c - the world a run starts from and ends with (backend.h): from a
 * seed or safetensors files, checkpoints written atomically, differences. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "optim.h"
#include "safetensors.h"
#include "weft/backend.h"
#include "weft/workspace.h"
#include "xops.h"

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) weft_oom();
  return p;
}

static void *xcalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) weft_oom();
  return p;
}

weft_world *world_new(const weft_graph *g) {
  weft_world *w = xcalloc(sizeof *w);
  w->g = g;
  w->param = xcalloc((size_t)g->ntensors * sizeof(float *));
  w->state = xcalloc((size_t)g->ntensors * sizeof(float *));
  w->input = xcalloc((size_t)g->ntensors * sizeof(void *));
  xoptim o;
  if (xoptim_from_graph(g, &o)) {
    w->optimizer = o.kind->name;
    w->state_copies = xoptim_state(&o);
    w->state_names = o.kind->state_names;
  }
  for (int t = 0; t < g->ntensors; t++) {
    const gtensor *x = &g->tensors[t];
    size_t n = (size_t)tensor_numel(x);
    if (x->role == TENSOR_PARAM) {
      w->param[t] = xcalloc(n * sizeof(float));
      if (w->state_copies) w->state[t] = xcalloc(n * (size_t)w->state_copies * sizeof(float));
    } else if (x->role == TENSOR_INPUT) {
      w->input[t] = xcalloc(n * 4);
    }
  }
  return w;
}

const char *world_meta(const weft_world *w, const char *key) {
  for (int i = 0; i < w->nmeta; i++)
    if (strcmp(w->meta_key[i], key) == 0) return w->meta_val[i];
  return NULL;
}

static char *xstrdup(const char *s) {
  char *c = strdup(s);
  if (!c) weft_oom();
  return c;
}

bool world_set_meta(weft_world *w, const char *key, const char *value) {
  for (int i = 0; i < w->nmeta; i++)
    if (strcmp(w->meta_key[i], key) == 0) {
      free(w->meta_val[i]);
      w->meta_val[i] = xstrdup(value);
      return true;
    }
  if (w->nmeta == WORLD_MAX_META) return false;
  w->meta_key[w->nmeta] = xstrdup(key);
  w->meta_val[w->nmeta++] = xstrdup(value);
  return true;
}

void world_free(weft_world *w) {
  if (!w) return;
  for (int i = 0; i < w->nmeta; i++) free(w->meta_key[i]), free(w->meta_val[i]);
  for (int t = 0; t < w->g->ntensors; t++) free(w->param[t]), free(w->state[t]), free(w->input[t]);
  free(w->param), free(w->state), free(w->input);
  free(w);
}

weft_world *world_clone(const weft_world *w) {
  weft_world *c = world_new(w->g);
  for (int t = 0; t < w->g->ntensors; t++) {
    size_t n = (size_t)tensor_numel(&w->g->tensors[t]);
    if (w->param[t]) memcpy(c->param[t], w->param[t], n * sizeof(float));
    if (w->state[t]) memcpy(c->state[t], w->state[t], n * (size_t)w->state_copies * sizeof(float));
    if (w->input[t]) memcpy(c->input[t], w->input[t], n * 4);
  }
  c->step = w->step;
  for (int i = 0; i < w->nmeta; i++) world_set_meta(c, w->meta_key[i], w->meta_val[i]);
  return c;
}

/* A stream number from a tensor's name, so that initial values do not
 * depend on the order tensors were declared in. */
static uint64_t name_stream(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* How a parameter starts (xop_param_init): as a norm weight or a bias when
 * any operator reads it as one, else normal. */
static char param_use(const weft_graph *g, int t) {
  for (int o = 0; o < g->nops; o++)
    for (int i = 0; i < g->ops[o].ninputs; i++) {
      char u = g->ops[o].inputs[i] == t ? xop_param_init(g, o, i) : 'w';
      if (u != 'w') return u;
    }
  return 'w';
}

void world_init_params(weft_world *w, uint64_t seed) {
  const weft_graph *g = w->g;
  for (int t = 0; t < g->ntensors; t++) {
    if (!w->param[t]) continue;
    int64_t n = tensor_numel(&g->tensors[t]);
    char use = param_use(g, t);
    if (use == 'w') k_init_normal(w->param[t], 0, n, seed, name_stream(g->tensors[t].name), 0.0, 0.02);
    else
      for (int64_t i = 0; i < n; i++) w->param[t][i] = use == 'n' ? 1.0f : 0.0f;
    if (w->state[t]) memset(w->state[t], 0, (size_t)n * (size_t)w->state_copies * sizeof(float));
  }
  w->step = 0;
}

int64_t world_id_bound(const weft_graph *g, int t) {
  for (int o = 0; o < g->nops; o++)
    for (int i = 0; i < g->ops[o].ninputs; i++) {
      int64_t b = g->ops[o].inputs[i] == t ? xop_id_bound(g, o, i) : 0;
      if (b > 0) return b;
    }
  return 2;
}

void world_init_inputs(weft_world *w, uint64_t seed) {
  const weft_graph *g = w->g;
  for (int t = 0; t < g->ntensors; t++) {
    if (!w->input[t]) continue;
    const gtensor *x = &g->tensors[t];
    int64_t n = tensor_numel(x);
    uint64_t stream = name_stream(x->name);
    if (x->dtype == DT_I32) {
      int64_t bound = world_id_bound(g, t);
      int32_t *v = w->input[t];
      for (int64_t i = 0; i < n; i++) v[i] = (int32_t)(k_rng_u64(seed, stream, (uint64_t)i) % (uint64_t)bound);
    } else {
      k_init_normal(w->input[t], 0, n, seed, stream, 0.0, 1.0);
    }
  }
}

/* "[64, 192]" */
static const char *shape_str(char *buf, size_t n, int ndims, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndims && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

static const char *gshape_str(char *buf, size_t n, const gtensor *t) {
  int64_t s[16];
  for (int i = 0; i < t->ndims && i < 16; i++) s[i] = t->dims[i].size;
  return shape_str(buf, n, t->ndims, s);
}

/* Reads tensor `name` of f into out as the graph tensor t wants it. */
static bool read_tensor(const st_file *f, const char *path, const st_tensor *x, const gtensor *t,
                        const char *name, void *out, bool ints, char *err, size_t errlen) {
  bool same = x->ndims == t->ndims;
  for (int i = 0; same && i < t->ndims; i++) same = x->shape[i] == t->dims[i].size;
  if (!same) {
    char a[128], b[128];
    snprintf(err, errlen, "%s: tensor %s has shape %s; the model needs %s", path, name,
             shape_str(a, sizeof a, x->ndims, x->shape), gshape_str(b, sizeof b, t));
    return false;
  }
  char e2[256];
  bool ok = ints ? st_read_i32(f, x, out, e2, sizeof e2) : st_read_f32(f, x, out, e2, sizeof e2);
  if (!ok) snprintf(err, errlen, "%s: tensor %s: %s", path, name, e2);
  return ok;
}

/* A value of a tensor that training cannot start from: NaN or an infinity
 * anywhere, and below zero in a state that is a mean of squares. */
static bool check_values(const weft_world *w, const char *path, const char *name, const float *v, int64_t n,
                         bool nonneg, char *err, size_t errlen) {
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(v[i]) && !w->allow_nonfinite) {
      int64_t more = 0;
      for (int64_t k = i + 1; k < n; k++) more += !isfinite(v[k]);
      snprintf(err, errlen, "%s: tensor %s holds %s at element %" PRId64 " (%" PRId64 " of its %" PRId64 " values are not "
               "finite); --allow-nonfinite loads it all the same", path, name, isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf",
               i, more + 1, n);
      return false;
    }
    if (nonneg && v[i] < 0) {
      snprintf(err, errlen, "%s: tensor %s holds %.9g at element %" PRId64 "; an optimizer's mean of squares is never negative",
               path, name, (double)v[i], i);
      return false;
    }
  }
  return true;
}

static bool is_optim_name(const char *n) { return strncmp(n, "optim.", 6) == 0; }

/* Every tensor of `role` in the file, and nothing else (optim.* aside). */
static bool load_role(weft_world *w, const char *path, tensor_role role, char *err, size_t errlen) {
  const weft_graph *g = w->g;
  st_file *f = st_open(path, err, errlen);
  if (!f) return false;
  bool ok = true;
  for (int t = 0; t < g->ntensors && ok; t++) {
    const gtensor *x = &g->tensors[t];
    if (x->role != role) continue;
    const st_tensor *s = st_find(f, x->name);
    if (!s) {
      snprintf(err, errlen, "%s: no tensor %s (the model's %s %s)", path, x->name,
               role == TENSOR_PARAM ? "parameter" : "input", x->name);
      ok = false;
      break;
    }
    bool ints = role == TENSOR_INPUT && x->dtype == DT_I32;
    void *out = role == TENSOR_PARAM ? (void *)w->param[t] : w->input[t];
    ok = read_tensor(f, path, s, x, x->name, out, ints, err, errlen) &&
         (ints || check_values(w, path, x->name, out, tensor_numel(x), false, err, errlen));
  }
  for (int i = 0; ok && i < st_count(f); i++) {
    const st_tensor *s = st_at(f, i);
    if (is_optim_name(s->name)) continue;
    int t = graph_find(g, s->name);
    if (t < 0 || g->tensors[t].role != role) {
      snprintf(err, errlen, "%s: tensor %s is not %s of model %s", path, s->name,
               role == TENSOR_PARAM ? "a parameter" : "an input", g->name);
      ok = false;
    }
  }
  st_close(f);
  return ok;
}

bool world_load_params(weft_world *w, const char *path, char *err, size_t errlen) {
  return load_role(w, path, TENSOR_PARAM, err, errlen);
}

bool world_load_inputs(weft_world *w, const char *path, char *err, size_t errlen) {
  if (!load_role(w, path, TENSOR_INPUT, err, errlen)) return false;
  const weft_graph *g = w->g;
  for (int t = 0; t < g->ntensors; t++) {
    const gtensor *x = &g->tensors[t];
    if (x->role != TENSOR_INPUT || x->dtype != DT_I32) continue;
    int64_t bound = world_id_bound(g, t), n = tensor_numel(x);
    const int32_t *v = w->input[t];
    for (int64_t i = 0; i < n; i++)
      if (v[i] < 0 || v[i] >= bound) {
        snprintf(err, errlen, "%s: %s holds %d at element %" PRId64 "; ids must lie in [0, %" PRId64 ")", path,
                 x->name, v[i], i, bound);
        return false;
      }
  }
  return true;
}

/* Whether s is a whole decimal number from 0 to max, digits only (no
 * sign, no space, not empty); its value in *out. */
static bool decimal(const char *s, uint64_t max, uint64_t *out) {
  uint64_t v = 0;
  if (!*s) return false;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return false;
    unsigned d = (unsigned)(*s - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  if (out) *out = v;
  return true;
}

/* The name of state tensor c of parameter `param` in a checkpoint. */
static const char *state_name(char *buf, size_t n, const weft_world *w, int c, const char *param) {
  snprintf(buf, n, "optim.%s.%s", w->state_names[c], param);
  return buf;
}

bool world_resume(weft_world *w, const char *path, uint64_t *seed, char *err, size_t errlen) {
  if (!load_role(w, path, TENSOR_PARAM, err, errlen)) return false;
  st_file *f = st_open(path, err, errlen);
  if (!f) return false;
  const weft_graph *g = w->g;
  bool ok = true;
  const char *fmt = st_meta(f, "format"), *step = st_meta(f, "step"), *model = st_meta(f, "model");
  const char *opt = st_meta(f, "optimizer"), *sd = st_meta(f, "seed");
  uint64_t v;
  if (!fmt || strcmp(fmt, "weft-checkpoint") != 0 || !step) {
    snprintf(err, errlen, "%s: not a checkpoint of weft run (its metadata lacks format and step)", path);
    ok = false;
  } else if (!decimal(step, WORLD_MAX_STEP, &v)) {
    snprintf(err, errlen, "%s: step \"%.40s\" in its metadata is not a count of steps (a decimal number from 0 to %" PRId64 ")",
             path, step, WORLD_MAX_STEP);
    ok = false;
  } else if (sd && !decimal(sd, UINT64_MAX, NULL)) {
    snprintf(err, errlen, "%s: seed \"%.40s\" in its metadata is not a seed (a decimal number from 0 to %" PRIu64 ")", path,
             sd, UINT64_MAX);
    ok = false;
  } else if (!model || strcmp(model, g->name) != 0) {
    snprintf(err, errlen, "%s: a checkpoint of model %.80s, not of model %s", path, model ? model : "(none named)", g->name);
    ok = false;
  } else if (!opt || strcmp(opt, w->optimizer ? w->optimizer : "none") != 0) {
    snprintf(err, errlen, "%s: a checkpoint of %.80s, but model %s trains with %s", path, opt ? opt : "no named optimizer",
             g->name, g->optimizer ? g->optimizer : "nothing");
    ok = false;
  } else {
    w->step = (int64_t)v;
    if (sd && seed) decimal(sd, UINT64_MAX, seed);
    /* the run's settings, "train.*" (weft run checks their values) */
    for (int i = 0; i < st_meta_count(f); i++) {
      const char *k = st_meta_key(f, i);
      if (strncmp(k, "train.", 6) == 0 && !world_set_meta(w, k, st_meta(f, k))) {
        snprintf(err, errlen, "%s: more than %d train.* entries in its metadata", path, WORLD_MAX_META);
        ok = false;
        break;
      }
    }
  }
  char name[1024];
  for (int t = 0; t < g->ntensors && ok; t++) {
    if (!w->state[t]) continue;
    int64_t n = tensor_numel(&g->tensors[t]);
    for (int c = 0; c < w->state_copies && ok; c++) {
      state_name(name, sizeof name, w, c, g->tensors[t].name);
      const st_tensor *s = st_find(f, name);
      if (!s) {
        snprintf(err, errlen, "%s: no tensor %s (optimizer state of %s)", path, name, g->tensors[t].name);
        ok = false;
        break;
      }
      ok = read_tensor(f, path, s, &g->tensors[t], name, w->state[t] + c * n, false, err, errlen) &&
           check_values(w, path, name, w->state[t] + c * n, n, strcmp(w->state_names[c], "exp_avg_sq") == 0, err, errlen);
    }
  }
  st_close(f);
  return ok;
}

bool world_save(const weft_world *w, const char *path, uint64_t seed, char *err, size_t errlen) {
  const weft_graph *g = w->g;
  st_writer *sw = st_writer_new();
  char **names = xmalloc((size_t)(g->ntensors * 2 + 1) * sizeof(char *));
  int nn = 0;
  int64_t shape[16];
  for (int t = 0; t < g->ntensors; t++) {
    const gtensor *x = &g->tensors[t];
    if (!w->param[t]) continue;
    for (int i = 0; i < x->ndims && i < 16; i++) shape[i] = x->dims[i].size;
    st_writer_add(sw, x->name, ST_F32, x->ndims, shape, w->param[t]);
    int64_t n = tensor_numel(x);
    for (int c = 0; c < w->state_copies && w->state[t]; c++) {
      size_t len = strlen(w->state_names[c]) + strlen(x->name) + 8;
      char *nm = xmalloc(len);
      state_name(nm, len, w, c, x->name);
      names[nn++] = nm;
      st_writer_add(sw, nm, ST_F32, x->ndims, shape, w->state[t] + c * n);
    }
  }
  char buf[64];
  st_writer_meta(sw, "format", "weft-checkpoint");
  st_writer_meta(sw, "model", g->name);
  st_writer_meta(sw, "optimizer", g->optimizer ? g->optimizer : "none");
  snprintf(buf, sizeof buf, "%" PRId64, w->step);
  st_writer_meta(sw, "step", buf);
  snprintf(buf, sizeof buf, "%" PRIu64, seed);
  st_writer_meta(sw, "seed", buf);
  for (int i = 0; i < w->nmeta; i++) st_writer_meta(sw, w->meta_key[i], w->meta_val[i]);
  bool ok = st_write(sw, path, err, errlen);
  st_writer_free(sw);
  for (int i = 0; i < nn; i++) free(names[i]);
  free(names);
  return ok;
}

static double rel_l2(const float *a, const float *b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = (double)a[i] - (double)b[i];
    d += x * x;
    r += (double)b[i] * (double)b[i];
  }
  return r > 0 ? sqrt(d / r) : sqrt(d);
}

double world_diff_all(const weft_world *a, const weft_world *b) {
  const weft_graph *g = a->g;
  double d = 0, r = 0;
  for (int t = 0; t < g->ntensors; t++) {
    if (!a->param[t]) continue;
    int64_t n = tensor_numel(&g->tensors[t]);
    for (int64_t i = 0; i < n; i++) {
      double x = (double)a->param[t][i] - (double)b->param[t][i];
      d += x * x;
      r += (double)b->param[t][i] * (double)b->param[t][i];
    }
  }
  return r > 0 ? sqrt(d / r) : sqrt(d);
}

double world_diff(const weft_world *a, const weft_world *b, bool state, const char **worst) {
  const weft_graph *g = a->g;
  double m = 0;
  if (worst) *worst = NULL;
  for (int t = 0; t < g->ntensors; t++) {
    if (!a->param[t]) continue;
    int64_t n = tensor_numel(&g->tensors[t]);
    double e = rel_l2(a->param[t], b->param[t], n);
    for (int c = 0; state && a->state[t] && c < a->state_copies; c++) {
      double s = rel_l2(a->state[t] + c * n, b->state[t] + c * n, n);
      if (s > e) e = s;
    }
    if (e > m || (worst && !*worst)) {
      if (e > m) m = e;
      if (worst) *worst = g->tensors[t].name;
    }
  }
  return m;
}

int64_t world_step_items(const weft_graph *g, const char **unit) {
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_INPUT && g->tensors[t].dtype == DT_I32) {
      *unit = "tokens";
      return tensor_numel(&g->tensors[t]);
    }
  for (int t = 0; t < g->ntensors; t++)
    if (g->tensors[t].role == TENSOR_INPUT && g->tensors[t].ndims > 0) {
      *unit = "samples";
      return g->tensors[t].dims[0].size;
    }
  *unit = "steps";
  return 1;
}
