/*
 * The MoE workspace layout (fused/moe/moe.h, mk_moe_geom_layout): for any sizes, every region
 * is 256-byte aligned, big enough for what the kernels put there, and overlaps no other, and
 * the total is where the last one ends. A pure function: no GPU.
 */
#include <stdint.h>
#include <stdlib.h>

#include "mk_test.h"
#include "moe.h"

struct region { const char* name; size_t off, need; };

static void check_sizes(int nranks, int tokens, int hidden, int topk, int recv_rows) {
  struct mk_moe_geom g = {.nranks = nranks, .max_tokens = tokens, .max_hidden = hidden, .max_topk = topk,
                          .max_recv_rows = recv_rows};
  const size_t bytes = mk_moe_geom_layout(&g), nr = (size_t)nranks, t = (size_t)tokens, h = (size_t)hidden;
  const size_t meta = (size_t)(MK_MOE_META_HEAD + topk) * 4, chunks = (t + MK_MOE_CHUNK_ROWS - 1) / MK_MOE_CHUNK_ROWS;
  const struct region r[] = {
      {"counts_flag", g.counts_flag, MK_MOE_MAX_RANKS * 8},
      {"comb_flag", g.comb_flag, (size_t)MK_MOE_MAX_RANKS * 8},
      {"counts", g.counts, (size_t)MK_MOE_MAX_RANKS * MK_MOE_COUNT_STRIDE * 4},
      {"chunk_flag", g.chunk_flag, (size_t)MK_MOE_MAX_RANKS * chunks * 8},
      {"meta", g.meta, nr * t * meta},
      {"recv", g.recv, nr * t * h * 2},
      {"comb", g.comb, t * (size_t)topk * h * 2},
      {"ready", g.ready, MK_MOE_MAX_LOCAL_EXPERTS * 8},
      {"rows_done", g.rows_done, MK_MOE_MAX_LOCAL_EXPERTS * 4},
      {"route_done", g.route_done, 4},
      {"expand_next", g.expand_next, 4},
      {"claims", g.claims, MK_MOE_CLAIMS * 4},
      {"routed", g.routed, 8},
      {"offsets_ready", g.offsets_ready, 8},
      {"send_counts", g.send_counts, (size_t)MK_MOE_MAX_RANKS * MK_MOE_COUNT_STRIDE * 4},
      {"send_list", g.send_list, nr * t * 4},
      {"send_meta", g.send_meta, nr * t * meta},
      {"seg", g.seg, (size_t)MK_MOE_MAX_LOCAL_EXPERTS * MK_MOE_MAX_RANKS * 4},
      {"rows", g.rows, (size_t)recv_rows * h * 2},
  };
  const int n = (int)(sizeof(r) / sizeof(r[0]));
  size_t end = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].off % 256) fprintf(stderr, "%s at %zu is not 256-byte aligned\n", r[i].name, r[i].off);
    CHECK(r[i].off % 256 == 0);
    CHECK(r[i].off + r[i].need <= bytes);
    for (int j = 0; j < n; j++) {
      const int apart = j == i || r[i].off + r[i].need <= r[j].off || r[j].off + r[j].need <= r[i].off;
      if (!apart) fprintf(stderr, "%s and %s overlap (nranks %d tokens %d hidden %d)\n", r[i].name, r[j].name,
                          nranks, tokens, hidden);
      CHECK(apart);
    }
    if (r[i].off + r[i].need > end) end = r[i].off + r[i].need;
  }
  CHECK(bytes >= end && bytes - end < 256); /* no slack past the last region but its rounding */
}

/* The expand's and the push's item numbering (mk_moe_step_item) over sources with counts[s] items each:
 * items 0 .. total-1 name every (source, local) pair exactly once, in source order and in
 * order within a source; from total on, none. */
static void check_expand_items(const int* counts, int sources) {
  int total = 0;
  for (int s = 0; s < sources; s++) total += counts[s];
  int prev_step = 0, prev_local = -1;
  for (int i = 0; i < total; i++) {
    int local = -7;
    const int step = mk_moe_step_item(counts, sources, i, &local);
    CHECK(step >= 0 && step < sources && local >= 0 && local < counts[step]);
    /* the next pair after the previous one: the same source's next item, or a later source's first */
    CHECK((step == prev_step && local == prev_local + 1) || (step > prev_step && local == 0));
    for (int s = prev_step + 1; s < step; s++) CHECK(counts[s] == 0); /* skipped only empty sources */
    CHECK(step == prev_step || prev_local == counts[prev_step] - 1);  /* after the last of the one before */
    prev_step = step, prev_local = local;
  }
  int local = -7;
  CHECK(mk_moe_step_item(counts, sources, total, &local) == -1 && local == -7);
  CHECK(mk_moe_step_item(counts, sources, total + 1000, &local) == -1);
}

/* mk_moe_gemm_block_m: 64-row tiles up to 32 mean rows per local expert, 128 above. */
static void check_gemm_block_m(void) {
  CHECK(mk_moe_gemm_block_m(128, 8, 2, 256) == 64);   /* decode: 8 rows */
  CHECK(mk_moe_gemm_block_m(512, 8, 2, 256) == 64);   /* 32: the last at 64 */
  CHECK(mk_moe_gemm_block_m(513, 8, 2, 256) == 128);
  CHECK(mk_moe_gemm_block_m(4096, 8, 2, 256) == 128); /* DeepSeek-like: 256 */
  CHECK(mk_moe_gemm_block_m(4096, 2, 2, 8) == 128);   /* Mixtral-like: 2048 */
  CHECK(mk_moe_gemm_block_m(0, 8, 2, 256) == 64);     /* no tokens here: the peers' few rows */
  CHECK(mk_moe_gemm_block_m(16, 1, 1, 0) == 128);     /* nonsense experts: the default */
}

/* mk_moe_route_chunks: every token in exactly one chunk, no chunk empty but the one of a call
 * with no tokens, never more chunks than CTAs (each CTA that gets here may take one). */
static void check_route_chunks(int tokens, int ctas) {
  int per = -1;
  const int chunks = mk_moe_route_chunks(tokens, ctas, &per);
  CHECK(per >= 1 && chunks >= 1 && chunks <= ctas);
  if (tokens == 0) {
    CHECK(chunks == 1);
    return;
  }
  CHECK((long)(chunks - 1) * per < tokens && (long)chunks * per >= tokens); /* the last one not empty */
}

int main(void) {
  check_gemm_block_m();
  const int route_tokens[] = {0, 1, 2, 7, 131, 132, 133, 4096, 16384}, route_ctas[] = {1, 2, 8, 12, 33, 132};
  for (int a = 0; a < 9; a++)
    for (int b = 0; b < 6; b++) check_route_chunks(route_tokens[a], route_ctas[b]);
  const int decode[] = {256, 260}, skewed[] = {0, 5000, 1, 0, 0, 1583, 1584}, one[] = {7}, none[] = {0, 0};
  check_expand_items(decode, 2);
  check_expand_items(skewed, 7);
  check_expand_items(one, 1);
  check_expand_items(none, 2);
  const int ranks[] = {1, 2, 8}, tokens[] = {1, 17, 4096, 16384}, hidden[] = {8, 136, 7168}, topk[] = {1, 8, 16};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 3; c++)
        for (int d = 0; d < 3; d++)
          check_sizes(ranks[a], tokens[b], hidden[c], topk[d], ranks[a] * tokens[b] * topk[d]);
  check_sizes(2, 4096, 7168, 8, 1); /* a tight moe_max_recv_rows */
  return MK_TEST_RESULT();
}
