/*
 * Two-sided messaging. The receiver posts its buffers (tags DATA|seq|i) and then sends a
 * clear-to-send {seq, msn, n, sizes, tags}; a sender that has the clear-to-send of its
 * message's receive picks the first unmatched entry with its tag and sends to exactly that
 * buffer, so matching is strictly in posting order and an oversized send is caught at the
 * sender (-EMSGSIZE) before anything moves. A small send whose clear-to-send has not arrived
 * goes eager instead (ofi_eager.c, rules in eager.h): the receiver matches it by message
 * number and tag and reports an oversized one on its receive (-EMSGSIZE).
 */
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"


static struct ofi_comm* ofi_comm_of(struct mk_comm* comm, int is_send) {
  struct ofi_comm* c = (struct ofi_comm*)comm;
  return comm && comm->ops == &mk_ofi_ops && c->is_send == is_send ? c : NULL;
}

static uint64_t ofi_req_bytes(const struct ofi_req* r) {
  uint64_t n = 0;
  for (int i = 0; i < r->n; i++) n += r->sizes[i];
  return n;
}

void ofi_req_release(struct ofi_comm* c, struct ofi_req* r) {
  if (mk_req_pool_free(&c->pool, r) < 0) MK_WARN("ofi: request %p freed twice", (void*)r);
}

/* Index of the first unmatched entry of the clear-to-send with this tag, or -1. */
static int ofi_cts_match(const struct ofi_cts_slot* s, int tag) {
  for (uint32_t i = 0; i < s->cts.n; i++)
    if (!(s->matched & (1u << i)) && s->cts.tags[i] == tag) return (int)i;
  return -1;
}

/* Posts one operation on stream k, telling its thread (if any) that work is coming. What is
 * posted follows op->kind: a tagged send or receive, or the RMA write of a put or of a
 * written send (tag unused; the remote address comes from the request, ofi_rma.c). */
static ssize_t ofi_stripe_post(struct ofi_comm* c, unsigned k, void* buf, size_t len,
                               void* desc, uint64_t tag, struct ofi_op* op) {
  struct ofi_stream* st = &c->st[k];
  ofi_stream_busy(st);
  ssize_t rc;
  if (op->kind == OFI_OP_PUT || op->kind == OFI_OP_WRITE_SEND)
    rc = ofi_put_stripe_write(st, op, buf, len, desc);
  else if (op->kind == OFI_OP_SEND) rc = fi_tsend(st->ep, buf, len, desc, st->peer, tag, &op->ctx);
  else rc = fi_trecv(st->ep, buf, len, desc, FI_ADDR_UNSPEC, tag, 0, &op->ctx);
  if (rc != 0) ofi_stream_idle(st);
  return rc;
}

/* Posting after earlier posts of the same message succeeded cannot be abandoned, so an
 * EAGAIN here is waited out (progressing frees provider resources; streams 1.. progress in
 * their threads), bounded. */
static int ofi_stripe_post_retry(struct ofi_comm* c, unsigned k, void* buf, size_t len,
                                 void* desc, uint64_t tag, struct ofi_op* op) {
  uint64_t deadline = mk_now_ns() + mk_connect_timeout_ns();
  for (;;) {
    ssize_t rc = ofi_stripe_post(c, k, buf, len, desc, tag, op);
    if (rc != -FI_EAGAIN) return ofi_rc(rc);
    int p = ofi_cq_progress(c);
    if (p < 0) return p;
    if (mk_now_ns() > deadline) return -ETIMEDOUT;
  }
}

int ofi_stripe_post_in_turn(struct ofi_comm* c, enum ofi_post_mode mode, unsigned k, void* buf,
                            size_t len, void* desc, uint64_t tag, struct ofi_op* op) {
  int rc;
  if (mode == OFI_POST_WAITED) rc = ofi_stripe_post_retry(c, k, buf, len, desc, tag, op);
  else rc = ofi_rc(ofi_stripe_post(c, k, buf, len, desc, tag, op));
  if (mode == OFI_POST_FIRST || rc == 0 || (mode == OFI_POST_RESUMABLE && rc == -FI_EAGAIN)) return rc;
  ofi_comm_fail(c, rc); /* half posted: the request stays with the provider */
  return rc;
}

