/*
 * The GEMM core's reduce-scatter epilogue (gemm.h rs; GEMM+ReduceScatter and GEMM+AllReduce):
 * which rank owns a tile's rows, the waits for the peers' partials and for the peers to leave
 * their previous call, the own-rows sum (storer warps, and the consumers for a CTA's last
 * tile), the counters raised after a tile's stores, and the all-reduce's collect of the peers'
 * reduced rows. Included by gemm.cuh where these were written (after the staging helpers),
 * so that the kernel's code is unchanged.
 */
#ifndef MK_GEMM_RS_CUH_
#define MK_GEMM_RS_CUH_

/* ---- reduce-scatter epilogue (gemm.h, rs) ------------------------------------------------- */

/* The rank whose shard a tile's rows are in; -1 without the rs epilogue. */
__device__ __forceinline__ int gemm_rs_owner(const struct mk_gemm_params& p, const struct mk_tile& t) {
  return p.rs.shard_rows ? t.row0 / p.rs.shard_rows : -1;
}

/* One thread: waits until every peer's partial of this rank's row-block mb (of the shard) is
 * complete (a remote peer's flag carries the same tile count). 0 on timeout (the error record
 * names the tile and the counter: src x blocks + mb). */
__device__ __noinline__ int gemm_rs_wait_peers(const struct mk_gemm_params& p, int mb, int blocks, int tile,
                                              uint64_t tiles_n) {
  for (int src = 0; src < p.rs.nranks; src++)
    if (src != p.rs.rank && mk_wait_geq(p.rs.in_counts[src] + mb, tiles_n, p.err, p.err_tag, (uint32_t)tile,
                                        (uint32_t)(src * blocks + mb), p.timeout_ns) < tiles_n)
      return 0;
  return 1;
}

/* ---- across nodes (gemm.h rs.xn; fused/proxy/xnode.h) ---- */

/* One thread, before a CTA's first store: the bounce buffer's out slots are free once every
 * descriptor of the previous call completed at the source. 0 on timeout or a failed proxy. */
__device__ __noinline__ int gemm_xn_rs_staging_free(const struct mk_gemm_params& p) {
  struct mk_xnode_dev* xn = p.rs.xn;
  const uint64_t tail = xn->call_tail;
  if (!tail || !mk_proxy_queue_wait_completed(xn->q, p.rs.rank, tail - 1, xn->timeout_ns)) return 1;
  mk_gemm_error_raise(p.err, p.err_tag, MK_GEMM_ERR_TILE_PROXY_SENT, (uint32_t)p.rs.rank, tail,
                      mk_pq_load_acquire(&xn->q->completed));
  return 0;
}

/* The sender CTA's thread 0: until every other CTA has counted its exit (call_end.cuh),
 * bounded; 0 when it gave up (timeout, or another wait of the call did). The other CTAs wait
 * for peers: the inner bound lets their record, the cause, be the one kept (session 46: at 4
 * ranks this wait expired first and named itself). */
__device__ __forceinline__ int gemm_xn_wait_others_left(const struct mk_gemm_params& p) {
  const uint32_t want = gridDim.x - 1;
  const uint64_t t0 = globaltimer_ns();
  for (uint32_t seen; (seen = ld_relaxed_sys_u32(p.call.exits)) < want;) {
    if (ld_relaxed_sys_u32(&p.err->aborted)) return 0;
    if (globaltimer_ns() - t0 > mk_wait_inner_timeout_ns(p.timeout_ns)) {
      mk_gemm_error_raise(p.err, p.err_tag, MK_GEMM_ERR_TILE_OWN_CTAS, (uint32_t)p.rs.rank, want,
                          seen);
      return 0;
    }
    __nanosleep(MK_WAIT_MAX_SLEEP_NS);
  }
  fence_acq_rel_sys(); /* the other CTAs' work, counted by their exits, before the done signals */
  return 1;
}

