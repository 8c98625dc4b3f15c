/*
 * The MoE workspace layout (fused/moe/moe.h, mk_moe_geom_layout): for any sizes, every region
 * is 256-byte aligned, big enough for what the kernels put there, and overlaps no other, and
 * the total is where the last one ends. A pure function: no GPU.
 */
#include <stdint.h>

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

int main(void) {
  const int ranks[] = {1, 2, 8}, tokens[] = {1, 17, 4096, 16384}, hidden[] = {8, 136, 7168}, topk[] = {1, 8, 16};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 3; c++)
        for (int d = 0; d < 3; d++)
          check_sizes(ranks[a], tokens[b], hidden[c], topk[d], ranks[a] * tokens[b] * topk[d]);
  check_sizes(2, 4096, 7168, 8, 1); /* a tight moe_max_recv_rows */
  return MK_TEST_RESULT();
}
