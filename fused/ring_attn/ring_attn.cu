/*
 * ncclMkRingAttention's kernel (ring_attn.h has the protocol): push CTAs, then attention CTAs
 * built from the core's device pieces (attn_fwd.cuh), then the call's end (call_end.cuh).
 */
#include <errno.h>
#include <string.h>
#include <math.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "attn_fwd.cuh"
#include "call_end.cuh"
#include "kv_push.cuh"
#include "ra_schedule.h"
#include "ring_attn.h"
#include "schedule.h"
#include "sm90.h"
#include "wait.cuh"
extern "C" {
#include "mk_err.h"
#include "mk_log.h"
}

/* The core's configurations until session 30 (attn.cu variant 5: 128-key tiles, 3 stages).
 * The core's default since (176-key tiles, K and V released separately) compiles here too
 * (ra_produce's SPLIT_KV step) but with producer spills, and ran 3-4% slower in this kernel
 * on 2 H200s (bench/NOTES.md, session 32), so the ring keeps 128-key tiles. */
typedef mk_attn_cfg<128, 3, 1> mk_ra_cfg_d128;
typedef mk_attn_cfg<64, 3, 1> mk_ra_cfg_d64;
/* The same tiles with persistent attention CTAs (mk_ra_args.persistent): one per SM, each
 * claiming items in turn, the next item's Q and K/V loaded while the consumers finish the last
 * one (attn_fwd.cuh PERSISTENT). */
typedef mk_attn_cfg<128, 3, 1, 1> mk_ra_cfg_d128_persistent;
typedef mk_attn_cfg<64, 3, 1, 1> mk_ra_cfg_d64_persistent;

struct mk_ra_params {
  int batch, s_local, heads, kv_heads, d_head, causal;
  int rank, nranks, push_ctas;
  int chunk_rows, chunks_per_batch;
  int q_segs, seg_rows, seg_tiles; /* query segments (zigzag halves or the whole), their rows, tiles */
  int chunk;                       /* the items' order: attn.h mk_attn_item_work's chunk */
  int n_items; /* query tiles x heads x batch; persistent CTAs take them in turn */
  struct mk_kv_push push; /* the push CTAs' (kv_push.cuh) */
  const uint64_t* flags;
  __nv_bfloat16* out;
  float* lse;
  float scale, scale_log2;
  struct mk_gemm_call call;
  uint64_t* gave_up; /* the backward's gather: MK_ATTN_ACC_GATE_CLOSED | call when a wait failed */
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint64_t timeout_ns;
};

/* Map 0: the own k, v (in place); map 1 + j: slot j. */
struct mk_ra_maps {
  CUtensorMap q;
  CUtensorMap k[MK_RA_MAX_RANKS];
  CUtensorMap v[MK_RA_MAX_RANKS];
};

/* ---- attention CTAs ------------------------------------------------------------------------- */

/* KV segment `seg` of the block from rank src: its rows in the block and its global position. */
struct ra_seg {
  int row0, rows;
  long long pos0;
};

static __device__ __forceinline__ struct ra_seg ra_kv_seg(const struct mk_ra_params& p, int src, int seg) {
  struct ra_seg s;
  if (p.causal) {
    const int c = p.s_local / 2;
    s.row0 = seg * c, s.rows = c;
    s.pos0 = (long long)mk_ra_zigzag_chunk(src, p.nranks, seg) * c;
  } else {
    s.row0 = 0, s.rows = p.s_local;
    s.pos0 = (long long)src * p.s_local;
  }
  return s;
}

/* The producer's wait before a slot tile: the flags of the chunks holding rows [lo, hi] of batch
 * b, from chunk *ready on (the chunks below it were seen complete in this step). 0 when a wait
 * gave up. Inlined (wait.cuh's NOTES on the producer's 40 registers). */
static __device__ __forceinline__ int ra_wait_rows(const struct mk_ra_params& p, const uint64_t* slot_flags, int b,
                                                   int lo, int hi, int* ready, uint64_t e, uint32_t item) {
  int c = lo / p.chunk_rows;
  if (c < *ready) c = *ready;
  const int last = hi / p.chunk_rows;
  if (c > last) return 1;
  for (; c <= last; c++) {
    const uint32_t idx = (uint32_t)(b * p.chunks_per_batch + c);
    if (mk_wait_geq_inline(slot_flags + idx, e, p.err, p.err_tag, item, (uint32_t)(slot_flags - p.flags) + idx,
                           p.timeout_ns) < e)
      return 0;
  }
  *ready = last + 1;
  fence_proxy_async_global(); /* the peer's generic-proxy stores, before our TMA reads them */
  return 1;
}

