/* A comm's streams (endpoint, CQ, AV each), request pool and (send side) control ring. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"

/* FI_MR_LOCAL: buffers we hand to the provider ourselves need a descriptor too. */
int ofi_internal_reg(struct ofi_comm* c, void* buf, size_t len, struct fid_mr** mr, void** desc) {
  if (!c->dev->mr_local) return 0;
  uint64_t key = __atomic_fetch_add(&c->dev->next_key, 1, __ATOMIC_RELAXED);
  int rc = fi_mr_reg(c->dev->domain, buf, len, FI_SEND | FI_RECV | FI_WRITE, 0, key, 0, mr, NULL);
  if (rc != 0) {
    MK_WARN("ofi: cannot register internal buffers: %s", ofi_sym.strerror(-rc));
    return rc;
  }
  *desc = fi_mr_desc(*mr);
  return 0;
}

int ofi_ctrl_post(struct ofi_comm* c, unsigned k) {
  struct ofi_ctrl_buf* b = &c->ctrl[k];
  b->op.req = NULL;
  b->op.kind = OFI_OP_CTRL_RECV;
  b->op.idx = (uint8_t)k;
  ssize_t rc = fi_trecv(c->st[0].ep, &b->cts, sizeof(b->cts), c->ctrl_desc, FI_ADDR_UNSPEC,
                        MK_OFI_TAG_CTRL, 0, &b->op.ctx);
  if (rc == -FI_EAGAIN) {
    c->ctrl_unposted |= 1ull << k;
    return 0;
  }
  c->ctrl_unposted &= ~(1ull << k);
  if (rc != 0) MK_WARN("ofi: cannot post a control receive: %s", ofi_sym.strerror((int)-rc));
  return ofi_rc(rc);
}

static int ofi_ctrl_setup(struct ofi_comm* c) {
  size_t len = sizeof(struct ofi_ctrl_buf) * MK_OFI_CTRL_BUFS;
  c->ctrl = calloc(1, len);
  if (!c->ctrl) return -ENOMEM;
  MK_CHECK(ofi_internal_reg(c, c->ctrl, len, &c->ctrl_mr, &c->ctrl_desc));
  for (unsigned k = 0; k < MK_OFI_CTRL_BUFS; k++) MK_CHECK(ofi_ctrl_post(c, k));
  return 0;
}

static int ofi_is_tcp(const char* provider) { return provider && strstr(provider, "tcp"); }

/* 2 endpoints over tcp, where 2 measured best under NCCL on 2xH200 with the progress thread
 * (4 did without it; with it, 4 helpers and a progress thread per comm crowd the cores), and
 * 1 over other providers (efa: not measured; a helper thread per extra endpoint of every comm
 * is a cost there until it is shown to pay). */
int mk_ofi_auto_streams(const char* provider) { return ofi_is_tcp(provider) ? 2 : 1; }

/* libfabric's net provider (alone or under rxm: NCCL_MK_OFI_PROVIDER=net gets "net;ofi_rxm")
 * completed receives we never cancelled with FI_ECANCELED when several endpoints of one comm
 * connected at once (1 striped loopback run in 21 on the CPU host, bench/NOTES.md session 55): one
 * endpoint there. */
int mk_ofi_streams_cap(const char* provider, int want) {
  const int net =
      provider && strncmp(provider, "net", 3) == 0 && (provider[3] == '\0' || provider[3] == ';');
  return net && want > 1 ? 1 : want;
}

