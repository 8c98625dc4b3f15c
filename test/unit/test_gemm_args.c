/*
 * The GEMM core's argument rules for its fused hooks (gemm.h: the reduce-scatter epilogue,
 * the call bracket, the row-scatter epilogue, the all-gather push, row_block_rotate), for its
 * rows per tile (block_m) and for its operand types
 * (dtype: bf16, e4m3 with scales), checked without a GPU: a bad set is refused with -EINVAL
 * before the launcher looks for a device. Every bad set differs from a good one in one field;
 * the good ones get past validation (-ENOTSUP: no GPU here; on a machine with a Hopper GPU
 * they are not launched, their pointers are made up).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gemm.h"
#include "gemm_tune.h"
#include "mk_log.h"
#include "mk_test.h"
#include "warn_capture.h"

/* Launching g is refused (-EINVAL) with a WARN that contains every non-NULL needle. */
static void expect_refused(const struct mk_gemm_args* g, const char* needle1, const char* needle2) {
  last_warn[0] = '\0';
  CHECK_EQ(mk_gemm_launch(g, 0), -EINVAL);
  if (needle1 && !strstr(last_warn, needle1)) fprintf(stderr, "WARN \"%s\" lacks \"%s\"\n", last_warn, needle1);
  if (needle2 && !strstr(last_warn, needle2)) fprintf(stderr, "WARN \"%s\" lacks \"%s\"\n", last_warn, needle2);
  CHECK(!needle1 || strstr(last_warn, needle1));
  CHECK(!needle2 || strstr(last_warn, needle2));
}

static void* fake(uintptr_t i) { return (void*)(uintptr_t)(0x100000 + 0x10000 * i); }

static int no_gpu; /* the good sets are only launched where nothing can run them */

static struct mk_gemm_args base_args(void) {
  struct mk_gemm_args g;
  memset(&g, 0, sizeof g);
  g.m = 256, g.n = 256, g.k = 256, g.a = fake(1), g.b = fake(2), g.c = fake(3);
  return g;
}

static struct mk_gemm_rs base_rs(void) {
  struct mk_gemm_rs rs;
  memset(&rs, 0, sizeof rs);
  rs.shard_rows = 128, rs.rank = 0, rs.nranks = 2;
  rs.out[1] = fake(4), rs.out_counts[1] = fake(5), rs.in[1] = fake(6), rs.in_counts[1] = fake(7);
  return rs;
}

static struct mk_gemm_call base_call(void) {
  struct mk_gemm_call c;
  memset(&c, 0, sizeof c);
  c.rank = 0, c.nranks = 2, c.done = fake(8), c.exits = fake(9), c.peer_done[1] = fake(10);
  return c;
}

static void expect_good(const struct mk_gemm_args* g) {
  if (no_gpu) CHECK_EQ(mk_gemm_launch(g, 0), -ENOTSUP);
}

/* call.claims (the claimed walk): an aligned counter, plain or grouped, and with rs the
 * rotation that puts this rank's rows last; the WARN names the rule. */
static void claimed_walk_rules(void) {
  struct mk_gemm_args g = base_args();
  struct mk_gemm_call call = base_call();
  struct mk_gemm_rs rs = base_rs();
  call.claims = (uint64_t*)fake(11);
  g.call = &call;
  expect_good(&g);
  call.claims = (uint64_t*)((char*)fake(11) + 4);
  expect_refused(&g, "call.claims (the claimed walk) needs one-CTA clusters", "8-byte aligned");
  call.claims = (uint64_t*)fake(11), g.group_offsets = (const int*)fake(12), g.num_groups = 2;
  expect_good(&g); /* grouped too: the end is where the scheduler has no slot */
  g.group_offsets = NULL, g.num_groups = 0, g.rs = &rs; /* rank 0 of 2: rank 1's row-block first */
  expect_refused(&g, "call.claims with rs needs row_block_rotate = 1", NULL);
  g.row_block_rotate = 1;
  expect_good(&g);
}

