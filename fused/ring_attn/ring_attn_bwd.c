/*
 * ncclMkRingAttentionBackward (issue 12), first version: simpler than the issue asks. Every
 * rank gathers every peer's K and V (the forward's push and slots, not a forwarding ring), the
 * backward core computes on it, and the partial dK/dV of each block are reduced at its owner,
 * who reads them from each peer's accumulator over NVLink. Per call on rank r:
 *   1. on the fused comm's side stream: gather (ring_attn.cu, one kernel): the forward's push
 *      CTAs copy r's k, v into its slot on every peer (after the peer's done >= e-1), then wait
 *      (bounded) for every peer's k, v; then a zero of the peers' fp32 accumulators acc[src] =
 *      [dk | dv] (ra_bwd_plan.h's workspace) that r fills for them (skipped, as the core's
 *      stores into them are, once the call gave up on a wait: a peer late by more than the
 *      timeout may still be reading them for its previous call).
 *   2. meanwhile on the caller's stream: a memset of acc[r] (only r reads it) and the backward
 *      core (mk_attn_bwd_launch) on r's own block, ra_bwd_plan.h's first calls, one per query
 *      range (zigzag half, or all rows);
 *   3. once the side stream is done: the calls on the peers' blocks, up to four KV segments
 *      per call, each at its global positions, dq accumulated in fp32 across a range's calls
 *      and written by its last, the partial dK/dV of block src added into acc[src]. 2 or 3
 *      kernels per call (delta, main, dq).
 *   4. reduce (ring_attn.cu, one kernel): announce (ready word on every peer = e), wait for every
 *      peer's, dk, dv = bf16(sum over ranks of acc[r] on that rank), done = e.
 * Non-causal, each block is in exactly one core call, so the partials skip the memsets and the
 * read-back: the core stores (acc_overwrite) rank r's partial of block src straight into acc[r]
 * on src (over NVLink, plain stores during the compute), and the reduce reads only local
 * memory; the announcement orders those stores as it does the causal accumulators.
 * NCCL_MK_RA_BWD_MERGED=1 (the causal default since session 43, on one-GPU evidence: +3-4%
 * at 16K and +0% at 64K with two ranks under MPS; not yet run on 2 GPUs): step 3's calls
 * merge into step 2's (mk_ra_bwd_plan_merged: one call per query range over the own and the
 * peers' blocks, launched beside the gather), whose CTAs on a peer's block wait for their
 * chunks' flags (the core's ready_flags) instead of the stream waiting for the whole gather;
 * the join moves before step 4; causal, the peers' accumulators are zeroed on the caller's
 * stream first, each after a bounded wait for its owner to have ended its previous call (step
 * 1 zeroes nothing).
 * NCCL_MK_RA_BWD_OWN_LAST=1 (non-causal; the default since session 43, on one-GPU evidence:
 * ring_bwd_emul +7.5%, two ranks under MPS +8-11%; not yet run on 2 GPUs): everything on the
 * caller's stream, no side stream and no reduce pass: the first call's delta and dq_acc
 * zeroing, the gather (it lets the next kernel start beside it: pdl), the calls on the peers'
 * blocks (their CTAs waiting for each chunk; partials stored into the owners' acc[r] as
 * above), the announcement (the reduce kernel's first part), the call on the own block, whose
 * CTAs wait for every peer's announcement and write dk, dv = bf16(their sum + the peers'
 * partials) (the core's addends), and the call's end (the reduce kernel's last part). It
 * saves the reduce's pass over every partial and the own partial's fp32 round trip (one GPU,
 * ring_bwd_emul: +7.5% at B=16 H=16 S_local=4096).
 * So 4 + (kernels of the core calls) launches (each core call is one kernel with
 * NCCL_MK_RA_BWD_ONE_LAUNCH=1: attn.h phase_words; as fast for the core alone, 0-1.6% slower
 * for two ranks under MPS, so not the default).
 * NCCL_MK_RA_BWD_ONE_KERNEL=1 (2-4 ranks, causal with S_local a multiple of 256; session 62,
 * not yet run on a GPU, so not the default): the own-last plan's work as one core call of
 * every whole block, the own block last (mk_ra_bwd_plan_one; causal, the queries and each block
 * in their two zigzag chunks: the core's two-piece positions, q_split and a block's split, so
 * each block's partial is whole in this one call and is stored, as non-causal ones are), in
 * one kernel with the ring's parts (attn.h mk_attn_bwd_args push,
 * announce, call_done; attn_bwd_phase.cuh): the push CTAs (kv_push.cuh, the gather's push
 * without its waits: the peers' blocks' CTAs wait for their chunks), delta and dq_acc, the
 * peers' blocks (partials stored into the owners' acc[rank]; each block's last CTA raises the
 * announcement the reduce kernel's first part raised), the own block (the peers' partials
 * added once announced), dq, and the call's end (done = e) by the last CTA.
 * A peer reads acc[r] of this rank only after r's announcement, and r zeroes its accumulators
 * (step 2 of the next call) only after step 1 saw every peer's done >= e: no second buffer.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "ag_push.h"
#include "attn.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "op_check.h"
#include "ra_bwd_plan.h"
#include "ring_attn.h"
#include "schedule.h"

#define MK_RA_BWD_NAME "ncclMkRingAttentionBackward"
_Static_assert(MK_RA_BWD_MAX_RANKS == MK_RA_MAX_RANKS, "ra_bwd_plan.h plans for every rank count the op takes");
_Static_assert(MK_AG_WORD_ATTN_PHASE + MK_ATTN_BWD_PHASE_WORDS <= MK_AG_FLAG0, "the core's phase words fit before the flags");

int mk_ra_bwd_args_check(const void* q, const void* k, const void* v, const void* out, const float* lse,
                         const void* dout, const void* dq, const void* dk, const void* dv, size_t batch,
                         size_t s_local, size_t heads, size_t kv_heads, size_t d_head, int causal) {
  const void* ptrs[] = {q, k, v, out, dout, dq, dk, dv};
  const char* names[] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
  for (int i = 0; i < 8; i++)
    if (!ptrs[i] || (uintptr_t)ptrs[i] % 16) {
      MK_WARN(MK_RA_BWD_NAME ": %s = %p, must be non-NULL and 16-byte aligned", names[i], ptrs[i]);
      return -EINVAL;
    }
  if (!lse) {
    MK_WARN(MK_RA_BWD_NAME ": lse is NULL (the forward's log-sum-exp is required)");
    return -EINVAL;
  }
  MK_CHECK(mk_ra_shape_check(MK_RA_BWD_NAME, lse, batch, s_local, heads, kv_heads, d_head, causal));
  const size_t qb = batch * s_local * heads * d_head * 2, kb = batch * s_local * kv_heads * d_head * 2;
  const void* all[] = {q, k, v, out, dout, lse, dq, dk, dv};
  const char* all_names[] = {"q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv"};
  const size_t bytes[] = {qb, kb, kb, qb, qb, batch * heads * s_local * 4, qb, kb, kb};
  return mk_op_overlap_check(MK_RA_BWD_NAME, all, all_names, bytes, 9, 6);
}

/* Flag word `index` of ra_bwd_plan.h's layout in the workspace at `sym` (this rank's or a peer's). */
static uint64_t* ra_bwd_word(void* sym, long index) { return (uint64_t*)sym + MK_AG_FLAG0 + index; }

