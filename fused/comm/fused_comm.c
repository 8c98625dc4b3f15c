/* The registry of fused-op communicators, their creation and release. */
#include "fused_comm.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_push.h"
#include "attn.h"
#include "err_text.h"
#include "gemm_rs.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "moe.h"
#include "op_check.h"
#include "ring_attn.h"

#define MK_FUSED_MAX_COMMS 1024

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mk_fused_comm* registry[MK_FUSED_MAX_COMMS];

int mk_cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return 0;
  cudaGetLastError(); /* clear it: nothing sticky was left by a failed API call */
  MK_WARN("%s failed: %s", what, cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return -ENOMEM;
  if (err == cudaErrorStreamCaptureUnsupported || err == cudaErrorStreamCaptureInvalidated ||
      err == cudaErrorStreamCaptureImplicit)
    return -ENOTSUP;
  return -EIO;
}

int mk_stream_capturing(cudaStream_t stream) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return st != cudaStreamCaptureStatusNone;
}

static struct mk_fused_comm** registry_slot(ncclComm_t comm) {
  for (int i = 0; i < MK_FUSED_MAX_COMMS; i++)
    if (registry[i] && registry[i]->nccl == comm) return &registry[i];
  return NULL;
}

/* comm's state, or NULL; with `take`, out of the registry (one release gets it). */
static struct mk_fused_comm* registry_get(ncclComm_t comm, int take) {
  pthread_mutex_lock(&registry_lock);
  struct mk_fused_comm** slot = registry_slot(comm);
  struct mk_fused_comm* fc = slot ? *slot : NULL;
  if (slot && take) *slot = NULL;
  pthread_mutex_unlock(&registry_lock);
  return fc;
}

/* A new state gets the next generation; one put back after a refused release keeps its own
 * (its MoE layouts stay valid). */
static int registry_add(struct mk_fused_comm* fc) {
  static uint64_t generations;
  pthread_mutex_lock(&registry_lock);
  int rc = -ENOSPC;
  if (registry_slot(fc->nccl)) {
    rc = -EEXIST;
  } else {
    for (int i = 0; i < MK_FUSED_MAX_COMMS && rc == -ENOSPC; i++)
      if (!registry[i]) registry[i] = fc, fc->generation = fc->generation ? fc->generation : ++generations, rc = 0;
  }
  pthread_mutex_unlock(&registry_lock);
  return rc;
}

static void fused_comm_free(struct mk_fused_comm* fc) {
  mk_xnode_release(fc);
  mk_peer_close(fc);
  mk_trace_comm_close(fc);
  /* stream-ordered like its allocation (mk_fused_scratch), before the stream goes */
  if (fc->scratch) cudaFreeAsync(fc->scratch, fc->internal);
  if (fc->internal) cudaStreamSynchronize(fc->internal), cudaStreamDestroy(fc->internal);
  if (fc->side) cudaStreamDestroy(fc->side);
  if (fc->ev_fork) cudaEventDestroy(fc->ev_fork);
  if (fc->ev_join) cudaEventDestroy(fc->ev_join);
  cudaFree(fc->sym);
  cudaFree(fc->records_dev);
  cudaFreeHost(fc->records_host);
  cudaFreeHost(fc->err);
  cudaFree(fc->err_claim);
  free(fc->peer_sym);
  free(fc->peer_opened);
  pthread_mutex_destroy(&fc->exchange_lock);
  free(fc);
}

/* What the workspace exchange needs, taken before anything sized from the config: an init
 * that fails after this still joins the exchange, and its peers learn of the failure. */
static int fused_comm_exchange_alloc(struct mk_fused_comm* fc) {
  size_t nr = (size_t)fc->nranks;
  fc->peer_sym = calloc(nr, sizeof(void*));
  fc->peer_opened = calloc(nr, sizeof(int));
  if (!fc->peer_sym || !fc->peer_opened) return -ENOMEM;
  MK_CHECK(mk_cuda_check(cudaStreamCreateWithFlags(&fc->internal, cudaStreamNonBlocking),
                         "cudaStreamCreate"));
  MK_CHECK(mk_cuda_check(cudaMalloc((void**)&fc->records_dev,
                                    (nr + 1) * sizeof(struct mk_peer_record)),
                         "cudaMalloc (records)"));
  return mk_cuda_check(cudaHostAlloc((void**)&fc->records_host, nr * sizeof(struct mk_peer_record),
                                     cudaHostAllocDefault), "cudaHostAlloc (records)");
}

