/*
 * ring_attn_perf: ncclMkRingAttention (issue 11) on 2 ranks against
 *   seq   the sequential baseline: per ring step our attention core (mk_attn_fwd_launch) on the
 *         current KV block while NCCL send/recv moves the next one on a second stream, then the
 *         log-sum-exp merge of the steps' out/lse (one elementwise kernel); 2 ranks only;
 *   core  our attention core alone on the whole sequence (S = 2 S_local) on one GPU (every
 *         rank runs it on its own GPU at once: the same work), the single-GPU ceiling.
 * TFLOP/s per GPU: fused and seq 4 B H S_local S D / t (halved when causal); core the same
 * formula on the whole sequence (4 B H S S D / t, halved). Medians of -n iterations after -w
 * warm-ups, variants interleaved, each after an NCCL barrier, max over ranks. The fused and the
 * seq outputs are checked against the core's rows of this rank: rel = ||x - core|| / ||core||,
 * wrong = elements off by more than 2e-2 (1 + |core|), summed over ranks.
 *
 * -b: the backward instead (issue 12): fused = ncclMkRingAttentionBackward, core = our backward
 * core (mk_attn_bwd_launch) on the whole sequence on one GPU, no seq baseline; out and lse from
 * the forward (fused / core) first; FLOPs 2.5x the forward's; dq, dk, dv checked against the
 * core's rows (wrong = elements off by more than 2e-2 (1 + |core|) summed over the three).
 *
 * usage: ring_attn_perf [-b] [-n iters] [-w warmup] [-S comm_sms] [-J json] [-c list]
 *   -c: cases to run, comma-separated indices into the table below (default: all that fit).
 */
#include <nccl.h>
#include <string.h>
#include <unistd.h>

#include "attn.h"
#include "gemm_check.cuh"
#include "nccl_mk.h"
#include "nccl_ok.h"
#include "perf_launch.h"
#include "perf_median.h"
#include "perf_rank_reduce.cuh"
#include "ra_schedule.h"

struct pcase {
  int batch, s_local, heads, kv_heads, d, causal;
};
/* The issue's shapes: S = 16384 and 65536 causal (B=1, H=64, H_kv=8), B=16 H=16 S_local=4096
 * non-causal. */
static const struct pcase cases[] = {
    {1, 8192, 64, 8, 128, 1},
    {16, 4096, 16, 16, 128, 0},
    {1, 32768, 64, 8, 128, 1},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

struct opts {
  int nprocs, proc, iters, warmup, comm_sms, bwd;
  int use[NCASES];
  const char* json;
  char id[PERF_ID_HEX_LEN];
};

struct rank {
  int r, n;
  ncclComm_t comm;
  cudaStream_t s, s2;
  cudaEvent_t fork, join;
  struct pcase c;
  long seq;
  size_t nq, nkv, nl; /* local elements */
  void *q_g, *k_g, *v_g, *out_g; /* the whole sequence (core) */
  float* lse_g;
  void *q, *k, *v, *out, *core_rows; /* this rank's */
  float *lse;
  void *kv_recv[2], *out_step[2], *out_seq; /* seq baseline: peer's k|v, per-step out, merged */
  float *lse_step[2], *lse_seq;
  double* scratch;
  /* -b: dout, the fused gradients, the core's on the whole sequence and its workspace */
  void *dout, *dq, *dk, *dv, *dout_g, *dq_g, *dk_g, *dv_g, *core_rows_kv;
  float *delta_g, *dq_acc_g, *dkv_ws_g; /* dkv_ws_g: split GQA heads (attn.h), or NULL */
};

static int parse(int argc, char** argv, struct opts* o) {
  int c, launched = 0;
  o->nprocs = 2, o->iters = 10, o->warmup = 2;
  for (int i = 0; i < NCASES; i++) o->use[i] = 1;
  while ((c = getopt(argc, argv, "bn:w:S:J:c:P:I:")) != -1) {
    switch (c) {
      case 'b': o->bwd = 1; break;
      case 'n': o->iters = atoi(optarg); break;
      case 'w': o->warmup = atoi(optarg); break;
      case 'S': o->comm_sms = atoi(optarg); break;
      case 'J': o->json = optarg; break;
      case 'c':
        for (int i = 0; i < NCASES; i++) o->use[i] = 0;
        for (const char* p = optarg; *p;) {
          int i = atoi(p);
          if (i >= 0 && i < NCASES) o->use[i] = 1;
          p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
        }
        break;
      case 'P': o->proc = atoi(optarg), launched = 1; break;
      case 'I': snprintf(o->id, sizeof(o->id), "%s", optarg), launched = 1; break;
      default: return -1;
    }
  }
  return o->iters < 1 ? -1 : launched;
}

/* ---- the sequential baseline ---------------------------------------------------------------- */

/* out = merge of two partial results by their lse (natural log), in fp32; rows with nothing
 * visible in either get 0 and -inf. */
static __global__ void lse_merge_kernel(const __nv_bfloat16* o0, const float* l0, const __nv_bfloat16* o1,
                                        const float* l1, __nv_bfloat16* out, float* lse, int batch, int seq, int heads,
                                        int d) {
  const size_t n = (size_t)batch * seq * heads * d;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const size_t row = e / d; /* (b, i, h) */
    const int h = (int)(row % heads), i = (int)(row / heads % seq), b = (int)(row / heads / seq);
    const size_t li = ((size_t)b * heads + h) * seq + i;
    const float a = l0[li], c = l1[li], m = fmaxf(a, c);
    if (m == -INFINITY) {
      out[e] = __float2bfloat16(0.f);
      if (e % d == 0) lse[li] = -INFINITY;
      continue;
    }
    const float w0 = expf(a - m), w1 = expf(c - m), s = w0 + w1;
    out[e] = __float2bfloat16((w0 * __bfloat162float(o0[e]) + w1 * __bfloat162float(o1[e])) / s);
    if (e % d == 0) lse[li] = m + logf(s);
  }
}

