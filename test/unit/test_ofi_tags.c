/* The ofi wire format: tag fields round-trip and never collide with the control tag; the
 * stripe plan covers every byte of a buffer and the stripe lengths of any send add up. */
#include "mk_test.h"
#include "ofi/proto.h"

static void tags(void) {
  uint32_t seqs[] = {0, 1, 31, 32, 0x7fffffffu, 0xffffffffu};
  for (unsigned s = 0; s < sizeof(seqs) / sizeof(seqs[0]); s++)
    for (unsigned i = 0; i < MK_MAX_RECVS; i++)
      for (unsigned k = 0; k < MK_OFI_MAX_STREAMS; k++) {
        uint64_t t = mk_ofi_tag_data(seqs[s], i, k);
        CHECK_EQ(mk_ofi_tag_seq(t), seqs[s]);
        CHECK_EQ(mk_ofi_tag_idx(t), i);
        CHECK_EQ(mk_ofi_tag_stripe(t), k);
        CHECK(!mk_ofi_tag_is_ctrl(t));
        CHECK(t != MK_OFI_TAG_CTRL);
        for (unsigned j = 0; j < i; j++) CHECK(mk_ofi_tag_data(seqs[s], j, k) != t);
        for (unsigned j = 0; j < k; j++) CHECK(mk_ofi_tag_data(seqs[s], i, j) != t);
      }
  CHECK(mk_ofi_tag_is_ctrl(MK_OFI_TAG_CTRL));
  CHECK(MK_MAX_RECVS - 1 <= MK_OFI_TAG_IDX_MASK);
  CHECK(MK_OFI_MAX_STREAMS - 1 <= MK_OFI_TAG_STRIPE_MASK);
}

/* For a buffer of size bytes: the stripes tile it exactly, and a send of any length up to
 * size splits into stripe lengths that fit their stripes and add up to it. */
static void plan_one(uint64_t size, int nstreams, uint64_t min) {
  uint8_t n;
  uint64_t chunk;
  mk_ofi_stripe_plan(size, nstreams, min, &n, &chunk);
  CHECK(n >= 1 && n <= nstreams);
  if (n == 1) {
    CHECK(size <= min || nstreams == 1 || size < 8192);
    CHECK_EQ(chunk, size);
    return;
  }
  CHECK_EQ(chunk % 4096, 0);
  CHECK(chunk * (n - 1) < size && chunk * n >= size); /* every stripe non-empty */
  uint64_t sends[] = {0, 1, chunk - 1, chunk, chunk + 1, size / 2, size - 1, size};
  for (unsigned s = 0; s < sizeof(sends) / sizeof(sends[0]); s++) {
    uint64_t total = 0;
    for (unsigned k = 0; k < n; k++) {
      uint64_t len = mk_ofi_stripe_len(sends[s], chunk, k);
      uint64_t cap = mk_ofi_stripe_len(size, chunk, k);
      CHECK(len <= cap);
      CHECK(len == 0 || k == 0 || mk_ofi_stripe_len(sends[s], chunk, k - 1) == chunk);
      total += len;
    }
    CHECK_EQ(total, sends[s]);
  }
}

static void plans(void) {
  uint64_t sizes[] = {0, 1, 4096, 8191, 8192, 262144, 262145, 1u << 20, (1u << 20) + 7,
                      3 * 4096 + 1, 64ull << 20, (64ull << 20) - 4095, 1ull << 30};
  for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
    for (int n = 1; n <= MK_OFI_MAX_STREAMS; n++) {
      plan_one(sizes[s], n, 262144);
      plan_one(sizes[s], n, 0);
    }
  uint8_t n;
  uint64_t chunk;
  mk_ofi_stripe_plan(1u << 20, 4, 262144, &n, &chunk);
  CHECK_EQ(n, 4);
  CHECK_EQ(chunk, 262144);
  mk_ofi_stripe_plan(262144, 4, 262144, &n, &chunk); /* at the threshold: not striped */
  CHECK_EQ(n, 1);
}

/* Version 4: a sender sends the stripes up to the one where its message ends, which lands
 * shorter than the chunk (zero-length on a chunk boundary), and that stripe, and only that
 * one, tells the receiver to cancel the rest. */