static int fused_comm_alloc(struct mk_fused_comm* fc) {
  size_t widest = fc->cfg.max_k > fc->cfg.max_n ? fc->cfg.max_k : fc->cfg.max_n;
  fc->sym_bytes = MK_FUSED_FLAG_BYTES + (fc->fused ? fc->cfg.max_m * widest * 2 : 0);
  if (fc->cfg.moe_max_tokens > 0 && fc->nranks <= MK_MOE_MAX_RANKS) {
    ncclMkConfig* c = &fc->cfg;
    if (!c->moe_max_recv_rows) c->moe_max_recv_rows = fc->nranks * c->moe_max_tokens * c->moe_max_topk;
    fc->moe_geom = (struct mk_moe_geom){.nranks = fc->nranks, .max_tokens = c->moe_max_tokens,
                                        .max_hidden = c->moe_max_hidden, .max_topk = c->moe_max_topk,
                                        .max_recv_rows = c->moe_max_recv_rows};
    fc->moe_offset = (fc->sym_bytes + 255) & ~(size_t)255;
    fc->moe_bytes = mk_moe_geom_layout(&fc->moe_geom);
    fc->sym_bytes = fc->moe_offset + fc->moe_bytes;
  } else if (fc->cfg.moe_max_tokens > 0) {
    MK_WARN("ncclMkCommInit: the MoE ops take at most %d ranks, this communicator has %d: no MoE workspace "
            "(moe_max_tokens ignored; ncclMkMoeLayoutCreate will refuse)", MK_MOE_MAX_RANKS, fc->nranks);
  }
  MK_CHECK(mk_cuda_check(cudaStreamCreateWithFlags(&fc->side, cudaStreamNonBlocking),
                         "cudaStreamCreate (side)"));
  MK_CHECK(mk_cuda_check(cudaEventCreateWithFlags(&fc->ev_fork, cudaEventDisableTiming),
                         "cudaEventCreate"));
  MK_CHECK(mk_cuda_check(cudaEventCreateWithFlags(&fc->ev_join, cudaEventDisableTiming),
                         "cudaEventCreate"));
  MK_CHECK(mk_cuda_check(cudaDeviceGetAttribute(&fc->num_sms, cudaDevAttrMultiProcessorCount,
                                                fc->dev), "cudaDeviceGetAttribute"));
  MK_CHECK(mk_cuda_check(cudaMalloc(&fc->sym, fc->sym_bytes), "cudaMalloc (workspace)"));
  /* Zeroed on the stream of the workspace exchange: a peer learns our workspace only from that
   * gather, so it cannot store into it before the zeroing ends. cudaMemset on the legacy stream
   * is asynchronous and unordered with the gather's non-blocking stream; with two ranks on one
   * GPU under MPS the fast rank's first MoE counts were wiped by the slow rank's zeroing. */
  MK_CHECK(mk_cuda_check(cudaMemsetAsync(fc->sym, 0, fc->sym_bytes, fc->internal), "cudaMemset (workspace)"));
  MK_CHECK(mk_cuda_check(cudaHostAlloc((void**)&fc->err, sizeof(*fc->err),
                                       cudaHostAllocMapped), "cudaHostAlloc (error record)"));
  memset(fc->err, 0, sizeof(*fc->err));
  MK_CHECK(mk_cuda_check(cudaMalloc((void**)&fc->err_claim, sizeof(*fc->err_claim)),
                         "cudaMalloc (error claim)"));
  MK_CHECK(mk_cuda_check(cudaMemsetAsync(fc->err_claim, 0, sizeof(*fc->err_claim), fc->internal),
                         "cudaMemset (error claim)"));
  fc->err->claim = fc->err_claim;
  /* The reference path's scratch for the largest configured shapes, so that calls inside
   * graph capture never need to grow it. */
  const ncclMkConfig* c = &fc->cfg;
  fc->scratch_bytes = c->max_m * (c->max_n > c->max_k ? c->max_n : c->max_k) * 2;
  MK_CHECK(mk_cuda_check(cudaMallocAsync(&fc->scratch, fc->scratch_bytes, fc->internal), "cudaMallocAsync (scratch)"));
  MK_CHECK(mk_cuda_check(cudaStreamSynchronize(fc->internal), "cudaStreamSynchronize (scratch)"));
  return mk_trace_comm_open(fc);
}

/* Every kernel the ops launch, loaded at init (sm90.h mk_kernel_load): under CUDA's lazy
 * loading an op's first launch would wait for whatever the device runs then, which may be
 * waiting for the peers' progress in this very call (test_moe / test_fused_ops busy_sms
 * without their warm-up calls). */
