/*
 * The GEMM core (host interface, C): C[M,N] = A[M,K] . B[N,K]^T, row-major bf16 operands
 * (or fp8 e4m3 with per-tensor scales: dtype), fp32 accumulation, one persistent
 * warp-specialised kernel (sm_90a only).
 *
 * Fusion hooks, each free when its pointer is NULL:
 *  - ready_flags: before loading A rows of row-block mb, the producer waits (ld.acquire.sys,
 *    then a proxy fence) until ready_flags[mb] >= ready_target; bounded by timeout_ms, after
 *    which it fills *err and the kernel exits cleanly (no trap). row_block_order picks the
 *    order row-blocks are visited in (e.g. local shard first).
 *  - epilogue: STORE writes bf16 into c (local or peer pointer); ADD_BF16 adds into a bf16 c
 *    with red.add.noftz.bf16x2 (each addition rounds to bf16: for k summands the error grows
 *    like k * 2^-9 relative; order is not deterministic); ADD_F32 adds into an fp32 c with
 *    red.add.f32 (fp32 rounding per addition).
 *  - tile_flags: after a tile's stores are visible at system scope, tile_flags[tile] += 1
 *    (red.release.sys), tile = tile_base(group) + mb * tiles_n + nb; or tile_flags[mb] += 1
 *    with tile_flags_by_row_block (a row-block is complete at tiles_n = ceil(n / block_n)).
 *  - num_sms: the number of CTAs (one per SM) of the persistent grid; 0 = all SMs.
 *  - grouped (MoE): group_offsets (device, num_groups + 1 row prefix sums, [0] = 0,
 *    [num_groups] <= m) gives each group's contiguous rows of A and C; B holds the groups'
 *    weights stacked as [num_groups, N, K]. Groups may be empty; rows past the last group
 *    are not touched (m is then a capacity: offsets written on the device need no host sync).
 *    With ready_flags, grouped mode waits per group: ready_flags[group] >= target before
 *    any row of the group is loaded.
 *  - rs (reduce-scatter epilogue, struct mk_gemm_rs): rows belong to owners in shards of
 *    rs->shard_rows. A tile of owner d != rank is stored into d's slot for this rank
 *    (out[d]) and d's counter for its row-block gets += 1 once the stores are visible; a tile
 *    of this rank's rows waits until every peer's counter for its row-block is complete
 *    (= ceil(n / block_n)), then c (this rank's shard, [shard_rows, n]) = the tile + the
 *    peers' partials (fp32 sum, one bf16 rounding); with gather set (all-reduce) the sum is
 *    also stored into every peer's gather slot, counted the same way. Plain mode, STORE
 *    epilogue, no tile_flags; the order should visit the peers' rows first (row_block_rotate =
 *    the next rank's first row-block). With `call` (struct mk_gemm_call) the kernel is the
 *    whole call: no kernel before or after it.
 *  - scatter (struct mk_gemm_scatter): every output row to its own destination row.
 *  - push (struct mk_gemm_push, AllGather+GEMM): extra CTAs ahead of the GEMM's in the grid
 *    copy this rank's shard of A into every peer's gathered A and raise the peer's ready flag
 *    per row-block, so one kernel is the whole call (needs `call`).
 */
#ifndef MK_GEMM_H_
#define MK_GEMM_H_

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "mk_hd.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mk_trace_buf;
struct mk_xnode_dev;

enum mk_gemm_epilogue {
  MK_GEMM_STORE = 0,    /* c: bf16 [m, n] */
  MK_GEMM_ADD_BF16 = 1, /* c: bf16 [m, n], c += A.B^T */
  MK_GEMM_ADD_F32 = 2,  /* c: float [m, n], c += A.B^T */
};

