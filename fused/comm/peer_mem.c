/*
 * The workspace exchange of ncclMkCommInit. Each rank gathers every rank's record with
 * ncclAllGather on its own communicator, then maps the workspaces of the ranks on its
 * host: a direct pointer for a peer in the same process (IPC handles cannot be opened by
 * the process that made them), cudaIpcOpenMemHandle otherwise.
 *
 * The gather may be held back by the caller's ncclGroupStart/End (one thread driving
 * several GPUs): then it runs at the caller's ncclGroupEnd, and the records are read at
 * the first later call. The gathered slots are poisoned first, so an idle stream with our
 * slot still poisoned means "not run yet".
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fused_comm.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "proxy.h"

static uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

/* Hostname and boot id: two containers with the same hostname on different machines
 * differ in boot id; two processes of one boot share it. */
static uint64_t host_hash(void) {
  char buf[256] = {0};
  uint64_t h = 0xcbf29ce484222325ULL;
  gethostname(buf, sizeof(buf) - 1);
  h = fnv1a(h, buf, strlen(buf));
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    memset(buf, 0, sizeof(buf));
    if (fgets(buf, sizeof(buf), f)) h = fnv1a(h, buf, strlen(buf));
    fclose(f);
  }
  return h;
}

/* The gathered slots start as 0xff bytes, so a slot the gather has not written reads as
 * this host hash. records_dev has nranks + 1 slots: the last is our send buffer. */
static const uint64_t record_poison = ~0ULL;

int mk_peer_exchange_post(struct mk_fused_comm* fc, int* local_rc) {
  struct mk_peer_record mine;
  memset(&mine, 0, sizeof(mine));
  mine.host_hash = host_hash();
  mine.pid = (int32_t)getpid();
  mine.dev = fc->dev;
  mine.sym_ptr = (uint64_t)(uintptr_t)fc->sym;
  mine.sym_bytes = fc->sym_bytes;
  mine.version = MK_PEER_RECORD_VERSION;
  mine.fused = fc->fused;
  mine.config = fc->cfg;
  int rc = 0;
  if (!*local_rc)
    *local_rc = mk_cuda_check(cudaIpcGetMemHandle(&mine.sym_handle, fc->sym), "cudaIpcGetMemHandle");
  mine.init_error = -*local_rc;
  size_t rec = sizeof(struct mk_peer_record);
  struct mk_peer_record* send = fc->records_dev + fc->nranks;
  rc = mk_cuda_check(cudaMemsetAsync(fc->records_dev, 0xff, (size_t)fc->nranks * rec, fc->internal),
                     "record poison");
  if (!rc) /* from pageable memory: returns once `mine` is staged */
    rc = mk_cuda_check(cudaMemcpyAsync(send, &mine, rec, cudaMemcpyHostToDevice, fc->internal), "record upload");
  if (rc) return rc;
  rc = mk_nccl_check(fc->api->group_start(), "ncclGroupStart");
  if (rc) return rc;
  rc = mk_nccl_comm_check(fc->api, fc->nccl, fc->api->all_gather(send, fc->records_dev, rec, ncclUint8, fc->nccl,
                                         fc->internal), "ncclAllGather (workspace exchange)");
  int end = mk_nccl_comm_check(fc->api, fc->nccl, fc->api->group_end(), "ncclGroupEnd");
  __atomic_store_n(&fc->exchange_pending, 1, __ATOMIC_RELEASE);
  return rc ? rc : end;
}

/* The fields of ncclMkConfig that choose a call's path and layout (not timeout_ms). */
static int config_differs(const ncclMkConfig* a, int a_fused, const ncclMkConfig* b, int b_fused) {
  return a->max_m != b->max_m || a->max_n != b->max_n || a->max_k != b->max_k || a->comm_sms != b->comm_sms ||
         a->chunk_bytes != b->chunk_bytes || a->moe_max_tokens != b->moe_max_tokens ||
         a->moe_max_hidden != b->moe_max_hidden || a->moe_max_topk != b->moe_max_topk ||
         a->moe_max_recv_rows != b->moe_max_recv_rows || a->moe_dispatch_fp8 != b->moe_dispatch_fp8 ||
         a_fused != b_fused;
}

