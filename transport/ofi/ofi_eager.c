/*
 * The eager path over libfabric; eager.h states the rules (message numbers, which path a
 * send takes, buffer matching, credits). Receive side: nbounce bounce buffers of
 * eager_bytes each, registered once and kept posted on stream 0 (tag EAGER, the message
 * number and user tag ignored by the match); an arrived message waits in the unexpected
 * queue until its receive is posted and every earlier message of that receive has been
 * delivered, is then copied into the user buffer, and the bounce buffer is reposted (its
 * credit goes back in the next clear-to-send, in a credit-only message once a quarter of
 * the buffers are owed, or at once after the closing sender's flush request). When the receive had
 * already posted that buffer and sent its clear-to-send (the message crossed it), the buffer's
 * posted stripes are cancelled, or, for a written buffer, the write it expected is let go. A
 * receive whose buffers all fit a bounce buffer sends no clear-to-send (version 7): its messages
 * can only come eager. Send side: an eager send, and what an arriving clear-to-send means for the
 * messages that went eager before it. Everything here runs under the comm lock.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"

#define OFI_BOUNCE_ALIGN 64

static int ofi_credit_send(struct ofi_comm* c);

/* A bounce buffer holds one piece of an eager message. */
static size_t ofi_bounce_len(const struct ofi_comm* c) {
  return c->eager_bytes < MK_OFI_EAGER_PIECE ? c->eager_bytes : MK_OFI_EAGER_PIECE;
}

static size_t ofi_bounce_stride(const struct ofi_comm* c) {
  return (ofi_bounce_len(c) + OFI_BOUNCE_ALIGN - 1) & ~(size_t)(OFI_BOUNCE_ALIGN - 1);
}

/* GPU receive buffers (FI_HMEM) cannot be filled by a host memcpy: no eager there. */
void ofi_eager_offer(const struct ofi_comm* c, struct mk_ofi_hello* out) {
  int on = !c->dev->hmem;
  out->eager_bytes = on ? (uint32_t)mk_param_int(MK_PARAM_OFI_EAGER_BYTES) : 0;
  out->eager_bufs = on && !c->is_send ? (uint16_t)mk_param_int(MK_PARAM_OFI_EAGER_BUFS) : 0;
}

/* Posts bounce buffer b. A credit it owes the sender (it held a consumed message) becomes
 * returnable once it is posted again; EAGAIN leaves it for ofi_eager_retry. */
static int ofi_bounce_post(struct ofi_comm* c, struct ofi_bounce* b) {
  b->op = (struct ofi_op){.kind = OFI_OP_EAGER_RECV};
  ssize_t rc = fi_trecv(c->st[0].ep, b->buf, ofi_bounce_len(c), c->bounce_desc, FI_ADDR_UNSPEC,
                        MK_OFI_TAG_EAGER, MK_OFI_EAGER_IGNORE, &b->op.ctx);
  if (rc == -FI_EAGAIN) {
    if (!b->unposted) c->bounce_unposted++;
    b->unposted = 1;
    return 0;
  }
  if (b->unposted) c->bounce_unposted--;
  b->unposted = 0;
  if (rc != 0) {
    MK_WARN("ofi: cannot post an eager bounce buffer: %s", ofi_sym.strerror((int)-rc));
    return (int)rc;
  }
  if (b->credit_due) c->owed.owed++;
  b->credit_due = 0;
  return 0;
}

static int ofi_bounce_setup(struct ofi_comm* c, uint32_t nbufs) {
  size_t stride = ofi_bounce_stride(c);
  size_t len = stride * nbufs + sizeof(struct ofi_ctrl_buf);
  if (posix_memalign((void**)&c->bounce_mem, OFI_BOUNCE_ALIGN, len) != 0) return -ENOMEM;
  memset(c->bounce_mem + stride * nbufs, 0, sizeof(struct ofi_ctrl_buf));
  c->credit_msg = (struct ofi_ctrl_buf*)(c->bounce_mem + stride * nbufs);
  c->bounce = calloc(nbufs, sizeof(*c->bounce));
  if (!c->bounce) return -ENOMEM;
  MK_CHECK(mk_ofi_uq_init(&c->uq, nbufs));
  mk_ofi_owed_init(&c->owed, nbufs, mk_ofi_eager_pieces(c->eager_bytes));
  MK_CHECK(ofi_internal_reg(c, c->bounce_mem, len, &c->bounce_mr, &c->bounce_desc));
  c->nbounce = nbufs;
  for (uint32_t i = 0; i < nbufs; i++) {
    c->bounce[i].buf = c->bounce_mem + stride * i;
    MK_CHECK(ofi_bounce_post(c, &c->bounce[i]));
  }
  return 0;
}


