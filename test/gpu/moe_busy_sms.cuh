/*
 * test_moe's busy_sms scenario: the MoE ops finish, correct, while another kernel of the same
 * process holds a quarter of the SMs for the whole call. The dispatch kernel's grid is every
 * SM (one CTA each): before its work was claimed from counters (moe.h) its CTAs waited for
 * the last routing CTA, which could not start while the SMs it needed were held, and the call
 * hung until its bounded waits gave up (first seen with two ranks sharing a GPU under MPS,
 * session 35). Both calls run inside one rank_held_call (rank_harness.cuh), whose holder is
 * released only after both have ended. The first calls of the scenario run held:
 * ncclMkCommInit loaded the ops' kernels (a lazy load at a first launch would wait for the
 * holder to end); the test's own kernel between the two calls is loaded here.
 */
#ifndef MK_MOE_BUSY_SMS_CUH_
#define MK_MOE_BUSY_SMS_CUH_

#include "moe_test_common.cuh"
#include "rank_harness.cuh"

struct held_moe {
  struct moe_bufs* b;
  const struct moe_case* c;
};

static ncclResult_t held_moe_run(void* e, void* arg) {
  const struct held_moe* h = (const struct held_moe*)arg;
  run_dispatch((struct rank_env*)e, h->b, h->c);
  run_combine((struct rank_env*)e, h->b, h->c);
  return ncclSuccess;
}

static void scenario_busy_sms(struct rank_env* e) {
  cudaFuncAttributes fa;
  CUDA_OK(cudaFuncGetAttributes(&fa, fill_act2_kernel)); /* run_dispatch's, between the calls */
  static const struct moe_case cases[] = {{300, 136, 128, 72, 2, 8, SKEWED}, {4096, 256, 128, 64, 8, 256, UNIFORM}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const struct moe_case* c = &cases[i];
    const uint64_t base = g_seed + 3000 + i * 7;
    struct moe_bufs b;
    bufs_alloc(&b, c);
    inputs_fill(e, &b, c, base);
    struct held_moe arg = {&b, c};
    const struct held_call h = rank_held_call(e->rank, e->comm, e->stream, 1, held_moe_run, e, &arg);
    printf("rank %d: %d of %d SMs held\n", e->rank, h.started, h.sms);
    expect(e, h.started == h.ctas, "every holding CTA runs before the MoE calls", 0);
    expect(e, h.held == h.ctas, "the SMs stayed held until both calls had ended", 0);
    check_case(e, &b, c, base, 0);
    bufs_free(&b);
  }
}

#endif /* MK_MOE_BUSY_SMS_CUH_ */
