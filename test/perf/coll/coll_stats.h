/*
 * The harness's robust time (-T K), as pure functions (unit-tested in test/unit without a GPU).
 * The -n timed iterations are split into n / K batches of K iterations (the last batch also
 * takes the n % K left over); an event on each GPU's stream before every batch and after the
 * last gives each batch's time, and the harness reports the median batch's time per iteration.
 * One stall (a descheduled host thread, a late peer) then moves one batch, not the result, as
 * it moves a mean over all n. Batches of several iterations keep the event timer's resolution
 * (about 0.5 us, CUDA's documentation says) small beside a batch of ~10 us collectives.
 */
#ifndef MK_COLL_STATS_H_
#define MK_COLL_STATS_H_

#include "perf_median.h" /* perf_median: the batches' median */

/* Number of batches: n / K, at least 1 (K <= n is checked by the argument parser). */
static inline int coll_batch_count(int iters, int batch) {
  int nb = batch > 0 ? iters / batch : 1;
  return nb > 0 ? nb : 1;
}

/* The event index recorded before iteration i (i == iters: after the last one), or -1 when no
 * event goes there. batch 0 (the default mean): only the first (0) and the last (1). */
static inline int coll_mark_index(int iters, int batch, int i) {
  if (batch < 1) return i == 0 ? 0 : i == iters ? 1 : -1;
  int nb = coll_batch_count(iters, batch);
  if (i == iters) return nb;
  return i % batch == 0 && i / batch < nb ? i / batch : -1;
}

/* Events one timed loop records: batches + 1, or 2 for the mean. */
static inline int coll_mark_count(int iters, int batch) {
  return batch < 1 ? 2 : coll_batch_count(iters, batch) + 1;
}

/* Iterations in batch b (the last one takes the remainder). */
static inline int coll_batch_iters(int iters, int batch, int b) {
  int nb = coll_batch_count(iters, batch);
  return b == nb - 1 ? iters - b * batch : batch;
}

#endif /* MK_COLL_STATS_H_ */
