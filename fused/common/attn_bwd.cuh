/*
 * The backward attention core for sm_90a (FlashAttention-2/3 style: P recomputed from q, k and
 * lse), as kernels that attn_bwd.cu launches; attn.h has the layouts, positions and arguments.
 *
 * The elementwise passes before and after (delta, dq_acc's zeroing, dq's conversion) are in
 * attn_bwd_passes.cuh; with phase words the main kernel runs them too (attn_bwd_phase.cuh).
 *
 * mk_attn_bwd_kernel: one CTA per (128-key tile of a KV block, kv head, batch), or with split
 * grouped-query heads per (key tile, query head, batch). Warp 0 is the
 * producer: the K and V tiles once (TMA, 4-D maps over [B, S, H_kv, D] stopping at the block's
 * rows, 128-byte swizzle, D in 64-column slabs), then per step the Q and dO tiles (64 rows of
 * one query head, maps stopping at the query range) into a STAGES-deep ring, with the steps'
 * lse (times log2 e; +inf for rows past the range or with no key, so their P is 0) and delta
 * stored beside them by the warp's lanes (and, DQ_LATE = 3, the dQ reductions of the step that
 * last used the stage). Steps: the query heads of the kv head's group (split: the CTA's one
 * head), each over the query tiles that see the key tile (mk_attn_bwd_first_q_tile on).
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
 * dK (times scale) and dV are written once at the end, bf16 and/or added to fp32; split, the
 * group's heads' partials are added (red.add) into fp32 dk_red, dv_red, and written out by a
 * kernel after (or the one-launch call's end part, or, in the ring's call, the tile's last
 * warp group: attn_bwd_group_write_out).
 * Every wait is bounded (attn_wait, attn_fwd.cuh): on expiry the error record is filled and
 * every CTA's waits give up, so a bug ends in a wrong result and an error, never in a hang.
 */
#ifndef MK_ATTN_BWD_CUH_
#define MK_ATTN_BWD_CUH_

#include "attn_bwd_dq.cuh"
#include "attn_bwd_phase.cuh"
#include "wait.cuh"

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

/* A step's shared-memory operands in Q/dO stage `stage`: the Q and dO tiles, lse and delta. */
struct attn_bwd_stage_at {
  uint32_t q, dout, lse, delta;
};

template <class Cfg>
__device__ __forceinline__ struct attn_bwd_stage_at attn_bwd_stage_of(uint32_t base, int stage) {
  struct attn_bwd_stage_at a;
  a.q = base + Cfg::OFF_Q + stage * Cfg::QT_BYTES;
  a.dout = base + Cfg::OFF_DO + stage * Cfg::QT_BYTES;
  a.lse = base + Cfg::OFF_LSE + stage * Cfg::BM * 4;
  a.delta = base + Cfg::OFF_DELTA + stage * Cfg::BM * 4;
  return a;
}

/* A step's S^T = K Q^T and dP^T = V dO^T over the group's 64 keys (k_wg, v_wg), one commit
 * group each. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_issue_s_dp(float* s, float* dp, uint32_t k_wg, uint32_t v_wg,
                                                    const struct attn_bwd_stage_at& at) {
  wgmma_fence();
  attn_bwd_issue_nt<Cfg>(s, k_wg, at.q);
  wgmma_commit_group();
  attn_bwd_issue_nt<Cfg>(dp, v_wg, at.dout);
  wgmma_commit_group();
}

/* dV += P^T dO and dK += dS^T Q (not committed: the caller's group may take more). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_issue_dv_dk(float* dv, float* dk, const uint32_t* pb, const uint32_t* dsb,
                                                     uint32_t q_base, uint32_t do_base) {
  attn_bwd_issue_tn<Cfg>(dv, pb, do_base);
  attn_bwd_issue_tn<Cfg>(dk, dsb, q_base);
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

/* PAIR_DQ: the whole dQ (64 queries x 128 columns) = dS . K over the buffer's 128 keys; the K
 * tile's second 64-column slab is the B operand's leading-byte offset (KV_SLAB). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_issue_dq_whole(float* dq, uint32_t ds_base, uint32_t k_base) {
  const uint32_t ds_lo = wgmma_desc_lo_sw128_mn(ds_base, Cfg::DS_BYTES);
  const uint32_t k_lo = wgmma_desc_lo_sw128_mn(k_base, Cfg::KV_SLAB);
#pragma unroll
  for (int kk = 0; kk < Cfg::BN / 16; kk++) {
    const uint32_t off = (kk * 16 * 128) >> 4;
    wgmma_m64n128k16_bf16<1, 1>(dq, wgmma_desc_from_lo(ds_lo + off), wgmma_desc_from_lo(k_lo + off), kk > 0 ? 1 : 0);
  }
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
 * released to the compiler, the step's Q/dO stage to the producer (DQ_BY_PRODUCER: at the next
 * step's start instead, once the step's dQ is staged: attn_bwd_release_staged). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_step_done(const struct mk_attn_bwd_smem& sm, float* dv, float* dk,
                                                   uint32_t* pb, uint32_t* dsb, int stage) {
  wgmma_fence_operands<Cfg::D / 2>(dv);
  wgmma_fence_operands<Cfg::D / 2>(dk);
  wgmma_fence_operands_u32<16>(pb);
  wgmma_fence_operands_u32<16>(dsb);
  if (!Cfg::DQ_BY_PRODUCER && (threadIdx.x & 31) == 0) mbarrier_arrive(&sm.empty[stage]);
}

/* The producer's lane 0: the tile's K and V, once. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_load_kv(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_smem& sm,
                                                 const struct attn_bwd_tile& k) {
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

/* The producer's lane 0, for a block whose rows arrive during the call (ready_flags): waits
 * (bounded) until the chunks holding the tile's rows are flagged with the call number, then
 * orders the writer's stores before the TMA reads. 0 when a wait gave up (recorded in p.err).
 * Not inlined: once per CTA, outside the producer's 40 registers. TRACED (the ring's one launch,
 * attn_bwd_trace.cuh): the wait is an event; a template parameter, so that the other kernels
 * keep their code (session 60: any code beside the step loop moves ptxas's order of it). */
