/* test_htab.c - the hash table and the growable array of src/base:
 * entries found by key through collisions, forgotten from the end and
 * found again after growth, on the heap and in an arena. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/htab.h"
#include "base/vec.h"

typedef VEC(int) ivec;

typedef struct lookup {
  const ivec *keys;
  int key;
} lookup;

static bool same_key(const void *ctx, int e) {
  const lookup *k = ctx;
  return k->keys->v[e] == k->key;
}

/* A hash that keeps a key's low 3 bits only: keys collide by the hundred. */
static uint64_t weak_hash(int key) { return (uint64_t)(key & 7); }

static int find(const htab *t, const ivec *keys, int key) {
  lookup k = {keys, key};
  return htab_find(t, weak_hash(key), same_key, &k);
}

static void add(htab *t, ivec *keys, int key) {
  vec_push(t->a, keys, key);
  assert_int_equal(htab_add(t, weak_hash(key)), keys->n - 1);
}

static void check_table(htab *t, ivec *keys) {
  for (int i = 0; i < 1000; i++) add(t, keys, 3 * i);
  for (int i = 0; i < 1000; i++) assert_int_equal(find(t, keys, 3 * i), i);
  assert_int_equal(find(t, keys, 1), -1);
  /* forgetting the last entries leaves the others found, through the
   * same collisions */
  htab_truncate(t, 400);
  keys->n = 400;
  for (int i = 0; i < 1000; i++) assert_int_equal(find(t, keys, 3 * i), i < 400 ? i : -1);
  for (int i = 400; i < 3000; i++) add(t, keys, 5 * i);
  for (int i = 0; i < 400; i++) assert_int_equal(find(t, keys, 3 * i), i);
  for (int i = 400; i < 3000; i++) assert_int_equal(find(t, keys, 5 * i), i);
  htab_truncate(t, 0);
  keys->n = 0;
  assert_int_equal(find(t, keys, 0), -1);
  add(t, keys, 42);
  assert_int_equal(find(t, keys, 42), 0);
}

static void test_heap(void **state) {
  (void)state;
  htab t = {0};
  ivec keys = {0};
  check_table(&t, &keys);
  htab_free(&t);
  vec_free(&keys);
}

static void test_arena(void **state) {
  (void)state;
  arena a;
  arena_init(&a);
  htab t = {.a = &a};
  ivec keys = {0};
  htab_reserve(&t, 100);
  check_table(&t, &keys);
  htab_free(&t);
  arena_free(&a);
}

/* A hash that is the key: no equality test. */
static void test_hash_is_key(void **state) {
  (void)state;
  htab t = {0};
  for (uint64_t k = 0; k < 5000; k++) assert_int_equal(htab_add(&t, k << 32 | (k * 7)), (int)k);
  for (uint64_t k = 0; k < 5000; k++) assert_int_equal(htab_find(&t, k << 32 | (k * 7), NULL, NULL), (int)k);
  assert_int_equal(htab_find(&t, 1, NULL, NULL), -1);
  htab_free(&t);
  assert_int_equal(htab_find(&t, 0, NULL, NULL), -1);
}

static void test_vec(void **state) {
  (void)state;
  ivec v = {0};
  for (int i = 0; i < 100000; i++) vec_push(NULL, &v, i);
  assert_int_equal(v.n, 100000);
  for (int i = 0; i < v.n; i++) assert_int_equal(v.v[i], i);
  /* a reservation is what it asks for, not the next power of 2 */
  ivec r = {0};
  vec_reserve(NULL, &r, 1000);
  assert_int_equal(r.cap, 1000);
  vec_free(&v);
  vec_free(&r);
  assert_null(v.v);
  arena a;
  arena_init(&a);
  ivec w = {0};
  for (int i = 0; i < 1000; i++) vec_push(&a, &w, -i);
  for (int i = 0; i < w.n; i++) assert_int_equal(w.v[i], -i);
  arena_free(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_heap),
    cmocka_unit_test(test_arena),
    cmocka_unit_test(test_hash_is_key),
    cmocka_unit_test(test_vec),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
