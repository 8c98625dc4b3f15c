/*
 * Connection setup over the TCP side channel. listen puts {address, nonce} in the handle.
 * connect and accept are non-blocking state machines:
 *   connector: TCP connect, create QPs, send hello -> receive the acceptor's hello, move QPs
 *              to RTS, send one "ready" byte -> comm;
 *   acceptor:  receive the hello (nonce checked), create as many QPs, move them to RTS, send
 *              its hello -> wait for "ready" -> comm.
 * "ready" makes sure the connector's QPs are at RTR before the acceptor may write into them
 * (a write to a QP still in INIT is dropped and only recovered by the ~4 s retry timer).
 * The socket stays open: EOF without "bye" later means the peer died.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "handle.h"
#include "ib.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "side_channel.h"

#define IB_LISTEN_MAGIC 0x4c4e4249u
#define IB_READY 'R'

struct ib_handshake {
  int fd;
  int connector;
  int connecting;      /* connector: TCP connect in progress */
  int dev;
  int tc;
  uint64_t nonce, deadline_ns;
  struct ib_comm* comm; /* connector: from the start; acceptor: once the hello is in */
  struct ib_hello in;
  size_t in_off, out_off, ready_off;
  int out_ready;       /* our hello is prepared */
  int heard;           /* the caller's hello passed its checks: our peer, not a stranger */
  char ready;
};


/* In-progress connects; their state is a struct ib_handshake. */
static struct mk_pending_list pending = MK_PENDING_LIST_INIT;

static struct ib_handshake* ib_hs_new(int fd, int dev, int tc, uint64_t nonce, int connector) {
  struct ib_handshake* hs = calloc(1, sizeof(*hs));
  if (!hs) return NULL;
  hs->fd = fd;
  hs->dev = dev;
  hs->tc = tc;
  hs->nonce = nonce;
  hs->connector = hs->connecting = connector;
  hs->ready = IB_READY;
  hs->deadline_ns = mk_now_ns() + mk_connect_timeout_ns();
  return hs;
}

/* mk_handshake_ops' free and step take the handshake untyped: these are them. */
static void ib_hs_free(void* state, int keep) {
  struct ib_handshake* hs = state;
  if (!hs) return;
  if (!keep) {
    if (hs->fd >= 0) close(hs->fd);
    ib_comm_destroy(hs->comm);
  }
  free(hs);
}

/* Builds the comm and our hello: the connector picks nqps, the acceptor follows. */
static int ib_hs_build(struct ib_handshake* hs, int nqps) {
  struct ib_vdev* v;
  MK_CHECK(ib_vdev_get(hs->dev, &v));
  MK_CHECK(ib_comm_create(v, hs->connector, hs->tc, &hs->comm));
  if (nqps > IB_MAX_QPS) nqps = IB_MAX_QPS;
  MK_CHECK(ib_comm_plan_qps(hs->comm, nqps));
  hs->comm->local.nonce = hs->nonce;
  hs->out_ready = 1;
  return 0;
}

static int ib_hs_hello_in(struct ib_handshake* hs) {
  int rc = ib_hello_valid(&hs->in, hs->nonce);
  if (rc) {
    if (rc == -EBADMSG) MK_WARN("ib: a connection with a foreign hello (not our peer) was dropped");
    return rc;
  }
  if (!hs->connector) MK_CHECK(ib_hs_build(hs, hs->in.nqps));
  hs->comm->remote = hs->in;
  return ib_comm_connect_qps(hs->comm);
}

/* 1: complete, 0: call again, <0: failed. */
static int ib_hs_step(void* state) {
  struct ib_handshake* hs = state;
  int rc;
  if (hs->connecting) {
    rc = mk_sock_connect_poll(hs->fd);
    if (rc < 0) return rc;
    if (rc == 0) goto wait;
    hs->connecting = 0;
  }
  if (hs->out_ready)
    MK_CHECK(mk_sock_send_some(hs->fd, &hs->comm->local, sizeof(struct ib_hello), &hs->out_off));
  if (hs->in_off < sizeof(hs->in)) {
    rc = mk_sock_recv_some(hs->fd, &hs->in, sizeof(hs->in), &hs->in_off);
    if (rc < 0) return rc;
    if (rc == 1) {
      MK_CHECK(ib_hs_hello_in(hs));
      hs->heard = 1;
      if (hs->out_ready)
        MK_CHECK(mk_sock_send_some(hs->fd, &hs->comm->local, sizeof(struct ib_hello), &hs->out_off));
    }
  }
  int hellos_done = hs->in_off == sizeof(hs->in) && hs->out_off == sizeof(struct ib_hello);
  if (hellos_done && hs->ready_off == 0) {
    char b = 0;
    size_t off = 0;
    rc = hs->connector ? mk_sock_send_some(hs->fd, &hs->ready, 1, &off)
                       : mk_sock_recv_some(hs->fd, &b, 1, &off);
    if (rc < 0) return rc;
    if (rc == 1 && !hs->connector && b != IB_READY) return -EBADMSG;
    if (rc == 1) return 1;
  }
wait:
  if (mk_now_ns() > hs->deadline_ns) {
    MK_WARN("ib: connection handshake did not finish within NCCL_MK_CONNECT_TIMEOUT_MS=%lld",
            (long long)mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS));
    return -ETIMEDOUT;
  }
  return 0;
}

