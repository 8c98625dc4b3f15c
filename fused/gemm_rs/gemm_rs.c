/*
 * ncclMkGemmReduceScatter. Two paths:
 *  - reference: the GEMM core writes this rank's partial C into the scratch, then NCCL's
 *    reduce-scatter sums the partials into each rank's rows;
 *  - overlapped (NCCL_MK_FUSED=1, every rank on this host, 128-row shards): the GEMM's
 *    epilogue stores each peer's rows straight into that peer's workspace as the tiles are
 *    produced, and a reduce kernel adds them to this rank's own rows (rs_reduce.h).
 */
#include "ag_push.h"
#include "gemm_rs.h"
#include "mk_err.h"
#include "op_check.h"
#include "rs_reduce.h"

static int gemm_rs_reference(struct mk_fused_comm* fc, const void* a, const void* b,
                             void* c_shard, size_t m, size_t n, size_t k, cudaStream_t stream) {
  void* partial;
  MK_CHECK(mk_fused_scratch(fc, stream, m * n * 2, &partial));
  struct mk_gemm_args g;
  mk_op_gemm_args(fc, MK_OP_GEMM_RS, &g);
  g.m = (int)m, g.n = (int)n, g.k = (int)k;
  g.a = a, g.b = b, g.c = partial;
  MK_CHECK(mk_gemm_launch(&g, stream));
  size_t shard_elems = m / (size_t)fc->nranks * n;
  return mk_nccl_check(fc->api->reduce_scatter(partial, c_shard, shard_elems, ncclBfloat16,
                                               ncclSum, fc->nccl, stream),
                       "ncclReduceScatter");
}

int mk_gemm_rs_fits(const struct mk_fused_comm* fc, size_t m, size_t n, size_t k) {
  const size_t shard = m / (size_t)fc->nranks;
  return fc->fused && fc->local_size == fc->nranks && fc->nranks <= MK_RS_MAX_RANKS && m % (size_t)fc->nranks == 0 &&
         shard % MK_AG_BLOCK_ROWS == 0 && m / MK_AG_BLOCK_ROWS <= MK_RS_MAX_COUNTERS &&
         m <= fc->cfg.max_m && n <= fc->cfg.max_n && k <= fc->cfg.max_k &&
         m * n * 2 <= fc->sym_bytes - MK_FUSED_FLAG_BYTES; /* the peers' slots fit the data area */
}

/* The GEMM of owner d's rows: into d's slot for this rank (a peer) or into c_shard (self). */
static int gemm_rs_owner_gemm(struct mk_fused_comm* fc, const void* a, const void* b, void* c_shard,
                              size_t m, size_t n, size_t k, int d, cudaStream_t stream) {
  const size_t shard = m / (size_t)fc->nranks, blocks = shard / MK_AG_BLOCK_ROWS;
  struct mk_gemm_args g;
  mk_op_gemm_args(fc, MK_OP_GEMM_RS, &g);
  g.m = (int)shard, g.n = (int)n, g.k = (int)k;
  g.a = (const char*)a + (size_t)d * shard * k * 2, g.b = b, g.c = c_shard;
  if (d != fc->rank) {
    char* ws = fc->peer_sym[d];
    g.c = ws + MK_AG_DATA_OFFSET + (size_t)fc->rank * shard * n * 2;
    g.tile_flags = (uint64_t*)(ws + MK_RS_COUNT_OFFSET) + (size_t)fc->rank * blocks;
    g.tile_flags_by_row_block = 1;
  }
  return mk_gemm_launch(&g, stream);
}

int mk_gemm_rs_overlapped(struct mk_fused_comm* fc, const void* a, const void* b, void* c_shard, size_t m,
                          size_t n, size_t k, cudaStream_t stream) {
  const size_t shard = m / (size_t)fc->nranks;
  const uint32_t tag = mk_op_err_tag(fc, MK_OP_GEMM_RS);
  const uint64_t timeout_ns = (uint64_t)fc->cfg.timeout_ms * 1000000u;
  int bm, bn;
  mk_gemm_tile_shape(&bm, &bn);
  MK_CHECK(mk_rs_begin_launch(fc->peer_sym, fc->rank, fc->nranks, fc->err, tag, timeout_ns, stream));
  for (int s = 1; s <= fc->nranks; s++) /* the next rank's rows first, this rank's last */
    MK_CHECK(gemm_rs_owner_gemm(fc, a, b, c_shard, m, n, k, (fc->rank + s) % fc->nranks, stream));
  char* ws = fc->sym;
  struct mk_rs_reduce_args ra = {.c_shard = c_shard, .slots = ws + MK_AG_DATA_OFFSET,
                                 .counts = (const uint64_t*)(ws + MK_RS_COUNT_OFFSET),
                                 .shard_rows = shard, .n = n, .rank = fc->rank, .nranks = fc->nranks,
                                 .tiles_n = (uint32_t)((n + (size_t)bn - 1) / (size_t)bn), .err = fc->err,
                                 .err_tag = tag, .timeout_ns = timeout_ns};
  MK_CHECK(mk_rs_reduce_launch(&ra, stream));
  /* counters back to 0 before done = e lets the peers write for the next call */
  MK_CHECK(mk_cuda_check(cudaMemsetAsync(ws + MK_RS_COUNT_OFFSET, 0, (size_t)fc->nranks * (shard / MK_AG_BLOCK_ROWS) * 8,
                                         stream), "cudaMemsetAsync (counters)"));
  return mk_ag_finish_launch(ws, stream);
}

NCCL_MK_API ncclResult_t ncclMkGemmReduceScatter(const void* a, const void* b, void* c_shard,
                                                 size_t m, size_t n, size_t k,
                                                 ncclDataType_t type, ncclComm_t comm,
                                                 cudaStream_t stream) {
  struct mk_op_call call = {
      .op = MK_OP_GEMM_RS, .name = "ncclMkGemmReduceScatter", .m = m, .n = n, .k = k,
      .type = type, .m_split = 1, .ptrs = {a, b, c_shard},
      .ptr_names = {"a", "b", "c_shard"}, .nptrs = 3, .comm = comm, .stream = stream};
  struct mk_fused_comm* fc;
  int prev, rc = mk_op_check(&call, &fc);
  if (rc) return mk_result_from_errno(rc);
  rc = mk_op_device_enter(fc, &prev);
  if (!rc && mk_gemm_rs_fits(fc, m, n, k)) rc = mk_gemm_rs_overlapped(fc, a, b, c_shard, m, n, k, stream);
  else if (!rc) rc = gemm_rs_reference(fc, a, b, c_shard, m, n, k, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
