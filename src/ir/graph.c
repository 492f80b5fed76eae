/* graph.c - the operator graph: tensors, operators, the name table, and the
 * text, JSON and Graphviz views `weft graph` prints. */
#include "weft/graph.h"

#include <inttypes.h>
#include <string.h>

#include "base/json.h"

weft_graph *graph_new(arena *a, const char *name) {
  weft_graph *g = arena_alloc(a, sizeof *g);
  g->name = name;
  g->loss = -1;
  g->output = -1;
  g->grad_dtype = -1;
  g->master = -1;
  return g;
}

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void hash_insert(arena *a, weft_graph *g, const char *key, int val) {
  if ((g->hcount + 1) * 2 > g->hcap) {
    int ncap = g->hcap ? g->hcap * 2 : 64;
    const char **nk = arena_alloc(a, sizeof(char *) * (size_t)ncap);
    int *nv = arena_alloc(a, sizeof(int) * (size_t)ncap);
    for (int i = 0; i < g->hcap; i++) {
      if (!g->hkeys[i]) continue;
      uint64_t h = hash_str(g->hkeys[i]) & (uint64_t)(ncap - 1);
      while (nk[h]) h = (h + 1) & (uint64_t)(ncap - 1);
      nk[h] = g->hkeys[i];
      nv[h] = g->hvals[i];
    }
    g->hkeys = nk;
    g->hvals = nv;
    g->hcap = ncap;
  }
  uint64_t h = hash_str(key) & (uint64_t)(g->hcap - 1);
  while (g->hkeys[h]) h = (h + 1) & (uint64_t)(g->hcap - 1);
  g->hkeys[h] = key;
  g->hvals[h] = val;
  g->hcount++;
}

int graph_find(const weft_graph *g, const char *name) {
  if (!g->hcap) return -1;
  uint64_t h = hash_str(name) & (uint64_t)(g->hcap - 1);
  while (g->hkeys[h]) {
    if (strcmp(g->hkeys[h], name) == 0) return g->hvals[h];
    h = (h + 1) & (uint64_t)(g->hcap - 1);
  }
  return -1;
}

int graph_add_tensor(arena *a, weft_graph *g, const char *name, tensor_role role, weft_dtype dt,
                     int ndims, const gdim *dims, weft_loc loc) {
  if (graph_find(g, name) >= 0) return -1;
  arena_grow(a, (void **)&g->tensors, &g->tcap, g->ntensors + 1, sizeof(gtensor));
  int id = g->ntensors++;
  gtensor *t = &g->tensors[id];
  t->name = name;
  t->role = role;
  t->dtype = dt;
  t->ndims = ndims;
  t->dims = arena_alloc(a, sizeof(gdim) * (size_t)(ndims ? ndims : 1));
  if (ndims) memcpy(t->dims, dims, sizeof(gdim) * (size_t)ndims);
  t->producer = -1;
  t->loc = loc;
  hash_insert(a, g, name, id);
  return id;
}

bool graph_alias(arena *a, weft_graph *g, const char *name, int tensor) {
  if (graph_find(g, name) >= 0) return false;
  hash_insert(a, g, name, tensor);
  return true;
}

int gop_add(arena *a, weft_graph *g) {
  arena_grow(a, (void **)&g->ops, &g->ocap, g->nops + 1, sizeof(gop));
  memset(&g->ops[g->nops], 0, sizeof(gop));
  return g->nops++;
}

int64_t tensor_numel(const gtensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndims; i++) n *= t->dims[i].size;
  return n;
}

int64_t graph_param_count(const weft_graph *g) {
  int64_t n = 0;
  for (int i = 0; i < g->ntensors; i++)
    if (g->tensors[i].role == TENSOR_PARAM) n += tensor_numel(&g->tensors[i]);
  return n;
}

int64_t graph_param_bytes(const weft_graph *g) {
  int64_t n = 0;
  for (int i = 0; i < g->ntensors; i++)
    if (g->tensors[i].role == TENSOR_PARAM) n += tensor_numel(&g->tensors[i]) * dtype_bytes[g->tensors[i].dtype];
  return n;
}

