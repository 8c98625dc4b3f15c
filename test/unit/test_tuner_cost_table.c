/*
 * getCollInfo as NCCL calls it, through the v5 entry points, with NCCL_MK_TUNER_FILE set by
 * meson: the measured choice is forced for each collective, a cell NCCL marked -1 is never
 * forced, nothing changes when nothing matches (other sizes, other rank/node counts) or the
 * size is launch-bound, odd and NULL arguments never crash and never return an error.
 * NCCL's own choice in these tables (tree/ll, the cheapest) is never a measured one here;
 * test_tuner_rule.c covers the comparison with it.
 *
 * usage: test_tuner_cost_table basic   (NCCL_MK_TUNER_FILE = data/tuner_basic.txt)
 *        test_tuner_cost_table none    (a missing or empty file: nothing ever changes)
 */
#include <errno.h>
#include <stdlib.h>

#include "mk_log.h"
#include "tuner.h"
#include "tuner_test_util.h"

#define MiB (1024 * 1024)

struct call_result {
  float before[NA][NP], after[NA][NP];
  int nchannels;
};

/* One getCollInfo on a fresh table; nchannels starts at 0 as in NCCL. */
static void call(void* ctx, ncclFunc_t coll, size_t bytes, struct call_result* r) {
  tuner_test_fill_table(r->before);
  memcpy(r->after, r->before, sizeof(r->after));
  r->nchannels = 0;
  CHECK_EQ(mk_tuner_get_coll_info(ctx, coll, bytes, 1, (float**)r->after, NA, NP, 0,
                                  &r->nchannels), ncclSuccess);
}

static void* new_ctx(size_t nranks, size_t nnodes) {
  void* ctx = NULL;
  CHECK_EQ(mk_tuner_init(&ctx, 0x1234, nranks, nnodes, tuner_test_logger, NULL, NULL),
           ncclSuccess);
  CHECK(ctx != NULL);
  return ctx;
}

static void measured_choice_is_forced_for_each_collective(void) {
  static const struct {
    ncclFunc_t coll; size_t bytes; int algo, proto, nchannels;
  } want[] = {
      {ncclFuncAllReduce, 2 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0},
      {ncclFuncAllGather, 1 * MiB, NCCL_ALGO_RING, NCCL_PROTO_LL128, 8},
      /* 16 channels measured, but below 16 * 512 threads * 64 bytes NCCL's own count is
       * lower, and that is what the capped run used: the count is not passed. */
      {ncclFuncReduceScatter, 65536, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0},
      {ncclFuncReduceScatter, 1 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 16},
      {ncclFuncBroadcast, 65536, NCCL_ALGO_RING, NCCL_PROTO_LL, 0},
      {ncclFuncReduce, 65536, NCCL_ALGO_RING, NCCL_PROTO_LL128, 2},
  };
  void* ctx = new_ctx(2, 1);
  for (size_t i = 0; i < sizeof(want) / sizeof(*want); i++) {
    struct call_result r;
    call(ctx, want[i].coll, want[i].bytes, &r);
    CHECK_FORCED(r.before, r.after, want[i].algo, want[i].proto);
    CHECK_EQ(r.nchannels, want[i].nchannels);
  }
  mk_tuner_finalize(ctx);
}

static void interpolation_between_measured_sizes_picks_the_right_entry(void) {
  void* ctx = new_ctx(2, 1);
  struct call_result r;
  call(ctx, ncclFuncAllReduce, 1 * MiB + MiB / 10, &r); /* tree 9.4 us, ring 11.0 */
  CHECK_FORCED(r.before, r.after, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE);
  call(ctx, ncclFuncAllReduce, 2 * MiB, &r); /* ring 20 us, tree 22 */
  CHECK_FORCED(r.before, r.after, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE);
  mk_tuner_finalize(ctx);
}

static void cell_nccl_marked_ignore_is_never_forced(void) {
  void* ctx = new_ctx(2, 1);
  struct call_result r;
  /* PAT/simple is measured fastest for all-gather, but the table says -1: ring/ll128. */
  call(ctx, ncclFuncAllGather, 1 * MiB, &r);
  CHECK(r.after[NCCL_ALGO_PAT][NCCL_PROTO_SIMPLE] == (float)NCCL_ALGO_PROTO_IGNORE);
  CHECK_FORCED(r.before, r.after, NCCL_ALGO_RING, NCCL_PROTO_LL128);
  /* With ring/ll128 disabled too, nothing measured is allowed: no change at all. */
  tuner_test_fill_table(r.before);
  r.before[NCCL_ALGO_RING][NCCL_PROTO_LL128] = (float)NCCL_ALGO_PROTO_IGNORE;
  memcpy(r.after, r.before, sizeof(r.after));
  r.nchannels = 0;
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllGather, 1 * MiB, 1, (float**)r.after, NA,
                                  NP, 0, &r.nchannels), ncclSuccess);
  CHECK_UNCHANGED(r.before, r.after);
  CHECK_EQ(r.nchannels, 0);
  mk_tuner_finalize(ctx);
}

