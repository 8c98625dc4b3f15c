/*
 * The attention core's host side without a GPU (attn.h): bad arguments are refused with
 * -EINVAL before any device use (each bad set differs from a good one in one field; the good
 * ones get past validation), and the pure tile rules that the producer and the consumers share
 * (which KV tiles a query tile needs, which of them are masked), against a brute-force count of
 * the visible (query, key) pairs; the persistent forward's item schedule; where the backward
 * stages dQ for its TMA reductions (the swizzle TMA reads; 4 wavefronts per warp store, as measured).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "mk_test.h"

static void* fake(uintptr_t i) { return (void*)(uintptr_t)(0x100000 + 0x10000 * i); }

static struct mk_attn_args base_args(void) {
  struct mk_attn_args a;
  memset(&a, 0, sizeof a);
  a.q = fake(1), a.out = fake(2), a.lse = (float*)fake(3);
  a.batch = 2, a.seq_q = 300, a.heads = 8, a.kv_heads = 2, a.d_head = 128, a.causal = 1;
  a.num_kv_blocks = 1;
  a.kv[0].k = fake(4), a.kv[0].v = fake(5), a.kv[0].seq = 300;
  return a;
}

static void bad_shapes_are_refused(void) {
  struct mk_attn_args g = base_args(), a;
  CHECK_EQ(mk_attn_fwd_check(&g), 0);
  CHECK_EQ(mk_attn_fwd_check(NULL), -EINVAL);
  a = g, a.d_head = 96;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.d_head = 256;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.d_head = 64;
  CHECK_EQ(mk_attn_fwd_check(&a), 0);
  a = g, a.heads = 6, a.kv_heads = 4; /* not a multiple */
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.kv_heads = 0;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.heads = 0;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.batch = 0;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.seq_q = 0;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.kv[0].seq = 0;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
}

static void bad_pointers_are_refused(void) {
  struct mk_attn_args g = base_args(), a;
  a = g, a.q = NULL;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.out = NULL;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.kv[0].k = NULL;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.kv[0].v = NULL;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.q = (char*)fake(1) + 8;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.kv[0].v = (char*)fake(5) + 2;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.lse = (float*)((char*)fake(3) + 2);
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.lse = NULL; /* optional */
  CHECK_EQ(mk_attn_fwd_check(&a), 0);
  a = g, a.batch = 32768, a.heads = 65535, a.kv_heads = 1; /* 3 query tiles: over 2^31 work items */
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.batch = 32768, a.heads = 65535, a.kv_heads = 1, a.seq_q = 128, a.kv[0].seq = 128; /* 1 tile: just under */
  CHECK_EQ(mk_attn_fwd_check(&a), 0);
}

static void bad_blocks_and_rows_are_refused(void) {
  struct mk_attn_args g = base_args(), a;
  a = g, a.num_kv_blocks = 0;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.num_kv_blocks = MK_ATTN_MAX_KV_BLOCKS + 1;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.num_kv_blocks = 2; /* the second block unset */
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.num_kv_blocks = 2, a.kv[1] = g.kv[0], a.kv[1].row0 = 150, a.kv[1].pos0 = 1000;
  CHECK_EQ(mk_attn_fwd_check(&a), 0);
  a.kv[1].rows = 151; /* past seq */
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.q_row0 = 300;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.q_row0 = 100, a.q_rows = 200;
  CHECK_EQ(mk_attn_fwd_check(&a), 0);
  a.q_rows = 201;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  a = g, a.q_pos0 = -1;
  CHECK_EQ(mk_attn_fwd_check(&a), -EINVAL);
  /* the launcher refuses the same before looking for a device */
  a = g, a.d_head = 96;
  CHECK_EQ(mk_attn_fwd_launch(&a, 0), -EINVAL);
}

/* Brute force: whether any (query in [q_first, q_last], key of tile t) pair is visible, and
 * whether every pair of the tile's bn columns is (an unmasked tile). */
static void brute_tile(long long q_first, long long q_last, long long pos0, int rows, int bn, int t, int causal,
                       int* any, int* all) {
  *any = 0, *all = 1;
  for (int j = t * bn; j < (t + 1) * bn; j++)
    for (long long q = q_first; q <= q_last; q++) {
      const int vis = j < rows && (!causal || pos0 + j <= q);
      *any |= vis;
      *all &= vis;
    }
}

