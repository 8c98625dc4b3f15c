/*
 * Host launcher for the backward attention core (attn.h, attn_bwd.cuh): validation, the tensor
 * maps, and the launches (delta and dq_acc's zeroing, the main kernel, dq's conversion).
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "attn_bwd.cuh"
#include "sm90.h"
extern "C" {
#include "mk_err.h"
#include "mk_log.h"
}

/* D = 128: K, V 64 KB + two dS^T buffers 32 KB + 2 stages of Q and dO (32 KB each) = 160 KB,
 * + 32 KB of dQ staging; D = 64: 3 stages, 88 KB + 32 KB. */
/* Variant 0 (the default): dQ through shared memory and TMA reductions (+32 KB: D = 128 192 KB
 * of the 227; 1.19-1.24x per-thread red.add, session 25), each step's reductions issued in the
 * next step (DQ_LATE): by the producer warp at D = 128 (3), by the consumers after the step's
 * first products at D = 64 (1). Session 31: the consumers' late reductions +5-8% at D = 128
 * (issued before the first products, 2), +9-12% at D = 64 (1); the producer's another +0-6%
 * at D = 128 but -9-11% at D = 64.
 * Variant 1: every thread adds its dQ fragment with red.add (the first version).
 * Variant 2: each step's dQ product issued in the next step (DEFER_DQ, +16 KB).
 * Variant 3: the reductions issued in their own step (sessions 25-30's default).
 * Variant 4: the other late mode (D = 128: the consumers', 2; D = 64: the producer's, 3).
 * Variant 5 (D = 128; D = 64 takes the default): a step pair's dQ as one m64n128 product per
 * warp group (PAIR_DQ; written in session 35 without a GPU: not run yet). */
typedef mk_attn_bwd_cfg<128, 2, 1, 0, 3> mk_attn_bwd_cfg_d128;
typedef mk_attn_bwd_cfg<64, 3, 1, 0, 1> mk_attn_bwd_cfg_d64;
typedef mk_attn_bwd_cfg<128, 2, 0> mk_attn_bwd_cfg_d128_red;
typedef mk_attn_bwd_cfg<64, 3, 0> mk_attn_bwd_cfg_d64_red;
typedef mk_attn_bwd_cfg<128, 2, 1, 1> mk_attn_bwd_cfg_d128_defer;
typedef mk_attn_bwd_cfg<64, 3, 1, 1> mk_attn_bwd_cfg_d64_defer;
typedef mk_attn_bwd_cfg<128, 2, 1> mk_attn_bwd_cfg_d128_now;
typedef mk_attn_bwd_cfg<64, 3, 1> mk_attn_bwd_cfg_d64_now;
typedef mk_attn_bwd_cfg<128, 2, 1, 0, 2> mk_attn_bwd_cfg_d128_late_alt;
typedef mk_attn_bwd_cfg<64, 3, 1, 0, 3> mk_attn_bwd_cfg_d64_late_alt;
typedef mk_attn_bwd_cfg<128, 2, 1, 0, 0, 1> mk_attn_bwd_cfg_d128_pair;

#define MK_ATTN_BWD_DEFAULT_TIMEOUT_MS 10000u

/* The CTA order's chunk (attn.h mk_attn_bwd_cta_work): 128 key tiles (16K keys) head by head,
 * then the next 128. Causal, against key tiles outermost (longest first, the order of sessions
 * 26-32), one H200, session 33: 16K / 64K, GQA 8:1 with a CTA per query head 524 / 538 TFLOP/s
 * (436 / 327), per kv head's group 500 / 514 (485 / 506), H = H_kv 530 / 536 (430 / 331), D = 64
 * 370 (367): the CTAs that run together share their heads' query tiles in L2, where longest
 * first spread them over every head (its makespan gain, ~1% on paper, is smaller than that). */
#define MK_ATTN_BWD_CHUNK_TILES 128

#define BWD_REJECT(...)   \
  do {                    \
    MK_WARN(__VA_ARGS__); \
    return -EINVAL;       \
  } while (0)

static int bwd_misaligned(const void* p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) != 0; }

/* A block's rows (rows 0: all of [row0, seq)); the call's query rows likewise. */
static int bwd_block_rows(const struct mk_attn_bwd_kv_block* kv) { return kv->rows ? kv->rows : kv->seq - kv->row0; }
static int bwd_q_rows(const struct mk_attn_bwd_args* a) { return a->q_rows ? a->q_rows : a->seq_q - a->q_row0; }

/* Whether the call has the ring's parts (push, announcements, the call's end). */
static int bwd_ring_parts(const struct mk_attn_bwd_args* a) {
  int any = a->push.ctas != 0 || a->call_done != NULL;
  for (int i = 0; i < a->num_kv_blocks && i < MK_ATTN_MAX_KV_BLOCKS; i++) any |= a->kv[i].announce != NULL;
  return any;
}

/* The addends (their block writes bf16 dk and dv and nothing else; each addend complete and
 * 8-byte aligned; a call number to wait for) and pdl (nothing to launch before the main kernel). */
