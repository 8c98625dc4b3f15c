/* NCCL_MK_SOCKET_IFNAME lists select interfaces as NCCL_SOCKET_IFNAME does: prefixes, "=name"
 * exact, a leading '^' for all but the list. */
#include "mk_test.h"
#include "sock.h"

static void test_prefixes_and_exact_names(void) {
  CHECK(mk_sock_ifname_matches("eth", "eth0"));
  CHECK(mk_sock_ifname_matches("ib,eth", "eth1"));
  CHECK(!mk_sock_ifname_matches("ib,eth", "lo"));
  CHECK(mk_sock_ifname_matches("=lo", "lo"));
  CHECK(!mk_sock_ifname_matches("=eth", "eth0"));
  CHECK(mk_sock_ifname_matches("=eth0,=lo", "lo"));
}

static void test_a_caret_excludes_the_list(void) {
  CHECK(!mk_sock_ifname_matches("^lo,docker", "lo"));
  CHECK(!mk_sock_ifname_matches("^lo,docker", "docker0"));
  CHECK(mk_sock_ifname_matches("^lo,docker", "eth0"));
  CHECK(mk_sock_ifname_matches("^=eth", "eth0"));
  CHECK(!mk_sock_ifname_matches("^=eth0", "eth0"));
}

int main(void) {
  test_prefixes_and_exact_names();
  test_a_caret_excludes_the_list();
  return MK_TEST_RESULT();
}
