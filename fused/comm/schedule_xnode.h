/*
 * Hierarchical schedules for fused ops across nodes (issue 13): pure functions, callable from
 * host code and from kernels, unit-tested for 2 to 16 ranks and nodes of 1, 2, 4 and 8 ranks
 * (test/unit/test_schedule_xnode.c).
 *
 * Ranks are grouped in nodes of `local` consecutive ranks (`local` divides nranks; the local
 * team, or NCCL_MK_LOCAL_SIZE to emulate several nodes on one host). Rank r is local index
 * r % local of node r / local. Shard s belongs to rank s, as in schedule.h.
 *
 * Why hierarchical: inside a node NVLink is ~8x faster than a GPU's share of InfiniBand, so
 * every shard crosses InfiniBand once per destination node, between ranks with the same local
 * index (each GPU uses its own NIC), and is spread or reduced inside the node over NVLink.
 * A rank then sends and receives nodes - 1 shards over RDMA, not nranks - local.
 *
 * Steps are numbered s = t * local + j: t is the node step (0 = own node), j the local step
 * (0 = the rank itself). With local == nranks (one node) or local == 1 (one rank per node)
 * every function here gives the same order as the single-node one in schedule.h.
 */
#ifndef MK_SCHEDULE_XNODE_H_
#define MK_SCHEDULE_XNODE_H_

#include "schedule.h"

MK_HD int mk_xn_nodes(int nranks, int local) { return nranks / local; }
MK_HD int mk_xn_node(int rank, int local) { return rank / local; }
MK_HD int mk_xn_lidx(int rank, int local) { return rank % local; }

/* The rank at local index lidx of node `node`, both taken modulo their ranges, so callers
 * can add step offsets without wrapping them. */
MK_HD int mk_xn_rank(int nranks, int local, int node, int lidx) {
  int nodes = nranks / local;
  return ((node % nodes + nodes) % nodes) * local + (lidx % local + local) % local;
}

/* ---- AllGather+GEMM ----------------------------------------------------------------------
 * Node step t >= 1: every rank pushes its own shard over RDMA to its counterpart (same local
 * index) in node (node - t), so it receives its counterpart's shard from node (node + t): a
 * rotation over nodes, direct pushes, one shard per rank and step, so a slow node delays only
 * its own shards. Local step j >= 1 of node step t: every rank forwards over NVLink the shard
 * it has for that node step (its own at t = 0, the RDMA arrival at t >= 1) to the local peer
 * j indices below it, so it receives from the local peer j indices above. */

/* The counterpart whose shard arrives over RDMA at node step t (1 .. nodes-1). */
MK_HD int mk_sched_xag_rdma_source(int rank, int nranks, int local, int t) {
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local) + t, mk_xn_lidx(rank, local));
}

/* The counterpart rank pushes its own shard to over RDMA at node step t (1 .. nodes-1). */
MK_HD int mk_sched_xag_rdma_dest(int rank, int nranks, int local, int t) {
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local) - t, mk_xn_lidx(rank, local));
}

/* The shard rank forwards over NVLink during node step t: its own at t = 0, else the one
 * that arrived over RDMA at step t. */
MK_HD int mk_sched_xag_nvl_shard(int rank, int nranks, int local, int t) {
  return t == 0 ? rank : mk_sched_xag_rdma_source(rank, nranks, local, t);
}

/* The local peer rank forwards to at local step j (1 .. local-1). */
MK_HD int mk_sched_xag_nvl_dest(int rank, int nranks, int local, int j) {
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local), mk_xn_lidx(rank, local) - j);
}

/* The local peer whose forwarded shards arrive at local step j (1 .. local-1). */
MK_HD int mk_sched_xag_nvl_from(int rank, int nranks, int local, int j) {
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local), mk_xn_lidx(rank, local) + j);
}

/* The shard that arrives at rank at step s (0 .. nranks-1), s = t * local + j: the shard of
 * local index (lidx + j) of node (node + t). Step 0 is the rank's own shard, steps 1 .. local-1
 * its local peers' (they need no RDMA), then the remote shards in arrival order. */
MK_HD int mk_sched_xag_source(int rank, int nranks, int local, int s) {
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local) + s / local,
                    mk_xn_lidx(rank, local) + s % local);
}

/* 1 when the shard of step s came over RDMA (j == 0, t >= 1): the step a rank's proxy
 * receives; every other step after 0 comes over NVLink. */
MK_HD int mk_sched_xag_step_is_rdma(int local, int s) { return s >= local && s % local == 0; }

/* The i-th row-block rank computes, as (shard, block within shard): shards in arrival order
 * (mk_sched_xag_source), blocks in order within a shard. Unlike the single-node order this is
 * not one rotation of the row-blocks when 1 < local < nranks, so the GEMM core must call this
 * rather than use row_block_rotate. */
MK_HD void mk_sched_xag_block(int rank, int nranks, int local, int blocks_per_shard, int i,
                              int* shard, int* block) {
  *shard = mk_sched_xag_source(rank, nranks, local, i / blocks_per_shard);
  *block = i % blocks_per_shard;
}

/* ---- GEMM+ReduceScatter ------------------------------------------------------------------
 * The mirror. Rank r (node a, local index l) reduces, for every remote node b, the node's
 * partials of shard (b, l) (its counterpart's): its local peers send it their partials of that
 * shard over NVLink, and r sends the sum to (b, l) in one RDMA transfer. Shards of its own node
 * go straight to their owners over NVLink. Position i = t * local + j: node (a + 1 + t), local
 * index (l + 1 + j); remote nodes first, own node last, and within a node the shard r reduces
 * itself last, so its peers' partials have had the most time to arrive; r's own shard, which
 * receives every sum, comes last of all. */

/* The output shard rank computes at position i (0 .. nranks-1). */
MK_HD int mk_sched_xrs_shard(int rank, int nranks, int local, int i) {
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local) + 1 + i / local,
                    mk_xn_lidx(rank, local) + 1 + i % local);
}

/* The local peer rank sends its partial of position i's shard to over NVLink: the shard's
 * counterpart in this node (its owner, for the own node), or -1 at the position where that
 * is rank itself (it keeps the partial and adds the peers' to it). */
MK_HD int mk_sched_xrs_nvl_dest(int rank, int nranks, int local, int i) {
  if (i % local == local - 1) return -1;
  int shard = mk_sched_xrs_shard(rank, nranks, local, i);
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local), mk_xn_lidx(shard, local));
}

/* The remote owner rank sends its node's sum to over RDMA after node step t (0 .. nodes-2),
 * once every local peer's partial of that shard has arrived. */
MK_HD int mk_sched_xrs_rdma_dest(int rank, int nranks, int local, int t) {
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local) + 1 + t, mk_xn_lidx(rank, local));
}

/* The counterpart whose node's sum of rank's own shard arrives over RDMA at node step t. */
MK_HD int mk_sched_xrs_rdma_source(int rank, int nranks, int local, int t) {
  return mk_xn_rank(nranks, local, mk_xn_node(rank, local) - 1 - t, mk_xn_lidx(rank, local));
}

/* The row-block of M rank visits at position pos (shards in mk_sched_xrs_shard order, blocks
 * in order within a shard). */
MK_HD int mk_sched_xrs_row_block(int rank, int nranks, int local, int blocks_per_shard,
                                 int pos) {
  return mk_sched_xrs_shard(rank, nranks, local, pos / blocks_per_shard) * blocks_per_shard +
         pos % blocks_per_shard;
}

#endif /* MK_SCHEDULE_XNODE_H_ */
