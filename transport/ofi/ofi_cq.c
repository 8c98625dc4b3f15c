/* Completion dispatch of stream 0 and dead-peer detection for one comm. Caller holds
 * c->lock. Streams 1.. are read by their own threads (ofi_stream.c). */
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "ofi.h"

#define OFI_CQ_BATCH 16

/* A clear-to-send landed in control buffer k: file it by sequence number, repost k. */
static int ofi_cts_arrived(struct ofi_comm* c, unsigned k) {
  const struct mk_ofi_cts* cts = &c->ctrl[k].cts;
  struct ofi_cts_slot* s = &c->slots[cts->seq % MK_MAX_REQUESTS];
  if (cts->magic != MK_OFI_CTS_MAGIC || cts->n < 1 || cts->n > MK_MAX_RECVS || s->valid ||
      cts->seq - c->seq >= MK_MAX_REQUESTS) {
    MK_WARN("ofi: malformed or out-of-window clear-to-send (seq %u, expecting %u..%u)", cts->seq,
            c->seq, c->seq + MK_MAX_REQUESTS - 1);
    return -EPROTO;
  }
  for (uint32_t i = 0; i < cts->n; i++) { /* the stripes must fit inside the buffer */
    unsigned nst = cts->nstripes[i];
    if (nst < 1 || nst > (unsigned)c->nstreams || cts->stream0[i] >= c->nstreams ||
        (nst > 1 && (cts->chunk[i] == 0 || cts->chunk[i] * (nst - 1) >= cts->sizes[i]))) {
      MK_WARN("ofi: clear-to-send %u entry %u: %u stripes of %llu bytes do not fit %d streams",
              cts->seq, i, nst, (unsigned long long)cts->chunk[i], c->nstreams);
      return -EPROTO;
    }
  }
  s->cts = *cts;
  s->matched = 0;
  s->valid = 1;
  return ofi_ctrl_post(c, k);
}

/* An error completion we did not ask for: cancellations (we cancel only at close, and never
 * read the CQ after that) and connection errors mean the peer or its connection is gone. */
static int ofi_completion_errno(struct ofi_comm* c, int fi_err) {
  int e = ofi_errno_of(fi_err);
  if (e == -ECONNRESET && !c->error) c->error = e; /* the comm is gone: every later op fails */
  return e;
}

static int ofi_op_done(struct ofi_comm* c, struct ofi_op* op, size_t len, int err) {
  if (op->kind == OFI_OP_CTRL_RECV) {
    if (err) {
      MK_WARN("ofi: control receive failed: %s", ofi_sym.strerror(-err));
      return ofi_completion_errno(c, -err);
    }
    return ofi_cts_arrived(c, op->idx);
  }
  struct ofi_req* r = op->req;
  if (op->kind == OFI_OP_SEND || op->kind == OFI_OP_RECV) { /* may race a stream thread */
    if (err) ofi_completion_errno(c, -err);
    ofi_req_complete(r, op, len, err);
    return 0;
  }
  if (err && !r->error) r->error = ofi_completion_errno(c, -err);
  if (op->kind == OFI_OP_PUT && r->ops[1].kind == OFI_OP_SIGNAL) {
    __atomic_sub_fetch(&r->pending, 1, __ATOMIC_RELEASE);
    if (err) {
      __atomic_sub_fetch(&r->pending, 1, __ATOMIC_RELEASE); /* the signal will never be posted */
      return 0;
    }
    r->signal_waiting = 1; /* the signal goes out only now that the data is delivered */
    c->signals_waiting++;
    return ofi_signal_post(c, r);
  }
  __atomic_sub_fetch(&r->pending, 1, __ATOMIC_RELEASE);
  return 0;
}

static int ofi_cq_error(struct ofi_comm* c) {
  struct fi_cq_err_entry e;
  memset(&e, 0, sizeof(e));
  ssize_t n = fi_cq_readerr(c->st[0].cq, &e, 0);
  if (n == -FI_EAGAIN) return 0;
  if (n < 0) return (int)n;
  MK_WARN("ofi: operation failed: %s (provider: %s)", ofi_sym.strerror(e.err),
            fi_cq_strerror(c->st[0].cq, e.prov_errno, e.err_data, NULL, 0));
  if (!e.op_context) return -EIO;
  return ofi_op_done(c, (struct ofi_op*)e.op_context, e.len, -(int)e.err);
}

/* Retries what could not be posted earlier (EAGAIN): control receives and signal writes. */
static int ofi_retry_deferred(struct ofi_comm* c) {
  for (unsigned k = 0; c->ctrl_unposted && k < MK_MAX_REQUESTS; k++)
    if (c->ctrl_unposted & (1u << k)) MK_CHECK(ofi_ctrl_post(c, k));
  for (uint32_t i = 0; (c->signals_waiting || c->cts_waiting) && i < c->pool.count; i++) {
    struct ofi_req* r = mk_req_pool_slot(&c->pool, i);
    if (r->signal_waiting) MK_CHECK(ofi_signal_post(c, r));
    if (r->cts_waiting) MK_CHECK(ofi_cts_post(c, r));
  }
  return 0;
}

/* A stream thread saw its connection fail: the comm fails as a whole. */
static int ofi_streams_error(struct ofi_comm* c) {
  for (int k = 1; k < c->nstreams && !c->error; k++) {
    int e = __atomic_load_n(&c->st[k].error, __ATOMIC_ACQUIRE);
    if (e) c->error = e;
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
      c->error = -EIO;
      return c->error;
    }
    for (ssize_t i = 0; i < n; i++)
      MK_CHECK_GOTO(ofi_op_done(c, (struct ofi_op*)e[i].op_context, e[i].len, 0), rc, fail);
    handled += (int)n;
    if (n < OFI_CQ_BATCH) break;
  }
  for (int k = 1; k < c->nstreams; k++) /* streams without a thread of their own */
    if (!c->st[k].has_thread) handled += ofi_stream_poll(&c->st[k], 0);
  MK_CHECK_GOTO(ofi_retry_deferred(c), rc, fail);
  return handled;
fail:
  if (!c->error) c->error = rc;
  return c->error;
}

int ofi_peer_check(struct ofi_comm* c) {
  if (c->error) return c->error;
  uint64_t now = ofi_now_ns();
  if (now - c->last_check_ns < MK_OFI_PEER_CHECK_NS) return 0;
  c->last_check_ns = now;
  if (c->peer_state != MK_PEER_BYE) c->peer_state = mk_sock_peer_state(c->sock);
  if (c->peer_state == MK_PEER_DEAD) {
    MK_WARN("ofi: peer of comm %p vanished (side channel closed without bye)", (void*)c);
    c->error = -ECONNRESET;
  } else if (c->peer_state == MK_PEER_BYE) {
    if (!c->bye_ns) c->bye_ns = now;
    if (now - c->bye_ns > MK_OFI_BYE_GRACE_NS) {
      MK_WARN("ofi: peer of comm %p closed its end with this operation still pending", (void*)c);
      c->error = -ECONNRESET;
    }
  }
  return c->error;
}