/* Our core on this rank's queries against KV block `src` (its k, v at kb, vb) into out_s, lse_s:
 * per query half (causal: their positions differ) one launch with the block's two halves. */
static void core_step(struct rank* k, int src, const void* kb, const void* vb, void* out_s, float* lse_s) {
  const struct pcase c = k->c;
  const int halves = c.causal ? 2 : 1, rows = c.causal ? c.s_local / 2 : c.s_local;
  for (int qh = 0; qh < halves; qh++) {
    struct mk_attn_args a;
    memset(&a, 0, sizeof a);
    a.q = k->q, a.out = out_s, a.lse = lse_s;
    a.batch = c.batch, a.seq_q = c.s_local, a.heads = c.heads, a.kv_heads = c.kv_heads, a.d_head = c.d;
    a.causal = c.causal, a.q_row0 = qh * rows, a.q_rows = rows;
    a.q_pos0 = c.causal ? (long long)mk_ra_zigzag_chunk(k->r, k->n, qh) * rows : (long long)k->r * c.s_local;
    a.num_kv_blocks = halves;
    for (int kh = 0; kh < halves; kh++) {
      a.kv[kh].k = kb, a.kv[kh].v = vb, a.kv[kh].seq = c.s_local;
      a.kv[kh].row0 = kh * rows, a.kv[kh].rows = rows;
      a.kv[kh].pos0 = c.causal ? (long long)mk_ra_zigzag_chunk(src, k->n, kh) * rows : (long long)src * c.s_local;
    }
    if (mk_attn_fwd_launch(&a, k->s)) exit(1);
  }
}

static void run_seq(struct rank* k) {
  const int peer = 1 - k->r; /* 2 ranks */
  CUDA_OK(cudaEventRecord(k->fork, k->s));
  CUDA_OK(cudaStreamWaitEvent(k->s2, k->fork, 0));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(k->k, k->nkv, ncclBfloat16, peer, k->comm, k->s2));
  NCCL_OK(ncclSend(k->v, k->nkv, ncclBfloat16, peer, k->comm, k->s2));
  NCCL_OK(ncclRecv(k->kv_recv[0], k->nkv, ncclBfloat16, peer, k->comm, k->s2));
  NCCL_OK(ncclRecv(k->kv_recv[1], k->nkv, ncclBfloat16, peer, k->comm, k->s2));
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaEventRecord(k->join, k->s2));
  core_step(k, k->r, k->k, k->v, k->out_step[0], k->lse_step[0]);
  CUDA_OK(cudaStreamWaitEvent(k->s, k->join, 0));
  core_step(k, peer, k->kv_recv[0], k->kv_recv[1], k->out_step[1], k->lse_step[1]);
  const struct pcase c = k->c;
  lse_merge_kernel<<<1024, 256, 0, k->s>>>((const __nv_bfloat16*)k->out_step[0], k->lse_step[0],
                                           (const __nv_bfloat16*)k->out_step[1], k->lse_step[1],
                                           (__nv_bfloat16*)k->out_seq, k->lse_seq, c.batch, c.s_local, c.heads, c.d);
  CUDA_OK(cudaGetLastError());
}

