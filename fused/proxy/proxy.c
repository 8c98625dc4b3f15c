/* The proxy thread: descriptors from the queue become one-sided transport operations. */
#include "proxy.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mk_clock.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"

#define HELLO_TAG 0x4d
#define DEFAULT_INFLIGHT 16
#define MAX_INFLIGHT 256

enum { OP_FREE = 0, OP_WAIT_POST, OP_POSTED, OP_DONE };

struct proxy_op {
  struct mk_proxy_desc d;
  uint64_t ticket;
  struct mk_request* req;
  int state;
};

struct proxy_peer {
  struct mk_comm* send; /* our puts to the peer */
  struct mk_comm* recv; /* the peer's puts land on this endpoint */
  struct mk_rkey data, flags;
  struct mk_request* hello_req;
  int hello_done;
  uint64_t sent_bytes, sent_ops; /* atomics */
  uint64_t posted_bytes;           /* data posted and not completed yet (the thread's) */
  uint64_t peak_posted;            /* the most posted_bytes ever was (atomic) */
  int closed;                      /* it closed while the ranks were leaving: skipped since */
};

struct accepted {
  struct mk_comm* comm;
  struct mk_request* req;
  uint64_t msg;
  int done;
};

struct mk_proxy {
  struct mk_proxy_conf conf;
  const struct mk_transport_ops* ops;
  unsigned char* remote;
  int nremote;
  void* listen_comm;
  unsigned char handle[MK_HANDLE_MAX];
  struct proxy_peer* peers;
  struct mk_comm* mr_comm;
  struct mk_mr *data_mr, *flags_mr;
  uint64_t hello_msg;
  /* the thread's state */
  struct proxy_op* ops_fifo; /* ring of max_inflight, in ticket order */
  int cap;
  uint64_t inflight_bytes; /* per peer: data posted at once (beyond one descriptor) */
  uint64_t fifo_head, fifo_tail; /* counters; entry = counter % cap */
  uint64_t next_ticket;          /* the next descriptor to consume */
  pthread_t thread;
  int started, joined;
  int go;     /* atomic: an armed thread may start its loop (mk_proxy_go) */
  int stop;   /* atomic: asks the thread to drain and exit */
  int tid;    /* atomic */
  int failed; /* atomic: err is valid */
  int leaving; /* atomic: the peers are closing; a transport error closes only its peer */
  struct mk_proxy_error err;
};

static const char* kind_name(uint32_t k) {
  switch (k) {
    case MK_PROXY_ERR_TRANSPORT: return "transport error";
    case MK_PROXY_ERR_BAD_DESC: return "malformed descriptor";
    case MK_PROXY_ERR_QUEUE_FULL: return "descriptor queue full";
    case MK_PROXY_ERR_FLAG_TIMEOUT: return "flag wait timed out";
    case MK_PROXY_ERR_COMPLETION_TIMEOUT: return "completion wait timed out";
    default: return "error";
  }
}

void mk_proxy_error_format(const struct mk_proxy_error* e, char* msg, size_t len) {
  if (!msg || !len) return;
  if (e->seq == ~0ull)
    snprintf(msg, len, "rank %d: proxy %s (%s) with peer %d, no descriptor in flight "
             "(flag offset %" PRIu64 ", expected %" PRIu64 ", seen %" PRIu64 ")", e->rank,
             kind_name(e->kind), strerror(-e->err), e->peer, e->flag_off, e->expected, e->seen);
  else
    snprintf(msg, len, "rank %d: proxy %s (%s) with peer %d at descriptor %" PRIu64
             " (op 0x%x, tag 0x%x, flag offset %" PRIu64 ", expected %" PRIu64 ", seen %" PRIu64
             ")", e->rank, kind_name(e->kind), strerror(-e->err), e->peer, e->seq, e->op,
             e->tag, e->flag_off, e->expected, e->seen);
}

