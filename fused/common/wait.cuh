/*
 * The bounded wait of the communication kernels: until *word >= want (acquire at system
 * scope), sleeping between polls as ptx.cuh's MK_WAIT_* say. On expiry it fills the error
 * record (tag, what, flag_index, want, seen) and raises its abort word; it also gives up
 * early when another CTA raised that word. Returns the last value seen (>= want: success).
 * Called by one thread. NOTES: the GEMM core's producer keeps its own copy of this loop
 * (gemm_wait_row_block): calling this one from there, inlined or not, made the 40-register
 * producer spill.
 */
#ifndef MK_WAIT_CUH_
#define MK_WAIT_CUH_

#include "gemm.h"
#include "ptx.cuh"

/* The bound of a wait that this call's own CTAs or warps feed (an attention core's barrier,
 * the MoE dispatch's wait for another CTA's step):
 * 1.5 x the call's, so that when a peer is missing the peer-facing wait, the cause, expires
 * first and its record names the missing flag, not the symptom. With equal bounds the inner
 * wait, often started a little earlier, won (session 44: the ring backward named a barrier's
 * parity; session 45: the MoE dispatch named its own layout step, not the peer's counts). */
static __host__ __device__ __forceinline__ uint64_t mk_wait_inner_timeout_ns(uint64_t call_timeout_ns) {
  return call_timeout_ns + call_timeout_ns / 2;
}

/* Fills the error record (what, flag_index, want, seen under err_tag) and raises its abort
 * word: the host's asynchronous error, and every other wait of the call gives up. With a claim
 * word only its first taker writes; the others leave (the taker raises the abort word). */
static __device__ __forceinline__ void mk_gemm_error_raise(struct mk_gemm_error* err, uint32_t err_tag, uint32_t what,
                                                           uint32_t flag_index, uint64_t want, uint64_t seen) {
  uint32_t* claim = *(uint32_t* volatile*)&err->claim;
  if (claim && atomicExch(claim, 1u) != 0u) return;
  err->tag = err_tag;
  err->tile = what;
  err->flag_index = flag_index;
  err->expected = want;
  err->seen = seen;
  fence_acq_rel_sys();
  *(volatile uint32_t*)&err->aborted = 1;
}

static __device__ __forceinline__ uint64_t mk_wait_geq_inline(const uint64_t* word, uint64_t want,
                                                             struct mk_gemm_error* err, uint32_t err_tag,
                                                             uint32_t what, uint32_t flag_index,
                                                             uint64_t timeout_ns) {
  uint64_t seen = ld_acquire_sys_u64(word);
  if (seen >= want) return seen;
  const uint64_t t0 = globaltimer_ns();
  uint32_t sleep_ns = MK_WAIT_MIN_SLEEP_NS;
  for (uint32_t polls = 1;; polls++) {
    __nanosleep(sleep_ns);
    sleep_ns = sleep_ns < MK_WAIT_MAX_SLEEP_NS ? 2 * sleep_ns : MK_WAIT_MAX_SLEEP_NS;
    seen = ld_acquire_sys_u64(word);
    if (seen >= want) return seen;
    if (polls % MK_WAIT_CLOCK_POLLS) continue;
    if (polls % MK_WAIT_ABORT_POLLS == 0 && err && ld_relaxed_sys_u32(&err->aborted)) return seen;
    if (globaltimer_ns() - t0 > timeout_ns) {
      if (err) mk_gemm_error_raise(err, err_tag, what, flag_index, want, seen);
      return seen;
    }
  }
}

/* NOTES: not inlined, for the register budgets of the GEMM core's storer warps. A caller that
 * runs at another budget inlines the loop instead (mk_wait_geq_inline): the GEMM's push CTAs
 * calling this one made ptxas fail the consumers' allocation at 224 registers. */
static __device__ __noinline__ uint64_t mk_wait_geq(const uint64_t* word, uint64_t want, struct mk_gemm_error* err,
                                                    uint32_t err_tag, uint32_t what, uint32_t flag_index,
                                                    uint64_t timeout_ns) {
  return mk_wait_geq_inline(word, want, err, err_tag, what, flag_index, timeout_ns);
}

#endif /* MK_WAIT_CUH_ */