static void reduce_scatter_rules(void) {
  struct mk_gemm_args g = base_args();
  struct mk_gemm_rs rs = base_rs(), bad;
  g.rs = &rs;
  expect_good(&g);
  g.rs = &bad;
  bad = rs, bad.shard_rows = 64; /* not a row-block, and m != 2 x shard */
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  bad = rs, bad.nranks = 1;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  bad = rs, bad.in[1] = NULL;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  bad = rs, bad.out[1] = (char*)fake(4) + 8;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  g.rs = &rs, g.epilogue = MK_GEMM_ADD_BF16;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  /* the all-reduce's gather inside a call bracket needs this rank's gathered slots */
  g.epilogue = MK_GEMM_STORE;
  struct mk_gemm_call call = base_call();
  rs.gather[1] = fake(11), rs.gather_counts[1] = fake(12);
  g.call = &call;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  rs.gathered[1] = fake(13), rs.gathered_counts[1] = fake(14), rs.c_full = fake(15);
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL); /* the collect's claim counters missing */
  rs.collect_claims = (uint64_t*)fake(16);
  expect_good(&g);
  rs.c_full = NULL;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
}

static void call_bracket_rules(void) {
  struct mk_gemm_args g = base_args();
  struct mk_gemm_call call = base_call(), bad;
  g.call = &call;
  expect_good(&g);
  g.call = &bad;
  bad = call, bad.peer_done[1] = NULL;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  bad = call, bad.exits = NULL;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  bad = call, bad.num_counters = 4;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  bad = call, bad.rank = 2;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
}

static void row_scatter_rules(void) {
  struct mk_gemm_args g = base_args();
  struct mk_gemm_scatter sc, bad;
  memset(&sc, 0, sizeof sc);
  sc.row_dest = fake(16), sc.row_mult = 8, sc.base[0] = fake(17), sc.base[1] = fake(18);
  g.scatter = &sc;
  expect_good(&g);
  g.scatter = &bad;
  bad = sc, bad.row_dest = NULL;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  bad = sc, bad.row_mult = -1;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  bad = sc, bad.base[1] = (char*)fake(18) + 2;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  g.scatter = &sc, g.epilogue = MK_GEMM_ADD_F32;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  struct mk_gemm_rs rs = base_rs();
  g.epilogue = MK_GEMM_STORE, g.rs = &rs;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
}

static void rotation_rules(void) {
  struct mk_gemm_args g = base_args(); /* 256 rows: row-blocks 0 and 1 */
  g.row_block_rotate = 1;
  expect_good(&g);
  g.row_block_rotate = 2;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  g.row_block_rotate = -1;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
  g.row_block_rotate = 1, g.group_offsets = fake(19), g.num_groups = 2;
  CHECK_EQ(mk_gemm_launch(&g, 0), -EINVAL);
}

/* Zero-initialised args are bf16 without scales: exactly the launch of before dtype existed. */
static void zeroed_args_are_bf16(void) {
  CHECK_EQ(MK_GEMM_BF16, 0);
  struct mk_gemm_args g = base_args();
  CHECK_EQ(g.dtype, MK_GEMM_BF16);
  CHECK(!g.scale_a && !g.scale_b);
  expect_good(&g);
  g.k = 24; /* bf16 needs a multiple of 8 only */
  expect_good(&g);
}

static void e4m3_needs_k_a_multiple_of_16(void) {
  struct mk_gemm_args g = base_args();
  g.dtype = MK_GEMM_E4M3;
  expect_good(&g);
  g.k = 16;
  expect_good(&g);
  g.k = 1008;
  expect_good(&g);
  g.k = 24;
  expect_refused(&g, "k = 24", "multiple of 16 for e4m3");
  g.k = 8;
  expect_refused(&g, "k = 8", "multiple of 16 for e4m3");
  g.k = 12; /* the general rule comes first */
  expect_refused(&g, "k = 12", "multiple of 8");
}

