/*
 * test_moe's busy_sms scenario: the MoE ops finish, correct, while another kernel of the same
 * process holds a quarter of the SMs for the whole call. The dispatch kernel's grid is every
 * SM (one CTA each): before its work was claimed from counters (moe.h) its CTAs waited for
 * the last routing CTA, which could not start while the SMs it needed were held, and the call
 * hung until its bounded waits gave up (first seen with two ranks sharing a GPU under MPS,
 * session 35). The holder is released only after both calls have ended. Each case runs once
 * unheld first: with CUDA's lazy loading, a kernel's first launch waits for the kernels
 * running in the context (here the holder) to end, as NCCL's do (bench/NOTES.md, session 36).
 */
#ifndef MK_MOE_BUSY_SMS_CUH_
#define MK_MOE_BUSY_SMS_CUH_

#include "moe_test_common.cuh"
#include "ptx.cuh"

#define SM_HOLD_SMEM (200 << 10) /* one CTA per SM: two do not fit in 228 KB */

/* One CTA on one SM until *release (host memory) or limit_ns; *released counts the CTAs
 * that saw the release (the others gave up: the SMs were not held to the end). */
static __global__ void sm_hold_kernel(unsigned* started, const volatile unsigned* release, unsigned* released,
                                      unsigned long long limit_ns) {
  extern __shared__ char hold_smem[];
  if (threadIdx.x) return;
  hold_smem[0] = 1;
  atomicAdd(started, 1u);
  __threadfence_system();
  const unsigned long long t0 = globaltimer_ns();
  while (!*release && globaltimer_ns() - t0 < limit_ns) __nanosleep(2000);
  if (*release) atomicAdd(released, 1u);
}

struct sm_hold {
  unsigned* flags; /* mapped host memory: started, release, released */
  cudaStream_t stream;
  int ctas;
};

/* Starts the holder on a quarter of the SMs and waits (up to 5 s) until every CTA runs. */
static int sm_hold_start(struct rank_env* e, struct sm_hold* h) {
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, perf_rank_device(e->rank)));
  h->ctas = sms / 4;
  CUDA_OK(cudaHostAlloc((void**)&h->flags, 3 * sizeof(unsigned), cudaHostAllocMapped));
  memset(h->flags, 0, 3 * sizeof(unsigned));
  CUDA_OK(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking));
  CUDA_OK(cudaFuncSetAttribute(sm_hold_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SM_HOLD_SMEM));
  unsigned* dev;
  CUDA_OK(cudaHostGetDevicePointer((void**)&dev, h->flags, 0));
  sm_hold_kernel<<<h->ctas, 32, SM_HOLD_SMEM, h->stream>>>(dev, dev + 1, dev + 2, 30000000000ull);
  CUDA_OK(cudaGetLastError());
  for (int ms = 0; ms < 5000 && *(volatile unsigned*)&h->flags[0] < (unsigned)h->ctas; ms++) usleep(1000);
  const unsigned started = *(volatile unsigned*)&h->flags[0];
  printf("rank %d: %u of %d SMs held\n", e->rank, started, sms);
  expect(e, started == (unsigned)h->ctas, "every holding CTA runs before the MoE calls", 0);
  return started == (unsigned)h->ctas;
}

/* Releases the holder; every CTA must have held its SM until now. */
static void sm_hold_end(struct rank_env* e, struct sm_hold* h) {
  *(volatile unsigned*)&h->flags[1] = 1;
  CUDA_OK(cudaStreamSynchronize(h->stream));
  expect(e, h->flags[2] == (unsigned)h->ctas, "the SMs stayed held until both calls had ended", 0);
  CUDA_OK(cudaStreamDestroy(h->stream));
  CUDA_OK(cudaFreeHost(h->flags));
}

static void scenario_busy_sms(struct rank_env* e) {
  static const struct moe_case cases[] = {{300, 136, 128, 72, 2, 8, SKEWED}, {4096, 256, 128, 64, 8, 256, UNIFORM}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const struct moe_case* c = &cases[i];
    const uint64_t base = g_seed + 3000 + i * 7;
    run_case(e, c, base, 0); /* loads the kernels */
    struct moe_bufs b;
    bufs_alloc(&b, c);
    inputs_fill(e, &b, c, base);
    struct sm_hold h;
    if (sm_hold_start(e, &h)) {
      run_dispatch(e, &b, c);
      run_combine(e, &b, c);
      CUDA_OK(cudaStreamSynchronize(e->stream));
    }
    sm_hold_end(e, &h);
    check_case(e, &b, c, base, 0);
    bufs_free(&b);
  }
}

#endif /* MK_MOE_BUSY_SMS_CUH_ */
