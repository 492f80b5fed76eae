/* test_parse.c - the scanner and parser (grammar/lexer.l, grammar/parser.y)
 * and the tree helpers of src/front/ast.c: literals, precedence, paths, every
 * statement, op patterns, plans (selectors, schedule grids, soft keywords),
 * positioned errors and hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weft/ast.h"

/* ---- helpers ----------------------------------------------------------------- */

typedef struct pt {
  arena ar;
  weft_srcs srcs;
  weft_diags diags;
} pt;

static pt *pt_new(void) {
  pt *p = calloc(1, sizeof *p);
  arena_init(&p->ar);
  p->diags.arena = &p->ar;
  p->diags.srcs = &p->srcs;
  p->diags.max_errors = 50;
  return p;
}

static void pt_free(pt *p) {
  arena_free(&p->ar);
  free(p);
}

static ast *parse_n(pt *p, const char *text, size_t len, bool expr) {
  int f = src_add(&p->srcs, &p->ar, "t.plan", "", text, len);
  weft_parse_opts o = { &p->ar, &p->srcs, &p->diags };
  return expr ? weft_parse_expr(&o, f) : weft_parse(&o, f);
}

static ast *parse(pt *p, const char *text) { return parse_n(p, text, strlen(text), false); }

static char *dump(const ast *n) {
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  ast_dump(n, m);
  fclose(m);
  return buf;
}

static void print_diags(pt *p) {
  for (int i = 0; i < p->diags.n; i++)
    fprintf(stderr, "  %d:%d: %s\n", p->diags.items[i].loc.line, p->diags.items[i].loc.col,
            p->diags.items[i].msg);
}

/* The expression src dumps as want. */
static void expect_expr(const char *src, const char *want) {
  pt *p = pt_new();
  ast *n = parse_n(p, src, strlen(src), true);
  if (!n) {
    print_diags(p);
    fail_msg("expression '%s' did not parse", src);
  }
  char *got = dump(n);
  if (strcmp(got, want) != 0) fail_msg("'%s'\n  got  %s\n  want %s", src, got, want);
  free(got);
  pt_free(p);
}

/* The file src dumps as want. */
static void expect_file(const char *src, const char *want) {
  pt *p = pt_new();
  ast *n = parse(p, src);
  if (!n) {
    print_diags(p);
    fail_msg("file '%s' did not parse", src);
  }
  char *got = dump(n);
  if (strcmp(got, want) != 0) fail_msg("'%s'\n  got  %s\n  want %s", src, got, want);
  free(got);
  pt_free(p);
}

/* Parsing text (len bytes) fails with an error at line:col whose message
 * contains msg. */
static void expect_error_n(const char *text, size_t len, int line, int col, const char *msg) {
  pt *p = pt_new();
  ast *n = parse_n(p, text, len, false);
  if (n) fail_msg("'%.*s' parsed, want error '%s'", (int)len, text, msg);
  for (int i = 0; i < p->diags.n; i++) {
    weft_diag *g = &p->diags.items[i];
    if (g->sev == DIAG_ERROR && g->loc.line == line && g->loc.col == col && strstr(g->msg, msg)) {
      assert_int_equal(g->loc.file, 0);
      assert_true(g->loc.end_line > g->loc.line ||
                  (g->loc.end_line == g->loc.line && g->loc.end_col >= g->loc.col - 1));
      pt_free(p);
      return;
    }
  }
  print_diags(p);
  fail_msg("'%.*s': no error '%s' at %d:%d", (int)len, text, msg, line, col);
}

static void expect_error(const char *text, int line, int col, const char *msg) {
  expect_error_n(text, strlen(text), line, col, msg);
}

/* ---- literals ------------------------------------------------------------------ */

static void test_integers(void **state) {
  (void)state;
  pt *p = pt_new();
  ast *n = parse_n(p, "1_000_000", 9, true);
  assert_non_null(n);
  assert_int_equal(n->kind, E_INT);
  assert_int_equal(n->ival, 1000000);
  assert_string_equal(n->text, "1_000_000");
  n = parse_n(p, "9223372036854775807", 19, true);
  assert_non_null(n);
  assert_true(n->ival == INT64_MAX);
  pt_free(p);
  expect_expr("0", "0");
  expect_expr("42", "42");
  expect_error("x = 9223372036854775808", 1, 5, "integer literal too large");
  expect_error("x = 1_", 1, 5, "invalid number");
}

static void test_floats(void **state) {
  (void)state;
  pt *p = pt_new();
  ast *n = parse_n(p, "2.5e3", 5, true);
  assert_int_equal(n->kind, E_FLOAT);
  assert_true(n->fval == 2500.0);
  assert_string_equal(n->text, "2.5e3");
  n = parse_n(p, "1e-5", 4, true);
  assert_int_equal(n->kind, E_FLOAT);
  assert_true(n->fval == 1e-5);
  n = parse_n(p, "0.5", 3, true);
  assert_true(n->fval == 0.5);
  pt_free(p);
  expect_expr("1.5..2", "(.. 1.5 2)");
  expect_expr("0..n", "(.. 0 n)");
  expect_error("x = 1e999", 1, 5, "out of range");
  expect_error("x = .5", 1, 5, "unexpected '.'");
}

static void test_quantities(void **state) {
  (void)state;
  pt *p = pt_new();
  ast *n = parse_n(p, "25 Gb/s", 7, true);
  assert_int_equal(n->kind, E_QUANTITY);
  assert_true(n->fval == 25);
  assert_string_equal(n->text, "25");
  assert_string_equal(n->name, "Gb/s");
  assert_int_equal(n->loc.col, 1);
  assert_int_equal(n->loc.end_col, 7);
  n = parse_n(p, "1_000\tGB", 8, true);
  assert_int_equal(n->kind, E_QUANTITY);
  assert_true(n->fval == 1000);
  assert_string_equal(n->text, "1_000");
  pt_free(p);
  expect_expr("2 us", "(q 2 us)");
  expect_expr("80GiB", "(q 80 GiB)");
  expect_expr("312 TFLOP/s", "(q 312 TFLOP/s)");
  expect_expr("1.5e3 bit", "(q 1.5e3 bit)");
  expect_expr("80 GiB / (2 TB/s)", "(/ (q 80 GiB) (paren (q 2 TB/s)))");
  expect_expr("25 Gb/s / 8", "(/ (q 25 Gb/s) 8)");
  expect_expr("10 GB/s/2", "(/ (q 10 GB/s) 2)");
  expect_expr("1 GB/ms", "(/ (q 1 GB) ms)");   /* only "/s" belongs to a unit */
  expect_expr("2 * s", "(* 2 s)");
  /* a word that is not exactly a unit is a name of its own */
  expect_file("x = 2 sx = 3", "(file (= x 2) (= sx 3))");
  expect_file("x = 2 GBs = 3", "(file (= x 2) (= GBs 3))");
  expect_file("x = 2 s_ = 3", "(file (= x 2) (= s_ 3))");
  expect_file("x = 2\ns = 3", "(file (= x 2) (= s 3))");
  expect_file("x = if n > 2 then 1 else 0", "(file (= x (if (> n 2) 1 0)))");
  pt *q = pt_new();
  assert_null(parse_n(q, "2 sx", 4, true));
  assert_int_equal(q->diags.items[0].loc.col, 3);
  assert_non_null(strstr(q->diags.items[0].msg, "unexpected identifier 'sx'"));
  pt_free(q);
}