static int fused_comm_load_kernels(const struct mk_fused_comm* fc) {
  MK_CHECK(mk_gemm_prepare());
  MK_CHECK(mk_ag_load());
  MK_CHECK(mk_ra_load());
  MK_CHECK(mk_attn_bwd_load());
  if (fc->moe_bytes) {
    MK_CHECK(mk_moe_dispatch_load());
    MK_CHECK(mk_moe_combine_load());
  }
  return 0;
}

static int device_is_hopper(int dev) {
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return 0;
  if (prop.major == 9 && prop.minor == 0) return 1;
  MK_WARN("fused ops need a Hopper GPU (sm_90); device %d is %s (sm_%d%d)", dev, prop.name,
          prop.major, prop.minor);
  return 0;
}

static int fused_comm_identify(struct mk_fused_comm* fc) {
  const struct mk_nccl_api* api = fc->api;
  /* a non-blocking communicator's own init may still run: it ends first */
  MK_CHECK(mk_nccl_comm_check(api, fc->nccl, mk_nccl_comm_state(api, fc->nccl), "the communicator's state"));
  MK_CHECK(mk_nccl_check(api->comm_count(fc->nccl, &fc->nranks), "ncclCommCount"));
  MK_CHECK(mk_nccl_check(api->comm_user_rank(fc->nccl, &fc->rank), "ncclCommUserRank"));
  return mk_nccl_check(api->comm_cu_device(fc->nccl, &fc->dev), "ncclCommCuDevice");
}

/* This rank's part of the init once the exchange can be posted; its error goes to the peers. */
static int fused_comm_prepare(struct mk_fused_comm* fc, int config_rc) {
  if (config_rc) return config_rc;
  if (!device_is_hopper(fc->dev)) return -ENOTSUP;
  MK_CHECK(fused_comm_alloc(fc));
  return fused_comm_load_kernels(fc);
}

int mk_fused_comm_create(ncclComm_t comm, const ncclMkConfig* cfg, int config_rc) {
  if (registry_get(comm, 0)) { /* before any collective: a second init must not post an exchange */
    MK_WARN("ncclMkCommInit: communicator %p already has nccl-mk state: a second ncclMkCommInit, an earlier "
            "one that failed inside ncclGroupStart/End (ncclMkCommRelease it first), or an earlier "
            "communicator at this address destroyed without ncclMkCommRelease", (void*)comm);
    return -ENOTSUP;
  }
  struct mk_fused_comm* fc = calloc(1, sizeof(*fc));
  if (!fc) return -ENOMEM;
  fc->nccl = comm;
  fc->cfg = *cfg;
  fc->fused = (int)mk_param_int(MK_PARAM_FUSED);
  pthread_mutex_init(&fc->exchange_lock, NULL);
  int rc, prev_dev = -1;
  cudaGetDevice(&prev_dev);
  MK_CHECK_GOTO(mk_nccl_api_get(&fc->api), rc, fail);
  MK_CHECK_GOTO(fused_comm_identify(fc), rc, fail);
  MK_CHECK_GOTO(mk_cuda_check(cudaSetDevice(fc->dev), "cudaSetDevice"), rc, fail);
  MK_CHECK_GOTO(fused_comm_exchange_alloc(fc), rc, fail);
  int local_rc = fused_comm_prepare(fc, config_rc);
  MK_CHECK_GOTO(mk_peer_exchange_post(fc, &local_rc), rc, fail);
  rc = mk_peer_exchange_finish(fc, 1);
  if (rc == -EAGAIN) { /* inside the caller's group: the gather runs at its end, finished at first use */
    fc->exchange_failed = local_rc;
    rc = registry_add(fc); /* on failure fc is lost, never freed: the gather would write into it */
    if (prev_dev >= 0) cudaSetDevice(prev_dev);
    return rc == -EEXIST ? -ENOTSUP : rc ? rc : local_rc;
  }
  MK_CHECK_GOTO(rc, rc, fail);
  MK_CHECK_GOTO(registry_add(fc), rc, fail);
  if (prev_dev >= 0) cudaSetDevice(prev_dev);
  return 0;
fail:
  if (rc == -EEXIST) MK_WARN("ncclMkCommInit: this communicator is already initialised");
  fused_comm_free(fc);
  if (prev_dev >= 0) cudaSetDevice(prev_dev);
  return rc == -EEXIST ? -ENOTSUP : rc;
}

