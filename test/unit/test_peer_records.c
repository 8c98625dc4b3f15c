/*
 * ncclMkCommInit's agreement over the gathered records (mk_peer_records_agree): a rank whose own
 * init failed, a peer's failure, and configs that choose different paths each fail every rank's
 * init, naming the rank; a different timeout (which chooses nothing) does not. Before this an
 * init that failed on one rank left its peers waiting in the exchange, and ranks with different
 * sizes or NCCL_MK_FUSED took different paths in the same call.
 */
#include <errno.h>
#include <string.h>

#include "fused_comm.h"
#include "mk_test.h"
#include "warn_capture.h"

#define RANKS 4

static void records_fill(struct mk_peer_record* r) {
  memset(r, 0, RANKS * sizeof(*r));
  for (int p = 0; p < RANKS; p++) {
    ncclMkConfigDefaults(&r[p].config);
    r[p].fused = 1;
    r[p].version = MK_PEER_RECORD_VERSION;
    r[p].sym_bytes = 1 << 20;
  }
}

static void same_records_agree(void) {
  struct mk_peer_record r[RANKS];
  records_fill(r);
  for (int rank = 0; rank < RANKS; rank++) CHECK_EQ(mk_peer_records_agree(r, RANKS, rank), 0);
  r[2].config.timeout_ms = 1234; /* a bound on waits, not a path */
  CHECK_EQ(mk_peer_records_agree(r, RANKS, 0), 0);
}

static void a_peers_failed_init_fails_every_rank_and_is_named(void) {
  struct mk_peer_record r[RANKS];
  records_fill(r);
  r[3].init_error = ENOMEM;
  for (int rank = 0; rank < 3; rank++) {
    last_warn[0] = '\0';
    CHECK_EQ(mk_peer_records_agree(r, RANKS, rank), -ECONNRESET);
    CHECK(strstr(last_warn, "the init failed on rank 3") != NULL);
  }
  CHECK_EQ(mk_peer_records_agree(r, RANKS, 3), -ENOMEM); /* its own error, as it was */
}

static void a_config_that_differs_fails_every_rank_and_is_named(void) {
  struct mk_peer_record r[RANKS];
  records_fill(r);
  r[1].config.max_m = 16384;
  last_warn[0] = '\0';
  CHECK_EQ(mk_peer_records_agree(r, RANKS, 0), -EINVAL);
  CHECK(strstr(last_warn, "rank 1's config differs from rank 0's") != NULL);
  CHECK(strstr(last_warn, "16384/8192/8192 vs 8192/8192/8192") != NULL);
  CHECK_EQ(mk_peer_records_agree(r, RANKS, 1), -EINVAL); /* and rank 1 sees rank 0's */
  records_fill(r);
  r[2].fused = 0;
  last_warn[0] = '\0';
  CHECK_EQ(mk_peer_records_agree(r, RANKS, 3), -EINVAL);
  CHECK(strstr(last_warn, "NCCL_MK_FUSED 0 vs 1") != NULL);
  records_fill(r);
  r[0].config.moe_max_tokens = 64;
  CHECK_EQ(mk_peer_records_agree(r, RANKS, 1), -EINVAL);
}

/* Another build's record, or a workspace of another size from the same config (another build's
 * layout), is refused rather than misread. */
static void another_build_is_refused(void) {
  struct mk_peer_record r[RANKS];
  records_fill(r);
  r[2].version = MK_PEER_RECORD_VERSION + 1;
  last_warn[0] = '\0';
  CHECK_EQ(mk_peer_records_agree(r, RANKS, 0), -EINVAL);
  CHECK(strstr(last_warn, "rank 2's init record is version") != NULL);
  records_fill(r);
  r[1].sym_bytes += 256;
  last_warn[0] = '\0';
  CHECK_EQ(mk_peer_records_agree(r, RANKS, 3), -EINVAL);
  CHECK(strstr(last_warn, "rank 1's workspace is") != NULL);
}

/* The mapping results' agreement over plain int32 slots: the first failed peer is named. */
static void a_peers_failed_mapping_fails_every_rank(void) {
  int32_t errs[RANKS] = {0, 0, 0, 0};
  CHECK_EQ(mk_peer_errors_agree(errs, sizeof *errs, RANKS, 1, "mapping"), 0);
  errs[2] = EIO;
  last_warn[0] = '\0';
  CHECK_EQ(mk_peer_errors_agree(errs, sizeof *errs, RANKS, 0, "mapping"), -ECONNRESET);
  CHECK(strstr(last_warn, "mapping failed on rank 2") != NULL);
  CHECK_EQ(mk_peer_errors_agree(errs, sizeof *errs, RANKS, 2, "mapping"), -EIO);
}

int main(void) {
  warn_capture_on();
  same_records_agree();
  a_peers_failed_init_fails_every_rank_and_is_named();
  a_config_that_differs_fails_every_rank_and_is_named();
  another_build_is_refused();
  a_peers_failed_mapping_fails_every_rank();
  return MK_TEST_RESULT();
}