static void test_strings(void **state) {
  (void)state;
  expect_expr("\"\"", "(str)");
  expect_expr("\"abc\"", "(str \"abc\")");
  expect_expr("\"a\\nb\\t\\\\\\\"\\{\\}\"", "(str \"a\\nb\\t\\\\\\\"{}\")");
  expect_expr("\"layer.{l}\"", "(str \"layer.\" l)");
  expect_expr("\"{a}{b + 1}c\"", "(str a (+ b 1) \"c\")");
  /* braces and strings nest inside an interpolation */
  expect_expr("\"x{ {a = 1}.a }y\"", "(str \"x\" (. (record (= a 1)) a) \"y\")");
  expect_expr("\"{f(\"in{x}\")}!\"", "(str (call f (str \"in\" x)) \"!\")");
  expect_expr("\"{\"{\"{x}\"}\"}\"", "(str (str (str x)))");
  expect_expr("\"héllo ✓\"", "(str \"h\xc3\xa9llo \xe2\x9c\x93\")");
  pt *p = pt_new();
  ast *n = parse_n(p, "\"a{x}b\"", 7, true);
  assert_int_equal(n->list.n, 3);
  assert_int_equal(n->list.items[0]->kind, E_STRPART);
  assert_int_equal(n->list.items[0]->loc.col, 2);
  assert_int_equal(n->list.items[1]->kind, E_NAME);
  assert_int_equal(n->list.items[1]->loc.col, 4);
  assert_int_equal(n->loc.col, 1);
  assert_int_equal(n->loc.end_col, 7);
  pt_free(p);
  expect_error("x = \"abc", 1, 5, "unterminated string");
  expect_error("x = \"abc\ny = 1", 1, 5, "unterminated string");
  expect_error("x = \"a{b\ny = 1", 1, 5, "unterminated string");
  expect_error("x = \"a{\"b\ny = 1", 1, 8, "unterminated string");
  expect_error("x = \"a\\qb\"", 1, 7, "unknown escape '\\q'");
  expect_error("x = \"a}\"", 1, 7, "unmatched '}'");
  expect_error("x = \"{}\"", 1, 7, "unexpected '}', expected an expression");
  expect_error("use \"a{b}\"", 1, 5, "cannot contain interpolation");
}

/* ---- expressions ---------------------------------------------------------------- */

static void test_precedence(void **state) {
  (void)state;
  expect_expr("1 + 2 * 3", "(+ 1 (* 2 3))");
  expect_expr("1 * 2 + 3", "(+ (* 1 2) 3)");
  expect_expr("1 - 2 - 3", "(- (- 1 2) 3)");
  expect_expr("a // b % c / d", "(/ (% (// a b) c) d)");
  expect_expr("a..b + 1", "(.. a (+ b 1))");
  expect_expr("a + 1..b * 2", "(.. (+ a 1) (* b 2))");
  expect_expr("if a then b else c or d", "(if a b (or c d))");
  expect_expr("if a then if b then c else d else e", "(if a (if b c d) e)");
  expect_expr("a or b and c", "(or a (and b c))");
  expect_expr("not a == b", "(not (== a b))");
  expect_expr("not not a and b", "(and (not (not a)) b)");
  expect_expr("-a * b", "(* (- a) b)");
  expect_expr("- -a", "(- (- a))");
  expect_expr("-f(x)[0].y", "(- (. (index (call f x) 0) y))");
  expect_expr("(a + b) * c", "(* (paren (+ a b)) c)");
  expect_expr("a != b", "(!= a b)");
  expect_expr("a <= b", "(<= a b)");
  expect_expr("a >= b", "(>= a b)");
  expect_expr("f(1, k = 2,)", "(call f 1 (= k 2))");
  expect_expr("f()", "(call f)");
  expect_expr("[1, [2], []]", "(list 1 (list 2) (list))");
  expect_expr("[1, 2,]", "(list 1 2)");
  expect_expr("{ lr = 0.1, eps = 1e-8, }", "(record (= lr 0.1) (= eps 1e-8))");
  expect_expr("{}", "(record)");
  expect_expr("true and false", "(and true false)");
  expect_error("x = a < b < c", 1, 11, "unexpected '<'");
  expect_error("x = a..b..c", 1, 9, "unexpected '..'");
  expect_error("x = 1 + not a", 1, 9, "unexpected 'not'");
}

static void test_paths(void **state) {
  (void)state;
  expect_expr("h.{i}.attn", "(. (.{} h i) attn)");
  expect_expr("h.3.4", "(. (. h 3) 4)");
  expect_expr("h.{i - 1}.out", "(. (.{} h (- i 1)) out)");
  expect_expr("xs[0].5", "(. (index xs 0) 5)");
  expect_file("h.3.4 = 1", "(file (= (. (. h 3) 4) 1))");
  expect_file("block h.{i} { x = 1 }", "(file (block (.{} h i) (= x 1)))");
  expect_file("param ln_1.weight : [hidden]", "(file (tparam (. ln_1 weight) (type _ hidden)))");
  expect_file("h.{i}.w = h.{i - 1}.out", "(file (= (. (.{} h i) w) (. (.{} h (- i 1)) out)))");
  pt *p = pt_new();
  ast *f = parse(p, "h.12.x = 1");
  ast *m = f->list.items[0]->a;
  assert_int_equal(m->kind, E_MEMBER);
  assert_string_equal(m->name, "x");
  assert_int_equal(m->a->kind, E_MEMBER);
  assert_null(m->a->name);
  assert_int_equal(m->a->b->kind, E_INT);
  assert_int_equal(m->a->b->ival, 12);
  assert_int_equal(m->a->op, 0);
  pt_free(p);
}

/* ---- statements ------------------------------------------------------------------ */

