/*
 * The forward attention core for sm_90a (FlashAttention-3 style), as device functions that a
 * kernel composes: attn.h has the layouts, positions and masking rules.
 *
 * Roles (one CTA = one 128-row query tile of one head): warp group 0's thread 0 is the producer:
 * it loads the Q tile once and then the K and V tiles (BN keys x D) of every KV block the tile
 * needs, by TMA (4-D tensor maps over [B, S, heads, D], so one head's rows are a strided box,
 * 128-byte swizzle, D in 64-column slabs) into a STAGES-deep ring of shared memory, K and V of a
 * stage on their own full barriers and released together (SPLIT_KV: separately, K one tile
 * ahead). Warp groups 1 and 2 are consumers, 64 query rows each:
 *   S = Q.K^T       wgmma m64nBNk16 (BN = 128, or 176 keys: attn.cu's default at D = 128), both
 *                   operands K-major in shared memory;
 *   online softmax  in registers: running max m and sum l per row (exp2 with log2(e)/sqrt(D)
 *                   folded into one FFMA), masked scores -inf, rows with nothing visible yet
 *                   kept at m = -inf without NaNs;
 *   O += P.V        P rounded to bf16 in registers is the A operand (the S accumulator's
 *                   fragment layout is the A fragment's, no shuffles), V the MN-major B
 *                   operand (transpose bit);
 *   intra-warp-group overlap: S of tile t+1 is issued together with P.V of tile t, and the
 *                   softmax of tile t+1 runs while P.V of tile t is still in the tensor cores.
 * The finish normalises O, stages it as bf16 in the warp group's own (no longer needed) rows of
 * the Q tile, writes 16-byte rows and lse.
 *
 * For the ring kernel (issue 11): attn_state_init once, attn_consume_kv_block per KV block as
 * it arrives (the producer runs attn_load_kv_block for the same block with the same tile
 * count, mk_attn_kv_tiles), attn_finish at the end; blocks merge in registers.
 * Every wait is bounded (attn_wait): on expiry the error record is filled and the waits of every
 * CTA give up, so a bug ends in a wrong result and an error, never in a hang.
 */
#ifndef MK_ATTN_FWD_CUH_
#define MK_ATTN_FWD_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <math.h>
#include "attn.h"
#include "gemm.h"
#include "ptx.cuh"
#include "stage.cuh"
#include "wait.cuh"

/* PINGPONG: the two consumer warp groups take turns issuing their wgmmas (FA3's
 * inter-warp-group schedule, turns passed on two mbarriers), so one's softmax runs while the
 * other's matrix products occupy the tensor cores. PERSISTENT: one CTA per SM takes work items
 * in turn (mk_attn_cta_item), the producer loading the next item's Q as soon as the consumers'
 * last S product of the current one is done and its K and V into the ring as stages free, so
 * no CTA start-up or epilogue is exposed; out is then written from registers (the Q tile, the
 * staging space of the non-persistent finish, already holds the next item's rows). */
template <int D_, int STAGES_, int PINGPONG_, int PERSISTENT_ = 0, int BN_ = MK_ATTN_BLOCK_N, int SPLIT_KV_ = 0>
struct mk_attn_cfg {
  static constexpr int D = D_, BM = MK_ATTN_BLOCK_M, BN = BN_, STAGES = STAGES_;
  static constexpr int PINGPONG = PINGPONG_, PERSISTENT = PERSISTENT_, SPLIT_KV = SPLIT_KV_;
  static constexpr int CONSUMERS = 2, THREADS = 128 * (1 + CONSUMERS);
  static constexpr int SLABS = D / 64;                   /* 64-column (128-byte) slabs of a row */
  static constexpr int Q_SLAB = BM * 128, KV_SLAB = BN * 128; /* bytes between a tile's slabs */
  static constexpr int Q_BYTES = SLABS * Q_SLAB, KV_BYTES = SLABS * KV_SLAB;
  static constexpr int OFF_K = Q_BYTES;
  static constexpr int OFF_V = OFF_K + STAGES * KV_BYTES;
  static constexpr int OFF_BAR = OFF_V + STAGES * KV_BYTES;
  static constexpr int SMEM_USED = OFF_BAR + (1 + 3 * STAGES + 2 + 1 + (SPLIT_KV ? STAGES : 0)) * 8;
  static constexpr int SMEM_BYTES = SMEM_USED + 1024; /* slack to align the base to 1024 */
  /* setmaxnreg per thread of the producer warp group and of each consumer: x 128 threads they
   * fill the 64512 registers that the launch gives the CTA (168 per thread, __launch_bounds__
   * of 384 threads at one CTA per SM); asking for more makes setmaxnreg.inc wait forever.
   * BN = 176 (O 64 + S 88 + P 44 registers) fits 240, the producer (one thread issuing TMA)
   * keeping 24: FlashAttention-3's split. (Persistent with BN = 176 does not fit: its
   * producer's item loop spills at 24, its consumers at 232; NOTES, session 30.) */
  static constexpr int REGS_PRODUCER = BN > 128 ? 24 : 40;
  static constexpr int REGS_CONSUMER = BN > 128 ? 240 : 232;
  static_assert(D == 64 || D == 128, "head dimensions 64 and 128");
  static_assert(BN == 128 || !PERSISTENT, "persistent with BN = 176 spills (REGS_*)");
  /* BN: the n of S's wgmma (ptx.cuh has n128 and n176), 16-key steps of P.V; BN x 128 bytes
   * keeps each KV slab 1024-byte aligned (the swizzle atom) whenever BN % 8 == 0 */
  static_assert(BM == 64 * CONSUMERS && (BN == 128 || BN == 176),
                "wgmma shapes: 64 rows per consumer, n of S");
  static_assert(BN % 16 == 0 && KV_SLAB % 1024 == 0,
                "KV tiles of 16-key steps, 1024-byte aligned slabs");
  static_assert(SMEM_BYTES <= 232448, "over the 227 KB of dynamic shared memory per block");
  static_assert(REGS_PRODUCER + CONSUMERS * REGS_CONSUMER <= 3 * 168,
                "over the CTA's registers (x 128 threads): setmaxnreg.inc would never return");
};

