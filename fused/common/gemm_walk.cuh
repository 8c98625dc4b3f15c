/*
 * The GEMM core's tile walks (gemm.cuh), one concern apart from the roles that follow them:
 * the static walk (CTA c takes slots c, c + G, .. of the scheduler's order, every role on its
 * own) and the claimed walk (gemm.h call bracket: the producer's thread takes each slot from
 * a counter and hands it on through shared memory). Included by gemm.cuh after struct
 * mk_gemm_params.
 */
#ifndef MK_GEMM_WALK_CUH_
#define MK_GEMM_WALK_CUH_

/* This CTA's index among the GEMM's (the push CTAs come first in the grid). */
__device__ __forceinline__ int gemm_cta(const struct mk_gemm_params& p) { return (int)blockIdx.x - p.push.ctas; }

/* The tile scheduler and the static slots every role of this CTA walks: first, first + step,
 * .. (slots cta, cta + ctas, ..; the claimed walk takes its slots from the producer instead). */
template <class Cfg>
__device__ __forceinline__ void gemm_slots(const struct mk_gemm_params& p, int rank, struct mk_sched* s, int* first,
                                           int* step) {
  sched_init(s, p.m, p.n, Cfg::BM, Cfg::BN, p.group_m, Cfg::CLUSTER_M, rank, p.num_groups, p.group_offsets,
             p.row_block_order, p.row_block_rotate);
  *first = gemm_cta(p) / Cfg::CLUSTER_M, *step = p.gemm_ctas / Cfg::CLUSTER_M;
}

/* ---- the claimed walk (gemm.h call.claims) -------------------------------------------------
 * Instead of the static slots first, first + step, .., the producer's thread takes each slot
 * from the counter (or finds the end) and writes it into the stage's slot word before the
 * stage's first arrival; the consumers read it after their wait on that stage, and each
 * consumer writes it into its staged slot word before handing the staged tile to the storer
 * warps; -1 in either word is the end. */

/* The control words after the barriers: [0] abort flag (gemm_producer), [1] the collect's
 * slot (gemm_rs_collect), [2], [3] spare, then the slot words. */
__device__ __forceinline__ volatile int* gemm_stage_slot(volatile uint32_t* ctl, int stage) {
  return (volatile int*)ctl + 4 + stage;
}

template <class Cfg>
__device__ __forceinline__ volatile int* gemm_staged_slot(volatile uint32_t* ctl, int wg) {
  return (volatile int*)ctl + 4 + Cfg::STAGES + wg;
}

/* The slot after `id` in a role's walk: the static walk's next (the claimed walk reads it). */
__device__ __forceinline__ int gemm_next_slot(const struct mk_gemm_params& p, int id, int step) {
  return p.claim_end ? id : id + step;
}

/* The producer's thread takes each slot from the counter a few K blocks before it needs it
 * (gemm_claim_kb): the atomic (every CTA on one L2 word) is issued there and its value is
 * first read at the next tile's start, so its latency hides behind the tile's last loads. A
 * CTA holds one slot ahead only for those few K blocks. The low 32 bits of the counter word:
 * a call takes fewer than 2^31 slots. */
__device__ __forceinline__ uint32_t gemm_claim_issue(const struct mk_gemm_params& p) {
  return atomicAdd((unsigned int*)p.call.claims, 1u);
}

/* The claimed slot, or -1 at the end. */
__device__ __forceinline__ int gemm_claimed_slot(const struct mk_gemm_params& p, uint32_t claim) {
  return (int)claim < p.claim_end ? (int)claim : -1;
}

/* The K block at whose load the producer claims the next slot. */
template <class Cfg>
__device__ __forceinline__ int gemm_claim_kb(const struct mk_gemm_params& p) {
  return p.claim_end ? max(0, p.num_k_blocks - Cfg::STAGES - 1) : -1;
}

/* The claimed walk, consumers, after the K loop of a tile they would store themselves: whether
 * the producer's next slot word (in the stage after the tile's) is the end, which makes the
 * tile the CTA's last. The wait costs nothing: the producer claimed the next slot a few K
 * blocks before this tile's last (gemm_claim_kb). */
__device__ __forceinline__ bool gemm_claimed_walk_ends(uint64_t* full, int stage, uint32_t phase,
                                                       volatile uint32_t* ctl) {
  mbarrier_wait_parity(&full[stage], phase);
  return *gemm_stage_slot(ctl, stage) < 0;
}

#endif /* MK_GEMM_WALK_CUH_ */
