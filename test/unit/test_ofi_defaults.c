/* The ofi transport's automatic settings: endpoints per comm (NCCL_MK_OFI_STREAMS=0) and the
 * comm progress thread (NCCL_MK_OFI_PROGRESS_THREAD=-1), as functions of the provider and the
 * usable cores. */
#include "mk_test.h"
#include "transport.h"

static void test_two_endpoints_over_tcp_one_elsewhere(void) {
  CHECK(mk_ofi_auto_streams("tcp;ofi_rxm") == 2);
  CHECK(mk_ofi_auto_streams("tcp") == 2);
  CHECK(mk_ofi_auto_streams("efa") == 1);
  CHECK(mk_ofi_auto_streams(NULL) == 1);
}

static void test_progress_thread_over_tcp_with_eight_cores(void) {
  CHECK(mk_ofi_progress_auto("tcp;ofi_rxm", 8));
  CHECK(mk_ofi_progress_auto("tcp;ofi_rxm", 128));
  CHECK(!mk_ofi_progress_auto("tcp;ofi_rxm", 7)); /* spinning threads need cores */
  CHECK(!mk_ofi_progress_auto("tcp;ofi_rxm", 2));
  CHECK(!mk_ofi_progress_auto("efa", 128)); /* unmeasured there */
  CHECK(!mk_ofi_progress_auto(NULL, 128));
}

int main(void) {
  test_two_endpoints_over_tcp_one_elsewhere();
  test_progress_thread_over_tcp_with_eight_cores();
  return MK_TEST_RESULT();
}