static void test_statements(void **state) {
  (void)state;
  expect_file("", "(file)");
  expect_file("use std", "(file (use std))");
  expect_file("use \"./other.plan\"", "(file (use \"./other.plan\"))");
  expect_file("param layers = 12", "(file (param layers 12))");
  expect_file("param w : f32[dim, dim]", "(file (tparam w (type f32 dim dim)))");
  expect_file("param s : []", "(file (tparam s (type _)))");
  expect_file("input x : f32[batch, 2 * dim]", "(file (input x (type f32 batch (* 2 dim))))");
  expect_file("let gib = 80 GiB", "(file (let gib (q 80 GiB)))");
  expect_file("fn f(a, b = 2,) = a * b", "(file (fn f (a (= b 2)) (* a b)))");
  expect_file("fn g() = 1", "(file (fn g () 1))");
  expect_file("model m { }", "(file (model m))");
  expect_file("model m() { }", "(file (model m ()))");
  expect_file("model m(batch = 8, dim) { o = f(x) }",
              "(file (model m ((= batch 8) dim) (= o (call f x))))");
  expect_file("model g = gpt(layers = 2)", "(file (model= g (call gpt (= layers 2))))");
  expect_file("cluster c(nodes = 2) { devices_per_node = 4 }",
              "(file (cluster c ((= nodes 2)) (= devices_per_node 4)))");
  expect_file("cluster c { }", "(file (cluster c))");
  expect_file("x = 1; y = 2;; z = 3", "(file (= x 1) (= y 2) (= z 3))");
  expect_file("for i in 0..n { y = i }", "(file (for i (.. 0 n) (= y i)))");
  expect_file("if a { x = 1 }", "(file (if a (then (= x 1))))");
  expect_file("if a { x = 1 } else { x = 2 }", "(file (if a (then (= x 1)) (else (= x 2))))");
  expect_file("if a { } else if b { x = 2 } else { x = 3 }",
              "(file (if a (then) (else (if b (then (= x 2)) (else (= x 3))))))");
  expect_file("output o", "(file (output o))");
  expect_file("train sgd(lr = 0.1)", "(file (train (call sgd (= lr 0.1))))");
  expect_file("assert x > 0", "(file (assert (> x 0)))");
  expect_file("assert x > 0, \"x\"", "(file (assert (> x 0) (str \"x\")))");
  expect_file("device { name = \"L4\" }", "(file (device (= name (str \"L4\"))))");
  expect_file("link pcie { level = \"node\", bandwidth = 32 GB/s, latency = 5 us }",
              "(file (link pcie (= level (str \"node\")) (= bandwidth (q 32 GB/s)) (= latency (q 5 us))))");
  /* "assert c, x" takes x as its message, not a ',' separator */
  expect_file("link l { assert a, b c = 1 }", "(file (link l (assert a b) (= c 1)))");

  /* fields the fmt needs: ival for "()", body spans */
  pt *p = pt_new();
  ast *f = parse(p, "model m {\n  x = 1\n}\nif a {\n} else {\n  y = 2\n}\n");
  assert_non_null(f);
  ast *m = f->list.items[0];
  assert_int_equal(m->ival, 0);
  assert_int_equal(m->body.line, 1);
  assert_int_equal(m->body.col, 9);
  assert_int_equal(m->body.end_line, 3);
  assert_int_equal(m->body.end_col, 1);
  assert_int_equal(m->loc.line, 1);
  assert_int_equal(m->loc.col, 1);
  assert_int_equal(m->loc.end_line, 3);
  assert_int_equal(m->loc.end_col, 1);
  ast *i = f->list.items[1];
  assert_int_equal(i->kind, S_IF);
  assert_int_equal(i->body.line, 4);
  assert_int_equal(i->body2.line, 5);
  assert_int_equal(i->body2.col, 8);
  pt_free(p);
}

static void test_op_patterns(void **state) {
  (void)state;
  expect_file("op mm(a: [m, k+], b: [k+, n]) -> [m, n] { flops = 2 * m * k * n }",
              "(file (op mm ((arg a (pattern _ m k+)) (arg b (pattern _ k+ n))) (pattern _ m n) "
              "(= flops (* (* (* 2 m) k) n))))");
  expect_file("op norm(x: [b.., h^], eps = 1e-5, flag) -> [b.., h^] {}",
              "(file (op norm ((arg x (pattern _ b.. h^)) (arg eps = 1e-5) (arg flag)) (pattern _ b.. h^)))");
  expect_file("op qkv(x: [b.., s^, (3 n dh)], n) -> i32[] {}",
              "(file (op qkv ((arg x (pattern _ b.. s^ (group 3 n dh))) (arg n)) (pattern i32)))");
  expect_file("op e(ids: i32[b, s],) -> [b, s, (h^ 2+)] {}",
              "(file (op e ((arg ids (pattern i32 b s))) (pattern _ b s (group h^ 2+))))");
  /* "(2 s)" scans as a quantity; the parser splits it back */
  expect_file("op f(x: [(2 s^)]) -> [] {}", "(file (op f ((arg x (pattern _ (group 2 s^)))) (pattern _)))");
  pt *p = pt_new();
  ast *f = parse(p, "op f(x: [(2 s)]) -> [] {}");
  ast *g = f->list.items[0]->list.items[0]->b->list.items[0];
  assert_int_equal(g->kind, N_DIM);
  assert_null(g->name);
  assert_int_equal(g->list.n, 2);
  assert_int_equal(g->list.items[0]->kind, E_INT);
  assert_int_equal(g->list.items[0]->ival, 2);
  assert_int_equal(g->list.items[1]->kind, E_NAME);
  assert_string_equal(g->list.items[1]->name, "s");
  assert_int_equal(g->list.items[1]->loc.col, 13);
  pt_free(p);
  expect_error("op f(x: [()]) -> [] {}", 1, 11, "unexpected ')'");
  expect_error("op f(x: [(2 GB/s)]) -> [] {}", 1, 11, "expected a dimension name or an integer");
  expect_error("op f(x: [m]) {}", 1, 14, "expected '->'");
}

/* ---- errors ------------------------------------------------------------------------ */

static void test_syntax_errors(void **state) {
  (void)state;
  expect_error("x = }", 1, 5, "unexpected '}', expected an expression");
  expect_error("let = 3", 1, 5, "unexpected '=', expected identifier");
  expect_error("model m {\n  x = 1\n", 3, 1, "unexpected end of file");
  expect_error("x = (1 + 2", 1, 11, "expected an operator or ')'");
  expect_error("x = f(a b)", 1, 9, "unexpected identifier 'b'");
  expect_error("fn f(a b) = 1", 1, 8, "expected ',', '=' or ')'");
  expect_error("if a = b { }", 1, 6, "unexpected '='");
  expect_error("model m { 3 }", 1, 11, "unexpected number '3', expected a statement or '}'");
  expect_error("}", 1, 1, "unexpected '}', expected a statement");
  expect_error("plan p { }", 1, 8, "unexpected '{', expected 'for' or '('");
  expect_error("let plan = 1", 1, 5, "unexpected 'plan'");
  expect_error("train sgd", 1, 7, "expected an optimizer call");
  expect_error("x = 1 $", 1, 7, "unexpected character '$'");
  expect_error("x = 1 & y", 1, 7, "unexpected character '&'");
  expect_error("x = 'a'", 1, 5, "unexpected character '''");
  expect_error("x = \x01", 1, 5, "unexpected character '\\x01'");
  expect_error("\n\n   x = = 1", 3, 8, "unexpected '='");
  expect_error("x = é", 1, 5, "unexpected character 'é'");
  /* a long identifier: an error, quickly */
  size_t n = 1000000;
  char *big = malloc(n + 8);
  memcpy(big, "x = ", 4);
  memset(big + 4, 'a', n);
  clock_t t0 = clock();
  expect_error_n(big, n + 4, 1, 5, "identifier too long");
  assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 5.0);
  free(big);
  expect_error("let abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij"
               "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij"
               "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij = 1",
               1, 5, "identifier too long (260 characters");
}

