/*
 * Eight bf16 in a uint4 (one 16-byte access), summed in fp32: the reduce-scatter epilogue's
 * arithmetic.
 */
#ifndef MK_BF16X8_CUH_
#define MK_BF16X8_CUH_

#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ void bf16x8_add_to_f32(float* acc, uint4 v) {
  const __nv_bfloat162* h = (const __nv_bfloat162*)&v;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float2 f = __bfloat1622float2(h[j]);
    acc[2 * j] += f.x, acc[2 * j + 1] += f.y;
  }
}
__device__ __forceinline__ uint4 f32x8_to_bf16x8(const float* acc) {
  uint4 out;
  __nv_bfloat162* w = (__nv_bfloat162*)&out;
#pragma unroll
  for (int j = 0; j < 4; j++) w[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
  return out;
}

#endif /* MK_BF16X8_CUH_ */