static void tile_rules_match_brute_force(void) {
  const int bn = 128;
  const long long q_firsts[] = {0, 5, 127, 128, 300, 1000};
  const int q_lens[] = {1, 64, 100, 128};
  const long long pos0s[] = {0, 64, 128, 300, 1200};
  const int rows_list[] = {1, 100, 128, 129, 300, 1024};
  for (int causal = 0; causal < 2; causal++)
    for (unsigned a = 0; a < sizeof q_firsts / sizeof *q_firsts; a++)
      for (unsigned b = 0; b < sizeof q_lens / sizeof *q_lens; b++)
        for (unsigned c = 0; c < sizeof pos0s / sizeof *pos0s; c++)
          for (unsigned d = 0; d < sizeof rows_list / sizeof *rows_list; d++) {
            const long long qf = q_firsts[a], ql = qf + q_lens[b] - 1, p0 = pos0s[c];
            const int rows = rows_list[d], tiles = (rows + bn - 1) / bn;
            const int n = mk_attn_kv_tiles(ql, p0, rows, bn, causal);
            for (int t = 0; t < tiles; t++) {
              int any, all, any_first, all_first;
              brute_tile(qf, ql, p0, rows, bn, t, causal, &any, &all);
              /* tiles needed are exactly those with a visible pair, and they lead */
              CHECK_EQ(t < n, any);
              /* a tile left unmasked must have every pair visible for the first query, hence all */
              brute_tile(qf, qf, p0, rows, bn, t, causal, &any_first, &all_first);
              if (!mk_attn_tile_masked(qf, p0, rows, bn, t, causal)) CHECK(all_first && all);
              else CHECK(!all_first);
            }
          }
}

/* ---- the backward core (mk_attn_bwd_check and its tile rules) ---- */

static struct mk_attn_bwd_args base_bwd_args(void) {
  struct mk_attn_bwd_args a;
  memset(&a, 0, sizeof a);
  a.q = fake(1), a.out = fake(2), a.dout = fake(3), a.lse = (const float*)fake(4);
  a.delta = (float*)fake(5), a.dq_acc = (float*)fake(6), a.dq = fake(7);
  a.batch = 2, a.seq_q = 300, a.heads = 8, a.kv_heads = 2, a.d_head = 128, a.causal = 1;
  a.num_kv_blocks = 1;
  a.kv[0].k = fake(8), a.kv[0].v = fake(9), a.kv[0].dk = fake(10), a.kv[0].dv = fake(11), a.kv[0].seq = 300;
  return a;
}

/* The addends (peers' partials added to a block's bf16 outputs) and pdl (the main kernel
 * launched beside the kernel before it): what the core takes and what it refuses. */
static void bwd_addends_and_pdl_rules(void) {
  struct mk_attn_bwd_args g = base_bwd_args(), a;
  g.ready_done = (const uint64_t*)fake(20);
  g.addends.n = 2, g.addends.block = 0;
  for (int i = 0; i < 2; i++)
    g.addends.dk[i] = (const float*)fake(21 + i), g.addends.dv[i] = (const float*)fake(23 + i),
    g.addends.ready[i] = (const uint64_t*)fake(25 + i);
  CHECK_EQ(mk_attn_bwd_check(&g), 0);
  a = g, a.addends.n = MK_ATTN_MAX_ADDENDS + 1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.addends.n = -1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.addends.block = 1; /* one kv block */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].dv = NULL, a.kv[0].dv_acc = (float*)fake(12); /* the sum lands in bf16 dk and dv only */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].dk_acc = (float*)fake(12);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.ready_done = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.addends.ready[1] = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.addends.dv[0] = (const float*)((const char*)fake(23) + 4);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.dkv_ws = (float*)fake(12);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.addends.n = 0, a.ready_done = NULL; /* no addends: nothing else asked */
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = base_bwd_args(), a.pdl = 1; /* its prep kernel would run before it */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a.delta_ready = a.dq_accumulate = 1;
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a.dkv_ws = (float*)fake(12); /* and its memset */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
}

/* A valid one-launch call with the ring's parts: a peer's block (stored into its owner's
 * accumulator, announced) and the own block last with one addend, the push, the call's end. */
