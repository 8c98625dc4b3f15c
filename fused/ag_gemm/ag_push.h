/*
 * The fused AllGather+GEMM's protocol and workspace (the push itself is a role of the GEMM
 * core's kernel: gemm.h struct mk_gemm_push; gemm_push.cuh).
 *
 * Per call e on rank r (all ranks on one host, direct peer pointers), one kernel:
 *   push CTAs      (the first few of the grid) for each peer d, once d's previous call is done
 *                  (done[d] >= e-1), copy each 128-row block of r's shard into d's gathered A,
 *                  every CTA a slice of it, and the last CTA done with the block raises d's
 *                  flag for it to e (per CTA: bar.sync, fence.sys, acq_rel add on the block's
 *                  counter; the last: fence.sys + st.release.sys of the flag, so a flag is never
 *                  seen before its rows). Destinations r-1, r-2, ...: each rank receives the
 *                  shards in ascending rank order from its own (schedule.h).
 *   GEMM CTAs      read the own shard in place (a_local) and the peers' rows from the gathered
 *                  buffer, in that arrival order (a rotation), waiting flag[mb] >= e for each
 *                  of their row-blocks (acquire + proxy fence in the GEMM core)
 *   last CTA       done = e (release.sys: peers may write our buffer again); with the caller's
 *                  gathered A, a copy out of the buffer and then the finish kernel do it instead
 * e = done + 1 throughout (done changes only at the call's end). Every word that changes
 * between calls lives in device memory, so a CUDA graph of the call replays correctly. One
 * gathered buffer suffices: a peer writes it for call e only after our call e-1 finished.
 *
 * Workspace of each rank (symmetric, mapped by its local peers):
 *   words:    32 KiB of u64   [0] done, [1] call (shared by all ops), [2] exits, [3] the
 *             claimed walk's tiles (gemm.h call.claims; 0 between calls), [4 .. 7] the ring
 *             attention backward's core calls' phase words (attn.h; 0 between calls),
 *             [MK_AG_FLAG0 + mb] flags (all zero at init: the first call is 1)
 *   counts:   MK_AG_MAX_BLOCKS x 4 B   CTAs done with each push item (own CTAs only; the
 *                                      last one resets it to 0)
 *   gathered: max_m x max_k x 2 B      A, gathered (starts at MK_AG_DATA_OFFSET); the own
 *                                      shard's rows are never written
 */
#ifndef MK_AG_PUSH_H_
#define MK_AG_PUSH_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MK_AG_MAX_RANKS 8
#define MK_AG_BLOCK_ROWS 128          /* the GEMM core's BM: one flag per row-block */
#define MK_AG_WORD_DONE 0             /* the last call this rank finished (peers read it) */
#define MK_AG_WORD_CALL 1             /* the call in progress */
#define MK_AG_WORD_EXITS 2            /* one-kernel calls: CTAs finished (u32; 0 between calls) */
/* the claimed walk's tiles taken (0 between calls), by AllGather+GEMM and the MoE GEMMs */
#define MK_AG_WORD_CLAIMS 3
/* the ring attention backward's core calls, one launch each (attn.h mk_attn_bwd_args.phase_words) */
#define MK_AG_WORD_ATTN_PHASE 4
#define MK_AG_FLAG0 64                /* first flag word */
#define MK_AG_MAX_BLOCKS 4032         /* flags in the 32 KiB word area */
#define MK_AG_WORDS_BYTES (32u << 10)
#define MK_AG_COUNT_OFFSET (48u << 10)
#define MK_AG_DATA_OFFSET (128u << 10) /* = MK_FUSED_FLAG_BYTES */

/* A one-kernel call bracket (gemm.h struct mk_gemm_call) over these words: zeroed, then this
 * rank's done and exits words (and the call word when with_call) and set_done. The op adds
 * the peers' done words, its counters and its claims. */
static inline void mk_ag_call_words(struct mk_gemm_call* call, int rank, int nranks, uint64_t* own,
                                    int with_call, int set_done) {
  memset(call, 0, sizeof(*call));
  call->rank = rank, call->nranks = nranks;
  call->done = own + MK_AG_WORD_DONE, call->call = with_call ? own + MK_AG_WORD_CALL : NULL;
  call->exits = (uint32_t*)(own + MK_AG_WORD_EXITS), call->set_done = set_done;
}

/* The claimed walk's word (MK_AG_WORD_CLAIMS of own) as the call's claims and its one counter
 * (the bracket zeroes it for the next call). */
static inline void mk_ag_call_claims(struct mk_gemm_call* call, uint64_t* own) {
  call->claims = call->counters = own + MK_AG_WORD_CLAIMS, call->num_counters = 1;
}

/* done = done + 1 (the call's number e) on `stream`, after the gathered A was copied out. 0 or -EIO. */
int mk_ag_finish_launch(void* own_ws, cudaStream_t stream);

/* Loads the finish kernel (sm90.h mk_kernel_load). 0 or -EIO. */
int mk_ag_load(void);

#ifdef __cplusplus
}
#endif

#endif /* MK_AG_PUSH_H_ */
