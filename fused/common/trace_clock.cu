/* The offset between this GPU's %globaltimer and the host's CLOCK_REALTIME (trace.h header
 * clock_offset_ns): ranks on one host then share one clock in the traces. NOTES: seen on the
 * 2 x H200 machine: the two GPUs' timers ~250 us apart in one lease, close in another. */
#include <stdint.h>
#include <time.h>

#include "ptx.cuh"
#include "trace.h"

static __global__ void trace_read_timer(uint64_t* out) { *out = globaltimer_ns(); }

static int64_t host_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The best of a few tries: the sample whose host bracket is narrowest. 0 or -1 (CUDA error). */
extern "C" int mk_trace_clock_offset(cudaStream_t stream, int64_t* offset_ns) {
  uint64_t *dev, gpu;
  if (cudaMalloc(&dev, 8) != cudaSuccess) return -1;
  int64_t best_width = INT64_MAX;
  for (int i = 0; i < 8; i++) {
    const int64_t t0 = host_realtime_ns();
    trace_read_timer<<<1, 1, 0, stream>>>(dev);
    if (cudaMemcpyAsync(&gpu, dev, 8, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      cudaFree(dev);
      return -1;
    }
    const int64_t t1 = host_realtime_ns();
    if (t1 - t0 < best_width) best_width = t1 - t0, *offset_ns = (t0 + (t1 - t0) / 2) - (int64_t)gpu;
  }
  cudaFree(dev);
  return 0;
}
