/* The collectives harness's robust time (test/perf/coll/coll_stats.h): where the timed loop
 * puts its events, how many iterations each batch holds, and the median that one stall
 * cannot move. */
#include "coll_stats.h"
#include "mk_test.h"

/* Every iteration falls in exactly one batch, batches are in order, and the events the loop
 * records are 0..count-1, each once, the last one after the last iteration. */
static void batches_cover_every_iteration_once(int iters, int batch) {
  int nmarks = coll_mark_count(iters, batch), seen = 0, last = -1, total = 0;
  for (int i = 0; i <= iters; i++) {
    int m = coll_mark_index(iters, batch, i);
    if (m < 0) continue;
    CHECK_EQ(m, last + 1);
    last = m, seen++;
  }
  CHECK_EQ(seen, nmarks);
  CHECK_EQ(coll_mark_index(iters, batch, 0), 0);
  CHECK_EQ(coll_mark_index(iters, batch, iters), nmarks - 1);
  if (batch < 1) return;
  for (int b = 0; b < nmarks - 1; b++) {
    int n = coll_batch_iters(iters, batch, b);
    CHECK(n >= batch && n < 2 * batch);
    total += n;
  }
  CHECK_EQ(total, iters);
}

static void mean_mode_records_first_and_last_only(void) {
  CHECK_EQ(coll_mark_count(20, 0), 2);
  CHECK_EQ(coll_mark_index(20, 0, 0), 0);
  CHECK_EQ(coll_mark_index(20, 0, 10), -1);
  CHECK_EQ(coll_mark_index(20, 0, 20), 1);
  CHECK_EQ(coll_mark_index(1, 0, 1), 1);
}

static void batch_layout(void) {
  CHECK_EQ(coll_batch_count(30, 5), 6);
  CHECK_EQ(coll_mark_count(30, 5), 7);
  CHECK_EQ(coll_batch_count(32, 5), 6); /* the last batch takes 7 */
  CHECK_EQ(coll_batch_iters(32, 5, 5), 7);
  CHECK_EQ(coll_batch_iters(32, 5, 0), 5);
  CHECK_EQ(coll_mark_index(32, 5, 30), -1); /* no 7th batch of 2 */
  CHECK_EQ(coll_mark_index(32, 5, 32), 6);
  CHECK_EQ(coll_batch_count(7, 7), 1);
  CHECK_EQ(coll_mark_count(4, 1), 5);
}

static void median_ignores_one_stall(void) {
  double odd[] = {10.2, 500.0, 10.0, 10.1, 9.9};
  CHECK(perf_median(odd, 5) == 10.1);
  double even[] = {10.0, 10.4, 480.0, 10.2, 9.8, 10.6};
  CHECK(perf_median(even, 6) > 10.29 && perf_median(even, 6) < 10.31);
  double one[] = {7.0};
  CHECK(perf_median(one, 1) == 7.0);
  double two[] = {8.0, 6.0};
  CHECK(perf_median(two, 2) == 7.0);
  CHECK(perf_median(one, 0) < 0);
}

int main(void) {
  mean_mode_records_first_and_last_only();
  batch_layout();
  median_ignores_one_stall();
  int iters[] = {1, 2, 5, 20, 30, 31, 64, 97};
  for (int i = 0; i < (int)(sizeof(iters) / sizeof(iters[0])); i++)
    for (int k = 0; k <= iters[i]; k++) batches_cover_every_iteration_once(iters[i], k);
  return MK_TEST_RESULT();
}
