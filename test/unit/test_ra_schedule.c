/* Ring attention's schedule (fused/ring_attn/ra_schedule.h) for 2 to 16 ranks: the zigzag
 * split places every token once, the ring shows every rank every KV block once, the chunk
 * mask classes give exactly the token-level causal mask, and causal work is the same on
 * every rank at every step. */
#include <string.h>

#include "mk_test.h"
#include "ra_schedule.h"

#define MAX_N 16

static void zigzag_chunks_of_all_ranks_are_a_permutation_of_2n_chunks(int n) {
  int seen[2 * MAX_N] = {0};
  CHECK_EQ(mk_ra_num_chunks(n), 2 * n);
  for (int r = 0; r < n; r++)
    for (int h = 0; h < 2; h++) {
      const int c = mk_ra_zigzag_chunk(r, n, h);
      REQUIRE(c >= 0 && c < 2 * n);
      seen[c]++;
      int half = -1;
      CHECK_EQ(mk_ra_zigzag_owner(c, n, &half), r);
      CHECK_EQ(half, h);
    }
  for (int c = 0; c < 2 * n; c++) CHECK_EQ(seen[c], 1);
  for (int r = 0; r < n; r++) { /* chunk r first, its mirror second */
    CHECK_EQ(mk_ra_zigzag_chunk(r, n, 0), r);
    CHECK_EQ(mk_ra_zigzag_chunk(r, n, 1), 2 * n - 1 - r);
  }
}

static void zigzag_rows_place_every_global_token_once_in_chunk_order(int n, long s_local) {
  static int seen[MAX_N * 64];
  const long s = n * s_local, c = s_local / 2;
  REQUIRE(s <= MAX_N * 64);
  CHECK_EQ(mk_ra_chunk_len(s_local), c);
  memset(seen, 0, sizeof(seen));
  for (int r = 0; r < n; r++)
    for (long i = 0; i < s_local; i++) {
      const long t = mk_ra_zigzag_global_row(r, n, s_local, i);
      REQUIRE(t >= 0 && t < s);
      seen[t]++;
      /* Row i is offset i % c of chunk (half 0: r, half 1: 2n-1-r). */
      CHECK_EQ(t, (i < c ? r : 2 * n - 1 - r) * c + i % c);
      long row = -1;
      CHECK_EQ(mk_ra_zigzag_local_row(t, n, s_local, &row), r);
      CHECK_EQ(row, i);
    }
  for (long t = 0; t < s; t++) CHECK_EQ(seen[t], 1);
}

static void zigzag_rows_of_two_ranks_match_the_written_example(void) {
  /* S = 8 over 2 ranks, chunks of 2: rank 0 holds tokens 0 1 6 7, rank 1 holds 2 3 4 5. */
  const long want[2][4] = {{0, 1, 6, 7}, {2, 3, 4, 5}};
  for (int r = 0; r < 2; r++)
    for (long i = 0; i < 4; i++) CHECK_EQ(mk_ra_zigzag_global_row(r, 2, 4, i), want[r][i]);
}

static void ring_shows_every_rank_every_kv_block_once_own_first(int n) {
  for (int r = 0; r < n; r++) {
    int seen[MAX_N] = {0};
    CHECK_EQ(mk_ra_kv_source(r, n, 0), r);
    for (int s = 0; s < n; s++) {
      const int src = mk_ra_kv_source(r, n, s);
      REQUIRE(src >= 0 && src < n);
      seen[src]++;
    }
    for (int p = 0; p < n; p++) CHECK_EQ(seen[p], 1);
  }
  /* At each step every block is worked on by exactly one rank. */
  for (int s = 0; s < n; s++) {
    int hits[MAX_N] = {0};
    for (int r = 0; r < n; r++) hits[mk_ra_kv_source(r, n, s)]++;
    for (int p = 0; p < n; p++) CHECK_EQ(hits[p], 1);
  }
}

static void ring_predecessor_and_successor_are_inverse_and_pass_blocks_on(int n) {
  int hits[MAX_N] = {0};
  for (int r = 0; r < n; r++) {
    const int prev = mk_ra_recv_from(r, n), next = mk_ra_send_to(r, n);
    REQUIRE(prev >= 0 && prev < n && next >= 0 && next < n);
    CHECK(prev != r && next != r);
    CHECK_EQ(mk_ra_send_to(prev, n), r);
    CHECK_EQ(mk_ra_recv_from(next, n), r);
    hits[next]++;
    /* The block r works on at step s+1 is the one its predecessor worked on at step s. */
    for (int s = 0; s + 1 < n; s++)
      CHECK_EQ(mk_ra_kv_source(r, n, s + 1), mk_ra_kv_source(prev, n, s));
  }
  for (int p = 0; p < n; p++) CHECK_EQ(hits[p], 1); /* every rank receives from exactly one */
}

