/*
 * ncclMkRingAttention's kernel (issue 11), host interface: one launch per rank and call.
 *
 * Per call e on rank r of n (every rank on one host, direct peer pointers; e = done + 1):
 *   push CTAs    (blockIdx 0 .. push_ctas-1, so they are dispatched first and always resident)
 *                wait until every peer d finished its previous call (done[d] >= e-1: it no
 *                longer reads its slots), then copy this rank's k and v, chunk by chunk
 *                (chunk_rows sequence rows of one batch: all kv heads, contiguous), into slot
 *                mk_sched_rs_slot(r, d) of every peer d at once (one read, n-1 writes); per
 *                chunk: bar.sync, fence.sys, st.release.sys of d's flag for (slot, chunk) to e.
 *                CTA i takes chunks i, i + push_ctas, ...: no counters between CTAs.
 *   attention    one CTA per work item (a 128-row query tile of one zigzag half, head,
 *   CTAs         batch), or with persistent = 1 one CTA per SM (up to the items' count), each
 *                claiming items one after another from the call's counter (call.claims,
 *                zeroed by the call's end), in attn.h's item order. The core's roles
 *                (attn_fwd.cuh): per ring step s the KV block of rank
 *                mk_ra_kv_source(r, n, s) (step 0: the own k, v in place; later: its slot),
 *                as one segment (non-causal) or its two zigzag halves at their global
 *                positions (causal), merged in registers; before each KV tile of a slot the
 *                producer waits (bounded, acquire.sys, then fence.proxy.async.global) for the
 *                flags of the chunks that hold its rows. Causal items longest first. The
 *                next item's Q and K/V load while the consumers finish the last one.
 *   end          every CTA counts its exit; the last sets done = e (call_end.cuh).
 * Progress needs only that the push CTAs are resident, which their lowest block indices give:
 * an attention CTA waits for nothing but the pushes, and no item belongs to a CTA before it
 * runs (a CTA that cannot start while other kernels hold SMs leaves its share to the running
 * ones, and the SMs the push CTAs free take attention CTAs).
 *
 * Workspace (fused_comm.h's data area at MK_AG_DATA_OFFSET): n-1 slots, slot j = [k | v], each
 * bf16 [batch, s_local, kv_heads, d_head]; flags: u64 words from MK_AG_FLAG0 (call numbers, as
 * AllGather+GEMM's, which share them safely: a flag only ever grows to the call that sets it),
 * slot j's chunk i at j * batch * chunks_per_batch + i.
 */
#ifndef MK_RING_ATTN_H_
#define MK_RING_ATTN_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "attn.h"
#include "gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MK_RA_MAX_RANKS 8
#define MK_RA_DEFAULT_TIMEOUT_MS 10000u /* mk_ra_args.timeout_ms 0 */

/* A kernel's bound on each wait, from mk_ra_args.timeout_ms (0: the default). */
static inline uint64_t mk_ra_timeout_ns(uint32_t timeout_ms) {
  return (uint64_t)(timeout_ms ? timeout_ms : MK_RA_DEFAULT_TIMEOUT_MS) * 1000000ull;
}

struct mk_ra_args {
  const void* q; /* bf16 [batch, s_local, heads, d_head] */
  const void* k; /* bf16 [batch, s_local, kv_heads, d_head] */
  const void* v;
  void* out;     /* like q */
  float* lse;    /* fp32 [batch, heads, s_local]; NULL: not written */
  int batch, s_local, heads, kv_heads, d_head, causal;
  int rank, nranks;
  int push_ctas;  /* >= 1 */
  int item_chunk; /* the forward's CTA order: 0 ra_schedule.h's rule, N chunks of N query tiles */
  int persistent; /* the forward: 1 attention CTAs claim the items from call.claims in turn */
  int chunk_rows; /* rows per flag, a multiple of 128 */
  void* slots;    /* this rank's n-1 slots */
  void* peer_slot[MK_RA_MAX_RANKS];       /* on peer d: the slot this rank writes */
  uint64_t* peer_flags[MK_RA_MAX_RANKS];  /* on peer d: that slot's chunk flags */
  const uint64_t* flags;                  /* this rank's flags, slot 0 first */
  struct mk_gemm_call call;               /* done, exits, peer_done (set_done = 1) */
  uint64_t* gave_up;                      /* backward gather: closed (attn.h) when a wait failed; else NULL */
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint32_t timeout_ms;
};

/* The push of a's k and v into this rank's slot on every peer (attn.h struct mk_kv_push; its
 * call word left to the kernel), kv_elems elements each. */
void mk_ra_kv_push(const struct mk_ra_args* a, size_t kv_elems, struct mk_kv_push* p);

/* Launches on `stream`. 0, -EINVAL (a shape the kernel cannot do, nothing launched), -ENOTSUP
 * (no sm_90 device) or -EIO (launch failure). The caller checked the arguments. */
int mk_ra_launch(const struct mk_ra_args* a, cudaStream_t stream);

/* Loads the ring attention's own kernels (sm90.h mk_kernel_load). 0 or -EIO. */
int mk_ra_load(void);

