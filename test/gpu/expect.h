/*
 * The single-process GPU tests' assertion: EXPECT(cond, fmt, ...) prints file:line and the
 * message when cond is false and counts it in `failures`; main ends with failures ? 1 : 0.
 */
#ifndef MK_TEST_EXPECT_H_
#define MK_TEST_EXPECT_H_

#include <stdio.h>

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

#endif /* MK_TEST_EXPECT_H_ */