/* Whether fc's buffers may be freed: not while its exchange's gather is still to run (the
 * caller's group has not ended: it would write into them), unless NCCL reports the
 * communicator failed (then it never runs). */
static int fused_comm_may_free(struct mk_fused_comm* fc) {
  if (!__atomic_load_n(&fc->exchange_pending, __ATOMIC_ACQUIRE) || mk_peer_exchange_ran(fc) != 0) return 1;
  const ncclResult_t state = mk_nccl_comm_state(fc->api, fc->nccl);
  if (state == ncclSuccess || state == ncclInProgress) return 0;
  MK_INFO(MK_NCCL_SUBSYS_INIT, "ncclMkCommRelease: the exchange never ran, the communicator failed: freeing");
  return 1;
}

int mk_fused_comm_destroy(ncclComm_t comm) {
  struct mk_fused_comm* fc = registry_get(comm, 1);
  if (!fc) {
    MK_WARN("ncclMkCommRelease: communicator %p has no ncclMkCommInit", (void*)comm);
    return -EINVAL;
  }
  int prev_dev = -1;
  cudaGetDevice(&prev_dev);
  cudaSetDevice(fc->dev);
  const int may_free = fused_comm_may_free(fc);
  if (may_free) {
    cudaStreamSynchronize(fc->internal);
    fused_comm_free(fc);
  } else {
    MK_WARN("ncclMkCommRelease: communicator %p's ncclMkCommInit exchange has not run yet: call ncclGroupEnd first",
            (void*)comm);
    registry_add(fc); /* back as it was: it was taken out, and keeps its generation */
  }
  if (prev_dev >= 0) cudaSetDevice(prev_dev);
  return may_free ? 0 : -ENOTSUP;
}

/* Finishes an exchange that ncclMkCommInit posted inside the caller's group, once, under the
 * comm's lock: first ops from several threads (one per stream) may come at once. */
static int fused_comm_exchange_late(struct mk_fused_comm* fc, cudaStream_t stream) {
  pthread_mutex_lock(&fc->exchange_lock);
  int rc = fc->exchange_failed;
  if (rc) {
    MK_WARN("this communicator's ncclMkCommInit failed (%s; the first WARN says why): ncclMkCommRelease it "
            "and init again", strerror(-rc));
  } else if (fc->exchange_pending && mk_stream_capturing(stream)) {
    MK_WARN("the first fused call after ncclMkCommInit inside ncclGroupStart/End must be "
            "made outside graph capture");
    rc = -ENOTSUP;
  } else if (fc->exchange_pending) {
    rc = mk_peer_exchange_finish(fc, 0);
    if (rc == -EAGAIN) {
      MK_WARN("ncclMkCommInit's exchange has not run: was ncclGroupEnd called?");
      rc = -ENOTSUP;
    } else if (rc) {
      __atomic_store_n(&fc->exchange_failed, rc, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&fc->exchange_lock);
  return rc;
}

int mk_fused_comm_lookup(ncclComm_t comm, struct mk_fused_comm** out) {
  struct mk_fused_comm* fc = registry_get(comm, 0);
  if (!fc) MK_WARN("communicator %p has no ncclMkCommInit", (void*)comm);
  *out = fc;
  return fc ? 0 : -ENOTSUP;
}

int mk_fused_comm_get(ncclComm_t comm, cudaStream_t stream, struct mk_fused_comm** out) {
  struct mk_fused_comm* fc;
  MK_CHECK(mk_fused_comm_lookup(comm, &fc));
  if (__atomic_load_n(&fc->exchange_pending, __ATOMIC_ACQUIRE)) MK_CHECK(fused_comm_exchange_late(fc, stream));
  *out = fc;
  return 0;
}

void mk_fused_comm_settle(ncclComm_t comm, cudaStream_t stream) {
  struct mk_fused_comm* fc = comm ? registry_get(comm, 0) : NULL;
  if (fc && __atomic_load_n(&fc->exchange_pending, __ATOMIC_ACQUIRE)) (void)fused_comm_exchange_late(fc, stream);
}

cudaError_t mk_fused_read(const struct mk_fused_comm* fc, void* dst, const void* src, size_t bytes) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, fc->internal);
  return e == cudaSuccess ? cudaStreamSynchronize(fc->internal) : e;
}

