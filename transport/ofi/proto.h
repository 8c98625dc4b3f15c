/*
 * The wire format between two nccl-mk ofi endpoints, versioned. Bump MK_OFI_PROTO_VERSION
 * on any change: the side-channel hello carries it and mismatched peers refuse to connect.
 *
 * 64-bit tags (every bit is matched, ignore mask 0, except for eager bounce buffers):
 *   bit 63      control (clear-to-send, credit return)
 *   bit 62      eager: bits 61..59 the piece, bit 58 set on the message's last piece, bits
 *               57..32 the message number (low 26 bits), bits 31..0 the user tag (version 7;
 *               before it bits 61..32 were the message number)
 *   data (bits 63, 62 clear):
 *   bits 39..36 stripe index of a striped entry (0 when not striped; stripe k rides stream k)
 *   bits 35..32 entry index inside a grouped receive (0..MK_MAX_RECVS-1)
 *   bits 31..0  receive sequence number (wraps; at most MK_MAX_REQUESTS are ever live)
 *
 * Version 2 (striping): a comm owns up to MK_OFI_MAX_STREAMS endpoints ("streams"); the hello
 * carries every stream's address and both ends use min(ours, theirs) streams. The receiver
 * decides how each buffer is striped and says so in the clear-to-send (nstripes, chunk,
 * stream0): stripe k covers [k*chunk, min(size, (k+1)*chunk)) of the buffer and rides
 * stream (stream0 + k) % streams. The sender puts the bytes
 * of its message that fall in stripe k into stripe k, a zero-length message when none do, so
 * every posted stripe completes and the received size is the sum of the stripe lengths.
 *
 * Version 3 (eager, transport/ofi/eager.h has the rules): every send has a message number
 * (msn, counted by both ends: receive r takes msns [msn0, msn0 + n)), and a clear-to-send
 * carries its receive's msn0. A send of at most the negotiated eager size for which no
 * clear-to-send has arrived goes at once into one of the receiver's bounce buffers (tag
 * EAGER|msn|user tag), if the sender holds a credit; the receiver copies it into the user
 * buffer when the receive is (or once it is) posted, reposts the bounce buffer and returns
 * the credit in its next clear-to-send, or in a credit-only message (n = 0). The hello
 * carries each side's eager size and bounce-buffer count (0: no eager).
 *
 * Version 4 (short messages into striped buffers): stream0 is always 0, and the sender sends
 * only the stripes up to the one where its message ends (mk_ofi_stripes_sent): one shorter
 * than the chunk, zero-length when the message ends exactly on a chunk boundary before the
 * last stripe. A stripe that lands shorter than the chunk tells the receiver that the later
 * stripes get nothing, and it cancels them. NCCL posts whole step slots (512 KiB) for
 * messages of any size, and with 4 streams every 64 KiB message used to cost three empty
 * messages on helper threads (2-3x slower than one stream at 128-512 KiB, bench/NOTES.md).
 *
 * Version 5 (messages written with RMA): when both hellos offer MK_OFI_FEATURE_WRITE, a
 * receiver may mark an entry of its clear-to-send as written (write[i] = 1, with the remote
 * address and key of its buffer) and post no receive for it. The sender then moves each
 * stripe of its message with one RMA write into that buffer (stripe k at k * chunk, on the
 * stream a tagged stripe would take), carrying remote CQ data mk_ofi_imm(seq, i, k, len): the
 * receiver counts the stripe when that completion arrives, so one message is one hop instead
 * of rxm's rendezvous (a request, a read and an acknowledgement above rxm's 16 KiB eager
 * size). Stripes that end a message early work as in version 4, except that the receiver has
 * nothing posted to cancel. An end offers writes only with eager sends off (until version 7).
 *
 * Version 6 (written messages cut evenly): the sender cuts a written message into pieces of
 * its own choosing (mk_ofi_write_cut: as many as the stripes allow, none below its
 * NCCL_MK_OFI_WRITE_PIECE_MIN, none above the chunk), piece k at k * piece on stripe k's
 * stream, and flags the last one in its remote CQ data; the receiver counts the stripes after
 * the flagged one as done. NCCL posts 512 KiB slots for messages of any size: in version 5 a
 * 256 KiB message filled stripe 0 alone and one thread copied all of it.
 *
 * Version 7 (small receives without a clear-to-send; eager.h has the rules): a receive whose
 * every buffer fits the eager size sends no clear-to-send when it is posted. Any message it can
 * take fits the eager size too, so its sender, which never sees a clear-to-send for it, sends
 * eager as soon as it holds the credits. Only if a message is still missing after the
 * receiver's NCCL_MK_OFI_NO_CTS_MS does the receive post its buffers and send its
 * clear-to-send after all, as in version 6 (a sender whose message is too large for the
 * buffer learns it from that clear-to-send); the messages that went eager meanwhile are the
 * receive's eager prefix as before. Eager and written messages may be on together: an eager
 * message that crosses the clear-to-send of a written entry is delivered from the bounce
 * buffers and the entry expects no write any more. An eager message travels in pieces of
 * MK_OFI_EAGER_PIECE bytes, one per bounce buffer and credit, each a tagged send naming its
 * piece, the last one flagged: over tcp;ofi_rxm a tagged message above 16 KiB takes rxm's
 * rendezvous (a 32 KiB message one way 25 us against 11-14 us written, bench/NOTES.md session
 * 54), and raising rxm's buffer size costs every endpoint a larger receive pool (a loopback
 * process 0.3 -> 1.2 GB at 64 KiB). Receives' sequence numbers no longer follow their
 * message numbers (only announced receives take one).
 *
 * Version 8 (credits come back when due or asked for): the receiver no longer returns its owed
 * credits whenever it has no live receive (one credit-only message per collective at 8 bytes:
 * a ping-pong's 8-byte one-way time 8.4-8.9 us without it against 13.1-13.3 with it on the CPU
 * host, session 55). It returns them at the threshold (mk_ofi_owed_init, which leaves the
 * sender credits for its largest message) and in its clear-to-sends as before; and a sender
 * that closes with credits out first sends a flush request (mk_ofi_tag_eager_flush, a 0-byte
 * piece taking a credit), after which that receive comm returns every credit it owes at once.
 */
