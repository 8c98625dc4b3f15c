/*
 * The attention core (issues 11, 12), host interface (C): FlashAttention-3-style forward
 * attention for sm_90a, one CTA per (128-row query tile, head, batch), TMA + wgmma, online
 * softmax in registers. The device pieces (attn_fwd.cuh) are what the ring attention kernel
 * calls; mk_attn_fwd_launch is the single-GPU entry point (tests, benchmarks, the sequential
 * baseline).
 *
 * Layouts (row-major): q, out bf16 [batch, seq_q, heads, d_head]; each KV block's k, v bf16
 * [batch, seq, kv_heads, d_head]; lse fp32 [batch, heads, seq_q] = the natural log of the sum
 * over visible keys of exp(q.k / sqrt(d_head)). Head h reads kv head h / (heads / kv_heads).
 *
 * Positions (causal). Rows [q_row0, q_row0 + q_rows) of q are computed; row q_row0 + i has
 * global position q_pos0 + i. KV block b contributes its rows [row0, row0 + rows), row0 + j at
 * global position pos0 + j; a key is visible to a query when its position is not larger.
 * Several blocks are merged in registers (the ring's steps, or a zigzag rank's two chunks);
 * a row that sees no key at all gets out = 0 and lse = -inf.
 */
#ifndef MK_ATTN_H_
#define MK_ATTN_H_

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "mk_hd.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mk_gemm_error;

#define MK_ATTN_MAX_KV_BLOCKS 4
#define MK_ATTN_BLOCK_M 128 /* query rows per CTA */
#define MK_ATTN_BLOCK_N 128 /* keys per KV tile (the forward core's default: 176, attn.cu) */

struct mk_attn_kv_block {
  const void* k; /* bf16 [batch, seq, kv_heads, d_head] */
  const void* v;
  int seq;        /* rows of the k, v tensors */
  int row0, rows; /* the rows this block contributes; rows 0: all of [row0, seq) */
  long long pos0; /* global position of row row0 */
};

struct mk_attn_args {
  const void* q; /* bf16 [batch, seq_q, heads, d_head] */
  void* out;     /* bf16, like q; only rows [q_row0, q_row0 + q_rows) are written */
  float* lse;    /* fp32 [batch, heads, seq_q]; optional (NULL) */
  int batch, seq_q, heads, kv_heads, d_head;
  int causal;
  int q_row0, q_rows; /* q_rows 0: all of [q_row0, seq_q) */
  long long q_pos0;   /* global position of row q_row0 */
  int num_kv_blocks;  /* 1 .. MK_ATTN_MAX_KV_BLOCKS */
  struct mk_attn_kv_block kv[MK_ATTN_MAX_KV_BLOCKS];
  struct mk_gemm_error* err; /* optional: a wait that timed out is recorded here */
  uint32_t timeout_ms;       /* 0: 10000 */
};

/* Checks the arguments without a GPU: 0, or -EINVAL with a WARN naming the argument. */
int mk_attn_fwd_check(const struct mk_attn_args* args);

/* Launches on `stream`. Returns 0, -EINVAL (bad argument, nothing launched), -ENOTSUP (no
 * sm_90 device) or -EIO (launch failure). */
int mk_attn_fwd_launch(const struct mk_attn_args* args, cudaStream_t stream);

/* The same with a compiled variant, for A/B runs (attn_perf) and tests: 0 is the default
 * (mk_attn_fwd_launch: the consumer warp groups ping-pong, attn_fwd.cuh PINGPONG; 176-key KV
 * tiles whose K and V are released separately, 2 stages at D = 128, 3 at D = 64), 1 without
 * the ping-pong, 2 with the ping-pong and other stage counts, 3 and 4 persistent (one CTA per
 * SM; items head-major, tile-major), 5 128-key tiles in 3 stages (the default until session
 * 30), 6 128-key tiles in 2 stages released as 0's (attn.cu). */
#define MK_ATTN_VARIANTS 7
int mk_attn_fwd_launch_variant(const struct mk_attn_args* args, cudaStream_t stream, int variant);

