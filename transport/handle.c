#include "handle.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include "mk_log.h"

/* Layout: magic u32 | version u16 | family u16 | port u16 (network order) | transport u16 |
 *         addr 16 bytes (IPv4 uses the first 4) | nonce u64 | checksum u32 over bytes 0..35.
 * transport was padding (zero) before session 71: the version stays 1, an old handle reads as
 * unnamed. */
enum { OFF_MAGIC = 0, OFF_VERSION = 4, OFF_FAMILY = 6, OFF_PORT = 8, OFF_TRANSPORT = 10,
       OFF_ADDR = 12, OFF_NONCE = 28, OFF_SUM = 36, SUM_LEN = 36, ENC_FAMILY_V4 = 4,
       ENC_FAMILY_V6 = 6 };

_Static_assert(OFF_SUM + 4 == MK_HANDLE_ENCODED_SIZE, "handle layout");

const char* mk_handle_transport_name(unsigned transport) {
  switch (transport) {
  case MK_HANDLE_TRANSPORT_UNNAMED: return "unnamed";
  case MK_HANDLE_TRANSPORT_OFI: return "ofi";
  case MK_HANDLE_TRANSPORT_IB: return "ib";
  default: return "unknown";
  }
}

uint32_t mk_fnv1a32(const void* data, size_t len) {
  const uint8_t* p = data;
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

static void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

int mk_handle_encode(const struct mk_handle* h, void* buf, size_t len) {
  if (!h || !buf || len < MK_HANDLE_ENCODED_SIZE) return -EINVAL;
  uint8_t* p = buf;
  memset(p, 0, len);
  put_le(p + OFF_MAGIC, MK_HANDLE_MAGIC, 4);
  put_le(p + OFF_VERSION, MK_HANDLE_VERSION, 2);
  if (h->addr.ss_family == AF_INET) {
    const struct sockaddr_in* a = (const struct sockaddr_in*)&h->addr;
    put_le(p + OFF_FAMILY, ENC_FAMILY_V4, 2);
    memcpy(p + OFF_PORT, &a->sin_port, 2);
    memcpy(p + OFF_ADDR, &a->sin_addr, 4);
  } else if (h->addr.ss_family == AF_INET6) {
    const struct sockaddr_in6* a = (const struct sockaddr_in6*)&h->addr;
    put_le(p + OFF_FAMILY, ENC_FAMILY_V6, 2);
    memcpy(p + OFF_PORT, &a->sin6_port, 2);
    memcpy(p + OFF_ADDR, &a->sin6_addr, 16);
  } else {
    return -EINVAL;
  }
  put_le(p + OFF_TRANSPORT, h->transport, 2);
  put_le(p + OFF_NONCE, h->nonce, 8);
  put_le(p + OFF_SUM, mk_fnv1a32(p, SUM_LEN), 4);
  return 0;
}

int mk_handle_decode(const void* buf, size_t len, struct mk_handle* h) {
  if (!buf || !h) return -EINVAL;
  const uint8_t* p = buf;
  if (len < MK_HANDLE_ENCODED_SIZE) {
    MK_WARN("listen handle too short (%zu bytes, need %d)", len, MK_HANDLE_ENCODED_SIZE);
    return -EBADMSG;
  }
  if (get_le(p + OFF_MAGIC, 4) != MK_HANDLE_MAGIC) {
    MK_WARN("listen handle has a foreign magic: not made by nccl-mk");
    return -EBADMSG;
  }
  if (get_le(p + OFF_VERSION, 2) != MK_HANDLE_VERSION) {
    MK_WARN("listen handle version %u, this build speaks %d", (unsigned)get_le(p + OFF_VERSION, 2),
            MK_HANDLE_VERSION);
    return -EBADMSG;
  }
  if (get_le(p + OFF_SUM, 4) != mk_fnv1a32(p, SUM_LEN)) {
    MK_WARN("listen handle checksum mismatch: the handle was corrupted in transit");
    return -EBADMSG;
  }
  memset(h, 0, sizeof(*h));
  unsigned fam = (unsigned)get_le(p + OFF_FAMILY, 2);
  if (fam == ENC_FAMILY_V4) {
    struct sockaddr_in* a = (struct sockaddr_in*)&h->addr;
    a->sin_family = AF_INET;
    memcpy(&a->sin_port, p + OFF_PORT, 2);
    memcpy(&a->sin_addr, p + OFF_ADDR, 4);
  } else if (fam == ENC_FAMILY_V6) {
    struct sockaddr_in6* a = (struct sockaddr_in6*)&h->addr;
    a->sin6_family = AF_INET6;
    memcpy(&a->sin6_port, p + OFF_PORT, 2);
    memcpy(&a->sin6_addr, p + OFF_ADDR, 16);
  } else {
    MK_WARN("listen handle names address family %u", fam);
    return -EBADMSG;
  }
  h->nonce = get_le(p + OFF_NONCE, 8);
  h->transport = (uint16_t)get_le(p + OFF_TRANSPORT, 2);
  return 0;
}
