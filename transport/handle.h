/*
 * The listen handle that NCCL ships between ranks (MK_HANDLE_MAX bytes): where to reach the
 * listener's side-channel socket, a nonce that the connector echoes so the listener can tell
 * its own peers from anything else that dials the port, and the listener's transport, so that
 * a rank on the other transport (NCCL_MK_TRANSPORT auto picks ib on a host with an RDMA device,
 * ofi elsewhere) says so instead of failing a handshake it cannot read. Fixed little-endian
 * layout with a checksum, so a corrupt, short or foreign handle is rejected (-EBADMSG), never
 * trusted.
 */
#ifndef MK_HANDLE_H_
#define MK_HANDLE_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define MK_HANDLE_MAGIC 0x4b4d434eu /* "NCMK" */
#define MK_HANDLE_VERSION 1
#define MK_HANDLE_ENCODED_SIZE 40   /* bytes actually used inside the MK_HANDLE_MAX buffer */

/* The transport whose listener made a handle; 0: not named (a handle of a build before session
 * 71, where these bytes were padding, zero). */
enum { MK_HANDLE_TRANSPORT_UNNAMED = 0, MK_HANDLE_TRANSPORT_OFI = 1, MK_HANDLE_TRANSPORT_IB = 2 };

struct mk_handle {
  struct sockaddr_storage addr; /* AF_INET or AF_INET6, with port */
  uint64_t nonce;
  uint16_t transport; /* MK_HANDLE_TRANSPORT_* */
};

/* "ofi", "ib", "unnamed", or "unknown" for a value this build does not know. */
const char* mk_handle_transport_name(unsigned transport);

/* Writes the encoding into buf (len >= MK_HANDLE_ENCODED_SIZE); zeroes the rest of buf.
 * -EINVAL for an unsupported address family or a short buffer. */
int mk_handle_encode(const struct mk_handle* h, void* buf, size_t len);
/* -EBADMSG for a short buffer, wrong magic or version, bad checksum or bad address. */
int mk_handle_decode(const void* buf, size_t len, struct mk_handle* h);

/* FNV-1a, 32 bit: the handle's checksum; exposed for tests. */
uint32_t mk_fnv1a32(const void* data, size_t len);

#endif /* MK_HANDLE_H_ */
