/*
 * ncclMkRingAttention (issue 11) on 2 ranks, one process per GPU (perf_launch): every rank
 * builds the whole sequence's q, k, v from the same seeds, takes its rows (zigzag split when
 * causal, contiguous otherwise: attn_check.cuh), calls the op and checks its out and lse rows.
 *   small:            against the float64 reference (attn_check.cuh's checker): causal and
 *                     not, H = H_kv and GQA 8:1, D 64 and 128, S_local 77 (non-causal) and
 *                     128 .. 4096, chunks below, at and past a 128-row tile.
 *   large:            against the single-GPU core (mk_attn_fwd_launch) on the whole sequence,
 *                     S = 16384, H = 16, H_kv = 2, D = 128, causal and not.
 *   graph:            one call captured, replayed 5 times with fresh inputs, each checked.
 *   one_kernel:       the call captured alone is exactly one node, a kernel.
 *   back_to_back:     20 calls in a row into 20 outputs, rank 1 delayed at random before each.
 *   bad_input:        every bad call refused with its code, nothing launched, out untouched.
 *   negative_control: one element of out (then of lse) moved: the checker must reject it.
 *   absent_peer:      rank 1 never calls: rank 0's call ends in ncclRemoteError (timeout 2 s),
 *                     its next call fails at once.
 *   late_peer:        the ranks but 0 call after rank 0's call gave up: an error, or the right out and
 *                     lse (rank_harness.cuh rank_late_peer).
 *   peer_dies_mid_call: rank 1's process dies with its kernel in flight: rank 0's calls end in
 *                     ncclRemoteError, its GPU healthy (rank_harness.cuh).
 *   busy_sms, busy_sms_most: calls while another kernel holds a quarter (three quarters) of
 *                     the SMs (sm_hold.cuh): no timeout, checked out and lse, the SMs held
 *                     to the end of each call.
 * usage: test_ring_attn <scenario>; exit 77 with fewer than 2 GPUs.
 */
#include <nccl.h>
#include <string.h>
#include <unistd.h>
#include <vector>

#include "attn.h"
#include "attn_check.cuh"
#include "expect.h"
#include "graph_kernels.cuh"
#include "nccl_mk.h"
#include "nccl_ok.h"
#include "perf_launch.h"
#include "scenario_harness.cuh"



struct ra_case {
  int batch, s_local, heads, kv_heads, d, causal;
};

/* The whole sequence (g: global) and this rank's rows of it. */
struct ra_bufs {
  struct ra_case c;
  int rank;
  long seq;
  size_t nq_g, nkv_g, nl_g, nq, nkv, nl;
  void *q_g, *k_g, *v_g;
  double *ref_out_g, *ref_lse_g;
  void *q, *k, *v, *out;
  float* lse;
  double *ref_out, *ref_lse;
};

static void bufs_alloc(struct ra_bufs* b, struct ra_case c, int rank) {
  memset(b, 0, sizeof *b);
  b->c = c, b->rank = rank, b->seq = (long)c.s_local * g_nranks;
  b->nq = (size_t)c.batch * c.s_local * c.heads * c.d, b->nkv = (size_t)c.batch * c.s_local * c.kv_heads * c.d;
  b->nl = (size_t)c.batch * c.heads * c.s_local;
  b->nq_g = b->nq * g_nranks, b->nkv_g = b->nkv * g_nranks, b->nl_g = b->nl * g_nranks;
  CUDA_OK(cudaMalloc(&b->q_g, b->nq_g * 2));
  CUDA_OK(cudaMalloc(&b->k_g, b->nkv_g * 2));
  CUDA_OK(cudaMalloc(&b->v_g, b->nkv_g * 2));
  CUDA_OK(cudaMalloc(&b->ref_out_g, b->nq_g * 8));
  CUDA_OK(cudaMalloc(&b->ref_lse_g, b->nl_g * 8));
  CUDA_OK(cudaMalloc(&b->q, b->nq * 2));
  CUDA_OK(cudaMalloc(&b->k, b->nkv * 2));
  CUDA_OK(cudaMalloc(&b->v, b->nkv * 2));
  CUDA_OK(cudaMalloc(&b->out, b->nq * 2));
  CUDA_OK(cudaMalloc(&b->lse, b->nl * 4));
  CUDA_OK(cudaMalloc(&b->ref_out, b->nq * 8));
  CUDA_OK(cudaMalloc(&b->ref_lse, b->nl * 8));
}