/* A work item's query rows: per (batch, head) the query tiles, causal ones longest first (the
 * late zigzag half, last tile first, then the early half), in chunks of p.chunk tiles (1: the
 * tiles outermost, then (batch, head); MK_ATTN_CHUNK_HEADS: head by head; attn.h
 * mk_attn_chunk_work, ra_schedule.h mk_ra_items_tiles_outer). */
struct ra_item {
  int b, h, hk;
  int q_row, rows_valid;      /* the tile's first local row, and how many are valid */
  long long q_first, q_last;  /* their global positions */
};

static __device__ __forceinline__ struct ra_item ra_item_of(const struct mk_ra_params& p, int item, int bm) {
  struct ra_item it;
  /* attn.h's item order over (tile, head, batch), the tiles of both query halves as one */
  const struct mk_attn_work wk = mk_attn_item_work(item, p.q_segs * p.seg_tiles, p.heads, p.batch, p.chunk, 0);
  const int ti = wk.tile;
  it.h = wk.head, it.b = wk.batch;
  it.hk = it.h / (p.heads / p.kv_heads);
  int seg = 0, tile = ti;
  if (p.causal) seg = ti < p.seg_tiles ? 1 : 0, tile = p.seg_tiles - 1 - ti % p.seg_tiles;
  it.q_row = seg * p.seg_rows + tile * bm;
  it.rows_valid = p.seg_rows - tile * bm < bm ? p.seg_rows - tile * bm : bm;
  it.q_first = p.causal ? (long long)mk_ra_zigzag_chunk(p.rank, p.nranks, seg) * p.seg_rows + tile * bm
                        : (long long)p.rank * p.s_local + tile * bm;
  it.q_last = it.q_first + it.rows_valid - 1;
  return it;
}

/* The persistent CTAs' next item from the call's counter (its value: an item, or n_items and
 * beyond at the end); the producer's thread issues it an item ahead. */
static __device__ __forceinline__ uint32_t ra_claim(const struct mk_ra_params& p) {
  return atomicAdd((unsigned int*)p.call.claims, 1u);
}

/* The KV tiles an item sees of segment ks of the block from ring step s. */
template <class Cfg>
static __device__ __forceinline__ int ra_seg_tiles(const struct mk_ra_params& p,
                                                   const struct ra_item& it, int s, int ks) {
  const struct ra_seg g = ra_kv_seg(p, mk_ra_kv_source(p.rank, p.nranks, s), ks);
  return mk_attn_kv_tiles(it.q_last, g.pos0, g.rows, Cfg::BN, p.causal);
}

/* The producer's KV loads of one item: every source's tiles in ring order, each peer tile
 * after a bounded wait for the chunk flags that cover it. 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int ra_produce_kv(const struct mk_ra_maps& maps,
                                             const struct mk_ra_params& p,
                                             const struct mk_attn_smem& sm,
                                             const struct ra_item& it, struct mk_attn_ring* ring,
                                             struct mk_attn_ring* v_ring, uint64_t e, uint32_t item,
                                             const struct mk_attn_wait_ctx& w) {
  const long flags_per_slot = (long)p.batch * p.chunks_per_batch;
  int ok = 1;
  for (int s = 0; s < p.nranks && ok; s++) {
    const int src = mk_ra_kv_source(p.rank, p.nranks, s);
    const int slot = s ? mk_sched_rs_slot(src, p.rank) : -1;
    const int mi = slot + 1;
    const uint64_t* slot_flags = p.flags + (slot < 0 ? 0 : slot * flags_per_slot);
    int ready = 0;
    for (int ks = 0; ks < (p.causal ? 2 : 1) && ok; ks++) {
      const struct ra_seg g = ra_kv_seg(p, src, ks);
      const int n = mk_attn_kv_tiles(it.q_last, g.pos0, g.rows, Cfg::BN, p.causal);
      for (int t = 0; t < n && ok; t++) {
        const int row = g.row0 + t * Cfg::BN;
        if (slot >= 0) {
          const int hi = (row + Cfg::BN < p.s_local ? row + Cfg::BN : p.s_local) - 1;
          ok = ra_wait_rows(p, slot_flags, it.b, row, hi, &ready, e, item);
          if (!ok) break;
        }
        if constexpr (Cfg::SPLIT_KV)
          ok = attn_load_split_step<Cfg>(&maps.k[mi], &maps.v[mi], sm, ring, v_ring, it.b, it.hk,
                                         g.row0, t, n, w);
        else
          ok = attn_load_kv_block<Cfg>(&maps.k[mi], &maps.v[mi], sm, ring, it.b, it.hk, row, 1, w);
      }
    }
  }
  return ok;
}

/* The producer thread's one item: its Q tile, then its KV tiles. 0 when a wait gave up. */
template <class Cfg>
__device__ __forceinline__ int ra_produce_item(const struct mk_ra_maps& maps,
                                               const struct mk_ra_params& p,
                                               const struct mk_attn_smem& sm, int item,
                                               struct mk_attn_ring* ring,
                                               struct mk_attn_ring* v_ring, uint64_t e,
                                               struct mk_attn_wait_ctx& w) {
  const struct ra_item it = ra_item_of(p, item, Cfg::BM);
  w.tile = (uint32_t)item;
  attn_load_q<Cfg>(&maps.q, sm, it.b, it.h, it.q_row);
  return ra_produce_kv<Cfg>(maps, p, sm, it, ring, v_ring, e, (uint32_t)item, w);
}

