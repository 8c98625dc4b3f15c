/*
 * Row copies of the MoE kernels: `lanes` threads (a warp or a CTA) move one row of `hidden`
 * bf16 (a multiple of 8, so whole 16-byte vectors), UNROLL vectors per thread in flight before
 * the first store (a plain load-store loop keeps one in flight and ran at a fraction of the
 * bandwidth). Rows a peer wrote during the kernel are read through L2 (ld.cg), never the
 * non-coherent path.
 */
#ifndef MK_MOE_COPY_CUH_
#define MK_MOE_COPY_CUH_

#include "ptx.cuh"

#define MOE_COPY_UNROLL 8

template <bool PEER_WRITTEN>
static __device__ __forceinline__ uint4 moe_load_vec(const uint4* p) {
  return PEER_WRITTEN ? __ldcg(p) : ld_global_nc_v4(p);
}

/* Vectors [begin, end) of src's row into each of the `ndst` rows dst[i] (one read, ndst
 * writes); this thread is `lane` of `lanes`. */
template <bool PEER_WRITTEN>
static __device__ __forceinline__ void moe_copy_row_to(uint4* const* dst, int ndst, const uint4* src, int begin,
                                                       int end, int lane, int lanes) {
  for (int v0 = begin + lane; v0 < end; v0 += lanes * MOE_COPY_UNROLL) {
    uint4 r[MOE_COPY_UNROLL];
#pragma unroll
    for (int u = 0; u < MOE_COPY_UNROLL; u++)
      if (v0 + lanes * u < end) r[u] = moe_load_vec<PEER_WRITTEN>(src + v0 + lanes * u);
    for (int i = 0; i < ndst; i++)
#pragma unroll
      for (int u = 0; u < MOE_COPY_UNROLL; u++)
        if (v0 + lanes * u < end) dst[i][v0 + lanes * u] = r[u];
  }
}

/* One row by one warp. */
template <bool PEER_WRITTEN>
static __device__ __forceinline__ void moe_copy_row(void* dst, const void* src, int hidden) {
  uint4* d = (uint4*)dst;
  moe_copy_row_to<PEER_WRITTEN>(&d, 1, (const uint4*)src, 0, hidden / 8, threadIdx.x & 31, 32);
}

#endif /* MK_MOE_COPY_CUH_ */
