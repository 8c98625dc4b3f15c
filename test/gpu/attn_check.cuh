/*
 * Test helpers for ring attention (issues 11, 12): a float64 reference attention on the
 * device over the whole (global, un-split) sequence, and the row selection that gives a
 * rank its part of the sequence (its inputs, and the reference rows its outputs must match).
 * Random inputs, poisoning, CUDA_OK, gpu_or_skip and check_close come from gemm_check.cuh.
 *
 * Layouts (row-major, as in ncclMkRingAttention's issue): q, out [B, S, H, D];
 * k, v [B, S, H_kv, D]; lse [B, H, S]. Head h reads kv head h / (H / H_kv) (grouped-query).
 * The backward (issue 12) takes dout like out and gives dq like q, dk and dv like k and v.
 */
#ifndef MK_ATTN_CHECK_CUH_
#define MK_ATTN_CHECK_CUH_

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
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

/* Where row i of head h (batch b) starts in a [B, S, heads, width] tensor (q, out, dout, dq;
 * k, v, dk, dv with heads = H_kv), and its entry of a [B, H, S] one (lse, delta). */
static __host__ __device__ size_t attn_row_at(int b, int i, int h, int seq, int heads, int width) {
  return (((size_t)b * seq + i) * heads + h) * width;
}
static __host__ __device__ size_t attn_lse_at(int b, int h, int i, int seq, int heads) {
  return ((size_t)b * heads + h) * seq + i;
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
  const size_t q_row = attn_row_at(b, s, h, seq, heads, d_head);
  const __nv_bfloat16* kb = k + attn_row_at(b, 0, hk, seq, kv_heads, d_head);
  const __nv_bfloat16* vb = v + attn_row_at(b, 0, hk, seq, kv_heads, d_head);
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
  if (tid == 0 && lse) lse[attn_lse_at(b, h, s, seq, heads)] = m + log(l);
}

/* Exits on a shape the references cannot do (they are test helpers). */
static void attn_ref_check_shape(const char* who, int batch, int seq, int heads, int kv_heads,
                                 int d_head) {
  if (kv_heads <= 0 || heads % kv_heads || d_head <= 0 || d_head > ATTN_REF_MAX_D || seq <= 0 ||
      batch <= 0 || heads > 65535 || batch > 65535) {
    fprintf(stderr, "%s: unsupported shape B=%d S=%d H=%d H_kv=%d D=%d\n", who, batch, seq, heads,
            kv_heads, d_head);
    exit(1);
  }
}

/* out [B,S,H,D] and (if lse != NULL) lse [B,H,S] in float64 from bf16 q, k, v of the whole
 * sequence. */
static void ref_attn_f64(const void* q, const void* k, const void* v, double* out, double* lse,
                         int batch, int seq, int heads, int kv_heads, int d_head, int causal) {
  attn_ref_check_shape("ref_attn_f64", batch, seq, heads, kv_heads, d_head);
  dim3 grid(seq, heads, batch);
  ref_attn_f64_kernel<<<grid, ATTN_REF_THREADS>>>((const __nv_bfloat16*)q, (const __nv_bfloat16*)k,
                                                  (const __nv_bfloat16*)v, out, lse, seq, heads,
                                                  kv_heads, d_head, causal);
  CUDA_OK(cudaGetLastError());
}

/* ---- the checker of the forward kernels (test_attn, test_ring_attn) ----------------------
 * out (bf16) and lse (fp32) against float64 rows: ||out - ref|| / ||ref|| < 1e-2, every element
 * |out - ref| <= 2e-2 (1 + |ref|), lse within 2e-3, nothing non-finite (the poison never
 * passes). */

/* acc[0] = max |out - ref| (bits of a non-negative double), acc[1] = elements over the bound,
 * acc[2] = non-finite outputs. */
template <class OutT>
static __global__ void attn_elem_check_kernel(const OutT* out, const double* ref, size_t n, double atol, double rtol,
                                              unsigned long long* acc) {
  double worst = 0;
  unsigned long long over = 0, bad = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const double o = load_as_double(out, i), r = ref[i], d = fabs(o - r);
    if (!isfinite(o)) bad++;
    else worst = fmax(worst, d);
    if (!(d <= atol + rtol * fabs(r))) over++;
  }
  atomicMax(&acc[0], (unsigned long long)__double_as_longlong(worst));
  atomicAdd(&acc[1], over);
  atomicAdd(&acc[2], bad);
}

struct elem_result {
  double worst;
  long over, nonfinite;
};