/* Where a CTA's tiles and barriers are. */
struct mk_attn_smem {
  uint8_t* base;     /* 1024-aligned: Q, then STAGES K tiles, then STAGES V tiles */
  uint64_t* q_full;  /* 1 */
  uint64_t* k_full;  /* STAGES */
  uint64_t* v_full;  /* STAGES */
  uint64_t* empty;   /* STAGES: one arrival per consumer warp */
  uint64_t* turn;    /* 2 (PINGPONG): consumer c may issue once turn[c] completes a phase */
  uint64_t* q_empty; /* 1: one arrival per consumer warp once its last S product of an item is done */
  uint64_t* k_empty; /* SPLIT_KV: STAGES, one arrival per consumer warp once its S product of the
                      * stage is done; `empty` then frees the stage's V alone */
};

/* Where producer and consumers are in the ring; both sides advance it the same way. */
struct mk_attn_ring {
  int stage;
  uint32_t phase;
};

/* What a bounded wait needs. */
struct mk_attn_wait_ctx {
  struct mk_gemm_error* err; /* optional */
  uint32_t err_tag;
  uint32_t tile;             /* recorded on a timeout: the CTA's linear tile */
  /* wait.cuh mk_wait_inner_timeout_ns of the call's: a barrier is fed by the CTA's other
   * warps, whose flag waits (the call's bound) are the cause when it stalls; with equal bounds
   * the barrier's record won ("waiting for flag 1: expected 0, seen 1": the K barrier's parity;
   * ring backward absent_peer, session 44) */
  uint64_t timeout_ns;
};

/* Barrier codes recorded in mk_gemm_error.flag_index: which wait gave up. */
#define MK_ATTN_WAIT_Q 0u
#define MK_ATTN_WAIT_K 1u
#define MK_ATTN_WAIT_V 2u
#define MK_ATTN_WAIT_EMPTY 3u
#define MK_ATTN_WAIT_TURN 4u
#define MK_ATTN_WAIT_Q_EMPTY 5u

