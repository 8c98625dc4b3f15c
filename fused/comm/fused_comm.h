/*
 * Per-communicator state of the fused ops (DESIGN.md "Fused-op state is created
 * explicitly"): found by the caller's ncclComm_t, made by ncclMkCommInit, freed by
 * ncclMkCommRelease.
 *
 * Symmetric workspace layout (every rank allocates the same size; local peers map it):
 *   flags: MK_FUSED_FLAG_BYTES of words, flags and schedules, zeroed at init:
 *          [0, 64 KiB)   the call counters (shared by every overlapped op: a peer writes our
 *                        data area only after our previous call, of any op, is done) and
 *                        AllGather+GEMM's flags and tables (fused/ag_gemm/ag_push.h)
 *          [64, 96 KiB)  GEMM+ReduceScatter/AllReduce counters (fused/gemm_rs/rs_comm.h)
 *   data:  max_m × max(max_k, max_n) × 2 B with NCCL_MK_FUSED=1 (AllGather+GEMM's gathered A,
 *          GEMM+ReduceScatter's partial sums from the peers), else none
 *   moe:   the MoE ops' area (fused/moe/moe.h) when ncclMkConfig.moe_max_tokens > 0
 */
#ifndef MK_FUSED_COMM_H_
#define MK_FUSED_COMM_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm.h"
#include "moe.h"
#include "nccl_api.h"
#include "nccl_mk.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MK_FUSED_FLAG_BYTES (128 << 10)

/* What each rank tells the others at init (gathered with ncclAllGather). A build whose record
 * differs says another version: its ranks are refused, not misread. */
#define MK_PEER_RECORD_VERSION 2
struct mk_peer_record {
  uint32_t version;   /* MK_PEER_RECORD_VERSION: first, so that any other build's is seen (the
                       * size stays while ncclMkConfig keeps its size: it grows into reserved) */
  uint32_t reserved0;
  uint64_t host_hash; /* same value = same host (hostname and boot id) */
  int32_t pid;
  int32_t dev;
  uint64_t sym_ptr;   /* the workspace's address in its own process */
  uint64_t sym_bytes;
  cudaIpcMemHandle_t sym_handle;
  int32_t init_error;          /* its ncclMkCommInit's own failure (positive errno), else 0 */
  int32_t fused;               /* NCCL_MK_FUSED */
  int32_t reserved;
  ncclMkConfig config;         /* every rank's must match (mk_peer_records_agree) */
};

struct mk_fused_comm {
  ncclComm_t nccl;
  const struct mk_nccl_api* api;
  int rank, nranks, dev;
  ncclMkConfig cfg;
  cudaStream_t internal;        /* the init exchange */
  cudaStream_t side;            /* the fused ops' communication kernels */
  cudaEvent_t ev_fork, ev_join; /* main stream -> side stream -> main stream */
  int num_sms;                  /* the GPU's multiprocessors */
  int fused;                    /* NCCL_MK_FUSED: the overlapped paths, data area allocated */
  void* sym;                    /* symmetric workspace, MK_FUSED_FLAG_BYTES + data */
  size_t sym_bytes;
  void** peer_sym;              /* [nranks]: a local peer's workspace, NULL if remote */
  int* peer_opened;             /* [nranks]: 1 when peer_sym came from cudaIpcOpenMemHandle */
  int local_size;               /* ranks reachable by load/store, self included */
  int exchange_pending;         /* the gathered records are not read yet (atomic: read
                                 * without exchange_lock on every call's fast path) */
  int exchange_failed;          /* a deferred exchange's error, or this rank's init failure
                                 * inside a group: every later call refuses (a failed exchange
                                 * may have mapped some peers, and must not run twice) */
  int records_read;             /* the gathered records were read: records_dev's slots are
                                 * free for later exchanges (xnode.c) */
  pthread_mutex_t exchange_lock; /* one finisher of a deferred exchange: first ops from
                                  * several threads may race */
  struct mk_peer_record* records_dev;
  struct mk_peer_record* records_host; /* pinned, [nranks] */
  void* scratch;                /* local scratch of the reference path; grows outside capture */
  size_t scratch_bytes;
  struct mk_gemm_error* err;    /* host-mapped: kernels report timeouts here */
  uint32_t* err_claim;          /* device: err->claim, the record's one writer */
  int broken;
  struct mk_trace_state* trace; /* NCCL_MK_TRACE=1 only (trace_comm.c), else NULL */
  size_t moe_offset, moe_bytes; /* the MoE area in sym (fused/moe/moe.h); 0 bytes: none */
  struct mk_moe_geom moe_geom;  /* its layout, from the config at init */
  int ag_shard_blocks;          /* row-blocks per shard of the last overlapped AllGather+GEMM
                                 * (a hang report names the peer that owed a row-block) */
  int rs_shard_blocks;          /* the same for the last overlapped GEMM+ReduceScatter/AllReduce */
  int ra_flags_per_slot;        /* chunk flags per K/V slot of the last ring attention call */
  struct mk_xnode* xn;          /* ranks outside the local team: the proxy (xnode.c); else NULL */
  uint64_t generation;          /* this init's number in the process (registry_add): what a MoE
                                 * layout was sized from, even at a reused comm address */
};

