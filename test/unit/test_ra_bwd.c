/*
 * ncclMkRingAttentionBackward's host side without a GPU (ring_attn_bwd.c, ra_bwd_plan.h):
 *   - bad arguments refused with -EINVAL (each bad set differs from a good one in one field);
 *   - the plan of backward-core calls, for 2 to 8 ranks, every rank, causal and not: every
 *     (query chunk, key chunk) pair the mask lets through is in exactly one call, no NONE pair
 *     is, at most 4 KV segments per call, a query range's calls are contiguous with `first` on
 *     the first and `last` on the last (the core arguments built from it are checked with
 *     mk_attn_bwd_check by the op itself before any launch, not here);
 *   - the merged plan (mk_ra_bwd_plan_merged): the same (range, block, half) segments in no more
 *     calls, a call's segments of one range, non-causal the own block first, causal in order of
 *     global position;
 *   - the core arguments of a plan call (mk_ra_bwd_core_args): the range's rows and position,
 *     the own k, v or the slot of each peer block, causal partials added into this rank's
 *     acc[src], non-causal ones stored into the owner's acc[rank] (so with grouped-query heads
 *     the causal calls take the core's split heads with no workspace, the non-causal ones not);
 *   - the own-last plan (mk_ra_bwd_plan_own_last, non-causal only): the same segments, the own
 *     block alone in the last call; its core arguments write dk, dv with every peer's partial
 *     (acc[d], ready word slot(d)) as an addend, the peers' blocks store into their owners and
 *     wait for their chunks, and the core's own check takes every call;
 *   - the one-kernel plan (mk_ra_bwd_plan_one, 2-4 ranks): every block in one call, whole,
 *     the own block last; its core arguments (with the blocks' announcements and the push),
 *     non-causal and causal (both zigzag chunks of q and of each block, at their positions),
 *     pass the core's check, and a call with the own block elsewhere does not;
 *   - the op's own builder of every plan's calls (mk_ra_bwd_build_calls, the one-kernel call's
 *     ring parts included) on a stand-in communicator: every call passes the core's check;
 *   - the hang report's peer for each kind of wait, none for a one-launch call's part waits;
 *   - the workspace layout: regions in order, 256-byte aligned, disjoint, sized as documented.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ag_push.h" /* MK_AG_DATA_OFFSET */
#include "attn.h"
#include "err_text.h"
#include "fused_comm.h"
#include "op_check.h"
#include "mk_test.h"
#include "ra_bwd_plan.h"
#include "ring_attn.h"
#include "schedule.h"

static void* fake(uintptr_t i) { return (void*)(uintptr_t)(0x100000 + 0x10000 * i); }

/* Tensors 256 MiB apart: no shape below overlaps the next. */
static void* far(uintptr_t i) { return (void*)(uintptr_t)(i << 28); }

static void bad_arguments_are_refused(void) {
  void *q = far(1), *k = far(2), *v = far(3), *o = far(4), *dout = far(5), *dq = far(6), *dk = far(7),
       *dv = far(8);
  float* l = (float*)far(9);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dv, 1, 256, 8, 2, 128, 1), 0);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dv, 2, 77, 4, 4, 64, 0), 0);
  CHECK_EQ(mk_ra_bwd_args_check(NULL, k, v, o, l, dout, dq, dk, dv, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, NULL, l, dout, dq, dk, dv, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, NULL, dout, dq, dk, dv, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, NULL, dq, dk, dv, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, NULL, dk, dv, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, NULL, dv, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, NULL, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, (char*)dq + 8, dk, dv, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, (char*)dout + 2, dq, dk, dv, 1, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, (float*)((char*)l + 2), dout, dq, dk, dv, 1, 256, 8, 2, 128, 1),
           -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dv, 1, 256, 8, 2, 96, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dv, 1, 256, 6, 4, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dv, 1, 255, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dv, 0, 256, 8, 2, 128, 1), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dv, 1, 0, 8, 2, 128, 0), -EINVAL);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dv, 1, 256, 8, 2, 128, 2), -EINVAL);
  /* the outputs overlap no input and no other output (B=1 S=256 H=8 H_kv=2 D=128: q 512 KiB, k 128 KiB) */
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, q, dk, dv, 1, 256, 8, 2, 128, 1), -EINVAL);  /* dq = q */
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, (char*)v + 131056, dv, 1, 256, 8, 2, 128, 1),
           -EINVAL);                                                                              /* dk's start in v */
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, (char*)l - 524272, dk, dv, 1, 256, 8, 2, 128, 1),
           -EINVAL);                                                                              /* dq's last 16 bytes on lse */
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, dk, 1, 256, 8, 2, 128, 1), -EINVAL); /* dv = dk */
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, dq, dk, (char*)dk + 131072, 1, 256, 8, 2, 128, 1), 0);
  CHECK_EQ(mk_ra_bwd_args_check(q, k, v, o, l, dout, (char*)dout + 524288, dk, dv, 1, 256, 8, 2, 128, 1), 0);
}

