/*
 * The pure parts of the override rule, without NCCL or a file: the size from which a
 * measured channel count is passed (NCCL's own count reaches it), the launch-bound limit a
 * model derives from its sweep, and the rule's decision on small models built here.
 */
#include <errno.h>

#include "mk_test.h"
#include "tuner_channels.h"
#include "tuner_model.h"
#include "tuner_rule.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static void add(struct mk_tuner_model* m, uint64_t bytes, int algo, int proto, int nch,
                double t) {
  struct mk_tuner_point p = {ncclFuncAllReduce, 2, 1, algo, proto, nch, bytes, t};
  CHECK_EQ(mk_tuner_model_add_point(m, &p), 0);
}

/* nc * nt * threshold, NCCL 2.28's defaults: ring/ll 512 threads x 8 B x nranks, ll128 640 x
 * 8, simple 512 x 64; tree/ll without the nranks factor. */
static void channel_count_is_passed_only_where_nccl_own_count_reaches_it(void) {
  CHECK_EQ(mk_tuner_channels_full_size(NCCL_ALGO_RING, NCCL_PROTO_LL, 2, 16), 131072);
  CHECK_EQ(mk_tuner_channels_full_size(NCCL_ALGO_RING, NCCL_PROTO_LL, 8, 16), 524288);
  CHECK_EQ(mk_tuner_channels_full_size(NCCL_ALGO_TREE, NCCL_PROTO_LL, 8, 16), 65536);
  CHECK_EQ(mk_tuner_channels_full_size(NCCL_ALGO_RING, NCCL_PROTO_LL128, 2, 8), 40960);
  CHECK_EQ(mk_tuner_channels_full_size(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 2, 16), 524288);
  CHECK_EQ(mk_tuner_channels_to_pass(NCCL_ALGO_RING, NCCL_PROTO_LL, 2, 32, 16), 0);
  CHECK_EQ(mk_tuner_channels_to_pass(NCCL_ALGO_RING, NCCL_PROTO_LL, 2, 131071, 16), 0);
  CHECK_EQ(mk_tuner_channels_to_pass(NCCL_ALGO_RING, NCCL_PROTO_LL, 2, 131072, 16), 16);
  CHECK_EQ(mk_tuner_channels_to_pass(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 2, 128 * MiB, 16), 16);
  /* Algorithms whose own count NCCL derives otherwise: never passed. */
  int others[] = {NCCL_ALGO_NVLS, NCCL_ALGO_NVLS_TREE, NCCL_ALGO_COLLNET_DIRECT,
                  NCCL_ALGO_COLLNET_CHAIN, NCCL_ALGO_PAT, -1, 99};
  for (int i = 0; i < 7; i++)
    CHECK_EQ(mk_tuner_channels_to_pass(others[i], NCCL_PROTO_SIMPLE, 2, 1ull << 40, 16), 0);
  CHECK_EQ(mk_tuner_channels_to_pass(NCCL_ALGO_RING, 7, 2, 1ull << 40, 16), 0);
  CHECK_EQ(mk_tuner_channels_to_pass(NCCL_ALGO_RING, NCCL_PROTO_LL, 2, 1ull << 40, 0), 0);
}

/* Floor 6.5 us: every size with a reading under 13 us is launch-bound, whatever the rest. */
static void launch_bound_limit_follows_the_sweep_floor(void) {
  struct mk_tuner_model m = {0};
  add(&m, 8, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 10.3);
  add(&m, 32, NCCL_ALGO_RING, NCCL_PROTO_LL, 16, 6.5);
  add(&m, 512 * KiB, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 12.9);
  add(&m, 512 * KiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 20.0);
  add(&m, 2 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 22.0);
  mk_tuner_model_finish(&m);
  CHECK_EQ(mk_tuner_model_launch_bound(&m, ncclFuncAllReduce, 2, 1), 512 * KiB);
  CHECK_EQ(mk_tuner_model_launch_bound(&m, ncclFuncAllReduce, 4, 1), 0); /* other shape */
  CHECK_EQ(mk_tuner_model_launch_bound(&m, ncclFuncAllGather, 2, 1), 0);
  CHECK_EQ(mk_tuner_model_launch_bound(NULL, ncclFuncAllReduce, 2, 1), 0);
  mk_tuner_model_free(&m);
  /* A network-like sweep: floor 20 us at 8 B, data-bound from 256 KiB (45 us). */
  add(&m, 8, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 20.0);
  add(&m, 64 * KiB, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 39.0);
  add(&m, 256 * KiB, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 45.0);
  mk_tuner_model_finish(&m);
  CHECK_EQ(mk_tuner_model_launch_bound(&m, ncclFuncAllReduce, 2, 1), 64 * KiB);
  mk_tuner_model_free(&m);
}

static int decide(const struct mk_tuner_model* m, uint64_t bytes, int nccl_algo,
                  int nccl_proto, struct mk_tuner_choice* c) {
  struct mk_tuner_query q = {ncclFuncAllReduce, 2, 1, bytes, MK_TUNER_ALL_CELLS, nccl_algo,
                             nccl_proto};
  return mk_tuner_rule_decide(m, &q, c);
}

/* A "keep" record at 512 KiB (the check lost there): NCCL's choice stands from 256 KiB to
 * just under 1 MiB, the measured best still applies at 2 MiB and at 1 MiB. */
