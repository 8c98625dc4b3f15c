/* The fused ops find the NCCL already in the process. This binary links NCCL, so its
 * symbols are global: the lookup must take them (a null RTLD_DEFAULT handle once made it
 * report "no NCCL" here). ncclGetVersion needs no GPU. And a non-blocking communicator's
 * ncclInProgress is waited out through ncclCommGetAsyncError (a stand-in here), not taken
 * for a failure as it was; a long wait says so (a WARN every NCCL_MK_TIMEOUT_MS) and waits on. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mk_clock.h"
#include "mk_param.h"
#include "mk_test.h"
#include "nccl_api.h"
#include "warn_capture.h"

/* ncclCommGetAsyncError's stand-in: in progress for polls_left polls, or until until_ns (a peer
 * that joins late), then polls_end. */
static int polls_left, polls;
static uint64_t until_ns;
static ncclResult_t polls_end;

static ncclResult_t fake_async_error(ncclComm_t comm, ncclResult_t* async_error) {
  (void)comm;
  polls++;
  const int more = --polls_left > 0 || mk_now_ns() < until_ns;
  *async_error = more ? ncclInProgress : polls_end;
  return ncclSuccess;
}

static struct mk_nccl_api fake = {.comm_get_async_error = fake_async_error};

static void in_progress_is_polled_to_its_end(void) {
  ncclComm_t comm = (ncclComm_t)(void*)&fake;
  polls = 0, polls_left = 3, polls_end = ncclSuccess;
  CHECK_EQ(mk_nccl_comm_check(&fake, comm, ncclInProgress, "an enqueue"), 0);
  CHECK_EQ(polls, 3);
  polls = 0, polls_left = 2, polls_end = ncclRemoteError;
  CHECK_EQ(mk_nccl_comm_check(&fake, comm, ncclInProgress, "an enqueue"), -ECONNRESET);
  CHECK_EQ(polls, 2);
  polls = 0;
  CHECK_EQ(mk_nccl_comm_check(&fake, comm, ncclSuccess, "a call"), 0);
  CHECK_EQ(mk_nccl_comm_check(&fake, comm, ncclInvalidArgument, "a call"), -EINVAL);
  CHECK_EQ(polls, 0);
}

static void long_in_progress_warns_and_waits_on(void) {
  ncclComm_t comm = (ncclComm_t)(void*)&fake;
  polls_left = 0, polls_end = ncclSuccess;
  setenv("NCCL_MK_TIMEOUT_MS", "5", 1);
  mk_param_reload();
  warn_capture_on();
  last_warn[0] = 0;
  until_ns = mk_now_ns() + 30 * 1000000ull; /* 30 ms: several 5 ms periods */
  CHECK_EQ(mk_nccl_comm_check(&fake, comm, ncclInProgress, "ncclAllGather (workspace exchange)"), 0);
  CHECK(mk_now_ns() >= until_ns); /* waited to the end, not given up */
  CHECK(strstr(last_warn, "ncclAllGather (workspace exchange)") != NULL);
  CHECK(strstr(last_warn, "still ncclInProgress") != NULL);
  /* a short wait stays quiet */
  last_warn[0] = 0;
  setenv("NCCL_MK_TIMEOUT_MS", "60000", 1);
  mk_param_reload();
  until_ns = mk_now_ns() + 2 * 1000000ull;
  CHECK_EQ(mk_nccl_comm_check(&fake, comm, ncclInProgress, "an enqueue"), 0);
  CHECK_EQ(last_warn[0], 0);
  unsetenv("NCCL_MK_TIMEOUT_MS");
  mk_param_reload();
}

int main(void) {
  in_progress_is_polled_to_its_end();
  long_in_progress_warns_and_waits_on();
  int linked = 0;
  REQUIRE(ncclGetVersion(&linked) == ncclSuccess);
  const struct mk_nccl_api* api = NULL;
  CHECK_EQ(mk_nccl_api_get(&api), 0);
  REQUIRE(api != NULL);
  CHECK_EQ(api->version, linked);
  CHECK(api->get_version == ncclGetVersion);
  CHECK(api->all_gather == ncclAllGather);
  CHECK(api->comm_count && api->comm_user_rank && api->comm_cu_device);
  CHECK(api->comm_get_async_error == ncclCommGetAsyncError);
  return MK_TEST_RESULT();
}