/* A bf16 [batch, seq, heads, d] tensor at ptr as a TMA map (a CUtensorMap, 64 bytes aligned)
 * the way the core loads it: (d, head, row, batch), box 64 x 1 x box_rows x 1, 128-byte
 * swizzle, zeros past the tensor. 0, -ENOTSUP (no encoder in the driver) or -EINVAL. */
int mk_attn_tmap_encode(void* map, const void* ptr, int batch, int seq, int heads, int d, int box_rows);

/* The rows [row0, row0 + rows) of each batch of a bf16 [batch, seq, heads, d] tensor as such a
 * map: the box sees only those rows (zeros past them, not the tensor's next rows). */
int mk_attn_tmap_encode_rows(void* map, const void* ptr, int batch, int seq, int row0, int rows, int heads, int d,
                             int box_rows);

/* The same for an fp32 tensor (box 32 x 1 x box_rows x 1): the backward's dq_acc, which the
 * kernel adds into by TMA reductions (nothing is written past the rows). */
int mk_attn_tmap_encode_rows_f32(void* map, const float* ptr, int batch, int seq, int row0, int rows, int heads, int d,
                                 int box_rows);

/* ---- the backward core (attn_bwd.cuh; issue 12) --------------------------------------------
 * FlashAttention-2/3 style: P recomputed from q, k and lse. delta = rowsum(dout * out) first
 * (one small kernel), then one CTA per (128-key tile of a KV block, kv head, batch) loops over
 * the query heads of its group and the 64-row query tiles that see the tile: S^T = K Q^T,
 * P^T = exp(S^T scale - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
 * dK += dS^T Q, dQ += dS K (TMA reductions into fp32 dq_acc); dK and dV stay in registers and are
 * written once. Then (optional) dq = bf16(dq_acc).
 *
 * Positions as the forward's: query row q_row0 + i at q_pos0 + i, key row row0 + j of a block
 * at pos0 + j (with the ring's parts, either may come in two pieces: q_split, a block's split);
 * lse is the forward's (over every block the forward merged), so several calls
 * (ring steps, zigzag chunks) add up to the gradients of the whole attention: dq_acc
 * accumulates across calls (dq_accumulate), dk_acc / dv_acc too. Rows outside the ranges are
 * neither read (the tensor maps stop at them) nor written. */
struct mk_attn_bwd_kv_block {
  const void* k; /* bf16 [batch, seq, kv_heads, d_head] */
  const void* v;
  void* dk;       /* bf16 like k, optional: rows [row0, row0 + rows) = this call's gradient */
  void* dv;
  float* dk_acc;  /* fp32 like k, optional: rows [row0, row0 + rows) += this call's gradient */
  float* dv_acc;  /* (each of dk, dv needs at least one of its two outputs) */
  int acc_overwrite; /* 1: dk_acc, dv_acc rows = this call's gradient (stored, never read) */
  int seq;        /* rows of the k, v tensors */
  int row0, rows; /* rows 0: all of [row0, seq) */
  long long pos0; /* global position of row row0 */
  /* optional (0: none), with the ring's parts only (their kernels are the ones compiled with
   * it): rows from row0 + split on are at pos1 + (row - row0 - split), a zigzag rank's two
   * chunks in one block; a multiple of MK_ATTN_BWD_BLOCK_N inside the rows */
  int split;
  long long pos1;
  /* optional: the block's rows arrive while the call runs (the ring's slots, written by a peer).
   * Chunk c of batch b (rows [c ready_chunk_rows, +ready_chunk_rows) of seq) is there once
   * ready_flags[b ceil(seq / ready_chunk_rows) + c] >= the call number, *ready_done + 1 (a
   * device word that does not move during the call): each CTA's producer waits (bounded, the
   * call's timeout) for the chunks of its key tile before loading it. */
  const uint64_t* ready_flags;
  int ready_chunk_rows;
  /* optional, one launch only (phase_words): once every CTA of this block has written its
   * dK/dV partials (made visible at system scope), *announce = the call number (*ready_done +
   * 1; release, system scope): the ring's owner of the block adds them (its addends). Not when
   * a wait of the call gave up (acc_gate closed, or err's abort raised). */
  uint64_t* announce;
};

