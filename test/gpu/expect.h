/*
 * The single-process GPU tests' assertion: EXPECT(cond, fmt, ...) prints file:line and the
 * message when cond is false and counts it in `failures`; main ends with failures ? 1 : 0.
 */
#ifndef MK_TEST_EXPECT_H_
#define MK_TEST_EXPECT_H_

#include <stdio.h>
#include <string.h>

static int failures;

#define EXPECT(cond, ...)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);   \
      fprintf(stderr, __VA_ARGS__);                           \
      fprintf(stderr, "\n");                                  \
      failures++;                                             \
    }                                                         \
  } while (0)

/* A single-process GPU test program's behaviours by name: `what` (argv[1]) runs the one of
 * that name, "all" every one in order; prints the name, then "<what>: passed|FAILED (N
 * failures)". Returns main's exit code: 0, 1 (failures) or 2 (no such behaviour). */
struct named_test {
  const char* name;
  void (*run)(void);
};

static inline int run_named_tests(const char* what, const struct named_test* tests, int n) {
  const int all = !strcmp(what, "all");
  int known = all;
  for (int i = 0; i < n; i++)
    if (all || !strcmp(what, tests[i].name)) known = 1, printf("%s\n", tests[i].name), tests[i].run();
  if (!known) {
    fprintf(stderr, "unknown test '%s'\n", what);
    return 2;
  }
  printf("%s: %s (%d failures)\n", what, failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}

#endif /* MK_TEST_EXPECT_H_ */
