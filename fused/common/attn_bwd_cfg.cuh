/*
 * The backward attention core's configurations, shared-memory layout, kernel parameters and
 * work split (attn_bwd.cuh has the kernels, attn_bwd_dq.cuh the ways dQ reaches dq_acc).
 */
#ifndef MK_ATTN_BWD_CFG_CUH_
#define MK_ATTN_BWD_CFG_CUH_

#include "attn_bwd_passes.cuh"
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
 * and hands the staging back (dq_free) once its reductions have read it.
 * PAIR_DQ (D = 128, DQ_TMA, neither DEFER_DQ nor DQ_LATE): the steps go in pairs; after both
 * steps' S^T, dP^T, dV and dK, warp group g computes the whole dQ (64 queries x 128 columns,
 * m64n128 over the 128 keys) of the pair's step g, stages it (four boxes) and adds it with TMA
 * reductions; both groups run the same instructions (only addresses depend on g), so no wgmma
 * sits in a divergent path (ptxas C7518). An odd step count gets a dummy last step whose
 * query rows lie past the range (lse +inf: P and dS are 0; its reductions are clipped by the
 * map). Before a pair rewrites dS^T buffer g, group g's dQ of it is done (ds_free[g]). */
template <int D_, int STAGES_, int DQ_TMA_ = 0, int DEFER_DQ_ = 0, int DQ_LATE_ = 0, int PAIR_DQ_ = 0>
struct mk_attn_bwd_cfg {
  static constexpr int D = D_, BM = MK_ATTN_BWD_BLOCK_M, BN = MK_ATTN_BWD_BLOCK_N, STAGES = STAGES_;
  static constexpr int DQ_TMA = DQ_TMA_, DEFER_DQ = DEFER_DQ_, DS_BUFS = DEFER_DQ_ ? 3 : 2, DQ_LATE = DQ_LATE_;
  static constexpr int PAIR_DQ = PAIR_DQ_, DQ_BOXES = PAIR_DQ_ ? 4 : 2; /* staged boxes per group */
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
  static constexpr int DQ_BYTES = DQ_TMA ? CONSUMERS * DQ_BOXES * DQ_BOX : 0;
  static constexpr int OFF_LSE = OFF_DQ + DQ_BYTES; /* STAGES x BM fp32 */
  static constexpr int OFF_DELTA = OFF_LSE + STAGES * BM * 4;
  static constexpr int OFF_BAR = OFF_DELTA + STAGES * BM * 4;
  static constexpr int SMEM_USED = OFF_BAR + (1 + 2 * STAGES + 2 * DS_BUFS + 2) * 8;
  static constexpr int SMEM_BYTES = SMEM_USED + 1024;
  static_assert(D == 64 || D == 128, "head dimensions 64 and 128");
  static_assert(BM == 64 && BN == 64 * CONSUMERS, "64 keys per consumer, 64-query steps");
  static_assert(!DEFER_DQ || DQ_TMA, "the deferred dQ goes through the TMA path");
  static_assert(!DQ_LATE || (DQ_TMA && !DEFER_DQ), "the late dQ reductions: the TMA path, not deferred");
  static_assert(!PAIR_DQ || (D == 128 && DQ_TMA && !DEFER_DQ && !DQ_LATE), "the pairs' dQ: D = 128, TMA, its own step");
  static_assert(OFF_DQ % 1024 == 0, "the dQ staging's swizzle needs 1024-byte alignment");
  static_assert(SMEM_BYTES <= 232448, "over the 227 KB of dynamic shared memory per block");
};

struct mk_attn_bwd_smem {
  uint8_t* base;      /* 1024-aligned */
  uint64_t* kv_full;  /* 1: K and V */
  uint64_t* full;     /* STAGES: Q, dO (TMA bytes) + lse, delta (32 producer lanes) */
  uint64_t* empty;    /* STAGES: one arrival per consumer warp */
  uint64_t* ds_ready; /* DS_BUFS: dS^T buffer b written by all 256 consumer threads */
  uint64_t* ds_free;  /* DS_BUFS: DEFER_DQ one arrival per consumer warp once its dQ of b is done;
                       * PAIR_DQ one per warp of the group that reads b */
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
  float *dk_red, *dv_red; /* split: where the CTAs add their heads' partials (dk_acc or dkv_ws), */
  int red_seq, red_row0;  /* as [batch, red_seq, kv_heads, D] from row red_row0 */
  int seq;
  const uint64_t* ready_flags; /* mk_attn_bwd_kv_block's */
  int ready_chunk_rows, ready_chunks; /* chunks per batch */
  uint64_t* announce; /* mk_attn_bwd_kv_block's (the ring call's one launch) */
  int ctas;           /* the block's main CTAs: its key tiles x grid_heads x batch */
  int split_tiles;    /* two pieces (the ring's kernels): tiles from this one on at pos1; else INT_MAX */
  long long pos1;
};