/* The persistent producer: it claims each item while the previous one loads, and hands it to
 * the consumers in *next once their last S product of the previous one is done (the Q tile
 * free); they read it once q_full completes: -1, with a plain arrival, when no item is left.
 * The stage ring runs on across items. */
template <class Cfg>
__device__ __forceinline__ void ra_produce_items(const struct mk_ra_maps& maps,
                                                 const struct mk_ra_params& p,
                                                 const struct mk_attn_smem& sm, int* next,
                                                 struct mk_attn_wait_ctx& w) {
  struct mk_attn_ring ring = {0, 0}, v_ring = {0, 0};
  const uint64_t e = *(volatile uint64_t*)p.call.done + 1;
  uint32_t claim = ra_claim(p);
  for (int k = 0;; k++) {
    const int item = claim < (uint32_t)p.n_items ? (int)claim : -1;
    if (k > 0 && !attn_wait(sm.q_empty, (k - 1) & 1, w, MK_ATTN_WAIT_Q_EMPTY)) return;
    *(volatile int*)next = item;
    if (item < 0) {
      mbarrier_arrive(sm.q_full);
      return;
    }
    claim = ra_claim(p);
    if (!ra_produce_item<Cfg>(maps, p, sm, item, &ring, &v_ring, e, w)) return;
  }
}

/* Consumer warp group c, one item: every source's KV tiles into the running state, in the
 * producer's order; persistent, the last segment with tiles releases the Q tile. */
template <class Cfg>
__device__ __forceinline__ int ra_consume_kv(
    const struct mk_ra_params& p, const struct mk_attn_smem& sm, int c, const struct ra_item& it,
    struct mk_attn_state<Cfg>& st, struct mk_attn_ring* ring, const struct mk_attn_wait_ctx& w) {
  int last = -1; /* s * 2 + ks of the last segment with tiles */
  if (Cfg::PERSISTENT)
    for (int s = 0; s < p.nranks; s++)
      for (int ks = 0; ks < (p.causal ? 2 : 1); ks++)
        if (ra_seg_tiles<Cfg>(p, it, s, ks) > 0) last = 2 * s + ks;
  if (Cfg::PERSISTENT && last < 0 && (threadIdx.x & 31) == 0) mbarrier_arrive(sm.q_empty);
  int ok = 1;
  for (int s = 0; s < p.nranks && ok; s++) {
    const int src = mk_ra_kv_source(p.rank, p.nranks, s);
    for (int ks = 0; ks < (p.causal ? 2 : 1) && ok; ks++) {
      const struct ra_seg g = ra_kv_seg(p, src, ks);
      const int n = mk_attn_kv_tiles(it.q_last, g.pos0, g.rows, Cfg::BN, p.causal);
      ok = attn_consume_kv_block<Cfg>(st, sm, ring, c, it.q_first + 64 * c, g.pos0, g.rows, n,
                                      p.causal, p.scale_log2, w,
                                      2 * s + ks == last ? sm.q_empty : nullptr);
    }
  }
  return ok;
}

/* Consumer warp group c's one item: its KV blocks into the (fresh) state, then out and lse
 * (persistent: from registers, the Q tile already holding the next item's rows). */
