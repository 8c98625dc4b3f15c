/*
 * The backward core's call as one launch (mk_attn_bwd_args.phase_words): the main kernel's
 * grid is three parts in index order: n_start CTAs of the start part (delta, dq_acc's and
 * dkv_ws's zeroing, slice i of n_start each), the n_main CTAs of the key tiles, n_end CTAs of
 * the end part (dq's conversion, split's write-out). A CTA of a part waits (bounded) until every
 * CTA of the part before it is done. CTAs start in index order, so a CTA waits only for CTAs
 * that started before it (the forward's push CTAs first rely on that too); were that ever not
 * so, the bounded wait ends the call in an error, not a hang. Index-ordered, not claimed from
 * a counter (tried first, session 59): a claimed key tile cannot be recomputed from blockIdx,
 * and kept in registers it made the consumers spill 60-90 bytes.
 * Words: [0] start CTAs done, [1] main CTAs done, [2] end CTAs done. The last CTA to touch them
 * zeroes them (the last end CTA; without an end part the last main CTA), so the next call
 * (stream-ordered after this one) finds them zero; every CTA counts itself done whether or not
 * its waits gave up. A CTA's count is one release by its thread 0 after a barrier (CUTLASS's
 * semaphore): no fence per thread.
 * The ring's call in the launch (ATTN_BWD_LAUNCH_RING: mk_attn_bwd_args push, announce,
 * call_done): push.ctas push CTAs come before the start part (they count word [3]); a main CTA
 * of a block that announces counts word [4 + block] too, after a system-scope fence, and the
 * block's last one raises the announcement; there is always an end part, whose last CTA waits
 * for the push CTAs, zeroes the words and ends the call. With split heads there (dkv_ws) each
 * tile's outputs are written by its last warp group (attn_bwd.cuh attn_bwd_group_write_out)
 * before its CTA counts for the announcement, not by the end part, which comes after it.
 */
#ifndef MK_ATTN_BWD_PHASE_CUH_
#define MK_ATTN_BWD_PHASE_CUH_

#include "attn_bwd_cfg.cuh"
#include "attn_bwd_trace.cuh"
#include "kv_push.cuh"
#include "wait.cuh"

enum { ATTN_BWD_START_DONE, ATTN_BWD_MAIN_DONE, ATTN_BWD_END_DONE, ATTN_BWD_PUSH_DONE, ATTN_BWD_BLOCK_DONE0 };

/* The main kernel's launches: the main part alone (a call is several launches), the call's
 * three parts in one, and that with the ring's parts. */
enum { ATTN_BWD_LAUNCH_MAIN, ATTN_BWD_LAUNCH_ONE, ATTN_BWD_LAUNCH_RING };

__device__ __forceinline__ void attn_bwd_phase_reset(uint64_t* words) {
  for (int i = 0; i < MK_ATTN_BWD_PHASE_WORDS; i++) *(volatile uint64_t*)&words[i] = 0;
}

/* Thread 0: until words[word] >= want, bounded by part_timeout_ns (so that the waits inside the
 * part before, the cause, expire first); a timeout is recorded as a wait for this call's other
 * CTAs (gemm.h MK_GEMM_ERR_TILE_OWN_CTAS, flag_index = the word): no peer owes it, so the hang
 * report names none. */
__device__ __forceinline__ int attn_bwd_word_wait(const struct mk_attn_bwd_params& p, int word, uint64_t want) {
  const uint64_t seen = mk_wait_geq_inline(&p.phase[word], want, NULL, 0, 0, 0, p.part_timeout_ns);
  if (seen < want && p.err) mk_gemm_error_raise(p.err, p.err_tag, MK_GEMM_ERR_TILE_OWN_CTAS, (uint32_t)word, want, seen);
  return seen >= want;
}

/* Every thread: attn_bwd_word_wait by thread 0, then the async proxy fenced (the main part
 * reads what the start part wrote through TMA). 0 when it gave up. It does not give up early
 * when another wait of the call raised the abort word: the part before always ends (its waits
 * are bounded), and a CTA that left first could zero the words before the last of it counted
 * itself. TRACED: the ring's one launch, whose waits are events (attn_bwd_trace.cuh). */