/* The stripes of one send, as the receiver cut its buffer (the clear-to-send says how):
 * stripe k carries the bytes of the message inside [k*chunk, (k+1)*chunk), possibly none.
 * Posts stripes k0.. (k0 > 0: a resumed send). 1: nothing could be posted (retry later);
 * 2 (resumable only): stripes before r->send_next are posted, the provider had no room for
 * that one (resume from it later); <0: the comm is out of step with its peer. A send that is
 * not resumable waits out a later stripe's EAGAIN here (ofi_stripe_post_retry). */
static int ofi_send_stripes(struct ofi_comm* c, struct ofi_req* r, const struct mk_ofi_cts* cts,
                            int i, char* data, size_t size, void* desc, unsigned k0, int resumable) {
  if (cts->write[i]) return ofi_write_send_pieces(c, r, cts, i, data, size, desc, k0, resumable);
  unsigned nst = cts->nstripes[i], s0 = cts->stream0[i];
  uint64_t chunk = cts->chunk[i];
  unsigned nsend = mk_ofi_stripes_sent(size, chunk, (uint8_t)nst); /* the rest: cancelled */
  /* before any post: stream threads may complete stripes at once; atomic, as a deferred send
   * is set here by the progress thread while NCCL's test() may read it */
  if (k0 == 0) __atomic_store_n(&r->pending, (int)nsend, __ATOMIC_RELAXED);
  for (unsigned k = k0; k < nsend; k++) {
    size_t len = nst == 1 ? size : (size_t)mk_ofi_stripe_len(size, chunk, k);
    char* buf = len ? data + (size_t)k * chunk : data;
    struct ofi_op* op = &r->ops[OFI_OP_AT(0, k)];
    *op = (struct ofi_op){.req = r, .kind = OFI_OP_SEND, .idx = (uint8_t)i, .stripe = (uint8_t)k};
    uint64_t tag = mk_ofi_tag_data(cts->seq, (unsigned)i, k);
    const unsigned stream = (s0 + k) % (unsigned)c->nstreams;
    const enum ofi_post_mode mode = k == 0 ? OFI_POST_FIRST : resumable ? OFI_POST_RESUMABLE : OFI_POST_WAITED;
    const int rc = ofi_stripe_post_in_turn(c, mode, stream, buf, len, desc, tag, op);
    if (rc == -FI_EAGAIN && k == 0) return 1;
    if (rc == -FI_EAGAIN) {
      r->send_next = (uint8_t)k;
      return 2;
    }
    if (rc != 0) return rc;
  }
  return 0;
}

/* With a progress thread, a send of NCCL_MK_OFI_THREAD_SEND_MIN bytes or more is posted there
 * (a post is a syscall over tcp, 7-18 us of NCCL's proxy thread per message, bench/NOTES.md
 * session 24; smaller ones measured faster posted at once, session 26), and so is a smaller
 * one while the thread drives the comm (the 0-1 byte steps of NCCL's Simple protocol waited
 * ~13 us each for the comm's lock there, session 57): the request keeps a copy of the
 * clear-to-send and counts as in flight until then. */
static void ofi_send_wait(struct ofi_comm* c, struct ofi_req* r) {
  __atomic_store_n(&r->pending, 1, __ATOMIC_RELAXED); /* not done before it is posted */
  r->send_waiting = 1;
  c->sends_waiting++;
}

static void ofi_send_defer(struct ofi_comm* c, struct ofi_req* r, const struct mk_ofi_cts* cts,
                           int i, void* data, void* desc) {
  r->cts = *cts;
  r->send_idx = i;
  r->send_data = data;
  r->send_desc = desc;
  ofi_send_wait(c, r);
}