template <class Cfg>
__device__ __forceinline__ int ra_consume_item(
    const struct mk_ra_params& p, const struct mk_attn_smem& sm, int c, const struct ra_item& it,
    struct mk_attn_state<Cfg>& st, struct mk_attn_ring* ring, const struct mk_attn_wait_ctx& w) {
  if (!ra_consume_kv<Cfg>(p, sm, c, it, st, ring, w)) return 0;
  const int row = it.q_row + 64 * c; /* the warp group's first row */
  const size_t row_stride = (size_t)p.heads * Cfg::D;
  __nv_bfloat16* out = p.out + (((size_t)it.b * p.s_local + row) * p.heads + it.h) * Cfg::D;
  float* lse = p.lse ? p.lse + ((size_t)it.b * p.heads + it.h) * p.s_local + row : NULL;
  if (Cfg::PERSISTENT)
    attn_finish_direct<Cfg>(st, out, row_stride, lse, it.rows_valid - 64 * c, p.scale);
  else
    attn_finish<Cfg>(st, sm, c, out, row_stride, lse, it.rows_valid - 64 * c, p.scale);
  return 1;
}

/* The persistent consumers: per item (from *next, once q_full completes) a fresh state. */
template <class Cfg>
__device__ __forceinline__ void ra_consume_items(const struct mk_ra_params& p,
                                                 const struct mk_attn_smem& sm, int c,
                                                 const int* next, struct mk_attn_wait_ctx& w) {
  struct mk_attn_ring ring = {0, 0};
  struct mk_attn_state<Cfg> st;
  attn_state_init<Cfg>(st);
  attn_turns_start<Cfg>(sm, c);
  for (int k = 0;; k++) {
    if (!attn_wait(sm.q_full, k & 1, w, MK_ATTN_WAIT_Q)) return;
    const int item = *(volatile const int*)next;
    if (item < 0) return;
    w.tile = (uint32_t)item;
    if (k > 0) attn_state_reset<Cfg>(st);
    if (!ra_consume_item<Cfg>(p, sm, c, ra_item_of(p, item, Cfg::BM), st, &ring, w)) return;
  }
}

/* The one-item CTA's roles (not persistent). */
template <class Cfg>
__device__ __forceinline__ void ra_produce_one(const struct mk_ra_maps& maps,
                                               const struct mk_ra_params& p,
                                               const struct mk_attn_smem& sm, int item,
                                               struct mk_attn_wait_ctx& w) {
  struct mk_attn_ring ring = {0, 0}, v_ring = {0, 0}; /* v_ring: SPLIT_KV's V positions */
  prefetch_tensormap(&maps.q);
  ra_produce_item<Cfg>(maps, p, sm, item, &ring, &v_ring, *(volatile uint64_t*)p.call.done + 1, w);
}

template <class Cfg>
__device__ __forceinline__ void ra_consume_one(const struct mk_ra_params& p,
                                               const struct mk_attn_smem& sm, int c,
                                               const struct ra_item& it,
                                               struct mk_attn_wait_ctx& w) {
  struct mk_attn_ring ring = {0, 0};
  struct mk_attn_state<Cfg> st;
  attn_state_init<Cfg>(st);
  attn_turns_start<Cfg>(sm, c);
  if (attn_wait(sm.q_full, 0, w, MK_ATTN_WAIT_Q)) ra_consume_item<Cfg>(p, sm, c, it, st, &ring, w);
}

/* Push CTAs first, then the attention CTAs (one per item, or persistent over the items); every
 * CTA ends the call's count. */
template <class Cfg>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
mk_ra_kernel(const __grid_constant__ struct mk_ra_maps maps, const __grid_constant__ struct mk_ra_params p) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ int next_item; /* persistent: the producer's claimed item for the consumers */
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.call.call) *p.call.call = *(volatile uint64_t*)p.call.done + 1;
  if ((int)blockIdx.x < p.push_ctas) {
    mk_kv_push_cta(p.push, (int)blockIdx.x);
    mk_call_end(p.call, p.err);
    return;
  }
  const struct mk_attn_smem sm = attn_smem_carve<Cfg>(smem_raw);
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) attn_smem_init<Cfg>(sm);
  __syncthreads();
  const int item = (int)blockIdx.x - p.push_ctas; /* not persistent: this CTA's one item */
  struct mk_attn_wait_ctx w;
  w.err = p.err;
  w.err_tag = p.err_tag;
  w.tile = (uint32_t)item;
  w.timeout_ns = mk_wait_inner_timeout_ns(p.timeout_ns);

  /* setmaxnreg: the roles as the two branches of one if/else (attn_fwd.cuh's kernel), the
   * core's split (Cfg::REGS_*). At 40 the producer spills 32-44 bytes (its flag waits); 56 /
   * 224 spills nothing but measured 1-3% slower on 2 H200s (bench/NOTES.md, session 25): the
   * consumers want their 232. */
  if (wg == 0) {
    setmaxnreg_dec<Cfg::REGS_PRODUCER>();
    if (threadIdx.x == 0) {
      if (Cfg::PERSISTENT)
        ra_produce_items<Cfg>(maps, p, sm, &next_item, w);
      else
        ra_produce_one<Cfg>(maps, p, sm, item, w);
    }
    mk_call_end(p.call, p.err);
  } else {
    setmaxnreg_inc<Cfg::REGS_CONSUMER>();
    if (Cfg::PERSISTENT)
      ra_consume_items<Cfg>(p, sm, wg - 1, &next_item, w);
    else
      ra_consume_one<Cfg>(p, sm, wg - 1, ra_item_of(p, item, Cfg::BM), w);
    mk_call_end(p.call, p.err);
  }
}