static struct mk_attn_bwd_args ring_parts_args(void) {
  struct mk_attn_bwd_args g = base_bwd_args();
  g.causal = 0, g.num_kv_blocks = 2, g.ready_done = (const uint64_t*)fake(20);
  g.kv[1] = g.kv[0];
  g.kv[0].dk = g.kv[0].dv = NULL, g.kv[0].dk_acc = (float*)fake(12), g.kv[0].dv_acc = (float*)fake(13);
  g.kv[0].acc_overwrite = 1, g.kv[0].announce = (uint64_t*)fake(14);
  g.addends.n = 1, g.addends.block = 1;
  g.addends.dk[0] = (const float*)fake(21), g.addends.dv[0] = (const float*)fake(23);
  g.addends.ready[0] = (const uint64_t*)fake(25);
  g.phase_words = (uint64_t*)fake(26), g.call_done = (uint64_t*)fake(27);
  g.err = (struct mk_gemm_error*)fake(45);
  struct mk_kv_push* p = &g.push;
  p->ctas = 4, p->rank = 0, p->nranks = 2, p->batch = 2, p->s_local = 300, p->chunk_rows = 128;
  p->chunks_per_batch = 3, p->row_vecs = 2 * 128 / 8, p->k = fake(8), p->v = fake(9), p->done = (const uint64_t*)fake(28);
  p->dst_k[1] = fake(29), p->dst_v[1] = fake(30), p->dst_flags[1] = (uint64_t*)fake(31);
  p->peer_done[1] = (const uint64_t*)fake(32);
  return g;
}

/* The ring's parts in one launch (push, announcements, the call's end): what the core takes
 * and what it refuses. */
static void bwd_ring_parts_rules(void) {
  const struct mk_attn_bwd_args g = ring_parts_args();
  struct mk_attn_bwd_args a;
  CHECK_EQ(mk_attn_bwd_check(&g), 0);
  a = g, a.phase_words = NULL; /* every part needs the one launch */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.push.ctas = 0, a.kv[0].announce = NULL, a.phase_words = NULL, a.call_done = (uint64_t*)fake(27);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.push.ctas = 0, a.call_done = NULL, a.kv[0].announce = NULL; /* no ring part: a plain one launch */
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = g, a.push.ctas = -1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.push.nranks = MK_ATTN_PUSH_MAX_RANKS + 1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.push.rank = 2;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.push.dst_flags[1] = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.push.chunks_per_batch = 2; /* 300 rows in 128-row chunks are 3 */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.push.k = (const char*)fake(8) + 8;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].announce = (uint64_t*)((char*)fake(14) + 4);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.call_done = (uint64_t*)((char*)fake(27) + 4);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.call_done = NULL; /* the push and the announcements need the call's end */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.err = NULL; /* and the record a wait that gives up aborts: else a block a warp group
                         * gave up on could still be announced whole */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.pdl = 1, a.delta_ready = a.dq_accumulate = 1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.dkv_ws = (float*)fake(33); /* split heads: each tile written out by its last warp group */
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a.addends.n = 0, a.kv[1].dk = a.kv[1].dv = NULL, a.kv[1].dk_acc = (float*)fake(15), a.kv[1].dv_acc = (float*)fake(16);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL); /* that write-out is the addends' epilogue's */
  a.dkv_ws = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = g, a.kv[0].rows = 100; /* blocks of one size: its CTAs take them in turn */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0] = g.kv[1], a.kv[1] = g.kv[0], a.addends.block = 0; /* the addends' block not last */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a.push.ctas = 0, a.kv[1].announce = NULL, a.call_done = NULL, a.phase_words = NULL; /* in any launch */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
}

/* Positions in two pieces (a zigzag rank's chunks): whole tiles inside the rows, the second
 * piece after the first, with the ring's parts only. */
static void bwd_two_piece_rules(void) {
  struct mk_attn_bwd_args g = ring_parts_args(), a;
  g.causal = 1, g.seq_q = 512, g.kv[0].seq = g.kv[1].seq = 512, g.push.s_local = 512, g.push.chunks_per_batch = 4;
  g.q_split = 256, g.q_pos1 = 1536, g.kv[0].split = g.kv[1].split = 256, g.kv[0].pos1 = 1024, g.kv[1].pos1 = 1280;
  CHECK_EQ(mk_attn_bwd_check(&g), 0);
  a = g, a.q_split = 96; /* not whole 64-row query tiles */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.q_split = 512; /* not inside the rows */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[1].split = 192; /* not whole 128-key tiles */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].pos1 = -1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.q_pos1 = g.q_pos0 + 128; /* the second piece inside the first: no longer a suffix */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[1].pos1 = a.kv[1].pos0;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.push.ctas = 0, a.kv[0].announce = NULL, a.call_done = NULL, a.addends.n = 0; /* no ring part */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
}

/* Which epilogue kernel a call takes (attn.h mk_attn_bwd_epilogue): the one with the loads it
 * needs, and no call whose accumulators are added to without them (it would drop their old
 * values). */