/* The sender's thread 0: once row-block mb's counter (count) is complete, its put+signal to
 * peer d (a partial, or with gather this rank's reduced rows). 0 when a wait or the queue
 * failed (the call's error record says why). */
__device__ __forceinline__ int gemm_xn_rs_publish(const struct mk_gemm_params& p, int d, int blocks, int mb,
                                                  const uint64_t* count, uint64_t tiles_n, uint64_t row_bytes,
                                                  int gather) {
  struct mk_xnode_dev* xn = p.rs.xn;
  const int rank = p.rs.rank;
  const uint64_t t0 = p.trace ? globaltimer_ns() : 0;
  /* this call's CTAs store them: the inner bound */
  const uint64_t seen = mk_wait_geq_inline(count, tiles_n, p.err, p.err_tag, MK_GEMM_ERR_TILE_OWN_ROWS, (uint32_t)d,
                                           mk_wait_inner_timeout_ns(p.timeout_ns));
  /* NCCL_MK_TRACE: the wait for the row-block's tiles (peer: its destination; flag 1: the gather) */
  mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_COMM, t0, MK_TRACE_COMM_SEND, MK_TRACE_WAIT, (uint32_t)d,
                (uint32_t)mb, (uint32_t)gather, tiles_n, seen);
  if (seen < tiles_n) return 0;
  const uint64_t t1 = p.trace ? globaltimer_ns() : 0;
  const struct mk_proxy_desc desc = mk_xn_rs_block_desc(rank, d, p.rs.nranks, blocks, mb, row_bytes, tiles_n, gather,
                                                        p.err_tag);
  const int rc = mk_proxy_mp_publish(xn->q, &xn->prod.tail, &desc, xn->timeout_ns, rank, NULL);
  if (rc)
    mk_gemm_error_raise(p.err, p.err_tag, MK_GEMM_ERR_TILE_PROXY_SENT, (uint32_t)d, tiles_n,
                        (uint64_t)(-rc));
  /* and its publication (room in the queue). No peer: the proxy moves the rows after, so its
   * end is not their arrival (scripts/mktrace/analysis.py arrival_events) */
  mk_trace_emit(p.trace, blockIdx.x, MK_TRACE_LANE_COMM, t1, MK_TRACE_COMM_SEND, MK_TRACE_CHUNK, MK_TRACE_NO_PEER,
                (uint32_t)mb, (uint32_t)gather, (uint64_t)d + 1, rc == 0 ? (uint64_t)d + 1 : 0);
  return rc == 0;
}

/* The cross-node sender CTA (gemm.h rs.xn; it takes the grid's first slot, as the
 * all-gather's push CTAs do). Its thread 0 publishes each remote owner's row-block once its
 * counter (raised by the storers after every tile, as for an NVLink peer) is complete, in the
 * order the GEMM computes them (its flag at the owner carries the tile count, as a counter
 * would), and with the all-reduce's gather each of this rank's reduced row-blocks to every
 * remote rank once its gather counter is; then, once every other CTA has left the call (the
 * own rows' sums are done, the peers' partials read), zeroes the remote peers' flags here,
 * signals done to them, notes where this call ended, and leaves the call last. Not inlined
 * (gemm_push_cta): the GEMM roles' register budgets stay as they are. */