/* ---- launch --------------------------------------------------------------------------------- */

/* The parameters the push CTAs (and the backward's gather) use; memset p first. */
static void ra_fill_push_params(const struct mk_ra_args* a, size_t kv_elems, struct mk_ra_params* p) {
  p->batch = a->batch, p->s_local = a->s_local, p->heads = a->heads, p->kv_heads = a->kv_heads;
  p->d_head = a->d_head, p->causal = a->causal ? 1 : 0;
  p->rank = a->rank, p->nranks = a->nranks, p->push_ctas = a->push_ctas;
  p->chunk_rows = a->chunk_rows;
  p->chunks_per_batch = (a->s_local + a->chunk_rows - 1) / a->chunk_rows;
  mk_ra_kv_push(a, kv_elems, &p->push);
  p->flags = a->flags;
  p->call = a->call;
  p->gave_up = a->gave_up;
  p->err = a->err, p->err_tag = a->err_tag;
  p->timeout_ns = mk_ra_timeout_ns(a->timeout_ms);
}

template <class Cfg>
static cudaError_t ra_prepare_cfg(void) {
  static int done[64];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 64 && __atomic_load_n(&done[dev], __ATOMIC_ACQUIRE)) return cudaSuccess;
  e = cudaFuncSetAttribute(mk_ra_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES);
  cudaFuncAttributes fa;
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, mk_ra_kernel<Cfg>);
  if (e == cudaSuccess && dev < 64) __atomic_store_n(&done[dev], 1, __ATOMIC_RELEASE);
  return e;
}

template <class Cfg>
static int ra_launch_cfg(const struct mk_ra_args* a, int sms, cudaStream_t stream) {
  struct mk_ra_maps maps;
  struct mk_ra_params p;
  memset(&maps, 0, sizeof maps);
  memset(&p, 0, sizeof p);
  const size_t kv_elems = (size_t)a->batch * a->s_local * a->kv_heads * Cfg::D;
  MK_CHECK(mk_attn_tmap_encode(&maps.q, a->q, a->batch, a->s_local, a->heads, Cfg::D, Cfg::BM));
  MK_CHECK(mk_attn_tmap_encode(&maps.k[0], a->k, a->batch, a->s_local, a->kv_heads, Cfg::D, Cfg::BN));
  MK_CHECK(mk_attn_tmap_encode(&maps.v[0], a->v, a->batch, a->s_local, a->kv_heads, Cfg::D, Cfg::BN));
  for (int j = 0; j < a->nranks - 1; j++) {
    const __nv_bfloat16* slot = (const __nv_bfloat16*)a->slots + (size_t)j * 2 * kv_elems;
    MK_CHECK(mk_attn_tmap_encode(&maps.k[1 + j], slot, a->batch, a->s_local, a->kv_heads, Cfg::D, Cfg::BN));
    MK_CHECK(mk_attn_tmap_encode(&maps.v[1 + j], slot + kv_elems, a->batch, a->s_local, a->kv_heads, Cfg::D,
                                 Cfg::BN));
  }
  ra_fill_push_params(a, kv_elems, &p);
  p.q_segs = p.causal ? 2 : 1;
  p.seg_rows = p.causal ? a->s_local / 2 : a->s_local;
  p.seg_tiles = (p.seg_rows + Cfg::BM - 1) / Cfg::BM;
  p.out = (__nv_bfloat16*)a->out, p.lse = a->lse;
  p.scale = (float)(1.0 / sqrt((double)Cfg::D));
  p.scale_log2 = (float)(1.4426950408889634 / sqrt((double)Cfg::D));

  const long items = (long)a->batch * a->heads * p.q_segs * p.seg_tiles;
  if (items + a->push_ctas > 0x7fffffffL) {
    MK_WARN("ncclMkRingAttention: %ld query tiles are too many for one launch", items);
    return -EINVAL;
  }
  p.chunk = a->item_chunk > 0                                  ? a->item_chunk
            : mk_ra_items_tiles_outer(p.causal, items, sms) ? 1
                                                            : MK_ATTN_CHUNK_HEADS;
  p.n_items = (int)items;
  /* persistent: one attention CTA per SM; those that start once the push CTAs end take their
   * SMs (items are claimed, so a CTA that starts late finds fewer or none) */
  const long attn_ctas = !Cfg::PERSISTENT || items < sms ? items : sms;
  cudaError_t e = ra_prepare_cfg<Cfg>();
  if (e == cudaSuccess) {
    mk_ra_kernel<Cfg>
        <<<(unsigned)(attn_ctas + a->push_ctas), Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(maps, p);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) {
    MK_WARN("ncclMkRingAttention: launch failed: %s", cudaGetErrorString(e));
    return -EIO;
  }
  return 0;
}