static void plan_covers_every_visible_pair_own_block_first(void) {
  for (int n = 2; n <= MK_RA_MAX_RANKS; n++)
    for (int causal = 0; causal < 2; causal++)
      for (int r = 0; r < n; r++) {
        struct mk_ra_bwd_call c[MK_RA_BWD_MAX_CALLS];
        int own = -1;
        const int m = mk_ra_bwd_plan(r, n, causal, c, MK_RA_BWD_MAX_CALLS, &own);
        CHECK(m >= 1);
        CHECK_EQ(mk_ra_bwd_plan(r, n, causal, c, m - 1, NULL), -1); /* too little room is reported */
        mk_ra_bwd_plan(r, n, causal, c, MK_RA_BWD_MAX_CALLS, NULL);
        CHECK_EQ(own, causal ? 2 : 1); /* one call per query range against the own block */
        int seen[2][16][2], firsts[3] = {0, 0, 0}, lasts[3] = {0, 0, 0};
        memset(seen, 0, sizeof seen);
        for (int i = 0; i < m; i++) {
          CHECK(c[i].nseg >= 1 && c[i].nseg <= MK_RA_BWD_MAX_SEGS);
          CHECK_EQ(c[i].q_half == -1, !causal);
          const int qh = c[i].q_half + 1;
          /* first: the range's first call (its own-block call); last: its last call */
          CHECK_EQ(c[i].first, i < own);
          int later = 0;
          for (int j = i + 1; j < m; j++) later |= c[j].q_half == c[i].q_half;
          CHECK_EQ(c[i].last, !later);
          firsts[qh] += c[i].first, lasts[qh] += c[i].last;
          for (int j = 0; j < c[i].nseg; j++) {
            const int src = c[i].seg[j].src, kh = c[i].seg[j].k_half;
            CHECK(src >= 0 && src < n);
            CHECK_EQ(src == r, i < own); /* own block first, alone */
            CHECK_EQ(kh == -1, !causal);
            if (causal) {
              const enum mk_ra_mask mk = mk_ra_chunk_mask(mk_ra_zigzag_chunk(r, n, c[i].q_half),
                                                          mk_ra_zigzag_chunk(src, n, kh), 1);
              CHECK(mk != MK_RA_NONE);
            }
            seen[causal ? c[i].q_half : 0][src][causal ? kh : 0]++;
          }
        }
        for (int qh = 0; qh < (causal ? 2 : 1); qh++) {
          CHECK_EQ(firsts[causal ? qh + 1 : 0], 1);
          CHECK_EQ(lasts[causal ? qh + 1 : 0], 1);
          for (int src = 0; src < n; src++)
            for (int kh = 0; kh < (causal ? 2 : 1); kh++) {
              const int want = !causal || mk_ra_chunk_mask(mk_ra_zigzag_chunk(r, n, qh),
                                                           mk_ra_zigzag_chunk(src, n, kh), 1) != MK_RA_NONE;
              CHECK_EQ(seen[qh][src][kh], want);
            }
        }
      }
}

/* (range, src, half) -> count over a plan's calls. */
static void plan_segments(const struct mk_ra_bwd_call* c, int m, int causal, int seen[2][16][2]) {
  memset(seen, 0, sizeof(int) * 2 * 16 * 2);
  for (int i = 0; i < m; i++)
    for (int j = 0; j < c[i].nseg; j++)
      seen[causal ? c[i].q_half : 0][c[i].seg[j].src][causal ? c[i].seg[j].k_half : 0]++;
}

