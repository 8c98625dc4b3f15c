/*
 * The median the harnesses report (every timed figure is a median over iterations or batches),
 * one copy for all of them; unit-tested in test/unit/test_coll_stats.c.
 */
#ifndef MK_PERF_MEDIAN_H_
#define MK_PERF_MEDIAN_H_

#include <stdlib.h>

static inline int perf_cmp_double(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

/* Median of v[0..n) (sorts v); the mean of the two middle values when n is even; -1 when empty. */
static inline double perf_median(double* v, int n) {
  if (n < 1) return -1;
  qsort(v, (size_t)n, sizeof(*v), perf_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif /* MK_PERF_MEDIAN_H_ */