static void bwd_epilogue_kernel_has_the_loads_the_call_needs(void) {
  struct mk_attn_bwd_args a = base_bwd_args(); /* GQA 8:2, D = 128, bf16 outputs, no dkv_ws: not split */
  CHECK_EQ(mk_attn_bwd_epilogue(&a), MK_ATTN_BWD_EPI_PLAIN);
  a.kv[0].dk = a.kv[0].dv = NULL, a.kv[0].dk_acc = (float*)fake(13), a.kv[0].dv_acc = (float*)fake(14);
  CHECK_EQ(mk_attn_bwd_epilogue(&a), MK_ATTN_BWD_EPI_PLAIN); /* added straight in by split heads' red.add */
  a.heads = a.kv_heads; /* not split: added to their old values */
  CHECK_EQ(mk_attn_bwd_epilogue(&a), MK_ATTN_BWD_EPI_ACC);
  a.kv[0].acc_overwrite = 1; /* stored, nothing read */
  CHECK_EQ(mk_attn_bwd_epilogue(&a), MK_ATTN_BWD_EPI_PLAIN);
  a = base_bwd_args(), a.d_head = 64, a.kv[0].dk_acc = (float*)fake(13); /* D = 64 never splits */
  CHECK_EQ(mk_attn_bwd_epilogue(&a), MK_ATTN_BWD_EPI_ACC);
  a = base_bwd_args(), a.num_kv_blocks = 2, a.kv[1] = a.kv[0], a.kv[1].dv_acc = (float*)fake(14);
  a.heads = a.kv_heads; /* one block of two */
  CHECK_EQ(mk_attn_bwd_epilogue(&a), MK_ATTN_BWD_EPI_ACC);
  a = base_bwd_args(), a.ready_done = (const uint64_t*)fake(20), a.addends.n = 1;
  a.addends.dk[0] = (const float*)fake(21), a.addends.dv[0] = (const float*)fake(23);
  a.addends.ready[0] = (const uint64_t*)fake(25);
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  CHECK_EQ(mk_attn_bwd_epilogue(&a), MK_ATTN_BWD_EPI_ADDENDS);
}

static void bwd_bad_shapes_are_refused(void) {
  struct mk_attn_bwd_args g = base_bwd_args(), a;
  CHECK_EQ(mk_attn_bwd_check(&g), 0);
  CHECK_EQ(mk_attn_bwd_check(NULL), -EINVAL);
  a = g, a.d_head = 96;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.d_head = 64;
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = g, a.heads = 6, a.kv_heads = 4;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv_heads = 0;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.heads = 0;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.batch = 0;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.seq_q = 0;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
}

static void bwd_bad_pointers_are_refused(void) {
  struct mk_attn_bwd_args g = base_bwd_args(), a;
  a = g, a.q = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.dout = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.lse = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.delta = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.dq_acc = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.dq = NULL; /* optional */
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = g, a.out = NULL; /* needed for delta */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a.delta_ready = 1; /* not any more */
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = g, a.q = (const char*)fake(1) + 8;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.dq_acc = (float*)((char*)fake(6) + 4);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.dkv_ws = (float*)fake(12);
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = g, a.dkv_ws = (float*)((char*)fake(12) + 8);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.phase_words = (uint64_t*)fake(14); /* the one-launch call */
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = g, a.phase_words = (uint64_t*)((char*)fake(14) + 4);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.lse = (const float*)((const char*)fake(4) + 2);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].k = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].v = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].dk = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a.kv[0].dk_acc = (float*)fake(12); /* either output will do */
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a = g, a.kv[0].dv = NULL;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].dv_acc = (float*)((char*)fake(13) + 4);
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
}

static void bwd_bad_blocks_and_rows_are_refused(void) {
  struct mk_attn_bwd_args g = base_bwd_args(), a;
  a = g, a.kv[0].seq = 0;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.num_kv_blocks = 0;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.num_kv_blocks = MK_ATTN_MAX_KV_BLOCKS + 1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.num_kv_blocks = 2; /* the second block unset */
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.num_kv_blocks = 2, a.kv[1] = g.kv[0], a.kv[1].row0 = 150, a.kv[1].pos0 = 1000;
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a.kv[1].rows = 151;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.kv[0].pos0 = -1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.q_row0 = 300;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.q_row0 = 100, a.q_rows = 200;
  CHECK_EQ(mk_attn_bwd_check(&a), 0);
  a.q_rows = 201;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.q_pos0 = -1;
  CHECK_EQ(mk_attn_bwd_check(&a), -EINVAL);
  a = g, a.d_head = 96;
  CHECK_EQ(mk_attn_bwd_launch(&a, 0), -EINVAL);
}