/* Peer d's "partials ready" word of this rank: raised when this rank's partial of d's block is
 * in (the reduce kernel's announcement, or the one-kernel call's last CTA of that block). */
static uint64_t* ra_bwd_peer_ready(const struct mk_fused_comm* fc, const struct mk_ra_bwd_layout* l, int d) {
  return ra_bwd_word(fc->peer_sym[d], l->ready0 + mk_sched_rs_slot(fc->rank, d));
}

/* The own-last plan's own block (segment i of its call): dk, dv written whole, with every peer
 * d's partial (acc[d] here, stored by d) added once d has announced it (ready word slot(d)). */
static void ra_bwd_own_block_last(const struct mk_ra_bwd_areas* ar, const struct mk_ra_bwd_layout* l,
                                  const struct mk_ra_bwd_tensors* t, int i, struct mk_attn_bwd_args* a) {
  a->kv[i].dk = t->dk, a->kv[i].dv = t->dv;
  a->addends.n = ar->nranks - 1, a->addends.block = i, a->addends.flag_index0 = ar->ready_index0;
  for (int d = 0; d < ar->nranks; d++) {
    if (d == ar->rank) continue;
    const int slot = mk_sched_rs_slot(d, ar->rank);
    a->addends.dk[slot] = mk_ra_bwd_acc(ar->data, l, d);
    a->addends.dv[slot] = a->addends.dk[slot] + l->kv_elems;
    a->addends.ready[slot] = ar->ready + slot;
  }
  a->ready_done = ar->done;
}