extern "C" int mk_ra_launch(const struct mk_ra_args* a, cudaStream_t stream) {
  int sms = 0;
  MK_CHECK(mk_sm90_sms("ncclMkRingAttention", &sms));
  if (a->nranks < 1 || a->nranks > MK_RA_MAX_RANKS || a->push_ctas < 1 || a->chunk_rows < 128 ||
      a->chunk_rows % 128 || (a->persistent && !a->call.claims)) {
    MK_WARN(
        "ncclMkRingAttention: internal: nranks %d, push_ctas %d, chunk_rows %d, persistent %d, "
        "claims %p",
        a->nranks, a->push_ctas, a->chunk_rows, a->persistent, (void*)a->call.claims);
    return -EINVAL;
  }
  if (a->persistent)
    return a->d_head == 128 ? ra_launch_cfg<mk_ra_cfg_d128_persistent>(a, sms, stream)
                            : ra_launch_cfg<mk_ra_cfg_d64_persistent>(a, sms, stream);
  return a->d_head == 128 ? ra_launch_cfg<mk_ra_cfg_d128>(a, sms, stream) : ra_launch_cfg<mk_ra_cfg_d64>(a, sms, stream);
}

/* ---- the backward's gather and reduce (ring_attn.h; ncclMkRingAttentionBackward) ------------- */

#define MK_RA_BWD_THREADS 256

/* The forward's push, then every incoming chunk flag of this rank's slots waited for (CTA i
 * takes flags i, i + push_ctas, ..), then fence.proxy.async: the core's TMA loads read them
 * in the next kernels. */
__global__ void __launch_bounds__(MK_RA_BWD_THREADS, 1) mk_ra_bwd_gather_kernel(const __grid_constant__ struct mk_ra_params p) {
  /* the own-last plan's first core call starts beside this kernel (attn.h pdl) */
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const uint64_t e = *(volatile uint64_t*)p.call.done + 1; /* done moves only at the call's end */
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.call.call) *p.call.call = e;
  mk_kv_push_cta(p.push, (int)blockIdx.x);
  if (threadIdx.x == 0) {
    const long total = (long)(p.nranks - 1) * p.batch * p.chunks_per_batch;
    bool ok = true;
    for (long i = blockIdx.x; i < total && ok; i += p.push_ctas)
      ok = mk_wait_geq_inline(p.flags + i, e, p.err, p.err_tag, (uint32_t)blockIdx.x, (uint32_t)i, p.timeout_ns) >= e;
    /* a failed push (a peer's previous call not done in time) records it there too */
    if (!ok || ld_relaxed_sys_u32(&p.err->aborted)) *(volatile uint64_t*)p.gave_up = MK_ATTN_ACC_GATE_CLOSED | e;
    fence_proxy_async_global(); /* the peers' generic-proxy stores, before TMA reads them */
  }
}

extern "C" int mk_ra_bwd_gather_launch(const struct mk_ra_args* a, cudaStream_t stream) {
  if (!a->gave_up) {
    MK_WARN("ncclMkRingAttentionBackward: internal: the gather has no gave-up word");
    return -EINVAL;
  }
  struct mk_ra_params p;
  memset(&p, 0, sizeof p);
  ra_fill_push_params(a, (size_t)a->batch * a->s_local * a->kv_heads * a->d_head, &p);
  mk_ra_bwd_gather_kernel<<<(unsigned)a->push_ctas, MK_RA_BWD_THREADS, 0, stream>>>(p);
  return mk_kernel_launched("mk_ra_bwd_gather_kernel");
}