int mk_proxy_desc_check(const struct mk_proxy_desc* d, int nranks, const unsigned char* remote,
                        size_t data_bytes, const struct mk_rkey* peer_data,
                        const struct mk_rkey* peer_flags) {
  uint32_t op = d->op & MK_PROXY_OP_MASK;
  if ((d->op & ~(MK_PROXY_OP_MASK | MK_PROXY_FENCE)) || op < MK_PROXY_PUT ||
      op > MK_PROXY_SIGNAL)
    return -EINVAL;
  if (d->peer < 0 || d->peer >= nranks || !remote[d->peer]) return -EINVAL;
  if (op != MK_PROXY_SIGNAL) {
    if (d->src_off > data_bytes || d->size > data_bytes - d->src_off) return -EINVAL;
    if (d->dst_off > peer_data->size || d->size > peer_data->size - d->dst_off) return -EINVAL;
  }
  if (op != MK_PROXY_PUT) {
    if ((d->flag_off & 7) || peer_flags->size < 8 || d->flag_off > peer_flags->size - 8)
      return -EINVAL;
  }
  return 0;
}

int mk_proxy_create(const struct mk_proxy_conf* conf, struct mk_proxy** out) {
  *out = NULL;
  if (!conf || conf->nranks < 1 || conf->rank < 0 || conf->rank >= conf->nranks ||
      !conf->remote || !conf->queue || conf->queue->magic != MK_PROXY_QUEUE_MAGIC ||
      !conf->data || !conf->data_bytes || !conf->flags || conf->flags_bytes < 8 ||
      conf->max_inflight < 0 || conf->max_inflight > MAX_INFLIGHT || conf->streams < 0 ||
      conf->streams > 8) {
    MK_WARN("proxy: bad configuration");
    return -EINVAL;
  }
  struct mk_proxy* p = calloc(1, sizeof(*p));
  if (!p) return -ENOMEM;
  p->conf = *conf;
  p->remote = calloc((size_t)conf->nranks, 1);
  p->peers = calloc((size_t)conf->nranks, sizeof(*p->peers));
  p->cap = conf->max_inflight ? conf->max_inflight : DEFAULT_INFLIGHT;
  p->inflight_bytes = conf->inflight_bytes ? conf->inflight_bytes
                                           : (uint64_t)mk_param_int(MK_PARAM_PROXY_INFLIGHT_BYTES);
  p->ops_fifo = calloc((size_t)p->cap, sizeof(*p->ops_fifo));
  if (!p->remote || !p->peers || !p->ops_fifo) {
    mk_proxy_stop(p);
    return -ENOMEM;
  }
  for (int r = 0; r < conf->nranks; r++) {
    p->remote[r] = r != conf->rank && conf->remote[r];
    p->nremote += p->remote[r];
  }
  p->conf.remote = p->remote;
  p->hello_msg = ((uint64_t)(uint32_t)conf->rank << 32) | MK_PROXY_RECORD_MAGIC;
  int rc = 0;
  p->ops = conf->ops;
  if (!p->ops && p->nremote) rc = mk_transport_get(&p->ops);
  if (!rc && p->nremote) rc = p->ops->listen(conf->dev, p->handle, &p->listen_comm);
  if (rc) {
    MK_WARN("proxy rank %d: no transport to reach %d remote rank(s): %s", conf->rank,
            p->nremote, strerror(-rc));
    mk_proxy_stop(p);
    return rc;
  }
  *out = p;
  return 0;
}

int mk_proxy_addr(struct mk_proxy* p, struct mk_proxy_addr* mine) {
  memset(mine, 0, sizeof(*mine));
  mine->magic = MK_PROXY_RECORD_MAGIC;
  mine->rank = p->conf.rank;
  memcpy(mine->handle, p->handle, sizeof(mine->handle));
  return 0;
}

/* Drives one accepted comm's hello: 1 when it named its rank, 0 not yet, <0 error. */
static int accept_step(struct mk_proxy* p, struct accepted* a) {
  if (a->done) return 0;
  int rc;
  if (!a->req) {
    void* buf = &a->msg;
    size_t size = sizeof(a->msg);
    int tag = HELLO_TAG;
    MK_CHECK(p->ops->irecv(a->comm, 1, &buf, &size, &tag, NULL, 0, &a->req));
    if (!a->req) return 0;
  }
  int done = 0;
  MK_CHECK(rc = p->ops->test(a->req, &done, NULL));
  if (!done) return 0;
  a->req = NULL;
  a->done = 1;
  int r = (int)(a->msg >> 32);
  if ((uint32_t)a->msg != MK_PROXY_RECORD_MAGIC || r < 0 || r >= p->conf.nranks ||
      !p->remote[r] || p->peers[r].recv) {
    MK_WARN("proxy rank %d: an incoming connection introduced itself as %#" PRIx64, p->conf.rank,
            a->msg);
    return -EBADMSG;
  }
  p->peers[r].recv = a->comm;
  a->comm = NULL;
  return 1;
}

