/*
 * The model alone (no file, no NCCL): which configuration it picks between and at measured
 * sizes, that it never extrapolates or picks a cell NCCL disallowed, that repeated
 * measurements keep the fastest, the sizes a keep record covers, and the fused-op defaults
 * lookup.
 */
#include <errno.h>

#include "mk_test.h"
#include "tuner_model.h"

#define MiB (1024 * 1024)

static void add(struct mk_tuner_model* m, int coll, int nranks, int nnodes, uint64_t bytes,
                int algo, int proto, int nch, double t) {
  struct mk_tuner_point p = {coll, nranks, nnodes, algo, proto, nch, bytes, t};
  CHECK_EQ(mk_tuner_model_add_point(m, &p), 0);
}

/* ring: 10 us at 1 MiB, 40 at 4 MiB; tree: 8 and 50. They cross at 1.5 MiB. */
static void crossing_model(struct mk_tuner_model* m) {
  add(m, ncclFuncAllReduce, 2, 1, 4 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 40.0);
  add(m, ncclFuncAllReduce, 2, 1, 1 * MiB, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 0, 8.0);
  add(m, ncclFuncAllReduce, 2, 1, 1 * MiB, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 10.0);
  add(m, ncclFuncAllReduce, 2, 1, 4 * MiB, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 0, 50.0);
  mk_tuner_model_finish(m);
}

static int choose_algo(const struct mk_tuner_model* m, uint64_t bytes, uint32_t allowed,
                       struct mk_tuner_choice* c) {
  return mk_tuner_model_choose(m, ncclFuncAllReduce, 2, 1, bytes, allowed, c);
}

static void interpolation_picks_the_faster_between_two_measured_sizes(void) {
  struct mk_tuner_model m = {0};
  crossing_model(&m);
  struct mk_tuner_choice c;
  CHECK_EQ(choose_algo(&m, 1 * MiB + MiB / 10, MK_TUNER_ALL_CELLS, &c), 0);
  CHECK_EQ(c.algo, NCCL_ALGO_TREE); /* tree 9.4 us, ring 11.0 */
  CHECK(c.time_us > 9.3 && c.time_us < 9.5);
  CHECK_EQ(choose_algo(&m, 2 * MiB, MK_TUNER_ALL_CELLS, &c), 0);
  CHECK_EQ(c.algo, NCCL_ALGO_RING); /* ring 20 us, tree 22 */
  CHECK(c.time_us > 19.99 && c.time_us < 20.01);
  CHECK_EQ(c.proto, NCCL_PROTO_SIMPLE);
  CHECK_EQ(c.nchannels, 0);
  mk_tuner_model_free(&m);
}

static void measured_sizes_are_used_exactly(void) {
  struct mk_tuner_model m = {0};
  crossing_model(&m);
  struct mk_tuner_choice c;
  CHECK_EQ(choose_algo(&m, 1 * MiB, MK_TUNER_ALL_CELLS, &c), 0);
  CHECK_EQ(c.algo, NCCL_ALGO_TREE);
  CHECK(c.time_us == 8.0);
  CHECK_EQ(choose_algo(&m, 4 * MiB, MK_TUNER_ALL_CELLS, &c), 0);
  CHECK_EQ(c.algo, NCCL_ALGO_RING);
  CHECK(c.time_us == 40.0);
  mk_tuner_model_free(&m);
}

static void outside_the_measured_range_nothing_is_chosen(void) {
  struct mk_tuner_model m = {0};
  crossing_model(&m);
  struct mk_tuner_choice c;
  CHECK_EQ(choose_algo(&m, 1 * MiB - 1, MK_TUNER_ALL_CELLS, &c), -ENOENT);
  CHECK_EQ(choose_algo(&m, 4 * MiB + 1, MK_TUNER_ALL_CELLS, &c), -ENOENT);
  CHECK_EQ(choose_algo(&m, 0, MK_TUNER_ALL_CELLS, &c), -ENOENT);
  mk_tuner_model_free(&m);
}

static void disallowed_cells_are_skipped_for_the_next_best(void) {
  struct mk_tuner_model m = {0};
  crossing_model(&m);
  struct mk_tuner_choice c;
  uint32_t no_tree = MK_TUNER_ALL_CELLS & ~mk_tuner_cell_bit(NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE);
  CHECK_EQ(choose_algo(&m, 1 * MiB, no_tree, &c), 0);
  CHECK_EQ(c.algo, NCCL_ALGO_RING);
  CHECK_EQ(choose_algo(&m, 1 * MiB, 0, &c), -ENOENT);
  mk_tuner_model_free(&m);
}

