/*
 * The cross-node state of a fused-op communicator (issue 13; regions and protocol in
 * fused/proxy/xnode.h): made after the workspace exchange when some rank is outside the
 * local team (another host, or another emulated node with NCCL_MK_LOCAL_SIZE), released with
 * the communicator. Setup is collective: three exchanges (the proxy's listen addresses, then
 * its remote keys, then whether every rank took them and has its thread, held) as
 * ncclAllGather on the caller's communicator; the proxies connect to each other between the
 * first two.
 */
#include "fused_comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "proxy.h"
#include "xnode.h"

struct mk_xnode {
  struct mk_proxy* proxy;
  struct mk_proxy_queue* q; /* host-mapped */
  void* bounce;             /* host-mapped */
  size_t bounce_bytes;
  uint64_t* flags;          /* host-mapped */
  struct mk_xnode_dev* dev; /* device memory */
  char* bounce_dev;         /* the GPU's views of the bounce buffer and the flags */
  uint64_t* flags_dev;
  unsigned char* remote; /* [nranks] */
  uint32_t remote_mask;  /* the same, for ranks < 32 */
  int started;           /* the proxy thread runs: release meets the peers */
};

static int host_mapped(void** p, size_t bytes, const char* what) {
  MK_CHECK(
      mk_cuda_check(cudaHostAlloc(p, bytes, cudaHostAllocMapped | cudaHostAllocPortable), what));
  memset(*p, 0, bytes);
  return 0;
}

static void* device_view(void* host) {
  void* d = NULL;
  return cudaHostGetDevicePointer(&d, host, 0) == cudaSuccess ? d : NULL;
}

_Static_assert(sizeof(struct mk_peer_record) >= sizeof(struct mk_proxy_addr) &&
                   sizeof(struct mk_peer_record) >= sizeof(struct mk_proxy_keys),
               "the cross-node records fit the workspace exchange's slots");

/* Every rank's `bytes`-byte record into all[nranks], through ncclAllGather on fc's comm and
 * the workspace exchange's device slots (read by now: records_read), which every rank has
 * since its init: an allocation here could fail on one rank alone, and its peers would wait
 * in the gather it skipped. */
static int xnode_allgather(struct mk_fused_comm* fc, const void* mine, size_t bytes, void* all) {
  return mk_fused_allgather(fc, fc->records_dev, mine, bytes, all, "proxy record exchange");
}

/* A proxy failure (dead peer, transport error) is the communicator's asynchronous error:
 * every wait of a running kernel gives up at its next check of the record. */
static void xnode_on_error(void* arg, const struct mk_proxy_error* e) {
  struct mk_gemm_error* r = ((struct mk_fused_comm*)arg)->err;
  if (__atomic_load_n(&r->aborted, __ATOMIC_ACQUIRE)) return;
  r->tag = MK_XNODE_ERR_TAG;
  r->tile = 0;
  r->flag_index = (uint32_t)e->peer;
  r->expected = e->expected;
  r->seen = e->seen;
  __atomic_store_n(&r->aborted, 1, __ATOMIC_RELEASE);
}

