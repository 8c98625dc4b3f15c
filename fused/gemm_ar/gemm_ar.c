/*
 * ncclMkGemmAllReduce. Three paths:
 *  - gathered (where the partial and gather slots fit the workspace, m a multiple of
 *    nranks x 128): GEMM+ReduceScatter's one GEMM, whose epilogue also stores each reduced
 *    tile of this rank's rows into every peer's gather slot; a collect kernel copies the
 *    peers' rows into c as they are complete (rs_comm.h);
 *  - split: where only one copy fits, that overlapped GEMM+ReduceScatter into this rank's
 *    rows of c, then NCCL's all-gather in place (half an all-reduce's traffic left after the
 *    GEMM);
 *  - reference: the GEMM core writes this rank's partial C into c, then NCCL's all-reduce
 *    sums it in place.
 */
#include "gemm_rs.h"
#include "mk_err.h"
#include "op_check.h"

/* Below this many rows the split path lost to the reference on 2 H200s (0.90-0.98x at
 * M = 2048, 4096; 1.02-1.04x from 8192, bench/NOTES.md): the all-gather left after the GEMM
 * costs about what the overlap saves. */
#define MK_AR_SPLIT_MIN_M 8192

static int gemm_ar_split(struct mk_fused_comm* fc, const void* a, const void* b, void* c, size_t m,
                         size_t n, size_t k, cudaStream_t stream) {
  const size_t shard_elems = m / (size_t)fc->nranks * n;
  char* own = (char*)c + (size_t)fc->rank * shard_elems * 2;
  MK_CHECK(mk_gemm_rs_overlapped(fc, a, b, own, m, n, k, 0, stream));
  return mk_nccl_comm_check(fc->api, fc->nccl, fc->api->all_gather(own, c, shard_elems, ncclBfloat16, fc->nccl, stream),
                       "ncclAllGather");
}

static int gemm_ar_reference(struct mk_fused_comm* fc, const void* a, const void* b, void* c,
                             size_t m, size_t n, size_t k, cudaStream_t stream) {
  struct mk_gemm_args g;
  mk_op_gemm_args(fc, MK_OP_GEMM_AR, &g);
  g.m = (int)m, g.n = (int)n, g.k = (int)k;
  g.a = a, g.b = b, g.c = c;
  MK_CHECK(mk_gemm_launch(&g, stream));
  return mk_nccl_comm_check(fc->api, fc->nccl, fc->api->all_reduce(c, c, m * n, ncclBfloat16, ncclSum, fc->nccl,
                                            stream), "ncclAllReduce");
}

NCCL_MK_API ncclResult_t ncclMkGemmAllReduce(const void* a, const void* b, void* c, size_t m,
                                             size_t n, size_t k, ncclDataType_t type,
                                             ncclComm_t comm, cudaStream_t stream) {
  struct mk_op_call call = {
      .op = MK_OP_GEMM_AR, .name = "ncclMkGemmAllReduce", .m = m, .n = n, .k = k,
      .type = type, .m_split = 0, .ptrs = {a, b, c}, .ptr_names = {"a", "b", "c"},
      .nptrs = 3, .comm = comm, .stream = stream};
  struct mk_fused_comm* fc;
  int prev, rc = mk_op_check(&call, &fc);
  if (!rc) rc = mk_op_gemm_overlap_check(call.name, a, m, b, c, m, NULL, m, n, k);
  if (rc) return mk_result_from_errno(rc);
  rc = mk_op_device_enter(fc, &prev);
  if (!rc && mk_gemm_rs_fits(fc, m, n, k, 1))
    rc = mk_gemm_rs_overlapped(fc, a, b, c, m, n, k, 1, stream);
  else if (!rc && m >= MK_AR_SPLIT_MIN_M && mk_gemm_rs_fits(fc, m, n, k, 0))
    rc = gemm_ar_split(fc, a, b, c, m, n, k, stream);
  else if (!rc) rc = gemm_ar_reference(fc, a, b, c, m, n, k, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
