/*
 * GEMM+ReduceScatter's walks on the GEMM's own tile scheduler (fused/common/sched.cuh,
 * compiled here as C), with the rotation and raster group the launcher uses; the raster group
 * is the largest power of two up to the default that divides the row-blocks of a shard. The
 * static walk (slots c, c + G, .. of the rotated order; without a call bracket): every CTA
 * meets this rank's rows only after all its peers' rows (an own tile's storers wait for the
 * peers, and a peer tile behind it in the same CTA deadlocked 8 ranks at 2 row-blocks per
 * shard). The claimed walk (gemm.h collect_claims) takes the slots in order: every peer-row
 * slot comes before every own-row one. No GPU.
 */
#include "mk_test.h"
#include "gemm.h"

/* sched.cuh's device helpers as plain C */
#undef __device__
#undef __forceinline__
#define __device__
#define __forceinline__ static inline
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
#include "sched.cuh"

static void group_m_divides_the_shard(void) {
  for (int blocks = 1; blocks <= 96; blocks++)
    for (int group_m = 1; group_m <= 16; group_m *= 2) {
      const int g = mk_gemm_rs_group_m(group_m, blocks);
      CHECK(g >= 1 && g <= group_m && (g & (g - 1)) == 0 && blocks % g == 0);
      CHECK(g * 2 > group_m || blocks % (g * 2) != 0); /* the largest such */
    }
}

/* The static walk: in every CTA's slots, no peer-row tile after an own-row tile. */
static void static_walk_case(int nranks, int rank, int blocks, int tiles_n, int ctas, int group_m) {
  const int bm = 128, bn = 256, m = nranks * blocks * bm, n = tiles_n * bn;
  const int rotate = (rank + 1) % nranks * blocks;
  for (int c = 0; c < ctas; c++) {
    struct mk_sched s;
    sched_init(&s, m, n, bm, bn, group_m, 1, 0, 1, NULL, NULL, rotate);
    struct mk_tile t;
    int seen_own = 0;
    for (int id = c; sched_tile(&s, m, n, id, &t); id += ctas) {
      const int own = t.row0 / (blocks * bm) == rank;
      if (seen_own && !own)
        fprintf(stderr, "n=%d rank=%d blocks=%d tiles=%d ctas=%d group=%d: cta %d has peer slot %d after an own one\n",
                nranks, rank, blocks, tiles_n, ctas, group_m, c, id);
      CHECK(!seen_own || own);
      if (seen_own && !own) return;
      seen_own |= own;
    }
  }
}

/* The claimed walk (gemm.h collect_claims) takes the slots in order, so that an own-row tile
 * is taken only after every peer-row tile: with the launcher's rotation and group, the first
 * (nranks - 1) x blocks x tiles_n slots must be exactly the peers' rows. Returns the slots on
 * the wrong side (0 expected). */
static int claimed_split_misplaced(int nranks, int rank, int blocks, int tiles_n, int group_m) {
  const int bm = 128, bn = 256, m = nranks * blocks * bm, n = tiles_n * bn - 8;
  const int from = (nranks - 1) * blocks * tiles_n;
  struct mk_sched s;
  sched_init(&s, m, n, bm, bn, group_m, 1, 0, 1, NULL, NULL, (rank + 1) % nranks * blocks);
  struct mk_tile t;
  int wrong = 0, id = 0;
  for (; sched_tile(&s, m, n, id, &t); id++) wrong += (t.row0 / (blocks * bm) == rank) != (id >= from);
  return wrong + (id != nranks * blocks * tiles_n);
}

static void claimed_walk_takes_every_peer_row_tile_before_an_own_one(void) {
  const int ranks[] = {2, 3, 4, 8}, blocks[] = {1, 2, 3, 6, 12, 32}, tiles[] = {1, 2, 3};
  for (int a = 0; a < 4; a++)
    for (int r = 0; r < ranks[a]; r++)
      for (int b = 0; b < 6; b++)
        for (int t = 0; t < 3; t++)
          CHECK_EQ(claimed_split_misplaced(ranks[a], r, blocks[b], tiles[t], mk_gemm_rs_group_m(8, blocks[b])), 0);
  /* negative control: a raster group across two shards (the group before session 37) */
  CHECK(claimed_split_misplaced(8, 1, 2, 2, 8) > 0);
}

int main(void) {
  group_m_divides_the_shard();
  claimed_walk_takes_every_peer_row_tile_before_an_own_one();
  const int ranks[] = {2, 3, 4, 8}, blocks[] = {1, 2, 3, 6, 12, 32}, tiles[] = {1, 3, 4}, ctas[] = {1, 5, 14, 66, 132};
  for (int a = 0; a < 4; a++)
    for (int r = 0; r < ranks[a]; r++)
      for (int b = 0; b < 6; b++)
        for (int t = 0; t < 3; t++)
          for (int c = 0; c < 5; c++)
            static_walk_case(ranks[a], r, blocks[b], tiles[t], ctas[c], mk_gemm_rs_group_m(8, blocks[b]));
  return MK_TEST_RESULT();
}