int mk_peer_errors_agree(const void* base, size_t stride, int nranks, int rank, const char* stage) {
  int32_t err;
  memcpy(&err, (const char*)base + (size_t)rank * stride, sizeof err);
  if (err) return -err; /* WARNed where it failed */
  for (int p = 0; p < nranks; p++) {
    memcpy(&err, (const char*)base + (size_t)p * stride, sizeof err);
    if (!err) continue;
    MK_WARN("ncclMkCommInit: %s failed on rank %d (%s), so it fails on every rank (rank %d here)", stage, p,
            strerror(err), rank);
    return -ECONNRESET;
  }
  return 0;
}

int mk_peer_records_agree(const struct mk_peer_record* records, int nranks, int rank) {
  const struct mk_peer_record* mine = &records[rank];
  for (int p = 0; p < nranks; p++) {
    if (records[p].version == MK_PEER_RECORD_VERSION) continue;
    MK_WARN("ncclMkCommInit: rank %d's init record is version %u, rank %d's %u: every rank must load the same "
            "nccl-mk build", p, records[p].version, rank, MK_PEER_RECORD_VERSION);
    return -EINVAL;
  }
  const int rc = mk_peer_errors_agree(&records[0].init_error, sizeof *records, nranks, rank, "the init");
  if (rc) return rc;
  for (int p = 0; p < nranks; p++) {
    const struct mk_peer_record* r = &records[p];
    if (!config_differs(&r->config, r->fused, &mine->config, mine->fused)) {
      if (r->sym_bytes == mine->sym_bytes) continue; /* equal configs of one build: equal workspaces */
      MK_WARN("ncclMkCommInit: rank %d's workspace is %llu bytes, rank %d's %llu: every rank must load the same "
              "nccl-mk build", p, (unsigned long long)r->sym_bytes, rank, (unsigned long long)mine->sym_bytes);
      return -EINVAL;
    }
    const ncclMkConfig *a = &r->config, *b = &mine->config;
    MK_WARN("ncclMkCommInit: rank %d's config differs from rank %d's (max_m/n/k %zu/%zu/%zu vs %zu/%zu/%zu, "
            "comm_sms %d vs %d, chunk_bytes %zu vs %zu, moe tokens/hidden/topk/recv_rows/fp8 %d/%d/%d/%d/%d vs "
            "%d/%d/%d/%d/%d, NCCL_MK_FUSED %d vs %d): give every rank the same ncclMkConfig and NCCL_MK_FUSED",
            p, rank, a->max_m, a->max_n, a->max_k, b->max_m, b->max_n, b->max_k, a->comm_sms, b->comm_sms,
            a->chunk_bytes, b->chunk_bytes, a->moe_max_tokens, a->moe_max_hidden, a->moe_max_topk,
            a->moe_max_recv_rows, a->moe_dispatch_fp8, b->moe_max_tokens, b->moe_max_hidden, b->moe_max_topk,
            b->moe_max_recv_rows, b->moe_dispatch_fp8, r->fused, mine->fused);
    return -EINVAL;
  }
  return 0;
}

/* A peer is in the local team when it is on this host and, with NCCL_MK_LOCAL_SIZE > 0, in
 * the same emulated node (consecutive groups of that many ranks); others are remote, for
 * the proxy (fused/proxy) to reach through the transport. From the records alone, so that
 * every rank counts the same team whether or not its mapping works. */
static int peer_is_local(const struct mk_fused_comm* fc, int p, const struct mk_peer_record* mine) {
  return fc->records_host[p].host_hash == mine->host_hash &&
         mk_local_team_same(fc->rank, p, (int)mk_param_int(MK_PARAM_LOCAL_SIZE));
}

