/* backends.c - weft backends: the backends of this build and the plugins
 * weft knows, whether each can run here, and (--kernels) what each runs. */
#include "common.h"

typedef struct entry {
  const char *name;
  const weft_backend *b;  /* NULL: a plugin that did not load */
  bool plugin;
  char origin[1024];      /* the plugin's file */
  char status[1024];      /* probe's answer, or why the plugin is absent */
  bool ready;
} entry;

static void fill(entry *e) {
  if (!e->b) return;
  e->name = e->b->name;
  backend_origin(e->b, e->origin, sizeof e->origin);
  e->ready = true;
  e->status[0] = 0;
  if (e->b->probe) e->ready = e->b->probe(e->status, sizeof e->status);
}

int report_backends(const weft_opts *o) {
  int nb, np;
  const weft_backend *const *built = backend_builtin(&nb);
  const char *const *plugins = backend_plugins(&np);
  entry *all = calloc((size_t)(nb + np), sizeof *all);
  if (!all) weft_oom();
  int n = 0;
  for (int i = 0; i < nb; i++) {
    all[n].b = built[i];
    fill(&all[n++]);
  }
  for (int i = 0; i < np; i++) {
    entry *e = &all[n++];
    e->name = plugins[i];
    e->plugin = true;
    e->b = backend_find(plugins[i], e->status, sizeof e->status);
    fill(e);
  }
  if (o->json) {
    json j;
    json_init(&j, stdout);
    json_obj(&j);
    json_key(&j, "backends");
    json_arr(&j);
    for (int i = 0; i < n; i++) {
      entry *e = &all[i];
      json_obj(&j);
      json_key(&j, "name"), json_str(&j, e->name);
      json_key(&j, "kind"), json_str(&j, e->plugin ? "plugin" : "built-in");
      json_key(&j, "loaded"), json_bool(&j, e->b != NULL);
      if (e->origin[0]) json_key(&j, "path"), json_str(&j, e->origin);
      if (e->b) json_key(&j, "summary"), json_str(&j, e->b->summary);
      json_key(&j, "ready"), json_bool(&j, e->b && e->ready);
      if (e->status[0]) json_key(&j, "status"), json_str(&j, e->status);
      if (o->kernels && e->b && e->b->kernels) {
        json_key(&j, "kernels");
        json_arr(&j);
        for (const char *const *k = e->b->kernels; *k; k++) json_str(&j, *k);
        json_end_arr(&j);
      }
      json_end_obj(&j);
    }
    json_end_arr(&j);
    json_end_obj(&j);
    printf("\n");
  } else {
    for (int i = 0; i < n; i++) {
      entry *e = &all[i];
      printf("%-6s %-8s %s\n", e->name, e->plugin ? "plugin" : "built in", e->b ? e->b->summary : "not loaded");
      if (e->origin[0]) printf("       loaded from %s\n", e->origin);
      if (e->status[0]) printf("       %s: %s\n", e->b && e->ready ? "runs on" : "cannot run", e->status);
      if (o->kernels && e->b && e->b->kernels) {
        printf("       kernels:\n");
        for (const char *const *k = e->b->kernels; *k; k++) printf("         %s\n", *k);
      }
    }
  }
  free(all);
  return WEFT_OK;
}
