/*
 * Test helpers for ring attention (issues 11, 12): a float64 reference attention on the
 * device over the whole (global, un-split) sequence, and the row selection that gives a
 * rank its part of the sequence (its inputs, and the reference rows its outputs must match).
 * Random inputs, poisoning, CUDA_OK, gpu_or_skip and check_close come from gemm_check.cuh.
 *
 * Layouts (row-major, as in ncclMkRingAttention's issue): q, out [B, S, H, D];
 * k, v [B, S, H_kv, D]; lse [B, H, S]. Head h reads kv head h / (H / H_kv) (grouped-query).
 */
#ifndef MK_ATTN_CHECK_CUH_
#define MK_ATTN_CHECK_CUH_

#include "gemm_check.cuh"
#include "ra_schedule.h"

#define ATTN_REF_THREADS 128 /* a power of two (the max reduction halves it) */
#define ATTN_REF_MAX_D 256

static __device__ double attn_ref_score(const double* qs, const __nv_bfloat16* kr, int d_head,
                                        double scale) {
  double s = 0;
  for (int d = 0; d < d_head; d++) s += qs[d] * (double)__bfloat162float(kr[d]);
  return s * scale;
}

/* One block per (query row, head, batch). Two passes over the visible keys: the maximum
 * score, then p = exp(score - max) for ATTN_REF_THREADS keys at a time (one per thread) and
 * out[d] += p * v[d] (one d per thread). lse = max + log(sum p): the natural log of the sum of
 * exp(scaled score). Causal: query s sees keys 0 .. s. */
static __global__ void ref_attn_f64_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                           const __nv_bfloat16* v, double* out, double* lse,
                                           int seq, int heads, int kv_heads, int d_head,
                                           int causal) {
  __shared__ double qs[ATTN_REF_MAX_D];
  __shared__ double p[ATTN_REF_THREADS];
  __shared__ double red[ATTN_REF_THREADS];
  const int s = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int hk = h / (heads / kv_heads);
  const double scale = 1.0 / sqrt((double)d_head);
  const size_t q_row = (((size_t)b * seq + s) * heads + h) * d_head;
  const __nv_bfloat16* kb = k + (size_t)b * seq * kv_heads * d_head + (size_t)hk * d_head;
  const __nv_bfloat16* vb = v + (size_t)b * seq * kv_heads * d_head + (size_t)hk * d_head;
  const size_t kv_stride = (size_t)kv_heads * d_head; /* between consecutive tokens */
  const int nk = causal ? s + 1 : seq;

  for (int d = tid; d < d_head; d += ATTN_REF_THREADS) qs[d] = (double)__bfloat162float(q[q_row + d]);
  __syncthreads();

  double m = -INFINITY;
  for (int j = tid; j < nk; j += ATTN_REF_THREADS)
    m = fmax(m, attn_ref_score(qs, kb + (size_t)j * kv_stride, d_head, scale));
  red[tid] = m;
  __syncthreads();
  for (int w = ATTN_REF_THREADS / 2; w > 0; w /= 2) {
    if (tid < w) red[tid] = fmax(red[tid], red[tid + w]);
    __syncthreads();
  }
  m = red[0];

  double acc[ATTN_REF_MAX_D / ATTN_REF_THREADS] = {0};
  double l = 0; /* every thread sums the same p[], so each holds the total */
  for (int j0 = 0; j0 < nk; j0 += ATTN_REF_THREADS) {
    const int j = j0 + tid;
    p[tid] = j < nk ? exp(attn_ref_score(qs, kb + (size_t)j * kv_stride, d_head, scale) - m) : 0.0;
    __syncthreads();
    const int jn = nk - j0 < ATTN_REF_THREADS ? nk - j0 : ATTN_REF_THREADS;
    for (int jj = 0; jj < jn; jj++) {
      const double pj = p[jj];
      const __nv_bfloat16* vr = vb + (size_t)(j0 + jj) * kv_stride;
      l += pj;
      for (int i = 0, d = tid; d < d_head; i++, d += ATTN_REF_THREADS)
        acc[i] += pj * (double)__bfloat162float(vr[d]);
    }
    __syncthreads();
  }
  for (int i = 0, d = tid; d < d_head; i++, d += ATTN_REF_THREADS) out[q_row + d] = acc[i] / l;
  if (tid == 0 && lse) lse[((size_t)b * heads + h) * seq + s] = m + log(l);
}