/* One pass over the remote ranks we dial: connect, send our hello, test it. 1 while any is
 * not done, 0 when all are, negative errno on failure. */
static int proxy_dial_step(struct mk_proxy* p, const struct mk_proxy_addr* all) {
  int pending = 0, rc = 0;
  for (int r = 0; r < p->conf.nranks && !rc; r++) {
    struct proxy_peer* q = &p->peers[r];
    if (!p->remote[r] || q->hello_done) continue;
    pending = 1;
    if (!q->send) {
      rc = p->ops->connect(p->conf.dev, all[r].handle, -1, &q->send);
      if (rc || !q->send) continue;
    }
    if (!q->hello_req) {
      rc = p->ops->isend(q->send, &p->hello_msg, sizeof(p->hello_msg), HELLO_TAG, NULL,
                         &q->hello_req);
      if (rc || !q->hello_req) continue;
    }
    int done = 0;
    rc = p->ops->test(q->hello_req, &done, NULL);
    if (!rc && done) q->hello_done = 1, q->hello_req = NULL;
  }
  return rc ? rc : pending;
}

/* Dials every remote rank and accepts each one's connection until all have named
 * themselves. Returns 0 or negative errno; *nnamed counts the accepted, named peers. */
static int proxy_connect_all(struct mk_proxy* p, const struct mk_proxy_addr* all, int* nnamed) {
  struct accepted* acc = calloc((size_t)p->nremote, sizeof(*acc));
  if (!acc) return -ENOMEM;
  int naccepted = 0, rc = 0;
  *nnamed = 0;
  uint64_t deadline = mk_now_ns() + 2 * mk_connect_timeout_ns();
  for (;;) {
    int pending = proxy_dial_step(p, all);
    if (pending < 0) rc = pending;
    if (!rc && naccepted < p->nremote) {
      rc = p->ops->accept(p->listen_comm, &acc[naccepted].comm);
      if (!rc && acc[naccepted].comm) naccepted++;
    }
    for (int i = 0; i < naccepted && !rc; i++) {
      int named = accept_step(p, &acc[i]);
      if (named < 0) rc = named;
      *nnamed += named > 0;
    }
    if (rc || (pending == 0 && *nnamed == p->nremote)) break;
    if (mk_now_ns() > deadline) {
      rc = -ETIMEDOUT;
      break;
    }
    sched_yield();
  }
  for (int i = 0; i < p->nremote; i++) /* comms that never named themselves */
    if (acc[i].comm) p->ops->close(acc[i].comm);
  free(acc);
  return rc;
}

/* One registration of each region, usable on every comm of the device. */
static int proxy_register_regions(struct mk_proxy* p) {
  struct mk_dev_props props;
  MK_CHECK(p->ops->get_properties(p->conf.dev, &props));
  if (!props.reg_is_global) {
    MK_WARN("proxy: transport %s registers per connection; the proxy needs one registration "
            "for every peer (not supported yet)", p->ops->name);
    return -ENOTSUP;
  }
  for (int r = 0; r < p->conf.nranks && !p->mr_comm; r++)
    if (p->remote[r]) p->mr_comm = p->peers[r].send;
  MK_CHECK(p->ops->reg_mr(p->mr_comm, p->conf.data, p->conf.data_bytes, p->conf.data_type,
                          &p->data_mr));
  MK_CHECK(p->ops->reg_mr(p->mr_comm, p->conf.flags, p->conf.flags_bytes, p->conf.flags_type,
                          &p->flags_mr));
  return 0;
}