/* A deferred send the provider had no room for after some of its stripes: back on the
 * waiting list (pending stays: those stripes are posted) until it does, bounded by the connect
 * timeout. The thread meanwhile serves its other comms: with the device-wide thread
 * (NCCL_MK_OFI_PROGRESS_THREAD=2) waiting it out here held every comm of the device. */
static int ofi_send_resume_later(struct ofi_comm* c, struct ofi_req* r) {
  const uint64_t now = mk_now_ns();
  if (!r->send_deadline) {
    r->send_deadline = now + mk_connect_timeout_ns();
    c->n_resumed++;
  } else if (now > r->send_deadline) {
    MK_WARN("ofi: stripe %u of a %zu-byte send found no room in the provider for %d ms", r->send_next,
            r->sizes[0], (int)mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS));
    ofi_comm_fail(c, -ETIMEDOUT);
    return -ETIMEDOUT;
  }
  r->send_waiting = 1;
  c->sends_waiting++;
  return 1;
}

int mk_ofi_caller_progress(const struct mk_comm* comm) {
  const struct ofi_comm* c = (const struct ofi_comm*)comm;
  return comm && comm->ops == &mk_ofi_ops && __atomic_load_n(&c->caller_progress, __ATOMIC_ACQUIRE);
}

uint64_t mk_ofi_sends_resumed(const struct mk_comm* comm) {
  const struct ofi_comm* c = (const struct ofi_comm*)comm;
  return comm && comm->ops == &mk_ofi_ops && c->is_send ? c->n_resumed : 0;
}

int ofi_send_deferred_post(struct ofi_comm* c, struct ofi_req* r) {
  /* off the waiting list first: progress from inside a post must not post it again */
  r->send_waiting = 0;
  c->sends_waiting--;
  int rc = ofi_send_stripes(c, r, &r->cts, r->send_idx, r->send_data, r->sizes[0], r->send_desc, r->send_next, 1);
  if (rc == 1) { /* nothing posted: wait again */
    ofi_send_wait(c, r);
    return 1;
  }
  if (rc == 2) return ofi_send_resume_later(c, r);
  if (rc < 0) { /* the request is NCCL's already: the failure reaches it as the comm's error */
    MK_WARN("ofi: posting a send of %zu bytes failed: %s", r->sizes[0], strerror(-rc));
    ofi_comm_fail(c, rc);
  }
  return rc;
}

static int ofi_send_post(struct ofi_comm* c, struct ofi_cts_slot* s, int i, void* data,
                         size_t size, struct mk_mr* mr, struct ofi_req** out) {
  struct ofi_req* r = mk_req_pool_alloc(&c->pool);
  if (!r) return 0;
  r->kind = OFI_REQ_SEND;
  r->n = 1;
  r->sizes[0] = size;
  int rc = 0;
  if (c->runner && mk_ofi_thread_posts_send(size, c->thread_send_min, ofi_runner_drives(c))) {
    if (size >= c->thread_send_min) ofi_progress_observe(c, size); /* the thread drives again */
    ofi_send_defer(c, r, &s->cts, i, data, ofi_mr_desc(mr));
    c->n_thread_sends++;
  } else {
    rc = ofi_send_stripes(c, r, &s->cts, i, data, size, ofi_mr_desc(mr), 0, 0);
  }
  if (rc == 1 || (rc < 0 && !c->error)) mk_req_pool_free(&c->pool, r); /* nothing posted */
  if (rc == 1) return 0;
  if (rc < 0) {
    MK_WARN("ofi: posting a send of %zu bytes failed: %s", size, strerror(-rc));
    return rc;
  }
  s->matched |= 1u << i;
  if (s->matched == (1u << s->cts.n) - 1) s->valid = 0; /* every buffer has its send */
  c->n_cts++;
  c->n_written += s->cts.write[i];
  *out = r;
  return 0;
}

/* The clear-to-send of the receive message m belongs to, if it has arrived; slots of
 * receives whose every message has been sent are let go on the way. */