/* Maps local peer p's workspace: 0 or negative errno. */
static int peer_map(struct mk_fused_comm* fc, int p, const struct mk_peer_record* mine) {
  const struct mk_peer_record* r = &fc->records_host[p];
  if (r->pid == mine->pid) {
    if (r->dev != fc->dev) {
      cudaError_t err = cudaDeviceEnablePeerAccess(r->dev, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else if (err != cudaSuccess) return mk_cuda_check(err, "cudaDeviceEnablePeerAccess");
    }
    fc->peer_sym[p] = (void*)(uintptr_t)r->sym_ptr;
    return 0;
  }
  int rc = mk_cuda_check(cudaIpcOpenMemHandle(&fc->peer_sym[p], r->sym_handle,
                                              cudaIpcMemLazyEnablePeerAccess),
                         "cudaIpcOpenMemHandle");
  if (rc) return rc;
  fc->peer_opened[p] = 1;
  return 0;
}

static int peer_exchange_read(struct mk_fused_comm* fc, int eager);

/* Every rank's result of mapping its peers' workspaces, gathered (the record buffers reused as
 * int32 slots; the records are read by now): a rank that could not map them fails, and the
 * others must not go on storing into its workspace. */
static int peer_mapping_agree(struct mk_fused_comm* fc, int mine) {
  int32_t* all = (int32_t*)(void*)fc->records_host;
  const int32_t err = -mine;
  MK_CHECK(mk_fused_allgather(fc, fc->records_dev, &err, sizeof err, all, "mapping results exchange"));
  return mk_peer_errors_agree(all, sizeof *all, fc->nranks, fc->rank, "mapping the peers' workspaces");
}

int mk_peer_exchange_ran(struct mk_fused_comm* fc) {
  if (fc->records_read) return 1; /* the slots may hold the cross-node exchanges' records since */
  uint64_t hash = 0; /* read behind whatever the internal stream holds: the gather, if launched */
  const int rc = mk_cuda_check(mk_fused_read(fc, &hash, &fc->records_dev[fc->rank].host_hash, sizeof hash),
                               "workspace record");
  return rc ? rc : hash != record_poison;
}

/* Peer access is enabled from the current device: make it the comm's for the mapping. */
int mk_peer_exchange_finish(struct mk_fused_comm* fc, int eager) {
  if (!fc->exchange_pending) return 0;
  int prev = -1;
  cudaGetDevice(&prev);
  int rc = mk_cuda_check(cudaSetDevice(fc->dev), "cudaSetDevice");
  if (!rc) rc = peer_exchange_read(fc, eager);
  if (prev >= 0) cudaSetDevice(prev);
  return rc;
}

static int peer_exchange_read(struct mk_fused_comm* fc, int eager) {
  int rc = mk_cuda_check(cudaStreamSynchronize(fc->internal), "workspace exchange");
  if (!rc)
    rc = mk_cuda_check(cudaMemcpy(fc->records_host, fc->records_dev,
                                  (size_t)fc->nranks * sizeof(struct mk_peer_record),
                                  cudaMemcpyDeviceToHost), "record download");
  if (rc) return rc;
  const struct mk_peer_record* mine = &fc->records_host[fc->rank];
  if (mine->host_hash == record_poison) return -EAGAIN; /* caller's group not ended yet */
  fc->records_read = 1;
  rc = mk_peer_records_agree(fc->records_host, fc->nranks, fc->rank); /* alike on every rank */
  if (rc) return rc;
  fc->local_size = 0;
  for (int p = 0; p < fc->nranks; p++) {
    if (p == fc->rank) fc->peer_sym[p] = fc->sym;
    if (p != fc->rank && !peer_is_local(fc, p, mine)) continue;
    fc->local_size++;
    if (p != fc->rank && !rc) rc = peer_map(fc, p, mine);
  }
  if (eager) MK_CHECK(peer_mapping_agree(fc, rc)); /* every rank fails its init alike */
  if (rc) {
    /* At the first op (after an init inside a group) the rank still joins the cross-node
     * exchange, as failed: its peers' first calls wait in it, and fail there too. (On one
     * node there is none, and its peers go on; their calls time out waiting for it.) */
    mk_xnode_setup(fc, rc);
    return rc;
  }
  MK_INFO(MK_NCCL_SUBSYS_INIT, "fused ops: rank %d of %d, %d on this host reachable by "
          "load/store", fc->rank, fc->nranks, fc->local_size);
  rc = mk_xnode_setup(fc, 0); /* the others, through the proxy */
  /* Done only when whole: a failed lazy exchange stays pending, and its error is kept
   * (mk_fused_comm_get), so no call runs on a half-mapped communicator. */
  if (!rc) __atomic_store_n(&fc->exchange_pending, 0, __ATOMIC_RELEASE);
  return rc;
}

void mk_peer_close(struct mk_fused_comm* fc) {
  for (int p = 0; fc->peer_sym && p < fc->nranks; p++)
    if (fc->peer_opened[p]) cudaIpcCloseMemHandle(fc->peer_sym[p]);
}
