/*
 * One process per GPU for the GPU tests that run an op as a collective (test_fused_ops,
 * test_moe, and through scenario_harness.cuh test_ring_attn and test_ring_attn_bwd). The binary
 * relaunches itself, one process per GPU (perf_launch.h; exit 77 with fewer GPUs, unless
 * MK_SHARE_GPU=1 puts the ranks on shared GPUs: under scripts/mps.sh, or time-sliced without
 * MPS), and each child opens its rank the same way: the scenario's environment, its device, a
 * stream, NCCL, nccl-mk with the test's config; runs the scenario; closes the rank. What the
 * tests differ in is struct rank_harness. Scenario names with rules of their own: absent_peer*
 * and late_peer* (2 s waits), busy_sms* (5 s), peer_dies* (rank_peer_dies_mid_call: 5 s, 2
 * ranks, not under MPS).
 */
#ifndef MK_RANK_HARNESS_CUH_
#define MK_RANK_HARNESS_CUH_

#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gemm_check.cuh"
#include "nccl_mk.h"
#include "nccl_ok.h"
#include "perf_launch.h"
#include "sm_hold.cuh"

static uint64_t g_seed; /* from the NCCL id: fresh each run, the same on every rank, printed */

/* The barrier's element: a device global, one per device, so that a barrier allocates and
 * frees nothing (cudaFree waits for every kernel on the device: busy_sms's holder). */
static __device__ double rank_barrier_word;

/* Every rank of comm meets, its legacy-stream work (set-up) done: a one-element all-reduce on
 * the stream, then a sync. */