static void merged_plan_covers_the_same_pairs_in_no_more_calls(void) {
  for (int n = 2; n <= MK_RA_MAX_RANKS; n++)
    for (int causal = 0; causal < 2; causal++)
      for (int r = 0; r < n; r++) {
        struct mk_ra_bwd_call a[MK_RA_BWD_MAX_CALLS], b[MK_RA_BWD_MAX_CALLS];
        const int m = mk_ra_bwd_plan(r, n, causal, a, MK_RA_BWD_MAX_CALLS, NULL);
        const int mm = mk_ra_bwd_plan_merged(r, n, causal, b, MK_RA_BWD_MAX_CALLS);
        CHECK(mm >= 1 && mm <= m);
        CHECK_EQ(mk_ra_bwd_plan_merged(r, n, causal, b, mm - 1), -1);
        mk_ra_bwd_plan_merged(r, n, causal, b, MK_RA_BWD_MAX_CALLS);
        int sa[2][16][2], sb[2][16][2];
        plan_segments(a, m, causal, sa);
        plan_segments(b, mm, causal, sb);
        CHECK(!memcmp(sa, sb, sizeof sa));
        int firsts[3] = {0, 0, 0}, lasts[3] = {0, 0, 0};
        for (int i = 0; i < mm; i++) {
          CHECK(b[i].nseg >= 1 && b[i].nseg <= MK_RA_BWD_MAX_SEGS);
          firsts[b[i].q_half + 1] += b[i].first, lasts[b[i].q_half + 1] += b[i].last;
          const int range_start = i == 0 || b[i - 1].q_half != b[i].q_half;
          for (int j = 0; j < b[i].nseg; j++) {
            if (!causal) /* non-causal: the own block first */
              CHECK(b[i].seg[j].src != r || (range_start && j == 0));
            else if (j > 0) /* causal: by global position, so the CTA order stays longest first */
              CHECK(mk_ra_zigzag_chunk(b[i].seg[j - 1].src, n, b[i].seg[j - 1].k_half) <
                    mk_ra_zigzag_chunk(b[i].seg[j].src, n, b[i].seg[j].k_half));
          }
        }
        for (int qh = 0; qh < (causal ? 2 : 1); qh++) {
          CHECK_EQ(firsts[causal ? qh + 1 : 0], 1);
          CHECK_EQ(lasts[causal ? qh + 1 : 0], 1);
        }
      }
}

/* Rank 1's areas in a ring of n: its data at fake(10), peer d's at fake(20 + 5 d). */
static void areas_of_rank1(struct mk_ra_bwd_areas* ar, int n) {
  memset(ar, 0, sizeof *ar);
  ar->rank = 1, ar->nranks = n, ar->data = fake(10);
  for (int d = 0; d < n; d++) ar->peer_data[d] = d == 1 ? fake(10) : fake(20 + 5 * d);
  ar->err = (struct mk_gemm_error*)fake(60), ar->err_tag = 0x1107, ar->timeout_ms = 1234;
}

/* Rank 1 of 3 with the own-last plan's words: chunk flags (2 per slot), done, ready words. */
static void own_last_areas_of_rank1_of_3(struct mk_ra_bwd_areas* ar) {
  areas_of_rank1(ar, 3);
  ar->flags = (const uint64_t*)fake(40), ar->fps = 2, ar->chunk_rows = 128, ar->done = (const uint64_t*)fake(41);
  ar->ready = (const uint64_t*)fake(50), ar->ready_index0 = 77;
}

/* B = 1, S_local = 256, H = 8, H_kv = 2, D = 128: q, k, v, out, lse, dout, dq, then dk, dv. */
static struct mk_ra_bwd_tensors tensors_1x256(int causal) {
  const struct mk_ra_bwd_tensors t = {fake(1), fake(2), fake(3), fake(4), (const float*)fake(5), fake(6), fake(7),
                                      1, 256, 8, 2, 128, causal, fake(8), fake(9)};
  return t;
}

