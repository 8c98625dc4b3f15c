/*
 * ncclMkRingAttentionBackward's first version (issue 12; ring_attn_bwd.c): which calls of the
 * backward core (attn.h mk_attn_bwd_launch) a rank makes, and where its workspace lives. Pure
 * functions, callable from host code, unit-tested for 2 to 8 ranks (test/unit/test_ra_bwd_plan.c).
 *
 * The core takes one query range and up to MK_ATTN_MAX_KV_BLOCKS KV segments per call, each at
 * its global positions. Causal (zigzag): per local query half (chunk r, then chunk 2n-1-r) the
 * KV halves of every block the mask lets through (mk_ra_step_mask != NONE), in ring order
 * (mk_ra_kv_source), four to a call. Non-causal: all query rows against whole blocks, four to
 * a call. The calls against this rank's own block come first (they overlap the gather of the
 * peers' K/V), then those against the peers'. A query range's first call computes delta and
 * zeroes dq_acc, its last writes dq.
 *
 * Workspace (the fused data area, identical offsets on every rank, each region 256-byte
 * aligned): the n-1 K/V slots of the forward (slot j = [k | v] bf16, so the forward's push
 * writes them unchanged), then n fp32 accumulators acc[src] = [dk | dv] (the partial dK/dV of
 * rank src's block; peers read acc[owner] of each other over NVLink), then delta (fp32
 * [B, H, S_local]) and dq_acc (fp32 like q), used only locally.
 * Flags (u64 words from MK_AG_FLAG0): the forward's K/V chunk flags (n-1 slots x fps), then
 * n-1 "partials ready" words, word (n-1) * fps + mk_sched_rs_slot(from, to) on rank `to`, then
 * the "gave up" word (this rank's only): the gather marks it (MK_ATTN_ACC_GATE_CLOSED | call,
 * a bit no call number has: other ops' flags use the word too) when a wait failed, and the
 * zero of the accumulators and the core's stores into them (acc_gate) then do nothing: a peer
 * late by more than the timeout may still be reading them for its previous call. Once marked
 * the communicator is broken (every later call fails at once), so the mark is never cleared.
 */
#ifndef MK_RA_BWD_PLAN_H_
#define MK_RA_BWD_PLAN_H_

#include <stddef.h>

#include "ra_schedule.h"

#define MK_RA_BWD_MAX_SEGS 4 /* = MK_ATTN_MAX_KV_BLOCKS */
#define MK_RA_BWD_MAX_CALLS 16
#define MK_RA_BWD_MAX_RANKS 8 /* = ring_attn.h MK_RA_MAX_RANKS */

struct mk_ra_bwd_seg {
  int src;    /* the rank whose KV block */
  int k_half; /* 0 or 1: that zigzag half (causal); -1: the whole block (non-causal) */
};

struct mk_ra_bwd_call {
  int q_half; /* 0 or 1: that zigzag half of the local queries; -1: all of them */
  int nseg;   /* 1 .. MK_RA_BWD_MAX_SEGS */
  struct mk_ra_bwd_seg seg[MK_RA_BWD_MAX_SEGS];
  int first, last; /* the query range's first call (delta, dq_acc zeroed) / last (writes dq) */
};

/* Fills calls[] (room for max) with rank r's core calls; returns their number, or -1 if they
 * do not fit (never with max >= MK_RA_BWD_MAX_CALLS and nranks <= 8). */
/* Appends to `calls` (n of max used) the segments of query range qh (-1: all rows) from the
 * sources own (1: only this rank's block; 0: only the peers'; -1: every block), four to a call:
 * non-causal in ring order, causal by global position (a key tile earlier in the sequence
 * sees more queries, so the core's CTAs, which take each head's key tiles in order, start each
 * head with its longest across the call's segments). Returns the new n, or -1 when max is too
 * small. */
