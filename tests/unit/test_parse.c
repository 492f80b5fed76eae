/* test_parse.c - the scanner and parser (grammar/lexer.l, grammar/parser.y)
 * and the tree helpers of interp/ast.c: literals, precedence, paths, every
 * statement, op patterns, positioned errors and hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ast.h"

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
  expect_error("plan p { }", 1, 1, "unexpected 'plan'");
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
  pt_free(p);
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