#ifndef MK_OFI_PROTO_H_
#define MK_OFI_PROTO_H_

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define MK_OFI_PROTO_VERSION 8
#define MK_OFI_HELLO_MAGIC 0x4f4b4d48u /* "HMKO" */
#define MK_OFI_CTS_MAGIC 0x5354434du   /* "MCTS" */
#define MK_OFI_ADDR_MAX 64             /* fabric address bytes carried in the hello */
#define MK_OFI_MAX_STREAMS 8           /* endpoints per comm (NCCL_MK_OFI_STREAMS bound) */

#define MK_OFI_TAG_CTRL (1ull << 63)
#define MK_OFI_TAG_EAGER (1ull << 62)
#define MK_OFI_MSN_MASK 0x03ffffffu /* the msn bits an eager tag carries */
#define MK_OFI_EAGER_PIECE 16384u   /* bytes of an eager piece: rxm's default eager size */
#define MK_OFI_EAGER_MAX_PIECES 8u  /* pieces of one eager message (3 bits) */
#define MK_OFI_EAGER_PIECE_SHIFT 59
#define MK_OFI_EAGER_LAST (1ull << 58)
/* Bounce buffers match every eager tag: only bits 63 and 62 are compared. */
#define MK_OFI_EAGER_IGNORE (~(MK_OFI_TAG_CTRL | MK_OFI_TAG_EAGER))
/* The 0-byte message that forms a stream's connection ahead (ofi_streams_connect_ahead): on
 * streams 1.. only, which carry data tags (bits 63, 62 clear); bounce buffers (bits 63, 62 =
 * 01) and control receives (exactly bit 63) never match it. */
#define MK_OFI_TAG_CONNECT (MK_OFI_TAG_CTRL | MK_OFI_TAG_EAGER)
#define MK_OFI_TAG_IDX_SHIFT 32
#define MK_OFI_TAG_IDX_MASK 0xfull
#define MK_OFI_TAG_STRIPE_SHIFT 36
#define MK_OFI_TAG_STRIPE_MASK 0xfull

