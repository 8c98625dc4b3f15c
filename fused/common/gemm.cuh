/*
 * Persistent warp-specialised GEMM for sm_90a: C[M,N] = A[M,K] . B[N,K]^T, bf16 or fp8 e4m3
 * operands (Cfg::DTYPE), bf16 output.
 *
 * One CTA per SM, 3 warp groups (2 with BM = 64): WG0 is the producer (one thread issues TMA
 * loads into a STAGES-deep ring of shared memory completed on mbarriers), WG1 and WG2 (WG1
 * alone with BM = 64) are consumers, each owning 64 rows of the BM x BN tile and issuing wgmma
 * m64n{BN}k16 (bf16) or m64n{BN}k32 (e4m3) with both operands in shared memory (128-byte
 * swizzle: one K row of a stage is 128 bytes, 64 bf16 or 128 e4m3 elements). e4m3 tiles are scaled by scale_a * scale_b in the consumers;
 * from there on both types share everything. The epilogue stages bf16 through swizzled shared
 * memory and writes 16-byte vectors with row/column clipping (any M; N, K multiples of 8, K of
 * 16 for e4m3).
 * See gemm.h for the fusion hooks.
 */
#ifndef MK_GEMM_CUH_
#define MK_GEMM_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include "bf16x8.cuh"
#include "call_end.cuh"
#include "copy_vec.cuh"
#include "gemm.h"
#include "ptx.cuh"
#include "sched.cuh"
#include "stage.cuh"
#include "trace.h"
#include "wait.cuh"

struct mk_gemm_params {
  int m, n, k;
  int epilogue;
  void* c;
  int num_k_blocks;
  int group_m;
  int num_groups;
  const int* group_offsets;
  const int* row_block_order;
  int row_block_rotate;
  int a_local_row0, a_local_row_end; /* rows read through tmap_a_local; end 0: none */
  const uint64_t* ready_flags;
  uint64_t ready_target;
  const uint64_t* ready_target_ptr;
  uint64_t* tile_flags;
  int tile_flags_by_row_block;
  uint64_t* tile_start_ns;
  struct mk_trace_buf* trace;
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint64_t timeout_ns;
  struct mk_gemm_rs rs; /* shard_rows 0: off */
  int rs_gather;        /* rs.gather is set (all-reduce) */
  struct mk_gemm_call call;       /* done NULL: off */
  struct mk_gemm_scatter scatter; /* row_dest NULL: off */
  struct mk_gemm_push push;       /* ctas 0: off */
  int gemm_ctas;                  /* the GEMM's CTAs: push.ctas .. push.ctas + gemm_ctas - 1 */
  int claim_end; /* the claimed walk (gemm.h call.claims): slots 0 .. claim_end - 1; 0: off */
  int peer_store_lanes;           /* storer threads that write a tile into a peer (gemm.cu) */
  const float* scale_a; /* e4m3 only; NULL: 1 */
  const float* scale_b;
};

#include "gemm_walk.cuh" /* the tiles each role walks, static or claimed */

#include "gemm_push.cuh" /* the push role, on struct mk_gemm_params */

/* MMA_INFLIGHT: wgmma groups left in flight when a K-block is done (0 or 1): with 1, the
 * stage of K-block kb is released once kb+1's group is issued, so issue never stalls. */
/* CLUSTER_M: CTAs per cluster along M (1 or 2); a pair shares its B tile, each CTA loading
 * half of it and multicasting it to both, which halves B's L2-to-SM traffic. */
/* DTYPE: enum mk_gemm_dtype of A and B; BK is then the elements in one 128-byte row. */
/* ASYNC_EPI: the consumers only convert the tile into shared memory and go on to the next
 * tile; warps 1-3 of the producer warp group write it out (and raise its flag), so global
 * stores overlap the next tile's wgmma. Needs the whole tile staged (EPI_COLS == BN). */
template <int BM_, int BN_, int BK_, int STAGES_, int EPI_COLS_, int MMA_INFLIGHT_, int CLUSTER_M_, int ASYNC_EPI_,
          int DTYPE_ = MK_GEMM_BF16>
struct mk_gemm_cfg {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_, EPI_COLS = EPI_COLS_;
  static constexpr int MMA_INFLIGHT = MMA_INFLIGHT_, CLUSTER_M = CLUSTER_M_, ASYNC_EPI = ASYNC_EPI_;
  static constexpr int DTYPE = DTYPE_;
  static_assert(DTYPE == MK_GEMM_BF16 || DTYPE == MK_GEMM_E4M3, "bf16 or e4m3 operands");
  static constexpr int ELEM_BYTES = DTYPE == MK_GEMM_E4M3 ? 1 : 2;
  /* wgmma steps per stage: each takes 32 bytes of K (k16 bf16, k32 e4m3) */
  static constexpr int K_STEPS = BK * ELEM_BYTES / 32;
  static_assert(!ASYNC_EPI || EPI_COLS == BN, "the storer warps take whole tiles");
  static constexpr int STORER_THREADS = 96;
  static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "clusters of 1 or 2 CTAs along M");
  static constexpr int B_ROWS_PER_CTA = BN / CLUSTER_M; /* rows of the B tile each CTA loads */
  static_assert(MMA_INFLIGHT == 0 || MMA_INFLIGHT == 1, "0 or 1 wgmma group in flight");
  static constexpr int CONSUMERS = BM_ / 64;
  static constexpr int THREADS = 128 * (1 + CONSUMERS);
  static constexpr int A_STAGE = BM * BK * ELEM_BYTES;
  static constexpr int B_STAGE = BN * BK * ELEM_BYTES;
  static constexpr int C_STAGE_WG = 64 * EPI_COLS * 2; /* one consumer's staging buffer */
  static constexpr int OFF_B = STAGES * A_STAGE;
  static constexpr int OFF_C = OFF_B + STAGES * B_STAGE;
  static constexpr int OFF_BAR = OFF_C + CONSUMERS * C_STAGE_WG;
  /* + the control words (gemm_stage_slot): abort flag, the collect's slot, 2 spare, then the
   * claimed walk's slot words, one per stage and per consumer */
  static constexpr int CTL_WORDS = 4 + STAGES + CONSUMERS;
  static constexpr int SMEM_USED = OFF_BAR + (2 * STAGES + 2 * CONSUMERS) * 8 + CTL_WORDS * 4;
  static constexpr int SMEM_BYTES = SMEM_USED + 1024; /* slack to align the base to 1024 */
  static_assert(BM == 64 || BM == 128, "each consumer warp group owns 64 rows: one or two of them");
  static_assert(BN == 256 || (BN == 128 && DTYPE == MK_GEMM_BF16), "wgmma wrappers: bf16 n = 128, 256; e4m3 n = 256");
  static_assert(BK * ELEM_BYTES == 128, "a K-block row must be one 128-byte swizzle row");
  static_assert(BN % EPI_COLS == 0 && EPI_COLS % 64 == 0, "epilogue passes are whole 64-column atoms");
  static_assert(A_STAGE % 1024 == 0 && B_STAGE % 1024 == 0 && C_STAGE_WG % 1024 == 0,
                "128B-swizzled tiles must stay 1024-byte aligned");
  static_assert(SMEM_BYTES <= 232448, "over the 227 KB of dynamic shared memory per block");
};