template <class Cfg>
__device__ __forceinline__ struct mk_attn_smem attn_smem_carve(uint8_t* smem_raw) {
  struct mk_attn_smem s;
  s.base = (uint8_t*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  s.q_full = (uint64_t*)(s.base + Cfg::OFF_BAR);
  s.k_full = s.q_full + 1;
  s.v_full = s.k_full + Cfg::STAGES;
  s.empty = s.v_full + Cfg::STAGES;
  s.turn = s.empty + Cfg::STAGES;
  s.q_empty = s.turn + 2;
  s.k_empty = s.q_empty + 1; /* past the barriers when !SPLIT_KV: never used then */
  return s;
}

/* One thread, before any role starts (then a CTA barrier). */
template <class Cfg>
__device__ __forceinline__ void attn_smem_init(const struct mk_attn_smem& s) {
  mbarrier_init(s.q_full, 1);
  for (int i = 0; i < Cfg::STAGES; i++) {
    mbarrier_init(&s.k_full[i], 1);
    mbarrier_init(&s.v_full[i], 1);
    mbarrier_init(&s.empty[i], Cfg::CONSUMERS * 4);
  }
  for (int i = 0; i < 2; i++) mbarrier_init(&s.turn[i], 4); /* the other warp group's 4 warps */
  mbarrier_init(s.q_empty, Cfg::CONSUMERS * 4);
  if (Cfg::SPLIT_KV)
    for (int i = 0; i < Cfg::STAGES; i++) mbarrier_init(&s.k_empty[i], Cfg::CONSUMERS * 4);
  fence_mbarrier_init();
}

/* The slow path of attn_wait: polls, reads the clock and the abort word every 64 polls. */
__device__ __forceinline__ int attn_wait_slow(uint64_t* bar, uint32_t parity, const struct mk_attn_wait_ctx& w,
                                           uint32_t what) {
  const uint64_t t0 = globaltimer_ns();
  for (uint32_t polls = 1;; polls++) {
    if (mbarrier_try_wait_parity(bar, parity)) return 1;
    if (polls % 64) continue;
    if (w.err && ld_relaxed_sys_u32(&w.err->aborted)) return 0;
    if (globaltimer_ns() - t0 > w.timeout_ns) {
      /* when one of the feeding warps' waits gave up first, its record names the cause */
      if (w.err && !ld_relaxed_sys_u32(&w.err->aborted))
        mk_gemm_error_raise(w.err, w.err_tag, w.tile, what, parity, parity ^ 1);
      return 0;
    }
  }
}

/* 1 once the barrier's phase `parity` completed; 0 when it timed out or another CTA gave up. */
__device__ __forceinline__ int attn_wait(uint64_t* bar, uint32_t parity, const struct mk_attn_wait_ctx& w,
                                         uint32_t what) {
  if (mbarrier_try_wait_parity(bar, parity)) return 1;
  return attn_wait_slow(bar, parity, w, what);
}

__device__ __forceinline__ void attn_ring_next(struct mk_attn_ring* r, int stages) {
  if (++r->stage == stages) {
    r->stage = 0;
    r->phase ^= 1;
  }
}

/* ---- producer (one thread) ---------------------------------------------------------------- */

/* The Q tile: rows [row, row + BM) of head h of batch b (rows past the tensor read as zeros). */
template <class Cfg>
__device__ __forceinline__ void attn_load_q(const CUtensorMap* tmap_q, const struct mk_attn_smem& s, int b, int h,
                                            int row) {
  mbarrier_arrive_expect_tx(s.q_full, Cfg::Q_BYTES);
#pragma unroll
  for (int j = 0; j < Cfg::SLABS; j++)
    cp_async_bulk_tensor_4d_load(s.base + j * Cfg::Q_SLAB, tmap_q, j * 64, h, row, b, s.q_full);
}

/* One K or V tile (BN rows from `row` of kv head hk, batch b) into dst, on barrier full. */
template <class Cfg>
__device__ __forceinline__ void attn_load_kv_tile(uint8_t* dst, const CUtensorMap* tmap, uint64_t* full, int b,
                                                  int hk, int row) {
  mbarrier_arrive_expect_tx(full, Cfg::KV_BYTES);
#pragma unroll
  for (int j = 0; j < Cfg::SLABS; j++) cp_async_bulk_tensor_4d_load(dst + j * Cfg::KV_SLAB, tmap, j * 64, hk, row, b, full);
}

/* SPLIT_KV: a V tile into the V ring (its own release, `empty`). */
template <class Cfg>
__device__ __forceinline__ int attn_load_v_split(const CUtensorMap* tmap_v, const struct mk_attn_smem& s,
                                                 struct mk_attn_ring* vr, int b, int hk, int row,
                                                 const struct mk_attn_wait_ctx& w) {
  if (!attn_wait(&s.empty[vr->stage], vr->phase ^ 1, w, MK_ATTN_WAIT_EMPTY)) return 0;
  attn_load_kv_tile<Cfg>(s.base + Cfg::OFF_V + vr->stage * Cfg::KV_BYTES, tmap_v, &s.v_full[vr->stage], b, hk, row);
  attn_ring_next(vr, Cfg::STAGES);
  return 1;
}

/* SPLIT_KV, the producer's step for tile t of the n of a block (rows from row0): K runs one
 * tile ahead of V, each on its own release (FlashAttention-3's two pipelines): K of tile t,
 * then V of tile t - 1 (the consumers issue S of tile t with P.V of tile t - 1), and at the
 * block's last tile its V too (the block's last P.V is issued alone). A stage's K is free once
 * its S product is done, a whole tile before its V, so two stages hide the loads (with K and V
 * released together they did not: NOTES, session 25). kr, vr: the K and V rings' positions
 * (they start equal). Returns 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_load_split_step(const CUtensorMap* tmap_k, const CUtensorMap* tmap_v,
                                                    const struct mk_attn_smem& s, struct mk_attn_ring* kr,
                                                    struct mk_attn_ring* vr, int b, int hk, int row0, int t, int n,
                                                    const struct mk_attn_wait_ctx& w) {
  if (!attn_wait(&s.k_empty[kr->stage], kr->phase ^ 1, w, MK_ATTN_WAIT_EMPTY)) return 0;
  attn_load_kv_tile<Cfg>(s.base + Cfg::OFF_K + kr->stage * Cfg::KV_BYTES, tmap_k, &s.k_full[kr->stage], b, hk,
                         row0 + t * Cfg::BN);
  attn_ring_next(kr, Cfg::STAGES);
  if (t > 0 && !attn_load_v_split<Cfg>(tmap_v, s, vr, b, hk, row0 + (t - 1) * Cfg::BN, w)) return 0;
  return t < n - 1 || attn_load_v_split<Cfg>(tmap_v, s, vr, b, hk, row0 + t * Cfg::BN, w);
}

/* n_tiles K and V tiles of kv head hk, batch b, from row `row0` on, into the ring. Returns 0
 * when a wait gave up (then nothing more is loaded). */
template <class Cfg>
__device__ __forceinline__ int attn_load_kv_block(const CUtensorMap* tmap_k, const CUtensorMap* tmap_v,
                                                  const struct mk_attn_smem& s, struct mk_attn_ring* ring, int b,
                                                  int hk, int row0, int n_tiles,
                                                  const struct mk_attn_wait_ctx& w) {
  if constexpr (Cfg::SPLIT_KV) {
    struct mk_attn_ring vr = *ring; /* K's ring ends where V's does: the block's tiles */
    for (int t = 0; t < n_tiles; t++)
      if (!attn_load_split_step<Cfg>(tmap_k, tmap_v, s, ring, &vr, b, hk, row0, t, n_tiles, w)) return 0;
    return 1;
  } else {
    for (int t = 0; t < n_tiles; t++) {
      if (!attn_wait(&s.empty[ring->stage], ring->phase ^ 1, w, MK_ATTN_WAIT_EMPTY)) return 0;
      const int row = row0 + t * Cfg::BN;
      attn_load_kv_tile<Cfg>(s.base + Cfg::OFF_K + ring->stage * Cfg::KV_BYTES, tmap_k, &s.k_full[ring->stage], b,
                             hk, row);
      attn_load_kv_tile<Cfg>(s.base + Cfg::OFF_V + ring->stage * Cfg::KV_BYTES, tmap_v, &s.v_full[ring->stage], b,
                             hk, row);
      attn_ring_next(ring, Cfg::STAGES);
    }
    return 1;
  }
}

/* ---- consumers (one warp group each, 64 query rows) --------------------------------------- */

/* A thread's part of its warp group's running result: the 64 x D accumulator fragment (rows
 * r0 = 16 * warp + lane / 4 and r0 + 8; o[4j], o[4j+1] in row r0 at columns 8j + 2 (lane % 4)
 * + {0, 1}, o[4j+2], o[4j+3] in row r0 + 8), and per row the running max (raw score units,
 * -inf while nothing was visible) and this thread's part of the running sum. */
template <class Cfg>
struct mk_attn_state {
  float o[Cfg::D / 2];
  float m[2], l[2];
  uint32_t turn_phase; /* PINGPONG: parity of this warp group's next turn */
};

/* A new query tile's result (the turns go on). */
template <class Cfg>
__device__ __forceinline__ void attn_state_reset(struct mk_attn_state<Cfg>& st) {
#pragma unroll
  for (int i = 0; i < Cfg::D / 2; i++) st.o[i] = 0.f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;
}

template <class Cfg>
__device__ __forceinline__ void attn_state_init(struct mk_attn_state<Cfg>& st) {
  attn_state_reset<Cfg>(st);
  st.turn_phase = 0;
}

/* PINGPONG, once per kernel after attn_state_init: consumer 1 gives consumer 0 the first turn.
 * Both then take one turn per wgmma issue point, the same number (they consume the same
 * tiles), so the turns alternate strictly. */
template <class Cfg>
__device__ __forceinline__ void attn_turns_start(const struct mk_attn_smem& sm, int wg) {
  if (Cfg::PINGPONG && wg == 1 && (threadIdx.x & 31) == 0) mbarrier_arrive(&sm.turn[0]);
}

template <class Cfg>
__device__ __forceinline__ int attn_turn_begin(struct mk_attn_state<Cfg>& st, const struct mk_attn_smem& sm, int wg,
                                               const struct mk_attn_wait_ctx& w) {
  if (!Cfg::PINGPONG) return 1;
  if (!attn_wait(&sm.turn[wg], st.turn_phase, w, MK_ATTN_WAIT_TURN)) return 0;
  st.turn_phase ^= 1;
  return 1;
}

/* After this warp's wgmmas of the turn are issued: the other warp group's turn. */
template <class Cfg>
__device__ __forceinline__ void attn_turn_end(const struct mk_attn_smem& sm, int wg) {
  if (Cfg::PINGPONG && (threadIdx.x & 31) == 0) mbarrier_arrive(&sm.turn[wg ^ 1]);
}

__device__ __forceinline__ float attn_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* S = Q.K^T for this warp group's 64 rows and the BN keys of a stage (one commit group);
 * q_lo, k_lo: the tiles' descriptor low words (ptx.cuh wgmma_desc_lo_sw128). */
template <class Cfg>
__device__ __forceinline__ void attn_issue_qk(float* s, uint32_t q_lo, uint32_t k_lo) {
  /* BN = 176: the compiler would hoist the loop-invariant Q descriptors out of the KV loop
   * into ~14 registers that the consumer lacks (it spilled); one add per wgmma instead */
  if constexpr (Cfg::BN > 128) q_lo = opaque_u32(q_lo);
#pragma unroll
  for (int kk = 0; kk < Cfg::D / 16; kk++) {
    const uint32_t off = (kk % 4) * 32; /* 16 columns = 32 bytes into the 128-byte slab row */
    const uint64_t da = wgmma_desc_from_lo(q_lo + (((kk / 4) * Cfg::Q_SLAB + off) >> 4));
    const uint64_t db = wgmma_desc_from_lo(k_lo + (((kk / 4) * Cfg::KV_SLAB + off) >> 4));
    if constexpr (Cfg::BN == 176) wgmma_m64n176k16_bf16(s, da, db, kk > 0 ? 1 : 0);
    else wgmma_m64n128k16_bf16(s, da, db, kk > 0 ? 1 : 0);
  }
}

/* acc (64 x D) += A . tile: A (bf16 fragments, 4 registers per 16 of the K rows) from registers,
 * the tile (K rows x D, MN-major, slabs of 64 columns SLAB bytes apart) from shared memory,
 * given by its descriptor low word (wgmma_desc_lo_sw128_mn(base, SLAB)).
 * The forward's O += P.V and the backward's dV += P^T.dO, dK += dS^T.Q. */
template <int D, int K, int SLAB>
__device__ __forceinline__ void attn_issue_rs_mn(float* acc, const uint32_t* a, uint32_t tile_lo) {
#pragma unroll
  for (int kk = 0; kk < K / 16; kk++) {
    const uint64_t db = wgmma_desc_from_lo(tile_lo + ((kk * 16 * 128) >> 4));
    if constexpr (D == 128) wgmma_m64n128k16_bf16_rs_tb(acc, a + 4 * kk, db, 1);
    else wgmma_m64n64k16_bf16_rs_tb(acc, a + 4 * kk, db, 1);
  }
}

/* O += P.V: P (4 registers per 16 keys), V MN-major (v_lo: its descriptor low word). */
template <class Cfg>
__device__ __forceinline__ void attn_issue_pv(float* o, const uint32_t* p, uint32_t v_lo) {
  attn_issue_rs_mn<Cfg::D, Cfg::BN, Cfg::KV_SLAB>(o, p, v_lo);
}

/* The online softmax of one S tile, in place: masks (when `masked`: key columns past
 * vis[row] are -inf), updates the running max and sum, turns s into exp2 weights, and gives
 * the factor the old O must be scaled by. vis[i]: the last visible column of the tile (in this
 * thread's column numbering, see attn_consume_kv_block) for row r0 + 8 i. */
template <class Cfg>
__device__ __forceinline__ void attn_softmax(struct mk_attn_state<Cfg>& st, float* s, float* corr, int masked,
                                             const int* vis, float scale_log2) {
  if (masked) {
#pragma unroll
    for (int j = 0; j < Cfg::BN / 8; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int c = 8 * j + e;
        if (c > vis[0]) s[4 * j + e] = -INFINITY;
        if (c > vis[1]) s[4 * j + 2 + e] = -INFINITY;
      }
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float mx = st.m[i];
#pragma unroll
    for (int j = 0; j < Cfg::BN / 8; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    /* nothing visible yet: subtract 0, so that -inf scores give 0 and no NaN */
    const float ref = mx == -INFINITY ? 0.f : mx * scale_log2;
    corr[i] = attn_ex2(st.m[i] * scale_log2 - ref); /* old max -inf: 0 (O and l are 0 then) */
    st.m[i] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < Cfg::BN / 8; j++) {
      s[4 * j + 2 * i] = attn_ex2(fmaf(s[4 * j + 2 * i], scale_log2, -ref));
      s[4 * j + 2 * i + 1] = attn_ex2(fmaf(s[4 * j + 2 * i + 1], scale_log2, -ref));
      sum += s[4 * j + 2 * i] + s[4 * j + 2 * i + 1];
    }
    st.l[i] = st.l[i] * corr[i] + sum;
  }
}

/* O *= corr per row, then P = bf16(s) as A fragments: for keys 16kk .. 16kk+15 the registers
 * (r0, 2q), (r0 + 8, 2q), (r0, 8 + 2q), (r0 + 8, 8 + 2q) are s[8kk + 0..7] in pairs. */
template <class Cfg>
__device__ __forceinline__ void attn_rescale_and_pack(struct mk_attn_state<Cfg>& st, const float* s, uint32_t* p,
                                                      const float* corr) {
  /* NOTES: skipping this where no row's max moved (a warp vote) measured 4-7% slower */
#pragma unroll
  for (int j = 0; j < Cfg::D / 8; j++) {
    st.o[4 * j] *= corr[0], st.o[4 * j + 1] *= corr[0];
    st.o[4 * j + 2] *= corr[1], st.o[4 * j + 3] *= corr[1];
  }
#pragma unroll
  for (int i = 0; i < Cfg::BN / 4; i++) p[i] = pack_bf16x2(s[2 * i], s[2 * i + 1]);
}

/* The last visible column (this thread's numbering: column c of the thread is key
 * 8 (c / 8) + 2 (lane % 4) + c % 8 of the tile) of tile t for rows r0 and r0 + 8. */
template <class Cfg>
__device__ __forceinline__ void attn_visible(int* vis, long long q_pos_r0, long long pos0, int rows, int t,
                                             int causal) {
  const int lane = threadIdx.x & 31;
  const long long key0 = pos0 + (long long)t * Cfg::BN + 2 * (lane & 3); /* position of column 0 */
  const int last = rows - t * Cfg::BN - 2 * (lane & 3) - 1;               /* block end */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    int v = last;
    if (causal) {
      long long d = q_pos_r0 + 8 * i - key0;
      d = d < -1 ? -1 : d;
      if (d < v) v = (int)d;
    }
    vis[i] = v;
  }
}