/* Rank owner's local rows as a core call sees them: one zigzag half (which = 0, 1) at its
 * chunk's position, or all of them (-1): causal, the two chunks (a split at half); non-causal,
 * one piece at owner x s_local. */
struct ra_bwd_rows {
  int row0, rows, split;
  long long pos0, pos1;
};

static struct ra_bwd_rows ra_bwd_rows_of(int owner, int n, int which, int causal, int s_local) {
  const int half = s_local / 2;
  struct ra_bwd_rows x = {0, s_local, 0, (long long)owner * s_local, 0};
  if (which >= 0) {
    x.row0 = which * half, x.rows = half, x.pos0 = (long long)mk_ra_zigzag_chunk(owner, n, which) * half;
  } else if (causal) {
    x.split = half;
    x.pos0 = (long long)mk_ra_zigzag_chunk(owner, n, 0) * half, x.pos1 = (long long)mk_ra_zigzag_chunk(owner, n, 1) * half;
  }
  return x;
}

/* Segment i of the call: its K/V (own, or the peer's slot with its chunk flags), where its
 * partials go, its rows and positions. */
static void ra_bwd_segment_args(const struct mk_ra_bwd_areas* ar, const struct mk_ra_bwd_layout* l,
                                const struct mk_ra_bwd_tensors* t, const struct mk_ra_bwd_seg* seg, int i,
                                struct mk_attn_bwd_args* a) {
  const int r = ar->rank, src = seg->src;
  struct mk_attn_bwd_kv_block* b = &a->kv[i];
  if (src == r) {
    b->k = t->k, b->v = t->v;
  } else {
    const uint16_t* slot = /* bf16 */
        (const uint16_t*)((char*)ar->data + l->slots) + (size_t)mk_sched_rs_slot(src, r) * 2 * l->kv_elems;
    b->k = slot, b->v = slot + l->kv_elems;
    if (ar->flags) {
      b->ready_flags = ar->flags + (long)mk_sched_rs_slot(src, r) * ar->fps;
      b->ready_chunk_rows = ar->chunk_rows;
      a->ready_done = ar->done;
    }
  }
  if (ar->ready && src == r) { /* the own-last plan */
    ra_bwd_own_block_last(ar, l, t, i, a);
  } else if (seg->k_half >= 0) { /* a block's halves meet several query ranges: added here, read by the owner */
    b->dk_acc = mk_ra_bwd_acc(ar->data, l, src);
  } else { /* the whole block in one call: stored straight into the owner's acc[r] */
    b->dk_acc = mk_ra_bwd_acc(src == r ? ar->data : ar->peer_data[src], l, r);
    b->acc_overwrite = 1;
  }
  if (b->dk_acc) b->dv_acc = b->dk_acc + l->kv_elems;
  const struct ra_bwd_rows x = ra_bwd_rows_of(src, ar->nranks, seg->k_half, t->causal, t->s_local);
  b->seq = t->s_local, b->row0 = x.row0, b->rows = x.rows, b->split = x.split, b->pos0 = x.pos0, b->pos1 = x.pos1;
}

