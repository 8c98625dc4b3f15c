/*
 * Minimal assertions for the C tests: each failed CHECK prints file:line and the expression
 * and is counted; REQUIRE also stops the test. End main with `return MK_TEST_RESULT();`.
 * A test that cannot run on this machine calls MK_TEST_SKIP("why") (exit 77: meson's skip).
 */
#ifndef MK_TEST_H_
#define MK_TEST_H_

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mk_test_failures;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      mk_test_failures++;                                                  \
    }                                                                      \
  } while (0)

#define CHECK_EQ(a, b)                                                             \
  do {                                                                             \
    long long mk_a_ = (long long)(a), mk_b_ = (long long)(b);                      \
    if (mk_a_ != mk_b_) {                                                          \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__, \
              __LINE__, #a, #b, mk_a_, mk_b_);                                     \
      mk_test_failures++;                                                          \
    }                                                                              \
  } while (0)

#define CHECK_STR(a, b)                                                                  \
  do {                                                                                   \
    const char *mk_a_ = (a), *mk_b_ = (b);                                               \
    if (!mk_a_ || !mk_b_ || strcmp(mk_a_, mk_b_) != 0) {                                 \
      fprintf(stderr, "%s:%d: CHECK_STR failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__, \
              mk_a_ ? mk_a_ : "(null)", mk_b_ ? mk_b_ : "(null)");                       \
      mk_test_failures++;                                                                \
    }                                                                                    \
  } while (0)

#define REQUIRE(cond)                                                        \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define MK_TEST_SKIP(why)                      \
  do {                                         \
    fprintf(stderr, "SKIP: %s\n", (why));      \
    exit(77);                                  \
  } while (0)

#define MK_TEST_RESULT() (mk_test_failures ? (fprintf(stderr, "%d check(s) failed\n", \
                                                      mk_test_failures), 1) : 0)

#endif /* MK_TEST_H_ */