/* A grid-stride zero of a peer's accumulator in this rank's memory (the causal backward: the
 * peer reads it in its reduce), unless the gather gave up on a wait: the peer may be late,
 * still reading it for its previous call (as the core's accumulator stores, attn_bwd.cuh).
 * With peer_done, every CTA first waits for the peer's previous call to have ended. */
__global__ void __launch_bounds__(MK_RA_BWD_THREADS) mk_ra_bwd_zero_kernel(const struct mk_ra_bwd_zero_args a) {
  if (a.peer_done) {
    bool ok = true;
    if (threadIdx.x == 0) {
      const uint64_t prev = *(volatile const uint64_t*)a.done; /* e - 1 */
      ok = mk_wait_geq_inline(a.peer_done, prev, a.err, a.err_tag, MK_GEMM_ERR_TILE_PEER_FREE, a.flag_index,
                              (uint64_t)a.timeout_ms * 1000000ull) >= prev;
      if (!ok) *(volatile uint64_t*)a.gave_up = MK_ATTN_ACC_GATE_CLOSED | (prev + 1);
    }
    if (!__syncthreads_and(ok)) return;
  }
  if (!mk_attn_acc_gate_open(a.gave_up)) return;
  float4* acc = (float4*)a.acc;
  const size_t n4 = a.bytes / 16;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x)
    acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

extern "C" int mk_ra_bwd_zero_launch(const struct mk_ra_bwd_zero_args* a, cudaStream_t stream) {
  int sms = 0;
  MK_CHECK(mk_sm90_sms("ncclMkRingAttentionBackward", &sms));
  if (!a->acc || !a->gave_up || a->bytes % 16 || (a->peer_done && !a->done)) {
    MK_WARN("ncclMkRingAttentionBackward: internal: accumulator %p of %zu bytes, gave-up word %p, done %p",
            (void*)a->acc, a->bytes, (const void*)a->gave_up, (const void*)a->done);
    return -EINVAL;
  }
  const size_t n4 = a->bytes / 16, want = (n4 + MK_RA_BWD_THREADS - 1) / MK_RA_BWD_THREADS;
  const size_t cap = (size_t)sms * 4;
  const unsigned grid = (unsigned)(want < cap ? (want ? want : 1) : cap);
  mk_ra_bwd_zero_kernel<<<grid, MK_RA_BWD_THREADS, 0, stream>>>(*a);
  return mk_kernel_launched("mk_ra_bwd_zero_kernel");
}

struct mk_ra_reduce_params {
  int mode; /* MK_RA_REDUCE_* */
  const float4* own;
  const float4* peer[MK_RA_MAX_RANKS];
  uint64_t* peer_ready[MK_RA_MAX_RANKS];
  const uint64_t* ready;
  uint32_t ready_index0;
  uint2* dk;
  uint2* dv;
  size_t n4; /* float4s of dk (of dv) */
  int rank, nranks;
  struct mk_gemm_call call;
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint64_t timeout_ns;
  const uint64_t* gave_up;
};

static __device__ __forceinline__ uint2 ra_pack_bf16x4(float4 x) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
  uint2 r;
  r.x = *(const uint32_t*)&lo;
  r.y = *(const uint32_t*)&hi;
  return r;
}

/* CTA 0 announces first (its lowest index dispatches it first; the grid is at most one CTA
 * per SM), then every CTA waits for every peer's announcement and sums its share. The peers'
 * accumulators are read with ld.global.cv (no stale cached copy). Sum order: ranks ascending
 * (the own at its place), so it does not depend on timing. */
