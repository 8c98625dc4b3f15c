/* The kernels of the MoE combine (moe.h): scatter the second GEMM's rows to their sources,
 * then the weighted sum per token on each source. */
#include <cuda_bf16.h>
#include <errno.h>

#include "ag_push.h"
#include "moe.h"
#include "moe_copy.cuh"
#include "ptx.cuh"
#include "wait.cuh"

#define MOE_THREADS 512
#define MOE_WARPS (MOE_THREADS / 32)

/* Every CTA: once every peer finished its previous call (its comb area is free), each of its
 * rows of y to comb[token][slot] on the row's source; then this CTA's flag on every rank. A
 * CTA that gave up raises nothing: the sources time out (the error record says where). */
static __global__ void __launch_bounds__(MOE_THREADS) moe_scatter_kernel(const struct mk_moe_args a) {
  const uint64_t e = *(volatile uint64_t*)(a.words[a.rank] + MK_AG_WORD_CALL);
  int ok = 1;
  if ((int)threadIdx.x < a.nranks && (int)threadIdx.x != a.rank)
    ok = mk_wait_geq(a.words[threadIdx.x] + MK_AG_WORD_DONE, e - 1, a.err, a.err_tag, 3, MK_AG_WORD_DONE,
                     a.timeout_ns) >= e - 1;
  if (!__syncthreads_and(ok)) return;
  const int warp = threadIdx.x / 32, total = a.group_offsets[a.e_local];
  const size_t row_bytes = (size_t)a.hidden * 2;
  const char* y = a.moe[a.rank] + a.g.rows;
  for (int r = blockIdx.x * MOE_WARPS + warp; r < total; r += gridDim.x * MOE_WARPS) {
    const int src = a.row_source[(size_t)r * 3], t = a.row_source[(size_t)r * 3 + 1];
    const int slot = a.row_source[(size_t)r * 3 + 2];
    moe_copy_row<false>(a.moe[src] + a.g.comb + ((size_t)t * a.g.max_topk + slot) * row_bytes,
                        y + (size_t)r * row_bytes, a.hidden);
  }
  __syncthreads(); /* every thread's stores before the fences below */
  if ((int)threadIdx.x < a.nranks) {
    fence_acq_rel_sys();
    uint64_t* flags = (uint64_t*)(a.moe[threadIdx.x] + a.g.comb_flag);
    st_release_sys_u64(flags + (size_t)a.rank * MK_MOE_SCATTER_CTAS + blockIdx.x, e);
  }
}

/* 8 bf16 of a 16-byte vector, scaled, into acc. */
static __device__ __forceinline__ void moe_accumulate8(float* acc, uint4 q, float w) {
  const __nv_bfloat162* h = (const __nv_bfloat162*)&q;
  for (int i = 0; i < 4; i++) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += w * f.x;
    acc[2 * i + 1] += w * f.y;
  }
}

/* A warp per token: out[t] = sum over its valid slots of weight * comb[t][slot], fp32, one
 * rounding; after every rank's every scatter CTA raised its flag for this call (also with no
 * tokens: then out and topk_weights are never touched). */
static __global__ void __launch_bounds__(MOE_THREADS) moe_reduce_kernel(const struct mk_moe_args a) {
  const uint64_t e = *(volatile uint64_t*)(a.words[a.rank] + MK_AG_WORD_CALL);
  const uint64_t* flags = (const uint64_t*)(a.moe[a.rank] + a.g.comb_flag);
  int ok = 1;
  for (int i = threadIdx.x; i < a.nranks * MK_MOE_SCATTER_CTAS && ok; i += blockDim.x)
    ok = mk_wait_geq(flags + i, e, a.err, a.err_tag, 4, (uint32_t)i, a.timeout_ns) >= e;
  if (!__syncthreads_and(ok)) return;
  const int t = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (t >= a.tokens) return;
  const size_t row_vecs = (size_t)a.hidden / 8;
  const uint4* comb = (const uint4*)(a.moe[a.rank] + a.g.comb);
  uint4* out = (uint4*)a.out + (size_t)t * row_vecs;
  for (size_t v = lane; v < row_vecs; v += 32) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int s = 0; s < a.topk; s++) {
      if (a.slot_dest[(size_t)t * a.g.max_topk + s] < 0) continue;
      const uint4 q = __ldcg(comb + ((size_t)t * a.g.max_topk + s) * row_vecs + v);
      moe_accumulate8(acc, q, a.topk_weights[(size_t)t * a.topk + s]);
    }
    uint4 r;
    __nv_bfloat162* h = (__nv_bfloat162*)&r;
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    out[v] = r;
  }
}

static int moe_launched(void) { return cudaGetLastError() == cudaSuccess ? 0 : -EIO; }

extern "C" int mk_moe_scatter_launch(const struct mk_moe_args* a, cudaStream_t stream) {
  moe_scatter_kernel<<<MK_MOE_SCATTER_CTAS, MOE_THREADS, 0, stream>>>(*a);
  return moe_launched();
}

/* At least one CTA: with no tokens (0 CTAs would be a launch error) it still waits for every
 * scatter flag like any rank, so a peer that never scatters is reported here too. */
extern "C" int mk_moe_reduce_launch(const struct mk_moe_args* a, cudaStream_t stream) {
  const int ctas = a->tokens > 0 ? (a->tokens + MOE_WARPS - 1) / MOE_WARPS : 1;
  moe_reduce_kernel<<<ctas, MOE_THREADS, 0, stream>>>(*a);
  return moe_launched();
}