static void other_shapes_and_collectives_do_not_match(void) {
  struct mk_tuner_model m = {0};
  crossing_model(&m);
  struct mk_tuner_choice c;
  CHECK_EQ(mk_tuner_model_choose(&m, ncclFuncAllReduce, 4, 1, 2 * MiB, MK_TUNER_ALL_CELLS, &c),
           -ENOENT);
  CHECK_EQ(mk_tuner_model_choose(&m, ncclFuncAllReduce, 2, 2, 2 * MiB, MK_TUNER_ALL_CELLS, &c),
           -ENOENT);
  CHECK_EQ(mk_tuner_model_choose(&m, ncclFuncAllGather, 2, 1, 2 * MiB, MK_TUNER_ALL_CELLS, &c),
           -ENOENT);
  CHECK_EQ(mk_tuner_model_count_shape(&m, 2, 1), 4);
  CHECK_EQ(mk_tuner_model_count_shape(&m, 4, 1), 0);
  mk_tuner_model_free(&m);
}

static void repeated_measurements_keep_the_fastest(void) {
  struct mk_tuner_model m = {0};
  add(&m, ncclFuncReduce, 2, 1, 4096, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 9.0);
  add(&m, ncclFuncReduce, 2, 1, 4096, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 5.0);
  add(&m, ncclFuncReduce, 2, 1, 4096, NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 7.0);
  mk_tuner_model_finish(&m);
  CHECK_EQ(m.npoints, 1);
  struct mk_tuner_choice c;
  CHECK_EQ(mk_tuner_model_choose(&m, ncclFuncReduce, 2, 1, 4096, MK_TUNER_ALL_CELLS, &c), 0);
  CHECK(c.time_us == 5.0);
  mk_tuner_model_free(&m);
}

static void channel_counts_are_separate_configurations(void) {
  struct mk_tuner_model m = {0};
  add(&m, ncclFuncAllGather, 2, 1, 1024, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 4, 20.0);
  add(&m, ncclFuncAllGather, 2, 1, 8192, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 4, 20.0);
  add(&m, ncclFuncAllGather, 2, 1, 1024, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 16, 30.0);
  add(&m, ncclFuncAllGather, 2, 1, 8192, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 16, 10.0);
  mk_tuner_model_finish(&m);
  struct mk_tuner_choice c;
  CHECK_EQ(mk_tuner_model_choose(&m, ncclFuncAllGather, 2, 1, 2048, MK_TUNER_ALL_CELLS, &c), 0);
  CHECK_EQ(c.nchannels, 4);
  CHECK_EQ(mk_tuner_model_choose(&m, ncclFuncAllGather, 2, 1, 8000, MK_TUNER_ALL_CELLS, &c), 0);
  CHECK_EQ(c.nchannels, 16);
  mk_tuner_model_free(&m);
}

static void empty_or_null_model_chooses_nothing(void) {
  struct mk_tuner_model m = {0};
  struct mk_tuner_choice c;
  mk_tuner_model_finish(&m);
  CHECK_EQ(mk_tuner_model_choose(&m, ncclFuncAllReduce, 2, 1, 64, MK_TUNER_ALL_CELLS, &c),
           -ENOENT);
  CHECK_EQ(mk_tuner_model_choose(NULL, ncclFuncAllReduce, 2, 1, 64, MK_TUNER_ALL_CELLS, &c),
           -ENOENT);
  CHECK_EQ(mk_tuner_model_count_shape(NULL, 2, 1), 0);
}

static void add_fused(struct mk_tuner_model* m, const char* op, int64_t mm, int64_t n,
                      int64_t k, int sms, int64_t chunk, double t) {
  struct mk_tuner_fused_point f = {.m = mm, .n = n, .k = k, .comm_sms = sms,
                                   .chunk_bytes = chunk, .time_us = t};
  snprintf(f.op, sizeof(f.op), "%s", op);
  CHECK_EQ(mk_tuner_model_add_fused(m, &f), 0);
}

static void fused_defaults_take_nearest_m_then_fastest(void) {
  struct mk_tuner_model m = {0};
  add_fused(&m, "allgather_gemm", 4096, 8192, 8192, 16, 1 << 20, 812.5);
  add_fused(&m, "allgather_gemm", 4096, 8192, 8192, 8, 4 << 20, 900.0);
  add_fused(&m, "allgather_gemm", 16384, 8192, 8192, 32, 8 << 20, 3000.0);
  add_fused(&m, "gemm_reducescatter", 4096, 8192, 8192, 4, 2 << 20, 700.0);
  int sms = 0;
  int64_t chunk = 0;
  CHECK_EQ(mk_tuner_model_fused(&m, "allgather_gemm", 4096, 8192, 8192, &sms, &chunk), 0);
  CHECK_EQ(sms, 16);
  CHECK_EQ(chunk, 1 << 20);
  CHECK_EQ(mk_tuner_model_fused(&m, "allgather_gemm", 12000, 8192, 8192, &sms, &chunk), 0);
  CHECK_EQ(sms, 32);
  /* 8192 is as near to 4096 as to 16384 (ratio 2): the smaller M wins. */
  CHECK_EQ(mk_tuner_model_fused(&m, "allgather_gemm", 8192, 8192, 8192, &sms, &chunk), 0);
  CHECK_EQ(sms, 16);
  CHECK_EQ(mk_tuner_model_fused(&m, "gemm_reducescatter", 2048, 8192, 8192, &sms, &chunk), 0);
  CHECK_EQ(sms, 4);
  CHECK_EQ(chunk, 2 << 20);
  mk_tuner_model_free(&m);
}

