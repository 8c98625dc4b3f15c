/*
 * A send comm's close with eager sends out (protocol version 8).
 *
 * Eager sends complete once the provider has taken them, and closing the endpoint under them
 * lost some: 7 of 32 messages in 20-45% of runs of a test that closes at once (session 54),
 * and still 4 of 12 runs after 1 ms of reading the CQ before the close (session 55);
 * delivery-complete sends did not help. So a closing sender waits, bounded by
 * OFI_EAGER_CLOSE_NS, until the receiver has taken every piece: all its credits are back.
 *
 * The receiver returns credits only when enough are owed or in a clear-to-send, so the
 * sender asks: a flush request (a 0-byte eager piece, proto.h) after which that receive comm
 * returns each credit as soon as it is owed. A receiver answers when its comm is read. Both
 * ends of a job often close at once, each first closing its send comm (NCCL frees a
 * channel's send connector before its receive connector), and then no one reads the receive
 * comms: so the waiting sender reads every other comm of the process that no one else holds
 * (ofi_comms_visit_idle), which answers the peer's request as the peer answers ours.
 */
#include "mk_log.h"
#include "ofi.h"

#define OFI_EAGER_CLOSE_NS 200000000ull

static uint64_t ofi_close_drains_short; /* atomic: closes that gave up waiting */

uint64_t mk_ofi_close_drains_short(void) {
  return __atomic_load_n(&ofi_close_drains_short, __ATOMIC_RELAXED);
}

/* 0 when posted, 1 when the provider had no room (next time), < 0 on error. */
static int ofi_eager_flush_ask(struct ofi_comm* c) {
  c->flush_op = (struct ofi_op){.kind = OFI_OP_FLUSH_SEND};
  ssize_t rc = fi_tsend(c->st[0].ep, NULL, 0, NULL, c->st[0].peer, mk_ofi_tag_eager_flush(),
                        &c->flush_op.ctx);
  if (rc == -FI_EAGAIN) return 1;
  if (rc != 0) {
    MK_WARN("ofi: comm %p cannot ask its receiver for its eager credits: %s", (void*)c,
            ofi_sym.strerror((int)-rc));
    return (int)rc;
  }
  mk_ofi_credits_take(&c->credits, 1);
  return 0;
}

/* Another comm of this process, under its lock: a receive comm with eager on is read, which
 * answers its sender's flush request. */
static void ofi_eager_serve(struct ofi_comm* other) {
  if (!other->is_send && other->eager_bytes && !other->error) (void)ofi_cq_progress(other);
}

void ofi_eager_close_drain(struct ofi_comm* c) {
  if (!c->is_send || !c->eager_bytes || c->error) return;
  const uint64_t start = mk_now_ns(), deadline = start + OFI_EAGER_CLOSE_NS;
  int asked = 0;
  while (c->credits.avail < c->credits.cap && !c->error && mk_now_ns() < deadline) {
    if (!asked && c->credits.avail > 0) {
      int rc = ofi_eager_flush_ask(c);
      if (rc < 0) break;
      asked = rc == 0;
    }
    if (ofi_cq_progress(c) != 0) continue;
    if (ofi_peer_check(c) < 0 || ofi_peer_bye(c)) break; /* nothing left to deliver to */
    ofi_comms_visit_idle(c, ofi_eager_serve);
  }
  const unsigned out = c->credits.cap - c->credits.avail;
  const double ms = (double)(mk_now_ns() - start) / 1e6;
  if (!out) return;
  /* A receiver that closed first reported any message it never received itself. */
  if (c->error || ofi_peer_bye(c)) {
    MK_INFO(MK_NCCL_SUBSYS_NET,
            "ofi: comm %p closed with %u eager credits out after %.1f ms: its receiver %s", (void*)c,
            out, ms, c->error ? "failed" : "closed first");
    return;
  }
  /* INFO, not WARN: under NCCL every message was received before the close (NCCL waited for
   * each receive), so what is out is credits the receiver had not returned yet. */
  __atomic_add_fetch(&ofi_close_drains_short, 1, __ATOMIC_RELAXED);
  MK_INFO(MK_NCCL_SUBSYS_NET,
          "ofi: comm %p gave up after %.1f ms waiting for its receiver to take or return %u "
          "eager pieces",
          (void*)c, ms, out);
}
