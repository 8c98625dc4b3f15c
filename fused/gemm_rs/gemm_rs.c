/*
 * ncclMkGemmReduceScatter. Two paths:
 *  - reference: the GEMM core writes this rank's partial C into the scratch, then NCCL's
 *    reduce-scatter sums the partials into each rank's rows;
 *  - overlapped (NCCL_MK_FUSED=1, 128-row shards): one GEMM whose epilogue stores each peer's
 *    rows straight into that peer's workspace as the tiles are produced and sums the peers'
 *    partials into this rank's own rows (rs_comm.h); a rank outside the local team gets its
 *    rows through the proxy, a row-block at a time through the bounce buffer (gemm_rs.cuh,
 *    xnode.h), and with the all-reduce's gather its reduced rows the same way.
 * The overlapped path is also GEMM+AllReduce's (gemm_ar.c), with the gather.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ag_push.h"
#include "gemm_rs.h"
#include "mk_err.h"
#include "op_check.h"
#include "rs_comm.h"
#include "schedule.h"
#include "xnode.h"

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
  return mk_nccl_comm_check(fc->api, fc->nccl, fc->api->reduce_scatter(partial, c_shard, shard_elems, ncclBfloat16,
                                               ncclSum, fc->nccl, stream),
                       "ncclReduceScatter");
}

/* Data bytes of the overlapped path: the peers' partial slots, then their gather slots with
 * `gather` (on 2 ranks both fit where one m x n copy of C does). */
static size_t gemm_rs_data_bytes(const struct mk_fused_comm* fc, size_t m, size_t n, int gather) {
  return (size_t)(fc->nranks - 1) * (m / (size_t)fc->nranks) * n * 2 * (gather ? 2 : 1);
}

/* Ranks outside the local team are reached through the proxy: the bounce buffer holds the
 * out, in (and gather) slots (xnode.h mk_xn_rs_off). */
static int gemm_rs_reachable(const struct mk_fused_comm* fc, size_t m, size_t n, int gather) {
  struct mk_xnode_view xv;
  if (fc->local_size == fc->nranks) return 1;
  const int blocks = (int)(m / (size_t)fc->nranks / MK_AG_BLOCK_ROWS);
  return !mk_xnode_view(fc, &xv) && m / MK_AG_BLOCK_ROWS <= MK_XN_MAX_BLOCKS &&
         mk_xn_rs_bytes(fc->nranks, blocks, (uint64_t)MK_AG_BLOCK_ROWS * n * 2, gather) <= xv.bounce_bytes;
}

/* The overlapped path: 2 or more ranks (the epilogue's peers; one rank takes the reference),
 * every one reachable, whole row-blocks per shard inside the tables, the shape inside the
 * prepared maxima, and the slots inside the data area (not into the MoE area after it). */
int mk_gemm_rs_fits(const struct mk_fused_comm* fc, size_t m, size_t n, size_t k, int gather) {
  const size_t shard = m / (size_t)fc->nranks, blocks_all = m / MK_AG_BLOCK_ROWS;
  return fc->fused && fc->nranks >= 2 && gemm_rs_reachable(fc, m, n, gather) && fc->nranks <= MK_RS_MAX_RANKS &&
         m % (size_t)fc->nranks == 0 &&
         shard % MK_AG_BLOCK_ROWS == 0 && blocks_all <= MK_AG_MAX_BLOCKS &&
         blocks_all * (gather ? 2 : 1) + MK_GEMM_RS_CLAIM_WORDS <= MK_RS_MAX_COUNTERS && m <= fc->cfg.max_m && n <= fc->cfg.max_n &&
         k <= fc->cfg.max_k && gemm_rs_data_bytes(fc, m, n, gather) <= mk_fused_data_bytes(fc);
}

/* Remote peer d's pointers (gemm.h rs.xn): this rank's bounce slots and flags; the counters
 * the storers raise for d are this rank's own counters of d, free because d's partials (and
 * reduced rows) arrive flagged in the flag region instead. */
