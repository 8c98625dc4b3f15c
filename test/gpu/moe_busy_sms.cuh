/*
 * test_moe's busy_sms scenario: the MoE ops finish, correct, while another kernel of the same
 * process holds a quarter of the SMs for the whole call. The dispatch kernel's grid is every
 * SM (one CTA each): before its work was claimed from counters (moe.h) its CTAs waited for
 * the last routing CTA, which could not start while the SMs it needed were held, and the call
 * hung until its bounded waits gave up (first seen with two ranks sharing a GPU under MPS,
 * session 35). The holder (sm_hold.cuh) is released only after both calls have ended. The
 * first calls of the scenario run held: ncclMkCommInit loaded the ops' kernels (a lazy load
 * at a first launch would wait for the holder to end); the test's own kernel between the two
 * calls is loaded here.
 */
#ifndef MK_MOE_BUSY_SMS_CUH_
#define MK_MOE_BUSY_SMS_CUH_

#include "moe_test_common.cuh"
#include "sm_hold.cuh"

static void scenario_busy_sms(struct rank_env* e) {
  cudaFuncAttributes fa;
  CUDA_OK(cudaFuncGetAttributes(&fa, fill_act2_kernel)); /* run_dispatch's, between the calls */
  static const struct moe_case cases[] = {{300, 136, 128, 72, 2, 8, SKEWED}, {4096, 256, 128, 64, 8, 256, UNIFORM}};
  rank_barrier(e->comm, e->stream); /* loads NCCL's kernel before any hold */
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const struct moe_case* c = &cases[i];
    const uint64_t base = g_seed + 3000 + i * 7;
    struct moe_bufs b;
    bufs_alloc(&b, c);
    inputs_fill(e, &b, c, base);
    struct sm_hold h;
    const int started = sm_hold_start(&h, perf_rank_device(e->rank), 1);
    printf("rank %d: %d of %d SMs held\n", e->rank, started, h.sms);
    expect(e, started == h.ctas, "every holding CTA runs before the MoE calls", 0);
    rank_barrier(e->comm, e->stream); /* every rank's holder runs before any rank calls */
    if (started == h.ctas) {
      sm_hold_delay(e->stream, 2000000); /* the calls queued behind work, as in a job */
      run_dispatch(e, &b, c);
      run_combine(e, &b, c);
      CUDA_OK(cudaStreamSynchronize(e->stream));
    }
    expect(e, sm_hold_end(&h) == h.ctas, "the SMs stayed held until both calls had ended", 0);
    check_case(e, &b, c, base, 0);
    bufs_free(&b);
  }
}

#endif /* MK_MOE_BUSY_SMS_CUH_ */
