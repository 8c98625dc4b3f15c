/*
 * The backward attention core for sm_90a (FlashAttention-2/3 style: P recomputed from q, k and
 * lse), as kernels that attn_bwd.cu launches; attn.h has the layouts, positions and arguments.
 *
 * mk_attn_bwd_prep_kernel: delta = rowsum(dout * out) per query row (fp32, [B, H, S]) and the
 * rows of dq_acc zeroed; one warp per (row, head, batch).
 *
 * mk_attn_bwd_kernel: one CTA per (128-key tile of a KV block, kv head, batch). Warp 0 is the
 * producer: the K and V tiles once (TMA, 4-D maps over [B, S, H_kv, D] stopping at the block's
 * rows, 128-byte swizzle, D in 64-column slabs), then per step the Q and dO tiles (64 rows of
 * one query head, maps stopping at the query range) into a STAGES-deep ring, with the steps'
 * lse (times log2 e; +inf for rows past the range or with no key, so their P is 0) and delta
 * stored beside them by the warp's lanes (and, DQ_LATE = 3, the dQ reductions of the step that
 * last used the stage). Steps: the query heads of the kv head's group, each over the query
 * tiles that see the key tile (mk_attn_bwd_first_q_tile on).
 * Warp groups 1 and 2 are consumers, 64 keys each (the M of every product is keys, so that
 * P^T and dS^T come out of an accumulator in the A-fragment layout):
 *   S^T  = K Q^T            wgmma m64n64k16, both K-major in shared memory
 *   dP^T = V dO^T           the same
 *   P^T  = exp2(S^T scale log2 e - lse log2 e), masked entries -inf first
 *   dV  += P^T dO           P^T bf16 from registers, dO MN-major (transpose bit)
 *   dS^T = P^T (dP^T - delta)
 *   dK  += dS^T Q           dS^T bf16 from registers, Q MN-major
 *   dQ   = dS K             dS^T stored bf16 in shared memory (swizzled as a TMA tile, one
 *                           buffer of two per step), read M-major; K MN-major. D = 128: warp
 *                           group c takes columns [64c, 64c + 64) over all 128 keys (both
 *                           groups' dS^T: an mbarrier of 256 arrivals per buffer); D = 64: its
 *                           own 64 keys, all columns. Added into fp32 dq_acc by TMA
 *                           reductions from shared memory (DQ_TMA) or red.add.
 * dK (times scale) and dV are written once at the end, bf16 and/or added to fp32.
 * Every wait is bounded (attn_wait, attn_fwd.cuh): on expiry the error record is filled and
 * every CTA's waits give up, so a bug ends in a wrong result and an error, never in a hang.
 *
 * mk_attn_bwd_dq_kernel: dq = bf16(dq_acc) over the rows.
 */
#ifndef MK_ATTN_BWD_CUH_
#define MK_ATTN_BWD_CUH_

#include "attn_fwd.cuh"

/* DQ_TMA: each warp group stages its dQ tile (64 queries x 64 columns, fp32) in shared memory,
 * 128-byte swizzled as two 32-column boxes, and each warp's lane 0 adds the warp's 16 rows into
 * dq_acc with TMA reductions; otherwise every thread adds its fragment with red.add (8 L2
 * sectors per warp instruction).
 * DEFER_DQ: a step's dQ product is issued in the next step, before that step's dV and dK, so the
 * two consumer warp groups, which need each other's dS^T for dQ, no longer meet in every step:
 * the second group starts half a step late (the `stagger` barrier) and they stay apart, one's
 * softmax beside the other's products. Three dS^T buffers, each reused once both groups' dQ
 * of its last step is done (ds_free).
 * DQ_LATE (DQ_TMA): a step's dQ is stored into the staging at its end, but the proxy fence and
 * the reductions are issued in the next step, once its S^T and dP^T are issued (1) or once its
 * Q and dO have arrived (2), so the fence no longer waits out the staging stores' latency. The
 * reductions then read the staging during that step's products, before it is rewritten.
 * DQ_LATE = 3: the producer warp issues them (64-row boxes, 4 per step): the consumers fence
 * their staged dQ at the next step's start and release the step's Q/dO stage only then, so the
 * producer, once the stage is empty, adds the staged dQ into dq_acc before it reloads the stage
 * and hands the staging back (dq_free) once its reductions have read it. */
template <int D_, int STAGES_, int DQ_TMA_ = 0, int DEFER_DQ_ = 0, int DQ_LATE_ = 0>
struct mk_attn_bwd_cfg {
  static constexpr int D = D_, BM = MK_ATTN_BWD_BLOCK_M, BN = MK_ATTN_BWD_BLOCK_N, STAGES = STAGES_;
  static constexpr int DQ_TMA = DQ_TMA_, DEFER_DQ = DEFER_DQ_, DS_BUFS = DEFER_DQ_ ? 3 : 2, DQ_LATE = DQ_LATE_;
  static constexpr int DQ_BY_PRODUCER = DQ_LATE_ == 3, DQ_BOX_ROWS = DQ_BY_PRODUCER ? BM : 16;
  static constexpr int CONSUMERS = 2, THREADS = 128 * (1 + CONSUMERS);
  static constexpr int SLABS = D / 64;
  static constexpr int QT_SLAB = BM * 128, KV_SLAB = BN * 128; /* bytes between a tile's slabs */
  static constexpr int QT_BYTES = SLABS * QT_SLAB, KV_BYTES = SLABS * KV_SLAB;
  static constexpr int DS_BYTES = BN * BM * 2; /* dS^T: BN rows (keys) of BM bf16 (128 bytes) */
  static constexpr int OFF_K = 0, OFF_V = KV_BYTES, OFF_DS = 2 * KV_BYTES;
  static constexpr int OFF_Q = OFF_DS + DS_BUFS * DS_BYTES;
  static constexpr int OFF_DO = OFF_Q + STAGES * QT_BYTES;
  static constexpr int DQ_BOX = BM * 128; /* 64 rows x 32 fp32 (attn.h mk_attn_dq_stage_offset) */
  static constexpr int OFF_DQ = OFF_DO + STAGES * QT_BYTES; /* swizzled boxes: 1024-aligned */
  static constexpr int DQ_BYTES = DQ_TMA ? CONSUMERS * 2 * DQ_BOX : 0;
  static constexpr int OFF_LSE = OFF_DQ + DQ_BYTES; /* STAGES x BM fp32 */
  static constexpr int OFF_DELTA = OFF_LSE + STAGES * BM * 4;
  static constexpr int OFF_BAR = OFF_DELTA + STAGES * BM * 4;
  static constexpr int SMEM_USED = OFF_BAR + (1 + 2 * STAGES + 2 * DS_BUFS + 2) * 8;
  static constexpr int SMEM_BYTES = SMEM_USED + 1024;
  static_assert(D == 64 || D == 128, "head dimensions 64 and 128");
  static_assert(BM == 64 && BN == 64 * CONSUMERS, "64 keys per consumer, 64-query steps");
  static_assert(!DEFER_DQ || DQ_TMA, "the deferred dQ goes through the TMA path");
  static_assert(!DQ_LATE || (DQ_TMA && !DEFER_DQ), "the late dQ reductions: the TMA path, not deferred");
  static_assert(OFF_DQ % 1024 == 0, "the dQ staging's swizzle needs 1024-byte alignment");
  static_assert(SMEM_BYTES <= 232448, "over the 227 KB of dynamic shared memory per block");
};