/* A rank's K/V block pushed into its slot on each peer (the ring attention's gather), chunk by
 * chunk, by `ctas` CTAs (kv_push.cuh; the forward's push CTAs, the backward's gather kernel and
 * the first CTAs of a one-launch backward call). With e = *done + 1 (the call number), every
 * CTA first waits (bounded) for each peer to have ended call e - 1 (its done >= e - 1: it no
 * longer reads the slot), then copies chunk i (chunk_rows rows of one batch; CTA j takes i = j,
 * j + ctas, ..) of k and v into every peer's slot and raises that peer's flag i to e (release,
 * system scope). A wait that gives up is recorded in err (tag | MK_GEMM_ERR_TAG_PUSH, the peer
 * as its flag index) and closes *gave_up (MK_ATTN_ACC_GATE_CLOSED | e) when given. */
#define MK_ATTN_PUSH_MAX_RANKS 8 /* the arrays are indexed by rank */
struct mk_kv_push {
  int ctas; /* 0: no push */
  int rank, nranks;
  int batch, s_local, chunk_rows, chunks_per_batch;
  int row_vecs; /* 16-byte vectors per row: kv_heads x d_head / 8 */
  const void* k; /* bf16 [batch, s_local, kv_heads, d_head] */
  const void* v;
  void* dst_k[MK_ATTN_PUSH_MAX_RANKS]; /* on peer d: this rank's slot, k then v */
  void* dst_v[MK_ATTN_PUSH_MAX_RANKS];
  uint64_t* dst_flags[MK_ATTN_PUSH_MAX_RANKS];
  const uint64_t* peer_done[MK_ATTN_PUSH_MAX_RANKS];
  const uint64_t* done; /* this rank's: the last call it ended */
  uint64_t* call;       /* optional: = e (the call in progress), by CTA 0 */
  uint64_t* gave_up;    /* optional */
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint64_t timeout_ns;
};

#define MK_ATTN_MAX_ADDENDS 7 /* a ring of 8 ranks: every peer's partial of the own block */

/* Partials added to block `block`'s outputs (that block has bf16 dk and dv, no accumulators).
 * Addend i: dk[i], dv[i], fp32 laid out like k (the block's rows), there once *ready[i] >= the
 * call number (*ready_done + 1): the CTAs wait for it (bounded; a timeout is recorded in err
 * with flag index flag_index0 + i, and those rows are not written) before writing. */
struct mk_attn_bwd_addends {
  int n; /* 0 .. MK_ATTN_MAX_ADDENDS */
  int block;
  const float* dk[MK_ATTN_MAX_ADDENDS];
  const float* dv[MK_ATTN_MAX_ADDENDS];
  const uint64_t* ready[MK_ATTN_MAX_ADDENDS];
  uint32_t flag_index0;
};