static void core_args_point_at_the_range_the_blocks_and_the_partials_owner(void) {
  struct mk_ra_bwd_layout l;
  mk_ra_bwd_layout(2, 1, 256, 8, 2, 128, 128, &l);
  struct mk_ra_bwd_areas ar;
  areas_of_rank1(&ar, 2);
  for (int causal = 0; causal < 2; causal++) {
    const struct mk_ra_bwd_tensors t = {fake(1), fake(2), fake(3), fake(4), (const float*)fake(5), fake(6), fake(7),
                                        1, 256, 8, 2, 128, causal};
    struct mk_ra_bwd_call c[MK_RA_BWD_MAX_CALLS];
    const int m = mk_ra_bwd_plan(1, 2, causal, c, MK_RA_BWD_MAX_CALLS, NULL);
    for (int i = 0; i < m; i++) {
      struct mk_attn_bwd_args a;
      mk_ra_bwd_core_args(&ar, &l, &c[i], &t, &a);
      CHECK(a.q == fake(1) && a.dout == fake(6) && a.seq_q == 256 && a.causal == causal);
      CHECK(a.dq == (c[i].last ? fake(7) : NULL));
      CHECK_EQ(a.dq_accumulate, !c[i].first);
      CHECK(a.dq_acc == (float*)((char*)fake(10) + l.dq_acc) && a.err == ar.err && a.timeout_ms == 1234);
      /* a wait that gives up names the ring backward, not a bare op 0 (found on 2 ranks, session 35) */
      CHECK_EQ(a.err_tag, 0x1107u);
      if (causal) /* rank 1 holds chunks 1 and 2 of 4 */
        CHECK(a.q_row0 == 128 * c[i].q_half && a.q_rows == 128 && a.q_pos0 == (c[i].q_half ? 256 : 128));
      else
        CHECK(a.q_row0 == 0 && a.q_rows == 256 && a.q_pos0 == 256);
      CHECK_EQ(a.num_kv_blocks, c[i].nseg);
      /* GQA 4:1: the causal calls add into accumulators only, so the core splits the heads over
       * CTAs with no workspace; the non-causal ones store (acc_overwrite), which would need one,
       * and the ring gives none: a CTA per kv head's group there */
      CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a) == 0, causal);
      CHECK(a.dkv_ws == NULL);
      for (int j = 0; j < c[i].nseg; j++) {
        const struct mk_attn_bwd_kv_block* b = &a.kv[j];
        const int src = c[i].seg[j].src;
        CHECK(b->k == (src == 1 ? fake(2) : (char*)fake(10) + l.slots));
        CHECK(b->v == (src == 1 ? fake(3) : (char*)fake(10) + l.slots + 2 * l.kv_elems));
        if (causal)
          CHECK(b->dk_acc == mk_ra_bwd_acc(fake(10), &l, src) && !b->acc_overwrite);
        else
          CHECK(b->dk_acc == mk_ra_bwd_acc(src == 1 ? fake(10) : fake(20), &l, 1) && b->acc_overwrite);
        CHECK(b->dv_acc == b->dk_acc + l.kv_elems);
        CHECK(!b->ready_flags); /* no flags given: the K/V are all there */
      }
    }
  }
  /* the merged plan's areas: the peer's segments wait for their slot's chunk flags */
  ar.flags = (const uint64_t*)fake(40), ar.fps = 6, ar.chunk_rows = 128, ar.done = (const uint64_t*)fake(41);
  const struct mk_ra_bwd_tensors t = {fake(1), fake(2), fake(3), fake(4), (const float*)fake(5), fake(6), fake(7),
                                      1, 256, 8, 2, 128, 0};
  struct mk_ra_bwd_call c[MK_RA_BWD_MAX_CALLS];
  CHECK_EQ(mk_ra_bwd_plan_merged(1, 2, 0, c, MK_RA_BWD_MAX_CALLS), 1);
  struct mk_attn_bwd_args a;
  mk_ra_bwd_core_args(&ar, &l, &c[0], &t, &a);
  CHECK_EQ(a.num_kv_blocks, 2);
  CHECK(a.kv[0].k == fake(2) && !a.kv[0].ready_flags); /* own block first, nothing to wait for */
  CHECK(a.kv[1].ready_flags == (const uint64_t*)fake(40) + mk_sched_rs_slot(0, 1) * 6);
  CHECK(a.kv[1].ready_chunk_rows == 128 && a.ready_done == (const uint64_t*)fake(41));
  CHECK_EQ(a.err_tag, 0x1107u); /* the merged call waits for chunks: its timeouts name the op */
}

static void own_last_plan_puts_the_own_block_alone_in_the_last_call(void) {
  for (int n = 2; n <= MK_RA_MAX_RANKS; n++)
    for (int r = 0; r < n; r++) {
      struct mk_ra_bwd_call a[MK_RA_BWD_MAX_CALLS], b[MK_RA_BWD_MAX_CALLS];
      const int m = mk_ra_bwd_plan(r, n, 0, a, MK_RA_BWD_MAX_CALLS, NULL);
      const int mo = mk_ra_bwd_plan_own_last(r, n, 0, b, MK_RA_BWD_MAX_CALLS);
      CHECK(mo >= 2);
      CHECK_EQ(mk_ra_bwd_plan_own_last(r, n, 0, b, mo - 1), -1);
      CHECK_EQ(mk_ra_bwd_plan_own_last(r, n, 1, b, MK_RA_BWD_MAX_CALLS), -1); /* non-causal only */
      mk_ra_bwd_plan_own_last(r, n, 0, b, MK_RA_BWD_MAX_CALLS);
      int sa[2][16][2], sb[2][16][2];
      plan_segments(a, m, 0, sa);
      plan_segments(b, mo, 0, sb);
      CHECK(!memcmp(sa, sb, sizeof sa));
      CHECK(b[mo - 1].nseg == 1 && b[mo - 1].seg[0].src == r && b[mo - 1].last && !b[mo - 1].first);
      CHECK(b[0].first);
      for (int i = 0; i < mo - 1; i++) {
        CHECK(!b[i].last && b[i].first == (i == 0));
        for (int j = 0; j < b[i].nseg; j++) CHECK(b[i].seg[j].src != r);
      }
    }
}