/* ---- the variants ---------------------------------------------------------------------------- */

enum { V_FUSED, V_SEQ, V_CORE, NV };

static void run_fused(struct rank* k) {
  const struct pcase c = k->c;
  NCCL_OK(ncclMkRingAttention(k->q, k->k, k->v, k->out, k->lse, c.batch, c.s_local, c.heads, c.kv_heads, c.d,
                              c.causal, ncclBfloat16, k->comm, k->s));
}

static void run_core(struct rank* k) {
  const struct pcase c = k->c;
  struct mk_attn_args a;
  memset(&a, 0, sizeof a);
  a.q = k->q_g, a.out = k->out_g, a.lse = k->lse_g;
  a.batch = c.batch, a.seq_q = (int)k->seq, a.heads = c.heads, a.kv_heads = c.kv_heads, a.d_head = c.d;
  a.causal = c.causal, a.num_kv_blocks = 1;
  a.kv[0].k = k->k_g, a.kv[0].v = k->v_g, a.kv[0].seq = (int)k->seq;
  if (mk_attn_fwd_launch(&a, k->s)) exit(1);
}

static void run_fused_bwd(struct rank* k) {
  const struct pcase c = k->c;
  NCCL_OK(ncclMkRingAttentionBackward(k->q, k->k, k->v, k->out, k->lse, k->dout, k->dq, k->dk, k->dv, c.batch,
                                      c.s_local, c.heads, c.kv_heads, c.d, c.causal, ncclBfloat16, k->comm, k->s));
}

static struct mk_attn_bwd_args core_bwd_args(const struct rank* k) {
  const struct pcase c = k->c;
  struct mk_attn_bwd_args a;
  memset(&a, 0, sizeof a);
  a.q = k->q_g, a.out = k->out_g, a.dout = k->dout_g, a.lse = k->lse_g, a.delta = k->delta_g;
  a.dq_acc = k->dq_acc_g, a.dq = k->dq_g;
  a.batch = c.batch, a.seq_q = (int)k->seq, a.heads = c.heads, a.kv_heads = c.kv_heads, a.d_head = c.d;
  a.causal = c.causal, a.num_kv_blocks = 1;
  a.kv[0].k = k->k_g, a.kv[0].v = k->v_g, a.kv[0].dk = k->dk_g, a.kv[0].dv = k->dv_g, a.kv[0].seq = (int)k->seq;
  a.dkv_ws = k->dkv_ws_g;
  return a;
}

static void run_core_bwd(struct rank* k) {
  const struct mk_attn_bwd_args a = core_bwd_args(k);
  if (mk_attn_bwd_launch(&a, k->s)) exit(1);
}

/* -b has no seq variant (the row prints "-") */
static int variant_runs(const struct opts* o, int v) { return !(o->bwd && v == V_SEQ); }

static void run_variant(struct rank* k, const struct opts* o, int v) {
  if (v == V_FUSED) o->bwd ? run_fused_bwd(k) : run_fused(k);
  else if (v == V_SEQ) run_seq(k);
  else o->bwd ? run_core_bwd(k) : run_core(k);
}

/* rows r of a [B, S, width] bf16 tensor under the split (attn_check.cuh has the test's copy;
 * this harness does not include the float64 reference). */
static __global__ void take_rows_kernel(const __nv_bfloat16* g, __nv_bfloat16* l, int batch, long seq, long width,
                                        int rank, int nranks, int zigzag) {
  const long s_local = seq / nranks;
  const size_t n = (size_t)batch * s_local * width;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const long c = (long)(e % width), i = (long)(e / width % s_local), b = (long)(e / width / s_local);
    const long gi = zigzag ? mk_ra_zigzag_global_row(rank, nranks, s_local, i) : rank * s_local + i;
    l[e] = g[(b * seq + gi) * width + c];
  }
}