/* Both hellos are known: the eager size both ends use; the receiver posts its bounce
 * buffers now, before its hello goes out, so no eager message can arrive unexpected. */
int ofi_eager_agree(struct ofi_comm* c, const struct mk_ofi_hello* ours,
                    const struct mk_ofi_hello* theirs) {
  uint32_t nbufs = c->is_send ? theirs->eager_bufs : ours->eager_bufs;
  c->eager_bytes = mk_ofi_eager_negotiate(ours->eager_bytes, theirs->eager_bytes, nbufs);
  MK_INFO(MK_NCCL_SUBSYS_NET, "ofi %s comm %p: eager up to %u bytes, %u bounce buffers",
          c->is_send ? "send" : "recv", (void*)c, c->eager_bytes, c->eager_bytes ? nbufs : 0);
  if (!c->eager_bytes) return 0;
  if (c->is_send) {
    mk_ofi_credits_init(&c->credits, nbufs);
    return 0;
  }
  c->no_cts_ns = (uint64_t)mk_param_int(MK_PARAM_OFI_NO_CTS_MS) * 1000000ull;
  c->announce_after = (uint64_t)mk_param_int(MK_PARAM_OFI_ANNOUNCE_AFTER);
  return ofi_bounce_setup(c, nbufs);
}

void ofi_eager_close_fabric(struct ofi_comm* c) {
  if (c->bounce_mr) fi_close(&c->bounce_mr->fid);
  c->bounce_mr = NULL;
}

void ofi_eager_destroy(struct ofi_comm* c) {
  if (c->eager_bytes)
    MK_INFO(MK_NCCL_SUBSYS_NET,
            "ofi %s comm %p: %llu messages eager (%llu waited for their "
            "receive, %llu crossed its clear-to-send), %llu through a clear-to-send; %llu "
            "receives without one (%llu sent it late)",
            c->is_send ? "send" : "recv", (void*)c, (unsigned long long)c->n_eager,
            (unsigned long long)c->n_queued, (unsigned long long)c->n_crossed,
            (unsigned long long)c->n_cts, (unsigned long long)c->n_unannounced,
            (unsigned long long)c->n_late);
  if (c->uq.count)
    MK_INFO(MK_NCCL_SUBSYS_NET, "ofi: comm %p closed with %u eager messages never received",
            (void*)c, c->uq.count);
  mk_ofi_uq_fini(&c->uq);
  free(c->bounce);
  free(c->bounce_mem);
  c->bounce = NULL, c->bounce_mem = NULL, c->credit_msg = NULL, c->nbounce = 0;
}

/* Returns the owed credits on their own once enough are owed (one message in flight), or any
 * owed once the sender has asked for them at its close (version 8). */
static int ofi_credit_send(struct ofi_comm* c) {
  if (c->credit_busy || !(mk_ofi_owed_due(&c->owed) || (c->flush_asked && c->owed.owed))) return 0;
  struct ofi_ctrl_buf* m = c->credit_msg;
  memset(&m->cts, 0, sizeof(m->cts));
  m->cts.magic = MK_OFI_CTS_MAGIC;
  m->cts.credits = c->owed.owed;
  m->op = (struct ofi_op){.kind = OFI_OP_CREDIT_SEND};
  ssize_t rc = fi_tsend(c->st[0].ep, &m->cts, sizeof(m->cts), c->bounce_desc, c->st[0].peer,
                        MK_OFI_TAG_CTRL, &m->op.ctx);
  if (rc == -FI_EAGAIN) return 0; /* retried from progress */
  if (rc != 0) {
    MK_WARN("ofi: cannot return eager credits: %s", ofi_sym.strerror((int)-rc));
    return (int)rc;
  }
  mk_ofi_owed_take(&c->owed);
  c->credit_busy = 1;
  c->n_credit_msgs++;
  return 0;
}