static void bufs_free(struct ra_bufs* b) {
  cudaFree(b->q_g), cudaFree(b->k_g), cudaFree(b->v_g), cudaFree(b->ref_out_g), cudaFree(b->ref_lse_g);
  cudaFree(b->q), cudaFree(b->k), cudaFree(b->v), cudaFree(b->out), cudaFree(b->lse);
  cudaFree(b->ref_out), cudaFree(b->ref_lse);
}

/* Fresh inputs from `seed` (the same whole sequence on every rank), this rank's rows of them,
 * the float64 reference's rows (with_ref), out and lse poisoned; synchronous. */
static void bufs_fill(struct ra_bufs* b, uint64_t seed, int with_ref) {
  const struct ra_case c = b->c;
  const int zz = c.causal;
  fill_random_bf16(b->q_g, b->nq_g, seed, 2.0f); /* scores of a few units, as test_attn */
  fill_random_bf16(b->k_g, b->nkv_g, seed + 1, 2.0f);
  fill_random_bf16(b->v_g, b->nkv_g, seed + 2, 1.0f);
  attn_take_rank_rows((const __nv_bfloat16*)b->q_g, (__nv_bfloat16*)b->q, c.batch, b->seq, (long)c.heads * c.d,
                      b->rank, g_nranks, zz);
  attn_take_rank_rows((const __nv_bfloat16*)b->k_g, (__nv_bfloat16*)b->k, c.batch, b->seq, (long)c.kv_heads * c.d,
                      b->rank, g_nranks, zz);
  attn_take_rank_rows((const __nv_bfloat16*)b->v_g, (__nv_bfloat16*)b->v, c.batch, b->seq, (long)c.kv_heads * c.d,
                      b->rank, g_nranks, zz);
  if (with_ref) {
    ref_attn_f64(b->q_g, b->k_g, b->v_g, b->ref_out_g, b->ref_lse_g, c.batch, (int)b->seq, c.heads, c.kv_heads, c.d,
                 c.causal);
    attn_take_rank_rows(b->ref_out_g, b->ref_out, c.batch, b->seq, (long)c.heads * c.d, b->rank, g_nranks, zz);
    attn_take_rank_lse(b->ref_lse_g, b->ref_lse, c.batch, c.heads, b->seq, b->rank, g_nranks, zz);
  }
  poison(b->out, b->nq * 2);
  poison(b->lse, b->nl * 4);
  CUDA_OK(cudaDeviceSynchronize());
}

static ncclResult_t ra_call(struct rank_env* e, struct ra_bufs* b, void* out, float* lse) {
  const struct ra_case c = b->c;
  return ncclMkRingAttention(b->q, b->k, b->v, out, lse, c.batch, c.s_local, c.heads, c.kv_heads, c.d, c.causal,
                             ncclBfloat16, e->comm, e->stream);
}

static void ra_name(const struct ra_bufs* b, const char* prefix, char* what, size_t len) {
  const struct ra_case c = b->c;
  snprintf(what, len, "%srank %d B=%d S_local=%4d H=%2d H_kv=%d D=%3d %s", prefix, b->rank, c.batch, c.s_local,
           c.heads, c.kv_heads, c.d, c.causal ? "causal" : "non-causal");
}

static int ra_check(struct ra_bufs* b, const void* out, const float* lse, const char* prefix) {
  char what[160];
  ra_name(b, prefix, what, sizeof what);
  return attn_check(what, out, lse, b->ref_out, b->ref_lse, b->nq, b->nl);
}

/* No asynchronous error on the comm (a timed-out wait would leave a wrong result). */
static void run_case(struct rank_env* e, struct ra_case c, uint64_t seed) {
  struct ra_bufs b;
  bufs_alloc(&b, c, e->rank);
  bufs_fill(&b, seed, 1);
  NCCL_OK(ra_call(e, &b, b.out, b.lse));
  CUDA_OK(cudaStreamSynchronize(e->stream));
  char what[160];
  ra_name(&b, "", what, sizeof what);
  EXPECT(ra_check(&b, b.out, b.lse, ""), "%s: out or lse wrong", what);
  bufs_free(&b);
}

