/*
 * Helpers shared by test/gpu/test_moe.cu and test/perf/fused/moe_perf.cu: NCCL_OK, the host's
 * random numbers for routings, block reductions, and the fp8 dispatch's rounding
 * (ncclMkConfig.moe_dispatch_fp8) emulated for the references, written from include/nccl_mk.h
 * (not from the library's code).
 */
#ifndef MK_MOE_CHECK_CUH_
#define MK_MOE_CHECK_CUH_

#include <cuda_fp8.h>
#include <nccl.h>

#include "gemm_check.cuh"
#include "nccl_ok.h"


static inline uint64_t host_mix(uint64_t* s) {
  uint64_t x = (*s += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* The block's sum of one double per thread, in thread 0 (every thread must call it). */
static __device__ double block_sum(double v, double* shared) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += shared[i];
  __syncthreads();
  return s;
}

/* The block's maximum of one float per thread, in every thread (every thread must call it). */
static __device__ float block_max(float v, float* shared) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = shared[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, shared[i]);
  __syncthreads();
  return m;
}

/* Each bf16 row of x, in place, as the fp8 dispatch delivers it to the GEMM: amax = max |x_i|
 * (fp32); a zero row stays zeros; else inv = 448 / amax and scale = amax / 448 (fp32 divisions
 * rounded to nearest, whatever the compiler flags), q_i = e4m3(x_i * inv) rounded to nearest
 * even and saturating (__nv_fp8_e4m3(float): cvt.rn.satfinite), x_i = bf16_rn(float(q_i) *
 * scale). One block per row; blockDim a multiple of 32. */
static __global__ void fp8_round_rows_kernel(__nv_bfloat16* x, size_t rows, int hidden) {
  __shared__ float shared[32];
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    __nv_bfloat16* row = x + r * hidden;
    float m = 0.f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x)
      m = fmaxf(m, fabsf(__bfloat162float(row[c])));
    const float amax = block_max(m, shared);
    const float inv = amax > 0.f ? __fdiv_rn(448.f, amax) : 0.f;
    const float scale = amax > 0.f ? __fdiv_rn(amax, 448.f) : 0.f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      const float q = (float)__nv_fp8_e4m3(__fmul_rn(__bfloat162float(row[c]), inv));
      row[c] = amax > 0.f ? __float2bfloat16_rn(__fmul_rn(q, scale)) : __float2bfloat16_rn(0.f);
    }
  }
}

/* fp8_round_rows_kernel on `rows` rows of x ([rows][hidden] bf16), enqueued on s. */
static inline void fp8_round_rows(void* x, size_t rows, int hidden, cudaStream_t s) {
  if (!rows) return;
  const unsigned grid = rows < 65535 ? (unsigned)rows : 65535u;
  fp8_round_rows_kernel<<<grid, 256, 0, s>>>((__nv_bfloat16*)x, rows, hidden);
  CUDA_OK(cudaGetLastError());
}

#endif /* MK_MOE_CHECK_CUH_ */