/* The sender is closing (ofi_eager_close.c): the flush request's buffer is free again at once,
 * and from now on every credit goes back as soon as it is owed. */
static int ofi_eager_flush_arrived(struct ofi_comm* c, struct ofi_bounce* b) {
  c->flush_asked = 1;
  b->credit_due = 1;
  MK_CHECK(ofi_bounce_post(c, b));
  return ofi_credit_send(c);
}

int ofi_eager_retry(struct ofi_comm* c) {
  for (uint32_t i = 0; c->bounce_unposted && i < c->nbounce; i++)
    if (c->bounce[i].unposted) MK_CHECK(ofi_bounce_post(c, &c->bounce[i]));
  return ofi_credit_send(c);
}

int ofi_rx_add(struct ofi_comm* c, struct ofi_req* r) {
  if (c->nrx >= MK_MAX_REQUESTS) return -EPROTO;
  c->rx[c->nrx++] = r;
  return 0;
}

void ofi_rx_remove(struct ofi_comm* c, struct ofi_req* r) {
  for (uint32_t i = 0; i < c->nrx; i++)
    if (c->rx[i] == r) {
      memmove(&c->rx[i], &c->rx[i + 1], sizeof(c->rx[0]) * (c->nrx - i - 1));
      c->nrx--;
      return;
    }
}

static struct ofi_req* ofi_rx_find(struct ofi_comm* c, uint32_t m) {
  for (uint32_t i = 0; i < c->nrx; i++)
    if (mk_ofi_msn_in(m, c->rx[i]->msn0, (uint32_t)c->rx[i]->n)) return c->rx[i];
  return NULL;
}

int ofi_recv_cancel_stripes(struct ofi_comm* c, struct ofi_req* r, int i, unsigned from) {
  for (unsigned k = from; k < r->cts.nstripes[i]; k++) {
    struct ofi_op* op = &r->ops[OFI_OP_AT(i, k)];
    struct ofi_stream* st = &c->st[(r->cts.stream0[i] + k) % (unsigned)c->nstreams];
    __atomic_store_n(&op->cancelled, 1, __ATOMIC_RELEASE);
    ssize_t rc = fi_cancel(&st->ep->fid, &op->ctx);
    if (rc != 0) {
      MK_WARN("ofi: cannot cancel a receive stripe nothing will fill: %s",
              ofi_sym.strerror((int)-rc));
      return -EIO;
    }
  }
  return 0;
}

int ofi_recv_cancel_tails(struct ofi_comm* c) {
  if (!__atomic_load_n(&c->tails_pending, __ATOMIC_ACQUIRE)) return 0;
  for (uint32_t j = 0; j < c->nrx; j++) {
    struct ofi_req* r = c->rx[j];
    for (int i = 0; i < r->n; i++) {
      unsigned from = __atomic_load_n(&r->tail_from[i], __ATOMIC_ACQUIRE);
      if (!from || (r->tail_cancelled & (1u << i))) continue;
      r->tail_cancelled |= (uint8_t)(1u << i);
      __atomic_sub_fetch(&c->tails_pending, 1, __ATOMIC_RELAXED);
      MK_CHECK(ofi_recv_cancel_stripes(c, r, i, from));
    }
  }
  return 0;
}

/* Entry i's stripes were posted (the clear-to-send went out) but its message came eager:
 * nothing will ever match them, so they are cancelled (ofi_cq.c, ofi_stream.c count each
 * FI_ECANCELED completion as the stripe being done). */
static int ofi_entry_cancel(struct ofi_comm* c, struct ofi_req* r, int i) {
  MK_CHECK(ofi_recv_cancel_stripes(c, r, i, 0));
  r->posted_mask &= (uint8_t)~(1u << i);
  return 0;
}