static void own_last_core_args_add_every_peers_partial_into_the_own_block(void) {
  struct mk_ra_bwd_layout l;
  mk_ra_bwd_layout(3, 1, 256, 8, 2, 128, 128, &l);
  struct mk_ra_bwd_areas ar;
  own_last_areas_of_rank1_of_3(&ar);
  const struct mk_ra_bwd_tensors t = tensors_1x256(0);
  struct mk_ra_bwd_call c[MK_RA_BWD_MAX_CALLS];
  const int m = mk_ra_bwd_plan_own_last(1, 3, 0, c, MK_RA_BWD_MAX_CALLS);
  CHECK_EQ(m, 2);
  for (int i = 0; i < m; i++) {
    struct mk_attn_bwd_args a;
    mk_ra_bwd_core_args(&ar, &l, &c[i], &t, &a);
    CHECK_EQ(mk_attn_bwd_check(&a), 0); /* the core takes them */
    if (i < m - 1) { /* the peers' blocks: stored into their owners' acc[1], waiting for their chunks */
      CHECK_EQ(a.addends.n, 0);
      for (int j = 0; j < a.num_kv_blocks; j++) {
        const int src = c[i].seg[j].src;
        CHECK(a.kv[j].dk_acc == mk_ra_bwd_acc(fake(20 + 5 * src), &l, 1) && a.kv[j].acc_overwrite);
        CHECK(a.kv[j].ready_flags == (const uint64_t*)fake(40) + mk_sched_rs_slot(src, 1) * 2);
      }
      continue;
    }
    const struct mk_attn_bwd_kv_block* b = &a.kv[0]; /* the own block: dk, dv whole, the peers' partials added */
    CHECK(a.num_kv_blocks == 1 && b->k == fake(2) && b->dk == fake(8) && b->dv == fake(9));
    CHECK(!b->dk_acc && !b->dv_acc && !b->ready_flags && a.dq == fake(7));
    CHECK(a.addends.n == 2 && a.addends.block == 0 && a.addends.flag_index0 == 77);
    CHECK(a.ready_done == (const uint64_t*)fake(41));
    for (int d = 0; d < 3; d += 2) {
      const int slot = mk_sched_rs_slot(d, 1);
      CHECK(a.addends.dk[slot] == mk_ra_bwd_acc(fake(10), &l, d));
      CHECK(a.addends.dv[slot] == mk_ra_bwd_acc(fake(10), &l, d) + l.kv_elems);
      CHECK(a.addends.ready[slot] == (const uint64_t*)fake(50) + slot);
    }
  }
}

static void one_kernel_plan_puts_every_block_in_one_call_the_own_last(void) {
  for (int n = 2; n <= MK_RA_MAX_RANKS; n++)
    for (int r = 0; r < n; r++) {
      struct mk_ra_bwd_call b[MK_RA_BWD_MAX_CALLS];
      CHECK_EQ(mk_ra_bwd_plan_one(r, n, b, 0), -1);
      const int mo = mk_ra_bwd_plan_one(r, n, b, MK_RA_BWD_MAX_CALLS);
      if (n > MK_RA_BWD_MAX_SEGS) { /* more blocks than one call takes */
        CHECK_EQ(mo, -1);
        continue;
      }
      CHECK_EQ(mo, 1);
      int seen[MK_RA_MAX_RANKS] = {0};
      for (int j = 0; j < b[0].nseg; j++) {
        seen[b[0].seg[j].src]++;
        CHECK_EQ(b[0].seg[j].k_half, -1);
      }
      for (int d = 0; d < n; d++) CHECK_EQ(seen[d], 1); /* every block once, whole */
      CHECK(b[0].nseg == n && b[0].seg[n - 1].src == r && b[0].first && b[0].last && b[0].q_half == -1);
      for (int j = 0; j + 1 < n; j++) CHECK_EQ(b[0].seg[j].src, mk_ra_kv_source(r, n, j + 1)); /* ring order */
    }
  struct mk_ra_bwd_call one;
  CHECK_EQ(mk_ra_bwd_plan_one(0, 1, &one, 1), -1); /* one rank: no ring */
}

/* The one-kernel call's core arguments as ring_attn_bwd.c builds them: the core takes them, and
 * refuses the same call as several launches or with the own block (the addends') not last. */
