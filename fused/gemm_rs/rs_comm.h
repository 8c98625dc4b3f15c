/*
 * The overlapped GEMM+ReduceScatter and GEMM+AllReduce: their small kernels around the one
 * GEMM (C interface to rs_comm.cu).
 *
 * Per call e on rank r of n (all ranks on one host, direct peer pointers), shard = m / n rows,
 * blocks = shard / 128 row-blocks per shard:
 *   begin kernel    call = done + 1 (= e); the GEMM's row-block order (the next rank's shard
 *                   first, this rank's last); then waits until every peer's done >= e - 1: the
 *                   GEMM writes into the peers' workspaces, which their previous call (of any
 *                   op) may still read
 *   GEMM            one launch over all m rows with the reduce-scatter epilogue (gemm.h, rs):
 *                   a peer d's tiles go straight into slot r of d's data area over NVLink and
 *                   add 1 to d's counter [r][mb]; this rank's tiles wait for every peer's
 *                   counter of their row-block, then c_shard = own + peers' partials (fp32 sum,
 *                   one bf16 rounding, as NCCL's reduce-scatter of bf16 partials on 2 ranks);
 *                   for the all-reduce also stored into every peer's gather slot r and
 *                   counted in its gather counters [r][mb]
 *   collect kernel  (all-reduce only) per peer src and row-block: waits for its gather
 *                   counter, then copies src's reduced rows from the gather slot into c
 *   finish kernel   the counters back to 0, then done = e (peers may write for e + 1)
 * Each rank computes the others' rows in the same rotation, so every partial a rank needs is
 * produced before the peer reaches its own rows, and no owner is flooded.
 *
 * Workspace of each rank (fused_comm.h): counters at MK_RS_COUNT_OFFSET, u64: partials
 * [n][blocks], then gather [n][blocks]; data area: the n - 1 peers' partial slots
 * [shard][n_cols] bf16 (peers in rank order, the rank itself skipped), then (all-reduce) their
 * n - 1 gather slots: 2 (n - 1) / n times one copy of C, so on 2 ranks both fit where AllGather+
 * GEMM's gathered A or one C does.
 */
#ifndef MK_RS_COMM_H_
#define MK_RS_COMM_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MK_RS_MAX_RANKS MK_GEMM_RS_MAX_RANKS
#define MK_RS_COUNT_OFFSET (64u << 10)
#define MK_RS_MAX_COUNTERS 4096 /* u64 in [64, 96 KiB) */

struct mk_rs_begin_args {
  void* ws[MK_RS_MAX_RANKS]; /* every rank's workspace, as this GPU addresses it */
  int rank, nranks;
  int blocks;                /* row-blocks per shard */
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint64_t timeout_ns;
};

struct mk_rs_collect_args {
  void* c;                   /* [m, n] bf16: the peers' rows are written */
  const void* gather;        /* this rank's gather slots (n - 1, the peers in rank order) */
  const uint64_t* counts;    /* this rank's gather counters [nranks][blocks] */
  size_t shard_rows, n;
  int rank, nranks;
  uint32_t tiles_n;          /* a row-block's count when complete */
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint64_t timeout_ns;
};

/* The begin kernel on `stream` (order written to ws[rank] + MK_AG_ORDER_OFFSET). 0 or -EIO. */
int mk_rs_begin_launch(const struct mk_rs_begin_args* a, cudaStream_t stream);
/* The collect kernel on `stream`. 0 or -EIO. */
int mk_rs_collect_launch(const struct mk_rs_collect_args* a, cudaStream_t stream);
/* The finish kernel on `stream`: `counters` u64 at MK_RS_COUNT_OFFSET of own_ws back to 0,
 * then done = call. 0 or -EIO. */
int mk_rs_finish_launch(void* own_ws, int counters, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MK_RS_COMM_H_ */
