/*
 * The overlapped GEMM+ReduceScatter and GEMM+AllReduce: one GEMM launch is the whole call
 * (the GEMM core's reduce-scatter epilogue and call bracket, gemm.h struct mk_gemm_rs). This
 * header gives the protocol and where its words live in the workspace.
 *
 * Per call e on rank r of n (all ranks on one host, direct peer pointers), shard = m / n rows,
 * blocks = shard / 128 row-blocks per shard:
 *   start          e = done + 1; CTA 0 sets call = e; every CTA's storer warps wait until each
 *                  peer's done >= e - 1 before their first store (the peer's previous call, of
 *                  any op, no longer reads its workspace)
 *   tiles          row-blocks from the next rank's shard on, wrapping, this rank's last
 *                  (mk_sched_rs_row_block: a rotation); a peer d's tiles go straight into
 *                  d's slot for r over NVLink and add 1 to d's counter [r][mb]; this rank's
 *                  tiles wait for every peer's counter of their row-block, then c_shard = own
 *                  + peers' partials (fp32 sum, one bf16 rounding, as NCCL's reduce-scatter of
 *                  bf16 partials on 2 ranks); for the all-reduce the sums also go into every
 *                  peer's gather slot for r, counted in its gather counters [r][mb]
 *   collect        (all-reduce) each CTA's producer warp group, once its tiles are done and
 *                  every GEMM CTA has started, takes items from a counter: copies of the
 *                  peers' reduced row-blocks from this rank's gather slots into c as their
 *                  counters complete
 *   end            the last CTA to finish zeroes the counters, then done = e (release, system
 *                  scope): the peers may write this rank's slots for e + 1
 * Each rank computes the others' rows in the same rotation, so every partial a rank needs is
 * produced before the peer reaches its own rows, and no owner is flooded.
 *
 * Workspace of each rank (fused_comm.h): words done, call, exits (ag_push.h MK_AG_WORD_*);
 * counters at MK_RS_COUNT_OFFSET, u64: partials [n][blocks], then gather [n][blocks] and the
 * 3 claim words (gemm.h collect_claims); data
 * area: the n - 1 peers' partial slots [shard][n_cols] bf16 (mk_sched_rs_slot: peers in rank
 * order, the rank itself skipped), then (all-reduce) their n - 1 gather slots: 2 (n - 1) / n
 * times one copy of C, so on 2 ranks both fit where AllGather+GEMM's gathered A or one C does.
 */
#ifndef MK_RS_COMM_H_
#define MK_RS_COMM_H_

#include "gemm.h"

#define MK_RS_MAX_RANKS MK_GEMM_RS_MAX_RANKS
#define MK_RS_COUNT_OFFSET (64u << 10)
#define MK_RS_MAX_COUNTERS 4096 /* u64 in [64, 96 KiB) */

#endif /* MK_RS_COMM_H_ */