static void test_several_errors(void **state) {
  (void)state;
  const char *src =
      "model m {\n"
      "  x = (1 + )\n"        /* 2:13 */
      "  y = 2\n"
      "  z = = 3\n"           /* 4:7 */
      "}\n"
      "let q = 1 2\n"         /* 6:11 */
      "fn f(a b) = a\n"       /* 7:8 */
      "let ok = 1\n";
  pt *p = pt_new();
  assert_null(parse(p, src));
  int want[][2] = { { 2, 12 }, { 4, 7 }, { 6, 11 }, { 7, 8 } };
  assert_int_equal(p->diags.errors, 4);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(p->diags.items[i].loc.line, want[i][0]);
    assert_int_equal(p->diags.items[i].loc.col, want[i][1]);
  }
  pt_free(p);

  /* an error inside brackets resumes after the closing one: one error */
  p = pt_new();
  assert_null(parse(p, "op sgd(param: [n], lr) -> [n] {\n  flops = 1\n}\nx = f(a b, g(c))\ny = 1\n"));
  assert_int_equal(p->diags.errors, 2);
  assert_int_equal(p->diags.items[0].loc.line, 1);
  assert_int_equal(p->diags.items[0].loc.col, 8);
  assert_non_null(strstr(p->diags.items[0].hint, "'param' is a keyword"));
  assert_int_equal(p->diags.items[1].loc.line, 4);
  assert_int_equal(p->diags.items[1].loc.col, 9);
  pt_free(p);

  /* the error limit holds with many errors */
  size_t cap = 100000, len = 0;
  char *many = malloc(cap);
  for (int i = 0; i < 500; i++) len += (size_t)snprintf(many + len, cap - len, "x%d = )\n", i);
  p = pt_new();
  assert_null(parse_n(p, many, len, false));
  assert_int_equal(p->diags.errors, 500);
  assert_int_equal(p->diags.n, 50);
  pt_free(p);
  free(many);
}

static void test_deep_nesting(void **state) {
  (void)state;
  size_t n = 300;
  char *s = malloc(2 * n + 16);
  size_t k = 0;
  memcpy(s, "x = ", 4);
  k = 4;
  for (size_t i = 0; i < n; i++) s[k++] = '(';
  s[k++] = '1';
  for (size_t i = 0; i < n; i++) s[k++] = ')';
  expect_error_n(s, k, 1, 4 + 257, "nesting too deep (more than 256 levels)");
  pt *p = pt_new();
  assert_null(parse_n(p, s, k, false));
  assert_int_equal(p->diags.errors, 1);   /* one error, then parsing stops */
  pt_free(p);
  free(s);

  /* 200 levels are fine */
  s = malloc(512);
  k = 0;
  for (int i = 0; i < 200; i++) s[k++] = '[';
  for (int i = 0; i < 200; i++) s[k++] = ']';
  p = pt_new();
  ast *l = parse_n(p, s, k, true);
  assert_non_null(l);
  assert_int_equal(l->depth, 200);
  pt_free(p);
  free(s);

  /* braces inside interpolations count too */
  s = malloc(4 * 300 + 16);
  k = 0;
  s[k++] = 'x';
  s[k++] = '=';
  for (int i = 0; i < 300; i++) { s[k++] = '"'; s[k++] = '{'; }
  expect_error_n(s, k, 1, 2 + 2 * 257, "nesting too deep");
  free(s);

  /* no brackets: a million prefix minus signs */
  n = 1000000;
  s = malloc(2 * n + 16);
  memcpy(s, "x = ", 4);
  k = 4;
  for (size_t i = 0; i < n; i++) { s[k++] = '-'; s[k++] = ' '; }
  s[k++] = 'x';
  clock_t t0 = clock();
  p = pt_new();
  assert_null(parse_n(p, s, k, false));
  assert_int_equal(p->diags.errors, 1);
  assert_int_equal(p->diags.items[0].loc.line, 1);
  assert_true(p->diags.items[0].loc.col > 4);
  assert_non_null(strstr(p->diags.items[0].msg, "nesting too deep"));
  pt_free(p);
  assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 5.0);
  free(s);

  /* a long flat sum deepens the tree: rejected at AST_MAX_DEPTH */
  n = 100000;
  s = malloc(2 * n + 16);
  memcpy(s, "x = ", 4);
  k = 4;
  for (size_t i = 0; i < n; i++) { if (i) s[k++] = '+'; s[k++] = '1'; }
  p = pt_new();
  assert_null(parse_n(p, s, k, false));
  assert_int_equal(p->diags.errors, 1);
  assert_int_equal(p->diags.items[0].loc.col, 5);
  assert_non_null(strstr(p->diags.items[0].msg, "more than 512 levels"));
  pt_free(p);
  free(s);

  /* else-if chains and long member paths */
  s = malloc(20 * 100000 + 16);
  k = (size_t)sprintf(s, "if a {}");
  for (int i = 0; i < 100000; i++) k += (size_t)sprintf(s + k, " else if a {}");
  p = pt_new();
  assert_null(parse_n(p, s, k, false));
  assert_int_equal(p->diags.errors, 1);
  pt_free(p);
  k = (size_t)sprintf(s, "x = a");
  for (int i = 0; i < 100000; i++) k += (size_t)sprintf(s + k, ".b");
  p = pt_new();
  assert_null(parse_n(p, s, k, false));
  assert_int_equal(p->diags.errors, 1);
  pt_free(p);
  free(s);

  /* every node has its depth */
  p = pt_new();
  ast *f = parse(p, "x = (1 + 2) * 3");
  assert_int_equal(f->list.items[0]->b->depth, 4);
  assert_int_equal(f->list.items[0]->depth, 5);
  assert_int_equal(f->depth, 6);
  pt_free(p);
}

