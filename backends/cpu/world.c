/* world.c - the world a run starts from and ends with (backend.h): from a
 * seed or safetensors files, checkpoints written atomically, differences. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/files.h"

#include "kernels.h"
#include "optim.h"
#include "safetensors.h"
#include "weft/backend.h"
#include "weft/workspace.h"
#include "xops.h"

weft_world *world_new(const weft_graph *g) {
  weft_world *w = weft_xcalloc(sizeof *w);
  w->g = g;
  w->param = weft_xcalloc((size_t)g->ntensors * sizeof(float *));
  w->state = weft_xcalloc((size_t)g->ntensors * sizeof(float *));
  w->input = weft_xcalloc((size_t)g->ntensors * sizeof(void *));
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
      w->param[t] = weft_xcalloc(n * sizeof(float));
      if (w->state_copies) w->state[t] = weft_xcalloc(n * (size_t)w->state_copies * sizeof(float));
    } else if (x->role == TENSOR_INPUT) {
      w->input[t] = weft_xcalloc(n * 4);
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

/* Where a checkpoint's metadata comes from: a file's header, or the index
 * of a sharded set. */
typedef struct meta_src {
  const st_file *f;
  const st_index *ix;
} meta_src;

static const char *meta_get(const meta_src *m, const char *key) {
  return m->f ? st_meta(m->f, key) : st_index_meta(m->ix, key);
}
static int meta_count(const meta_src *m) { return m->f ? st_meta_count(m->f) : m->ix->nmeta; }
static const char *meta_key(const meta_src *m, int i) { return m->f ? st_meta_key(m->f, i) : m->ix->meta_key[i]; }

/* The checkpoint's metadata, checked as data: format, step, seed, model,
 * optimizer; w->step, *seed and the run's settings (train.*) from it. */
static bool resume_meta(weft_world *w, const char *path, const meta_src *m, uint64_t *seed, char *err, size_t errlen) {
  const weft_graph *g = w->g;
  bool ok = true;
  const char *fmt = meta_get(m, "format"), *step = meta_get(m, "step"), *model = meta_get(m, "model");
  const char *opt = meta_get(m, "optimizer"), *sd = meta_get(m, "seed");
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
    for (int i = 0; i < meta_count(m); i++) {
      const char *k = meta_key(m, i);
      if (strncmp(k, "train.", 6) == 0 && !world_set_meta(w, k, meta_get(m, k))) {
        snprintf(err, errlen, "%s: more than %d train.* entries in its metadata", path, WORLD_MAX_META);
        ok = false;
        break;
      }
    }
  }
  return ok;
}

bool world_resume(weft_world *w, const char *path, uint64_t *seed, char *err, size_t errlen) {
  if (!load_role(w, path, TENSOR_PARAM, err, errlen)) return false;
  st_file *f = st_open(path, err, errlen);
  if (!f) return false;
  const weft_graph *g = w->g;
  meta_src m = {f, NULL};
  bool ok = resume_meta(w, path, &m, seed, err, errlen);
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
  char **names = weft_xmalloc((size_t)(g->ntensors * 2 + 1) * sizeof(char *));
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
      char *nm = weft_xmalloc(len);
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

/* ---- sharded checkpoints ----------------------------------------------------
 * A directory: model-RRRRR-of-NNNNN.safetensors, one per process, each
 * holding the pieces of parameters and optimizer state that the devices of
 * its process hold, and model.safetensors.index.json (safetensors.h), the
 * run's metadata and where every piece lies, written last. */

#define SHARD_INDEX "model.safetensors.index.json"
enum { SHARD_MAX_PROCS = 99999 };

/* A box of a tensor, [lo, hi) in each dimension, and the process that
 * holds (and writes) it. */
typedef struct sbox {
  int proc;
  int64_t lo[ST_MAX_DIMS], hi[ST_MAX_DIMS];
} sbox;

typedef struct sboxes {
  sbox *v;
  int n, cap;
} sboxes;

/* Per graph tensor, two lists: [2t] its values, [2t + 1] its optimizer
 * state (every state copy holds the same boxes). */
typedef struct holdings {
  int ntensors;
  sboxes *of;
} holdings;

static void holdings_free(holdings *h) {
  if (!h->of) return;
  for (int i = 0; i < 2 * h->ntensors; i++) free(h->of[i].v);
  free(h->of);
  h->of = NULL;
}

static bool box_same(const sbox *a, const sbox *b, int nd) {
  for (int d = 0; d < nd; d++)
    if (a->lo[d] != b->lo[d] || a->hi[d] != b->hi[d]) return false;
  return true;
}

static bool box_meets(const int64_t *alo, const int64_t *ahi, const int64_t *blo, const int64_t *bhi, int nd) {
  for (int d = 0; d < nd; d++)
    if (ahi[d] <= blo[d] || bhi[d] <= alo[d]) return false;
  return true;
}

static int64_t box_numel(const int64_t *lo, const int64_t *hi, int nd) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= hi[d] - lo[d];
  return n;
}

