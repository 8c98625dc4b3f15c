/* The finish kernel of the fused AllGather+GEMM (see ag_push.h). */
#include <errno.h>

#include "ag_push.h"
#include "ptx.cuh"
#include "sm90.h"

static_assert(MK_AG_WORDS_BYTES <= MK_AG_COUNT_OFFSET && MK_AG_COUNT_OFFSET + MK_AG_MAX_BLOCKS * 4 <= MK_AG_DATA_OFFSET,
              "the push counters overlap the words or the data");

/* done = e = done + 1: the kernel did not end the call (the caller's gathered A was copied
 * out of the workspace first). */
static __global__ void ag_finish_kernel(uint64_t* words) {
  fence_acq_rel_sys();
  st_release_sys_u64(words + MK_AG_WORD_DONE, words[MK_AG_WORD_DONE] + 1);
}

extern "C" int mk_ag_finish_launch(void* own_ws, cudaStream_t stream) {
  ag_finish_kernel<<<1, 1, 0, stream>>>((uint64_t*)own_ws);
  return mk_kernel_launched("ag_finish_kernel");
}

extern "C" int mk_ag_load(void) { return mk_kernel_load((const void*)ag_finish_kernel, "ag_finish_kernel"); }