/* A block's last P.V (stage r's V), then the stage given back. Returns 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_last_pv(struct mk_attn_state<Cfg>& st, const struct mk_attn_smem& sm,
                                            const struct mk_attn_ring& r, uint32_t* p, uint32_t v_lo,
                                            int wg, int lane, const struct mk_attn_wait_ctx& w) {
  constexpr uint32_t STAGE_LO = Cfg::KV_BYTES >> 4;
  if (!attn_wait(&sm.v_full[r.stage], r.phase, w, MK_ATTN_WAIT_V)) return 0;
  if (!attn_turn_begin<Cfg>(st, sm, wg, w)) return 0;
  wgmma_fence();
  attn_issue_pv<Cfg>(st.o, p, v_lo + r.stage * STAGE_LO);
  wgmma_commit_group();
  attn_turn_end<Cfg>(sm, wg);
  wgmma_wait_group<0>();
  wgmma_fence_operands<Cfg::D / 2>(st.o);
  wgmma_fence_operands_u32<Cfg::BN / 4>(p);
  if (lane == 0) mbarrier_arrive(&sm.empty[r.stage]);
  return 1;
}

/* One KV block (n_tiles tiles from the ring, mk_attn_kv_tiles of the CTA's queries) into the
 * running state. q_pos_wg: global position of the warp group's first row; pos0, rows: the
 * block's. q_release (optional; the item's last block): each warp arrives on it once its last
 * S product is done, the Q tile no longer read. Returns 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_consume_kv_block(struct mk_attn_state<Cfg>& st, const struct mk_attn_smem& sm,
                                                     struct mk_attn_ring* ring, int wg, long long q_pos_wg,
                                                     long long pos0, int rows, int n_tiles, int causal,
                                                     float scale_log2, const struct mk_attn_wait_ctx& w,
                                                     uint64_t* q_release = nullptr) {
  if (n_tiles <= 0) return 1;
  float s[Cfg::BN / 2];
  uint32_t p[Cfg::BN / 4];
  float corr[2];
  int vis[2];
  const int tid = threadIdx.x & 127, lane = tid & 31;
  const long long q_pos_r0 = q_pos_wg + (tid >> 5) * 16 + (lane >> 2);
  /* descriptor low words: this warp group's 64 Q rows, stage 0's K and V (a stage KV_BYTES on) */
  const uint32_t q_lo = wgmma_desc_lo_sw128(smem_addr(sm.base) + wg * 64 * 128);
  const uint32_t k_lo = wgmma_desc_lo_sw128(smem_addr(sm.base + Cfg::OFF_K));
  const uint32_t v_lo = wgmma_desc_lo_sw128_mn(smem_addr(sm.base + Cfg::OFF_V), Cfg::KV_SLAB);
  constexpr uint32_t STAGE_LO = Cfg::KV_BYTES >> 4;
  struct mk_attn_ring r = *ring;

  if (!attn_wait(&sm.k_full[r.stage], r.phase, w, MK_ATTN_WAIT_K)) return 0;
  if (!attn_turn_begin<Cfg>(st, sm, wg, w)) return 0;
  wgmma_fence();
  attn_issue_qk<Cfg>(s, q_lo, k_lo + r.stage * STAGE_LO);
  wgmma_commit_group();
  attn_turn_end<Cfg>(sm, wg);
  wgmma_wait_group<0>();
  wgmma_fence_operands<Cfg::BN / 2>(s);
  if (Cfg::SPLIT_KV && lane == 0) mbarrier_arrive(&sm.k_empty[r.stage]);
  if (q_release && n_tiles == 1 && lane == 0) mbarrier_arrive(q_release);
  int masked = mk_attn_tile_masked(q_pos_wg, pos0, rows, Cfg::BN, 0, causal);
  if (masked) attn_visible<Cfg>(vis, q_pos_r0, pos0, rows, 0, causal);
  attn_softmax<Cfg>(st, s, corr, masked, vis, scale_log2);
  attn_rescale_and_pack<Cfg>(st, s, p, corr);

  for (int t = 1; t < n_tiles; t++) {
    const struct mk_attn_ring prev = r;
    attn_ring_next(&r, Cfg::STAGES);
    if (!attn_wait(&sm.k_full[r.stage], r.phase, w, MK_ATTN_WAIT_K)) return 0;
    if (!attn_wait(&sm.v_full[prev.stage], prev.phase, w, MK_ATTN_WAIT_V)) return 0;
    if (!attn_turn_begin<Cfg>(st, sm, wg, w)) return 0;
    wgmma_fence();
    attn_issue_qk<Cfg>(s, q_lo, k_lo + r.stage * STAGE_LO);
    wgmma_commit_group();
    attn_issue_pv<Cfg>(st.o, p, v_lo + prev.stage * STAGE_LO);
    wgmma_commit_group();
    attn_turn_end<Cfg>(sm, wg);
    wgmma_wait_group<1>(); /* S of tile t is in; P.V of tile t-1 may still run */
    wgmma_fence_operands<Cfg::BN / 2>(s);
    if (Cfg::SPLIT_KV && lane == 0) mbarrier_arrive(&sm.k_empty[r.stage]);
    if (q_release && t == n_tiles - 1 && lane == 0) mbarrier_arrive(q_release);
    masked = mk_attn_tile_masked(q_pos_wg, pos0, rows, Cfg::BN, t, causal);
    if (masked) attn_visible<Cfg>(vis, q_pos_r0, pos0, rows, t, causal);
    attn_softmax<Cfg>(st, s, corr, masked, vis, scale_log2);
    wgmma_wait_group<0>();
    wgmma_fence_operands<Cfg::D / 2>(st.o);
    wgmma_fence_operands_u32<Cfg::BN / 4>(p);
    if (lane == 0) mbarrier_arrive(&sm.empty[prev.stage]);
    attn_rescale_and_pack<Cfg>(st, s, p, corr);
  }

  if (!attn_last_pv<Cfg>(st, sm, r, p, v_lo, wg, lane, w)) return 0;
  attn_ring_next(&r, Cfg::STAGES);
  *ring = r;
  return 1;
}