static void test_nul_and_utf8(void **state) {
  (void)state;
  expect_error_n("x = 1\0\ny = 2", 12, 1, 6, "unexpected character '\\x00'");
  expect_error_n("x = \"a\0b\"", 9, 1, 7, "unexpected character '\\x00' in a string");
  expect_error_n("# a\0b\nx = 1", 11, 1, 4, "unexpected character '\\x00' in a comment");
  /* the whole text is scanned, past a NUL */
  expect_error_n("x = 1\0\ny = $", 12, 2, 5, "unexpected character '$'");
  expect_error("x = \"\xff\"", 1, 6, "invalid UTF-8");
  expect_error("x = \"ok \xc3\x28\"", 1, 9, "invalid UTF-8");
  expect_error("x = \"\xed\xa0\x80\"", 1, 6, "invalid UTF-8");   /* a surrogate */
  expect_error("x = \"\xc0\xaf\"", 1, 6, "invalid UTF-8");       /* overlong */
  expect_error("# \xe2\x9c\nx = 1", 1, 3, "invalid UTF-8");
  expect_error("x = 1 \x80\x80", 1, 7, "invalid UTF-8");
  /* valid UTF-8 in strings and comments is fine */
  expect_file("# naïve ✓\nx = \"größe ✓ 😀\"", "(file (= x (str \"gr\xc3\xb6\xc3\x9f" "e \xe2\x9c\x93 \xf0\x9f\x98\x80\")))");
  /* CRLF line ends */
  expect_file("x = 1\r\ny = 2 # c\r\n", "(file (= x 1) (= y 2))");
}

static void test_empty_and_comments(void **state) {
  (void)state;
  pt *p = pt_new();
  ast *f = parse(p, "");
  assert_non_null(f);
  assert_int_equal(f->kind, S_FILE);
  assert_int_equal(f->list.n, 0);
  f = parse(p, "  \n\n# only a comment  \n\t# two\r\n");
  assert_non_null(f);
  assert_int_equal(f->list.n, 0);
  assert_int_equal(f->list2.n, 2);
  assert_string_equal(f->list2.items[0]->text, " only a comment");
  assert_int_equal(f->list2.items[0]->loc.line, 3);
  assert_int_equal(f->list2.items[0]->loc.col, 1);
  assert_string_equal(f->list2.items[1]->text, " two");
  assert_int_equal(f->list2.items[1]->loc.line, 4);
  assert_int_equal(f->list2.items[1]->loc.col, 2);
  f = parse(p, "x = 1 # one\ny = \"#not\" #two");
  assert_int_equal(f->list2.n, 2);
  assert_string_equal(f->list2.items[1]->text, "two");
  assert_string_equal(f->list.items[1]->b->list.items[0]->text, "#not");
  pt_free(p);
}

static void test_locations(void **state) {
  (void)state;
  pt *p = pt_new();
  ast *f = parse(p, "let x = 1 + 23\n  y.z = f(a)\n");
  ast *s = f->list.items[0];
  assert_int_equal(s->loc.line, 1);
  assert_int_equal(s->loc.col, 1);
  assert_int_equal(s->loc.end_line, 1);
  assert_int_equal(s->loc.end_col, 14);
  assert_int_equal(s->a->loc.col, 9);
  assert_int_equal(s->a->loc.end_col, 14);
  assert_int_equal(s->a->b->loc.col, 13);
  s = f->list.items[1];
  assert_int_equal(s->loc.line, 2);
  assert_int_equal(s->loc.col, 3);
  assert_int_equal(s->loc.end_col, 12);
  assert_int_equal(s->a->loc.end_col, 5);
  pt_free(p);
}

static void test_parse_expr(void **state) {
  (void)state;
  expect_expr("1600", "1600");
  expect_expr("40GiB", "(q 40 GiB)");
  expect_expr("3e-4", "3e-4");
  expect_expr("  h100  # note", "h100");
  pt *p = pt_new();
  assert_null(parse_n(p, "", 0, true));
  assert_int_equal(p->diags.items[0].loc.col, 1);
  assert_non_null(strstr(p->diags.items[0].msg, "expected an expression"));
  assert_null(parse_n(p, "x = 1", 5, true));
  assert_null(parse_n(p, "1 2", 3, true));
  pt_free(p);
}

static void test_ast_equal(void **state) {
  (void)state;
  pt *p = pt_new();
  ast *a = parse(p, "model m(a = 1) { x = f(a, k = 2) # c\n}");
  ast *b = parse(p, "model m( a=1 ) {\n\n  x=f( a,k=2 ) ; }");
  ast *c = parse(p, "model m(a = 1) { x = f(a, k = 3) }");
  ast *d = parse(p, "model m { x = f(a, k = 2) }");
  ast *e = parse(p, "model m(a = 1) { x = f(a, k = (2)) }");
  assert_true(ast_equal(a, b));
  assert_false(ast_equal(a, c));
  assert_false(ast_equal(a, d));
  assert_false(ast_equal(a, e));
  assert_true(ast_equal(NULL, NULL));
  assert_false(ast_equal(a, NULL));
  /* literals compare as written */
  assert_false(ast_equal(parse(p, "x = 1000"), parse(p, "x = 1_000")));
  assert_int_equal(strcmp(ast_kind_names[E_INT], "E_INT"), 0);
  assert_int_equal(strcmp(ast_kind_names[S_LINK], "S_LINK"), 0);
  assert_int_equal(strcmp(ast_kind_names[S_CALL], "S_CALL"), 0);
  assert_int_equal(strcmp(ast_kind_names[N_CELL], "N_CELL"), 0);
  /* grid cells compare as written */
  assert_false(ast_equal(parse(p, "schedule { s0: f03 }"), parse(p, "schedule { s0: f3 }")));
  assert_true(ast_equal(parse(p, "schedule { s0: f3 }"), parse(p, "schedule {\n s0 :\n f3 }")));
  assert_false(ast_equal(parse(p, "assign a -> m[0, 1]"), parse(p, "assign a -> m[0][1]")));
  pt_free(p);
}

/* ---- plans ------------------------------------------------------------------------ */