template <class OutT>
static inline struct elem_result elem_check(const OutT* out, const double* ref, size_t n, double atol, double rtol) {
  unsigned long long* acc;
  unsigned long long h[3];
  CUDA_OK(cudaMalloc(&acc, sizeof h));
  memset_now(acc, 0, sizeof h);
  attn_elem_check_kernel<OutT><<<512, 256>>>(out, ref, n, atol, rtol, acc);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, acc, sizeof h, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(acc));
  struct elem_result r;
  long long bits = (long long)h[0];
  memcpy(&r.worst, &bits, sizeof r.worst);
  r.over = (long)h[1];
  r.nonfinite = (long)h[2];
  return r;
}

#define OUT_TOL_REL 1e-2
#define OUT_TOL_ELEM 2e-2
#define LSE_TOL 2e-3

/* The checker: out (bf16) and lse (fp32) against float64 rows. Prints one line; 1 = pass. */
static inline int attn_check(const char* what, const void* out, const float* lse, const double* ref_out,
                      const double* ref_lse, size_t n_out, size_t n_lse) {
  const struct check_result c = check_close((const __nv_bfloat16*)out, ref_out, n_out, OUT_TOL_REL);
  const struct elem_result e = elem_check((const __nv_bfloat16*)out, ref_out, n_out, OUT_TOL_ELEM, OUT_TOL_ELEM);
  const struct elem_result l = elem_check(lse, ref_lse, n_lse, LSE_TOL, 0.0);
  const int pass = c.pass && e.over == 0 && e.nonfinite == 0 && l.over == 0 && l.nonfinite == 0;
  printf("  %-44s out rel %.2e max %.2e over %ld nonfinite %ld | lse max %.2e over %ld nonfinite %ld: %s\n", what,
         c.rel, e.worst, e.over, e.nonfinite, l.worst, l.over, l.nonfinite, pass ? "ok" : "WRONG");
  return pass;
}

/* ---- the backward ------------------------------------------------------------------------
 * From scratch, as FlashAttention's backward recomputes it: P = exp(q k^T * scale - lse) (the
 * softmax weights, from the reference forward's lse), D_i = rowsum(dout * out) over the head
 * dimension, dP = dout v^T, dS = P * (dP - D_i), dq = dS k * scale, dk = dS^T q * scale,
 * dv = P^T dout; dk, dv of a kv head sum over the query heads that read it. out is the
 * reference forward's float64 out (a kernel's D_i comes from its bf16 out: a rounding apart). */


/* delta[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d]: one thread per row. */
static __global__ void ref_attn_bwd_delta_kernel(const __nv_bfloat16* dout, const double* out,
                                                 double* delta, int batch, int seq, int heads,
                                                 int d_head, int out_bf16) {
  const size_t rows = (size_t)batch * seq * heads;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < rows;
       e += (size_t)gridDim.x * blockDim.x) {
    const size_t b = e / ((size_t)seq * heads), s = e / heads % seq, h = e % heads; /* [B,S,H] */
    double acc = 0;
    for (int d = 0; d < d_head; d++) {
      const double o = out[e * d_head + d];
      acc += (double)__bfloat162float(dout[e * d_head + d]) *
             (out_bf16 ? (double)__bfloat162float(__double2bfloat16(o)) : o);
    }
    delta[attn_lse_at((int)b, (int)h, (int)s, seq, heads)] = acc;
  }
}

/* dq: one block per (query row, head, batch), as ref_attn_f64_kernel: dS for ATTN_REF_THREADS
 * visible keys at a time (one per thread), then dq[d] += dS * k[d] (one d per thread). */
