/*
 * Copies of 16-byte vectors by a group of threads (a warp, a warp group, a CTA): UNROLL vectors
 * per thread in flight before the first store (a plain load-store loop keeps one in flight and
 * runs at a fraction of the bandwidth). Data a peer wrote during the kernel is read through L2
 * (ld.cg), never the non-coherent path.
 */
#ifndef MK_COPY_VEC_CUH_
#define MK_COPY_VEC_CUH_

#include "ptx.cuh"

template <bool PEER_WRITTEN>
static __device__ __forceinline__ uint4 mk_load_vec(const uint4* p) {
  return PEER_WRITTEN ? __ldcg(p) : ld_global_nc_v4(p);
}

/* Vectors [begin, end) of src into each of the `ndst` arrays dst[i] (one read, ndst writes);
 * this thread is `lane` of `lanes`. */
template <int UNROLL, bool PEER_WRITTEN>
static __device__ __forceinline__ void mk_copy_vecs(uint4* const* dst, int ndst, const uint4* src, int begin,
                                                    int end, int lane, int lanes) {
  for (int v0 = begin + lane; v0 < end; v0 += lanes * UNROLL) {
    uint4 r[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (v0 + lanes * u < end) r[u] = mk_load_vec<PEER_WRITTEN>(src + v0 + lanes * u);
    for (int i = 0; i < ndst; i++)
#pragma unroll
      for (int u = 0; u < UNROLL; u++)
        if (v0 + lanes * u < end) dst[i][v0 + lanes * u] = r[u];
  }
}

#endif /* MK_COPY_VEC_CUH_ */
