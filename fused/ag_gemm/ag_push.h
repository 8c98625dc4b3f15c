/*
 * The communication half of the fused AllGather+GEMM (C interface to ag_push.cu).
 *
 * Per call e on rank r (all ranks on one host, direct peer pointers):
 *   begin kernel   call = done + 1 (= e), and the GEMM's row-block order: own shard
 *                  first, then ring arrival order
 *   push kernel    (side stream, a few CTAs) for each peer d, once d's GEMM of call e-1
 *                  is done (done[d] >= e-1), copies each 128-row block of r's shard into d's
 *                  gathered A, every CTA a slice of it, and the last CTA done with the block
 *                  raises d's flag for it to e (per CTA: bar.sync, fence.sys, acq_rel add on
 *                  the block's counter; the last: fence.sys + st.release.sys of the flag, so
 *                  a flag is never seen before its rows)
 *   GEMM           (main stream, the other SMs) reads its own shard in place (a_local) and
 *                  the peers' rows from the gathered buffer, waiting flag[mb] >= call for
 *                  each of their row-blocks (acquire + proxy fence in the GEMM core)
 *   finish kernel  after both: done = e (release.sys: peers may write our buffer again)
 * Every word that changes between calls lives in device memory, so a CUDA graph of the call
 * replays correctly. One gathered buffer suffices: a peer writes it for call e only after our
 * GEMM of call e-1 finished (the done counter).
 *
 * Workspace of each rank (symmetric, mapped by its local peers):
 *   words:    32 KiB of u64   [0] done, [1] call (shared by all ops), [MK_AG_FLAG0 + mb] flags
 *             (all zero at init: the first call is 1)
 *   order:    MK_AG_MAX_BLOCKS × 4 B   the GEMM's row-block order (own rank only)
 *   counts:   MK_AG_MAX_BLOCKS × 4 B   CTAs done with each push item (own CTAs only; the
 *                                      last one resets it to 0)
 *   gathered: max_m × max_k × 2 B      A, gathered (starts at MK_AG_DATA_OFFSET); the own
 *                                      shard's rows are never written
 */
#ifndef MK_AG_PUSH_H_
#define MK_AG_PUSH_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MK_AG_MAX_RANKS 8
#define MK_AG_BLOCK_ROWS 128          /* the GEMM core's BM: one flag per row-block */
#define MK_AG_WORD_DONE 0             /* the last call this rank finished (peers read it) */
#define MK_AG_WORD_CALL 1             /* the call in progress */
#define MK_AG_WORD_EXITS 2            /* one-kernel calls: CTAs finished (u32; 0 between calls) */
#define MK_AG_FLAG0 64                /* first flag word */
#define MK_AG_MAX_BLOCKS 4032         /* flags in the 32 KiB word area */
#define MK_AG_WORDS_BYTES (32u << 10)
#define MK_AG_ORDER_OFFSET MK_AG_WORDS_BYTES
#define MK_AG_COUNT_OFFSET (48u << 10)
#define MK_AG_DATA_OFFSET (128u << 10) /* = MK_FUSED_FLAG_BYTES */

struct mk_ag_push_args {
  const void* a_shard;                   /* this rank's rows: [shard_rows, k] bf16 */
  size_t shard_rows, k;
  int rank, nranks;
  void* ws[MK_AG_MAX_RANKS];             /* every rank's workspace, as this GPU addresses it */
  struct mk_gemm_error* err;             /* host-mapped error record */
  uint32_t err_tag;
  uint64_t timeout_ns;
  struct mk_trace_buf* trace;            /* NCCL_MK_TRACE, else NULL */
  uint32_t trace_cta0;                   /* ring of CTA 0 (after the GEMM's CTAs) */
  int drop_flag_block;                   /* NCCL_MK_DEBUG_DROP_FLAG: a row-block whose flag is
                                          * never raised (tests of hang reports); -1 off */
};

/* The push's own waits (for a peer's done word) report with this bit in the error tag, so a
 * hang report tells them from the GEMM's row-block waits; their `tile` is the push item. */
#define MK_AG_ERR_TAG_PUSH 0x80u

/* The begin kernel on `stream`. 0 or -EIO. */
int mk_ag_begin_launch(void* own_ws, int rank, int nranks, size_t shard_rows, cudaStream_t stream);
/* The push kernel with `ctas` CTAs on `stream`. 0 or -EIO. */
int mk_ag_push_launch(const struct mk_ag_push_args* a, int ctas, cudaStream_t stream);
/* The finish kernel on `stream`. 0 or -EIO. */
int mk_ag_finish_launch(void* own_ws, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MK_AG_PUSH_H_ */