static __global__ void ref_attn_bwd_dq_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                              const __nv_bfloat16* v, const __nv_bfloat16* dout,
                                              const double* lse, const double* delta, double* dq,
                                              double* dq_mag, int seq, int heads, int kv_heads,
                                              int d_head, int causal) {
  __shared__ double qs[ATTN_REF_MAX_D];
  __shared__ double dos[ATTN_REF_MAX_D];
  __shared__ double ds[ATTN_REF_THREADS];
  const int s = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int hk = h / (heads / kv_heads);
  const double scale = 1.0 / sqrt((double)d_head);
  const size_t q_row = attn_row_at(b, s, h, seq, heads, d_head);
  const __nv_bfloat16* kb = k + attn_row_at(b, 0, hk, seq, kv_heads, d_head);
  const __nv_bfloat16* vb = v + attn_row_at(b, 0, hk, seq, kv_heads, d_head);
  const size_t kv_stride = (size_t)kv_heads * d_head;
  const int nk = causal ? s + 1 : seq;
  const double l = lse[attn_lse_at(b, h, s, seq, heads)];
  const double dl = delta[attn_lse_at(b, h, s, seq, heads)];

  for (int d = tid; d < d_head; d += ATTN_REF_THREADS) {
    qs[d] = (double)__bfloat162float(q[q_row + d]);
    dos[d] = (double)__bfloat162float(dout[q_row + d]);
  }
  __syncthreads();

  double acc[ATTN_REF_MAX_D / ATTN_REF_THREADS] = {0};
  double mag[ATTN_REF_MAX_D / ATTN_REF_THREADS] = {0};
  for (int j0 = 0; j0 < nk; j0 += ATTN_REF_THREADS) {
    const int j = j0 + tid;
    if (j < nk) {
      const double p = exp(attn_ref_score(qs, kb + (size_t)j * kv_stride, d_head, scale) - l);
      ds[tid] = p * (attn_ref_score(dos, vb + (size_t)j * kv_stride, d_head, 1.0) - dl);
    } else {
      ds[tid] = 0;
    }
    __syncthreads();
    const int jn = nk - j0 < ATTN_REF_THREADS ? nk - j0 : ATTN_REF_THREADS;
    for (int jj = 0; jj < jn; jj++) {
      const __nv_bfloat16* kr = kb + (size_t)(j0 + jj) * kv_stride;
      for (int i = 0, d = tid; d < d_head; i++, d += ATTN_REF_THREADS) {
        const double kd = (double)__bfloat162float(kr[d]);
        acc[i] += ds[jj] * kd;
        mag[i] += fabs(ds[jj] * kd);
      }
    }
    __syncthreads();
  }
  for (int i = 0, d = tid; d < d_head; i++, d += ATTN_REF_THREADS) {
    dq[q_row + d] = acc[i] * scale;
    if (dq_mag) dq_mag[q_row + d] = mag[i] * scale;
  }
}

/* dk, dv: one block per (key row, kv head, batch). The (query head, query row) pairs that see
 * the key (the heads of its group; causal: rows from the key's on) are numbered m = g * nq + i
 * and taken ATTN_REF_THREADS at a time: P and dS per thread, then dv[d] += P * dout[d] and
 * dk[d] += dS * q[d] (one d per thread). */
static __global__ void ref_attn_bwd_dkv_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                               const __nv_bfloat16* v, const __nv_bfloat16* dout,
                                               const double* lse, const double* delta, double* dk,
                                               double* dv, double* dk_mag, double* dv_mag, int seq,
                                               int heads, int kv_heads, int d_head, int causal) {
  __shared__ double ks[ATTN_REF_MAX_D];
  __shared__ double vs[ATTN_REF_MAX_D];
  __shared__ double p[ATTN_REF_THREADS];
  __shared__ double ds[ATTN_REF_THREADS];
  const int j = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int group = heads / kv_heads;
  const double scale = 1.0 / sqrt((double)d_head);
  const size_t kv_row = attn_row_at(b, j, hk, seq, kv_heads, d_head);
  const int i0 = causal ? j : 0, nq = seq - i0, nm = group * nq;

  for (int d = tid; d < d_head; d += ATTN_REF_THREADS) {
    ks[d] = (double)__bfloat162float(k[kv_row + d]);
    vs[d] = (double)__bfloat162float(v[kv_row + d]);
  }
  __syncthreads();

  double acc_k[ATTN_REF_MAX_D / ATTN_REF_THREADS] = {0};
  double acc_v[ATTN_REF_MAX_D / ATTN_REF_THREADS] = {0};
  double mag_k[ATTN_REF_MAX_D / ATTN_REF_THREADS] = {0};
  double mag_v[ATTN_REF_MAX_D / ATTN_REF_THREADS] = {0};
  for (int m0 = 0; m0 < nm; m0 += ATTN_REF_THREADS) {
    const int m = m0 + tid;
    if (m < nm) {
      const int h = hk * group + m / nq, i = i0 + m % nq;
      const size_t row = attn_row_at(b, i, h, seq, heads, d_head);
      const size_t l = attn_lse_at(b, h, i, seq, heads);
      const double pm = exp(attn_ref_score(ks, q + row, d_head, scale) - lse[l]);
      p[tid] = pm;
      ds[tid] = pm * (attn_ref_score(vs, dout + row, d_head, 1.0) - delta[l]);
    } else {
      p[tid] = ds[tid] = 0;
    }
    __syncthreads();
    const int mn = nm - m0 < ATTN_REF_THREADS ? nm - m0 : ATTN_REF_THREADS;
    for (int mm = 0; mm < mn; mm++) {
      const int h = hk * group + (m0 + mm) / nq, i = i0 + (m0 + mm) % nq;
      const size_t row = attn_row_at(b, i, h, seq, heads, d_head);
      const __nv_bfloat16 *qr = q + row, *dor = dout + row;
      for (int e = 0, d = tid; d < d_head; e++, d += ATTN_REF_THREADS) {
        const double qd = (double)__bfloat162float(qr[d]), dod = (double)__bfloat162float(dor[d]);
        acc_k[e] += ds[mm] * qd;
        acc_v[e] += p[mm] * dod;
        mag_k[e] += fabs(ds[mm] * qd);
        mag_v[e] += fabs(p[mm] * dod);
      }
    }
    __syncthreads();
  }
  for (int e = 0, d = tid; d < d_head; e++, d += ATTN_REF_THREADS) {
    dk[kv_row + d] = acc_k[e] * scale;
    dv[kv_row + d] = acc_v[e];
    if (dk_mag) dk_mag[kv_row + d] = mag_k[e] * scale, dv_mag[kv_row + d] = mag_v[e];
  }
}

