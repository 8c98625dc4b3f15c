/* The kernels of the MoE dispatch (moe.h): begin, route, counts, the push/expand comm kernel
 * and finish (also the combine's). */
#include <errno.h>

#include "ag_push.h" /* the call words, shared by every op of a communicator */
#include "moe.h"
#include "moe_copy.cuh"
#include "moe_fp8.cuh"
#include "ptx.cuh"
#include "sm90.h"
#include "trace.h"
#include "wait.cuh"
extern "C" {
#include "mk_err.h"
}

#define MOE_THREADS 512
#define MOE_WARPS (MOE_THREADS / 32)
static_assert(MK_MOE_MAX_LOCAL_EXPERTS < MOE_THREADS && MOE_THREADS / 32 <= 32,
              "moe_counts: a thread per local expert (and one for the end), a warp's scan of the warps");

static __device__ __forceinline__ int* moe_ints(char* area, size_t off) { return (int*)(area + off); }
static __device__ __forceinline__ uint64_t* moe_words(char* area, size_t off) { return (uint64_t*)(area + off); }
static __device__ __forceinline__ uint64_t moe_call(const struct mk_moe_args& a) {
  return *(volatile uint64_t*)(a.words[a.rank] + MK_AG_WORD_CALL);
}
static __device__ __forceinline__ int moe_chunks_max(const struct mk_moe_geom& g) {
  return (g.max_tokens + MK_MOE_CHUNK_ROWS - 1) / MK_MOE_CHUNK_ROWS;
}

/* Thread 0 waits until *word >= want (bounded; a wait for this call's own CTAs longer, so that
 * a missing peer's wait names it); the CTA learns whether it got there. */
static __device__ bool moe_cta_wait(const struct mk_moe_args& a, const uint64_t* word, uint64_t want, uint32_t what,
                                    uint32_t index) {
  uint64_t seen = want;
  const uint64_t bound = what == MK_MOE_WAIT_OWN ? mk_wait_inner_timeout_ns(a.timeout_ns) : a.timeout_ns;
  if (threadIdx.x == 0) seen = mk_wait_geq(word, want, a.err, a.err_tag, what, index, bound);
  return __syncthreads_and(seen >= want);
}

/* moe_cta_wait, recorded (NCCL_MK_TRACE) as a wait of `phase` with flag = index. */
static __device__ bool moe_cta_wait_traced(const struct mk_moe_args& a, const uint64_t* word, uint64_t want,
                                           uint32_t index, struct mk_trace_writer* w, uint32_t role, uint32_t phase) {
  const uint64_t t0 = mk_trace_begin(w);
  const bool ok = moe_cta_wait(a, word, want, MK_MOE_WAIT_OWN, index);
  mk_trace_wait(w, t0, role, phase, index, want, ok ? want : 0);
  return ok;
}

/* One phase of this CTA, from `start` to now (thread 0's lane; nothing when tracing is off). */
static __device__ void moe_trace_phase(struct mk_trace_writer* w, uint64_t start, uint32_t role, uint32_t phase,
                                       uint64_t e) {
  mk_trace_end(w, start, role, MK_TRACE_PHASE, MK_TRACE_NO_PEER, phase, 0, e);
}

/* call = done + 1; with zero_counters also this call's route counters, expert row counters,
 * rows_sent and the expand's item counter. */
static __global__ void moe_begin_kernel(const struct mk_moe_args a, int zero_counters) {
  uint64_t* words = a.words[a.rank];
  if (threadIdx.x == 0) words[MK_AG_WORD_CALL] = words[MK_AG_WORD_DONE] + 1;
  if (!zero_counters) return;
  char* own = a.moe[a.rank];
  int* send_counts = moe_ints(own, a.g.send_counts);
  for (int i = threadIdx.x; i < a.nranks * MK_MOE_COUNT_STRIDE; i += blockDim.x) send_counts[i] = 0;
  uint32_t* rows_done = (uint32_t*)(own + a.g.rows_done);
  for (int j = threadIdx.x; j < a.e_local; j += blockDim.x) rows_done[j] = 0;
  if (threadIdx.x == 0) *a.rows_sent = 0, *(uint32_t*)(own + a.g.expand_next) = 0;
  if (threadIdx.x < MK_MOE_CLAIMS) ((uint32_t*)(own + a.g.claims))[threadIdx.x] = 0;
}