static inline uint64_t mk_ofi_tag_data(uint32_t seq, unsigned idx, unsigned stripe) {
  return ((uint64_t)(stripe & MK_OFI_TAG_STRIPE_MASK) << MK_OFI_TAG_STRIPE_SHIFT) |
         ((uint64_t)(idx & MK_OFI_TAG_IDX_MASK) << MK_OFI_TAG_IDX_SHIFT) | seq;
}
static inline unsigned mk_ofi_tag_stripe(uint64_t tag) {
  return (unsigned)((tag >> MK_OFI_TAG_STRIPE_SHIFT) & MK_OFI_TAG_STRIPE_MASK);
}
static inline int mk_ofi_tag_is_ctrl(uint64_t tag) { return (tag & MK_OFI_TAG_CTRL) != 0; }
static inline int mk_ofi_tag_is_eager(uint64_t tag) {
  return (tag & (MK_OFI_TAG_CTRL | MK_OFI_TAG_EAGER)) == MK_OFI_TAG_EAGER;
}
static inline uint64_t mk_ofi_tag_eager(uint32_t msn, unsigned piece, int last, int32_t user_tag) {
  return MK_OFI_TAG_EAGER |
         ((uint64_t)(piece & (MK_OFI_EAGER_MAX_PIECES - 1)) << MK_OFI_EAGER_PIECE_SHIFT) |
         (last ? MK_OFI_EAGER_LAST : 0) | ((uint64_t)(msn & MK_OFI_MSN_MASK) << 32) |
         (uint32_t)user_tag;
}
static inline unsigned mk_ofi_tag_eager_piece(uint64_t tag) {
  return (unsigned)(tag >> MK_OFI_EAGER_PIECE_SHIFT) & (MK_OFI_EAGER_MAX_PIECES - 1);
}
static inline int mk_ofi_tag_eager_last(uint64_t tag) {
  return (tag & MK_OFI_EAGER_LAST) != 0;
}
static inline uint32_t mk_ofi_tag_eager_msn(uint64_t tag) {
  return (uint32_t)(tag >> 32) & MK_OFI_MSN_MASK;
}
static inline int32_t mk_ofi_tag_eager_user(uint64_t tag) { return (int32_t)(uint32_t)tag; }
/* A closing sender's request for its credits (version 8): a 0-byte eager piece 0 that is not
 * the last, which no message can be (a 0-byte message is one last piece; a first piece that is
 * not the last is full). It takes a credit like any piece. */
static inline uint64_t mk_ofi_tag_eager_flush(void) {
  return mk_ofi_tag_eager(0, 0, 0, 0);
}
static inline int mk_ofi_eager_is_flush(uint64_t tag, size_t len) {
  return len == 0 && mk_ofi_tag_eager_piece(tag) == 0 && !mk_ofi_tag_eager_last(tag);
}
static inline uint32_t mk_ofi_tag_seq(uint64_t tag) { return (uint32_t)tag; }
static inline unsigned mk_ofi_tag_idx(uint64_t tag) {
  return (unsigned)((tag >> MK_OFI_TAG_IDX_SHIFT) & MK_OFI_TAG_IDX_MASK);
}

/* Side-channel hello, both directions, fixed size. Integers in host order: both ends of a
 * comm run the same build on the same architecture family (x86-64 / aarch64, little-endian). */
struct mk_ofi_hello {
  uint32_t magic;
  uint16_t version;
  uint16_t addr_len;            /* of each address (one provider: all the same length) */
  uint64_t nonce;               /* the listen handle's nonce, echoed by both sides */
  uint8_t nstreams;             /* endpoints the sender of the hello opened (1..MAX) */
  uint8_t features;             /* MK_OFI_FEATURE_* this side offers (version 5; the byte
                                   was nstreams' high byte, always 0, so the hello keeps its
                                   size and an older peer still reads it whole and names the
                                   version it does not speak) */
  uint16_t eager_bufs;          /* bounce buffers a receiver posts (0: no eager) */
  uint32_t eager_bytes;         /* largest eager message this side takes or sends (0: none) */
  uint8_t addr[MK_OFI_MAX_STREAMS][MK_OFI_ADDR_MAX]; /* fi_getname of each endpoint */
};

#define MK_OFI_FEATURE_WRITE 1u /* version 5: messages written with RMA */

/* Clear-to-send: the receiver posted receive seq with n buffers, for messages msn.. . With
 * n = 0 it only returns credits. */