/* ---- producer ------------------------------------------------------------------------------ */

/* NCCL_MK_TRACE: a ready-flag wait. Not inlined, like the wait itself: the producer thread
 * runs on 64 registers. */
__device__ __noinline__ void gemm_trace_wait_event(const struct mk_gemm_params& p, int tile, int mb, uint64_t t0,
                                                   uint64_t target, uint64_t seen) {
  mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_PRODUCER, t0, MK_TRACE_PRODUCER, MK_TRACE_WAIT, MK_TRACE_NO_PEER,
                (uint32_t)tile, (uint32_t)mb, target, seen);
}

/* Waits until ready_flags[mb] >= target. Returns 0 on timeout or when another CTA gave up.
 * The loop of wait.cuh's mk_wait_geq, kept here for the producer's register budget. */
__device__ __noinline__ int gemm_wait_row_block(const struct mk_gemm_params& p, int mb, int tile) {
  /* NOTES: the device word does not change during a launch; reading it here rather than
   * once per CTA keeps the producer free of a live register (its budget is 64). */
  const uint64_t target = p.ready_target_ptr ? ld_acquire_sys_u64(p.ready_target_ptr)
                          : p.call.done      ? *(volatile uint64_t*)p.call.done + 1
                                             : p.ready_target;
  const uint64_t* flag = p.ready_flags + mb;
  uint64_t seen = ld_acquire_sys_u64(flag);
  if (seen < target) {
    const uint64_t t0 = globaltimer_ns();
    uint32_t sleep_ns = MK_WAIT_MIN_SLEEP_NS;
    for (uint32_t polls = 1;; polls++) {
      __nanosleep(sleep_ns);
      sleep_ns = sleep_ns < MK_WAIT_MAX_SLEEP_NS ? 2 * sleep_ns : MK_WAIT_MAX_SLEEP_NS;
      seen = ld_acquire_sys_u64(flag);
      if (seen >= target) break;
      if (polls % MK_WAIT_CLOCK_POLLS) continue;
      if (polls % MK_WAIT_ABORT_POLLS == 0 && p.err && ld_relaxed_sys_u32(&p.err->aborted)) return 0;
      if (globaltimer_ns() - t0 > p.timeout_ns) {
        if (p.err)
          mk_gemm_error_raise(p.err, p.err_tag, (uint32_t)tile, (uint32_t)mb, target, seen);
        break;
      }
    }
    /* only the waits that held a tile back: the others are noise on the picture */
    if (p.trace) gemm_trace_wait_event(p, tile, mb, t0, target, seen);
    if (seen < target) return 0;
  }
  /* The data behind the flag is next read by TMA (async proxy). */
  fence_proxy_async_global();
  return 1;
}

/* The producer's abort: a data-less arrival on the next stage, once the consumers have released
 * it, with its slot word -1 (the claimed walk's consumers: the end). */
template <class Cfg>
__device__ __forceinline__ void gemm_producer_abort(uint64_t* full, uint64_t* empty, int stage, uint32_t phase,
                                                  volatile uint32_t* abort_flag) {
  mbarrier_wait_parity(&empty[stage], phase ^ 1);
  *gemm_stage_slot(abort_flag, stage) = -1;
  mbarrier_arrive(&full[stage]);
}

/* One tile's K blocks into the stage ring: A's rows (from the local shard's map when they are
 * local), B's rows (multicast to the cluster's CTAs when CLUSTER_M > 1); the claimed walk's
 * next slot is claimed at K block claim_kb. */
template <class Cfg>
__device__ __forceinline__ void gemm_load_tile(const CUtensorMap* tmap_a, const CUtensorMap* tmap_a_local,
                                               const CUtensorMap* tmap_b, const struct mk_gemm_params& p,
                                               const struct mk_tile& t, int rank, bool local, uint8_t* smem,
                                               uint64_t* full, uint64_t* empty, int* stage_io, uint32_t* phase_io,
                                               int claim_kb, uint32_t* claim) {
  const int b_row = t.b_row0 + rank * Cfg::B_ROWS_PER_CTA;
  const CUtensorMap* a_map = local ? tmap_a_local : tmap_a;
  const int a_row = local ? t.row0 - p.a_local_row0 : t.row0;
  uint8_t* b_dst = smem + Cfg::OFF_B + rank * Cfg::B_ROWS_PER_CTA * 128;
  int stage = *stage_io;
  uint32_t phase = *phase_io;
  for (int kb = 0; kb < p.num_k_blocks; kb++) {
    /* with clusters, empty[stage] also counts the partner's consumers: its half of B
     * lands in our stage and ours in its */
    mbarrier_wait_parity(&empty[stage], phase ^ 1);
    mbarrier_arrive_expect_tx(&full[stage], Cfg::A_STAGE + Cfg::B_STAGE);
    cp_async_bulk_tensor_2d_load(smem + stage * Cfg::A_STAGE, a_map, kb * Cfg::BK, a_row, &full[stage]);
    if (Cfg::CLUSTER_M == 1)
      cp_async_bulk_tensor_2d_load(b_dst + stage * Cfg::B_STAGE, tmap_b, kb * Cfg::BK, b_row, &full[stage]);
    else
      cp_async_bulk_tensor_2d_load_multicast(b_dst + stage * Cfg::B_STAGE, tmap_b, kb * Cfg::BK, b_row, &full[stage],
                                             (uint16_t)((1u << Cfg::CLUSTER_M) - 1));
    if (kb == claim_kb) *claim = gemm_claim_issue(p); /* the next tile's slot, read at its start */
    if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
  }
  *stage_io = stage, *phase_io = phase;
}