static void test_plan_statements(void **state) {
  (void)state;
  expect_file("plan p for m on c {}", "(file (plan p (for m) (on c)))");
  expect_file("plan tp2(dp = 2, tp) for mlp(4) on cpus(4) { }",
              "(file (plan tp2 ((= dp 2) tp) (for (call mlp 4)) (on (call cpus 4))))");
  expect_file("plan p() for m on c {}", "(file (plan p () (for m) (on c)))");
  expect_file("strategy s { }", "(file (strategy s))");
  expect_file("strategy dp(n, axis = \"dp\") { split all on batch into n }",
              "(file (strategy dp (n (= axis (str \"dp\"))) (split (sel all) batch n)))");
  expect_file("mesh m = devices as [dp = 2, tp = 2]", "(file (mesh m devices (= dp 2) (= tp 2)))");
  expect_file("mesh m = devices[0..8] as [pp = 2, dp = 4,]",
              "(file (mesh m (index devices (.. 0 8)) (= pp 2) (= dp 4)))");
  expect_file("mesh m = devices as []", "(file (mesh m devices))");
  expect_file("split {h, a} on hidden into tp", "(file (split (sel h a) hidden tp))");
  expect_file("split all on batch into 4 as mb in time",
              "(file (split (sel all) batch 4 (as mb) (in time)))");
  expect_file("split x on k into 2 * n in time", "(file (split (sel x) k (* 2 n) (in time)))");
  expect_file("split x on k into n as tp", "(file (split (sel x) k n (as tp)))");
  expect_file("replicate loss into tp", "(file (replicate (sel loss) tp))");
  expect_file("replicate {loss, o} into 2 as r", "(file (replicate (sel loss o) 2 (as r)))");
  expect_file("assign all -> m[dp, tp]", "(file (assign (-> (sel all) (index m dp tp))))");
  expect_file("assign s0 -> m[0], s1 -> m[1], {a, b} -> 3",
              "(file (assign (-> (sel s0) (index m 0)) (-> (sel s1) (index m 1)) (-> (sel a b) 3)))");
  expect_file("stage s0 = h[0..6], s1 = h[6..12]",
              "(file (stage (= s0 (sel (index h (.. 0 6)))) (= s1 (sel (index h (.. 6 12))))))");
  expect_file("stage s = {emb, h[0..2]}", "(file (stage (= s (sel emb (index h (.. 0 2))))))");
  expect_file("order a before {b, c}", "(file (order (sel a) (sel b c)))");
  expect_file("recompute h.* selective", "(file (recompute (sel (. h *)) selective))");
  expect_file("recompute all full", "(file (recompute (sel all) full))");
  expect_file("recompute h", "(file (recompute (sel h)))");
  expect_file("data_parallel(dp)", "(file (do (call data_parallel dp)))");
  expect_file("megatron(tp = 2, pp = 2,)", "(file (do (call megatron (= tp 2) (= pp 2))))");
  expect_file("zero()", "(file (do (call zero)))");
  /* the statement keywords are callees too; assert, train and output keep
   * their statements */
  expect_file("split(1) stage(2) full(3)",
              "(file (do (call split 1)) (do (call stage 2)) (do (call full 3)))");
  expect_file("assert (x)", "(file (assert (paren x)))");
  expect_file("output (x)", "(file (output (paren x)))");
  /* several indices are an E_INDEX with a list; one keeps b */
  expect_expr("m[dp, tp]", "(index m dp tp)");
  expect_expr("m[0, 1, 2,]", "(index m 0 1 2)");
  expect_expr("m[0,]", "(index m 0)");
  /* the plan statements stand in any body: the evaluator checks where */
  expect_file("model m { split x on k into 2 }", "(file (model m (split (sel x) k 2)))");
  expect_file("plan p for m on c {\n  for i in 0..2 {\n    assign h.{i} -> i\n  }\n  if a { s(1) }\n}",
              "(file (plan p (for m) (on c) (for i (.. 0 2) (assign (-> (sel (.{} h i)) i))) "
              "(if a (then (do (call s 1))))))");

  /* the design examples */
  expect_file("plan tp2_dp2 for mlp on cpus(4) {\n"
              "  mesh m = devices as [dp = 2, tp = 2]\n"
              "  split {h, a} on hidden into tp\n"
              "  split o on hidden into tp\n"
              "  replicate loss into tp\n"
              "  split all on batch into dp\n"
              "  assign all -> m[dp, tp]\n"
              "}\n",
              "(file (plan tp2_dp2 (for mlp) (on (call cpus 4)) (mesh m devices (= dp 2) (= tp 2)) "
              "(split (sel h a) hidden tp) (split (sel o) hidden tp) (replicate (sel loss) tp) "
              "(split (sel all) batch dp) (assign (-> (sel all) (index m dp tp)))))");
  expect_file("plan pipe for gpt on h100_dgx(nodes = 1) {\n"
              "  mesh m = devices[0..2] as [pp = 2]\n"
              "  split all on batch into 4 as mb in time\n"
              "  stage s0 = h[0..6], s1 = h[6..12]\n"
              "  assign s0 -> m[0], s1 -> m[1]\n"
              "  schedule {\n"
              "    s0: f0 f1 .  b0 f2 b1 f3 b2 .  b3\n"
              "    s1: .  f0 b0 f1 b1 f2 b2 f3 b3 .\n"
              "  }\n"
              "}\n",
              "(file (plan pipe (for gpt) (on (call h100_dgx (= nodes 1))) "
              "(mesh m (index devices (.. 0 2)) (= pp 2)) (split (sel all) batch 4 (as mb) (in time)) "
              "(stage (= s0 (sel (index h (.. 0 6)))) (= s1 (sel (index h (.. 6 12))))) "
              "(assign (-> (sel s0) (index m 0)) (-> (sel s1) (index m 1))) "
              "(schedule (row s0 f0 f1 . b0 f2 b1 f3 b2 . b3) (row s1 . f0 b0 f1 b1 f2 b2 f3 b3 .))))");

  /* fields: names, ival, body spans */
  pt *p = pt_new();
  ast *f = parse(p, "plan p(a) for m on c {\n  split x on k into 2 as tp in time\n}\n"
                    "strategy s {\n}\nreplicate y into 3\nrecompute z selective\n");
  assert_non_null(f);
  ast *pl = f->list.items[0];
  assert_int_equal(pl->kind, S_PLAN);
  assert_string_equal(pl->name, "p");
  assert_int_equal(pl->ival, 1);
  assert_int_equal(pl->list.n, 1);
  assert_int_equal(pl->list.items[0]->kind, N_PARAM);
  assert_int_equal(pl->a->kind, E_NAME);
  assert_int_equal(pl->b->kind, E_NAME);
  assert_int_equal(pl->list2.n, 1);
  assert_int_equal(pl->body.line, 1);
  assert_int_equal(pl->body.col, 22);
  assert_int_equal(pl->body.end_line, 3);
  assert_int_equal(pl->loc.end_line, 3);
  ast *sp = pl->list2.items[0];
  assert_int_equal(sp->kind, S_SPLIT);
  assert_string_equal(sp->name, "k");
  assert_string_equal(sp->text, "tp");
  assert_int_equal(sp->ival, 1);
  assert_int_equal(sp->a->kind, N_SEL);
  assert_int_equal(sp->b->kind, E_INT);
  assert_int_equal(sp->loc.line, 2);
  assert_int_equal(sp->loc.col, 3);
  assert_int_equal(sp->loc.end_col, 35);
  ast *st = f->list.items[1];
  assert_int_equal(st->kind, S_STRATEGY);
  assert_int_equal(st->ival, 0);
  assert_int_equal(st->body.line, 4);
  assert_int_equal(st->body.end_line, 5);
  ast *rp = f->list.items[2];
  assert_int_equal(rp->kind, S_REPLICATE);
  assert_null(rp->text);
  assert_null(rp->name);
  assert_int_equal(rp->loc.end_col, 18);
  ast *rc = f->list.items[3];
  assert_int_equal(rc->kind, S_RECOMPUTE);
  assert_string_equal(rc->name, "selective");
  pt_free(p);

  expect_error("plan p for m { }", 1, 14, "unexpected '{', expected an operator or 'on'");
  expect_error("plan p for m on c", 1, 18, "unexpected end of file");
  expect_error("mesh m = devices [dp = 2]", 1, 22, "unexpected '='");
  expect_error("mesh m = devices", 1, 17, "expected an operator or 'as'");
  expect_error("split x into 2", 1, 9, "unexpected 'into', expected 'on', '[' or '.'");
  expect_error("split x on k 2", 1, 14, "expected 'into'");
  expect_error("split x on k into 2 in 3", 1, 24, "expected 'time'");
  expect_error("order a b", 1, 9, "expected 'before', '[' or '.'");
  expect_error("assign a m", 1, 10, "expected '->', '[' or '.'");
  expect_error("stage s0 h", 1, 10, "expected '='");
  expect_error("strategy s for m on c {}", 1, 12, "unexpected 'for', expected '{' or '('");
  expect_error("split {} on k into 2", 1, 8, "unexpected '}', expected identifier, '**' or '*'");
  expect_error("split h.*x on k into 2", 1, 10, "unexpected identifier 'x', expected 'on', '[' or '.'");
}

