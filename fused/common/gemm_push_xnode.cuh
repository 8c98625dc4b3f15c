/*
 * The all-gather push's cross-node part (gemm.h struct mk_gemm_push, xn set; the state and
 * regions in fused/proxy/xnode.h): ranks outside the local team are reached through the
 * proxy thread. Included by gemm_push.cuh.
 *
 * Call e, rank r:
 *   send CTA (the last push CTA), thread 0 owning the queue's producer:
 *     1. the staging rows are free: every earlier descriptor completed at the source;
 *        each remote rank d finished copying in our rows of the previous cross-node call
 *        (its proxy raised flags[DONE0 + d] to that call's number, xn->last_call: other ops
 *        between them advance the call numbers too);
 *     2. per row-block of r's shard: the CTA copies it into the bounce buffer (r's own rows),
 *        bar.sync, fence.sys, then one put+signal per remote rank (flag AG_FLAG0 + row-block
 *        = e in the peer's flag region, never visible before the rows);
 *     3. once r's own copy-in of the remote rows is done (its ready flags = e), a signal to
 *        every remote rank: flags[DONE0 + r] = e there.
 *   the other push CTAs, per remote row-block in arrival order: thread 0 waits for its flag
 *     (acquire, system scope), every CTA copies its slice from the bounce buffer into the
 *     gathered A, the last CTA done raises the GEMM's ready flag.
 * Every wait is bounded; a failure fills the call's error record (what the host reports),
 * which also makes every other wait of the call give up.
 */
#ifndef MK_GEMM_PUSH_XNODE_CUH_
#define MK_GEMM_PUSH_XNODE_CUH_

#include "xnode.h"

/* The step at which rank d receives this rank's shard (the push item of its first row-block,
 * over blocks, is what a hang report names). */
static __device__ __forceinline__ int gemm_xn_step_of_dest(int rank, int n, int d) {
  return (rank - d + n) % n;
}

/* Thread 0 of the send CTA: step 1 above. 1 when the shard may be staged and sent. */
static __device__ int gemm_xn_send_ready(const struct mk_gemm_params& p, int blocks, uint64_t e) {
  struct mk_xnode_dev* xn = p.push.xn;
  const int n = p.call.nranks, rank = p.call.rank;
  if (xn->prod.tail) {
    const uint64_t last = xn->prod.tail - 1;
    if (mk_proxy_wait_completed(&xn->prod, last, xn->timeout_ns)) {
      mk_gemm_error_raise(p.err, p.err_tag | MK_GEMM_ERR_TAG_PUSH, MK_GEMM_ERR_TILE_PROXY_SENT,
                          (uint32_t)rank, last + 1, mk_pq_load_acquire(&xn->q->completed));
      return 0;
    }
  }
  for (int d = 0; d < n; d++) {
    if (!(p.push.remote_mask >> d & 1)) continue;
    const int item = gemm_xn_step_of_dest(rank, n, d) * blocks;
    if (mk_wait_geq_inline(xn->flags + MK_XN_DONE0 + d, xn->last_call, p.err,
                           p.err_tag | MK_GEMM_ERR_TAG_PUSH, (uint32_t)item, (uint32_t)d,
                           p.timeout_ns) < xn->last_call)
      return 0;
  }
  return 1;
}

/* Thread 0 of the send CTA: one descriptor into the queue, or the call's error. */
static __device__ int gemm_xn_publish(const struct mk_gemm_params& p,
                                      const struct mk_proxy_desc* d) {
  struct mk_xnode_dev* xn = p.push.xn;
  const int rc = mk_proxy_publish(&xn->prod, d, xn->timeout_ns, NULL);
  if (rc)
    mk_gemm_error_raise(p.err, p.err_tag | MK_GEMM_ERR_TAG_PUSH, MK_GEMM_ERR_TILE_PROXY_SENT,
                        (uint32_t)d->peer, xn->prod.tail + 1, (uint64_t)(-rc));
  return rc == 0;
}

/* Thread 0 of the send CTA, after the CTA staged row-block mb: a put+signal of it to every
 * remote rank, in the push order (rank - 1, rank - 2, ...). */
static __device__ int gemm_xn_send_block(const struct mk_gemm_params& p, int mb, size_t bytes,
                                         uint64_t e) {
  const int n = p.call.nranks, rank = p.call.rank;
  mk_pq_fence_sys(); /* after bar.sync: the CTA's staging stores are visible to the proxy */
  for (int step = 1; step < n; step++) {
    const int d = mk_sched_ag_dest(rank, n, step);
    if (!(p.push.remote_mask >> d & 1)) continue;
    const struct mk_proxy_desc desc =
        mk_xn_block_desc(d, mb, bytes, e, mb + 1 != p.push.drop_flag_block, p.err_tag);
    if (!gemm_xn_publish(p, &desc)) return 0;
  }
  return 1;
}

/* Thread 0 of the send CTA: step 3 above. */
static __device__ void gemm_xn_signal_done(const struct mk_gemm_params& p, int blocks, uint64_t e) {
  const int n = p.call.nranks, rank = p.call.rank;
  for (int s = 0; s < n; s++) {
    if (!(p.push.remote_mask >> s & 1)) continue;
    for (int b = 0; b < blocks; b++) {
      const int mb = s * blocks + b;
      /* copied in by this call's receive CTAs, whose waits for the peers are the cause */
      if (mk_wait_geq_inline(p.push.self_flags + mb, e, p.err, p.err_tag, (uint32_t)mb,
                             (uint32_t)mb, mk_wait_inner_timeout_ns(p.timeout_ns)) < e)
        return;
    }
  }
  for (int d = 0; d < n; d++) {
    if (!(p.push.remote_mask >> d & 1)) continue;
    const struct mk_proxy_desc desc = mk_xn_done_desc(rank, d, e, p.err_tag);
    if (!gemm_xn_publish(p, &desc)) return;
  }
  p.push.xn->last_call = e;
  p.push.xn->call_tail = p.push.xn->prod.tail;
}

