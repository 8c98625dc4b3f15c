/*
 * ncclTuner_v4_t (NCCL 2.24-2.27), written from ../shared/reference/nccl-abi.md section 2
 * and checked against NVIDIA/nccl's src/include/plugin/tuner/tuner_v4.h. Compared with v5:
 * init takes no comm id, NVL domain info or constants and returns the context last;
 * getCollInfo is identical; destroy instead of finalize.
 */
#ifndef MK_ABI_TUNER_V4_H_
#define MK_ABI_TUNER_V4_H_

#include "tuner_v5.h"

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       void** ctx);
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*destroy)(void* ctx);
} ncclTuner_v4_t;

#endif /* MK_ABI_TUNER_V4_H_ */
