#include "nccl_mk.h"

#include "mk_log.h"

NCCL_MK_API ncclResult_t ncclMkGetVersion(int* version) {
  if (!version) {
    MK_WARN("ncclMkGetVersion: version is NULL");
    return ncclInvalidArgument;
  }
  *version = NCCL_MK_VERSION;
  return ncclSuccess;
}
