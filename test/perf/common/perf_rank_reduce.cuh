/* The fused harnesses' reduction of per-rank figures (medians, sums, checks) over the ranks.
 * Include after gemm_check.cuh and nccl_ok.h (CUDA_OK, NCCL_OK). */
#ifndef MK_PERF_RANK_REDUCE_CUH_
#define MK_PERF_RANK_REDUCE_CUH_

#include <cuda_runtime.h>
#include <nccl.h>

/* v[0, count) becomes its sum (or maximum, op) over the ranks of comm, through the device
 * buffer scratch (count doubles); synchronous. Every copy is on s: the harnesses' streams are
 * non-blocking and would not wait for a cudaMemcpy on the legacy stream. */
static void perf_rank_reduce(double* v, int count, ncclRedOp_t op, double* scratch, ncclComm_t comm,
                             cudaStream_t s) {
  CUDA_OK(cudaMemcpyAsync(scratch, v, count * sizeof(double), cudaMemcpyHostToDevice, s));
  NCCL_OK(ncclAllReduce(scratch, scratch, count, ncclFloat64, op, comm, s));
  CUDA_OK(cudaMemcpyAsync(v, scratch, count * sizeof(double), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
}

#endif /* MK_PERF_RANK_REDUCE_CUH_ */