/* The first piece of receive r's next eager message to arrive: the first free buffer with its
 * tag takes the message; a buffer whose stripes the clear-to-send had posted, or that it had
 * marked written, lets go of them. The message counts in pending until it is whole (an
 * unannounced receive counted it already). */
static int ofi_eager_begin(struct ofi_comm* c, struct ofi_req* r, const struct mk_ofi_uq_ent* e) {
  int i = mk_ofi_match_entry(r->cts.tags, (uint32_t)r->n, r->eager_mask, e->tag);
  if (i < 0) {
    MK_WARN("ofi: eager message %u has tag %d, which no free buffer of its receive has",
            e->msn, e->tag);
    return -EPROTO;
  }
  r->eager_entry = (uint8_t)i;
  r->eager_pieces = (struct mk_ofi_pieces){0};
  r->eager_active = 1;
  r->eager_bad = 0;
  r->eager_mask |= (uint8_t)(1u << i);
  if (!r->unannounced) __atomic_add_fetch(&r->pending, 1, __ATOMIC_RELAXED);
  if (r->posted_mask & (1u << i)) {
    c->n_crossed++;
    MK_CHECK(ofi_entry_cancel(c, r, i));
  } else if (r->cts.write[i]) {
    c->n_crossed++;
    ofi_write_unexpect(c, r, i);
  }
  return 0;
}

/* The message is whole: the receive's next one may come. */
static void ofi_eager_finish(struct ofi_comm* c, struct ofi_req* r) {
  r->eager_active = 0;
  r->eager_done++;
  c->n_eager++;
  if (r->eager_bad) __atomic_store_n(&r->sizes[r->eager_entry], 0, __ATOMIC_RELAXED);
  if (r->unannounced && r->eager_done == r->n) r->unannounced = 0, c->unannounced--;
  __atomic_sub_fetch(&r->pending, 1, __ATOMIC_RELEASE); /* last: test() may read r now */
}

/* A piece of receive r's current eager message: copied to its place in the buffer the
 * message took. A message larger than that buffer fails the receive (-EMSGSIZE) and is
 * dropped; the comm stays in step. */
