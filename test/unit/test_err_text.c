/* What ncclMkCommGetAsyncError says for each kind of error record (fused/comm/err_text.c): the
 * op by name, a tile's wait as "at tile N waiting for flag F", a wait that is not a tile's in
 * words (the records that read "tile 4294967294" before session 45), and a MoE dispatch that
 * received more rows than its layout holds, which is not a timeout. */
#include <stdio.h>
#include <string.h>

#include "err_text.h"
#include "mk_test.h"
#include "moe.h"
#include "op_check.h"

static const char* text_of(unsigned tag, uint32_t tile, uint32_t flag, uint64_t expected, uint64_t seen) {
  static char out[256];
  const struct mk_gemm_error e = {1, tag, tile, flag, expected, seen};
  mk_err_record_text((int)(tag >> 8), &e, out, sizeof out);
  printf("%s\n", out);
  return out;
}

static void a_tile_wait_names_the_op_tile_and_flag(void) {
  CHECK(!strcmp(text_of(MK_OP_AG_GEMM, 2, 2, 2, 1),
                "rank 0: ncclMkAllGatherGemm (op 0x1) timed out at tile 2 waiting for flag 2: expected 2, seen 1"));
  CHECK(!strcmp(text_of(0x100 | MK_OP_RING_ATTN_BWD, 116, 0, 4, 3),
                "rank 1: ncclMkRingAttentionBackward (op 0x7) timed out at tile 116 waiting for flag 0: "
                "expected 4, seen 3"));
}

static void a_push_wait_says_push_item_and_keeps_the_ops_tag(void) {
  CHECK(!strcmp(text_of(MK_GEMM_ERR_TAG_PUSH | MK_OP_RING_ATTN, 5, 1, 2, 1),
                "rank 0: ncclMkRingAttention (op 0x6) timed out at push item 5 waiting for flag 1: expected 2, seen 1"));
}

static void the_waits_that_are_not_a_tiles_are_put_in_words(void) {
  CHECK(!strcmp(text_of(0x100 | MK_OP_GEMM_AR, MK_GEMM_ERR_TILE_COLLECT, 0, 1, 0),
                "rank 1: ncclMkGemmAllReduce (op 0x3) timed out waiting for a peer's reduced rows (the "
                "all-reduce's gather) (flag 0: expected 1, seen 0)"));
  CHECK(!strcmp(text_of(MK_OP_GEMM_RS, MK_GEMM_ERR_TILE_PEER_FREE, 1, 3, 2),
                "rank 0: ncclMkGemmReduceScatter (op 0x2) timed out waiting for rank 1's previous call to end "
                "(flag 1: expected 3, seen 2)"));
  const unsigned moe = MK_GEMM_ERR_TAG_PUSH | MK_OP_MOE_DISPATCH;
  CHECK(strstr(text_of(moe, MK_MOE_WAIT_COUNTS, 1, 3, 1), "(op 0x4) timed out waiting for a peer's token counts (flag 1:"));
  CHECK(strstr(text_of(moe, MK_MOE_WAIT_CHUNK, 7, 3, 2), "waiting for a chunk of a peer's tokens (flag 7:"));
  CHECK(strstr(text_of(moe, MK_MOE_WAIT_PEER_DONE, 1, 2, 1), "waiting for rank 1's previous call to end"));
  CHECK(strstr(text_of(moe, MK_MOE_WAIT_OWN, 0, 2, 1), "waiting for another CTA's routing or layout"));
  CHECK(strstr(text_of(MK_GEMM_ERR_TAG_PUSH | MK_OP_MOE_COMBINE, MK_MOE_WAIT_ROWS, 1, 2, 1),
               "ncclMkMoeGemmCombine (op 0x5) timed out waiting for a peer's combined rows"));
  /* the MoE GEMMs' own waits are tiles' (no push bit): tile 1 is a tile, not the counts */
  CHECK(strstr(text_of(MK_OP_MOE_DISPATCH, 1, 1, 3, 1), "(op 0x4) timed out at tile 1 waiting for flag 1"));
}

/* Session 46: across nodes these read "waiting for rank 2's previous call to end" on rank 2. */
static void the_cross_node_senders_own_waits_say_what_they_are(void) {
  CHECK(!strcmp(
      text_of(0x200 | MK_OP_GEMM_AR, MK_GEMM_ERR_TILE_OWN_CTAS, 2, 8, 0),
      "rank 2: ncclMkGemmAllReduce (op 0x3) timed out waiting for this call's other CTAs to finish "
      "(flag 2: expected 8, seen 0)"));
  CHECK(strstr(text_of(0x100 | MK_OP_GEMM_RS, MK_GEMM_ERR_TILE_OWN_ROWS, 3, 4, 1),
               "timed out waiting for this rank's rows bound for rank 3 to be stored (flag 3:"));
  CHECK(strstr(
      text_of(MK_OP_GEMM_RS, MK_GEMM_ERR_TILE_PROXY_SENT, 0, 9, 6),
      "timed out waiting for the cross-node proxy (its queue, or the previous call's sends)"));
  /* the AllGather+GEMM push's (push role): the same words, not "push item 4294967293" */
  CHECK(strstr(text_of(MK_GEMM_ERR_TAG_PUSH | MK_OP_AG_GEMM, MK_GEMM_ERR_TILE_PROXY_SENT, 1, 3, 2),
               "ncclMkAllGatherGemm (op 0x1) timed out waiting for the cross-node proxy"));
}

static void a_moe_overflow_names_the_limit_and_is_no_timeout(void) {
  const char* t = text_of(MK_MOE_ERR_OVERFLOW | MK_GEMM_ERR_TAG_PUSH | MK_OP_MOE_DISPATCH, 0, 0, 64, 300);
  CHECK(!strcmp(t, "rank 0: ncclMkMoeDispatchGemm received 300 rows, more than its layout holds "
                   "(ncclMkConfig.moe_max_recv_rows = 64); the layout of this call is empty"));
  CHECK(strstr(t, "timed out") == NULL);
}

static void an_unknown_op_and_a_short_buffer_stay_safe(void) {
  CHECK(strstr(text_of(0x3f, 0, 0, 1, 0), "a fused op (op 0x3f) timed out"));
  CHECK_EQ(mk_err_tag_op(0x3f), 0);
  CHECK_EQ(mk_err_tag_op(0x2c7), MK_OP_RING_ATTN_BWD);
  char small[8];
  const struct mk_gemm_error e = {1, MK_OP_AG_GEMM, 2, 2, 2, 1};
  CHECK(mk_err_record_text(0, &e, small, sizeof small) > (int)sizeof small);
  CHECK_EQ(strlen(small), sizeof small - 1);
}

int main(void) {
  a_tile_wait_names_the_op_tile_and_flag();
  a_push_wait_says_push_item_and_keeps_the_ops_tag();
  the_waits_that_are_not_a_tiles_are_put_in_words();
  the_cross_node_senders_own_waits_say_what_they_are();
  a_moe_overflow_names_the_limit_and_is_no_timeout();
  an_unknown_op_and_a_short_buffer_stay_safe();
  return MK_TEST_RESULT();
}