/* The next item of a claim counter (enum mk_moe_claim) for the whole CTA (every thread calls). */
static __device__ int moe_claim(const struct mk_moe_args& a, int which) {
  __shared__ int claimed;
  if (threadIdx.x == 0) claimed = (int)atomicAdd((uint32_t*)(a.moe[a.rank] + a.g.claims) + which, 1u);
  __syncthreads();
  const int c = claimed;
  __syncthreads(); /* every thread read it before the next claim writes it */
  return c;
}

/* Token t's slots: local expert and destination rank of each (-1: masked). */
static __device__ void moe_token_slots(const struct mk_moe_args& a, int t, int* expert, int* dest) {
  for (int s = 0; s < a.topk; s++) {
    const int e = a.topk_idx[(size_t)t * a.topk + s];
    const bool valid = e >= 0 && e < a.num_experts;
    expert[s] = valid ? e % a.e_local : -1;
    dest[s] = valid ? e / a.e_local : -1;
  }
}

/* Token t once per destination d that owns one of its experts: counts only (base NULL), or a
 * place u = base + a count in d's list and, per slot with an expert j on d, a place among
 * this rank's rows for (d, j), written to send_list / send_meta. */
static __device__ void moe_route_token(const struct mk_moe_args& a, int t, int* cnt, const int* base) {
  char* own = a.moe[a.rank];
  const int stride = MK_MOE_META_HEAD + a.g.max_topk;
  int expert[MK_MOE_MAX_TOPK], dest[MK_MOE_MAX_TOPK];
  moe_token_slots(a, t, expert, dest);
  if (base)
    for (int s = 0; s < a.topk; s++) a.slot_dest[(size_t)t * a.g.max_topk + s] = dest[s];
  for (int s = 0; s < a.topk; s++) {
    const int d = dest[s];
    bool first = d >= 0;
    for (int p = 0; p < s && first; p++) first = dest[p] != d;
    if (!first) continue;
    int* c = cnt + d * MK_MOE_COUNT_STRIDE;
    const int u = atomicAdd(&c[0], 1);
    if (!base) {
      for (int q = 0; q < a.topk; q++)
        if (dest[q] == d) atomicAdd(&c[1 + expert[q]], 1);
      continue;
    }
    const int* b = base + d * MK_MOE_COUNT_STRIDE;
    const size_t slot = (size_t)d * a.g.max_tokens + b[0] + u;
    moe_ints(own, a.g.send_list)[slot] = t;
    int* meta = moe_ints(own, a.g.send_meta) + slot * stride;
    meta[0] = t;
    for (int q = 0; q < a.topk; q++)
      meta[MK_MOE_META_HEAD + q] = dest[q] == d ? (expert[q] << MK_MOE_POS_BITS) | (b[1 + expert[q]] + atomicAdd(&c[1 + expert[q]], 1))
                                 : -1;
  }
}

/* Tokens [t0, t1) in two passes over counters in shared memory (fast atomics): count, reserve
 * the chunk's places with one global atomic per counter, place. Places are unique; their
 * order is not fixed (each row of the layout says where it came from). */