struct mk_attn_bwd_args {
  const void* q;    /* bf16 [batch, seq_q, heads, d_head] */
  const void* out;  /* bf16 like q: the forward's output (read unless delta_ready) */
  const void* dout; /* bf16 like q */
  const float* lse; /* fp32 [batch, heads, seq_q]: the forward's (natural log); -inf: no key */
  float* delta;     /* fp32 [batch, heads, seq_q], workspace: rowsum(dout * out) of the rows */
  float* dq_acc;    /* fp32 like q, workspace: this call adds its dq to the rows */
  void* dq;         /* bf16 like q, optional: rows = dq_acc's rows after this call */
  int batch, seq_q, heads, kv_heads, d_head;
  int causal;
  int q_row0, q_rows; /* q_rows 0: all of [q_row0, seq_q) */
  long long q_pos0;   /* global position of row q_row0 */
  /* optional (0: none), as a block's split (a multiple of MK_ATTN_BWD_BLOCK_M): query rows from
   * q_row0 + q_split on at q_pos1 + (row - q_row0 - q_split) */
  int q_split;
  long long q_pos1;
  int num_kv_blocks;  /* 1 .. MK_ATTN_MAX_KV_BLOCKS */
  struct mk_attn_bwd_kv_block kv[MK_ATTN_MAX_KV_BLOCKS];
  int dq_accumulate; /* 0: dq_acc's rows are zeroed first; 1: added to (an earlier call's) */
  int delta_ready;   /* 1: delta's rows hold rowsum(dout * out) already (an earlier call) */
  /* optional, device memory: with MK_ATTN_ACC_GATE_CLOSED set in it, nothing goes into dk_acc /
   * dv_acc (the ring's gather gave up on a peer that may still read them for its previous
   * call). A bit that call numbers never have: the word is a flag word other ops write. */
  const uint64_t* acc_gate;
  struct mk_gemm_error* err; /* optional: a wait that timed out is recorded here */
  uint32_t err_tag;          /* the record's op/rank tag (mk_op_err_tag: the caller's op); 0 bare */
  uint32_t timeout_ms;       /* 0: 10000 */
  const uint64_t* ready_done; /* with any block's ready_flags: the call number is *ready_done + 1 */
  /* optional, fp32 workspace of mk_attn_bwd_dkv_ws_floats(args) floats: with grouped-query
   * heads (kv_heads < heads <= 65535) at D = 128 the core gives each CTA one query head
   * instead of a kv head's group (its CTAs share their heads' query tiles in L2), adds the
   * group's dK, dV partials here, then writes the blocks' outputs from it. A block whose
   * outputs are only dk_acc, dv_acc (added to, acc_overwrite 0) needs none of it: the partials
   * are added there directly. */
  float* dkv_ws;
  /* optional: fp32 partials of one block's dK (times scale) and dV that other calls made (the
   * ring's peers), added to what this call writes into that block's bf16 dk and dv. */
  struct mk_attn_bwd_addends addends;
  /* 1: the main kernel may start before the kernel before it on the stream has ended
   * (programmatic dependent launch; that kernel must issue griddepcontrol.launch_dependents),
   * so its CTAs are on the SMs first: the ring's gather, whose pushes feed other GPUs' waiting
   * CTAs. Nothing may then run before the main kernel: needs delta_ready and dq_accumulate
   * (mk_attn_bwd_prep_launch does that part earlier) and no dkv_ws. */
  int pdl;
  /* optional, device memory: MK_ATTN_BWD_PHASE_WORDS words, zero before the first call and
   * left zero by each (a call that gave up on a wait too). Given, the call is one launch: the
   * main kernel's grid is three parts in index order (delta and dq_acc's zeroing, the key
   * tiles, dq's conversion and split's write-out), each waiting for the one before
   * (attn_bwd_phase.cuh), instead of three to five kernels. Calls on one stream may share
   * them; calls that can overlap may not. */
  uint64_t* phase_words;
  /* optional, one launch only: the ring's whole call in the launch. push.ctas CTAs first push
   * this rank's K/V to its peers (struct mk_kv_push; the blocks' ready_flags are the peers'
   * pushes); with addends and other blocks, the addends' block must be the last and every
   * block the same rows (the CTAs take the blocks in turn, so the CTAs that wait for the
   * peers' announcements start after every CTA whose announcement a peer waits for);
   * call_done, the call's done word, is raised to *call_done + 1 (release, system scope) by the
   * call's last CTA, once the push's CTAs are done too. */
  struct mk_kv_push push;
  uint64_t* call_done;
  /* optional, with the ring's parts only: NCCL_MK_TRACE's device buffer (fused/common/trace.h),
   * its rings per SM (attn_bwd_trace.cuh); NULL: no events */
  struct mk_trace_buf* trace;
};
/* [0] start CTAs done, [1] main, [2] end, [3] push, [4 + b] block b's main CTAs (announce) */
#define MK_ATTN_BWD_PHASE_WORDS (4 + MK_ATTN_MAX_KV_BLOCKS)

#define MK_ATTN_ACC_GATE_CLOSED (1ull << 63)

/* MK_TRACE_PHASE ids of the ring's one-launch events (attn_bwd_trace.cuh; scripts/mktrace
 * names them): the part waits are the phase words waited for (attn_bwd_phase.cuh), the parts'
 * spans from 8 on. */