/* 512 B is measured (ring/ll 6.0 us), but within 2x of the sweep's fastest time (5.0 us at
 * 8 B): launch-bound, so NCCL's choice stands up to 1 MiB (tree 8.0 us there). */
static void unmatched_or_launch_bound_sizes_leave_the_table_byte_for_byte(void) {
  void* ctx = new_ctx(2, 1);
  size_t sizes[] = {2048, 8 * MiB, 1, 8, 512, 1 * MiB};
  for (int i = 0; i < 6; i++) {
    struct call_result r;
    call(ctx, ncclFuncAllReduce, sizes[i], &r);
    CHECK_UNCHANGED(r.before, r.after);
    CHECK_EQ(r.nchannels, 0);
  }
  mk_tuner_finalize(ctx);
}

static void other_rank_or_node_counts_keep_nccl_choice(void) {
  size_t shapes[][2] = {{4, 1}, {2, 2}, {8, 1}, {16, 2}};
  for (int s = 0; s < 4; s++) {
    void* ctx = new_ctx(shapes[s][0], shapes[s][1]);
    struct call_result r;
    call(ctx, ncclFuncAllReduce, 2 * MiB, &r);
    CHECK_UNCHANGED(r.before, r.after);
    CHECK_EQ(r.nchannels, 0);
    mk_tuner_finalize(ctx);
  }
  /* 8 ranks on 2 nodes are measured, with CollNet: forced only where NCCL allows it. */
  void* ctx = new_ctx(8, 2);
  struct call_result r;
  call(ctx, ncclFuncAllReduce, 2 * MiB, &r);
  CHECK_UNCHANGED(r.before, r.after);
  tuner_test_fill_table(r.before);
  r.before[NCCL_ALGO_COLLNET_DIRECT][NCCL_PROTO_SIMPLE] = 55.0f;
  memcpy(r.after, r.before, sizeof(r.after));
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllReduce, 2 * MiB, 1, (float**)r.after, NA, NP,
                                  0, &r.nchannels), ncclSuccess);
  CHECK_FORCED(r.before, r.after, NCCL_ALGO_COLLNET_DIRECT, NCCL_PROTO_SIMPLE);
  CHECK_EQ(r.nchannels, 0); /* CollNet's own count is not modelled: never passed */
  mk_tuner_finalize(ctx);
}

static void null_and_odd_arguments_never_fail_or_crash(void) {
  CHECK_EQ(mk_tuner_init(NULL, 1, 2, 1, tuner_test_logger, NULL, NULL), ncclSuccess);
  CHECK_EQ(mk_tuner_finalize(NULL), ncclSuccess);
  struct call_result r;
  call(NULL, ncclFuncAllReduce, 2 * MiB, &r); /* no context: nothing changes */
  CHECK_UNCHANGED(r.before, r.after);

  void* ctx = new_ctx(2, 1);
  int nch = 0;
  tuner_test_log_clear();
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllReduce, 2 * MiB, 1, NULL, NA, NP, 0, &nch),
           ncclSuccess);
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllReduce, 2 * MiB, 1, NULL, NA, NP, 0, &nch),
           ncclSuccess);
  CHECK_EQ(tuner_test_log_warns, 1); /* once per communicator, not per call */
  CHECK_EQ(nch, 0);

  int dims[][2] = {{0, NP}, {NA, 0}, {-1, NP}, {NA, -3}};
  for (int i = 0; i < 4; i++) {
    tuner_test_fill_table(r.before);
    memcpy(r.after, r.before, sizeof(r.after));
    CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllReduce, 2 * MiB, 1, (float**)r.after,
                                    dims[i][0], dims[i][1], 0, &nch), ncclSuccess);
    CHECK_UNCHANGED(r.before, r.after);
  }
  ncclFunc_t not_tuned[] = {ncclFuncSendRecv, ncclFuncAlltoAll, (ncclFunc_t)-1, (ncclFunc_t)99};
  for (int i = 0; i < 4; i++) {
    call(ctx, not_tuned[i], 2 * MiB, &r);
    CHECK_UNCHANGED(r.before, r.after);
  }
  /* No nChannels pointer: the table is still edited. */
  tuner_test_fill_table(r.before);
  memcpy(r.after, r.before, sizeof(r.after));
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncReduce, 65536, 1, (float**)r.after, NA, NP, 0,
                                  NULL), ncclSuccess);
  CHECK_FORCED(r.before, r.after, NCCL_ALGO_RING, NCCL_PROTO_LL128);
  mk_tuner_finalize(ctx);
}

