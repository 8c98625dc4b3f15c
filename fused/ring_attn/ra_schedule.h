/*
 * Ring attention's schedule (issues 11, 12): where each token lives, which KV block a rank
 * works on at each ring step, and which (query chunk, key chunk) pairs the causal mask lets
 * through. Pure functions, callable from host code and from kernels, unit-tested for every
 * rank count from 2 to 16 (test/unit/test_ra_schedule.c; the backward's dK/dV path in
 * test/unit/test_ra_backward_schedule.c).
 *
 * Layout. The global sequence of S tokens is cut into 2n equal chunks of S / (2n) tokens.
 * For causal attention rank r holds chunks r and 2n-1-r ("zigzag"), in that order, as its
 * S_local = S / n rows: local half 0 is chunk r, local half 1 is chunk 2n-1-r. A contiguous
 * split would give rank n-1 all the late queries (which see almost every key) and rank 0
 * almost nothing to do; pairing an early chunk with its mirror gives every rank the same
 * number of visible (query, key) pairs, and, since every ring step is as slow as its slowest
 * rank, the same work at every step (see mk_ra_step_tiles). Non-causal attention needs no
 * mask, so the caller's split does not matter to the kernel; tests use the contiguous one
 * (rank r holds rows r * S_local ..).
 *
 * Ring. At step s (0 .. n-1) rank r works on the KV block that originated on rank
 * (r - s) mod n: its own at step 0, then the one its predecessor worked on at step s-1.
 * So each block moves one hop per step, from a rank to its successor.
 *
 * Backward (issue 12). The KV blocks travel exactly as in the forward pass (mk_ra_kv_source),
 * and so do the causal mask classes of each step (mk_ra_step_mask): a chunk pair that is NONE
 * adds nothing to dq, dK or dV either. Each rank keeps its q, out, dout, lse and the dq of its
 * rows, which it accumulates locally over the n steps and never sends. The dK/dV of block p
 * (rank p's keys) sum a contribution from every rank, so they must travel; they follow the KV
 * block: the owner keeps its own step-0 contribution in its dk/dv output, rank p+1 starts a
 * travelling partial at step 1 (from zero, nothing received), every later holder receives it
 * from its predecessor together with the KV block and adds its part, and the holder at step
 * n-1 (rank p-1) sends it one last hop to its successor, the owner, which adds it to its own
 * sum: then block p's dK/dV are complete, at rank p. That is n-1 transfers of a partial per
 * block, the fewest possible (each of the n-1 other ranks holds a contribution that must leave
 * it at least once), all to the ring successor, the same link as the KV blocks; a partial is
 * in flight while its next holder computes (the holder adds the arrived partial to its own
 * part of the block's dK/dV, e.g. when it writes each key tile, before sending it on).
 * Alternatives cost more: a partial that started at the owner (instead of staying there) would
 * need n hops; a second ring running backward to the owner would carry a part made at step s
 * over s hops (n(n-1)/2 per block unless the parts merged on the way, which is this design run
 * in reverse, on a second set of flags); sending each part straight to the owner also costs
 * n-1 but leaves the ring's neighbour links. Partials are best kept in fp32: a bf16 partial
 * would be rounded n-1 times.
 */
#ifndef MK_RA_SCHEDULE_H_
#define MK_RA_SCHEDULE_H_

#include "../common/mk_hd.h"

/* ---- the zigzag split ---------------------------------------------------------------- */

/* Chunks of the global sequence: two per rank. */
MK_HD int mk_ra_num_chunks(int nranks) { return 2 * nranks; }

/* Tokens per chunk: half a rank's rows (S_local must be even; S = nranks * s_local). */
MK_HD long mk_ra_chunk_len(long s_local) { return s_local / 2; }

/* The global chunk held as local half `half` (0 or 1) of rank r. */
MK_HD int mk_ra_zigzag_chunk(int rank, int nranks, int half) {
  return half ? 2 * nranks - 1 - rank : rank;
}

