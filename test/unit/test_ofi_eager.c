/* The eager path's rules (transport/ofi/eager.h), without a network: tag encoding, message
 * numbers across wrap-around, the sender's choice of path, credit accounting, buffer
 * matching and the sender's replay, the unexpected queue, size checks, and the wire layout. */
#include "mk_test.h"
#include "ofi/eager.h"

static void eager_tags_round_trip_and_never_look_like_data_or_control(void) {
  uint32_t msns[] = {0, 1, 0x3fffffffu, 0x40000000u, 0xffffffffu};
  int32_t tags[] = {0, 1, -1, 0x7fffffff, (int32_t)0x80000000u};
  for (unsigned m = 0; m < 5; m++)
    for (unsigned t = 0; t < 5; t++) {
      for (unsigned piece = 0; piece < MK_OFI_EAGER_MAX_PIECES; piece += 7) {
        const int last = piece == 7;
        uint64_t tag = mk_ofi_tag_eager(msns[m], piece, last, tags[t]);
        CHECK(mk_ofi_tag_is_eager(tag));
        CHECK(!mk_ofi_tag_is_ctrl(tag));
        CHECK_EQ(mk_ofi_tag_eager_msn(tag), msns[m] & MK_OFI_MSN_MASK);
        CHECK_EQ(mk_ofi_tag_eager_user(tag), tags[t]);
        CHECK_EQ(mk_ofi_tag_eager_piece(tag), piece);
        CHECK_EQ(mk_ofi_tag_eager_last(tag), last);
        /* a bounce buffer (tag EAGER, ignore mask) matches it */
        CHECK_EQ(tag | MK_OFI_EAGER_IGNORE, MK_OFI_TAG_EAGER | MK_OFI_EAGER_IGNORE);
      }
    }
  /* data and control never match a bounce buffer */
  uint64_t data = mk_ofi_tag_data(0xffffffffu, MK_MAX_RECVS - 1, MK_OFI_MAX_STREAMS - 1);
  CHECK(!mk_ofi_tag_is_eager(data));
  CHECK((data | MK_OFI_EAGER_IGNORE) != (MK_OFI_TAG_EAGER | MK_OFI_EAGER_IGNORE));
  CHECK((MK_OFI_TAG_CTRL | MK_OFI_EAGER_IGNORE) != (MK_OFI_TAG_EAGER | MK_OFI_EAGER_IGNORE));
}

static void msn_expand_finds_the_number_nearest_the_reference(void) {
  uint32_t refs[] = {0, 5, 0x3ffffff0u, 0x40000000u, 0xfffffff0u, 0xffffffffu};
  int32_t offs[] = {0, 1, -1, 300, -300, 100000, -100000};
  for (unsigned r = 0; r < 6; r++)
    for (unsigned o = 0; o < 7; o++) {
      uint32_t m = refs[r] + (uint32_t)offs[o];
      CHECK_EQ(mk_ofi_msn_expand(refs[r], m & MK_OFI_MSN_MASK), m);
    }
  CHECK(mk_ofi_msn_in(0xffffffffu, 0xfffffffeu, 2)); /* a receive across the wrap */
  CHECK(mk_ofi_msn_in(0, 0xfffffffeu, 3));
  CHECK(!mk_ofi_msn_in(1, 0xfffffffeu, 3));
  CHECK(!mk_ofi_msn_in(0xfffffffdu, 0xfffffffeu, 3));
  CHECK(mk_ofi_msn_diff(2, 0xffffffffu) == 3);
}

/* Version 7: a receive goes without a clear-to-send only when eager is on, the receiver
 * allows it, and every buffer fits a bounce buffer (any message for it then goes eager). */
static void receives_that_fit_bounce_buffers_send_no_clear_to_send(void) {
  const size_t small[3] = {0, 8, 65536}, mixed[3] = {8, 65537, 8};
  CHECK_EQ(mk_ofi_recv_announces(small, 3, 65536, 1, 0), 0);
  CHECK_EQ(mk_ofi_recv_announces(small, 1, 8, 1, 0), 0);
  CHECK_EQ(mk_ofi_recv_announces(mixed, 3, 65536, 1, 0), 1); /* one buffer is larger */
  CHECK_EQ(mk_ofi_recv_announces(mixed, 1, 65536, 1, 0), 0);
  CHECK_EQ(mk_ofi_recv_announces(small, 3, 0, 1, 0), 1);     /* eager off */
  CHECK_EQ(mk_ofi_recv_announces(small, 3, 65536, 0, 0), 1); /* NCCL_MK_OFI_NO_CTS_MS=0 */
  CHECK_EQ(mk_ofi_recv_announces(small, 3, 4096, 1, 0), 1);  /* 64 KiB > a 4 KiB bounce */
  CHECK_EQ(mk_ofi_recv_announces(small, 3, 65536, 1, 1), 1); /* after a large message */
}