static int xnode_alloc(struct mk_fused_comm* fc, struct mk_xnode* xn) {
  const size_t n = (size_t)fc->nranks;
  xn->remote = calloc(n, 1);
  if (!xn->remote) return -ENOMEM;
  for (int p = 0; p < fc->nranks; p++) {
    xn->remote[p] = p != fc->rank && !fc->peer_sym[p];
    if (xn->remote[p] && p < 32) xn->remote_mask |= 1u << p;
  }
  /* AllGather+GEMM's gathered A, or GEMM+ReduceScatter/AllReduce's slots (< 3 C: xnode.h) */
  const ncclMkConfig* c = &fc->cfg;
  xn->bounce_bytes = c->max_m * (c->max_k > 3 * c->max_n ? c->max_k : 3 * c->max_n) * 2;
  if (xn->bounce_bytes < 4096) xn->bounce_bytes = 4096;
  MK_CHECK(host_mapped((void**)&xn->q, mk_proxy_queue_bytes(MK_XN_QUEUE_DEPTH),
                       "cudaHostAlloc (proxy queue)"));
  MK_CHECK(mk_proxy_queue_init(xn->q, MK_XN_QUEUE_DEPTH));
  MK_CHECK(host_mapped(&xn->bounce, xn->bounce_bytes, "cudaHostAlloc (proxy bounce buffer)"));
  MK_CHECK(host_mapped((void**)&xn->flags, MK_XN_FLAG_WORDS * 8, "cudaHostAlloc (proxy flags)"));
  MK_CHECK(mk_cuda_check(cudaMalloc((void**)&xn->dev, sizeof(*xn->dev)),
                         "cudaMalloc (cross-node state)"));
  struct mk_xnode_dev* d = calloc(1, sizeof(*d));
  if (!d) return -ENOMEM;
  d->q = device_view(xn->q), d->bounce = device_view(xn->bounce), d->flags = device_view(xn->flags);
  d->timeout_ns = (uint64_t)fc->cfg.timeout_ms * 1000000ull;
  mk_proxy_producer_init(&d->prod, d->q, fc->rank);
  xn->bounce_dev = d->bounce, xn->flags_dev = d->flags;
  int rc = d->q && d->bounce && d->flags ? 0 : -EIO;
  /* landed before init returns: the ops' kernels run on the caller's streams, which need
   * not wait for the legacy stream that cudaMemcpy uses */
  if (!rc)
    rc =
        mk_cuda_check(cudaMemcpyAsync(xn->dev, d, sizeof(*d), cudaMemcpyHostToDevice, fc->internal),
                      "cross-node state upload");
  if (!rc) rc = mk_cuda_check(cudaStreamSynchronize(fc->internal), "cross-node state upload");
  free(d);
  return rc;
}

/* The transport device this GPU's proxy uses: one per GPU where there are several (each
 * GPU its own NIC, as NCCL pairs them on such nodes). */
static int xnode_transport_dev(const struct mk_fused_comm* fc,
                               const struct mk_transport_ops** ops) {
  int ndev = 0;
  MK_CHECK(mk_transport_get(ops));
  MK_CHECK((*ops)->devices(&ndev));
  return ndev > 0 ? fc->dev % ndev : -ENODEV;
}

static int xnode_create(struct mk_fused_comm* fc, struct mk_xnode* xn) {
  const struct mk_transport_ops* ops;
  const int dev = xnode_transport_dev(fc, &ops);
  if (dev < 0) return dev;
  struct mk_proxy_conf conf = {.ops = ops,
                               .dev = dev,
                               .rank = fc->rank,
                               .nranks = fc->nranks,
                               .remote = xn->remote,
                               .data = xn->bounce,
                               .data_bytes = xn->bounce_bytes,
                               .data_type = MK_PTR_HOST,
                               .flags = xn->flags,
                               .flags_bytes = MK_XN_FLAG_WORDS * 8,
                               .flags_type = MK_PTR_HOST | MK_PTR_FORCE_SO,
                               .queue = xn->q,
                               .on_error = xnode_on_error,
                               .on_error_arg = fc};
  return mk_proxy_create(&conf, &xn->proxy);
}

/* 1 when every rank's record of this exchange carries the magic (a rank that failed sends
 * zeros); the records' own checks come later (mk_proxy_connect, mk_proxy_arm). */
static int xnode_all_ready(const uint32_t* magic, size_t stride, int nranks) {
  for (int r = 0; r < nranks; r++)
    if (*(const uint32_t*)((const char*)magic + (size_t)r * stride) != MK_PROXY_RECORD_MAGIC)
      return 0;
  return 1;
}

/* The `reserved` word of a rank's address record (magic 0) whose own exchange failed before
 * the cross-node one ("FAIL"): every rank's exchange then fails with it. */
#define XNODE_RANK_FAILED 0x4c494146u

/* 1 when every rank's flag of the third exchange is set: each took the others' keys and
 * has its thread, held. */
static int xnode_all_armed(struct mk_fused_comm* fc, int mine, int* all_armed) {
  int32_t armed[MK_XN_MAX_RANKS]; /* no allocation that could fail before the others' gather */
  const int32_t flag = mine ? 1 : 0;
  const int rc = xnode_allgather(fc, &flag, sizeof(flag), armed);
  *all_armed = !rc;
  for (int r = 0; !rc && r < fc->nranks; r++) *all_armed &= armed[r] == 1;
  return rc;
}