static __global__ void count_wrong_kernel(const __nv_bfloat16* x, const __nv_bfloat16* ref, size_t n,
                                          unsigned long long* wrong) {
  unsigned long long w = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float a = __bfloat162float(x[i]), r = __bfloat162float(ref[i]);
    w += !(fabsf(a - r) <= 2e-2f * (1.f + fabsf(r)));
  }
  atomicAdd(wrong, w);
}

static long count_wrong(const void* x, const void* ref, size_t n) {
  unsigned long long* d;
  unsigned long long h = 0;
  CUDA_OK(cudaMalloc(&d, sizeof h));
  CUDA_OK(cudaMemset(d, 0, sizeof h));
  count_wrong_kernel<<<1024, 256>>>((const __nv_bfloat16*)x, (const __nv_bfloat16*)ref, n, d);
  CUDA_OK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  cudaFree(d);
  return (long)h;
}

static void alloc_case_bwd(struct rank* k) {
  const size_t n = (size_t)k->n;
  CUDA_OK(cudaMalloc(&k->dout, k->nq * 2));
  CUDA_OK(cudaMalloc(&k->dq, k->nq * 2));
  CUDA_OK(cudaMalloc(&k->dk, k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->dv, k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->dout_g, n * k->nq * 2));
  CUDA_OK(cudaMalloc(&k->dq_g, n * k->nq * 2));
  CUDA_OK(cudaMalloc(&k->dk_g, n * k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->dv_g, n * k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->core_rows_kv, k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->delta_g, n * k->nl * 4));
  CUDA_OK(cudaMalloc(&k->dq_acc_g, n * k->nq * 4));
  k->dkv_ws_g = NULL;
  const struct mk_attn_bwd_args a = core_bwd_args(k);
  const size_t ws_floats = mk_attn_bwd_dkv_ws_floats(&a);
  if (ws_floats) CUDA_OK(cudaMalloc(&k->dkv_ws_g, ws_floats * 4));
  fill_random_bf16(k->dout_g, n * k->nq, 14, 1.0f);
  take_rows_kernel<<<1024, 256>>>((const __nv_bfloat16*)k->dout_g, (__nv_bfloat16*)k->dout, k->c.batch, k->seq,
                                  (long)k->c.heads * k->c.d, k->r, k->n, k->c.causal);
  /* the inputs the backward takes: out and lse of the forward (fused on the ranks, core whole) */
  run_fused(k);
  run_core(k);
  CUDA_OK(cudaDeviceSynchronize());
}

static void free_case_bwd(struct rank* k) {
  cudaFree(k->dout), cudaFree(k->dq), cudaFree(k->dk), cudaFree(k->dv), cudaFree(k->dout_g), cudaFree(k->dq_g);
  cudaFree(k->dk_g), cudaFree(k->dv_g), cudaFree(k->core_rows_kv), cudaFree(k->delta_g), cudaFree(k->dq_acc_g);
  cudaFree(k->dkv_ws_g);
}