void mk_ra_bwd_core_args(const struct mk_ra_bwd_areas* ar, const struct mk_ra_bwd_layout* l,
                         const struct mk_ra_bwd_call* c, const struct mk_ra_bwd_tensors* t, struct mk_attn_bwd_args* a) {
  memset(a, 0, sizeof *a);
  a->q = t->q, a->out = t->out, a->dout = t->dout, a->lse = t->lse;
  a->delta = (float*)((char*)ar->data + l->delta);
  a->dq_acc = (float*)((char*)ar->data + l->dq_acc);
  a->dq = c->last ? t->dq : NULL;
  a->batch = t->batch, a->seq_q = t->s_local, a->heads = t->heads, a->kv_heads = t->kv_heads, a->d_head = t->d_head;
  a->causal = t->causal;
  /* causal, all rows (q_half -1): the one-kernel call, both zigzag chunks at their positions */
  const struct ra_bwd_rows q = ra_bwd_rows_of(ar->rank, ar->nranks, c->q_half, t->causal, t->s_local);
  a->q_row0 = q.row0, a->q_rows = q.rows, a->q_split = q.split, a->q_pos0 = q.pos0, a->q_pos1 = q.pos1;
  a->dq_accumulate = a->delta_ready = !c->first;
  a->num_kv_blocks = c->nseg;
  for (int i = 0; i < c->nseg; i++) ra_bwd_segment_args(ar, l, t, &c->seg[i], i, a);
  a->acc_gate = ar->acc_gate;
  a->err = ar->err, a->err_tag = ar->err_tag;
  a->timeout_ms = ar->timeout_ms;
}

/* Step 4's arguments: this rank's accumulator of its own block, each peer's accumulator of
 * this rank's block and its "partials ready" word, the outputs and the call's words. */
static void ra_bwd_reduce_args(const struct mk_fused_comm* fc, const struct mk_ra_bwd_layout* l, void* data,
                               const struct mk_ra_args* ga, void* dk, void* dv, struct mk_ra_bwd_reduce_args* ra) {
  memset(ra, 0, sizeof *ra);
  ra->own_acc = mk_ra_bwd_acc(data, l, fc->rank);
  for (int d = 0; d < fc->nranks; d++) {
    if (d == fc->rank) continue;
    void* peer_data = (char*)fc->peer_sym[d] + MK_AG_DATA_OFFSET;
    /* causal: d's partial of this block is in d's acc[rank]; non-causal: d stored it in ours, acc[d] */
    ra->peer_acc[d] = ga->causal ? mk_ra_bwd_acc(peer_data, l, fc->rank) : mk_ra_bwd_acc(data, l, d);
    ra->peer_ready[d] = ra_bwd_peer_ready(fc, l, d);
  }
  ra->ready = ra_bwd_word(fc->sym, l->ready0);
  ra->ready_index0 = (uint32_t)l->ready0;
  ra->dk = dk, ra->dv = dv;
  ra->kv_elems = l->kv_elems;
  ra->rank = fc->rank, ra->nranks = fc->nranks;
  ra->call = ga->call;
  ra->err = fc->err, ra->err_tag = ga->err_tag, ra->timeout_ms = ga->timeout_ms, ra->gave_up = ga->gave_up;
}

void mk_ra_bwd_zero_wait(const struct mk_ra_args* ga, int d, struct mk_ra_bwd_zero_args* z) {
  z->peer_done = ga->call.peer_done[d], z->done = ga->call.done, z->err = ga->err;
  z->err_tag = ga->err_tag | MK_GEMM_ERR_TAG_PUSH, z->flag_index = (uint32_t)d, z->timeout_ms = ga->timeout_ms;
}

/* The peers' accumulators in this rank's memory zeroed on `stream` (causal: each call adds into
 * them). wait (the merged plan, on the caller's stream): each zero first waits, bounded, for
 * its owner to have ended its previous call (its reduce read them); else (step 1, after the
 * gather, which saw every peer start this call) at once. */