template <class Cfg, bool TRACED>
__device__ __noinline__ int attn_bwd_wait_tile_rows(const struct mk_attn_bwd_params& p, int bi, int t, int b,
                                                    int keys_left, uint32_t cta) {
  const struct mk_attn_bwd_block_params& blk = p.kv[bi];
  const uint64_t e = *(volatile const uint64_t*)p.ready_done + 1;
  const int first = blk.row0 + t * Cfg::BN, last = first + min(keys_left, Cfg::BN) - 1;
  for (int c = first / blk.ready_chunk_rows; c <= last / blk.ready_chunk_rows; c++) {
    const uint32_t idx = (uint32_t)(b * blk.ready_chunks + c);
    const uint64_t t0 = TRACED ? attn_bwd_trace_begin(p) : 0;
    const uint64_t seen = mk_wait_geq_inline(blk.ready_flags + idx, e, p.err, p.err_tag, cta, idx, p.timeout_ns);
    if (TRACED && p.trace) /* one event per chunk flag */
      mk_trace_emit_per_sm(p.trace, MK_TRACE_LANE_PRODUCER, t0, MK_TRACE_PRODUCER, MK_TRACE_WAIT, cta, idx, e, seen);
    if (seen < e) return 0;
  }
  fence_proxy_async_global();
  return 1;
}

/* The ring's call (TWO_PIECE): a tile no query of the call sees (steps 0) of a block whose rows
 * arrive during the call still stores its partials (zeros) into the block's owner, so it too
 * waits for its rows' chunk flags, which the owner raises only in this call: nothing lands in a
 * peer's memory before the peer ended its previous call (it may still read it; session 68). */
template <bool TWO_PIECE>
__device__ __forceinline__ bool attn_bwd_unread_tile_gated(const struct mk_attn_bwd_params& p,
                                                           const struct attn_bwd_tile& k) {
  return TWO_PIECE && k.steps == 0 && p.kv[k.bi].ready_flags != NULL;
}

/* The producer warp, step st into an empty stage: its lse (times log2 e; +inf past the range
 * or with no key, so P is 0) and delta stored by every lane, the Q and dO tiles by lane 0. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_load_step(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                   const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& k,
                                                   struct attn_bwd_step st, int stage) {
  const int lane = threadIdx.x;
  float* lse_s = (float*)(sm.base + Cfg::OFF_LSE) + stage * Cfg::BM;
  float* delta_s = (float*)(sm.base + Cfg::OFF_DELTA) + stage * Cfg::BM;
  const size_t lrow = ((size_t)k.b * p.heads + st.h) * p.seq_q + p.q_row0;
#pragma unroll
  for (int rr = 0; rr < Cfg::BM / 32; rr++) {
    const int r = lane + 32 * rr, row = st.qi * Cfg::BM + r;
    float l = INFINITY, dl = 0.f;
    if (row < p.q_rows) {
      l = p.lse[lrow + row];
      l = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
      dl = p.delta[lrow + row];
    }
    lse_s[r] = l;
    delta_s[r] = dl;
  }
  uint64_t* full = &sm.full[stage];
  if (lane != 0) {
    mbarrier_arrive(full);
    return;
  }
  mbarrier_arrive_expect_tx(full, 2 * Cfg::QT_BYTES);
  uint8_t* qd = sm.base + Cfg::OFF_Q + stage * Cfg::QT_BYTES;
  uint8_t* dd = sm.base + Cfg::OFF_DO + stage * Cfg::QT_BYTES;
#pragma unroll
  for (int j = 0; j < Cfg::SLABS; j++) {
    cp_async_bulk_tensor_4d_load(qd + j * Cfg::QT_SLAB, &maps.q, j * 64, st.h, st.qi * Cfg::BM, k.b, full);
    cp_async_bulk_tensor_4d_load(dd + j * Cfg::QT_SLAB, &maps.dout, j * 64, st.h, st.qi * Cfg::BM, k.b, full);
  }
}

/* The producer warp: the K and V tiles once, then per step, once its stage is empty, the Q and
 * dO tiles with the step's lse and delta; DQ_BY_PRODUCER: before a stage is reloaded, the dQ
 * that its last step staged is added into dq_acc, and after the loop the last steps' dQ as each
 * of their stages comes back. */