/* How the reference takes delta = rowsum(dout * out). */
enum attn_ref_delta {
  ATTN_REF_DELTA_EXACT, /* from the float64 out: the exact gradients of sum(out * dout) */
  /* from out rounded to bf16, as a backward gets it from the forward (FlashAttention's
   * definition): that rounding moves delta by ~2^-9 sqrt(D) |dout| |out|, and dq and dk with it
   * (measured on an H200: up to 2.2x the element bound at rows with few visible keys) */
  ATTN_REF_DELTA_STORED_OUT,
};

/* Per gradient element, the sum of the absolute values of the terms the reference adds up
 * (dq: scale sum_j |dS_ij k_jd|, dk: scale sum_i |dS_ij q_id|, dv: sum_i |P_ij dout_id|): a
 * kernel that rounds P or dS to bf16 before its matrix products is off by up to 2^-8 of it,
 * however much the terms cancel (they do at the keys and queries with few partners). */
struct attn_ref_mag {
  double *dq, *dk, *dv;
};

/* dq [B,S,H,D], dk and dv [B,S,H_kv,D] in float64 from bf16 q, k, v and dout of the whole
 * sequence (the gradients of sum(out * dout), delta as `how` says); mag, when not NULL, gets
 * the terms' magnitudes (struct attn_ref_mag). Forward recomputed by ref_attn_f64. Synchronous
 * (it frees its scratch). */
static void ref_attn_bwd_f64(const void* q, const void* k, const void* v, const void* dout,
                             double* dq, double* dk, double* dv, int batch, int seq, int heads,
                             int kv_heads, int d_head, int causal, enum attn_ref_delta how,
                             const struct attn_ref_mag* mag) {
  attn_ref_check_shape("ref_attn_bwd_f64", batch, seq, heads, kv_heads, d_head);
  const size_t nq = (size_t)batch * seq * heads * d_head, nl = (size_t)batch * heads * seq;
  double *out, *lse, *delta;
  CUDA_OK(cudaMalloc(&out, nq * sizeof(double)));
  CUDA_OK(cudaMalloc(&lse, nl * sizeof(double)));
  CUDA_OK(cudaMalloc(&delta, nl * sizeof(double)));
  ref_attn_f64(q, k, v, out, lse, batch, seq, heads, kv_heads, d_head, causal);
  ref_attn_bwd_delta_kernel<<<256, 256>>>((const __nv_bfloat16*)dout, out, delta, batch, seq,
                                          heads, d_head, how == ATTN_REF_DELTA_STORED_OUT);
  CUDA_OK(cudaGetLastError());
  const __nv_bfloat16 *q16 = (const __nv_bfloat16*)q, *k16 = (const __nv_bfloat16*)k;
  const __nv_bfloat16 *v16 = (const __nv_bfloat16*)v, *do16 = (const __nv_bfloat16*)dout;
  ref_attn_bwd_dq_kernel<<<dim3(seq, heads, batch), ATTN_REF_THREADS>>>(
      q16, k16, v16, do16, lse, delta, dq, mag ? mag->dq : NULL, seq, heads, kv_heads, d_head,
      causal);
  CUDA_OK(cudaGetLastError());
  ref_attn_bwd_dkv_kernel<<<dim3(seq, kv_heads, batch), ATTN_REF_THREADS>>>(
      q16, k16, v16, do16, lse, delta, dk, dv, mag ? mag->dk : NULL, mag ? mag->dv : NULL, seq,
      heads, kv_heads, d_head, causal);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaFree(out));
  CUDA_OK(cudaFree(lse));
  CUDA_OK(cudaFree(delta));
}