weft_dtype graph_grad_dtype(const weft_graph *g, int t) {
  if (g->grad_dtype >= 0) return (weft_dtype)g->grad_dtype;
  weft_dtype d = g->tensors[t].dtype;
  return d == DT_BF16 ? DT_F32 : d;
}

bool graph_has_master(const weft_graph *g, int t) {
  return g->master != 0 && dtype_is_float(g->tensors[t].dtype) && dtype_bytes[g->tensors[t].dtype] < 4;
}

int graph_master_copies(const weft_graph *g, int t) {
  if (!graph_has_master(g, t)) return 0;
  return dtype_bytes[graph_grad_dtype(g, t)] < dtype_bytes[DT_F32] ? 2 : 1;
}

int graph_train_bytes(const weft_graph *g, int t) {
  int b = dtype_bytes[g->tensors[t].dtype];
  if (!g->optimizer) return b;
  return b + dtype_bytes[graph_grad_dtype(g, t)] + dtype_bytes[DT_F32] * (graph_master_copies(g, t) + g->optimizer_state);
}

double graph_forward_flops(const weft_graph *g) {
  double f = 0;
  for (int i = 0; i < g->nops; i++) f += g->ops[i].flops;
  return f;
}

const char *tensor_type_str(arena *a, const gtensor *t) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "%s[", dtype_names[t->dtype]);
  for (int i = 0; i < t->ndims && n < (int)sizeof buf - 64; i++) {
    if (t->dims[i].name)
      n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%s=%" PRId64, i ? ", " : "", t->dims[i].name, t->dims[i].size);
    else
      n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%" PRId64, i ? ", " : "", t->dims[i].size);
  }
  snprintf(buf + n, sizeof buf - (size_t)n, "]");
  return arena_strdup(a, buf);
}

/* 124439808 -> "124,439,808" */
static const char *grouped(char *buf, int64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%" PRId64, v < 0 ? -v : v);
  int o = 0;
  if (v < 0) buf[o++] = '-';
  for (int i = 0; i < n; i++) {
    buf[o++] = tmp[i];
    if ((n - i - 1) % 3 == 0 && i != n - 1) buf[o++] = ',';
  }
  buf[o] = 0;
  return buf;
}

static const char *human_flops(char *buf, double f) {
  const char *u[] = {"", "K", "M", "G", "T", "P", "E"};
  int k = 0;
  while (f >= 1000 && k < 6) { f /= 1000; k++; }
  snprintf(buf, 32, k ? "%.3g %sFLOP" : "%.0f FLOP", f, u[k]);
  return buf;
}

static const char *shape_str(char *buf, size_t n, const gtensor *t) {
  int o = snprintf(buf, n, "%s[", dtype_names[t->dtype]);
  for (int i = 0; i < t->ndims && o < (int)n - 24; i++)
    o += snprintf(buf + o, n - (size_t)o, "%s%" PRId64, i ? ", " : "", t->dims[i].size);
  snprintf(buf + o, n - (size_t)o, "]");
  return buf;
}

