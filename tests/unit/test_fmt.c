/* test_fmt.c - the canonical printer (src/front/fmt.c): exact output for a set
 * of inputs, comments kept and aligned, and for every input the properties
 * fmt(fmt(x)) == fmt(x), parse(fmt(x)) == parse(x) and same comments.
 * Also checks the sample pairs tests/fmt/NAME.plan -> NAME.expected (run from
 * the repository root, as `make unit` does). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft/ast.h"

typedef struct ft {
  arena ar;
  weft_srcs srcs;
  weft_diags diags;
} ft;

static ft *ft_new(void) {
  ft *p = calloc(1, sizeof *p);
  arena_init(&p->ar);
  p->diags.arena = &p->ar;
  p->diags.srcs = &p->srcs;
  return p;
}

static void ft_free(ft *p) {
  arena_free(&p->ar);
  free(p);
}

static ast *parse(ft *p, const char *text, size_t len) {
  int f = src_add(&p->srcs, &p->ar, "t.plan", "", text, len);
  weft_parse_opts o = { &p->ar, &p->srcs, &p->diags };
  ast *t = weft_parse(&o, f);
  if (!t) {
    for (int i = 0; i < p->diags.n; i++)
      fprintf(stderr, "  %d:%d: %s\n", p->diags.items[i].loc.line, p->diags.items[i].loc.col,
              p->diags.items[i].msg);
    fail_msg("did not parse:\n%.*s", (int)len, text);
  }
  return t;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void check_same_comments(const ast *x, const ast *y) {
  assert_int_equal(x->list2.n, y->list2.n);
  int n = x->list2.n;
  if (!n) return;
  const char **a = calloc((size_t)n * 2, sizeof *a);
  for (int i = 0; i < n; i++) {
    a[i] = x->list2.items[i]->text;
    a[n + i] = y->list2.items[i]->text;
  }
  qsort(a, (size_t)n, sizeof *a, cmp_str);
  qsort(a + n, (size_t)n, sizeof *a, cmp_str);
  for (int i = 0; i < n; i++) assert_string_equal(a[i], a[n + i]);
  free(a);
}

/* fmt of text, after checking the three properties on it. */
static char *fmt_checked(const char *text, size_t len) {
  ft *p = ft_new();
  ast *t1 = parse(p, text, len);
  size_t n1;
  char *o1 = weft_fmt_string(t1, &p->srcs.items[0], &n1);
  ast *t2 = parse(p, o1, n1);
  if (!ast_equal(t1, t2)) fail_msg("parse(fmt(x)) != parse(x) for:\n%s\nfmt:\n%s", text, o1);
  check_same_comments(t1, t2);
  size_t n2;
  char *o2 = weft_fmt_string(t2, &p->srcs.items[1], &n2);
  if (strcmp(o1, o2) != 0) fail_msg("not idempotent:\n--- fmt(x)\n%s--- fmt(fmt(x))\n%s", o1, o2);
  free(o2);
  ft_free(p);
  return o1;
}

static void expect_fmt(const char *in, const char *want) {
  char *got = fmt_checked(in, strlen(in));
  if (strcmp(got, want) != 0) fail_msg("fmt of:\n%s\n--- got\n%s--- want\n%s", in, got, want);
  free(got);
}

/* ---- layout --------------------------------------------------------------------- */

