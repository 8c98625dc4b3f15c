/*
 * ncclMkAllGatherGemm. Two paths:
 *  - reference (DESIGN.md: a generic path under every fast path, also the oracle of the
 *    tests): NCCL's all-gather into the gathered-A buffer, then the GEMM core;
 *  - overlapped (NCCL_MK_FUSED=1, the default; 128-row shards, at most 8 ranks): one
 *    kernel per call: its first few CTAs push this rank's shard into every peer's workspace
 *    block by block while the GEMM's CTAs, on the other SMs, read the own shard in place and
 *    start each peer row-block as soon as its flag says the rows are there (ag_push.h; the
 *    GEMM core's push role). 1.02-1.17x the reference's NCCL + cuBLASLt on 2 H200s
 *    (bench/NOTES.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_push.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "op_check.h"
#include "schedule.h"
#include "tuner.h"
#include "xnode.h"

/* 4 leaves the GEMM 128 of the H200's 132 SMs: the DESIGN.md shapes have a multiple of 128
 * tiles, so 128 CTAs run as few waves as 132, where 124 ran one more (bench/NOTES.md). */
#define MK_AG_DEFAULT_COMM_CTAS 4
#define MK_AG_MAX_COMM_CTAS 32

/* The push CTAs: the config's comm_sms, else the tuning file's best for this shape
 * (scripts/tune.sh), else the default; never more than MK_AG_MAX_COMM_CTAS or half the SMs. */
static int ag_comm_ctas(const struct mk_fused_comm* fc, size_t m, size_t n, size_t k) {
  int ctas = fc->cfg.comm_sms;
  if (!ctas && mk_tuner_fused_defaults("allgather_gemm", (int64_t)m, (int64_t)n, (int64_t)k, &ctas, NULL))
    ctas = MK_AG_DEFAULT_COMM_CTAS;
  if (ctas > MK_AG_MAX_COMM_CTAS) ctas = MK_AG_MAX_COMM_CTAS;
  if (ctas > fc->num_sms / 2) ctas = fc->num_sms / 2;
  const int least = fc->xn ? 2 : 1; /* cross-node: one CTA sends through the proxy, the others copy in */
  return ctas < least ? least : ctas;
}
_Static_assert(MK_AG_MAX_BLOCKS <= MK_XN_MAX_BLOCKS, "the cross-node flags cover every row-block");
_Static_assert(MK_AG_MAX_RANKS <= 32, "remote ranks as a 32-bit mask");
_Static_assert(MK_AG_DATA_OFFSET == MK_FUSED_FLAG_BYTES, "the data area follows the flags");

static int ag_gemm_reference(struct mk_fused_comm* fc, const void* a_shard, const void* b,
                             void* c, void* a_gathered, size_t m, size_t n, size_t k,
                             cudaStream_t stream) {
  void* gathered = a_gathered;
  if (!gathered) MK_CHECK(mk_fused_scratch(fc, stream, m * k * 2, &gathered));
  size_t shard_elems = m / (size_t)fc->nranks * k;
  MK_CHECK(mk_nccl_comm_check(fc->api, fc->nccl, fc->api->all_gather(a_shard, gathered, shard_elems, ncclBfloat16,
                                             fc->nccl, stream), "ncclAllGather"));
  struct mk_gemm_args g;
  mk_op_gemm_args(fc, MK_OP_AG_GEMM, &g);
  g.m = (int)m, g.n = (int)n, g.k = (int)k;
  g.a = gathered, g.b = b, g.c = c;
  return mk_gemm_launch(&g, stream);
}

/* The push counts a row-block's 16-byte vectors in an int (gemm_push.cuh, gemm_push_xnode.cuh):
 * MK_AG_BLOCK_ROWS x K / 8 of them, computed as MK_AG_BLOCK_ROWS x K, below 2^31. A larger K
 * takes the reference path. */
#define MK_AG_PUSH_MAX_K ((size_t)INT32_MAX / MK_AG_BLOCK_ROWS)

