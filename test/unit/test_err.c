/* The one translator from negative errno to ncclResult_t, and MK_CHECK propagation. */
#include "mk_err.h"
#include "mk_test.h"

static int fails_with(int rc) { return rc; }

static int propagates(int rc) {
  MK_CHECK(fails_with(rc));
  return 7;
}

static int propagates_goto(int rc, int* cleaned) {
  int ret = 0;
  MK_CHECK_GOTO(fails_with(rc), ret, out);
  ret = 7;
out:
  *cleaned = 1;
  return ret;
}

int main(void) {
  CHECK_EQ(mk_result_from_errno(0), ncclSuccess);
  CHECK_EQ(mk_result_from_errno(5), ncclSuccess);
  CHECK_EQ(mk_result_from_errno(-EINVAL), ncclInvalidArgument);
  CHECK_EQ(mk_result_from_errno(-EBADMSG), ncclInvalidArgument);
  CHECK_EQ(mk_result_from_errno(-ENOTSUP), ncclInvalidUsage);
  CHECK_EQ(mk_result_from_errno(-ECONNRESET), ncclRemoteError);
  CHECK_EQ(mk_result_from_errno(-ETIMEDOUT), ncclRemoteError);
  CHECK_EQ(mk_result_from_errno(-ENOMEM), ncclSystemError);
  CHECK_EQ(mk_result_from_errno(-EIO), ncclSystemError);
  CHECK_EQ(mk_result_from_errno(-EPROTO), ncclInternalError);

  CHECK_EQ(propagates(-ECONNRESET), -ECONNRESET);
  CHECK_EQ(propagates(0), 7);
  int cleaned = 0;
  CHECK_EQ(propagates_goto(-EIO, &cleaned), -EIO);
  CHECK_EQ(cleaned, 1);
  cleaned = 0;
  CHECK_EQ(propagates_goto(0, &cleaned), 7);
  CHECK_EQ(cleaned, 1);
  CHECK_STR(mk_result_string(ncclRemoteError), "remote error");
  return MK_TEST_RESULT();
}
