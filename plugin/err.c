#include "mk_err.h"

#include <string.h>

#include "mk_log.h"

ncclResult_t mk_result_from_errno(int rc) {
  if (rc >= 0) return ncclSuccess;
  switch (-rc) {
    case EINVAL:
    case EBADMSG:
      return ncclInvalidArgument;
    case ENOTSUP:
      return ncclInvalidUsage;
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
      return ncclRemoteError;
    case EAGAIN:
    case EPROTO:
      return ncclInternalError;
    default:
      return ncclSystemError;
  }
}

const char* mk_result_string(ncclResult_t res) {
  switch (res) {
    case ncclSuccess: return "success";
    case ncclUnhandledCudaError: return "unhandled CUDA error";
    case ncclSystemError: return "system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote error";
    case ncclInProgress: return "in progress";
    default: return "unknown result";
  }
}

void mk_err_breadcrumb(const char* file, int line, int rc) {
  MK_INFO(MK_NCCL_SUBSYS_ALL, "%s:%d -> %d (%s)", file, line, rc, strerror(-rc));
}