/* A zigzag rank's queries (chunks r and 2n-1-r) against every key tile of every rank's block
 * (its two chunks): the query tiles that see a key tile (any query at or after its first key)
 * are exactly those from mk_attn_bwd_first_q_tile2 on, brute force over the tiles' positions. */
static void bwd_two_piece_first_tile_matches_brute_force(void) {
  const int bm = MK_ATTN_BWD_BLOCK_M, bn = MK_ATTN_BWD_BLOCK_N;
  for (int n = 2; n <= 4; n++)
    for (int s_local = 256; s_local <= 1024; s_local *= 2) {
      const int half = s_local / 2, nqt = s_local / bm, q_tiles0 = half / bm;
      for (int r = 0; r < n; r++) {
        const long long q_pos0 = (long long)r * half, q_pos1 = (long long)(2 * n - 1 - r) * half;
        for (int src = 0; src < n; src++)
          for (int t = 0; t < s_local / bn; t++) {
            const long long kf = t < half / bn ? (long long)src * half + (long long)t * bn
                                               : (long long)(2 * n - 1 - src) * half + (long long)(t - half / bn) * bn;
            int first = nqt; /* brute force: the first tile whose last query is at or after kf */
            for (int qi = nqt - 1; qi >= 0; qi--) {
              const long long last = (qi < q_tiles0 ? q_pos0 + (long long)qi * bm : q_pos1 + (long long)(qi - q_tiles0) * bm) + bm - 1;
              if (last >= kf) first = qi;
              else break; /* a suffix: no earlier tile sees it either */
            }
            int i0 = mk_attn_bwd_first_q_tile2(q_pos0, q_tiles0, q_pos1, kf, bm, 1);
            if (i0 > nqt) i0 = nqt;
            CHECK_EQ(i0, first);
            for (int qi = 0; qi < first; qi++) { /* and none before it sees it */
              const long long last = (qi < q_tiles0 ? q_pos0 + (long long)qi * bm : q_pos1 + (long long)(qi - q_tiles0) * bm) + bm - 1;
              CHECK(last < kf);
            }
            CHECK_EQ(mk_attn_bwd_first_q_tile2(q_pos0, q_tiles0, q_pos1, kf, bm, 0), 0);
          }
      }
    }
}

/* The backward's rules against brute force: query tiles before mk_attn_bwd_first_q_tile see
 * no key of the tile; a pair left unmasked has every (query, key) visible. */
static void bwd_tile_rules_match_brute_force(void) {
  const int bm = 64, bn = 128;
  const long long q_pos0s[] = {0, 5, 64, 127, 128, 300, 1000};
  const long long key_firsts[] = {0, 1, 63, 64, 128, 200, 1100};
  const int keys_lefts[] = {1, 100, 127, 128, 300};
  for (int causal = 0; causal < 2; causal++)
    for (unsigned a = 0; a < sizeof q_pos0s / sizeof *q_pos0s; a++)
      for (unsigned c = 0; c < sizeof key_firsts / sizeof *key_firsts; c++) {
        const long long q0 = q_pos0s[a], k0 = key_firsts[c];
        const int first = mk_attn_bwd_first_q_tile(q0, k0, bm, causal);
        CHECK(first >= 0);
        for (int i = 0; i < first + 3; i++) {
          const long long qf = q0 + (long long)i * bm;
          /* any query of tile i sees key k0 (the tile's first, so its most visible)? */
          const int any = !causal || qf + bm - 1 >= k0;
          CHECK_EQ(i >= first, any);
          for (unsigned d = 0; d < sizeof keys_lefts / sizeof *keys_lefts; d++) {
            const int left = keys_lefts[d];
            int all = 1;
            for (int j = 0; j < bn; j++)
              for (int q = 0; q < bm; q++) all &= j < left && (!causal || qf + q >= k0 + j);
            if (!mk_attn_bwd_tile_masked(qf, k0, left, bn, causal)) CHECK(all);
            else CHECK(!all);
          }
        }
      }
}

/* The persistent forward's schedule: over any CTA count every item is taken exactly once, each
 * CTA's items in rising order (its rounds), and an item's (tile, head, batch) is a bijection
 * for any chunk (mk_attn_item_work); chunk 1 and MK_ATTN_CHUNK_HEADS are the tile-major and
 * head-major orders they replaced, tile-major causal items never grow in length (longest
 * first). */
