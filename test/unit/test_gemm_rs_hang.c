/*
 * A timed-out wait of a one-kernel GEMM+RS/AR (or MoE combine) call names the peer it waited
 * for (mk_gemm_rs_hang_peer), from the error record alone: the wait for a peer's previous call,
 * for a peer's partial of a row-block, for a peer's reduced row-block; records it cannot read,
 * and the cross-node sender's waits on this rank's own work, name nobody. No GPU.
 */
#include <string.h>

#include "gemm_rs.h"
#include "mk_test.h"

static struct mk_gemm_error record(uint32_t tile, uint32_t flag_index, uint64_t expected, uint64_t seen) {
  struct mk_gemm_error e;
  memset(&e, 0, sizeof e);
  e.aborted = 1, e.tile = tile, e.flag_index = flag_index, e.expected = expected, e.seen = seen;
  return e;
}

static void previous_call_wait_names_that_peer(void) {
  struct mk_gemm_error e = record(MK_GEMM_ERR_TILE_PEER_FREE, 3, 6, 4);
  uint64_t progress = 0;
  char what[128] = "";
  CHECK_EQ(mk_gemm_rs_hang_peer(1, 4, 0, &e, &progress, what, sizeof what), 3);
  CHECK_EQ(progress, 4);
  CHECK(strstr(what, "last call it finished") != NULL && strstr(what, "needed 6") != NULL);
  e.flag_index = 1; /* itself: not a peer */
  CHECK_EQ(mk_gemm_rs_hang_peer(1, 4, 0, &e, &progress, what, sizeof what), -1);
  e.flag_index = 4; /* past the ranks */
  CHECK_EQ(mk_gemm_rs_hang_peer(1, 4, 0, &e, &progress, what, sizeof what), -1);
}

static void partial_and_reduced_row_block_waits_name_their_source(void) {
  const int blocks = 16;
  struct mk_gemm_error e = record(37, 2 * blocks + 5, 32, 20); /* a tile's wait: rank 2, row-block 5 */
  uint64_t progress = 0;
  char what[128] = "";
  CHECK_EQ(mk_gemm_rs_hang_peer(0, 3, blocks, &e, &progress, what, sizeof what), 2);
  CHECK_EQ(progress, 20);
  CHECK(strstr(what, "partial sum of row-block 5") != NULL && strstr(what, "of 32") != NULL);
  e = record(MK_GEMM_ERR_TILE_COLLECT, 1 * blocks + 15, 32, 31);
  CHECK_EQ(mk_gemm_rs_hang_peer(0, 3, blocks, &e, &progress, what, sizeof what), 1);
  CHECK(strstr(what, "reduced rows of row-block 15") != NULL);
  CHECK_EQ(mk_gemm_rs_hang_peer(0, 3, 0, &e, &progress, what, sizeof what), -1); /* blocks unknown */
  e = record(37, 3 * blocks, 32, 0);                                              /* rank 3 of 3 */
  CHECK_EQ(mk_gemm_rs_hang_peer(0, 3, blocks, &e, &progress, what, sizeof what), -1);
  e = record(37, 0 * blocks + 2, 32, 0);                                          /* this rank */
  CHECK_EQ(mk_gemm_rs_hang_peer(0, 3, blocks, &e, &progress, what, sizeof what), -1);
}

/* The cross-node sender's waits on this rank's own proxy, CTAs and rows: flag_index is this
 * rank or a destination, never a peer that owes something. */
static void the_senders_own_waits_name_nobody(void) {
  const uint32_t own[] = {MK_GEMM_ERR_TILE_PROXY_SENT, MK_GEMM_ERR_TILE_OWN_CTAS,
                          MK_GEMM_ERR_TILE_OWN_ROWS};
  for (int i = 0; i < 3; i++) {
    struct mk_gemm_error e = record(own[i], 2, 8, 0);
    uint64_t progress = 0;
    char what[128] = "";
    CHECK_EQ(mk_gemm_rs_hang_peer(1, 4, 16, &e, &progress, what, sizeof what), -1);
  }
}

int main(void) {
  previous_call_wait_names_that_peer();
  the_senders_own_waits_name_nobody();
  partial_and_reduced_row_block_waits_name_their_source();
  return MK_TEST_RESULT();
}