/* For every rank, step, local query row and key row of the block it holds: the chunk mask
 * class (and the in-chunk rule for DIAGONAL) lets a key through exactly when the global
 * token-level mask does (non-causal: always; causal: key token <= query token). */
static void chunk_masks_reproduce_the_token_level_mask(int n, long s_local, int causal) {
  const long c = s_local / 2;
  for (int r = 0; r < n; r++)
    for (int s = 0; s < n; s++) {
      const int src = mk_ra_kv_source(r, n, s);
      for (long qi = 0; qi < s_local; qi++)
        for (long ki = 0; ki < s_local; ki++) {
          const long tq = mk_ra_zigzag_global_row(r, n, s_local, qi);
          const long tk = mk_ra_zigzag_global_row(src, n, s_local, ki);
          const int want = !causal || tk <= tq;
          const enum mk_ra_mask m =
              mk_ra_step_mask(r, n, s, (int)(qi / c), (int)(ki / c), causal);
          const int got = mk_ra_visible(m, qi % c, ki % c);
          if (got != want) {
            fprintf(stderr, "n=%d s_local=%ld causal=%d rank %d step %d q %ld k %ld: %d vs %d\n",
                    n, s_local, causal, r, s, tq, tk, got, want);
            CHECK_EQ(got, want);
            return;
          }
        }
    }
}

/* Tiles of a chunk pair, counted by brute force: a tile is needed when it holds a visible
 * (query, key) pair. */
static void pair_tiles_count_the_tiles_holding_a_visible_pair(long chunk_len, int tq, int tk) {
  const enum mk_ra_mask classes[3] = {MK_RA_NONE, MK_RA_DIAGONAL, MK_RA_FULL};
  for (int ci = 0; ci < 3; ci++) {
    long want = 0;
    for (long i = 0; i * tq < chunk_len; i++)
      for (long j = 0; j * tk < chunk_len; j++) {
        int any = 0;
        for (long q = i * tq; q < (i + 1) * tq && q < chunk_len && !any; q++)
          for (long k = j * tk; k < (j + 1) * tk && k < chunk_len && !any; k++)
            any = mk_ra_visible(classes[ci], q, k);
        want += any;
      }
    const long got = mk_ra_pair_tiles(classes[ci], chunk_len, tq, tk);
    if (got != want)
      fprintf(stderr, "class %d chunk %ld tiles %dx%d\n", (int)classes[ci], chunk_len, tq, tk);
    CHECK_EQ(got, want);
  }
}

/* The point of zigzag: with causal masking every rank has the same work at every ring step
 * (step 0: 1 FULL + 2 DIAGONAL chunk pairs; later steps: 2 FULL, 2 skipped), so no rank
 * waits for another; over the ring the ranks together cover the global causal triangle. */
static void causal_zigzag_work_is_equal_on_every_rank_at_every_step(int n, long s_local,
                                                                    int tile_q, int tile_k) {
  const long c = s_local / 2;
  const long full_tiles = ((c + tile_q - 1) / tile_q) * ((c + tile_k - 1) / tile_k);
  long all = 0;
  for (int s = 0; s < n; s++) {
    const long step_work = mk_ra_step_tiles(0, n, s, s_local, tile_q, tile_k, 1);
    CHECK_EQ(step_work, s == 0 ? full_tiles + 2 * mk_ra_pair_tiles(MK_RA_DIAGONAL, c, tile_q, tile_k)
                               : 2 * full_tiles);
    for (int r = 0; r < n; r++) {
      int full = 0, diag = 0;
      for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) {
          const enum mk_ra_mask m = mk_ra_step_mask(r, n, s, qh, kh, 1);
          full += m == MK_RA_FULL;
          diag += m == MK_RA_DIAGONAL;
        }
      CHECK_EQ(full, s == 0 ? 1 : 2);
      CHECK_EQ(diag, s == 0 ? 2 : 0);
      if (s > 0) { /* which two: see mk_ra_step_tiles */
        const int lower = mk_ra_kv_source(r, n, s) < r;
        for (int qh = 0; qh < 2; qh++)
          for (int kh = 0; kh < 2; kh++)
            CHECK_EQ(mk_ra_step_mask(r, n, s, qh, kh, 1),
                     (lower ? kh == 0 : qh == 1) ? MK_RA_FULL : MK_RA_NONE);
      }
      const long w = mk_ra_step_tiles(r, n, s, s_local, tile_q, tile_k, 1);
      CHECK_EQ(w, step_work);
      all += w;
    }
  }
  if (tile_q == tile_k && c % tile_q == 0) {
    /* Chunks split into whole square tiles: together the ranks cover the global lower
     * triangle of tiles, each tile once. */
    const long t = n * s_local / tile_q;
    CHECK_EQ(all, t * (t + 1) / 2);
  }
}