/* 1 / l for rows r0 and r0 + 8 of this thread (0 where nothing was visible), and lse[0 ..
 * rows_valid) of the warp group (optional) as the natural log. */
template <class Cfg>
__device__ __forceinline__ void attn_row_norm(const struct mk_attn_state<Cfg>& st, float* inv, float* lse,
                                              int rows_valid, float scale) {
  const int lane = threadIdx.x & 31;
  const int r0 = ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2);
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float l = st.l[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[i] = l > 0.f ? 1.f / l : 0.f;
    if (lse && (lane & 3) == 0 && r0 + 8 * i < rows_valid)
      lse[r0 + 8 * i] = l > 0.f ? st.m[i] * scale + logf(l) : -INFINITY;
  }
}

/* Normalise and write: out rows [0, rows_valid) of the warp group (out points at its row 0,
 * rows row_stride elements apart), lse[0 .. rows_valid) (optional) as the natural log. Stages
 * bf16 through the warp group's own rows of the Q tile (its S wgmmas are done). */
template <class Cfg>
__device__ __forceinline__ void attn_finish(struct mk_attn_state<Cfg>& st, const struct mk_attn_smem& sm, int wg,
                                            __nv_bfloat16* out, size_t row_stride, float* lse, int rows_valid,
                                            float scale) {
  const int tid = threadIdx.x & 127, lane = tid & 31;
  const int r0 = (tid >> 5) * 16 + (lane >> 2);
  float inv[2];
  attn_row_norm<Cfg>(st, inv, lse, rows_valid, scale);
  const uint32_t base = smem_addr(sm.base) + wg * 64 * 128;
#pragma unroll
  for (int j = 0; j < Cfg::D / 8; j++) {
    const int col = 8 * j + 2 * (lane & 3);
    st_shared_b32(base + stage_offset_in(r0, col, Cfg::Q_SLAB), pack_bf16x2(st.o[4 * j] * inv[0], st.o[4 * j + 1] * inv[0]));
    st_shared_b32(base + stage_offset_in(r0 + 8, col, Cfg::Q_SLAB),
                  pack_bf16x2(st.o[4 * j + 2] * inv[1], st.o[4 * j + 3] * inv[1]));
  }
  bar_sync(1 + wg, 128);
  constexpr int CHUNKS = Cfg::D / 8; /* 16-byte chunks per row */
#pragma unroll 4
  for (int c = tid; c < 64 * CHUNKS; c += 128) {
    const int r = c / CHUNKS, cc = c % CHUNKS;
    if (r < rows_valid) st_global_v4_b32(out + (size_t)r * row_stride + cc * 8, ld_shared_v4_b32(base + stage_offset_in(r, cc * 8, Cfg::Q_SLAB)));
  }
}

