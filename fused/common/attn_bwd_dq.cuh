/*
 * How the backward core's dQ reaches the fp32 dq_acc (attn_bwd_cfg.cuh DQ_TMA, DQ_LATE): each
 * thread's fragment by red.add, or each consumer warp group's tile staged in shared memory and
 * added by TMA reductions, issued by the consumers' warps in the step itself, by them in the
 * next step, or by the producer warp once the step's stage comes back to it.
 */
#ifndef MK_ATTN_BWD_DQ_CUH_
#define MK_ATTN_BWD_DQ_CUH_

#include "attn_bwd_cfg.cuh"

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
 * (128-byte swizzle: 16-byte chunk k of row r at chunk k ^ (r % 8)), once the warp's last
 * reductions have read them. A warp's 8-byte stores take 4 wavefronts, not the minimum 2 (ncu,
 * session 34): each half-warp's 4 rows r, r + 1 (r even) land on the same chunk pair. Rows
 * storing their fragments in turn j ^ (r % 4) would not, but at the price of register
 * selects. */
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

/* dq_acc rows of step s's query tile += this warp group's dQ * scale, by the configured path
 * (DQ_LATE: only staged; attn_bwd_reduce_dq_step adds it later). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_add_dq_step(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                     const float* dq, uint32_t base, int c,
                                                     const struct attn_bwd_tile& tile, int s) {
  const int col0 = Cfg::D == 128 ? 64 * c : 0;
  const struct attn_bwd_step st = attn_bwd_step_of(tile, s);
  const uint32_t stage = base + Cfg::OFF_DQ + c * Cfg::DQ_BOXES * Cfg::DQ_BOX;
  if constexpr (Cfg::DQ_LATE) attn_bwd_stage_dq<Cfg>(p, dq, stage);
  else if constexpr (Cfg::DQ_TMA) attn_bwd_add_dq_tma<Cfg>(maps, p, dq, stage, tile.b, st.h, st.qi, col0);
  else attn_bwd_add_dq_red<Cfg>(p, dq, tile.b, st.h, st.qi, col0);
}

/* PAIR_DQ: dq_acc rows of step s's query tile += this warp group's whole dQ (64 queries x 128
 * columns: the fragment's first 32 floats are columns 0-63, the rest 64-127) * scale, staged in
 * the group's four boxes and added by TMA reductions (a dummy step's rows lie past the map). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_add_dq_whole(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_params& p,
                                                      const float* dq, uint32_t base, int c,
                                                      const struct attn_bwd_tile& tile, int s) {
  const struct attn_bwd_step st = attn_bwd_step_or_dummy<Cfg>(tile, p.q_rows, s);
  const uint32_t stage = base + Cfg::OFF_DQ + c * Cfg::DQ_BOXES * Cfg::DQ_BOX;
  attn_bwd_stage_dq<Cfg>(p, dq, stage);
  attn_bwd_stage_dq<Cfg>(p, dq + 32, stage + 2 * Cfg::DQ_BOX);
  attn_bwd_reduce_dq<Cfg>(maps, stage, tile.b, st.h, st.qi, 0);
  attn_bwd_reduce_dq<Cfg>(maps, stage + 2 * Cfg::DQ_BOX, tile.b, st.h, st.qi, 64);
}

/* DQ_LATE: the reductions of step s's staged dQ. */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_reduce_dq_step(const struct mk_attn_bwd_maps& maps, uint32_t base, int c,
                                                        const struct attn_bwd_tile& tile, int s) {
  const struct attn_bwd_step st = attn_bwd_step_of(tile, s);
  attn_bwd_reduce_dq<Cfg>(maps, base + Cfg::OFF_DQ + c * Cfg::DQ_BOXES * Cfg::DQ_BOX, tile.b, st.h, st.qi,
                          Cfg::D == 128 ? 64 * c : 0);
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
    const uint32_t src = staging + c * Cfg::DQ_BOXES * Cfg::DQ_BOX;
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

/* DQ_BY_PRODUCER: this warp's staged dQ to the async proxy, then the stage of its step released
 * to the producer (one arrival per consumer warp), which adds the dQ into dq_acc. */
__device__ __forceinline__ void attn_bwd_release_staged(const struct mk_attn_bwd_smem& sm, int stage) {
  fence_proxy_async_shared_cta();
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbarrier_arrive(&sm.empty[stage]);
}

/* DQ_LATE: the hand-off of step s's staged dQ in the next step (or after the last), `ring` at
 * the step after s: its reductions (1, 2), or s's stage back to the producer (3). */
template <class Cfg>
__device__ __forceinline__ void attn_bwd_hand_off_dq(const struct mk_attn_bwd_maps& maps, const struct mk_attn_bwd_smem& sm,
                                                     const struct attn_bwd_tile& tile, uint32_t base, int c, int s,
                                                     struct mk_attn_ring ring) {
  if (Cfg::DQ_BY_PRODUCER) attn_bwd_release_staged(sm, (ring.stage + Cfg::STAGES - 1) % Cfg::STAGES);
  else attn_bwd_reduce_dq_step<Cfg>(maps, base, c, tile, s);
}

/* The warp's dQ reductions have read their staging: before the CTA's shared memory goes away,
 * on every exit of a consumer (one that gave up on a wait too: a reduction still reading freed
 * shared memory would add garbage to dq_acc). */
template <class Cfg>
__device__ __forceinline__ int attn_bwd_drain_dq() {
  if (Cfg::DQ_TMA && (threadIdx.x & 31) == 0) cp_async_bulk_wait_group_0();
  return 0; /* what a consumer that gave up returns (attn_bwd.cuh attn_bwd_consume) */
}

#endif /* MK_ATTN_BWD_DQ_CUH_ */