static void non_causal_pairs_are_all_full(int n, long s_local, int tile) {
  const long t = (s_local / 2 + tile - 1) / tile;
  for (int r = 0; r < n; r++)
    for (int s = 0; s < n; s++) {
      for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) CHECK_EQ(mk_ra_step_mask(r, n, s, qh, kh, 0), MK_RA_FULL);
      CHECK_EQ(mk_ra_step_tiles(r, n, s, s_local, tile, tile, 0), 4 * t * t);
    }
  for (int q = 0; q < 2 * n; q++)
    for (int k = 0; k < 2 * n; k++) CHECK_EQ(mk_ra_chunk_mask(q, k, 0), MK_RA_FULL);
}

/* The forward's item order (mk_ra_items_tiles_outer): tiles outermost only for causal calls
 * with few items per SM (the measured S = 16384 case on 132 SMs, 4096 items), head by head at
 * S = 65536 (16384 items) and for every non-causal call. */
static void forward_items_take_tiles_outermost_only_when_few_and_causal(void) {
  const long s16k = 1L * 64 * 2 * (4096 / 128), s64k = 1L * 64 * 2 * (16384 / 128);
  CHECK(mk_ra_items_tiles_outer(1, s16k, 132));
  CHECK(!mk_ra_items_tiles_outer(1, s64k, 132));
  CHECK(!mk_ra_items_tiles_outer(0, s16k, 132));
  CHECK(!mk_ra_items_tiles_outer(1, (long)MK_RA_TILES_OUTER_PER_SM * 132, 132));
  CHECK(mk_ra_items_tiles_outer(1, (long)MK_RA_TILES_OUTER_PER_SM * 132 - 1, 132));
}

int main(void) {
  zigzag_rows_of_two_ranks_match_the_written_example();
  forward_items_take_tiles_outermost_only_when_few_and_causal();
  for (int n = 2; n <= MAX_N; n++) {
    zigzag_chunks_of_all_ranks_are_a_permutation_of_2n_chunks(n);
    ring_shows_every_rank_every_kv_block_once_own_first(n);
    ring_predecessor_and_successor_are_inverse_and_pass_blocks_on(n);
    for (long s_local = 2; s_local <= 10; s_local += 4) {
      zigzag_rows_place_every_global_token_once_in_chunk_order(n, s_local);
      chunk_masks_reproduce_the_token_level_mask(n, s_local, 1);
      chunk_masks_reproduce_the_token_level_mask(n, s_local, 0);
    }
    for (int tile = 64; tile <= 128; tile *= 2) {
      causal_zigzag_work_is_equal_on_every_rank_at_every_step(n, 4096, tile, tile);
      causal_zigzag_work_is_equal_on_every_rank_at_every_step(n, 400, tile, tile); /* short tiles */
      non_causal_pairs_are_all_full(n, 4096, tile);
    }
    causal_zigzag_work_is_equal_on_every_rank_at_every_step(n, 4096, 128, 64);
    causal_zigzag_work_is_equal_on_every_rank_at_every_step(n, 400, 64, 128);
    causal_zigzag_work_is_equal_on_every_rank_at_every_step(n, 12, 2, 2);
  }
  const int tiles[][2] = {{1, 1}, {2, 2}, {3, 2}, {2, 3}, {4, 7}, {64, 64}, {128, 128}, {128, 64}};
  const long lens[] = {1, 5, 12, 17, 130, 256};
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 6; j++)
      pair_tiles_count_the_tiles_holding_a_visible_pair(lens[j], tiles[i][0], tiles[i][1]);
  return MK_TEST_RESULT();
}