struct mk_ofi_cts {
  uint32_t magic;
  uint32_t seq;
  uint32_t n;
  uint32_t credits;               /* bounce buffers reposted since the last report */
  uint32_t msn;                   /* message number of this receive's first buffer */
  uint32_t pad;
  uint64_t sizes[MK_MAX_RECVS];
  int32_t tags[MK_MAX_RECVS];
  uint64_t chunk[MK_MAX_RECVS];   /* stripe length (the last stripe may be shorter) */
  uint8_t nstripes[MK_MAX_RECVS]; /* 1: not striped */
  uint8_t stream0[MK_MAX_RECVS];  /* stream of stripe 0 (0 since version 4); stripe k rides
                                     (stream0 + k) % streams */
  uint8_t write[MK_MAX_RECVS];    /* 1: no receive posted, write the message (version 5) */
  uint64_t raddr[MK_MAX_RECVS];   /* write: where the buffer's byte 0 is, for the writer */
  uint64_t rkey[MK_MAX_RECVS];    /* write: the buffer's remote key */
};

/* The remote CQ data of a written stripe (version 5): the receive's sequence number (low 16
 * bits: the receiver finds the receive by them, in 2 * MK_MAX_REQUESTS slots), whether it is
 * the message's last piece (version 6), the entry, the stripe and the bytes written. A stripe
 * of 2^40 bytes or more is never written: a receiver marks only buffers below
 * MK_OFI_WRITE_MAX_BYTES. */
#define MK_OFI_IMM_LEN_BITS 40
#define MK_OFI_WRITE_MAX_BYTES (1ull << MK_OFI_IMM_LEN_BITS)
#define MK_OFI_IMM_LAST (1ull << 47)
_Static_assert(MK_MAX_RECVS <= 8 && MK_OFI_MAX_STREAMS <= 16, "entry in 3 bits, stripe in 4");
struct mk_ofi_imm {
  uint32_t seq16;
  unsigned last, idx, stripe;
  uint64_t len;
};
static inline uint64_t mk_ofi_imm(uint32_t seq, unsigned last, unsigned idx, unsigned stripe,
                                  uint64_t len) {
  return ((uint64_t)(seq & 0xffffu) << 48) | (last ? MK_OFI_IMM_LAST : 0) |
         ((uint64_t)(idx & 0x7u) << 44) | ((uint64_t)(stripe & 0xfu) << 40) |
         (len & (MK_OFI_WRITE_MAX_BYTES - 1));
}
static inline struct mk_ofi_imm mk_ofi_imm_parse(uint64_t imm) {
  return (struct mk_ofi_imm){.seq16 = (uint32_t)(imm >> 48),
                             .last = (imm & MK_OFI_IMM_LAST) != 0,
                             .idx = (unsigned)(imm >> 44) & 0x7u,
                             .stripe = (unsigned)(imm >> 40) & 0xfu,
                             .len = imm & (MK_OFI_WRITE_MAX_BYTES - 1)};
}

/* Whether a written stripe's data fits the receive it names: a live receive with that seq,
 * an entry marked written, a stripe of its plan and no more bytes than a chunk (the sender's
 * pieces never exceed it, version 6) nor the buffer; that the pieces together fit the buffer
 * the receiver checks as they add up. n, write, sizes, chunk and nstripes are the receive's
 * clear-to-send. */
static inline int mk_ofi_imm_fits(const struct mk_ofi_imm* m, uint32_t seq, uint32_t n,
                                  const uint8_t* write, const uint64_t* sizes,
                                  const uint64_t* chunk, const uint8_t* nstripes) {
  if (m->seq16 != (seq & 0xffffu) || m->idx >= n || !write[m->idx]) return 0;
  unsigned i = m->idx;
  return m->stripe < nstripes[i] && m->len <= chunk[i] && m->len <= sizes[i];
}

/* How a sender cuts a size-byte message into a written entry of nstripes stripes of chunk
 * bytes (version 6): into as many pieces as there are stripes, but none below piece_min
 * bytes (except a lone piece) and none above the chunk; pieces of *piece bytes, a 4 KiB
 * multiple, the last shorter. Returns how many (1 for an empty message). */
