/* The cross-node ops' bounce-buffer slots and flags (fused/proxy/xnode.h), for 2 to 8 ranks,
 * without network or GPU: every rank's slots are disjoint and inside mk_xn_rs_bytes; what a
 * sender's descriptor reads is its own slot for the peer and what it writes is the peer's slot
 * for it; every (source, row-block) has its own flag inside the flag region. */
#include <stdint.h>
#include <stdlib.h>

#include "mk_test.h"
#include "xnode.h"

enum { MAX_N = 8, BLOCKS = 3 };
static const uint64_t BYTES = 4096;

/* Row-block 0 of every slot rank `self` has (group, other), as slot numbers. */
static void slots_are_disjoint(int n, int self, int gather) {
  const uint64_t total = mk_xn_rs_bytes(n, BLOCKS, BYTES, gather), slot = BLOCKS * BYTES;
  unsigned char used[4 * MAX_N] = {0};
  for (int group = MK_XN_RS_OUT; group <= (gather ? MK_XN_RS_GATHERED : MK_XN_RS_IN); group++)
    for (int other = 0; other < n; other++) {
      if (other == self || (group == MK_XN_RS_GATHER && other != (self + 1) % n)) continue;
      const uint64_t off = mk_xn_rs_off(group, other, self, n, BLOCKS, 0, BYTES);
      CHECK_EQ(off % slot, 0);
      CHECK(off + slot <= total);
      if (off / slot < sizeof(used)) CHECK_EQ(used[off / slot]++, 0); /* no two slots share bytes */
    }
  /* the one gather slot serves every peer */
  for (int other = 0; other < n; other++)
    if (other != self)
      CHECK_EQ(mk_xn_rs_off(MK_XN_RS_GATHER, other, self, n, BLOCKS, 1, BYTES),
               mk_xn_rs_off(MK_XN_RS_GATHER, (self + 1) % n, self, n, BLOCKS, 1, BYTES));
}

/* rank -> peer, row-block mb: the put reads rank's slot for peer and lands in peer's slot for
 * rank; its flag is the peer's flag of (rank, mb). */
static void descriptors_pair_up(int n, int rank, int peer, int mb, int gather) {
  const struct mk_proxy_desc d =
      mk_xn_rs_block_desc(rank, peer, n, BLOCKS, mb, BYTES, 7, gather, 0);
  CHECK_EQ(d.peer, peer);
  CHECK_EQ(d.size, BYTES);
  CHECK_EQ(d.flag_value, 7);
  CHECK_EQ(d.src_off,
           mk_xn_rs_off(gather ? MK_XN_RS_GATHER : MK_XN_RS_OUT, peer, rank, n, BLOCKS, mb, BYTES));
  CHECK_EQ(d.dst_off, mk_xn_rs_off(gather ? MK_XN_RS_GATHERED : MK_XN_RS_IN, rank, peer, n, BLOCKS,
                                   mb, BYTES));
  const uint64_t word =
      (gather ? MK_XN_GATHER_FLAG0 : MK_XN_RS_FLAG0) + (uint64_t)rank * BLOCKS + (uint64_t)mb;
  CHECK_EQ(d.flag_off, word * 8);
  CHECK(word < MK_XN_FLAG_WORDS);
}

int main(void) {
  for (int n = 2; n <= MAX_N; n++)
    for (int rank = 0; rank < n; rank++) {
      slots_are_disjoint(n, rank, 0);
      slots_are_disjoint(n, rank, 1);
      for (int peer = 0; peer < n; peer++)
        for (int mb = 0; peer != rank && mb < BLOCKS; mb++) {
          descriptors_pair_up(n, rank, peer, mb, 0);
          descriptors_pair_up(n, rank, peer, mb, 1);
        }
    }
  /* the flag regions do not overlap, and the queue's signals stay inside */
  CHECK(MK_XN_DONE0 + MK_XN_MAX_RANKS <= MK_XN_ROW_FLAG0);
  CHECK(MK_XN_ROW_FLAG0 + MK_XN_MAX_BLOCKS <= MK_XN_BYE0);
  CHECK(MK_XN_BYE0 + MK_XN_MAX_RANKS <= MK_XN_RS_FLAG0);
  CHECK(MK_XN_RS_FLAG0 + MK_XN_MAX_BLOCKS <= MK_XN_GATHER_FLAG0);
  CHECK_EQ(MK_XN_GATHER_FLAG0 + MK_XN_MAX_BLOCKS, MK_XN_FLAG_WORDS);
  const struct mk_proxy_desc bye = mk_xn_bye_desc(3, 1), done = mk_xn_done_desc(3, 1, 9, 0);
  CHECK_EQ(bye.flag_off, (uint64_t)(MK_XN_BYE0 + 3) * 8);
  CHECK_EQ(done.flag_off, (uint64_t)(MK_XN_DONE0 + 3) * 8);
  CHECK_EQ(done.flag_value, 9);
  CHECK_EQ(done.op, MK_PROXY_SIGNAL);
  return MK_TEST_RESULT();
}