static int bwd_check_addends_pdl(const struct mk_attn_bwd_args* a) {
  const struct mk_attn_bwd_addends* ad = &a->addends;
  if (ad->n < 0 || ad->n > MK_ATTN_MAX_ADDENDS)
    BWD_REJECT("mk_attn_bwd: addends.n = %d, must be in [0, %d]", ad->n, MK_ATTN_MAX_ADDENDS);
  if (ad->n) {
    if (ad->block < 0 || ad->block >= a->num_kv_blocks)
      BWD_REJECT("mk_attn_bwd: addends.block = %d, not one of the %d kv blocks", ad->block, a->num_kv_blocks);
    const struct mk_attn_bwd_kv_block* kv = &a->kv[ad->block];
    if (!kv->dk || !kv->dv || kv->dk_acc || kv->dv_acc)
      BWD_REJECT("mk_attn_bwd: addends: kv block %d must write bf16 dk and dv and no accumulators", ad->block);
    if (!a->ready_done) BWD_REJECT("mk_attn_bwd: addends need ready_done (the call number they wait for)");
    /* the CTAs add them as they write; split, only the ring's call has a write-out that adds them
     * (each tile's last warp group), the write-out kernel and end part do not */
    if (a->dkv_ws && !bwd_ring_parts(a))
      BWD_REJECT("mk_attn_bwd: addends with dkv_ws need the ring's parts (leave dkv_ws NULL)");
    for (int i = 0; i < ad->n; i++)
      if (!ad->dk[i] || !ad->dv[i] || !ad->ready[i] || bwd_misaligned(ad->dk[i], 8) || bwd_misaligned(ad->dv[i], 8) ||
          bwd_misaligned(ad->ready[i], 8))
        BWD_REJECT("mk_attn_bwd: addend %d: dk %p, dv %p, ready %p must be non-NULL and 8-byte aligned", i,
                   (const void*)ad->dk[i], (const void*)ad->dv[i], (const void*)ad->ready[i]);
  }
  if (a->pdl && (!a->delta_ready || !a->dq_accumulate || a->dkv_ws))
    BWD_REJECT("mk_attn_bwd: pdl needs delta_ready = 1 and dq_accumulate = 1 (mk_attn_bwd_prep_launch first) and "
               "no dkv_ws (%d, %d, %p)", a->delta_ready, a->dq_accumulate, (void*)a->dkv_ws);
  return 0;
}

/* A block's key tiles. */
static int bwd_block_tiles(const struct mk_attn_bwd_kv_block* kv) {
  return (bwd_block_rows(kv) + MK_ATTN_BWD_BLOCK_N - 1) / MK_ATTN_BWD_BLOCK_N;
}

/* The push: a rank of 2..8, its words and every peer's slot, flags and done word. */
static int bwd_check_push(const struct mk_kv_push* p) {
  if (p->ctas < 0) BWD_REJECT("mk_attn_bwd: push.ctas = %d, must be >= 0", p->ctas);
  if (!p->ctas) return 0;
  if (p->nranks < 2 || p->nranks > MK_ATTN_PUSH_MAX_RANKS || p->rank < 0 || p->rank >= p->nranks)
    BWD_REJECT("mk_attn_bwd: push: rank %d of %d, must be one of 2 to %d ranks", p->rank, p->nranks,
               MK_ATTN_PUSH_MAX_RANKS);
  if (!p->done || !p->k || !p->v || bwd_misaligned(p->k, 16) || bwd_misaligned(p->v, 16))
    BWD_REJECT("mk_attn_bwd: push: done %p, k %p, v %p must be non-NULL (k, v 16-byte aligned)", (const void*)p->done,
               p->k, p->v);
  if (p->batch < 1 || p->s_local < 1 || p->chunk_rows < 1 || p->row_vecs < 1 ||
      p->chunks_per_batch != (p->s_local + p->chunk_rows - 1) / p->chunk_rows)
    BWD_REJECT("mk_attn_bwd: push: batch %d, s_local %d, chunk_rows %d (%d per batch), row_vecs %d", p->batch,
               p->s_local, p->chunk_rows, p->chunks_per_batch, p->row_vecs);
  for (int d = 0; d < p->nranks; d++)
    if (d != p->rank && (!p->dst_k[d] || !p->dst_v[d] || !p->dst_flags[d] || !p->peer_done[d]))
      BWD_REJECT("mk_attn_bwd: push: peer %d's slot, flags or done word is NULL", d);
  return 0;
}

/* Positions in two pieces (q_split, a block's split): inside the rows, whole tiles, and only
 * in the ring's kernels (the others keep their loops as they were). */
static int bwd_check_two_pieces(const struct mk_attn_bwd_args* a) {
  int any = a->q_split != 0;
  for (int i = 0; i < a->num_kv_blocks; i++) any |= a->kv[i].split != 0;
  if (!any) return 0;
  if (!bwd_ring_parts(a)) BWD_REJECT("mk_attn_bwd: q_split and a block's split come with the ring's parts only");
  /* the second piece after the first: the query tiles that see a key tile stay a suffix */
  if (a->q_split < 0 || a->q_split % MK_ATTN_BWD_BLOCK_M || a->q_split >= bwd_q_rows(a) ||
      (a->q_split && a->q_pos1 < a->q_pos0 + a->q_split))
    BWD_REJECT("mk_attn_bwd: q_split = %d must be a multiple of %d inside the %d query rows, q_pos1 = %lld at or "
               "after the first piece's end (%lld)", a->q_split, MK_ATTN_BWD_BLOCK_M, bwd_q_rows(a), a->q_pos1,
               a->q_pos0 + a->q_split);
  for (int i = 0; i < a->num_kv_blocks; i++) {
    const struct mk_attn_bwd_kv_block* kv = &a->kv[i];
    if (kv->split < 0 || kv->split % MK_ATTN_BWD_BLOCK_N || kv->split >= bwd_block_rows(kv) ||
        (kv->split && kv->pos1 < kv->pos0 + kv->split))
      BWD_REJECT("mk_attn_bwd: kv block %d: split = %d must be a multiple of %d inside its %d rows, pos1 = %lld at "
                 "or after the first piece's end (%lld)", i, kv->split, MK_ATTN_BWD_BLOCK_N, bwd_block_rows(kv),
                 kv->pos1, kv->pos0 + kv->split);
  }
  return 0;
}