static void test_selectors(void **state) {
  (void)state;
  expect_file("recompute h.*.mlp.c_fc", "(file (recompute (sel (. (. (. h *) mlp) c_fc))))");
  expect_file("recompute h.**", "(file (recompute (sel (. h **))))");
  expect_file("recompute **.c_fc", "(file (recompute (sel (. ** c_fc))))");
  expect_file("recompute *", "(file (recompute (sel *)))");
  expect_file("recompute *.attn.*", "(file (recompute (sel (. (. * attn) *))))");
  expect_file("recompute h.{i}.attn", "(file (recompute (sel (. (.{} h i) attn))))");
  expect_file("recompute h.3.mlp", "(file (recompute (sel (. (. h 3) mlp))))");
  expect_file("recompute h[0..6]", "(file (recompute (sel (index h (.. 0 6)))))");
  expect_file("recompute h.*[a..b + 1]", "(file (recompute (sel (index (. h *) (.. a (+ b 1))))))");
  expect_file("recompute {h.*.attn, emb, s0,}", "(file (recompute (sel (. (. h *) attn) emb s0)))");
  expect_file("recompute {h}", "(file (recompute (sel h)))");
  /* path segments may be soft keywords */
  expect_file("recompute model.order.full full", "(file (recompute (sel (. (. model order) full)) full))");

  pt *p = pt_new();
  ast *f = parse(p, "order *.x before h.**");
  ast *a = f->list.items[0]->a->list.items[0];
  assert_int_equal(a->kind, E_MEMBER);
  assert_string_equal(a->name, "x");
  assert_int_equal(a->a->kind, E_NAME);
  assert_string_equal(a->a->name, "*");
  ast *b = f->list.items[0]->b->list.items[0];
  assert_int_equal(b->kind, E_MEMBER);
  assert_string_equal(b->name, "**");
  assert_null(b->b);
  assert_int_equal(b->loc.col, 18);
  assert_int_equal(b->loc.end_col, 21);
  /* "h" and "{h}" give the same tree */
  assert_true(ast_equal(parse(p, "recompute h"), parse(p, "recompute {h}")));
  assert_false(ast_equal(parse(p, "recompute h"), parse(p, "recompute {h, h}")));
  pt_free(p);
  /* "**" is one token: outside a selector it is an error */
  expect_error("x = 2 ** 3", 1, 7, "unexpected '**'");
}

