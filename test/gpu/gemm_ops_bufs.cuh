/*
 * The dense fused ops' test buffers and their float64 checks, shared by the GPU tests that
 * call them (test_fused_ops, test_ops_in_turn): per rank, seeded inputs (A_p's shard for
 * AllGather+GEMM; A_p and B_p for the other two) and poisoned outputs; the references are
 * rebuilt from the seeds, so no rank needs another's buffers.
 *   AllGather+GEMM      C[M,N] = gather over p of A_p's shard [M/n,K] . B_r^T
 *   GEMM+ReduceScatter  C[M/n,N] = rank r's rows of the sum over p of A_p . B_p^T
 *   GEMM+AllReduce      C[M,N] = the sum over p of A_p . B_p^T
 */
#ifndef MK_GEMM_OPS_BUFS_CUH_
#define MK_GEMM_OPS_BUFS_CUH_

#include <nccl.h>
#include <stdint.h>

#include "gemm_check.cuh"
#include "nccl_mk.h"

#define GEMM_OPS_TOL 1e-2

struct shape { size_t m, n, k; };

/* Buffer `which` (1: A, 2: B) of `rank` for the inputs numbered base. */
static uint64_t gemm_ops_seed(uint64_t base, int rank, int which) { return base * 1000 + rank * 10 + which; }

struct op_bufs { void *a_shard, *a, *b, *c_ag, *ag, *c_rs, *c_ar; };

static void gemm_ops_alloc(struct op_bufs* o, struct shape s, int nranks) {
  CUDA_OK(cudaMalloc(&o->a_shard, s.m / nranks * s.k * 2));
  CUDA_OK(cudaMalloc(&o->a, s.m * s.k * 2));
  CUDA_OK(cudaMalloc(&o->b, s.n * s.k * 2));
  CUDA_OK(cudaMalloc(&o->c_ag, s.m * s.n * 2));
  CUDA_OK(cudaMalloc(&o->ag, s.m * s.k * 2));
  CUDA_OK(cudaMalloc(&o->c_rs, s.m / nranks * s.n * 2));
  CUDA_OK(cudaMalloc(&o->c_ar, s.m * s.n * 2));
}

static void gemm_ops_free(struct op_bufs* o) {
  cudaFree(o->a_shard), cudaFree(o->a), cudaFree(o->b), cudaFree(o->c_ag), cudaFree(o->ag);
  cudaFree(o->c_rs), cudaFree(o->c_ar);
}

/* Fresh inputs for `base` and poisoned outputs; synchronous. */
static void gemm_ops_fill(struct op_bufs* o, struct shape s, uint64_t base, int rank, int nranks) {
  fill_random_bf16(o->a_shard, s.m / nranks * s.k, gemm_ops_seed(base, rank, 1), 1.0f);
  fill_random_bf16(o->a, s.m * s.k, gemm_ops_seed(base, rank, 1), 1.0f);
  fill_random_bf16(o->b, s.n * s.k, gemm_ops_seed(base, rank, 2), 1.0f);
  poison(o->c_ag, s.m * s.n * 2), poison(o->ag, s.m * s.k * 2);
  poison(o->c_rs, s.m / nranks * s.n * 2), poison(o->c_ar, s.m * s.n * 2);
  CUDA_OK(cudaDeviceSynchronize());
}

/* Op 0 AllGather+GEMM (with the gathered A when ag is set), 1 GEMM+ReduceScatter, 2 GEMM+AllReduce. */
static ncclResult_t gemm_ops_run(ncclComm_t comm, cudaStream_t stream, struct op_bufs* o, struct shape s, int op,
                                 void* ag) {
  if (op == 0) return ncclMkAllGatherGemm(o->a_shard, o->b, o->c_ag, ag, s.m, s.n, s.k, ncclBfloat16, comm, stream);
  if (op == 1) return ncclMkGemmReduceScatter(o->a, o->b, o->c_rs, s.m, s.n, s.k, ncclBfloat16, comm, stream);
  return ncclMkGemmAllReduce(o->a, o->b, o->c_ar, s.m, s.n, s.k, ncclBfloat16, comm, stream);
}

/* AllGather+GEMM's C on `rank` against float64 (one element of it first set to 32768 when
 * corrupt: a negative control); with ag, also the gathered A, bit for bit (*ag_result). */
