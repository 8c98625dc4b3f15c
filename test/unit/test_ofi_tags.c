/* The ofi wire format: tag fields round-trip and never collide with the control tag. */
#include "mk_test.h"
#include "ofi/proto.h"

int main(void) {
  uint32_t seqs[] = {0, 1, 31, 32, 0x7fffffffu, 0xffffffffu};
  for (unsigned s = 0; s < sizeof(seqs) / sizeof(seqs[0]); s++)
    for (unsigned i = 0; i < MK_MAX_RECVS; i++) {
      uint64_t t = mk_ofi_tag_data(seqs[s], i);
      CHECK_EQ(mk_ofi_tag_seq(t), seqs[s]);
      CHECK_EQ(mk_ofi_tag_idx(t), i);
      CHECK(!mk_ofi_tag_is_ctrl(t));
      CHECK(t != MK_OFI_TAG_CTRL);
      for (unsigned j = 0; j < i; j++) CHECK(mk_ofi_tag_data(seqs[s], j) != t);
    }
  CHECK(mk_ofi_tag_is_ctrl(MK_OFI_TAG_CTRL));
  CHECK(MK_MAX_RECVS - 1 <= MK_OFI_TAG_IDX_MASK);
  CHECK_EQ(sizeof(struct mk_ofi_cts), 112);
  return MK_TEST_RESULT();
}