template <class Cfg>
__device__ __forceinline__ void gemm_producer(const CUtensorMap* tmap_a, const CUtensorMap* tmap_a_local,
                                              const CUtensorMap* tmap_b,
                                              const struct mk_gemm_params& p, uint8_t* smem,
                                              uint64_t* full, uint64_t* empty, volatile uint32_t* abort_flag) {
  struct mk_sched s;
  const int rank = Cfg::CLUSTER_M > 1 ? (int)cluster_ctarank() : 0;
  int stage = 0;
  uint32_t phase = 0;
  int ready_mb = -1; /* last row-block seen ready: flags only grow within a launch */
  struct mk_tile t;
  int first_slot, slot_step;
  gemm_slots<Cfg>(p, rank, &s, &first_slot, &slot_step);
  const int claim_kb = gemm_claim_kb<Cfg>(p);
  uint32_t claim = p.claim_end ? gemm_claim_issue(p) : 0;
  for (int id = first_slot;; id = gemm_next_slot(p, id, slot_step)) {
    if (p.claim_end) { /* the claimed walk: the slot word before the stage's arrival */
      id = gemm_claimed_slot(p, claim);
      if (id >= 0 && !sched_tile(&s, p.m, p.n, id, &t)) id = -1; /* grouped: past the last group */
      mbarrier_wait_parity(&empty[stage], phase ^ 1);
      *gemm_stage_slot(abort_flag, stage) = id;
      if (id < 0) {
        mbarrier_arrive(&full[stage]);
        return;
      }
    } else if (!sched_tile(&s, p.m, p.n, id, &t)) {
      break;
    }
    /* ASSUMPTION: ready flags only with CLUSTER_M == 1 (the launcher picks it): an abort in
     * one CTA of a pair would leave its partner waiting for the multicast half. */
    const bool local = t.row0 >= p.a_local_row0 && t.row0 < p.a_local_row_end;
    const int ready_index = p.group_offsets ? t.group : t.mb; /* grouped: one flag per group */
    if (p.ready_flags && ready_index != ready_mb && !local) {
      if (!gemm_wait_row_block(p, ready_index, t.linear)) {
        /* Abort at a tile boundary: every stage loaded so far has been or will be consumed
         * in order, so the consumers drain the ring, then find this data-less arrival with
         * abort_flag naming this tile, and leave. No copy is in flight when the CTA exits. */
        *abort_flag = (uint32_t)id + 1;
        gemm_producer_abort<Cfg>(full, empty, stage, phase, abort_flag);
        return;
      }
      ready_mb = ready_index;
    }
    if (p.tile_start_ns && t.valid) p.tile_start_ns[t.linear] = globaltimer_ns();
    gemm_load_tile<Cfg>(tmap_a, tmap_a_local, tmap_b, p, t, rank, local, smem, full, empty, &stage, &phase, claim_kb,
                        &claim);
  }
}

/* ---- consumers ----------------------------------------------------------------------------- */

template <class Cfg>
__device__ __forceinline__ void gemm_epilogue_bf16(const float* acc, uint8_t* cstage, const struct mk_tile& t,
                                                   int wg, const struct mk_gemm_params& p) {
  const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  const int r0 = warp * 16 + (lane >> 2);
  const uint32_t base = smem_addr(cstage);
  const int add = p.epilogue == MK_GEMM_ADD_BF16;
  constexpr int CHUNKS_ROW = Cfg::EPI_COLS / 8;
#pragma unroll
  for (int pass = 0; pass < Cfg::BN / Cfg::EPI_COLS; pass++) {
    bar_sync(1 + wg, 128); /* the previous pass's reads are done */
#pragma unroll
    for (int j = 0; j < CHUNKS_ROW; j++) {
      const int jj = pass * CHUNKS_ROW + j;
      const int col = j * 8 + (lane & 3) * 2;
      st_shared_b32(base + stage_offset(r0, col), pack_bf16x2(acc[4 * jj], acc[4 * jj + 1]));
      st_shared_b32(base + stage_offset(r0 + 8, col), pack_bf16x2(acc[4 * jj + 2], acc[4 * jj + 3]));
    }
    bar_sync(1 + wg, 128);
#pragma unroll 4
    for (int i = 0; i < 64 * CHUNKS_ROW / 128; i++) {
      const int c = tid + 128 * i, r = c / CHUNKS_ROW, cc = c % CHUNKS_ROW;
      const uint4 v = ld_shared_v4_b32(base + stage_offset(r, cc * 8));
      const int grow = t.row0 + wg * 64 + r, gcol = t.col0 + pass * Cfg::EPI_COLS + cc * 8;
      if (grow < t.row_end && gcol < p.n) {
        __nv_bfloat16* dst = (__nv_bfloat16*)p.c + (size_t)grow * p.n + gcol;
        if (add) red_global_add_noftz_v4_bf16x2(dst, v);
        else st_global_v4_b32(dst, v);
      }
    }
  }
}

