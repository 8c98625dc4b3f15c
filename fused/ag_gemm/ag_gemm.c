/*
 * ncclMkAllGatherGemm. Today's path is the reference one (DESIGN.md: a generic path under
 * every fast path, also the oracle of the tests): NCCL's all-gather into the gathered-A
 * buffer, then the GEMM core on the same stream. The fused persistent kernel replaces the
 * sequence where it is faster.
 */
#include "mk_err.h"
#include "op_check.h"

static int ag_gemm_reference(struct mk_fused_comm* fc, const void* a_shard, const void* b,
                             void* c, void* a_gathered, size_t m, size_t n, size_t k,
                             cudaStream_t stream) {
  void* gathered = a_gathered;
  if (!gathered) MK_CHECK(mk_fused_scratch(fc, stream, m * k * 2, &gathered));
  size_t shard_elems = m / (size_t)fc->nranks * k;
  MK_CHECK(mk_nccl_check(fc->api->all_gather(a_shard, gathered, shard_elems, ncclBfloat16,
                                             fc->nccl, stream), "ncclAllGather"));
  struct mk_gemm_args g;
  mk_op_gemm_args(fc, MK_OP_AG_GEMM, &g);
  g.m = (int)m, g.n = (int)n, g.k = (int)k;
  g.a = gathered, g.b = b, g.c = c;
  return mk_gemm_launch(&g, stream);
}

NCCL_MK_API ncclResult_t ncclMkAllGatherGemm(const void* a_shard, const void* b, void* c,
                                             void* a_gathered, size_t m, size_t n, size_t k,
                                             ncclDataType_t type, ncclComm_t comm,
                                             cudaStream_t stream) {
  struct mk_op_call call = {
      .op = MK_OP_AG_GEMM, .name = "ncclMkAllGatherGemm", .m = m, .n = n, .k = k,
      .type = type, .m_split = 1, .ptrs = {a_shard, b, c},
      .ptr_names = {"a_shard", "b", "c"}, .nptrs = 3, .optional_ptr = a_gathered,
      .optional_name = "a_gathered", .comm = comm, .stream = stream};
  struct mk_fused_comm* fc;
  int prev, rc = mk_op_check(&call, &fc);
  if (rc) return mk_result_from_errno(rc);
  rc = mk_op_device_enter(fc, &prev);
  if (!rc) rc = ag_gemm_reference(fc, a_shard, b, c, a_gathered, m, n, k, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