static void rank_barrier(ncclComm_t comm, cudaStream_t stream) {
  legacy_stream_done();
  double* one;
  CUDA_OK(cudaGetSymbolAddress((void**)&one, rank_barrier_word));
  NCCL_OK(ncclAllReduce(one, one, 1, ncclFloat64, ncclSum, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
}

/* What rank_held_call saw; the caller judges it. */
struct held_call {
  ncclResult_t result; /* call's (ncclSuccess when the holder did not start: not called) */
  int started, held;   /* the holder's CTAs running before the call, and until its end */
  int ctas, sms;       /* the holder's CTAs; the SMs the device reports (under MPS: the client's) */
  double ms;           /* the call, to its stream's end */
};

/* call(env, arg), which enqueues an op on `stream`, while held_of_4 quarters of this rank's SMs
 * are held by another kernel (sm_hold.cuh); synchronous. Every rank meets first (which also
 * loads NCCL's kernel: a lazy load during the hold would wait for the holder) and again once
 * its holder runs (else a rank whose holder still waits for SMs that the others' calls hold
 * while they wait for it starts late); the op then queues behind 2 ms of other work, as in a
 * job (kernels it forks onto two streams become ready together). */
static struct held_call rank_held_call(int rank, ncclComm_t comm, cudaStream_t stream, int held_of_4,
                                       ncclResult_t (*call)(void* env, void* arg), void* env, void* arg) {
  struct held_call r = {ncclSuccess, 0, 0, 0, 0, 0.0};
  struct sm_hold h;
  rank_barrier(comm, stream);
  r.started = sm_hold_start(&h, perf_rank_device(rank), held_of_4);
  r.ctas = h.ctas, r.sms = h.sms;
  rank_barrier(comm, stream);
  const double t0 = sm_hold_now_ms();
  sm_hold_delay(stream, 2000000);
  if (r.started == h.ctas) r.result = call(env, arg);
  CUDA_OK(cudaStreamSynchronize(stream));
  r.ms = sm_hold_now_ms() - t0;
  r.held = sm_hold_end(&h);
  return r;
}

/* call(env, arg)'s outcome on `stream`: its error at launch, else the asynchronous error once
 * the stream is done (its text in msg). */
static ncclResult_t rank_call_outcome(ncclComm_t comm, cudaStream_t stream, ncclResult_t (*call)(void* env, void* arg),
                                      void* env, void* arg, char* msg, size_t len) {
  ncclResult_t r = call(env, arg);
  msg[0] = '\0';
  if (r == ncclSuccess) {
    CUDA_OK(cudaStreamSynchronize(stream));
    NCCL_OK(ncclMkCommGetAsyncError(comm, &r, msg, len));
  }
  return r;
}

/* Ends rank 0's process after its peer died: the release is bounded (the peer's goodbye never
 * comes), NCCL's communicator is aborted (destroying it would wait for the peer). */
static void rank_exit_after_peer_death(ncclComm_t comm, const char* scenario, int failures) {
  NCCL_OK(ncclMkCommRelease(comm));
  ncclCommAbort(comm);
  printf("rank 0: %s: %d failure(s)\n", scenario, failures);
  fflush(stdout);
  _exit(failures ? 1 : 0);
}

/* A rank dying mid-call, for scenarios named "peer_dies*" (2 ranks, not under MPS, 5 s waits:
 * rank_harness_main and rank_harness_child see to it). Rank 1
 * enqueues call(env, arg) and its process exits 0.2 s later with the kernel in flight; rank 0
 * calls 0.5 s in, then again. Rank 0's first outcome must be success (the peer's data arrived
 * before it died) or ncclRemoteError, its second ncclRemoteError, and its GPU must stay healthy
 * (a dead process's memory stays mapped: bench/probes/ipc_peer_death.cu). Neither rank returns:
 * rank 0 exits with `failures` plus this check's. */
static void rank_peer_dies_mid_call(int rank, ncclComm_t comm, cudaStream_t stream, const char* scenario,
                                    ncclResult_t (*call)(void* env, void* arg), void* env, void* arg, int failures) {
  if (rank == 1) {
    const ncclResult_t r = call(env, arg);
    usleep(200 * 1000);
    printf("rank 1: call returned %d, exiting with its kernel in flight\n", (int)r);
    fflush(stdout);
    _exit(r == ncclSuccess ? 0 : 1);
  }
  usleep(500 * 1000);
  char msg[256];
  for (int i = 0; i < 2; i++) {
    const ncclResult_t r = rank_call_outcome(comm, stream, call, env, arg, msg, sizeof msg);
    printf("rank 0: call %d after the peer died: %d %s\n", i, (int)r, msg);
    if (r != ncclRemoteError && (i == 1 || r != ncclSuccess)) {
      fprintf(stderr, "FAIL: rank 0's call %d ended in %d, not %sncclRemoteError\n", i, (int)r, i ? "" : "success or ");
      failures++;
    }
  }
  double* word;
  CUDA_OK(cudaGetSymbolAddress((void**)&word, rank_barrier_word));
  const cudaError_t health = cudaMemsetAsync(word, 0, sizeof(double), stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  if (health != cudaSuccess || sync != cudaSuccess) {
    fprintf(stderr, "FAIL: rank 0's GPU after its peer died: %s\n", cudaGetErrorString(health ? health : sync));
    failures++;
  }
  rank_exit_after_peer_death(comm, scenario, failures);
}

/* One op for rank_late_peer: call enqueues it (its launch error returned), fill gives every
 * rank fresh inputs (synchronous, this rank's own work: no collective), check says whether the
 * output is right for the inputs of the last fill (1) and reports what is wrong (0). */
struct rank_late_op {
  ncclResult_t (*call)(void* env, void* arg);
  void (*fill)(void* env, void* arg);
  int (*check)(void* env, void* arg);
  void (*judge_record)(const char* msg); /* optional: the test's checks of an error's text */
  /* optional, synchronous: the collectives the fresh inputs need before the call (the forward
   * before a backward, the dispatch before a combine), started on every rank together */
  void (*setup)(void* env, void* arg);
};

/* Fresh inputs on every rank, lined up: a fill takes the ranks different times (a float64
 * reference: seconds at 4 ranks on one GPU, session 46), and whatever follows waits only 2 s
 * for its peers; so a barrier before and after the fill, and after the setup. */
static void rank_late_refill(ncclComm_t comm, cudaStream_t stream, const struct rank_late_op* op, void* env,
                             void* arg) {
  rank_barrier(comm, stream);
  op->fill(env, arg);
  rank_barrier(comm, stream);
  if (!op->setup) return;
  op->setup(env, arg);
  rank_barrier(comm, stream);
}

/* A late peer, for scenarios named "late_peer*" (2 s waits: rank_harness_child). The ranks
 * other than 0 are late, not dead: every rank runs one completed, checked call; then fresh
 * inputs; rank 0 calls alone and must end in ncclRemoteError, its record saying what it timed
 * out on; then the others call together. Rank 0 gave up, so each of them must end in
 * ncclRemoteError as well, or succeed with the right output: never succeed with data that rank
 * 0's call skipped or an earlier call left (session 44 found the ring backward and the MoE
 * combine doing that). Fresh inputs come through rank_late_refill: a check or fill that takes
 * one rank longer (4 ranks on one GPU) must not look like a late peer. Returns the failures. */
static int rank_late_peer(int rank, ncclComm_t comm, cudaStream_t stream, const struct rank_late_op* op, void* env,
                          void* arg) {
  int failures = 0;
  char msg[256];
  rank_late_refill(comm, stream, op, env, arg);
  ncclResult_t r = rank_call_outcome(comm, stream, op->call, env, arg, msg, sizeof msg);
  if (r != ncclSuccess || !op->check(env, arg)) {
    fprintf(stderr, "FAIL: rank %d: the completed call before the late one: %d %s\n", rank, (int)r, msg);
    return 1;
  }
  rank_late_refill(comm, stream, op, env, arg);
  if (rank == 0) {
    r = rank_call_outcome(comm, stream, op->call, env, arg, msg, sizeof msg);
    printf("rank 0, alone: %d %s\n", (int)r, msg);
    if (r != ncclRemoteError || !strstr(msg, "timed out")) {
      fprintf(stderr, "FAIL: rank 0's call without its peers ended in %d (%s), not a timeout's ncclRemoteError\n",
              (int)r, msg);
      failures++;
    }
    if (op->judge_record) op->judge_record(msg);
  }
  rank_barrier(comm, stream); /* the others call once rank 0's call has ended */
  if (rank != 0) {
    r = rank_call_outcome(comm, stream, op->call, env, arg, msg, sizeof msg);
    printf("rank %d, late: %d %s\n", rank, (int)r, msg);
    if (r == ncclSuccess && !op->check(env, arg)) {
      fprintf(stderr, "FAIL: rank %d's late call succeeded with a wrong output\n", rank);
      failures++;
    } else if (r != ncclSuccess && r != ncclRemoteError) {
      fprintf(stderr, "FAIL: rank %d's late call ended in %d, not success or ncclRemoteError\n", rank, (int)r);
      failures++;
    }
    if (r != ncclSuccess && op->judge_record) op->judge_record(msg);
  }
  rank_barrier(comm, stream);
  return failures;
}

/* The ranks a test runs: 2, or MK_TEST_RANKS (2 to 8; exits 2 otherwise). */
static int test_ranks(void) {
  const char* v = getenv("MK_TEST_RANKS");
  int n = v ? atoi(v) : 2;
  if (n < 2 || n > 8) {
    fprintf(stderr, "MK_TEST_RANKS=%s: 2 to 8 ranks\n", v);
    exit(2);
  }
  return n;
}

/* A scenario of ncclMkCommInit itself: rank 1's config makes its init fail (a workspace no GPU
 * has), be refused (comm_sms -1) or differ from the others' (max_m). */
enum rank_init_fault { RANK_INIT_FAILS, RANK_INIT_REFUSED, RANK_INIT_DIFFERS };

/* Every rank's init must then fail, none left waiting in the exchange: rank 1 with its own
 * error, the others with ncclRemoteError (ncclInvalidArgument when the configs differ); then
 * every rank inits again with the good config, which must work (a failed init leaves nothing
 * behind). Returns the failures. */
static int rank_init_fails(enum rank_init_fault fault, int rank, ncclComm_t comm, const ncclMkConfig* good) {
  ncclMkConfig cfg = *good;
  ncclResult_t own = ncclSystemError, peers = ncclRemoteError;
  if (fault == RANK_INIT_FAILS && rank == 1) cfg.max_m = (size_t)1 << 22, cfg.max_n = (size_t)1 << 22; /* 32 TiB */
  if (fault == RANK_INIT_REFUSED) own = ncclInvalidArgument;
  if (fault == RANK_INIT_REFUSED && rank == 1) cfg.comm_sms = -1;
  if (fault == RANK_INIT_DIFFERS) own = peers = ncclInvalidArgument;
  if (fault == RANK_INIT_DIFFERS && rank == 1) cfg.max_m *= 2;
  const ncclResult_t r = ncclMkCommInit(comm, &cfg), want = rank == 1 ? own : peers;
  printf("rank %d: ncclMkCommInit returned %d (%s)\n", rank, (int)r, ncclGetErrorString(r));
  int failures = 0;
  if (r != want) {
    fprintf(stderr, "FAIL: rank %d: ncclMkCommInit returned %d, not %d\n", rank, (int)r, (int)want);
    failures++;
  }
  if (r == ncclSuccess) NCCL_OK(ncclMkCommRelease(comm));
  NCCL_OK(ncclMkCommInit(comm, good));
  NCCL_OK(ncclMkCommRelease(comm));
  return failures;
}

struct rank_harness {
  int nranks;
  /* Optional: the scenario's environment (shorter timeouts, planted faults), set before
   * anything is opened; "absent_peer*" and "late_peer*" always get NCCL_MK_TIMEOUT_MS = 2000,
   * "busy_sms*" 5000. */
  void (*scenario_env)(const char* scenario, int rank);
  /* Optional: the test's changes to the default ncclMkConfig (the shapes to prepare for). */
  void (*config)(const char* scenario, ncclMkConfig* cfg);
  /* Optional, NULL-terminated: scenarios that plant their fault on rank 1 and check rank 0
   * alone; above 2 ranks they are skipped (exit 77). */
  const char* const* two_rank_only;
  /* The scenario on the opened rank; returns its failure count. */
  int (*run)(const char* scenario, int rank, ncclComm_t comm, cudaStream_t stream);
  /* Optional: a scenario of ncclMkCommInit itself, run in place of the init and `run`
   * (rank_init_fails); returns its failure count, or -1 when `scenario` is not one. */
  int (*init_scenario)(const char* scenario, int rank, ncclComm_t comm, const ncclMkConfig* cfg);
};

/* An MPS control daemon is listening where this process's CUDA would connect to it. */
static int rank_harness_under_mps(void) {
  const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  char path[512];
  snprintf(path, sizeof path, "%s/control", dir && *dir ? dir : "/tmp/nvidia-mps");
  struct stat st;
  return stat(path, &st) == 0;
}

static int rank_harness_child(const struct rank_harness* h, const char* scenario, int rank,
                              const ncclUniqueId* id) {
  printf("rank %d: %s, seed %llu\n", rank, scenario, (unsigned long long)g_seed);
  /* every test's "absent_peer*" and "late_peer*" (a rank that never calls, or calls late): the
   * bounded waits expire in 2 s */
  if (!strncmp(scenario, "absent_peer", 11) || !strncmp(scenario, "late_peer", 9))
    setenv("NCCL_MK_TIMEOUT_MS", "2000", 1);
  /* "late_peer*": every kernel loaded before the first call, not by it (lazy loading), so that
   * one rank's slower load is not taken for lateness (session 46: 4 ranks on one GPU, a rank's
   * first ring forward over 2 s behind its peers'). Read at CUDA's initialisation, below. */
  if (!strncmp(scenario, "late_peer", 9)) setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  /* "busy_sms*" (sm_hold.cuh): a hang ends well before the holder's 30 s */
  if (!strncmp(scenario, "busy_sms", 8)) setenv("NCCL_MK_TIMEOUT_MS", "5000", 1);
  /* "peer_dies*": rank 0's second call times out within the test */
  if (!strncmp(scenario, "peer_dies", 9)) setenv("NCCL_MK_TIMEOUT_MS", "5000", 1);
  if (h->scenario_env) h->scenario_env(scenario, rank);
  ncclComm_t comm;
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(perf_rank_device(rank)));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  NCCL_OK(ncclCommInitRank(&comm, h->nranks, *id, rank));
  ncclMkConfig cfg;
  NCCL_OK(ncclMkConfigDefaults(&cfg));
  if (h->config) h->config(scenario, &cfg);
  int failures = h->init_scenario ? h->init_scenario(scenario, rank, comm, &cfg) : -1;
  if (failures < 0) {
    NCCL_OK(ncclMkCommInit(comm, &cfg));
    failures = h->run(scenario, rank, comm, stream);
    NCCL_OK(ncclMkCommRelease(comm));
  }
  ncclCommDestroy(comm);
  printf("rank %d: %s: %d failure(s)\n", rank, scenario, failures);
  return failures ? 1 : 0;
}

/* The test's main once it has checked argv[1]: a child ("<scenario> -P rank -I id") runs its
 * rank; the launcher starts h->nranks of them. */
static int rank_harness_main(int argc, char** argv, const struct rank_harness* h) {
  alarm(300); /* a bug must not hang the suite */
  /* each line as it is printed: a rank killed by a step's timeout (timeout(1), the alarm)
   * otherwise loses everything still in its buffer, and its log says nothing of how far it got */
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (const char* const* s = h->two_rank_only; h->nranks > 2 && s && *s; s++)
    if (!strcmp(argv[1], *s)) {
      printf("SKIP: %s is a 2-rank scenario (MK_TEST_RANKS=%d)\n", argv[1], h->nranks);
      return 77;
    }
  /* every test's "peer_dies*" (rank_peer_dies_mid_call): 2 ranks, and not under MPS, where a
   * client dying with a kernel in flight faults every client (bench/probes/ipc_peer_death.cu) */
  if (!strncmp(argv[1], "peer_dies", 9) && (h->nranks > 2 || rank_harness_under_mps())) {
    printf("SKIP: %s kills rank 1 with its kernel in flight: 2 ranks, not under MPS (which faults every client)\n",
           argv[1]);
    return 77;
  }
  ncclUniqueId id;
  int rank;
  if (perf_test_child(argc, argv, &rank, &id)) {
    g_seed = perf_seed_from_id(argv[5]);
    return rank_harness_child(h, argv[1], rank, &id);
  }
  gpus_or_skip(perf_gpus_needed(h->nranks));
  return perf_launch_local(2, argv, h->nranks, 0);
}

#endif /* MK_RANK_HARNESS_CUH_ */