/* A receive that took a message above the limit makes the next one announce itself. */
static void a_receive_that_took_a_large_message_makes_the_next_announce(void) {
  const size_t small[2] = {8192, 8}, large[2] = {8, 8193};
  CHECK_EQ(mk_ofi_sizes_above(small, 2, 8192), 0);
  CHECK_EQ(mk_ofi_sizes_above(large, 2, 8192), 1);
  CHECK_EQ(mk_ofi_sizes_above(large, 1, 8192), 0);
  CHECK_EQ(mk_ofi_sizes_above(large, 2, 65536), 0);
}

/* An isend reads for its clear-to-send until 8 reads in a row found none; then eager sends go
 * without the read but for one message in 8; a send that cannot go eager always reads. */
static void isend_skips_its_cq_read_once_reads_keep_finding_no_clear_to_send(void) {
  for (uint32_t idle = 0; idle < MK_OFI_CTS_IDLE_READS; idle++)
    CHECK_EQ(mk_ofi_isend_reads_cq(MK_OFI_PATH_EAGER, idle, 5), 1);
  CHECK_EQ(mk_ofi_isend_reads_cq(MK_OFI_PATH_EAGER, MK_OFI_CTS_IDLE_READS, 5), 0);
  CHECK_EQ(mk_ofi_isend_reads_cq(MK_OFI_PATH_EAGER, 1000, 7), 0);
  CHECK_EQ(mk_ofi_isend_reads_cq(MK_OFI_PATH_EAGER, 1000, 8), 1); /* the probe */
  CHECK_EQ(mk_ofi_isend_reads_cq(MK_OFI_PATH_EAGER, 1000, 0), 1);
  CHECK_EQ(mk_ofi_isend_reads_cq(MK_OFI_PATH_WAIT, 1000, 7), 1); /* no credit, or too large */
  int skipped = 0;
  for (uint32_t msn = 0; msn < 64; msn++) skipped += !mk_ofi_isend_reads_cq(MK_OFI_PATH_EAGER, 8, msn);
  CHECK_EQ(skipped, 56);
}

static void send_path_prefers_the_clear_to_send_then_eager_within_size_and_credits(void) {
  CHECK_EQ(mk_ofi_send_path(1, 1u << 30, 65536, 0), MK_OFI_PATH_CTS);
  CHECK_EQ(mk_ofi_send_path(1, 8, 65536, 16), MK_OFI_PATH_CTS);
  CHECK_EQ(mk_ofi_send_path(0, 0, 65536, 1), MK_OFI_PATH_EAGER); /* 0 bytes go eager */
  CHECK_EQ(mk_ofi_send_path(0, 16384, 65536, 1), MK_OFI_PATH_EAGER); /* one piece */
  CHECK_EQ(mk_ofi_send_path(0, 16385, 65536, 1), MK_OFI_PATH_WAIT);  /* two pieces, one credit */
  CHECK_EQ(mk_ofi_send_path(0, 65536, 65536, 4), MK_OFI_PATH_EAGER);
  CHECK_EQ(mk_ofi_send_path(0, 65536, 65536, 3), MK_OFI_PATH_WAIT);
  CHECK_EQ(mk_ofi_eager_pieces(0), 1);
  CHECK_EQ(mk_ofi_eager_pieces(16384), 1);
  CHECK_EQ(mk_ofi_eager_pieces(16385), 2);
  CHECK_EQ(mk_ofi_eager_pieces(65536), 4);
  CHECK_EQ(mk_ofi_send_path(0, 65537, 65536, 16), MK_OFI_PATH_WAIT); /* too large */
  CHECK_EQ(mk_ofi_send_path(0, 8, 65536, 0), MK_OFI_PATH_WAIT);      /* no credit */
  CHECK_EQ(mk_ofi_send_path(0, 0, 0, 16), MK_OFI_PATH_WAIT);         /* eager off */
  CHECK_EQ(mk_ofi_eager_negotiate(65536, 16384, 16), 16384);
  CHECK_EQ(mk_ofi_eager_negotiate(4096, 65536, 16), 4096);
  CHECK_EQ(mk_ofi_eager_negotiate(65536, 0, 16), 0);
  CHECK_EQ(mk_ofi_eager_negotiate(65536, 65536, 0), 0); /* no bounce buffers: off */
  CHECK_EQ(mk_ofi_eager_negotiate(65536, 65536, 2), 32768); /* a message fits the buffers */
  CHECK_EQ(mk_ofi_eager_negotiate(1048576, 1048576, 256), 8 * 16384); /* 8 pieces at most */
}