/* The inverse: the rank that holds global chunk c, and (if half != NULL) in which half. */
MK_HD int mk_ra_zigzag_owner(int chunk, int nranks, int* half) {
  const int second = chunk >= nranks;
  if (half) *half = second;
  return second ? 2 * nranks - 1 - chunk : chunk;
}

/* Global token index of local row `row` (0 .. s_local-1) of rank r under the zigzag split. */
MK_HD long mk_ra_zigzag_global_row(int rank, int nranks, long s_local, long row) {
  const long c = mk_ra_chunk_len(s_local);
  const int half = row >= c;
  return (long)mk_ra_zigzag_chunk(rank, nranks, half) * c + (row - half * c);
}

/* The inverse: the rank whose local rows hold global token t, and the local row. */
MK_HD int mk_ra_zigzag_local_row(long t, int nranks, long s_local, long* row) {
  const long c = mk_ra_chunk_len(s_local);
  int half;
  const int rank = mk_ra_zigzag_owner((int)(t / c), nranks, &half);
  *row = half * c + t % c;
  return rank;
}

/* ---- the ring ------------------------------------------------------------------------ */

/* The rank whose KV block rank r works on at step s (0 .. nranks-1); step 0 is r itself. */
MK_HD int mk_ra_kv_source(int rank, int nranks, int step) {
  return (rank - step + nranks) % nranks;
}

/* The predecessor: the rank r receives its next KV block from. */
MK_HD int mk_ra_recv_from(int rank, int nranks) { return (rank - 1 + nranks) % nranks; }

/* The successor: the rank r forwards the block it holds to (in the backward pass the partial
 * dK/dV of a block travel the same way and reach the block's owner after the last step). */
MK_HD int mk_ra_send_to(int rank, int nranks) { return (rank + 1) % nranks; }

/* The rank that works on rank `block`'s KV block at step s: the inverse of mk_ra_kv_source. */
MK_HD int mk_ra_kv_holder(int block, int nranks, int step) { return (block + step) % nranks; }

/* Whether a rank forwards the KV block it worked on at step s to its successor: not after the
 * last step (the successor is the block's owner, which has it). */
MK_HD int mk_ra_kv_forwarded(int nranks, int step) { return step < nranks - 1; }

/* ---- the backward ring: the dK/dV partials (see the comment at the top) ---------------- */

/* No rank: the partial is started, or kept, rather than received or sent. */
#define MK_RA_NOBODY (-1)

/* Where the dK/dV partial that rank r adds its step-s part to comes from: MK_RA_NOBODY at
 * step 0 (r's own block: the sum starts in r's dk/dv output) and at step 1 (the travelling
 * partial starts at zero on its first holder), else r's predecessor, which held the same
 * block's partial at step s-1 and sent it after that step. */
MK_HD int mk_ra_dkv_recv_from(int rank, int nranks, int step) {
  return step < 2 ? MK_RA_NOBODY : mk_ra_recv_from(rank, nranks);
}

/* Where rank r sends the partial after step s: MK_RA_NOBODY after step 0 (the owner's own part
 * stays in its dk/dv), else its successor: the next holder, or after step n-1 the owner. */
MK_HD int mk_ra_dkv_send_to(int rank, int nranks, int step) {
  return step == 0 ? MK_RA_NOBODY : mk_ra_send_to(rank, nranks);
}

/* Whether the partial sent after step s ends at the block's owner (which adds it to its own
 * part, completing the block's dK/dV there): only after the last step. A rank's dk/dv output
 * is final once it has added the partial its predecessor sent after step n-1. */
MK_HD int mk_ra_dkv_arrives_home(int nranks, int step) { return step == nranks - 1; }

/* ---- the causal mask, chunk by chunk --------------------------------------------------- */

/* What the mask lets through between a query chunk and a key chunk (both global chunks of
 * equal length, so a key is earlier than a query exactly when its chunk is, or when both are
 * in the same chunk and its offset in the chunk is not larger). */
enum mk_ra_mask {
  MK_RA_NONE = 0,     /* no key visible: the pair is skipped */
  MK_RA_DIAGONAL = 1, /* same chunk: key offset <= query offset (lower triangle, diagonal in) */
  MK_RA_FULL = 2,     /* every key visible: no mask is applied */
};

