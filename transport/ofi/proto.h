/*
 * The wire format between two nccl-mk ofi endpoints, versioned. Bump MK_OFI_PROTO_VERSION
 * on any change: the side-channel hello carries it and mismatched peers refuse to connect.
 *
 * 64-bit tags (every bit is matched, ignore mask 0):
 *   bit 63      kind: 0 data, 1 control (clear-to-send)
 *   bits 35..32 entry index inside a grouped receive (0..MK_MAX_RECVS-1)
 *   bits 31..0  receive sequence number (wraps; at most MK_MAX_REQUESTS are ever live)
 */
#ifndef MK_OFI_PROTO_H_
#define MK_OFI_PROTO_H_

#include <stdint.h>

#include "transport.h"

#define MK_OFI_PROTO_VERSION 1
#define MK_OFI_HELLO_MAGIC 0x4f4b4d48u /* "HMKO" */
#define MK_OFI_CTS_MAGIC 0x5354434du   /* "MCTS" */
#define MK_OFI_ADDR_MAX 64             /* fabric address bytes carried in the hello */

#define MK_OFI_TAG_CTRL (1ull << 63)
#define MK_OFI_TAG_IDX_SHIFT 32
#define MK_OFI_TAG_IDX_MASK 0xfull

static inline uint64_t mk_ofi_tag_data(uint32_t seq, unsigned idx) {
  return ((uint64_t)(idx & MK_OFI_TAG_IDX_MASK) << MK_OFI_TAG_IDX_SHIFT) | seq;
}
static inline int mk_ofi_tag_is_ctrl(uint64_t tag) { return (tag & MK_OFI_TAG_CTRL) != 0; }
static inline uint32_t mk_ofi_tag_seq(uint64_t tag) { return (uint32_t)tag; }
static inline unsigned mk_ofi_tag_idx(uint64_t tag) {
  return (unsigned)((tag >> MK_OFI_TAG_IDX_SHIFT) & MK_OFI_TAG_IDX_MASK);
}

/* Side-channel hello, both directions, fixed size. Integers in host order: both ends of a
 * comm run the same build on the same architecture family (x86-64 / aarch64, little-endian). */
struct mk_ofi_hello {
  uint32_t magic;
  uint16_t version;
  uint16_t addr_len;
  uint64_t nonce;               /* the listen handle's nonce, echoed by both sides */
  uint8_t addr[MK_OFI_ADDR_MAX]; /* fi_getname of the sender's endpoint */
};

/* Clear-to-send: the receiver posted receive seq with n buffers. */
struct mk_ofi_cts {
  uint32_t magic;
  uint32_t seq;
  uint32_t n;
  uint32_t pad;
  uint64_t sizes[MK_MAX_RECVS];
  int32_t tags[MK_MAX_RECVS];
};

_Static_assert(sizeof(struct mk_ofi_hello) == 80, "hello layout");
_Static_assert(sizeof(struct mk_ofi_cts) == 112, "cts layout");

#endif /* MK_OFI_PROTO_H_ */
