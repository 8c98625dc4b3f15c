/* The kernel of the MoE combine after its GEMM (moe.h): the weighted sum per token of the rows
 * the GEMMs of every rank scattered to this one. */
#include <cuda_bf16.h>
#include <errno.h>

#include "ag_push.h"
#include "moe.h"
#include "ptx.cuh"
#include "sm90.h"
#include "wait.cuh"

#define MOE_THREADS 512
#define MOE_WARPS (MOE_THREADS / 32)

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
 * rounding; after every rank's GEMM raised its flag for this call (also with no tokens: then
 * out and topk_weights are never touched). */
static __global__ void __launch_bounds__(MOE_THREADS) moe_reduce_kernel(const struct mk_moe_args a) {
  const uint64_t e = *(volatile uint64_t*)(a.words[a.rank] + MK_AG_WORD_CALL);
  const uint64_t* flags = (const uint64_t*)(a.moe[a.rank] + a.g.comb_flag);
  int ok = 1;
  if ((int)threadIdx.x < a.nranks)
    ok = mk_wait_geq(flags + threadIdx.x, e, a.err, a.err_tag, MK_MOE_WAIT_ROWS, threadIdx.x, a.timeout_ns) >= e;
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

/* At least one CTA: with no tokens (0 CTAs would be a launch error) it still waits for every
 * rank's flag like any rank, so a peer that never scatters is reported here too. */
extern "C" int mk_moe_reduce_launch(const struct mk_moe_args* a, cudaStream_t stream) {
  const int ctas = a->tokens > 0 ? (a->tokens + MOE_WARPS - 1) / MOE_WARPS : 1;
  moe_reduce_kernel<<<ctas, MOE_THREADS, 0, stream>>>(*a);
  return mk_kernel_launched("moe_reduce_kernel");
}

extern "C" int mk_moe_combine_load(void) { return mk_kernel_load((const void*)moe_reduce_kernel, "moe_reduce_kernel"); }
