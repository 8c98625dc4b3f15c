/*
 * Which GEMM+ReduceScatter / GEMM+AllReduce calls take the one-kernel overlapped path
 * (mk_gemm_rs_fits), without a GPU: every rank on the host, 128-row shards, the shapes inside
 * the prepared maxima, the row-blocks inside the counters and order tables, and the slots in
 * the data area (n - 1 partial slots, and as many gather slots for the all-reduce: on 2 ranks
 * both fit where one m x n copy of C does), never in the MoE area after it; one rank never.
 */
#include <string.h>

#include "fused_comm.h"
#include "gemm_rs.h"
#include "mk_test.h"

/* A communicator prepared for (max_m, max_n, max_k) as ncclMkCommInit sizes it. */
static struct mk_fused_comm comm_for(int nranks, size_t max_m, size_t max_n, size_t max_k) {
  struct mk_fused_comm fc;
  memset(&fc, 0, sizeof fc);
  fc.nranks = nranks, fc.local_size = nranks, fc.fused = 1;
  fc.cfg.max_m = max_m, fc.cfg.max_n = max_n, fc.cfg.max_k = max_k;
  const size_t widest = max_k > max_n ? max_k : max_n;
  fc.sym_bytes = MK_FUSED_FLAG_BYTES + max_m * widest * 2;
  return fc;
}

static void two_ranks_fit_both_where_c_fits(void) {
  struct mk_fused_comm fc = comm_for(2, 8192, 8192, 8192);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 8192, 8192, 8192, 0), 1);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 8192, 8192, 8192, 1), 1); /* 1 partial + 1 gather slot = one C */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 256, 8, 8, 1), 1);
}

static void eight_ranks_gather_needs_more_than_one_c(void) {
  struct mk_fused_comm fc = comm_for(8, 8192, 8192, 8192);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 8192, 8192, 8192, 0), 1); /* 7/8 of C */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 8192, 8192, 8192, 1), 0); /* 14/8 of C: falls back */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 4096, 8192, 8192, 1), 1); /* half the rows: 7/8 of the area */
  fc = comm_for(8, 8192, 8192, 16384);                     /* K twice N: room for both */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 8192, 8192, 8192, 1), 1);
}

static void shapes_outside_the_rules_do_not_fit(void) {
  struct mk_fused_comm fc = comm_for(2, 8192, 8192, 8192);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 2 * 127, 64, 64, 0), 0);   /* shards not whole row-blocks */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 2 * 4097, 64, 64, 0), 0);  /* m odd per rank and past max_m */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 16384, 64, 64, 0), 0);     /* past max_m */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 256, 8200, 64, 0), 0);     /* past max_n */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 256, 64, 8200, 0), 0);     /* past max_k */
  fc.fused = 0;                                             /* NCCL_MK_FUSED=0 */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 256, 64, 64, 0), 0);
  fc = comm_for(2, 8192, 8192, 8192);
  fc.local_size = 1;                                        /* a rank on another host */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 256, 64, 64, 0), 0);
  fc = comm_for(16, 1 << 20, 64, 64);                       /* more ranks than the epilogue takes */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 16 * 128, 64, 64, 0), 0);
}

static void row_blocks_stay_inside_the_tables(void) {
  struct mk_fused_comm fc = comm_for(2, 1 << 20, 64, 64);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 4032 * 128, 64, 64, 0), 1);  /* the order table's last entry */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 4034 * 128, 64, 64, 0), 0);  /* past it */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 2046 * 128, 64, 64, 1), 1);  /* partial + gather counters + 3 claim words: 4095 */
  CHECK_EQ(mk_gemm_rs_fits(&fc, 2048 * 128, 64, 64, 1), 0);  /* 4099 */
}

/* The slots fill the data area only: a MoE area after it is not room (it once was, and a
 * 4-rank GEMM+AllReduce's gather slots overwrote the MoE counts and flags). */
static void slots_never_reach_into_the_moe_area(void) {
  struct mk_fused_comm fc = comm_for(4, 8192, 8192, 8192);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 8192, 8192, 8192, 1), 0); /* 6/4 of C */
  fc.moe_offset = (fc.sym_bytes + 255) & ~(size_t)255, fc.moe_bytes = (size_t)512 << 20;
  fc.sym_bytes = fc.moe_offset + fc.moe_bytes;
  CHECK_EQ(mk_gemm_rs_fits(&fc, 8192, 8192, 8192, 1), 0);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 8192, 8192, 8192, 0), 1); /* 3/4 of C: inside the data area */
  CHECK_EQ(mk_fused_data_bytes(&fc), (size_t)8192 * 8192 * 2);
}

/* One rank has no peer for the epilogue (whose rules need 2 or more): the reference path. */
static void one_rank_takes_the_reference_path(void) {
  struct mk_fused_comm fc = comm_for(1, 8192, 8192, 8192);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 256, 64, 64, 0), 0);
  CHECK_EQ(mk_gemm_rs_fits(&fc, 256, 64, 64, 1), 0);
}

int main(void) {
  slots_never_reach_into_the_moe_area();
  one_rank_takes_the_reference_path();
  two_ranks_fit_both_where_c_fits();
  eight_ranks_gather_needs_more_than_one_c();
  shapes_outside_the_rules_do_not_fit();
  row_blocks_stay_inside_the_tables();
  return MK_TEST_RESULT();
}