static void test_schedule_grid(void **state) {
  (void)state;
  expect_file("schedule {}", "(file (schedule))");
  expect_file("schedule { s0: f0 b0 }", "(file (schedule (row s0 f0 b0)))");
  expect_file("schedule{s0:f0 . b0}x = 1", "(file (schedule (row s0 f0 . b0)) (= x 1))");
  expect_file("schedule {\n  s0: f0 f1 .\n  1 : r0 w2 b12 f3.1\n  s2:\n}\n",
              "(file (schedule (row s0 f0 f1 .) (row 1 r0 w2 b12 f3.1) (row s2)))");
  /* line breaks do not end a row; '..' is two idle cells */
  expect_file("schedule { s0: f0\n  f1 .. # note\n b0 }", "(file (schedule (row s0 f0 f1 . . b0)))");
  /* "f0." is a cell then an idle cell; "f0:" a label */
  expect_file("schedule { f0: f0. b1 }", "(file (schedule (row f0 f0 . b1)))");
  /* outside the statement, schedule is a name */
  expect_file("let schedule = { a = 1 }\nif schedule { x = schedule.a }\nschedule = 2",
              "(file (let schedule (record (= a 1))) (if schedule (then (= x (. schedule a)))) "
              "(= schedule 2))");

  pt *p = pt_new();
  ast *f = parse(p, "schedule { # c1\n  s0: f3 b12 . # c2\n  7: f3.14 w0\n}\n");
  assert_non_null(f);
  assert_int_equal(f->list2.n, 2);
  assert_string_equal(f->list2.items[0]->text, " c1");
  assert_string_equal(f->list2.items[1]->text, " c2");
  ast *s = f->list.items[0];
  assert_int_equal(s->kind, S_SCHEDULE);
  assert_int_equal(s->body.line, 1);
  assert_int_equal(s->body.col, 10);
  assert_int_equal(s->body.end_line, 4);
  assert_int_equal(s->body.end_col, 1);
  ast *r0 = s->list.items[0];
  assert_int_equal(r0->kind, N_ROW);
  assert_string_equal(r0->name, "s0");
  assert_int_equal(r0->loc.line, 2);
  assert_int_equal(r0->loc.col, 3);
  assert_int_equal(r0->loc.end_col, 14);
  assert_int_equal(r0->list.n, 3);
  ast *c = r0->list.items[0];
  assert_int_equal(c->kind, N_CELL);
  assert_int_equal(c->op, 'f');
  assert_int_equal(c->ival, 3);
  assert_null(c->a);
  assert_string_equal(c->text, "f3");
  assert_int_equal(c->loc.col, 7);
  assert_int_equal(c->loc.end_col, 8);
  c = r0->list.items[1];
  assert_int_equal(c->op, 'b');
  assert_int_equal(c->ival, 12);
  c = r0->list.items[2];
  assert_int_equal(c->op, '.');
  assert_int_equal(c->ival, 0);
  assert_string_equal(c->text, ".");
  ast *r1 = s->list.items[1];
  assert_string_equal(r1->name, "7");
  c = r1->list.items[0];
  assert_int_equal(c->op, 'f');
  assert_int_equal(c->ival, 3);
  assert_non_null(c->a);
  assert_int_equal(c->a->kind, E_INT);
  assert_int_equal(c->a->ival, 14);
  assert_string_equal(c->a->text, "14");
  assert_int_equal(r1->list.items[1]->op, 'w');
  pt_free(p);

  /* positioned errors in the grid */
  expect_error("schedule {\n  s0: f0 x b1\n}", 2, 10, "unexpected 'x' in a schedule grid; cells are f0, b0, r0, w0 or '.'");
  expect_error("schedule {\n  s0: f0 g1\n}", 2, 10, "unexpected 'g1' in a schedule grid");
  expect_error("schedule {\n  s0 f0\n}", 2, 3, "unexpected 's0' in a schedule grid");
  expect_error("schedule { s0: f0 { }", 1, 19, "unexpected '{' in a schedule grid");
  expect_error("schedule { s0: f0, b0 }", 1, 18, "unexpected ',' in a schedule grid");
  expect_error("schedule { s0: \x01 }", 1, 16, "unexpected '\\x01' in a schedule grid");
  expect_error("schedule { s0: \xc3\xa9 }", 1, 16, "unexpected '\xc3\xa9' in a schedule grid");
  expect_error("schedule { s0: \xff }", 1, 16, "invalid UTF-8");
  expect_error("schedule { s0: b99999999999999999999 }", 1, 16, "number too large in a schedule cell");
  expect_error("schedule { f0 }", 1, 12, "unexpected schedule cell 'f0', expected row label or '}'");
  expect_error("schedule { s0: f0\n", 2, 1, "unexpected end of file, expected schedule cell, row label or '}'");
  expect_error("schedule 3", 1, 10, "unexpected number '3', expected identifier, '{', '=', '(' or '.'");
  /* a generator by name */
  expect_file("schedule one_f_one_b", "(file (schedule one_f_one_b))");
  /* the hint for a word */
  p = pt_new();
  assert_null(parse(p, "schedule { s0 }"));
  assert_non_null(p->diags.items[0].hint);
  assert_non_null(strstr(p->diags.items[0].hint, "a row starts with its label and ':'"));
  pt_free(p);
  /* after a grid error the parse goes on: errors after the grid are reported */
  p = pt_new();
  assert_null(parse(p, "plan p for m on c {\n  schedule { f0 s0: f1 }\n  x = = 1\n}\ny = )\n"));
  assert_int_equal(p->diags.errors, 3);
  assert_int_equal(p->diags.items[0].loc.line, 2);
  assert_int_equal(p->diags.items[0].loc.col, 14);
  assert_int_equal(p->diags.items[1].loc.line, 3);
  assert_int_equal(p->diags.items[1].loc.col, 7);
  assert_int_equal(p->diags.items[2].loc.line, 5);
  pt_free(p);
}

/* The new keywords stay names outside the statements they start. */
static void test_soft_keywords(void **state) {
  (void)state;
  expect_file("let order = 1", "(file (let order 1))");
  expect_file("let full = true", "(file (let full true))");
  expect_file("fn f(time) = time", "(file (fn f (time) time))");
  expect_file("let x = { on = 1, into = 2, as = 3, before = 4, selective = 5 }",
              "(file (let x (record (= on 1) (= into 2) (= as 3) (= before 4) (= selective 5))))");
  expect_file("param strategy = 2\nparam mesh = 3\nlet split = mesh + strategy",
              "(file (param strategy 2) (param mesh 3) (let split (+ mesh strategy)))");
  expect_file("fn f(replicate, assign, stage, schedule, recompute) = replicate",
              "(file (fn f (replicate assign stage schedule recompute) replicate))");
  expect_file("order = 1\nfull.x = 2\ntime = 3\nstage = 4\nsplit.y = 5",
              "(file (= order 1) (= (. full x) 2) (= time 3) (= stage 4) (= (. split y) 5))");
  expect_file("model time(order = 1) { input full : [order] }",
              "(file (model time ((= order 1)) (input full (type _ order))))");
  expect_file("let y = x.on.into.as.time", "(file (let y (. (. (. (. x on) into) as) time)))");
  expect_file("for time in 0..order { }", "(file (for time (.. 0 order)))");
  /* names of plan parts */
  expect_file("plan order for full on time { stage before = after }",
              "(file (plan order (for full) (on time) (stage (= before (sel after)))))");
  expect_file("mesh as = on as [into = 2]", "(file (mesh as on (= into 2)))");
  expect_file("split on on on into into as as in time",
              "(file (split (sel on) on into (as as) (in time)))");
  /* a statement that ends where an optional word may follow takes the word:
   * ';' ends it first */
  expect_file("replicate x into n; as = 1", "(file (replicate (sel x) n) (= as 1))");
  expect_file("recompute x; full = 1", "(file (recompute (sel x)) (= full 1))");
  expect_error("recompute x\nfull = 1", 2, 6, "unexpected '='");
  /* and "," continues assign and stage lists */
  expect_error("assign a -> 0, assign b -> 1", 1, 23, "unexpected identifier 'b'");
  /* error recovery restarts at the new statement keywords (a name would
   * not end the recovery) */
  pt *p = pt_new();
  assert_null(parse(p, "x = = 1 split 3"));
  assert_int_equal(p->diags.errors, 2);
  assert_int_equal(p->diags.items[1].loc.col, 15);
  pt_free(p);
  p = pt_new();
  assert_null(parse(p, "x = = 1 foo 3"));
  assert_int_equal(p->diags.errors, 1);
  pt_free(p);
  /* 'plan' is not a name */
  expect_error("fn f(plan) = 1", 1, 6, "unexpected 'plan'");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_integers),
    cmocka_unit_test(test_floats),
    cmocka_unit_test(test_quantities),
    cmocka_unit_test(test_strings),
    cmocka_unit_test(test_precedence),
    cmocka_unit_test(test_paths),
    cmocka_unit_test(test_statements),
    cmocka_unit_test(test_op_patterns),
    cmocka_unit_test(test_syntax_errors),
    cmocka_unit_test(test_several_errors),
    cmocka_unit_test(test_deep_nesting),
    cmocka_unit_test(test_nul_and_utf8),
    cmocka_unit_test(test_empty_and_comments),
    cmocka_unit_test(test_locations),
    cmocka_unit_test(test_parse_expr),
    cmocka_unit_test(test_ast_equal),
    cmocka_unit_test(test_plan_statements),
    cmocka_unit_test(test_selectors),
    cmocka_unit_test(test_schedule_grid),
    cmocka_unit_test(test_soft_keywords),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
