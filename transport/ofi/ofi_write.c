/*
 * Messages written with RMA (protocol version 5, proto.h). Over tcp;ofi_rxm a tagged message
 * above rxm's 16 KiB eager size takes rxm's rendezvous: a request to the receiver, which
 * reads the data and acknowledges, three trips on top of our clear-to-send (one 128 KiB
 * message: 90 us one way on the CPU host against 56 us for a put, bench/NOTES.md session
 * 50). Our clear-to-send already tells the sender where the receive's buffer is, so the
 * sender can write the message there itself: the receiver posts nothing for such an entry,
 * and counts each stripe when its remote CQ data arrives (on the stream it was written on,
 * read by that stream's thread or by stream 0's progress). Since version 6 the sender cuts
 * the message evenly over the stripes and the streams' threads post their own pieces: one
 * thread posting every stripe copied them one after another (16-256 MiB +20-62% under NCCL,
 * bench/NOTES.md session 51).
 */
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"

/* Eager sends and writes may be on together since version 7: an eager message that crosses
 * a written entry's clear-to-send lets its write go (ofi_write_unexpect). */
void ofi_write_offer(const struct ofi_comm* c, struct mk_ofi_hello* out) {
  int on = c->dev->can_write_data && mk_param_int(MK_PARAM_OFI_WRITES);
  out->features = on ? MK_OFI_FEATURE_WRITE : 0;
}

void ofi_write_agree(struct ofi_comm* c, const struct mk_ofi_hello* ours,
                     const struct mk_ofi_hello* theirs) {
  c->write_data = (ours->features & theirs->features & MK_OFI_FEATURE_WRITE) != 0;
  MK_INFO(MK_NCCL_SUBSYS_NET, "ofi %s comm %p: messages %s", c->is_send ? "send" : "recv",
          (void*)c, c->write_data ? "written with RMA" : "sent to posted receives");
}

int ofi_write_slot_free(const struct ofi_comm* c, uint32_t seq) {
  return c->write_data && !__atomic_load_n(&c->written_rx[seq % MK_OFI_WRITTEN_SLOTS], __ATOMIC_RELAXED);
}

int ofi_write_wanted(const struct ofi_comm* c, const void* data, size_t size, struct mk_mr* mr) {
  return c->write_data && mr && data && size > 0 && size < MK_OFI_WRITE_MAX_BYTES;
}

int ofi_write_expect(struct ofi_comm* c, struct ofi_req* r, int i, void* data, size_t size,
                     struct mk_mr* mr) {
  MK_CHECK(ofi_mr_remote(mr, data, &r->cts.raddr[i], &r->cts.rkey[i]));
  ofi_recv_plan(c, &r->cts, i, size);
  r->cts.write[i] = 1;
  const unsigned nst = r->cts.nstripes[i];
  /* stripe k lands on stream k: its thread reads that CQ while it expects something */
  __atomic_add_fetch(&r->pending, (int)nst, __ATOMIC_RELAXED);
  for (unsigned k = 0; k < nst; k++) ofi_stream_busy(&c->st[k]);
  __atomic_store_n(&c->written_rx[r->cts.seq % MK_OFI_WRITTEN_SLOTS], r, __ATOMIC_RELEASE);
  c->n_written++;
  return 0;
}

void ofi_write_unexpect(struct ofi_comm* c, struct ofi_req* r, int i) {
  const unsigned nst = r->cts.nstripes[i];
  for (unsigned k = 0; k < nst; k++) ofi_stream_idle(&c->st[k]);
  __atomic_sub_fetch(&r->pending, (int)nst, __ATOMIC_RELEASE);
}

/* The stream that carries stripe (piece) k of entry i. */
static struct ofi_stream* ofi_piece_stream(struct ofi_comm* c, const struct mk_ofi_cts* cts, int i,
                                           unsigned k) {
  return &c->st[(cts->stream0[i] + k) % (unsigned)c->nstreams];
}

int ofi_write_landed(struct ofi_comm* c, unsigned k, uint64_t flags, uint64_t imm) {
  if (!(flags & FI_REMOTE_CQ_DATA) || !c->write_data) {
    MK_WARN("ofi: a completion without an operation (flags 0x%llx)", (unsigned long long)flags);
    return -EPROTO;
  }
  const struct mk_ofi_imm m = mk_ofi_imm_parse(imm);
  struct ofi_req* r = __atomic_load_n(&c->written_rx[m.seq16 % MK_OFI_WRITTEN_SLOTS], __ATOMIC_ACQUIRE);
  const struct mk_ofi_cts* cts = r ? &r->cts : NULL;
  if (!r ||
      !mk_ofi_imm_fits(&m, cts->seq, cts->n, cts->write, cts->sizes, cts->chunk, cts->nstripes) ||
      ofi_piece_stream(c, cts, (int)m.idx, m.stripe) != &c->st[k]) {
    MK_WARN("ofi: a write names no stripe this comm expects (receive %u, entry %u, stripe %u, "
            "%llu bytes, stream %u)", m.seq16, m.idx, m.stripe, (unsigned long long)m.len, k);
    return -EPROTO;
  }
  const unsigned nst = cts->nstripes[m.idx];
  int done = 1;
  ofi_stream_idle(&c->st[k]);
  /* the message's last piece: the later stripes are never written */
  if (m.last)
    for (unsigned j = m.stripe + 1; j < nst; j++, done++)
      ofi_stream_idle(ofi_piece_stream(c, cts, (int)m.idx, j));
  if (__atomic_add_fetch(&r->sizes[m.idx], m.len, __ATOMIC_RELAXED) > cts->sizes[m.idx]) {
    MK_WARN("ofi: written pieces add up to more than receive %u's %llu-byte buffer", m.seq16,
            (unsigned long long)cts->sizes[m.idx]);
    return -EPROTO;
  }
  __atomic_add_fetch(&c->n_pieces, 1, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&r->pending, done, __ATOMIC_RELEASE);
  return 0;
}