static void one_kernel_core_args_pass_the_cores_check(void) {
  for (int causal = 0; causal < 2; causal++) {
    struct mk_ra_bwd_layout l;
    mk_ra_bwd_layout(3, 1, 256, 8, 2, 128, 128, &l);
    struct mk_ra_bwd_areas ar;
    own_last_areas_of_rank1_of_3(&ar);
    const struct mk_ra_bwd_tensors t = tensors_1x256(causal);
    struct mk_ra_bwd_call c;
    CHECK_EQ(mk_ra_bwd_plan_one(1, 3, &c, 1), 1);
    struct mk_attn_bwd_args a;
    mk_ra_bwd_core_args(&ar, &l, &c, &t, &a);
    CHECK(a.num_kv_blocks == 3 && a.addends.n == 2 && a.addends.block == 2 && !a.delta_ready && !a.dq_accumulate);
    CHECK(a.q_row0 == 0 && (a.q_rows == 0 || a.q_rows == 256));
    for (int j = 0; j < 3; j++) { /* whole blocks; causal at the zigzag chunks' positions */
      const int src = c.seg[j].src;
      CHECK(a.kv[j].row0 == 0 && (a.kv[j].rows == 0 || a.kv[j].rows == 256));
      if (causal)
        CHECK(a.kv[j].split == 128 && a.kv[j].pos0 == 128LL * mk_ra_zigzag_chunk(src, 3, 0) &&
              a.kv[j].pos1 == 128LL * mk_ra_zigzag_chunk(src, 3, 1));
      else
        CHECK(a.kv[j].split == 0 && a.kv[j].pos0 == 256LL * src);
      if (j < 2) CHECK(a.kv[j].acc_overwrite && a.kv[j].dk_acc == mk_ra_bwd_acc(fake(20 + 5 * src), &l, 1));
    }
    if (causal)
      CHECK(a.q_split == 128 && a.q_pos0 == 128LL * mk_ra_zigzag_chunk(1, 3, 0) &&
            a.q_pos1 == 128LL * mk_ra_zigzag_chunk(1, 3, 1));
    else
      CHECK(a.q_split == 0 && a.q_pos0 == 256);
    for (int j = 0; j < 2; j++) a.kv[j].announce = (uint64_t*)fake(60 + j);
    a.phase_words = (uint64_t*)fake(70);
    a.push.ctas = 8, a.push.rank = 1, a.push.nranks = 3, a.push.batch = 1, a.push.s_local = 256;
    a.push.chunk_rows = 128, a.push.chunks_per_batch = 2, a.push.row_vecs = 2 * 128 / 8;
    a.push.k = fake(2), a.push.v = fake(3), a.push.done = (const uint64_t*)fake(41);
    for (int d = 0; d < 3; d += 2)
      a.push.dst_k[d] = fake(80 + d), a.push.dst_v[d] = fake(90 + d), a.push.dst_flags[d] = (uint64_t*)fake(100 + d),
      a.push.peer_done[d] = (const uint64_t*)fake(110 + d);
    a.call_done = (uint64_t*)fake(41);
    CHECK_EQ(mk_attn_bwd_check(&a), 0);
    CHECK_EQ(mk_attn_bwd_epilogue(&a), MK_ATTN_BWD_EPI_ADDENDS);
    struct mk_attn_bwd_args b = a;
    b.phase_words = NULL; /* the ring's parts need the one launch */
    CHECK_EQ(mk_attn_bwd_check(&b), -EINVAL);
    b = a, b.kv[0] = a.kv[2], b.kv[2] = a.kv[0], b.addends.block = 0; /* the own block first */
    CHECK_EQ(mk_attn_bwd_check(&b), -EINVAL);
  }
}

/* The op's own call builder (mk_ra_bwd_build_calls) on a stand-in communicator (addresses
 * only: nothing is read): every plan's calls come back whole and pass the core's check, for
 * every rank count the plan takes, every rank, causal and not, grouped heads or not, D 64 and
 * 128. The one-kernel call carries its ring parts (session 62's builder checked it before the
 * push and call_done were set, so every such call was refused as bad arguments), and with
 * grouped heads at D = 128 its split workspace when the communicator's holds it. */