/* Version 7: the pieces of one eager message arrive in any order; it is whole when the last
 * one and every one before it are in; contradictions are protocol errors. */
static void eager_pieces_make_a_message_whole_in_any_order_and_reject_contradictions(void) {
  struct mk_ofi_pieces p = {0};
  CHECK_EQ(mk_ofi_pieces_add(&p, 0, 1), 1); /* a one-piece message */
  p = (struct mk_ofi_pieces){0};
  CHECK_EQ(mk_ofi_pieces_add(&p, 2, 1), 0); /* the last first */
  CHECK_EQ(mk_ofi_pieces_add(&p, 0, 0), 0);
  CHECK_EQ(mk_ofi_pieces_add(&p, 1, 0), 1);
  p = (struct mk_ofi_pieces){0};
  CHECK_EQ(mk_ofi_pieces_add(&p, 1, 0), 0);
  CHECK_EQ(mk_ofi_pieces_add(&p, 1, 0), -EPROTO); /* twice */
  CHECK_EQ(mk_ofi_pieces_add(&p, 0, 1), -EPROTO); /* a piece after the last came */
  CHECK_EQ(mk_ofi_pieces_add(&p, 3, 1), 0);
  CHECK_EQ(mk_ofi_pieces_add(&p, 5, 0), -EPROTO); /* past the last */
  CHECK_EQ(mk_ofi_pieces_add(&p, 4, 1), -EPROTO); /* a second last */
  CHECK_EQ(mk_ofi_pieces_add(&p, MK_OFI_EAGER_MAX_PIECES, 0), -EPROTO);
  CHECK_EQ(mk_ofi_pieces_add(&p, 0, 0), 0);
  CHECK_EQ(mk_ofi_pieces_add(&p, 2, 0), 1);
}

static void credits_never_exceed_the_pool_nor_go_below_zero(void) {
  struct mk_ofi_credits c;
  mk_ofi_credits_init(&c, 4);
  for (int i = 0; i < 4; i++) CHECK_EQ(mk_ofi_credits_take(&c, 1), 0);
  CHECK_EQ(mk_ofi_credits_take(&c, 1), -EAGAIN);
  CHECK_EQ(c.avail, 0);
  CHECK_EQ(mk_ofi_credits_give(&c, 3), 0);
  CHECK_EQ(mk_ofi_credits_give(&c, 2), -EPROTO); /* more than were lent */
  CHECK_EQ(c.avail, 3);
  CHECK_EQ(mk_ofi_credits_give(&c, 1), 0);
  CHECK_EQ(mk_ofi_credits_give(&c, 0), 0);
  CHECK_EQ(c.avail, 4);
  struct mk_ofi_owed o;
  mk_ofi_owed_init(&o, 16, 4);
  CHECK_EQ(o.threshold, 4);
  o.owed = 3;
  CHECK(!mk_ofi_owed_due(&o));
  o.owed = 4;
  CHECK(mk_ofi_owed_due(&o));
  CHECK_EQ(mk_ofi_owed_take(&o), 4);
  CHECK_EQ(o.owed, 0);
  mk_ofi_owed_init(&o, 1, 1); /* one buffer: every repost is reported */
  o.owed = 1;
  CHECK(mk_ofi_owed_due(&o));
}

/* Duplicate tags fill their buffers in order; the sender's replay of an eager prefix marks
 * exactly the buffers the receiver filled, so the rest goes where the receiver expects. */
