/* The begin and reduce kernels of the overlapped GEMM+ReduceScatter (see rs_reduce.h). */
#include <cuda_bf16.h>
#include <errno.h>

#include "ag_push.h" /* the call words, shared by every overlapped op */
#include "rs_reduce.h"
#include "wait.cuh"

#define RS_THREADS 512
#define RS_SPLITS 8 /* CTAs per row-block */

struct mk_rs_peers {
  const uint64_t* words[MK_RS_MAX_RANKS];
};

static __global__ void rs_begin_kernel(uint64_t* own_words, const struct mk_rs_peers peers, int rank, int nranks,
                                       struct mk_gemm_error* err, uint32_t err_tag, uint64_t timeout_ns) {
  const uint64_t e = own_words[MK_AG_WORD_DONE] + 1;
  own_words[MK_AG_WORD_CALL] = e;
  for (int p = 0; p < nranks; p++)
    if (p != rank && mk_wait_geq(peers.words[p] + MK_AG_WORD_DONE, e - 1, err, err_tag, (uint32_t)p,
                                 MK_AG_WORD_DONE, timeout_ns) < e - 1)
      return;
}

/* Eight bf16 of c += the peers' eight, summed in fp32. */
static __device__ uint4 rs_sum8(uint4 own, const uint4* const* peer, int npeers, size_t i) {
  float acc[8];
  const __nv_bfloat162* o = (const __nv_bfloat162*)&own;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float2 f = __bfloat1622float2(o[j]);
    acc[2 * j] = f.x, acc[2 * j + 1] = f.y;
  }
  for (int p = 0; p < npeers; p++) {
    uint4 v = ld_global_nc_v4(peer[p] + i);
    const __nv_bfloat162* h = (const __nv_bfloat162*)&v;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float2 f = __bfloat1622float2(h[j]);
      acc[2 * j] += f.x, acc[2 * j + 1] += f.y;
    }
  }
  uint4 out;
  __nv_bfloat162* w = (__nv_bfloat162*)&out;
#pragma unroll
  for (int j = 0; j < 4; j++) w[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
  return out;
}

/* CTA (mb, split): waits for row-block mb from every peer, then sums its slice of it. */
static __global__ void rs_reduce_kernel(const struct mk_rs_reduce_args a) {
  const int blocks = (int)(a.shard_rows / MK_AG_BLOCK_ROWS);
  const int mb = blockIdx.x / RS_SPLITS, split = blockIdx.x % RS_SPLITS;
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    for (int src = 0; src < a.nranks && ok; src++)
      if (src != a.rank)
        ok = mk_wait_geq(a.counts + src * blocks + mb, a.tiles_n, a.err, a.err_tag, (uint32_t)mb,
                         (uint32_t)(src * blocks + mb), a.timeout_ns) >= a.tiles_n;
  }
  __syncthreads();
  if (!ok) return;
  /* the counters were raised after the peers' stores, at system scope; ld.acquire above and
   * bar.sync order this CTA's loads after them */
  const uint4* peer[MK_RS_MAX_RANKS];
  int npeers = 0;
  const size_t slot_vecs = a.shard_rows * a.n / 8, row0_vec = (size_t)mb * MK_AG_BLOCK_ROWS * a.n / 8;
  for (int src = 0; src < a.nranks; src++)
    if (src != a.rank) peer[npeers++] = (const uint4*)a.slots + src * slot_vecs + row0_vec;
  uint4* own = (uint4*)a.c_shard + row0_vec;
  const size_t nvec = (size_t)MK_AG_BLOCK_ROWS * a.n / 8, per = (nvec + RS_SPLITS - 1) / RS_SPLITS;
  const size_t lo = per * split, hi = lo + per < nvec ? lo + per : nvec;
  for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) own[i] = rs_sum8(own[i], peer, npeers, i);
}

static int rs_launched(void) { return cudaGetLastError() == cudaSuccess ? 0 : -EIO; }

extern "C" int mk_rs_begin_launch(void* const* peer_ws, int rank, int nranks, struct mk_gemm_error* err,
                                  uint32_t err_tag, uint64_t timeout_ns, cudaStream_t stream) {
  struct mk_rs_peers peers = {};
  for (int p = 0; p < nranks; p++) peers.words[p] = (const uint64_t*)peer_ws[p];
  rs_begin_kernel<<<1, 1, 0, stream>>>((uint64_t*)peer_ws[rank], peers, rank, nranks, err, err_tag, timeout_ns);
  return rs_launched();
}

extern "C" int mk_rs_reduce_launch(const struct mk_rs_reduce_args* a, cudaStream_t stream) {
  const int blocks = (int)(a->shard_rows / MK_AG_BLOCK_ROWS);
  rs_reduce_kernel<<<blocks * RS_SPLITS, RS_THREADS, 0, stream>>>(*a);
  return rs_launched();
}
