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

static void test_net_provider_gets_one_endpoint_whatever_is_asked(void) {
  CHECK(mk_ofi_streams_cap("net", 4) == 1);
  CHECK(mk_ofi_streams_cap("net", 1) == 1);
  CHECK(mk_ofi_streams_cap("net;ofi_rxm", 2) == 1);
  CHECK(mk_ofi_streams_cap("netdev", 2) == 2);
  CHECK(mk_ofi_streams_cap("tcp;ofi_rxm", 4) == 4);
  CHECK(mk_ofi_streams_cap("efa", 2) == 2);
  CHECK(mk_ofi_streams_cap(NULL, 3) == 3);
}

static void test_progress_thread_over_tcp_with_eight_cores(void) {
  CHECK(mk_ofi_progress_auto("tcp;ofi_rxm", 8));
  CHECK(mk_ofi_progress_auto("tcp;ofi_rxm", 128));
  CHECK(!mk_ofi_progress_auto("tcp;ofi_rxm", 7)); /* spinning threads need cores */
  CHECK(!mk_ofi_progress_auto("tcp;ofi_rxm", 2));
  CHECK(!mk_ofi_progress_auto("efa", 128)); /* unmeasured there */
  CHECK(!mk_ofi_progress_auto(NULL, 128));
}

static void test_callers_progress_after_a_run_of_small_requests_until_a_large_one(void) {
  int callers = -1;
  uint32_t streak = 0;
  for (int i = 1; i < MK_OFI_SMALL_STREAK; i++) {
    streak = mk_ofi_caller_progress_step(streak, 16383, 16384, &callers);
    CHECK(!callers);
  }
  streak = mk_ofi_caller_progress_step(streak, 8, 16384, &callers);
  CHECK(callers && streak == MK_OFI_SMALL_STREAK);
  streak = mk_ofi_caller_progress_step(streak, 0, 16384, &callers); /* stays, no wrap */
  CHECK(callers && streak == MK_OFI_SMALL_STREAK);
  streak = mk_ofi_caller_progress_step(streak, 16384, 16384, &callers); /* large: the thread */
  CHECK(!callers && streak == 0);
  streak = mk_ofi_caller_progress_step(streak, 8, 16384, &callers);
  CHECK(!callers && streak == 1); /* a new run starts */
  streak = mk_ofi_caller_progress_step(MK_OFI_SMALL_STREAK, 8, 0, &callers); /* 0: off */
  CHECK(!callers && streak == 0);
}

static void test_thread_posts_large_sends_and_small_ones_while_it_drives(void) {
  CHECK(mk_ofi_thread_posts_send(16384, 16384, 0));
  CHECK(mk_ofi_thread_posts_send(1u << 20, 16384, 1));
  CHECK(mk_ofi_thread_posts_send(0, 16384, 1)); /* NCCL's 0-byte Simple steps */
  CHECK(mk_ofi_thread_posts_send(16383, 16384, 1));
  CHECK(!mk_ofi_thread_posts_send(16383, 16384, 0)); /* NCCL's calls drive: at once */
  CHECK(!mk_ofi_thread_posts_send(0, 16384, 0));
  CHECK(mk_ofi_thread_posts_send(0, 0, 0)); /* min 0: every send */
}

int main(void) {
  test_thread_posts_large_sends_and_small_ones_while_it_drives();
  test_callers_progress_after_a_run_of_small_requests_until_a_large_one();
  test_two_endpoints_over_tcp_one_elsewhere();
  test_net_provider_gets_one_endpoint_whatever_is_asked();
  test_progress_thread_over_tcp_with_eight_cores();
  return MK_TEST_RESULT();
}
