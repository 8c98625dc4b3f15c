/*
 * Who sends which chunk when, and in which order a rank visits its tiles: pure functions,
 * callable from host code and from kernels, unit-tested for every rank count from 2 to 16
 * (test/unit/test_schedule.c).
 *
 * Rows of M are split into nranks equal shards; shard r belongs to rank r (its A rows for
 * AllGather+GEMM, its C rows for GEMM+ReduceScatter).
 */
#ifndef MK_SCHEDULE_H_
#define MK_SCHEDULE_H_

#include "../common/mk_hd.h"

/* Ring step s (0 .. nranks-1) of rank r: the peer whose shard arrives at step s when every
 * rank pushes its shard to the others in ring order. Step 0 is the rank itself; then the
 * next ranks in ascending order, so the arrival order is a rotation of the row-blocks (the
 * GEMM core's row_block_rotate, no order table). */
MK_HD int mk_sched_ag_source(int rank, int nranks, int step) { return (rank + step) % nranks; }

/* The peer rank r pushes its shard to at step s (1 .. nranks-1): the inverse of the above. */
MK_HD int mk_sched_ag_dest(int rank, int nranks, int step) { return (rank - step + nranks) % nranks; }

/* Row-blocks per shard when shards are split into blocks of block_m rows; a block never
 * spans two shards (the last block of a shard may be short). */
MK_HD int mk_sched_blocks_per_shard(long shard_rows, int block_m) {
  return (int)((shard_rows + block_m - 1) / block_m);
}

/* AllGather+GEMM: the i-th row-block rank r computes, as (shard, block within shard):
 * its own shard first (its rows are there at once), then the others in arrival order. */
MK_HD void mk_sched_ag_block(int rank, int nranks, int blocks_per_shard, int i, int* shard,
                             int* block) {
  *shard = mk_sched_ag_source(rank, nranks, i / blocks_per_shard);
  *block = i % blocks_per_shard;
}

/* GEMM+ReduceScatter: the i-th output shard rank r computes. It starts with the shard of
 * the next rank and ends with its own, so that every rank's first partial result goes to a
 * different owner (no owner is flooded) and its own shard, which receives the peers'
 * partial sums, comes last, when those have had the most time to arrive. */
MK_HD int mk_sched_rs_shard(int rank, int nranks, int i) { return (rank + 1 + i) % nranks; }

/* GEMM+ReduceScatter's row-block order: the row-block of M rank r visits at position pos
 * (shards in mk_sched_rs_shard order, blocks in order within a shard). */
MK_HD int mk_sched_rs_row_block(int rank, int nranks, int blocks_per_shard, int pos) {
  return mk_sched_rs_shard(rank, nranks, pos / blocks_per_shard) * blocks_per_shard + pos % blocks_per_shard;
}

/* GEMM+ReduceScatter: the slot, in owner d's workspace, that peer src writes its partial (and
 * for the all-reduce its sums) into: the peers in rank order, d itself skipped, so n - 1
 * slots hold them all. */
MK_HD int mk_sched_rs_slot(int src, int owner) { return src < owner ? src : src - 1; }

/* The rank that owns row `row` of an M-row output split evenly over nranks. */
MK_HD int mk_sched_row_owner(long row, long m, int nranks) {
  return (int)(row / (m / nranks));
}

#endif /* MK_SCHEDULE_H_ */