struct mk_attn_bwd_smem {
  uint8_t* base;      /* 1024-aligned */
  uint64_t* kv_full;  /* 1: K and V */
  uint64_t* full;     /* STAGES: Q, dO (TMA bytes) + lse, delta (32 producer lanes) */
  uint64_t* empty;    /* STAGES: one arrival per consumer warp */
  uint64_t* ds_ready; /* DS_BUFS: dS^T buffer b written by all 256 consumer threads */
  uint64_t* ds_free;  /* DS_BUFS (DEFER_DQ): one arrival per consumer warp once its dQ of b is done */
  uint64_t* stagger;  /* 1 (DEFER_DQ): group 0's warps, once its first dV, dK are issued */
  uint64_t* dq_free;  /* 1 (DQ_BY_PRODUCER): the producer's reductions of a step's dQ have read it */
};

template <class Cfg>
__device__ __forceinline__ struct mk_attn_bwd_smem attn_bwd_smem_carve(uint8_t* smem_raw) {
  struct mk_attn_bwd_smem s;
  s.base = (uint8_t*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  s.kv_full = (uint64_t*)(s.base + Cfg::OFF_BAR);
  s.full = s.kv_full + 1;
  s.empty = s.full + Cfg::STAGES;
  s.ds_ready = s.empty + Cfg::STAGES;
  s.ds_free = s.ds_ready + Cfg::DS_BUFS;
  s.stagger = s.ds_free + Cfg::DS_BUFS;
  s.dq_free = s.stagger + 1;
  return s;
}

struct mk_attn_bwd_block_params {
  int row0, rows; /* rows of the block (the maps start at row0) */
  long long pos0;
  int tile0;      /* the block's first tile in the grid's x */
  __nv_bfloat16 *dk, *dv;
  float *dk_acc, *dv_acc;
  int acc_overwrite;
  int seq;
};

struct mk_attn_bwd_params {
  int seq_q, heads, kv_heads, causal;
  int order; /* mk_attn_bwd_cta_work's */
  int q_row0, q_rows;
  long long q_pos0;
  int num_kv_blocks;
  struct mk_attn_bwd_block_params kv[MK_ATTN_MAX_KV_BLOCKS];
  const float* lse;
  const float* delta;
  float* dq_acc;
  float scale, scale_log2;
  const uint64_t* acc_gate; /* mk_attn_bwd_args.acc_gate */
  struct mk_gemm_error* err;
  uint64_t timeout_ns;
};

struct mk_attn_bwd_maps {
  CUtensorMap q, dout; /* rows [q_row0, q_row0 + q_rows), box BM rows */
  CUtensorMap dq_acc;  /* fp32, the same rows, box 32 columns x 16 rows (a warp's; DQ_TMA) */
  CUtensorMap k[MK_ATTN_MAX_KV_BLOCKS], v[MK_ATTN_MAX_KV_BLOCKS]; /* the block's rows, box BN */
};

/* S^T (or dP^T) = A_rows . B^T for this warp group's 64 keys (a: the K or V tile at the warp
 * group's first row) and the 64 rows of a Q or dO tile, K = D. One commit group. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_issue_nt(float* acc, uint32_t a_base, uint32_t b_base) {
  const uint32_t a_lo = wgmma_desc_lo_sw128(a_base), b_lo = wgmma_desc_lo_sw128(b_base);
#pragma unroll
  for (int kk = 0; kk < Cfg::D / 16; kk++) {
    const uint32_t off = (kk % 4) * 32;
    const uint64_t da = wgmma_desc_from_lo(a_lo + (((kk / 4) * Cfg::KV_SLAB + off) >> 4));
    const uint64_t db = wgmma_desc_from_lo(b_lo + (((kk / 4) * Cfg::QT_SLAB + off) >> 4));
    wgmma_m64n64k16_bf16_ss<0, 0>(acc, da, db, kk > 0 ? 1 : 0);
  }
}

/* acc (64 keys x D) += A^T-fragments (64 keys x 64 queries, bf16 registers) . tile (64 queries
 * x D, MN-major in shared memory). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_issue_tn(float* acc, const uint32_t* a, uint32_t tile_base) {
  attn_issue_rs_mn<Cfg::D, Cfg::BM, Cfg::QT_SLAB>(acc, a, wgmma_desc_lo_sw128_mn(tile_base, Cfg::QT_SLAB));
}

/* dQ (64 queries x 64 columns) = dS . K: D = 128, all 128 keys of the buffer and the K tile's
 * slab c; D = 64, the warp group's own 64 keys. Both operands MN-major, 64 wide: one swizzle
 * atom across, so the LBO (the next 64 columns) is never used; given as the next slab anyway. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_issue_dq(float* dq, uint32_t ds_base, uint32_t k_base, int c) {
  const uint32_t ds_lo = wgmma_desc_lo_sw128_mn(ds_base, Cfg::DS_BYTES);
  if constexpr (Cfg::D == 128) {
    const uint32_t k_lo = wgmma_desc_lo_sw128_mn(k_base + c * Cfg::KV_SLAB, Cfg::KV_SLAB);
#pragma unroll
    for (int kk = 0; kk < Cfg::BN / 16; kk++) {
      const uint32_t off = (kk * 16 * 128) >> 4;
      wgmma_m64n64k16_bf16_ss<1, 1>(dq, wgmma_desc_from_lo(ds_lo + off), wgmma_desc_from_lo(k_lo + off), kk > 0 ? 1 : 0);
    }
  } else {
    const uint32_t k_lo = wgmma_desc_lo_sw128_mn(k_base, Cfg::KV_SLAB);
#pragma unroll
    for (int kk = 0; kk < 64 / 16; kk++) {
      const uint32_t off = ((c * 64 + kk * 16) * 128) >> 4;
      wgmma_m64n64k16_bf16_ss<1, 1>(dq, wgmma_desc_from_lo(ds_lo + off), wgmma_desc_from_lo(k_lo + off), kk > 0 ? 1 : 0);
    }
  }
}

/* dq_acc rows of query tile qi, columns [col0, col0 + 64), += dQ * scale: each thread's
 * fragment (rows kr0, kr0 + 8; columns 8j + 2 (lane % 4) + {0, 1}) by red.add. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_add_dq_red(const struct mk_attn_bwd_params& p, const float* dq, int b, int h,
                                                    int qi, int col0) {
  const int lane = threadIdx.x & 31, kr0 = 16 * ((threadIdx.x & 127) >> 5) + (lane >> 2);
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int row = qi * Cfg::BM + kr0 + 8 * i;
    if (row >= p.q_rows) continue;
    float* dst = p.dq_acc + (((size_t)b * p.seq_q + p.q_row0 + row) * p.heads + h) * Cfg::D + col0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < 8; j++) red_global_add_v2_f32(dst + 8 * j, dq[4 * j + 2 * i] * p.scale, dq[4 * j + 2 * i + 1] * p.scale);
  }
}

/* The same through shared memory: the warp group's fragments into its two 32-column boxes
 * (128-byte swizzle: 16-byte chunk k of row r at chunk k ^ (r % 8), so a warp's 8-byte stores
 * take the minimum 2 wavefronts), once the warp's last reductions have read them. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_stage_dq(const struct mk_attn_bwd_params& p, const float* dq, uint32_t stage) {
  const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, kr0 = 16 * warp + (lane >> 2);
  if (!Cfg::DQ_BY_PRODUCER) { /* DQ_BY_PRODUCER: the caller waited for dq_free */
    if (lane == 0) cp_async_bulk_wait_group_read_0();
    __syncwarp();
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int r = kr0 + 8 * i;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const uint32_t at = stage + mk_attn_dq_stage_offset(r, j, lane);
      st_shared_v2_f32(at, dq[4 * j + 2 * i] * p.scale, dq[4 * j + 2 * i + 1] * p.scale);
    }
  }
}