static void unknown_dtype_is_refused_by_name(void) {
  struct mk_gemm_args g = base_args();
  g.dtype = 2;
  expect_refused(&g, "dtype = 2", "enum mk_gemm_dtype");
  g.dtype = -1;
  expect_refused(&g, "dtype = -1", NULL);
}

static void scales_are_for_e4m3_only_and_float_aligned(void) {
  struct mk_gemm_args g = base_args();
  g.scale_a = (const float*)fake(20); /* dtype bf16 */
  expect_refused(&g, "scale_a", "e4m3 operands only");
  g.scale_a = NULL, g.scale_b = (const float*)fake(21);
  expect_refused(&g, "scale_b", "e4m3 operands only");
  g.dtype = MK_GEMM_E4M3;
  expect_good(&g); /* one scale set, the other NULL (= 1) */
  g.scale_a = (const float*)fake(20);
  expect_good(&g);
  g.scale_a = (const float*)((const char*)fake(20) + 2);
  expect_refused(&g, "4-byte aligned", NULL);
}

/* e4m3 shares the kernel's hooks (a fused epilogue is accepted) but has one configuration. */
static void e4m3_takes_the_hooks_and_only_configuration_0(void) {
  struct mk_gemm_args g = base_args();
  struct mk_gemm_rs rs = base_rs();
  g.dtype = MK_GEMM_E4M3, g.rs = &rs;
  expect_good(&g);
  g.rs = NULL;
  last_warn[0] = '\0';
  CHECK_EQ(mk_gemm_launch_variant(&g, 0, 1), -EINVAL);
  CHECK(strstr(last_warn, "configuration 0 only") != NULL);
  if (no_gpu) CHECK_EQ(mk_gemm_launch_variant(&g, 0, 0), -ENOTSUP);
}

/* Rows per tile (gemm.h args.block_m): 0, 64 or 128; 64 for bf16 without a_local, push or
 * rs, and by number only as configuration 4, which takes no other (its row-blocks are 64 rows:
 * a caller's 128-row flags would be read past their end). */
static void block_m_rules(void) {
  struct mk_gemm_args g = base_args();
  int offsets[3] = {0, 100, 256};
  g.group_offsets = offsets, g.num_groups = 2; /* made up: never launched where a GPU could */
  for (int bm = 0; bm <= 128; bm += 64) {
    g.block_m = bm;
    expect_good(&g);
  }
  g.block_m = 32;
  expect_refused(&g, "block_m = 32", NULL);
  g.block_m = 64, g.dtype = MK_GEMM_E4M3;
  expect_refused(&g, "block_m = 64", "bf16");
  struct mk_gemm_rs rs = base_rs();
  g.dtype = MK_GEMM_BF16, g.group_offsets = NULL, g.num_groups = 0, g.rs = &rs;
  expect_refused(&g, "block_m = 64", "rs");
  g.rs = NULL, g.a_local = fake(20), g.a_local_rows = 128;
  expect_refused(&g, "block_m = 64", "a_local");
  g.a_local = NULL, g.a_local_rows = 0;
  last_warn[0] = '\0';
  CHECK_EQ(mk_gemm_launch_variant(&g, 0, 1), -EINVAL);
  CHECK(strstr(last_warn, "configuration 4") != NULL);
  if (no_gpu) CHECK_EQ(mk_gemm_launch_variant(&g, 0, 4), -ENOTSUP);
  for (int bm = 0; bm <= 128; bm += 128) {
    g.block_m = bm;
    last_warn[0] = '\0';
    CHECK_EQ(mk_gemm_launch_variant(&g, 0, 4), -EINVAL);
    CHECK(strstr(last_warn, "needs block_m = 64") != NULL);
  }
}

/* The all-gather push (gemm.h struct mk_gemm_push): a call bracket, ready flags, plain bf16
 * mode, whole row-blocks per shard, every peer's destination; each missing piece named. */