/* The ring's parts: one launch; announcements need the call number; addends beside other
 * blocks need their block last and blocks of one size (the CTAs then take the blocks in turn). */
static int bwd_check_ring(const struct mk_attn_bwd_args* a) {
  MK_CHECK(bwd_check_push(&a->push));
  if (a->addends.n && a->num_kv_blocks > 1) { /* any launch: the CTAs take the blocks in turn */
    if (a->addends.block != a->num_kv_blocks - 1)
      BWD_REJECT("mk_attn_bwd: addends.block = %d: beside other blocks it must be the last (%d)", a->addends.block,
                 a->num_kv_blocks - 1);
    for (int i = 1; i < a->num_kv_blocks; i++)
      if (bwd_block_tiles(&a->kv[i]) != bwd_block_tiles(&a->kv[0]))
        BWD_REJECT("mk_attn_bwd: addends beside other blocks: kv block %d has %d key tiles, block 0 %d (one size)", i,
                   bwd_block_tiles(&a->kv[i]), bwd_block_tiles(&a->kv[0]));
  }
  MK_CHECK(bwd_check_two_pieces(a));
  if (a->trace && !bwd_ring_parts(a)) /* only the RING kernel has the events (attn_bwd_trace.cuh) */
    BWD_REJECT("mk_attn_bwd: trace needs the ring's parts (push, announce): its events are the one launch's");
  if (!bwd_ring_parts(a)) return 0;
  if (!a->phase_words || !a->call_done)
    BWD_REJECT("mk_attn_bwd: push and announce need phase_words (the call as one launch) and call_done (its end): "
               "%p, %p", (void*)a->phase_words, (void*)a->call_done);
  if (bwd_misaligned(a->call_done, 8)) BWD_REJECT("mk_attn_bwd: call_done = %p, must be 8-byte aligned", (void*)a->call_done);
  /* a wait that gives up aborts it, which keeps a half-written block from being announced */
  if (!a->err) BWD_REJECT("mk_attn_bwd: push and announce need err (the record a wait that gives up aborts)");
  if (a->pdl) /* it would start beside the call before it, whose done word it reads */
    BWD_REJECT("mk_attn_bwd: push, announce and call_done do not take pdl");
  /* split: each tile's last warp group writes it out, in the addends' epilogue (the other
   * epilogues' kernels keep that code out of their loops) */
  if (a->dkv_ws && !a->addends.n)
    BWD_REJECT("mk_attn_bwd: dkv_ws (split heads) with the ring's parts needs addends (the own block's)");
  for (int i = 0; i < a->num_kv_blocks; i++)
    if (a->kv[i].announce && (!a->ready_done || bwd_misaligned(a->kv[i].announce, 8)))
      BWD_REJECT("mk_attn_bwd: kv block %d: announce %p needs ready_done (%p) and 8-byte alignment", i,
                 (void*)a->kv[i].announce, (const void*)a->ready_done);
  return 0;
}

