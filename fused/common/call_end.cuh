/*
 * The end of a one-kernel call (gemm.h struct mk_gemm_call): every thread of every CTA calls
 * mk_call_end once its role is done; the last CTA to get here zeroes the call's counters,
 * raises the notify flags (not when a wait of the call gave up: err, the call's error record)
 * and ends the call (done = e, release at system scope: the peers may write this rank's
 * workspace for call e + 1). Shared by the GEMM core (gemm_call_end) and the ring attention
 * kernel. Called inside each role's branch (whole warps: bar.sync 0 counts all the CTA's
 * threads wherever they wait).
 */
#ifndef MK_CALL_END_CUH_
#define MK_CALL_END_CUH_

#include "gemm.h"
#include "ptx.cuh"

__device__ __forceinline__ void mk_call_end(const struct mk_gemm_call& call, const struct mk_gemm_error* err) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel_sys(); /* this CTA's stores, to peers too, before its exit is counted */
    last = atomicAdd(call.exits, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < call.num_counters; i += blockDim.x) call.counters[i] = 0;
  __syncthreads();
  if (threadIdx.x) return;
  *call.exits = 0;
  const uint64_t e = *(volatile uint64_t*)call.done + 1;
  fence_acq_rel_sys();
  /* a call that gave up on a wait skipped stores the notify flags vouch for: a late peer must
   * time out, not read what an earlier call left (every CTA's raise precedes its count). The
   * record is read only behind a set notify word: read once into a flag before the loop, it
   * cost five GEMM kernels 4-12 spill bytes (session 44). */
  for (int d = 0; d < call.nranks; d++)
    if (call.notify[d] && !(err && ld_relaxed_sys_u32(&err->aborted))) st_release_sys_u64(call.notify[d], e);
  if (call.set_done) st_release_sys_u64(call.done, e);
}

#endif /* MK_CALL_END_CUH_ */
