/*
 * Streams: the endpoints of a comm, and the helper threads that progress streams 1.. .
 *
 * Why threads: tcp;ofi_rxm has manual data progress, so payload bytes are copied through the
 * kernel inside fi_cq_read of the endpoint's CQ. With one endpoint progressed by NCCL's one
 * proxy thread, a comm moves at most what one core copies. Each extra stream has a thread
 * that reads its own CQ while the stream has operations posted, and sleeps on a condition
 * variable otherwise (no core burnt while idle). Stream 0 stays with the comm's progress
 * thread (ofi_progress.c) or NCCL's thread (test()), which also handle its control messages.
 *
 * Helper threads never take the comm lock: a completion only touches its own op and request
 * (atomics), and stream errors are picked up by NCCL's thread through st->error.
 */
#include <sched.h>
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"

#define OFI_CQ_SIZE 4096     /* > every operation a stream can have posted at once */
#define OFI_STREAM_BATCH 16
#define OFI_STREAM_SPINS 64  /* empty polls before sleeping (or yielding) */
#define OFI_STREAM_WAIT_MS 1 /* bounds a sleep that a missed wake-up would make longer */

/* Streams 1.. get a CQ with a file-descriptor wait object when the provider has one, so
 * that their thread can sleep in fi_cq_sread until a socket has data instead of spinning
 * (spinning helpers starve the thread that has bytes to copy when cores are few). */
static int ofi_stream_cq_open(struct ofi_comm* c, struct ofi_stream* st) {
  struct fi_cq_attr attr = {.size = OFI_CQ_SIZE, .format = FI_CQ_FORMAT_TAGGED,
                            .wait_obj = FI_WAIT_NONE};
  if (st != &c->st[0]) {
    attr.wait_obj = FI_WAIT_FD;
    if (fi_cq_open(c->dev->domain, &attr, &st->cq, NULL) == 0) {
      st->can_wait = 1;
      return 0;
    }
    attr.wait_obj = FI_WAIT_NONE;
  }
  return fi_cq_open(c->dev->domain, &attr, &st->cq, NULL);
}

int ofi_stream_open(struct ofi_comm* c, struct ofi_stream* st) {
  struct ofi_dev* dev = c->dev;
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = 4};
  st->peer = FI_ADDR_NOTAVAIL;
  st->comm = c;
  int rc = fi_endpoint(dev->domain, dev->info, &st->ep, NULL);
  if (rc == 0) rc = ofi_stream_cq_open(c, st);
  if (rc == 0) rc = fi_av_open(dev->domain, &av_attr, &st->av, NULL);
  if (rc == 0) rc = fi_ep_bind(st->ep, &st->cq->fid, FI_TRANSMIT | FI_RECV);
  if (rc == 0) rc = fi_ep_bind(st->ep, &st->av->fid, 0);
  if (rc == 0) rc = fi_enable(st->ep);
  st->addr_len = sizeof(st->addr);
  if (rc == 0) rc = fi_getname(&st->ep->fid, st->addr, &st->addr_len);
  if (rc != 0) MK_WARN("ofi dev %s: cannot open an endpoint: %s", dev->name, ofi_sym.strerror(-rc));
  return rc;
}

/* The endpoint goes first (it discards whatever is still posted), the rest after the
 * comm's registrations: the same order as with one endpoint. */
void ofi_stream_close_ep(struct ofi_stream* st) {
  if (st->ep) fi_close(&st->ep->fid);
  st->ep = NULL;
}

void ofi_stream_close_rest(struct ofi_stream* st) {
  if (st->av) fi_close(&st->av->fid);
  if (st->cq) fi_close(&st->cq->fid);
  st->av = NULL, st->cq = NULL;
}

int ofi_errno_of(int fi_err) {
  switch (fi_err) {
    case FI_ECANCELED: case FI_ECONNRESET: case FI_ECONNABORTED: case FI_ENOTCONN:
    case FI_ECONNREFUSED: case FI_EHOSTUNREACH: case FI_ETIMEDOUT:
      return -ECONNRESET;
    default:
      return -EIO;
  }
}

/* A stripe of a receive landed len bytes. One shorter than its chunk ends the message
 * (protocol version 4): no later stripe of it will come, and the comm's progress cancels
 * them (ofi_recv_cancel_tails). Recorded before the stripe counts as done. */