static void gemm_rs_remote_peer(const struct mk_xnode_view* xv, int r, int d, int nr, int blocks, size_t n, int gather,
                                uint64_t* own_counts, struct mk_gemm_rs* rs, struct mk_gemm_call* call) {
  const uint64_t row_bytes = (uint64_t)MK_AG_BLOCK_ROWS * n * 2;
  rs->out[d] = xv->bounce + mk_xn_rs_off(MK_XN_RS_OUT, d, r, nr, blocks, 0, row_bytes);
  rs->out_counts[d] = own_counts + (size_t)d * blocks;
  rs->in[d] = xv->bounce + mk_xn_rs_off(MK_XN_RS_IN, d, r, nr, blocks, 0, row_bytes);
  rs->in_counts[d] = xv->flags + MK_XN_RS_FLAG0 + (size_t)d * blocks;
  call->peer_done[d] = xv->flags + MK_XN_DONE0 + d;
  if (!gather) return;
  rs->gather[d] = xv->bounce + mk_xn_rs_off(MK_XN_RS_GATHER, d, r, nr, blocks, 0, row_bytes);
  rs->gather_counts[d] = own_counts + (size_t)(nr + d) * blocks;
  rs->gathered[d] = xv->bounce + mk_xn_rs_off(MK_XN_RS_GATHERED, d, r, nr, blocks, 0, row_bytes);
  rs->gathered_counts[d] = xv->flags + MK_XN_GATHER_FLAG0 + (size_t)d * blocks;
}

/* The epilogue's peers and the call bracket (rs_comm.h: words, slots and counters). */
static void gemm_rs_peers(const struct mk_fused_comm* fc, size_t m, size_t n, int gather, struct mk_gemm_rs* rs,
                          struct mk_gemm_call* call) {
  const int nr = fc->nranks, r = fc->rank;
  const size_t shard = m / (size_t)nr, blocks = shard / MK_AG_BLOCK_ROWS, slot = shard * n * 2;
  const size_t gather0 = (size_t)(nr - 1) * slot; /* the gather slots follow the partial slots */
  char* own = (char*)fc->sym;
  uint64_t* own_counts = (uint64_t*)(own + MK_RS_COUNT_OFFSET);
  memset(rs, 0, sizeof(*rs));
  mk_ag_call_words(call, r, nr, (uint64_t*)own, 1, 1);
  rs->shard_rows = (int)shard, rs->rank = r, rs->nranks = nr;
  struct mk_xnode_view xv;
  mk_xnode_view(fc, &xv); /* all zero without a proxy */
  rs->xn = xv.remote_mask ? xv.dev : NULL, rs->remote_mask = xv.remote_mask;
  for (int d = 0; d < nr; d++) {
    if (d == r) continue;
    if (xv.remote_mask >> d & 1) { /* through the proxy: xnode.h's slots and flags */
      gemm_rs_remote_peer(&xv, r, d, nr, (int)blocks, n, gather, own_counts, rs, call);
      continue;
    }
    char* peer = fc->peer_sym[d];
    uint64_t* peer_counts = (uint64_t*)(peer + MK_RS_COUNT_OFFSET);
    rs->out[d] = peer + MK_AG_DATA_OFFSET + (size_t)mk_sched_rs_slot(r, d) * slot;
    rs->out_counts[d] = peer_counts + (size_t)r * blocks;
    rs->in[d] = own + MK_AG_DATA_OFFSET + (size_t)mk_sched_rs_slot(d, r) * slot;
    rs->in_counts[d] = own_counts + (size_t)d * blocks;
    call->peer_done[d] = (const uint64_t*)peer + MK_AG_WORD_DONE;
    if (!gather) continue;
    rs->gather[d] = peer + MK_AG_DATA_OFFSET + gather0 + (size_t)mk_sched_rs_slot(r, d) * slot;
    rs->gather_counts[d] = peer_counts + (size_t)(nr + r) * blocks;
    rs->gathered[d] = own + MK_AG_DATA_OFFSET + gather0 + (size_t)mk_sched_rs_slot(d, r) * slot;
    rs->gathered_counts[d] = own_counts + (size_t)(nr + d) * blocks;
  }
  call->counters = own_counts, call->num_counters = nr * (int)blocks * (gather ? 2 : 1);
  /* the claim words (gemm.h collect_claims: the CTAs' start count, the collect's items, the
   * claimed walk's tiles), after the gather counters */
  rs->collect_claims = own_counts + call->num_counters;
  call->claims = rs->collect_claims + 2;
  call->num_counters += MK_GEMM_RS_CLAIM_WORDS;
}