/* Tables of other shapes are float[numAlgo][numProto]: the row stride is numProto. */
static void smaller_or_larger_tables_are_indexed_by_their_own_shape(void) {
  void* ctx = new_ctx(2, 1);
  int nch = 0;
  float two_algos[2][NP] = {{5, 6, 7}, {8, 9, 10}}; /* tree, ring */
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllReduce, 2 * MiB, 1, (float**)two_algos, 2,
                                  NP, 0, &nch), ncclSuccess);
  CHECK(two_algos[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] == 0.0f);
  CHECK(two_algos[NCCL_ALGO_TREE][NCCL_PROTO_SIMPLE] == 7.0f);

  float two_protos[NA][2]; /* ll, ll128 only */
  for (int a = 0; a < NA; a++) two_protos[a][0] = 50.0f, two_protos[a][1] = 60.0f;
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllGather, 1 * MiB, 1, (float**)two_protos, NA,
                                  2, 0, &nch), ncclSuccess);
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < 2; p++) {
      int forced = a == NCCL_ALGO_RING && p == NCCL_PROTO_LL128;
      CHECK(two_protos[a][p] == (forced ? 0.0f : 50.0f + 10.0f * (float)p));
    }

  float ten_algos[10][NP]; /* a future NCCL with more algorithms: extra rows are left alone */
  for (int a = 0; a < 10; a++)
    for (int p = 0; p < NP; p++) ten_algos[a][p] = 1.0f;
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllReduce, 2 * MiB, 1, (float**)ten_algos, 10,
                                  NP, 0, &nch), ncclSuccess);
  for (int a = 0; a < 10; a++)
    for (int p = 0; p < NP; p++)
      CHECK(ten_algos[a][p] == ((a == NCCL_ALGO_RING && p == NCCL_PROTO_SIMPLE) ? 0.0f : 1.0f));
  mk_tuner_finalize(ctx);
}

static void fused_defaults_come_from_the_same_file(int have_file) {
  int sms = -1;
  size_t chunk = 0;
  int rc = mk_tuner_fused_defaults("allgather_gemm", 4096, 8192, 8192, &sms, &chunk);
  if (!have_file) {
    CHECK_EQ(rc, -ENOENT);
    return;
  }
  CHECK_EQ(rc, 0);
  CHECK_EQ(sms, 16);
  CHECK_EQ(chunk, 1048576);
  CHECK_EQ(mk_tuner_fused_defaults("gemm_allreduce", 4096, 8192, 8192, &sms, &chunk), -ENOENT);
}

/* Without a usable file, every call leaves NCCL's table and channel count alone. */
static void without_a_file_nothing_ever_changes(void) {
  void* ctx = new_ctx(2, 1);
  size_t sizes[] = {8, 512, 65536, 1 * MiB, 2 * MiB, 16 * MiB};
  for (int coll = 0; coll < MK_TUNER_NUM_COLLS; coll++)
    for (int i = 0; i < 6; i++) {
      struct call_result r;
      call(ctx, (ncclFunc_t)coll, sizes[i], &r);
      CHECK_UNCHANGED(r.before, r.after);
      CHECK_EQ(r.nchannels, 0);
    }
  mk_tuner_finalize(ctx);
}

static void null_arguments_succeed_without_a_file(void) {
  CHECK_EQ(mk_tuner_init(NULL, 1, 2, 1, tuner_test_logger, NULL, NULL), ncclSuccess);
  void* ctx = new_ctx(2, 1);
  CHECK_EQ(mk_tuner_get_coll_info(ctx, ncclFuncAllReduce, 64, 1, NULL, 0, 0, 0, NULL),
           ncclSuccess);
  CHECK_EQ(mk_tuner_get_coll_info(NULL, ncclFuncAllReduce, 64, 1, NULL, NA, NP, 0, NULL),
           ncclSuccess);
  CHECK_EQ(mk_tuner_finalize(ctx), ncclSuccess);
  CHECK_EQ(mk_tuner_finalize(NULL), ncclSuccess);
}

int main(int argc, char** argv) {
  if (argc != 2 || (strcmp(argv[1], "basic") && strcmp(argv[1], "none"))) {
    fprintf(stderr, "usage: %s basic|none\n", argv[0]);
    return 2;
  }
  mk_log_set_logger(tuner_test_logger);
  if (!strcmp(argv[1], "none")) {
    without_a_file_nothing_ever_changes();
    null_arguments_succeed_without_a_file();
    fused_defaults_come_from_the_same_file(0);
    return MK_TEST_RESULT();
  }
  measured_choice_is_forced_for_each_collective();
  interpolation_between_measured_sizes_picks_the_right_entry();
  cell_nccl_marked_ignore_is_never_forced();
  unmatched_or_launch_bound_sizes_leave_the_table_byte_for_byte();
  other_rank_or_node_counts_keep_nccl_choice();
  null_and_odd_arguments_never_fail_or_crash();
  smaller_or_larger_tables_are_indexed_by_their_own_shape();
  fused_defaults_come_from_the_same_file(1);
  return MK_TEST_RESULT();
}
