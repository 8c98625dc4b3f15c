/*
 * The backward core's elementwise passes around its main part: delta = rowsum(dout * out) and
 * dq_acc's rows zeroed (and split's dkv_ws zeroed) before it; dq = bf16(dq_acc) and split's
 * blocks written out of dkv_ws after it. Each is a slice (first, stride) of its work in thread
 * units, so that its own kernel (a grid-stride loop, the multi-launch call) and the one-launch
 * call's CTAs (attn_bwd_phase.cuh: slice i of n) run the same code.
 */
#ifndef MK_ATTN_BWD_PASSES_CUH_
#define MK_ATTN_BWD_PASSES_CUH_

#include <cuda_bf16.h>
#include <stdint.h>

#include "attn.h"
#include "ptx.cuh"
#include "stage.cuh"

/* The query rows [q_row0, q_row0 + q_rows) of [batch, seq_q, heads, D] the passes read and
 * write, with what to do before (do_delta, zero_dq, ws_floats) and after (dq). */
struct mk_attn_bwd_rows {
  const __nv_bfloat16* out;
  const __nv_bfloat16* dout;
  float* delta;  /* [batch, heads, seq_q] */
  float* dq_acc; /* like q, fp32 */
  __nv_bfloat16* dq; /* NULL: no conversion */
  int batch, seq_q, heads, q_row0, q_rows;
  int do_delta, zero_dq;
  float* dkv_ws; /* split's workspace, zeroed before (ws_floats of it; 0: none) */
  size_t ws_floats;
};

/* Thread units of a pass over the rows: 8 of a row's D elements each (the prep pass's D/8
 * threads per row, the dq pass's 8-element steps). */
__host__ __device__ __forceinline__ size_t attn_bwd_row_units(const struct mk_attn_bwd_rows& a, int d) {
  return (size_t)a.batch * a.q_rows * a.heads * (size_t)(d / 8);
}

/* Element offset of row r (of the range), head h, batch b. */
template <int D>
__device__ __forceinline__ size_t attn_bwd_row_at(const struct mk_attn_bwd_rows& a, size_t b, size_t r, size_t h) {
  return ((b * a.seq_q + a.q_row0 + r) * a.heads + h) * D;
}

/* Units a thread has in flight at once: the one-launch call runs the passes on one CTA of 384
 * threads per SM, so each thread needs several loads outstanding to reach HBM's rate. */
#define MK_ATTN_BWD_PASS_UNROLL 4

/* delta and dq_acc's zeroing: D/8 threads per (row, head, batch), 8 columns each (16-byte loads);
 * whole warps step together (the shuffles), lanes past the end masked. first, stride: thread
 * units, stride a multiple of 32. */
