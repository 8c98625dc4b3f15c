/* Hierarchical schedules (fused/comm/schedule_xnode.h) for 2 to 16 ranks in nodes of 1, 2, 4
 * and 8 ranks: the schedules are run step by step on every rank at once, so that "arrives
 * exactly once", "no receiver is hit twice in a step" and "nodes - 1 RDMA transfers per rank"
 * are checked on what is actually sent, not only on the order functions. */
#include <string.h>

#include "mk_test.h"
#include "schedule_xnode.h"

enum { MAXR = 16 };

/* One transfer of shard from src to dst in the current step: src must hold it, dst must not
 * (arrives once), and dst must not have been hit already in this step. */
static void ag_deliver(int have[MAXR][MAXR], int hits[MAXR], int order[MAXR][MAXR],
                       int count[MAXR], int src, int dst, int shard) {
  CHECK(have[src][shard]);
  CHECK(!have[dst][shard]);
  CHECK_EQ(hits[dst], 0);
  hits[dst]++;
  have[dst][shard] = 1;
  order[dst][count[dst]++] = shard;
}

/* Runs AllGather: node step t's RDMA pushes, then its local steps' NVLink forwards. Checks
 * that every shard reaches every rank exactly once, in mk_sched_xag_source order, and that
 * each rank receives nodes - 1 shards over RDMA (not nranks - local). */
static void ag_every_shard_arrives_once_in_source_order_with_nodes_minus_1_rdma(int n, int L) {
  int nodes = mk_xn_nodes(n, L), have[MAXR][MAXR] = {{0}}, order[MAXR][MAXR], count[MAXR];
  int rdma_in[MAXR] = {0};
  for (int r = 0; r < n; r++) { have[r][r] = 1; order[r][0] = r; count[r] = 1; }
  for (int t = 0; t < nodes; t++) {
    if (t > 0) {
      int hits[MAXR] = {0};
      for (int r = 0; r < n; r++) {
        int dst = mk_sched_xag_rdma_dest(r, n, L, t);
        CHECK(mk_xn_node(dst, L) != mk_xn_node(r, L) && mk_xn_lidx(dst, L) == mk_xn_lidx(r, L));
        CHECK_EQ(mk_sched_xag_rdma_source(dst, n, L, t), r);
        ag_deliver(have, hits, order, count, r, dst, r);
        rdma_in[dst]++;
      }
    }
    for (int j = 1; j < L; j++) {
      int hits[MAXR] = {0};
      for (int r = 0; r < n; r++) {
        int dst = mk_sched_xag_nvl_dest(r, n, L, j);
        CHECK(dst != r && mk_xn_node(dst, L) == mk_xn_node(r, L));
        CHECK_EQ(mk_sched_xag_nvl_from(dst, n, L, j), r);
        ag_deliver(have, hits, order, count, r, dst, mk_sched_xag_nvl_shard(r, n, L, t));
      }
    }
  }
  for (int r = 0; r < n; r++) {
    CHECK_EQ(count[r], n);
    CHECK_EQ(rdma_in[r], nodes - 1);
    for (int s = 0; s < n; s++) {
      CHECK_EQ(order[r][s], mk_sched_xag_source(r, n, L, s));
      /* the RDMA steps are exactly those whose shard is a counterpart's in another node */
      int src = order[r][s];
      int remote_counterpart = mk_xn_node(src, L) != mk_xn_node(r, L) && mk_xn_lidx(src, L) == mk_xn_lidx(r, L);
      CHECK_EQ(mk_sched_xag_step_is_rdma(L, s), remote_counterpart);
    }
  }
}

/* Own shard first, then the local peers' (no RDMA wait), then remote shards; every row-block
 * exactly once. */
static void ag_blocks_own_first_then_local_peers_then_remote(int n, int L, int bps) {
  for (int r = 0; r < n; r++) {
    int seen[MAXR * 7] = {0};
    for (int i = 0; i < n * bps; i++) {
      int shard, block;
      mk_sched_xag_block(r, n, L, bps, i, &shard, &block);
      CHECK(shard >= 0 && shard < n && block >= 0 && block < bps);
      if (i < bps) CHECK_EQ(shard, r);
      int same_node = mk_xn_node(shard, L) == mk_xn_node(r, L);
      CHECK_EQ(same_node, i < L * bps);
      seen[shard * bps + block]++;
    }
    for (int b = 0; b < n * bps; b++) CHECK_EQ(seen[b], 1);
  }
}

/* One node (local == nranks) or one rank per node (local == 1) is the single-node rotation. */
static void ag_and_rs_reduce_to_the_single_node_orders(int n) {
  for (int r = 0; r < n; r++)
    for (int s = 0; s < n; s++) {
      CHECK_EQ(mk_sched_xag_source(r, n, n, s), mk_sched_ag_source(r, n, s));
      CHECK_EQ(mk_sched_xag_source(r, n, 1, s), mk_sched_ag_source(r, n, s));
      CHECK_EQ(mk_sched_xrs_shard(r, n, n, s), mk_sched_rs_shard(r, n, s));
      CHECK_EQ(mk_sched_xrs_shard(r, n, 1, s), mk_sched_rs_shard(r, n, s));
    }
}