/* Adds a box unless the list has the same one, of any process with
 * `once` (processes come in order, so the lowest keeps it), else of the
 * same process. */
static void boxes_add(sboxes *l, const sbox *b, int nd, bool once) {
  for (int i = 0; i < l->n; i++)
    if (box_same(&l->v[i], b, nd) && (once || l->v[i].proc == b->proc)) return;
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 4;
    l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
    if (!l->v) weft_oom();
  }
  l->v[l->n++] = *b;
}

/* Copies between a whole tensor of shape (row-major) and the packed box
 * [lo, hi): into the box when `out`, else from it into the tensor. With
 * `mark`, sets whole's bytes to 1 instead (a mask of the elements held). */
static void box_move(float *whole, const gtensor *t, const int64_t *lo, const int64_t *hi, float *packed, bool out,
                     unsigned char *mark) {
  int nd = t->ndims;
  int64_t n = box_numel(lo, hi, nd);
  if (n == 0) return;
  if (nd == 0) {
    if (mark) mark[0] = 1;
    else if (out) packed[0] = whole[0];
    else whole[0] = packed[0];
    return;
  }
  int64_t idx[ST_MAX_DIMS], stride[ST_MAX_DIMS];
  stride[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; d--) stride[d] = stride[d + 1] * t->dims[d + 1].size;
  for (int d = 0; d < nd; d++) idx[d] = lo[d];
  int64_t run = hi[nd - 1] - lo[nd - 1], k = 0;
  for (;;) {
    int64_t at = 0;
    for (int d = 0; d < nd; d++) at += idx[d] * stride[d];
    if (mark) memset(mark + at, 1, (size_t)run);
    else if (out) memcpy(packed + k, whole + at, (size_t)run * sizeof(float));
    else memcpy(whole + at, packed + k, (size_t)run * sizeof(float));
    k += run;
    int d = nd - 2;
    while (d >= 0 && ++idx[d] == hi[d]) idx[d] = lo[d], d--;
    if (d < 0) break;
  }
}

/* The process of each device with a program: blocks of consecutive
 * devices, as the CPU backend spreads them over processes (net.c). */
static int device_proc(const weft_program *pr, int nprocs, int device) {
  int active = 0, before = 0;
  for (int d = 0; d < pr->nprogs; d++) {
    active += pr->progs[d].n > 0;
    before += d < device && pr->progs[d].n > 0;
  }
  return active ? (int)((int64_t)before * nprocs / active) : 0;
}

/* What the devices of each of nprocs processes hold under pr: the regions
 * of their buffers of parameters, master weights and optimizer state (all
 * that a device reads from the world), cut into boxes; elements no device
 * holds go to process 0. With `once`, a box that several processes hold
 * is the lowest one's only (what each writes), else each one's (what each
 * reads). */