template <int D>
__device__ __forceinline__ void attn_bwd_prep_slice(const struct mk_attn_bwd_rows& a, size_t first, size_t stride) {
  constexpr int TPR = D / 8, U = MK_ATTN_BWD_PASS_UNROLL; /* threads per row: 16 or 8, a divisor of 32 */
  const int lane = threadIdx.x & 31;
  const size_t units = attn_bwd_row_units(a, D);
  for (size_t base = first - lane; base < units; base += U * stride) {
    uint4 o[U], g[U];
    size_t at[U], drow[U];
#pragma unroll
    for (int j = 0; j < U; j++) {
      const size_t u = base + j * stride + lane, e = u / TPR;
      const bool live = u < units;
      const size_t h = live ? e % a.heads : 0, r = live ? e / a.heads % a.q_rows : 0;
      const size_t b = live ? e / a.heads / a.q_rows : 0;
      at[j] = live ? attn_bwd_row_at<D>(a, b, r, h) + (u % TPR) * 8 : (size_t)-1;
      drow[j] = (b * a.heads + h) * a.seq_q + a.q_row0 + r;
      o[j] = g[j] = make_uint4(0, 0, 0, 0);
      if (live && a.do_delta) o[j] = *(const uint4*)(a.out + at[j]), g[j] = *(const uint4*)(a.dout + at[j]);
    }
#pragma unroll
    for (int j = 0; j < U; j++) {
      const bool live = at[j] != (size_t)-1;
      if (a.do_delta) {
        const __nv_bfloat162* o2 = (const __nv_bfloat162*)&o[j];
        const __nv_bfloat162* g2 = (const __nv_bfloat162*)&g[j];
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
          const float2 x = __bfloat1622float2(o2[k]), y = __bfloat1622float2(g2[k]);
          acc += x.x * y.x + x.y * y.y;
        }
#pragma unroll
        for (int m = TPR / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
        if (live && lane % TPR == 0) a.delta[drow[j]] = acc;
      }
      if (a.zero_dq && live) {
        float4* z = (float4*)(a.dq_acc + at[j]);
        z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
  }
}

/* dkv_ws zeroed, 4 floats per unit. */
__device__ __forceinline__ void attn_bwd_ws_zero_slice(const struct mk_attn_bwd_rows& a, size_t first, size_t stride) {
  for (size_t u = first; u < a.ws_floats / 4; u += stride) ((float4*)a.dkv_ws)[u] = make_float4(0.f, 0.f, 0.f, 0.f);
}

/* dq = bf16(dq_acc) over the rows, 8 elements per unit, U units in flight. */
template <int D>
__device__ __forceinline__ void attn_bwd_dq_slice(const struct mk_attn_bwd_rows& a, size_t first, size_t stride) {
  constexpr int U = MK_ATTN_BWD_PASS_UNROLL;
  const size_t n = attn_bwd_row_units(a, D), per_batch = n / a.batch;
  for (size_t u0 = first; u0 < n; u0 += U * stride) {
    float4 x[U], y[U];
    size_t at[U];
#pragma unroll
    for (int j = 0; j < U; j++) {
      const size_t u = u0 + j * stride;
      at[j] = u < n ? ((u / per_batch) * a.seq_q + a.q_row0) * a.heads * D + 8 * (u % per_batch) : (size_t)-1;
      if (at[j] != (size_t)-1) x[j] = *(const float4*)(a.dq_acc + at[j]), y[j] = *(const float4*)(a.dq_acc + at[j] + 4);
    }
#pragma unroll
    for (int j = 0; j < U; j++) {
      if (at[j] == (size_t)-1) continue;
      uint4 o;
      o.x = pack_bf16x2(x[j].x, x[j].y), o.y = pack_bf16x2(x[j].z, x[j].w);
      o.z = pack_bf16x2(y[j].x, y[j].y), o.w = pack_bf16x2(y[j].z, y[j].w);
      *(uint4*)(a.dq + at[j]) = o;
    }
  }
}

/* One block's outputs from the workspace (split): ws_k, ws_v [batch, rows, kv_heads, D] fp32;
 * dk, dv = bf16 of them (where given), dk_acc, dv_acc = or += them (where given and the gate is
 * open); the block's rows of [batch, seq, kv_heads, D], 2 elements per unit (the alignment
 * mk_attn_bwd_check asks of the outputs). */
struct mk_attn_bwd_ws_block {
  const float *ws_k, *ws_v;
  __nv_bfloat16 *dk, *dv;
  float *dk_acc, *dv_acc;
  int overwrite, seq, row0, rows;
};

/* One pair of a workspace block's outputs from its sums x (dk) and y (dv), at element `at` of
 * [batch, seq, kv_heads, D]: dk, dv = bf16 where given; the accumulators (acc_on) = or += them. */
__device__ __forceinline__ void attn_bwd_ws_out_pair(const struct mk_attn_bwd_ws_block& w, bool acc_on, size_t at,
                                                     float2 x, float2 y) {
  if (w.dk) *(uint32_t*)(w.dk + at) = pack_bf16x2(x.x, x.y);
  if (w.dv) *(uint32_t*)(w.dv + at) = pack_bf16x2(y.x, y.y);
  if (!acc_on) return;
  if (w.dk_acc) {
    const float2 o = w.overwrite ? make_float2(0.f, 0.f) : *(const float2*)(w.dk_acc + at);
    *(float2*)(w.dk_acc + at) = make_float2(o.x + x.x, o.y + x.y);
  }
  if (w.dv_acc) {
    const float2 o = w.overwrite ? make_float2(0.f, 0.f) : *(const float2*)(w.dv_acc + at);
    *(float2*)(w.dv_acc + at) = make_float2(o.x + y.x, o.y + y.y);
  }
}

template <int D>
__device__ __forceinline__ void attn_bwd_ws_block_slice(const struct mk_attn_bwd_ws_block& w, const uint64_t* gate,
                                                        int batch, int kv_heads, size_t first, size_t stride) {
  const size_t per_batch = (size_t)w.rows * kv_heads * D / 2, n = (size_t)batch * per_batch;
  const bool acc_on = mk_attn_acc_gate_open(gate);
  for (size_t e = first; e < n; e += stride) {
    const size_t at = ((e / per_batch) * w.seq + w.row0) * kv_heads * D + 2 * (e % per_batch);
    attn_bwd_ws_out_pair(w, acc_on, at, *(const float2*)(w.ws_k + 2 * e), *(const float2*)(w.ws_v + 2 * e));
  }
}

/* The passes' own kernels (the multi-launch call): grid-stride over every unit. */
__device__ __forceinline__ size_t attn_bwd_grid_first(void) { return blockIdx.x * (size_t)blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t attn_bwd_grid_stride(void) { return (size_t)gridDim.x * blockDim.x; }

template <int D>
__global__ void mk_attn_bwd_prep_kernel(const struct mk_attn_bwd_rows a) {
  attn_bwd_prep_slice<D>(a, attn_bwd_grid_first(), attn_bwd_grid_stride());
}

template <int D>
__global__ void mk_attn_bwd_dq_kernel(const struct mk_attn_bwd_rows a) {
  attn_bwd_dq_slice<D>(a, attn_bwd_grid_first(), attn_bwd_grid_stride());
}

template <int D>
__global__ void mk_attn_bwd_dkv_kernel(const struct mk_attn_bwd_ws_block w, const uint64_t* gate, int batch,
                                       int kv_heads) {
  attn_bwd_ws_block_slice<D>(w, gate, batch, kv_heads, attn_bwd_grid_first(), attn_bwd_grid_stride());
}

#endif /* MK_ATTN_BWD_PASSES_CUH_ */