static void every_plans_calls_are_built_whole_and_pass_the_cores_check(void) {
  void* peer_sym[MK_RA_MAX_RANKS];
  for (int d = 0; d < MK_RA_MAX_RANKS; d++) peer_sym[d] = fake(200 + 100 * d);
  const enum mk_ra_bwd_plan_kind kinds[] = {MK_RA_BWD_SPLIT, MK_RA_BWD_MERGED, MK_RA_BWD_OWN_LAST, MK_RA_BWD_ONE_KERNEL};
  for (int ki = 0; ki < 4; ki++)
    for (int n = 2; n <= (kinds[ki] == MK_RA_BWD_ONE_KERNEL ? MK_RA_BWD_MAX_SEGS : MK_RA_MAX_RANKS); n++)
      for (int r = 0; r < n; r++)
        for (int causal = 0; causal < 2; causal++)
          for (int v = 0; v < 4; v++) {
            if (kinds[ki] == MK_RA_BWD_OWN_LAST && causal) continue; /* non-causal only */
            const int hkv = v & 1 ? 2 : 8, d = v & 2 ? 128 : 64, B = 2, S = 512, H = 8;
            struct mk_fused_comm fc;
            memset(&fc, 0, sizeof fc);
            fc.rank = r, fc.nranks = n, fc.sym = peer_sym[r], fc.peer_sym = peer_sym, fc.num_sms = 132;
            fc.err = (struct mk_gemm_error*)fake(90); /* the op's record */
            fc.cfg.timeout_ms = 1000;
            struct mk_ra_bwd_layout l;
            mk_ra_bwd_layout(n, B, S, H, hkv, d, 128, &l);
            const struct mk_ra_bwd_tensors t = {.q = fake(1), .k = fake(2), .v = fake(3), .out = fake(4),
                                                .lse = (const float*)fake(5), .dout = fake(6), .dq = fake(7),
                                                .batch = B, .s_local = S, .heads = H, .kv_heads = hkv, .d_head = d,
                                                .causal = causal, .dk = fake(8), .dv = fake(9)};
            struct mk_ra_args ga;
            mk_ra_fill_args(&fc, MK_OP_RING_ATTN_BWD, t.k, t.v, B, S, H, hkv, d, causal, 128, l.kv_elems * 2, &ga);
            ga.gave_up = (uint64_t*)fake(10);
            struct mk_ra_bwd_call plan[MK_RA_BWD_MAX_CALLS];
            struct mk_attn_bwd_args core[MK_RA_BWD_MAX_CALLS];
            int own = 0;
            void* data = (char*)peer_sym[r] + MK_AG_DATA_OFFSET;
            const int m = mk_ra_bwd_build_calls(&fc, &ga, &l, data, 128, kinds[ki], &t, plan, core, &own);
            CHECK(m >= 1);
            for (int i = 0; i < m; i++) CHECK(mk_attn_bwd_check(&core[i]) == 0 && core[i].err == fc.err);
            if (kinds[ki] != MK_RA_BWD_ONE_KERNEL || m != 1) continue;
            CHECK(core[0].call_done == ga.call.done && core[0].push.ctas >= 1 && core[0].push.call == ga.call.call);
            for (int j = 0; j < core[0].num_kv_blocks; j++) /* each peer's block announced to it, the own not */
              CHECK_EQ(core[0].kv[j].announce != NULL, plan[0].seg[j].src != r);
            /* split heads (GQA at D = 128) once the workspace holds their partials after the
             * layout's regions (a stand-in's workspace holds nothing: a CTA per group above) */
            CHECK(core[0].dkv_ws == NULL);
            const size_t ws_bytes = mk_attn_bwd_dkv_ws_floats(&core[0]) * sizeof(float); /* partials and counts */
            CHECK_EQ(ws_bytes != 0, hkv < H && d == 128);
            for (int room = 0; room < 2; room++) { /* one byte short of it, then exactly it */
              fc.sym_bytes = MK_FUSED_FLAG_BYTES + mk_ra_bwd_align(l.total) + ws_bytes - (room ? 0 : 1);
              CHECK_EQ(mk_ra_bwd_build_calls(&fc, &ga, &l, data, 128, kinds[ki], &t, plan, core, &own), 1);
              CHECK_EQ(mk_attn_bwd_check(&core[0]), 0);
              CHECK_EQ(core[0].dkv_ws != NULL, room && ws_bytes != 0);
              CHECK(!core[0].dkv_ws || (char*)core[0].dkv_ws == (char*)data + mk_ra_bwd_align(l.total));
            }
          }
}

/* Which peer the hang report names for each wait of the ring attention (mk_ra_hang_source):
 * the push's wait for a peer's previous call, the backward's "partials ready" word, a K/V
 * chunk flag; none for a one-launch call's part waits (its own CTAs), which read as a chunk
 * flag would have named slot 0's source. */
static void hang_report_names_the_peer_each_wait_depended_on(void) {
  const int n = 3, fps = 4; /* rank 1: slot 0 holds rank 0's block, slot 1 rank 2's */
  struct mk_gemm_error e;
  enum mk_ra_hang_kind kind = MK_RA_HANG_DONE;
  memset(&e, 0, sizeof e);
  e.tag = MK_OP_RING_ATTN_BWD | MK_GEMM_ERR_TAG_PUSH;
  e.tile = 5;
  e.flag_index = 2;
  CHECK(mk_ra_hang_source(&e, 1, n, fps, &kind) == 2 && kind == MK_RA_HANG_DONE);
  e.tag = MK_OP_RING_ATTN_BWD;
  e.flag_index = 1 * fps + 3; /* slot 1's last chunk */
  CHECK(mk_ra_hang_source(&e, 1, n, fps, &kind) == 2 && kind == MK_RA_HANG_CHUNK);
  e.flag_index = 3; /* slot 0's */
  CHECK(mk_ra_hang_source(&e, 1, n, fps, &kind) == 0 && kind == MK_RA_HANG_CHUNK);
  e.flag_index = (n - 1) * fps + 1; /* the "partials ready" word of slot 1 */
  CHECK(mk_ra_hang_source(&e, 1, n, fps, &kind) == 2 && kind == MK_RA_HANG_READY);
  e.tag = MK_OP_RING_ATTN; /* the forward has no ready words: a flag past the slots */
  CHECK_EQ(mk_ra_hang_source(&e, 1, n, fps, &kind), -1);
  e.tag = MK_OP_RING_ATTN_BWD;
  e.tile = MK_GEMM_ERR_TILE_OWN_CTAS; /* a part wait */
  e.flag_index = 3;
  CHECK_EQ(mk_ra_hang_source(&e, 1, n, fps, &kind), -1);
}

