/*
 * The harness's robust time (-T K) and its A/B interleaving (-A F), as pure functions
 * (unit-tested in test/unit without a GPU).
 * The -n timed iterations are split into n / K batches of K iterations (the last batch also
 * takes the n % K left over); without -T there is one batch of all n (the mean, as
 * nccl-tests). An event on each GPU's stream before every batch and after the last gives each
 * batch's time, and the harness reports the median batch's time per iteration. One stall (a
 * descheduled host thread, a late peer) then moves one batch, not the result, as it moves a
 * mean over all n. Batches of several iterations keep the event timer's resolution (about
 * 0.5 us, CUDA's documentation says) small beside a batch of ~10 us collectives.
 * With -A the two sides take turns batch by batch (A1 B1 A2 B2 ... or B1 A1 B2 A2 ...): the
 * timed pass is batches x sides segments, one event before each and one after the last, so
 * each side's batch b lies between two events of its own and next to the other side's batch b
 * in time; drift between the sides is then at most one batch long, not one -n block.
 */
#ifndef MK_COLL_STATS_H_
#define MK_COLL_STATS_H_

#include "perf_median.h" /* perf_median: the batches' median */

/* Number of batches: n / K, at least 1 (K <= n is checked by the argument parser); 1 without
 * -T (batch 0: the mean over all n). */
static inline int coll_batch_count(int iters, int batch) {
  int nb = batch > 0 ? iters / batch : 1;
  return nb > 0 ? nb : 1;
}

/* Iterations in batch b (the last one takes the remainder). */
static inline int coll_batch_iters(int iters, int batch, int b) {
  int nb = coll_batch_count(iters, batch);
  return b == nb - 1 ? iters - b * batch : batch;
}

/* Events one timed pass records on each GPU: one before every batch of every side (1, or 2
 * with -A) and one after the last. */
static inline int coll_mark_count(int iters, int batch, int sides) {
  return coll_batch_count(iters, batch) * sides + 1;
}

/* The segment (and the index of the event before it) of batch b of the side in position pos
 * of each turn (0: the side that opens every turn); its end is the next event. */
static inline int coll_batch_mark(int b, int sides, int pos) {
  return b * sides + pos;
}

#endif /* MK_COLL_STATS_H_ */