static void keep_record_leaves_nccl_choice_within_a_factor_two(void) {
  struct mk_tuner_model m = {0};
  add(&m, 8, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 5.0);
  add(&m, 128 * KiB, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 30.0);
  add(&m, 128 * KiB, NCCL_ALGO_TREE, NCCL_PROTO_LL, 0, 20.0);
  add(&m, 2 * MiB, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 60.0);
  add(&m, 2 * MiB, NCCL_ALGO_TREE, NCCL_PROTO_LL, 0, 40.0);
  struct mk_tuner_point keep = {ncclFuncAllReduce, 2, 1, -1, -1, 0, 512 * KiB, 0};
  CHECK_EQ(mk_tuner_model_add_keep(&m, &keep), 0);
  mk_tuner_model_finish(&m);
  struct mk_tuner_choice c;
  CHECK_EQ(mk_tuner_model_kept(&m, ncclFuncAllReduce, 2, 1, 256 * KiB), 1);
  CHECK_EQ(mk_tuner_model_kept(&m, ncclFuncAllReduce, 2, 1, 1 * MiB - 1), 1);
  CHECK_EQ(mk_tuner_model_kept(&m, ncclFuncAllReduce, 2, 1, 1 * MiB), 0);
  CHECK_EQ(mk_tuner_model_kept(&m, ncclFuncAllReduce, 2, 1, 256 * KiB - 1), 0);
  CHECK_EQ(mk_tuner_model_kept(&m, ncclFuncAllGather, 2, 1, 512 * KiB), 0); /* other collective */
  CHECK_EQ(mk_tuner_model_kept(&m, ncclFuncAllReduce, 4, 1, 512 * KiB), 0); /* other shape */
  CHECK_EQ(decide(&m, 512 * KiB, NCCL_ALGO_RING, NCCL_PROTO_LL, &c), -ENOENT);
  CHECK_EQ(decide(&m, 300 * KiB, NCCL_ALGO_RING, NCCL_PROTO_LL, &c), -ENOENT);
  CHECK_EQ(decide(&m, 1 * MiB, NCCL_ALGO_RING, NCCL_PROTO_LL, &c), 0); /* tree, 1/3 faster */
  CHECK_EQ(c.algo, NCCL_ALGO_TREE);
  CHECK_EQ(decide(&m, 2 * MiB, NCCL_ALGO_RING, NCCL_PROTO_LL, &c), 0);
  CHECK_EQ(c.algo, NCCL_ALGO_TREE);
  mk_tuner_model_free(&m);
}

/* Above the launch-bound sizes: 16 channels must beat channels 0 of the same cell by 3%. */
static void channel_count_needs_a_gain_over_nccl_own_count(void) {
  struct mk_tuner_model m = {0};
  add(&m, 8, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 5.0);
  add(&m, 2 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 30.0);
  add(&m, 2 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 16, 29.5); /* 1.7%: not passed */
  add(&m, 2 * MiB, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 0, 40.0);
  add(&m, 8 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 100.0);
  add(&m, 8 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 16, 90.0); /* 11%: passed */
  add(&m, 8 * MiB, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 0, 120.0);
  mk_tuner_model_finish(&m);
  struct mk_tuner_choice c;
  CHECK_EQ(decide(&m, 2 * MiB, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, &c), 0);
  CHECK_EQ(c.algo, NCCL_ALGO_RING);
  CHECK_EQ(c.nchannels, 0);
  CHECK(c.time_us == 30.0);
  /* NCCL already runs ring/simple at its own count: nothing to change. */
  CHECK_EQ(decide(&m, 2 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, &c), -ENOENT);
  CHECK_EQ(decide(&m, 8 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, &c), 0);
  CHECK_EQ(c.algo, NCCL_ALGO_RING);
  CHECK_EQ(c.nchannels, 16);
  CHECK_EQ(decide(&m, 8, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, &c), -ENOENT); /* launch-bound */
  CHECK_EQ(decide(NULL, 8 * MiB, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, &c), -ENOENT);
  mk_tuner_model_free(&m);
}

/* A bimodal small size: the forced 16 channels read 6.8 us, NCCL's own ring/ll 10.3. With a
 * fast reading elsewhere in the sweep (6.5 us) the size is launch-bound: NCCL's choice. */
static void bimodal_small_size_does_not_override_nccl(void) {
  struct mk_tuner_model m = {0};
  add(&m, 8, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 6.5);
  add(&m, 32, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 10.3);
  add(&m, 32, NCCL_ALGO_RING, NCCL_PROTO_LL, 16, 6.8);
  add(&m, 128, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 10.3);
  add(&m, 128, NCCL_ALGO_RING, NCCL_PROTO_LL, 16, 10.4);
  add(&m, 2 * MiB, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 30.0);
  mk_tuner_model_finish(&m);
  struct mk_tuner_choice c;
  for (uint64_t b = 8; b <= 128; b *= 2)
    CHECK_EQ(decide(&m, b, NCCL_ALGO_RING, NCCL_PROTO_LL, &c), -ENOENT);
  /* Without the rule the model alone would force 16 channels at 32 B. */
  CHECK_EQ(mk_tuner_model_choose(&m, ncclFuncAllReduce, 2, 1, 32, MK_TUNER_ALL_CELLS, &c), 0);
  CHECK_EQ(c.nchannels, 16);
  mk_tuner_model_free(&m);
}

int main(void) {
  channel_count_is_passed_only_where_nccl_own_count_reaches_it();
  launch_bound_limit_follows_the_sweep_floor();
  channel_count_needs_a_gain_over_nccl_own_count();
  bimodal_small_size_does_not_override_nccl();
  keep_record_leaves_nccl_choice_within_a_factor_two();
  return MK_TEST_RESULT();
}