/* The staged dQ to the async proxy; each warp's lane 0 adds the warp's 16 rows of both boxes
 * with TMA reductions (rows past the range are skipped by the map), so no warp waits for
 * another. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_reduce_dq(const struct mk_attn_bwd_maps& maps, uint32_t stage, int b, int h,
                                                   int qi, int col0) {
  const int warp = (threadIdx.x & 127) >> 5;
  fence_proxy_async_shared_cta();
  __syncwarp();
  if ((threadIdx.x & 31) == 0) {
    const int row = qi * Cfg::BM + 16 * warp;
    const uint32_t src = stage + 16 * warp * 128; /* 2 KB on: still 1024-aligned for the swizzle */
    cp_reduce_async_bulk_tensor_4d_add(&maps.dq_acc, col0, h, row, b, src);
    cp_reduce_async_bulk_tensor_4d_add(&maps.dq_acc, col0 + 32, h, row, b, src + Cfg::DQ_BOX);
    cp_async_bulk_commit_group();
  }
}

template <class Cfg>
__device__ __forceinline__ void attn_bwd_add_dq_tma(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                    const float* dq, uint32_t stage, int b, int h, int qi, int col0) {
  attn_bwd_stage_dq<Cfg>(p, dq, stage);
  attn_bwd_reduce_dq<Cfg>(maps, stage, b, h, qi, col0);
}

/* A CTA's key tile: tile t of KV block bi, kv head hk, batch b; its valid keys and first key's
 * position; the query tiles that see it (i0 on, per_head per query head) and its steps. */
struct attn_bwd_tile {
  int bi, t, hk, b, group, keys_left, i0, per_head, steps;
  long long key_first;
};

/* Step s of a tile: the query head it reads (the group's heads in turn, each over its query
 * tiles) and the query tile. */
struct attn_bwd_step {
  int h, qi;
};
__device__ __forceinline__ struct attn_bwd_step attn_bwd_step_of(const struct attn_bwd_tile& k, int s) {
  struct attn_bwd_step st;
  st.h = k.hk * k.group + s / k.per_head;
  st.qi = k.i0 + s % k.per_head;
  return st;
}