static void test_spacing(void **state) {
  (void)state;
  expect_fmt("", "");
  expect_fmt("\n\n  \n", "");
  expect_fmt("x=1", "x = 1\n");
  expect_fmt("let a=b+c*-d//e%f", "let a = b + c * -d // e % f\n");
  expect_fmt("let r=0 .. n", "let r = 0..n\n");
  expect_fmt("let x=f(a,k=v,)", "let x = f(a, k = v)\n");
  expect_fmt("let x=[a,b,]", "let x = [a, b]\n");
  expect_fmt("let x={a=1,b=2}", "let x = { a = 1, b = 2 }\n");
  expect_fmt("let x={}", "let x = {}\n");
  expect_fmt("let x=not a and b or c", "let x = not a and b or c\n");
  expect_fmt("let x=if a then b else c", "let x = if a then b else c\n");
  expect_fmt("let x=( a )", "let x = (a)\n");
  expect_fmt("let x=- - a", "let x = - -a\n");
  expect_fmt("let x=a==b", "let x = a == b\n");
  expect_fmt("let x=a!=b", "let x = a != b\n");
  expect_fmt("let x=a<=b", "let x = a <= b\n");
  expect_fmt("let x=h . { i } . attn . 3", "let x = h.{i}.attn.3\n");
  expect_fmt("let x=xs [ 0 ]", "let x = xs[0]\n");
  expect_fmt("let x=true", "let x = true\n");
  expect_fmt("input x:f32[a,b]", "input x : f32[a, b]\n");
  expect_fmt("param w:[]", "param w : []\n");
  expect_fmt("param ln.weight :[ h ]", "param ln.weight : [h]\n");
  expect_fmt("param n=3", "param n = 3\n");
  expect_fmt("fn f(a,b=2)=a", "fn f(a, b = 2) = a\n");
  expect_fmt("use std", "use std\n");
  expect_fmt("use \"a.plan\"", "use \"a.plan\"\n");
  expect_fmt("output  o", "output o\n");
  expect_fmt("train sgd( lr=0.1 )", "train sgd(lr = 0.1)\n");
  expect_fmt("assert x>0,\"bad\"", "assert x > 0, \"bad\"\n");
  expect_fmt("model g=gpt(a=1)", "model g = gpt(a = 1)\n");
}

static void test_literals(void **state) {
  (void)state;
  expect_fmt("let a=1_000", "let a = 1_000\n");
  expect_fmt("let a=2.5e3", "let a = 2.5e3\n");
  expect_fmt("let a=80GiB", "let a = 80 GiB\n");
  expect_fmt("let a=25   Gb/s", "let a = 25 Gb/s\n");
  expect_fmt("let a=1e-5\tTFLOP/s", "let a = 1e-5 TFLOP/s\n");
  expect_fmt("let s=\"a\\tb\\n\\\"c\\\"\\\\ \\{x\\}\"", "let s = \"a\\tb\\n\\\"c\\\"\\\\ \\{x\\}\"\n");
  expect_fmt("let s=\"x{ a+1 }y{ \"z{b}\" }\"", "let s = \"x{a + 1}y{\"z{b}\"}\"\n");
  expect_fmt("let s=\"t\tab\"", "let s = \"t\\tab\"\n");   /* a raw tab comes back escaped */
  /* "1 .2" is a member of an integer, not the float 1.2 */
  expect_fmt("let s=1 .2", "let s = 1 .2\n");
}

static void test_blocks(void **state) {
  (void)state;
  expect_fmt("model m{}", "model m {}\n");
  expect_fmt("model m(){}", "model m() {}\n");
  expect_fmt("model m(a=1,b){x=1;y=2}", "model m(a = 1, b) {\n  x = 1\n  y = 2\n}\n");
  /* link and device entries written on one line stay on one line */
  expect_fmt("cluster c{device{name=\"x\"}link l{a=1;b=2}}",
             "cluster c {\n  device { name = \"x\" }\n  link l { a = 1, b = 2 }\n}\n");
  expect_fmt("link l {\n  a = 1, b = 2 }\n", "link l {\n  a = 1\n  b = 2\n}\n");
  expect_fmt("link l { a = 1 # c\n}\n", "link l {\n  a = 1  # c\n}\n");
  expect_fmt("link l { a = 1, assert x }\n", "link l {\n  a = 1\n  assert x\n}\n");
  expect_fmt("link l { a = 1 }  # c\n", "link l { a = 1 }  # c\n");
  expect_fmt("op f(a:[m,k+],b:i32[b..,s^,(3 n^ dh)],eps=1e-5,n)->[m]{flops=1}",
             "op f(a: [m, k+], b: i32[b.., s^, (3 n^ dh)], eps = 1e-5, n) -> [m] {\n  flops = 1\n}\n");
  expect_fmt("op f(x:[(2 s)])->[]{}", "op f(x: [(2 s)]) -> [] {}\n");
  expect_fmt("for i in 0..n{block h.{i}{w=1}}",
             "for i in 0..n {\n  block h.{i} {\n    w = 1\n  }\n}\n");
  expect_fmt("if a{x=1}else{x=2}", "if a {\n  x = 1\n} else {\n  x = 2\n}\n");
  expect_fmt("if a{x=1}else if b{x=2}else{x=3}",
             "if a {\n  x = 1\n} else if b {\n  x = 2\n} else {\n  x = 3\n}\n");
  expect_fmt("if a{}else{x=2}", "if a {} else {\n  x = 2\n}\n");
  expect_fmt("if a{x=1}else{}", "if a {\n  x = 1\n}\n");
  expect_fmt("if a{}", "if a {}\n");
}

