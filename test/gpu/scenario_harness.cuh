/*
 * Named scenarios over rank_harness.cuh for the GPU tests that run an op as a collective
 * (test_ring_attn, test_ring_attn_bwd): each rank runs nccl-mk with the default config (128
 * MiB of workspace) or the test's changes to it (config, optional) and the scenario named by
 * argv[1], and reports its failures (expect.h).
 * 2 ranks, or MK_TEST_RANKS (g_nranks); "absent_peer" and "absent_peer_noncausal" (rank 1 stays
 * away) are 2-rank scenarios and skip above; they and "late_peer*" (the ranks but 0 come late)
 * get NCCL_MK_TIMEOUT_MS = 2000 (rank_harness), so that their bounded waits expire within the
 * test.
 */
#ifndef MK_SCENARIO_HARNESS_CUH_
#define MK_SCENARIO_HARNESS_CUH_

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

static int g_nranks = 2; /* set by scenario_main */

struct rank_env {
  int rank;
  ncclComm_t comm;
  cudaStream_t stream;
};

struct named_scenario {
  const char* name;
  void (*run)(struct rank_env* e);
};

/* Every rank meets (rank_harness.cuh's rank_barrier). */
static void ranks_barrier(struct rank_env* e) { rank_barrier(e->comm, e->stream); }

/* The communicator reports no asynchronous error. */
static void expect_healthy(struct rank_env* e) {
  ncclResult_t async = ncclSuccess;
  char msg[256] = "";
  NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof msg));
  EXPECT(async == ncclSuccess, "rank %d: asynchronous error: %s", e->rank, msg);
}

/* rank_held_call (rank_harness.cuh) with env = e, judged: no error, the SMs held throughout. */
static struct held_call held_call(struct rank_env* e, int held_of_4, ncclResult_t (*call)(void* e, void* arg),
                                  void* arg) {
  const struct held_call r = rank_held_call(e->rank, e->comm, e->stream, held_of_4, call, e, arg);
  EXPECT(r.result == ncclSuccess && r.started == r.ctas && r.held == r.ctas,
         "rank %d: call %d, %d of %d SMs held, %d to the end", e->rank, (int)r.result, r.started, r.ctas, r.held);
  return r;
}

static const struct named_scenario* g_scenarios;
static int g_nscenarios;

static int scenario_run(const char* scenario, int rank, ncclComm_t comm, cudaStream_t stream) {
  struct rank_env e = {rank, comm, stream};
  int found = 0;
  for (int i = 0; i < g_nscenarios; i++)
    if (!strcmp(scenario, g_scenarios[i].name)) g_scenarios[i].run(&e), found = 1;
  if (!found) {
    fprintf(stderr, "unknown scenario %s\n", scenario);
    failures++;
  }
  return failures;
}

/* The test's main: argv[1] names a scenario of list (n of them); config (or NULL) changes the
 * default ncclMkConfig, once g_nranks is known. */
static int scenario_main(int argc, char** argv, const struct named_scenario* list, int n,
                         void (*config)(const char* scenario, ncclMkConfig* cfg)) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <", argv[0]);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? "|" : "", list[i].name);
    fprintf(stderr, ">\n");
    return 2;
  }
  g_scenarios = list, g_nscenarios = n;
  g_nranks = test_ranks();
  static const char* const two_rank_only[] = {"absent_peer", "absent_peer_noncausal", "one_kernel_absent_owner", NULL};
  const struct rank_harness h = {g_nranks, NULL, config, two_rank_only, scenario_run, NULL};
  return rank_harness_main(argc, argv, &h);
}

#endif /* MK_SCENARIO_HARNESS_CUH_ */
