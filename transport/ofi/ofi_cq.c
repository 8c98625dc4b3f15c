/* Completion dispatch of stream 0 and dead-peer detection for one comm. Caller holds
 * c->lock. Streams 1.. are read by their own threads (ofi_stream.c). */
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"

#define OFI_CQ_BATCH 16

/* The stripes a clear-to-send describes must fit inside their buffers and streams. */
static int ofi_cts_check_stripes(const struct ofi_comm* c, const struct mk_ofi_cts* cts) {
  for (uint32_t i = 0; i < cts->n; i++) {
    unsigned nst = cts->nstripes[i];
    if (cts->write[i] > 1 || (cts->write[i] && !c->write_data)) {
      MK_WARN("ofi: clear-to-send %u entry %u asks to be written, which this comm did not agree to",
              cts->seq, i);
      return -EPROTO;
    }
    if (nst < 1 || nst > (unsigned)c->nstreams || cts->stream0[i] >= c->nstreams ||
        (nst > 1 && (cts->chunk[i] == 0 || cts->chunk[i] * (nst - 1) >= cts->sizes[i]))) {
      MK_WARN("ofi: clear-to-send %u entry %u: %u stripes of %llu bytes do not fit %d streams",
              cts->seq, i, nst, (unsigned long long)cts->chunk[i], c->nstreams);
      return -EPROTO;
    }
  }
  return 0;
}

/* A clear-to-send (or a credit return) landed in control buffer k: take its credits, file it
 * by sequence number unless every message of its receive already went eager, repost k. */
static int ofi_cts_arrived(struct ofi_comm* c, unsigned k) {
  const struct mk_ofi_cts* cts = &c->ctrl[k].cts;
  struct ofi_cts_slot* s = &c->slots[cts->seq % MK_MAX_REQUESTS];
  int live = s->valid && mk_ofi_msn_diff(c->msn, s->cts.msn) < (int32_t)s->cts.n;
  if (cts->magic != MK_OFI_CTS_MAGIC || cts->n > MK_MAX_RECVS || (cts->n && live)) {
    MK_WARN("ofi: malformed or out-of-window clear-to-send (seq %u, n %u, slot %s)", cts->seq,
            cts->n, live ? "busy" : "free");
    return -EPROTO;
  }
  MK_CHECK(ofi_cts_check_stripes(c, cts));
  MK_CHECK(ofi_eager_cts(c, cts, s));
  return ofi_ctrl_post(c, k);
}

int ofi_peer_bye(struct ofi_comm* c) {
  if (c->peer_state != MK_PEER_BYE && c->sock >= 0) c->peer_state = mk_sock_peer_state(c->sock);
  return c->peer_state == MK_PEER_BYE;
}

/* An error completion we did not ask for: cancellations (we cancel only at close, and never
 * read the CQ after that) and connection errors mean the peer or its connection is gone. */
static int ofi_completion_errno(struct ofi_comm* c, int fi_err) {
  int e = ofi_errno_of(fi_err);
  if (e == -ECONNRESET) ofi_comm_fail(c, e); /* the comm is gone: every later op fails */
  return e;
}

static int ofi_op_done(struct ofi_comm* c, struct ofi_op* op, uint64_t tag, size_t len, int err) {
  if (op->kind == OFI_OP_CTRL_RECV || op->kind == OFI_OP_EAGER_RECV) {
    if (err) {
      MK_WARN("ofi: %s receive failed: %s", op->kind == OFI_OP_CTRL_RECV ? "control" : "eager",
              ofi_sym.strerror(-err));
      return ofi_completion_errno(c, -err);
    }
    return op->kind == OFI_OP_CTRL_RECV ? ofi_cts_arrived(c, op->idx)
                                        : ofi_eager_arrived(c, (struct ofi_bounce*)op, tag, len);
  }
  if (op->kind == OFI_OP_CREDIT_SEND || op->kind == OFI_OP_FLUSH_SEND) {
    if (op->kind == OFI_OP_CREDIT_SEND) c->credit_busy = 0;
    return err ? ofi_completion_errno(c, -err) : 0;
  }
  /* data stripes, put stripes and signals: stream threads may complete the same request */
  struct ofi_req* r = op->req;
  if (err) ofi_completion_errno(c, -err);
  ofi_req_complete(r, op, len, err);
  /* a put's signal goes out once its last data stripe is delivered */
  return op->kind == OFI_OP_PUT ? ofi_signal_post(c, r) : 0;
}

static int ofi_cq_error(struct ofi_comm* c) {
  struct fi_cq_err_entry e;
  memset(&e, 0, sizeof(e));
  ssize_t n = fi_cq_readerr(c->st[0].cq, &e, 0);
  if (n == -FI_EAGAIN) return 0;
  if (n < 0) return (int)n;
  struct ofi_op* op = e.op_context;
  if (op && __atomic_load_n(&op->cancelled, __ATOMIC_ACQUIRE) && e.err == FI_ECANCELED) {
    ofi_req_complete(op->req, op, 0, 0); /* its message came eager */
    return 0;
  }
  if (op &&
      (op->kind == OFI_OP_CTS_SEND || op->kind == OFI_OP_CREDIT_SEND ||
       op->kind == OFI_OP_FLUSH_SEND || op->kind == OFI_OP_EAGER_RECV) &&
      ofi_peer_bye(c)) {
    /* With eager sends a sender may finish, say "bye" and close while a clear-to-send or
     * credit return to it is on the way, or with our bounce buffers still posted: that loss
     * is no error. Whatever a receive still waits for fails after the bye grace
     * (ofi_peer_check). */
    MK_INFO(MK_NCCL_SUBSYS_NET, "ofi: comm %p: %s to a peer that closed dropped", (void*)c,
            op->kind == OFI_OP_EAGER_RECV ? "a bounce buffer" : "a control message");
    return op->kind == OFI_OP_EAGER_RECV ? 0 : ofi_op_done(c, op, e.tag, e.len, 0);
  }
  MK_WARN("ofi: operation (kind %d) failed: %s (provider: %s)", op ? op->kind : -1,
          ofi_sym.strerror(e.err), fi_cq_strerror(c->st[0].cq, e.prov_errno, e.err_data, NULL, 0));
  if (!e.op_context) return -EIO;
  return ofi_op_done(c, op, e.tag, e.len, -(int)e.err);
}

