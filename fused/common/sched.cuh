/*
 * Tile scheduler for the persistent GEMM. Work is handed out in "slots": a slot is one tile,
 * or, with clusters of cluster_m CTAs along M, cluster_m vertically adjacent tiles that share
 * their B tile (multicast). Cluster c visits slots c, c + clusters, c + 2 * clusters...; CTA
 * `rank` of the cluster takes row-block slot_row * cluster_m + rank. Every role of a CTA
 * walks the same sequence independently, so no tile index crosses shared memory.
 *
 * Order: slots are rastered in groups of `group_m` row-blocks (column-block outer, row-block
 * inner inside a group), so the CTAs of one wave share a few A row-blocks and B column-blocks
 * in L2. An optional `row_block_order` table maps the position in that order to the row-block
 * actually visited (e.g. the local shard first in AllGather+GEMM); without one, `rotate` starts
 * the walk at row-block `rotate` and wraps (e.g. the next rank's shard first in
 * GEMM+ReduceScatter), which needs no table in memory.
 *
 * Grouped (MoE) mode: `group_offsets[0..num_groups]` are row prefix sums in device memory; the
 * scheduler walks them, group-major, with a cursor that only moves forward (slot ids increase).
 * ASSUMPTION: group_offsets is non-decreasing, starts at 0 and ends at m.
 */
#ifndef MK_SCHED_CUH_
#define MK_SCHED_CUH_

struct mk_sched {
  int block_m, block_n;
  int tiles_n;
  int group_m;                /* in slots */
  int cluster_m, rank;
  int num_groups;             /* 1 in plain mode */
  const int* group_offsets;   /* NULL in plain mode */
  const int* row_block_order; /* NULL: natural order, rotated */
  int rotate;                 /* plain mode without a table: position p visits (p + rotate) % tiles */
  /* cursor over groups */
  int g;
  int g_slot_base; /* slots in the groups before g */
  int g_tile_base; /* tiles in the groups before g */
  int g_row0, g_row_end;
  int g_tiles_m, g_slots_m;
};

struct mk_tile {
  int valid;      /* 0: a cluster partner past the last row-block (loads, never stores) */
  int group;
  int mb, nb;     /* row-block within the group, column-block */
  int row0;       /* first row of the tile in A and C */
  int row_end;    /* one past the last row this tile may write (group end or m) */
  int col0;       /* first output column */
  int b_row0;     /* first row of the B tile (group * n + col0) */
  int linear;     /* flag/debug index: g_tile_base + mb * tiles_n + nb */
};

__device__ __forceinline__ void sched_load_group(struct mk_sched* s, int m, int n) {
  if (s->group_offsets) {
    s->g_row0 = s->group_offsets[s->g];
    s->g_row_end = s->group_offsets[s->g + 1];
  } else {
    s->g_row0 = 0;
    s->g_row_end = m;
  }
  int rows = s->g_row_end - s->g_row0;
  s->g_tiles_m = rows > 0 ? (rows + s->block_m - 1) / s->block_m : 0;
  s->g_slots_m = (s->g_tiles_m + s->cluster_m - 1) / s->cluster_m;
}

__device__ __forceinline__ void sched_init(struct mk_sched* s, int m, int n, int block_m, int block_n, int group_m,
                                           int cluster_m, int rank, int num_groups, const int* group_offsets,
                                           const int* row_block_order, int rotate) {
  s->block_m = block_m;
  s->block_n = block_n;
  s->tiles_n = (n + block_n - 1) / block_n;
  s->cluster_m = cluster_m;
  s->rank = rank;
  s->group_m = max(1, group_m / cluster_m);
  s->num_groups = group_offsets ? num_groups : 1;
  s->group_offsets = group_offsets;
  s->row_block_order = row_block_order;
  s->rotate = rotate;
  s->g = 0;
  s->g_slot_base = 0;
  s->g_tile_base = 0;
  sched_load_group(s, m, n);
}

/* Fills *t for slot `id`; returns 0 once id is past the last slot.
 * ASSUMPTION: successive calls pass increasing ids (the group cursor never moves back). */
__device__ __forceinline__ int sched_tile(struct mk_sched* s, int m, int n, int id, struct mk_tile* t) {
  while (id >= s->g_slot_base + s->g_slots_m * s->tiles_n) {
    s->g_slot_base += s->g_slots_m * s->tiles_n;
    s->g_tile_base += s->g_tiles_m * s->tiles_n;
    if (++s->g >= s->num_groups) return 0;
    sched_load_group(s, m, n);
  }
  const int local = id - s->g_slot_base;
  const int span = s->group_m * s->tiles_n;
  const int first = (local / span) * s->group_m;
  const int slots_in_group = min(s->g_slots_m - first, s->group_m);
  const int within = local % span;
  const int mpos = (first + within % slots_in_group) * s->cluster_m + s->rank;
  t->valid = mpos < s->g_tiles_m;
  t->nb = within / slots_in_group;
  t->mb = !t->valid ? mpos : s->row_block_order ? s->row_block_order[mpos]
                             : s->rotate ? (mpos + s->rotate) % s->g_tiles_m : mpos;
  t->group = s->g;
  t->row0 = s->g_row0 + t->mb * s->block_m;
  t->row_end = s->g_row_end;
  t->col0 = t->nb * s->block_n;
  t->b_row0 = s->g * n + t->col0;
  t->linear = s->g_tile_base + t->mb * s->tiles_n + t->nb;
  return 1;
}

#endif /* MK_SCHED_CUH_ */