template <class Cfg>
__device__ void gemm_xn_rs_sender(const struct mk_gemm_params& p) {
  if (threadIdx.x != 0) return;
  struct mk_xnode_dev* xn = p.rs.xn;
  const int blocks = p.rs.shard_rows / Cfg::BM, n = p.rs.nranks, rank = p.rs.rank;
  const uint64_t e = *(volatile uint64_t*)p.call.done + 1, tiles_n = (uint64_t)((p.n + Cfg::BN - 1) / Cfg::BN);
  const uint64_t row_bytes = (uint64_t)Cfg::BM * p.n * 2;
  for (int pos = 0; pos < n * blocks; pos++) { /* the partials, then (all-reduce) the reduced rows */
    const int rb = mk_sched_rs_row_block(rank, n, blocks, pos), owner = rb / blocks, mb = rb % blocks;
    if (!(p.rs.remote_mask >> owner & 1) && !(owner == rank && p.rs_gather)) continue;
    for (int d = owner == rank ? 0 : owner; d < (owner == rank ? n : owner + 1); d++) {
      if (!(p.rs.remote_mask >> d & 1)) continue;
      const uint64_t* count = (owner == rank ? p.rs.gather_counts[d] : p.rs.out_counts[d]) + mb;
      if (!gemm_xn_rs_publish(p, d, blocks, mb, count, tiles_n, row_bytes, owner == rank)) return;
    }
  }
  if (!gemm_xn_wait_others_left(p)) return;
  /* the remote peers' flags back to 0 for the next call (their puts wait for our done) */
  for (int src = 0; src < n; src++)
    for (int mb = 0; (p.rs.remote_mask >> src & 1) && mb < blocks; mb++) {
      ((uint64_t*)p.rs.in_counts[src])[mb] = 0;
      if (p.rs_gather) ((uint64_t*)p.rs.gathered_counts[src])[mb] = 0;
    }
  fence_acq_rel_sys();
  for (int d = 0; d < n; d++) {
    if (!(p.rs.remote_mask >> d & 1)) continue;
    const struct mk_proxy_desc done = mk_xn_done_desc(rank, d, e, p.err_tag);
    if (mk_proxy_mp_publish(xn->q, &xn->prod.tail, &done, xn->timeout_ns, rank, NULL)) return;
  }
  xn->last_call = e;
  xn->call_tail = mk_pq_load_acquire(&xn->prod.tail);
}

/* This rank's own rows, one consumer's staged half of a tile: c = the tile + the peers'
 * partials (fp32 sum, one rounding), and the same into every peer's gather slot; this thread
 * is `lane` of `lanes`. One chunk's loads in flight: two spilled the storer warps (the producer
 * warp group's few registers) by 100+ bytes and the consumers (their accumulator) by 24. */
template <class Cfg>
__device__ __forceinline__ void gemm_rs_sum_half(const struct mk_gemm_params& p, uint32_t base, int lane, int lanes,
                                                 int row0, int row_end, int col0, size_t shard_off) {
  constexpr int CHUNKS_ROW = Cfg::BN / 8;
  for (int c = lane; c < 64 * CHUNKS_ROW; c += lanes) {
    const int r = c / CHUNKS_ROW, cc = c % CHUNKS_ROW, gcol = col0 + cc * 8;
    if (row0 + r >= row_end || gcol >= p.n) continue;
    const size_t off = shard_off + (size_t)r * p.n + gcol;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    bf16x8_add_to_f32(acc, ld_shared_v4_b32(base + stage_offset(r, cc * 8)));
    for (int src = 0; src < p.rs.nranks; src++)
      if (src != p.rs.rank)
        bf16x8_add_to_f32(acc, mk_load_vec<true>((const uint4*)((const __nv_bfloat16*)p.rs.in[src] + off)));
    const uint4 v = f32x8_to_bf16x8(acc);
    st_global_v4_b32((__nv_bfloat16*)p.c + off, v);
    if (p.rs_gather)
      for (int d = 0; d < p.rs.nranks; d++)
        if (d != p.rs.rank) st_global_v4_b32((__nv_bfloat16*)p.rs.gather[d] + off, v);
  }
}

/* The storers' call of it. Not inlined: the storer warps' register budget. */
template <class Cfg>
__device__ __noinline__ void gemm_rs_store_own(const struct mk_gemm_params& p, uint32_t base, int stid, int row0,
                                               int row_end, int col0, size_t shard_off) {
  gemm_rs_sum_half<Cfg>(p, base, stid, Cfg::STORER_THREADS, row0, row_end, col0, shard_off);
}

/* After a tile's stores are visible at system scope (one thread): the owner's counter, or
 * with the gather every peer's. */
