/*
 * Row copies of the MoE kernels: rows of `hidden` bf16 (a multiple of 8, so whole 16-byte
 * vectors), through copy_vec.cuh with MOE_COPY_UNROLL vectors per thread in flight.
 */
#ifndef MK_MOE_COPY_CUH_
#define MK_MOE_COPY_CUH_

#include "copy_vec.cuh"

#define MOE_COPY_UNROLL 8

/* One row by one warp. */
template <bool PEER_WRITTEN>
static __device__ __forceinline__ void moe_copy_row(void* dst, const void* src, int hidden) {
  uint4* d = (uint4*)dst;
  mk_copy_vecs<MOE_COPY_UNROLL, PEER_WRITTEN>(&d, 1, (const uint4*)src, 0, hidden / 8, threadIdx.x & 31, 32);
}

#endif /* MK_MOE_COPY_CUH_ */