/* The same written from registers, 4 bytes per store (no shared memory: the persistent
 * kernel's Q tile already holds the next item). */
template <class Cfg>
__device__ __forceinline__ void attn_finish_direct(const struct mk_attn_state<Cfg>& st, __nv_bfloat16* out,
                                                   size_t row_stride, float* lse, int rows_valid, float scale) {
  const int lane = threadIdx.x & 31;
  const int r0 = ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2);
  float inv[2];
  attn_row_norm<Cfg>(st, inv, lse, rows_valid, scale);
  uint32_t* row_a = (uint32_t*)(out + (size_t)r0 * row_stride + 2 * (lane & 3));
  uint32_t* row_b = (uint32_t*)(out + (size_t)(r0 + 8) * row_stride + 2 * (lane & 3));
#pragma unroll
  for (int j = 0; j < Cfg::D / 8; j++) {
    if (r0 < rows_valid) row_a[4 * j] = pack_bf16x2(st.o[4 * j] * inv[0], st.o[4 * j + 1] * inv[0]);
    if (r0 + 8 < rows_valid) row_b[4 * j] = pack_bf16x2(st.o[4 * j + 2] * inv[1], st.o[4 * j + 3] * inv[1]);
  }
}

/* ---- the single-GPU kernel (attn.cu launches it) ------------------------------------------ */