static int ag_gemm_fused_fits(const struct mk_fused_comm* fc, size_t m, size_t k) {
  size_t shard_rows = m / (size_t)fc->nranks;
  struct mk_xnode_view xv;
  const int reachable = fc->local_size == fc->nranks || !mk_xnode_view(fc, &xv);
  return fc->fused && reachable && fc->nranks <= MK_AG_MAX_RANKS &&
         shard_rows % MK_AG_BLOCK_ROWS == 0 && m / MK_AG_BLOCK_ROWS <= MK_AG_MAX_BLOCKS &&
         m <= fc->cfg.max_m && k <= fc->cfg.max_k && k <= MK_AG_PUSH_MAX_K;
}

/* One kernel (gemm.h struct mk_gemm_push, mk_gemm_call): the push CTAs, then the GEMM's; the
 * last CTA ends the call (done = e), unless the caller wants the gathered A, which is copied
 * out of the workspace after the kernel and before done = e (a peer's next call may write it). */
static void ag_gemm_push_call(const struct mk_fused_comm* fc, const void* a_shard, size_t m, int ctas,
                              struct mk_gemm_push* push, struct mk_gemm_call* call, int set_done) {
  uint64_t* own = (uint64_t*)fc->sym;
  memset(push, 0, sizeof(*push));
  mk_ag_call_words(call, fc->rank, fc->nranks, own, 1, set_done);
  push->ctas = ctas, push->src = a_shard, push->shard_rows = (int)(m / (size_t)fc->nranks);
  push->counts = (uint32_t*)((char*)fc->sym + MK_AG_COUNT_OFFSET);
  push->drop_flag_block = (int)mk_param_int(MK_PARAM_DEBUG_DROP_FLAG) + 1; /* -1 (off) -> 0 */
  struct mk_xnode_view xv;
  mk_xnode_view(fc, &xv); /* all zero without a proxy */
  push->xn = xv.dev, push->remote_mask = xv.remote_mask;
  push->self_dst = (char*)fc->sym + MK_AG_DATA_OFFSET;
  push->self_flags = own + MK_AG_FLAG0;
  for (int d = 0; d < fc->nranks; d++) {
    if (d == fc->rank || !fc->peer_sym[d]) continue; /* remote ranks: through the proxy */
    push->dst[d] = (char*)fc->peer_sym[d] + MK_AG_DATA_OFFSET;
    push->dst_flags[d] = (uint64_t*)fc->peer_sym[d] + MK_AG_FLAG0;
    call->peer_done[d] = (const uint64_t*)fc->peer_sym[d] + MK_AG_WORD_DONE;
  }
  mk_ag_call_claims(call, own);
}

/* The caller's gathered A: the peers' rows from the workspace, the own shard from a_shard (the
 * workspace never holds it). */
static int ag_gemm_copy_gathered(const struct mk_fused_comm* fc, const void* a_shard, const char* gathered,
                                 void* a_gathered, size_t m, size_t k, cudaStream_t stream) {
  const size_t shard = m / (size_t)fc->nranks * k * 2, own = (size_t)fc->rank * shard, total = m * k * 2;
  char* out = a_gathered;
  if (own) MK_CHECK(mk_cuda_check(cudaMemcpyAsync(out, gathered, own, cudaMemcpyDeviceToDevice, stream),
                                  "gathered A copy"));
  MK_CHECK(mk_cuda_check(cudaMemcpyAsync(out + own, a_shard, shard, cudaMemcpyDeviceToDevice, stream),
                         "gathered A copy"));
  if (own + shard < total)
    MK_CHECK(mk_cuda_check(cudaMemcpyAsync(out + own + shard, gathered + own + shard, total - own - shard,
                                           cudaMemcpyDeviceToDevice, stream), "gathered A copy"));
  return 0;
}

