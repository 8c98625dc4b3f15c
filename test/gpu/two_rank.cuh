/*
 * The two-rank harness of the GPU tests that run an op as a collective on 2 GPUs
 * (test_ring_attn, test_ring_attn_bwd), over rank_harness.cuh: each rank runs nccl-mk with the
 * default config (128 MiB of workspace) and the scenario named by argv[1], and reports its
 * failures (expect.h). The scenario "absent_peer" gets NCCL_MK_TIMEOUT_MS = 2000 (rank_harness),
 * so that its bounded waits expire within the test.
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
#include "rank_harness.cuh"

#define TWO_RANK_NR 2

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

static const struct two_rank_scenario* g_two_rank_list;
static int g_two_rank_n;

static int two_rank_run(const char* scenario, int rank, ncclComm_t comm, cudaStream_t stream) {
  struct rank_env e = {rank, comm, stream};
  int found = 0;
  for (int i = 0; i < g_two_rank_n; i++)
    if (!strcmp(scenario, g_two_rank_list[i].name)) g_two_rank_list[i].run(&e), found = 1;
  if (!found) {
    fprintf(stderr, "unknown scenario %s\n", scenario);
    failures++;
  }
  return failures;
}

/* The test's main: argv[1] names a scenario of list (n of them). */
static int two_rank_main(int argc, char** argv, const struct two_rank_scenario* list, int n) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <", argv[0]);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? "|" : "", list[i].name);
    fprintf(stderr, ">\n");
    return 2;
  }
  g_two_rank_list = list, g_two_rank_n = n;
  static const struct rank_harness h = {TWO_RANK_NR, NULL, NULL, two_rank_run};
  return rank_harness_main(argc, argv, &h);
}

#endif /* MK_TWO_RANK_CUH_ */