static int ofi_streams_capped(const struct ofi_dev* dev, int want) {
  static int warned;
  const char* prov = dev->info->fabric_attr->prov_name;
  int n = mk_ofi_streams_cap(prov, want);
  if (n != want && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    MK_WARN(
        "ofi: provider %s takes one endpoint per comm, not %d (its receives were seen "
        "cancelled when several connect at once)",
        prov, want);
  return n;
}

/* The cores the calling thread may run on; threads it starts inherit them (under NCCL the
 * proxy thread's, which NCCL may have bound to the GPU's NUMA node). */
int ofi_thread_cores(void) {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

/* tcp's progress is syscalls (poll, recvmsg, sendmsg), which belong off NCCL's proxy thread;
 * but a thread per comm that spins while it has work needs cores to spin on (on 2 cores a
 * 4 KiB ping-pong went from 19 to 55 us one way with it). Elsewhere (efa: a CQ read is cheap)
 * unmeasured, so off. */
#define OFI_PROGRESS_MIN_CORES 8
int mk_ofi_progress_auto(const char* provider, int cores) {
  return ofi_is_tcp(provider) && cores >= OFI_PROGRESS_MIN_CORES;
}

int mk_ofi_progress_thread_on(const char* provider) {
  int64_t set = mk_param_int(MK_PARAM_OFI_PROGRESS_THREAD);
  return set >= 0 ? (int)set : mk_ofi_progress_auto(provider, ofi_thread_cores());
}

/* NCCL_MK_OFI_STREAMS, or with 0 (auto) mk_ofi_auto_streams of the device's provider. */
int ofi_streams_default(const struct ofi_dev* dev) {
  int64_t set = mk_param_int(MK_PARAM_OFI_STREAMS);
  return set > 0 ? (int)set : mk_ofi_auto_streams(dev->info->fabric_attr->prov_name);
}

/* Every comm from its creation to its destroy (a dead peer's comm stays: ofi_close). */
static pthread_mutex_t ofi_live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ofi_comm* ofi_live;

static void ofi_live_add(struct ofi_comm* c) {
  pthread_mutex_lock(&ofi_live_mu);
  c->live_next = ofi_live;
  if (ofi_live) ofi_live->live_prev = c;
  ofi_live = c;
  pthread_mutex_unlock(&ofi_live_mu);
}

static void ofi_live_remove(struct ofi_comm* c) {
  pthread_mutex_lock(&ofi_live_mu);
  if (c->live_prev) c->live_prev->live_next = c->live_next;
  else if (ofi_live == c) ofi_live = c->live_next;
  if (c->live_next) c->live_next->live_prev = c->live_prev;
  c->live_prev = c->live_next = NULL;
  pthread_mutex_unlock(&ofi_live_mu);
}

void ofi_comms_stop_threads(void) {
  pthread_mutex_lock(&ofi_live_mu);
  for (struct ofi_comm* c = ofi_live; c; c = c->live_next) {
    ofi_progress_stop(c);
    ofi_streams_stop(c);
  }
  pthread_mutex_unlock(&ofi_live_mu);
}

void ofi_comms_visit_idle(const struct ofi_comm* self, void (*fn)(struct ofi_comm*)) {
  if (pthread_mutex_trylock(&ofi_live_mu) != 0) return;
  for (struct ofi_comm* c = ofi_live; c; c = c->live_next) {
    if (c == self || pthread_mutex_trylock(&c->lock) != 0) continue;
    if (c->base.ops == &mk_ofi_ops) fn(c); /* a closed comm's ops are cleared under its lock */
    pthread_mutex_unlock(&c->lock);
  }
  pthread_mutex_unlock(&ofi_live_mu);
}

int ofi_comm_create(struct ofi_dev* dev, int is_send, struct ofi_comm** out) {
  int rc;
  *out = NULL;
  MK_CHECK(ofi_dev_open(dev));
  struct ofi_comm* c = calloc(1, sizeof(*c));
  if (!c) return -ENOMEM;
  c->base.ops = &mk_ofi_ops;
  c->base.dev = (int)(dev - ofi.devs);
  c->is_send = is_send;
  c->dev = dev;
  c->sock = -1;
  pthread_mutex_init(&c->lock, NULL);
  ofi_runner_init(&c->own_runner);
  for (int k = 0; k < MK_OFI_MAX_STREAMS; k++) {
    pthread_mutex_init(&c->st[k].mu, NULL);
    pthread_cond_init(&c->st[k].cv, NULL);
  }
  ofi_live_add(c);
  uint32_t nreq = is_send ? MK_MAX_REQUESTS * MK_MAX_RECVS : MK_MAX_REQUESTS;
  MK_CHECK_GOTO(mk_req_pool_init(&c->pool, nreq, sizeof(struct ofi_req)), rc, fail);
  c->sig_wait = calloc(nreq, sizeof(*c->sig_wait));
  if (!c->sig_wait) {
    rc = -ENOMEM;
    goto fail;
  }
  const struct mk_conn_hints* hints = mk_conn_hints_get();
  int hinted = hints->streams;
  c->nstreams = ofi_streams_capped(
      dev, hinted >= 1 && hinted <= MK_OFI_MAX_STREAMS ? hinted : ofi_streams_default(dev));
  c->connect_ahead = hints->connect_ahead;
  c->stream_posts = (int)mk_param_int(MK_PARAM_OFI_STREAM_POSTS);
  c->stream_linger_ns = (uint64_t)mk_param_int(MK_PARAM_OFI_STREAM_LINGER_US) * 1000u;
  c->progress_wanted = hints->progress_thread < 0   ? OFI_PROGRESS_NCCL
                       : hints->progress_thread > 0 ? hints->progress_thread
                       : mk_ofi_progress_thread_on(dev->info->fabric_attr->prov_name);
  c->stripe_min = (uint64_t)mk_param_int(MK_PARAM_OFI_STRIPE_MIN);
  c->thread_send_min = (uint64_t)mk_param_int(MK_PARAM_OFI_THREAD_SEND_MIN);
  c->caller_progress_max = (uint64_t)mk_param_int(MK_PARAM_OFI_CALLER_PROGRESS_MAX);
  c->write_piece_min = (uint64_t)mk_param_int(MK_PARAM_OFI_WRITE_PIECE_MIN);
  for (int k = 0; k < c->nstreams; k++) {
    MK_CHECK_GOTO(ofi_stream_open(c, &c->st[k]), rc, fail);
    if (c->st[k].addr_len != c->st[0].addr_len || c->st[k].addr_len > MK_OFI_ADDR_MAX) {
      rc = -EPROTO; /* the hello carries one address length for all */
      goto fail;
    }
  }
  MK_CHECK_GOTO(ofi_internal_reg(c, c->pool.slots, c->pool.slot_size * nreq, &c->pool_mr,
                                 &c->pool_desc), rc, fail);
  if (is_send) MK_CHECK_GOTO(ofi_ctrl_setup(c), rc, fail);
  *out = c;
  return 0;
fail:
  ofi_comm_destroy(c);
  return rc;
}

/* Reverse order of creation. Closing the endpoint first discards whatever is still posted,
 * so no provider write can land in memory freed below. */
void ofi_comm_close_fabric(struct ofi_comm* c) {
  ofi_streams_stop(c); /* no thread may be inside fi_cq_read of what goes below */
  ofi_progress_stop(c); /* already stopped by close; here for a comm that failed to connect */
  for (int k = 0; k < MK_OFI_MAX_STREAMS; k++) ofi_stream_close_ep(&c->st[k]);
  if (c->ctrl_mr) fi_close(&c->ctrl_mr->fid);
  if (c->pool_mr) fi_close(&c->pool_mr->fid);
  ofi_eager_close_fabric(c);
  for (int k = 0; k < MK_OFI_MAX_STREAMS; k++) ofi_stream_close_rest(&c->st[k]);
  c->ctrl_mr = NULL, c->pool_mr = NULL;
}

void ofi_comm_destroy(struct ofi_comm* c) {
  if (!c) return;
  ofi_live_remove(c);
  ofi_comm_close_fabric(c);
  free(c->ctrl);
  free(c->sig_wait);
  ofi_eager_destroy(c);
  mk_req_pool_fini(&c->pool);
  if (c->sock >= 0) close(c->sock);
  for (int k = 0; k < MK_OFI_MAX_STREAMS; k++) {
    pthread_mutex_destroy(&c->st[k].mu);
    pthread_cond_destroy(&c->st[k].cv);
  }
  ofi_runner_destroy(&c->own_runner);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

int ofi_comm_set_peer(struct ofi_comm* c, int k, const uint8_t* addr, size_t len) {
  if (len == 0 || len > MK_OFI_ADDR_MAX) return -EBADMSG;
  int n = fi_av_insert(c->st[k].av, addr, 1, &c->st[k].peer, 0, NULL);
  if (n != 1) {
    MK_WARN("ofi: cannot insert the peer's fabric address (%s)",
            ofi_sym.strerror(n < 0 ? -n : FI_EINVAL));
    return n < 0 ? n : -EIO;
  }
  return 0;
}
