/*
 * The ring attention backward's test buffers (test_ring_attn_bwd, test_ops_in_turn, test_moe):
 * every rank builds the whole sequence's q, k, v, dout from the same seeds and takes its rows
 * (zigzag when causal, contiguous otherwise); the float64 reference's gradients likewise; the
 * forward (ncclMkRingAttention) gives out and lse, the backward dq (the rank's query rows) and
 * dk, dv (its key rows), checked by rb_check (attn_check.cuh attn_grad_check). It takes the
 * communicator, stream and rank count as arguments, not a harness's rank_env: the test
 * programs' harnesses differ.
 */
#ifndef MK_RING_BWD_BUFS_CUH_
#define MK_RING_BWD_BUFS_CUH_

#include <string.h>

#include "attn_check.cuh"
#include "gemm_check.cuh"
#include "nccl_mk.h"

struct rb_case {
  int batch, s_local, heads, kv_heads, d, causal;
};

struct rb_bufs {
  struct rb_case c;
  int rank, nranks;
  long seq;
  size_t nq, nkv, nl, nq_g, nkv_g;
  void *q_g, *k_g, *v_g, *do_g;
  double *ref_dq_g, *ref_dk_g, *ref_dv_g;
  void *q, *k, *v, *dout, *out, *dq, *dk, *dv;
  float* lse;
  double *ref_dq, *ref_dk, *ref_dv;
  struct attn_ref_mag mag_g, mag; /* the reference's term magnitudes (whole, this rank's) */
  int has_mag;                    /* the float64 reference filled them */
};

static void rb_alloc(struct rb_bufs* b, struct rb_case c, int rank, int nranks) {
  memset(b, 0, sizeof *b);
  b->c = c, b->rank = rank, b->nranks = nranks, b->seq = (long)c.s_local * nranks;
  b->nq = (size_t)c.batch * c.s_local * c.heads * c.d, b->nkv = (size_t)c.batch * c.s_local * c.kv_heads * c.d;
  b->nl = (size_t)c.batch * c.heads * c.s_local;
  b->nq_g = b->nq * nranks, b->nkv_g = b->nkv * nranks;
  void** bf[] = {&b->q_g, &b->do_g};
  for (void** p : bf) CUDA_OK(cudaMalloc(p, b->nq_g * 2));
  CUDA_OK(cudaMalloc(&b->k_g, b->nkv_g * 2));
  CUDA_OK(cudaMalloc(&b->v_g, b->nkv_g * 2));
  CUDA_OK(cudaMalloc(&b->ref_dq_g, b->nq_g * 8));
  CUDA_OK(cudaMalloc(&b->ref_dk_g, b->nkv_g * 8));
  CUDA_OK(cudaMalloc(&b->ref_dv_g, b->nkv_g * 8));
  void** lq[] = {&b->q, &b->dout, &b->out, &b->dq};
  for (void** p : lq) CUDA_OK(cudaMalloc(p, b->nq * 2));
  void** lk[] = {&b->k, &b->v, &b->dk, &b->dv};
  for (void** p : lk) CUDA_OK(cudaMalloc(p, b->nkv * 2));
  CUDA_OK(cudaMalloc(&b->lse, b->nl * 4));
  CUDA_OK(cudaMalloc(&b->ref_dq, b->nq * 8));
  CUDA_OK(cudaMalloc(&b->ref_dk, b->nkv * 8));
  CUDA_OK(cudaMalloc(&b->ref_dv, b->nkv * 8));
  CUDA_OK(cudaMalloc(&b->mag_g.dq, b->nq_g * 8));
  CUDA_OK(cudaMalloc(&b->mag_g.dk, b->nkv_g * 8));
  CUDA_OK(cudaMalloc(&b->mag_g.dv, b->nkv_g * 8));
  CUDA_OK(cudaMalloc(&b->mag.dq, b->nq * 8));
  CUDA_OK(cudaMalloc(&b->mag.dk, b->nkv * 8));
  CUDA_OK(cudaMalloc(&b->mag.dv, b->nkv * 8));
}

static void rb_free(struct rb_bufs* b) {
  void* all[] = {b->q_g, b->k_g, b->v_g, b->do_g, b->ref_dq_g, b->ref_dk_g, b->ref_dv_g, b->q, b->k, b->v, b->dout,
                 b->out, b->dq, b->dk, b->dv, b->lse, b->ref_dq, b->ref_dk, b->ref_dv,
                 b->mag_g.dq, b->mag_g.dk, b->mag_g.dv, b->mag.dq, b->mag.dk, b->mag.dv};
  for (void* p : all) cudaFree(p);
}