extern "C" int mk_attn_bwd_check(const struct mk_attn_bwd_args* a) {
  if (!a) BWD_REJECT("mk_attn_bwd: args is NULL");
  if (a->d_head != 64 && a->d_head != 128) BWD_REJECT("mk_attn_bwd: d_head = %d, must be 64 or 128", a->d_head);
  if (a->batch < 1 || a->batch > 65535) BWD_REJECT("mk_attn_bwd: batch = %d, must be in [1, 65535]", a->batch);
  if (a->heads < 1) BWD_REJECT("mk_attn_bwd: heads = %d, must be >= 1", a->heads);
  if (a->kv_heads < 1 || a->kv_heads > 65535 || a->heads % a->kv_heads)
    BWD_REJECT("mk_attn_bwd: heads = %d must be a positive multiple of kv_heads = %d (at most 65535)", a->heads,
               a->kv_heads);
  if (a->seq_q < 1) BWD_REJECT("mk_attn_bwd: seq_q = %d, must be >= 1", a->seq_q);
  const struct {
    const void* p;
    const char* name;
    uintptr_t align;
    int required;
  } ptrs[] = {{a->q, "q", 16, 1},          {a->dout, "dout", 16, 1},  {a->lse, "lse", 4, 1},
              {a->delta, "delta", 4, 1},   {a->dq_acc, "dq_acc", 16, 1}, {a->dq, "dq", 16, 0},
              {a->out, "out", 16, !a->delta_ready}};
  for (unsigned i = 0; i < sizeof ptrs / sizeof *ptrs; i++) {
    if (ptrs[i].required && !ptrs[i].p)
      BWD_REJECT("mk_attn_bwd: %s is NULL%s", ptrs[i].name, !strcmp(ptrs[i].name, "out") ? " (delta_ready = 0)" : "");
    if (bwd_misaligned(ptrs[i].p, ptrs[i].align))
      BWD_REJECT("mk_attn_bwd: %s = %p, must be %u-byte aligned", ptrs[i].name, ptrs[i].p, (unsigned)ptrs[i].align);
  }
  const int q_rows = bwd_q_rows(a);
  if (a->q_row0 < 0 || a->q_rows < 0 || q_rows < 1 || (long)a->q_row0 + q_rows > a->seq_q)
    BWD_REJECT("mk_attn_bwd: q rows [%d, +%d) must be a non-empty part of seq_q = %d", a->q_row0, a->q_rows,
               a->seq_q);
  if (a->q_pos0 < 0) BWD_REJECT("mk_attn_bwd: q_pos0 = %lld, must be >= 0", a->q_pos0);
  if (a->num_kv_blocks < 1 || a->num_kv_blocks > MK_ATTN_MAX_KV_BLOCKS)
    BWD_REJECT("mk_attn_bwd: num_kv_blocks = %d, must be in [1, %d]", a->num_kv_blocks, MK_ATTN_MAX_KV_BLOCKS);
  long long tiles = 0;
  for (int i = 0; i < a->num_kv_blocks; i++) {
    const struct mk_attn_bwd_kv_block* kv = &a->kv[i];
    if (!kv->k || bwd_misaligned(kv->k, 16) || !kv->v || bwd_misaligned(kv->v, 16))
      BWD_REJECT("mk_attn_bwd: kv block %d: k = %p, v = %p, must be non-NULL and 16-byte aligned", i, kv->k, kv->v);
    if (!kv->dk && !kv->dk_acc) BWD_REJECT("mk_attn_bwd: kv block %d: dk and dk_acc are both NULL", i);
    if (!kv->dv && !kv->dv_acc) BWD_REJECT("mk_attn_bwd: kv block %d: dv and dv_acc are both NULL", i);
    if (bwd_misaligned(kv->dk, 4) || bwd_misaligned(kv->dv, 4) || bwd_misaligned(kv->dk_acc, 8) ||
        bwd_misaligned(kv->dv_acc, 8))
      BWD_REJECT("mk_attn_bwd: kv block %d: dk %p / dv %p (4-byte) or dk_acc %p / dv_acc %p (8-byte) misaligned", i,
                 kv->dk, kv->dv, (void*)kv->dk_acc, (void*)kv->dv_acc);
    if (kv->seq < 1) BWD_REJECT("mk_attn_bwd: kv block %d: seq = %d, must be >= 1", i, kv->seq);
    const int rows = bwd_block_rows(kv);
    if (kv->row0 < 0 || kv->rows < 0 || rows < 1 || (long)kv->row0 + rows > kv->seq)
      BWD_REJECT("mk_attn_bwd: kv block %d: rows [%d, +%d) must be a non-empty part of seq = %d", i, kv->row0,
                 kv->rows, kv->seq);
    if (kv->pos0 < 0) BWD_REJECT("mk_attn_bwd: kv block %d: pos0 = %lld, must be >= 0", i, kv->pos0);
    if (kv->ready_flags && (!a->ready_done || kv->ready_chunk_rows < 1 || bwd_misaligned(kv->ready_flags, 8)))
      BWD_REJECT("mk_attn_bwd: kv block %d: ready_flags %p need ready_done (%p), ready_chunk_rows >= 1 (%d) and "
                 "8-byte alignment", i, (const void*)kv->ready_flags, (const void*)a->ready_done, kv->ready_chunk_rows);
    tiles += bwd_block_tiles(kv);
  }
  if (tiles > INT_MAX) BWD_REJECT("mk_attn_bwd: %lld key tiles, too many", tiles);
  if (bwd_misaligned(a->dkv_ws, 16)) BWD_REJECT("mk_attn_bwd: dkv_ws = %p, must be 16-byte aligned", (void*)a->dkv_ws);
  if (bwd_misaligned(a->phase_words, 8))
    BWD_REJECT("mk_attn_bwd: phase_words = %p, must be 8-byte aligned", (void*)a->phase_words);
  MK_CHECK(bwd_check_addends_pdl(a));
  return bwd_check_ring(a);
}

/* Split, a block whose partials go straight into its accumulators (nothing else to write). */
static int bwd_block_direct(const struct mk_attn_bwd_kv_block* kv) {
  return kv->dk_acc && kv->dv_acc && !kv->dk && !kv->dv && !kv->acc_overwrite;
}

/* The ring's call, split (attn_bwd_group_write_out): a u32 per (key tile, kv head, batch) after
 * the blocks' partials, in floats, a whole number of the zeroing's 4-float units. */
static size_t bwd_group_count_floats(const struct mk_attn_bwd_args* a) {
  size_t tiles = 0;
  for (int i = 0; i < a->num_kv_blocks; i++) tiles += (size_t)bwd_block_tiles(&a->kv[i]);
  return (tiles * a->kv_heads * a->batch + 3) & ~(size_t)3;
}

/* Split only at D = 128: at D = 64 (steps half as long) a CTA per query head ran 3.5% slower
 * than a CTA per group (16K causal, GQA 8:1; bench/NOTES.md, session 33). */
extern "C" size_t mk_attn_bwd_dkv_ws_floats(const struct mk_attn_bwd_args* a) {
  if (!a || a->heads <= a->kv_heads || a->heads > 65535 || a->d_head != 128 || a->num_kv_blocks < 1 ||
      a->num_kv_blocks > MK_ATTN_MAX_KV_BLOCKS)
    return 0;
  size_t n = 0;
  for (int i = 0; i < a->num_kv_blocks; i++)
    if (!bwd_block_direct(&a->kv[i])) n += 2 * (size_t)a->batch * bwd_block_rows(&a->kv[i]) * a->kv_heads * a->d_head;
  return n && bwd_ring_parts(a) ? n + bwd_group_count_floats(a) : n;
}