static void fused_defaults_without_a_match_are_enoent(void) {
  struct mk_tuner_model m = {0};
  add_fused(&m, "allgather_gemm", 4096, 8192, 8192, 16, 1 << 20, 812.5);
  int sms = -7;
  int64_t chunk = -7;
  CHECK_EQ(mk_tuner_model_fused(&m, "gemm_allreduce", 4096, 8192, 8192, &sms, &chunk), -ENOENT);
  CHECK_EQ(mk_tuner_model_fused(&m, "allgather_gemm", 4096, 8192, 4096, &sms, &chunk), -ENOENT);
  CHECK_EQ(mk_tuner_model_fused(&m, "allgather_gemm", 4096, 14336, 8192, &sms, &chunk), -ENOENT);
  CHECK_EQ(mk_tuner_model_fused(&m, "allgather_gemm", 0, 8192, 8192, &sms, &chunk), -ENOENT);
  CHECK_EQ(mk_tuner_model_fused(&m, NULL, 4096, 8192, 8192, &sms, &chunk), -ENOENT);
  CHECK_EQ(sms, -7); /* outputs untouched */
  CHECK_EQ(chunk, -7);
  mk_tuner_model_free(&m);
}

static void keep(struct mk_tuner_model* m, uint64_t bytes) {
  struct mk_tuner_point k = {.coll = ncclFuncAllReduce, .nranks = 2, .nnodes = 1, .bytes = bytes};
  CHECK_EQ(mk_tuner_model_add_keep(m, &k), 0);
}

/* A keep covers 2x either way in a 4x sweep (halfway to the neighbours), but in a 2x sweep
 * only up to the geometric midpoint: the measured neighbours stay the model's. */
static void keep_records_cover_up_to_halfway_to_the_measured_neighbours(void) {
  struct mk_tuner_model x4 = {0}, x2 = {0};
  for (uint64_t b = 1 * MiB; b <= 16 * MiB; b *= 4)
    add(&x4, ncclFuncAllReduce, 2, 1, b, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 10.0);
  for (uint64_t b = 1 * MiB; b <= 16 * MiB; b *= 2)
    add(&x2, ncclFuncAllReduce, 2, 1, b, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 10.0);
  keep(&x4, 4 * MiB);
  keep(&x2, 4 * MiB);
  mk_tuner_model_finish(&x4);
  mk_tuner_model_finish(&x2);
  CHECK(mk_tuner_model_kept(&x4, ncclFuncAllReduce, 2, 1, 2 * MiB));
  CHECK(mk_tuner_model_kept(&x4, ncclFuncAllReduce, 2, 1, 8 * MiB - 1));
  CHECK(!mk_tuner_model_kept(&x4, ncclFuncAllReduce, 2, 1, 2 * MiB - 1));
  CHECK(!mk_tuner_model_kept(&x4, ncclFuncAllReduce, 2, 1, 8 * MiB));
  CHECK(mk_tuner_model_kept(&x2, ncclFuncAllReduce, 2, 1, 3 * MiB));
  CHECK(mk_tuner_model_kept(&x2, ncclFuncAllReduce, 2, 1, 5 * MiB));
  CHECK(!mk_tuner_model_kept(&x2, ncclFuncAllReduce, 2, 1, 2 * MiB)); /* a measured neighbour */
  CHECK(!mk_tuner_model_kept(&x2, ncclFuncAllReduce, 2, 1, 8 * MiB));
  CHECK(!mk_tuner_model_kept(&x2, ncclFuncAllReduce, 2, 1, 2 * MiB + MiB / 2));
  CHECK(!mk_tuner_model_kept(&x2, ncclFuncAllReduce, 2, 1, 6 * MiB));
  CHECK(!mk_tuner_model_kept(&x2, ncclFuncAllReduce, 4, 1, 4 * MiB)); /* other shape */
  mk_tuner_model_free(&x4);
  mk_tuner_model_free(&x2);
}

int main(void) {
  keep_records_cover_up_to_halfway_to_the_measured_neighbours();
  interpolation_picks_the_faster_between_two_measured_sizes();
  measured_sizes_are_used_exactly();
  outside_the_measured_range_nothing_is_chosen();
  disallowed_cells_are_skipped_for_the_next_best();
  other_shapes_and_collectives_do_not_match();
  repeated_measurements_keep_the_fastest();
  channel_counts_are_separate_configurations();
  empty_or_null_model_chooses_nothing();
  fused_defaults_take_nearest_m_then_fastest();
  fused_defaults_without_a_match_are_enoent();
  return MK_TEST_RESULT();
}