static void persistent_items_cover_every_tile_once(void) {
  static const int shapes[][3] = {{1, 1, 1}, {3, 2, 1}, {128, 64, 1}, {32, 16, 16}, {5, 7, 3}};
  static const int cta_counts[] = {1, 2, 7, 132, 1000};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int tiles = shapes[si][0], heads = shapes[si][1], batch = shapes[si][2];
    const int n = tiles * heads * batch;
    unsigned char* seen = calloc((size_t)n, 1);
    for (size_t ci = 0; ci < sizeof cta_counts / sizeof cta_counts[0]; ci++) {
      const int ctas = cta_counts[ci] < n ? cta_counts[ci] : n;
      memset(seen, 0, (size_t)n);
      for (int c = 0; c < ctas; c++) {
        int prev = -1;
        for (int k = 0;; k++) {
          const int i = mk_attn_cta_item(k, c, ctas, n);
          if (i < 0) break;
          CHECK(i > prev);
          CHECK(i < n);
          prev = i;
          seen[i]++;
        }
      }
      for (int i = 0; i < n; i++) CHECK_EQ(seen[i], 1);
    }
    static const int chunks[] = {MK_ATTN_CHUNK_HEADS, 1, 3, 16};
    for (size_t ki = 0; ki < sizeof chunks / sizeof chunks[0]; ki++)
      for (int causal = 0; causal < 2; causal++) {
        const int chunk = chunks[ki], hb = heads * batch;
        memset(seen, 0, (size_t)n);
        int prev_tile = tiles;
        for (int i = 0; i < n; i++) {
          const struct mk_attn_work w = mk_attn_item_work(i, tiles, heads, batch, chunk, causal);
          CHECK(w.tile >= 0 && w.tile < tiles && w.head >= 0 && w.head < heads && w.batch >= 0 && w.batch < batch);
          seen[(w.batch * heads + w.head) * tiles + w.tile]++;
          if (chunk == 1 && causal) CHECK(w.tile <= prev_tile);
          prev_tile = w.tile;
          if (chunk == MK_ATTN_CHUNK_HEADS && !causal) /* the grid's order */
            CHECK_EQ((w.batch * heads + w.head) * tiles + w.tile, i);
          if (chunk == 1 || chunk == MK_ATTN_CHUNK_HEADS) { /* sessions 21-32's orders 1 and 0 */
            const int t = chunk == 1 ? i / hb : i % tiles, bh = chunk == 1 ? i % hb : i / tiles;
            CHECK(w.tile == (causal ? tiles - 1 - t : t) && w.head == bh % heads && w.batch == bh / heads);
          }
        }
        for (int i = 0; i < n; i++) CHECK_EQ(seen[i], 1);
      }
    free(seen);
  }
}

/* Greedy dispatch of CTAs in order onto `sms` SMs (each to the first free one, as the GPU
 * does at one CTA per SM): the time the last one ends, in steps. */
static long long list_schedule_makespan(const int* steps, int n, int sms) {
  long long free_at[256] = {0}, end = 0;
  for (int c = 0; c < n; c++) {
    int m = 0;
    for (int s = 1; s < sms; s++)
      if (free_at[s] < free_at[m]) m = s;
    free_at[m] += steps[c];
    if (free_at[m] > end) end = free_at[m];
  }
  return end;
}

/* The split backward's workspace (attn.h dkv_ws): dk and dv of every block's rows (batch x rows
 * x kv_heads x D each) except a block whose outputs are only accumulators added to, which take
 * the partials directly; none without grouped-query heads or at D = 64; in the ring's call
 * also its tiles' warp-group counts. */