/* Whether the call gives each CTA one query head (attn.h, dkv_ws): grouped-query heads at D =
 * 128, few enough for the grid's y, and every block's partials have somewhere to meet. */
static int bwd_split(const struct mk_attn_bwd_args* a) {
  return a->heads > a->kv_heads && a->heads <= 65535 && a->d_head == 128 &&
         (a->dkv_ws || mk_attn_bwd_dkv_ws_floats(a) == 0);
}

/* mk_attn_bwd_epilogue for a call whose split (bwd_split) is known. */
static int bwd_epilogue(const struct mk_attn_bwd_args* a, int split) {
  if (a->addends.n > 0) return MK_ATTN_BWD_EPI_ADDENDS;
  for (int i = 0; !split && i < a->num_kv_blocks; i++)
    if ((a->kv[i].dk_acc || a->kv[i].dv_acc) && !a->kv[i].acc_overwrite) return MK_ATTN_BWD_EPI_ACC;
  return MK_ATTN_BWD_EPI_PLAIN;
}

extern "C" int mk_attn_bwd_epilogue(const struct mk_attn_bwd_args* a) { return bwd_epilogue(a, bwd_split(a)); }

/* What the elementwise passes read and write (attn_bwd_passes.cuh); dkv_ws: split's. */
static void attn_bwd_rows_of(const struct mk_attn_bwd_args* a, struct mk_attn_bwd_rows* r) {
  memset(r, 0, sizeof *r);
  r->out = (const __nv_bfloat16*)a->out, r->dout = (const __nv_bfloat16*)a->dout;
  r->delta = a->delta, r->dq_acc = a->dq_acc, r->dq = (__nv_bfloat16*)a->dq;
  r->batch = a->batch, r->seq_q = a->seq_q, r->heads = a->heads, r->q_row0 = a->q_row0, r->q_rows = bwd_q_rows(a);
  r->do_delta = !a->delta_ready, r->zero_dq = !a->dq_accumulate;
  r->dkv_ws = bwd_split(a) ? a->dkv_ws : NULL;
  r->ws_floats = r->dkv_ws ? mk_attn_bwd_dkv_ws_floats(a) : 0;
}

/* Blocks of 256 threads for `units` thread units of a pass, at most `cap`. */
static unsigned bwd_pass_blocks(size_t units, unsigned cap) {
  return (unsigned)(units / 256 + 1 < cap ? units / 256 + 1 : cap);
}

typedef void (*attn_bwd_main_fn)(const struct mk_attn_bwd_maps, const struct mk_attn_bwd_params);

/* The configurations the ring's parts are compiled for: the default variant's (the ring's). */
template <class Cfg>
struct attn_bwd_ring_cfg {
  static constexpr bool value = false;
};
template <>
struct attn_bwd_ring_cfg<mk_attn_bwd_cfg_d128> {
  static constexpr bool value = true;
};
template <>
struct attn_bwd_ring_cfg<mk_attn_bwd_cfg_d64> {
  static constexpr bool value = true;
};

/* The main kernel of Cfg for a call: its launch (attn_bwd_phase.cuh ATTN_BWD_LAUNCH_*) and its
 * epilogue; NULL when Cfg has no such kernel (the ring's parts of another variant). */
template <class Cfg>
static attn_bwd_main_fn attn_bwd_main_kernel(int launch, int epi) {
  static const attn_bwd_main_fn kernels[2][MK_ATTN_BWD_EPIS] = {
      {mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_MAIN, MK_ATTN_BWD_EPI_PLAIN>,
       mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_MAIN, MK_ATTN_BWD_EPI_ACC>,
       mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_MAIN, MK_ATTN_BWD_EPI_ADDENDS>},
      {mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_ONE, MK_ATTN_BWD_EPI_PLAIN>,
       mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_ONE, MK_ATTN_BWD_EPI_ACC>,
       mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_ONE, MK_ATTN_BWD_EPI_ADDENDS>}};
  if (launch != ATTN_BWD_LAUNCH_RING) return kernels[launch][epi];
  if constexpr (attn_bwd_ring_cfg<Cfg>::value) {
    static const attn_bwd_main_fn ring[MK_ATTN_BWD_EPIS] = {
        mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_RING, MK_ATTN_BWD_EPI_PLAIN>,
        mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_RING, MK_ATTN_BWD_EPI_ACC>,
        mk_attn_bwd_kernel<Cfg, ATTN_BWD_LAUNCH_RING, MK_ATTN_BWD_EPI_ADDENDS>};
    return ring[epi];
  }
  return NULL;
}

/* Every main kernel of Cfg loaded, their shared memory set. */
template <class Cfg>
static cudaError_t attn_bwd_prepare_cfg(void) {
  static int done[64];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 64 && __atomic_load_n(&done[dev], __ATOMIC_ACQUIRE)) return cudaSuccess;
  for (int i = 0; i < 3 * MK_ATTN_BWD_EPIS && e == cudaSuccess; i++) {
    const void* kernel = (const void*)attn_bwd_main_kernel<Cfg>(i / MK_ATTN_BWD_EPIS, i % MK_ATTN_BWD_EPIS);
    if (!kernel) continue;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES);
    cudaFuncAttributes fa;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, kernel);
  }
  if (e == cudaSuccess && dev < 64) __atomic_store_n(&done[dev], 1, __ATOMIC_RELEASE);
  return e;
}

/* A block's kernel parameters; split: where its CTAs add their partials (its accumulators, or
 * the next part of the workspace at *ws, [batch, rows, kv_heads, D] for dk, then for dv). */