static void test_blank_lines(void **state) {
  (void)state;
  expect_fmt("\n\nx = 1\n\n\n\ny = 2\nz = 3\n\n\n", "x = 1\n\ny = 2\nz = 3\n");
  expect_fmt("model m {\n\n\n  x = 1\n\n\n  y = 2\n\n}\n", "model m {\n  x = 1\n\n  y = 2\n}\n");
  expect_fmt("x = 1\n\n# c\ny = 2\n", "x = 1\n\n# c\ny = 2\n");
}

/* ---- plans --------------------------------------------------------------------------- */

static void test_plans(void **state) {
  (void)state;
  expect_fmt("plan tp2(dp=2)for mlp on cpus(4){}", "plan tp2(dp = 2) for mlp on cpus(4) {}\n");
  expect_fmt("plan p for m on c{x=1}", "plan p for m on c {\n  x = 1\n}\n");
  expect_fmt("plan p()for m on c{}", "plan p() for m on c {}\n");
  expect_fmt("strategy s(n,a=1){split all on batch into n}",
             "strategy s(n, a = 1) {\n  split all on batch into n\n}\n");
  expect_fmt("strategy s{}", "strategy s {}\n");
  expect_fmt("mesh m=devices as[dp=2,tp=2]", "mesh m = devices as [dp = 2, tp = 2]\n");
  expect_fmt("mesh m=devices[0..8]as[]", "mesh m = devices[0..8] as []\n");
  expect_fmt("split{h,a}on hidden into tp as tp", "split {h, a} on hidden into tp as tp\n");
  expect_fmt("split {h} on hidden into tp", "split h on hidden into tp\n");
  expect_fmt("split all on batch into 4 as mb in time", "split all on batch into 4 as mb in time\n");
  expect_fmt("split x on k into 2*n in time", "split x on k into 2 * n in time\n");
  expect_fmt("replicate loss into tp", "replicate loss into tp\n");
  expect_fmt("replicate{a,b,}into 2 as r", "replicate {a, b} into 2 as r\n");
  expect_fmt("assign s0->m[0],s1->m[1]", "assign s0 -> m[0], s1 -> m[1]\n");
  expect_fmt("assign all->m[dp,tp,]", "assign all -> m[dp, tp]\n");
  expect_fmt("stage s0=h[0..6],s1=h[6..12]", "stage s0 = h[0..6], s1 = h[6..12]\n");
  expect_fmt("order a before b", "order a before b\n");
  expect_fmt("order{a,b}before h . ** . c", "order {a, b} before h.**.c\n");
  expect_fmt("recompute h.*   selective", "recompute h.* selective\n");
  expect_fmt("recompute * . mlp full", "recompute *.mlp full\n");
  expect_fmt("recompute {h . { i } . attn, h[ 0 .. 2 ]}", "recompute {h.{i}.attn, h[0..2]}\n");
  expect_fmt("data_parallel( dp,k=2 )", "data_parallel(dp, k = 2)\n");
  expect_fmt("let x=m[ 0 , 1 ]", "let x = m[0, 1]\n");
  /* the design examples are canonical as written */
  const char *const design[] = {
    "plan tp2_dp2 for mlp on cpus(4) {\n"
    "  mesh m = devices as [dp = 2, tp = 2]\n"
    "  split {h, a} on hidden into tp\n"
    "  split o on hidden into tp\n"
    "  replicate loss into tp\n"
    "  split all on batch into dp\n"
    "  assign all -> m[dp, tp]\n"
    "}\n",
    "plan pipe for gpt on h100_dgx(nodes = 1) {\n"
    "  mesh m = devices[0..2] as [pp = 2]\n"
    "  split all on batch into 4 as mb in time\n"
    "  stage s0 = h[0..6], s1 = h[6..12]\n"
    "  assign s0 -> m[0], s1 -> m[1]\n"
    "  schedule {\n"
    "    s0: f0 f1 .  b0 f2 b1 f3 b2 .  b3\n"
    "    s1: .  f0 b0 f1 b1 f2 b2 f3 b3 .\n"
    "  }\n"
    "}\n",
  };
  for (size_t i = 0; i < sizeof design / sizeof design[0]; i++) expect_fmt(design[i], design[i]);
  /* a statement that an optional word could continue ends with ';' when
   * the next statement starts with that word */
  expect_fmt("replicate x into n; as = 1", "replicate x into n;\nas = 1\n");
  expect_fmt("split x on k into n;as.y = 1", "split x on k into n;\nas.y = 1\n");
  expect_fmt("recompute x; full = 1; recompute y;selective(2)",
             "recompute x;\nfull = 1\nrecompute y;\nselective(2)\n");
  expect_fmt("replicate x into n as r\nas = 1", "replicate x into n as r\nas = 1\n");
  expect_fmt("split x on k into n in time\nas = 1", "split x on k into n in time\nas = 1\n");
  expect_fmt("recompute x full\nfull = 1", "recompute x full\nfull = 1\n");
  expect_fmt("recompute x\nassign = 1", "recompute x\nassign = 1\n");
}