static void push_rules(void) {
  struct mk_gemm_args g = base_args();
  struct mk_gemm_call call = base_call();
  struct mk_gemm_push push, bad;
  memset(&push, 0, sizeof push);
  push.ctas = 4, push.src = fake(16), push.shard_rows = 128, push.counts = fake(17);
  push.dst[1] = fake(18), push.dst_flags[1] = fake(19);
  g.call = &call, g.ready_flags = fake(20), g.push = &push;
  expect_good(&g);
  g.push = &bad;
  bad = push, bad.ctas = 0;
  expect_refused(&g, "push ctas = 0", NULL);
  bad = push, bad.shard_rows = 64;
  expect_refused(&g, "push shard_rows 64", NULL);
  bad = push, bad.dst[1] = NULL;
  expect_refused(&g, "dst_flags of rank 1", NULL);
  bad = push, bad.src = (char*)fake(16) + 8;
  expect_refused(&g, "push src", NULL);
  g.push = &push, g.call = NULL;
  expect_refused(&g, "push needs a call bracket", NULL);
  g.call = &call, g.ready_flags = NULL;
  expect_refused(&g, "push needs a call bracket and ready_flags", NULL);
  g.ready_flags = fake(20), g.dtype = MK_GEMM_E4M3;
  expect_refused(&g, "bf16 operands", NULL);
}

/* GEMM+ReduceScatter/AllReduce across nodes (gemm.h rs.xn): a call bracket, an error record
 * and its sender CTA (push with ctas 1 and nothing else); a push that is not that sender, or a
 * remote mask without xn, is refused by name. */
static void cross_node_rs_rules(void) {
  struct mk_gemm_args g = base_args();
  struct mk_gemm_rs rs = base_rs();
  struct mk_gemm_call call = base_call();
  struct mk_gemm_error err;
  struct mk_gemm_push sender, bad;
  memset(&sender, 0, sizeof sender);
  sender.ctas = 1;
  rs.xn = fake(21), rs.remote_mask = 1u << 1;
  g.rs = &rs, g.call = &call, g.err = &err, g.push = &sender;
  expect_good(&g);
  g.push = NULL;
  expect_refused(&g, "rs across nodes", "sender CTA");
  g.push = &bad;
  bad = sender, bad.ctas = 2;
  expect_refused(&g, "push is its sender CTA", NULL);
  bad = sender, bad.src = fake(16);
  expect_refused(&g, "push is its sender CTA", NULL);
  g.push = &sender, g.err = NULL;
  expect_refused(&g, "rs across nodes", NULL);
  g.err = &err, rs.gather[1] = fake(11), rs.gather_counts[1] = fake(12); /* the all-reduce's gather too */
  rs.gathered[1] = fake(13), rs.gathered_counts[1] = fake(14), rs.c_full = fake(15);
  rs.collect_claims = (uint64_t*)fake(16);
  expect_good(&g);
  rs = base_rs(), rs.remote_mask = 1u << 1; /* remote ranks without the cross-node state */
  expect_refused(&g, "rs across nodes", NULL);
}

int main(void) {
  warn_capture_on();
  no_gpu = mk_gemm_prepare() == -ENOTSUP;
  printf("%s\n", no_gpu ? "no sm_90 GPU: good sets launched (expect -ENOTSUP)" : "a GPU: good sets not launched");
  claimed_walk_rules();
  reduce_scatter_rules();
  call_bracket_rules();
  row_scatter_rules();
  rotation_rules();
  zeroed_args_are_bf16();
  e4m3_needs_k_a_multiple_of_16();
  unknown_dtype_is_refused_by_name();
  scales_are_for_e4m3_only_and_float_aligned();
  e4m3_takes_the_hooks_and_only_configuration_0();
  block_m_rules();
  push_rules();
  cross_node_rs_rules();
  return MK_TEST_RESULT();
}
