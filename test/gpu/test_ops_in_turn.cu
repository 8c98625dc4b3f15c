/*
 * Every fused op on one communicator in turn, as a training step calls them, on 2 ranks (or
 * MK_TEST_RANKS), one process per GPU (perf_launch). The ops share the communicator's
 * workspace, flags and call numbers: an op that read what another op left there, or wrote
 * where another still reads, shows as a wrong output or a timeout here, where each op's own
 * test runs it alone.
 *   training_steps: STEPS steps, each: AllGather+GEMM, the ring attention forward (causal,
 *                   grouped-query, D = 128), GEMM+ReduceScatter, that attention's backward,
 *                   the forward and backward of a non-causal D = 64 case (B = 2), then
 *                   GEMM+AllReduce; every step's inputs its own, all calls on one stream with
 *                   no host wait between them, every rank but 0 a random 0-3 ms late before
 *                   each; then every output of every step against float64, and no
 *                   asynchronous error.
 *   training_steps_busy: the same while another kernel holds three quarters of rank 1's SMs
 *                   and a quarter of the others': rank 1 is still reading in an op when the
 *                   others start the next one and write into its workspace.
 * gpu-check runs both again with the one-kernel backward (NCCL_MK_RA_BWD_ONE_KERNEL=1).
 * usage: test_ops_in_turn <scenario>; exit 77 with fewer than 2 GPUs.
 */
#include <stdlib.h>
#include <unistd.h>

#include "expect.h"
#include "gemm_ops_bufs.cuh"
#include "ring_bwd_bufs.cuh"
#include "scenario_harness.cuh"

enum { STEPS = 3 };

/* Causal with S_local a multiple of 256 (the one-kernel backward takes it), and non-causal. */
static const struct rb_case causal_case = {1, 512, 8, 2, 128, 1}, plain_case = {2, 256, 4, 4, 64, 0};

struct step_bufs {
  struct op_bufs gemm;
  struct rb_bufs causal, plain;
};

/* Every rank but 0, a random 0-3 ms before a call: the ranks reach each op at different times. */
static void maybe_late(const struct rank_env* e) {
  if (e->rank) usleep((useconds_t)(rand() % 3000));
}

/* Call i of a step (STEP_CALLS in all, in the order above). */
enum { STEP_CALLS = 7 };
static ncclResult_t step_call(struct rank_env* e, struct step_bufs* b, struct shape s, int i) {
  switch (i) {
  case 0: return gemm_ops_run(e->comm, e->stream, &b->gemm, s, 0, b->gemm.ag);
  case 1: return rb_fwd(e->comm, e->stream, &b->causal);
  case 2: return gemm_ops_run(e->comm, e->stream, &b->gemm, s, 1, NULL);
  case 3: return rb_bwd(e->comm, e->stream, &b->causal);
  case 4: return rb_fwd(e->comm, e->stream, &b->plain);
  case 5: return rb_bwd(e->comm, e->stream, &b->plain);
  default: return gemm_ops_run(e->comm, e->stream, &b->gemm, s, 2, NULL);
  }
}

static void step_enqueue(struct rank_env* e, struct step_bufs* b, struct shape s) {
  for (int i = 0; i < STEP_CALLS; i++) {
    maybe_late(e);
    NCCL_OK(step_call(e, b, s, i));
  }
}

static void step_check(struct rank_env* e, struct step_bufs* b, struct shape s, uint64_t base, int step) {
  struct check_result r[GEMM_OPS_CHECKS];
  gemm_ops_check_all(&b->gemm, s, base, e->rank, g_nranks, r);
  for (int i = 0; i < GEMM_OPS_CHECKS; i++)
    EXPECT(r[i].pass, "rank %d step %d: %s (rel err %g)", e->rank, step, gemm_ops_check_names[i], r[i].rel);
  char prefix[32];
  snprintf(prefix, sizeof prefix, "step %d: ", step);
  EXPECT(rb_check(&b->causal, prefix), "rank %d step %d: causal ring attention's gradients", e->rank, step);
  EXPECT(rb_check(&b->plain, prefix), "rank %d step %d: non-causal ring attention's gradients", e->rank, step);
}

struct steps_arg {
  struct step_bufs* b;
  struct shape s;
};

static ncclResult_t steps_enqueue(void* env, void* arg) {
  const struct steps_arg* a = (const struct steps_arg*)arg;
  for (int i = 0; i < STEPS; i++) step_enqueue((struct rank_env*)env, &a->b[i], a->s);
  return ncclSuccess;
}

/* The steps; busy: while another kernel holds three quarters of rank 1's SMs and a quarter of
 * the others' (scenario_harness.cuh held_call), so that rank 1 is still reading in an op when
 * the others, done with it, start the next one and write into its workspace. */
static void run_steps(struct rank_env* e, int busy) {
  const struct shape s = {(size_t)1024 * g_nranks, 1024, 1024}; /* on the GEMM ops' overlapped paths */
  static struct step_bufs b[STEPS];
  srand((unsigned)g_seed + e->rank);
  for (int i = 0; i < STEPS; i++) {
    gemm_ops_alloc(&b[i].gemm, s, g_nranks);
    gemm_ops_fill(&b[i].gemm, s, g_seed + 100 + i, e->rank, g_nranks);
    rb_alloc(&b[i].causal, causal_case, e->rank, g_nranks), rb_fill(&b[i].causal, g_seed + 10 * i, 1);
    rb_alloc(&b[i].plain, plain_case, e->rank, g_nranks), rb_fill(&b[i].plain, g_seed + 10 * i + 5, 1);
  }
  struct steps_arg arg = {b, s};
  if (busy) {
    held_call(e, e->rank == 1 ? 3 : 1, steps_enqueue, &arg);
  } else {
    steps_enqueue(e, &arg);
    CUDA_OK(cudaStreamSynchronize(e->stream));
  }
  expect_healthy(e);
  for (int i = 0; i < STEPS; i++) step_check(e, &b[i], s, g_seed + 100 + i, i);
  for (int i = 0; i < STEPS; i++) gemm_ops_free(&b[i].gemm), rb_free(&b[i].causal), rb_free(&b[i].plain);
}

static void scenario_training_steps(struct rank_env* e) { run_steps(e, 0); }
static void scenario_training_steps_busy(struct rank_env* e) { run_steps(e, 1); }

static const struct named_scenario scenarios[] = {
    {"training_steps", scenario_training_steps},
    {"training_steps_busy", scenario_training_steps_busy},
};

int main(int argc, char** argv) {
  return scenario_main(argc, argv, scenarios, (int)(sizeof scenarios / sizeof *scenarios), NULL);
}