template <class Cfg, bool TRACED>
__device__ __forceinline__ void attn_bwd_produce(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                 const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& k,
                                                 const struct mk_attn_wait_ctx& w) {
  struct mk_attn_ring ring = {0, 0};
  const int lane = threadIdx.x;
  int ok = 1;
  if (lane == 0) {
    if (p.kv[k.bi].ready_flags) ok = attn_bwd_wait_tile_rows<Cfg, TRACED>(p, k.bi, k.t, k.b, k.keys_left, w.tile);
    if (ok) attn_bwd_load_kv<Cfg>(maps, sm, k);
  }
  if (!__shfl_sync(0xffffffffu, ok, 0)) return; /* the consumers' waits give up on the error record */
  const int steps = attn_bwd_loop_steps<Cfg>(k);
  for (int it = 0; it < steps + (Cfg::DQ_BY_PRODUCER ? Cfg::STAGES : 0); it++) {
    const int reduce = Cfg::DQ_BY_PRODUCER && it >= Cfg::STAGES; /* the stage's last step's dQ */
    if ((it < steps || reduce) && !attn_wait(&sm.empty[ring.stage], ring.phase ^ 1, w, MK_ATTN_WAIT_EMPTY)) return;
    if (reduce && lane == 0) attn_bwd_produce_dq<Cfg>(maps, sm, k, it - Cfg::STAGES);
    if (it < steps) attn_bwd_load_step<Cfg>(maps, p, sm, k, attn_bwd_step_or_dummy<Cfg>(k, p.q_rows, it), ring.stage);
    if (reduce && lane == 0) attn_bwd_produce_dq_read(sm);
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

/* Whether the addends (attn.h mk_attn_bwd_addends) of the call are all there: lane 0 of each
 * warp waits (bounded) for every ready word to reach the call number, then its lanes read them.
 * 0 when a wait gave up (recorded in p.err). Not inlined: once per CTA, at its end. TRACED:
 * as attn_bwd_wait_tile_rows's. */
template <bool TRACED>
__device__ __noinline__ int attn_bwd_wait_addends(const struct mk_attn_bwd_params& p, uint32_t tile) {
  int ok = 1;
  if ((threadIdx.x & 31) == 0) {
    const uint64_t e = *(volatile const uint64_t*)p.ready_done + 1;
    for (int i = 0; i < p.addends.n && ok; i++) {
      const uint64_t t0 = TRACED ? attn_bwd_trace_begin(p) : 0;
      const uint64_t seen = mk_wait_geq_inline(p.addends.ready[i], e, p.err, p.err_tag, tile,
                                               p.addends.flag_index0 + (uint32_t)i, p.timeout_ns);
      ok = seen >= e;
      if (TRACED && p.trace && (threadIdx.x & 127) == 0) /* a group's first warp: its consumer lane */
        mk_trace_emit_per_sm(p.trace, MK_TRACE_LANE_CONSUMER0 + threadIdx.x / 128 - 1, t0, MK_TRACE_CONSUMER,
                             MK_TRACE_WAIT, tile, p.addends.flag_index0 + (uint32_t)i, e, seen);
    }
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  fence_acq_rel_sys(); /* each lane's reads of the addends after lane 0's acquire */
  return ok;
}

/* What a thread's row adds to its outputs before writing them, every value loaded before any
 * output is stored (loads interleaved with the stores, which may alias them, waited out one
 * round trip each: 5% of the ring's non-causal call on one GPU): the sums of every addend's
 * dK (dV) pairs at o + 8 j, j < N (L2 reads: a peer wrote them); or an accumulator's old
 * values (acc, NULL: zeros). */
template <int N>
__device__ __forceinline__ void attn_bwd_sum_addends(const struct mk_attn_bwd_addends& ad, size_t o, float2* sk,
                                                     float2* sv) {
#pragma unroll
  for (int j = 0; j < N; j++) sk[j] = sv[j] = make_float2(0.f, 0.f);
  for (int a = 0; a < ad.n; a++)
#pragma unroll
    for (int j = 0; j < N; j++) {
      const float2 x = __ldcg((const float2*)(ad.dk[a] + o + 8 * j)), y = __ldcg((const float2*)(ad.dv[a] + o + 8 * j));
      sk[j].x += x.x, sk[j].y += x.y, sv[j].x += y.x, sv[j].y += y.y;
    }
}

template <int N>
__device__ __forceinline__ void attn_bwd_load_acc(const float* acc, size_t o, float2* s) {
#pragma unroll
  for (int j = 0; j < N; j++) s[j] = acc ? __ldcg((const float2*)(acc + o + 8 * j)) : make_float2(0.f, 0.f);
}

/* Split in the ring's call (p.group_counts), every thread of consumer warp group c after its
 * loop, `wrote` its own: once all 128 wrote their partials of the tile into the workspace, the
 * group counts on its (key tile, kv head, batch); the last of the tile's 2 x group warp groups
 * writes the tile's outputs from the workspace: the own block's bf16 dk, dv with the peers'
 * partials added (once they are there), a peer's block into its owner's accumulator. Every
 * thread comes here whether or not its waits gave up (each thread decides that: a barrier
 * inside the loop's exits could wait for a thread gone to another); a group one of whose
 * threads gave up does not count, so its tile is never written (the call has failed and
 * announces nothing). Not inlined: once per warp group, after its loop. */
template <class Cfg>
__device__ __noinline__ void attn_bwd_group_write_out(const struct mk_attn_bwd_params& p, const struct attn_bwd_tile& k,
                                                      int c, int wrote, uint32_t tile) {
  constexpr int U = 8; /* pairs per thread loaded before any is stored (stores may alias loads) */
  __shared__ int last_s[Cfg::CONSUMERS];
  const int tid = threadIdx.x & 127;
  const struct mk_attn_bwd_block_params& blk = p.kv[k.bi];
  if (!attn_bwd_block_in_ws(blk)) return; /* one answer for the group: the block's adds went straight in */
  __syncwarp(); /* the lanes left the loop by different exits; bar.red is an aligned barrier */
  /* the group's adds before its count (CUTLASS's semaphore: one release after a barrier) */
  if (!bar_red_and(1 + c, 128, wrote)) return;
  if (tid == 0) {
    const uint32_t want = (uint32_t)(Cfg::CONSUMERS * (p.heads / p.kv_heads));
    uint32_t* count = p.group_counts + ((size_t)(blk.tile0 + k.t) * p.kv_heads + k.hk) * p.batch + k.b;
    last_s[c] = atom_add_acq_rel_gpu_u32(count, 1u) + 1 == want;
  }
  bar_sync(1 + c, 128);
  if (!last_s[c]) return;
  const bool own = p.addends.n > 0 && k.bi == p.addends.block;
  if (own && !attn_bwd_wait_addends<true>(p, tile)) return;
  const bool acc_on = mk_attn_acc_gate_open(p.acc_gate);
  const struct mk_attn_bwd_ws_block w = attn_bwd_ws_block_of(blk);
  const int pairs = Cfg::D / 2, units = (k.keys_left < Cfg::BN ? k.keys_left : Cfg::BN) * pairs;
  for (int u0 = tid; u0 < units; u0 += U * 128) {
    float2 x[U], y[U];
    size_t at[U];
#pragma unroll
    for (int j = 0; j < U; j++) {
      const int u = u0 + j * 128;
      if (u >= units) continue;
      const size_t key = (size_t)k.t * Cfg::BN + u / pairs, col = 2 * (u % pairs);
      at[j] = (((size_t)k.b * blk.seq + blk.row0 + key) * p.kv_heads + k.hk) * Cfg::D + col;
      const size_t ws = (((size_t)k.b * blk.red_seq + blk.red_row0 + key) * p.kv_heads + k.hk) * Cfg::D + col;
      x[j] = __ldcg((const float2*)(blk.dk_red + ws)), y[j] = __ldcg((const float2*)(blk.dv_red + ws));
      for (int a = 0; own && a < p.addends.n; a++) {
        const float2 ak = __ldcg((const float2*)(p.addends.dk[a] + at[j]));
        const float2 av = __ldcg((const float2*)(p.addends.dv[a] + at[j]));
        x[j].x += ak.x, x[j].y += ak.y, y[j].x += av.x, y[j].y += av.y;
      }
    }
#pragma unroll
    for (int j = 0; j < U; j++)
      if (u0 + j * 128 < units) attn_bwd_ws_out_pair(w, acc_on, at[j], x[j], y[j]);
  }
}

/* The tile's dK (times scale) and dV rows, this thread's fragments (keys kr0, kr0 + 8 of warp
 * group c's 64), into the block's bf16 outputs and / or fp32 accumulators (added to their old
 * values unless overwritten: EPI ACC), the addends added when this is their block (EPI
 * ADDENDS); split, added into dk_red, dv_red (the CTAs of the group's other heads add theirs;
 * RING, the ring's kernels: then written out by the tile's last warp group, which adds the
 * addends, attn_bwd_group_write_out). Only the kernels of calls that need them have the old
 * values' and the addends' loads. */
template <class Cfg, int EPI, bool RING = false>
__device__ __forceinline__ void attn_bwd_write_dkdv(const struct mk_attn_bwd_params& p, const struct attn_bwd_tile& k,
                                                    const float* dk, const float* dv, int c, int kr0, uint32_t tile) {
  const int lane = threadIdx.x & 31;
  const struct mk_attn_bwd_block_params& blk = p.kv[k.bi];
  /* split: the ring's call only (mk_attn_bwd_check), whose tile write-out adds them instead */
  const bool add = EPI == MK_ATTN_BWD_EPI_ADDENDS && !(RING && p.split) && p.addends.n && k.bi == p.addends.block;
  if (add && !attn_bwd_wait_addends<RING>(p, tile)) return;
  /* The accumulators may be read by a peer (the ring's reduce); once the ring's gather gave up
   * on a wait (the peer may be late, still reading them for its previous call) nothing goes
   * there. A device word: the error record is host-mapped, a read per thread crossed PCIe. */
  const bool acc_on = mk_attn_acc_gate_open(p.acc_gate);
  if (p.split && blk.dk_red == blk.dk_acc && !acc_on) return; /* dk_red is the gated accumulator */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int kidx = c * 64 + kr0 + 8 * i;
    if (kidx >= k.keys_left) continue;
    const int key = k.t * Cfg::BN + kidx; /* within the block */
    const size_t off = (((size_t)k.b * blk.seq + blk.row0 + key) * p.kv_heads + k.hk) * Cfg::D + 2 * (lane & 3);
    const size_t roff =
        (((size_t)k.b * blk.red_seq + blk.red_row0 + key) * p.kv_heads + k.hk) * Cfg::D + 2 * (lane & 3);
    float2 sk[Cfg::D / 8], sv[Cfg::D / 8]; /* the addends' sums, or the accumulators' old values */
    if (add) {
      attn_bwd_sum_addends<Cfg::D / 8>(p.addends, off, sk, sv);
    } else { /* the accumulators are a peer's memory only when overwritten (the ring) */
      const bool old = EPI == MK_ATTN_BWD_EPI_ACC && !p.split && acc_on && !blk.acc_overwrite;
      attn_bwd_load_acc<Cfg::D / 8>(old ? blk.dk_acc : NULL, off, sk);
      attn_bwd_load_acc<Cfg::D / 8>(old ? blk.dv_acc : NULL, off, sv);
    }
#pragma unroll
    for (int j = 0; j < Cfg::D / 8; j++) {
      float k0 = dk[4 * j + 2 * i] * p.scale, k1 = dk[4 * j + 2 * i + 1] * p.scale;
      float v0 = dv[4 * j + 2 * i], v1 = dv[4 * j + 2 * i + 1];
      const size_t o = off + 8 * j;
      if (p.split) { /* the group's heads' partials meet here; attn_bwd.cu writes the outputs */
        red_global_add_v2_f32(blk.dk_red + roff + 8 * j, k0, k1);
        red_global_add_v2_f32(blk.dv_red + roff + 8 * j, v0, v1);
        continue;
      }
      if (add) k0 += sk[j].x, k1 += sk[j].y, v0 += sv[j].x, v1 += sv[j].y;
      if (blk.dk) *(uint32_t*)(blk.dk + o) = pack_bf16x2(k0, k1);
      if (blk.dv) *(uint32_t*)(blk.dv + o) = pack_bf16x2(v0, v1);
      /* no accumulators with addends (mk_attn_bwd_check): sk, sv are their old values or 0 */
      if (blk.dk_acc && acc_on) *(float2*)(blk.dk_acc + o) = make_float2(k0 + sk[j].x, k1 + sk[j].y);
      if (blk.dv_acc && acc_on) *(float2*)(blk.dv_acc + o) = make_float2(v0 + sv[j].x, v1 + sv[j].y);
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
  attn_bwd_issue_dv_dk<Cfg>(dv, dk, pb, dsb, q_base, do_base);
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
  attn_bwd_issue_dv_dk<Cfg>(dv, dk, pb, dsb, q_base, do_base);
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

/* DEFER_DQ, after the loop: the last step's dQ. 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_last_deferred_dq(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                         const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& tile,
                                                         uint32_t base, int c, const struct mk_attn_wait_ctx& w) {
  float dq[32];
  if (!attn_bwd_issue_dq_of<Cfg>(dq, sm, base, base + Cfg::OFF_K, c, tile.steps - 1, w)) return 0;
  wgmma_wait_group<0>();
  wgmma_fence_operands<32>(dq);
  attn_bwd_add_dq_step<Cfg>(maps, p, dq, base, c, tile, tile.steps - 1);
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

/* PAIR_DQ: step `it` of a pair (attn_bwd_cfg.cuh): S^T, dP^T, P^T and dS^T (into buffer it % 2
 * once the group that read it last pair is done), dV += P^T dO, dK += dS^T Q, the stage back to
 * the producer. 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_pair_step(const struct mk_attn_bwd_params& p, const struct mk_attn_bwd_smem& sm,
                                                  const struct attn_bwd_tile& tile, int c, int kr0, uint32_t base,
                                                  int it, struct mk_attn_ring* ring, float* dv, float* dk,
                                                  const struct mk_attn_wait_ctx& w) {
  const struct attn_bwd_step st = attn_bwd_step_or_dummy<Cfg>(tile, p.q_rows, it);
  const long long q_first = p.q_pos0 + (long long)st.qi * Cfg::BM;
  const struct attn_bwd_stage_at at = attn_bwd_stage_of<Cfg>(base, ring->stage);
  const int buf = mk_attn_pair_buf(it);
  float s[32], dp[32];
  uint32_t pb[16], dsb[16];
  if (!attn_wait(&sm.full[ring->stage], ring->phase, w, MK_ATTN_WAIT_Q)) return 0;
  attn_bwd_issue_s_dp<Cfg>(s, dp, base + Cfg::OFF_K + c * 64 * 128, base + Cfg::OFF_V + c * 64 * 128, at);
  attn_bwd_p_ds<Cfg>(p, s, dp, pb, dsb, at.lse, at.delta, q_first, tile, c, kr0);
  if (it >= 2 && !attn_wait(&sm.ds_free[buf], mk_attn_pair_free_parity(it), w, MK_ATTN_WAIT_TURN)) return 0;
  attn_bwd_store_ds<Cfg>(sm, dsb, base + Cfg::OFF_DS + buf * Cfg::DS_BYTES, buf, c, kr0);
  wgmma_fence();
  attn_bwd_issue_dv_dk<Cfg>(dv, dk, pb, dsb, at.q, at.dout);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  attn_bwd_step_done<Cfg>(sm, dv, dk, pb, dsb, ring->stage);
  attn_ring_next(ring, Cfg::STAGES);
  return 1;
}

/* PAIR_DQ: after pair pr's two steps, this group's whole dQ of the pair's step c (buffer c, once
 * both groups' dS^T of it are in), buffer c handed back, the dQ added into dq_acc. */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_pair_dq(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& tile,
                                                int c, uint32_t base, int pr, const struct mk_attn_wait_ctx& w) {
  float dq[64];
  if (!attn_wait(&sm.ds_ready[c], mk_attn_pair_ready_parity(pr), w, MK_ATTN_WAIT_TURN)) return 0;
  wgmma_fence();
  attn_bwd_issue_dq_whole<Cfg>(dq, base + Cfg::OFF_DS + c * Cfg::DS_BYTES, base + Cfg::OFF_K);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operands<64>(dq);
  if ((threadIdx.x & 31) == 0) mbarrier_arrive(&sm.ds_free[c]);
  attn_bwd_add_dq_whole<Cfg>(maps, p, dq, base, c, tile, 2 * pr + c);
  return 1;
}

/* PAIR_DQ's consumer warp group c: per pair two steps' products, then one whole dQ; then the
 * tile's dK and dV. */
template <class Cfg, int EPI>
__device__ __forceinline__ int attn_bwd_consume_pairs(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                       const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& tile,
                                                       int c, const struct mk_attn_wait_ctx& w) {
  const int tid = threadIdx.x & 127, kr0 = 16 * (tid >> 5) + ((tid & 31) >> 2);
  float dv[Cfg::D / 2], dk[Cfg::D / 2];
#pragma unroll
  for (int i = 0; i < Cfg::D / 2; i++) dv[i] = dk[i] = 0.f;
  const uint32_t base = smem_addr(sm.base);
  struct mk_attn_ring ring = {0, 0};
  if (tile.steps > 0 && !attn_wait(sm.kv_full, 0, w, MK_ATTN_WAIT_K)) return attn_bwd_drain_dq<Cfg>();
  for (int pr = 0; pr < attn_bwd_loop_steps<Cfg>(tile) / 2; pr++)
    if (!attn_bwd_pair_step<Cfg>(p, sm, tile, c, kr0, base, 2 * pr, &ring, dv, dk, w) ||
        !attn_bwd_pair_step<Cfg>(p, sm, tile, c, kr0, base, 2 * pr + 1, &ring, dv, dk, w) ||
        !attn_bwd_pair_dq<Cfg>(maps, p, sm, tile, c, base, pr, w))
      return attn_bwd_drain_dq<Cfg>();
  attn_bwd_drain_dq<Cfg>();
  attn_bwd_write_dkdv<Cfg, EPI>(p, tile, dk, dv, c, kr0, w.tile);
  return 1;
}

/* Consumer warp group c: per step S^T and dP^T, P^T and dS^T, dV += P^T dO, dK += dS^T Q and
 * dQ = dS K (added into dq_acc), then the tile's dK and dV. TWO_PIECE: the query rows in two
 * pieces of positions (attn_bwd_q_first). Returns 1 once this thread wrote its part of the
 * tile, 0 when one of its waits gave up (each thread decides: its group may split). */
template <class Cfg, int EPI, bool TWO_PIECE>
__device__ __forceinline__ int attn_bwd_consume(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                 const struct mk_attn_bwd_smem& sm, const struct attn_bwd_tile& tile,
                                                 int c, const struct mk_attn_wait_ctx& w) {
  static_assert(!(TWO_PIECE && Cfg::PAIR_DQ), "the pairs' steps take query positions in one piece");
  if constexpr (Cfg::PAIR_DQ) return attn_bwd_consume_pairs<Cfg, EPI>(maps, p, sm, tile, c, w);
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
  if ((steps > 0 || attn_bwd_unread_tile_gated<TWO_PIECE>(p, tile)) && !attn_wait(sm.kv_full, 0, w, MK_ATTN_WAIT_K))
    return attn_bwd_drain_dq<Cfg>();

  for (int it = 0; it < steps; it++) {
    const int qi = attn_bwd_step_of(tile, it).qi;
    const long long q_first = attn_bwd_q_first<Cfg, TWO_PIECE>(p, qi);
    const struct attn_bwd_stage_at at = attn_bwd_stage_of<Cfg>(base, ring.stage);
    const int buf = it % Cfg::DS_BUFS;
    const uint32_t ds_base = base + Cfg::OFF_DS + buf * Cfg::DS_BYTES;
    float s[32], dp[32];
    uint32_t pb[16], dsb[16];

    if (Cfg::DEFER_DQ && c == 1 && it == 0 && !attn_wait(sm.stagger, 0, w, MK_ATTN_WAIT_TURN))
      return attn_bwd_drain_dq<Cfg>();
    if (!attn_wait(&sm.full[ring.stage], ring.phase, w, MK_ATTN_WAIT_Q)) return attn_bwd_drain_dq<Cfg>();
    if (Cfg::DQ_LATE >= 2 && it > 0) attn_bwd_hand_off_dq<Cfg>(maps, sm, tile, base, c, it - 1, ring);
    attn_bwd_issue_s_dp<Cfg>(s, dp, k_wg, v_wg, at);
    if (Cfg::DQ_LATE == 1 && it > 0) attn_bwd_hand_off_dq<Cfg>(maps, sm, tile, base, c, it - 1, ring);
    attn_bwd_p_ds<Cfg>(p, s, dp, pb, dsb, at.lse, at.delta, q_first, tile, c, kr0);
    /* DEFER_DQ: both groups' dQ of this buffer's last step are done */
    if (Cfg::DEFER_DQ && it >= Cfg::DS_BUFS &&
        !attn_wait(&sm.ds_free[buf], (uint32_t)(it / Cfg::DS_BUFS - 1) & 1, w, MK_ATTN_WAIT_TURN))
      return attn_bwd_drain_dq<Cfg>();
    attn_bwd_store_ds<Cfg>(sm, dsb, ds_base, buf, c, kr0);
    const struct attn_bwd_ctx x = {base, k_base, c, kr0};
    const int ok = Cfg::DEFER_DQ ? attn_bwd_products_deferred<Cfg>(maps, p, sm, tile, x, it, ring.stage, at.q,
                                                                   at.dout, dv, dk, pb, dsb, w)
                                 : attn_bwd_products<Cfg>(maps, p, sm, tile, x, it, ring.stage, at.q, at.dout, dv,
                                                          dk, pb, dsb, w);
    if (!ok) return attn_bwd_drain_dq<Cfg>();
    attn_ring_next(&ring, Cfg::STAGES);
  }

  if (Cfg::DQ_LATE && steps > 0) attn_bwd_hand_off_dq<Cfg>(maps, sm, tile, base, c, steps - 1, ring);
  if (Cfg::DEFER_DQ && steps > 0 && !attn_bwd_last_deferred_dq<Cfg>(maps, p, sm, tile, base, c, w))
    return attn_bwd_drain_dq<Cfg>();
  attn_bwd_drain_dq<Cfg>();

  attn_bwd_write_dkdv<Cfg, EPI, TWO_PIECE>(p, tile, dk, dv, c, kr0, w.tile); /* TWO_PIECE: the ring's kernels */
  return 1;
}

/* grid (key tiles of all blocks, kv heads or, split, heads, batch). LAUNCH ONE (the one-launch
 * call, p.phase): one dimension, its three parts; RING: the ring's parts too (attn_bwd_phase.cuh).
 * EPI: the epilogue the call needs (attn.h MK_ATTN_BWD_EPI_*). Each an instantiation of its own: ptxas's order of the same
 * step loop moves the kernel's time by up to 4% with any code beside it (session 60: the
 * addends' epilogue cost the one-launch kernel 5%, the accumulators' loads D = 64 3-4%), so
 * a path a call does not take stays out of its kernel. */
template <class Cfg, int LAUNCH, int EPI>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
mk_attn_bwd_kernel(const __grid_constant__ struct mk_attn_bwd_maps maps,
                   const __grid_constant__ struct mk_attn_bwd_params p) {
  constexpr bool PHASED = LAUNCH != ATTN_BWD_LAUNCH_MAIN;
  extern __shared__ uint8_t smem_raw[];
  int c = (int)((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
  __shared__ struct attn_bwd_traced_item traced; /* NCCL_MK_TRACE: the ring's call only */
  if constexpr (PHASED) { /* c stays a function of blockIdx: kept in registers instead, the consumers spilled */
    if (!attn_bwd_phase_is_main<Cfg, LAUNCH>(p, c, &traced)) return;
    c -= LAUNCH == ATTN_BWD_LAUNCH_RING ? p.push.ctas + p.n_start : p.n_start;
  }
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
    /* ds_free: DEFER_DQ both groups' warps, PAIR_DQ the reading group's */
    if (Cfg::DEFER_DQ || Cfg::PAIR_DQ)
      for (int i = 0; i < Cfg::DS_BUFS; i++) mbarrier_init(&sm.ds_free[i], Cfg::DEFER_DQ ? Cfg::CONSUMERS * 4 : 4);
    if (Cfg::DEFER_DQ) mbarrier_init(sm.stagger, 4);
    fence_mbarrier_init();
  }
  __syncthreads();

  constexpr bool TWO_PIECE = LAUNCH == ATTN_BWD_LAUNCH_RING; /* the zigzag positions: the ring's kernels only */
  const struct attn_bwd_tile tile = PHASED ? attn_bwd_tile_of<Cfg, TWO_PIECE>(p, c, p.grid_tiles, p.grid_heads, p.batch)
                                           : attn_bwd_tile_of<Cfg>(p, c, gridDim.x, gridDim.y, gridDim.z);
  if constexpr (TWO_PIECE) attn_bwd_trace_item_begin(p, &traced, tile.bi, tile.steps);
  struct mk_attn_wait_ctx w;
  w.err = p.err;
  w.err_tag = p.err_tag;
  w.tile = (uint32_t)c;
  w.timeout_ns = mk_wait_inner_timeout_ns(p.timeout_ns);

  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x < 32 && tile.steps != 0) attn_bwd_produce<Cfg, TWO_PIECE>(maps, p, sm, tile, w);
    /* a ring tile without steps: its chunk-flag wait, then kv_full raised without a load (on a
     * timeout nothing: the consumers give up on the error record). The tile goes by value: by
     * reference to a call it went to the stack, and the consumers' loop read it there */
    else if constexpr (TWO_PIECE)
      if (threadIdx.x == 0 && attn_bwd_unread_tile_gated<TWO_PIECE>(p, tile) &&
          attn_bwd_wait_tile_rows<Cfg, true>(p, tile.bi, tile.t, tile.b, tile.keys_left, w.tile))
        mbarrier_arrive(sm.kv_full);
  } else {
    setmaxnreg_inc<232>();
    const int wrote = attn_bwd_consume<Cfg, EPI, TWO_PIECE>(maps, p, sm, tile, wg - 1, w);
    /* split heads in the ring's call (D = 128 only: attn_bwd.cu splits nothing else) */
    if constexpr (LAUNCH == ATTN_BWD_LAUNCH_RING && EPI == MK_ATTN_BWD_EPI_ADDENDS && Cfg::D == 128)
      if (p.group_counts) attn_bwd_group_write_out<Cfg>(p, tile, wg - 1, wrote, w.tile);
  }
  if constexpr (PHASED) attn_bwd_main_part_done<LAUNCH>(p, c, &traced);
}

#endif /* MK_ATTN_BWD_CUH_ */
