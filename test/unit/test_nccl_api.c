/* The fused ops find the NCCL already in the process. This binary links NCCL, so its
 * symbols are global: the lookup must take them (a null RTLD_DEFAULT handle once made it
 * report "no NCCL" here). ncclGetVersion needs no GPU. */
#include "mk_test.h"
#include "nccl_api.h"

int main(void) {
  int linked = 0;
  REQUIRE(ncclGetVersion(&linked) == ncclSuccess);
  const struct mk_nccl_api* api = NULL;
  CHECK_EQ(mk_nccl_api_get(&api), 0);
  REQUIRE(api != NULL);
  CHECK_EQ(api->version, linked);
  CHECK(api->get_version == ncclGetVersion);
  CHECK(api->all_gather == ncclAllGather);
  CHECK(api->comm_count && api->comm_user_rank && api->comm_cu_device);
  return MK_TEST_RESULT();
}