/* The merged plan's zero of peer d's accumulator waits for d's previous call: its record names
 * d (it was once tagged as a chunk-flag wait, so rank 0 of 4 named rank 1 for a wait on 3). */
static void accumulator_zero_wait_names_its_peer(void) {
  void* peer_sym[4] = {fake(200), fake(300), fake(400), fake(500)};
  struct mk_fused_comm fc;
  memset(&fc, 0, sizeof fc);
  fc.rank = 0, fc.nranks = 4, fc.sym = peer_sym[0], fc.peer_sym = peer_sym, fc.num_sms = 132;
  fc.err = (struct mk_gemm_error*)fake(90); /* the op's record */
  fc.cfg.timeout_ms = 1000;
  struct mk_ra_args ga;
  mk_ra_fill_args(&fc, MK_OP_RING_ATTN_BWD, fake(2), fake(3), 1, 2048, 8, 8, 128, 1, 128, 1 << 20, &ga);
  for (int d = 1; d < 4; d++) {
    struct mk_ra_bwd_zero_args z;
    memset(&z, 0, sizeof z);
    mk_ra_bwd_zero_wait(&ga, d, &z);
    CHECK(z.peer_done == ga.call.peer_done[d] && z.done == ga.call.done && z.timeout_ms == 1000);
    struct mk_gemm_error e; /* as the zero kernel raises it */
    memset(&e, 0, sizeof e);
    e.tag = z.err_tag, e.tile = MK_GEMM_ERR_TILE_PEER_FREE, e.flag_index = z.flag_index;
    enum mk_ra_hang_kind kind = MK_RA_HANG_CHUNK;
    CHECK(mk_ra_hang_source(&e, 0, 4, 16, &kind) == d && kind == MK_RA_HANG_DONE);
    char text[256], want[64];
    mk_err_record_text(0, &e, text, sizeof text);
    snprintf(want, sizeof want, "for rank %d's previous call to end", d);
    CHECK(strstr(text, want) != NULL);
  }
}

static void layout_is_aligned_disjoint_and_sized(void) {
  const int shapes[][6] = {{1, 256, 8, 1, 128, 128}, {2, 77, 4, 2, 64, 128}, {3, 1000, 16, 2, 128, 256}};
  for (int n = 2; n <= MK_RA_MAX_RANKS; n++)
    for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      const int* x = shapes[s];
      struct mk_ra_bwd_layout l;
      mk_ra_bwd_layout(n, x[0], x[1], x[2], x[3], x[4], x[5], &l);
      const size_t kv = (size_t)x[0] * x[1] * x[3] * x[4], qe = (size_t)x[0] * x[1] * x[2] * x[4];
      CHECK_EQ(l.kv_elems, kv);
      CHECK(l.slots == 0 && l.acc % 256 == 0 && l.delta % 256 == 0 && l.dq_acc % 256 == 0 && l.total % 256 == 0);
      CHECK(l.acc >= (size_t)(n - 1) * 2 * kv * 2);               /* the forward's slots first */
      CHECK(l.delta >= l.acc + (size_t)n * 2 * kv * 4);
      CHECK(l.dq_acc >= l.delta + (size_t)x[0] * x[2] * x[1] * 4);
      CHECK(l.total >= l.dq_acc + qe * 4 && l.total < l.dq_acc + qe * 4 + 256);
      CHECK_EQ(l.fps, mk_ra_flags_per_slot(x[0], x[1], x[5]));
      CHECK_EQ(l.ready0, (long)(n - 1) * l.fps);
      CHECK_EQ(l.gave_up, l.ready0 + n - 1); /* after the ready words, the last word */
      CHECK_EQ(l.flag_words, l.gave_up + 1);
      char* base = (char*)fake(100);
      CHECK((char*)mk_ra_bwd_acc(base, &l, n - 1) + 2 * kv * 4 <= base + l.delta);
    }
}

int main(void) {
  bad_arguments_are_refused();
  plan_covers_every_visible_pair_own_block_first();
  merged_plan_covers_the_same_pairs_in_no_more_calls();
  core_args_point_at_the_range_the_blocks_and_the_partials_owner();
  own_last_plan_puts_the_own_block_alone_in_the_last_call();
  own_last_core_args_add_every_peers_partial_into_the_own_block();
  one_kernel_plan_puts_every_block_in_one_call_the_own_last();
  one_kernel_core_args_pass_the_cores_check();
  every_plans_calls_are_built_whole_and_pass_the_cores_check();
  hang_report_names_the_peer_each_wait_depended_on();
  accumulator_zero_wait_names_its_peer();
  layout_is_aligned_disjoint_and_sized();
  return MK_TEST_RESULT();
}