int mk_proxy_connect(struct mk_proxy* p, const struct mk_proxy_addr* all) {
  const int n = p->conf.nranks, me = p->conf.rank;
  if (!p->nremote) return 0;
  for (int r = 0; r < n; r++)
    if (p->remote[r] && (all[r].magic != MK_PROXY_RECORD_MAGIC || all[r].rank != r)) {
      MK_WARN("proxy rank %d: rank %d's address record is corrupt", me, r);
      return -EBADMSG;
    }
  int nnamed = 0;
  /* no comm progress thread: the proxy's own thread progresses its comms all the time (with
   * one, a 2 MiB put+signal stream fell from 3.6 to 3.0 GB/s and the ops 1.25-1.37x -> 0.7x
   * against NCCL, 2xH200, bench/NOTES.md session 24) */
  struct mk_conn_hints hints = {
      .streams = p->conf.streams ? p->conf.streams : (int)mk_param_int(MK_PARAM_PROXY_STREAMS),
      .progress_thread = -1,
      .connect_ahead = 1}; /* every put uses every stream: form them all now, in parallel */
  mk_conn_hints_set(&hints); /* this thread's connects and accepts below */
  int rc = proxy_connect_all(p, all, &nnamed);
  mk_conn_hints_set(NULL);
  if (rc) {
    MK_WARN("proxy rank %d: connecting to %d remote rank(s) failed: %s (%d of them accepted)",
            me, p->nremote, strerror(-rc), nnamed);
    return rc;
  }
  MK_CHECK(proxy_register_regions(p));
  MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET, "proxy rank %d: connected to %d remote "
          "rank(s) over %s", me, p->nremote, p->ops->name);
  return 0;
}

int mk_proxy_keys(struct mk_proxy* p, struct mk_proxy_keys* mine) {
  memset(mine, 0, sizeof(*mine));
  mine->magic = MK_PROXY_RECORD_MAGIC;
  mine->rank = p->conf.rank;
  if (!p->nremote) return 0;
  if (!p->data_mr || !p->flags_mr) return -EINVAL; /* mk_proxy_connect first */
  MK_CHECK(p->ops->mr_rkey(p->data_mr, &mine->data));
  MK_CHECK(p->ops->mr_rkey(p->flags_mr, &mine->flags));
  return 0;
}

/* ---- the thread ---- */

/* A transport error with `peer` while the ranks are leaving is that peer's orderly close: it
 * is skipped from then on (what was still for it is dropped) and the thread goes on for the
 * others, whose goodbyes may still be on their way (3 or more nodes). 1 then, else 0. */
static int proxy_peer_closed(struct mk_proxy* p, int err, int peer) {
  if (!__atomic_load_n(&p->leaving, __ATOMIC_ACQUIRE) || peer < 0 || peer >= p->conf.nranks) return 0;
  if (!p->peers[peer].closed)
    MK_INFO(MK_NCCL_SUBSYS_NET, "proxy rank %d: peer %d closed while leaving (%s); the others go on",
            p->conf.rank, peer, strerror(-err));
  p->peers[peer].closed = 1;
  return 1;
}

static void proxy_fail(struct mk_proxy* p, int err, uint32_t kind, int peer,
                       const struct proxy_op* op) {
  struct mk_proxy_queue* q = p->conf.queue;
  uint64_t completed = __atomic_load_n(&q->completed, __ATOMIC_RELAXED);
  struct mk_proxy_error* e = &p->err;
  if (op)
    mk_proxy_error_raise(e, err, p->conf.rank, op->d.peer, kind, op->d.tag, op->ticket,
                         op->d.op, op->d.flag_off, op->d.flag_value, completed);
  else
    mk_proxy_error_raise(e, err, p->conf.rank, peer, kind, 0, ~0ull, 0, 0, 0, completed);
  /* the host's view first, then the queue's: whoever sees the queue's record also finds
   * mk_proxy_error() set */
  __atomic_store_n(&p->failed, 1, __ATOMIC_RELEASE);
  mk_proxy_error_raise(&q->proxy_err, e->err, e->rank, e->peer, e->kind, e->tag, e->seq, e->op,
                       e->flag_off, e->expected, e->seen);
  char msg[256];
  mk_proxy_error_format(e, msg, sizeof(msg));
  MK_WARN("%s", msg);
  if (p->conf.on_error) p->conf.on_error(p->conf.on_error_arg, e);
}

static struct proxy_op* fifo_at(struct mk_proxy* p, uint64_t i) {
  return &p->ops_fifo[i % (uint64_t)p->cap];
}

