/*
 * nccl-mk public API.
 *
 * libnccl-net-mk.so is loaded by NCCL as a net plugin (NCCL_NET_PLUGIN=mk) and, from the
 * same file, offers the fused communication + computation operations declared here.
 * Everything else in the library is private.
 *
 * Every call returns ncclResult_t: ncclSuccess, or the reason it failed, with a one-line
 * WARN through NCCL's logger (NCCL_DEBUG=WARN) naming the argument or the cause.
 */
#ifndef NCCL_MK_H_
#define NCCL_MK_H_

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_MK_VERSION_MAJOR 0
#define NCCL_MK_VERSION_MINOR 1
#define NCCL_MK_VERSION_PATCH 0
#define NCCL_MK_VERSION_CODE(maj, min, pat) ((maj) * 10000 + (min) * 100 + (pat))
#define NCCL_MK_VERSION \
  NCCL_MK_VERSION_CODE(NCCL_MK_VERSION_MAJOR, NCCL_MK_VERSION_MINOR, NCCL_MK_VERSION_PATCH)

#if defined(__GNUC__)
#define NCCL_MK_API __attribute__((visibility("default")))
#else
#define NCCL_MK_API
#endif

/*
 * ncclMkGetVersion: the library's version as NCCL_MK_VERSION_CODE(major, minor, patch).
 * Returns ncclSuccess, or ncclInvalidArgument if version is NULL.
 */
NCCL_MK_API ncclResult_t ncclMkGetVersion(int* version);

/* ---- fused operations ------------------------------------------------------------------
 *
 * Conventions (every op): row-major bf16 operands, fp32 accumulation, bf16 output,
 * C = A . B^T with both A and B K-contiguous (B is a Linear layer's weight, [N, K]).
 * Shapes are per rank: N is the number of output columns this rank computes, K the
 * reduction length it holds. M at least 1 (the MoE ops' tokens may be 0, see there); N and
 * K multiples of 8; pointers 16-byte aligned; every rank issues the fused ops on a
 * communicator in the same order, with the same shapes, like NCCL collectives. Calls are
 * asynchronous on `stream` and can be captured in a CUDA graph. Hopper (sm_90) GPUs only
 * for now; elsewhere ncclInvalidUsage.
 *
 * Return codes shared by the ops: ncclSuccess; ncclInvalidArgument (a NULL pointer, a
 * misaligned pointer, an output overlapping an input or another output (inputs may share
 * memory), a shape that breaks the rules above; nothing was launched and the outputs are
 * untouched; a WARN names the argument); ncclInvalidUsage (the communicator
 * has no ncclMkCommInit, an unsupported type or GPU, or inside graph capture a shape larger
 * than the prepared workspace); ncclRemoteError (an earlier call timed out waiting for a
 * peer: the communicator is broken, see ncclMkCommGetAsyncError); ncclSystemError /
 * ncclUnhandledCudaError (allocation or launch failures).
 */

/* Per-communicator configuration: fill with ncclMkConfigDefaults, then change fields. */
typedef struct {
  size_t size;            /* sizeof(ncclMkConfig): lets later versions add fields */
  unsigned int version;   /* NCCL_MK_VERSION of the header the caller compiled with (0 or
                           * one later than the library's: refused) */
  size_t max_m;           /* largest M (total rows of C) any call will use; default 8192 */
  size_t max_n;           /* largest per-rank N; default 8192 */
  size_t max_k;           /* largest per-rank K; default 8192 (each below 2^31, and
                           * max_m x max(max_n, max_k) at most 2^44) */
  int comm_sms;           /* SMs given to communication; 0: chosen per shape */
  size_t chunk_bytes;     /* reserved: must agree across ranks, not used yet (the ops pick
                           * their own chunks); 0 */
  int timeout_ms;         /* bound on every wait inside a kernel; 0: NCCL_MK_TIMEOUT_MS */
  /* MoE (ncclMkMoeDispatchGemm / ncclMkMoeGemmCombine); 0 in moe_max_tokens: no MoE workspace */
  int moe_max_tokens;     /* largest tokens per rank of a dispatch (moe_max_tokens x moe_max_topk
                           * at most 2^20); default 0; ignored past 8 ranks (no MoE there) */
  int moe_max_hidden;     /* largest hidden size; default 0 */
  int moe_max_topk;       /* largest experts per token; default 0 */
  int moe_max_recv_rows;  /* bound on the (token, local expert) rows one rank receives; 0: the
                           * worst case, nranks * moe_max_tokens * moe_max_topk */
  int moe_dispatch_fp8;   /* 1: dispatched rows move as e4m3 with one scale per token (half the
                           * bytes; see ncclMkMoeDispatchGemm); 0 (default): bf16 */
  int reserved[11];
} ncclMkConfig;