static void alloc_case(struct rank* k, struct pcase c) {
  k->c = c, k->seq = (long)c.s_local * k->n;
  k->nq = (size_t)c.batch * c.s_local * c.heads * c.d, k->nkv = (size_t)c.batch * c.s_local * c.kv_heads * c.d;
  k->nl = (size_t)c.batch * c.heads * c.s_local;
  const size_t n = (size_t)k->n;
  CUDA_OK(cudaMalloc(&k->q_g, n * k->nq * 2));
  CUDA_OK(cudaMalloc(&k->k_g, n * k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->v_g, n * k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->out_g, n * k->nq * 2));
  CUDA_OK(cudaMalloc(&k->lse_g, n * k->nl * 4));
  CUDA_OK(cudaMalloc(&k->q, k->nq * 2));
  CUDA_OK(cudaMalloc(&k->k, k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->v, k->nkv * 2));
  CUDA_OK(cudaMalloc(&k->out, k->nq * 2));
  CUDA_OK(cudaMalloc(&k->core_rows, k->nq * 2));
  CUDA_OK(cudaMalloc(&k->lse, k->nl * 4));
  for (int i = 0; i < 2; i++) {
    CUDA_OK(cudaMalloc(&k->kv_recv[i], k->nkv * 2));
    CUDA_OK(cudaMalloc(&k->out_step[i], k->nq * 2));
    CUDA_OK(cudaMalloc(&k->lse_step[i], k->nl * 4));
  }
  CUDA_OK(cudaMalloc(&k->out_seq, k->nq * 2));
  CUDA_OK(cudaMalloc(&k->lse_seq, k->nl * 4));
  /* the same whole sequence on every rank; this rank's rows of it */
  fill_random_bf16(k->q_g, n * k->nq, 11, 2.0f);
  fill_random_bf16(k->k_g, n * k->nkv, 12, 2.0f);
  fill_random_bf16(k->v_g, n * k->nkv, 13, 1.0f);
  take_rows_kernel<<<1024, 256>>>((const __nv_bfloat16*)k->q_g, (__nv_bfloat16*)k->q, c.batch, k->seq,
                                  (long)c.heads * c.d, k->r, k->n, c.causal);
  take_rows_kernel<<<1024, 256>>>((const __nv_bfloat16*)k->k_g, (__nv_bfloat16*)k->k, c.batch, k->seq,
                                  (long)c.kv_heads * c.d, k->r, k->n, c.causal);
  take_rows_kernel<<<1024, 256>>>((const __nv_bfloat16*)k->v_g, (__nv_bfloat16*)k->v, c.batch, k->seq,
                                  (long)c.kv_heads * c.d, k->r, k->n, c.causal);
  CUDA_OK(cudaDeviceSynchronize());
}

static void free_case(struct rank* k) {
  cudaFree(k->q_g), cudaFree(k->k_g), cudaFree(k->v_g), cudaFree(k->out_g), cudaFree(k->lse_g);
  cudaFree(k->q), cudaFree(k->k), cudaFree(k->v), cudaFree(k->out), cudaFree(k->core_rows), cudaFree(k->lse);
  for (int i = 0; i < 2; i++) cudaFree(k->kv_recv[i]), cudaFree(k->out_step[i]), cudaFree(k->lse_step[i]);
  cudaFree(k->out_seq), cudaFree(k->lse_seq);
}

/* The core's rows of this rank of a [B, S, width] tensor into rows (the reference). */
static void core_rows_of(struct rank* k, const void* whole, void* rows, long width) {
  take_rows_kernel<<<1024, 256>>>((const __nv_bfloat16*)whole, (__nv_bfloat16*)rows, k->c.batch, k->seq, width, k->r,
                                  k->n, k->c.causal);
  CUDA_OK(cudaDeviceSynchronize());
}

/* Forward: fused and seq out against the core's rows. */
static void check_fwd(struct rank* k, double acc[4]) {
  run_core(k);
  run_fused(k);
  run_seq(k);
  CUDA_OK(cudaStreamSynchronize(k->s));
  core_rows_of(k, k->out_g, k->core_rows, (long)k->c.heads * k->c.d);
  const struct check_result cf = check_close((const __nv_bfloat16*)k->out, (const __nv_bfloat16*)k->core_rows, k->nq, 1e-2);
  const struct check_result cs =
      check_close((const __nv_bfloat16*)k->out_seq, (const __nv_bfloat16*)k->core_rows, k->nq, 1e-2);
  acc[0] = (double)count_wrong(k->out, k->core_rows, k->nq);
  acc[1] = (double)count_wrong(k->out_seq, k->core_rows, k->nq);
  acc[2] = cf.rel, acc[3] = cs.rel;
}

/* Backward: the fused dq, dk, dv against the core's rows (wrong summed, rel the largest). */
static void check_bwd(struct rank* k, double acc[4]) {
  run_core_bwd(k);
  run_fused_bwd(k);
  CUDA_OK(cudaStreamSynchronize(k->s));
  const long qw = (long)k->c.heads * k->c.d, kw = (long)k->c.kv_heads * k->c.d;
  const void* mine[3] = {k->dq, k->dk, k->dv};
  const void* whole[3] = {k->dq_g, k->dk_g, k->dv_g};
  acc[0] = acc[1] = acc[2] = acc[3] = 0;
  for (int g = 0; g < 3; g++) {
    void* rows = g == 0 ? k->core_rows : k->core_rows_kv;
    const size_t n = g == 0 ? k->nq : k->nkv;
    core_rows_of(k, whole[g], rows, g == 0 ? qw : kw);
    const struct check_result r = check_close((const __nv_bfloat16*)mine[g], (const __nv_bfloat16*)rows, n, 1e-2);
    acc[0] += (double)count_wrong(mine[g], rows, n);
    acc[2] = r.rel > acc[2] ? r.rel : acc[2];
  }
}