/* Operand type of A and B (args.dtype). C and every epilogue stay as for bf16. */
enum mk_gemm_dtype {
  MK_GEMM_BF16 = 0, /* a, b: bf16; K a multiple of 8 */
  /* a, b: fp8 e4m3; K a multiple of 16 (16-byte rows for TMA). C = scale_a * scale_b * A.B^T,
   * the fp32 accumulator scaled once per tile; the accumulation is the tensor cores' own
   * (no periodic promotion: cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM). */
  MK_GEMM_E4M3 = 1,
};

/* mk_gemm_error.tile of the fused waits that are not a tile's: a call bracket's wait for a
 * peer's previous call (flag_index = the peer), and the all-reduce collect's wait for a peer's
 * reduced row-block (flag_index = peer x row-blocks per shard + row-block). */
#define MK_GEMM_ERR_TILE_PEER_FREE 0xFFFFFFFFu
#define MK_GEMM_ERR_TILE_COLLECT 0xFFFFFFFEu
/* The cross-node senders' own waits (gemm_rs.cuh, gemm_push_xnode.cuh): for the proxy (to
 * finish sending this rank's previous call, flag_index = this rank; or a slot of its queue,
 * flag_index = the peer), for the call's other CTAs to leave (flag_index = this rank), and for
 * this rank's rows bound for peer flag_index to be stored. */
#define MK_GEMM_ERR_TILE_PROXY_SENT 0xFFFFFFFDu
#define MK_GEMM_ERR_TILE_OWN_CTAS 0xFFFFFFFCu
#define MK_GEMM_ERR_TILE_OWN_ROWS 0xFFFFFFFBu

/* 1 for those three: waits on this rank's own work, no peer for a hang report to name. */
MK_HD int mk_gemm_err_tile_is_own_wait(uint32_t tile) {
  return tile == MK_GEMM_ERR_TILE_PROXY_SENT || tile == MK_GEMM_ERR_TILE_OWN_CTAS ||
         tile == MK_GEMM_ERR_TILE_OWN_ROWS;
}

/* Written by the kernel when a wait times out; device or host-mapped memory. */
struct mk_gemm_error {
  uint32_t aborted;    /* 1 once any CTA gave up */
  uint32_t tag;        /* args.err_tag (the caller's rank/op encoding) */
  uint32_t tile;       /* linear tile that was waiting */
  uint32_t flag_index; /* index into ready_flags */
  uint64_t expected;
  uint64_t seen;
  /* Optional, a zeroed word in device memory: the first wait to expire takes it and alone
   * fills the fields above, so that two waits expiring together (an absent peer starts many
   * at once) cannot leave one's tile beside the other's flag. Never given back: the record
   * describes the first failure for good. NULL: every expiring wait writes (tests that give
   * a kernel a record of its own). Atomics on host-mapped memory are not atomic on every
   * system, hence device memory. */
  uint32_t* claim;
};

#define MK_GEMM_RS_MAX_RANKS 8

/* The reduce-scatter epilogue's peers (see above). Arrays are indexed by rank; the entries
 * of this rank are unused. Counters: one u64 per row-block of a shard. */