static inline int mk_ra_bwd_plan_range(int rank, int nranks, int causal, int qh, int own,
                                       struct mk_ra_bwd_call* calls, int n, int max) {
  struct mk_ra_bwd_seg segs[2 * MK_RA_BWD_MAX_RANKS];
  int chunk[2 * MK_RA_BWD_MAX_RANKS], m = 0;
  if (nranks > MK_RA_BWD_MAX_RANKS) return -1;
  for (int s = 0; s < nranks; s++) {
    const int src = mk_ra_kv_source(rank, nranks, s);
    if (own >= 0 && (src == rank) != own) continue;
    for (int kh = 0; kh < (causal ? 2 : 1); kh++) {
      if (causal && mk_ra_step_mask(rank, nranks, s, qh, kh, 1) == MK_RA_NONE) continue;
      int at = m++;
      const int c = causal ? mk_ra_zigzag_chunk(src, nranks, kh) : s;
      for (; at > 0 && chunk[at - 1] > c; at--) segs[at] = segs[at - 1], chunk[at] = chunk[at - 1];
      segs[at].src = src, segs[at].k_half = causal ? kh : -1, chunk[at] = c;
    }
  }
  for (int i = 0; i < m; i++) {
    if (i % MK_RA_BWD_MAX_SEGS == 0) {
      if (n == max) return -1;
      calls[n].q_half = causal ? qh : -1;
      calls[n].nseg = 0;
      calls[n].first = calls[n].last = 0;
      n++;
    }
    calls[n - 1].seg[calls[n - 1].nseg++] = segs[i];
  }
  return n;
}

/* Marks each query range's first call (computes delta, zeroes dq_acc) and last (writes dq). */
static inline void mk_ra_bwd_plan_mark(int causal, struct mk_ra_bwd_call* calls, int n) {
  for (int qh = 0; qh < (causal ? 2 : 1); qh++) {
    const int want = causal ? qh : -1;
    int first = -1, last = -1;
    for (int i = 0; i < n; i++)
      if (calls[i].q_half == want) last = i, first = first < 0 ? i : first;
    if (first >= 0) calls[first].first = 1, calls[last].last = 1;
  }
}

/* The plan: first every query range against this rank's own block (one call each: it needs
 * nothing from the peers, so it runs while their K/V are still arriving), then every range
 * against the peers' blocks. *own_calls gets the number of the first kind. Returns the number
 * of calls, or -1 when max is too small. */
static inline int mk_ra_bwd_plan(int rank, int nranks, int causal, struct mk_ra_bwd_call* calls, int max,
                                 int* own_calls) {
  const int qhalves = causal ? 2 : 1;
  int n = 0;
  for (int own = 1; own >= 0; own--) {
    for (int qh = 0; qh < qhalves && n >= 0; qh++)
      n = mk_ra_bwd_plan_range(rank, nranks, causal, causal ? qh : -1, own, calls, n, max);
    if (n < 0) return -1;
    if (own && own_calls) *own_calls = n;
  }
  mk_ra_bwd_plan_mark(causal, calls, n);
  return n;
}

/* The same work in fewer calls: each query range against every block it sees, four segments
 * to a call (non-causal: own block first). A call then reads peers' K/V from its start, so it needs
 * them there (or its CTAs waiting for them); ring_bwd_emul times both plans on one GPU. */
static inline int mk_ra_bwd_plan_merged(int rank, int nranks, int causal, struct mk_ra_bwd_call* calls, int max) {
  int n = 0;
  for (int qh = 0; qh < (causal ? 2 : 1) && n >= 0; qh++)
    n = mk_ra_bwd_plan_range(rank, nranks, causal, causal ? qh : -1, -1, calls, n, max);
  if (n < 0) return -1;
  mk_ra_bwd_plan_mark(causal, calls, n);
  return n;
}

/* Non-causal, the own block last: every query row against the peers' blocks (ring order, four
 * to a call), then against this rank's own block alone in the last call, whose dK/dV the core
 * writes with the peers' partials added (mk_attn_bwd_addends): no reduce pass. The peers'
 * calls run first, their CTAs waiting for each K/V chunk as it lands. -1 when causal (a
 * block's halves meet several query ranges there) or max is too small. */