__device__ __forceinline__ void gemm_rs_raise(const struct mk_gemm_params& p, int owner, int mb) {
  if (owner != p.rs.rank) red_release_sys_add_u64(p.rs.out_counts[owner] + mb, 1);
  else if (p.rs_gather)
    for (int d = 0; d < p.rs.nranks; d++)
      if (d != p.rs.rank) red_release_sys_add_u64(p.rs.gather_counts[d] + mb, 1);
}

/* One thread: waits until every peer finished its previous call (its done >= e - 1; a remote
 * peer's done flag >= the last cross-node call, and this rank's out slots free), so what this
 * call writes into it is free. 0 on timeout (flag_index: the peer). */
__device__ __noinline__ int gemm_call_wait_peers_free(const struct mk_gemm_params& p) {
  const uint64_t e = *(volatile uint64_t*)p.call.done + 1;
  if (p.rs.xn && !gemm_xn_rs_staging_free(p)) return 0;
  for (int d = 0; d < p.call.nranks; d++) {
    const uint64_t want = p.rs.remote_mask >> d & 1 ? p.rs.xn->last_call : e - 1;
    if (d != p.call.rank && mk_wait_geq(p.call.peer_done[d], want, p.err, p.err_tag, MK_GEMM_ERR_TILE_PEER_FREE,
                                        (uint32_t)d, p.timeout_ns) < want)
      return 0;
  }
  return 1;
}

/* Whether the consumer warp groups store tile t themselves when it is the CTA's last (the
 * storer warps skip it; both sides see the same tiles): nothing is left to hide that tile's
 * epilogue behind, and 256 threads finish it sooner than the storers' 96 (bench/NOTES.md,
 * "the tail"). Plain stores or bf16 adds (gemm_epilogue_bf16) and a reduce-scatter's own rows
 * (gemm_rs_own_last_tile); not a peer's rows, not the row scatter; single-group schedules. */
__device__ __forceinline__ bool gemm_tile_storable_by_consumers(const struct mk_gemm_params& p, const struct mk_tile& t) {
  return t.valid && p.num_groups == 1 && !p.scatter.row_dest && (!p.rs.shard_rows || gemm_rs_owner(p, t) == p.rs.rank);
}

/* The static walk: tile t (slot id) is the CTA's last and its consumers store it. The
 * claimed walk learns its last tile from the producer's next slot word instead
 * (gemm_claimed_walk_ends). */
template <class Cfg>
__device__ __forceinline__ bool gemm_last_tile_by_consumers(const struct mk_gemm_params& p, const struct mk_sched& s,
                                                            int id, int slot_step, const struct mk_tile& t) {
  return Cfg::CLUSTER_M == 1 && !p.claim_end && id + slot_step >= s.g_slots_m * s.tiles_n &&
         gemm_tile_storable_by_consumers(p, t);
}

/* The CTA's last own tile, by its consumer warp group: staged as for the storers (once they
 * are done with the buffer), then the peers' partials awaited and summed into its half by its
 * 128 threads (gemm_rs_sum_half; the two halves at once), and with the gather,
 * both halves' stores before one fence and the counters. Why: nothing is left to hide the last
 * tile's epilogue behind, and the storers' 96 threads with one load in flight took 35 us (71
 * us with the gather's stores into the peers) after the last MMA (bench/NOTES.md, "the tail"). */