/* fp32 accumulation target: straight from the fragments, two floats per reduction. */
template <class Cfg>
__device__ __forceinline__ void gemm_epilogue_add_f32(const float* acc, const struct mk_tile& t, int wg,
                                                      const struct mk_gemm_params& p) {
  const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  const int row = t.row0 + wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int jj = 0; jj < Cfg::BN / 8; jj++) {
    const int col = t.col0 + jj * 8 + (lane & 3) * 2;
    if (col < p.n) {
      if (row < t.row_end) red_global_add_v2_f32((float*)p.c + (size_t)row * p.n + col, acc[4 * jj], acc[4 * jj + 1]);
      if (row + 8 < t.row_end)
        red_global_add_v2_f32((float*)p.c + (size_t)(row + 8) * p.n + col, acc[4 * jj + 2], acc[4 * jj + 3]);
    }
  }
}

/* The flag a finished tile adds 1 to (gemm.h: per tile, or per row-block). */
__device__ __forceinline__ uint64_t* gemm_tile_flag(const struct mk_tile& t, const struct mk_gemm_params& p) {
  return p.tile_flags + (p.tile_flags_by_row_block ? t.mb : t.linear);
}

/* After both consumers' stores of a tile: make them visible at system scope, then raise. */
__device__ __forceinline__ void gemm_raise_tile_flag(const struct mk_tile& t, const struct mk_gemm_params& p) {
  fence_acq_rel_sys();
  bar_sync(3, 256);
  if (threadIdx.x == 128) red_release_sys_add_u64(gemm_tile_flag(t, p), 1);
}

/* ASYNC_EPI, consumer side: the whole 64 x BN bf16 tile into the swizzled staging buffer,
 * once the storer warps have finished reading the previous one. */
template <class Cfg>
__device__ __forceinline__ void gemm_stage_write(const float* acc, uint8_t* cstage, uint64_t* c_empty, uint32_t c_phase) {
  const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  const int r0 = warp * 16 + (lane >> 2);
  const uint32_t base = smem_addr(cstage);
  mbarrier_wait_parity(c_empty, c_phase ^ 1);
#pragma unroll
  for (int j = 0; j < Cfg::BN / 8; j++) {
    const int col = j * 8 + (lane & 3) * 2;
    st_shared_b32(base + stage_offset(r0, col), pack_bf16x2(acc[4 * j], acc[4 * j + 1]));
    st_shared_b32(base + stage_offset(r0 + 8, col), pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]));
  }
}

/* ... and its slot into the staged slot word (the claimed walk's storers read it there). */
template <class Cfg>
__device__ __forceinline__ void gemm_stage_tile(const float* acc, uint8_t* cstage, uint64_t* c_full, uint64_t* c_empty,
                                                uint32_t c_phase, volatile int* staged_slot, int id) {
  gemm_stage_write<Cfg>(acc, cstage, c_empty, c_phase);
  if ((threadIdx.x & 127) == 0) *staged_slot = id;
  mbarrier_arrive(c_full); /* release: our shared stores happen before the storers' reads */
}

/* ASYNC_EPI, consumer side: no further tile for the storer warps (the claimed walk's end, or
 * an abort): -1 as the staged slot, once they are done with the buffer. c_phase stays: the
 * storers do not hand this one back. */
__device__ __forceinline__ void gemm_stage_end(uint64_t* c_full, uint64_t* c_empty, uint32_t c_phase,
                                               volatile int* staged_slot) {
  mbarrier_wait_parity(c_empty, c_phase ^ 1);
  if ((threadIdx.x & 127) == 0) *staged_slot = -1;
  mbarrier_arrive(c_full);
}

#include "gemm_rs.cuh" /* the reduce-scatter epilogue, on the helpers above */

/* The call bracket's end (call_end.cuh), on the kernel's copy of args.call. */
__device__ __forceinline__ void gemm_call_end(const struct mk_gemm_params& p) { mk_call_end(p.call, p.err); }

/* A push CTA's whole life (gemm.h struct mk_gemm_push), or the cross-node reduce-scatter's
 * sender CTA's. Not inlined: inside the kernel it made the consumers' register allocation fail
 * at 224. */
template <class Cfg>
__device__ __noinline__ void gemm_push_cta(const struct mk_gemm_params& p) {
  if (p.rs.xn) gemm_xn_rs_sender<Cfg>(p); /* GEMM+ReduceScatter across nodes: its sender CTA */
  else gemm_push_role<Cfg>(p);
  gemm_call_end(p);
}

/* Row-scatter epilogue (gemm.h): one consumer's staged half of a tile, each row to its own
 * destination. Not inlined: the storer warps' register budget. */
template <class Cfg>
__device__ __noinline__ void gemm_scatter_store_half(const struct mk_gemm_params& p, uint32_t base, int stid,
                                                     int row0, int row_end, int col0) {
  constexpr int CHUNKS_ROW = Cfg::BN / 8;
  for (int c = stid; c < 64 * CHUNKS_ROW; c += Cfg::STORER_THREADS) {
    const int r = c / CHUNKS_ROW, gcol = col0 + (c % CHUNKS_ROW) * 8;
    if (row0 + r >= row_end || gcol >= p.n) continue;
    const int* d = p.scatter.row_dest + (size_t)(row0 + r) * 3;
    const int rank = d[0];
    if (rank < 0) continue;
    const size_t row = (size_t)d[1] * p.scatter.row_mult + d[2];
    st_global_v4_b32((__nv_bfloat16*)p.scatter.base[rank] + row * p.n + gcol,
                     ld_shared_v4_b32(base + stage_offset(r, (c % CHUNKS_ROW) * 8)));
  }
}

/* NCCL_MK_TRACE: one event per tile from the storers' first staged half to the tile's flag
 * (flag: the rows' owner with the reduce-scatter epilogue), in the ring of `lane`: the storers'
 * own, or for a tile the consumers stored, the first consumer's (its only writer: a ring has
 * one writer at a time). Not inlined: the storers' budget. */
