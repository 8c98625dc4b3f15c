/* The fused ops find the NCCL already in the process. This binary links NCCL, so its
 * symbols are global: the lookup must take them (a null RTLD_DEFAULT handle once made it
 * report "no NCCL" here). ncclGetVersion needs no GPU. And a non-blocking communicator's
 * ncclInProgress is waited out through ncclCommGetAsyncError (a stand-in here), not taken
 * for a failure as it was. */
#include <errno.h>

#include "mk_test.h"
#include "nccl_api.h"

static int polls_left, polls;
static ncclResult_t polls_end;

static ncclResult_t fake_async_error(ncclComm_t comm, ncclResult_t* async_error) {
  (void)comm;
  polls++;
  *async_error = --polls_left > 0 ? ncclInProgress : polls_end;
  return ncclSuccess;
}

static void in_progress_is_polled_to_its_end(void) {
  struct mk_nccl_api fake = {0};
  fake.comm_get_async_error = fake_async_error;
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

int main(void) {
  in_progress_is_polled_to_its_end();
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