void ofi_write_forget(struct ofi_comm* c, struct ofi_req* r) {
  struct ofi_req** slot = &c->written_rx[r->cts.seq % MK_OFI_WRITTEN_SLOTS];
  if (__atomic_load_n(slot, __ATOMIC_RELAXED) == r) __atomic_store_n(slot, NULL, __ATOMIC_RELEASE);
}

/* A plain local completion is enough: the receiver learns of the data from its own. */
static void ofi_write_send_prepare(struct ofi_req* r, const struct mk_ofi_cts* cts, int i,
                                   const void* data) {
  r->put_src = data;
  r->put_addr = cts->raddr[i];
  r->put_key = cts->rkey[i];
  r->write_seq = cts->seq;
  r->flags = FI_REMOTE_CQ_DATA;
}

/* Which of a new written send's n pieces go to their stream's thread (a mask), decided once
 * before any post: with NCCL_MK_OFI_STREAM_POSTS=1 every piece whose stream has a thread; with
 * 2 only those whose thread has operations in flight (one that sleeps takes a wake-up per
 * message, which latency-bound sizes feel: 1 MiB -17% with 1, bench/NOTES.md session 51). */
static uint32_t ofi_pieces_to_threads(struct ofi_comm* c, const struct mk_ofi_cts* cts, int i,
                                      unsigned n) {
  uint32_t mask = 0;
  if (n < 2 || !c->stream_posts) return 0;
  for (unsigned k = 0; k < n; k++) {
    const struct ofi_stream* st = ofi_piece_stream(c, cts, i, k);
    if (st->has_thread &&
        (c->stream_posts == 1 || __atomic_load_n(&st->active, __ATOMIC_ACQUIRE) > 0))
      mask |= 1u << k;
  }
  return mask;
}

/* The pieces of a written send (mk_ofi_write_cut), from piece k0 on (k0 > 0: a resumed send).
 * The pieces for the streams' threads (ofi_pieces_to_threads) are handed over first, so that
 * their copies into the sockets (a tcp post copies) run side by side; the rest are then
 * posted here, any EAGAIN waited out once something was handed over (the message can no
 * longer be abandoned). Returns as ofi_send_stripes: 1 nothing posted, 2 resume from
 * r->send_next later. */
int ofi_write_send_pieces(struct ofi_comm* c, struct ofi_req* r, const struct mk_ofi_cts* cts,
                          int i, char* data, size_t size, void* desc, unsigned k0, int resumable) {
  uint64_t piece;
  const unsigned n =
      mk_ofi_write_cut(size, cts->nstripes[i], cts->chunk[i], c->write_piece_min, &piece);
  const uint32_t to_threads = k0 == 0 ? ofi_pieces_to_threads(c, cts, i, n) : 0;
  ofi_write_send_prepare(r, cts, i, data);
  if (k0 == 0) __atomic_store_n(&r->pending, (int)n, __ATOMIC_RELAXED); /* before any post */
  for (int pass = to_threads ? 0 : 1; pass < 2; pass++) /* 0 hands over, 1 posts the rest */
    for (unsigned k = k0; k < n; k++) {
      const int threaded = (to_threads >> k) & 1u;
      if (threaded != (pass == 0)) continue;
      struct ofi_stream* st = ofi_piece_stream(c, cts, i, k);
      struct ofi_op* op = &r->ops[OFI_OP_AT(0, k)];
      *op = (struct ofi_op){.req = r,
                            .kind = OFI_OP_WRITE_SEND,
                            .idx = (uint8_t)i,
                            .stripe = (uint8_t)k,
                            .last = k + 1 == n,
                            .desc = desc};
      op->len = (size_t)mk_ofi_stripe_len(size, piece, k);
      op->buf = op->len ? data + k * piece : data;
      if (threaded) {
        ofi_stream_post_later(st, op);
        __atomic_add_fetch(&c->n_pieces, 1, __ATOMIC_RELAXED);
        continue;
      }
      const enum ofi_post_mode mode = to_threads || (k > 0 && !resumable) ? OFI_POST_WAITED
                                      : k == 0                            ? OFI_POST_FIRST
                                                                          : OFI_POST_RESUMABLE;
      const int rc =
          ofi_stripe_post_in_turn(c, mode, (unsigned)(st - c->st), op->buf, op->len, desc, 0, op);
      if (rc == -FI_EAGAIN && mode == OFI_POST_FIRST) return 1;
      if (rc == -FI_EAGAIN) {
        r->send_next = (uint8_t)k;
        return 2;
      }
      if (rc != 0) return rc;
      __atomic_add_fetch(&c->n_pieces, 1, __ATOMIC_RELAXED);
    }
  return 0;
}

uint64_t mk_ofi_messages_written(const struct mk_comm* comm) {
  return comm && comm->ops == &mk_ofi_ops ? ((const struct ofi_comm*)comm)->n_written : 0;
}

uint64_t mk_ofi_pieces_written(const struct mk_comm* comm) {
  return comm && comm->ops == &mk_ofi_ops
             ? __atomic_load_n(&((const struct ofi_comm*)comm)->n_pieces, __ATOMIC_RELAXED)
             : 0;
}