struct mk_gemm_rs {
  int shard_rows; /* rows per owner, a multiple of block_m; m = nranks * shard_rows */
  int rank, nranks;
  void* out[MK_GEMM_RS_MAX_RANKS];                 /* on d: this rank's partial of d's rows */
  uint64_t* out_counts[MK_GEMM_RS_MAX_RANKS];      /* on d: its counters for this rank */
  const void* in[MK_GEMM_RS_MAX_RANKS];            /* here: src's partial of this rank's rows */
  const uint64_t* in_counts[MK_GEMM_RS_MAX_RANKS]; /* here: the counters src raises */
  void* gather[MK_GEMM_RS_MAX_RANKS];              /* on d: this rank's reduced rows; NULL: off */
  uint64_t* gather_counts[MK_GEMM_RS_MAX_RANKS];   /* on d: its gather counters for this rank */
  /* With the gather, this rank's side: src's reduced rows and their counters, copied into
   * c_full ([m, n]; c is its own shard) once this CTA's tiles are stored (needs args.call). */
  const void* gathered[MK_GEMM_RS_MAX_RANKS];
  const uint64_t* gathered_counts[MK_GEMM_RS_MAX_RANKS];
  void* c_full;
  /* MK_GEMM_RS_CLAIM_WORDS words (in call.counters: 0 between calls): [0] the GEMM CTAs that
   * have started, [1] the collect's items taken, [2] the claimed walk's tiles (call.claims
   * points here). A CTA collects only once every GEMM CTA has started, so that no CTA waits
   * in the collect for rows whose tiles belong to a CTA that cannot start until an SM is freed
   * (another stream's kernels, MPS: the call timed out). Needed with the gather. */
  uint64_t* collect_claims;
  /* Cross-node (issue 13; fused/proxy/xnode.h; xn NULL: off; needs args.call). For d in
   * remote_mask: out[d] is the bounce buffer's out slot for d and out_counts[d] this rank's own
   * counters of it (in call.counters: 0 between calls), raised by the storers as for a peer;
   * in[src] is the bounce's in slot and in_counts[src] src's row-block flags in the flag region
   * (they carry the tile count, as a counter); with the gather likewise gather[d] (the one
   * gather slot) and gather_counts[d] (own counters), gathered[src] and gathered_counts[src]
   * (flags); call.peer_done[d] is d's done flag there (value: the last cross-node call).
   * args.push, ctas 1 and nothing else set, is the sender CTA: it publishes each complete
   * row-block, then zeroes the remote flags and signals done once the others left. */
  struct mk_xnode_dev* xn;
  uint32_t remote_mask;
};

/* The call bracket of a one-kernel fused call (args.call, optional), so that no kernel needs
 * to run before or after this one. Call e = *done + 1 (done changes only at the very end).
 * CTA 0 sets *call = e (when call is set); no tile is stored before every peer_done >= e - 1
 * (a peer's previous call no longer reads what this call writes into it); the last CTA to
 * finish (*exits counts them, back to 0 after) zeroes counters[0 .. num_counters), sets
 * *notify[d] = e for every non-NULL entry, and with set_done *done = e (all release, system
 * scope, after every CTA's stores). */
struct mk_gemm_call {
  int rank, nranks;
  uint64_t* done;
  uint64_t* call;
  const uint64_t* peer_done[MK_GEMM_RS_MAX_RANKS];
  uint32_t* exits;
  uint64_t* counters;
  int num_counters;
  uint64_t* notify[MK_GEMM_RS_MAX_RANKS];
  int set_done;
  /* The claimed walk (optional; one-CTA clusters; one of counters, so 0 between calls; in
   * grouped mode a CTA's walk ends when the scheduler has no slot): no CTA owns a tile before
   * it runs but the one it takes a few K blocks before its current tile's end. The producer's
   * thread of each CTA takes the slots one at a time from *claims (its low 32 bits), in the
   * scheduler's order, and its consumers and storers learn each through shared memory. The
   * static walk (CTA c: slots c, c + G, ..) leaves the share of CTAs that start late (other
   * kernels hold SMs) to the end, about doubling the call; with rs it deadlocks when too few
   * CTAs are resident on every rank. With rs the order must put this rank's rows last
   * (row_block_rotate = the next rank's first row-block): a
   * peer-row tile never waits, and an own-row tile is taken only after every peer-row tile
   * has been taken by a running CTA, so no tile any rank waits for sits with a CTA that cannot
   * start (bench/models/residency.py, bench/NOTES.md session 38). */
  uint64_t* claims;
};

/* Row-scatter epilogue (args.scatter, optional; plain or grouped, STORE): output row r goes to
 * base[rank] + (i * row_mult + j) * n bf16 elements, with (rank, i, j) = row_dest[3r .. 3r+2]
 * (rank < 0: the row is dropped), instead of c. MoE combine: every row back to (source rank,
 * token, slot). */
struct mk_gemm_scatter {
  void* base[MK_GEMM_RS_MAX_RANKS];
  const int* row_dest;
  int row_mult;
};