__device__ __noinline__ void gemm_trace_storer_event(const struct mk_gemm_params& p, uint32_t lane, int tile,
                                                     int owner, uint64_t from) {
  mk_trace_emit(p.trace, blockIdx.x, lane, from, MK_TRACE_STORER, MK_TRACE_TILE, MK_TRACE_NO_PEER, (uint32_t)tile,
                (uint32_t)owner, 0, 0);
}

/* ASYNC_EPI storers: consumer w's staged half of tile t (at `base`) into C, or into owner's
 * slot of the reduce-scatter (c_row0: its first row there), 16-byte stores (clipped), plain or
 * added (MK_GEMM_ADD_BF16). A peer's tile is written by one warp, so its stores spread over the
 * tile's time: a burst of NVLink stores from all three warps slowed this SM's next tiles by
 * ~12% (bench/NOTES.md, "Throttled peer stores"). */
template <class Cfg>
__device__ __forceinline__ void gemm_store_half(const struct mk_gemm_params& p, uint32_t base, int stid,
                                                const struct mk_tile& t, int w, int c_row0, int owner) {
  constexpr int CHUNKS_ROW = Cfg::BN / 8;
  const int add = p.epilogue == MK_GEMM_ADD_BF16;
  __nv_bfloat16* c_base = (__nv_bfloat16*)(owner >= 0 ? p.rs.out[owner] : p.c);
  const int lanes = owner >= 0 ? p.peer_store_lanes : Cfg::STORER_THREADS;
  for (int c = stid; stid < lanes && c < 64 * CHUNKS_ROW; c += lanes) {
    const int r = c / CHUNKS_ROW, cc = c % CHUNKS_ROW;
    const int gcol = t.col0 + cc * 8;
    if (t.row0 + w * 64 + r < t.row_end && gcol < p.n) {
      const uint4 v = ld_shared_v4_b32(base + stage_offset(r, cc * 8));
      __nv_bfloat16* dst = c_base + (size_t)(c_row0 + r) * p.n + gcol;
      if (add) red_global_add_noftz_v4_bf16x2(dst, v);
      else st_global_v4_b32(dst, v);
    }
  }
}

/* ASYNC_EPI storers, a tile's end: every storer's stores before stid 0's fence, then the tile's
 * flag (or, reduce-scatter, the owner's row-block word) raised at system scope. */
template <class Cfg>
__device__ __forceinline__ void gemm_storer_raise(const struct mk_gemm_params& p, const struct mk_tile& t, int stid,
                                                  int owner, int shard_row0, int rs_failed) {
  const int rs_raise = owner >= 0 && !rs_failed && (owner != p.rs.rank || p.rs_gather);
  if (!p.tile_flags && !rs_raise) return;
  bar_sync(4, Cfg::STORER_THREADS);
  if (stid == 0) {
    fence_acq_rel_sys();
    if (rs_raise) gemm_rs_raise(p, owner, (t.row0 - shard_row0) / Cfg::BM);
    else red_release_sys_add_u64(gemm_tile_flag(t, p), 1);
  }
}

/* ASYNC_EPI, storer side (warps 1-3 of warp group 0): walk the same tiles, write each
 * consumer's staged half out (its own rows summed with the peers' partials with the
 * reduce-scatter, scattered rows, or plain), hand the buffer back, and raise the tile's flag
 * once both halves are visible at system scope. */
template <class Cfg>
__device__ __forceinline__ void gemm_storer(const struct mk_gemm_params& p, uint8_t* smem, uint64_t* c_full,
                                            uint64_t* c_empty, volatile uint32_t* abort_flag) {
  if (p.epilogue == MK_GEMM_ADD_F32) return;
  struct mk_sched s;
  const int rank = Cfg::CLUSTER_M > 1 ? (int)cluster_ctarank() : 0;
  const int stid = threadIdx.x - 32;
  uint32_t c_phase = 0;
  __shared__ uint64_t storer_traced_from; /* NCCL_MK_TRACE: shared, not a register of the storers */
  int rs_failed = 0; /* a peer's partial never came: drain the tiles, store nothing more */
  /* stores into peers wait for the peers' previous call (an all-gather's stores are local) */
  if (p.call.done && (p.rs.shard_rows || p.scatter.row_dest))
    rs_failed = !bar_red_and(4, Cfg::STORER_THREADS, stid != 0 || gemm_call_wait_peers_free(p));
  struct mk_tile t;
  int first_slot, slot_step;
  gemm_slots<Cfg>(p, rank, &s, &first_slot, &slot_step);
  for (int id = first_slot;; id = gemm_next_slot(p, id, slot_step)) {
    if (p.claim_end) { /* the claimed walk: the slot the consumers staged, or the end */
      mbarrier_wait_parity(&c_full[0], c_phase);
      if ((id = *gemm_staged_slot<Cfg>(abort_flag, 0)) < 0) return;
    }
    if (!sched_tile(&s, p.m, p.n, id, &t)) break;
    if (!t.valid || gemm_last_tile_by_consumers<Cfg>(p, s, id, slot_step, t)) continue;
    const int owner = gemm_rs_owner(p, t);
    const int shard_row0 = owner >= 0 ? owner * p.rs.shard_rows : 0;
    if (owner == p.rs.rank && !rs_failed) {
      const int ok = stid != 0 || gemm_rs_wait_peers(p, (t.row0 - shard_row0) / Cfg::BM, p.rs.shard_rows / Cfg::BM,
                                                      t.linear, (uint64_t)s.tiles_n);
      rs_failed = !bar_red_and(4, Cfg::STORER_THREADS, ok);
    }
    for (int w = 0; w < Cfg::CONSUMERS; w++) {
      mbarrier_wait_parity(&c_full[w], c_phase);
      if (*abort_flag == (uint32_t)id + 1) return;
      if (p.trace && w == 0 && stid == 0) storer_traced_from = globaltimer_ns();
      const uint32_t base = smem_addr(smem + Cfg::OFF_C + w * Cfg::C_STAGE_WG);
      /* rs: a peer's rows go to its slot (plain stores); this rank's are summed */
      const int c_row0 = t.row0 + w * 64 - shard_row0;
      if (owner == p.rs.rank && !rs_failed)
        gemm_rs_store_own<Cfg>(p, base, stid, t.row0 + w * 64, t.row_end, t.col0, (size_t)c_row0 * p.n);
      else if (p.scatter.row_dest && !rs_failed)
        gemm_scatter_store_half<Cfg>(p, base, stid, t.row0 + w * 64, t.row_end, t.col0);
      else if (!rs_failed)
        gemm_store_half<Cfg>(p, base, stid, t, w, c_row0, owner);
      mbarrier_arrive(&c_empty[w]);
    }
    c_phase ^= 1;
    gemm_storer_raise<Cfg>(p, t, stid, owner, shard_row0, rs_failed);
    if (p.trace && stid == 0) gemm_trace_storer_event(p, MK_TRACE_LANE_STORER, t.linear, owner, storer_traced_from);
  }
}