/* dq_acc rows of step s's query tile += this warp group's dQ * scale, by the configured path
 * (DQ_LATE: only staged; attn_bwd_reduce_dq_step adds it later). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_add_dq_step(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                     const float* dq, uint32_t base, int c,
                                                     const struct attn_bwd_tile& tile, int s) {
  const int col0 = Cfg::D == 128 ? 64 * c : 0;
  const struct attn_bwd_step st = attn_bwd_step_of(tile, s);
  const uint32_t stage = base + Cfg::OFF_DQ + c * 2 * Cfg::DQ_BOX;
  if constexpr (Cfg::DQ_LATE) attn_bwd_stage_dq<Cfg>(p, dq, stage);
  else if constexpr (Cfg::DQ_TMA) attn_bwd_add_dq_tma<Cfg>(maps, p, dq, stage, tile.b, st.h, st.qi, col0);
  else attn_bwd_add_dq_red<Cfg>(p, dq, tile.b, st.h, st.qi, col0);
}

/* DQ_LATE: the reductions of step s's staged dQ. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_reduce_dq_step(const struct mk_attn_bwd_maps& maps, uint32_t base, int c,
                                                        const struct attn_bwd_tile& tile, int s) {
  const struct attn_bwd_step st = attn_bwd_step_of(tile, s);
  attn_bwd_reduce_dq<Cfg>(maps, base + Cfg::OFF_DQ + c * 2 * Cfg::DQ_BOX, tile.b, st.h, st.qi,
                          Cfg::D == 128 ? 64 * c : 0);
}

/* dQ from dS^T buffer `buf` (one commit group), after waiting (when `wait`) for the buffer's
 * ready phase `parity`: both groups' dS^T of its step are in. 0 when the wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_issue_dq_from(float* dq, const struct mk_attn_bwd_smem& sm, uint32_t base,
                                                      uint32_t k_base, int c, int buf, uint32_t parity, int wait,
                                                      const struct mk_attn_wait_ctx& w) {
  if (wait && !attn_wait(&sm.ds_ready[buf], parity, w, MK_ATTN_WAIT_TURN)) return 0;
  wgmma_fence();
  attn_bwd_issue_dq<Cfg>(dq, base + Cfg::OFF_DS + buf * Cfg::DS_BYTES, k_base, c);
  wgmma_commit_group();
  return 1;
}

/* dQ of step `it` once both groups' dS^T of it are in its buffer. 0 when the wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_issue_dq_of(float* dq, const struct mk_attn_bwd_smem& sm, uint32_t base,
                                                    uint32_t k_base, int c, int it, const struct mk_attn_wait_ctx& w) {
  return attn_bwd_issue_dq_from<Cfg>(dq, sm, base, k_base, c, it % Cfg::DS_BUFS, (uint32_t)(it / Cfg::DS_BUFS) & 1, 1,
                                     w);
}

/* The end of a step's products (all waited for): their register operands and accumulators
 * released to the compiler, the step's Q/dO stage to the producer. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_step_done(const struct mk_attn_bwd_smem& sm, float* dv, float* dk,
                                                   uint32_t* pb, uint32_t* dsb, int stage) {
  wgmma_fence_operands<Cfg::D / 2>(dv);
  wgmma_fence_operands<Cfg::D / 2>(dk);
  wgmma_fence_operands_u32<16>(pb);
  wgmma_fence_operands_u32<16>(dsb);
  if (!Cfg::DQ_BY_PRODUCER && (threadIdx.x & 31) == 0) mbarrier_arrive(&sm.empty[stage]);
}

template <class Cfg>
__device__ __forceinline__ struct attn_bwd_tile attn_bwd_tile_of(const struct mk_attn_bwd_params& p) {
  struct attn_bwd_tile k;
  const int c = (int)((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
  const struct mk_attn_work cw = mk_attn_bwd_cta_work(c, (int)gridDim.x, (int)gridDim.y, (int)gridDim.z, p.order);
  k.bi = 0;
  while (k.bi + 1 < p.num_kv_blocks && cw.tile >= p.kv[k.bi + 1].tile0) k.bi++;
  const struct mk_attn_bwd_block_params& blk = p.kv[k.bi];
  k.t = cw.tile - blk.tile0;
  k.hk = cw.head, k.b = cw.batch, k.group = p.heads / p.kv_heads;
  k.keys_left = blk.rows - k.t * Cfg::BN; /* valid keys of the tile (up to BN) */
  k.key_first = blk.pos0 + (long long)k.t * Cfg::BN;
  const int nqt = (p.q_rows + Cfg::BM - 1) / Cfg::BM;
  k.i0 = mk_attn_bwd_first_q_tile(p.q_pos0, k.key_first, Cfg::BM, p.causal);
  if (k.i0 > nqt) k.i0 = nqt;
  k.per_head = nqt - k.i0, k.steps = k.group * k.per_head;
  return k;
}

/* DQ_BY_PRODUCER, the producer's lane 0: both consumer groups' staged dQ of step s added into
 * dq_acc (64-row boxes; D = 64: both groups' over the same columns). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_produce_dq(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_smem& sm,
                                                    const struct attn_bwd_tile& k, int s) {
  const struct attn_bwd_step st = attn_bwd_step_of(k, s);
  const uint32_t staging = smem_addr(sm.base) + Cfg::OFF_DQ;
#pragma unroll
  for (int c = 0; c < Cfg::CONSUMERS; c++) {
    const int col0 = Cfg::D == 128 ? 64 * c : 0;
    const uint32_t src = staging + c * 2 * Cfg::DQ_BOX;
    cp_reduce_async_bulk_tensor_4d_add(&maps.dq_acc, col0, st.h, st.qi * Cfg::BM, k.b, src);
    cp_reduce_async_bulk_tensor_4d_add(&maps.dq_acc, col0 + 32, st.h, st.qi * Cfg::BM, k.b, src + Cfg::DQ_BOX);
  }
  cp_async_bulk_commit_group();
}

/* ... once they have read the staging (the stage's loads issued meanwhile): dq_free. */
__device__ __forceinline__ void attn_bwd_produce_dq_read(const struct mk_attn_bwd_smem& sm) {
  cp_async_bulk_wait_group_read_0();
  mbarrier_arrive(sm.dq_free);
}