static struct ofi_cts_slot* ofi_slot_for(struct ofi_comm* c, uint32_t m) {
  for (unsigned k = 0; k < MK_MAX_REQUESTS; k++) {
    struct ofi_cts_slot* s = &c->slots[k];
    if (!s->valid) continue;
    int32_t d = mk_ofi_msn_diff(m, s->cts.msn);
    if (d >= (int32_t)s->cts.n) s->valid = 0;
    else if (d >= 0) return s;
  }
  return NULL;
}

static int ofi_send_cts(struct ofi_comm* c, struct ofi_cts_slot* s, void* data, size_t size,
                        int tag, struct mk_mr* mr, struct ofi_req** out) {
  int i = ofi_cts_match(s, tag);
  if (i < 0) {
    MK_WARN("ofi isend: tag %d matches no pending buffer of receive %u", tag, s->cts.seq);
    return -EINVAL;
  }
  if (size > s->cts.sizes[i]) {
    MK_WARN("ofi isend: %zu bytes do not fit the receiver's %llu-byte buffer (tag %d)", size,
            (unsigned long long)s->cts.sizes[i], tag);
    return -EMSGSIZE;
  }
  return ofi_send_post(c, s, i, data, size, mr, out);
}

static int ofi_isend_locked(struct ofi_comm* c, void* data, size_t size, int tag,
                            struct mk_mr* mr, struct ofi_req** out) {
  /* the clear-to-send has usually been filed already (by the progress thread, or by an
   * earlier call's read): the CQ is read here only when it has not */
  struct ofi_cts_slot* s = ofi_slot_for(c, c->msn);
  int rc = 0;
  if (!s && mk_ofi_isend_reads_cq(mk_ofi_send_path(0, size, c->eager_bytes, c->credits.avail),
                                  c->cts_idle_reads, c->msn)) {
    rc = ofi_cq_progress(c);
    if (rc < 0) return rc;
    s = ofi_slot_for(c, c->msn);
    c->cts_idle_reads = s ? 0 : c->cts_idle_reads + (c->cts_idle_reads < UINT32_MAX);
  } else if (!s) {
    c->n_reads_skipped++;
  }
  switch (mk_ofi_send_path(s != NULL, size, c->eager_bytes, c->credits.avail)) {
    case MK_OFI_PATH_CTS:
      MK_CHECK(ofi_send_cts(c, s, data, size, tag, mr, out));
      break;
    case MK_OFI_PATH_EAGER:
      MK_CHECK(ofi_eager_send(c, data, size, tag, mr, out));
      break;
    case MK_OFI_PATH_WAIT:
      c->asking = 1; /* the progress thread keeps reading until the clear-to-send comes */
      ofi_progress_wake(c);
      return rc > 0 ? 0 : ofi_peer_check(c);
  }
  if (*out) {
    c->sent_tags[c->msn++ % MK_OFI_TAG_RING] = tag;
    c->asking = 0;
    ofi_progress_wake(c);
  }
  return 0;
}

/* test() of a request still in flight while the progress thread drives the comm (and checks
 * on the peer), or a call that went back without the lock: no CQ read, no lock; the comm's
 * error if it has one. */
static int ofi_test_pending(struct ofi_comm* c) {
  int rc = __atomic_load_n(&c->error, __ATOMIC_RELAXED);
  return rc < 0 ? rc : 0;
}

int ofi_isend(struct mk_comm* comm, void* data, size_t size, int tag, struct mk_mr* mr,
              struct mk_request** req) {
  struct ofi_comm* c = ofi_comm_of(comm, 1);
  if (req) *req = NULL;
  if (!c || !req || (!data && size) || size > c->dev->max_msg_size ||
      ofi_mr_check(c, mr, data, size) < 0) {
    MK_WARN("ofi isend: bad argument (comm %p, data %p, size %zu, mr %p)", (void*)comm, data,
            size, (void*)mr);
    return -EINVAL;
  }
  struct ofi_req* r = NULL;
  if (!ofi_call_lock(c)) return ofi_test_pending(c); /* NCCL asks again */
  int rc = c->error ? c->error : ofi_isend_locked(c, data, size, tag, mr, &r);
  if (r) r->base.comm = comm;
  pthread_mutex_unlock(&c->lock);
  if (rc == 0 && r) *req = &r->base;
  return rc;
}

