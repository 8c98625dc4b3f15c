/*
 * Connection setup over a TCP side channel: listen puts {address, nonce} into the handle;
 * connect and accept are non-blocking state machines that exchange one hello each way
 * {magic, version, nonce, fabric addresses, eager offer} and insert the peer into the comm's
 * AV; then the connector, whose AV now knows the acceptor, says so (4 bytes), and only then
 * does the acceptor's comm exist: with eager sends either end may open the fabric connection
 * first, and tcp;ofi_rxm broke it (broken pipe) when a message came from an address its AV
 * did not hold yet and the AV's owner then sent too. The
 * socket then stays open for the comm's lifetime: EOF without "bye" means the peer died.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "handle.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"
#include "side_channel.h"

#define OFI_LISTEN_MAGIC 0x4c494f46u /* "FOIL" */
#define OFI_ACK_MAGIC 0x4b434148u    /* "HACK": the connector's AV holds the acceptor */

struct ofi_handshake {
  int fd;
  int connecting;  /* connector: TCP connect still in progress */
  int out_ready;   /* acceptor: our hello is prepared once the peer's arrived */
  int heard;       /* the caller's hello passed its checks: our peer, not a stranger */
  struct mk_ofi_hello out, in;
  size_t out_off, in_off;
  uint32_t ack;     /* third leg, connector to acceptor */
  size_t ack_off;
  uint64_t nonce, deadline_ns;
  struct ofi_comm* comm;
};


/* In-progress connects; their state is a struct ofi_handshake. */
static struct mk_pending_list pending = MK_PENDING_LIST_INIT;

static struct ofi_handshake* ofi_hs_new(int fd, struct ofi_comm* c, uint64_t nonce, int connector) {
  struct ofi_handshake* hs = calloc(1, sizeof(*hs));
  if (!hs) return NULL;
  hs->fd = fd;
  hs->comm = c;
  hs->nonce = nonce;
  hs->connecting = connector;
  hs->out_ready = connector;
  hs->deadline_ns = mk_now_ns() + mk_connect_timeout_ns();
  hs->ack = connector ? OFI_ACK_MAGIC : 0;
  hs->out = (struct mk_ofi_hello){.magic = MK_OFI_HELLO_MAGIC, .version = MK_OFI_PROTO_VERSION,
                                  .addr_len = (uint16_t)c->st[0].addr_len, .nonce = nonce,
                                  .nstreams = (uint8_t)c->nstreams};
  for (int k = 0; k < c->nstreams; k++) memcpy(hs->out.addr[k], c->st[k].addr, c->st[k].addr_len);
  ofi_eager_offer(c, &hs->out);
  ofi_write_offer(c, &hs->out);
  return hs;
}

/* mk_handshake_ops' free and step take the handshake untyped: these are them. */
static void ofi_hs_free(void* state, int keep) {
  struct ofi_handshake* hs = state;
  if (!hs) return;
  if (!keep) {
    if (hs->fd >= 0) close(hs->fd);
    ofi_comm_destroy(hs->comm);
  }
  free(hs);
}

static int ofi_hello_check(const struct ofi_handshake* hs) {
  const struct mk_ofi_hello* h = &hs->in;
  if (h->magic != MK_OFI_HELLO_MAGIC || h->nonce != hs->nonce) {
    MK_WARN("ofi: a connection with a foreign hello (not our peer) was dropped");
    return -EBADMSG;
  }
  if (h->version != MK_OFI_PROTO_VERSION) {
    MK_WARN("ofi: peer speaks wire protocol %u, we speak %d (version 5 added messages written with RMA): "
            "run the same nccl-mk build on every host", h->version, MK_OFI_PROTO_VERSION);
    return -EPROTO;
  }
  if (h->nstreams < 1 || h->nstreams > MK_OFI_MAX_STREAMS) return -EBADMSG;
  return h->addr_len && h->addr_len <= MK_OFI_ADDR_MAX ? 0 : -EBADMSG;
}

/* Both ends use min(ours, theirs) streams (NCCL_MK_OFI_STREAMS may differ between hosts):
 * our extra endpoints are closed, and each stream learns its peer endpoint. */