/* The producer warp: the K and V tiles once (lane 0), then per step the Q and dO tiles (lane
 * 0) with the step's lse (times log2 e; +inf past the range or with no key, so P is 0) and
 * delta stored beside them by every lane. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_produce(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                 const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& k,
                                                 const struct mk_attn_wait_ctx& w) {
  struct mk_attn_ring ring = {0, 0};
  const int lane = threadIdx.x;
  if (lane == 0) {
    prefetch_tensormap(&maps.q);
    prefetch_tensormap(&maps.dout);
    mbarrier_arrive_expect_tx(sm.kv_full, 2 * Cfg::KV_BYTES);
#pragma unroll
    for (int j = 0; j < Cfg::SLABS; j++) {
      cp_async_bulk_tensor_4d_load(sm.base + Cfg::OFF_K + j * Cfg::KV_SLAB, &maps.k[k.bi], j * 64, k.hk, k.t * Cfg::BN,
                                   k.b, sm.kv_full);
      cp_async_bulk_tensor_4d_load(sm.base + Cfg::OFF_V + j * Cfg::KV_SLAB, &maps.v[k.bi], j * 64, k.hk, k.t * Cfg::BN,
                                   k.b, sm.kv_full);
    }
  }
  float* lse_s = (float*)(sm.base + Cfg::OFF_LSE);
  float* delta_s = (float*)(sm.base + Cfg::OFF_DELTA);
  for (int it = 0; it < k.steps; it++) {
    const struct attn_bwd_step st = attn_bwd_step_of(k, it);
    const int qi = st.qi, h = st.h;
    if (!attn_wait(&sm.empty[ring.stage], ring.phase ^ 1, w, MK_ATTN_WAIT_EMPTY)) return;
    if (Cfg::DQ_BY_PRODUCER && lane == 0 && it >= Cfg::STAGES) attn_bwd_produce_dq<Cfg>(maps, sm, k, it - Cfg::STAGES);
    const size_t lrow = ((size_t)k.b * p.heads + h) * p.seq_q + p.q_row0;
#pragma unroll
    for (int rr = 0; rr < Cfg::BM / 32; rr++) {
      const int r = lane + 32 * rr, row = qi * Cfg::BM + r;
      float l = INFINITY, dl = 0.f;
      if (row < p.q_rows) {
        l = p.lse[lrow + row];
        l = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
        dl = p.delta[lrow + row];
      }
      lse_s[ring.stage * Cfg::BM + r] = l;
      delta_s[ring.stage * Cfg::BM + r] = dl;
    }
    uint64_t* full = &sm.full[ring.stage];
    if (lane == 0) {
      mbarrier_arrive_expect_tx(full, 2 * Cfg::QT_BYTES);
      uint8_t* qd = sm.base + Cfg::OFF_Q + ring.stage * Cfg::QT_BYTES;
      uint8_t* dd = sm.base + Cfg::OFF_DO + ring.stage * Cfg::QT_BYTES;
#pragma unroll
      for (int j = 0; j < Cfg::SLABS; j++) {
        cp_async_bulk_tensor_4d_load(qd + j * Cfg::QT_SLAB, &maps.q, j * 64, h, qi * Cfg::BM, k.b, full);
        cp_async_bulk_tensor_4d_load(dd + j * Cfg::QT_SLAB, &maps.dout, j * 64, h, qi * Cfg::BM, k.b, full);
      }
    } else {
      mbarrier_arrive(full);
    }
    if (Cfg::DQ_BY_PRODUCER && lane == 0 && it >= Cfg::STAGES) attn_bwd_produce_dq_read(sm);
    attn_ring_next(&ring, Cfg::STAGES);
  }
  /* DQ_BY_PRODUCER: the last steps' dQ, as each of their stages is released */
  for (int it = k.steps; Cfg::DQ_BY_PRODUCER && it < k.steps + Cfg::STAGES; it++) {
    if (it >= Cfg::STAGES) {
      if (!attn_wait(&sm.empty[ring.stage], ring.phase ^ 1, w, MK_ATTN_WAIT_EMPTY)) return;
      if (lane == 0) {
        attn_bwd_produce_dq<Cfg>(maps, sm, k, it - Cfg::STAGES);
        attn_bwd_produce_dq_read(sm);
      }
    }
    attn_ring_next(&ring, Cfg::STAGES);
  }
}

/* A step's P^T and dS^T as bf16 A fragments (pb, dsb) from its S^T and dP^T products (two
 * commit groups in flight): waits for S^T, masks (keys past the block; causal, queries before
 * the key: -inf), P^T = exp2(S^T scale log2 e - lse), waits for dP^T, dS^T = P^T (dP^T - delta).
 * lse and delta come from the step's stage (lse_a, delta_a), loaded before each wait. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_p_ds(const struct mk_attn_bwd_params& p, float* s, float* dp, uint32_t* pb,
                                              uint32_t* dsb, uint32_t lse_a, uint32_t delta_a, long long q_first,
                                              const struct attn_bwd_tile& k, int c, int kr0) {
  const int lane = threadIdx.x & 31;
  /* the step's lse while S^T is computed (loaded after the wait, each exp waited for it) */
  float2 lse_r[8];
#pragma unroll
  for (int j = 0; j < 8; j++) lse_r[j] = ld_shared_v2_f32(lse_a + (8 * j + 2 * (lane & 3)) * 4);
  wgmma_wait_group<1>();
  wgmma_fence_operands<32>(s);

  /* P^T: masked entries (keys past the block; causal, queries before the key) -inf */
  if (mk_attn_bwd_tile_masked(q_first, k.key_first, k.keys_left, Cfg::BN, p.causal)) {
    int fv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int kidx = c * 64 + kr0 + 8 * i; /* within the tile */
      int v = 0;
      if (kidx >= k.keys_left) v = Cfg::BM;
      else if (p.causal) {
        long long d = k.key_first + kidx - q_first;
        v = d < 0 ? 0 : d > Cfg::BM ? Cfg::BM : (int)d;
      }
      fv[i] = v;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int col = 8 * j + 2 * (lane & 3) + e;
        if (col < fv[0]) s[4 * j + e] = -INFINITY;
        if (col < fv[1]) s[4 * j + 2 + e] = -INFINITY;
      }
  }
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const float2 l = lse_r[j];
    s[4 * j] = attn_ex2(fmaf(s[4 * j], p.scale_log2, -l.x));
    s[4 * j + 1] = attn_ex2(fmaf(s[4 * j + 1], p.scale_log2, -l.y));
    s[4 * j + 2] = attn_ex2(fmaf(s[4 * j + 2], p.scale_log2, -l.x));
    s[4 * j + 3] = attn_ex2(fmaf(s[4 * j + 3], p.scale_log2, -l.y));
  }
  float2 delta_r[8]; /* likewise while dP^T finishes */