/* The data area's bytes: after the flags, before the MoE area (which follows it when the
 * config asks for MoE): what the overlapped paths' slots may fill. */
static inline size_t mk_fused_data_bytes(const struct mk_fused_comm* fc) {
  const size_t end = fc->moe_bytes ? fc->moe_offset : fc->sym_bytes;
  return end > MK_FUSED_FLAG_BYTES ? end - MK_FUSED_FLAG_BYTES : 0;
}

/* ncclMkCommInit's config (api.c): the caller's (NULL: the defaults) checked into *cfg; 0 or
 * -EINVAL with a WARN naming the field. *cfg is always usable (the defaults when the caller's
 * cannot be read). Pure (unit-tested). */
int mk_config_read(const ncclMkConfig* config, ncclMkConfig* cfg);
/* ncclMkCommInit's work; 0 or negative errno. config_rc: the config's check (api.c); when it
 * failed, the exchange still runs, carrying the failure to the peers (which would otherwise
 * wait in it for ever), and nothing is sized from the config. */
int mk_fused_comm_create(ncclComm_t comm, const ncclMkConfig* cfg, int config_rc);
/* ncclMkCommRelease's work. */
int mk_fused_comm_destroy(ncclComm_t comm);
/* The state of `comm`, with the exchange finished if it still was pending (which needs to
 * be outside graph capture: `stream` is the caller's, used only to detect capture).
 * -ENOTSUP with a WARN when the comm was never initialised. */
int mk_fused_comm_get(ncclComm_t comm, cudaStream_t stream, struct mk_fused_comm** out);
/* For a call refused by its argument checks: finishes the exchange of an ncclMkCommInit made
 * inside a group if it is still pending, as a valid first call would. Across nodes that
 * exchange runs collectives (xnode.c) which the peers' first calls wait in, valid or not; a
 * rank whose first call was refused must not leave them there. Its failure is kept for the
 * next call (exchange_failed); nothing happens for a comm without ncclMkCommInit. */
void mk_fused_comm_settle(ncclComm_t comm, cudaStream_t stream);
/* The state of `comm` as it is, for the queries (ncclMkCommGetAsyncError, GetProxyBytes): a
 * pending exchange is left to the ops, which run the collectives in the caller's order (a
 * watchdog thread's query must not run one). -ENOTSUP with a WARN when never initialised. */
int mk_fused_comm_lookup(ncclComm_t comm, struct mk_fused_comm** out);
/* -ECONNRESET once a kernel reported a timeout (and *msg describes it), else 0. */
int mk_fused_comm_health(struct mk_fused_comm* fc, char* msg, size_t len);
/* Grows the reference path's scratch to `bytes` (outside capture only). */
int mk_fused_scratch(struct mk_fused_comm* fc, cudaStream_t stream, size_t bytes, void** out);

/* trace_comm.c: the trace buffer (NCCL_MK_TRACE). open/close at init/release (no-ops when
 * tracing is off). Around a traced launch: begin gives the pointer to pass to the kernel
 * (NULL when off), end copies the events out and writes this rank's file. hang writes the
 * hang report for a timed-out wait (peer -1 when the op cannot name the peer). */
struct mk_trace_buf;
int mk_trace_comm_open(struct mk_fused_comm* fc);
void mk_trace_comm_close(struct mk_fused_comm* fc);
int mk_trace_comm_begin(struct mk_fused_comm* fc, uint32_t op, uint32_t m, uint32_t n,
                        cudaStream_t stream, struct mk_trace_buf** dev);
int mk_trace_comm_end(struct mk_fused_comm* fc, cudaStream_t stream);
/* account: the error's text (err_text.c), the report's account line */
int mk_trace_comm_hang(struct mk_fused_comm* fc, const struct mk_gemm_error* e, const char* account, int peer,
                       uint64_t peer_progress, const char* progress_what);
/* ag_gemm.c: the peer an overlapped AllGather+GEMM's timed-out wait depended on, with its
 * progress as this rank sees it (*what says what it counts); -1 when unknown. */
int mk_ag_gemm_hang_peer(struct mk_fused_comm* fc, const struct mk_gemm_error* e, uint64_t* progress,
                         char* what, size_t what_len);

/* ring_attn.c: the same for ncclMkRingAttention's waits (chunk flags, a peer's done word). */
int mk_ra_hang_peer(struct mk_fused_comm* fc, const struct mk_gemm_error* e, uint64_t* progress, char* what,
                    size_t what_len);