enum mk_attn_bwd_trace_phase {
  MK_ATTN_BWD_TRACE_WAIT_START = 0, /* a key tile's CTA waits for the start part */
  MK_ATTN_BWD_TRACE_WAIT_MAIN = 1,  /* an end CTA waits for every key tile's CTA */
  MK_ATTN_BWD_TRACE_WAIT_PUSH = 3,  /* the call's last CTA waits for the push CTAs */
  MK_ATTN_BWD_TRACE_PUSH = 8,       /* a push CTA: its slice of this rank's K/V to its peers */
  MK_ATTN_BWD_TRACE_START = 9,      /* a start CTA's slice (delta, dq_acc and the workspace zeroed) */
  MK_ATTN_BWD_TRACE_END = 10,       /* an end CTA's slice (dq converted; split's write-out) */
};

/* Whether the accumulators behind `gate` (NULL: none) may be written: one volatile read of the
 * device word (device code only; the gate moves while kernels run). */
MK_HD int mk_attn_acc_gate_open(const uint64_t* gate) {
  return !gate || !(*(volatile const uint64_t*)gate & MK_ATTN_ACC_GATE_CLOSED);
}
#define MK_ATTN_BWD_BLOCK_M 64  /* query rows per step */
#define MK_ATTN_BWD_BLOCK_N 128 /* keys per CTA */

/* Checks the arguments without a GPU: 0, or -EINVAL with a WARN naming the argument. */
int mk_attn_bwd_check(const struct mk_attn_bwd_args* args);

/* Launches (up to three kernels) on `stream`. Returns 0, -EINVAL (bad argument, nothing
 * launched), -ENOTSUP (no sm_90 device) or -EIO (launch failure). */
int mk_attn_bwd_launch(const struct mk_attn_bwd_args* args, cudaStream_t stream);

/* Only the first kernel of such a launch: delta of the query rows (unless delta_ready) and
 * dq_acc's rows zeroed (unless dq_accumulate), so that a later call with both set can follow
 * another kernel closely (pdl); it also loads the default main kernel (a lazy load at the pdl
 * call would wait for the kernel it is to start beside). Same returns. */
int mk_attn_bwd_prep_launch(const struct mk_attn_bwd_args* args, cudaStream_t stream);

/* Loads the default variant's backward kernels at D = 64 and 128 (sm90.h mk_kernel_load). 0 or
 * -EIO. */
int mk_attn_bwd_load(void);

/* The same with a compiled variant, for A/B runs (attn_perf -b) and tests: 0 is the default
 * (mk_attn_bwd_launch: each warp group's dQ tile is staged in shared memory and added into
 * dq_acc by TMA reductions issued in the next step, by the producer warp at D = 128 and by the
 * consumers at D = 64, attn_bwd_cfg.cuh DQ_TMA and DQ_LATE), 1 has every thread add its dQ fragment
 * with fp32 red.add, 2 issues each step's dQ product in the next step so that the consumer warp
 * groups need not meet every step (DEFER_DQ), 3 issues the reductions in their own step
 * (sessions 25-30's default), 4 is 0 with the other issuer (the consumers at D = 128, the
 * producer at D = 64), 5 computes a step pair's dQ as one m64n128 product per warp group at
 * D = 128 (attn_bwd_cfg.cuh PAIR_DQ; D = 64 as 0). */
#define MK_ATTN_BWD_VARIANTS 6
int mk_attn_bwd_launch_variant(const struct mk_attn_bwd_args* args, cudaStream_t stream, int variant);

/* The floats of dkv_ws that a call with these arguments uses (0: none). */
size_t mk_attn_bwd_dkv_ws_floats(const struct mk_attn_bwd_args* args);

/* The main kernel's epilogue kinds (attn_bwd.cuh attn_bwd_write_dkdv), each compiled into
 * kernels of its own (a path beside the step loop costs the loop 2-4% though never taken:
 * bench/NOTES.md, session 60). PLAIN: bf16 outputs, accumulators overwritten, or (split heads)
 * partials added by red.add; ACC: also accumulators added to their old values; ADDENDS: the
 * peers' partials added into the outputs (mk_attn_bwd_addends). */