/* Takes published descriptors while there is room in flight. Returns how many, or <0. */
static int proxy_admit(struct mk_proxy* p) {
  struct mk_proxy_queue* q = p->conf.queue;
  int n = 0;
  while (p->fifo_tail - p->fifo_head < (uint64_t)p->cap) {
    struct proxy_op* op = fifo_at(p, p->fifo_tail);
    if (!mk_proxy_queue_peek(q, p->next_ticket, &op->d)) break;
    op->ticket = p->next_ticket++;
    op->req = NULL;
    mk_proxy_queue_release(q, p->next_ticket); /* the slot is ours no longer */
    int peer = op->d.peer;
    int ok = peer >= 0 && peer < p->conf.nranks && p->remote[peer];
    if (!ok || mk_proxy_desc_check(&op->d, p->conf.nranks, p->remote, p->conf.data_bytes,
                                   &p->peers[peer].data, &p->peers[peer].flags) != 0) {
      proxy_fail(p, -EINVAL, MK_PROXY_ERR_BAD_DESC, peer, op);
      return -EINVAL;
    }
    op->state = OP_WAIT_POST;
    p->fifo_tail++;
    n++;
  }
  return n;
}

static int proxy_post_one(struct mk_proxy* p, struct proxy_op* op) {
  struct proxy_peer* q = &p->peers[op->d.peer];
  const char* src = (const char*)p->conf.data + op->d.src_off;
  switch (op->d.op & MK_PROXY_OP_MASK) {
    case MK_PROXY_PUT:
      return p->ops->iput(q->send, src, op->d.size, p->data_mr, &q->data, op->d.dst_off, &op->req);
    case MK_PROXY_PUT_SIGNAL:
      return p->ops->iput_signal(q->send, src, op->d.size, p->data_mr, &q->data, op->d.dst_off,
                                 &q->flags, op->d.flag_off, op->d.flag_value, &op->req);
    default: /* SIGNAL: no data */
      return p->ops->iput_signal(q->send, p->conf.data, 0, p->data_mr, &q->data, 0, &q->flags,
                                 op->d.flag_off, op->d.flag_value, &op->req);
  }
}

/* The data bytes a descriptor moves: a SIGNAL's size field is none (it posts a 0-byte put
 * whatever the field says, and desc_check does not look at it), so neither the cap nor the
 * counters take it. */
static uint64_t proxy_data_bytes(const struct proxy_op* op) {
  return (op->d.op & MK_PROXY_OP_MASK) == MK_PROXY_SIGNAL ? 0 : op->d.size;
}

/* Whether op may be posted now: per peer in ticket order; a fenced descriptor only once every
 * earlier one to its peer has completed; data only while the peer's posted bytes stay within
 * the cap (or none are posted). Without a cap a whole call's blocks go at once, and where a
 * transport sends a put's signal behind the data posted before it (ofi with one stream) the
 * first flag lands with the last block (2xH200 trace, bench/NOTES.md). */
static int proxy_may_post(struct mk_proxy* p, uint64_t i) {
  const struct proxy_op* op = fifo_at(p, i);
  int fenced = (op->d.op & MK_PROXY_FENCE) || (op->d.op & MK_PROXY_OP_MASK) == MK_PROXY_SIGNAL;
  for (uint64_t j = p->fifo_head; j < i; j++) {
    const struct proxy_op* e = fifo_at(p, j);
    if (e->d.peer == op->d.peer && (e->state == OP_WAIT_POST || (fenced && e->state != OP_DONE)))
      return 0;
  }
  uint64_t posted = p->peers[op->d.peer].posted_bytes;
  return posted == 0 || posted + proxy_data_bytes(op) <= p->inflight_bytes;
}

/* Posts what may go (proxy_may_post). Returns how many were posted, or <0. */
static int proxy_post(struct mk_proxy* p) {
  int n = 0;
  for (uint64_t i = p->fifo_head; i < p->fifo_tail; i++) {
    struct proxy_op* op = fifo_at(p, i);
    if (op->state != OP_WAIT_POST || !proxy_may_post(p, i)) continue;
    int rc = p->peers[op->d.peer].closed ? -ECONNRESET : proxy_post_one(p, op);
    if (rc < 0 && proxy_peer_closed(p, rc, op->d.peer)) {
      op->state = OP_DONE; /* dropped: its peer is gone */
      continue;
    }
    if (rc < 0) {
      proxy_fail(p, rc, MK_PROXY_ERR_TRANSPORT, op->d.peer, op);
      return rc;
    }
    if (op->req) {
      op->state = OP_POSTED, n++;
      struct proxy_peer* q = &p->peers[op->d.peer];
      q->posted_bytes += proxy_data_bytes(op);
      if (q->posted_bytes > q->peak_posted)
        __atomic_store_n(&q->peak_posted, q->posted_bytes, __ATOMIC_RELAXED);
    }
  }
  return n;
}