/* Adds the partial sum `add` (a mask of the ranks it holds) into what dst holds of shard:
 * no rank's partial may be added twice, and no receiver is hit twice in a step. */
static void rs_deliver(unsigned acc[MAXR][MAXR], int hits[MAXR], int dst, int shard,
                       unsigned add) {
  CHECK_EQ(acc[dst][shard] & add, 0);
  CHECK_EQ(hits[dst], 0);
  hits[dst]++;
  acc[dst][shard] |= add;
}

/* One position of GEMM+ReduceScatter on every rank: compute the shard's partial, send it over
 * NVLink to the local peer that reduces it (or keep it). */
static void rs_run_position(unsigned acc[MAXR][MAXR], int n, int L, int i) {
  int hits[MAXR] = {0};
  for (int r = 0; r < n; r++) {
    int shard = mk_sched_xrs_shard(r, n, L, i), dst = mk_sched_xrs_nvl_dest(r, n, L, i);
    CHECK_EQ(acc[r][shard] & (1u << r), 0);
    acc[r][shard] |= 1u << r;
    if (dst < 0) continue;
    CHECK(dst != r && mk_xn_node(dst, L) == mk_xn_node(r, L));
    CHECK_EQ(mk_xn_lidx(dst, L), mk_xn_lidx(shard, L));
    rs_deliver(acc, hits, dst, shard, 1u << r);
    acc[r][shard] &= ~(1u << r); /* sent: r no longer holds it */
  }
}

/* Runs GEMM+ReduceScatter: after each remote node's positions, one RDMA transfer per rank of
 * that node's complete sum (every local partial reduced first). Every owner ends with every
 * rank's partial exactly once; each rank sends nodes - 1 shards over RDMA. */
static void rs_every_partial_reaches_its_owner_once_with_nodes_minus_1_rdma(int n, int L) {
  int nodes = mk_xn_nodes(n, L), rdma_out[MAXR] = {0};
  unsigned acc[MAXR][MAXR] = {{0}};
  for (int t = 0; t < nodes; t++) {
    for (int j = 0; j < L; j++) rs_run_position(acc, n, L, t * L + j);
    if (t == nodes - 1) break; /* own node: its shards went straight to their owners */
    int hits[MAXR] = {0};
    for (int r = 0; r < n; r++) {
      int dst = mk_sched_xrs_rdma_dest(r, n, L, t);
      unsigned node_mask = ((1u << L) - 1) << (mk_xn_node(r, L) * L);
      CHECK(mk_xn_node(dst, L) != mk_xn_node(r, L) && mk_xn_lidx(dst, L) == mk_xn_lidx(r, L));
      CHECK_EQ(mk_sched_xrs_rdma_source(dst, n, L, t), r);
      CHECK_EQ(acc[r][dst], node_mask); /* reduced inside the node before the one transfer */
      rs_deliver(acc, hits, dst, dst, acc[r][dst]);
      acc[r][dst] = 0;
      rdma_out[r]++;
    }
  }
  unsigned all = (1u << n) - 1;
  for (int r = 0; r < n; r++) {
    CHECK_EQ(acc[r][r], all);
    CHECK_EQ(rdma_out[r], nodes - 1);
  }
}

/* Remote owners first, own node after, own shard last; row-blocks each once. */
static void rs_blocks_remote_owners_first_own_shard_last(int n, int L, int bps) {
  for (int r = 0; r < n; r++) {
    int seen[MAXR * 7] = {0};
    for (int pos = 0; pos < n * bps; pos++) {
      int rb = mk_sched_xrs_row_block(r, n, L, bps, pos), shard = rb / bps;
      seen[rb]++;
      int remote = mk_xn_node(shard, L) != mk_xn_node(r, L);
      CHECK_EQ(remote, pos < (n - L) * bps);
      if (pos >= (n - 1) * bps) CHECK_EQ(shard, r);
    }
    for (int b = 0; b < n * bps; b++) CHECK_EQ(seen[b], 1);
  }
}

int main(void) {
  static const int locals[] = {1, 2, 4, 8};
  for (int n = 2; n <= MAXR; n++) {
    ag_and_rs_reduce_to_the_single_node_orders(n);
    for (unsigned k = 0; k < sizeof(locals) / sizeof(locals[0]); k++) {
      int L = locals[k];
      if (L > n || n % L) continue;
      ag_every_shard_arrives_once_in_source_order_with_nodes_minus_1_rdma(n, L);
      ag_blocks_own_first_then_local_peers_then_remote(n, L, 1);
      ag_blocks_own_first_then_local_peers_then_remote(n, L, 7);
      rs_every_partial_reaches_its_owner_once_with_nodes_minus_1_rdma(n, L);
      rs_blocks_remote_owners_first_own_shard_last(n, L, 1);
      rs_blocks_remote_owners_first_own_shard_last(n, L, 7);
    }
  }
  return MK_TEST_RESULT();
}
