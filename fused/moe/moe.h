/*
 * MoE expert parallelism on peer memory (C interface to moe_dispatch.cu and moe_combine.cu).
 *
 * Dispatch, call e on rank s (every rank on this host; ncclMkMoeDispatchGemm in moe.c): a
 * begin kernel (call = done + 1; zero this call's counters), then one dispatch kernel whose
 * phases are
 *   route     CTAs claim chunks of the tokens (mk_moe_route_chunks): each token once per
 *             destination rank d that owns one of its experts, a place u in d's list, and per
 *             (token, slot) with an expert j on d a place pos among s's rows for (d, j)
 *             (atomics: the order inside a group is not fixed, each row says where it came from)
 *   counts    the CTA that finishes the last chunk raises routed = e (the push starts), then,
 *             for each d once d finished call e-1: s's counts into d's counts[s], then
 *             counts_flag[s] = e; waits for every source's counts, writes the group offsets
 *             (expert j's rows: sources in rank order) and offsets_ready = e (the expand starts)
 *   comm      the first push_ctas CTAs to get here push: they claim (destination, chunk)
 *             items, and once d finished call e-1 copy s's listed tokens and their slots
 *             into d's recv[s] / meta[s], 16-row chunks, raising
 *             chunk_flag[s][c] = e after each (with fp8 dispatch the rows move as e4m3 and
 *             a scale rides in the token's meta); expand warps (and the push CTAs' once their
 *             push is done: items claimed in order from a counter) take every source's rows (own
 *             first: read in place; a row split over up to 16 warps when rows are few), copy
 *             each row to its (expert, source, pos) place in the GEMM's A (dequantizing fp8
 *             rows; own rows rounded the same way), and with the GEMM beside it (overlap) the
 *             part that completes expert j raises ready[j] = e
 *   GEMM      grouped over the local experts on every SM after the dispatch kernel
 *             (NCCL_MK_MOE_OVERLAP=1: on the SMs it leaves, each group waiting for
 *             ready[j] >= e; the route phase then runs first, as its own launch)
 *   finish    done = e (peers may write this rank's areas again)
 * Work is claimed from counters, never tied to blockIdx: the kernel finishes with any number
 * of its CTAs on the GPU at once (one resident CTA is enough). A CTA that waits for another
 * that cannot start would hang when other kernels hold SMs: another stream's, or a peer's
 * sharing the GPU under MPS (where the whole-grid dispatch hung in session 35).
 * A rank with no tokens (T = 0) runs every phase the same way: it routes nothing, sends zero
 * counts, pushes nothing, and expands and multiplies the rows its peers push to it.
 * Combine, call e: begin; the grouped GEMM, whose epilogue stores every row straight into its
 * source's comb[token][slot] (gemm.h row-scatter; its storer warps first wait until every
 * source's done >= e-1), and whose last CTA, once every CTA's stores are visible, raises
 * comb_flag[s] = e on every rank d (the GEMM's call bracket); reduce: once comb_flag[src] is e
 * for every source, out[t] = sum over valid slots of weight * comb[t][slot] in fp32; finish.
 * With T = 0 the GEMM serves the peers' rows as ever; the reduce (one CTA) waits for the flags
 * and sums nothing.
 *
 * MoE area of each rank's symmetric workspace (after the dense ops' data area), offsets in
 * struct mk_moe_geom: written by peers: counts_flag, comb_flag, counts, chunk_flag, meta,
 * recv, comb; this rank only: ready, rows_done, route_done, expand_next, claims, routed, offsets_ready,
 * send_counts, send_list, send_meta, seg, rows (the GEMM's A in a dispatch, y in a combine).
 */
#ifndef MK_MOE_H_
#define MK_MOE_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm.h"
#include "mk_hd.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MK_MOE_MAX_RANKS 8
#define MK_MOE_MAX_LOCAL_EXPERTS 256
#define MK_MOE_MAX_TOPK 16
#define MK_MOE_COUNT_STRIDE (1 + MK_MOE_MAX_LOCAL_EXPERTS) /* [0] tokens, [1 + j] rows of expert j */
#define MK_MOE_CHUNK_ROWS 16 /* one row per warp of a push CTA */
#define MK_MOE_POS_BITS 20      /* a meta slot: local expert << 20 | pos, or -1 */
#define MK_MOE_META_HEAD 2      /* a token's meta: [0] token, [1] fp8 scale (float bits), then slots */
#define MK_MOE_ERR_OVERFLOW 0x40u /* error-tag bit: more rows arrived than max_recv_rows */
/* What a wait of the dispatch or combine kernel (not the GEMMs) was for: the error record's
 * tile, its tag carrying MK_GEMM_ERR_TAG_PUSH (comm/err_text.c puts it in words). */
#define MK_MOE_WAIT_PEER_DONE 0 /* a peer's previous call (flag: the peer) */
#define MK_MOE_WAIT_COUNTS 1    /* a peer's token counts (flag: the peer) */
#define MK_MOE_WAIT_CHUNK 2     /* a chunk of a peer's tokens (flag: the chunk) */
#define MK_MOE_WAIT_ROWS 4      /* the combine: a peer's rows of this rank's tokens (flag: the peer) */
#define MK_MOE_WAIT_OWN 5       /* another CTA of this dispatch: routing or offsets done */

