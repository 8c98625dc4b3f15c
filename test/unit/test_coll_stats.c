/* The collectives harness's robust time (test/perf/coll/coll_stats.h): where the timed pass
 * puts its events (one side, or the two sides of -A taking turns batch by batch), how many
 * iterations each batch holds, and the median that one stall cannot move. */
#include "coll_stats.h"
#include "mk_test.h"

/* Every iteration falls in exactly one batch and the batches hold K..2K-1 iterations each;
 * with `sides` sides taking turns, the events before each side's batches are 0..count-2, each
 * once and in order, the last event (count-1) after the last batch, and one side's batch b
 * sits next to the other side's batch b. */
static void batches_cover_every_iteration_once(int iters, int batch, int sides) {
  int nb = coll_batch_count(iters, batch), total = 0, next = 0;
  CHECK_EQ(coll_mark_count(iters, batch, sides), nb * sides + 1);
  for (int b = 0; b < nb; b++) {
    int n = coll_batch_iters(iters, batch, b);
    CHECK(batch < 1 ? n == iters : n >= batch && n < 2 * batch);
    total += n;
    for (int pos = 0; pos < sides; pos++) CHECK_EQ(coll_batch_mark(b, sides, pos), next++);
    if (sides == 2) CHECK_EQ(coll_batch_mark(b, 2, 1) - coll_batch_mark(b, 2, 0), 1);
  }
  CHECK_EQ(total, iters);
  CHECK_EQ(next, coll_mark_count(iters, batch, sides) - 1);
}

static void mean_mode_is_one_batch_of_all_iterations(void) {
  CHECK_EQ(coll_batch_count(20, 0), 1);
  CHECK_EQ(coll_batch_iters(20, 0, 0), 20);
  CHECK_EQ(coll_mark_count(20, 0, 1), 2);
  CHECK_EQ(coll_mark_count(20, 0, 2), 3); /* -A without -T: A's -n block, then B's */
  CHECK_EQ(coll_batch_iters(1, 0, 0), 1);
}

static void batch_layout(void) {
  CHECK_EQ(coll_batch_count(30, 5), 6);
  CHECK_EQ(coll_mark_count(30, 5, 1), 7);
  CHECK_EQ(coll_batch_count(32, 5), 6); /* the last batch takes 7 */
  CHECK_EQ(coll_batch_iters(32, 5, 5), 7);
  CHECK_EQ(coll_batch_iters(32, 5, 0), 5);
  CHECK_EQ(coll_batch_count(7, 7), 1);
  CHECK_EQ(coll_mark_count(4, 1, 1), 5);
}

/* -A: A1 B1 A2 B2 ...: 2 x 6 segments, 13 events; the second side's batch 5 is the last one. */
static void ab_turns_interleave_batch_by_batch(void) {
  CHECK_EQ(coll_mark_count(30, 5, 2), 13);
  CHECK_EQ(coll_batch_mark(0, 2, 0), 0);
  CHECK_EQ(coll_batch_mark(0, 2, 1), 1);
  CHECK_EQ(coll_batch_mark(1, 2, 0), 2);
  CHECK_EQ(coll_batch_mark(5, 2, 1), 11);
  CHECK_EQ(coll_batch_mark(3, 1, 0), 3); /* one side: batch b between events b and b + 1 */
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
  mean_mode_is_one_batch_of_all_iterations();
  batch_layout();
  ab_turns_interleave_batch_by_batch();
  median_ignores_one_stall();
  int iters[] = {1, 2, 5, 20, 30, 31, 64, 97};
  for (int i = 0; i < (int)(sizeof(iters) / sizeof(iters[0])); i++)
    for (int k = 0; k <= iters[i]; k++)
      for (int sides = 1; sides <= 2; sides++)
        batches_cover_every_iteration_once(iters[i], k, sides);
  return MK_TEST_RESULT();
}