/* One arrival per consumer warp on the stage's empty barrier of every CTA of the cluster. */
template <class Cfg>
__device__ __forceinline__ void gemm_release_stage(uint64_t* empty_bar) {
  if (Cfg::CLUSTER_M == 1) {
    mbarrier_arrive(empty_bar);
  } else {
    const uint32_t rank = cluster_ctarank();
    mbarrier_arrive(empty_bar);
#pragma unroll
    for (int r = 1; r < Cfg::CLUSTER_M; r++)
      mbarrier_arrive_cluster(mapa_shared_cluster(smem_addr(empty_bar), (rank + r) % Cfg::CLUSTER_M));
  }
}

/* NCCL_MK_TRACE: one event per tile and consumer warp group, from its first data to its
 * epilogue's end. Not inlined: it stays out of the register budget of the wgmma loop. */
__device__ __noinline__ void gemm_trace_tile_event(const struct mk_gemm_params& p, int wg, int tile, int mb,
                                                   uint64_t from) {
  mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_CONSUMER0 + wg, from, MK_TRACE_CONSUMER, MK_TRACE_TILE,
                MK_TRACE_NO_PEER, (uint32_t)tile, (uint32_t)mb, 0, 0);
}

__device__ __forceinline__ void gemm_trace_tile(const struct mk_gemm_params& p, int wg, const struct mk_tile& t,
                                                uint64_t from) {
  if (p.trace && (threadIdx.x & 127) == 0) gemm_trace_tile_event(p, wg, t.linear, t.mb, from);
}

/* One wgmma step over 32 bytes of K of the stage: k16 for bf16, k32 for e4m3. */
template <class Cfg>
__device__ __forceinline__ void gemm_mma(float* acc, uint64_t da, uint64_t db, int scale_d) {
  if constexpr (Cfg::DTYPE == MK_GEMM_E4M3) wgmma_m64n256k32_e4m3(acc, da, db, scale_d);
  else if constexpr (Cfg::BN == 256) wgmma_m64n256k16_bf16(acc, da, db, scale_d);
  else wgmma_m64n128k16_bf16(acc, da, db, scale_d);
}

/* e4m3: scale_a * scale_b (gemm.h: device pointers, NULL = 1), read when the kernel runs. */
__device__ __forceinline__ float gemm_ab_scale(const struct mk_gemm_params& p) {
  return (p.scale_a ? *p.scale_a : 1.f) * (p.scale_b ? *p.scale_b : 1.f);
}

/* e4m3: the tile's fp32 accumulator times scale_a * scale_b, once, before any epilogue. */
template <class Cfg>
__device__ __forceinline__ void gemm_scale_acc(float* acc, float s) {
#pragma unroll
  for (int i = 0; i < Cfg::BN / 2; i++) acc[i] *= s;
}

/* A tile's K loop: one wgmma group per stage (the caller already waited for the tile's first
 * stage), each stage released once its wgmmas are done (with MMA_INFLIGHT, one group later). */
template <class Cfg>
__device__ __forceinline__ void gemm_mma_k_blocks(float* acc, const struct mk_gemm_params& p, uint32_t a_lo,
                                                  uint32_t b_lo, uint64_t* full, uint64_t* empty, int* stage_io,
                                                  uint32_t* phase_io) {
  const int lane = threadIdx.x & 31;
  int stage = *stage_io, prev_stage = 0;
  uint32_t phase = *phase_io;
  for (int kb = 0; kb < p.num_k_blocks; kb++) {
    if (kb > 0) mbarrier_wait_parity(&full[stage], phase);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < Cfg::K_STEPS; k++) {
      const uint64_t da = wgmma_desc_from_lo(a_lo + stage * (Cfg::A_STAGE >> 4) + k * 2);
      const uint64_t db = wgmma_desc_from_lo(b_lo + stage * (Cfg::B_STAGE >> 4) + k * 2);
      gemm_mma<Cfg>(acc, da, db, (kb > 0 || k > 0) ? 1 : 0);
    }
    wgmma_commit_group();
    if (Cfg::MMA_INFLIGHT == 0) {
      wgmma_wait_group<0>();
      if (lane == 0) gemm_release_stage<Cfg>(&empty[stage]);
    } else {
      wgmma_wait_group<1>(); /* K-block kb-1 is done: release its stage */
      if (kb > 0 && lane == 0) gemm_release_stage<Cfg>(&empty[prev_stage]);
      prev_stage = stage;
    }
    if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
  }
  if (Cfg::MMA_INFLIGHT) {
    wgmma_wait_group<0>();
    if (lane == 0) gemm_release_stage<Cfg>(&empty[prev_stage]);
  }
  *stage_io = stage, *phase_io = phase;
}

