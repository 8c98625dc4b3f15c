/*
 * The rules of the ofi eager path, without libfabric (unit-tested on their own in
 * test/unit/test_ofi_eager.c); ofi_eager.c applies them to endpoints and buffers.
 *
 * Message numbers (msn): both ends count messages, the sender every send it starts, the
 * receiver the buffers of every receive it posts (receive r takes msns [msn0, msn0 + n)).
 * Each send therefore belongs to one receive without either side waiting for the other.
 *
 * Path of a send (mk_ofi_send_path): the clear-to-send of its receive has arrived -> into
 * the user buffer it names, as without eager; else, at most eager_bytes and a credit in
 * hand -> eager, into a bounce buffer; else wait (isend says "not now"). So inside one
 * receive the eager messages are always a prefix (they went before its clear-to-send).
 *
 * Which buffer of a grouped receive a message takes (mk_ofi_match_entry): the first not yet
 * taken with its tag, messages taken in msn order. The receiver applies it to the eager
 * prefix as the messages arrive; the sender, once the clear-to-send arrives, replays the
 * prefix it sent (mk_ofi_replay) from the tags it remembers, so both ends agree on which
 * buffers the rest of the receive goes to.
 *
 * Credits: the receiver has nbufs bounce buffers; the sender starts with nbufs credits,
 * spends one per piece of an eager send (version 7: a message goes in pieces of
 * MK_OFI_EAGER_PIECE bytes, all at once, only with a credit for each), and gets them back when the
 * receiver has copied the message out and reposted the buffer (in a clear-to-send, or a credit-only
 * message once owed >= threshold). A sender can therefore never overrun the bounce buffers, and the
 * receiver holds at most nbufs unexpected messages (mk_ofi_uq).
 */
#ifndef MK_OFI_EAGER_H_
#define MK_OFI_EAGER_H_

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define MK_OFI_TAG_RING 1024 /* sender: user tags of its last messages, for the replay */

/* a - b for wrapping message numbers (negative: a is before b). */
static inline int32_t mk_ofi_msn_diff(uint32_t a, uint32_t b) { return (int32_t)(a - b); }

/* The full message number whose low 30 bits an eager tag carries, taken nearest ref. */
static inline uint32_t mk_ofi_msn_expand(uint32_t ref, uint32_t low) {
  uint32_t d = (low - ref) & MK_OFI_MSN_MASK;
  if (d & ((MK_OFI_MSN_MASK >> 1) + 1)) d |= ~MK_OFI_MSN_MASK; /* sign-extend the carried bits */
  return ref + d;
}

/* 1 when message m belongs to the receive of n buffers that starts at msn0. */
static inline int mk_ofi_msn_in(uint32_t m, uint32_t msn0, uint32_t n) {
  int32_t d = mk_ofi_msn_diff(m, msn0);
  return d >= 0 && (uint32_t)d < n;
}

/* Pieces of an eager message of size bytes (version 7): one per MK_OFI_EAGER_PIECE bytes, at
 * least one. */
static inline uint32_t mk_ofi_eager_pieces(uint64_t size) {
  return size ? (uint32_t)((size + MK_OFI_EAGER_PIECE - 1) / MK_OFI_EAGER_PIECE) : 1;
}

/* Both ends' eager size: the smaller one, at most the pieces one message may have and the
 * receiver's bounce buffers hold (a piece each); 0 (off) when either is 0 or the receiver
 * posts no bounce buffers. */
static inline uint32_t mk_ofi_eager_negotiate(uint32_t ours, uint32_t theirs, uint32_t nbufs) {
  if (!nbufs) return 0;
  uint32_t e = ours < theirs ? ours : theirs;
  uint32_t pieces = nbufs < MK_OFI_EAGER_MAX_PIECES ? nbufs : MK_OFI_EAGER_MAX_PIECES;
  return e < pieces * MK_OFI_EAGER_PIECE ? e : pieces * MK_OFI_EAGER_PIECE;
}