enum { MK_ATTN_BWD_EPI_PLAIN, MK_ATTN_BWD_EPI_ACC, MK_ATTN_BWD_EPI_ADDENDS, MK_ATTN_BWD_EPIS };

/* The epilogue a valid call needs: ADDENDS with addends, ACC when a block's accumulators are
 * added to (not overwritten) and its heads are not split, else PLAIN. */
int mk_attn_bwd_epilogue(const struct mk_attn_bwd_args* args);

/* The first query tile (bm rows, counted from the range's first query at q_pos0) holding a
 * query that sees a key at key_first (causal: the tiles before it see nothing of a key tile
 * that starts there); 0 non-causal. */
MK_HD int mk_attn_bwd_first_q_tile(long long q_pos0, long long key_first, int bm, int causal) {
  if (!causal || key_first <= q_pos0) return 0;
  const long long t = (key_first - q_pos0) / bm;
  return t > 0x3fffffff ? 0x3fffffff : (int)t;
}

/* The same with the queries in two pieces (the ring's kernels: a zigzag rank's two chunks):
 * tiles [0, q_tiles0) from q_pos0, the rest from q_pos1, which lies after the first piece. Its
 * positions rise with the tile, so the tiles that see a key tile are this one to the last. */
MK_HD int mk_attn_bwd_first_q_tile2(long long q_pos0, int q_tiles0, long long q_pos1, long long key_first, int bm,
                                    int causal) {
  const int i0 = mk_attn_bwd_first_q_tile(q_pos0, key_first, bm, causal);
  return i0 < q_tiles0 ? i0 : q_tiles0 + mk_attn_bwd_first_q_tile(q_pos1, key_first, bm, causal);
}

/* Whether a (bm-query tile from q_first, key tile of bn keys from key_first with keys_left
 * valid keys) pair needs masking: the key tile runs past its block, or (causal) its last key
 * is after the tile's first query. */
MK_HD int mk_attn_bwd_tile_masked(long long q_first, long long key_first, int keys_left, int bn, int causal) {
  if (keys_left < bn) return 1;
  return causal && key_first + bn - 1 > q_first;
}

/* ---- where the backward stages a dQ element for its TMA reduction (pure) ------------------- */

/* Byte offset, in a warp group's staging (two boxes of 64 rows x 32 fp32, 8 KB each, 128-byte
 * swizzle: 16-byte chunk k of row r at chunk k ^ (r % 8)), of the pair of dQ columns a thread
 * holds: row r of the tile, fragment column pair j (columns 8j + 2 (lane % 4) + {0, 1}, as the
 * wgmma accumulator lays them out). */
MK_HD unsigned mk_attn_dq_stage_offset(int r, int j, int lane) {
  const int chunk = 2 * (j % 4) + ((lane & 3) >> 1);
  return (unsigned)((j / 4) * 64 * 128 + r * 128 + ((chunk ^ (r & 7)) << 4) + (lane & 1) * 8);
}

/* ---- the step pairs of backward variant 5 (attn_bwd_cfg.cuh PAIR_DQ; pure) ----------------- */

/* The steps a CTA's loops run for `steps` steps: whole pairs (an odd count's last is a dummy). */
MK_HD int mk_attn_pair_steps(int steps) { return (steps + 1) & ~1; }
/* The dS^T buffer of step `it`: the pair's step g uses buffer g, which warp group g reads for
 * the pair's dQ. */
MK_HD int mk_attn_pair_buf(int it) { return it & 1; }
/* The mbarrier phase parity that step it (>= 2) waits for on ds_free[buf]: group buf's dQ read of
 * the buffer in the previous pair. */
MK_HD unsigned mk_attn_pair_free_parity(int it) { return (unsigned)((it >> 1) - 1) & 1u; }
/* The parity pair pr's dQ waits for on ds_ready[g]: both groups' dS^T of step 2 pr + g stored. */
MK_HD unsigned mk_attn_pair_ready_parity(int pr) { return (unsigned)pr & 1u; }

/* ---- which work items a CTA of the persistent forward takes (pure) ------------------------ */