/* The three exchanges, which every rank joins whatever happened to it before (a rank that
 * returned early would leave the others in NCCL's all-gather): addresses, connect, keys, then
 * whether every rank took the others' keys and created its thread (held), then the threads
 * run. The third comes before any thread runs: a rank whose proxy did not start would leave
 * its peers' ops waiting for it (they time out), so then no rank lets its thread run (a held
 * thread exits at the stop without touching a connection), and no running thread takes its
 * peers' closes for errors. *local: this rank's own error, or 0; xn->started when every rank's
 * thread runs, alike on every rank. failed: this rank's exchange failed before (its first
 * call could not map its peers' workspaces), which its address record says; *failed_rank:
 * the first rank whose record says so, or -1, alike on every rank. <0 only when an exchange
 * itself failed. */
static int xnode_exchange(struct mk_fused_comm* fc, struct mk_xnode* xn, int failed, int* local, int* failed_rank) {
  /* on the stack (13 KiB at most): an allocation that failed would skip gathers the others join */
  struct mk_proxy_addr addrs[MK_XN_MAX_RANKS];
  struct mk_proxy_keys keys[MK_XN_MAX_RANKS];
  memset(addrs, 0, sizeof addrs);
  memset(keys, 0, sizeof keys);
  if (!*local) *local = mk_proxy_addr(xn->proxy, &addrs[fc->rank]);
  if (*local) memset(&addrs[fc->rank], 0, sizeof(*addrs));
  if (failed) addrs[fc->rank].reserved = XNODE_RANK_FAILED; /* its magic stays 0: not ready */
  int rc = xnode_allgather(fc, &addrs[fc->rank], sizeof(*addrs), addrs);
  *failed_rank = -1;
  for (int r = 0; !rc && r < fc->nranks && *failed_rank < 0; r++)
    if (!addrs[r].magic && addrs[r].reserved == XNODE_RANK_FAILED) *failed_rank = r;
  int ready = !rc && xnode_all_ready(&addrs[0].magic, sizeof(*addrs), fc->nranks);
  if (!rc && ready) *local = mk_proxy_connect(xn->proxy, addrs);
  if (!rc && ready && !*local) *local = mk_proxy_keys(xn->proxy, &keys[fc->rank]);
  if (!rc && (!ready || *local)) memset(&keys[fc->rank], 0, sizeof(*keys));
  if (!rc) rc = xnode_allgather(fc, &keys[fc->rank], sizeof(*keys), keys);
  ready = !rc && ready && xnode_all_ready(&keys[0].magic, sizeof(*keys), fc->nranks);
  if (!rc && ready) *local = mk_proxy_arm(xn->proxy, keys);
  if (!rc && ready) rc = xnode_all_armed(fc, !*local, &ready);
  if (!rc && ready) mk_proxy_go(xn->proxy);
  xn->started = !rc && ready && !*local;
  return rc;
}