#pragma unroll
  for (int j = 0; j < 8; j++) delta_r[j] = ld_shared_v2_f32(delta_a + (8 * j + 2 * (lane & 3)) * 4);
  wgmma_wait_group<0>(); /* dP^T */
  wgmma_fence_operands<32>(dp);

  /* dS^T = P^T (dP^T - delta) from the fp32 P^T (a bf16 P here doubled the error of dq and
   * dk at rows with few visible keys: measured on an H200, one element of 131072 at 1.4x
   * the bound), then both to bf16 A fragments, element by element so that S^T's and dP^T's
   * registers free up as the packed ones fill; dS^T also to the buffer */
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const float2 dl = delta_r[j];
    dsb[2 * j] = pack_bf16x2(s[4 * j] * (dp[4 * j] - dl.x), s[4 * j + 1] * (dp[4 * j + 1] - dl.y));
    dsb[2 * j + 1] = pack_bf16x2(s[4 * j + 2] * (dp[4 * j + 2] - dl.x), s[4 * j + 3] * (dp[4 * j + 3] - dl.y));
    pb[2 * j] = pack_bf16x2(s[4 * j], s[4 * j + 1]);
    pb[2 * j + 1] = pack_bf16x2(s[4 * j + 2], s[4 * j + 3]);
  }
}

/* The tile's dK (times scale) and dV rows, this thread's fragments (keys kr0, kr0 + 8 of warp
 * group c's 64), into the block's bf16 outputs and / or fp32 accumulators. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_write_dkdv(const struct mk_attn_bwd_params& p, const struct attn_bwd_tile& k,
                                                    const float* dk, const float* dv, int c, int kr0) {
  const int lane = threadIdx.x & 31;
  const struct mk_attn_bwd_block_params& blk = p.kv[k.bi];
  /* The accumulators may be read by a peer (the ring's reduce); once the ring's gather gave up
   * on a wait (the peer may be late, still reading them for its previous call) nothing goes
   * there. A device word: the error record is host-mapped, a read per thread crossed PCIe. */
  const bool acc_on = !(p.acc_gate && (*(volatile const uint64_t*)p.acc_gate & MK_ATTN_ACC_GATE_CLOSED));
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int kidx = c * 64 + kr0 + 8 * i;
    if (kidx >= k.keys_left) continue;
    const size_t off =
        (((size_t)k.b * blk.seq + blk.row0 + k.t * Cfg::BN + kidx) * p.kv_heads + k.hk) * Cfg::D + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < Cfg::D / 8; j++) {
      const float k0 = dk[4 * j + 2 * i] * p.scale, k1 = dk[4 * j + 2 * i + 1] * p.scale;
      const float v0 = dv[4 * j + 2 * i], v1 = dv[4 * j + 2 * i + 1];
      const size_t o = off + 8 * j;
      if (blk.dk) *(uint32_t*)(blk.dk + o) = pack_bf16x2(k0, k1);
      if (blk.dv) *(uint32_t*)(blk.dv + o) = pack_bf16x2(v0, v1);
      /* the accumulators may be a peer's memory (the ring): overwriting reads nothing */
      if (blk.dk_acc && acc_on) {
        float2* a = (float2*)(blk.dk_acc + o);
        float2 x = make_float2(0.f, 0.f);
        if (!blk.acc_overwrite) x = *a;
        x.x += k0, x.y += k1;
        *a = x;
      }
      if (blk.dv_acc && acc_on) {
        float2* a = (float2*)(blk.dv_acc + o);
        float2 x = make_float2(0.f, 0.f);
        if (!blk.acc_overwrite) x = *a;
        x.x += v0, x.y += v1;
        *a = x;
      }
    }
  }
}

/* What a consumer warp group's step functions share: shared-memory addresses and its place. */
struct attn_bwd_ctx {
  uint32_t base, k_base; /* the CTA's shared memory; its K tile */
  int c, kr0;            /* the warp group; the thread's first key row in its 64 */
};

/* A step's dV += P^T dO and dK += dS^T Q, then its dQ = dS K once both groups' dS^T are in;
 * one wait for all three, the Q/dO stage released, dQ added into dq_acc. 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_products(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                 const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& tile,
                                                 const struct attn_bwd_ctx& x, int it, int stage, uint32_t q_base,
                                                 uint32_t do_base, float* dv, float* dk, uint32_t* pb, uint32_t* dsb,
                                                 const struct mk_attn_wait_ctx& w) {
  float dq[32];
  wgmma_fence();
  attn_bwd_issue_tn<Cfg>(dv, pb, do_base);
  attn_bwd_issue_tn<Cfg>(dk, dsb, q_base);
  wgmma_commit_group();
  if (!attn_bwd_issue_dq_of<Cfg>(dq, sm, x.base, x.k_base, x.c, it, w)) return 0;
  wgmma_wait_group<0>();
  wgmma_fence_operands<32>(dq);
  attn_bwd_step_done<Cfg>(sm, dv, dk, pb, dsb, stage);
  /* DQ_BY_PRODUCER: the producer's reductions of the last step's dQ have read the staging */
  if (Cfg::DQ_BY_PRODUCER && it > 0 && !attn_wait(sm.dq_free, (uint32_t)(it - 1) & 1, w, MK_ATTN_WAIT_TURN))
    return 0;
  /* dq_acc rows += dQ * scale */
  attn_bwd_add_dq_step<Cfg>(maps, p, dq, x.base, x.c, tile, it);
  return 1;
}