static void test_schedule_grids(void **state) {
  (void)state;
  expect_fmt("schedule{}", "schedule {}\n");
  expect_fmt("schedule{s0:f0 b0}", "schedule {\n  s0: f0 b0\n}\n");
  /* columns align: every cell is padded to the widest of its column, labels
   * to the widest label; no trailing blanks */
  expect_fmt("schedule {\n"
             "s0: f0 f1 . b0 f2 b1 f3 b2 . b3\n"
             "s1: . f0 b0 f1 b1 f2 b2 f3 b3 .\n"
             "}\n",
             "schedule {\n"
             "  s0: f0 f1 .  b0 f2 b1 f3 b2 .  b3\n"
             "  s1: .  f0 b0 f1 b1 f2 b2 f3 b3 .\n"
             "}\n");
  expect_fmt("schedule { 0: f0 f10 .\n 12: b3.1 . w0 r2 r3\n s: . }\n",
             "schedule {\n"
             "  0:  f0   f10 .\n"
             "  12: b3.1 .   w0 r2 r3\n"
             "  s:  .\n"
             "}\n");
  /* an empty row, and a row continued on the next line */
  expect_fmt("schedule {\n  a:\n  long_label: f0\n    b0\n}\n",
             "schedule {\n  a:\n  long_label: f0 b0\n}\n");
  /* comments in a grid: own-line, trailing (aligned), inside a row */
  expect_fmt("schedule { # grid\n"
             "  # first row\n"
             "  s0: f0 . b0 # a\n"
             "  s1: . f0 b0 # bb\n"
             "\n\n"
             "  s2: f0 # inside\n"
             "    b0\n"
             "  # last\n"
             "} # end\n",
             "schedule {  # grid\n"
             "  # first row\n"
             "  s0: f0 .  b0  # a\n"
             "  s1: .  f0 b0  # bb\n"
             "\n"
             "  # inside\n"
             "  s2: f0 b0\n"
             "  # last\n"
             "}  # end\n");
  expect_fmt("schedule {\n  # only a comment\n}\n", "schedule {\n  # only a comment\n}\n");
  /* inside a plan, at the plan's indentation + 1 */
  expect_fmt("plan p for m on c { schedule { s0: f0 b0 } }",
             "plan p for m on c {\n  schedule {\n    s0: f0 b0\n  }\n}\n");
  /* two grids align apart */
  expect_fmt("schedule { a: f10 }\nschedule { a: f0 b0 }\n",
             "schedule {\n  a: f10\n}\nschedule {\n  a: f0 b0\n}\n");
}