static void scenario_small(struct rank_env* e) {
  const int s_locals[] = {128, 130, 200, 256, 1024};
  int i = 0;
  for (int causal = 1; causal >= 0; causal--)
    for (int d = 64; d <= 128; d += 64)
      for (int s = 0; s < 5; s++) {
        run_case(e, {2, s_locals[s], 4, 4, d, causal}, g_seed + 10 * i++); /* H = H_kv */
        run_case(e, {1, s_locals[s], 8, 1, d, causal}, g_seed + 10 * i++); /* GQA 8:1 */
      }
  run_case(e, {2, 77, 4, 2, 128, 0}, g_seed + 10 * i++); /* a short last tile, not causal */
  run_case(e, {1, 2048, 8, 1, 128, 1}, g_seed + 10 * i++);
  run_case(e, {1, 4096, 2, 1, 128, 1}, g_seed + 10 * i++);
  run_case(e, {1, 4096, 2, 2, 64, 0}, g_seed + 10 * i++);
  expect_healthy(e);
}

static __global__ void to_double_kernel(const __nv_bfloat16* x, double* y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = (double)__bfloat162float(x[i]);
}
static __global__ void to_double_kernel(const float* x, double* y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = (double)x[i];
}

/* The core on the whole sequence (one GPU) is the reference: its rows of this rank, as double,
 * through the same checker. */
static void large_case(struct rank_env* e, struct ra_case c, uint64_t seed) {
  struct ra_bufs b;
  bufs_alloc(&b, c, e->rank);
  bufs_fill(&b, seed, 0);
  void* core_out;
  float* core_lse;
  CUDA_OK(cudaMalloc(&core_out, b.nq_g * 2));
  CUDA_OK(cudaMalloc(&core_lse, b.nl_g * 4));
  struct mk_attn_args a;
  memset(&a, 0, sizeof a);
  a.q = b.q_g, a.out = core_out, a.lse = core_lse;
  a.batch = c.batch, a.seq_q = (int)b.seq, a.heads = c.heads, a.kv_heads = c.kv_heads, a.d_head = c.d;
  a.causal = c.causal, a.num_kv_blocks = 1;
  a.kv[0].k = b.k_g, a.kv[0].v = b.v_g, a.kv[0].seq = (int)b.seq;
  EXPECT(mk_attn_fwd_launch(&a, 0) == 0, "the core refused the whole sequence");
  to_double_kernel<<<1024, 256>>>((const __nv_bfloat16*)core_out, b.ref_out_g, b.nq_g);
  to_double_kernel<<<1024, 256>>>(core_lse, b.ref_lse_g, b.nl_g);
  attn_take_rank_rows(b.ref_out_g, b.ref_out, c.batch, b.seq, (long)c.heads * c.d, b.rank, g_nranks, c.causal);
  attn_take_rank_lse(b.ref_lse_g, b.ref_lse, c.batch, c.heads, b.seq, b.rank, g_nranks, c.causal);
  CUDA_OK(cudaDeviceSynchronize());
  NCCL_OK(ra_call(e, &b, b.out, b.lse));
  CUDA_OK(cudaStreamSynchronize(e->stream));
  EXPECT(ra_check(&b, b.out, b.lse, "vs core: "), "rank %d: the ring differs from the core on one GPU", e->rank);
  cudaFree(core_out), cudaFree(core_lse);
  bufs_free(&b);
}

static void scenario_large(struct rank_env* e) {
  large_case(e, {1, 8192, 16, 2, 128, 1}, g_seed + 1);
  large_case(e, {1, 8192, 16, 2, 128, 0}, g_seed + 2);
  large_case(e, {2, 2048, 8, 8, 64, 1}, g_seed + 3);
  expect_healthy(e);
}

static void capture(struct rank_env* e, struct ra_bufs* b, cudaGraph_t* graph) {
  CUDA_OK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeGlobal));
  NCCL_OK(ra_call(e, b, b->out, b->lse));
  CUDA_OK(cudaStreamEndCapture(e->stream, graph));
}