static __device__ void moe_route_chunk(const struct mk_moe_args& a, int t0, int t1) {
  __shared__ int cnt[MK_MOE_MAX_RANKS * MK_MOE_COUNT_STRIDE], base[MK_MOE_MAX_RANKS * MK_MOE_COUNT_STRIDE];
  int* global = moe_ints(a.moe[a.rank], a.g.send_counts);
  const int n = a.nranks * MK_MOE_COUNT_STRIDE;
  for (int i = threadIdx.x; i < n; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  for (int t = t0 + threadIdx.x; t < t1; t += blockDim.x) moe_route_token(a, t, cnt, NULL);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    base[i] = cnt[i] ? atomicAdd(&global[i], cnt[i]) : 0;
    cnt[i] = 0;
  }
  __syncthreads();
  for (int t = t0 + threadIdx.x; t < t1; t += blockDim.x) moe_route_token(a, t, cnt, base);
}

/* After a route chunk: 1 in the CTA that finished the call's last one (it then sees every
 * chunk's counts). */
static __device__ bool moe_route_chunk_done(const struct mk_moe_args& a, int chunks) {
  __shared__ int last;
  __syncthreads(); /* every thread's writes before thread 0's fence */
  if (threadIdx.x == 0) {
    uint32_t* done = (uint32_t*)(a.moe[a.rank] + a.g.route_done);
    __threadfence();
    last = atomicAdd(done, 1u) == (uint32_t)chunks - 1;
    if (last) {
      *done = 0; /* for the next call: every chunk is counted */
      __threadfence();
    }
  }
  __syncthreads();
  return last;
}

/* Route chunks claimed until none is left; 1 in the CTA that finished the last. */
static __device__ bool moe_route(const struct mk_moe_args& a) {
  int per;
  const int chunks = mk_moe_route_chunks(a.tokens, gridDim.x, &per);
  bool last = false;
  for (int c = moe_claim(a, MK_MOE_CLAIM_ROUTE); c < chunks; c = moe_claim(a, MK_MOE_CLAIM_ROUTE)) {
    moe_route_chunk(a, c * per, min(a.tokens, (c + 1) * per));
    last = moe_route_chunk_done(a, chunks);
  }
  return last;
}

/* Warp d: once d finished the previous call, this rank's counts for d into d's counts[rank],
 * then d's counts_flag[rank] = call. 1 on success (the same in every lane). */
static __device__ int moe_counts_publish(const struct mk_moe_args& a, int d, uint64_t e) {
  const int lane = threadIdx.x & 31;
  uint64_t done = e;
  if (d != a.rank && lane == 0)
    done = mk_wait_geq(a.words[d] + MK_AG_WORD_DONE, e - 1, a.err, a.err_tag, MK_MOE_WAIT_PEER_DONE, (uint32_t)d,
                      a.timeout_ns);
  if (__shfl_sync(0xffffffffu, done, 0) < e - 1) return 0;
  const int* src = moe_ints(a.moe[a.rank], a.g.send_counts) + d * MK_MOE_COUNT_STRIDE;
  int* dst = moe_ints(a.moe[d], a.g.counts) + a.rank * MK_MOE_COUNT_STRIDE;
  for (int i = lane; i <= a.e_local; i += 32) dst[i] = src[i];
  __syncwarp();
  if (lane == 0) {
    fence_acq_rel_sys();
    st_release_sys_u64(moe_words(a.moe[d], a.g.counts_flag) + a.rank, e);
  }
  return 1;
}

/* Expert j's rows: sources in rank order. seg[j][src] = rows of j from sources before src. */
static __device__ int moe_expert_rows(const struct mk_moe_args& a, int j) {
  char* own = a.moe[a.rank];
  const int* counts = moe_ints(own, a.g.counts);
  int* seg = moe_ints(own, a.g.seg) + j * MK_MOE_MAX_RANKS;
  int rows = 0;
  for (int src = 0; src < a.nranks; src++) {
    seg[src] = rows;
    rows += *(volatile const int*)&counts[src * MK_MOE_COUNT_STRIDE + 1 + j];
  }
  return rows;
}