/* r's clear-to-send is left for ofi_cq_progress's retries (the progress thread's, or test()'s). */
static void ofi_cts_wait(struct ofi_comm* c, struct ofi_req* r) {
  if (!r->cts_waiting) c->cts_waiting++;
  r->cts_waiting = 1;
}

/* The clear-to-send may meet EAGAIN while the provider waits for the peer (connection
 * setup, flow control): then it is deferred and retried from ofi_cq_progress, so irecv
 * never waits for the peer. */
int ofi_cts_post(struct ofi_comm* c, struct ofi_req* r) {
  ssize_t rc = fi_tsend(c->st[0].ep, &r->cts, sizeof(r->cts), c->pool_desc, c->st[0].peer,
                        MK_OFI_TAG_CTRL, &r->ops[OFI_OP_CTS_AT].ctx);
  if (rc == -FI_EAGAIN) {
    ofi_cts_wait(c, r);
    return 0;
  }
  if (r->cts_waiting) c->cts_waiting--;
  r->cts_waiting = 0;
  if (rc != 0) {
    MK_WARN("ofi: posting a clear-to-send failed: %s", ofi_sym.strerror((int)-rc));
    return (int)rc;
  }
  return 0;
}

void ofi_recv_plan(const struct ofi_comm* c, struct mk_ofi_cts* cts, int i, size_t size) {
  mk_ofi_stripe_plan(size, c->nstreams, c->stripe_min, &cts->nstripes[i], &cts->chunk[i]);
  cts->stream0[i] = 0;
}

/* The stripes of entry i (ofi_recv_plan), each posted on its own stream. first: this is
 * the first post of the receive, which may still be abandoned on EAGAIN (returns 1). */
static int ofi_recv_stripes(struct ofi_comm* c, struct ofi_req* r, int i, char* data,
                            size_t size, void* desc, int first) {
  ofi_recv_plan(c, &r->cts, i, size);
  const uint8_t nst = r->cts.nstripes[i];
  const uint64_t chunk = r->cts.chunk[i];
  /* stripe k on stream k (stream0 = 0): a message shorter than a stripe travels on stream 0
   * alone */
  for (unsigned k = 0; k < nst; k++) {
    size_t len = nst == 1 ? size : (size_t)mk_ofi_stripe_len(size, chunk, k);
    struct ofi_op* op = &r->ops[OFI_OP_AT(i, k)];
    *op = (struct ofi_op){.req = r, .kind = OFI_OP_RECV, .idx = (uint8_t)i, .stripe = (uint8_t)k};
    uint64_t tag = mk_ofi_tag_data(c->seq, (unsigned)i, k);
    __atomic_add_fetch(&r->pending, 1, __ATOMIC_RELAXED); /* before: it may complete at once */
    int rc = ofi_stripe_post_in_turn(c, first && k == 0 ? OFI_POST_FIRST : OFI_POST_WAITED, k,
                                     data + (size_t)k * chunk, len, desc, tag, op);
    if (rc == -FI_EAGAIN) rc = 1; /* nothing posted: the caller may retry */
    if (rc != 0) {
      __atomic_sub_fetch(&r->pending, 1, __ATOMIC_RELAXED);
      return rc;
    }
  }
  return 0;
}

/* The stripes of every entry no eager message has taken and that is not to be written;
 * then, once nothing can be abandoned any more, the written ones (ofi_write.c). 1: the very
 * first post met EAGAIN and nothing is posted (the receive can still be abandoned). */