/* DEFER_DQ: the previous step's dQ (its dS^T in long ago), then this step's dV and dK; dQ is
 * staged while they run. 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_products_deferred(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                          const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& tile,
                                                          const struct attn_bwd_ctx& x, int it, int stage, uint32_t q_base,
                                                          uint32_t do_base, float* dv, float* dk, uint32_t* pb, uint32_t* dsb,
                                                          const struct mk_attn_wait_ctx& w) {
  const int lane = threadIdx.x & 31;
  float dq[32];
  /* issued in every step (wgmmas under a condition made ptxas spill 272 bytes): in the first
   * it reads an unwritten buffer and nothing is staged */
  if (!attn_bwd_issue_dq_from<Cfg>(dq, sm, x.base, x.k_base, x.c, (it + Cfg::DS_BUFS - 1) % Cfg::DS_BUFS,
                                   (uint32_t)((it - 1) / Cfg::DS_BUFS) & 1, it > 0, w))
    return 0;
  attn_bwd_issue_tn<Cfg>(dv, pb, do_base);
  attn_bwd_issue_tn<Cfg>(dk, dsb, q_base);
  wgmma_commit_group();
  if (x.c == 0 && it == 0 && lane == 0) mbarrier_arrive(sm.stagger);
  wgmma_wait_group<1>();
  wgmma_fence_operands<32>(dq);
  if (it > 0) {
    if (lane == 0) mbarrier_arrive(&sm.ds_free[(it - 1) % Cfg::DS_BUFS]);
    attn_bwd_add_dq_step<Cfg>(maps, p, dq, x.base, x.c, tile, it - 1);
  }
  wgmma_wait_group<0>();
  attn_bwd_step_done<Cfg>(sm, dv, dk, pb, dsb, stage);
  return 1;
}

/* dS^T (this thread's bf16 fragments) into its buffer for the dQ product, then this thread's
 * arrival on the buffer's ready barrier (all 256 consumer threads). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_store_ds(const struct mk_attn_bwd_smem& sm, const uint32_t* dsb,
                                                  uint32_t ds_base, int buf, int c, int kr0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const int col = 8 * j + 2 * (lane & 3), row = c * 64 + kr0;
    st_shared_b32(ds_base + stage_offset_in(row, col, 0), dsb[2 * j]);
    st_shared_b32(ds_base + stage_offset_in(row + 8, col, 0), dsb[2 * j + 1]);
  }
  fence_proxy_async_shared_cta();
  mbarrier_arrive(&sm.ds_ready[buf]);
}

/* DQ_BY_PRODUCER: this warp's staged dQ to the async proxy, then the stage of its step released
 * to the producer (one arrival per consumer warp), which adds the dQ into dq_acc. */
__device__ __forceinline__ void attn_bwd_release_staged(const struct mk_attn_bwd_smem& sm, int stage) {
  fence_proxy_async_shared_cta();
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbarrier_arrive(&sm.empty[stage]);
}

/* The warp's dQ reductions have read their staging: before the CTA's shared memory goes away,
 * on every exit of a consumer (one that gave up on a wait too: a reduction still reading freed
 * shared memory would add garbage to dq_acc). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_drain_dq() {
  if (Cfg::DQ_TMA && (threadIdx.x & 31) == 0) cp_async_bulk_wait_group_0();
}

/* Consumer warp group c: per step S^T and dP^T, P^T and dS^T, dV += P^T dO, dK += dS^T Q and
 * dQ = dS K (added into dq_acc), then the tile's dK and dV. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_consume(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                 const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& tile,
                                                 int c, const struct mk_attn_wait_ctx& w) {
  const int steps = tile.steps;
  struct mk_attn_ring ring = {0, 0};
  const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
  const int kr0 = 16 * warp + (lane >> 2); /* the thread's first key row in the group's 64 */
  float dv[Cfg::D / 2], dk[Cfg::D / 2];
#pragma unroll
  for (int i = 0; i < Cfg::D / 2; i++) dv[i] = dk[i] = 0.f;
  const uint32_t base = smem_addr(sm.base);
  const uint32_t k_base = base + Cfg::OFF_K, v_base = base + Cfg::OFF_V;
  const uint32_t k_wg = k_base + c * 64 * 128, v_wg = v_base + c * 64 * 128;
  if (steps > 0 && !attn_wait(sm.kv_full, 0, w, MK_ATTN_WAIT_K)) return attn_bwd_drain_dq<Cfg>();

  for (int it = 0; it < steps; it++) {
    const int qi = attn_bwd_step_of(tile, it).qi;
    const long long q_first = p.q_pos0 + (long long)qi * Cfg::BM;
    const uint32_t q_base = base + Cfg::OFF_Q + ring.stage * Cfg::QT_BYTES;
    const uint32_t do_base = base + Cfg::OFF_DO + ring.stage * Cfg::QT_BYTES;
    const uint32_t lse_a = base + Cfg::OFF_LSE + ring.stage * Cfg::BM * 4;
    const uint32_t delta_a = base + Cfg::OFF_DELTA + ring.stage * Cfg::BM * 4;
    const int buf = it % Cfg::DS_BUFS;
    const uint32_t ds_base = base + Cfg::OFF_DS + buf * Cfg::DS_BYTES;
    float s[32], dp[32];
    uint32_t pb[16], dsb[16];

    if (Cfg::DEFER_DQ && c == 1 && it == 0 && !attn_wait(sm.stagger, 0, w, MK_ATTN_WAIT_TURN))
      return attn_bwd_drain_dq<Cfg>();
    if (!attn_wait(&sm.full[ring.stage], ring.phase, w, MK_ATTN_WAIT_Q)) return attn_bwd_drain_dq<Cfg>();
    if (Cfg::DQ_LATE == 2 && it > 0) attn_bwd_reduce_dq_step<Cfg>(maps, base, c, tile, it - 1);
    if (Cfg::DQ_BY_PRODUCER && it > 0) attn_bwd_release_staged(sm, (ring.stage + Cfg::STAGES - 1) % Cfg::STAGES);
    wgmma_fence();
    attn_bwd_issue_nt<Cfg>(s, k_wg, q_base);
    wgmma_commit_group();
    attn_bwd_issue_nt<Cfg>(dp, v_wg, do_base);
    wgmma_commit_group();
    if (Cfg::DQ_LATE == 1 && it > 0) attn_bwd_reduce_dq_step<Cfg>(maps, base, c, tile, it - 1);
    attn_bwd_p_ds<Cfg>(p, s, dp, pb, dsb, lse_a, delta_a, q_first, tile, c, kr0);
    /* DEFER_DQ: both groups' dQ of this buffer's last step are done */
    if (Cfg::DEFER_DQ && it >= Cfg::DS_BUFS &&
        !attn_wait(&sm.ds_free[buf], (uint32_t)(it / Cfg::DS_BUFS - 1) & 1, w, MK_ATTN_WAIT_TURN))
      return attn_bwd_drain_dq<Cfg>();
    attn_bwd_store_ds<Cfg>(sm, dsb, ds_base, buf, c, kr0);
    const struct attn_bwd_ctx x = {base, k_base, c, kr0};
    const int ok = Cfg::DEFER_DQ ? attn_bwd_products_deferred<Cfg>(maps, p, sm, tile, x, it, ring.stage, q_base,
                                                                   do_base, dv, dk, pb, dsb, w)
                                 : attn_bwd_products<Cfg>(maps, p, sm, tile, x, it, ring.stage, q_base, do_base, dv,
                                                          dk, pb, dsb, w);
    if (!ok) return attn_bwd_drain_dq<Cfg>();
    attn_ring_next(&ring, Cfg::STAGES);
  }

  /* DQ_LATE: the last step's reductions */
  if ((Cfg::DQ_LATE == 1 || Cfg::DQ_LATE == 2) && steps > 0) attn_bwd_reduce_dq_step<Cfg>(maps, base, c, tile, steps - 1);
  if (Cfg::DQ_BY_PRODUCER && steps > 0) attn_bwd_release_staged(sm, (ring.stage + Cfg::STAGES - 1) % Cfg::STAGES);

  /* DEFER_DQ: the last step's dQ */
  if (Cfg::DEFER_DQ && steps > 0) {
    float dq[32];
    if (!attn_bwd_issue_dq_of<Cfg>(dq, sm, base, k_base, c, steps - 1, w)) return attn_bwd_drain_dq<Cfg>();
    wgmma_wait_group<0>();
    wgmma_fence_operands<32>(dq);
    attn_bwd_add_dq_step<Cfg>(maps, p, dq, base, c, tile, steps - 1);
  }

  attn_bwd_drain_dq<Cfg>();

  attn_bwd_write_dkdv<Cfg>(p, tile, dk, dv, c, kr0);
}