int mk_fused_allgather(struct mk_fused_comm* fc, void* dev, const void* mine, size_t bytes, void* all, const char* what) {
  char* buf = dev;
  const size_t n = (size_t)fc->nranks;
  /* from pageable memory: staged on return; on the internal stream, which waits for no other */
  MK_CHECK(mk_cuda_check(cudaMemcpyAsync(buf + n * bytes, mine, bytes, cudaMemcpyHostToDevice, fc->internal),
                         what));
  MK_CHECK(mk_nccl_comm_check(fc->api, fc->nccl,
                              fc->api->all_gather(buf + n * bytes, buf, bytes, ncclUint8, fc->nccl, fc->internal),
                              what));
  return mk_cuda_check(mk_fused_read(fc, all, buf, n * bytes), what);
}

int mk_fused_comm_health(struct mk_fused_comm* fc, char* msg, size_t len) {
  volatile struct mk_gemm_error* e = fc->err;
  if (!fc->broken && !e->aborted) return 0;
  char proxy_msg[200];
  if (mk_xnode_error(fc, proxy_msg, sizeof(proxy_msg))) {
    if (!fc->broken) MK_WARN("rank %d: the cross-node proxy failed (%s); the communicator is broken", fc->rank, proxy_msg);
    fc->broken = 1;
    if (msg && len) snprintf(msg, len, "rank %d: the cross-node proxy failed: %s", fc->rank, proxy_msg);
    return -ECONNRESET;
  }
  struct mk_gemm_error copy = *(struct mk_gemm_error*)e;
  char text[256];
  mk_err_record_text(fc->rank, &copy, text, sizeof text);
  if (!fc->broken && !(copy.tag & MK_MOE_ERR_OVERFLOW)) { /* a wait timed out: the hang report */
    /* The peer is known for AllGather+GEMM's, ring attention's, GEMM+RS/AR's and the MoE
     * combine's store waits;
     * the other waits report it unknown. */
    uint64_t progress = 0;
    char what[96] = "";
    int prev, peer = -1;
    if (!mk_op_device_enter(fc, &prev)) {
      const uint32_t op = mk_err_tag_op(copy.tag);
      if (op == MK_OP_AG_GEMM) peer = mk_ag_gemm_hang_peer(fc, &copy, &progress, what, sizeof(what));
      else if (op == MK_OP_RING_ATTN || op == MK_OP_RING_ATTN_BWD) peer = mk_ra_hang_peer(fc, &copy, &progress, what, sizeof(what));
      else if (op == MK_OP_GEMM_RS || op == MK_OP_GEMM_AR || op == MK_OP_MOE_COMBINE)
        peer = mk_gemm_rs_hang_peer(fc->rank, fc->nranks, op == MK_OP_MOE_COMBINE ? 0 : fc->rs_shard_blocks,
                                    &copy, &progress, what, sizeof(what));
      mk_trace_comm_hang(fc, &copy, text, peer, progress, what[0] ? what : NULL);
    }
    mk_op_device_leave(prev);
  }
  if (!fc->broken) MK_WARN("%s; the communicator is broken", text);
  fc->broken = 1;
  if (msg && len) snprintf(msg, len, "%s", text);
  return -ECONNRESET;
}

int mk_fused_scratch(struct mk_fused_comm* fc, cudaStream_t stream, size_t bytes, void** out) {
  if (bytes > fc->scratch_bytes) {
    if (mk_stream_capturing(stream)) {
      MK_WARN("this call needs %zu bytes of workspace, %zu are prepared, and it cannot grow "
              "inside graph capture: run the largest shape once before capture, or raise "
              "ncclMkConfig's max_m/max_n/max_k", bytes, fc->scratch_bytes);
      return -ENOTSUP;
    }
    /* Waits for this stream only (the old scratch's readers are its earlier calls): cudaFree
     * would wait for every kernel on the device, including another stream's that waits for
     * this call's peers (a deadlock, or 30 s with test_fused_ops busy_sms's holder). The
     * second sync makes the new allocation usable from any stream, as cudaMalloc's is. */
    void* grown = NULL;
    MK_CHECK(mk_cuda_check(cudaStreamSynchronize(stream), "stream sync before growing"));
    MK_CHECK(mk_cuda_check(cudaFreeAsync(fc->scratch, stream), "cudaFreeAsync (scratch)"));
    fc->scratch = NULL, fc->scratch_bytes = 0;
    MK_CHECK(mk_cuda_check(cudaMallocAsync(&grown, bytes, stream), "cudaMallocAsync (scratch)"));
    MK_CHECK(mk_cuda_check(cudaStreamSynchronize(stream), "stream sync after growing"));
    fc->scratch = grown;
    fc->scratch_bytes = bytes;
  }
  *out = fc->scratch;
  return 0;
}