static int ofi_recv_post_entries(struct ofi_comm* c, struct ofi_req* r) {
  int first = r->eager_mask == 0, writable = ofi_write_slot_free(c, r->cts.seq);
  uint8_t written = 0;
  for (int i = 0; i < r->n; i++) {
    struct mk_mr* mr = r->mrs[i];
    if (r->eager_mask & (1u << i)) {
      r->cts.nstripes[i] = 1; /* never used: its message is in already */
      r->cts.chunk[i] = r->cts.sizes[i];
      continue;
    }
    if (writable && ofi_write_wanted(c, r->data[i], r->cts.sizes[i], mr)) {
      written |= (uint8_t)(1u << i);
      continue;
    }
    int rc = ofi_recv_stripes(c, r, i, r->data[i], r->cts.sizes[i], ofi_mr_desc(mr), first);
    if (rc != 0) return rc;
    first = 0;
    r->posted_mask |= (uint8_t)(1u << i);
  }
  for (int i = 0; i < r->n; i++)
    if (written & (1u << i))
      MK_CHECK(ofi_write_expect(c, r, i, r->data[i], r->cts.sizes[i], r->mrs[i]));
  return 0;
}

/* The buffers of r that no eager message has filled yet are posted (or marked written) and
 * its clear-to-send goes out with the credits owed. 1: the very first post met EAGAIN and
 * nothing is posted. Eager arrivals meanwhile wait in the queue (r->posting). */
static int ofi_recv_announce(struct ofi_comm* c, struct ofi_req* r) {
  r->cts.seq = c->seq; /* before the entries: a written one is found by it */
  r->cts.n = (uint32_t)r->n;
  r->posting = 1;
  int rc = ofi_recv_post_entries(c, r);
  r->posting = 0;
  if (rc != 0) return rc;
  r->cts.magic = MK_OFI_CTS_MAGIC;
  r->cts.msn = r->msn0;
  r->cts.credits = mk_ofi_owed_take(&c->owed);
  r->ops[OFI_OP_CTS_AT] = (struct ofi_op){.req = r, .kind = OFI_OP_CTS_SEND, .idx = (uint8_t)r->n};
  __atomic_add_fetch(&r->pending, 1, __ATOMIC_RELAXED);
  if (ofi_runner_drives(c))
    ofi_cts_wait(c, r); /* the thread posts it: a syscall off NCCL's */
  else
    MK_CHECK(ofi_cts_post(c, r));
  c->seq++;
  c->n_cts += (uint64_t)(r->n - r->eager_done);
  return 0;
}

/* A receive whose messages all come eager (version 7): each one still missing counts in
 * pending until it is delivered; the clear-to-send waits until announce_ns. */
static void ofi_recv_unannounced(struct ofi_comm* c, struct ofi_req* r) {
  /* a message with some pieces in counts already (ofi_eager_begin) */
  __atomic_add_fetch(&r->pending, r->n - r->eager_done - r->eager_active, __ATOMIC_RELAXED);
  r->unannounced = 1;
  r->announce_ns = mk_now_ns() + c->no_cts_ns;
  c->unannounced++;
  c->n_unannounced++;
}

int ofi_recv_announce_late(struct ofi_comm* c) {
  const uint64_t now = mk_now_ns();
  for (uint32_t j = 0; c->unannounced && j < c->nrx; j++) {
    struct ofi_req* r = c->rx[j];
    if (!r->unannounced || now < r->announce_ns) continue;
    const int missing = r->n - r->eager_done - r->eager_active; /* not begun */
    /* off the list first: the posts below may progress the comm and come back here */
    r->unannounced = 0;
    c->unannounced--;
    int rc = ofi_recv_announce(c, r);
    if (rc == 1) { /* the provider had no room: next time */
      r->unannounced = 1;
      c->unannounced++;
      continue;
    }
    if (rc < 0) return rc;
    c->n_late++;
    /* after the announce's own counts, so that a test() never sees 0 in between */
    __atomic_sub_fetch(&r->pending, missing, __ATOMIC_RELEASE);
    MK_CHECK(ofi_eager_drain(c));
  }
  return 0;
}