static int ofi_hs_peers(struct ofi_handshake* hs) {
  struct ofi_comm* c = hs->comm;
  int n = (int)hs->in.nstreams < c->nstreams ? (int)hs->in.nstreams : c->nstreams;
  for (int k = n; k < c->nstreams; k++) {
    ofi_stream_close_ep(&c->st[k]);
    ofi_stream_close_rest(&c->st[k]);
  }
  c->nstreams = n;
  for (int k = 0; k < n; k++) MK_CHECK(ofi_comm_set_peer(c, k, hs->in.addr[k], hs->in.addr_len));
  return 0;
}

/* 1: handshake complete, 0: call again, <0: failed. */
static int ofi_hs_step(void* state) {
  struct ofi_handshake* hs = state;
  int rc;
  if (hs->connecting) {
    rc = mk_sock_connect_poll(hs->fd);
    if (rc < 0) return rc;
    if (rc == 0) goto wait;
    hs->connecting = 0;
  }
  if (hs->in_off < sizeof(hs->in)) {
    rc = mk_sock_recv_some(hs->fd, &hs->in, sizeof(hs->in), &hs->in_off);
    if (rc < 0) return rc;
    if (rc == 1) {
      MK_CHECK(ofi_hello_check(hs));
      MK_CHECK(ofi_hs_peers(hs));
      MK_CHECK(ofi_eager_agree(hs->comm, &hs->out, &hs->in));
      ofi_write_agree(hs->comm, &hs->out, &hs->in);
      hs->out_ready = 1; /* the acceptor answers once it knows who called */
      hs->heard = 1;
    }
  }
  if (hs->out_ready) MK_CHECK(mk_sock_send_some(hs->fd, &hs->out, sizeof(hs->out), &hs->out_off));
  if (hs->in_off == sizeof(hs->in) && hs->out_off == sizeof(hs->out)) {
    rc = hs->comm->is_send ? mk_sock_send_some(hs->fd, &hs->ack, sizeof(hs->ack), &hs->ack_off)
                           : mk_sock_recv_some(hs->fd, &hs->ack, sizeof(hs->ack), &hs->ack_off);
    if (rc < 0) return rc;
    if (rc == 1) {
      if (hs->ack != OFI_ACK_MAGIC) return -EBADMSG;
      if (ofi_streams_start(hs->comm) < 0 || ofi_progress_start(hs->comm) < 0) return -EAGAIN;
      if (hs->comm->connect_ahead) ofi_streams_connect_ahead(hs->comm);
      return 1;
    }
  }
wait:
  if (mk_now_ns() > hs->deadline_ns) {
    MK_WARN("ofi: connection handshake did not finish within NCCL_MK_CONNECT_TIMEOUT_MS=%lld",
            (long long)mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS));
    return -ETIMEDOUT;
  }
  return 0;
}

static int ofi_dev_get(int dev, struct ofi_dev** out) {
  if (dev < 0 || dev >= ofi.ndev) {
    MK_WARN("ofi: device %d does not exist (%d devices)", dev, ofi.ndev);
    return -EINVAL;
  }
  *out = &ofi.devs[dev];
  return 0;
}

/* A done handshake's comm, and the handshake ops (mk_side_connect, mk_side_accept). */
static struct mk_comm* ofi_hs_comm(void* state) {
  struct ofi_handshake* hs = state;
  hs->comm->sock = hs->fd;
  return &hs->comm->base;
}
static int ofi_hs_heard(const void* state) { return ((const struct ofi_handshake*)state)->heard; }

static const struct mk_handshake_ops ofi_hs_ops = {
    "ofi", ofi_hs_step, ofi_hs_comm, ofi_hs_free, ofi_hs_heard, MK_HANDLE_TRANSPORT_OFI};

int ofi_listen(int dev, void* handle, void** listen_comm) {
  struct ofi_dev* d;
  if (!handle || !listen_comm) return -EINVAL;
  *listen_comm = NULL;
  MK_CHECK(ofi_dev_get(dev, &d));
  return mk_listen_comm_open(OFI_LISTEN_MAGIC, &ofi_hs_ops, dev, handle, listen_comm);
}