/* Work item k (0, 1, ..) of CTA `cta` of `ctas`, in a snake over the item order (round r takes
 * items r * ctas .. + ctas - 1, even rounds CTA 0 first, odd rounds CTA 0 last, so with items in
 * longest-first order no CTA takes the longest of every round); -1 past the last item. */
MK_HD int mk_attn_cta_item(int k, int cta, int ctas, int n_items) {
  const long long i = (long long)k * ctas + ((k & 1) ? ctas - 1 - cta : cta);
  return i < n_items ? (int)i : -1;
}

struct mk_attn_work {
  int tile, head, batch;
};

/* Item i of tiles x heads x batch in chunks of `chunk` tiles: chunk by chunk, in each (batch,
 * head) by (batch, head), in each the chunk's tiles in order (the last chunk may be shorter).
 * chunk 1: tiles outermost, then (batch, head); chunk >= tiles (MK_ATTN_CHUNK_HEADS): (batch,
 * head) outer, tiles inner, as a grid of (tiles, heads, batch) numbers its CTAs. Between, the
 * items that run together share a few heads' rows in L2 and still start with the chunk's
 * first tiles. */
#define MK_ATTN_CHUNK_HEADS (1 << 30)
MK_HD struct mk_attn_work mk_attn_chunk_work(int i, int tiles, int heads, int batch, int chunk) {
  const int hb = heads * batch, full = tiles / chunk * chunk; /* tiles in whole chunks */
  int t, bh;
  if (i < full * hb) {
    t = i / (chunk * hb) * chunk + i % chunk;
    bh = i / chunk % hb;
  } else { /* the last, shorter chunk */
    const int r = tiles - full, k = i - full * hb;
    t = full + k % r;
    bh = k / r;
  }
  struct mk_attn_work w;
  w.tile = t;
  w.head = bh % heads;
  w.batch = bh / heads;
  return w;
}

/* The forward's item i: query tile, head and batch in mk_attn_chunk_work's order; causal query
 * tiles last to first (a causal tile's work grows with its index), so chunk 1 is longest first
 * over all items. */
MK_HD struct mk_attn_work mk_attn_item_work(int i, int tiles, int heads, int batch, int chunk, int causal) {
  struct mk_attn_work w = mk_attn_chunk_work(i, tiles, heads, batch, chunk);
  if (causal) w.tile = tiles - 1 - w.tile;
  return w;
}

/* The backward's CTA c of its (key tiles over all blocks, heads, batch) grid in
 * mk_attn_chunk_work's order. Under the causal mask a key tile's work falls with its index (it
 * sees the queries at or after it), so chunk 1 starts every head's longest CTAs first; chunk
 * >= tiles starts the last head's longest CTAs when most of the work is done, but the CTAs that
 * run together share their heads' query tiles in L2 (attn_bwd.cu MK_ATTN_BWD_CHUNK_TILES). */
MK_HD struct mk_attn_work mk_attn_bwd_cta_work(int c, int tiles, int heads, int batch, int chunk) {
  return mk_attn_chunk_work(c, tiles, heads, batch, chunk);
}

/* ---- which KV tiles a query tile needs (pure; shared by the producer and the consumers) ---- */

/* Tiles of bn keys, counted from a block's first key (pos0, `rows` keys), that queries up to
 * position q_last see: all of them non-causal; causal, the leading tiles whose first key is at
 * or before q_last (so fully masked tiles are never loaded). */
MK_HD int mk_attn_kv_tiles(long long q_last, long long pos0, int rows, int bn, int causal) {
  const int n = (rows + bn - 1) / bn;
  if (!causal) return n;
  if (q_last < pos0) return 0;
  const long long need = (q_last - pos0) / bn + 1;
  return need < n ? (int)need : n;
}

/* Whether tile t of such a block needs masking for queries from position q_first on: it runs
 * past the block's rows, or (causal) its last key is after q_first. */
MK_HD int mk_attn_tile_masked(long long q_first, long long pos0, int rows, int bn, int t, int causal) {
  const long long end = (long long)(t + 1) * bn;
  if (end > rows) return 1;
  return causal && pos0 + end - 1 > q_first;
}

#ifdef __cplusplus
}
#endif

#endif /* MK_ATTN_H_ */
