/* The account of a fused kernel's error record, for ncclMkCommGetAsyncError and the log. */
#include "err_text.h"

#include <inttypes.h>
#include <stdio.h>

#include "moe.h"
#include "op_check.h"

static const char* const op_names[] = {
    [MK_OP_AG_GEMM] = "ncclMkAllGatherGemm",          [MK_OP_GEMM_RS] = "ncclMkGemmReduceScatter",
    [MK_OP_GEMM_AR] = "ncclMkGemmAllReduce",          [MK_OP_MOE_DISPATCH] = "ncclMkMoeDispatchGemm",
    [MK_OP_MOE_COMBINE] = "ncclMkMoeGemmCombine",     [MK_OP_RING_ATTN] = "ncclMkRingAttention",
    [MK_OP_RING_ATTN_BWD] = "ncclMkRingAttentionBackward"};

#define ERR_TAG_OP_BITS 0x3fu /* below the MoE overflow and push bits */

unsigned mk_err_tag_op(unsigned tag) {
  const unsigned op = tag & ERR_TAG_OP_BITS;
  return op < sizeof op_names / sizeof *op_names && op_names[op] ? op : 0;
}

/* What a MoE dispatch or combine kernel's wait was for (moe.h MK_MOE_WAIT_*). */
static const char* moe_wait_name(uint32_t phase) {
  switch (phase) {
    case MK_MOE_WAIT_COUNTS: return "for a peer's token counts";
    case MK_MOE_WAIT_CHUNK: return "for a chunk of a peer's tokens";
    case MK_MOE_WAIT_ROWS: return "for a peer's combined rows";
    case MK_MOE_WAIT_OWN: return "for another CTA's routing or layout";
    default: return NULL;
  }
}

/* What a wait that is not a tile's was for, or NULL (a tile's, or a push item's). */
static const char* wait_what(unsigned op, const struct mk_gemm_error* e, char* buf, size_t len) {
  const int role = (e->tag & MK_GEMM_ERR_TAG_PUSH) != 0;
  const int moe = role && (op == MK_OP_MOE_DISPATCH || op == MK_OP_MOE_COMBINE);
  if (moe && moe_wait_name(e->tile)) return moe_wait_name(e->tile);
  if (e->tile == MK_GEMM_ERR_TILE_PEER_FREE || (moe && e->tile == MK_MOE_WAIT_PEER_DONE)) {
    snprintf(buf, len, "for rank %" PRIu32 "'s previous call to end", e->flag_index);
    return buf;
  }
  if (e->tile == MK_GEMM_ERR_TILE_COLLECT) return "for a peer's reduced rows (the all-reduce's gather)";
  if (e->tile == MK_GEMM_ERR_TILE_PROXY_SENT)
    return "for the cross-node proxy (its queue, or the previous call's sends)";
  if (e->tile == MK_GEMM_ERR_TILE_OWN_CTAS) return "for this call's other CTAs to finish";
  if (e->tile == MK_GEMM_ERR_TILE_OWN_ROWS) {
    snprintf(buf, len, "for this rank's rows bound for rank %" PRIu32 " to be stored",
             e->flag_index);
    return buf;
  }
  return NULL;
}

int mk_err_record_text(int rank, const struct mk_gemm_error* e, char* out, size_t len) {
  const unsigned op = mk_err_tag_op(e->tag);
  const char* name = op ? op_names[op] : "a fused op";
  if (op == MK_OP_MOE_DISPATCH && (e->tag & MK_MOE_ERR_OVERFLOW))
    return snprintf(out, len, "rank %d: %s received %" PRIu64 " rows, more than its layout holds "
                    "(ncclMkConfig.moe_max_recv_rows = %" PRIu64 "); the layout of this call is empty",
                    rank, name, e->seen, e->expected);
  const unsigned code = e->tag & ERR_TAG_OP_BITS;
  char buf[64];
  const char* what = wait_what(op, e, buf, sizeof buf);
  if (what)
    return snprintf(out, len, "rank %d: %s (op 0x%x) timed out waiting %s (flag %" PRIu32 ": expected %" PRIu64
                    ", seen %" PRIu64 ")", rank, name, code, what, e->flag_index, e->expected, e->seen);
  return snprintf(out, len, "rank %d: %s (op 0x%x) timed out at %s %" PRIu32 " waiting for flag %" PRIu32
                  ": expected %" PRIu64 ", seen %" PRIu64, rank, name, code,
                  (e->tag & MK_GEMM_ERR_TAG_PUSH) ? "push item" : "tile", e->tile, e->flag_index, e->expected,
                  e->seen);
}