template <class Cfg>
static void attn_bwd_block_params(const struct mk_attn_bwd_args* a, const struct mk_attn_bwd_kv_block* kv, int split,
                                  int tile0, float** ws, struct mk_attn_bwd_block_params* b) {
  const int rows = bwd_block_rows(kv);
  b->row0 = kv->row0, b->rows = rows, b->pos0 = kv->pos0, b->tile0 = tile0, b->seq = kv->seq;
  b->dk = (__nv_bfloat16*)kv->dk, b->dv = (__nv_bfloat16*)kv->dv;
  b->dk_acc = kv->dk_acc, b->dv_acc = kv->dv_acc, b->acc_overwrite = kv->acc_overwrite ? 1 : 0;
  b->ready_flags = kv->ready_flags;
  b->ready_chunk_rows = kv->ready_chunk_rows;
  b->ready_chunks = kv->ready_flags ? (kv->seq + kv->ready_chunk_rows - 1) / kv->ready_chunk_rows : 0;
  b->announce = kv->announce;
  b->ctas = bwd_block_tiles(kv) * (split ? a->heads : a->kv_heads) * a->batch; /* grid_heads */
  b->split_tiles = kv->split ? kv->split / Cfg::BN : INT_MAX, b->pos1 = kv->pos1;
  if (split && bwd_block_direct(kv)) {
    b->dk_red = kv->dk_acc, b->dv_red = kv->dv_acc, b->red_seq = kv->seq, b->red_row0 = kv->row0;
  } else if (split) {
    const size_t n = (size_t)a->batch * rows * a->kv_heads * Cfg::D;
    b->dk_red = *ws, b->dv_red = *ws + n, b->red_seq = rows, b->red_row0 = 0;
    *ws += 2 * n;
  }
}

/* The main kernel's tensor maps and parameters, its grid (grid_tiles: the key tiles of all blocks). */
template <class Cfg>
static int attn_bwd_fill(const struct mk_attn_bwd_args* a, int split, struct mk_attn_bwd_maps* maps,
                         struct mk_attn_bwd_params* p) {
  memset(maps, 0, sizeof *maps);
  memset(p, 0, sizeof *p);
  const int q_rows = bwd_q_rows(a);
  MK_CHECK(mk_attn_tmap_encode_rows(&maps->q, a->q, a->batch, a->seq_q, a->q_row0, q_rows, a->heads, Cfg::D, Cfg::BM));
  MK_CHECK(mk_attn_tmap_encode_rows(&maps->dout, a->dout, a->batch, a->seq_q, a->q_row0, q_rows, a->heads, Cfg::D,
                                    Cfg::BM));
  if (Cfg::DQ_TMA)
    MK_CHECK(mk_attn_tmap_encode_rows_f32(&maps->dq_acc, a->dq_acc, a->batch, a->seq_q, a->q_row0, q_rows, a->heads,
                                          Cfg::D, Cfg::DQ_BOX_ROWS));
  int tiles = 0;
  float* ws = a->dkv_ws;
  for (int i = 0; i < a->num_kv_blocks; i++) {
    const struct mk_attn_bwd_kv_block* kv = &a->kv[i];
    const int rows = bwd_block_rows(kv);
    MK_CHECK(mk_attn_tmap_encode_rows(&maps->k[i], kv->k, a->batch, kv->seq, kv->row0, rows, a->kv_heads,
                                      Cfg::D, Cfg::BN));
    MK_CHECK(mk_attn_tmap_encode_rows(&maps->v[i], kv->v, a->batch, kv->seq, kv->row0, rows, a->kv_heads,
                                      Cfg::D, Cfg::BN));
    attn_bwd_block_params<Cfg>(a, kv, split, tiles, &ws, &p->kv[i]);
    tiles += bwd_block_tiles(kv);
  }
  p->seq_q = a->seq_q, p->heads = a->heads, p->kv_heads = a->kv_heads, p->causal = a->causal ? 1 : 0;
  p->split = split;
  p->chunk = MK_ATTN_BWD_CHUNK_TILES;
  p->q_row0 = a->q_row0, p->q_rows = q_rows, p->q_pos0 = a->q_pos0;
  p->num_kv_blocks = a->num_kv_blocks;
  p->lse = a->lse, p->delta = a->delta, p->dq_acc = a->dq_acc;
  p->scale = (float)(1.0 / sqrt((double)Cfg::D));
  p->scale_log2 = (float)(1.4426950408889634 / sqrt((double)Cfg::D));
  p->acc_gate = a->acc_gate, p->ready_done = a->ready_done, p->err = a->err, p->err_tag = a->err_tag;
  p->addends = a->addends;
  p->grid_tiles = tiles, p->grid_heads = split ? a->heads : a->kv_heads, p->batch = a->batch;
  p->q_tiles0 = a->q_split ? a->q_split / Cfg::BM : INT_MAX, p->q_pos1 = a->q_pos1;
  /* addends beside other blocks (their block last, blocks of one size): block by block */
  if (a->addends.n && a->num_kv_blocks > 1) p->chunk = bwd_block_tiles(&a->kv[0]);
  p->push = a->push, p->call_done = a->call_done;
  /* the ring's call, split: the tiles' warp-group counts after the blocks' partials */
  p->group_counts = split && ws != a->dkv_ws && bwd_ring_parts(a) ? (uint32_t*)ws : NULL;
  p->trace = a->trace;
  attn_bwd_rows_of(a, &p->pass);
  p->timeout_ns = (uint64_t)(a->timeout_ms ? a->timeout_ms : MK_ATTN_BWD_DEFAULT_TIMEOUT_MS) * 1000000ull;
  int chain = a->addends.n > 1 ? a->addends.n : 1; /* waits one after another inside a part */
  if (a->push.ctas && a->push.nranks - 1 > chain) chain = a->push.nranks - 1;
  p->part_timeout_ns = (uint64_t)(chain + 1) * p->timeout_ns;
  return 0;
}