/* A message of len bytes into a buffer of cap bytes: -EMSGSIZE when it does not fit. */
static inline int mk_ofi_eager_fits(uint64_t len, uint64_t cap) {
  return len <= cap ? 0 : -EMSGSIZE;
}

enum mk_ofi_path { MK_OFI_PATH_WAIT, MK_OFI_PATH_CTS, MK_OFI_PATH_EAGER };

/* Eager takes a credit for each of the message's pieces, all at once. */
static inline enum mk_ofi_path mk_ofi_send_path(int have_cts, uint64_t size, uint32_t eager_bytes,
                                                uint32_t credits) {
  if (have_cts) return MK_OFI_PATH_CTS;
  if (eager_bytes && size <= eager_bytes && credits >= mk_ofi_eager_pieces(size))
    return MK_OFI_PATH_EAGER;
  return MK_OFI_PATH_WAIT;
}

/* Sender: whether an isend that finds its clear-to-send not filed reads the CQ first to look
 * for it (a CQ read is a poll of the sockets over tcp, ~1-2 us before the send goes out). Once
 * MK_OFI_CTS_IDLE_READS reads in a row found none, the receiver is not announcing (its
 * receives fit the eager size) and an eager send goes without the read, but for one message
 * in MK_OFI_CTS_IDLE_READS, until a clear-to-send arrives again (idle_reads back to 0). A
 * clear-to-send the skip misses is crossed, which the protocol allows for any eager send. */
#define MK_OFI_CTS_IDLE_READS 8
static inline int mk_ofi_isend_reads_cq(enum mk_ofi_path unread_path, uint32_t idle_reads,
                                        uint32_t msn) {
  return unread_path != MK_OFI_PATH_EAGER || idle_reads < MK_OFI_CTS_IDLE_READS ||
         msn % MK_OFI_CTS_IDLE_READS == 0;
}

/* Whether any of n sizes is above limit: a finished receive's message sizes against
 * NCCL_MK_OFI_ANNOUNCE_AFTER (then the next receive announces itself), or a receive's buffer
 * sizes against the eager size. */
static inline int mk_ofi_sizes_above(const size_t* sizes, int n, uint64_t limit) {
  for (int i = 0; i < n; i++)
    if (sizes[i] > limit) return 1;
  return 0;
}

/* Whether a receive of n buffers of these sizes sends its clear-to-send when posted (version
 * 7): not when eager is on (eager_bytes > 0), small receives may go without one (no_cts) and
 * every buffer fits a bounce buffer; then no message it can take needs one. Nor after a
 * receive that took a large message (after_large, mk_ofi_sizes_above): NCCL posts its
 * 64 KiB LL slots for messages of any size, and a message that went through a bounce buffer
 * is copied by rxm on both sides and by us, where the clear-to-send lets it be written once
 * into the user's buffer. The receiver alone decides: nothing changes on the wire. */
static inline int mk_ofi_recv_announces(const size_t* sizes, int n, uint32_t eager_bytes,
                                        int no_cts, int after_large) {
  return !eager_bytes || !no_cts || after_large || mk_ofi_sizes_above(sizes, n, eager_bytes);
}

/* The first of n entries not in the bitmap taken whose tag is tag, or -1. */
int mk_ofi_match_entry(const int32_t* tags, uint32_t n, uint32_t taken, int32_t tag);

/* The sender's view of the receive that starts at msn0 (n entries, tags): its first count
 * messages went eager with the tags ring[m % MK_OFI_TAG_RING]; marks the entries they took
 * in *taken. -EPROTO when one matches no entry or the ring no longer holds it. */
int mk_ofi_replay(const int32_t* ring, uint32_t msn0, uint32_t count, const int32_t* tags,
                  uint32_t n, uint32_t* taken);

/* Whether eager message m can be delivered to the receive at msn0 that has had done of its
 * messages delivered eagerly: 1 now, 0 not yet (an earlier one has not arrived), -EPROTO
 * when it is not the receive's (or is one already delivered). */
int mk_ofi_eager_next(uint32_t m, uint32_t msn0, uint32_t n, uint32_t done);