static bool holdings_of(const weft_world *w, const weft_program *pr, int nprocs, bool once, holdings *h, char *err,
                        size_t errlen) {
  const weft_graph *g = w->g;
  h->ntensors = g->ntensors;
  h->of = weft_xcalloc((size_t)(2 * g->ntensors + 1) * sizeof(sboxes));
  for (int t = 0; t < g->ntensors; t++)
    if (w->param[t] && g->tensors[t].ndims > ST_MAX_DIMS) {
      snprintf(err, errlen, "tensor %s has %d dimensions; a checkpoint holds at most %d", g->tensors[t].name,
               g->tensors[t].ndims, ST_MAX_DIMS);
      holdings_free(h);
      return false;
    }
  for (int dv = 0; dv < pr->nprogs; dv++) {
    const lprog *lp = &pr->progs[dv];
    if (lp->n == 0) continue;
    int proc = device_proc(pr, nprocs, dv);
    for (int id = lp->buf_lo; id < lp->buf_hi; id++) {
      const lbuf *b = &pr->bufs[id];
      int t = b->tensor;
      if (t < 0 || t >= g->ntensors || !w->param[t]) continue;
      /* every buffer a device fills from the world when it makes it */
      int kind = b->role == LB_PARAM || b->role == LB_MASTER ? 0 : b->role == LB_STATE && w->state[t] ? 1 : -1;
      if (kind < 0 || b->region.ndims != g->tensors[t].ndims) continue;
      /* the region's intervals, dimension by dimension, give boxes */
      int nd = b->region.ndims, pick[ST_MAX_DIMS] = {0};
      bool empty = false;
      for (int d = 0; d < nd; d++) empty |= b->region.dims[d].n == 0;
      if (empty) continue;
      for (;;) {
        sbox x = {.proc = proc};
        for (int d = 0; d < nd; d++) {
          x.lo[d] = b->region.dims[d].iv[pick[d]].lo;
          x.hi[d] = b->region.dims[d].iv[pick[d]].hi;
        }
        boxes_add(&h->of[2 * t + kind], &x, nd, once);
        int d = nd - 1;
        while (d >= 0 && ++pick[d] == b->region.dims[d].n) pick[d--] = 0;
        if (d < 0) break;
      }
    }
  }
  /* what no device holds: the whole tensor, written by process 0 */
  for (int t = 0; t < g->ntensors; t++)
    for (int kind = 0; kind < 2; kind++) {
      if (!w->param[t] || (kind && !w->state[t])) continue;
      const gtensor *x = &g->tensors[t];
      int64_t n = tensor_numel(x);
      unsigned char *mask = weft_xcalloc((size_t)n);
      sboxes *l = &h->of[2 * t + kind];
      for (int i = 0; i < l->n; i++) box_move(NULL, x, l->v[i].lo, l->v[i].hi, NULL, false, mask);
      bool all = true;
      for (int64_t e = 0; e < n && all; e++) all = mask[e];
      free(mask);
      if (all) continue;
      sbox whole = {.proc = 0};
      for (int d = 0; d < x->ndims; d++) whole.hi[d] = x->dims[d].size;
      boxes_add(l, &whole, x->ndims, once);
    }
  return true;
}

bool world_sharded_path(const char *path) {
  size_t n = strlen(path);
  return n > 1 && path[n - 1] == '/';
}

/* dir without its trailing slashes (malloc'd). */
static char *strip_slash(const char *dir) {
  char *d = xstrdup(dir);
  size_t n = strlen(d);
  while (n > 1 && d[n - 1] == '/') d[--n] = 0;
  return d;
}

/* PARENT/.BASE.SUFFIX beside dir (malloc'd). */
static char *beside(const char *dir, const char *suffix) {
  const char *slash = strrchr(dir, '/');
  size_t head = slash ? (size_t)(slash - dir) + 1 : 0;
  size_t n = strlen(dir) + strlen(suffix) + 4;
  char *s = weft_xmalloc(n);
  snprintf(s, n, "%.*s.%s.%s", (int)head, dir, dir + head, suffix);
  return s;
}

/* Whether a directory entry belongs to a sharded set: the index, a shard,
 * or a temporary one of them left by a save that was killed. */
static bool set_member(const char *name) {
  if (strcmp(name, SHARD_INDEX) == 0 || st_shard_name_ok(name, NULL, NULL)) return true;
  if (name[0] != '.') return false;
  size_t n = strlen(name);
  if (n < 5 || strcmp(name + n - 4, ".tmp") != 0) return false;
  return strncmp(name + 1, SHARD_INDEX ".", strlen(SHARD_INDEX) + 1) == 0 || strncmp(name + 1, "model-", 6) == 0;
}

/* Whether dir is absent, or a directory (not a link) of a sharded set's
 * files only; why says what else it is. */
static bool set_dir_ok(const char *dir, bool *exists, char *why, size_t n) {
  struct stat st;
  *exists = false;
  if (lstat(dir, &st) != 0) {
    if (errno == ENOENT) return true;
    snprintf(why, n, "%s", strerror(errno));
    return false;
  }
  *exists = true;
  if (!S_ISDIR(st.st_mode)) {
    snprintf(why, n, "%s, not a directory", S_ISLNK(st.st_mode) ? "a symbolic link" : file_kind(st.st_mode));
    return false;
  }
  DIR *d = opendir(dir);
  if (!d) {
    snprintf(why, n, "%s", strerror(errno));
    return false;
  }
  bool ok = true;
  struct dirent *e;
  while (ok && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (!set_member(e->d_name)) {
      snprintf(why, n, "the directory holds %.200s, which is not part of a sharded checkpoint; weft replaces only a "
               "directory of one", e->d_name);
      ok = false;
    }
  }
  closedir(d);
  return ok;
}