static void matching_and_replay_agree_on_every_buffer(void) {
  int32_t tags[4] = {7, 3, 7, 9};
  uint32_t taken = 0;
  CHECK_EQ(mk_ofi_match_entry(tags, 4, taken, 7), 0);
  taken |= 1;
  CHECK_EQ(mk_ofi_match_entry(tags, 4, taken, 7), 2);
  CHECK_EQ(mk_ofi_match_entry(tags, 4, taken, 5), -1);
  taken |= 4;
  CHECK_EQ(mk_ofi_match_entry(tags, 4, taken, 7), -1);

  int32_t ring[MK_OFI_TAG_RING];
  uint32_t msn0 = MK_OFI_TAG_RING * 3 - 2; /* the prefix wraps around the ring */
  ring[msn0 % MK_OFI_TAG_RING] = 7;
  ring[(msn0 + 1) % MK_OFI_TAG_RING] = 9;
  ring[(msn0 + 2) % MK_OFI_TAG_RING] = 7;
  uint32_t sender = 0, receiver = 0;
  CHECK_EQ(mk_ofi_replay(ring, msn0, 3, tags, 4, &sender), 0);
  for (uint32_t k = 0; k < 3; k++) {
    int i = mk_ofi_match_entry(tags, 4, receiver, ring[(msn0 + k) % MK_OFI_TAG_RING]);
    CHECK(i >= 0);
    if (i >= 0) receiver |= 1u << i; /* a failed check goes on to report, not to shift by -1 */
  }
  CHECK_EQ(sender, receiver);
  CHECK_EQ(sender, 0xdu); /* 7 -> 0, 9 -> 3, 7 -> 2; tag 3 (entry 1) left for the rest */
  ring[(msn0 + 1) % MK_OFI_TAG_RING] = 42; /* a tag no buffer has */
  sender = 0;
  CHECK_EQ(mk_ofi_replay(ring, msn0, 2, tags, 4, &sender), -EPROTO);
  sender = 0;
  CHECK_EQ(mk_ofi_replay(ring, msn0, 5, tags, 4, &sender), -EPROTO); /* more than n */
  sender = 0;
  CHECK_EQ(mk_ofi_replay(ring, msn0, 0, tags, 4, &sender), 0);
  CHECK_EQ(sender, 0);
}

static void eager_next_delivers_a_receive_prefix_in_order_only(void) {
  CHECK_EQ(mk_ofi_eager_next(10, 10, 3, 0), 1);
  CHECK_EQ(mk_ofi_eager_next(11, 10, 3, 0), 0); /* 10 has not arrived: wait */
  CHECK_EQ(mk_ofi_eager_next(11, 10, 3, 1), 1);
  CHECK_EQ(mk_ofi_eager_next(10, 10, 3, 1), -EPROTO); /* delivered already */
  CHECK_EQ(mk_ofi_eager_next(13, 10, 3, 3), -EPROTO); /* another receive's */
  CHECK_EQ(mk_ofi_eager_next(9, 10, 3, 0), -EPROTO);
  CHECK_EQ(mk_ofi_eager_next(0, 0xffffffffu, 2, 1), 1); /* across the wrap */
}

static void unexpected_queue_is_bounded_keeps_arrival_order_and_finds_by_msn(void) {
  struct mk_ofi_uq q;
  CHECK_EQ(mk_ofi_uq_init(&q, 3), 0);
  struct mk_ofi_uq_ent a = {.msn = 5, .tag = 1, .len = 10, .buf = 0};
  struct mk_ofi_uq_ent b = {.msn = 7, .tag = 2, .len = 0, .buf = 2};
  struct mk_ofi_uq_ent d = {.msn = 6, .tag = 3, .len = 65536, .buf = 1};
  CHECK_EQ(mk_ofi_uq_push(&q, &a), 0);
  CHECK_EQ(mk_ofi_uq_push(&q, &b), 0);
  CHECK_EQ(mk_ofi_uq_push(&q, &d), 0);
  CHECK_EQ(mk_ofi_uq_push(&q, &a), -ENOSPC); /* never more than the bounce buffers */
  CHECK_EQ(mk_ofi_uq_find(&q, 6), 2);
  CHECK_EQ(mk_ofi_uq_find(&q, 8), -1);
  mk_ofi_uq_remove(&q, 0);
  CHECK_EQ(q.count, 2);
  CHECK_EQ(q.e[0].msn, 7); /* arrival order kept */
  CHECK_EQ(q.e[1].msn, 6);
  CHECK_EQ(q.e[1].len, 65536);
  mk_ofi_uq_remove(&q, 5); /* out of range: nothing */
  CHECK_EQ(q.count, 2);
  CHECK_EQ(mk_ofi_uq_push(&q, &a), 0);
  mk_ofi_uq_fini(&q);
  CHECK_EQ(q.count, 0);
}