/* A receive's eager message arriving in pieces (version 7), in any order: the pieces here so
 * far, and total once the last one has come (0 before). */
struct mk_ofi_pieces {
  uint8_t mask, total;
};
/* Piece `piece` arrived (last: the flagged one): 1 when the message is whole now, 0 when
 * pieces are still missing, -EPROTO when the pieces contradict each other (a piece twice, one
 * past the last, two last ones). */
static inline int mk_ofi_pieces_add(struct mk_ofi_pieces* p, unsigned piece, int last) {
  const unsigned bit = 1u << piece;
  if (piece >= MK_OFI_EAGER_MAX_PIECES || (p->mask & bit)) return -EPROTO;
  if (last && (p->total || (p->mask >> piece) != 0)) return -EPROTO;
  if (!last && p->total && piece >= p->total) return -EPROTO;
  if (last) p->total = (uint8_t)(piece + 1);
  p->mask |= (uint8_t)bit;
  return p->total && p->mask == (1u << p->total) - 1;
}

/* Sender credits: avail of cap bounce buffers may be filled. */
struct mk_ofi_credits {
  uint32_t avail, cap;
};
static inline void mk_ofi_credits_init(struct mk_ofi_credits* c, uint32_t cap) {
  c->avail = c->cap = cap;
}
static inline int mk_ofi_credits_take(struct mk_ofi_credits* c, uint32_t n) {
  if (c->avail < n) return -EAGAIN;
  c->avail -= n;
  return 0;
}
/* More than were ever taken: the peer is out of step. */
static inline int mk_ofi_credits_give(struct mk_ofi_credits* c, uint32_t n) {
  if (n > c->cap - c->avail) return -EPROTO;
  c->avail += n;
  return 0;
}

/* Receiver: bounce buffers reposted and not yet reported to the sender. */
struct mk_ofi_owed {
  uint32_t owed, threshold;
};
/* A quarter of the buffers, but never so many that a sender left with the rest could not
 * send its largest message (max_pieces): owed credits are returned only at the threshold, in a
 * clear-to-send, or once the sender asks at close (version 8), and a receive that sends no
 * clear-to-send waits for exactly such a message. */
static inline void mk_ofi_owed_init(struct mk_ofi_owed* o, uint32_t nbufs, uint32_t max_pieces) {
  uint32_t t = nbufs / 4;
  if (max_pieces <= nbufs && t > nbufs + 1 - max_pieces) t = nbufs + 1 - max_pieces;
  o->owed = 0;
  o->threshold = t ? t : 1;
}
static inline int mk_ofi_owed_due(const struct mk_ofi_owed* o) { return o->owed >= o->threshold; }
static inline uint32_t mk_ofi_owed_take(struct mk_ofi_owed* o) {
  uint32_t n = o->owed;
  o->owed = 0;
  return n;
}

/* Receiver: eager messages that arrived before their receive was posted (or before an
 * earlier message of the same receive), in arrival order. One entry per bounce buffer, so
 * cap = nbufs; a full queue means the sender overran its credits. */
struct mk_ofi_uq_ent {
  uint32_t msn;
  int32_t tag;
  uint32_t len;
  uint32_t buf;  /* bounce buffer index */
  uint8_t piece; /* which piece of message msn it holds (version 7) */
  uint8_t last;  /* the message's last piece */
};
struct mk_ofi_uq {
  struct mk_ofi_uq_ent* e;
  uint32_t cap, count;
};
int mk_ofi_uq_init(struct mk_ofi_uq* q, uint32_t cap);
void mk_ofi_uq_fini(struct mk_ofi_uq* q);
int mk_ofi_uq_push(struct mk_ofi_uq* q, const struct mk_ofi_uq_ent* ent); /* -ENOSPC: full */
int mk_ofi_uq_find(const struct mk_ofi_uq* q, uint32_t msn);              /* index or -1 */
void mk_ofi_uq_remove(struct mk_ofi_uq* q, uint32_t idx);

#endif /* MK_OFI_EAGER_H_ */