struct mk_attn_block_params {
  int row0, rows;
  long long pos0;
};

struct mk_attn_params {
  int seq_q, heads, kv_heads, batch, causal;
  int q_row0, q_rows;
  long long q_pos0;
  int q_tiles, n_items; /* query tiles per head; q_tiles x heads x batch */
  int chunk;            /* mk_attn_item_work's */
  int num_kv_blocks;
  struct mk_attn_block_params kv[MK_ATTN_MAX_KV_BLOCKS];
  __nv_bfloat16* out;
  float* lse;
  float scale, scale_log2;
  struct mk_gemm_error* err;
  uint64_t timeout_ns;
};

struct mk_attn_maps {
  CUtensorMap q;
  CUtensorMap k[MK_ATTN_MAX_KV_BLOCKS];
  CUtensorMap v[MK_ATTN_MAX_KV_BLOCKS];
};

/* This CTA's work item k, -1 past its last: persistent, the snake of mk_attn_cta_item over a
 * 1-D grid; otherwise one item per CTA of a (tiles, heads, batch) grid. */
template <class Cfg>
__device__ __forceinline__ int attn_kernel_item(const struct mk_attn_params& p, int k) {
  if (Cfg::PERSISTENT) return mk_attn_cta_item(k, (int)blockIdx.x, (int)gridDim.x, p.n_items);
  return k ? -1 : (int)((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
}

/* One item's query rows: the tile's first row within the computed rows, how many are valid,
 * their global positions. */
struct mk_attn_item_rows {
  struct mk_attn_work wk;
  int row_in, rows_valid;
  long long q_first, q_last;
};

__device__ __forceinline__ struct mk_attn_item_rows attn_item_rows(const struct mk_attn_params& p, int item, int bm) {
  struct mk_attn_item_rows r;
  r.wk = mk_attn_item_work(item, p.q_tiles, p.heads, p.batch, p.chunk, p.causal);
  r.row_in = r.wk.tile * bm;
  r.rows_valid = p.q_rows - r.row_in < bm ? p.q_rows - r.row_in : bm;
  r.q_first = p.q_pos0 + r.row_in;
  r.q_last = r.q_first + r.rows_valid - 1;
  return r;
}

/* The producer thread: per item the Q tile (once the consumers are done with the last one's),
 * then its KV tiles. */
template <class Cfg>
__device__ __forceinline__ void attn_produce(const struct mk_attn_maps& maps, const struct mk_attn_params& p,
                                             const struct mk_attn_smem& sm, struct mk_attn_wait_ctx& w) {
  struct mk_attn_ring ring = {0, 0};
  prefetch_tensormap(&maps.q);
  for (int k = 0;; k++) {
    const int item = attn_kernel_item<Cfg>(p, k);
    if (item < 0) return;
    const struct mk_attn_item_rows r = attn_item_rows(p, item, Cfg::BM);
    w.tile = (uint32_t)item;
    if (k > 0 && !attn_wait(sm.q_empty, (k - 1) & 1, w, MK_ATTN_WAIT_Q_EMPTY)) return;
    const int hk = r.wk.head / (p.heads / p.kv_heads);
    attn_load_q<Cfg>(&maps.q, sm, r.wk.batch, r.wk.head, p.q_row0 + r.row_in);
    for (int i = 0; i < p.num_kv_blocks; i++) {
      const int n = mk_attn_kv_tiles(r.q_last, p.kv[i].pos0, p.kv[i].rows, Cfg::BN, p.causal);
      if (!attn_load_kv_block<Cfg>(&maps.k[i], &maps.v[i], sm, &ring, r.wk.batch, hk, p.kv[i].row0, n, w)) return;
    }
  }
}

/* Consumer warp group c: per item the KV blocks into a fresh state, then out and lse. */
template <class Cfg>
__device__ __forceinline__ void attn_consume(const struct mk_attn_params& p, const struct mk_attn_smem& sm, int c,
                                             struct mk_attn_wait_ctx& w) {
  struct mk_attn_ring ring = {0, 0};
  struct mk_attn_state<Cfg> st;
  attn_state_init<Cfg>(st);
  attn_turns_start<Cfg>(sm, c);
  for (int k = 0;; k++) {
    const int item = attn_kernel_item<Cfg>(p, k);
    if (item < 0) return;
    const struct mk_attn_item_rows r = attn_item_rows(p, item, Cfg::BM);
    w.tile = (uint32_t)item;
    int last = -1; /* the last block with tiles: it releases the Q tile */
    for (int i = 0; i < p.num_kv_blocks; i++)
      if (mk_attn_kv_tiles(r.q_last, p.kv[i].pos0, p.kv[i].rows, Cfg::BN, p.causal) > 0) last = i;
    if (k > 0) attn_state_reset<Cfg>(st);
    if (!attn_wait(sm.q_full, k & 1, w, MK_ATTN_WAIT_Q)) return;
    if (last < 0 && (threadIdx.x & 31) == 0) mbarrier_arrive(sm.q_empty);
    for (int i = 0; i < p.num_kv_blocks; i++) {
      const int n = mk_attn_kv_tiles(r.q_last, p.kv[i].pos0, p.kv[i].rows, Cfg::BN, p.causal);
      if (!attn_consume_kv_block<Cfg>(st, sm, &ring, c, r.q_first + 64 * c, p.kv[i].pos0, p.kv[i].rows, n, p.causal,
                                      p.scale_log2, w, i == last ? sm.q_empty : nullptr))
        return;
    }
    const int row = p.q_row0 + r.row_in + 64 * c; /* the warp group's first row in the tensor */
    const size_t row_stride = (size_t)p.heads * Cfg::D;
    __nv_bfloat16* out = p.out + (((size_t)r.wk.batch * p.seq_q + row) * p.heads + r.wk.head) * Cfg::D;
    float* lse = p.lse ? p.lse + ((size_t)r.wk.batch * p.heads + r.wk.head) * p.seq_q + row : NULL;
    if (Cfg::PERSISTENT) attn_finish_direct<Cfg>(st, out, row_stride, lse, r.rows_valid - 64 * c, p.scale);
    else attn_finish<Cfg>(st, sm, c, out, row_stride, lse, r.rows_valid - 64 * c, p.scale);
  }
}

/* Non-persistent: grid (query tiles, heads, batch), mk_attn_item_work's chunk
 * MK_ATTN_CHUNK_HEADS. Persistent: one CTA per SM over the items in p.chunk's order. */
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
mk_attn_fwd_kernel(const __grid_constant__ struct mk_attn_maps maps, const __grid_constant__ struct mk_attn_params p) {
  extern __shared__ uint8_t smem_raw[];
  const struct mk_attn_smem sm = attn_smem_carve<Cfg>(smem_raw);
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) attn_smem_init<Cfg>(sm);
  __syncthreads();
  struct mk_attn_wait_ctx w;
  w.err = p.err;
  w.err_tag = 0;
  w.tile = 0;
  w.timeout_ns = mk_wait_inner_timeout_ns(p.timeout_ns);

  /* NOTES: setmaxnreg needs the roles as the two branches of one if/else (Cfg::REGS_*). */
  if (wg == 0) {
    setmaxnreg_dec<Cfg::REGS_PRODUCER>();
    if (threadIdx.x == 0) attn_produce<Cfg>(maps, p, sm, w);
  } else {
    setmaxnreg_inc<Cfg::REGS_CONSUMER>();
    attn_consume<Cfg>(p, sm, wg - 1, w);
  }
}

#endif /* MK_ATTN_FWD_CUH_ */