template <bool TRACED>
__device__ __noinline__ int attn_bwd_part_wait(const struct mk_attn_bwd_params& p, int word, uint64_t want) {
  __shared__ int ok_s;
  if (threadIdx.x == 0) {
    const uint64_t t0 = TRACED ? attn_bwd_trace_begin(p) : 0;
    ok_s = attn_bwd_word_wait(p, word, want);
    if (TRACED) attn_bwd_trace_part_wait(p, t0, (uint32_t)word, want, ok_s);
    fence_proxy_async_global();
  }
  __syncthreads();
  return ok_s;
}

/* Thread 0 of the call's last CTA (RING): once the push CTAs are done (they write the peers'
 * slots; bounded), the words zeroed and the call ended (done = e, release at system scope: the
 * peers may write this rank's workspace for call e + 1). Inlined: as a call (noinline) ptxas
 * failed to fit the D = 128 addends kernel's consumers in their 232 registers. */
__device__ __forceinline__ void attn_bwd_end_ring_call(const struct mk_attn_bwd_params& p,
                                                       struct attn_bwd_traced_item* traced) {
  attn_bwd_trace_mark(p, traced);
  const int pushed = attn_bwd_word_wait(p, ATTN_BWD_PUSH_DONE, (uint64_t)p.push.ctas);
  attn_bwd_trace_wait_push(p, traced, pushed);
  attn_bwd_phase_reset(p.phase);
  const uint64_t e = *(volatile const uint64_t*)p.call_done + 1;
  fence_acq_rel_sys();
  st_release_sys_u64(p.call_done, e);
}

/* Thread 0 of main CTA c (RING), after a barrier, when its block announces: its partials
 * visible at system scope, then counted; the block's last CTA raises the announcement unless
 * a wait of the call gave up (its partials may be missing: the owner must time out, not add
 * them). The block is found again from c here, not kept live from the tile through the roles. */
__device__ __forceinline__ void attn_bwd_announce(const struct mk_attn_bwd_params& p, int c) {
  const int bi = attn_bwd_block_of(p, mk_attn_bwd_cta_work(c, p.grid_tiles, p.grid_heads, p.batch, p.chunk).tile);
  const struct mk_attn_bwd_block_params& b = p.kv[bi];
  if (!b.announce) return;
  fence_acq_rel_sys();
  if (atom_add_acq_rel_gpu_u64(&p.phase[ATTN_BWD_BLOCK_DONE0 + bi], 1ull) + 1 != (uint64_t)b.ctas) return;
  if (!mk_attn_acc_gate_open(p.acc_gate) || (p.err && ld_relaxed_sys_u32(&p.err->aborted))) return;
  fence_acq_rel_sys(); /* the other CTAs' partials (their counts, acquired above) before the raise */
  st_release_sys_u64(b.announce, *(volatile const uint64_t*)p.ready_done + 1);
}

/* Thread 0, after a barrier: the CTA's part done (every thread's writes before it). */
__device__ __forceinline__ void attn_bwd_count_main(const struct mk_attn_bwd_params& p) {
  if (p.n_end) {
    red_release_gpu_add_u64(&p.phase[ATTN_BWD_MAIN_DONE], 1ull);
  } else if (atom_add_acq_rel_gpu_u64(&p.phase[ATTN_BWD_MAIN_DONE], 1ull) + 1 == (uint64_t)p.n_main) {
    attn_bwd_phase_reset(p.phase);
  }
}

/* The start part's slice i: delta and dq_acc's rows, dkv_ws. */
template <class Cfg>
__device__ __noinline__ void attn_bwd_start_part(const struct mk_attn_bwd_params& p, int i) {
  const size_t first = (size_t)i * Cfg::THREADS + threadIdx.x, stride = (size_t)p.n_start * Cfg::THREADS;
  if (p.pass.do_delta || p.pass.zero_dq) attn_bwd_prep_slice<Cfg::D>(p.pass, first, stride);
  if (p.pass.ws_floats) attn_bwd_ws_zero_slice(p.pass, first, stride);
}

/* The end part's slice i: split's blocks out of dkv_ws (unless each tile's last warp group
 * wrote its own: the ring's call, group_counts), dq. */
template <class Cfg, int LAUNCH>
__device__ __noinline__ void attn_bwd_end_part(const struct mk_attn_bwd_params& p, int i) {
  const size_t first = (size_t)i * Cfg::THREADS + threadIdx.x, stride = (size_t)p.n_end * Cfg::THREADS;
  const bool ws_out = p.split && (LAUNCH != ATTN_BWD_LAUNCH_RING || !p.group_counts);
  for (int bi = 0; ws_out && bi < p.num_kv_blocks; bi++)
    if (attn_bwd_block_in_ws(p.kv[bi]))
      attn_bwd_ws_block_slice<Cfg::D>(attn_bwd_ws_block_of(p.kv[bi]), p.acc_gate, p.batch, p.kv_heads, first, stride);
  if (p.pass.dq) attn_bwd_dq_slice<Cfg::D>(p.pass, first, stride);
}

