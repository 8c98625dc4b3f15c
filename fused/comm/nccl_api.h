/*
 * NCCL's public functions, resolved at run time from the NCCL already in the process, so
 * the fused ops use the same NCCL that made the caller's communicator (PyTorch brings its
 * own). Only long-stable calls (2.19+) are used. Never linked: the .so must load anywhere.
 */
#ifndef MK_NCCL_API_H_
#define MK_NCCL_API_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#define MK_NCCL_MIN_VERSION 21900 /* 2.19.0 */

struct mk_nccl_api {
  int version; /* NCCL_VERSION_CODE of the library found */
  ncclResult_t (*get_version)(int* version);
  const char* (*get_error_string)(ncclResult_t result);
  ncclResult_t (*comm_count)(const ncclComm_t comm, int* count);
  ncclResult_t (*comm_user_rank)(const ncclComm_t comm, int* rank);
  ncclResult_t (*comm_cu_device)(const ncclComm_t comm, int* device);
  ncclResult_t (*comm_get_async_error)(ncclComm_t comm, ncclResult_t* async_error);
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
  ncclResult_t (*all_gather)(const void* send, void* recv, size_t count, ncclDataType_t type,
                             ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*reduce_scatter)(const void* send, void* recv, size_t count,
                                 ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream);
  ncclResult_t (*all_reduce)(const void* send, void* recv, size_t count, ncclDataType_t type,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
};

/* 0, -ENOTSUP when no NCCL 2.19+ is loaded or loadable (a WARN says which). Resolved once. */
int mk_nccl_api_get(const struct mk_nccl_api** api);

/* NCCL result of a resolved call as negative errno, with a WARN naming the call. */
int mk_nccl_check(ncclResult_t res, const char* what);
/* The same for a call on `comm`, which a non-blocking communicator (ncclConfig_t.blocking = 0,
 * or NCCL_COMM_BLOCKING=0) may answer with ncclInProgress: the call is then finished here by
 * polling ncclCommGetAsyncError, so such a communicator is used as a blocking one (the ops'
 * collectives are enqueued when the op returns, as its caller expects). The wait is unbounded,
 * as NCCL's is; every NCCL_MK_TIMEOUT_MS a WARN names `what` and how long it has waited. */
int mk_nccl_comm_check(const struct mk_nccl_api* api, ncclComm_t comm, ncclResult_t res, const char* what);
/* comm's state as ncclCommGetAsyncError gives it (ncclInProgress while a non-blocking call or
 * init still runs), or that call's own failure. */
ncclResult_t mk_nccl_comm_state(const struct mk_nccl_api* api, ncclComm_t comm);

#endif /* MK_NCCL_API_H_ */