/* Split, a block whose partials meet in dkv_ws (not added straight into its accumulators):
 * its write-out's view (attn_bwd_passes.cuh), for its own kernel and the one-launch end part. */
__host__ __device__ __forceinline__ int attn_bwd_block_in_ws(const struct mk_attn_bwd_block_params& b) {
  return b.dk_red != b.dk_acc;
}
__host__ __device__ __forceinline__ struct mk_attn_bwd_ws_block attn_bwd_ws_block_of(
    const struct mk_attn_bwd_block_params& b) {
  const struct mk_attn_bwd_ws_block w = {b.dk_red, b.dv_red,         b.dk,  b.dv,   b.dk_acc,
                                         b.dv_acc, b.acc_overwrite, b.seq, b.row0, b.rows};
  return w;
}

struct mk_attn_bwd_params {
  int seq_q, heads, kv_heads, causal;
  int chunk; /* mk_attn_bwd_cta_work's */
  int split; /* 1: a CTA per query head (grid y = heads), its dK, dV added into dk_red, dv_red */
  int q_row0, q_rows;
  long long q_pos0;
  int q_tiles0; /* two pieces (the ring's kernels): query tiles from this one on at q_pos1; else INT_MAX */
  long long q_pos1;
  int num_kv_blocks;
  struct mk_attn_bwd_block_params kv[MK_ATTN_MAX_KV_BLOCKS];
  const float* lse;
  const float* delta;
  float* dq_acc;
  float scale, scale_log2;
  const uint64_t* acc_gate; /* mk_attn_bwd_args.acc_gate */
  struct mk_gemm_error* err;
  uint32_t err_tag; /* mk_attn_bwd_args's */
  uint64_t timeout_ns;
  /* a one-launch part's wait for the one before (attn_bwd_phase.cuh): longer than the longest
   * chain of bounded waits inside that part (the addends' and the push's peers are waited for
   * one after another), so that those, the cause, expire first */
  uint64_t part_timeout_ns;
  const uint64_t* ready_done; /* mk_attn_bwd_args's */
  struct mk_attn_bwd_addends addends; /* mk_attn_bwd_args's */
  int grid_tiles, grid_heads, batch; /* the main part's CTAs: (key tiles, kv heads or heads, batch) */
  /* the one-launch call (attn_bwd_phase.cuh; phase NULL: the kernel is the main part only):
   * its words, its parts' CTAs (start: delta, dq_acc, dkv_ws zeroed; end: dq, split's
   * write-out) and what they read and write */
  uint64_t* phase;
  int n_start, n_main, n_end;
  struct mk_attn_bwd_rows pass;
  /* the ring's call in the launch (mk_attn_bwd_args's; the kernel's RING phase): push.ctas
   * CTAs before the start part, the blocks' announcements, the call's end */
  struct mk_kv_push push;
  uint64_t* call_done;
  /* the ring's call with split heads (attn.h dkv_ws beside the ring's parts): per (key tile of
   * the grid, kv head, batch) the consumer warp groups whose partials are in the workspace; the
   * last writes the tile's outputs (attn_bwd.cuh attn_bwd_group_write_out); NULL otherwise */
  uint32_t* group_counts;
  struct mk_trace_buf* trace; /* mk_attn_bwd_args's (the RING kernel's events: attn_bwd_trace.cuh) */
};

struct mk_attn_bwd_maps {
  CUtensorMap q, dout; /* rows [q_row0, q_row0 + q_rows), box BM rows */
  CUtensorMap dq_acc;  /* fp32, the same rows, box 32 columns x 16 rows (a warp's; DQ_TMA) */
  CUtensorMap k[MK_ATTN_MAX_KV_BLOCKS], v[MK_ATTN_MAX_KV_BLOCKS]; /* the block's rows, box BN */
};

/* CTA c's key tile (of a grid of grid_x key tiles, grid_y heads, grid_z batches): tile t of
 * KV block bi, kv head hk, batch b; its valid keys and first key's position; its query heads (h0 on: the kv head's group, or one head when split); the query
 * tiles that see the key tile (i0 on, per_head per query head, from the rot-th on: non-causal
 * at D = 128, CTAs of neighbouring key tiles start apart, so that they do not all add into one
 * dq_acc tile at once) and its steps. */
struct attn_bwd_tile {
  int bi, t, hk, b, h0, keys_left, i0, per_head, rot, steps;
  long long key_first;
};

/* Step s of a tile: the query head it reads (its heads in turn, each over its query tiles) and
 * the query tile. */
struct attn_bwd_step {
  int h, qi;
};