/* A consumer whose 64 rows of the tile all lie past the tile's row_end has nothing to multiply
 * (grouped GEMMs with a few rows per group, MoE decode: ~8 rows per expert): it takes and
 * releases the tile's stages without a wgmma, which halves the tensor work of such tiles. Its
 * accumulator keeps whatever it held: none of its rows is stored (every epilogue stops at
 * row_end), and zeroing it would make ptxas serialise the other wgmmas (C7515 in the
 * MMA_INFLIGHT = 0 configurations). */
template <class Cfg>
__device__ __forceinline__ void gemm_skip_k_blocks(const struct mk_gemm_params& p, uint64_t* full, uint64_t* empty,
                                                   int* stage_io, uint32_t* phase_io) {
  const int lane = threadIdx.x & 31;
  int stage = *stage_io;
  uint32_t phase = *phase_io;
  for (int kb = 0; kb < p.num_k_blocks; kb++) {
    if (kb > 0) mbarrier_wait_parity(&full[stage], phase);
    if (lane == 0) gemm_release_stage<Cfg>(&empty[stage]);
    if (++stage == Cfg::STAGES) { stage = 0; phase ^= 1; }
  }
  *stage_io = stage, *phase_io = phase;
}

/* The CTA's last tile, stored by the consumer warp groups themselves (gemm_last_tile_by_consumers):
 * a reduce-scatter's own rows (gemm_rs_own_last_tile), else the synchronous bf16 epilogue once
 * the storers are done with the staging buffer; then its trace events, the store event in the
 * first consumer's ring (the storers did not record it; mk-trace check: every tile stored once). */
template <class Cfg>
__device__ __forceinline__ void gemm_consumers_store_last_tile(const float* acc, const struct mk_gemm_params& p,
                                                               const struct mk_tile& t, int wg, uint8_t* cstage,
                                                               uint64_t* c_empty, uint32_t c_phase, int tiles_n,
                                                               const uint64_t* traced_from) {
  if (p.rs.shard_rows) {
    gemm_rs_own_last_tile<Cfg>(acc, p, t, wg, cstage, c_empty, c_phase, tiles_n);
  } else {
    mbarrier_wait_parity(c_empty, c_phase ^ 1);
    gemm_epilogue_bf16<Cfg>(acc, cstage, t, wg, p);
    if (p.tile_flags) gemm_raise_tile_flag(t, p);
  }
  gemm_trace_tile(p, wg, t, traced_from[wg]);
  if (p.trace && threadIdx.x == 128)
    gemm_trace_storer_event(p, MK_TRACE_LANE_CONSUMER0, t.linear, gemm_rs_owner(p, t), traced_from[0]);
}

/* One tile's K loop for this warp group: its MMAs, or, where its rows are all past the group's
 * end, only the stages given back. NOTES: skipped only in a group of at most 64 rows (the
 * second consumer's rows are then all past its end): skipping in the partial last tile of a
 * larger group measured 1.3-2.7% slower on the DeepSeek-like grouped GEMM (bench/NOTES.md,
 * session 27). bf16 only: with e4m3's scaling of the accumulator after the skip, ptxas
 * serialises that configuration's wgmmas (C7515). */
template <class Cfg>
__device__ __forceinline__ void gemm_tile_k_loop(float* acc, const struct mk_gemm_params& p, const struct mk_tile& t,
                                                 int wg, uint32_t a_lo, uint32_t b_lo, uint64_t* full,
                                                 uint64_t* empty, int* stage, uint32_t* phase) {
  if (Cfg::DTYPE == MK_GEMM_BF16 && wg == 1 && t.mb == 0 && t.row_end - t.row0 <= 64)
    gemm_skip_k_blocks<Cfg>(p, full, empty, stage, phase);
  else
    gemm_mma_k_blocks<Cfg>(acc, p, a_lo, b_lo, full, empty, stage, phase);
}