/* A done handshake's comm, and the handshake ops (mk_side_connect, mk_side_accept). */
static struct mk_comm* ib_hs_comm(void* state) {
  struct ib_handshake* hs = state;
  hs->comm->sock = hs->fd;
  hs->comm->base.dev = hs->dev;
  return &hs->comm->base;
}
static int ib_hs_heard(const void* state) { return ((const struct ib_handshake*)state)->heard; }

static const struct mk_handshake_ops ib_hs_ops = {
    "ib", ib_hs_step, ib_hs_comm, ib_hs_free, ib_hs_heard, MK_HANDLE_TRANSPORT_IB};

int ib_listen(int dev, void* handle, void** listen_comm) {
  struct ib_vdev* v;
  if (!handle || !listen_comm) {
    MK_WARN("ib listen: bad argument (handle %p, listen_comm %p)", handle, (void*)listen_comm);
    return -EINVAL;
  }
  *listen_comm = NULL;
  MK_CHECK(ib_vdev_get(dev, &v));
  return mk_listen_comm_open(IB_LISTEN_MAGIC, &ib_hs_ops, dev, handle, listen_comm);
}

struct ib_connect_ctx {
  int dev, tc;
};

/* The connector's handshake: TCP connect started, QPs planned, our hello prepared. */
static int ib_connect_begin(void* ctx, const struct mk_handle* h, void** out) {
  const struct ib_connect_ctx* c = ctx;
  int fd = -1;
  MK_CHECK(mk_sock_connect_start(&h->addr, &fd));
  struct ib_handshake* hs = ib_hs_new(fd, c->dev, c->tc, h->nonce, 1);
  if (!hs) {
    close(fd);
    return -ENOMEM;
  }
  const int rc = ib_hs_build(hs, (int)mk_param_int(MK_PARAM_IB_QPS) * ib.devs[c->dev].nrails);
  if (rc < 0) {
    ib_hs_free(hs, 0);
    return rc;
  }
  *out = hs;
  return 0;
}

int ib_connect(int dev, const void* handle, int traffic_class, struct mk_comm** send_comm) {
  struct ib_vdev* v;
  struct mk_handle h;
  if (!handle || !send_comm) {
    MK_WARN("ib connect: bad argument (handle %p, send_comm %p)", handle, (void*)send_comm);
    return -EINVAL;
  }
  *send_comm = NULL;
  MK_CHECK(ib_vdev_get(dev, &v));
  MK_CHECK(mk_handle_decode(handle, MK_HANDLE_MAX, &h));
  struct ib_connect_ctx ctx = {dev, traffic_class};
  return mk_side_connect(&pending, &ib_hs_ops, handle, &h, ib_connect_begin, &ctx, send_comm);
}

/* The acceptor's handshake on a new socket (closed if it cannot start). */
static int ib_accept_begin(void* ctx, int fd, void** out) {
  const struct mk_listen_comm* lc = ctx;
  *out = ib_hs_new(fd, lc->side.dev, -1, lc->side.nonce, 0);
  if (*out) return 0;
  close(fd);
  return -ENOMEM;
}

int ib_accept(void* listen_comm, struct mk_comm** recv_comm) {
  return mk_side_accept(listen_comm, IB_LISTEN_MAGIC, &ib_hs_ops, ib_accept_begin, listen_comm, recv_comm);
}

int ib_close_listen(void* listen_comm) { return mk_listen_comm_close(listen_comm, IB_LISTEN_MAGIC, &ib_hs_ops); }

/* NCCL may close a comm from its service thread while its proxy thread is still inside test()
 * on it (ncclCommAbort after a peer died): the comm's lock lets that call end before the QPs
 * and CQs go, and the cleared ops pointer fails any later call's check (as ofi_close). */
int ib_close(struct mk_comm* comm) {
  struct ib_comm* c = (struct ib_comm*)comm;
  if (!comm || comm->ops != &mk_ib_ops) {
    MK_WARN("ib close: bad comm %p", (void*)comm);
    return -EINVAL;
  }
  pthread_mutex_lock(&c->lock);
  comm->ops = NULL;
  uint32_t inflight = mk_req_pool_in_use(&c->pool);
  pthread_mutex_unlock(&c->lock);
  if (inflight)
    MK_INFO(MK_NCCL_SUBSYS_NET, "ib: closing a comm with %u requests in flight (cancelled)",
            inflight);
  ib_comm_destroy(c); /* sends "bye" on the side channel: the peer lets in-flight data drain */
  return 0;
}