static int ra_bwd_zero_peers(const struct mk_fused_comm* fc, const struct mk_ra_args* ga,
                             const struct mk_ra_bwd_layout* l, void* data, int wait, cudaStream_t stream) {
  for (int d = 0; d < fc->nranks; d++) {
    if (d == fc->rank) continue;
    struct mk_ra_bwd_zero_args z = {.acc = mk_ra_bwd_acc(data, l, d), .bytes = mk_ra_bwd_acc_bytes(l),
                                    .gave_up = ga->gave_up};
    if (wait) mk_ra_bwd_zero_wait(ga, d, &z);
    MK_CHECK(mk_ra_bwd_zero_launch(&z, stream));
  }
  return 0;
}

/* Step 1 of the top on fc's side stream, forked from `stream`; fc->ev_join marks its end. The
 * merged plan zeroes the peers' accumulators on the caller's stream instead (ra_bwd_zero_peers). */
static int ra_bwd_gather_beside(struct mk_fused_comm* fc, const struct mk_ra_args* ga,
                                const struct mk_ra_bwd_layout* l, void* data, int merged, cudaStream_t stream) {
  MK_CHECK(mk_cuda_check(cudaEventRecord(fc->ev_fork, stream), "cudaEventRecord (fork)"));
  MK_CHECK(mk_cuda_check(cudaStreamWaitEvent(fc->side, fc->ev_fork, 0), "cudaStreamWaitEvent"));
  MK_CHECK(mk_ra_bwd_gather_launch(ga, fc->side));
  if (ga->causal && !merged) MK_CHECK(ra_bwd_zero_peers(fc, ga, l, data, 0, fc->side)); /* non-causal stores whole */
  return mk_cuda_check(cudaEventRecord(fc->ev_join, fc->side), "cudaEventRecord (join)");
}

/* The one-kernel call: 2 to MK_RA_BWD_MAX_SEGS ranks (every block in one core call); causal,
 * zigzag chunks of whole 128-key tiles (the core's two-piece positions cut between tiles). */
static int ra_bwd_one_kernel_fits(int causal, int nranks, int s_local) {
  return nranks >= 2 && nranks <= MK_RA_BWD_MAX_SEGS && (!causal || s_local % (2 * MK_ATTN_BWD_BLOCK_N) == 0);
}

static enum mk_ra_bwd_plan_kind ra_bwd_plan_kind(int causal, int nranks, int s_local) {
  if (mk_param_int(MK_PARAM_RA_BWD_ONE_KERNEL) && ra_bwd_one_kernel_fits(causal, nranks, s_local))
    return MK_RA_BWD_ONE_KERNEL;
  if (!causal && mk_param_int(MK_PARAM_RA_BWD_OWN_LAST)) return MK_RA_BWD_OWN_LAST;
  return mk_param_int(MK_PARAM_RA_BWD_MERGED) ? MK_RA_BWD_MERGED : MK_RA_BWD_SPLIT;
}

/* The one-kernel call's ring parts: each peer's block announced to its owner (the "partials
 * ready" word of this rank on it, as the reduce kernel's announcement) by its last CTA; this
 * rank's K/V pushed by the first CTAs (ga's slots and words); the call ended by the last CTA. */
static void ra_bwd_one_kernel_parts(const struct mk_fused_comm* fc, const struct mk_ra_args* ga,
                                    const struct mk_ra_bwd_layout* l, const struct mk_ra_bwd_call* c,
                                    struct mk_attn_bwd_args* a) {
  for (int i = 0; i < c->nseg; i++) {
    const int src = c->seg[i].src;
    if (src != fc->rank) a->kv[i].announce = ra_bwd_peer_ready(fc, l, src);
  }
  mk_ra_kv_push(ga, l->kv_elems, &a->push);
  a->push.call = ga->call.call;
  a->call_done = ga->call.done;
}

/* The one-kernel call's split-heads workspace (grouped-query heads at D = 128: a CTA per query
 * head, attn.h dkv_ws), after the layout's regions, when the workspace holds it; else NULL: a
 * CTA per kv head's group, with which the one kernel ran the 16K causal GQA shape 7%
 * below the merged plan on one GPU (ring_bwd_emul, bench/NOTES.md session 65). */
