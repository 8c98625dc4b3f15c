/*
 * The GEMM core's all-gather push role (gemm.h, struct mk_gemm_push): CTAs 0 .. push.ctas-1
 * of the grid copy this rank's shard of A into every peer's gathered A, row-block by
 * row-block, and raise the peer's ready flag for each. Included by gemm.cuh.
 */
#ifndef MK_GEMM_PUSH_CUH_
#define MK_GEMM_PUSH_CUH_

#include "copy_vec.cuh"
#include "schedule.h"

#define MK_GEMM_PUSH_UNROLL 4 /* 16-byte vectors in flight per thread: 384 threads, few CTAs */

#include "gemm_push_xnode.cuh" /* the ranks reached through the proxy */

/* Bounded wait (one thread) for peer d's previous call: what this call writes into it is free.
 * Traced when it blocked. The wait loop inlined (wait.cuh NOTES). */
static __device__ __forceinline__ int gemm_push_wait_peer_free(const struct mk_gemm_params& p, int d, int item,
                                                           uint64_t e) {
  const uint64_t* word = p.call.peer_done[d];
  if (ld_acquire_sys_u64(word) >= e - 1) return 1;
  const uint64_t t0 = globaltimer_ns();
  const uint64_t seen = mk_wait_geq_inline(word, e - 1, p.err, p.err_tag | MK_GEMM_ERR_TAG_PUSH, (uint32_t)item,
                                    (uint32_t)d, p.timeout_ns);
  mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_COMM, t0, MK_TRACE_COMM_SEND, MK_TRACE_WAIT, MK_TRACE_NO_PEER,
                (uint32_t)item, (uint32_t)d, e - 1, seen);
  return seen >= e - 1;
}

/* Item `item` (row-block b of the shard, for destination d): this CTA's slice of it into d's
 * gathered A; the last CTA done with the item raises d's flag. Ordering: each CTA's stores,
 * bar.sync, fence.sys, an acq_rel add on the item's counter; the last adder's fence.sys and
 * st.release.sys of the flag come after every CTA's stores, so a flag is never seen before
 * its rows. */
template <class Cfg>
static __device__ void gemm_push_item(const struct mk_gemm_params& p, int ctas, int d, int b, int item, uint64_t e) {
  const uint64_t t0 = p.trace ? globaltimer_ns() : 0;
  const int blocks = p.push.shard_rows / Cfg::BM;
  const int mb = p.call.rank * blocks + b;
  const int nvec = Cfg::BM * p.k / 8; /* k is a multiple of 8: whole vectors */
  const int per_cta = (nvec + ctas - 1) / ctas;
  const int lo = per_cta * (int)blockIdx.x, hi = lo + per_cta < nvec ? lo + per_cta : nvec;
  const size_t row_vecs = (size_t)p.k / 8;
  const uint4* src = (const uint4*)p.push.src + (size_t)b * Cfg::BM * row_vecs;
  uint4* dst = (uint4*)p.push.dst[d] + (size_t)mb * Cfg::BM * row_vecs;
  mk_copy_vecs<MK_GEMM_PUSH_UNROLL, false>(&dst, 1, src, lo, hi, threadIdx.x, blockDim.x);
  __syncthreads(); /* every thread's stores happen before thread 0's fence below */
  if (threadIdx.x != 0) return;
  fence_acq_rel_sys();
  const int last = atom_add_acq_rel_gpu_u32(p.push.counts + item, 1) == (uint32_t)ctas - 1;
  if (last) {
    p.push.counts[item] = 0; /* every CTA has added: the item is done for this call */
    fence_acq_rel_sys();
    if (mb + 1 != p.push.drop_flag_block) st_release_sys_u64(p.push.dst_flags[d] + mb, e);
  }
  mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_COMM, t0, MK_TRACE_COMM_SEND, MK_TRACE_CHUNK, (uint32_t)d,
                (uint32_t)mb, (uint32_t)mb, last ? e : 0, last ? e : 0);
}

/* The role: items in order, destination mk_sched_ag_dest(rank, step) for step = item / blocks
 * from step 1 (this rank's own GEMM reads its shard in place), row-block item % blocks; every
 * CTA takes a slice of every item, so row-blocks complete one after another at the full rate.
 * With ranks reached through the proxy (push.xn), the last push CTA sends to them and the
 * others, after their NVLink items, copy in what they sent (gemm_push_xnode.cuh). */
template <class Cfg>
static __device__ __forceinline__ void gemm_push_role(const struct mk_gemm_params& p) {
  const int blocks = p.push.shard_rows / Cfg::BM, n = p.call.nranks;
  const uint64_t e = *(volatile uint64_t*)p.call.done + 1; /* done moves only at the call's end */
  const int ctas = p.push.xn ? p.push.ctas - 1 : p.push.ctas;
  if (p.push.xn && (int)blockIdx.x == ctas) {
    gemm_xn_send_role<Cfg>(p, e);
    return;
  }
  __shared__ int ok;
  for (int item = blocks; item < blocks * n; item++) {
    const int d = mk_sched_ag_dest(p.call.rank, n, item / blocks);
    if (p.push.remote_mask >> d & 1) continue;
    if (item % blocks == 0) {
      if (threadIdx.x == 0) ok = gemm_push_wait_peer_free(p, d, item, e);
      __syncthreads();
      if (!ok) return;
    }
    gemm_push_item<Cfg>(p, ctas, d, item % blocks, item, e);
  }
  if (p.push.xn) gemm_xn_recv_role<Cfg>(p, ctas, e);
}

#endif /* MK_GEMM_PUSH_CUH_ */