static int ag_gemm_fused(struct mk_fused_comm* fc, const void* a_shard, const void* b, void* c,
                         void* a_gathered, size_t m, size_t n, size_t k, cudaStream_t stream) {
  char* ws = fc->sym;
  const int ctas = ag_comm_ctas(fc, m, n, k);
  const size_t shard_rows = m / (size_t)fc->nranks;
  struct mk_trace_buf* trace;
  MK_CHECK(mk_trace_comm_begin(fc, MK_OP_AG_GEMM, (uint32_t)m, (uint32_t)n, stream, &trace));
  fc->ag_shard_blocks = (int)(shard_rows / MK_AG_BLOCK_ROWS);
  struct mk_gemm_push push;
  struct mk_gemm_call call;
  ag_gemm_push_call(fc, a_shard, m, ctas, &push, &call, !a_gathered);
  struct mk_gemm_args g;
  mk_op_gemm_args(fc, MK_OP_AG_GEMM, &g);
  g.m = (int)m, g.n = (int)n, g.k = (int)k;
  g.a = ws + MK_AG_DATA_OFFSET, g.b = b, g.c = c;
  g.a_local = a_shard;
  g.a_local_row0 = (int)shard_rows * fc->rank;
  g.a_local_rows = (int)shard_rows;
  g.num_sms = fc->num_sms - ctas;
  g.ready_flags = (const uint64_t*)ws + MK_AG_FLAG0; /* target: the call's number */
  g.row_block_rotate = fc->rank * fc->ag_shard_blocks; /* own shard, then arrival order */
  g.push = &push, g.call = &call, g.trace = trace;
  MK_CHECK(mk_gemm_launch(&g, stream));
  if (a_gathered) {
    /* the call ends (done = e) even when a copy fails: with done behind, this rank's next call
     * would take flags the peers raised for it as this one's rows, and multiply stale A */
    const int copied = ag_gemm_copy_gathered(fc, a_shard, ws + MK_AG_DATA_OFFSET, a_gathered, m, k, stream);
    MK_CHECK(mk_ag_finish_launch(ws, stream));
    MK_CHECK(copied);
  }
  return mk_trace_comm_end(fc, stream);
}

/* A GEMM row-block wait owes its rows to the shard's owner: progress = that shard's row-blocks
 * whose flag reached the awaited call. A push wait (MK_GEMM_ERR_TAG_PUSH, tile = push item)
 * waits for a destination's done word: progress = the last call that peer finished. */
int mk_ag_gemm_hang_peer(struct mk_fused_comm* fc, const struct mk_gemm_error* e, uint64_t* progress,
                         char* what, size_t what_len) {
  const int blocks = fc->ag_shard_blocks;
  if (blocks <= 0 || mk_gemm_err_tile_is_own_wait(e->tile)) return -1;
  if (e->tag & MK_GEMM_ERR_TAG_PUSH) {
    /* blocks is the last call's: an earlier call's item may lie past its steps */
    const uint32_t step = e->tile / (uint32_t)blocks;
    if (step >= (uint32_t)fc->nranks) return -1;
    const int peer = mk_sched_ag_dest(fc->rank, fc->nranks, (int)step);
    if (!fc->peer_sym[peer] ||
        mk_fused_read(fc, progress, (uint64_t*)fc->peer_sym[peer] + MK_AG_WORD_DONE, 8) != cudaSuccess)
      return -1;
    snprintf(what, what_len, "the last call it finished");
    return peer;
  }
  const int peer = (int)(e->flag_index / (uint32_t)blocks);
  if (peer >= fc->nranks) return -1;
  uint64_t* flags = malloc((size_t)blocks * 8);
  if (!flags ||
      mk_fused_read(fc, flags, (uint64_t*)fc->sym + MK_AG_FLAG0 + (size_t)peer * blocks, (size_t)blocks * 8) != cudaSuccess) {
    free(flags);
    return -1;
  }
  *progress = 0;
  for (int b = 0; b < blocks; b++) *progress += flags[b] >= e->expected;
  free(flags);
  snprintf(what, what_len, "row-blocks of its shard arrived, of %d", blocks);
  return peer;
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
  if (!rc) rc = mk_op_gemm_overlap_check(call.name, a_shard, m / (size_t)fc->nranks, b, c, m, a_gathered, m, n, k);
  if (rc) return mk_result_from_errno(rc);
  rc = mk_op_device_enter(fc, &prev);
  if (!rc && ag_gemm_fused_fits(fc, m, k))
    rc = ag_gemm_fused(fc, a_shard, b, c, a_gathered, m, n, k, stream);
  else if (!rc)
    rc = ag_gemm_reference(fc, a_shard, b, c, a_gathered, m, n, k, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