/* out [B,S,H,D] and (if lse != NULL) lse [B,H,S] in float64 from bf16 q, k, v of the whole
 * sequence. Exits on a shape it cannot do (it is a test helper). */
static void ref_attn_f64(const void* q, const void* k, const void* v, double* out, double* lse,
                         int batch, int seq, int heads, int kv_heads, int d_head, int causal) {
  if (kv_heads <= 0 || heads % kv_heads || d_head <= 0 || d_head > ATTN_REF_MAX_D || seq <= 0 ||
      batch <= 0 || heads > 65535 || batch > 65535) {
    fprintf(stderr, "ref_attn_f64: unsupported shape B=%d S=%d H=%d H_kv=%d D=%d\n", batch, seq,
            heads, kv_heads, d_head);
    exit(1);
  }
  dim3 grid(seq, heads, batch);
  ref_attn_f64_kernel<<<grid, ATTN_REF_THREADS>>>((const __nv_bfloat16*)q, (const __nv_bfloat16*)k,
                                                  (const __nv_bfloat16*)v, out, lse, seq, heads,
                                                  kv_heads, d_head, causal);
  CUDA_OK(cudaGetLastError());
}

/* ---- a rank's rows ----------------------------------------------------------------------
 * Rank r of n holds s_local = S / n rows of the sequence: under the zigzag split (causal)
 * chunks r and 2n-1-r of 2n (fused/ring_attn/ra_schedule.h), else (contiguous) rows
 * r * s_local ... */
static __host__ __device__ long attn_global_row(int rank, int nranks, long s_local, long row,
                                                int zigzag) {
  return zigzag ? mk_ra_zigzag_global_row(rank, nranks, s_local, row) : rank * s_local + row;
}

/* local[b, i, :] = global[b, attn_global_row(i), :], rows of `width` elements. */
template <class T>
static __global__ void attn_take_rank_rows_kernel(const T* global, T* local, int batch, long seq,
                                                  long width, int rank, int nranks, int zigzag) {
  const long s_local = seq / nranks;
  const size_t n = (size_t)batch * s_local * width;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const size_t b = e / (s_local * width), i = e / width % s_local, c = e % width;
    local[e] = global[(b * seq + attn_global_row(rank, nranks, s_local, i, zigzag)) * width + c];
  }
}

/* Rank r's rows of a [B, S, width] tensor into [B, S/n, width]: to split q (width H*D) or
 * k, v (H_kv*D) into a rank's inputs, and to take the reference out rows its out must match. */
template <class T>
static void attn_take_rank_rows(const T* global, T* local, int batch, long seq, long width,
                                int rank, int nranks, int zigzag) {
  attn_take_rank_rows_kernel<T><<<1024, 256>>>(global, local, batch, seq, width, rank, nranks, zigzag);
  CUDA_OK(cudaGetLastError());
}

/* local[b, h, i] = global[b, h, attn_global_row(i)]: rank r's part of lse [B, H, S]. */
template <class T>
static __global__ void attn_take_rank_lse_kernel(const T* global, T* local, int batch, int heads,
                                                 long seq, int rank, int nranks, int zigzag) {
  const long s_local = seq / nranks;
  const size_t n = (size_t)batch * heads * s_local;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const size_t bh = e / s_local, i = e % s_local;
    local[e] = global[bh * seq + attn_global_row(rank, nranks, s_local, i, zigzag)];
  }
}

template <class T>
static void attn_take_rank_lse(const T* global, T* local, int batch, int heads, long seq, int rank,
                               int nranks, int zigzag) {
  attn_take_rank_lse_kernel<T><<<1024, 256>>>(global, local, batch, heads, seq, rank, nranks, zigzag);
  CUDA_OK(cudaGetLastError());
}

#endif /* MK_ATTN_CHECK_CUH_ */
