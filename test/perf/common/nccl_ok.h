/* NCCL_OK for the GPU tests and fused harnesses: an NCCL call that fails ends the process with
 * file:line, the call and NCCL's message (a rank that goes on would hang its peers). */
#ifndef MK_NCCL_OK_H_
#define MK_NCCL_OK_H_

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define NCCL_OK(call)                                                                        \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    if (r_ != ncclSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

#endif /* MK_NCCL_OK_H_ */
