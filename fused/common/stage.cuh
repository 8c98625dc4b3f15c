/*
 * Accumulator fragments to bf16 in shared memory: the packing and the swizzled staging layout
 * that the GEMM core's epilogue and the attention core's output share.
 */
#ifndef MK_STAGE_CUH_
#define MK_STAGE_CUH_

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(uint32_t*)&v;
}

/* Byte offset of (row, col) in a staging buffer of 64-column atoms, each rows x 128 bytes
 * with the 128-byte swizzle (16-byte chunk index XOR row % 8), atom_bytes apart: conflict-free
 * for both the accumulator-fragment writes and the 16-byte row reads. */
__device__ __forceinline__ uint32_t stage_offset_in(int row, int col, int atom_bytes) {
  return (uint32_t)((col >> 6) * atom_bytes + row * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4) + (col & 7) * 2);
}

/* Atoms of 64 rows (8192 bytes): the GEMM core's staging buffers. */
__device__ __forceinline__ uint32_t stage_offset(int row, int col) { return stage_offset_in(row, col, 8192); }

#endif /* MK_STAGE_CUH_ */
