/*
 * The two-rank harness of the GPU tests that run an op as a collective on 2 GPUs
 * (test_ring_attn, test_ring_attn_bwd): the binary relaunches itself, one process per GPU
 * (perf_launch.h; exit 77 with fewer GPUs); each rank sets its device, inits NCCL and
 * nccl-mk (the default config: 128 MiB of workspace), runs the scenario named by argv[1]
 * and reports its failures (expect.h). The scenario "absent_peer" gets NCCL_MK_TIMEOUT_MS =
 * 2000, so that its bounded waits expire within the test.
 */
#ifndef MK_TWO_RANK_CUH_
#define MK_TWO_RANK_CUH_

#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expect.h"
#include "gemm_check.cuh"
#include "nccl_mk.h"
#include "nccl_ok.h"
#include "perf_launch.h"

#define TWO_RANK_NR 2

static uint64_t g_seed; /* from the launcher's id: the same on both ranks */

struct rank_env {
  int rank;
  ncclComm_t comm;
  cudaStream_t stream;
};

struct two_rank_scenario {
  const char* name;
  void (*run)(struct rank_env* e);
};

/* Both ranks meet (a one-element all-reduce on the stream, then a sync). */
static void two_rank_barrier(struct rank_env* e) {
  double* one;
  CUDA_OK(cudaMalloc(&one, sizeof(double)));
  NCCL_OK(ncclAllReduce(one, one, 1, ncclFloat64, ncclSum, e->comm, e->stream));
  CUDA_OK(cudaStreamSynchronize(e->stream));
  cudaFree(one);
}

/* The communicator reports no asynchronous error. */
static void expect_healthy(struct rank_env* e) {
  ncclResult_t async = ncclSuccess;
  char msg[256] = "";
  NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof msg));
  EXPECT(async == ncclSuccess, "rank %d: asynchronous error: %s", e->rank, msg);
}

static int two_rank_rank_main(const struct two_rank_scenario* list, int n, const char* scenario, int rank,
                              const ncclUniqueId* id) {
  struct rank_env e = {rank, NULL, NULL};
  printf("rank %d: %s, seed %llu\n", rank, scenario, (unsigned long long)g_seed);
  if (!strcmp(scenario, "absent_peer")) setenv("NCCL_MK_TIMEOUT_MS", "2000", 1);
  CUDA_OK(cudaSetDevice(rank));
  CUDA_OK(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
  NCCL_OK(ncclCommInitRank(&e.comm, TWO_RANK_NR, *id, rank));
  ncclMkConfig cfg;
  NCCL_OK(ncclMkConfigDefaults(&cfg));
  NCCL_OK(ncclMkCommInit(e.comm, &cfg));
  int found = 0;
  for (int i = 0; i < n; i++)
    if (!strcmp(scenario, list[i].name)) list[i].run(&e), found = 1;
  if (!found) {
    fprintf(stderr, "unknown scenario %s\n", scenario);
    failures++;
  }
  NCCL_OK(ncclMkCommRelease(e.comm));
  ncclCommDestroy(e.comm);
  printf("rank %d: %s: %d failure(s)\n", rank, scenario, failures);
  return failures ? 1 : 0;
}

/* The test's main: argv[1] names a scenario of list (n of them). */
static int two_rank_main(int argc, char** argv, const struct two_rank_scenario* list, int n) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <", argv[0]);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? "|" : "", list[i].name);
    fprintf(stderr, ">\n");
    return 2;
  }
  alarm(300); /* a bug must not hang the suite */
  ncclUniqueId id;
  int rank;
  if (perf_test_child(argc, argv, &rank, &id)) {
    g_seed = perf_seed_from_id(argv[5]);
    return two_rank_rank_main(list, n, argv[1], rank, &id);
  }
  gpus_or_skip(TWO_RANK_NR);
  return perf_launch_local(2, argv, TWO_RANK_NR, 0);
}

#endif /* MK_TWO_RANK_CUH_ */