/* The reference's global gradients (ref_*_g) to this rank's rows. */
static void rb_take_ref(struct rb_bufs* b) {
  const struct rb_case c = b->c;
  attn_take_rank_rows(b->ref_dq_g, b->ref_dq, c.batch, b->seq, (long)c.heads * c.d, b->rank, b->nranks, c.causal);
  attn_take_rank_rows(b->ref_dk_g, b->ref_dk, c.batch, b->seq, (long)c.kv_heads * c.d, b->rank, b->nranks, c.causal);
  attn_take_rank_rows(b->ref_dv_g, b->ref_dv, c.batch, b->seq, (long)c.kv_heads * c.d, b->rank, b->nranks, c.causal);
  attn_take_rank_rows(b->mag_g.dq, b->mag.dq, c.batch, b->seq, (long)c.heads * c.d, b->rank, b->nranks, c.causal);
  attn_take_rank_rows(b->mag_g.dk, b->mag.dk, c.batch, b->seq, (long)c.kv_heads * c.d, b->rank, b->nranks, c.causal);
  attn_take_rank_rows(b->mag_g.dv, b->mag.dv, c.batch, b->seq, (long)c.kv_heads * c.d, b->rank, b->nranks, c.causal);
}

/* Fresh inputs (the same whole sequence on every rank), this rank's rows, the float64
 * reference (with_ref), outputs poisoned; synchronous. */
static void rb_fill(struct rb_bufs* b, uint64_t seed, int with_ref) {
  const struct rb_case c = b->c;
  const int zz = c.causal;
  fill_random_bf16(b->q_g, b->nq_g, seed, 2.0f);
  fill_random_bf16(b->k_g, b->nkv_g, seed + 1, 2.0f);
  fill_random_bf16(b->v_g, b->nkv_g, seed + 2, 1.0f);
  fill_random_bf16(b->do_g, b->nq_g, seed + 3, 1.0f);
  const long qw = (long)c.heads * c.d, kw = (long)c.kv_heads * c.d;
  attn_take_rank_rows((const __nv_bfloat16*)b->q_g, (__nv_bfloat16*)b->q, c.batch, b->seq, qw, b->rank, b->nranks, zz);
  attn_take_rank_rows((const __nv_bfloat16*)b->do_g, (__nv_bfloat16*)b->dout, c.batch, b->seq, qw, b->rank, b->nranks, zz);
  attn_take_rank_rows((const __nv_bfloat16*)b->k_g, (__nv_bfloat16*)b->k, c.batch, b->seq, kw, b->rank, b->nranks, zz);
  attn_take_rank_rows((const __nv_bfloat16*)b->v_g, (__nv_bfloat16*)b->v, c.batch, b->seq, kw, b->rank, b->nranks, zz);
  b->has_mag = with_ref;
  if (with_ref) {
    ref_attn_bwd_f64(b->q_g, b->k_g, b->v_g, b->do_g, b->ref_dq_g, b->ref_dk_g, b->ref_dv_g, c.batch, (int)b->seq,
                     c.heads, c.kv_heads, c.d, c.causal, ATTN_REF_DELTA_STORED_OUT, &b->mag_g);
    rb_take_ref(b);
  }
  poison(b->dq, b->nq * 2), poison(b->dk, b->nkv * 2), poison(b->dv, b->nkv * 2);
  CUDA_OK(cudaDeviceSynchronize());
}

static ncclResult_t rb_fwd(ncclComm_t comm, cudaStream_t stream, struct rb_bufs* b) {
  const struct rb_case c = b->c;
  return ncclMkRingAttention(b->q, b->k, b->v, b->out, b->lse, c.batch, c.s_local, c.heads, c.kv_heads, c.d,
                             c.causal, ncclBfloat16, comm, stream);
}

static ncclResult_t rb_bwd(ncclComm_t comm, cudaStream_t stream, struct rb_bufs* b) {
  const struct rb_case c = b->c;
  return ncclMkRingAttentionBackward(b->q, b->k, b->v, b->out, b->lse, b->dout, b->dq, b->dk, b->dv, c.batch,
                                     c.s_local, c.heads, c.kv_heads, c.d, c.causal, ncclBfloat16, comm, stream);
}

static int rb_check(struct rb_bufs* b, const char* prefix) {
  const struct rb_case c = b->c;
  char w[200];
  int ok = 1;
  const char* g[] = {"dq", "dk", "dv"};
  const void* x[] = {b->dq, b->dk, b->dv};
  const double* r[] = {b->ref_dq, b->ref_dk, b->ref_dv};
  const double* m[] = {b->mag.dq, b->mag.dk, b->mag.dv};
  const size_t n[] = {b->nq, b->nkv, b->nkv};
  for (int i = 0; i < 3; i++) {
    snprintf(w, sizeof w, "%srank %d B=%d S_local=%d H=%d H_kv=%d D=%d %s %s", prefix, b->rank, c.batch, c.s_local,
             c.heads, c.kv_heads, c.d, c.causal ? "causal" : "non-causal", g[i]);
    ok &= attn_grad_check(w, (const __nv_bfloat16*)x[i], r[i], b->has_mag ? m[i] : NULL, n[i]);
  }
  return ok;
}

#endif /* MK_RING_BWD_BUFS_CUH_ */
