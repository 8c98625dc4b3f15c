/*
 * nccl-mk public API.
 *
 * libnccl-net-mk.so is loaded by NCCL as a net plugin (NCCL_NET_PLUGIN=mk) and, from the
 * same file, offers the fused communication + computation operations declared here.
 * Everything else in the library is private.
 *
 * Every call returns ncclResult_t: ncclSuccess, or the reason it failed, with a one-line
 * WARN through NCCL's logger (NCCL_DEBUG=WARN) naming the argument or the cause.
 */
#ifndef NCCL_MK_H_
#define NCCL_MK_H_

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_MK_VERSION_MAJOR 0
#define NCCL_MK_VERSION_MINOR 1
#define NCCL_MK_VERSION_PATCH 0
#define NCCL_MK_VERSION_CODE(maj, min, pat) ((maj) * 10000 + (min) * 100 + (pat))
#define NCCL_MK_VERSION \
  NCCL_MK_VERSION_CODE(NCCL_MK_VERSION_MAJOR, NCCL_MK_VERSION_MINOR, NCCL_MK_VERSION_PATCH)

#if defined(__GNUC__)
#define NCCL_MK_API __attribute__((visibility("default")))
#else
#define NCCL_MK_API
#endif

/*
 * ncclMkGetVersion: the library's version as NCCL_MK_VERSION_CODE(major, minor, patch).
 * Returns ncclSuccess, or ncclInvalidArgument if version is NULL.
 */
NCCL_MK_API ncclResult_t ncclMkGetVersion(int* version);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_MK_H_ */