static void ofi_recv_stripe_landed(struct ofi_req* r, const struct ofi_op* op, size_t len) {
  unsigned i = op->idx;
  if (!mk_ofi_stripe_ends_message(op->stripe, r->cts.nstripes[i], len, r->cts.chunk[i])) return;
  __atomic_store_n(&r->tail_from[i], (uint8_t)(op->stripe + 1), __ATOMIC_RELEASE);
  struct ofi_comm* c = (struct ofi_comm*)r->base.comm;
  __atomic_add_fetch(&c->tails_pending, 1, __ATOMIC_RELEASE);
}

/* One data operation (a stripe of a send or receive) is over. Everything a later test()
 * reads is written before the release of `pending`. */
void ofi_req_complete(struct ofi_req* r, const struct ofi_op* op, size_t len, int err) {
  if (err) {
    int expected = 0, e = ofi_errno_of(-err);
    __atomic_compare_exchange_n(&r->error, &expected, e, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  } else if (op->kind == OFI_OP_RECV && !__atomic_load_n(&op->cancelled, __ATOMIC_ACQUIRE)) {
    ofi_recv_stripe_landed(r, op, len);
  }
  if (op->kind == OFI_OP_RECV) __atomic_add_fetch(&r->sizes[op->idx], len, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&r->pending, 1, __ATOMIC_RELEASE);
}

void ofi_stream_busy(struct ofi_stream* st) {
  if (!st->has_thread) return;
  if (__atomic_fetch_add(&st->active, 1, __ATOMIC_ACQ_REL) == 0) {
    pthread_mutex_lock(&st->mu); /* the thread checks `active` under mu before sleeping */
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
  }
}

void ofi_stream_idle(struct ofi_stream* st) {
  if (st->has_thread) __atomic_sub_fetch(&st->active, 1, __ATOMIC_ACQ_REL);
}

/* With manual progress, bytes written into a put target move only while its CQs are read,
 * and nothing is posted there to wake its threads: they stay awake from the first progress
 * call until close (sleeping in sread where the CQ can wait). */
void ofi_streams_keep_awake(struct ofi_comm* c) {
  if (c->streams_awake) return;
  c->streams_awake = 1;
  for (int k = 1; k < c->nstreams; k++) ofi_stream_busy(&c->st[k]);
}

/* 1 when there is work (or the thread still lingers: until linger_until, in mk_now_ns),
 * 0 when asked to stop. */
static int ofi_stream_wait(struct ofi_stream* st, uint64_t linger_until) {
  if (__atomic_load_n(&st->stop, __ATOMIC_ACQUIRE)) return 0;
  if (__atomic_load_n(&st->active, __ATOMIC_ACQUIRE) > 0) return 1;
  if (linger_until && mk_now_ns() < linger_until) return 1;
  pthread_mutex_lock(&st->mu);
  while (!__atomic_load_n(&st->stop, __ATOMIC_ACQUIRE) &&
         __atomic_load_n(&st->active, __ATOMIC_ACQUIRE) == 0)
    pthread_cond_wait(&st->cv, &st->mu);
  pthread_mutex_unlock(&st->mu);
  return !__atomic_load_n(&st->stop, __ATOMIC_ACQUIRE);
}

static void ofi_stream_fail(struct ofi_stream* st, int err) {
  int expected = 0;
  __atomic_compare_exchange_n(&st->error, &expected, err, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

/* A stripe on st failed with libfabric error fi_err (positive) after len bytes: the stream
 * fails (NCCL's thread picks it up through st->error) and so does the stripe's request. */
static void ofi_stream_op_failed(struct ofi_stream* st, struct ofi_op* op, size_t len, int fi_err) {
  ofi_stream_fail(st, ofi_errno_of(fi_err));
  ofi_req_complete(op->req, op, len, -fi_err);
  ofi_stream_idle(st);
}

/* An error entry: its op fails (and with a connection error, the whole stream). */
static void ofi_stream_error(struct ofi_stream* st) {
  struct fi_cq_err_entry e;
  memset(&e, 0, sizeof(e));
  ssize_t n = fi_cq_readerr(st->cq, &e, 0);
  if (n == -FI_EAGAIN) return;
  if (n < 0 || !e.op_context) {
    ofi_stream_fail(st, -EIO);
    return;
  }
  struct ofi_op* op = e.op_context;
  if (op->kind == OFI_OP_CONNECT) { /* the stream's first real operation reports the failure */
    ofi_stream_idle(st);
    return;
  }
  if (__atomic_load_n(&op->cancelled, __ATOMIC_ACQUIRE) && e.err == FI_ECANCELED) { /* its message came eager (ofi_eager.c) */
    ofi_req_complete(op->req, op, 0, 0);
    ofi_stream_idle(st);
    return;
  }
  MK_WARN("ofi: striped operation failed: %s", ofi_sym.strerror(e.err));
  ofi_stream_op_failed(st, op, e.len, (int)e.err);
}

int ofi_stream_poll(struct ofi_stream* st, int block) {
  struct fi_cq_tagged_entry e[OFI_STREAM_BATCH];
  ssize_t n = block && st->can_wait
                  ? fi_cq_sread(st->cq, e, OFI_STREAM_BATCH, NULL, OFI_STREAM_WAIT_MS)
                  : fi_cq_read(st->cq, e, OFI_STREAM_BATCH);
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    ofi_stream_error(st);
    return 1;
  }
  if (n < 0) {
    ofi_stream_fail(st, -EIO);
    return 0;
  }
  for (ssize_t i = 0; i < n; i++) {
    struct ofi_op* op = e[i].op_context;
    if (!op) { /* the remote CQ data of a stripe written into a receive */
      int rc = ofi_write_landed(st->comm, (unsigned)(st - st->comm->st), e[i].flags, e[i].data);
      if (rc < 0) ofi_stream_fail(st, rc);
      continue;
    }
    if (op->kind == OFI_OP_CONNECT) __atomic_store_n(&st->connected_ahead, 1, __ATOMIC_RELEASE);
    else ofi_req_complete(op->req, op, e[i].len, 0);
    ofi_stream_idle(st);
  }
  return (int)n;
}

void ofi_stream_post_later(struct ofi_stream* st, struct ofi_op* op) {
  op->next_post = NULL;
  pthread_mutex_lock(&st->mu);
  if (st->posts_tail) st->posts_tail->next_post = op;
  else st->posts_head = op;
  st->posts_tail = op;
  pthread_mutex_unlock(&st->mu);
  ofi_stream_busy(st);
  if (st->can_wait) fi_cq_signal(st->cq); /* out of a 1 ms sread at once */
}

/* The thread's side: posts what was handed over, oldest first, until the provider says "not
 * now" (kept for the next turn, after reading the CQ frees room) or the queue is empty. A
 * stripe refused past the connect timeout, or failed, fails its request and the stream.
 * 1 while something is left. */
static int ofi_stream_posts_run(struct ofi_stream* st) {
  for (;;) {
    pthread_mutex_lock(&st->mu);
    struct ofi_op* op = st->posts_head; /* the producer only appends */
    pthread_mutex_unlock(&st->mu);
    if (!op) return 0;
    ssize_t rc = ofi_put_stripe_write(st, op, op->buf, op->len, op->desc);
    if (rc == -FI_EAGAIN) {
      const uint64_t now = mk_now_ns();
      if (!st->posts_refused_since) st->posts_refused_since = now;
      if (now - st->posts_refused_since < mk_connect_timeout_ns()) return 1;
      rc = -FI_ETIMEDOUT;
    }
    st->posts_refused_since = 0;
    pthread_mutex_lock(&st->mu);
    st->posts_head = op->next_post;
    if (!st->posts_head) st->posts_tail = NULL;
    pthread_mutex_unlock(&st->mu);
    if (rc != 0) {
      MK_WARN("ofi: posting a stripe of a put or written send failed: %s", ofi_sym.strerror((int)-rc));
      ofi_stream_op_failed(st, op, 0, (int)-rc);
    }
  }
}

/* The send side of ofi_streams_connect_ahead, on the stream's thread: the 0-byte send, retried
 * while rxm says the connection is still forming (each try moves it on), bounded. */
static void ofi_stream_connect_step(struct ofi_stream* st) {
  const uint64_t deadline = __atomic_load_n(&st->connect_deadline_ns, __ATOMIC_ACQUIRE);
  if (!deadline) return;
  ssize_t rc = fi_tsend(st->ep, NULL, 0, NULL, st->peer, MK_OFI_TAG_CONNECT, &st->connect_op.ctx);
  if (rc == -FI_EAGAIN && mk_now_ns() < deadline) return;
  __atomic_store_n(&st->connect_deadline_ns, 0, __ATOMIC_RELEASE);
  if (rc != 0) { /* not formed ahead: the first write forms it, as without the hint */
    MK_INFO(MK_NCCL_SUBSYS_NET, "ofi: a stream's connection was not formed ahead: %s",
            ofi_sym.strerror(rc == -FI_EAGAIN ? FI_ETIMEDOUT : (int)-rc));
    ofi_stream_idle(st);
  }
}

/* While lingering (no operation posted, NCCL_MK_OFI_STREAM_LINGER_US not yet past) the
 * thread polls without blocking, so that the next message's post finds it awake. */
static void* ofi_stream_thread(void* arg) {
  struct ofi_stream* st = arg;
  const uint64_t linger_ns = st->comm->stream_linger_ns;
  uint64_t linger_until = 0;
  int spins = 0;
  while (ofi_stream_wait(st, linger_until)) {
    if (__atomic_load_n(&st->connect_deadline_ns, __ATOMIC_ACQUIRE)) {
      ofi_stream_connect_step(st);
      ofi_stream_poll(st, 0);
      sched_yield();
      continue;
    }
    const int busy = __atomic_load_n(&st->active, __ATOMIC_ACQUIRE) > 0;
    if (busy && linger_ns) linger_until = mk_now_ns() + linger_ns;
    const int queued = ofi_stream_posts_run(st);
    if (ofi_stream_poll(st, busy && !queued && spins >= OFI_STREAM_SPINS) > 0)
      spins = 0;
    else if (++spins >= OFI_STREAM_SPINS && (!st->can_wait || !busy))
      sched_yield(), spins = 0;
  }
  return NULL;
}

/* tcp;ofi_rxm forms a stream's fabric connection on its first post, and that post also
 * grows rxm's send-buffer pool (16 MB, page-faulted under the endpoint's lock); the
 * connection moves only while both ends read the endpoint. Left to a put's first write, the
 * streams paid this one after another (each stripe waits out its EAGAIN before the next is
 * posted): 30 / 75-200 / 300-940 ms at 2 / 4 / 8 streams on a 2-core host (bench/NOTES.md,
 * session 47). Here every stream 1.. pays it at once on its own thread: the receiver posts
 * a 0-byte receive of MK_OFI_TAG_CONNECT (its thread reads the CQ until it lands), the
 * sender's thread retries a 0-byte send of it until rxm takes it. */
void ofi_streams_connect_ahead(struct ofi_comm* c) {
  const uint64_t deadline = mk_now_ns() + mk_connect_timeout_ns();
  for (int k = 1; k < c->nstreams; k++) {
    struct ofi_stream* st = &c->st[k];
    if (!st->has_thread) continue; /* NCCL_MK_OFI_STREAM_THREADS=0: the first write forms it */
    st->connect_op = (struct ofi_op){.kind = OFI_OP_CONNECT};
    if (c->is_send) __atomic_store_n(&st->connect_deadline_ns, deadline, __ATOMIC_RELEASE);
    ofi_stream_busy(st); /* until the op completes */
    if (!c->is_send && fi_trecv(st->ep, NULL, 0, NULL, FI_ADDR_UNSPEC, MK_OFI_TAG_CONNECT, 0,
                                &st->connect_op.ctx) != 0)
      ofi_stream_idle(st);
  }
}

int mk_ofi_streams_connected_ahead(const struct mk_comm* comm) {
  if (!comm || comm->ops != &mk_ofi_ops) return 0;
  const struct ofi_comm* c = (const struct ofi_comm*)comm;
  int n = 0;
  for (int k = 1; k < c->nstreams; k++) n += __atomic_load_n(&c->st[k].connected_ahead, __ATOMIC_ACQUIRE);
  return n;
}

int ofi_streams_start(struct ofi_comm* c) {
  if (!mk_param_int(MK_PARAM_OFI_STREAM_THREADS)) return 0; /* test() polls them all */
  for (int k = 1; k < c->nstreams; k++) {
    struct ofi_stream* st = &c->st[k];
    st->has_thread = 1;
    int rc = pthread_create(&st->thread, NULL, ofi_stream_thread, st);
    if (rc != 0) {
      st->has_thread = 0;
      MK_WARN("ofi: cannot start a stream progress thread: %s", strerror(rc));
      ofi_streams_stop(c);
      return -rc;
    }
  }
  return 0;
}

void ofi_streams_stop(struct ofi_comm* c) {
  for (int k = 1; k < MK_OFI_MAX_STREAMS; k++) {
    struct ofi_stream* st = &c->st[k];
    if (!st->has_thread) continue;
    ofi_thread_stop_join(&st->mu, &st->cv, &st->stop, st->thread);
    st->has_thread = 0;
  }
}
