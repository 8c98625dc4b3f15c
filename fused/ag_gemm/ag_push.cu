/* The push, order and finish kernels of the fused AllGather+GEMM (see ag_push.h).
 * NOTES: compiled, not yet run on a GPU. */
#include <errno.h>

#include "ag_push.h"
#include "ptx.cuh"
#include "schedule.h"

static __device__ __forceinline__ uint64_t* ag_words(void* ws) { return (uint64_t*)ws; }

/* Bounded wait for a peer's word to reach `want`; on expiry writes the error record. */
static __device__ int ag_wait_word(const uint64_t* word, uint64_t want,
                                   const struct mk_ag_push_args& a, uint32_t what) {
  uint64_t seen = ld_acquire_sys_u64(word), t0 = globaltimer_ns();
  while (seen < want) {
    __nanosleep(128);
    seen = ld_acquire_sys_u64(word);
    if (a.err && ld_relaxed_sys_u32(&a.err->aborted)) return 0;
    if (seen < want && globaltimer_ns() - t0 > a.timeout_ns) {
      if (a.err) {
        a.err->tag = a.err_tag;
        a.err->tile = what;
        a.err->flag_index = MK_AG_WORD_DONE;
        a.err->expected = want;
        a.err->seen = seen;
        fence_acq_rel_sys();
        *(volatile uint32_t*)&a.err->aborted = 1;
      }
      return 0;
    }
  }
  return 1;
}

/* Copies one row-block of this rank's shard into destination d's gathered buffer, then
 * raises d's flag for it. All threads of the CTA take part. */
static __device__ void ag_push_block(const struct mk_ag_push_args& a, int d, int b, uint64_t e) {
  const size_t row0 = (size_t)b * MK_AG_BLOCK_ROWS;
  const size_t rows = a.shard_rows - row0 < MK_AG_BLOCK_ROWS ? a.shard_rows - row0 : MK_AG_BLOCK_ROWS;
  const size_t nvec = rows * a.k * 2 / 16; /* k is a multiple of 8: whole 16-byte vectors */
  const uint4* src = (const uint4*)((const char*)a.a_shard + row0 * a.k * 2);
  char* gathered = (char*)a.ws[d] + MK_AG_DATA_OFFSET;
  uint4* dst = (uint4*)(gathered + ((size_t)a.rank * a.shard_rows + row0) * a.k * 2);
  for (size_t i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = src[i];
  __syncthreads(); /* every thread's stores happen before thread 0's release below */
  if (threadIdx.x == 0) {
    const int mb = a.rank * (int)(a.shard_rows / MK_AG_BLOCK_ROWS) + b;
    fence_acq_rel_sys();
    st_release_sys_u64(ag_words(a.ws[d]) + MK_AG_FLAG0 + mb, e);
  }
}

/* Work item i: destination mk_sched_ag_dest(rank, step) for step = i / blocks (step 0 is this
 * rank itself, so the local shard lands first), block i % blocks. */
static __global__ void ag_push_kernel(const struct mk_ag_push_args a) {
  const int blocks = (int)(a.shard_rows / MK_AG_BLOCK_ROWS);
  const uint64_t e = ag_words(a.ws[a.rank])[MK_AG_WORD_CALL]; /* set by the begin kernel */
  __shared__ int ok;
  for (int i = blockIdx.x; i < blocks * a.nranks; i += gridDim.x) {
    const int d = mk_sched_ag_dest(a.rank, a.nranks, i / blocks);
    if (threadIdx.x == 0) /* d's GEMM of the previous call no longer reads its buffer */
      ok = ag_wait_word(ag_words(a.ws[d]) + MK_AG_WORD_DONE, e - 1, a, (uint32_t)i);
    __syncthreads();
    if (!ok) return;
    ag_push_block(a, d, i % blocks, e);
  }
}

/* The call's number (one more than the last finished) and the GEMM's row-block order. */
static __global__ void ag_begin_kernel(uint64_t* words, int* order, int rank, int nranks,
                                       int blocks) {
  if (threadIdx.x == 0) words[MK_AG_WORD_CALL] = words[MK_AG_WORD_DONE] + 1;
  for (int i = threadIdx.x; i < blocks * nranks; i += blockDim.x) {
    int shard, block;
    mk_sched_ag_block(rank, nranks, blocks, i, &shard, &block);
    order[i] = shard * blocks + block;
  }
}

static __global__ void ag_finish_kernel(uint64_t* words) {
  fence_acq_rel_sys();
  st_release_sys_u64(words + MK_AG_WORD_DONE, words[MK_AG_WORD_CALL]);
}

static int ag_launched(void) {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? 0 : -EIO;
}

extern "C" int mk_ag_begin_launch(void* own_ws, int rank, int nranks, size_t shard_rows,
                                  cudaStream_t stream) {
  int* order = (int*)((char*)own_ws + MK_AG_ORDER_OFFSET);
  ag_begin_kernel<<<1, 256, 0, stream>>>((uint64_t*)own_ws, order, rank, nranks,
                                         (int)(shard_rows / MK_AG_BLOCK_ROWS));
  return ag_launched();
}

extern "C" int mk_ag_push_launch(const struct mk_ag_push_args* a, int ctas, cudaStream_t stream) {
  ag_push_kernel<<<ctas, 512, 0, stream>>>(*a);
  return ag_launched();
}

extern "C" int mk_ag_finish_launch(void* own_ws, cudaStream_t stream) {
  ag_finish_kernel<<<1, 1, 0, stream>>>((uint64_t*)own_ws);
  return ag_launched();
}