static int ofi_eager_deliver(struct ofi_comm* c, struct ofi_req* r, const struct mk_ofi_uq_ent* e) {
  struct ofi_bounce* b = &c->bounce[e->buf];
  if (!r->eager_active) MK_CHECK(ofi_eager_begin(c, r, e));
  const int i = r->eager_entry;
  if (e->tag != r->cts.tags[i]) {
    MK_WARN("ofi: pieces of eager message %u carry tags %d and %d", e->msn, r->cts.tags[i], e->tag);
    return -EPROTO;
  }
  const uint64_t off = (uint64_t)e->piece * MK_OFI_EAGER_PIECE;
  int fits = mk_ofi_eager_fits(off + e->len, r->cts.sizes[i]);
  if (fits < 0 && !r->eager_bad) {
    MK_WARN(
        "ofi irecv: an eager message (tag %d) longer than %llu bytes does not fit the "
        "posted %llu-byte buffer",
        e->tag, (unsigned long long)(off + e->len - 1), (unsigned long long)r->cts.sizes[i]);
    int expected = 0;
    __atomic_compare_exchange_n(&r->error, &expected, fits, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    r->eager_bad = 1;
  } else if (fits == 0 && e->len) {
    memcpy((char*)r->data[i] + off, b->buf, e->len);
    __atomic_add_fetch(&r->sizes[i], (size_t)e->len, __ATOMIC_RELAXED);
  }
  int whole = mk_ofi_pieces_add(&r->eager_pieces, e->piece, e->last);
  if (whole < 0) {
    MK_WARN("ofi: eager message %u: piece %u%s contradicts the pieces before it", e->msn, e->piece,
            e->last ? " (the last)" : "");
    return whole;
  }
  b->credit_due = 1;
  MK_CHECK(ofi_bounce_post(c, b));
  if (whole) ofi_eager_finish(c, r);
  return ofi_credit_send(c);
}

/* Delivers every queued message whose receive is posted and whose turn it is. */
int ofi_eager_drain(struct ofi_comm* c) {
  for (uint32_t q = 0; q < c->uq.count;) {
    struct mk_ofi_uq_ent e = c->uq.e[q];
    struct ofi_req* r = ofi_rx_find(c, e.msn);
    int rc = r ? (r->posting ? 0 : mk_ofi_eager_next(e.msn, r->msn0, (uint32_t)r->n, r->eager_done))
               : (mk_ofi_msn_diff(e.msn, c->msn) < 0 ? -EPROTO : 0);
    if (rc < 0) {
      MK_WARN("ofi: eager message %u belongs to no receive still waiting for it", e.msn);
      return rc;
    }
    if (rc == 0) {
      q++;
      continue;
    }
    mk_ofi_uq_remove(&c->uq, q);
    MK_CHECK(ofi_eager_deliver(c, r, &e));
    q = 0; /* that may have been the turn of one queued before it */
  }
  return 0;
}

int ofi_eager_arrived(struct ofi_comm* c, struct ofi_bounce* b, uint64_t tag, size_t len) {
  if (!mk_ofi_tag_is_eager(tag) || len > ofi_bounce_len(c)) {
    MK_WARN("ofi: a bounce buffer got a foreign message (tag %#llx, %zu bytes)",
            (unsigned long long)tag, len);
    return -EPROTO;
  }
  if (mk_ofi_eager_is_flush(tag, len)) return ofi_eager_flush_arrived(c, b);
  struct mk_ofi_uq_ent e = {.msn = mk_ofi_msn_expand(c->msn, mk_ofi_tag_eager_msn(tag)),
                            .tag = mk_ofi_tag_eager_user(tag),
                            .len = (uint32_t)len,
                            .buf = (uint32_t)(b - c->bounce),
                            .piece = (uint8_t)mk_ofi_tag_eager_piece(tag),
                            .last = (uint8_t)mk_ofi_tag_eager_last(tag)};
  if (mk_ofi_uq_push(&c->uq, &e) < 0) {
    MK_WARN("ofi: more eager messages than bounce buffers: the sender ignored its credits");
    return -EPROTO;
  }
  MK_CHECK(ofi_eager_drain(c));
  if (mk_ofi_uq_find(&c->uq, e.msn) >= 0) c->n_queued++;
  return 0;
}

/* Sender: the message in pieces of MK_OFI_EAGER_PIECE bytes, all posted now (the caller
 * holds a credit for each), as a send's stripes are (ofi_stripe_post_in_turn on stream 0):
 * 1 when nothing could be posted (no request, or the provider said EAGAIN for the first
 * piece); a later piece's EAGAIN is waited out, bounded. A piece's completion means only
 * that the provider took it (delivery-complete pieces cost 1.3 us a post at 8 B on the CPU
 * host, session 54): a closing send comm waits for its credits instead. */
int ofi_eager_send(struct ofi_comm* c, void* data, size_t size, int tag, struct mk_mr* mr,
                   struct ofi_req** out) {
  struct ofi_req* r = mk_req_pool_alloc(&c->pool);
  if (!r) return 1;
  const uint32_t pieces = mk_ofi_eager_pieces(size);
  r->kind = OFI_REQ_SEND;
  r->n = 1;
  r->sizes[0] = size;
  r->pending = (int)pieces;
  for (uint32_t k = 0; k < pieces; k++) {
    const size_t off = (size_t)k * MK_OFI_EAGER_PIECE;
    const size_t len = size - off < MK_OFI_EAGER_PIECE ? size - off : MK_OFI_EAGER_PIECE;
    struct ofi_op* op = &r->ops[OFI_OP_AT(0, k)];
    *op = (struct ofi_op){.req = r, .kind = OFI_OP_SEND, .stripe = (uint8_t)k};
    int rc = ofi_stripe_post_in_turn(c, k == 0 ? OFI_POST_FIRST : OFI_POST_WAITED, 0,
                                     (char*)data + off, len, ofi_mr_desc(mr),
                                     mk_ofi_tag_eager(c->msn, k, k + 1 == pieces, tag), op);
    if (rc == 0) continue;
    if (k == 0) mk_req_pool_free(&c->pool, r); /* nothing posted; else the comm has failed */
    if (rc == -FI_EAGAIN && k == 0) return 1;
    MK_WARN("ofi: posting piece %u of an eager send of %zu bytes failed: %s", k, size,
            strerror(-rc));
    return rc;
  }
  mk_ofi_credits_take(&c->credits, pieces);
  c->n_eager++;
  *out = r;
  return 0;
}

/* Sender: a clear-to-send (or credit return) arrived. Messages of its receive sent before it
 * went eager: replayed, so the rest of the receive goes to the buffers the receiver left
 * for it; a receive whose every message went eager is done with. */
int ofi_eager_cts(struct ofi_comm* c, const struct mk_ofi_cts* cts, struct ofi_cts_slot* s) {
  if (mk_ofi_credits_give(&c->credits, cts->credits) < 0) {
    MK_WARN("ofi: the receiver returned %u eager credits, more than it was lent", cts->credits);
    return -EPROTO;
  }
  if (cts->n == 0) return 0;
  c->cts_idle_reads = 0; /* the receiver announces again: isends read for it first */
  int32_t sent = mk_ofi_msn_diff(c->msn, cts->msn);
  if (sent >= (int32_t)cts->n) return 0;
  s->cts = *cts;
  s->matched = 0;
  s->valid = 1;
  if (sent <= 0) return 0;
  int rc = mk_ofi_replay(c->sent_tags, cts->msn, (uint32_t)sent, cts->tags, cts->n, &s->matched);
  if (rc < 0)
    MK_WARN("ofi: the eager messages of receive %u do not match its buffers' tags", cts->seq);
  return rc;
}

/* Under the lock: the progress thread counts too. */
uint64_t mk_ofi_receives_unannounced(const struct mk_comm* comm, uint64_t* late) {
  struct ofi_comm* c = (struct ofi_comm*)comm;
  uint64_t n = 0, l = 0;
  if (comm && comm->ops == &mk_ofi_ops && !c->is_send) {
    pthread_mutex_lock(&c->lock);
    n = c->n_unannounced, l = c->n_late;
    pthread_mutex_unlock(&c->lock);
  }
  if (late) *late = l;
  return n;
}

static uint64_t ofi_count_locked(const struct mk_comm* comm, size_t offset) {
  struct ofi_comm* c = (struct ofi_comm*)comm;
  uint64_t n = 0;
  if (comm && comm->ops == &mk_ofi_ops) {
    pthread_mutex_lock(&c->lock);
    n = *(const uint64_t*)((const char*)c + offset);
    pthread_mutex_unlock(&c->lock);
  }
  return n;
}

uint64_t mk_ofi_messages_eager(const struct mk_comm* comm) {
  return ofi_count_locked(comm, offsetof(struct ofi_comm, n_eager));
}

uint64_t mk_ofi_messages_announced(const struct mk_comm* comm) {
  return ofi_count_locked(comm, offsetof(struct ofi_comm, n_cts));
}

uint64_t mk_ofi_isend_reads_skipped(const struct mk_comm* comm) {
  return ofi_count_locked(comm, offsetof(struct ofi_comm, n_reads_skipped));
}

uint64_t mk_ofi_calls_sent_back(const struct mk_comm* comm) {
  const struct ofi_comm* c = (const struct ofi_comm*)comm;
  return comm && comm->ops == &mk_ofi_ops ? __atomic_load_n(&c->n_sent_back, __ATOMIC_RELAXED) : 0;
}

void mk_ofi_hold_lock(struct mk_comm* comm, int hold) {
  struct ofi_comm* c = (struct ofi_comm*)comm;
  if (!comm || comm->ops != &mk_ofi_ops) return;
  if (hold)
    pthread_mutex_lock(&c->lock);
  else
    pthread_mutex_unlock(&c->lock);
}

uint64_t mk_ofi_sends_by_thread(const struct mk_comm* comm) {
  return ofi_count_locked(comm, offsetof(struct ofi_comm, n_thread_sends));
}

uint64_t mk_ofi_credit_messages(const struct mk_comm* comm) {
  return ofi_count_locked(comm, offsetof(struct ofi_comm, n_credit_msgs));
}
