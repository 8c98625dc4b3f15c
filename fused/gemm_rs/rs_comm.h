/*
 * The overlapped GEMM+ReduceScatter's own kernels (C interface to rs_reduce.cu).
 *
 * Per call e on rank r of n (all ranks on one host, direct peer pointers), shard = m / n rows:
 *   begin kernel   call = done + 1 (= e), then waits until every peer's done >= e - 1: the
 *                  GEMMs below write into the peers' data areas, which their previous call
 *                  (of any op) may still read
 *   GEMMs          for s = 1 .. n-1, owner d = (r + s) % n: rows of d's shard, the epilogue
 *                  storing straight into slot r of d's data area over NVLink and adding 1 to
 *                  d's counter [r][mb] per tile once its stores are visible (tile flags by
 *                  row-block); then this rank's own shard into c_shard
 *   reduce kernel  per row-block mb of the own shard: waits counter[src][mb] >= tiles_n for
 *                  every peer src, then c_shard += the peers' slots (fp32 sum, one bf16
 *                  rounding, as NCCL's reduce-scatter of bf16 partials on 2 ranks)
 *   counters reset (memset) after the reduce, then the finish kernel: done = e
 * Every rank computes the next rank's shard first, so no owner is flooded and the partial
 * sums this rank needs are the first its peers produce.
 *
 * Workspace of each rank (fused_comm.h): counters at MK_RS_COUNT_OFFSET, u64 [n][blocks];
 * slots in the data area: slot src = rows [src * shard, (src + 1) * shard) x n bf16.
 */
#ifndef MK_RS_REDUCE_H_
#define MK_RS_REDUCE_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MK_RS_MAX_RANKS 8
#define MK_RS_COUNT_OFFSET (64u << 10)
#define MK_RS_MAX_COUNTERS 4096 /* u64 in [64, 96 KiB) */

struct mk_rs_reduce_args {
  void* c_shard;                      /* this rank's rows: [shard_rows, n] bf16, holds its partial */
  const void* slots;                  /* this rank's data area: the peers' partials */
  const uint64_t* counts;             /* this rank's counters [nranks][blocks] */
  size_t shard_rows, n;
  int rank, nranks;
  uint32_t tiles_n;                   /* tiles per row-block: a row-block's count when complete */
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint64_t timeout_ns;
};

/* The begin kernel on `stream`: own_ws's call word, then the wait on every peer's done word
 * (peer_ws[p], NULL for p == rank). 0 or -EIO. */
int mk_rs_begin_launch(void* const* peer_ws, int rank, int nranks, struct mk_gemm_error* err,
                       uint32_t err_tag, uint64_t timeout_ns, cudaStream_t stream);
/* The reduce kernel on `stream`. 0 or -EIO. */
int mk_rs_reduce_launch(const struct mk_rs_reduce_args* a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MK_RS_REDUCE_H_ */