/* CTA `c` (its grid index): a push, start or end CTA runs its part here (0 back); a main CTA
 * (1 back) once the start part is done (0 if that wait gave up: it counts as done). TRACED (the
 * ring's one launch): each part's span an event, its start time in the CTA's shared note
 * (`traced`): held in registers across the parts' calls, with the waits' events, the kernel
 * spilled. */
template <class Cfg, int LAUNCH>
__device__ __forceinline__ int attn_bwd_phase_is_main(const struct mk_attn_bwd_params& p, int c,
                                                      struct attn_bwd_traced_item* traced) {
  constexpr bool TRACED = LAUNCH == ATTN_BWD_LAUNCH_RING; /* the other kernels keep their code as it was */
  if constexpr (LAUNCH == ATTN_BWD_LAUNCH_RING) {
    if (c < p.push.ctas) {
      attn_bwd_trace_mark(p, traced);
      mk_kv_push_cta(p.push, c);
      __syncthreads();
      if (threadIdx.x == 0) red_release_gpu_add_u64(&p.phase[ATTN_BWD_PUSH_DONE], 1ull);
      attn_bwd_trace_span(p, traced, MK_ATTN_BWD_TRACE_PUSH, (uint32_t)c);
      return 0;
    }
    c -= p.push.ctas;
  }
  if (c < p.n_start) {
    if (TRACED) attn_bwd_trace_mark(p, traced);
    attn_bwd_start_part<Cfg>(p, c);
    __syncthreads();
    if (threadIdx.x == 0) red_release_gpu_add_u64(&p.phase[ATTN_BWD_START_DONE], 1ull);
    if (TRACED) attn_bwd_trace_span(p, traced, MK_ATTN_BWD_TRACE_START, (uint32_t)c);
    return 0;
  }
  if (c >= p.n_start + p.n_main) {
    const int ran = attn_bwd_part_wait<TRACED>(p, ATTN_BWD_MAIN_DONE, (uint64_t)p.n_main);
    if (ran) {
      if (TRACED) attn_bwd_trace_mark(p, traced);
      attn_bwd_end_part<Cfg, LAUNCH>(p, c - p.n_start - p.n_main);
    }
    __syncthreads();
    if (TRACED && ran) attn_bwd_trace_span(p, traced, MK_ATTN_BWD_TRACE_END, (uint32_t)c);
    if (threadIdx.x == 0 &&
        atom_add_acq_rel_gpu_u64(&p.phase[ATTN_BWD_END_DONE], 1ull) + 1 == (uint64_t)p.n_end) {
      if constexpr (LAUNCH == ATTN_BWD_LAUNCH_RING) attn_bwd_end_ring_call(p, traced);
      else attn_bwd_phase_reset(p.phase);
    }
    return 0;
  }
  if (p.n_start && !attn_bwd_part_wait<TRACED>(p, ATTN_BWD_START_DONE, (uint64_t)p.n_start)) {
    if (threadIdx.x == 0) attn_bwd_count_main(p);
    return 0;
  }
  return 1;
}

/* Main CTA c's end, every thread of the CTA: the TMA reductions of each issuing lane (the
 * consumers' and the producer's) complete and fenced for the generic proxy (the end part reads
 * dq_acc with plain loads), then counted (RING: for its block's announcement too). */
template <int LAUNCH>
__device__ __forceinline__ void attn_bwd_main_part_done(const struct mk_attn_bwd_params& p, int c,
                                                        const struct attn_bwd_traced_item* traced) {
  if ((threadIdx.x & 31) == 0) {
    cp_async_bulk_wait_group_0();
    fence_proxy_async_global();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (LAUNCH == ATTN_BWD_LAUNCH_RING) attn_bwd_announce(p, c);
    attn_bwd_count_main(p);
    if (LAUNCH == ATTN_BWD_LAUNCH_RING) attn_bwd_trace_item_end(p, traced, (uint32_t)c);
  }
}

#endif /* MK_ATTN_BWD_PHASE_CUH_ */