/* Removes a directory of a set's files (set_dir_ok checked it). */
static bool set_remove(const char *dir, char *err, size_t errlen) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return true;
    snprintf(err, errlen, "%s: %s", dir, strerror(errno));
    return false;
  }
  struct dirent *e;
  bool ok = true;
  while ((e = readdir(d))) {
    if (!set_member(e->d_name)) continue;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlink(p) != 0 && errno != ENOENT) ok = false;
  }
  closedir(d);
  if (ok && rmdir(dir) != 0) ok = false;
  if (!ok) snprintf(err, errlen, "%s: cannot remove: %s", dir, strerror(errno));
  return ok;
}

bool world_sharded_target(const char *path, char *err, size_t errlen) {
  char *dir = strip_slash(path), why[512];
  bool exists, ok = set_dir_ok(dir, &exists, why, sizeof why);
  if (ok && !exists) {
    /* a new name: its parent must take it */
    ok = file_check_output(dir, why, sizeof why);
  } else if (ok && access(dir, W_OK) != 0) {
    snprintf(why, sizeof why, "%s", strerror(errno));
    ok = false;
  }
  if (!ok) snprintf(err, errlen, "%s: %s", path, why);
  free(dir);
  return ok;
}

bool world_remove_sharded(const char *path, char *err, size_t errlen) {
  char *dir = strip_slash(path), why[512];
  bool exists, ok = set_dir_ok(dir, &exists, why, sizeof why);
  if (!ok) snprintf(err, errlen, "%s: %s", path, why);
  else if (exists) ok = set_remove(dir, err, errlen);
  free(dir);
  return ok;
}

/* The name of tensor kind c of parameter t: the parameter's (c < 0), or
 * its state copy c's. */
static void piece_tensor_name(char *buf, size_t n, const weft_world *w, int t, int c) {
  if (c < 0) snprintf(buf, n, "%s", w->g->tensors[t].name);
  else state_name(buf, n, w, c, w->g->tensors[t].name);
}

/* A piece's entry in its shard: the tensor's name when it is whole, else
 * the name and the box, "h.0.w[0:64, 32:64]". */