static void stripes_sent_end_at_the_message(void) {
  const uint64_t ch = 131072; /* a 512 KiB buffer over 4 streams */
  CHECK_EQ(mk_ofi_stripes_sent(0, ch, 4), 1u);
  CHECK_EQ(mk_ofi_stripes_sent(65536, ch, 4), 1u);
  CHECK_EQ(mk_ofi_stripes_sent(ch - 1, ch, 4), 1u);
  CHECK_EQ(mk_ofi_stripes_sent(ch, ch, 4), 2u); /* stripe 1 zero-length: the end */
  CHECK_EQ(mk_ofi_stripes_sent(ch + 1, ch, 4), 2u);
  CHECK_EQ(mk_ofi_stripes_sent(3 * ch, ch, 4), 4u);
  CHECK_EQ(mk_ofi_stripes_sent(4 * ch, ch, 4), 4u); /* fills the buffer: no terminator */
  CHECK_EQ(mk_ofi_stripes_sent(12345, 12345, 1), 1u);
  for (uint64_t size = 0; size <= 4 * ch; size += 4093) {
    unsigned n = mk_ofi_stripes_sent(size, ch, 4), ends = 0, k;
    uint64_t got = 0;
    for (k = 0; k < n; k++) { /* what each sent stripe carries, as the sender cuts it */
      uint64_t len = mk_ofi_stripe_len(size, ch, k);
      got += len;
      if (mk_ofi_stripe_ends_message(k, 4, len, ch)) {
        ends++;
        CHECK_EQ(k, n - 1);
      }
    }
    CHECK_EQ(got, size);                  /* nothing of the message left unsent */
    CHECK_EQ(ends, n < 4 ? 1u : 0u);       /* the receiver learns the end unless all came */
  }
}

/* Puts: striped only with delivery-complete writes. Without them a completion only means the
 * bytes left the source and ordering rests on one endpoint's write-after-write order, which a
 * plain put's stripes on streams 1.. would escape: the proxy's fenced signal (stream 0),
 * posted once the put completed, could land before them. With them a put_signal's data
 * leaves stream 0 to the signals. */
static void put_streams(void) {
  int first = -1;
  for (int signal = 0; signal <= 1; signal++) {
    CHECK_EQ(mk_ofi_put_streams(4, 0, signal, &first), 1); /* no delivery-complete: stream 0 */
    CHECK_EQ(first, 0);
    CHECK_EQ(mk_ofi_put_streams(1, 1, signal, &first), 1);
    CHECK_EQ(first, 0);
  }
  CHECK_EQ(mk_ofi_put_streams(4, 1, 0, &first), 4);
  CHECK_EQ(first, 0);
  CHECK_EQ(mk_ofi_put_streams(4, 1, 1, &first), 3);
  CHECK_EQ(first, 1);
  CHECK_EQ(mk_ofi_put_streams(2, 1, 1, &first), 1);
  CHECK_EQ(first, 1);
}

/* A written stripe's remote CQ data (versions 5, 6) round-trips, and the receiver takes it
 * only when it names a live receive's written entry, a stripe of its plan and no more bytes
 * than a chunk or the buffer: anything else is refused (the comm fails), never counted. */
static void written_stripes(void) {
  const uint32_t seqs[] = {0, 1, 63, 64, 0xffffu, 0x10000u, 0xfffffffeu};
  const uint64_t lens[] = {0, 1, 4096, (1ull << 40) - 1};
  for (unsigned s = 0; s < 7; s++)
    for (unsigned i = 0; i < MK_MAX_RECVS; i++)
      for (unsigned k = 0; k < MK_OFI_MAX_STREAMS; k++)
        for (unsigned l = 0; l < 8; l++) {
          struct mk_ofi_imm m = mk_ofi_imm_parse(mk_ofi_imm(seqs[s], l & 1, i, k, lens[l / 2]));
          CHECK_EQ(m.seq16, seqs[s] & 0xffffu);
          CHECK_EQ(m.last, l & 1);
          CHECK_EQ(m.idx, i);
          CHECK_EQ(m.stripe, k);
          CHECK_EQ(m.len, lens[l / 2]);
        }
  /* receive 70: entry 0 written, 3 stripes of 4096 over 10000 bytes; entry 1 posted */
  const uint8_t write[MK_MAX_RECVS] = {1, 0}, nst[MK_MAX_RECVS] = {3, 1};
  const uint64_t sizes[MK_MAX_RECVS] = {10000, 50}, chunk[MK_MAX_RECVS] = {4096, 50};
  struct mk_ofi_imm ok = mk_ofi_imm_parse(mk_ofi_imm(70, 1, 0, 2, 4096));
  CHECK(mk_ofi_imm_fits(&ok, 70, 2, write, sizes, chunk, nst));
  CHECK(mk_ofi_imm_fits(&ok, 70 + 0x10000, 2, write, sizes, chunk, nst)); /* 16 bits carried */
  const struct mk_ofi_imm bad[] = {
      mk_ofi_imm_parse(mk_ofi_imm(71, 0, 0, 0, 10)),   /* another receive */
      mk_ofi_imm_parse(mk_ofi_imm(70, 0, 1, 0, 10)),   /* a posted entry */
      mk_ofi_imm_parse(mk_ofi_imm(70, 0, 2, 0, 10)),   /* past the receive's entries */
      mk_ofi_imm_parse(mk_ofi_imm(70, 1, 0, 3, 0)),    /* past the plan's stripes */
      mk_ofi_imm_parse(mk_ofi_imm(70, 0, 0, 0, 4097)), /* more than a chunk */
  };
  for (unsigned b = 0; b < sizeof(bad) / sizeof(bad[0]); b++)
    CHECK(!mk_ofi_imm_fits(&bad[b], 70, 2, write, sizes, chunk, nst));
  const uint8_t one[MK_MAX_RECVS] = {1};
  const uint64_t small[MK_MAX_RECVS] = {50}, whole[MK_MAX_RECVS] = {50};
  struct mk_ofi_imm over = mk_ofi_imm_parse(mk_ofi_imm(70, 1, 0, 0, 51));
  CHECK(!mk_ofi_imm_fits(&over, 70, 1, write, small, whole, one)); /* more than the buffer */
}