/* Fills *config with the defaults above. ncclInvalidArgument if config is NULL. */
NCCL_MK_API ncclResult_t ncclMkConfigDefaults(ncclMkConfig* config);

/*
 * ncclMkCommInit: prepares `comm` for fused ops: workspaces sized from config (NULL: the
 * defaults), shared with the peers of this host through CUDA IPC (direct pointers between
 * GPUs of one process); ranks on other nodes (or emulated ones, NCCL_MK_LOCAL_SIZE) are
 * reached through a proxy thread it starts (pinned host buffers of max_m x max(max_k,
 * 3 max_n) bf16; every rank falls back to the reference paths when some cannot start one).
 * It also loads every kernel the ops launch, so that no op's first call waits for a lazy
 * module load (which waits for every kernel running on the device).
 * Collective over `comm`, like ncclCommInitRank: every rank calls it, with ranks on several
 * nodes each from its own thread or process. It succeeds on every rank or fails on every rank:
 * a rank whose init fails (a refused config, an allocation) still joins the ranks' exchange,
 * and the others then fail with ncclRemoteError, their WARN naming it; configs that differ
 * between ranks in what chooses a call's path (max_m/n/k, comm_sms, chunk_bytes, moe_*,
 * NCCL_MK_FUSED; not timeout_ms) fail every rank with ncclInvalidArgument. Must be called
 * outside graph capture; safe inside ncclGroupStart/End when one thread drives several GPUs of
 * one node (the caller's group is respected: the exchange then ends at the group's end, and a
 * peer's failed init is reported by the first fused call, which may sit in a group of the
 * caller's and so runs no collective of its own: a failure to map the peers' workspaces found
 * there fails that rank's calls only; a rank that failed inside a group keeps
 * its exchange buffers until ncclMkCommRelease, which it must call before another init).
 * Calling it again on the same comm is ncclInvalidUsage. Returns ncclSuccess,
 * ncclInvalidArgument (comm NULL, bad config size/fields, configs that differ),
 * ncclInvalidUsage (already initialised, inside capture, no NCCL 2.19+ in the process, not a
 * Hopper GPU), ncclRemoteError (another rank's init failed), ncclSystemError/
 * ncclUnhandledCudaError (allocation, IPC, kernel load).
 */
NCCL_MK_API ncclResult_t ncclMkCommInit(ncclComm_t comm, const ncclMkConfig* config);

/* Frees what ncclMkCommInit made; call before ncclCommDestroy (nccl-mk knows a communicator
 * by its address: one destroyed without it leaves state that a new communicator NCCL places at
 * the same address would meet, and its ncclMkCommInit fails saying so). Not collective while every
 * rank is reachable by load/store (one node). With ranks on other nodes (or emulated ones,
 * NCCL_MK_LOCAL_SIZE) every rank must call it: it waits for the GPU, then up to
 * NCCL_MK_TIMEOUT_MS for the other ranks' release, then stops the proxy thread and closes its
 * connections (with a WARN, without waiting further, when a rank never came). Returns
 * ncclSuccess, ncclInvalidArgument (comm not initialised for fused ops), or ncclInvalidUsage
 * when ncclMkCommInit ran inside ncclGroupStart/End and that group has not ended (its exchange
 * would write into the freed buffers: call ncclGroupEnd first). */
NCCL_MK_API ncclResult_t ncclMkCommRelease(ncclComm_t comm);

/* ncclMkCommGetProxyBytes: the data bytes this rank's proxy has put to ranks outside its
 * local team since ncclMkCommInit (0 when every rank is local): the cross-node path's
 * traffic, for tests and harnesses. ncclSuccess, ncclInvalidArgument (NULL argument) or
 * ncclInvalidUsage (comm not initialised for fused ops). */
NCCL_MK_API ncclResult_t ncclMkCommGetProxyBytes(ncclComm_t comm, uint64_t* bytes);

/*
 * ncclMkCommGetAsyncError: ncclSuccess in *result while the communicator is healthy;
 * ncclRemoteError once a kernel gave up waiting for a peer (or a MoE dispatch received more
 * rows than moe_max_recv_rows, or the cross-node proxy failed), and then `msg` (if not NULL)
 * gets a one-line account: the rank, the op by name, what the wait was for (a tile, or e.g.
 * "a peer's token counts"), the flag and its expected and seen values, e.g.
 *   rank 0: ncclMkAllGatherGemm (op 0x1) timed out at tile 2 waiting for flag 2: expected 2, seen 1
 * The account is of the first wait that gave up, all of its fields from that one wait, also
 * when many expired together. Every later fused call on the comm returns that error. Does not
 * synchronise the stream, and runs no collective (safe from a watchdog thread): after an init
 * inside ncclGroupStart/End its exchange is finished by the first fused call, and a failure
 * found there (a peer's init, a mapping) is reported in *result from then on.
 */
