/*
 * The fused ops refuse outputs that overlap their inputs or each other, without a GPU
 * (op_check.c mk_op_overlap_check, mk_op_gemm_overlap_check; ring_attn.c mk_ra_args_check): the
 * kernels read the inputs while they write the outputs, so an overlap would be silent corruption.
 * Tensors that only touch, inputs that share memory, NULL and empty tensors are accepted; the
 * ring forward's out and lse are checked as the backward's outputs always were. And ring
 * attention's batch limit (the communicator's chunk flags) is an argument error naming it.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "fused_comm.h"
#include "mk_test.h"
#include "op_check.h"
#include "ring_attn.h"
#include "warn_capture.h"

/* Tensors 256 MiB apart: no shape below overlaps the next. */
static void* far(uintptr_t i) { return (void*)(uintptr_t)(i << 28); }
static void* at(void* p, long off) { return (char*)p + off; }

static void outputs_overlapping_inputs_or_each_other_are_refused(void) {
  void* p[] = {far(1), far(2), far(3), far(4)};
  const char* names[] = {"in0", "in1", "out0", "out1"};
  const size_t bytes[] = {4096, 4096, 4096, 4096};
  CHECK_EQ(mk_op_overlap_check("op", (const void**)p, names, bytes, 4, 2), 0);
  const void* touching[] = {far(1), at(far(1), 4096), at(far(1), 8192), at(far(1), 12288)};
  CHECK_EQ(mk_op_overlap_check("op", touching, names, bytes, 4, 2), 0);          /* end to end: fine */
  const void* inputs_shared[] = {far(1), far(1), far(3), far(4)};
  CHECK_EQ(mk_op_overlap_check("op", inputs_shared, names, bytes, 4, 2), 0);     /* inputs may alias */
  const void* out_on_in[] = {far(1), far(2), at(far(2), 4095), far(4)};
  CHECK_EQ(mk_op_overlap_check("op", out_on_in, names, bytes, 4, 2), -EINVAL);   /* one byte over in1 */
  const void* in_after_out[] = {at(far(3), 4095), far(2), far(3), far(4)};
  CHECK_EQ(mk_op_overlap_check("op", in_after_out, names, bytes, 4, 2), -EINVAL); /* in0 starts in out0 */
  const void* outs_alias[] = {far(1), far(2), far(3), at(far(3), 16)};
  CHECK_EQ(mk_op_overlap_check("op", outs_alias, names, bytes, 4, 2), -EINVAL);  /* the outputs overlap */
  const void* null_out[] = {far(1), far(2), NULL, far(1)};
  const size_t empty_in[] = {0, 4096, 4096, 4096};
  CHECK_EQ(mk_op_overlap_check("op", null_out, names, empty_in, 4, 2), 0);       /* NULL, 0 bytes: skipped */
  CHECK_EQ(mk_op_overlap_check("op", null_out, names, bytes, 4, 2), -EINVAL);    /* out1 = in0 */
}

/* The dense ops at M = 64 (two ranks: 32-row shards), N = 16, K = 32 (bf16). */
static void gemm_ops_outputs_are_checked_against_a_b_and_each_other(void) {
  enum { M = 64, N = 16, K = 32 };
  void *a = far(1), *b = far(2), *c = far(3), *g = far(4);
  CHECK_EQ(mk_op_gemm_overlap_check("ag", a, M / 2, b, c, M, g, M, N, K), 0);
  CHECK_EQ(mk_op_gemm_overlap_check("ag", a, M / 2, b, c, M, NULL, M, N, K), 0);
  CHECK_EQ(mk_op_gemm_overlap_check("ag", a, M / 2, b, a, M, NULL, M, N, K), -EINVAL);           /* c = a_shard */
  CHECK_EQ(mk_op_gemm_overlap_check("ag", a, M / 2, b, c, M, at(b, N * K * 2 - 2), M, N, K), -EINVAL); /* on b */
  CHECK_EQ(mk_op_gemm_overlap_check("ag", a, M / 2, b, c, M, at(c, M * N * 2 - 16), M, N, K), -EINVAL); /* on c */
  CHECK_EQ(mk_op_gemm_overlap_check("ag", a, M / 2, b, at(a, M / 2 * K * 2), M, NULL, M, N, K), 0); /* after the shard */
  CHECK_EQ(mk_op_gemm_overlap_check("ag", a, M / 2, b, at(a, M / 2 * K * 2 - 16), M, NULL, M, N, K), -EINVAL);
  /* GEMM+ReduceScatter: c_shard of M / 2 rows right after a, then one row into it */
  CHECK_EQ(mk_op_gemm_overlap_check("rs", a, M, b, at(a, M * K * 2), M / 2, NULL, M, N, K), 0);
  CHECK_EQ(mk_op_gemm_overlap_check("rs", a, M, b, at(a, (M - 1) * K * 2), M / 2, NULL, M, N, K), -EINVAL);
  CHECK_EQ(mk_op_gemm_overlap_check("ar", a, M, b, b, M, NULL, M, N, K), -EINVAL); /* c = b */
}

