/* The push, order and finish kernels of the fused AllGather+GEMM (see ag_push.h). */
#include <errno.h>

#include "ag_push.h"
#include "ptx.cuh"
#include "schedule.h"
#include "trace.h"
#include "wait.cuh"

static_assert(MK_AG_ORDER_OFFSET + MK_AG_MAX_BLOCKS * 4 <= MK_AG_COUNT_OFFSET &&
                  MK_AG_COUNT_OFFSET + MK_AG_MAX_BLOCKS * 4 <= MK_AG_DATA_OFFSET,
              "order and count tables overlap");

static __device__ __forceinline__ uint64_t* ag_words(void* ws) { return (uint64_t*)ws; }

/* Bounded wait for a peer's done word (wait.cuh), traced when it blocked. */
static __device__ int ag_wait_word(const uint64_t* word, uint64_t want,
                                   const struct mk_ag_push_args& a, uint32_t what) {
  if (ld_acquire_sys_u64(word) >= want) return 1;
  const uint64_t t0 = globaltimer_ns();
  const uint64_t seen = mk_wait_geq(word, want, a.err, a.err_tag | MK_AG_ERR_TAG_PUSH, what, MK_AG_WORD_DONE, a.timeout_ns);
  mk_trace_emit(a.trace, a.trace_cta0 + blockIdx.x, MK_TRACE_LANE_COMM, t0, MK_TRACE_COMM_SEND, MK_TRACE_WAIT,
                MK_TRACE_NO_PEER, what, MK_AG_WORD_DONE, want, seen);
  return seen >= want;
}

/* This CTA's slice of the 16-byte vectors [lo, hi), four loads in flight per thread. */
static __device__ void ag_copy_slice(uint4* dst, const uint4* src, size_t lo, size_t hi) {
  constexpr int UNROLL = 4;
  for (size_t i = lo + threadIdx.x; i < hi; i += UNROLL * blockDim.x) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (i + u * blockDim.x < hi) v[u] = ld_global_nc_v4(src + i + u * blockDim.x);
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (i + u * blockDim.x < hi) dst[i + u * blockDim.x] = v[u];
  }
}

/* Work item `item` (block b of this rank's shard, for destination d): every CTA copies its
 * slice into d's gathered A; the last CTA to finish raises d's flag for the row-block to e.
 * Ordering: each CTA's stores, bar.sync, fence.sys, then an acq_rel add on the item's
 * counter; the last adder's fence.sys and st.release.sys of the flag therefore come after
 * every CTA's stores, so the flag is never seen before the rows. */
static __device__ void ag_push_item(const struct mk_ag_push_args& a, int d, int b, int item, uint64_t e) {
  const uint64_t t0 = a.trace ? globaltimer_ns() : 0;
  const size_t row0 = (size_t)b * MK_AG_BLOCK_ROWS;
  const size_t rows = a.shard_rows - row0 < MK_AG_BLOCK_ROWS ? a.shard_rows - row0 : MK_AG_BLOCK_ROWS;
  const size_t nvec = rows * a.k * 2 / 16; /* k is a multiple of 8: whole 16-byte vectors */
  const size_t per_cta = (nvec + gridDim.x - 1) / gridDim.x;
  const size_t lo = per_cta * blockIdx.x, hi = lo + per_cta < nvec ? lo + per_cta : nvec;
  const uint4* src = (const uint4*)((const char*)a.a_shard + row0 * a.k * 2);
  char* gathered = (char*)a.ws[d] + MK_AG_DATA_OFFSET;
  uint4* dst = (uint4*)(gathered + ((size_t)a.rank * a.shard_rows + row0) * a.k * 2);
  ag_copy_slice(dst, src, lo, hi);
  __syncthreads(); /* every thread's stores happen before thread 0's fence below */
  if (threadIdx.x != 0) return;
  const int mb = a.rank * (int)(a.shard_rows / MK_AG_BLOCK_ROWS) + b;
  uint32_t* count = (uint32_t*)((char*)a.ws[a.rank] + MK_AG_COUNT_OFFSET) + item;
  fence_acq_rel_sys();
  const int last = atom_add_acq_rel_gpu_u32(count, 1) == gridDim.x - 1;
  if (last) {
    *count = 0; /* no CTA adds to it again in this call; the next call is a later kernel */
    fence_acq_rel_sys();
    if (mb != a.drop_flag_block) st_release_sys_u64(ag_words(a.ws[d]) + MK_AG_FLAG0 + mb, e);
  }
  mk_trace_emit(a.trace, a.trace_cta0 + blockIdx.x, MK_TRACE_LANE_COMM, t0, MK_TRACE_COMM_SEND, MK_TRACE_CHUNK,
                (uint32_t)d, (uint32_t)mb, (uint32_t)mb, last ? e : 0, last ? e : 0);
}

/* Items in order: destination mk_sched_ag_dest(rank, step) for step = item / blocks, from
 * step 1 (this rank's own GEMM reads its shard in place), block item % blocks; every CTA takes
 * a slice of every item, so row-blocks complete one after another at the full rate. */
static __global__ void ag_push_kernel(const struct mk_ag_push_args a) {
  const int blocks = (int)(a.shard_rows / MK_AG_BLOCK_ROWS);
  const uint64_t e = ag_words(a.ws[a.rank])[MK_AG_WORD_CALL]; /* set by the begin kernel */
  __shared__ int ok;
  for (int item = blocks; item < blocks * a.nranks; item++) {
    const int d = mk_sched_ag_dest(a.rank, a.nranks, item / blocks);
    if (item % blocks == 0) { /* a new destination: its GEMM of the previous call is done */
      if (threadIdx.x == 0) ok = ag_wait_word(ag_words(a.ws[d]) + MK_AG_WORD_DONE, e - 1, a, (uint32_t)item);
      __syncthreads();
      if (!ok) return;
    }
    ag_push_item(a, d, item % blocks, item, e);
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