NCCL_MK_API ncclResult_t ncclMkCommGetAsyncError(ncclComm_t comm, ncclResult_t* result,
                                                 char* msg, size_t msg_len);

/*
 * ncclMkAllGatherGemm: C[M, N] = AllGather(A_r)[M, K] . B[N, K]^T.
 * a_shard: this rank's rows, [M / nranks, K]; b: [N, K]; c: [M, N].
 * a_gathered: optional ([M, K]); when not NULL it receives the gathered A (backward needs it).
 * M must be a multiple of the number of ranks.
 * Not between ncclGroupStart and ncclGroupEnd: inside a group NCCL defers its collectives to
 * ncclGroupEnd (NCCL's rule for every stream operation that depends on one), which would
 * put the gather after the GEMM. GEMM+ReduceScatter and GEMM+AllReduce may be grouped, one
 * call per communicator in a group (the reference path's partial C is the communicator's
 * scratch: a second call would overwrite it before the deferred collective read it).
 */
NCCL_MK_API ncclResult_t ncclMkAllGatherGemm(const void* a_shard, const void* b, void* c,
                                             void* a_gathered, size_t m, size_t n, size_t k,
                                             ncclDataType_t type, ncclComm_t comm,
                                             cudaStream_t stream);

/*
 * ncclMkGemmReduceScatter: C_r[M / nranks, N] = rows r of sum over ranks of A[M, K] . B[N, K]^T.
 * a: [M, K] (this rank's K-slice of the full reduction), b: [N, K], c_shard: [M / nranks, N].
 * M must be a multiple of the number of ranks.
 */
NCCL_MK_API ncclResult_t ncclMkGemmReduceScatter(const void* a, const void* b, void* c_shard,
                                                 size_t m, size_t n, size_t k,
                                                 ncclDataType_t type, ncclComm_t comm,
                                                 cudaStream_t stream);

/* ncclMkGemmAllReduce: C[M, N] = sum over ranks of A[M, K] . B[N, K]^T on every rank. */
NCCL_MK_API ncclResult_t ncclMkGemmAllReduce(const void* a, const void* b, void* c, size_t m,
                                             size_t n, size_t k, ncclDataType_t type,
                                             ncclComm_t comm, cudaStream_t stream);

/* ---- sequence parallelism ----------------------------------------------------------------
 *
 * ncclMkRingAttention: forward attention over a sequence split across the ranks (ring
 * attention), one kernel per rank and call. Rank r holds its part of the sequence:
 * q, out [B, S_local, H, D]; k, v [B, S_local, H_kv, D] (bf16, row-major; head h reads kv head
 * h / (H / H_kv)); it gets out and, when lse is not NULL, lse [B, H, S_local] (fp32, the natural
 * log of the sum over visible keys of exp(q.k / sqrt(D)), for the backward pass). The whole
 * sequence has S = nranks x S_local tokens.
 *   causal = 0: every query sees every key; the split does not matter (rank r's rows are
 *               usually tokens r x S_local ..).
 *   causal = 1: the zigzag split: the sequence is cut into 2 nranks chunks of S_local / 2
 *               tokens and rank r holds chunks r and 2 nranks - 1 - r, in that order, as its
 *               S_local rows (so every rank has the same work); a query sees the keys at or
 *               before its position. S_local must be even.
 * D = 64 or 128; B, H in [1, 65535]; H a multiple of H_kv; B x S_local below 2^31; B at most
 * 4032 / (nranks - 1) (the backward: (4032 - nranks) / (nranks - 1)): the communicator's K/V
 * chunk flags, one per peer and sequence at the least; q, k, v, out 16-byte aligned, lse 4-byte
 * aligned; out and lse must not overlap q, k, v or each other (refused); type ncclBfloat16. Every rank calls it with the same
 * shapes, as a collective. Needs 2 to 8 ranks, all on one host, NCCL_MK_FUSED=1 at
 * ncclMkCommInit, and a workspace (ncclMkConfig: max_m x max(max_n, max_k) x 2 bytes) of at
 * least (nranks - 1) x 2 x B x S_local x H_kv x D x 2 bytes for the peers' K and V.
 * Returns ncclSuccess; ncclInvalidArgument (NULL or misaligned pointer, overlapping outputs, a
 * shape outside the rules above, comm NULL; nothing launched, outputs untouched);
 * ncclInvalidUsage (no ncclMkCommInit, a type other than bf16, a non-Hopper GPU, a rank count
 * or placement outside the rules, no fused workspace, the workspace too small); ncclRemoteError
 * (an earlier fused call timed out: the communicator is broken, see ncclMkCommGetAsyncError);
 * ncclSystemError (launch failure). A wait for a peer's K/V is bounded by ncclMkConfig.timeout_ms: on expiry
 * the kernel ends, out is not valid, and the communicator reports ncclRemoteError.
 */