template <class Cfg>
__device__ __forceinline__ void gemm_rs_own_last_tile(const float* acc, const struct mk_gemm_params& p,
                                                      const struct mk_tile& t, int wg, uint8_t* cstage,
                                                      uint64_t* c_empty, uint32_t c_phase, int tiles_n) {
  const int tid = threadIdx.x & 127;
  const int shard_row0 = p.rs.rank * p.rs.shard_rows, mb = (t.row0 - shard_row0) / Cfg::BM;
  gemm_stage_write<Cfg>(acc, cstage, c_empty, c_phase);
  /* as the storers: nothing before every peer left its previous call, then their partials */
  const int ok = bar_red_and(6 + wg, 128,
                             tid != 0 || ((!p.call.done || gemm_call_wait_peers_free(p)) &&
                                          gemm_rs_wait_peers(p, mb, p.rs.shard_rows / Cfg::BM, t.linear,
                                                             (uint64_t)tiles_n)));
  if (ok)
    gemm_rs_sum_half<Cfg>(p, smem_addr(cstage), tid, 128, t.row0 + wg * 64, t.row_end, t.col0,
                             (size_t)(t.row0 + wg * 64 - shard_row0) * p.n);
  if (p.rs_gather && bar_red_and(3, 256, ok) && threadIdx.x == 128) {
    fence_acq_rel_sys();
    gemm_rs_raise(p, p.rs.rank, mb);
  }
}

#define MK_GEMM_RS_COLLECT_SPLITS 8 /* CTAs sharing one row-block's copy */

/* The all-reduce's last step, by the producer warp group (128 threads) once its tiles are stored:
 * items (a peer's reduced row-block, split 8 ways) taken in order from a counter and copied
 * from this rank's gather slots into c_full, each once the peer's counter says it is complete.
 * Only once every GEMM CTA has started (gemm.h collect_claims): before that a CTA leaves the
 * items to the later ones, since a wait here could hold the SM a tile of those rows needs. The
 * CTA that starts last finds them all started, so every item is taken. `slot`: a shared word
 * (thread 0 hands each claimed item to the group through it). */
template <class Cfg>
__device__ __noinline__ void gemm_rs_collect(const struct mk_gemm_params& p, volatile int* slot) {
  const int tid = threadIdx.x, blocks = p.rs.shard_rows / Cfg::BM;
  const uint64_t tiles_n = (uint64_t)((p.n + Cfg::BN - 1) / Cfg::BN);
  const int items = (p.rs.nranks - 1) * blocks * MK_GEMM_RS_COLLECT_SPLITS;
  const size_t block_vecs = (size_t)Cfg::BM * p.n / 8;
  const size_t per = (block_vecs + MK_GEMM_RS_COLLECT_SPLITS - 1) / MK_GEMM_RS_COLLECT_SPLITS;
  unsigned long long* claims = (unsigned long long*)p.rs.collect_claims;
  if (!bar_red_and(5, 128, tid != 0 || *(volatile uint64_t*)claims >= (uint64_t)p.gemm_ctas))
    return;
  for (;;) {
    if (tid == 0) *slot = (int)atomicAdd(&claims[1], 1ull);
    bar_sync(5, 128);
    const int item = *slot;
    if (item >= items) return;
    const int split = item % MK_GEMM_RS_COLLECT_SPLITS, ib = item / MK_GEMM_RS_COLLECT_SPLITS;
    const int src = (p.rs.rank + 1 + ib / blocks) % p.rs.nranks, mb = ib % blocks;
    const int ok = tid != 0 || mk_wait_geq(p.rs.gathered_counts[src] + mb, tiles_n, p.err, p.err_tag,
                                           MK_GEMM_ERR_TILE_COLLECT, (uint32_t)(src * blocks + mb),
                                           p.timeout_ns) >= tiles_n;
    if (!bar_red_and(5, 128, ok)) return; /* also: every thread read the slot before its next write */
    const size_t lo = per * split, hi = lo + per < block_vecs ? lo + per : block_vecs;
    const uint4* from = (const uint4*)p.rs.gathered[src] + (size_t)mb * block_vecs;
    uint4* to = (uint4*)p.rs.c_full + ((size_t)src * blocks + mb) * block_vecs;
    /* 4 loads in flight per thread: 128 threads alone are latency-bound otherwise (8 spilled) */
    mk_copy_vecs<4, true>(&to, 1, from, (int)lo, (int)hi, tid, 128);
  }
}

#endif /* MK_GEMM_RS_CUH_ */