void graph_print_text(const weft_graph *g, FILE *out) {
  char b1[64], b2[64], sh[256];
  int wname = 8, wop = 2, wshape = 6;  /* at least the headers */
  for (int i = 0; i < g->ntensors; i++) {
    int l = (int)strlen(g->tensors[i].name);
    if (l > wname) wname = l;
    int s = (int)strlen(shape_str(sh, sizeof sh, &g->tensors[i]));
    if (s > wshape) wshape = s;
  }
  for (int i = 0; i < g->nops; i++) {
    int l = (int)strlen(g->ops[i].decl->name);
    if (l > wop) wop = l;
  }
  if (wname > 60) wname = 60;
  fprintf(out, "model %s\n\n", g->name);
  fprintf(out, "%-*s  %-*s  %s\n", wname, "name", wshape, "shape", "kind");
  for (int i = 0; i < g->ntensors; i++) {
    const gtensor *t = &g->tensors[i];
    if (t->role == TENSOR_ACT) continue;
    fprintf(out, "%-*s  %-*s  %s\n", wname, t->name, wshape, shape_str(sh, sizeof sh, t),
            t->role == TENSOR_INPUT ? "input" : "param");
  }
  fprintf(out, "\n%-*s  %-*s  %-*s  %s\n", wname, "operator", wop, "op", wshape, "result", "flops");
  for (int i = 0; i < g->nops; i++) {
    const gop *o = &g->ops[i];
    fprintf(out, "%-*s  %-*s  %-*s  %s\n", wname, o->name, wop, o->decl->name, wshape,
            shape_str(sh, sizeof sh, &g->tensors[o->output]), human_flops(b1, o->flops));
  }
  int64_t np = graph_param_count(g);
  fprintf(out, "\n%d operator%s, %s parameters (%s bytes), forward %s per step\n", g->nops, g->nops == 1 ? "" : "s", grouped(b1, np),
          grouped(b2, graph_param_bytes(g)), human_flops(sh, graph_forward_flops(g)));
  if (g->loss >= 0) fprintf(out, "loss %s, optimizer %s\n", g->tensors[g->loss].name, g->optimizer);
}

static void json_tensor(json *j, const gtensor *t) {
  json_obj(j);
  json_key(j, "name");
  json_str(j, t->name);
  json_key(j, "dtype");
  json_str(j, dtype_names[t->dtype]);
  json_key(j, "shape");
  json_arr(j);
  for (int i = 0; i < t->ndims; i++) json_int(j, t->dims[i].size);
  json_end_arr(j);
  json_key(j, "dims");
  json_arr(j);
  for (int i = 0; i < t->ndims; i++) json_str(j, t->dims[i].name);
  json_end_arr(j);
  json_end_obj(j);
}

static void json_value(json *j, value v) {
  switch (v.kind) {
  case V_INT: json_int(j, v.i); break;
  case V_FLOAT: json_num(j, v.f); break;
  case V_BOOL: json_bool(j, v.i != 0); break;
  case V_STRING: json_str(j, v.s); break;
  case V_QUANTITY: json_num(j, v.q.v); break;
  default: json_null(j);
  }
}

void graph_print_json(const weft_graph *g, FILE *out) {
  json j;
  json_init(&j, out);
  json_obj(&j);
  json_key(&j, "model");
  json_str(&j, g->name);
  json_key(&j, "parameters");
  json_int(&j, graph_param_count(g));
  json_key(&j, "parameter_bytes");
  json_int(&j, graph_param_bytes(g));
  json_key(&j, "forward_flops");
  json_num(&j, graph_forward_flops(g));
  json_key(&j, "inputs");
  json_arr(&j);
  for (int i = 0; i < g->ntensors; i++)
    if (g->tensors[i].role == TENSOR_INPUT) json_tensor(&j, &g->tensors[i]);
  json_end_arr(&j);
  json_key(&j, "params");
  json_arr(&j);
  for (int i = 0; i < g->ntensors; i++)
    if (g->tensors[i].role == TENSOR_PARAM) json_tensor(&j, &g->tensors[i]);
  json_end_arr(&j);
  json_key(&j, "ops");
  json_arr(&j);
  for (int i = 0; i < g->nops; i++) {
    const gop *o = &g->ops[i];
    json_obj(&j);
    json_key(&j, "name");
    json_str(&j, o->name);
    json_key(&j, "op");
    json_str(&j, o->decl->name);
    if (o->kind) { json_key(&j, "kind"); json_str(&j, o->kind); }
    json_key(&j, "inputs");
    json_arr(&j);
    for (int k = 0; k < o->ninputs; k++) json_str(&j, g->tensors[o->inputs[k]].name);
    json_end_arr(&j);
    json_key(&j, "output");
    json_tensor(&j, &g->tensors[o->output]);
    json_key(&j, "attrs");
    json_obj(&j);
    for (int k = 0; o->attrs && k < o->attrs->n; k++) {
      json_key(&j, o->attrs->keys[k]);
      json_value(&j, o->attrs->vals[k]);
    }
    json_end_obj(&j);
    json_key(&j, "dims");
    json_obj(&j);
    for (int k = 0; k < o->nbinds; k++) {
      json_key(&j, o->binds[k].name);
      if (o->binds[k].n == 1) json_int(&j, o->binds[k].sizes[0]);
      else {
        json_arr(&j);
        for (int q = 0; q < o->binds[k].n; q++) json_int(&j, o->binds[k].sizes[q]);
        json_end_arr(&j);
      }
    }
    json_end_obj(&j);
    json_key(&j, "flops");
    json_num(&j, o->flops);
    json_key(&j, "bytes");
    json_num(&j, o->bytes);
    json_end_obj(&j);
  }
  json_end_arr(&j);
  json_key(&j, "loss");
  if (g->loss >= 0) json_str(&j, g->tensors[g->loss].name); else json_null(&j);
  json_key(&j, "optimizer");
  if (g->optimizer) {
    json_obj(&j);
    json_key(&j, "name");
    json_str(&j, g->optimizer);
    for (int k = 0; g->optimizer_args && k < g->optimizer_args->n; k++) {
      json_key(&j, g->optimizer_args->keys[k]);
      json_value(&j, g->optimizer_args->vals[k]);
    }
    json_end_obj(&j);
  } else {
    json_null(&j);
  }
  json_end_obj(&j);
}