/* The connector's handshake: a send comm on device ctx, TCP connect started. */
static int ofi_connect_begin(void* ctx, const struct mk_handle* h, void** out) {
  struct ofi_comm* c = NULL;
  int fd = -1, rc;
  MK_CHECK_GOTO(ofi_comm_create(ctx, 1, &c), rc, fail);
  MK_CHECK_GOTO(mk_sock_connect_start(&h->addr, &fd), rc, fail);
  *out = ofi_hs_new(fd, c, h->nonce, 1);
  if (*out) return 0;
  rc = -ENOMEM;
fail:
  if (fd >= 0) close(fd);
  ofi_comm_destroy(c);
  return rc;
}

int ofi_connect(int dev, const void* handle, int traffic_class, struct mk_comm** send_comm) {
  struct ofi_dev* d;
  struct mk_handle h;
  (void)traffic_class;
  if (!handle || !send_comm) return -EINVAL;
  *send_comm = NULL;
  MK_CHECK(ofi_dev_get(dev, &d));
  MK_CHECK(mk_handle_decode(handle, MK_HANDLE_MAX, &h));
  return mk_side_connect(&pending, &ofi_hs_ops, handle, &h, ofi_connect_begin, d, send_comm);
}

/* The acceptor's handshake on a new socket: a receive comm (fd closed if it cannot start). */
static int ofi_accept_begin(void* ctx, int fd, void** out) {
  const struct mk_listen_comm* lc = ctx;
  struct ofi_comm* c = NULL;
  int rc = ofi_comm_create(&ofi.devs[lc->side.dev], 0, &c);
  if (rc == 0) {
    *out = ofi_hs_new(fd, c, lc->side.nonce, 0);
    if (*out) return 0;
    rc = -ENOMEM;
  }
  ofi_comm_destroy(c);
  close(fd);
  return rc;
}

int ofi_accept(void* listen_comm, struct mk_comm** recv_comm) {
  return mk_side_accept(listen_comm, OFI_LISTEN_MAGIC, &ofi_hs_ops, ofi_accept_begin, listen_comm, recv_comm);
}

int ofi_close_listen(void* listen_comm) { return mk_listen_comm_close(listen_comm, OFI_LISTEN_MAGIC, &ofi_hs_ops); }

/* NCCL may close a comm from its service thread while its progress thread is still inside
 * test() on it (ncclCommAbort after a peer died): take the comm's lock so the provider
 * objects are never torn down under a running operation. */
int ofi_close(struct mk_comm* comm) {
  struct ofi_comm* c = (struct ofi_comm*)comm;
  if (!comm || comm->ops != &mk_ofi_ops) return -EINVAL;
  ofi_progress_stop(c); /* before the lock: the thread takes it */
  pthread_mutex_lock(&c->lock);
  comm->ops = NULL; /* a late call through a stale pointer fails its check, not the provider */
  uint32_t inflight = mk_req_pool_in_use(&c->pool);
  if (c->n_resumed)
    MK_INFO(MK_NCCL_SUBSYS_NET, "ofi: comm %p: %llu sends found no room in the provider after their first "
            "stripe and were resumed later", (void*)c, (unsigned long long)c->n_resumed);
  if (inflight)
    MK_INFO(MK_NCCL_SUBSYS_NET, "ofi: closing a comm with %u requests in flight (cancelled)",
            inflight);
  int peer_dead = c->error == -ECONNRESET || mk_sock_peer_state(c->sock) == MK_PEER_DEAD;
  if (!peer_dead) ofi_eager_close_drain(c);
  mk_sock_close_graceful(c->sock); /* "bye": the peer lets in-flight data drain */
  c->sock = -1;
  ofi_streams_stop(c); /* joined in both cases: no thread outlives its comm */
  if (peer_dead) {
    /* NOTES: libfabric 1.17's tcp;ofi_rxm crashed (SIGSEGV inside fi_close of the endpoint)
     * in 3 of 5 NCCL aborts after a peer was killed (bench/NOTES.md), also on comms where no
     * operation had noticed the death yet. A dead peer's comm and
     * its provider objects are left allocated: a bounded leak per dead connection instead
     * of a crashed job. Its ops pointer is cleared, so nothing can use it again. */
    MK_INFO(MK_NCCL_SUBSYS_NET, "ofi: peer of comm %p is dead; its endpoint is left open",
            (void*)c);
    pthread_mutex_unlock(&c->lock);
    return 0;
  }
  ofi_comm_close_fabric(c);
  pthread_mutex_unlock(&c->lock);
  ofi_comm_destroy(c);
  return 0;
}
