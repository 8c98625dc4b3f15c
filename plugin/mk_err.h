/*
 * One error model. Internal functions return 0 on success or a negative errno; the edge
 * (the NCCL tables and the ncclMk* calls) turns that into ncclResult_t with
 * mk_result_from_errno. MK_CHECK propagates and leaves one INFO breadcrumb per level, like
 * NCCL's "file:line -> rc" trail.
 *
 * Errno meanings used across the project:
 *   -EINVAL        bad argument from the caller          -> ncclInvalidArgument
 *   -EBADMSG       corrupt or foreign handle/wire data   -> ncclInvalidArgument
 *   -ENOTSUP       valid but unsupported here            -> ncclInvalidUsage
 *   -EAGAIN        resource exhausted, try later         -> ncclInternalError (never leaked)
 *   -ECONNRESET, -EPIPE, -ETIMEDOUT, -ECONNREFUSED,
 *   -EHOSTUNREACH  the peer died or cannot be reached    -> ncclRemoteError
 *   -ENOMEM, -EIO and other system failures              -> ncclSystemError
 */
#ifndef MK_ERR_H_
#define MK_ERR_H_

#include <errno.h>
#include "abi/nccl_types.h"

ncclResult_t mk_result_from_errno(int rc);
const char* mk_result_string(ncclResult_t res);
void mk_err_breadcrumb(const char* file, int line, int rc);

#define MK_CHECK(call)                                   \
  do {                                                   \
    int mk_rc_ = (call);                                 \
    if (mk_rc_ < 0) {                                    \
      mk_err_breadcrumb(__FILE__, __LINE__, mk_rc_);     \
      return mk_rc_;                                     \
    }                                                    \
  } while (0)

#define MK_CHECK_GOTO(call, rc, label)                   \
  do {                                                   \
    (rc) = (call);                                       \
    if ((rc) < 0) {                                      \
      mk_err_breadcrumb(__FILE__, __LINE__, (rc));       \
      goto label;                                        \
    }                                                    \
  } while (0)

#endif /* MK_ERR_H_ */
