/*
 * A kernel that holds a share of the GPU's SMs (one CTA per SM, by shared memory) until the
 * host releases it: the GPU tests' stand-in for another stream's kernels (NCCL's, a
 * compute stream's, or a peer rank's sharing the GPU under MPS) while a fused op runs. The
 * flags are mapped host memory, so the host sees the holder start and releases it without a
 * stream. A kernel first launched during the hold must be loaded before it (ncclMkCommInit
 * loads the library's; a test loads its own): with CUDA's lazy loading a kernel's first launch
 * waits for the context's running kernels (the holder) to end.
 */
#ifndef MK_SM_HOLD_CUH_
#define MK_SM_HOLD_CUH_

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gemm_check.cuh" /* CUDA_OK */
#include "ptx.cuh"

#define SM_HOLD_SMEM (200 << 10) /* two do not fit in an SM's 228 KB */
/* NOTES (session 39): holders polling mapped host memory every 2 us slowed the kernels they
 * ran beside 2-4x (cuBLAS, 16 or 33 holding CTAs on one H200; 8 CTAs of two MPS clients),
 * where holders that only read the clock cost what their SMs are worth. A release seen
 * 100 us late costs nothing. */
#define SM_HOLD_POLL_NS 100000u

/* *released counts the CTAs that saw the release (the others gave up after limit_ns). */
static __global__ void sm_hold_kernel(unsigned* started, const volatile unsigned* release, unsigned* released,
                                      unsigned long long limit_ns) {
  extern __shared__ char hold_smem[];
  if (threadIdx.x) return;
  hold_smem[0] = 1;
  atomicAdd(started, 1u);
  __threadfence_system();
  const unsigned long long t0 = globaltimer_ns();
  while (!*release && globaltimer_ns() - t0 < limit_ns) __nanosleep(SM_HOLD_POLL_NS);
  if (*release) atomicAdd(released, 1u);
}

/* One warp spinning `ns` on its stream: what an op enqueues next waits behind running work, so
 * that kernels it forks onto two streams become ready at the same moment (after an idle
 * stream the forked one starts first and hides which of them would take the free SMs). */
static __global__ void sm_hold_delay_kernel(unsigned long long ns) {
  const unsigned long long t0 = globaltimer_ns();
  while (globaltimer_ns() - t0 < ns) __nanosleep(1000);
}

static void sm_hold_delay(cudaStream_t stream, unsigned long long ns) {
  sm_hold_delay_kernel<<<1, 32, 0, stream>>>(ns);
  CUDA_OK(cudaGetLastError());
}

struct sm_hold {
  unsigned* flags; /* mapped host memory: started, release, released */
  cudaStream_t stream;
  int ctas, sms;   /* CTAs of the holder, SMs the device reports (under MPS: the client's) */
};

/* The running holder's release word, raised at exit and on SIGTERM/SIGINT: a process that
 * fails (CUDA_OK's exit) or is stopped by timeout(1) while holding would otherwise leave the
 * holder on its SMs for up to 30 s, and under MPS the next test in the same server fails. */
static volatile unsigned* sm_hold_active_release;

static void sm_hold_release_at_exit(void) {
  if (sm_hold_active_release) *sm_hold_active_release = 1;
}

static void sm_hold_release_on_signal(int sig) {
  sm_hold_release_at_exit();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void sm_hold_arm_release(volatile unsigned* release) {
  static int armed;
  sm_hold_active_release = release;
  if (armed++) return;
  atexit(sm_hold_release_at_exit);
  signal(SIGTERM, sm_hold_release_on_signal);
  signal(SIGINT, sm_hold_release_on_signal);
}

/* Holds `ctas` SMs of `device` for up to 30 s; waits (up to 5 s) until every holding CTA runs
 * and returns how many do. */
static int sm_hold_start_ctas(struct sm_hold* h, int device, int ctas) {
  CUDA_OK(cudaDeviceGetAttribute(&h->sms, cudaDevAttrMultiProcessorCount, device));
  h->ctas = ctas;
  CUDA_OK(cudaHostAlloc((void**)&h->flags, 3 * sizeof(unsigned), cudaHostAllocMapped));
  memset(h->flags, 0, 3 * sizeof(unsigned));
  sm_hold_arm_release(&h->flags[1]);
  CUDA_OK(cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking));
  sm_hold_delay(h->stream, 0); /* loaded now: a lazy load during the hold waits for the holder */
  CUDA_OK(cudaFuncSetAttribute(sm_hold_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SM_HOLD_SMEM));
  unsigned* dev;
  CUDA_OK(cudaHostGetDevicePointer((void**)&dev, h->flags, 0));
  sm_hold_kernel<<<h->ctas, 32, SM_HOLD_SMEM, h->stream>>>(dev, dev + 1, dev + 2, 30000000000ull);
  CUDA_OK(cudaGetLastError());
  for (int ms = 0; ms < 5000 && *(volatile unsigned*)&h->flags[0] < (unsigned)h->ctas; ms++) usleep(1000);
  return (int)*(volatile unsigned*)&h->flags[0];
}

/* Holds held_of_4 quarters of the SMs of `device` (sms x held_of_4 / 4), as above. */
static int sm_hold_start(struct sm_hold* h, int device, int held_of_4) {
  int sms;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sm_hold_start_ctas(h, device, sms * held_of_4 / 4);
}

/* Monotonic milliseconds: how long a call took while the SMs were held. */
static double sm_hold_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Releases the holder, waits for it; returns how many CTAs held their SM until now. */
static int sm_hold_end(struct sm_hold* h) {
  *(volatile unsigned*)&h->flags[1] = 1;
  sm_hold_active_release = NULL;
  CUDA_OK(cudaStreamSynchronize(h->stream));
  const int held = (int)h->flags[2];
  CUDA_OK(cudaStreamDestroy(h->stream));
  CUDA_OK(cudaFreeHost(h->flags));
  return held;
}

#endif /* MK_SM_HOLD_CUH_ */
