/* Schedules for 2 to 16 ranks: every order is a permutation, local work comes first where
 * it should, and the ring pairs each sender with exactly one receiver per step. */
#include <string.h>

#include "mk_test.h"
#include "schedule.h"

static void ag_ring_is_a_permutation_starting_at_self(int n) {
  for (int r = 0; r < n; r++) {
    int seen[16] = {0};
    CHECK_EQ(mk_sched_ag_source(r, n, 0), r);
    for (int s = 0; s < n; s++) seen[mk_sched_ag_source(r, n, s)]++;
    for (int p = 0; p < n; p++) CHECK_EQ(seen[p], 1);
  }
}

static void ag_push_and_arrival_agree(int n) {
  /* At step s, the peer that r pushes to receives r's shard at its own step s. */
  for (int r = 0; r < n; r++)
    for (int s = 1; s < n; s++) CHECK_EQ(mk_sched_ag_source(mk_sched_ag_dest(r, n, s), n, s), r);
  /* At each step, the destinations of all ranks are distinct (no receiver is hit twice). */
  for (int s = 1; s < n; s++) {
    int hits[16] = {0};
    for (int r = 0; r < n; r++) hits[mk_sched_ag_dest(r, n, s)]++;
    for (int p = 0; p < n; p++) CHECK_EQ(hits[p], 1);
  }
}

static void ag_blocks_cover_every_row_block_once_local_first(int n, int bps) {
  for (int r = 0; r < n; r++) {
    static int seen[16 * 64];
    memset(seen, 0, sizeof(seen));
    for (int i = 0; i < n * bps; i++) {
      int shard, block;
      mk_sched_ag_block(r, n, bps, i, &shard, &block);
      CHECK(shard >= 0 && shard < n && block >= 0 && block < bps);
      if (i < bps) CHECK_EQ(shard, r);
      seen[shard * bps + block]++;
    }
    for (int j = 0; j < n * bps; j++) CHECK_EQ(seen[j], 1);
  }
}

/* The i-th row-block rank r computes is row-block (r x bps + i) mod (n x bps): a rotation,
 * which the GEMM core walks without an order table. */
static void ag_order_is_the_rotation_from_the_own_shard(int n, int bps) {
  for (int r = 0; r < n; r++)
    for (int i = 0; i < n * bps; i++) {
      int shard, block;
      mk_sched_ag_block(r, n, bps, i, &shard, &block);
      CHECK_EQ(shard * bps + block, (r * bps + i) % (n * bps));
    }
}

static void rs_order_ends_with_own_shard_and_spreads_first_sends(int n) {
  int first_hits[16] = {0};
  for (int r = 0; r < n; r++) {
    int seen[16] = {0};
    for (int i = 0; i < n; i++) seen[mk_sched_rs_shard(r, n, i)]++;
    for (int p = 0; p < n; p++) CHECK_EQ(seen[p], 1);
    CHECK_EQ(mk_sched_rs_shard(r, n, n - 1), r);
    first_hits[mk_sched_rs_shard(r, n, 0)]++;
  }
  for (int p = 0; p < n; p++) CHECK_EQ(first_hits[p], 1);
}

static void rs_row_blocks_cover_every_block_once_own_shard_last(int n, int bps) {
  for (int r = 0; r < n; r++) {
    int seen[16 * 7] = {0};
    for (int pos = 0; pos < n * bps; pos++) seen[mk_sched_rs_row_block(r, n, bps, pos)]++;
    for (int j = 0; j < n * bps; j++) CHECK_EQ(seen[j], 1);
    for (int pos = (n - 1) * bps; pos < n * bps; pos++) CHECK_EQ(mk_sched_rs_row_block(r, n, bps, pos) / bps, r);
    /* a rotation: the GEMM core walks it as row_block_rotate = the first position's block */
    for (int pos = 0; pos < n * bps; pos++)
      CHECK_EQ(mk_sched_rs_row_block(r, n, bps, pos), (pos + mk_sched_rs_row_block(r, n, bps, 0)) % (n * bps));
  }
}

static void rs_slots_of_an_owner_are_distinct_and_dense(int n) {
  for (int d = 0; d < n; d++) {
    int seen[16] = {0};
    for (int src = 0; src < n; src++)
      if (src != d) seen[mk_sched_rs_slot(src, d)]++;
    for (int i = 0; i < n - 1; i++) CHECK_EQ(seen[i], 1);
    CHECK_EQ(seen[n - 1], 0);
  }
}

static void row_owner_splits_rows_evenly(int n) {
  long m = 96L * n;
  int count[16] = {0};
  for (long row = 0; row < m; row++) count[mk_sched_row_owner(row, m, n)]++;
  for (int p = 0; p < n; p++) CHECK_EQ(count[p], 96);
}

int main(void) {
  for (int n = 2; n <= 16; n++) {
    ag_ring_is_a_permutation_starting_at_self(n);
    ag_push_and_arrival_agree(n);
    ag_blocks_cover_every_row_block_once_local_first(n, 1);
    ag_blocks_cover_every_row_block_once_local_first(n, 7);
    ag_order_is_the_rotation_from_the_own_shard(n, 1);
    ag_order_is_the_rotation_from_the_own_shard(n, 7);
    rs_order_ends_with_own_shard_and_spreads_first_sends(n);
    rs_row_blocks_cover_every_block_once_own_shard_last(n, 1);
    rs_row_blocks_cover_every_block_once_own_shard_last(n, 7);
    rs_slots_of_an_owner_are_distinct_and_dense(n);
    row_owner_splits_rows_evenly(n);
  }
  CHECK_EQ(mk_sched_blocks_per_shard(4096, 128), 32);
  CHECK_EQ(mk_sched_blocks_per_shard(4097, 128), 33);
  CHECK_EQ(mk_sched_blocks_per_shard(1, 128), 1);
  return MK_TEST_RESULT();
}