static void bwd_dkv_workspace_covers_the_blocks_that_need_it(void) {
  struct mk_attn_bwd_args a = base_bwd_args(); /* B = 2, 300 rows, H_kv = 2, D = 128 */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)2 * 2 * 300 * 2 * 128);
  a.num_kv_blocks = 2, a.kv[1] = a.kv[0], a.kv[1].row0 = 100, a.kv[1].rows = 50;
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)2 * 2 * (300 + 50) * 2 * 128);
  a.kv[0].dk = a.kv[0].dv = NULL, a.kv[0].dk_acc = (float*)fake(13), a.kv[0].dv_acc = (float*)fake(14);
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)2 * 2 * 50 * 2 * 128); /* block 0: added directly */
  a.kv[0].acc_overwrite = 1; /* stored, not added: several heads' CTAs cannot each store it */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)2 * 2 * (300 + 50) * 2 * 128);
  a.heads = 65536, a.kv_heads = 2; /* more query heads than a grid's y: a CTA per group */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)0);
  a.heads = 8;
  a.d_head = 64; /* split only at D = 128 (attn_bwd.cu) */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)0);
  a.d_head = 128, a.heads = a.kv_heads;
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)0);
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(NULL), (size_t)0);
  /* the ring's call: then also a count per (key tile, kv head, batch), whole 4-float units
   * (2 blocks of 300 rows: 3 tiles each, x 2 kv heads x 2 batches = 24 counts) */
  a = ring_parts_args(); /* B = 2, H_kv = 2, D = 128, two blocks of 300 rows */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)2 * 2 * (300 + 300) * 2 * 128 + 24);
  a.batch = 1, a.push.batch = 1; /* 12 counts */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)2 * 1 * (300 + 300) * 2 * 128 + 12);
  a.kv[0].rows = 50; /* 1 + 3 tiles x 2 kv heads = 8 */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)2 * 1 * (50 + 300) * 2 * 128 + 8);
  a.kv_heads = 1; /* 4 */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)2 * 1 * (50 + 300) * 1 * 128 + 4);
  a.heads = 1; /* no grouped heads: no workspace at all */
  CHECK_EQ(mk_attn_bwd_dkv_ws_floats(&a), (size_t)0);
}

/* The backward's CTA order (attn.h mk_attn_bwd_cta_work) over any chunk: every (key tile,
 * head, batch) once; chunk >= tiles is the grid's own order; inside a chunk the CTAs of one
 * (batch, head) are consecutive, in tile order. */
static void bwd_cta_chunks_visit_every_cta_once(void) {
  static const int shapes[][3] = {{1, 1, 1}, {3, 2, 1}, {128, 64, 1}, {32, 16, 16}, {5, 7, 3}, {512, 8, 1}};
  static const int chunks[] = {1, 2, 3, 16, 32, 64, 100, 128, 512, 1000};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int tiles = shapes[si][0], heads = shapes[si][1], batch = shapes[si][2], n = tiles * heads * batch;
    unsigned char* seen = calloc((size_t)n, 1);
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
      const int chunk = chunks[ci];
      memset(seen, 0, (size_t)n);
      struct mk_attn_work prev = {-1, -1, -1};
      for (int c = 0; c < n; c++) {
        const struct mk_attn_work w = mk_attn_bwd_cta_work(c, tiles, heads, batch, chunk);
        CHECK(w.tile >= 0 && w.tile < tiles && w.head >= 0 && w.head < heads && w.batch >= 0 && w.batch < batch);
        seen[(w.batch * heads + w.head) * tiles + w.tile]++;
        if (chunk >= tiles) CHECK_EQ((w.batch * heads + w.head) * tiles + w.tile, c);
        if (w.tile % chunk && w.tile != tiles / chunk * chunk) /* not a chunk's first tile */
          CHECK(prev.tile == w.tile - 1 && prev.head == w.head && prev.batch == w.batch);
        prev = w;
      }
      for (int i = 0; i < n; i++) CHECK_EQ(seen[i], 1);
    }
    free(seen);
  }
}

/* The causal backward's makespan on 132 SMs against the even share, S = 16384 (128 key tiles),
 * 64 query heads, 8 kv heads, for a CTA order and the query heads per CTA (8: a kv head's group,
 * 1: split); steps per CTA from mk_attn_bwd_first_q_tile. */
static double bwd_causal_makespan(int chunk, int heads_per_cta) {
  enum { TILES = 128, HEADS = 64, SMS = 132 };
  static int steps[TILES * HEADS];
  const int grid_heads = HEADS / heads_per_cta, n = TILES * grid_heads;
  const int bm = MK_ATTN_BWD_BLOCK_M, bn = MK_ATTN_BWD_BLOCK_N, q_tiles = TILES * bn / bm;
  long long total = 0;
  for (int c = 0; c < n; c++) {
    const struct mk_attn_work w = mk_attn_bwd_cta_work(c, TILES, grid_heads, 1, chunk);
    steps[c] = heads_per_cta * (q_tiles - mk_attn_bwd_first_q_tile(0, (long long)w.tile * bn, bm, 1));
    if (chunk == 1 && c) CHECK(steps[c] <= steps[c - 1]); /* longest first */
    total += steps[c];
  }
  return (double)list_schedule_makespan(steps, n, SMS) / ((double)total / SMS);
}