__global__ void __launch_bounds__(MK_RA_BWD_THREADS) mk_ra_bwd_reduce_kernel(const __grid_constant__ struct mk_ra_reduce_params p) {
  const uint64_t e = *(volatile uint64_t*)p.call.done + 1;
  /* nothing announced once the call gave up on a wait (the gather closed the gate, or any wait
   * raised the record): its partials may be missing, and a late peer would sum stale ones */
  if (p.mode != MK_RA_REDUCE_END && blockIdx.x == 0 && threadIdx.x == 0 && mk_attn_acc_gate_open(p.gave_up) &&
      !ld_relaxed_sys_u32(&p.err->aborted)) {
    fence_acq_rel_sys(); /* the core's accumulator stores (earlier kernels) before the announcement */
    for (int d = 0; d < p.nranks; d++)
      if (d != p.rank) st_release_sys_u64(p.peer_ready[d], e);
  }
  if (p.mode == MK_RA_REDUCE_ANNOUNCE) return;
  if (p.mode == MK_RA_REDUCE_END) return mk_call_end(p.call, p.err);
  __shared__ int ok;
  if (threadIdx.x == 0) {
    int good = 1;
    for (int d = 0; d < p.nranks && good; d++) {
      if (d == p.rank) continue;
      const int slot = d < p.rank ? d : d - 1; /* mk_sched_rs_slot(d, rank) */
      good = mk_wait_geq_inline(p.ready + slot, e, p.err, p.err_tag, (uint32_t)blockIdx.x,
                                p.ready_index0 + (uint32_t)slot, p.timeout_ns) >= e;
    }
    ok = good;
  }
  __syncthreads();
  if (ok) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < 2 * p.n4; i += (size_t)gridDim.x * blockDim.x) {
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int d = 0; d < p.nranks; d++) {
        const float4 x = d == p.rank ? p.own[i] : __ldcv(p.peer[d] + i);
        s.x += x.x, s.y += x.y, s.z += x.z, s.w += x.w;
      }
      if (i < p.n4) p.dk[i] = ra_pack_bf16x4(s);
      else p.dv[i - p.n4] = ra_pack_bf16x4(s);
    }
  }
  mk_call_end(p.call, p.err);
}

extern "C" int mk_ra_bwd_reduce_launch(const struct mk_ra_bwd_reduce_args* a, cudaStream_t stream) {
  int sms = 0;
  MK_CHECK(mk_sm90_sms("ncclMkRingAttentionBackward", &sms));
  if (a->nranks < 2 || a->nranks > MK_RA_MAX_RANKS || a->kv_elems % 4 || !a->err) {
    MK_WARN("ncclMkRingAttentionBackward: internal: nranks %d, kv_elems %zu, error record %p", a->nranks,
            a->kv_elems, (void*)a->err);
    return -EINVAL;
  }
  struct mk_ra_reduce_params p;
  memset(&p, 0, sizeof p);
  p.mode = a->mode;
  p.own = (const float4*)a->own_acc;
  for (int d = 0; d < a->nranks; d++)
    if (d != a->rank) p.peer[d] = (const float4*)a->peer_acc[d], p.peer_ready[d] = a->peer_ready[d];
  p.ready = a->ready, p.ready_index0 = a->ready_index0;
  p.dk = (uint2*)a->dk, p.dv = (uint2*)a->dv;
  p.n4 = a->kv_elems / 4;
  p.rank = a->rank, p.nranks = a->nranks;
  p.call = a->call;
  p.err = a->err, p.err_tag = a->err_tag, p.gave_up = a->gave_up;
  p.timeout_ns = mk_ra_timeout_ns(a->timeout_ms);
  const size_t want = a->mode == MK_RA_REDUCE_ALL ? (2 * p.n4 + MK_RA_BWD_THREADS - 1) / MK_RA_BWD_THREADS : 1;
  const unsigned grid = (unsigned)(want < (size_t)sms ? (want ? want : 1) : (size_t)sms);
  mk_ra_bwd_reduce_kernel<<<grid, MK_RA_BWD_THREADS, 0, stream>>>(p);
  return mk_kernel_launched("mk_ra_bwd_reduce_kernel");
}

/* Every kernel of the ring attention's forward and backward but the backward core's
 * (attn_bwd.cu mk_attn_bwd_load). */
extern "C" int mk_ra_load(void) {
  /* every configuration a call may launch: a first launch's lazy load would wait for the
   * kernels then running (test_ring_attn busy_sms with NCCL_MK_RA_FWD_PERSISTENT=1 hung on it) */
  cudaError_t e = ra_prepare_cfg<mk_ra_cfg_d128>();
  if (e == cudaSuccess) e = ra_prepare_cfg<mk_ra_cfg_d64>();
  if (e == cudaSuccess) e = ra_prepare_cfg<mk_ra_cfg_d128_persistent>();
  if (e == cudaSuccess) e = ra_prepare_cfg<mk_ra_cfg_d64_persistent>();
  if (e != cudaSuccess) {
    MK_WARN("loading the ring attention kernels: %s", cudaGetErrorString(e));
    return -EIO;
  }
  MK_CHECK(mk_kernel_load((const void*)mk_ra_bwd_gather_kernel, "mk_ra_bwd_gather_kernel"));
  MK_CHECK(mk_kernel_load((const void*)mk_ra_bwd_zero_kernel, "mk_ra_bwd_zero_kernel"));
  return mk_kernel_load((const void*)mk_ra_bwd_reduce_kernel, "mk_ra_bwd_reduce_kernel");
}