static float* ra_bwd_one_kernel_ws(const struct mk_fused_comm* fc, const struct mk_ra_bwd_layout* l, void* data,
                                   const struct mk_attn_bwd_args* a) {
  const size_t floats = mk_attn_bwd_dkv_ws_floats(a), at = mk_ra_bwd_align(l->total);
  if (!floats || at + floats * sizeof(float) > mk_fused_data_bytes(fc)) return NULL;
  return (float*)((char*)data + at);
}

int mk_ra_bwd_build_calls(const struct mk_fused_comm* fc, const struct mk_ra_args* ga, const struct mk_ra_bwd_layout* l,
                          void* data, int chunk_rows, enum mk_ra_bwd_plan_kind kind, const struct mk_ra_bwd_tensors* t,
                          struct mk_ra_bwd_call* plan, struct mk_attn_bwd_args* core, int* own_calls) {
  const int n = fc->nranks;
  const int ncalls = kind == MK_RA_BWD_ONE_KERNEL ? mk_ra_bwd_plan_one(fc->rank, n, plan, MK_RA_BWD_MAX_CALLS)
                     : kind == MK_RA_BWD_OWN_LAST ? mk_ra_bwd_plan_own_last(fc->rank, n, t->causal, plan, MK_RA_BWD_MAX_CALLS)
                     : kind == MK_RA_BWD_MERGED   ? mk_ra_bwd_plan_merged(fc->rank, n, t->causal, plan, MK_RA_BWD_MAX_CALLS)
                                               : mk_ra_bwd_plan(fc->rank, n, t->causal, plan, MK_RA_BWD_MAX_CALLS, own_calls);
  if (ncalls < 1) {
    MK_WARN(MK_RA_BWD_NAME ": internal: no plan for rank %d of %d", fc->rank, n);
    return -EPROTO;
  }
  if (kind != MK_RA_BWD_SPLIT) *own_calls = ncalls; /* every call before the join */
  struct mk_ra_bwd_areas areas = {.rank = fc->rank, .nranks = n, .data = data,
                                   .acc_gate = ra_bwd_word(fc->sym, l->gave_up), /* the gather's "gave up" */
                                   .err = fc->err, .err_tag = mk_op_err_tag(fc, MK_OP_RING_ATTN_BWD),
                                   .timeout_ms = (uint32_t)fc->cfg.timeout_ms};
  for (int d = 0; d < n; d++) areas.peer_data[d] = d == fc->rank ? data : (char*)fc->peer_sym[d] + MK_AG_DATA_OFFSET;
  if (kind != MK_RA_BWD_SPLIT) {
    areas.flags = ra_bwd_word(fc->sym, 0), areas.fps = l->fps, areas.chunk_rows = chunk_rows;
    areas.done = (const uint64_t*)fc->sym + MK_AG_WORD_DONE;
  }
  if (kind == MK_RA_BWD_OWN_LAST || kind == MK_RA_BWD_ONE_KERNEL)
    areas.ready = ra_bwd_word(fc->sym, l->ready0), areas.ready_index0 = (uint32_t)l->ready0;
  /* every core call of this rank is on the caller's stream, one after the other: one set of words */
  uint64_t* phase = mk_param_int(MK_PARAM_RA_BWD_ONE_LAUNCH) || kind == MK_RA_BWD_ONE_KERNEL
                        ? (uint64_t*)fc->sym + MK_AG_WORD_ATTN_PHASE
                        : NULL;
  for (int i = 0; i < ncalls; i++) {
    mk_ra_bwd_core_args(&areas, l, &plan[i], t, &core[i]);
    core[i].phase_words = phase;
    if (kind == MK_RA_BWD_ONE_KERNEL) {
      ra_bwd_one_kernel_parts(fc, ga, l, &plan[i], &core[i]);
      core[i].dkv_ws = ra_bwd_one_kernel_ws(fc, l, data, &core[i]);
    }
    MK_CHECK(mk_attn_bwd_check(&core[i]));
  }
  if (kind == MK_RA_BWD_OWN_LAST) { /* its prep is launched apart (ra_bwd_run_own_last) */
    core[0].delta_ready = core[0].dq_accumulate = 1, core[0].pdl = 1;
    MK_CHECK(mk_attn_bwd_check(&core[0]));
  }
  return ncalls;
}