static struct check_result gemm_ops_check_ag(struct shape s, uint64_t base, int rank, int nranks, void* c,
                                             const void* ag, struct check_result* ag_result, int corrupt) {
  const size_t rows = s.m / nranks;
  void *full, *b;
  double* ref;
  CUDA_OK(cudaMalloc(&full, s.m * s.k * 2));
  CUDA_OK(cudaMalloc(&b, s.n * s.k * 2));
  CUDA_OK(cudaMalloc(&ref, s.m * s.n * 8));
  for (int p = 0; p < nranks; p++)
    fill_random_bf16((char*)full + p * rows * s.k * 2, rows * s.k, gemm_ops_seed(base, p, 1), 1.0f);
  fill_random_bf16(b, s.n * s.k, gemm_ops_seed(base, rank, 2), 1.0f);
  ref_gemm_f64<double>(full, b, NULL, NULL, ref, (int)s.m, (int)s.n, (int)s.k);
  if (corrupt) {
    const uint16_t big = 0x4700;
    CUDA_OK(cudaMemcpy((char*)c + 2 * (s.m * s.n / 2), &big, 2, cudaMemcpyHostToDevice));
  }
  const struct check_result r = check_close((const __nv_bfloat16*)c, ref, s.m * s.n, GEMM_OPS_TOL);
  if (ag) *ag_result = check_close((const __nv_bfloat16*)ag, (const __nv_bfloat16*)full, s.m * s.k, 1e-12);
  cudaFree(full), cudaFree(b), cudaFree(ref);
  return r;
}

/* The sum over ranks of A_p . B_p^T, rows [row0, row0 + rows), in float64 (cudaFree it). */
static double* gemm_ops_ref_sum(struct shape s, uint64_t base, int nranks, size_t row0, size_t rows) {
  void *a, *b;
  double* ref;
  CUDA_OK(cudaMalloc(&a, s.m * s.k * 2));
  CUDA_OK(cudaMalloc(&b, s.n * s.k * 2));
  CUDA_OK(cudaMalloc(&ref, rows * s.n * 8));
  for (int p = 0; p < nranks; p++) {
    fill_random_bf16(a, s.m * s.k, gemm_ops_seed(base, p, 1), 1.0f);
    fill_random_bf16(b, s.n * s.k, gemm_ops_seed(base, p, 2), 1.0f);
    ref_gemm_f64<double>((char*)a + row0 * s.k * 2, b, p ? ref : NULL, NULL, ref, (int)rows, (int)s.n, (int)s.k);
  }
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(a), cudaFree(b);
  return ref;
}

/* GEMM+ReduceScatter's (rs) or GEMM+AllReduce's C on `rank` against float64. */
static struct check_result gemm_ops_check_sum(struct shape s, uint64_t base, int rank, int nranks, const void* c,
                                              int rs) {
  const size_t rows = rs ? s.m / nranks : s.m, row0 = rs ? rank * rows : 0;
  double* ref = gemm_ops_ref_sum(s, base, nranks, row0, rows);
  const struct check_result r = check_close((const __nv_bfloat16*)c, ref, rows * s.n, GEMM_OPS_TOL);
  cudaFree(ref);
  return r;
}

/* Every output of the three ops in o against float64, named by gemm_ops_check_names: what a
 * caller that ran all three judges, each with its own harness's assertion. */
enum { GEMM_OPS_CHECKS = 4 };
static const char* const gemm_ops_check_names[GEMM_OPS_CHECKS] = {"AG+GEMM output", "AG+GEMM gathered A",
                                                                  "GEMM+RS output", "GEMM+AR output"};

static void gemm_ops_check_all(struct op_bufs* o, struct shape s, uint64_t base, int rank, int nranks,
                               struct check_result r[GEMM_OPS_CHECKS]) {
  r[1] = (struct check_result){1.0, 0, 0}; /* fails unless the gathered A was checked */
  r[0] = gemm_ops_check_ag(s, base, rank, nranks, o->c_ag, o->ag, &r[1], 0);
  r[2] = gemm_ops_check_sum(s, base, rank, nranks, o->c_rs, 1);
  r[3] = gemm_ops_check_sum(s, base, rank, nranks, o->c_ar, 0);
}

#endif /* MK_GEMM_OPS_BUFS_CUH_ */