/* The receive takes message numbers [msn0, msn0 + n). Those that already came eager are
 * copied in; if any is still missing, the other buffers are posted and the clear-to-send
 * goes out, unless every buffer fits a bounce buffer (mk_ofi_recv_announces). Eager
 * arrivals meanwhile wait in the queue. */
static int ofi_recv_post(struct ofi_comm* c, struct ofi_req* r, int n, void** data,
                         const size_t* sizes, const int* tags, struct mk_mr** mrs) {
  r->msn0 = c->msn;
  for (int i = 0; i < n; i++) {
    r->data[i] = data[i];
    r->cts.sizes[i] = sizes[i];
    r->cts.tags[i] = tags[i];
    r->mrs[i] = mrs ? mrs[i] : NULL;
  }
  MK_CHECK(ofi_rx_add(c, r));
  c->msn += (uint32_t)n;
  MK_CHECK(ofi_eager_drain(c));
  if (r->eager_done == n) return 0; /* all in: no clear-to-send */
  if (!mk_ofi_recv_announces(sizes, n, c->eager_bytes, c->no_cts_ns != 0, c->recv_took_large)) {
    ofi_recv_unannounced(c, r);
    return 0;
  }
  int rc = ofi_recv_announce(c, r);
  if (rc == 1) { /* nothing posted, nothing delivered: as if never called */
    ofi_rx_remove(c, r);
    c->msn -= (uint32_t)n;
  }
  if (rc != 0) return rc;
  return ofi_eager_drain(c);
}

static int ofi_irecv_check(struct ofi_comm* c, int n, void** data, const size_t* sizes,
                           const int* tags, struct mk_mr** mrs) {
  if (!c || n < 1 || n > MK_MAX_RECVS || !data || !sizes || !tags) return -EINVAL;
  for (int i = 0; i < n; i++) {
    if ((!data[i] && sizes[i]) || sizes[i] > c->dev->max_msg_size) return -EINVAL;
    if (ofi_mr_check(c, mrs ? mrs[i] : NULL, data[i], sizes[i]) < 0) return -EINVAL;
  }
  return 0;
}

/* optional (NCCL_NET_OPTIONAL_RECV_COMPLETION) is a permission, not a duty: completions are
 * always reported when the data has landed, so a slot is never reused under the provider. */