/* Sizes fixed at init and byte offsets inside the MoE area. */
struct mk_moe_geom {
  int nranks, max_tokens, max_hidden, max_topk, max_recv_rows;
  size_t counts_flag, comb_flag, counts, chunk_flag, meta, recv, comb;
  size_t ready, rows_done, route_done, expand_next, claims, routed, offsets_ready, send_counts, send_list, send_meta,
      seg, rows;
  size_t bytes;
};

/* The dispatch's claim counters (claims in the MoE area, zeroed by the begin kernel): the
 * route's token chunks, the CTAs' roles in arrival order, the push's chunks. */
enum mk_moe_claim { MK_MOE_CLAIM_ROUTE, MK_MOE_CLAIM_ROLE, MK_MOE_CLAIM_PUSH, MK_MOE_CLAIMS };

/* The route's token chunks for a grid of `ctas`: *per tokens each (at least 1), as many chunks
 * as CTAs or fewer, and one (empty) chunk with no tokens, whose end still ends the route. */
MK_HD int mk_moe_route_chunks(int tokens, int ctas, int* per) {
  *per = tokens > 0 ? (tokens + ctas - 1) / ctas : 1;
  return tokens > 0 ? (tokens + *per - 1) / *per : 1;
}

/* Items numbered across steps (moe_dispatch.cu: the expand's rows or row parts per source, own
 * rows first; the push's chunks per destination): item i is item *local of step `return`, of
 * `steps` steps with items[s] items each; -1 (and *local untouched) past the last. */
MK_HD int mk_moe_step_item(const int* items, int steps, int i, int* local) {
  for (int s = 0; s < steps; s++) {
    if (i < items[s]) {
      *local = i;
      return s;
    }
    i -= items[s];
  }
  return -1;
}

/* The grouped GEMMs' rows per tile (gemm.h args.block_m) from the mean rows of a local expert
 * (every rank's tokens x topk over the experts): 64 up to 32 rows, else 128. On the claimed
 * walk (sessions 39-41) 128-row tiles, which read an expert's weight block once per 128 rows,
 * win from 64 mean rows on (one H200, moe_perf -p 1 -s deepseek -c -T 2048..16384,
 * bench/NOTES.md session 42: dispatch 4-11% and combine 5-11% faster); 64-row tiles keep
 * decode (4-8 rows) 5% faster. 32 lies between the measured sizes. */
MK_HD int mk_moe_gemm_block_m(long tokens, int topk, int nranks, int num_experts) {
  return num_experts > 0 && tokens * topk * nranks <= 32L * num_experts ? 64 : 128;
}

/* Fills the offsets from the sizes (g->nranks ... max_recv_rows set); returns g->bytes. */
size_t mk_moe_geom_layout(struct mk_moe_geom* g);

/* Everything a dispatch's or combine's kernels need. */
struct mk_moe_args {
  struct mk_moe_geom g;
  int rank, nranks;
  char* moe[MK_MOE_MAX_RANKS];       /* each rank's MoE area as this GPU addresses it */
  uint64_t* words[MK_MOE_MAX_RANKS]; /* each rank's call words (done, call) */
  int tokens, hidden, topk, num_experts, e_local;
  int fp8;                           /* dispatch rows as e4m3 with a scale per token */
  const void* x;                     /* dispatch: [tokens, hidden] */
  const int* topk_idx;               /* dispatch: [tokens, topk] */
  const float* topk_weights;         /* combine: [tokens, topk] */
  void* out;                         /* combine: [tokens, hidden] */
  /* the layout (device) */
  int* group_offsets;                /* [e_local + 1] */
  int* row_source;                   /* [max_recv_rows][3] */
  int* slot_dest;                    /* [max_tokens][max_topk]: destination rank or -1 */
  unsigned long long* rows_sent;
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint64_t timeout_ns;
  int push_ctas, expand_ctas;
  int mark_ready;                    /* 1: the expand raises ready[j] per complete expert (overlap) */
  struct mk_trace_buf* trace;        /* NCCL_MK_TRACE (fused/common/trace.h); NULL: off */
};

/* MK_TRACE_PHASE ids of the dispatch kernel's events (trace.h; scripts/mktrace names them). */
enum mk_moe_trace_phase {
  MK_MOE_TRACE_ROUTE = 0,  /* a CTA: from its start to its last route chunk placed */
  MK_MOE_TRACE_COUNTS = 1, /* the last routing CTA: counts out, every source's back, offsets */
  MK_MOE_TRACE_PUSH = 2,   /* a push CTA: from `routed` to its last chunk's flag */
  MK_MOE_TRACE_EXPAND = 3, /* an expand CTA, or a push CTA once its push is done: from
                              `offsets_ready` to its last row (all warps) */
};

/* Each returns 0 or -EIO (launch failure). Dispatch: */
int mk_moe_begin_launch(const struct mk_moe_args* a, int zero_counters, cudaStream_t stream);
#define MK_MOE_PHASE_ROUTE 1 /* route, counts exchange, offsets */
#define MK_MOE_PHASE_COMM 2  /* push and expand (push_ctas + expand_ctas CTAs) */
int mk_moe_dispatch_launch(const struct mk_moe_args* a, int phases, int ctas, cudaStream_t stream);
/* Combine (after the GEMM that scatters the rows): */
int mk_moe_reduce_launch(const struct mk_moe_args* a, cudaStream_t stream);
/* Load the dispatch's and the combine's kernels (sm90.h mk_kernel_load). 0 or -EIO. */
int mk_moe_dispatch_load(void);
int mk_moe_combine_load(void);
/* done = call (both). */
int mk_moe_finish_launch(const struct mk_moe_args* a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MK_MOE_H_ */