static void dot_id(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', out);
    fputc(*s, out);
  }
  fputc('"', out);
}

void graph_print_dot(const weft_graph *g, FILE *out) {
  char sh[256];
  fprintf(out, "digraph ");
  dot_id(out, g->name);
  fprintf(out, " {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n");
  for (int i = 0; i < g->ntensors; i++) {
    const gtensor *t = &g->tensors[i];
    if (t->role == TENSOR_ACT) continue;
    fputs("  ", out);
    dot_id(out, t->name);
    fprintf(out, " [shape=%s, label=\"%s\\n%s\"];\n", t->role == TENSOR_INPUT ? "ellipse" : "note", t->name,
            shape_str(sh, sizeof sh, t));
  }
  for (int i = 0; i < g->nops; i++) {
    const gop *o = &g->ops[i];
    fputs("  ", out);
    dot_id(out, o->name);
    fprintf(out, " [shape=box, style=filled, fillcolor=\"#dde8f5\", label=\"%s\\n%s %s\"];\n", o->name, o->decl->name,
            shape_str(sh, sizeof sh, &g->tensors[o->output]));
    for (int k = 0; k < o->ninputs; k++) {
      const gtensor *in = &g->tensors[o->inputs[k]];
      fputs("  ", out);
      dot_id(out, in->producer >= 0 ? g->ops[in->producer].name : in->name);
      fputs(" -> ", out);
      dot_id(out, o->name);
      fputs(";\n", out);
    }
  }
  fputs("}\n", out);
}

bool graph_glob_match(const char *const *pat, int np, const char *name) {
  if (np == 0) return *name == 0;
  if (strcmp(pat[0], "**") == 0) {
    if (graph_glob_match(pat + 1, np - 1, name)) return true;
    for (const char *s = name; *s; s++)
      if (*s == '.' && graph_glob_match(pat, np, s + 1)) return true;
    return *name && graph_glob_match(pat + 1, np - 1, "");
  }
  const char *dot = strchr(name, '.');
  size_t len = dot ? (size_t)(dot - name) : strlen(name);
  if (*name == 0) return false;
  if (strcmp(pat[0], "*") != 0 && (strlen(pat[0]) != len || strncmp(pat[0], name, len) != 0)) return false;
  return graph_glob_match(pat + 1, np - 1, dot ? dot + 1 : name + len);
}