/* Its pure part: the peer a ring attention wait on rank `rank` of nranks depended on (fps: K/V
 * chunk flags per slot) and what it waited for (*kind), or -1 with none (a wait on the call's
 * own CTAs, or a flag past the ranks). */
enum mk_ra_hang_kind { MK_RA_HANG_DONE, MK_RA_HANG_READY, MK_RA_HANG_CHUNK };
int mk_ra_hang_source(const struct mk_gemm_error* e, int rank, int nranks, int fps, enum mk_ra_hang_kind* kind);

/* peer_mem.c: the exchange of workspaces between the ranks of a host. *local_rc: this rank's
 * init so far (0, or the negative errno that every rank's init then fails with); the post's
 * own failure to describe the workspace is added to it. */
int mk_peer_exchange_post(struct mk_fused_comm* fc, int* local_rc);
/* 1 once the exchange's gather has run (it may wait for the caller's ncclGroupEnd), 0 before,
 * negative errno when that cannot be read. */
int mk_peer_exchange_ran(struct mk_fused_comm* fc);
/* Every rank's record says its init went well and it has this rank's config and build (records:
 * nranks, gathered): 0; this rank's own failure, -ECONNRESET for a peer's, -EINVAL for a config,
 * workspace or record version that differs (WARNs name the rank and the fields). Pure
 * (unit-tested). */
int mk_peer_records_agree(const struct mk_peer_record* records, int nranks, int rank);
/* Each rank's error (positive errno, 0: none) at `base` + p x `stride` bytes: this rank's own
 * (negative), -ECONNRESET with a WARN naming the first peer that failed `stage`, or 0. Pure. */
int mk_peer_errors_agree(const void* base, size_t stride, int nranks, int rank, const char* stage);
/* 0 when done (or already done), -EAGAIN when the caller's NCCL group has not launched the
 * exchange yet, other negative errno on failure. eager: ncclMkCommInit's own finish, which may
 * run one more collective (every rank's mapping result); a finish at the first op may not (the
 * op may sit inside the caller's group, which would hold that gather back). */
int mk_peer_exchange_finish(struct mk_fused_comm* fc, int eager);
void mk_peer_close(struct mk_fused_comm* fc);

/* xnode.c: the cross-node state (fused/proxy/xnode.h). setup (collective, after the workspace
 * exchange; a no-op when every rank is local) starts the proxy, or on every rank none when some
 * rank cannot (the ops then take their reference paths); `failed` (negative errno): this rank's
 * exchange failed already (its first call's mapping) and it joins the exchanges so that its
 * peers do not wait in them; they learn of it there and fail too (-ECONNRESET), as an init
 * outside a group fails every rank; release says goodbye to the peers (no
 * collective) and stops it. view: the kernels' state, the remote ranks (< 32) as a bit mask and
 * the regions' GPU views; -ENOENT (all zero) when no proxy runs. sent_bytes: data bytes the
 * proxy's puts completed, all peers. error: the proxy's failure (0 while healthy), described
 * in msg. MK_XNODE_ERR_TAG marks a proxy failure in the error record's tag. */
#define MK_XNODE_ERR_TAG 0xFFFFFF00u
struct mk_xnode;
struct mk_xnode_dev;
int mk_xnode_setup(struct mk_fused_comm* fc, int failed);
void mk_xnode_release(struct mk_fused_comm* fc);
struct mk_xnode_view {
  struct mk_xnode_dev* dev;
  char* bounce;       /* the bounce buffer, GPU view */
  uint64_t* flags;    /* the flag region, GPU view */
  size_t bounce_bytes;
  uint32_t remote_mask;
};
int mk_xnode_view(const struct mk_fused_comm* fc, struct mk_xnode_view* v);
uint64_t mk_xnode_sent_bytes(const struct mk_fused_comm* fc);
int mk_xnode_error(const struct mk_fused_comm* fc, char* msg, size_t len);

/* 1 when `stream` (or the legacy stream when NULL) is being captured into a graph. */
int mk_stream_capturing(cudaStream_t stream);
/* CUDA error as negative errno with a WARN naming the call. */
int mk_cuda_check(cudaError_t err, const char* what);
/* Copies `bytes` of device memory to the host on fc's internal stream, which waits for no
 * other stream (a plain cudaMemcpy waits for the legacy stream, where a caller's work may be
 * stuck behind a dead peer: the hang report must not wait on it). cudaSuccess or the error. */
cudaError_t mk_fused_read(const struct mk_fused_comm* fc, void* dst, const void* src, size_t bytes);
/* Every rank's `bytes`-byte record (this rank's: mine) into all[nranks], by ncclAllGather on
 * fc's comm through dev (device memory of nranks + 1 records) on the internal stream; what:
 * the exchange's name in errors. 0 or negative errno. */
int mk_fused_allgather(struct mk_fused_comm* fc, void* dev, const void* mine, size_t bytes, void* all, const char* what);

#ifdef __cplusplus
}
#endif

#endif /* MK_FUSED_COMM_H_ */