/* Tests what is in flight and retires completed descriptors in ticket order. */
static int proxy_complete(struct mk_proxy* p) {
  int n = 0;
  for (uint64_t i = p->fifo_head; i < p->fifo_tail; i++) {
    struct proxy_op* op = fifo_at(p, i);
    if (op->state != OP_POSTED) continue;
    int done = 0;
    int rc = p->ops->test(op->req, &done, NULL);
    struct proxy_peer* q = &p->peers[op->d.peer];
    if (rc < 0) {
      op->req = NULL; /* a failed request is the transport's again */
      if (!proxy_peer_closed(p, rc, op->d.peer)) {
        proxy_fail(p, rc, MK_PROXY_ERR_TRANSPORT, op->d.peer, op);
        return rc;
      }
      op->state = OP_DONE; /* dropped: its peer is gone */
      q->posted_bytes -= proxy_data_bytes(op);
      continue;
    }
    if (!done) continue;
    op->req = NULL;
    op->state = OP_DONE;
    q->posted_bytes -= proxy_data_bytes(op);
    __atomic_fetch_add(&q->sent_bytes, proxy_data_bytes(op), __ATOMIC_RELAXED);
    __atomic_fetch_add(&q->sent_ops, 1, __ATOMIC_RELAXED);
    n++;
  }
  uint64_t head = p->fifo_head;
  while (p->fifo_head < p->fifo_tail && fifo_at(p, p->fifo_head)->state == OP_DONE) {
    fifo_at(p, p->fifo_head)->state = OP_FREE;
    p->fifo_head++;
  }
  if (p->fifo_head != head)
    mk_proxy_queue_complete(p->conf.queue, p->fifo_head == p->fifo_tail
                                               ? p->next_ticket
                                               : fifo_at(p, p->fifo_head)->ticket);
  return n;
}

/* Progress on every connection: lands incoming writes on manual-progress providers and
 * notices dead peers even when nothing is in flight to them. */
static int proxy_progress(struct mk_proxy* p) {
  for (int r = 0; r < p->conf.nranks; r++) {
    if (!p->remote[r] || p->peers[r].closed) continue;
    struct proxy_peer* q = &p->peers[r];
    int rc = p->ops->progress(q->recv);
    if (rc == 0) rc = p->ops->progress(q->send);
    if (rc < 0 && proxy_peer_closed(p, rc, r)) continue;
    if (rc < 0) {
      /* name the oldest descriptor in flight to that peer, if any */
      const struct proxy_op* op = NULL;
      for (uint64_t i = p->fifo_head; i < p->fifo_tail && !op; i++)
        if (fifo_at(p, i)->d.peer == r) op = fifo_at(p, i);
      proxy_fail(p, rc, MK_PROXY_ERR_TRANSPORT, r, op);
      return rc;
    }
  }
  return 0;
}

/* An armed thread holds here, touching no connection, until mk_proxy_go (1) or a stop (0):
 * the setup exchanges run meanwhile, so short naps. */
static int proxy_wait_go(struct mk_proxy* p) {
  while (!__atomic_load_n(&p->go, __ATOMIC_ACQUIRE)) {
    if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) return 0;
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return 1;
}

static void* proxy_main(void* arg) {
  struct mk_proxy* p = arg;
  __atomic_store_n(&p->tid, (int)syscall(SYS_gettid), __ATOMIC_RELEASE);
  if (!proxy_wait_go(p)) return NULL;
  uint64_t idle = 0, drain_deadline = 0;
  for (;;) {
    int stopping = __atomic_load_n(&p->stop, __ATOMIC_ACQUIRE);
    if (stopping) {
      if (p->fifo_head == p->fifo_tail) break;
      uint64_t now = mk_now_ns();
      if (!drain_deadline)
        drain_deadline = now + (uint64_t)mk_param_int(MK_PARAM_TIMEOUT_MS) * 1000000;
      if (now > drain_deadline) {
        MK_WARN("proxy rank %d: stopped with %" PRIu64 " operation(s) still in flight",
                p->conf.rank, p->fifo_tail - p->fifo_head);
        break;
      }
    }
    int a = stopping ? 0 : proxy_admit(p);
    if (a < 0) break;
    int b = proxy_post(p);
    if (b < 0) break;
    int c = proxy_complete(p);
    if (c < 0) break;
    if (proxy_progress(p) < 0) break;
    if (a || b || c) {
      idle = 0;
    } else if (++idle > 20000) {
      struct timespec ts = {0, 20000}; /* long idle: 20 us naps */
      nanosleep(&ts, NULL);
    } else if ((idle & 15) == 0) {
      sched_yield();
    }
  }
  return NULL;
}