static void piece_entry(char *buf, size_t n, const char *tensor, const gtensor *x, const sbox *b) {
  bool whole = true;
  for (int d = 0; d < x->ndims; d++) whole &= b->lo[d] == 0 && b->hi[d] == x->dims[d].size;
  size_t k = (size_t)snprintf(buf, n, "%s", tensor);
  if (whole) return;
  for (int d = 0; d < x->ndims && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64 ":%" PRId64, d ? ", " : "[", b->lo[d], b->hi[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* What a shard's metadata says of an entry: its box in the whole shape,
 * "[0:64, 32:64] of [64, 64]". */
static void piece_meta(char *buf, size_t n, const gtensor *x, const int64_t *lo, const int64_t *hi) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < x->ndims && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64 ":%" PRId64, d ? ", " : "", lo[d], hi[d]);
  if (k < n) k += (size_t)snprintf(buf + k, n - k, "] of ");
  if (k < n) gshape_str(buf + k, n - k, x);
}

bool world_save_sharded(const weft_world *w, const weft_program *pr, int rank, int nprocs, const char *path,
                        uint64_t seed, world_agree_fn agree, void *ctx, char *err, size_t errlen) {
  const weft_graph *g = w->g;
  err[0] = 0;
  if (nprocs > SHARD_MAX_PROCS) {
    snprintf(err, errlen, "%s: a sharded checkpoint holds at most %d shards", path, SHARD_MAX_PROCS);
    return false;
  }
  holdings h = {0};
  bool ok = holdings_of(w, pr, nprocs, true, &h, err, errlen);
  char *dir = strip_slash(path), *tmp = beside(dir, "partial"), *old = beside(dir, "old");
  /* process 0 makes the directory the shards go to, fresh */
  if (ok && rank == 0) {
    char why[512];
    bool exists;
    if (!set_dir_ok(tmp, &exists, why, sizeof why)) {
      snprintf(err, errlen, "%s: %s", tmp, why);
      ok = false;
    } else if (exists) {
      ok = set_remove(tmp, err, errlen);
    }
    if (ok && mkdir(tmp, 0777) != 0) {
      snprintf(err, errlen, "%s: cannot make the directory: %s", tmp, strerror(errno));
      ok = false;
    }
  }
  if (agree) ok = agree(ctx, ok);
  if (!ok && !err[0]) snprintf(err, errlen, "%s: process 0 could not make the directory of the shards", path);
  char shard[64], name[1024], ename[1200], meta[512], file[PATH_MAX];
  /* every process writes its own shard */
  if (ok) {
    st_writer *sw = st_writer_new();
    char **keep = NULL;
    float **bufs = NULL;
    int nkeep = 0, nbufs = 0, cap = 0, bcap = 0;
    for (int t = 0; t < g->ntensors; t++)
      for (int kind = 0; kind < 2; kind++) {
        const sboxes *l = &h.of[2 * t + kind];
        const gtensor *x = &g->tensors[t];
        int64_t n = tensor_numel(x), shape[ST_MAX_DIMS];
        for (int i = 0; i < l->n; i++) {
          const sbox *b = &l->v[i];
          if (b->proc != rank) continue;
          for (int d = 0; d < x->ndims; d++) shape[d] = b->hi[d] - b->lo[d];
          for (int c = kind ? 0 : -1; c < (kind ? w->state_copies : 0); c++) {
            piece_tensor_name(name, sizeof name, w, t, c);
            piece_entry(ename, sizeof ename, name, x, b);
            float *v = weft_xmalloc((size_t)box_numel(b->lo, b->hi, x->ndims) * sizeof(float));
            box_move(c < 0 ? w->param[t] : w->state[t] + c * n, x, b->lo, b->hi, v, true, NULL);
            if (nbufs == bcap) bcap = bcap ? 2 * bcap : 16, bufs = realloc(bufs, (size_t)bcap * sizeof *bufs);
            if (nkeep == cap) cap = cap ? 2 * cap : 16, keep = realloc(keep, (size_t)cap * sizeof *keep);
            if (!bufs || !keep) weft_oom();
            bufs[nbufs++] = v;
            keep[nkeep++] = xstrdup(ename);
            st_writer_add(sw, ename, ST_F32, x->ndims, shape, v);
            piece_meta(meta, sizeof meta, x, b->lo, b->hi);
            st_writer_meta(sw, ename, meta);
          }
        }
      }
    char buf[64];
    st_writer_meta(sw, "format", "weft-checkpoint-shard");
    st_writer_meta(sw, "model", g->name);
    snprintf(buf, sizeof buf, "%" PRId64, w->step);
    st_writer_meta(sw, "step", buf);
    snprintf(buf, sizeof buf, "%d", rank + 1);
    st_writer_meta(sw, "shard", buf);
    snprintf(buf, sizeof buf, "%d", nprocs);
    st_writer_meta(sw, "shards", buf);
    snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", rank + 1, nprocs);
    snprintf(file, sizeof file, "%s/%s", tmp, shard);
    ok = st_write(sw, file, err, errlen);
    st_writer_free(sw);
    for (int i = 0; i < nbufs; i++) free(bufs[i]);
    for (int i = 0; i < nkeep; i++) free(keep[i]);
    free(bufs), free(keep);
  }
  if (agree) {
    bool mine = ok;
    ok = agree(ctx, ok);
    if (mine && !ok) snprintf(err, errlen, "%s: another process could not write its shard", path);
  }
  /* process 0 writes the index, last, and puts the set in place */
  if (ok && rank == 0) {
    st_index ix = {0};
    int nt = 0, np = 0;
    for (int t = 0; t < g->ntensors; t++)
      for (int kind = 0; kind < 2; kind++) {
        int copies = !w->param[t] ? 0 : kind ? (w->state[t] ? w->state_copies : 0) : 1;
        nt += copies;
        np += copies * h.of[2 * t + kind].n;
      }
    ix.tensors = weft_xcalloc((size_t)(nt + 1) * sizeof *ix.tensors);
    st_piece *pieces = weft_xcalloc((size_t)(np + 1) * sizeof *pieces);
    char **strs = weft_xcalloc((size_t)(nt + np + 1) * sizeof(char *));
    int ns = 0;
    ix.nfiles = nprocs;
    ix.files = weft_xcalloc((size_t)nprocs * sizeof(char *));
    for (int r = 0; r < nprocs; r++) {
      snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", r + 1, nprocs);
      ix.files[r] = strs[ns++] = xstrdup(shard);
    }
    strs = realloc(strs, (size_t)(nt + np + nprocs + 1) * sizeof(char *));
    if (!strs) weft_oom();
    int at = 0;
    for (int t = 0; t < g->ntensors; t++)
      for (int kind = 0; kind < 2; kind++) {
        const sboxes *l = &h.of[2 * t + kind];
        const gtensor *x = &g->tensors[t];
        if (!w->param[t] || (kind && !w->state[t])) continue;
        for (int c = kind ? 0 : -1; c < (kind ? w->state_copies : 0); c++) {
          st_itensor *it = &ix.tensors[ix.ntensors++];
          piece_tensor_name(name, sizeof name, w, t, c);
          it->name = strs[ns++] = xstrdup(name);
          it->ndims = x->ndims;
          for (int d = 0; d < x->ndims; d++) it->shape[d] = x->dims[d].size;
          it->pieces = pieces + at;
          for (int i = 0; i < l->n; i++) {
            st_piece *q = &pieces[at++];
            q->file = l->v[i].proc;
            piece_entry(ename, sizeof ename, name, x, &l->v[i]);
            q->entry = strs[ns++] = xstrdup(ename);
            memcpy(q->start, l->v[i].lo, sizeof q->start);
            memcpy(q->stop, l->v[i].hi, sizeof q->stop);
            ix.total_size += box_numel(l->v[i].lo, l->v[i].hi, x->ndims) * 4;
          }
          it->npieces = l->n;
        }
      }
    const char *keys[WORLD_MAX_META + 8], *vals[WORLD_MAX_META + 8];
    char stepb[32], seedb[32], nb[16];
    snprintf(stepb, sizeof stepb, "%" PRId64, w->step);
    snprintf(seedb, sizeof seedb, "%" PRIu64, seed);
    snprintf(nb, sizeof nb, "%d", nprocs);
    int nm = 0;
    keys[nm] = "format", vals[nm++] = "weft-checkpoint";
    keys[nm] = "model", vals[nm++] = g->name;
    keys[nm] = "optimizer", vals[nm++] = g->optimizer ? g->optimizer : "none";
    keys[nm] = "step", vals[nm++] = stepb;
    keys[nm] = "seed", vals[nm++] = seedb;
    keys[nm] = "shards", vals[nm++] = nb;
    for (int i = 0; i < w->nmeta; i++) keys[nm] = w->meta_key[i], vals[nm++] = w->meta_val[i];
    ix.nmeta = nm;
    ix.meta_key = keys;
    ix.meta_val = vals;
    snprintf(file, sizeof file, "%s/%s", tmp, SHARD_INDEX);
    ok = st_index_write(&ix, file, err, errlen);
    for (int i = 0; i < ns; i++) free(strs[i]);
    free(strs), free(pieces), free(ix.tensors), free(ix.files);
    /* the test hook of st_write (safetensors.h) pauses here too: the set
     * complete beside the previous one, not yet in its place */
    const char *pause = getenv("WEFT_TEST_SAVE_PAUSE");
    long ms = pause ? strtol(pause, NULL, 10) : 0;
    if (ok && ms > 0) {
      struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    }
    /* into place: exchanged with the previous set in one step where the
     * file system can, else the previous set moved aside first */
    char why[512];
    bool exists = false;
    if (ok && !set_dir_ok(dir, &exists, why, sizeof why)) {
      snprintf(err, errlen, "%s: %s", path, why);
      ok = false;
    }
    if (ok && !exists) {
      if (rename(tmp, dir) != 0) {
        snprintf(err, errlen, "%s: cannot rename %s to it: %s", path, tmp, strerror(errno));
        ok = false;
      }
    } else if (ok) {
      if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        ok = set_remove(tmp, err, errlen);
      } else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
        bool stale;
        ok = set_dir_ok(old, &stale, why, sizeof why) && (!stale || set_remove(old, err, errlen));
        if (ok && (rename(dir, old) != 0 || rename(tmp, dir) != 0)) {
          snprintf(err, errlen, "%s: cannot put the new set in place: %s", path, strerror(errno));
          ok = false;
        }
        if (ok) ok = set_remove(old, err, errlen);
      } else {
        snprintf(err, errlen, "%s: cannot put the new set in place: %s", path, strerror(errno));
        ok = false;
      }
    }
    /* the renames reach the disk */
    char *parent = xstrdup(dir), *slash = strrchr(parent, '/');
    if (slash) *(slash == parent ? slash + 1 : slash) = 0;
    int fd = open(slash ? parent : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) fsync(fd), close(fd);
    free(parent);
  }
  if (agree) {
    bool mine = ok;
    ok = agree(ctx, ok);
    if (mine && !ok) snprintf(err, errlen, "%s: process 0 could not complete the set", path);
  }
  holdings_free(&h);
  free(dir), free(tmp), free(old);
  return ok;
}