/* With fewer than the threshold owed, the sender still holds credits for its largest message:
 * a receive that sends no clear-to-send waits for that message (version 8 returns owed credits
 * only at the threshold, in a clear-to-send, or when the closing sender asks). */
static void owed_threshold_leaves_the_sender_credits_for_its_largest_message(void) {
  struct mk_ofi_owed o;
  mk_ofi_owed_init(&o, 32, 4);
  CHECK_EQ(o.threshold, 8);
  mk_ofi_owed_init(&o, 8, 8);
  CHECK_EQ(o.threshold, 1);
  mk_ofi_owed_init(&o, 8, 6);
  CHECK_EQ(o.threshold, 2);
  for (uint32_t nbufs = 1; nbufs <= 64; nbufs++)
    for (uint32_t pieces = 1; pieces <= MK_OFI_EAGER_MAX_PIECES && pieces <= nbufs; pieces++) {
      mk_ofi_owed_init(&o, nbufs, pieces);
      CHECK(o.threshold >= 1);
      CHECK(nbufs - (o.threshold - 1) >= pieces); /* credits left with threshold - 1 owed */
    }
}

/* The closing sender's request is told apart from every piece of every message. */
static void flush_request_is_no_piece_of_any_message(void) {
  CHECK(mk_ofi_tag_is_eager(mk_ofi_tag_eager_flush()));
  CHECK(mk_ofi_eager_is_flush(mk_ofi_tag_eager_flush(), 0));
  const uint64_t sizes[] = {0,
                            1,
                            4096,
                            MK_OFI_EAGER_PIECE - 1,
                            MK_OFI_EAGER_PIECE,
                            MK_OFI_EAGER_PIECE + 1,
                            4 * MK_OFI_EAGER_PIECE,
                            MK_OFI_EAGER_MAX_PIECES * MK_OFI_EAGER_PIECE};
  for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    const uint32_t pieces = mk_ofi_eager_pieces(sizes[s]);
    for (uint32_t k = 0; k < pieces; k++) {
      const uint64_t off = (uint64_t)k * MK_OFI_EAGER_PIECE;
      const size_t len =
          (size_t)(sizes[s] - off < MK_OFI_EAGER_PIECE ? sizes[s] - off : MK_OFI_EAGER_PIECE);
      CHECK(!mk_ofi_eager_is_flush(mk_ofi_tag_eager(0, k, k + 1 == pieces, 0), len));
    }
  }
}

static void size_check_refuses_only_what_does_not_fit(void) {
  CHECK_EQ(mk_ofi_eager_fits(0, 0), 0);
  CHECK_EQ(mk_ofi_eager_fits(100, 100), 0);
  CHECK_EQ(mk_ofi_eager_fits(101, 100), -EMSGSIZE);
  CHECK_EQ(mk_ofi_eager_fits(1, 0), -EMSGSIZE);
}

int main(void) {
  eager_tags_round_trip_and_never_look_like_data_or_control();
  msn_expand_finds_the_number_nearest_the_reference();
  send_path_prefers_the_clear_to_send_then_eager_within_size_and_credits();
  isend_skips_its_cq_read_once_reads_keep_finding_no_clear_to_send();
  receives_that_fit_bounce_buffers_send_no_clear_to_send();
  a_receive_that_took_a_large_message_makes_the_next_announce();
  eager_pieces_make_a_message_whole_in_any_order_and_reject_contradictions();
  credits_never_exceed_the_pool_nor_go_below_zero();
  matching_and_replay_agree_on_every_buffer();
  eager_next_delivers_a_receive_prefix_in_order_only();
  unexpected_queue_is_bounded_keeps_arrival_order_and_finds_by_msn();
  size_check_refuses_only_what_does_not_fit();
  owed_threshold_leaves_the_sender_credits_for_its_largest_message();
  flush_request_is_no_piece_of_any_message();
  CHECK_EQ(sizeof(struct mk_ofi_hello), 536); /* unchanged: a v2 peer reads it and says why */
  CHECK_EQ(sizeof(struct mk_ofi_cts), 336); /* version 5: written entries */
  return MK_TEST_RESULT();
}