/* ---- the small-shape sweep of the core tests ------------------------------------------------
 * S = 1, 100, 128, 300, 1024 (B = 2; 1 at S = 1024), H = H_kv = 4 and GQA 8:1, D = 64 and 128,
 * non-causal then causal: run(batch, seq, heads, kv_heads, d, causal, seed) per case, each
 * with its own seed (printed first, for a rerun). */
static void attn_small_shape_sweep(void (*run)(int, int, int, int, int, int, uint64_t)) {
  const uint64_t seed = (uint64_t)time(NULL);
  printf("  seed %016llx\n", (unsigned long long)seed);
  const int seqs[] = {1, 100, 128, 300, 1024};
  int i = 0;
  for (int causal = 0; causal < 2; causal++)
    for (int d = 64; d <= 128; d += 64)
      for (int s = 0; s < 5; s++) {
        const int batch = seqs[s] >= 1024 ? 1 : 2;
        run(batch, seqs[s], 4, 4, d, causal, seed + 10 * i++); /* H = H_kv */
        run(batch, seqs[s], 8, 1, d, causal, seed + 10 * i++); /* GQA 8:1 */
      }
}

/* ---- the gradient checker ---------------------------------------------------------------- */

#define ATTN_GRAD_TOL_REL 2e-2
#define ATTN_GRAD_TOL_ABS 3e-3
#define ATTN_GRAD_TOL_TERMS 0x1p-8 /* of the terms' magnitude: P or dS rounded to bf16 */

static double attn_to_double(__nv_bfloat16 x) { return (double)__bfloat162float(x); }
static double attn_to_double(float x) { return (double)x; }

/* The gradient checker of the backward tests (test_attn_bwd, test_ring_attn_bwd), on the host in
 * float64: ||x - ref|| <= 2e-2 ||ref|| + 3e-3 sqrt(n), every element |x - ref| <= 2e-2 (|ref| +
 * rms(ref)) + 3e-3 + 2^-8 mag (mag_dev: the reference's term magnitudes, struct attn_ref_mag,
 * NULL for none), nothing non-finite. Prints one line; 1 = pass. */
template <class T>
static int attn_grad_check(const char* what, const T* dev, const double* ref_dev, const double* mag_dev, size_t n) {
  std::vector<T> x(n);
  std::vector<double> r(n), mag(n, 0.0);
  CUDA_OK(cudaMemcpy(x.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(r.data(), ref_dev, n * sizeof(double), cudaMemcpyDeviceToHost));
  if (mag_dev) CUDA_OK(cudaMemcpy(mag.data(), mag_dev, n * sizeof(double), cudaMemcpyDeviceToHost));
  double ss_ref = 0, ss_diff = 0, worst = 0;
  for (size_t i = 0; i < n; i++) ss_ref += r[i] * r[i];
  const double rms = sqrt(ss_ref / (double)n);
  long over = 0, nonfinite = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < n; i++) {
    const double v = attn_to_double(x[i]), d = fabs(v - r[i]);
    if (!std::isfinite(v)) {
      nonfinite++;
      continue;
    }
    ss_diff += d * d;
    if (d > worst) worst = d, worst_at = i;
    if (!(d <= ATTN_GRAD_TOL_REL * (fabs(r[i]) + rms) + ATTN_GRAD_TOL_ABS + ATTN_GRAD_TOL_TERMS * mag[i])) over++;
  }
  const double rel = ss_ref > 0 ? sqrt(ss_diff / ss_ref) : sqrt(ss_diff);
  const int pass = nonfinite == 0 && over == 0 && sqrt(ss_diff) <= ATTN_GRAD_TOL_REL * sqrt(ss_ref) + ATTN_GRAD_TOL_ABS * sqrt((double)n);
  printf("  %-50s rel %.2e rms %.2e max %.2e at %zu over %ld nonfinite %ld: %s\n", what, rel, rms, worst, worst_at,
         over, nonfinite, pass ? "ok" : "WRONG");
  return pass;
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
  legacy_stream_done();
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
  legacy_stream_done();
}

/* Negative controls: element i of a device array (bf16 or a float type) += delta. */
template <class T>
static void nudge(T* p, size_t i, double delta) {
  T h;
  CUDA_OK(cudaMemcpy(&h, p + i, sizeof h, cudaMemcpyDeviceToHost));
  if constexpr (sizeof(T) == 2) h = __float2bfloat16(__bfloat162float(h) + (float)delta);
  else h = (T)((double)h + delta);
  CUDA_OK(cudaMemcpy(p + i, &h, sizeof h, cudaMemcpyHostToDevice));
}

#endif /* MK_ATTN_CHECK_CUH_ */