/* ---- the backward's kernels (ncclMkRingAttentionBackward, ring_attn_bwd.c; issue 12) ----------
 * Not one kernel yet: gather, a zero of the accumulators, the backward core's calls
 * (ra_bwd_plan.h), reduce. */

/* The gather: a->push_ctas CTAs run the forward's push (every peer gets this rank's k, v in its
 * slot, flags = e), then wait (bounded) until every peer's k, v arrived in this rank's slots;
 * a CTA whose wait failed sets *a->gave_up = MK_ATTN_ACC_GATE_CLOSED | call (ra_bwd_plan.h). Sets the call word; does not
 * end the call. 0 or -EIO (launch failure). */
int mk_ra_bwd_gather_launch(const struct mk_ra_args* a, cudaStream_t stream);

/* Zeroes `bytes` (a multiple of 16) at acc, a peer's accumulator in this rank's memory, unless
 * *gave_up is closed (MK_ATTN_ACC_GATE_CLOSED: the gather gave up; the peer may still be
 * reading it for its previous call). With peer_done (the merged plan, which zeroes on the
 * caller's stream before the gather has seen the peer's call start), it first waits (bounded)
 * until the peer finished its previous call, *peer_done >= *done (this rank's done word: the
 * call number is *done + 1), and closes *gave_up instead of zeroing when the wait fails.
 * 0, -EINVAL, -ENOTSUP (no sm_90 device) or -EIO (launch failure). */
struct mk_ra_bwd_zero_args {
  float* acc;
  size_t bytes;
  uint64_t* gave_up;
  const uint64_t* peer_done; /* optional */
  const uint64_t* done;
  struct mk_gemm_error* err;
  uint32_t err_tag, flag_index; /* the error record's names for a wait that gives up */
  uint32_t timeout_ms;
};
int mk_ra_bwd_zero_launch(const struct mk_ra_bwd_zero_args* a, cudaStream_t stream);

struct mk_ra_args;
/* The wait of a zero of peer d's accumulator (the merged plan): for d's done word, recorded as
 * a push wait (err_tag | MK_GEMM_ERR_TAG_PUSH, flag_index d; the kernel's tile is
 * MK_GEMM_ERR_TILE_PEER_FREE), so the hang report and the error text name d. */
void mk_ra_bwd_zero_wait(const struct mk_ra_args* ga, int d, struct mk_ra_bwd_zero_args* z);

#define MK_RA_REDUCE_ALL 0      /* announce, wait for the peers', sum, end the call */
#define MK_RA_REDUCE_ANNOUNCE 1 /* only the announcement (the own-last plan, before its last call) */
#define MK_RA_REDUCE_END 2      /* only the call's end (the own-last plan, after its last call) */

struct mk_ra_bwd_reduce_args {
  int mode;                               /* MK_RA_REDUCE_* */
  const float* own_acc;                   /* this rank's acc[rank]: [dk | dv], fp32, 2 x kv_elems */
  const float* peer_acc[MK_RA_MAX_RANKS]; /* on peer d: acc[rank] (d's partial of this rank's block) */
  uint64_t* peer_ready[MK_RA_MAX_RANKS];  /* on peer d: the "partials ready" word of this rank */
  const uint64_t* ready;                  /* this rank's "partials ready" words, by slot */
  uint32_t ready_index0;                  /* ready[0]'s flag index (error reports) */
  void* dk;                               /* bf16 [B, S_local, H_kv, D] */
  void* dv;
  size_t kv_elems;                        /* a multiple of 4 */
  int rank, nranks;
  struct mk_gemm_call call;               /* done, exits (set_done = 1) */
  struct mk_gemm_error* err;
  uint32_t err_tag;
  uint32_t timeout_ms;
  const uint64_t* gave_up; /* the gather's gate word (attn.h MK_ATTN_ACC_GATE_CLOSED) */
};

/* The reduce: announces this rank's partials to every peer (fence.sys, then st.release.sys of
 * its ready word on each peer to e; not when the call gave up on a wait: its partials may be
 * missing, and a peer that is late, not dead, would add what an earlier call left), waits
 * (bounded) for every peer's word, then dk, dv = bf16(own acc + every peer's acc[rank])
 * (reading the peers' accumulators over NVLink), then ends the call (done = e);
 * MK_RA_REDUCE_ANNOUNCE / _END: only the first / the last part (one CTA). 0, -ENOTSUP (no
 * sm_90 device) or -EIO. */
int mk_ra_bwd_reduce_launch(const struct mk_ra_bwd_reduce_args* a, cudaStream_t stream);

/* Where rank `rank`'s backward core calls read and write: its data area and every rank's
 * (ra_bwd_plan.h's layout; peer_data[rank] = data), the gather's "gave up" word, the error
 * record. The ring passes its workspaces; the one-GPU emulation (test/perf/attn/ring_bwd_emul)
 * buffers of its own. */