MK_HD enum mk_ra_mask mk_ra_chunk_mask(int q_chunk, int k_chunk, int causal) {
  if (!causal || k_chunk < q_chunk) return MK_RA_FULL;
  return k_chunk == q_chunk ? MK_RA_DIAGONAL : MK_RA_NONE;
}

/* The mask between local half q_half of rank r's queries and local half k_half of the KV
 * block r works on at ring step s: what a kernel asks per chunk pair. */
MK_HD enum mk_ra_mask mk_ra_step_mask(int rank, int nranks, int step, int q_half, int k_half,
                                      int causal) {
  return mk_ra_chunk_mask(mk_ra_zigzag_chunk(rank, nranks, q_half),
                          mk_ra_zigzag_chunk(mk_ra_kv_source(rank, nranks, step), nranks, k_half),
                          causal);
}

/* Whether the key at offset k_off of its chunk is visible to the query at offset q_off of its
 * chunk, for a pair of class m. */
MK_HD int mk_ra_visible(enum mk_ra_mask m, long q_off, long k_off) {
  return m == MK_RA_FULL || (m == MK_RA_DIAGONAL && k_off <= q_off);
}

/* ---- work ------------------------------------------------------------------------------ */

/* Tiles of tile_q queries x tile_k keys that a chunk pair of class m needs, tiles counted
 * from the start of each chunk (the last may be short): all of them for FULL, none for NONE,
 * for DIAGONAL those that hold at least one visible pair (key tile start <= query tile end). */
MK_HD long mk_ra_pair_tiles(enum mk_ra_mask m, long chunk_len, int tile_q, int tile_k) {
  const long tq = (chunk_len + tile_q - 1) / tile_q, tk = (chunk_len + tile_k - 1) / tile_k;
  if (m == MK_RA_NONE) return 0;
  if (m == MK_RA_FULL) return tq * tk;
  long n = 0;
  for (long i = 0; i < tq; i++) {
    /* Key tiles that start at or before the tile's last query (past the chunk's end for a
     * short last tile, where the cap at tk gives the right count). */
    const long kt = ((i + 1) * tile_q - 1) / tile_k + 1;
    n += kt < tk ? kt : tk;
  }
  return n;
}

/* Tiles rank r computes at ring step s: the four (query half, key half) chunk pairs. With the
 * zigzag split this is the same on every rank at every step: step 0 has one FULL and two
 * DIAGONAL pairs; every later step exactly two FULL pairs, both query halves against the
 * block's first chunk when the block comes from a lower rank, the second query half against
 * both of its chunks when from a higher one (the other two pairs are NONE and skipped).
 * Non-causal: all four pairs FULL. */
MK_HD long mk_ra_step_tiles(int rank, int nranks, int step, long s_local, int tile_q, int tile_k,
                            int causal) {
  long n = 0;
  for (int qh = 0; qh < 2; qh++)
    for (int kh = 0; kh < 2; kh++)
      n += mk_ra_pair_tiles(mk_ra_step_mask(rank, nranks, step, qh, kh, causal),
                            mk_ra_chunk_len(s_local), tile_q, tile_k);
  return n;
}

/* The forward's order of its work items (query tiles x heads x batch). Causal, a tile's work
 * grows with its position, so head by head leaves the last heads' long tiles for the end;
 * tiles outermost (longest first over all heads) removes that tail but runs every head at
 * once, whose K/V then do not stay in L2. Measured on 2xH200 (bench/NOTES.md, session 26):
 * tiles outermost +2% at S = 16384 (31 items per SM), -1% at S = 65536 (124 per SM), so it is
 * taken below MK_RA_TILES_OUTER_PER_SM items per SM. */
#define MK_RA_TILES_OUTER_PER_SM 64
MK_HD int mk_ra_items_tiles_outer(int causal, long items, int sms) {
  return causal && items < (long)MK_RA_TILES_OUTER_PER_SM * sms;
}

#endif /* MK_RA_SCHEDULE_H_ */