/* Under the causal mask a key tile's work falls with its index. On paper (list scheduling), with
 * a kv head's group per CTA, key tiles outermost (chunk 1, longest first) ends within 1% of the
 * even share and head by head (the grid's order) later; the kernel takes chunks of 128 key
 * tiles anyway (attn_bwd.cu MK_ATTN_BWD_CHUNK_TILES: measured faster, the CTAs that run together
 * share query tiles in L2), which costs at most 2% on paper with a group per CTA and 1% with one
 * query head per CTA (split: 8 times shorter CTAs). */
static void bwd_causal_order_runs_the_longest_ctas_first(void) {
  const double grouped_grid = bwd_causal_makespan(128, 8), grouped_longest = bwd_causal_makespan(1, 8);
  const double split_heads = bwd_causal_makespan(128, 1);
  CHECK(grouped_longest <= 1.01);
  CHECK(grouped_grid > grouped_longest);
  CHECK(grouped_grid <= 1.02);
  CHECK(split_heads <= 1.01);
  printf("bwd causal CTA order, makespan / even share: group per CTA %.3f (chunks of 128) -> %.3f (longest first); "
         "a head per CTA, chunks of 128 %.3f\n", grouped_grid, grouped_longest, split_heads);
}

/* The backward's dQ staging (attn.h mk_attn_dq_stage_offset): every element of the warp
 * group's 64 x 64 fp32 tile lands at the 128-byte-swizzled place TMA reads it from (box
 * j / 4, row r, column c at chunk (c / 4) ^ (r % 8)), each byte once. And the bank cost of a
 * warp's store (a fixed fragment pair, 32 lanes x 8 bytes), modelled as the hardware serves
 * 8-byte shared stores, a half-warp (128 bytes) at a time, each taking as many wavefronts as
 * its most-used 4-byte bank: rows r and r + 1 of a half-warp share a chunk pair, so 2 each, 4
 * per store where 2 would do; ncu measured exactly that (session 34: 4 wavefronts per STS.64,
 * 2 ideal). A layout without the conflicts would have this test say 2. */
static void dq_staging_is_the_tma_swizzle_at_4_wavefronts_per_store(void) {
  static unsigned char hits[2 * 64 * 128];
  memset(hits, 0, sizeof hits);
  for (int warp = 0; warp < 4; warp++)
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 8; j++) {
        int wavefronts = 0;
        for (int half = 0; half < 2; half++) {
          int banks[32] = {0}, most = 0;
          for (int lane = 16 * half; lane < 16 * half + 16; lane++) {
            const int r = 16 * warp + lane / 4 + 8 * i, col = 8 * j + 2 * (lane % 4); /* within the 64 */
            const unsigned at = mk_attn_dq_stage_offset(r, j, lane);
            const int box = col / 32, c = col % 32; /* box column, fp32 */
            const unsigned want = (unsigned)(box * 64 * 128 + r * 128 + (((c / 4) ^ (r % 8)) * 16) + (c % 4) * 4);
            CHECK_EQ(at, want);
            CHECK(at % 8 == 0 && at + 8 <= sizeof hits);
            for (int b = 0; b < 8 && at + 8 <= sizeof hits; b++) hits[at + b]++;
            banks[(at / 4) % 32]++, banks[(at / 4 + 1) % 32]++;
          }
          for (int b = 0; b < 32; b++) most = banks[b] > most ? banks[b] : most;
          wavefronts += most;
        }
        CHECK_EQ(wavefronts, 4);
      }
  for (size_t b = 0; b < sizeof hits; b++) CHECK_EQ(hits[b], 1);
}

int main(void) {
  bad_shapes_are_refused();
  bad_pointers_are_refused();
  bad_blocks_and_rows_are_refused();
  tile_rules_match_brute_force();
  bwd_bad_shapes_are_refused();
  bwd_bad_pointers_are_refused();
  bwd_bad_blocks_and_rows_are_refused();
  bwd_addends_and_pdl_rules();
  bwd_ring_parts_rules();
  bwd_two_piece_rules();
  bwd_epilogue_kernel_has_the_loads_the_call_needs();
  bwd_tile_rules_match_brute_force();
  bwd_two_piece_first_tile_matches_brute_force();
  persistent_items_cover_every_tile_once();
  bwd_cta_chunks_visit_every_cta_once();
  bwd_dkv_workspace_covers_the_blocks_that_need_it();
  bwd_causal_order_runs_the_longest_ctas_first();
  dq_staging_is_the_tma_swizzle_at_4_wavefronts_per_store();
  return MK_TEST_RESULT();
}