/* The send CTA's role. */
template <class Cfg>
static __device__ void gemm_xn_send_role(const struct mk_gemm_params& p, uint64_t e) {
  const int blocks = p.push.shard_rows / Cfg::BM;
  const size_t row_vecs = (size_t)p.k / 8, block_vecs = (size_t)Cfg::BM * row_vecs;
  __shared__ int ok;
  if (threadIdx.x == 0) ok = gemm_xn_send_ready(p, blocks, e);
  __syncthreads();
  if (!ok) return;
  for (int b = 0; b < blocks; b++) {
    const int mb = p.call.rank * blocks + b;
    const uint64_t t0 = p.trace ? globaltimer_ns() : 0;
    const uint4* src = (const uint4*)p.push.src + (size_t)b * block_vecs;
    uint4* dst = (uint4*)p.push.xn->bounce + (size_t)mb * block_vecs;
    mk_copy_vecs<MK_GEMM_PUSH_UNROLL, false>(&dst, 1, src, 0, (int)block_vecs, threadIdx.x,
                                             blockDim.x);
    __syncthreads(); /* every thread's staging stores before thread 0's fence */
    if (threadIdx.x == 0) {
      ok = gemm_xn_send_block(p, mb, block_vecs * 16, e);
      /* staged and published: the chunk's time on this side (the proxy moves it after) */
      mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_COMM, t0, MK_TRACE_COMM_SEND, MK_TRACE_CHUNK,
                    MK_TRACE_NO_PEER, (uint32_t)mb, (uint32_t)mb, e, ok ? e : 0);
    }
    __syncthreads();
    if (!ok) return;
  }
  if (threadIdx.x == 0) gemm_xn_signal_done(p, blocks, e);
}

/* This CTA's slice of remote row-block mb (landed) into the gathered A; the last CTA done
 * raises the GEMM's ready flag. */
template <class Cfg>
static __device__ void gemm_xn_copy_in(const struct mk_gemm_params& p, int ctas, int mb,
                                       uint64_t e) {
  struct mk_xnode_dev* xn = p.push.xn;
  const size_t row_vecs = (size_t)p.k / 8;
  const int nvec = Cfg::BM * p.k / 8, per_cta = (nvec + ctas - 1) / ctas;
  const int lo = per_cta * (int)blockIdx.x, hi = lo + per_cta < nvec ? lo + per_cta : nvec;
  const uint4* src = (const uint4*)xn->bounce + (size_t)mb * Cfg::BM * row_vecs;
  uint4* dst = (uint4*)p.push.self_dst + (size_t)mb * Cfg::BM * row_vecs;
  mk_copy_vecs<MK_GEMM_PUSH_UNROLL, true>(&dst, 1, src, lo, hi, threadIdx.x, blockDim.x);
  __syncthreads(); /* every thread's stores before thread 0's fence */
  if (threadIdx.x == 0) {
    fence_acq_rel_sys();
    if (atom_add_acq_rel_gpu_u32(xn->recv_counts + mb, 1) == (uint32_t)ctas - 1) {
      xn->recv_counts[mb] = 0;
      fence_acq_rel_sys();
      st_release_sys_u64(p.push.self_flags + mb, e);
    }
  }
}

/* The receiving push CTAs' role: every remote row-block in arrival order (sources rank + 1,
 * ..., blocks in order): thread 0 waits for its flag, then all of these CTAs copy it in.
 * In order, a row-block that never lands also holds back the ones after it (copying in
 * whichever has landed first is the next step: bench/NOTES.md, cross-node). */
template <class Cfg>
static __device__ void gemm_xn_recv_role(const struct mk_gemm_params& p, int ctas, uint64_t e) {
  const int blocks = p.push.shard_rows / Cfg::BM, n = p.call.nranks;
  __shared__ uint64_t seen;
  for (int step = 1; step < n; step++) {
    const int s = mk_sched_ag_source(p.call.rank, n, step);
    if (!(p.push.remote_mask >> s & 1)) continue;
    for (int mb = s * blocks; mb < (s + 1) * blocks; mb++) {
      const uint64_t t0 = p.trace ? globaltimer_ns() : 0;
      if (threadIdx.x == 0)
        seen = mk_wait_geq_inline(p.push.xn->flags + MK_XN_ROW_FLAG0 + mb, e, p.err, p.err_tag,
                                  (uint32_t)mb, (uint32_t)mb, p.timeout_ns);
      __syncthreads();
      if (seen < e) return;
      const uint64_t t1 = p.trace ? globaltimer_ns() : 0;
      gemm_xn_copy_in<Cfg>(p, ctas, mb, e); /* its bar.sync orders every read of `seen` */
      if (threadIdx.x == 0) { /* the wait for the block to land, then its copy-in */
        mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_COMM, t0, MK_TRACE_COMM_RECV, MK_TRACE_WAIT,
                      (uint32_t)s, (uint32_t)mb, (uint32_t)mb, e, e);
        mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_COMM, t1, MK_TRACE_COMM_RECV, MK_TRACE_CHUNK,
                      (uint32_t)s, (uint32_t)mb, (uint32_t)mb, e, e);
      }
    }
  }
}

#endif /* MK_GEMM_PUSH_XNODE_CUH_ */