static void scenario_graph(struct rank_env* e) {
  struct ra_bufs b;
  bufs_alloc(&b, {1, 384, 8, 1, 128, 1}, e->rank);
  bufs_fill(&b, g_seed, 0);
  NCCL_OK(ra_call(e, &b, b.out, b.lse)); /* warm-up outside capture */
  CUDA_OK(cudaStreamSynchronize(e->stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  capture(e, &b, &graph);
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 5; rep++) {
    bufs_fill(&b, g_seed + 100 + 10 * rep, 1);
    CUDA_OK(cudaGraphLaunch(exec, e->stream));
    CUDA_OK(cudaStreamSynchronize(e->stream));
    EXPECT(ra_check(&b, b.out, b.lse, "replay: "), "rank %d: graph replay %d wrong", e->rank, rep);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  bufs_free(&b);
  expect_healthy(e);
}

static void scenario_one_kernel(struct rank_env* e) {
  struct ra_bufs b;
  bufs_alloc(&b, {1, 256, 8, 1, 128, 1}, e->rank);
  bufs_fill(&b, g_seed, 0);
  for (int causal = 0; causal < 2; causal++) {
    b.c.causal = causal;
    cudaGraph_t graph;
    capture(e, &b, &graph);
    size_t nodes = 0;
    const size_t kernels = graph_kernel_nodes(graph, &nodes);
    cudaGraphDestroy(graph);
    printf("rank %d: ncclMkRingAttention (%s) captured as %zu node(s), %zu kernel(s)\n", e->rank,
           causal ? "causal" : "non-causal", nodes, kernels);
    EXPECT(nodes == 1 && kernels == 1, "rank %d: not exactly one kernel", e->rank);
  }
  bufs_free(&b);
  expect_healthy(e);
}

static void scenario_back_to_back(struct rank_env* e) {
  enum { CALLS = 20 };
  const struct ra_case c = {1, 256, 8, 1, 128, 1};
  struct ra_bufs b[CALLS];
  srand((unsigned)g_seed + e->rank);
  for (int i = 0; i < CALLS; i++) bufs_alloc(&b[i], c, e->rank), bufs_fill(&b[i], g_seed + 10 * i, 1);
  for (int i = 0; i < CALLS; i++) {
    if (e->rank == 1) usleep((useconds_t)(rand() % 3000));
    NCCL_OK(ra_call(e, &b[i], b[i].out, b[i].lse));
  }
  CUDA_OK(cudaStreamSynchronize(e->stream));
  int wrong = 0;
  for (int i = 0; i < CALLS; i++) wrong += !ra_check(&b[i], b[i].out, b[i].lse, "b2b: ");
  EXPECT(wrong == 0, "rank %d: %d of %d back-to-back calls wrong", e->rank, wrong, CALLS);
  for (int i = 0; i < CALLS; i++) bufs_free(&b[i]);
  expect_healthy(e);
}

/* Tensor i of a call that is refused before it reads anything: 4 GiB past `base` per index,
 * so that extents of up to 4 GiB overlap nothing. */
static void* far(void* base, int i) { return (char*)base + (size_t)i * ((size_t)4 << 30); }

static void scenario_bad_input(struct rank_env* e) {
  struct ra_bufs b;
  bufs_alloc(&b, {1, 256, 8, 2, 128, 1}, e->rank);
  bufs_fill(&b, g_seed, 0);
  void *q = b.q, *k = b.k, *v = b.v, *o = b.out;
  float* l = b.lse;
  ncclComm_t cm = e->comm;
  cudaStream_t s = e->stream;
  const ncclDataType_t bf = ncclBfloat16;
  struct {
    ncclResult_t got, want;
    const char* what;
  } cases[] = {
      {ncclMkRingAttention(NULL, k, v, o, l, 1, 256, 8, 2, 128, 1, bf, cm, s), ncclInvalidArgument, "q NULL"},
      {ncclMkRingAttention(q, k, v, NULL, l, 1, 256, 8, 2, 128, 1, bf, cm, s), ncclInvalidArgument, "out NULL"},
      {ncclMkRingAttention(q, (char*)k + 2, v, o, l, 1, 256, 8, 2, 128, 1, bf, cm, s), ncclInvalidArgument,
       "misaligned k"},
      {ncclMkRingAttention(q, k, v, o, (float*)((char*)l + 2), 1, 256, 8, 2, 128, 1, bf, cm, s), ncclInvalidArgument,
       "misaligned lse"},
      {ncclMkRingAttention(q, k, v, o, l, 1, 256, 8, 2, 96, 1, bf, cm, s), ncclInvalidArgument, "D = 96"},
      {ncclMkRingAttention(q, k, v, o, l, 1, 256, 6, 4, 128, 1, bf, cm, s), ncclInvalidArgument, "H 6, H_kv 4"},
      {ncclMkRingAttention(q, k, v, o, l, 1, 0, 8, 2, 128, 0, bf, cm, s), ncclInvalidArgument, "S_local 0"},
      {ncclMkRingAttention(q, k, v, o, l, 1, 255, 8, 2, 128, 1, bf, cm, s), ncclInvalidArgument,
       "odd S_local, causal"},
      {ncclMkRingAttention(q, k, v, o, l, 0, 256, 8, 2, 128, 1, bf, cm, s), ncclInvalidArgument, "B = 0"},
      {ncclMkRingAttention(q, k, v, o, l, 1, 256, 8, 2, 128, 2, bf, cm, s), ncclInvalidArgument, "causal = 2"},
      {ncclMkRingAttention(q, k, v, o, l, 1, 256, 8, 2, 128, 1, ncclFloat32, cm, s), ncclInvalidUsage, "fp32"},
      {ncclMkRingAttention(q, k, v, o, l, 1, 256, 8, 2, 128, 1, bf, NULL, s), ncclInvalidArgument, "comm NULL"},
      {ncclMkRingAttention(q, k, v, o, l, 1, 256, 8, 2, 128, 1, bf, (ncclComm_t)&b, s), ncclInvalidUsage,
       "comm without ncclMkCommInit"},
      {ncclMkRingAttention(q, k, v, q, l, 1, 256, 8, 2, 128, 1, bf, cm, s), ncclInvalidArgument, "out = q"},
      {ncclMkRingAttention(q, k, v, o, (float*)v, 1, 256, 8, 2, 128, 1, bf, cm, s), ncclInvalidArgument,
       "lse on v"},
      /* 2 x 65536 x 8 x 128 x 2 B of K/V from the peer: more than the default 128 MiB workspace;
       * tensors of that shape would overlap the small buffers (refused first, as bad arguments):
       * 4 GiB apart here, never dereferenced (the call is refused before any launch) */
      {ncclMkRingAttention(far(q, 0), far(q, 1), far(q, 2), far(q, 3), (float*)far(q, 4), 1, 65536, 64, 8, 128, 1,
                           bf, cm, s), ncclInvalidUsage, "workspace too small"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    EXPECT(cases[i].got == cases[i].want, "rank %d: %s: got %d, want %d", e->rank, cases[i].what, (int)cases[i].got,
           (int)cases[i].want);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT(all_bytes_are(b.out, b.nq * 2, 0xFF), "rank %d: out written by a refused call", e->rank);
  EXPECT(all_bytes_are(b.lse, b.nl * 4, 0xFF), "rank %d: lse written by a refused call", e->rank);
  printf("rank %d: %zu bad calls refused, outputs untouched\n", e->rank, sizeof cases / sizeof cases[0]);
  bufs_free(&b);
  expect_healthy(e);
}

static void scenario_negative_control(struct rank_env* e) {
  struct ra_bufs b;
  bufs_alloc(&b, {1, 256, 8, 1, 128, 1}, e->rank);
  bufs_fill(&b, g_seed, 1);
  NCCL_OK(ra_call(e, &b, b.out, b.lse));
  CUDA_OK(cudaStreamSynchronize(e->stream));
  EXPECT(ra_check(&b, b.out, b.lse, "correct: "), "rank %d: the correct output must pass", e->rank);
  const size_t at = b.nq / 2 + 77, at_lse = b.nl / 3 + 5;
  nudge((__nv_bfloat16*)b.out, at, 0.1);
  EXPECT(!ra_check(&b, b.out, b.lse, "out + 0.1: "), "rank %d: one element of out off by 0.1 passed", e->rank);
  nudge((__nv_bfloat16*)b.out, at, -0.1);
  nudge(b.lse, at_lse, 0.01);
  EXPECT(!ra_check(&b, b.out, b.lse, "lse + 0.01: "), "rank %d: one element of lse off by 0.01 passed", e->rank);
  bufs_free(&b);
  expect_healthy(e);
}

static void scenario_absent_peer(struct rank_env* e) {
  struct ra_bufs b;
  bufs_alloc(&b, {1, 1024, 8, 1, 128, 1}, e->rank);
  bufs_fill(&b, g_seed, 0);
  if (e->rank == 0) {
    NCCL_OK(ra_call(e, &b, b.out, b.lse));
    CUDA_OK(cudaStreamSynchronize(e->stream));
    ncclResult_t async = ncclSuccess;
    char msg[256] = "";
    NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof msg));
    printf("rank 0: asynchronous error %d: %s\n", (int)async, msg);
    EXPECT(async == ncclRemoteError, "a call without its peer must end in ncclRemoteError");
    EXPECT(strstr(msg, "rank 0: ncclMkRingAttention (op 0x6)") != NULL, "the error names rank 0 and the ring attention op");
    EXPECT(ra_call(e, &b, b.out, b.lse) == ncclRemoteError, "the next call must fail at once");
  }
  ranks_barrier(e);
  bufs_free(&b);
}

static ncclResult_t ra_call_bufs(void* e, void* bufs) {
  struct ra_bufs* b = (struct ra_bufs*)bufs;
  return ra_call((struct rank_env*)e, b, b->out, b->lse);
}

/* rank_harness.cuh's rank_late_peer: rank 0's forward gives up without its peers, then they
 * call (an error, or the right out and lse; never stale K/V). */
struct late_bufs { struct ra_bufs b; uint64_t seed; }; /* b first: ra_call_bufs takes it */

static void late_fill(void* e, void* arg) {
  (void)e;
  struct late_bufs* l = (struct late_bufs*)arg;
  l->seed += 7;
  bufs_fill(&l->b, l->seed, 1);
}

static int late_check(void* e, void* arg) {
  (void)e;
  struct ra_bufs* b = (struct ra_bufs*)arg;
  return ra_check(b, b->out, b->lse, "late: ");
}

static void scenario_late_peer(struct rank_env* e) {
  struct late_bufs l;
  l.seed = g_seed;
  bufs_alloc(&l.b, {1, 1024, 8, 1, 128, 1}, e->rank);
  const struct rank_late_op op = {ra_call_bufs, late_fill, late_check, NULL, NULL};
  failures += rank_late_peer(e->rank, e->comm, e->stream, &op, e, &l);
  bufs_free(&l.b);
}

/* Each case called while held_of_4 quarters of the SMs are held by another kernel
 * (scenario_harness.cuh held_call): the op's CTAs wait for the peer's chunks, which must not
 * depend on CTAs that cannot start. */
static void busy_sms_run(struct rank_env* e, int held_of_4) {
  const struct ra_case cases[] = {{1, 4096, 8, 1, 128, 1}, {2, 2048, 4, 4, 128, 0}, {1, 4096, 2, 2, 64, 0}};
  for (int i = 0; i < 3; i++) {
    struct ra_bufs b;
    bufs_alloc(&b, cases[i], e->rank);
    bufs_fill(&b, g_seed + 10 * i, 1);
    const struct held_call h = held_call(e, held_of_4, ra_call_bufs, &b);
    char what[160];
    ra_name(&b, "", what, sizeof what);
    printf("%s with %d of %d SMs held: %.1f ms\n", what, h.started, h.sms, h.ms);
    expect_healthy(e);
    EXPECT(ra_check(&b, b.out, b.lse, ""), "%s: out or lse wrong with the SMs held", what);
    bufs_free(&b);
  }
}

/* rank_harness.cuh's rank_peer_dies_mid_call: rank 1's process dies while its kernel waits for
 * rank 0's blocks. */
static void scenario_peer_dies_mid_call(struct rank_env* e) {
  struct ra_bufs b;
  bufs_alloc(&b, {1, 1024, 8, 1, 128, 1}, e->rank);
  bufs_fill(&b, g_seed, 0);
  rank_peer_dies_mid_call(e->rank, e->comm, e->stream, "peer_dies_mid_call", ra_call_bufs, e, &b, failures);
}

static void scenario_busy_sms(struct rank_env* e) { busy_sms_run(e, 1); }
static void scenario_busy_sms_most(struct rank_env* e) { busy_sms_run(e, 3); }

static const struct named_scenario scenarios[] = {
    {"small", scenario_small},
    {"large", scenario_large},
    {"graph", scenario_graph},
    {"one_kernel", scenario_one_kernel},
    {"back_to_back", scenario_back_to_back},
    {"bad_input", scenario_bad_input},
    {"negative_control", scenario_negative_control},
    {"absent_peer", scenario_absent_peer},
    {"late_peer", scenario_late_peer},
    {"peer_dies_mid_call", scenario_peer_dies_mid_call},
    {"busy_sms", scenario_busy_sms},
    {"busy_sms_most", scenario_busy_sms_most},
};

int main(int argc, char** argv) {
  return scenario_main(argc, argv, scenarios, (int)(sizeof scenarios / sizeof *scenarios), NULL);
}