static inline int mk_ra_bwd_plan_own_last(int rank, int nranks, int causal, struct mk_ra_bwd_call* calls, int max) {
  if (causal) return -1;
  int n = mk_ra_bwd_plan_range(rank, nranks, 0, -1, 0, calls, 0, max);
  if (n >= 0) n = mk_ra_bwd_plan_range(rank, nranks, 0, -1, 1, calls, n, max);
  if (n < 0) return -1;
  mk_ra_bwd_plan_mark(0, calls, n);
  return n;
}

/* Every block in one call, the peers' in ring order and the own block last (the one-kernel
 * call: the core takes addends beside other blocks only with their block last); causal, all
 * query rows and whole blocks, each in its two zigzag chunks (the core's two-piece positions).
 * -1 on one rank, with more than MK_RA_BWD_MAX_SEGS blocks, or max < 1. */
static inline int mk_ra_bwd_plan_one(int rank, int nranks, struct mk_ra_bwd_call* calls, int max) {
  if (nranks < 2 || nranks > MK_RA_BWD_MAX_SEGS || max < 1) return -1;
  struct mk_ra_bwd_call* c = &calls[0];
  c->q_half = -1, c->nseg = 0, c->first = c->last = 1;
  for (int s = 1; s <= nranks; s++) {
    c->seg[c->nseg].src = mk_ra_kv_source(rank, nranks, s % nranks);
    c->seg[c->nseg++].k_half = -1;
  }
  return 1;
}

struct mk_ra_bwd_layout {
  size_t kv_elems;            /* B x S_local x H_kv x D */
  size_t slots, acc, delta, dq_acc, total; /* byte offsets in the data area; total: bytes needed */
  long fps;                   /* K/V chunk flags per slot */
  long ready0;                /* the first "partials ready" word, counted from MK_AG_FLAG0 */
  long gave_up;               /* the gather's "gave up" word (attn.h MK_ATTN_ACC_GATE_CLOSED | call) */
  long flag_words;            /* flag words needed */
};

static inline size_t mk_ra_bwd_align(size_t x) { return (x + 255) & ~(size_t)255; }

static inline void mk_ra_bwd_layout(int nranks, int batch, int s_local, int heads, int kv_heads, int d_head,
                                    int chunk_rows, struct mk_ra_bwd_layout* l) {
  l->kv_elems = (size_t)batch * s_local * kv_heads * d_head;
  const size_t q_elems = (size_t)batch * s_local * heads * d_head;
  l->slots = 0;
  l->acc = mk_ra_bwd_align((size_t)(nranks - 1) * 2 * l->kv_elems * 2);
  l->delta = l->acc + mk_ra_bwd_align((size_t)nranks * 2 * l->kv_elems * 4);
  l->dq_acc = l->delta + mk_ra_bwd_align((size_t)batch * heads * s_local * 4);
  l->total = l->dq_acc + mk_ra_bwd_align(q_elems * 4);
  l->fps = (long)batch * ((s_local + chunk_rows - 1) / chunk_rows);
  l->ready0 = (long)(nranks - 1) * l->fps;
  l->gave_up = l->ready0 + nranks - 1;
  l->flag_words = l->gave_up + 1;
}

/* acc[src]'s dk (dv: + kv_elems floats) in a data area at `data`. */
static inline float* mk_ra_bwd_acc(void* data, const struct mk_ra_bwd_layout* l, int src) {
  return (float*)((char*)data + l->acc) + (size_t)src * 2 * l->kv_elems;
}

/* Bytes of one block's accumulator (fp32 [dk | dv]). */
static inline size_t mk_ra_bwd_acc_bytes(const struct mk_ra_bwd_layout* l) { return 2 * l->kv_elems * sizeof(float); }

#endif /* MK_RA_BWD_PLAN_H_ */
