/*
 * A writer that comes late, for the tests of bounded waits: a one-thread kernel, launched on
 * another stream before the kernel under test, sleeps delay_ns, then raises flags[0 .. count)
 * to value (release.sys), recording when it started and raised (t_raise[1], t_raise[0];
 * t_raise may be NULL); time_beside_late_raise: that writer on a stream of its own, then the
 * call under test on stream 0, timed. And set_words: device words set from the host.
 */
#ifndef MK_LATE_RAISE_CUH_
#define MK_LATE_RAISE_CUH_

#include <stdint.h>
#include <vector>

#include "gemm_check.cuh"
#include "ptx.cuh"

static __global__ void delayed_raise_kernel(uint64_t* flags, int count, uint64_t value, uint64_t delay_ns,
                                            uint64_t* t_raise) {
  uint64_t t0 = globaltimer_ns();
  if (t_raise) t_raise[1] = t0;
  while (globaltimer_ns() - t0 < delay_ns) __nanosleep(1000);
  if (t_raise) *t_raise = globaltimer_ns();
  fence_acq_rel_sys();
  for (int i = 0; i < count; i++) st_release_sys_u64(flags + i, value);
}

/* Starts delayed_raise_kernel(flags, count, value, delay_ns) on a stream of its own, then
 * run() (which launches on stream 0 and synchronizes); returns the milliseconds stream 0 took,
 * at least the delay when run's kernels waited for the flags, and run's result in *ran. */
template <class Run>
static float time_beside_late_raise(uint64_t* flags, int count, uint64_t value, uint64_t delay_ns, Run run, int* ran) {
  cudaStream_t writer;
  cudaEvent_t e0, e1;
  CUDA_OK(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  delayed_raise_kernel<<<1, 1, 0, writer>>>(flags, count, value, delay_ns, NULL);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaEventRecord(e0, 0));
  *ran = run();
  CUDA_OK(cudaEventRecord(e1, 0));
  CUDA_OK(cudaEventSynchronize(e1));
  float ms = 0.f;
  CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_OK(cudaStreamSynchronize(writer));
  cudaStreamDestroy(writer), cudaEventDestroy(e0), cudaEventDestroy(e1);
  return ms;
}

/* words[0 .. n) = value on the device. */
static void set_words(uint64_t* words, int n, uint64_t value) {
  std::vector<uint64_t> h(n, value);
  CUDA_OK(cudaMemcpy(words, h.data(), n * sizeof(uint64_t), cudaMemcpyHostToDevice));
  legacy_stream_done(); /* from pageable memory the copy may still be in flight */
}

#endif /* MK_LATE_RAISE_CUH_ */
