/* Compiled, never run (CI has no GPU): every device helper of trace.h used the way the GEMM
 * kernel will use it (see the note at the top of trace.h), so a change that breaks them fails
 * the build. The GPU session runs the real thing. */
#include "trace.h"

__global__ void mk_trace_compile_check(struct mk_trace_buf* trace, const unsigned long long* flag,
                                       unsigned long long target, int tiles) {
  if (threadIdx.x != 0) return;
  struct mk_trace_writer w = mk_trace_open(trace, blockIdx.x, MK_TRACE_LANE_PRODUCER);
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    uint64_t t0 = mk_trace_begin(&w);
    unsigned long long seen = *(volatile const unsigned long long*)flag;
    mk_trace_wait(&w, t0, MK_TRACE_PRODUCER, (uint32_t)tile, 0, target, seen);
    uint64_t t1 = mk_trace_begin(&w);
    mk_trace_end(&w, t1, MK_TRACE_PRODUCER, MK_TRACE_TILE, MK_TRACE_NO_PEER, (uint32_t)tile, 0, target);
  }
}