struct mk_ra_bwd_areas {
  int rank, nranks;
  void* data;
  void* peer_data[MK_RA_MAX_RANKS];
  const uint64_t* acc_gate;
  struct mk_gemm_error* err;
  uint32_t err_tag; /* names the op and rank in a timeout record (mk_op_err_tag) */
  uint32_t timeout_ms;
  /* optional (the merged plan, K/V still arriving): this rank's chunk flags, slot j's from
   * j * fps, chunk_rows rows each, and the done word (the call number is *done + 1); the
   * peers' segments then wait for their tiles' chunks (mk_attn_bwd_kv_block.ready_flags) */
  const uint64_t* flags;
  long fps;
  int chunk_rows;
  const uint64_t* done;
  /* optional, the own-last plan (ra_bwd_plan.h; with flags and done): this rank's "partials
   * ready" words by slot (flag index ready_index0 on), which the own block's call waits for
   * before it adds the peers' partials (its acc[src]) into dk, dv; NULL: the other plans */
  const uint64_t* ready;
  uint32_t ready_index0;
};

/* The call's tensors, as ncclMkRingAttentionBackward takes them. */
struct mk_ra_bwd_tensors {
  const void *q, *k, *v, *out;
  const float* lse;
  const void* dout;
  void* dq;
  int batch, s_local, heads, kv_heads, d_head, causal;
  void *dk, *dv; /* the own-last plan writes them in the own block's call */
};

struct mk_ra_bwd_layout;
struct mk_ra_bwd_call;
struct mk_attn_bwd_args;
/* The backward core's arguments for plan call c (ra_bwd_plan.h) of rank ar->rank
 * (ring_attn_bwd.c): its query range, its KV segments (the rank's own k, v or its slots)
 * at their global positions, and where their partial dK / dV go. */
void mk_ra_bwd_core_args(const struct mk_ra_bwd_areas* ar, const struct mk_ra_bwd_layout* l,
                         const struct mk_ra_bwd_call* c, const struct mk_ra_bwd_tensors* t, struct mk_attn_bwd_args* a);

/* Which plan a backward call takes (ra_bwd_plan.h): the own block's calls beside the gather,
 * then the peers'; one merged call per query range beside the gather; (non-causal) the peers'
 * blocks first and the own block last, with no reduce pass; or all of it in one kernel. */
enum mk_ra_bwd_plan_kind { MK_RA_BWD_SPLIT, MK_RA_BWD_MERGED, MK_RA_BWD_OWN_LAST, MK_RA_BWD_ONE_KERNEL };

struct mk_fused_comm;
/* The plan's core calls and their whole arguments, every one checked before anything is
 * launched (ring_attn_bwd.c); ga: the call's ring arguments (mk_ra_fill_args with gave_up),
 * which the one-kernel call's push and words come from. Merged and own-last: the calls' CTAs
 * on a peer's block wait for their chunks (so all of them may run before the gather ends);
 * own-last: the first call launched beside the gather (pdl, its delta and dq_acc zeroing
 * launched before it). Returns the number of calls (*own_calls of them before the join with
 * the gather), or a negative errno. */
int mk_ra_bwd_build_calls(const struct mk_fused_comm* fc, const struct mk_ra_args* ga, const struct mk_ra_bwd_layout* l,
                          void* data, int chunk_rows, enum mk_ra_bwd_plan_kind kind, const struct mk_ra_bwd_tensors* t,
                          struct mk_ra_bwd_call* plan, struct mk_attn_bwd_args* core, int* own_calls);

/* ---- shared by the forward and the backward (ring_attn.c) ------------------------------- */
int mk_ra_shape_check(const char* name, const void* lse, size_t batch, size_t s_local, size_t heads, size_t kv_heads,
                      size_t d_head, int causal);
int mk_ra_comm_check(const struct mk_fused_comm* fc, const char* name, size_t need, int batch, int s_local,
                     long extra_words, int* chunk_rows);
void mk_ra_fill_args(struct mk_fused_comm* fc, int op, const void* k, const void* v, int batch, int s_local,
                     int heads, int kv_heads, int d_head, int causal, int chunk_rows, size_t kv_bytes,
                     struct mk_ra_args* a);

/* The argument rules of ncclMkRingAttention that need no communicator and no GPU (ring_attn.c):
 * the shapes, and out and lse overlapping no input and each other (NULL pointers are left to
 * mk_op_check). 0 or -EINVAL after a WARN. */
int mk_ra_args_check(const void* q, const void* k, const void* v, const void* out, const float* lse, size_t batch,
                     size_t s_local, size_t heads, size_t kv_heads, size_t d_head, int causal);

/* The argument rules of ncclMkRingAttentionBackward that need no communicator and no GPU
 * (ring_attn_bwd.c): 0 or -EINVAL after a WARN. */
int mk_ra_bwd_args_check(const void* q, const void* k, const void* v, const void* out, const float* lse,
                         const void* dout, const void* dq, const void* dk, const void* dv, size_t batch,
                         size_t s_local, size_t heads, size_t kv_heads, size_t d_head, int causal);

/* The chunk flags per slot: batch x ceil(s_local / chunk_rows). */
static inline long mk_ra_flags_per_slot(int batch, int s_local, int chunk_rows) {
  return (long)batch * ((s_local + chunk_rows - 1) / chunk_rows);
}

#ifdef __cplusplus
}
#endif

#endif /* MK_RING_ATTN_H_ */