/* How a sender cuts a written message (version 6): evenly over the stripes, no piece below
 * the minimum (but a lone one) nor above the chunk, the pieces adding up to the message. */
static void write_cut_is_even_and_bounded(void) {
  const uint64_t K = 1024, M = 1024 * 1024;
  uint64_t q;
  CHECK_EQ(mk_ofi_write_cut(M, 4, 512 * K, 64 * K, &q), 4u); /* a 1 MiB message in a 2 MiB slot */
  CHECK_EQ(q, 256 * K);
  CHECK_EQ(mk_ofi_write_cut(256 * K, 2, 256 * K, 64 * K, &q), 2u); /* NCCL's 512 KiB slot */
  CHECK_EQ(q, 128 * K);
  CHECK_EQ(mk_ofi_write_cut(100, 4, 512 * K, 64 * K, &q), 1u);
  CHECK_EQ(q, 100u);
  CHECK_EQ(mk_ofi_write_cut(0, 4, 512 * K, 64 * K, &q), 1u);
  CHECK_EQ(q, 0u);
  CHECK_EQ(mk_ofi_write_cut(100 * K, 2, 256 * K, 64 * K, &q), 1u); /* two would be under 64 KiB */
  CHECK_EQ(mk_ofi_write_cut(M, 4, 512 * K, 1ull << 40, &q), 2u);   /* as few as the chunks allow */
  CHECK_EQ(q, 512 * K);
  CHECK_EQ(mk_ofi_write_cut(3000, 1, 3000, 0, &q), 1u);
  const uint64_t sizes[] = {0, 1, 4095, 4096, 65537, 200 * K, 256 * K + 1, M - 1, 3 * M + 7};
  const uint64_t mins[] = {0, 4096, 64 * K, 1ull << 40};
  for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
    for (int streams = 1; streams <= MK_OFI_MAX_STREAMS; streams++)
      for (unsigned m = 0; m < 4; m++) {
        uint8_t nst;
        uint64_t chunk, total = 0;
        const uint64_t buf = sizes[s] + 4 * K; /* the receiver's buffer, a little larger */
        mk_ofi_stripe_plan(buf, streams, 0, &nst, &chunk);
        const unsigned n = mk_ofi_write_cut(sizes[s], nst, chunk, mins[m], &q);
        CHECK(n >= 1 && n <= nst);
        for (unsigned k = 0; k < n; k++) {
          const uint64_t len = mk_ofi_stripe_len(sizes[s], q, k);
          CHECK(len <= chunk);
          CHECK(len > 0 || sizes[s] == 0); /* no empty piece */
          total += len;
        }
        CHECK_EQ(total, sizes[s]);
        /* below the minimum only where the chunks need that many pieces */
        if (n > 1) CHECK(q % 4096 == 0 && (q >= mins[m] || n == (sizes[s] + chunk - 1) / chunk));
      }
}

int main(void) {
  tags();
  plans();
  stripes_sent_end_at_the_message();
  put_streams();
  written_stripes();
  write_cut_is_even_and_bounded();
  CHECK_EQ(sizeof(struct mk_ofi_cts), 336);
  CHECK_EQ(sizeof(struct mk_ofi_hello), 536);
  return MK_TEST_RESULT();
}