/* All-gather push (args.push, optional; plain mode, with args.call and ready_flags). CTAs
 * 0 .. ctas-1 of the grid (the GEMM's come after them, so they are resident first and the
 * GEMM's waits always make progress) copy this rank's shard, src ([shard_rows, k] bf16, rows
 * rank x shard_rows .. of M), into dst[d] (peer d's gathered A, [m, k]) for d in
 * mk_sched_ag_dest order (schedule.h: rank - 1, rank - 2, ...; each rank then receives the
 * shards in ascending rank order, so row_block_rotate = rank x shard blocks is its arrival
 * order). Every CTA copies a slice of every row-block; the last one done with it raises
 * dst_flags[d][row-block of M] = e (release, system scope, after every CTA's stores). Before
 * the first row into d, d's previous call is done (call.peer_done[d] >= e - 1). counts: one u32
 * per (destination step, row-block) item, 0 between calls (the last CTA of an item resets it).
 * Its waits report with MK_GEMM_ERR_TAG_PUSH in the error's tag and the item as its tile (the
 * MoE dispatch and combine kernels' waits too, with their moe.h MK_MOE_WAIT_* as the tile). */
#define MK_GEMM_ERR_TAG_PUSH 0x80u
struct mk_gemm_push {
  int ctas;
  const void* src;
  int shard_rows; /* a multiple of block_m; m = call.nranks x shard_rows */
  void* dst[MK_GEMM_RS_MAX_RANKS];
  uint64_t* dst_flags[MK_GEMM_RS_MAX_RANKS];
  uint32_t* counts;
  int drop_flag_block; /* testing (NCCL_MK_DEBUG_DROP_FLAG): row-block + 1 never raised; 0 off */
  /* Cross-node (issue 13; fused/proxy/xnode.h; xn NULL: off). The ranks of remote_mask are
   * reached through the proxy (their dst and dst_flags are unused): the last push CTA stages
   * src into the bounce buffer and publishes a put+signal per row-block and remote rank; the
   * other push CTAs copy the remote ranks' row-blocks, once their flags say they landed in the
   * bounce buffer, into self_dst (this rank's gathered A) and raise self_flags (its ready
   * flags). Needs ctas >= 2. */
  struct mk_xnode_dev* xn;
  uint32_t remote_mask;
  void* self_dst;
  uint64_t* self_flags;
};

