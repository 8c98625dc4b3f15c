/* Completion dispatch and dead-peer detection for one comm. Caller holds c->lock. */
#include <string.h>
#include <arpa/inet.h>

#include "ib.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"

#define IB_CQ_BATCH 16

void ib_req_release(struct ib_comm* c, struct ib_req* r) {
  for (int k = 0; k < MK_MAX_RECVS; k++)
    if (r->tmp_mr[k]) {
      ib_dereg_mr(&c->base, r->tmp_mr[k]);
      r->tmp_mr[k] = NULL;
    }
  if (r->kind == IB_REQ_RECV && c->recv_by_slot[r->seq % IB_FIFO_DEPTH] == r)
    c->recv_by_slot[r->seq % IB_FIFO_DEPTH] = NULL;
  r->kind = 0;
  if (mk_req_pool_free(&c->pool, r) < 0) MK_WARN("ib: request %p freed twice", (void*)r);
}

/* A failed work request: the connection (or the device) is gone for good. */
static int ib_wc_errno(struct ib_comm* c, const struct ibv_wc* wc) {
  if (!c->error)
    MK_WARN("ib: work request failed: %s (vendor error %u); the comm is unusable",
            ib_sym.wc_status_str(wc->status), wc->vendor_err);
  int rc = wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_RNR_RETRY_EXC_ERR ||
                   wc->status == IBV_WC_WR_FLUSH_ERR || wc->status == IBV_WC_REM_ABORT_ERR ||
                   wc->status == IBV_WC_REM_OP_ERR || wc->status == IBV_WC_REM_INV_REQ_ERR ||
                   wc->status == IBV_WC_REM_ACCESS_ERR
               ? -ECONNRESET
               : -EIO;
  if (!c->error) c->error = rc;
  return rc;
}

static void ib_group_done(struct ib_comm* c, uint32_t gidx, int err) {
  struct ib_group* g = &c->groups[gidx % IB_GROUPS];
  if (!g->used) return;
  if (--g->pending > 0 && !err) return;
  for (uint32_t i = 0; i < g->nreqs; i++) {
    if (!g->reqs[i]) continue;
    if (err && !g->reqs[i]->error) g->reqs[i]->error = err;
    g->reqs[i]->pending = 0;
  }
  if (g->pending <= 0) g->used = 0;
}

/* One expected completion of r arrived. A receive is complete after its clear-to-send write
 * and one write-with-immediate per QP, in any order (the clear-to-send's own completion can
 * come last, after the data); its sizes are read from the sizes slot only then. */
static void ib_req_part_done(struct ib_comm* c, struct ib_req* r) {
  if (--r->pending > 0 || r->kind != IB_REQ_RECV || r->error) return;
  const uint32_t slot = r->seq % IB_FIFO_DEPTH; /* the receive holds its slot until it is tested */
  if (ib_recv_sizes_take(c->ctrl->sizes[slot], c->ctrl->cts_out[slot], r->n, r->sizes) < 0) {
    MK_WARN("ib: receive %u: the peer reports more bytes than a buffer offered (a corrupt or "
            "mismatched peer)",
            r->seq);
    r->error = -EPROTO;
    if (!c->error) c->error = -EPROTO;
  }
}

static void ib_recv_done(struct ib_comm* c, const struct ibv_wc* wc) {
  uint32_t seq = ntohl(wc->imm_data);
  struct ib_req* r = c->recv_by_slot[seq % IB_FIFO_DEPTH];
  if (!r || r->seq != seq || r->pending <= 0) {
    MK_WARN("ib: a completion for receive %u that is not pending", seq);
    c->error = -EPROTO;
    return;
  }
  ib_req_part_done(c, r);
}

static void ib_wc_dispatch(struct ib_comm* c, const struct ibv_wc* wc) {
  int kind = ib_wr_kind(wc->wr_id), err = 0;
  uint32_t idx = ib_wr_idx(wc->wr_id);
  if (wc->status != IBV_WC_SUCCESS) err = ib_wc_errno(c, wc);
  if (kind == IB_WR_GROUP) {
    ib_group_done(c, idx, err);
  } else if (kind == IB_WR_RECV) {
    if (!err) ib_recv_done(c, wc);
  } else if (kind == IB_WR_CTS || kind == IB_WR_PUT || kind == IB_WR_FLUSH) {
    struct ib_req* r = mk_req_pool_slot(&c->pool, idx);
    if (!r || !r->kind) return;
    if (err && !r->error) r->error = err;
    if (err && r->kind == IB_REQ_RECV) r->pending = 1; /* its data will never come */
    ib_req_part_done(c, r);
  }
}

int ib_cq_progress(struct ib_comm* c) {
  int handled = 0;
  MK_CHECK(ib_comm_check(c));
  for (int rail = 0; rail < c->nrails; rail++) {
    for (;;) {
      struct ibv_wc wc[IB_CQ_BATCH];
      int n = ibv_poll_cq(c->cq[rail], IB_CQ_BATCH, wc);
      if (n < 0) {
        MK_WARN("ib: polling the completion queue failed (%d)", n);
        c->error = -EIO;
        return c->error;
      }
      for (int i = 0; i < n; i++) ib_wc_dispatch(c, &wc[i]);
      handled += n;
      if (n < IB_CQ_BATCH) break;
    }
  }
  /* an error completion fails the requests it belongs to; the comm error is reported by
   * the next call that cannot make progress (ib_comm_check at entry) */
  return handled;
}

int ib_peer_check(struct ib_comm* c) {
  if (c->error) return c->error;
  uint64_t now = mk_now_ns();
  if (now - c->last_check_ns < IB_PEER_CHECK_NS) return 0;
  c->last_check_ns = now;
  if (c->peer_state != MK_PEER_BYE) c->peer_state = mk_sock_peer_state(c->sock);
  if (c->peer_state == MK_PEER_DEAD) {
    MK_WARN("ib: peer of comm %p vanished (side channel closed without bye)", (void*)c);
    c->error = -ECONNRESET;
  } else if (c->peer_state == MK_PEER_BYE) {
    if (!c->bye_ns) c->bye_ns = now;
    if (now - c->bye_ns > (uint64_t)mk_param_int(MK_PARAM_BYE_GRACE_MS) * 1000000ull) {
      MK_WARN("ib: peer of comm %p closed its end with this operation still pending", (void*)c);
      c->error = -ECONNRESET;
    }
  }
  return c->error;
}
