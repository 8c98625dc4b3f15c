/* The listen handle: round trip (its transport too), and every kind of damage rejected with
 * -EBADMSG. */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "handle.h"
#include "mk_test.h"
#include "transport.h"

static void make_v4(struct mk_handle* h) {
  memset(h, 0, sizeof(*h));
  struct sockaddr_in* a = (struct sockaddr_in*)&h->addr;
  a->sin_family = AF_INET;
  a->sin_port = htons(43210);
  inet_pton(AF_INET, "127.0.0.1", &a->sin_addr);
  h->nonce = 0x0123456789abcdefull;
  h->transport = MK_HANDLE_TRANSPORT_IB;
}

static void test_round_trip(void) {
  struct mk_handle h, back;
  unsigned char buf[MK_HANDLE_MAX];
  make_v4(&h);
  CHECK_EQ(mk_handle_encode(&h, buf, sizeof(buf)), 0);
  CHECK_EQ(mk_handle_decode(buf, sizeof(buf), &back), 0);
  CHECK(memcmp(&h.addr, &back.addr, sizeof(struct sockaddr_in)) == 0);
  CHECK(back.nonce == h.nonce);
  CHECK_EQ(back.transport, MK_HANDLE_TRANSPORT_IB);
  struct sockaddr_in6* a6 = (struct sockaddr_in6*)&h.addr;
  memset(&h.addr, 0, sizeof(h.addr));
  a6->sin6_family = AF_INET6;
  a6->sin6_port = htons(7);
  inet_pton(AF_INET6, "fd00::2", &a6->sin6_addr);
  CHECK_EQ(mk_handle_encode(&h, buf, sizeof(buf)), 0);
  CHECK_EQ(mk_handle_decode(buf, sizeof(buf), &back), 0);
  CHECK(memcmp(&h.addr, &back.addr, sizeof(struct sockaddr_in6)) == 0);
}

static void test_rejects(void) {
  struct mk_handle h, back;
  unsigned char good[MK_HANDLE_MAX], bad[MK_HANDLE_MAX];
  make_v4(&h);
  CHECK_EQ(mk_handle_encode(&h, good, sizeof(good)), 0);
  /* every single-byte corruption of the used part is caught */
  for (int i = 0; i < MK_HANDLE_ENCODED_SIZE; i++) {
    memcpy(bad, good, sizeof(bad));
    bad[i] ^= 0x5a;
    CHECK_EQ(mk_handle_decode(bad, sizeof(bad), &back), -EBADMSG);
  }
  CHECK_EQ(mk_handle_decode(good, MK_HANDLE_ENCODED_SIZE - 1, &back), -EBADMSG); /* short */
  memset(bad, 0, sizeof(bad));
  CHECK_EQ(mk_handle_decode(bad, sizeof(bad), &back), -EBADMSG); /* all zero: foreign */
  memcpy(bad, good, sizeof(bad));
  bad[0] = 'X'; /* wrong magic, checksum recomputed so only the magic is wrong */
  uint32_t sum = mk_fnv1a32(bad, 36);
  memcpy(bad + 36, &sum, 4);
  CHECK_EQ(mk_handle_decode(bad, sizeof(bad), &back), -EBADMSG);
  memcpy(bad, good, sizeof(bad));
  bad[4] = 99; /* wrong version, valid checksum */
  sum = mk_fnv1a32(bad, 36);
  memcpy(bad + 36, &sum, 4);
  CHECK_EQ(mk_handle_decode(bad, sizeof(bad), &back), -EBADMSG);
  CHECK_EQ(mk_handle_decode(NULL, sizeof(bad), &back), -EINVAL);
  CHECK_EQ(mk_handle_encode(&h, good, 8), -EINVAL);
  h.addr.ss_family = AF_UNIX;
  CHECK_EQ(mk_handle_encode(&h, good, sizeof(good)), -EINVAL);
}

/* A handle of a build before the transport was named had zeros there: it reads as unnamed, and
 * the names say which transport made a handle. */
static void a_handle_without_a_transport_reads_as_unnamed(void) {
  struct mk_handle h, back;
  unsigned char buf[MK_HANDLE_MAX];
  make_v4(&h);
  h.transport = MK_HANDLE_TRANSPORT_UNNAMED;
  CHECK_EQ(mk_handle_encode(&h, buf, sizeof(buf)), 0);
  CHECK_EQ(buf[10] | buf[11], 0); /* the old padding */
  CHECK_EQ(mk_handle_decode(buf, sizeof(buf), &back), 0);
  CHECK_EQ(back.transport, MK_HANDLE_TRANSPORT_UNNAMED);
  CHECK(strcmp(mk_handle_transport_name(MK_HANDLE_TRANSPORT_OFI), "ofi") == 0);
  CHECK(strcmp(mk_handle_transport_name(MK_HANDLE_TRANSPORT_IB), "ib") == 0);
  CHECK(strcmp(mk_handle_transport_name(77), "unknown") == 0);
}

int main(void) {
  test_round_trip();
  a_handle_without_a_transport_reads_as_unnamed();
  test_rejects();
  return MK_TEST_RESULT();
}