/* More rows arrive than the layout holds: the error record says so (the comm breaks). */
static __device__ void moe_report_overflow(const struct mk_moe_args& a, long total) {
  mk_gemm_error_raise(a.err, a.err_tag | MK_MOE_ERR_OVERFLOW, 0, 0, (uint64_t)a.g.max_recv_rows,
                      (uint64_t)total);
}

/* Inclusive prefix sum over the CTA (one value per thread; every thread calls it). */
static __device__ long long moe_cta_scan(long long x) {
  __shared__ long long warp_sums[MOE_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (int d = 1; d < 32; d <<= 1) {
    const long long y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    long long s = lane < MOE_WARPS ? warp_sums[lane] : 0;
    for (int d = 1; d < 32; d <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += y;
    }
    if (lane < MOE_WARPS) warp_sums[lane] = s;
  }
  __syncthreads();
  return x + (warp ? warp_sums[warp - 1] : 0);
}

/* The last routing CTA: counts to every rank, every source's counts back, then the group
 * offsets (a prefix sum over the CTA's threads, thread j expert j) and offsets_ready = call
 * for the other CTAs. On a timeout or more rows than fit, the offsets say "no rows" (the
 * GEMM and the expand do nothing) and the error record says why. Needs at least nranks warps
 * and e_local <= MK_MOE_MAX_LOCAL_EXPERTS < MOE_THREADS. The offsets took 8-13 us with thread 0
 * summing and storing them one by one and a system-scope fence (trace, session 28); only this
 * GPU reads them. */
static __device__ void moe_counts(const struct mk_moe_args& a, uint64_t e) {
  __shared__ long long total;
  int ok = 1;
  if ((int)threadIdx.x / 32 < a.nranks) ok = moe_counts_publish(a, threadIdx.x / 32, e);
  ok = __syncthreads_and(ok);
  if (ok && threadIdx.x < a.nranks)
    ok = mk_wait_geq(moe_words(a.moe[a.rank], a.g.counts_flag) + threadIdx.x, e, a.err, a.err_tag, MK_MOE_WAIT_COUNTS,
                     threadIdx.x, a.timeout_ns) >= e;
  ok = __syncthreads_and(ok);
  const int j = threadIdx.x;
  const long long rows = ok && j < a.e_local ? moe_expert_rows(a, j) : 0;
  const long long end = moe_cta_scan(rows); /* expert j's rows end here */
  if (j == a.e_local - 1) total = end;
  __syncthreads();
  const bool overflow = total > a.g.max_recv_rows;
  if (j < a.e_local) a.group_offsets[j] = overflow ? 0 : (int)(end - rows);
  if (j == a.e_local) a.group_offsets[j] = overflow ? 0 : (int)total;
  __syncthreads(); /* every thread's offsets and seg (moe_expert_rows) before thread 0's fence */
  if (threadIdx.x != 0) return;
  if (overflow) moe_report_overflow(a, (long)total);
  __threadfence();
  st_release_gpu_u64(moe_words(a.moe[a.rank], a.g.offsets_ready), e);
}

/* Push CTAs: the last routing CTA said every token is placed (before it exchanges counts). */
static __device__ bool moe_routed(const struct mk_moe_args& a, uint64_t e, struct mk_trace_writer* w) {
  return moe_cta_wait_traced(a, moe_words(a.moe[a.rank], a.g.routed), e, 0, w, MK_TRACE_COMM_SEND, MK_MOE_TRACE_PUSH);
}

/* Expand CTAs: the last routing CTA published the offsets. */
static __device__ bool moe_offsets_ready(const struct mk_moe_args& a, uint64_t e, struct mk_trace_writer* w) {
  return moe_cta_wait_traced(a, moe_words(a.moe[a.rank], a.g.offsets_ready), e, 1, w, MK_TRACE_COMM_RECV,
                             MK_MOE_TRACE_EXPAND);
}

/* Chunk c (16 rows) of this rank's listed tokens for d, n rows in all, and their slots into
 * d's recv[rank] / meta[rank], then the chunk's flag. */
static __device__ void moe_push_chunk(const struct mk_moe_args& a, int d, int c, int n, uint64_t e,
                                      struct mk_trace_writer* w) {
  char* own = a.moe[a.rank];
  char* peer = a.moe[d];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, stride = MK_MOE_META_HEAD + a.g.max_topk;
  const size_t row_bytes = (size_t)a.hidden * 2;
  const size_t base = (size_t)a.rank * a.g.max_tokens; /* our slot in the peer's arrays */
  const uint64_t t0 = mk_trace_begin(w);
  const int u0 = c * MK_MOE_CHUNK_ROWS, u1 = min(n, u0 + MK_MOE_CHUNK_ROWS);
  for (int u = u0 + warp; u < u1; u += MOE_WARPS) {
    const size_t mine = (size_t)d * a.g.max_tokens + u;
    const int t = moe_ints(own, a.g.send_list)[mine];
    const char* x_row = (const char*)a.x + (size_t)t * row_bytes;
    float scale = 0.f;
    char* dst = peer + a.g.recv + (base + u) * row_bytes;
    if (a.fp8) scale = moe_quant_row((uint2*)dst, (const uint4*)x_row, a.hidden / 8);
    else moe_copy_row<false>(dst, x_row, a.hidden);
    if (lane < stride)
      moe_ints(peer, a.g.meta)[(base + u) * stride + lane] =
          lane == 1 ? __float_as_int(scale) : moe_ints(own, a.g.send_meta)[mine * stride + lane];
  }
  __syncthreads(); /* every thread's stores before thread 0's fence */
  if (threadIdx.x == 0) {
    const size_t flag = (size_t)a.rank * moe_chunks_max(a.g) + c;
    fence_acq_rel_sys();
    st_release_sys_u64(moe_words(peer, a.g.chunk_flag) + flag, e);
    atomicAdd(a.rows_sent, (unsigned long long)(u1 - u0));
    mk_trace_end(w, t0, MK_TRACE_COMM_SEND, MK_TRACE_CHUNK, (uint32_t)d, (uint32_t)c, (uint32_t)flag, e);
  }
}

/* Push CTAs: (destination, chunk) items claimed in order, the peers in ring order; a peer's
 * first once it finished the previous call. Runs while the last routing CTA exchanges the
 * counts. */
static __device__ void moe_push(const struct mk_moe_args& a, uint64_t e, struct mk_trace_writer* w) {
  const int* send_counts = moe_ints(a.moe[a.rank], a.g.send_counts);
  int chunks[MK_MOE_MAX_RANKS];
  for (int step = 0; step < a.nranks; step++) {
    const int n = step ? send_counts[((a.rank + step) % a.nranks) * MK_MOE_COUNT_STRIDE] : 0;
    chunks[step] = (n + MK_MOE_CHUNK_ROWS - 1) / MK_MOE_CHUNK_ROWS;
  }
  uint32_t peers_free = 0; /* the peers seen done with the previous call */
  for (;;) {
    int c;
    const int step = mk_moe_step_item(chunks, a.nranks, moe_claim(a, MK_MOE_CLAIM_PUSH), &c);
    if (step < 0) return;
    const int d = (a.rank + step) % a.nranks;
    if (!(peers_free >> d & 1u)) {
      if (!moe_cta_wait(a, a.words[d] + MK_AG_WORD_DONE, e - 1, MK_MOE_WAIT_PEER_DONE, (uint32_t)d)) return;
      peers_free |= 1u << d;
    }
    moe_push_chunk(a, d, c, send_counts[d * MK_MOE_COUNT_STRIDE], e, w);
  }
}

/* Vectors [part * nvec / parts, ...) of a row, by a warp: read once, written at each
 * (expert, source, pos) place of its slots with a local expert. Every part adds one to its
 * experts' counters; the part that completes an expert (rows x parts) raises its ready flag. */
static __device__ void moe_expand_part(const struct mk_moe_args& a, int src, const int* meta, const void* row,
                                       bool peer_written, int part, int parts, uint64_t e) {
  char* own = a.moe[a.rank];
  const int lane = threadIdx.x & 31, nvec = a.hidden / 8;
  const int t = peer_written ? __ldcg(meta) : meta[0];
  uint4* dst[MK_MOE_MAX_TOPK];
  int expert[MK_MOE_MAX_TOPK], n = 0;
  for (int s = 0; s < a.topk; s++) {
    const int v = peer_written ? __ldcg(meta + MK_MOE_META_HEAD + s) : meta[MK_MOE_META_HEAD + s];
    if (v < 0) continue;
    const int j = v >> MK_MOE_POS_BITS, pos = v & ((1 << MK_MOE_POS_BITS) - 1);
    const int r = a.group_offsets[j] + moe_ints(own, a.g.seg)[j * MK_MOE_MAX_RANKS + src] + pos;
    if (part == 0 && lane < 3) a.row_source[(size_t)r * 3 + lane] = lane == 0 ? src : lane == 1 ? t : s;
    dst[n] = (uint4*)(own + a.g.rows + (size_t)r * a.hidden * 2);
    expert[n++] = j;
  }
  const int v0 = (int)((long)nvec * part / parts), v1 = (int)((long)nvec * (part + 1) / parts);
  if (a.fp8 && peer_written) {
    moe_land_fp8_row_to<true>(dst, n, row, 0.f, __int_as_float(__ldcg(meta + 1)), v0, v1);
  } else if (a.fp8) { /* own rows: the same rounding as the rows that moved */
    const float amax = moe_row_amax((const uint4*)row, nvec);
    moe_land_fp8_row_to<false>(dst, n, row, moe_fp8_inv(amax), moe_fp8_scale(amax), v0, v1);
  } else if (peer_written) {
    mk_copy_vecs<MOE_COPY_UNROLL, true>(dst, n, (const uint4*)row, v0, v1, lane, 32);
  } else {
    mk_copy_vecs<MOE_COPY_UNROLL, false>(dst, n, (const uint4*)row, v0, v1, lane, 32);
  }
  if (!a.mark_ready) return; /* the GEMM runs after this kernel: no per-expert flags to raise */
  __syncwarp(); /* every lane's stores before lane 0's fence */
  if (lane != 0) return;
  __threadfence();
  for (int i = 0; i < n; i++) {
    const int j = expert[i];
    const uint32_t done = atomicAdd((uint32_t*)(own + a.g.rows_done) + j, 1u) + 1;
    if ((int)done == (a.group_offsets[j + 1] - a.group_offsets[j]) * parts) {
      __threadfence();
      st_release_sys_u64(moe_words(own, a.g.ready) + j, e);
    }
  }
}

/* Warps per row of `rows` (every source's): 1 when rows outnumber the expand warps; else up to
 * 16 warps split each row, so a small dispatch (decode: a few rows per source) is short too. */
static __device__ int moe_expand_parts(int rows, int warps) {
  int parts = 1;
  while (parts < 16 && rows * parts * 2 <= warps) parts *= 2;
  return parts;
}

/* The expand's next item after a warp's first: past the expand warps' first items, from the
 * call's counter (zeroed by the begin kernel); `total` once every item is taken (also when the
 * first items cover them all: no atomics then, decode's case). */
static __device__ int moe_expand_claim(uint32_t* next, int warps, int total, int lane) {
  if (total <= warps) return total;
  int i = 0;
  if (lane == 0) i = warps + (int)atomicAdd(next, 1u);
  return __shfl_sync(0xffffffffu, i, 0);
}

/* Expand: every source's rows (own first, read in place; then the ranks that push to us first),
 * item i = u * parts + p (part p of row u) numbered across sources in that order
 * (mk_moe_step_item), each peer row once its chunk's flag is up. Expand warp w starts at item
 * w (first_item; -1: a push CTA's warp, which joins once its push is done) and claims the rest
 * in order from a counter: the copies run at a rate that grows with the SMs doing them
 * (2.35 / 2.51 / 2.87 TB/s of writes on 66 / 99 / 132 SMs, session 28), and the push's SMs
 * were idle for the expand's last 55 us (DeepSeek-like trace, session 27). */
static __device__ void moe_expand(const struct mk_moe_args& a, uint64_t e, int first_item) {
  char* own = a.moe[a.rank];
  if (a.group_offsets[a.e_local] == 0) return; /* nothing arrives, or the counts step gave up */
  const int warps = a.expand_ctas * MOE_WARPS, stride = MK_MOE_META_HEAD + a.g.max_topk, lane = threadIdx.x & 31;
  const size_t row_bytes = (size_t)a.hidden * 2;
  int items[MK_MOE_MAX_RANKS], rows = 0, total = 0;
  for (int step = 0; step < a.nranks; step++) { /* each source's rows, read once */
    const int src = (a.rank - step + a.nranks) % a.nranks;
    items[step] = *(volatile int*)&moe_ints(own, a.g.counts)[src * MK_MOE_COUNT_STRIDE];
    rows += items[step];
  }
  const int parts = moe_expand_parts(rows, warps);
  for (int step = 0; step < a.nranks; step++) {
    items[step] *= parts;
    total += items[step];
  }
  uint32_t* next = (uint32_t*)(own + a.g.expand_next);
  int arrived = -1; /* the last chunk flag seen up: flags only grow, items come in order */
  for (int i = first_item >= 0 ? first_item : moe_expand_claim(next, warps, total, lane); i < total;
       i = moe_expand_claim(next, warps, total, lane)) {
    int local;
    const int step = mk_moe_step_item(items, a.nranks, i, &local);
    const int src = (a.rank - step + a.nranks) % a.nranks;
    const bool self = src == a.rank;
    const int u = local / parts, flag = src * moe_chunks_max(a.g) + u / MK_MOE_CHUNK_ROWS;
    if (!self && flag != arrived) {
      uint64_t seen = e;
      if (lane == 0)
        seen = mk_wait_geq(moe_words(own, a.g.chunk_flag) + flag, e, a.err, a.err_tag, MK_MOE_WAIT_CHUNK, (uint32_t)flag,
                           a.timeout_ns);
      if (__shfl_sync(0xffffffffu, seen, 0) < e) return;
      arrived = flag;
    }
    const size_t slot = (size_t)src * a.g.max_tokens + u;
    const int* meta = self ? moe_ints(own, a.g.send_meta) + slot * stride : moe_ints(own, a.g.meta) + slot * stride;
    const void* row = self ? (const char*)a.x + (size_t)meta[0] * row_bytes : own + a.g.recv + slot * row_bytes;
    moe_expand_part(a, src, meta, row, !self, local % parts, parts, e);
  }
}

/* The dispatch in one kernel: CTAs claim the tokens' route chunks; the one that finishes the
 * last says so (push CTAs start), exchanges the counts and publishes the offsets (expand CTAs
 * start). `phases` (MK_MOE_PHASE_*) runs a part: with the GEMM beside the comm phase, the route
 * phase runs first on the GEMM's stream, whose scheduler reads the offsets when it starts.
 * Roles and work are claimed, so the CTAs that are resident finish every phase whatever the
 * others do (moe.h). The grid does not depend on the tokens: with none (x and topk_idx never
 * read) every phase still runs, so zero counts reach the peers and the rows they push are
 * expanded for this rank's GEMM. */
static __global__ void __launch_bounds__(MOE_THREADS) moe_dispatch_kernel(const struct mk_moe_args a, int phases) {
  /* With NCCL_MK_MOE_OVERLAP the GEMM is this kernel's programmatic dependent (gemm.h pdl): it
   * takes SMs only once every CTA here runs, so it cannot hold them all waiting for flags that
   * this kernel, left without an SM, would never raise. Without a dependent: nothing. */
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const uint64_t e = moe_call(a);
  /* NCCL_MK_TRACE: thread 0 writes this CTA's comm lane; the calls below do nothing elsewhere */
  struct mk_trace_writer w = {0, 0, 0, 0};
  if (threadIdx.x == 0) w = mk_trace_open(a.trace, blockIdx.x, MK_TRACE_LANE_COMM);
  uint64_t t0 = mk_trace_begin(&w);
  if (phases & MK_MOE_PHASE_ROUTE) {
    const bool last = moe_route(a);
    moe_trace_phase(&w, t0, MK_TRACE_COMM_SEND, MK_MOE_TRACE_ROUTE, e);
    if (last) {
      t0 = mk_trace_begin(&w);
      if (threadIdx.x == 0) st_release_sys_u64(moe_words(a.moe[a.rank], a.g.routed), e); /* after its fence */
      moe_counts(a, e);
      moe_trace_phase(&w, t0, MK_TRACE_COMM_SEND, MK_MOE_TRACE_COUNTS, e);
    }
  }
  if (!(phases & MK_MOE_PHASE_COMM)) return;
  const int role = moe_claim(a, MK_MOE_CLAIM_ROLE); /* arrival order: the first ones push */
  const bool pushes = role < a.push_ctas;
  if (pushes) {
    if (!moe_routed(a, e, &w)) return;
    t0 = mk_trace_begin(&w);
    moe_push(a, e, &w);
    moe_trace_phase(&w, t0, MK_TRACE_COMM_SEND, MK_MOE_TRACE_PUSH, e);
  }
  /* the push CTAs join the expand once their rows are out */
  if (moe_offsets_ready(a, e, &w)) {
    t0 = mk_trace_begin(&w);
    moe_expand(a, e, pushes ? -1 : (role - a.push_ctas) * MOE_WARPS + (int)threadIdx.x / 32);
    if (a.trace) __syncthreads(); /* the phase ends with the CTA's last warp */
    moe_trace_phase(&w, t0, MK_TRACE_COMM_RECV, MK_MOE_TRACE_EXPAND, e);
  }
}

static __global__ void moe_finish_kernel(uint64_t* words) {
  fence_acq_rel_sys();
  st_release_sys_u64(words + MK_AG_WORD_DONE, words[MK_AG_WORD_CALL]);
}

extern "C" int mk_moe_begin_launch(const struct mk_moe_args* a, int zero_counters, cudaStream_t stream) {
  moe_begin_kernel<<<1, 256, 0, stream>>>(*a, zero_counters);
  return mk_kernel_launched("moe_begin_kernel");
}

extern "C" int mk_moe_dispatch_launch(const struct mk_moe_args* a, int phases, int ctas, cudaStream_t stream) {
  moe_dispatch_kernel<<<ctas, MOE_THREADS, 0, stream>>>(*a, phases);
  return mk_kernel_launched("moe_dispatch_kernel");
}

extern "C" int mk_moe_finish_launch(const struct mk_moe_args* a, cudaStream_t stream) {
  moe_finish_kernel<<<1, 1, 0, stream>>>(a->words[a->rank]);
  return mk_kernel_launched("moe_finish_kernel");
}

extern "C" int mk_moe_dispatch_load(void) {
  MK_CHECK(mk_kernel_load((const void*)moe_begin_kernel, "moe_begin_kernel"));
  MK_CHECK(mk_kernel_load((const void*)moe_dispatch_kernel, "moe_dispatch_kernel"));
  return mk_kernel_load((const void*)moe_finish_kernel, "moe_finish_kernel");
}