static inline unsigned mk_ofi_write_cut(uint64_t size, uint8_t nstripes, uint64_t chunk,
                                        uint64_t piece_min, uint64_t* piece) {
  uint64_t n = nstripes;
  if (piece_min && size / piece_min < n) n = size / piece_min;
  if (nstripes > 1 && n * chunk < size) n = (size + chunk - 1) / chunk;
  if (n <= 1) {
    *piece = size;
    return 1;
  }
  uint64_t q = ((size + n - 1) / n + 4095) & ~4095ull;
  *piece = q;
  return (unsigned)((size + q - 1) / q);
}

/* How a receiver cuts a buffer of size bytes over nstreams streams: not at all up to
 * stripe_min bytes (and below two pages), else into equal 4 KiB-multiple chunks (page-aligned
 * pieces of page-aligned buffers copy fastest), the last one shorter. */
static inline void mk_ofi_stripe_plan(uint64_t size, int nstreams, uint64_t stripe_min,
                                      uint8_t* nstripes, uint64_t* chunk) {
  if (nstreams <= 1 || size <= stripe_min || size < 2 * 4096) {
    *nstripes = 1;
    *chunk = size;
    return;
  }
  uint64_t c = (size + (uint64_t)nstreams - 1) / (uint64_t)nstreams;
  c = (c + 4095) & ~4095ull;
  *nstripes = (uint8_t)((size + c - 1) / c);
  *chunk = c;
}

/* The stripes a sender sends of a size-byte message into a buffer cut in nstripes of chunk
 * bytes (version 4): up to and including the one where the message ends, which is shorter
 * than the chunk (zero-length when the message ends on a chunk boundary), so the receiver
 * learns from it that no later stripe comes; all of them when the message reaches the last. */
static inline unsigned mk_ofi_stripes_sent(uint64_t size, uint64_t chunk, uint8_t nstripes) {
  if (nstripes <= 1) return 1;
  uint64_t n = size / chunk + 1;
  return n < nstripes ? (unsigned)n : nstripes;
}

/* Whether a stripe k of nstripes that landed len bytes ends its message early: the
 * receiver then cancels stripes k+1.. (version 4). */
static inline int mk_ofi_stripe_ends_message(unsigned k, uint8_t nstripes, uint64_t len,
                                             uint64_t chunk) {
  return k + 1 < nstripes && len < chunk;
}

/* Bytes of a send of size bytes that fall into stripe k (of chunk bytes each): a prefix, so
 * the stripe lengths add up to size whatever it is. */
static inline uint64_t mk_ofi_stripe_len(uint64_t size, uint64_t chunk, unsigned k) {
  uint64_t off = (uint64_t)k * chunk;
  return off >= size ? 0 : size - off < chunk ? size - off : chunk;
}

/* The streams a put's data goes to: [*first, *first + return). Striping needs
 * delivery-complete writes, for a plain put as much as for a put_signal: without them a
 * completion only means the bytes left the source, and a flag's ordering behind data rests
 * on write-after-write order, which holds on one endpoint only. That covers a put_signal's
 * own data and also the earlier plain puts that a fenced signal (the proxy's
 * MK_PROXY_FENCE / MK_PROXY_SIGNAL) posted after their completions covers: striped over
 * streams 1.. they could land after that signal on stream 0. With them and more than one
 * stream, stream 0 is left to signals: a signal behind bulk data on its endpoint waits for
 * all of it, so with a call's blocks in flight the first flag landed with the last block
 * (2xH200, bench/NOTES.md). Not wire format: each end picks its own. */
static inline int mk_ofi_put_streams(int nstreams, int delivery_complete, int has_signal,
                                     int* first) {
  *first = 0;
  if (!delivery_complete || nstreams <= 1) return 1;
  if (!has_signal) return nstreams;
  *first = 1;
  return nstreams - 1;
}

_Static_assert(sizeof(struct mk_ofi_hello) == 536, "hello layout");
_Static_assert(sizeof(struct mk_ofi_cts) == 336, "cts layout");
_Static_assert(2 * MK_MAX_REQUESTS <= 0x10000 && (0x10000 % (2 * MK_MAX_REQUESTS)) == 0,
               "16 sequence bits index the receives with written entries");

#endif /* MK_OFI_PROTO_H_ */