/* Which tensor of the model an index tensor is: *t the parameter, *c -1 for
 * its values or the state copy. */
static bool index_tensor(const weft_world *w, const char *name, int *t, int *c) {
  const weft_graph *g = w->g;
  *c = -1;
  *t = graph_find(g, name);
  if (*t >= 0) return g->tensors[*t].role == TENSOR_PARAM && w->param[*t];
  if (!is_optim_name(name)) return false;
  for (int k = 0; k < w->state_copies; k++) {
    size_t n = strlen(w->state_names[k]);
    if (strncmp(name + 6, w->state_names[k], n) == 0 && name[6 + n] == '.') {
      *t = graph_find(g, name + 7 + n);
      *c = k;
      return *t >= 0 && g->tensors[*t].role == TENSOR_PARAM && w->state[*t];
    }
  }
  return false;
}

bool world_resume_sharded(weft_world *w, const weft_program *pr, int rank, int nprocs, bool whole, const char *path,
                          uint64_t *seed, char *err, size_t errlen) {
  const weft_graph *g = w->g;
  char *dir = strip_slash(path), ipath[PATH_MAX], fpath[PATH_MAX], name[1024], meta[512];
  snprintf(ipath, sizeof ipath, "%s/%s", dir, SHARD_INDEX);
  st_index *ix = st_index_read(ipath, err, errlen);
  bool ok = ix != NULL;
  meta_src m = {NULL, ix};
  ok = ok && resume_meta(w, ipath, &m, seed, err, errlen);
  /* the shards the index names: model-R-of-N, N as its metadata says */
  const char *ns = ok ? st_index_meta(ix, "shards") : NULL;
  uint64_t nshards = 0;
  if (ok && (!ns || !decimal(ns, SHARD_MAX_PROCS, &nshards) || nshards == 0)) {
    snprintf(err, errlen, "%s: shards \"%.40s\" in its metadata is not a count of shards (1 to %d)", ipath, ns ? ns : "",
             SHARD_MAX_PROCS);
    ok = false;
  }
  int *file_no = ok ? weft_xcalloc((size_t)ix->nfiles * sizeof(int) + 1) : NULL;
  for (int f = 0; ok && f < ix->nfiles; f++) {
    int r, of;
    st_shard_name_ok(ix->files[f], &r, &of);
    file_no[f] = r;
    if ((uint64_t)of != nshards) {
      snprintf(err, errlen, "%s: it names %s, but its metadata says %" PRIu64 " shards", ipath, ix->files[f], nshards);
      ok = false;
    }
  }
  /* every tensor the model's, of its shape; every parameter and state
   * there, each element in some piece */
  int *tk = ok ? weft_xcalloc((size_t)(ix->ntensors + 1) * sizeof(int) * 2) : NULL;
  for (int i = 0; ok && i < ix->ntensors; i++) {
    const st_itensor *it = &ix->tensors[i];
    int t, c;
    if (!index_tensor(w, it->name, &t, &c)) {
      snprintf(err, errlen, "%s: tensor %.200s is not a parameter of model %s or its optimizer state", ipath, it->name,
               g->name);
      ok = false;
      break;
    }
    tk[2 * i] = t, tk[2 * i + 1] = c;
    const gtensor *x = &g->tensors[t];
    bool same = it->ndims == x->ndims;
    for (int d = 0; same && d < x->ndims; d++) same = it->shape[d] == x->dims[d].size;
    if (!same) {
      char a[128], b[128];
      snprintf(err, errlen, "%s: tensor %s has shape %s; the model needs %s", ipath, it->name,
               shape_str(a, sizeof a, it->ndims, it->shape), gshape_str(b, sizeof b, x));
      ok = false;
      break;
    }
    int64_t n = tensor_numel(x);
    unsigned char *mask = weft_xcalloc((size_t)n);
    for (int k = 0; k < it->npieces; k++) box_move(NULL, x, it->pieces[k].start, it->pieces[k].stop, NULL, false, mask);
    int64_t e = 0;
    while (e < n && mask[e]) e++;
    free(mask);
    if (e < n) {
      snprintf(err, errlen, "%s: element %" PRId64 " of tensor %s lies in none of its pieces", ipath, e, it->name);
      ok = false;
    }
  }
  for (int t = 0; ok && t < g->ntensors; t++)
    for (int c = -1; ok && w->param[t] && c < (w->state[t] ? w->state_copies : 0); c++) {
      piece_tensor_name(name, sizeof name, w, t, c);
      bool there = false;
      for (int i = 0; i < ix->ntensors && !there; i++) there = tk[2 * i] == t && tk[2 * i + 1] == c;
      if (!there) {
        snprintf(err, errlen, "%s: no tensor %s (%s %s)", ipath, name, c < 0 ? "the model's parameter" : "optimizer state of",
                 g->tensors[t].name);
        ok = false;
      }
    }
  /* what this process needs: what its devices hold under this plan (and,
   * for process 0, what no device holds), or everything */
  holdings h = {0};
  if (ok && !whole) ok = holdings_of(w, pr, nprocs, false, &h, err, errlen);
  int total = 0;
  for (int i = 0; ok && i < ix->ntensors; i++) total += ix->tensors[i].npieces;
  bool *need = ok ? weft_xcalloc((size_t)total + 1) : NULL;
  for (int i = 0, at = 0; ok && i < ix->ntensors; i++) {
    const st_itensor *it = &ix->tensors[i];
    const sboxes *l = whole ? NULL : &h.of[2 * tk[2 * i] + (tk[2 * i + 1] >= 0)];
    for (int k = 0; k < it->npieces; k++, at++) {
      need[at] = whole;
      for (int b = 0; l && b < l->n && !need[at]; b++)
        need[at] = l->v[b].proc == rank && box_meets(it->pieces[k].start, it->pieces[k].stop, l->v[b].lo, l->v[b].hi, it->ndims);
    }
  }
  /* shard by shard, the pieces needed */
  for (int f = 0; ok && f < ix->nfiles; f++) {
    bool any = false;
    for (int i = 0, at = 0; i < ix->ntensors && !any; i++)
      for (int k = 0; k < ix->tensors[i].npieces; k++, at++) any |= need[at] && ix->tensors[i].pieces[k].file == f;
    if (!any) continue;
    snprintf(fpath, sizeof fpath, "%s/%s", dir, ix->files[f]);
    st_file *sf = st_open(fpath, err, errlen);
    if (!sf) {
      ok = false;
      break;
    }
    const char *fmt = st_meta(sf, "format"), *step = st_meta(sf, "step"), *sh = st_meta(sf, "shard"), *of = st_meta(sf, "shards");
    char want[32];
    snprintf(want, sizeof want, "%" PRId64, w->step);
    char wr[16], wn[16];
    snprintf(wr, sizeof wr, "%d", file_no[f]);
    snprintf(wn, sizeof wn, "%" PRIu64, nshards);
    if (!fmt || strcmp(fmt, "weft-checkpoint-shard") != 0 || !step || !sh || !of) {
      snprintf(err, errlen, "%s: not a shard of weft run (its metadata lacks format, step, shard and shards)", fpath);
      ok = false;
    } else if (strcmp(step, want) != 0 || strcmp(sh, wr) != 0 || strcmp(of, wn) != 0) {
      snprintf(err, errlen, "%s: shard %.20s of %.20s at step %.40s, but the index wants shard %s of %s at step %s: a file "
               "of another save", fpath, sh, of, step, wr, wn, want);
      ok = false;
    }
    for (int i = 0, at = 0; ok && i < ix->ntensors; i++) {
      const st_itensor *it = &ix->tensors[i];
      int t = tk[2 * i], c = tk[2 * i + 1];
      const gtensor *x = &g->tensors[t];
      int64_t n = tensor_numel(x);
      for (int k = 0; ok && k < it->npieces; k++, at++) {
        const st_piece *q = &it->pieces[k];
        if (!need[at] || q->file != f) continue;
        const st_tensor *s = st_find(sf, q->entry);
        if (!s) {
          snprintf(err, errlen, "%s: no tensor %.200s (a piece of %s, says the index)", fpath, q->entry, it->name);
          ok = false;
          break;
        }
        int64_t shape[ST_MAX_DIMS];
        for (int d = 0; d < it->ndims; d++) shape[d] = q->stop[d] - q->start[d];
        bool same = s->ndims == it->ndims;
        for (int d = 0; same && d < it->ndims; d++) same = s->shape[d] == shape[d];
        piece_meta(meta, sizeof meta, x, q->start, q->stop);
        const char *says = st_meta(sf, q->entry);
        if (!same || !says || strcmp(says, meta) != 0) {
          char a[128];
          snprintf(err, errlen, "%s: tensor %.200s has shape %s, %s %.120s; the index gives the piece %s", fpath, q->entry,
                   shape_str(a, sizeof a, s->ndims, s->shape), says ? "its metadata" : "no metadata", says ? says : "",
                   meta);
          ok = false;
          break;
        }
        float *v = weft_xmalloc((size_t)box_numel(q->start, q->stop, it->ndims) * sizeof(float));
        char e2[256];
        ok = st_read_f32(sf, s, v, e2, sizeof e2);
        if (!ok) snprintf(err, errlen, "%s: tensor %s: %s", fpath, q->entry, e2);
        ok = ok && check_values(w, fpath, q->entry, v, st_numel(s), c >= 0 && strcmp(w->state_names[c], "exp_avg_sq") == 0,
                                err, errlen);
        if (ok) box_move(c < 0 ? w->param[t] : w->state[t] + c * n, x, q->start, q->stop, v, false, NULL);
        free(v);
      }
    }
    st_close(sf);
  }
  free(need), free(tk), free(file_no);
  holdings_free(&h);
  st_index_free(ix);
  free(dir);
  return ok;
}