static int proxy_take_keys(struct mk_proxy* p, const struct mk_proxy_keys* all) {
  for (int r = 0; r < p->conf.nranks; r++) {
    if (!p->remote[r]) continue;
    if (all[r].magic != MK_PROXY_RECORD_MAGIC || all[r].rank != r || !p->peers[r].send ||
        !p->peers[r].recv) {
      MK_WARN("proxy rank %d: rank %d's key record is corrupt or it is not connected",
              p->conf.rank, r);
      return -EBADMSG;
    }
  }
  for (int r = 0; r < p->conf.nranks; r++)
    if (p->remote[r]) p->peers[r].data = all[r].data, p->peers[r].flags = all[r].flags;
  return 0;
}

int mk_proxy_arm(struct mk_proxy* p, const struct mk_proxy_keys* all) {
  if (p->started) return -EALREADY;
  MK_CHECK(proxy_take_keys(p, all));
  int rc = pthread_create(&p->thread, NULL, proxy_main, p);
  if (rc) {
    MK_WARN("proxy rank %d: its thread could not be created: %s", p->conf.rank, strerror(rc));
    return -rc;
  }
  p->started = 1;
  return 0;
}

void mk_proxy_go(struct mk_proxy* p) { __atomic_store_n(&p->go, 1, __ATOMIC_RELEASE); }

int mk_proxy_start(struct mk_proxy* p, const struct mk_proxy_keys* all) {
  MK_CHECK(mk_proxy_arm(p, all));
  mk_proxy_go(p);
  return 0;
}

static int proxy_join(struct mk_proxy* p) {
  if (p->started && !p->joined) {
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    pthread_join(p->thread, NULL);
    p->joined = 1;
  }
  return __atomic_load_n(&p->failed, __ATOMIC_ACQUIRE) ? (p->err.err ? p->err.err : -EIO) : 0;
}

int mk_proxy_stop(struct mk_proxy* p) {
  if (!p) return 0;
  int rc = proxy_join(p);
  /* Requests left in flight (a drain that timed out, a failure) die with their comms. */
  if (p->data_mr) p->ops->dereg_mr(p->mr_comm, p->data_mr);
  if (p->flags_mr) p->ops->dereg_mr(p->mr_comm, p->flags_mr);
  for (int r = 0; p->peers && r < p->conf.nranks; r++) {
    if (p->peers[r].send) p->ops->close(p->peers[r].send);
    if (p->peers[r].recv) p->ops->close(p->peers[r].recv);
  }
  if (p->listen_comm) p->ops->close_listen(p->listen_comm);
  free(p->ops_fifo);
  free(p->peers);
  free(p->remote);
  free(p);
  return rc;
}

int mk_proxy_quiesce(struct mk_proxy* p) { return proxy_join(p); }

void mk_proxy_peers_leaving(struct mk_proxy* p) {
  if (p) __atomic_store_n(&p->leaving, 1, __ATOMIC_RELEASE);
}

uint64_t mk_proxy_sent_bytes(const struct mk_proxy* p, int peer) {
  return __atomic_load_n(&p->peers[peer].sent_bytes, __ATOMIC_RELAXED);
}

uint64_t mk_proxy_sent_ops(const struct mk_proxy* p, int peer) {
  return __atomic_load_n(&p->peers[peer].sent_ops, __ATOMIC_RELAXED);
}

int mk_proxy_error(const struct mk_proxy* p, char* msg, size_t len) {
  if (!__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) return 0;
  mk_proxy_error_format(&p->err, msg, len);
  return p->err.err ? p->err.err : -EIO;
}

int mk_proxy_tid(const struct mk_proxy* p) { return __atomic_load_n(&p->tid, __ATOMIC_ACQUIRE); }

uint64_t mk_proxy_peak_posted_bytes(const struct mk_proxy* p, int peer) {
  return __atomic_load_n(&p->peers[peer].peak_posted, __ATOMIC_RELAXED);
}
