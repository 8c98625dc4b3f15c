/* The begin, collect and finish kernels of the overlapped GEMM+ReduceScatter (see rs_comm.h). */
#include <errno.h>

#include "ag_push.h" /* the call words and the order table, shared by every overlapped op */
#include "rs_comm.h"
#include "schedule.h"
#include "wait.cuh"

#define RS_BEGIN_THREADS 256
#define RS_COLLECT_THREADS 512
#define RS_COLLECT_SPLITS 8 /* CTAs per row-block */
#define RS_FINISH_THREADS 1024

static __global__ void rs_begin_kernel(const struct mk_rs_begin_args a) {
  uint64_t* words = (uint64_t*)a.ws[a.rank];
  int* order = (int*)((char*)a.ws[a.rank] + MK_AG_ORDER_OFFSET);
  for (int pos = threadIdx.x; pos < a.nranks * a.blocks; pos += blockDim.x)
    order[pos] = mk_sched_rs_row_block(a.rank, a.nranks, a.blocks, pos); /* the peers' rows, this rank's last */
  if (threadIdx.x) return;
  const uint64_t e = words[MK_AG_WORD_DONE] + 1;
  words[MK_AG_WORD_CALL] = e;
  for (int p = 0; p < a.nranks; p++)
    if (p != a.rank && mk_wait_geq((const uint64_t*)a.ws[p] + MK_AG_WORD_DONE, e - 1, a.err, a.err_tag,
                                   (uint32_t)p, MK_AG_WORD_DONE, a.timeout_ns) < e - 1)
      return;
}

/* CTA (src, mb, split): waits for src's reduced row-block mb, then copies its slice into c. */
static __global__ void rs_collect_kernel(const struct mk_rs_collect_args a) {
  const int blocks = (int)(a.shard_rows / MK_AG_BLOCK_ROWS);
  const int item = blockIdx.x / RS_COLLECT_SPLITS, split = blockIdx.x % RS_COLLECT_SPLITS;
  const int src = mk_sched_rs_shard(a.rank, a.nranks, item / blocks), mb = item % blocks;
  __shared__ int ok;
  if (threadIdx.x == 0)
    ok = mk_wait_geq(a.counts + src * blocks + mb, a.tiles_n, a.err, a.err_tag, (uint32_t)mb,
                     (uint32_t)(a.nranks * blocks + src * blocks + mb), a.timeout_ns) >= a.tiles_n;
  __syncthreads();
  if (!ok) return;
  /* the counter was raised after the peer's stores, at system scope; ld.acquire above and
   * bar.sync order this CTA's loads after them */
  const size_t block_vec = (size_t)mb * MK_AG_BLOCK_ROWS * a.n / 8, shard_vecs = a.shard_rows * a.n / 8;
  const int slot = mk_sched_rs_slot(src, a.rank);
  const uint4* from = (const uint4*)a.gather + (size_t)slot * shard_vecs + block_vec;
  uint4* to = (uint4*)a.c + (size_t)src * shard_vecs + block_vec;
  const size_t nvec = (size_t)MK_AG_BLOCK_ROWS * a.n / 8, per = (nvec + RS_COLLECT_SPLITS - 1) / RS_COLLECT_SPLITS;
  const size_t lo = per * split, hi = lo + per < nvec ? lo + per : nvec;
  for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) to[i] = from[i];
}

static __global__ void rs_finish_kernel(uint64_t* words, int counters) {
  uint64_t* counts = (uint64_t*)((char*)words + MK_RS_COUNT_OFFSET);
  for (int i = threadIdx.x; i < counters; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  if (threadIdx.x) return;
  fence_acq_rel_sys();
  st_release_sys_u64(words + MK_AG_WORD_DONE, words[MK_AG_WORD_CALL]);
}

static int rs_launched(void) { return cudaGetLastError() == cudaSuccess ? 0 : -EIO; }

extern "C" int mk_rs_begin_launch(const struct mk_rs_begin_args* a, cudaStream_t stream) {
  rs_begin_kernel<<<1, RS_BEGIN_THREADS, 0, stream>>>(*a);
  return rs_launched();
}

extern "C" int mk_rs_collect_launch(const struct mk_rs_collect_args* a, cudaStream_t stream) {
  const int items = (a->nranks - 1) * (int)(a->shard_rows / MK_AG_BLOCK_ROWS);
  rs_collect_kernel<<<items * RS_COLLECT_SPLITS, RS_COLLECT_THREADS, 0, stream>>>(*a);
  return rs_launched();
}

extern "C" int mk_rs_finish_launch(void* own_ws, int counters, cudaStream_t stream) {
  rs_finish_kernel<<<1, RS_FINISH_THREADS, 0, stream>>>((uint64_t*)own_ws, counters);
  return rs_launched();
}