/* The own-last plan on the caller's stream: the first call's delta and dq_acc zeroing; the
 * gather (its pushes feed the peers' waiting CTAs, so it is on the SMs first: the first call
 * starts beside it, pdl); the calls on the peers' blocks (partials stored into the owners'
 * acc[rank]); the announcement of those; the own block's call, whose CTAs wait for every
 * peer's announcement and add their partials into dk, dv; the call's end. */
static int ra_bwd_run_own_last(struct mk_fused_comm* fc, const struct mk_ra_args* ga, const struct mk_ra_bwd_layout* l,
                               void* data, const struct mk_attn_bwd_args* core, int ncalls, void* dk, void* dv,
                               cudaStream_t stream) {
  struct mk_attn_bwd_args prep = core[0];
  prep.delta_ready = prep.dq_accumulate = 0, prep.pdl = 0;
  MK_CHECK(mk_attn_bwd_prep_launch(&prep, stream));
  MK_CHECK(mk_ra_bwd_gather_launch(ga, stream));
  for (int i = 0; i < ncalls - 1; i++) MK_CHECK(mk_attn_bwd_launch(&core[i], stream));
  struct mk_ra_bwd_reduce_args ra;
  ra_bwd_reduce_args(fc, l, data, ga, dk, dv, &ra);
  ra.mode = MK_RA_REDUCE_ANNOUNCE;
  MK_CHECK(mk_ra_bwd_reduce_launch(&ra, stream));
  MK_CHECK(mk_attn_bwd_launch(&core[ncalls - 1], stream));
  ra.mode = MK_RA_REDUCE_END;
  return mk_ra_bwd_reduce_launch(&ra, stream);
}

/* The split and merged plans: the gather (and, causal and not merged, the peers' accumulators
 * zeroed) on the side stream; on the caller's stream (causal) this rank's accumulator zeroed,
 * (merged) the peers' after their owners' previous calls, the first own_calls calls, the join,
 * the rest, the reduce. */
static int ra_bwd_run_beside(struct mk_fused_comm* fc, const struct mk_ra_args* ga, const struct mk_ra_bwd_layout* l,
                             void* data, int merged, const struct mk_attn_bwd_args* core, int ncalls, int own_calls,
                             void* dk, void* dv, cudaStream_t stream) {
  MK_CHECK(ra_bwd_gather_beside(fc, ga, l, data, merged, stream));
  if (ga->causal)
    MK_CHECK(mk_cuda_check(cudaMemsetAsync(mk_ra_bwd_acc(data, l, fc->rank), 0, mk_ra_bwd_acc_bytes(l), stream),
                           "cudaMemsetAsync"));
  if (ga->causal && merged) MK_CHECK(ra_bwd_zero_peers(fc, ga, l, data, 1, stream));
  for (int i = 0; i < own_calls; i++) MK_CHECK(mk_attn_bwd_launch(&core[i], stream));
  MK_CHECK(mk_cuda_check(cudaStreamWaitEvent(stream, fc->ev_join, 0), "cudaStreamWaitEvent"));
  for (int i = own_calls; i < ncalls; i++) MK_CHECK(mk_attn_bwd_launch(&core[i], stream));
  struct mk_ra_bwd_reduce_args ra;
  ra_bwd_reduce_args(fc, l, data, ga, dk, dv, &ra);
  return mk_ra_bwd_reduce_launch(&ra, stream);
}

/* The one kernel (its ring parts in, checked), traced with NCCL_MK_TRACE (the other plans'
 * kernels have no events). */
static int ra_bwd_run_one_kernel(struct mk_fused_comm* fc, struct mk_attn_bwd_args* a, cudaStream_t stream) {
  MK_CHECK(mk_trace_comm_begin(fc, MK_OP_RING_ATTN_BWD, (uint32_t)(a->batch * a->seq_q), (uint32_t)a->heads, stream,
                               &a->trace));
  MK_CHECK(mk_attn_bwd_launch(a, stream));
  return mk_trace_comm_end(fc, stream);
}