int mk_xnode_setup(struct mk_fused_comm* fc, int failed) {
  if (fc->local_size == fc->nranks || fc->xn) return 0;
  if (fc->nranks > MK_XN_MAX_RANKS) {
    MK_WARN(
        "fused ops: %d ranks, %d of them local: the cross-node path supports at most %d ranks; "
        "the ops use their reference path (NCCL collectives)",
        fc->nranks, fc->local_size, MK_XN_MAX_RANKS);
    return 0;
  }
  /* From here every failure of this rank goes into `local`, never an early return: the
   * exchanges below are collectives its peers join. */
  struct mk_xnode none;
  memset(&none, 0, sizeof(none));
  struct mk_xnode* xn = fc->xn = failed ? NULL : calloc(1, sizeof(*fc->xn));
  int local = failed ? failed : xn ? 0 : -ENOMEM;
  if (!local) local = xnode_alloc(fc, xn);
  if (!local) local = xnode_create(fc, xn);
  if (!xn) xn = &none;
  int failed_rank = -1;
  const int rc = xnode_exchange(fc, xn, failed, &local, &failed_rank);
  if (rc || failed_rank >= 0) { /* a held thread must not outlive either */
    mk_proxy_stop(xn->proxy);
    xn->proxy = NULL;
  }
  if (rc) return rc; /* a gather failed: the communicator is gone */
  if (failed_rank >= 0) { /* alike on every rank: the failed rank's calls refuse, and so do ours */
    if (!failed)
      MK_WARN("rank %d: rank %d could not map its peers' workspaces at its first fused call, so the "
              "communicator's exchange fails on every rank; ncclMkCommRelease it and init again",
              fc->rank, failed_rank);
    return failed ? failed : -ECONNRESET;
  }
  if (xn->started) {
    MK_INFO(MK_NCCL_SUBSYS_INIT, "fused ops: rank %d reaches %d rank(s) through the proxy",
            fc->rank, fc->nranks - fc->local_size);
    return 0;
  }
  mk_proxy_stop(xn->proxy);
  xn->proxy = NULL; /* and so on every rank: the third exchange agreed */
  if (local) MK_WARN("rank %d: its cross-node proxy could not start: %s", fc->rank, strerror(-local));
  MK_WARN(
      "rank %d: not every rank could start its cross-node proxy; the fused ops use their reference "
      "paths (NCCL's collectives, then the GEMM) and MoE and ring attention are unavailable",
      fc->rank);
  return 0;
}

/* Release: after the GPU is idle the host takes over the queue's producer (the kernels' copy
 * of it) for the goodbye (xnode_bye.c). 0, or why a peer's bye did not come. */
static int xnode_say_bye(struct mk_fused_comm* fc) {
  struct mk_xnode* xn = fc->xn;
  struct mk_xnode_dev d;
  MK_CHECK(mk_cuda_check(cudaDeviceSynchronize(), "cross-node release"));
  MK_CHECK(mk_cuda_check(cudaMemcpy(&d, xn->dev, sizeof(d), cudaMemcpyDeviceToHost),
                         "cross-node state"));
  d.prod.q = xn->q; /* the host's view of the same queue */
  const int rc = mk_xn_goodbye(xn->proxy, &d.prod, xn->flags, fc->rank, fc->nranks, xn->remote,
                               (uint64_t)fc->cfg.timeout_ms * 1000000ull);
  if (rc)
    MK_WARN(
        "rank %d: not every remote rank said goodbye within NCCL_MK_TIMEOUT_MS (%s); the proxy's "
        "connections are closed without them",
        fc->rank, strerror(-rc));
  return rc;
}

void mk_xnode_release(struct mk_fused_comm* fc) {
  struct mk_xnode* xn = fc->xn;
  if (!xn) return;
  if (xn->started) {
    /* byes (bounded: a dead peer never says it), then stop the thread and close; no
     * collective here, which a dead peer would hang */
    xnode_say_bye(fc);
    mk_proxy_quiesce(xn->proxy);
  }
  mk_proxy_stop(xn->proxy); /* NULL: nothing */
  cudaFreeHost(xn->q);
  cudaFreeHost(xn->bounce);
  cudaFreeHost(xn->flags);
  cudaFree(xn->dev);
  free(xn->remote);
  free(xn);
  fc->xn = NULL;
}

int mk_xnode_view(const struct mk_fused_comm* fc, struct mk_xnode_view* v) {
  memset(v, 0, sizeof(*v));
  if (!fc->xn || !fc->xn->started) return -ENOENT;
  v->dev = fc->xn->dev, v->bounce = fc->xn->bounce_dev, v->flags = fc->xn->flags_dev;
  v->bounce_bytes = fc->xn->bounce_bytes, v->remote_mask = fc->xn->remote_mask;
  return 0;
}

uint64_t mk_xnode_sent_bytes(const struct mk_fused_comm* fc) {
  uint64_t sum = 0;
  for (int p = 0; fc->xn && fc->xn->proxy && p < fc->nranks; p++)
    if (fc->xn->remote[p]) sum += mk_proxy_sent_bytes(fc->xn->proxy, p);
  return sum;
}

int mk_xnode_error(const struct mk_fused_comm* fc, char* msg, size_t len) {
  return fc->xn && fc->xn->proxy ? mk_proxy_error(fc->xn->proxy, msg, len) : 0;
}