/* grid (key tiles of all blocks, kv heads, batch). */
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
mk_attn_bwd_kernel(const __grid_constant__ struct mk_attn_bwd_maps maps,
                   const __grid_constant__ struct mk_attn_bwd_params p) {
  extern __shared__ uint8_t smem_raw[];
  const struct mk_attn_bwd_smem sm = attn_bwd_smem_carve<Cfg>(smem_raw);
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    mbarrier_init(sm.kv_full, 1);
    for (int i = 0; i < Cfg::STAGES; i++) {
      mbarrier_init(&sm.full[i], 32);
      mbarrier_init(&sm.empty[i], Cfg::CONSUMERS * 4);
    }
    for (int i = 0; i < Cfg::DS_BUFS; i++) mbarrier_init(&sm.ds_ready[i], Cfg::CONSUMERS * 128);
    if (Cfg::DQ_BY_PRODUCER) mbarrier_init(sm.dq_free, 1);
    if (Cfg::DEFER_DQ) {
      for (int i = 0; i < Cfg::DS_BUFS; i++) mbarrier_init(&sm.ds_free[i], Cfg::CONSUMERS * 4);
      mbarrier_init(sm.stagger, 4);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  const struct attn_bwd_tile tile = attn_bwd_tile_of<Cfg>(p);
  struct mk_attn_wait_ctx w;
  w.err = p.err;
  w.err_tag = 0;
  w.tile = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  w.timeout_ns = p.timeout_ns;

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x >= 32 || tile.steps == 0) return;
    attn_bwd_produce<Cfg>(maps, p, sm, tile, w);
  } else {
    setmaxnreg_inc<232>();
    attn_bwd_consume<Cfg>(maps, p, sm, tile, wg - 1, w);
  }
}

/* delta[b, h, q_row0 + r] = sum_d dout * out (unless delta_ready), dq_acc's row zeroed (unless
 * dq_accumulate): one warp per (row r of the range, head, batch); grid-stride. */
template <int D>
__global__ void mk_attn_bwd_prep_kernel(const __nv_bfloat16* out, const __nv_bfloat16* dout, float* delta,
                                        float* dq_acc, int batch, int seq_q, int heads, int q_row0, int q_rows,
                                        int do_delta, int zero_dq) {
  const int lane = threadIdx.x & 31;
  const size_t rows = (size_t)batch * q_rows * heads;
  for (size_t e = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; e < rows;
       e += (size_t)gridDim.x * blockDim.x / 32) {
    const int h = (int)(e % heads), r = (int)(e / heads % q_rows), b = (int)(e / heads / q_rows);
    const size_t at = (((size_t)b * seq_q + q_row0 + r) * heads + h) * D;
    if (do_delta) {
      float acc = 0.f;
      for (int d = 2 * lane; d < D; d += 64) {
        const __nv_bfloat162 o = *(const __nv_bfloat162*)(out + at + d);
        const __nv_bfloat162 g = *(const __nv_bfloat162*)(dout + at + d);
        acc += __bfloat162float(o.x) * __bfloat162float(g.x) + __bfloat162float(o.y) * __bfloat162float(g.y);
      }
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
      if (lane == 0) delta[((size_t)b * heads + h) * seq_q + q_row0 + r] = acc;
    }
    if (zero_dq)
      for (int d = 4 * lane; d < D; d += 128) *(float4*)(dq_acc + at + d) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

/* dq = bf16(dq_acc) over the rows of the range, 4 elements per thread step. */
template <int D>
__global__ void mk_attn_bwd_dq_kernel(const float* dq_acc, __nv_bfloat16* dq, int batch, int seq_q, int heads,
                                      int q_row0, int q_rows) {
  const size_t per_batch = (size_t)q_rows * heads * D / 4, n = (size_t)batch * per_batch;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const size_t b = e / per_batch, in = e % per_batch;
    const size_t at = ((size_t)b * seq_q + q_row0) * heads * D + 4 * in;
    const float4 x = *(const float4*)(dq_acc + at);
    uint2 y;
    y.x = pack_bf16x2(x.x, x.y);
    y.y = pack_bf16x2(x.z, x.w);
    *(uint2*)(dq + at) = y;
  }
}

#endif /* MK_ATTN_BWD_CUH_ */