template <class Cfg>
__device__ __forceinline__ void gemm_consumer(int wg, const struct mk_gemm_params& p, uint8_t* smem,
                                              uint64_t* full, uint64_t* empty, uint64_t* c_full, uint64_t* c_empty,
                                              volatile uint32_t* abort_flag) {
  float acc[Cfg::BN / 2];
  __shared__ uint64_t traced_from[Cfg::CONSUMERS]; /* NCCL_MK_TRACE: when each one's tile began */
  const bool async_epi = Cfg::ASYNC_EPI && p.epilogue != MK_GEMM_ADD_F32; /* fp32 adds go from registers */
  uint32_t c_phase = 0;
  struct mk_sched s;
  const int rank = Cfg::CLUSTER_M > 1 ? (int)cluster_ctarank() : 0;
  /* descriptor low words of stage 0's A rows of this warp group and B (ptx.cuh) */
  const uint32_t a_lo = wgmma_desc_lo_sw128(smem_addr(smem) + wg * 64 * 128);
  const uint32_t b_lo = wgmma_desc_lo_sw128(smem_addr(smem + Cfg::OFF_B));
  uint8_t* cstage = smem + Cfg::OFF_C + wg * Cfg::C_STAGE_WG;
  /* read once, first used after the first tile's K loop: the load's latency is hidden */
  const float ab_scale = Cfg::DTYPE == MK_GEMM_E4M3 ? gemm_ab_scale(p) : 1.f;
  int stage = 0;
  uint32_t phase = 0;
  struct mk_tile t;
  int first_slot, slot_step;
  volatile int* staged_slot = gemm_staged_slot<Cfg>(abort_flag, wg);
  gemm_slots<Cfg>(p, rank, &s, &first_slot, &slot_step);
  for (int id = first_slot;; id = gemm_next_slot(p, id, slot_step)) {
    if (p.claim_end) { /* the claimed walk: the producer's slot word, or the end */
      mbarrier_wait_parity(&full[stage], phase);
      if ((id = *gemm_stage_slot(abort_flag, stage)) < 0) {
        if (async_epi) gemm_stage_end(&c_full[wg], &c_empty[wg], c_phase, staged_slot);
        break;
      }
    }
    if (!sched_tile(&s, p.m, p.n, id, &t)) break;
    /* NOTES: checked outside the K loop, where no wgmma is in flight; inside it, ptxas
     * injects a warpgroup.wait (C7517) that serialises the wgmma groups. */
    mbarrier_wait_parity(&full[stage], phase);
    /* the tile's first data is in; kept in shared memory, not in a register the wgmma needs */
    if (p.trace && (threadIdx.x & 127) == 0) traced_from[wg] = globaltimer_ns();
    if (*abort_flag == (uint32_t)id + 1) { /* see gemm_producer */
      /* tell the storer warps too, once they are done with our last tile */
      if (async_epi) gemm_stage_end(&c_full[wg], &c_empty[wg], c_phase, staged_slot);
      return;
    }
    gemm_tile_k_loop<Cfg>(acc, p, t, wg, a_lo, b_lo, full, empty, &stage, &phase);
    wgmma_fence_operands<Cfg::BN / 2>(acc);
    if (!t.valid) continue; /* a cluster partner past the last row-block */
    if constexpr (Cfg::DTYPE == MK_GEMM_E4M3) gemm_scale_acc<Cfg>(acc, ab_scale);
    if (async_epi && (gemm_last_tile_by_consumers<Cfg>(p, s, id, slot_step, t) ||
                      (p.claim_end && gemm_tile_storable_by_consumers(p, t) &&
                       gemm_claimed_walk_ends(full, stage, phase, abort_flag)))) {
      if (p.claim_end) gemm_stage_end(&c_full[wg], &c_empty[wg], c_phase, staged_slot);
      gemm_consumers_store_last_tile<Cfg>(acc, p, t, wg, cstage, &c_empty[wg], c_phase, s.tiles_n, traced_from);
      break; /* the last tile; and acc is dead from here, which the registers need */
    }
    if (async_epi) {
      gemm_stage_tile<Cfg>(acc, cstage, &c_full[wg], &c_empty[wg], c_phase, staged_slot, id);
      c_phase ^= 1;
      gemm_trace_tile(p, wg, t, traced_from[wg]);
      continue;
    }
    if (p.epilogue == MK_GEMM_ADD_F32) gemm_epilogue_add_f32<Cfg>(acc, t, wg, p);
    else gemm_epilogue_bf16<Cfg>(acc, cstage, t, wg, p);
    if (p.tile_flags) gemm_raise_tile_flag(t, p);
    gemm_trace_tile(p, wg, t, traced_from[wg]);
  }
}

/* ---- the kernel ---------------------------------------------------------------------------- */

template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
mk_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a, const __grid_constant__ CUtensorMap tmap_a_local,
               const __grid_constant__ CUtensorMap tmap_b,
               const __grid_constant__ struct mk_gemm_params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = (uint8_t*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint64_t* full = (uint64_t*)(smem + Cfg::OFF_BAR);
  uint64_t* empty = full + Cfg::STAGES;
  uint64_t* c_full = empty + Cfg::STAGES; /* per consumer: its tile is staged */
  uint64_t* c_empty = c_full + Cfg::CONSUMERS; /* per consumer: the storers are done with it */
  volatile uint32_t* abort_flag = (volatile uint32_t*)(c_empty + Cfg::CONSUMERS);
  const int wg = threadIdx.x / 128;
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.call.call) *p.call.call = *(volatile uint64_t*)p.call.done + 1;
  if (threadIdx.x == 0) {
    prefetch_tensormap(&tmap_a);
    prefetch_tensormap(&tmap_a_local);
    prefetch_tensormap(&tmap_b);
    for (int i = 0; i < Cfg::STAGES; i++) {
      mbarrier_init(&full[i], 1);
      mbarrier_init(&empty[i], Cfg::CLUSTER_M * Cfg::CONSUMERS * 4); /* one arrival per consumer warp */
    }
    for (int i = 0; i < Cfg::CONSUMERS; i++) {
      mbarrier_init(&c_full[i], 128);
      mbarrier_init(&c_empty[i], Cfg::STORER_THREADS);
    }
    *abort_flag = 0;
    fence_mbarrier_init();
  }
  /* the partner's multicasts and arrivals target our barriers: initialised first */
  if (Cfg::CLUSTER_M > 1) barrier_cluster_arrive_wait();
  else __syncthreads();
  /* NOTES: setmaxnreg needs the roles as the two branches of one if/else. 64 + 2 x 224 per
   * thread x 128 fills the 64K-register file at one CTA per SM. The storer warps' reduce-scatter
   * epilogue spilled at 40 and 48 (the consumers need ~200: 0 spills at 224). */
  if (Cfg::CLUSTER_M == 1 && (int)blockIdx.x < p.push.ctas) { /* ahead of the GEMM's CTAs: resident first */
    gemm_push_cta<Cfg>(p);
    return;
  }
  if (threadIdx.x == 0 && p.rs.collect_claims) atomicAdd((unsigned long long*)p.rs.collect_claims, 1ull);
  if (wg == 0) {
    setmaxnreg_dec<56>();
    if (threadIdx.x == 0) gemm_producer<Cfg>(&tmap_a, &tmap_a_local, &tmap_b, p, smem, full, empty, abort_flag);
    else if (Cfg::ASYNC_EPI && threadIdx.x >= 32) gemm_storer<Cfg>(p, smem, c_full, c_empty, abort_flag);
    /* NOTES: here, not in the consumers: a call from their branch failed register allocation */
    if (p.rs_gather && p.call.done) gemm_rs_collect<Cfg>(p, (volatile int*)(abort_flag + 1));
    if (p.call.done) gemm_call_end(p);
  } else {
    setmaxnreg_inc<224>();
    gemm_consumer<Cfg>(wg - 1, p, smem, full, empty, c_full, c_empty, abort_flag);
    if (p.call.done) gemm_call_end(p);
  }
  /* no CTA leaves while its partner may still multicast into it or arrive on its barriers */
  if (Cfg::CLUSTER_M > 1) barrier_cluster_arrive_wait();
}

#endif /* MK_GEMM_CUH_ */