/* The ring forward: B=1 S_local=256 H=8 H_kv=2 D=128 (q, out 512 KiB; k, v 128 KiB; lse 8 KiB). */
static void ring_forward_refuses_out_or_lse_on_an_input(void) {
  void *q = far(1), *k = far(2), *v = far(3), *o = far(4);
  float* l = (float*)far(5);
  CHECK_EQ(mk_ra_args_check(q, k, v, o, l, 1, 256, 8, 2, 128, 1), 0);
  CHECK_EQ(mk_ra_args_check(q, k, v, o, NULL, 1, 256, 8, 2, 128, 1), 0);            /* lse is optional */
  CHECK_EQ(mk_ra_args_check(q, k, k, o, l, 1, 256, 8, 2, 128, 1), 0);               /* k = v: inputs */
  CHECK_EQ(mk_ra_args_check(q, k, v, q, l, 1, 256, 8, 2, 128, 1), -EINVAL);         /* out = q */
  CHECK_EQ(mk_ra_args_check(q, k, v, at(k, 131056), l, 1, 256, 8, 2, 128, 1), -EINVAL); /* out's start in k */
  CHECK_EQ(mk_ra_args_check(q, k, v, o, (float*)at(v, 16), 1, 256, 8, 2, 128, 1), -EINVAL); /* lse in v */
  CHECK_EQ(mk_ra_args_check(q, k, v, o, (float*)at(o, 524288 - 4), 1, 256, 8, 2, 128, 1), -EINVAL); /* on out */
  CHECK_EQ(mk_ra_args_check(q, k, v, o, (float*)at(o, 524288), 1, 256, 8, 2, 128, 1), 0);   /* right after */
  CHECK_EQ(mk_ra_args_check(q, k, v, o, l, 1, 256, 8, 2, 96, 1), -EINVAL);          /* the shape rules still */
  CHECK_EQ(mk_ra_args_check(q, k, v, o, l, 1, 255, 8, 2, 128, 1), -EINVAL);
}

/* B past the communicator's chunk flags (one per peer and sequence at the least): an argument
 * refused for the rank count, naming the largest B, not a workspace to enlarge (ring_attn.c
 * mk_ra_comm_check, on a stand-in communicator of 8 ranks with room for any B below). */
static void ring_batch_past_the_chunk_flags_is_an_argument_error(void) {
  struct mk_fused_comm fc;
  memset(&fc, 0, sizeof fc);
  fc.nranks = 8, fc.local_size = 8, fc.fused = 1, fc.sym_bytes = MK_FUSED_FLAG_BYTES + ((size_t)1 << 40);
  int rows = 0;
  last_warn[0] = '\0';
  CHECK_EQ(mk_ra_comm_check(&fc, "fwd", 1 << 20, 576, 256, 0, &rows), 0); /* 7 x 576 = 4032 flags */
  CHECK_EQ(rows, 256);                                                       /* one chunk per sequence */
  CHECK_EQ(mk_ra_comm_check(&fc, "fwd", 1 << 20, 577, 256, 0, &rows), -EINVAL);
  CHECK(strstr(last_warn, "B = 577, at most 576 on 8 ranks") != NULL);
  CHECK_EQ(mk_ra_comm_check(&fc, "bwd", 1 << 20, 575, 256, 8, &rows), -EINVAL); /* the backward's 8 words */
  CHECK(strstr(last_warn, "at most 574") != NULL);
  fc.nranks = 2, fc.local_size = 2;
  CHECK_EQ(mk_ra_comm_check(&fc, "fwd", 1 << 20, 4032, 1024, 0, &rows), 0);
  CHECK_EQ(rows, 1024);
}

int main(void) {
  warn_capture_on();
  outputs_overlapping_inputs_or_each_other_are_refused();
  gemm_ops_outputs_are_checked_against_a_b_and_each_other();
  ring_forward_refuses_out_or_lse_on_an_input();
  ring_batch_past_the_chunk_flags_is_an_argument_error();
  return MK_TEST_RESULT();
}