__device__ __forceinline__ struct attn_bwd_step attn_bwd_step_of(const struct attn_bwd_tile& k, int s) {
  struct attn_bwd_step st;
  st.h = k.h0 + s / k.per_head;
  const int j = s % k.per_head + k.rot;
  st.qi = k.i0 + (j < k.per_head ? j : j - k.per_head);
  return st;
}

/* PAIR_DQ: step s, or past the last (an odd count's dummy) a step whose query rows all lie past
 * the range: the first head, the query tile after the last. */
template <class Cfg>
__device__ __forceinline__ struct attn_bwd_step attn_bwd_step_or_dummy(const struct attn_bwd_tile& k, int q_rows, int s) {
  if (s < k.steps) return attn_bwd_step_of(k, s);
  struct attn_bwd_step st;
  st.h = k.h0, st.qi = (q_rows + Cfg::BM - 1) / Cfg::BM;
  return st;
}

/* The steps the CTA's loops run: PAIR_DQ rounds them up to whole pairs. */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_loop_steps(const struct attn_bwd_tile& k) {
  return Cfg::PAIR_DQ ? mk_attn_pair_steps(k.steps) : k.steps;
}

/* Query tile qi's first position; TWO_PIECE (the ring's kernels): the tiles from q_tiles0 on
 * at q_pos1 (a zigzag rank's second chunk). */
template <class Cfg, bool TWO_PIECE>
__device__ __forceinline__ long long attn_bwd_q_first(const struct mk_attn_bwd_params& p, int qi) {
  if (TWO_PIECE && qi >= p.q_tiles0) return p.q_pos1 + (long long)(qi - p.q_tiles0) * Cfg::BM;
  return p.q_pos0 + (long long)qi * Cfg::BM;
}

/* The first query tile that sees keys from key_first on (attn.h mk_attn_bwd_first_q_tile2:
 * with two pieces the tiles that see a key tile are still this one to the last). */
template <class Cfg, bool TWO_PIECE>
__device__ __forceinline__ int attn_bwd_first_q_tile_of(const struct mk_attn_bwd_params& p, long long key_first) {
  if (!TWO_PIECE) return mk_attn_bwd_first_q_tile(p.q_pos0, key_first, Cfg::BM, p.causal);
  return mk_attn_bwd_first_q_tile2(p.q_pos0, p.q_tiles0, p.q_pos1, key_first, Cfg::BM, p.causal);
}

/* The block that key tile `tile` of the grid's x (all blocks' tiles in turn) belongs to. */
__device__ __forceinline__ int attn_bwd_block_of(const struct mk_attn_bwd_params& p, int tile) {
  int bi = 0;
  while (bi + 1 < p.num_kv_blocks && tile >= p.kv[bi + 1].tile0) bi++;
  return bi;
}

template <class Cfg, bool TWO_PIECE = false>
__device__ __forceinline__ struct attn_bwd_tile attn_bwd_tile_of(const struct mk_attn_bwd_params& p, int c, int grid_x,
                                                                 int grid_y, int grid_z) {
  struct attn_bwd_tile k;
  const struct mk_attn_work cw = mk_attn_bwd_cta_work(c, grid_x, grid_y, grid_z, p.chunk);
  k.bi = attn_bwd_block_of(p, cw.tile);
  const struct mk_attn_bwd_block_params& blk = p.kv[k.bi];
  k.t = cw.tile - blk.tile0;
  const int group = p.heads / p.kv_heads, heads = p.split ? 1 : group;
  k.hk = p.split ? cw.head / group : cw.head, k.b = cw.batch;
  k.h0 = p.split ? cw.head : cw.head * group;
  k.keys_left = blk.rows - k.t * Cfg::BN; /* valid keys of the tile (up to BN) */
  k.key_first = TWO_PIECE && k.t >= blk.split_tiles ? blk.pos1 + (long long)(k.t - blk.split_tiles) * Cfg::BN
                                                    : blk.pos0 + (long long)k.t * Cfg::BN;
  const int nqt = (p.q_rows + Cfg::BM - 1) / Cfg::BM;
  k.i0 = attn_bwd_first_q_tile_of<Cfg, TWO_PIECE>(p, k.key_first);
  if (k.i0 > nqt) k.i0 = nqt;
  k.per_head = nqt - k.i0, k.steps = heads * k.per_head;
  /* causal CTAs start at their key tile's diagonal (i0), two query tiles apart already. D = 128
   * non-causal, one H200 (session 33): +1-2.6%; D = 64 -7.5%, so not there */
  k.rot = Cfg::D != 128 || p.causal || k.per_head == 0 ? 0 : (2 * cw.tile) % k.per_head;
  return k;
}

#endif /* MK_ATTN_BWD_CFG_CUH_ */