/* ---- comments ---------------------------------------------------------------------- */

static void test_comments(void **state) {
  (void)state;
  /* own-line comments stay before what follows them, at its indentation */
  expect_fmt("# a\nx = 1\nmodel m {\n# b\n        y = 2\n    # c\n}\n",
             "# a\nx = 1\nmodel m {\n  # b\n  y = 2\n  # c\n}\n");
  /* trailing comments stay trailing, aligned across consecutive lines */
  expect_fmt("x = 1 # one\nlonger_name = 2 #two\n\nz = 3    # three\n",
             "x = 1            # one\nlonger_name = 2  #two\n\nz = 3  # three\n");
  /* columns count characters, not bytes */
  expect_fmt("s = \"\xc3\xa9\xc3\xa9\" # a\nt = \"xx\" # b\n",
             "s = \"\xc3\xa9\xc3\xa9\"  # a\nt = \"xx\"  # b\n");
  /* a line without a comment ends the alignment run */
  expect_fmt("a = 1 # a\nbb = 2\nccc = 3 # c\n", "a = 1  # a\nbb = 2\nccc = 3  # c\n");
  /* lines of an inner block align apart from the outer ones */
  expect_fmt("model m { # m\n  a = 1 # a\n  long_one = 2 # b\n} # end\n",
             "model m {  # m\n  a = 1         # a\n  long_one = 2  # b\n}  # end\n");
  /* a comment inside a multi-line expression moves before its statement */
  expect_fmt("x = f(a, # first\n  b) # second\n", "# first\nx = f(a, b)  # second\n");
  /* a comment in a multi-line header moves before the statement */
  expect_fmt("model m(a, # the a\n  b) { # body\n  x = 1\n}\n",
             "# the a\nmodel m(a, b) {  # body\n  x = 1\n}\n");
  /* comments keep an otherwise empty block open */
  expect_fmt("model m { # note\n}\n", "model m {  # note\n}\n");
  expect_fmt("model m {\n  # todo\n}\n", "model m {\n  # todo\n}\n");
  expect_fmt("model m {}  # after\n", "model m {}  # after\n");
  /* statements on one line: the comment belongs to the last */
  expect_fmt("a = 1; b = 2 # c\n", "a = 1\nb = 2  # c\n");
  /* else chains */
  expect_fmt("if a { # then\n  x = 1\n} else { # else\n  x = 2\n} # end\n",
             "if a {  # then\n  x = 1\n} else {  # else\n  x = 2\n}  # end\n");
  expect_fmt("if a {\n  x = 1\n}\n# between\nelse {\n  x = 2\n}\n",
             "if a {\n  x = 1\n  # between\n} else {\n  x = 2\n}\n");
  expect_fmt("if a {\n} else {\n  # only a comment\n}\n",
             "if a {} else {\n  # only a comment\n}\n");
  /* only comments; text kept as written, trailing blanks dropped */
  expect_fmt("#a\n   #  b  \n\n\n#c", "#a\n#  b\n\n#c\n");
  expect_fmt("x = 1 #\n", "x = 1  #\n");
}

/* ---- properties on awkward input ----------------------------------------------------- */