NCCL_MK_API ncclResult_t ncclMkRingAttention(const void* q, const void* k, const void* v, void* out,
                                             float* lse, size_t batch, size_t s_local,
                                             size_t heads, size_t kv_heads, size_t d_head,
                                             int causal, ncclDataType_t type, ncclComm_t comm,
                                             cudaStream_t stream);

/*
 * ncclMkRingAttentionBackward: the gradients of ncclMkRingAttention (issue 12). Given q, k, v,
 * out, lse as the forward took and left them and dout (the gradient of out; like out), rank r
 * gets dq [B, S_local, H, D] of its query rows and dk, dv [B, S_local, H_kv, D] of the keys and
 * values it holds (summed over every rank's queries). Same shapes, split (causal: zigzag,
 * S_local even), rank rules and workspace as the forward, and the same arguments: bf16 and
 * 16-byte aligned q, k, v, out, dout, dq, dk, dv (the outputs must not overlap the inputs or
 * each other: refused);
 * lse fp32, 4-byte aligned, required. Every rank calls it with the same shapes, as a collective.
 * Workspace (ncclMkConfig: max_m x max(max_n, max_k) x 2 bytes) of at least, in bytes, with
 * KV = B x S_local x H_kv x D: (nranks - 1) x 2 x KV x 2 (the peers' K and V) + nranks x 2 x KV
 * x 4 (fp32 dK/dV partials) + B x H x S_local x 4 + B x S_local x H x D x 4 (each rounded up to
 * 256). By default not one kernel: 4 launches plus 2 or 3 per backward-core call (1 with
 * NCCL_MK_RA_BWD_ONE_LAUNCH=1; graph capturable; fused/ring_attn/ring_attn_bwd.c).
 * NCCL_MK_RA_BWD_ONE_KERNEL=1 makes a call on 2-4 ranks (causal: S_local a multiple of 256) one
 * kernel, correct but slower (README).
 * Returns ncclSuccess; ncclInvalidArgument (NULL or misaligned pointer, overlapping outputs, a
 * shape outside the rules, comm NULL; nothing launched, outputs untouched); ncclInvalidUsage
 * (no ncclMkCommInit, a type other than bf16, a non-Hopper GPU, a rank count or placement
 * outside the rules, no fused workspace, the workspace too small); ncclRemoteError (an earlier
 * fused call timed out: the communicator is broken, see ncclMkCommGetAsyncError);
 * ncclSystemError (launch failure). A wait for a peer (its K/V, its dK/dV partials) is bounded by ncclMkConfig.timeout_ms: on
 * expiry the kernels end, dq, dk, dv are not valid, and the communicator reports ncclRemoteError.
 */
NCCL_MK_API ncclResult_t ncclMkRingAttentionBackward(const void* q, const void* k, const void* v,
                                                     const void* out, const float* lse,
                                                     const void* dout, void* dq, void* dk, void* dv,
                                                     size_t batch, size_t s_local, size_t heads,
                                                     size_t kv_heads, size_t d_head, int causal,
                                                     ncclDataType_t type, ncclComm_t comm,
                                                     cudaStream_t stream);

/* ---- MoE expert parallelism --------------------------------------------------------------
 *
 * Every rank of the communicator is one expert-parallel rank. With E experts in all, rank r
 * owns the E_local = E / nranks consecutive experts [r * E_local, (r + 1) * E_local). A token
 * goes once to each rank that owns at least one of its experts; there it becomes one row per
 * (token, local expert), rows grouped by local expert. Routing is read on the GPU: no call
 * synchronises with the host, so a whole MoE layer can be captured in a CUDA graph. Expert
 * ids outside [0, E) in topk_idx mask their slot (it gets no row and adds nothing).
 * Needs ncclMkConfig.moe_* at ncclMkCommInit and, for now, every rank on one host
 * (ncclInvalidUsage otherwise). Return codes as for the dense ops; ncclRemoteError also
 * when a dispatch received more rows than moe_max_recv_rows (the layout is then empty).
 * A rank may have tokens = 0 in a call while its peers have some: it must still make the
 * call (its peers wait for it), receives and serves their rows, and gets nothing back. Its
 * token-side pointers (x, topk_idx; topk_weights, out) are then not read, not written and
 * not checked (NULL is fine); the expert-side ones (w1, act; act, w2) are required as ever.
 */
