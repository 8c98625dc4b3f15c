/*
 * ncclTuner_v5_t (NCCL 2.28 and later; 2.30 still loads it), written from
 * ../shared/reference/nccl-abi.md section 2 and checked against NVIDIA/nccl's
 * src/include/plugin/tuner/tuner_v5.h and nccl_common.h. Never include NCCL internals.
 *
 * The cost table NCCL hands to getCollInfo is a float[numAlgo][numProto] array (7 x 3 in
 * 2.24-2.28) cast to float**: index it as a flat row-major array, never dereference the
 * "pointers". NCCL pre-fills predicted times in microseconds, marks cells it will not run
 * with NCCL_ALGO_PROTO_IGNORE, and takes the minimum after the call, so 0.0 forces a cell.
 */
#ifndef MK_ABI_TUNER_V5_H_
#define MK_ABI_TUNER_V5_H_

#include "nccl_types.h"

/* Collective kinds. Only the first five reach a tuner; the rest are listed for range checks. */
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
  ncclFuncAlltoAll = 8,
  ncclFuncScatter = 9,
  ncclFuncGather = 10
} ncclFunc_t;
#define MK_TUNER_NUM_COLLS 5 /* broadcast .. allreduce: the collectives NCCL tunes */

#define NCCL_ALGO_UNDEF (-1)
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6
#define NCCL_NUM_ALGORITHMS_V5 7

#define NCCL_PROTO_UNDEF (-1)
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_NUM_PROTOCOLS_V5 3

/* "NCCL will not use this algorithm/protocol here": never turn such a cell on. */
#define NCCL_ALGO_PROTO_IGNORE (-1.0)

#define NCCL_NUM_HW_LINKS_V5 3    /* NVLINK 0, PCI 1, NET 2 */
#define NCCL_NUM_COMPCAPS_V5 4    /* Volta, Ampere, Hopper, Blackwell */
#define NCCL_NUM_TUNING_SCALES_V5 3 /* 1, 2, 4 nodes */

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

/* NCCL's cost-model constants; init may edit them before NCCL builds its model. */
typedef struct {
  double baseLatencies[NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double hwLatencies[NCCL_NUM_HW_LINKS_V5][NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double llMaxBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
} ncclTunerConstants_v5_t;

typedef struct {
  const char* name;
  /* Per communicator. constants is in/out and may be NULL. */
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t* nvlDomainInfo,
                       ncclTunerConstants_v5_t* constants);
  /* NCCL 2.28 fails the collective on anything but ncclSuccess (NCCLCHECK around the call),
   * although the upstream header promises a fallback: always return ncclSuccess. */
  ncclResult_t (*getCollInfo)(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff,
                              int* nChannels);
  ncclResult_t (*finalize)(void* ctx);
} ncclTuner_v5_t;

#endif /* MK_ABI_TUNER_V5_H_ */