int ofi_irecv(struct mk_comm* comm, int n, void** data, const size_t* sizes, const int* tags,
              struct mk_mr** mrs, int optional, struct mk_request** req) {
  struct ofi_comm* c = ofi_comm_of(comm, 0);
  if (req) *req = NULL;
  if (!req || ofi_irecv_check(c, n, data, sizes, tags, mrs) < 0) {
    MK_WARN("ofi irecv: bad argument (comm %p, n %d, data %p, sizes %p, tags %p)", (void*)comm, n,
            (void*)data, (const void*)sizes, (const void*)tags);
    return -EINVAL;
  }
  if (!ofi_call_lock(c)) return ofi_test_pending(c); /* NCCL asks again */
  /* eager arrivals first where the receive would announce itself: fewer cancels (the progress
   * thread reads them when there is one); one that will not is matched by the next read */
  const int read_first = c->nbounce && !ofi_runner_drives(c) &&
                         mk_ofi_recv_announces(sizes, n, c->eager_bytes, c->no_cts_ns != 0,
                                               c->recv_took_large);
  int rc = read_first ? ofi_cq_progress(c) : c->error;
  if (rc > 0) rc = 0;
  struct ofi_req* r = rc ? NULL : mk_req_pool_alloc(&c->pool);
  if (r) {
    r->base.comm = comm;
    r->kind = OFI_REQ_RECV;
    r->n = n;
    rc = ofi_recv_post(c, r, n, data, sizes, tags, mrs);
    if (rc == 0) *req = &r->base, ofi_progress_wake(c);
    else if (rc == 1) mk_req_pool_free(&c->pool, r);
    if (rc == 1) rc = 0;
    if (rc < 0) { /* half-posted: the comm cannot stay in step with its peer */
      MK_WARN("ofi irecv: posting failed (%s); the comm is unusable", strerror(-rc));
      ofi_comm_fail(c, rc);
    }
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* Host memory needs no flush; GPU buffers (FI_HMEM) are reported with force_flush = 0 and
 * NCCL does not flush on Hopper; a read-back flush is a known gap. */
int ofi_iflush(struct mk_comm* comm, int n, void** data, const int* sizes, struct mk_mr** mrs,
               struct mk_request** req) {
  if (req) *req = NULL;
  if (!ofi_comm_of(comm, 0) || !req || n < 1 || n > MK_MAX_RECVS || !data || !sizes) {
    MK_WARN("ofi iflush: bad argument (comm %p, n %d)", (void*)comm, n);
    return -EINVAL;
  }
  for (int i = 0; i < n; i++)
    if (sizes[i] < 0) {
      MK_WARN("ofi iflush: negative size %d", sizes[i]);
      return -EINVAL;
    }
  return 0;
}

/* A receive is over: its message sizes decide whether the next one announces itself; with
 * none left live, bounce buffers the provider had no room for are posted again and credits
 * due go back (ofi_eager_retry). */
static void ofi_recv_done(struct ofi_comm* c, struct ofi_req* r) {
  c->recv_took_large = mk_ofi_sizes_above(r->sizes, r->n, c->announce_after);
  ofi_rx_remove(c, r);
  ofi_write_forget(c, r);
  int rc = c->nbounce && c->nrx == 0 ? ofi_eager_retry(c) : 0;
  if (rc < 0) ofi_comm_fail(c, rc);
}

int ofi_test(struct mk_request* req, int* done, size_t* sizes) {
  if (!req || !done || !req->comm || req->comm->ops != &mk_ofi_ops) {
    MK_WARN("ofi test: bad request %p", (void*)req);
    return -EINVAL;
  }
  struct ofi_req* r = (struct ofi_req*)req;
  struct ofi_comm* c = (struct ofi_comm*)req->comm;
  *done = 0;
  if (ofi_runner_drives(c) && __atomic_load_n(&r->pending, __ATOMIC_ACQUIRE) != 0)
    return ofi_test_pending(c);
  if (!ofi_call_lock(c)) return ofi_test_pending(c); /* done, but told at the next test */
  if (!mk_req_pool_live(&c->pool, r)) { /* completed and freed by an earlier test */
    pthread_mutex_unlock(&c->lock);
    MK_WARN("ofi test: request %p is not in flight (tested again after it completed?)", (void*)req);
    return -EINVAL;
  }
  /* A request that an earlier call's progress already completed needs no CQ read: NCCL and
   * the loopback harness test the requests of a batch in turn, and the first test's read
   * usually completes the rest (each read costs rxm/tcp a poll of every socket). */
  int rc = __atomic_load_n(&r->pending, __ATOMIC_ACQUIRE) == 0 ? c->error : ofi_cq_progress(c);
  if (rc >= 0 && __atomic_load_n(&r->pending, __ATOMIC_ACQUIRE) == 0) {
    *done = 1;
    if (sizes) memcpy(sizes, r->sizes, sizeof(size_t) * (size_t)r->n);
    rc = __atomic_load_n(&r->error, __ATOMIC_RELAXED);
    /* A stripe's stream thread may fail the request after this thread last looked at the
     * streams: a lost connection still makes the whole comm fail from here on. */
    if (rc == -ECONNRESET) ofi_comm_fail(c, rc);
    if (r->kind == OFI_REQ_RECV) ofi_recv_done(c, r);
    ofi_progress_observe(c, ofi_req_bytes(r));
    ofi_req_release(c, r);
  } else if (rc == 0) {
    rc = ofi_peer_check(c); /* waiting without progress: is the peer still there? */
  }
  pthread_mutex_unlock(&c->lock);
  return rc < 0 ? rc : 0;
}
