/*
 * ncclMkGemmReduceScatter. Today's path is the reference one: the GEMM core writes this
 * rank's partial C into the scratch, then NCCL's reduce-scatter sums the partials into each
 * rank's rows. The fused kernel (output tiles sent to their owners as they are produced)
 * replaces the sequence where it is faster.
 */
#include "mk_err.h"
#include "op_check.h"

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
  if (!rc) rc = gemm_rs_reference(fc, a, b, c_shard, m, n, k, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