/* Retries what could not be posted earlier (EAGAIN): control receives, clear-to-sends, bounce
 * buffers and credit returns; sends the clear-to-sends of small receives that waited too long
 * for their eager messages; posts the signals of puts whose last stripe completed on a
 * stream thread; and, on the progress thread, the clear-to-sends and sends left to it. */
static int ofi_retry_deferred(struct ofi_comm* c) {
  for (unsigned k = 0; c->ctrl_unposted && k < MK_OFI_CTRL_BUFS; k++)
    if (c->ctrl_unposted & (1ull << k)) MK_CHECK(ofi_ctrl_post(c, k));
  if (c->nbounce) MK_CHECK(ofi_eager_retry(c));
  if (c->unannounced) MK_CHECK(ofi_recv_announce_late(c));
  /* a posted signal leaves sig_wait (the last entry moves into its place) */
  for (int i = 0; i < c->signals_waiting;) {
    struct ofi_req* r = c->sig_wait[i];
    MK_CHECK(ofi_signal_post(c, r));
    if (r->signal_waiting) i++;
  }
  for (uint32_t i = 0; c->cts_waiting && i < c->pool.count; i++) {
    struct ofi_req* r = mk_req_pool_slot(&c->pool, i);
    if (r->cts_waiting) MK_CHECK(ofi_cts_post(c, r));
  }
  for (uint32_t i = 0; c->sends_waiting && i < c->pool.count; i++) {
    struct ofi_req* r = mk_req_pool_slot(&c->pool, i);
    if (r->send_waiting) {
      int rc = ofi_send_deferred_post(c, r);
      if (rc < 0) return rc;
      if (rc == 1) break; /* the provider is full: the rest later */
    }
  }
  return 0;
}

/* A stream thread saw its connection fail: the comm fails as a whole. */
static int ofi_streams_error(struct ofi_comm* c) {
  for (int k = 1; k < c->nstreams && !c->error; k++) {
    int e = __atomic_load_n(&c->st[k].error, __ATOMIC_ACQUIRE);
    if (e) ofi_comm_fail(c, e);
  }
  return c->error;
}

int ofi_cq_progress(struct ofi_comm* c) {
  struct fi_cq_tagged_entry e[OFI_CQ_BATCH];
  int handled = 0, rc;
  if (c->error || ofi_streams_error(c)) return c->error;
  for (;;) {
    ssize_t n = fi_cq_read(c->st[0].cq, e, OFI_CQ_BATCH);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      MK_CHECK_GOTO(ofi_cq_error(c), rc, fail);
      handled++;
      continue;
    }
    if (n < 0) {
      MK_WARN("ofi: reading the completion queue failed: %s", ofi_sym.strerror((int)-n));
      ofi_comm_fail(c, -EIO);
      return c->error;
    }
    for (ssize_t i = 0; i < n; i++)
      MK_CHECK_GOTO(e[i].op_context ? ofi_op_done(c, e[i].op_context, e[i].tag, e[i].len, 0)
                                    : ofi_write_landed(c, 0, e[i].flags, e[i].data), rc, fail);
    handled += (int)n;
    if (n < OFI_CQ_BATCH) break;
  }
  for (int k = 1; k < c->nstreams; k++) /* streams without a thread of their own */
    if (!c->st[k].has_thread) handled += ofi_stream_poll(&c->st[k], 0);
  MK_CHECK_GOTO(ofi_recv_cancel_tails(c), rc, fail);
  MK_CHECK_GOTO(ofi_retry_deferred(c), rc, fail);
  return handled;
fail:
  ofi_comm_fail(c, rc);
  return c->error;
}

int ofi_peer_check(struct ofi_comm* c) {
  if (c->error) return c->error;
  uint64_t now = mk_now_ns();
  if (now - c->last_check_ns < MK_OFI_PEER_CHECK_NS) return 0;
  c->last_check_ns = now;
  if (c->peer_state != MK_PEER_BYE) c->peer_state = mk_sock_peer_state(c->sock);
  if (c->peer_state == MK_PEER_DEAD) {
    MK_WARN("ofi: peer of comm %p vanished (side channel closed without bye)", (void*)c);
    ofi_comm_fail(c, -ECONNRESET);
  } else if (c->peer_state == MK_PEER_BYE) {
    if (!c->bye_ns) c->bye_ns = now;
    if (now - c->bye_ns > (uint64_t)mk_param_int(MK_PARAM_BYE_GRACE_MS) * 1000000ull) {
      MK_WARN("ofi: peer of comm %p closed its end with this operation still pending", (void*)c);
      ofi_comm_fail(c, -ECONNRESET);
    }
  }
  return c->error;
}