int mk_gemm_rs_overlapped(struct mk_fused_comm* fc, const void* a, const void* b, void* c, size_t m, size_t n,
                          size_t k, int gather, cudaStream_t stream) {
  const size_t shard = m / (size_t)fc->nranks;
  const enum mk_op_id op = gather ? MK_OP_GEMM_AR : MK_OP_GEMM_RS;
  struct mk_trace_buf* trace;
  MK_CHECK(mk_trace_comm_begin(fc, op, (uint32_t)m, (uint32_t)n, stream, &trace));
  struct mk_gemm_rs rs;
  struct mk_gemm_call call;
  gemm_rs_peers(fc, m, n, gather, &rs, &call);
  if (gather) rs.c_full = c;
  struct mk_gemm_args g;
  mk_op_gemm_args(fc, op, &g); /* error record, tag and timeout */
  g.m = (int)m, g.n = (int)n, g.k = (int)k;
  g.a = a, g.b = b, g.rs = &rs, g.call = &call, g.trace = trace;
  g.c = gather ? (char*)c + (size_t)fc->rank * shard * n * 2 : c; /* this rank's rows */
  g.row_block_rotate = mk_sched_rs_row_block(fc->rank, fc->nranks, (int)(shard / MK_AG_BLOCK_ROWS), 0);
  struct mk_gemm_push sender = {.ctas = 1}; /* across nodes: the CTA that feeds the proxy */
  if (rs.xn) g.push = &sender, g.num_sms = fc->num_sms - 1;
  fc->rs_shard_blocks = (int)(shard / MK_AG_BLOCK_ROWS); /* for a hang report */
  MK_CHECK(mk_gemm_launch(&g, stream)); /* the whole call: rs_comm.h */
  return mk_trace_comm_end(fc, stream);
}

int mk_gemm_rs_hang_peer(int rank, int nranks, int blocks, const struct mk_gemm_error* e,
                         uint64_t* progress, char* what, size_t what_len) {
  if (mk_gemm_err_tile_is_own_wait(e->tile)) return -1;
  if (e->tile == MK_GEMM_ERR_TILE_PEER_FREE) {
    const int peer = (int)e->flag_index;
    if (peer < 0 || peer >= nranks || peer == rank) return -1;
    *progress = e->seen;
    snprintf(what, what_len, "the last call it finished (this call needed %" PRIu64 ")", e->expected);
    return peer;
  }
  if (blocks <= 0 || e->flag_index / (uint32_t)blocks >= (uint32_t)nranks) return -1;
  const int peer = (int)(e->flag_index / (uint32_t)blocks), mb = (int)(e->flag_index % (uint32_t)blocks);
  if (peer == rank) return -1;
  *progress = e->seen;
  snprintf(what, what_len, "tiles of its %s of row-block %d of this rank's rows stored, of %" PRIu64,
           e->tile == MK_GEMM_ERR_TILE_COLLECT ? "reduced rows" : "partial sum", mb, e->expected);
  return peer;
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
  if (!rc) rc = mk_op_gemm_overlap_check(call.name, a, m, b, c_shard, m / (size_t)fc->nranks, NULL, m, n, k);
  if (rc) return mk_result_from_errno(rc);
  rc = mk_op_device_enter(fc, &prev);
  if (!rc && mk_gemm_rs_fits(fc, m, n, k, 0)) rc = mk_gemm_rs_overlapped(fc, a, b, c_shard, m, n, k, 0, stream);
  else if (!rc) rc = gemm_rs_reference(fc, a, b, c_shard, m, n, k, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