static void barrier(struct rank* k) {
  NCCL_OK(ncclAllReduce(k->scratch, k->scratch, 1, ncclFloat64, ncclSum, k->comm, k->s));
}

/* Sum (or max) over ranks of `count` doubles in v. */
static void reduce(struct rank* k, double* v, int count, ncclRedOp_t op) {
  perf_rank_reduce(v, count, op, k->scratch, k->comm, k->s);
}

static void time_case(struct rank* k, const struct opts* o, double med[NV]) {
  double* t = (double*)calloc(NV * o->iters, sizeof(double));
  cudaEvent_t ev[NV][2];
  for (int v = 0; v < NV; v++) {
    CUDA_OK(cudaEventCreate(&ev[v][0]));
    CUDA_OK(cudaEventCreate(&ev[v][1]));
  }
  for (int i = 0; i < o->warmup; i++)
    for (int v = 0; v < NV; v++) {
      if (!variant_runs(o, v)) continue;
      barrier(k);
      run_variant(k, o, v);
    }
  for (int i = 0; i < o->iters; i++) {
    for (int v = 0; v < NV; v++) {
      if (!variant_runs(o, v)) continue;
      barrier(k);
      CUDA_OK(cudaEventRecord(ev[v][0], k->s));
      run_variant(k, o, v);
      CUDA_OK(cudaEventRecord(ev[v][1], k->s));
    }
    CUDA_OK(cudaStreamSynchronize(k->s));
    for (int v = 0; v < NV; v++) {
      float ms = 0;
      if (!variant_runs(o, v)) {
        t[v * o->iters + i] = 0;
        continue;
      }
      CUDA_OK(cudaEventElapsedTime(&ms, ev[v][0], ev[v][1]));
      t[v * o->iters + i] = ms;
    }
  }
  for (int v = 0; v < NV; v++) med[v] = perf_median(t + v * o->iters, o->iters);
  reduce(k, med, NV, ncclMax);
  for (int v = 0; v < NV; v++) cudaEventDestroy(ev[v][0]), cudaEventDestroy(ev[v][1]);
  free(t);
}

static void rank_setup(struct rank* k, const struct opts* o) {
  memset(k, 0, sizeof *k);
  ncclUniqueId id;
  perf_hex_to_id(o->id, &id);
  k->r = o->proc, k->n = o->nprocs;
  CUDA_OK(cudaSetDevice(perf_rank_device(k->r)));
  CUDA_OK(cudaStreamCreateWithFlags(&k->s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&k->s2, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&k->fork, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&k->join, cudaEventDisableTiming));
  CUDA_OK(cudaMalloc((void**)&k->scratch, 8 * sizeof(double)));
  NCCL_OK(ncclCommInitRank(&k->comm, k->n, id, k->r));
  ncclMkConfig cfg;
  NCCL_OK(ncclMkConfigDefaults(&cfg));
  /* the data area: 512 MiB hold the peer's K and V of every case; the backward's also the fp32
   * dK/dV partials, delta and dq (3.2 GB at B = 16, S_local = 4096, H = 16) */
  cfg.max_m = 16384, cfg.max_k = o->bwd ? 131072 : 16384;
  cfg.comm_sms = o->comm_sms;
  NCCL_OK(ncclMkCommInit(k->comm, &cfg));
}