struct mk_gemm_args {
  int m, n, k;
  const void* a; /* bf16 [m, k] (e4m3 with dtype; so are a_local and b) */
  /* Rows [a_local_row0, a_local_row0 + a_local_rows) of A are read from a_local (bf16
   * [a_local_rows, k]) instead of a, and never wait for a ready flag: in AllGather+GEMM, this
   * rank's own shard, which then needs no copy. Both ends on a row-block boundary (or m).
   * Optional (NULL). */
  const void* a_local;
  int a_local_row0, a_local_rows;
  const void* b; /* bf16 [n, k]; [num_groups, n, k] when grouped */
  void* c;       /* see enum mk_gemm_epilogue */
  int epilogue;  /* enum mk_gemm_epilogue */
  int num_sms;        /* 0: every SM */
  int raster_group_m; /* row-blocks per raster group; 0: default (8) */
  const int* row_block_order;  /* device, ceil(m / block_m) entries, a permutation; optional */
  int row_block_rotate;        /* without row_block_order: start at this row-block and wrap */
  const uint64_t* ready_flags; /* device or peer, one per row-block; optional */
  uint64_t ready_target;
  /* When set, the target is read from this device word when the kernel starts (and
   * ready_target is ignored): a CUDA graph replays frozen arguments, so a call counter
   * that advances on the device keeps replays waiting for the right round. Without it and
   * with `call`, the target is the call's number e = *call->done + 1. */
  const uint64_t* ready_target_ptr;
  uint64_t* tile_flags;        /* device or peer, mk_gemm_max_tiles() entries; optional */
  int tile_flags_by_row_block; /* 1: tile_flags[mb] += 1 per tile of row-block mb instead */
  uint64_t* tile_start_ns;     /* debug: %globaltimer when the producer starts each tile */
  struct mk_trace_buf* trace;  /* NCCL_MK_TRACE: events into rings 0..grid-1 (trace.h); optional */
  struct mk_gemm_error* err;   /* optional */
  uint32_t err_tag;
  uint32_t timeout_ms;         /* 0: 30000 */
  int num_groups;              /* grouped mode when group_offsets != NULL */
  const int* group_offsets;
  const struct mk_gemm_rs* rs; /* reduce-scatter epilogue; optional (copied at launch) */
  const struct mk_gemm_call* call;       /* one-kernel call bracket; optional (copied) */
  const struct mk_gemm_scatter* scatter; /* row-scatter epilogue; optional (copied) */
  const struct mk_gemm_push* push;       /* all-gather push; optional (copied) */
  int dtype; /* enum mk_gemm_dtype; 0 (bf16) when zero-initialised */
  /* Rows per tile: 0 or 128 (two consumer warp groups, 3 stages), or 64 (one, 4 stages: half
   * the wasted rows in a group's partial last tile and more weight bytes in flight, at half the
   * operand reuse; MoE groups of a few hundred rows or fewer: mk_moe_gemm_block_m). 64: bf16,
   * no a_local, push or rs. */
  int block_m;
  /* 1: launched as a programmatic dependent of the kernel before it on the stream, which must
   * issue griddepcontrol.launch_dependents in every CTA: the GEMM's CTAs take SMs only once
   * every CTA of that kernel runs. The GEMM never waits for that kernel's end (griddepcontrol
   * .wait), only for what it raises (ready_flags). MoE's dispatch beside its GEMM. */
  int pdl;
  /* e4m3 only: per-tensor scales of A and B, device pointers read when the kernel runs (so a
   * captured CUDA graph picks up new values, as cuBLASLt's scale pointers); NULL means 1. */
  const float* scale_a;
  const float* scale_b;
};

/* With rs (either walk): the raster group (row-blocks) for `blocks` row-blocks per shard: the
 * largest power of two up to group_m that divides blocks, so that no raster group spans two
 * shards and this rank's rows are exactly the slots from (nranks - 1) x blocks x column tiles
 * on. Then every CTA meets its own-row tiles, whose storers wait for the peers' partials, only
 * after its peer-row tiles, which the peers wait for. A group spanning shards (8 ranks, 2
 * row-blocks per shard) put a peer-row tile after an own-row tile in one CTA: its storers,
 * waiting in the own tile, kept the staging buffer the peer tile needed, and every rank's
 * CTAs waited on the next rank's in a cycle. */
MK_HD int mk_gemm_rs_group_m(int group_m, int blocks) {
  int g = 1;
  while (g * 2 <= group_m && blocks % (g * 2) == 0) g *= 2;
  return g;
}

#define MK_GEMM_RS_CLAIM_WORDS 3

/* Launches on `stream`. Returns 0, -EINVAL (bad argument, nothing launched, a WARN names
 * it), -ENOTSUP (not an sm_90 device) or -EIO (launch failure). */
int mk_gemm_launch(const struct mk_gemm_args* args, cudaStream_t stream);

/* Loads the kernels (bf16 with either block_m, and e4m3) now. Call once before launching the
 * GEMM next to a kernel that waits on it (ready or tile flags): under lazy loading a first
 * launch waits for running kernels. Returns 0, -ENOTSUP or -EIO. */
int mk_gemm_prepare(void);

/* Tile shape of the default configuration (block_m 0), and an upper bound on tile indices for
 * tile_flags and tile_start_ns (exact in plain mode) for these arguments. */
void mk_gemm_tile_shape(int* block_m, int* block_n);
long mk_gemm_max_tiles(const struct mk_gemm_args* args);

#ifdef __cplusplus
}
#endif

#endif /* MK_GEMM_H_ */
