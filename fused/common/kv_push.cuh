/*
 * A rank's K/V block pushed into its slot on every peer, chunk by chunk (attn.h struct
 * mk_kv_push has the protocol). One CTA's share, by all its threads; shared by the ring
 * attention's forward kernel, the backward's gather kernel and the backward core's one-launch
 * ring call (attn_bwd_phase.cuh).
 */
#ifndef MK_KV_PUSH_CUH_
#define MK_KV_PUSH_CUH_

#include "attn.h"
#include "copy_vec.cuh"
#include "gemm.h"
#include "wait.cuh"

#define MK_KV_PUSH_UNROLL 4 /* 16-byte vectors in flight per thread (gemm_push.cuh's); 16 measured the same (FORWARD_PLAN.md) */

/* CTA `cta` of p.ctas. Not inlined (gemm_push_cta's reason: the consumers' register budget).
 * Returns once its chunks are pushed or a wait gave up. */
static __device__ __noinline__ void mk_kv_push_cta(const struct mk_kv_push& p, int cta) {
  const uint64_t e = *(volatile const uint64_t*)p.done + 1; /* done moves only at the call's end */
  __shared__ int ok;
  if (threadIdx.x == 0) {
    if (cta == 0 && p.call) *(volatile uint64_t*)p.call = e;
    int good = 1;
    for (int d = 0; d < p.nranks && good; d++)
      if (d != p.rank)
        good = mk_wait_geq_inline(p.peer_done[d], e - 1, p.err, p.err_tag | MK_GEMM_ERR_TAG_PUSH, (uint32_t)cta,
                                  (uint32_t)d, p.timeout_ns) >= e - 1;
    if (!good && p.gave_up) *(volatile uint64_t*)p.gave_up = MK_ATTN_ACC_GATE_CLOSED | e;
    ok = good;
  }
  __syncthreads();
  if (!ok) return;
  const int nchunks = p.batch * p.chunks_per_batch, ndst = p.nranks - 1;
  const uint4* k = (const uint4*)p.k;
  const uint4* v = (const uint4*)p.v;
  for (int i = cta; i < nchunks; i += p.ctas) {
    const int b = i / p.chunks_per_batch, c = i % p.chunks_per_batch;
    const int r0 = c * p.chunk_rows, r1 = r0 + p.chunk_rows < p.s_local ? r0 + p.chunk_rows : p.s_local;
    const size_t v0 = ((size_t)b * p.s_local + r0) * p.row_vecs;
    const int nv = (r1 - r0) * p.row_vecs;
    uint4* dk[MK_ATTN_PUSH_MAX_RANKS];
    uint4* dv[MK_ATTN_PUSH_MAX_RANKS];
    for (int j = 0, d = 0; d < p.nranks; d++)
      if (d != p.rank) dk[j] = (uint4*)p.dst_k[d] + v0, dv[j] = (uint4*)p.dst_v[d] + v0, j++;
    mk_copy_vecs<MK_KV_PUSH_UNROLL, false>(dk, ndst, k + v0, 0, nv, threadIdx.x, blockDim.x);
    mk_copy_vecs<MK_KV_PUSH_UNROLL, false>(dv, ndst, v + v0, 0, nv, threadIdx.x, blockDim.x);
    __syncthreads(); /* every thread's stores happen before thread 0's fence */
    if (threadIdx.x == 0) {
      fence_acq_rel_sys();
      for (int d = 0; d < p.nranks; d++)
        if (d != p.rank) st_release_sys_u64(p.dst_flags[d] + i, e);
    }
  }
}

#endif /* MK_KV_PUSH_CUH_ */