typedef struct ncclMkMoeLayout* ncclMkMoeLayout_t;

/* A routing layout for `comm` (device memory sized from its config): written by a dispatch,
 * read by the combine of the same tokens; refused by the ops after a later ncclMkCommInit of
 * the communicator (create it again then). Not collective. ncclSuccess, ncclInvalidArgument
 * (NULL argument), ncclInvalidUsage (no ncclMkCommInit or no MoE workspace configured),
 * ncclSystemError (allocation). */
NCCL_MK_API ncclResult_t ncclMkMoeLayoutCreate(ncclComm_t comm, ncclMkMoeLayout_t* layout);
/* Frees a layout; its last dispatch and combine must have completed. ncclInvalidArgument for
 * NULL or a handle that is not a live layout (destroyed already: nothing is freed twice). */
NCCL_MK_API ncclResult_t ncclMkMoeLayoutDestroy(ncclMkMoeLayout_t layout);

/* What a layout holds after a dispatch, as device pointers (valid once the dispatch ran). */
typedef struct {
  const int* group_offsets;  /* [experts_local + 1]: local expert j owns rows
                              * [group_offsets[j], group_offsets[j + 1]) of act */
  const int* row_source;     /* [max_recv_rows][3]: each row's source rank, token index on
                              * that rank and top-k slot */
  const unsigned long long* rows_sent; /* rows this rank sent to other ranks (deduplicated) */
  int max_recv_rows;
  int experts_local;         /* of the last dispatch */
} ncclMkMoeLayoutInfo;
NCCL_MK_API ncclResult_t ncclMkMoeLayoutGetInfo(ncclMkMoeLayout_t layout, ncclMkMoeLayoutInfo* info);

/*
 * ncclMkMoeDispatchGemm: dispatch x to the experts' ranks and run the first grouped GEMM.
 * x: [tokens, hidden]; topk_idx: int32 [tokens, topk] (global expert ids); w1: the local
 * experts' first weight, [E_local, inter, hidden] (gate and up fused: inter = 2I);
 * act: [max_recv_rows, inter], row i = (its token's x) . w1[its expert]^T, rows grouped by
 * local expert as `layout` says; rows past the last are not written. With
 * ncclMkConfig.moe_dispatch_fp8, x rows (every one, also those a rank keeps) are quantized per
 * token before they move and dequantized before the GEMM: amax = max |x_i|, inv = 448 / amax,
 * scale = amax / 448 (0 for a zero row), q_i = e4m3(x_i * inv) (round to nearest, saturating),
 * the GEMM reads bf16(float(q_i) * scale).
 * num_experts: E, a multiple of nranks; hidden and inter multiples of 8; tokens from 0 to
 * moe_max_tokens (0: x and topk_idx may be NULL, see above).
 */
NCCL_MK_API ncclResult_t ncclMkMoeDispatchGemm(const void* x, const int* topk_idx, const void* w1,
                                               void* act, size_t tokens, size_t hidden, size_t inter,
                                               int topk, int num_experts, ncclMkMoeLayout_t layout,
                                               ncclDataType_t type, ncclComm_t comm,
                                               cudaStream_t stream);

/*
 * ncclMkMoeGemmCombine: the second grouped GEMM on the rows of the layout's dispatch, each
 * output row sent back to its token's rank, and there
 * out[t] = sum over slots s of topk_weights[t, s] * row(t, s) (fp32 sum, one bf16 rounding).
 * act: [max_recv_rows, inter] (the first GEMM's output after the activation); w2: [E_local,
 * hidden, inter]; topk_weights: float [tokens, topk]; out: [tokens, hidden]. tokens, topk and
 * the expert count are the dispatch's (another tokens: ncclInvalidArgument); with tokens = 0,
 * topk_weights and out may be NULL. A token all of whose slots are masked gets zeros.
 */
NCCL_MK_API ncclResult_t ncclMkMoeGemmCombine(const void* act, const void* w2, const float* topk_weights,
                                              void* out, size_t tokens, size_t hidden, size_t inter,
                                              ncclMkMoeLayout_t layout, ncclDataType_t type,
                                              ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_MK_H_ */