NCCL_MK_API ncclResult_t ncclMkRingAttentionBackward(const void* q, const void* k, const void* v, const void* out,
                                                     const float* lse, const void* dout, void* dq, void* dk, void* dv,
                                                     size_t batch, size_t s_local, size_t heads, size_t kv_heads,
                                                     size_t d_head, int causal, ncclDataType_t type, ncclComm_t comm,
                                                     cudaStream_t stream) {
  int rc = mk_ra_bwd_args_check(q, k, v, out, lse, dout, dq, dk, dv, batch, s_local, heads, kv_heads, d_head, causal);
  if (rc) return mk_result_from_errno(mk_op_refuse(comm, stream, rc));
  struct mk_op_call call = {
      .op = MK_OP_RING_ATTN_BWD, .name = MK_RA_BWD_NAME, .m = batch * s_local, .n = heads * d_head,
      .k = kv_heads * d_head, .type = type, .m_split = 0, .ptrs = {q, k, v, dout},
      .ptr_names = {"q", "k", "v", "dout"}, .nptrs = 4, .comm = comm, .stream = stream};
  struct mk_fused_comm* fc;
  rc = mk_op_check(&call, &fc);
  if (rc) return mk_result_from_errno(rc);
  const int n = fc->nranks, B = (int)batch, S = (int)s_local, H = (int)heads, Hkv = (int)kv_heads, D = (int)d_head;
  struct mk_ra_bwd_layout l;
  mk_ra_bwd_layout(n, B, S, H, Hkv, D, 128, &l); /* the bytes do not depend on the chunk */
  int chunk_rows = 0;
  rc = mk_ra_comm_check(fc, MK_RA_BWD_NAME, l.total, B, S, l.flag_words - l.ready0, &chunk_rows);
  if (rc) return mk_result_from_errno(rc);
  mk_ra_bwd_layout(n, B, S, H, Hkv, D, chunk_rows, &l);
  void* data = (char*)fc->sym + MK_AG_DATA_OFFSET;

  struct mk_ra_bwd_call plan[MK_RA_BWD_MAX_CALLS];
  struct mk_attn_bwd_args core[MK_RA_BWD_MAX_CALLS];
  const enum mk_ra_bwd_plan_kind kind = ra_bwd_plan_kind(causal, n, S);
  const struct mk_ra_bwd_tensors tensors = {.q = q, .k = k, .v = v, .out = out, .lse = lse, .dout = dout, .dq = dq,
                                            .batch = B, .s_local = S, .heads = H, .kv_heads = Hkv, .d_head = D,
                                            .causal = causal, .dk = dk, .dv = dv};
  struct mk_ra_args ga; /* the gather's, and the one-kernel call's push and words */
  mk_ra_fill_args(fc, MK_OP_RING_ATTN_BWD, k, v, B, S, H, Hkv, D, causal, chunk_rows, l.kv_elems * 2, &ga);
  ga.gave_up = ra_bwd_word(fc->sym, l.gave_up);
  int own_calls = 0;
  const int ncalls = mk_ra_bwd_build_calls(fc, &ga, &l, data, chunk_rows, kind, &tensors, plan, core, &own_calls);
  if (ncalls < 0) return mk_result_from_errno(ncalls);

  int prev;
  rc = mk_op_device_enter(fc, &prev);
  if (!rc)
    rc = kind == MK_RA_BWD_ONE_KERNEL ? ra_bwd_run_one_kernel(fc, &core[0], stream)
         : kind == MK_RA_BWD_OWN_LAST ? ra_bwd_run_own_last(fc, &ga, &l, data, core, ncalls, dk, dv, stream)
                                   : ra_bwd_run_beside(fc, &ga, &l, data, kind == MK_RA_BWD_MERGED, core, ncalls,
                                                       own_calls, dk, dv, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
