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

/* Unstriped messages stay on stream 0 whatever their size; striped ones rotate their start. */
static void first_streams(void) {
  for (unsigned seq = 0; seq < 8; seq++) {
    CHECK_EQ(mk_ofi_first_stream(1, 4, seq, 0), 0u);
    CHECK_EQ(mk_ofi_first_stream(1, 4, seq, 3), 0u);
    CHECK_EQ(mk_ofi_first_stream(4, 1, seq, 1), 0u);
    CHECK_EQ(mk_ofi_first_stream(4, 4, seq, 1), (seq + 1) % 4);
    CHECK_EQ(mk_ofi_first_stream(2, 3, seq, 2), (seq + 2) % 3);
  }
}

int main(void) {
  tags();
  plans();
  first_streams();
  CHECK_EQ(sizeof(struct mk_ofi_cts), 200);
  CHECK_EQ(sizeof(struct mk_ofi_hello), 536);
  return MK_TEST_RESULT();
}