/* One case's row (and JSON line): med in ms, acc = fused wrong, seq wrong, fused rel, seq rel. */
static void print_case(const struct rank* k, const struct opts* o, const struct pcase& c, const double med[NV],
                       const double acc[4], int async_error, FILE* json) {
  const double half = (c.causal ? 0.5 : 1.0) * (o->bwd ? 2.5 : 1.0);
  const double flop_gpu = 4.0 * c.batch * c.heads * (double)c.s_local * k->seq * c.d * half;
  const double flop_core = 4.0 * c.batch * c.heads * (double)k->seq * k->seq * c.d * half;
  const double tf_f = flop_gpu / (med[V_FUSED] * 1e9);
  const double tf_s = med[V_SEQ] > 0 ? flop_gpu / (med[V_SEQ] * 1e9) : 0; /* 0: not run (-b) */
  const double tf_c = flop_core / (med[V_CORE] * 1e9);
  printf("%4d %7d %5ld %3d %4d %3d %6d | %6.3f %7.1f | %6.3f %7.1f | %8.3f %7.1f | %10.3f %9.3f | %.1e %5ld | %.1e %5ld%s\n",
         c.batch, c.s_local, k->seq, c.heads, c.kv_heads, c.d, c.causal, med[V_FUSED], tf_f, med[V_SEQ], tf_s,
         med[V_CORE], tf_c, tf_f / tf_c, med[V_SEQ] / med[V_FUSED], acc[2], (long)acc[0], acc[3], (long)acc[1],
         async_error ? "  ASYNC ERROR" : "");
  fflush(stdout);
  if (json)
    fprintf(json,
            "{\"op\": \"%s\", \"ranks\": %d, \"batch\": %d, \"s_local\": %d, \"seq\": %ld, \"heads\": %d, "
            "\"kv_heads\": %d, \"d\": %d, \"causal\": %d, \"fused_ms\": %.4f, \"fused_tflops\": %.1f, "
            "\"seq_ms\": %.4f, \"seq_tflops\": %.1f, \"core_ms\": %.4f, \"core_tflops\": %.1f, "
            "\"fused_rel\": %.3e, \"fused_wrong\": %ld, \"seq_rel\": %.3e, \"seq_wrong\": %ld}\n",
            o->bwd ? "ring_attn_bwd" : "ring_attn", k->n, c.batch, c.s_local, k->seq, c.heads, c.kv_heads, c.d,
            c.causal, med[V_FUSED], tf_f, med[V_SEQ], tf_s, med[V_CORE], tf_c, acc[2], (long)acc[0], acc[3],
            (long)acc[1]);
}

/* One case on every rank: checked, timed, printed by rank 0. Returns its wrong count (an
 * asynchronous error counts one). */
static long run_case(struct rank* k, const struct opts* o, const struct pcase& c, FILE* json) {
  alloc_case(k, c);
  if (o->bwd) alloc_case_bwd(k);
  double acc[4]; /* fused wrong, seq wrong, fused rel, seq rel */
  if (o->bwd) check_bwd(k, acc);
  else check_fwd(k, acc);
  reduce(k, acc, 2, ncclSum);
  reduce(k, acc + 2, 2, ncclMax);
  double med[NV];
  time_case(k, o, med);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclMkCommGetAsyncError(k->comm, &async, NULL, 0));
  if (k->r == 0) print_case(k, o, c, med, acc, async != ncclSuccess, json);
  if (o->bwd) free_case_bwd(k);
  free_case(k);
  return (long)acc[0] + (long)acc[1] + (async != ncclSuccess);
}

static int rank_main(const struct opts* o) {
  struct rank k;
  rank_setup(&k, o);
  FILE* json = k.r == 0 && o->json ? fopen(o->json, "w") : NULL;
  if (k.r == 0)
    printf("# ring_attn_perf%s on %d ranks, bf16, medians of %d (warm-up %d), ms, max over ranks; TFLOP/s per GPU\n"
           "#  B S_local     S   H H_kv   D causal |  fused TFLOP/s |    seq TFLOP/s | core(S, 1 GPU) TFLOP/s | "
           "fused/core fused/seq | fused rel wrong | seq rel wrong\n",
           o->bwd ? " -b (backward)" : "", k.n, o->iters, o->warmup);
  long wrong_total = 0;
  for (int ci = 0; ci < NCASES; ci++)
    if (o->use[ci]) wrong_total += run_case(&k, o, cases[ci], json);
  if (json) fclose(json);
  NCCL_OK(ncclMkCommRelease(k.comm));
  ncclCommDestroy(k.comm);
  return wrong_total ? 2 : 0;
}

int main(int argc, char** argv) {
  struct opts o;
  memset(&o, 0, sizeof o);
  const int launched = parse(argc, argv, &o);
  if (launched < 0) {
    fprintf(stderr, "usage: %s [-b] [-n iters] [-w warmup] [-S comm_sms] [-J json] [-c list]\n", argv[0]);
    return 2;
  }
  if (!launched) return perf_launch_local_or_skip(argc, argv, 2);
  return rank_main(&o);
}
