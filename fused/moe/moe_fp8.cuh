/*
 * The fp8 dispatch (ncclMkConfig.moe_dispatch_fp8): a token row is quantized per token to e4m3
 * before it moves and dequantized to bf16 where it lands, exactly as include/nccl_mk.h says:
 *   amax = max |x_i|; inv = 448 / amax; scale = amax / 448 (both 0 for a zero row);
 *   q_i = e4m3_rn_satfinite(x_i * inv); landed_i = bf16_rn(float(q_i) * scale).
 * A warp works on a row; 8 elements per thread step (16 bytes of bf16, 8 of fp8).
 */
#ifndef MK_MOE_FP8_CUH_
#define MK_MOE_FP8_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "ptx.cuh"

#define MOE_FP8_UNROLL 8

/* max |x| over a bf16 row of nvec 16-byte vectors, reduced over the warp. */
static __device__ __forceinline__ float moe_row_amax(const uint4* row, int nvec) {
  const int lane = threadIdx.x & 31;
  float m = 0.f;
  for (int v0 = lane; v0 < nvec; v0 += 32 * MOE_FP8_UNROLL) {
    uint4 q[MOE_FP8_UNROLL];
#pragma unroll
    for (int u = 0; u < MOE_FP8_UNROLL; u++) q[u] = v0 + 32 * u < nvec ? ld_global_nc_v4(row + v0 + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < MOE_FP8_UNROLL; u++) {
      const __nv_bfloat162* h = (const __nv_bfloat162*)&q[u];
      for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(h[i]);
        m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
  }
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

static __device__ __forceinline__ float moe_fp8_inv(float amax) { return amax > 0.f ? 448.f / amax : 0.f; }
static __device__ __forceinline__ float moe_fp8_scale(float amax) { return amax > 0.f ? amax / 448.f : 0.f; }

/* 8 bf16 -> 8 e4m3 (element 0 in the lowest byte). */
static __device__ __forceinline__ uint2 moe_quant8(uint4 q, float inv) {
  const __nv_bfloat162* h = (const __nv_bfloat162*)&q;
  uint32_t out[2] = {0, 0};
  for (int i = 0; i < 4; i++) {
    const float2 f = __bfloat1622float2(h[i]);
    const __nv_fp8x2_storage_t p = __nv_cvt_float2_to_fp8x2(make_float2(f.x * inv, f.y * inv), __NV_SATFINITE, __NV_E4M3);
    out[i / 2] |= (uint32_t)p << (16 * (i % 2));
  }
  return make_uint2(out[0], out[1]);
}

/* 8 e4m3 -> 8 bf16, each float(q) * scale rounded to nearest. */
static __device__ __forceinline__ uint4 moe_dequant8(uint2 p, float scale) {
  uint4 out;
  __nv_bfloat162* o = (__nv_bfloat162*)&out;
  const uint32_t w[2] = {p.x, p.y};
  for (int i = 0; i < 4; i++) {
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
    const float2 f = __half22float2(*(const __half2*)&hr);
    o[i] = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  }
  return out;
}

/* A bf16 row, quantized, into dst (nvec * 8 bytes of e4m3), by a warp; returns its scale. */
static __device__ __forceinline__ float moe_quant_row(uint2* dst, const uint4* src, int nvec) {
  const float amax = moe_row_amax(src, nvec), inv = moe_fp8_inv(amax);
  for (int v0 = threadIdx.x & 31; v0 < nvec; v0 += 32 * MOE_FP8_UNROLL) {
    uint4 q[MOE_FP8_UNROLL];
#pragma unroll
    for (int u = 0; u < MOE_FP8_UNROLL; u++)
      if (v0 + 32 * u < nvec) q[u] = ld_global_nc_v4(src + v0 + 32 * u);
#pragma unroll
    for (int u = 0; u < MOE_FP8_UNROLL; u++)
      if (v0 + 32 * u < nvec) dst[v0 + 32 * u] = moe_quant8(q[u], inv);
  }
  return moe_fp8_scale(amax);
}

/* Vectors [begin, end) of a landed row into each dst[i], by a warp: from e4m3 (PEER: a peer's
 * row, read through L2) or from bf16 quantized and dequantized in registers (this rank's own
 * rows; inv from the row's amax). UNROLL loads in flight per lane, as in moe_copy.cuh. */
template <bool PEER>
static __device__ __forceinline__ void moe_land_fp8_row_to(uint4* const* dst, int ndst, const void* src, float inv,
                                                           float scale, int begin, int end) {
  for (int v0 = begin + (threadIdx.x & 31); v0 < end; v0 += 32 * MOE_FP8_UNROLL) {
    uint2 p[MOE_FP8_UNROLL];
#pragma unroll
    for (int u = 0; u < MOE_FP8_UNROLL; u++)
      if (v0 + 32 * u < end)
        p[u] = PEER ? __ldcg((const uint2*)src + v0 + 32 * u) : moe_quant8(ld_global_nc_v4((const uint4*)src + v0 + 32 * u), inv);
#pragma unroll
    for (int u = 0; u < MOE_FP8_UNROLL; u++) {
      if (v0 + 32 * u >= end) continue;
      const uint4 q = moe_dequant8(p[u], scale);
      for (int i = 0; i < ndst; i++) dst[i][v0 + 32 * u] = q;
    }
  }
}

#endif /* MK_MOE_FP8_CUH_ */