static void test_roundtrip_awkward(void **state) {
  (void)state;
  static const char *const inputs[] = {
    "x = 1;;;y=2,z=3",
    "link l { assert a, b c = 1 }",
    "model m {\n x = [1,\n # in a list\n 2]\n # before close\n }\n",
    "let q = 1 GB.x\nlet p = 2 .3\nlet f = 1.5.2\n",
    "op f(x: [(2 s^ 3 B)]) -> [] {}",
    "if a { } # c1\n # c2\n else if b { # c3\n } # c4\n else { } # c5\n",
    "if a {} else if b {} else {}",
    "x = \"{\"{\"{a}\"}\"}\"",
    "for i in 0..n {\n  # c\n}\n",
    "block a.{b}.c { }",
    "x = \"\\{{a}\\}\"",
    "# only\n",
    "x = 1 # a\n# b\n\n\n# c\ny = 2 # d\n  # e\n",
    "model m(\n  a = 1, # one\n  b = 2  # two\n) { # three\n} # four\n",
    "a = {\n  x = 1, # x\n  y = 2 # y\n} # z\n",
    "plan p(a, # one\n b) for m # two\n on c { # three\n} # four\n",
    "strategy s { # a\n  split x # b\n  on k into # c\n 2 as # d\n tp in # e\n time # f\n}\n",
    "stage s0 = a, # x\n s1 = b # y\nassign a -> 0, # z\n b -> 1\n",
    "mesh m = devices as [ # axes\n dp = 2, # dp\n tp = 2 # tp\n] # end\n",
    "recompute { # set\n a, # a\n b.* # b\n } full # mode\n",
    "schedule { s0: f0 } schedule { } schedule { # c\n }",
    "schedule {\n# c0\ns0: # c1\n# c2\nf0 # c3\n# c4\n}\n",
    "plan p for m on c {\n  if a { schedule { s0: f0 } } else { schedule { s1: b0 } }\n}\n",
    "replicate x into n; as = 1; recompute y; full.a = 2\nrecompute z; selective(1)",
    "let order = 1; let full = true; fn f(time) = time; order = full",
  };
  for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
    free(fmt_checked(inputs[i], strlen(inputs[i])));

  /* the deepest trees the parser accepts print without trouble */
  char buf[1024];
  size_t k = (size_t)snprintf(buf, sizeof buf, "x = ");
  for (int i = 0; i < 250; i++) buf[k++] = '[';
  for (int i = 0; i < 250; i++) buf[k++] = ']';
  free(fmt_checked(buf, k));
}

/* ---- sample files ------------------------------------------------------------------------ */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  fclose(f);
  s[got] = 0;
  *len = got;
  return s;
}

static void test_samples(void **state) {
  (void)state;
  const char *dir = "tests/fmt";
  DIR *d = opendir(dir);
  if (!d) fail_msg("cannot open %s: run the test from the repository root", dir);
  int count = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".plan") != 0) continue;
    char in[512], exp[512];
    snprintf(in, sizeof in, "%s/%s", dir, e->d_name);
    snprintf(exp, sizeof exp, "%s/%.*s.expected", dir, (int)(n - 5), e->d_name);
    size_t ilen, elen;
    char *src = read_file(in, &ilen);
    char *want = read_file(exp, &elen);
    if (!src || !want) fail_msg("missing %s or %s", in, exp);
    char *got = fmt_checked(src, ilen);
    if (strcmp(got, want) != 0) fail_msg("%s: fmt differs from %s:\n%s", in, exp, got);
    /* the expected output is canonical */
    char *again = fmt_checked(want, elen);
    assert_string_equal(again, want);
    /* the library's roundtrip check agrees */
    ft *p = ft_new();
    int rc = weft_fmt_roundtrip(in, &p->srcs, &p->ar, &p->diags, stderr);
    assert_int_equal(rc, 0);
    ft_free(p);
    free(src);
    free(want);
    free(got);
    free(again);
    count++;
  }
  closedir(d);
  assert_true(count >= 5);
}

static void test_roundtrip_errors(void **state) {
  (void)state;
  ft *p = ft_new();
  FILE *devnull = fopen("/dev/null", "w");
  assert_int_equal(weft_fmt_roundtrip("tests/fmt/no such file.plan", &p->srcs, &p->ar, &p->diags,
                                      devnull), 2);
  char path[] = "/tmp/weft_fmt_bad_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs("x = (\n", f);
  fclose(f);
  assert_int_equal(weft_fmt_roundtrip(path, &p->srcs, &p->ar, &p->diags, devnull), 2);
  assert_true(p->diags.errors > 0);
  remove(path);
  fclose(devnull);
  ft_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_spacing),
    cmocka_unit_test(test_literals),
    cmocka_unit_test(test_blocks),
    cmocka_unit_test(test_blank_lines),
    cmocka_unit_test(test_plans),
    cmocka_unit_test(test_schedule_grids),
    cmocka_unit_test(test_comments),
    cmocka_unit_test(test_roundtrip_awkward),
    cmocka_unit_test(test_samples),
    cmocka_unit_test(test_roundtrip_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