/* Split: the outputs of the blocks whose partials met in the workspace. */
template <class Cfg>
static cudaError_t attn_bwd_write_ws_blocks(const struct mk_attn_bwd_args* a, const struct mk_attn_bwd_params* p,
                                            cudaStream_t stream) {
  for (int i = 0; i < a->num_kv_blocks; i++) {
    const struct mk_attn_bwd_block_params* b = &p->kv[i];
    if (!attn_bwd_block_in_ws(*b)) continue; /* added into its accumulators directly */
    const size_t n2 = (size_t)a->batch * b->rows * a->kv_heads * Cfg::D / 2;
    mk_attn_bwd_dkv_kernel<Cfg::D>
        <<<bwd_pass_blocks(n2, 4096), 256, 0, stream>>>(attn_bwd_ws_block_of(*b), a->acc_gate, a->batch, a->kv_heads);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/* delta (unless delta_ready) and dq_acc's rows zeroed (unless dq_accumulate). */
template <int D>
static cudaError_t attn_bwd_prep(const struct mk_attn_bwd_args* a, cudaStream_t stream) {
  if (a->delta_ready && a->dq_accumulate) return cudaSuccess;
  struct mk_attn_bwd_rows r;
  attn_bwd_rows_of(a, &r);
  mk_attn_bwd_prep_kernel<D><<<bwd_pass_blocks(attn_bwd_row_units(r, D), 8192), 256, 0, stream>>>(r);
  return cudaGetLastError();
}

/* The main kernel of Cfg loaded (and its shared memory set), then the prep kernel: the start
 * of every launch, and all of mk_attn_bwd_prep_launch. */
template <class Cfg>
static cudaError_t attn_bwd_prepare_and_prep(const struct mk_attn_bwd_args* a, cudaStream_t stream) {
  const cudaError_t e = attn_bwd_prepare_cfg<Cfg>();
  return e == cudaSuccess ? attn_bwd_prep<Cfg::D>(a, stream) : e;
}

/* The main kernel; pdl: launched as a programmatic dependent of the kernel before it. */
template <class Cfg>
static cudaError_t attn_bwd_launch_main(const struct mk_attn_bwd_args* a, const struct mk_attn_bwd_maps* maps,
                                        const struct mk_attn_bwd_params* p, dim3 grid, cudaStream_t stream) {
  const int launch = !p->phase ? ATTN_BWD_LAUNCH_MAIN : bwd_ring_parts(a) ? ATTN_BWD_LAUNCH_RING : ATTN_BWD_LAUNCH_ONE;
  const attn_bwd_main_fn kernel = attn_bwd_main_kernel<Cfg>(launch, bwd_epilogue(a, p->split));
  if (!kernel) return cudaErrorInvalidDeviceFunction; /* the ring's parts: the default variant only */
  if (!a->pdl) {
    kernel<<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(*maps, *p);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = dim3(Cfg::THREADS), cfg.dynamicSmemBytes = Cfg::SMEM_BYTES, cfg.stream = stream;
  cudaLaunchAttribute at = {};
  at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &at, cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, *maps, *p);
}

/* The one-launch call (attn_bwd_phase.cuh): a start item per SM if there is anything to
 * zero or compute first, the key tiles, an end item per SM if there is anything to write out. */
template <class Cfg>
static int attn_bwd_launch_one(const struct mk_attn_bwd_args* a, const struct mk_attn_bwd_maps* maps,
                               struct mk_attn_bwd_params* p, int sms, cudaStream_t stream) {
  const long long n_main = (long long)p->grid_tiles * p->grid_heads * p->batch;
  p->phase = a->phase_words;
  p->n_start = p->pass.do_delta || p->pass.zero_dq || p->pass.ws_floats ? sms : 0;
  p->n_end = p->pass.dq || p->pass.ws_floats ? sms : bwd_ring_parts(a) ? 1 : 0; /* the ring's: the call's end */
  if (n_main + p->push.ctas + p->n_start + p->n_end > INT_MAX)
    BWD_REJECT("mk_attn_bwd: %lld CTAs of key tiles, too many for one launch", n_main);
  p->n_main = (int)n_main;
  cudaError_t e = attn_bwd_prepare_cfg<Cfg>();
  if (e == cudaSuccess)
    e = attn_bwd_launch_main<Cfg>(a, maps, p, dim3((unsigned)(p->push.ctas + p->n_start + p->n_main + p->n_end)),
                                  stream);
  if (e != cudaSuccess) {
    MK_WARN("mk_attn_bwd: launch failed: %s", cudaGetErrorString(e));
    return -EIO;
  }
  return 0;
}

template <class Cfg>
static int attn_bwd_launch_cfg(const struct mk_attn_bwd_args* a, int sms, cudaStream_t stream) {
  struct mk_attn_bwd_maps maps;
  struct mk_attn_bwd_params p;
  const int split = bwd_split(a);
  MK_CHECK(attn_bwd_fill<Cfg>(a, split, &maps, &p));
  if (a->phase_words) return attn_bwd_launch_one<Cfg>(a, &maps, &p, sms, stream);
  const size_t ws_floats = p.pass.ws_floats;

  cudaError_t e = attn_bwd_prepare_and_prep<Cfg>(a, stream);
  if (e == cudaSuccess && ws_floats) e = cudaMemsetAsync(a->dkv_ws, 0, ws_floats * sizeof(float), stream);
  if (e == cudaSuccess) {
    const dim3 grid((unsigned)p.grid_tiles, (unsigned)p.grid_heads, (unsigned)p.batch);
    e = attn_bwd_launch_main<Cfg>(a, &maps, &p, grid, stream);
  }
  if (e == cudaSuccess && ws_floats) e = attn_bwd_write_ws_blocks<Cfg>(a, &p, stream);
  if (e == cudaSuccess && a->dq) {
    mk_attn_bwd_dq_kernel<Cfg::D><<<bwd_pass_blocks(attn_bwd_row_units(p.pass, Cfg::D), 8192), 256, 0, stream>>>(p.pass);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) {
    MK_WARN("mk_attn_bwd: launch failed: %s", cudaGetErrorString(e));
    return -EIO;
  }
  return 0;
}

/* The configuration of a variant for the call's head dimension. */
template <class Cfg128, class Cfg64>
static int attn_bwd_launch_d(const struct mk_attn_bwd_args* a, int sms, cudaStream_t stream) {
  return a->d_head == 128 ? attn_bwd_launch_cfg<Cfg128>(a, sms, stream) : attn_bwd_launch_cfg<Cfg64>(a, sms, stream);
}

extern "C" int mk_attn_bwd_launch_variant(const struct mk_attn_bwd_args* a, cudaStream_t stream, int variant) {
  MK_CHECK(mk_attn_bwd_check(a));
  if (variant < 0 || variant >= MK_ATTN_BWD_VARIANTS) BWD_REJECT("mk_attn_bwd: variant %d unknown", variant);
  if (variant && bwd_ring_parts(a)) /* compiled for the default variant only (attn_bwd_ring_cfg) */
    BWD_REJECT("mk_attn_bwd: push, announce and call_done need variant 0 (got %d)", variant);
  int sms = 0;
  MK_CHECK(mk_sm90_sms("mk_attn_bwd", &sms));
  switch (variant) {
    case 1: return attn_bwd_launch_d<mk_attn_bwd_cfg_d128_red, mk_attn_bwd_cfg_d64_red>(a, sms, stream);
    case 2: return attn_bwd_launch_d<mk_attn_bwd_cfg_d128_defer, mk_attn_bwd_cfg_d64_defer>(a, sms, stream);
    case 3: return attn_bwd_launch_d<mk_attn_bwd_cfg_d128_now, mk_attn_bwd_cfg_d64_now>(a, sms, stream);
    case 4: return attn_bwd_launch_d<mk_attn_bwd_cfg_d128_late_alt, mk_attn_bwd_cfg_d64_late_alt>(a, sms, stream);
    case 5: return attn_bwd_launch_d<mk_attn_bwd_cfg_d128_pair, mk_attn_bwd_cfg_d64>(a, sms, stream);
    default: return attn_bwd_launch_d<mk_attn_bwd_cfg_d128, mk_attn_bwd_cfg_d64>(a, sms, stream);
  }
}

extern "C" int mk_attn_bwd_launch(const struct mk_attn_bwd_args* a, cudaStream_t stream) {
  return mk_attn_bwd_launch_variant(a, stream, 0);
}

extern "C" int mk_attn_bwd_prep_launch(const struct mk_attn_bwd_args* a, cudaStream_t stream) {
  MK_CHECK(mk_attn_bwd_check(a));
  int sms = 0;
  MK_CHECK(mk_sm90_sms("mk_attn_bwd", &sms));
  /* the default main kernel loaded now: with lazy module loading its first launch loads it, and
   * a load waits for the kernels running then, the one a pdl call is to start beside included
   * (measured: the call then started only once that kernel ended) */
  const cudaError_t e = a->d_head == 128 ? attn_bwd_prepare_and_prep<mk_attn_bwd_cfg_d128>(a, stream)
                                         : attn_bwd_prepare_and_prep<mk_attn_bwd_cfg_d64>(a, stream);
  if (e != cudaSuccess) {
    MK_WARN("mk_attn_bwd: prep launch failed: %s", cudaGetErrorString(e));
    return -EIO;
  }
  return 0;
}

template <class Cfg>
static int attn_bwd_load_cfg(void) {
  const cudaError_t e = attn_bwd_prepare_cfg<Cfg>();
  if (e != cudaSuccess) {
    MK_WARN("loading the attention backward kernel (D = %d): %s", Cfg::D, cudaGetErrorString(e));
    return -EIO;
  }
  MK_CHECK(mk_kernel_load((const void*)mk_attn_bwd_prep_kernel<Cfg::D>, "mk_attn_bwd_prep_kernel"));
  MK_CHECK(mk_kernel_load((const void*)mk_attn_bwd_dq_kernel<Cfg::D>, "mk_attn_bwd_dq_kernel"));
  return mk_kernel_load((const void*)mk_attn_bwd_dkv_kernel<Cfg::D>, "mk_attn_bwd_dkv_kernel");
}

/* The default variant's kernels at both head dimensions (the ring attention's backward). */
extern "C" int mk_attn_bwd_load(void) {
  MK_CHECK(attn_bwd_load_cfg<mk_attn_bwd_cfg_d128>());
  return attn_bwd_load_cfg<mk_attn_bwd_cfg_d64>();
}
