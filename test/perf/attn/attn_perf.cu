/*
 * attn_perf: TFLOP/s of the forward attention core (fused/common/attn.h) alone on one GPU, the
 * whole sequence as one KV block. FLOPs = 4 B H S S_kv D, halved for causal (the issue's count).
 * Random inputs (never zeros), warm-up, then the median (and min, max) of ITERS runs timed with
 * events; each run checks that no wait timed out. Correctness is test_attn's job (float64
 * reference at small shapes); here a first run's out is checked to be finite and written.
 * Usage: attn_perf [-b] [iters] [shape ...] with shapes B,H,H_kv,D,S,causal[,S_kv] (S queries
 * against S_kv keys, default S; causal: query i sees keys 0..i; default shapes: the issue's two
 * and their D = 64 twins). -b: the backward core instead (mk_attn_bwd_launch: delta,
 * the main kernel and dq's conversion, timed together; FLOPs = 2.5x the forward's, 10 B H S S_kv D,
 * halved for causal; out and lse from one forward run; #nonfinite over the first dq, dk, dv;
 * grouped-query heads at D = 128: each variant with the dkv_ws workspace, "bN", a CTA per query
 * head, and without, "bNg", a CTA per kv head's group; each also as one launch, "bNo" and "bNgo":
 * mk_attn_bwd_args.phase_words). MK_ATTN_VARIANTS=0,1,.. (default: every
 * compiled variant, attn.h; with -b the backward's) are timed interleaved, one row each.
 */
#include <algorithm>
#include <string.h>
#include <vector>
#include "attn.h"
#include "attn_run.h"
#include "gemm.h"
#include "gemm_check.cuh"

struct shape {
  int b, h, hkv, d, s, causal, skv;
};

static void print_row(const struct shape& sh, const char* var, const std::vector<float>& ms, double flops,
                      unsigned long long bad, int aborted) {
  std::vector<float> v = ms;
  std::sort(v.begin(), v.end());
  const float med = v[v.size() / 2];
  printf("%3d %4d %4d %4d %6d %6d %-10s %3s %9.3f %9.3f %9.3f %8.1f %10llu %s\n", sh.b, sh.h, sh.hkv, sh.d, sh.s,
         sh.skv, sh.causal ? "causal" : "non-causal", var, med, v.front(), v.back(), flops / (med * 1e-3) / 1e12, bad,
         aborted ? "TIMEOUT" : "ok");
}

/* Non-finite elements of a bf16 tensor (poisoned first: unwritten ones count). */
static __global__ void count_nonfinite(const __nv_bfloat16* p, size_t n, unsigned long long* bad) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    c += !isfinite(__bfloat162float(p[i]));
  atomicAdd(bad, c);
}

static int variants[MK_ATTN_VARIANTS > MK_ATTN_BWD_VARIANTS ? MK_ATTN_VARIANTS : MK_ATTN_BWD_VARIANTS], num_variants;

static void bench(struct shape sh, int iters) {
  const size_t nq = (size_t)sh.b * sh.s * sh.h * sh.d, nkv = (size_t)sh.b * sh.skv * sh.hkv * sh.d;
  void *q, *k, *v, *out;
  float* lse;
  struct mk_gemm_error* err;
  unsigned long long* bad;
  CUDA_OK(cudaMalloc(&q, nq * 2));
  CUDA_OK(cudaMalloc(&k, nkv * 2));
  CUDA_OK(cudaMalloc(&v, nkv * 2));
  CUDA_OK(cudaMalloc(&out, nq * 2));
  CUDA_OK(cudaMalloc(&lse, (size_t)sh.b * sh.h * sh.s * 4));
  CUDA_OK(cudaMalloc(&err, sizeof *err));
  CUDA_OK(cudaMalloc(&bad, sizeof *bad));
  CUDA_OK(cudaMemset(err, 0, sizeof *err));
  CUDA_OK(cudaMemset(bad, 0, sizeof *bad));
  fill_random_bf16(q, nq, 11, 2.0f);
  fill_random_bf16(k, nkv, 12, 2.0f);
  fill_random_bf16(v, nkv, 13, 1.0f);
  poison(out, nq * 2);
  struct mk_attn_args a = attn_whole_fwd_args(q, k, v, out, lse, sh.b, sh.s, sh.skv, sh.h, sh.hkv, sh.d, sh.causal);
  a.err = err;
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  std::vector<float> ms[MK_ATTN_VARIANTS];
  for (int it = -3; it < iters; it++)
    for (int vi = 0; vi < num_variants; vi++) {
      CUDA_OK(cudaEventRecord(e0));
      if (mk_attn_fwd_launch_variant(&a, 0, variants[vi]) != 0) exit(1);
      CUDA_OK(cudaEventRecord(e1));
      CUDA_OK(cudaEventSynchronize(e1));
      if (it == -3) { /* every variant's first output, poisoned before */
        count_nonfinite<<<1024, 256>>>((const __nv_bfloat16*)out, nq, bad);
        CUDA_OK(cudaGetLastError());
        poison(out, nq * 2);
      }
      float t;
      CUDA_OK(cudaEventElapsedTime(&t, e0, e1));
      if (it >= 0) ms[vi].push_back(t);
    }
  CUDA_OK(cudaDeviceSynchronize());
  struct mk_gemm_error he;
  unsigned long long hbad;
  CUDA_OK(cudaMemcpy(&he, err, sizeof he, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&hbad, bad, sizeof hbad, cudaMemcpyDeviceToHost));
  const double flops = 4.0 * sh.b * sh.h * (double)sh.s * sh.skv * sh.d / (sh.causal ? 2 : 1);
  for (int vi = 0; vi < num_variants; vi++) {
    char var[8];
    snprintf(var, sizeof var, "%d", variants[vi]);
    print_row(sh, var, ms[vi], flops, hbad, he.aborted);
  }
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(lse), cudaFree(err), cudaFree(bad);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
}

/* The backward core's tensors on one shape: inputs random, out and lse from one forward run,
 * the gradients poisoned. */
struct bwd_bufs {
  size_t nq, nkv;
  void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *delta, *dq_acc, *ws;
  uint64_t* words;
  struct mk_gemm_error* err;
  unsigned long long* bad;
};

static void bwd_bufs_alloc(struct bwd_bufs* t, const struct shape& sh) {
  const size_t nq = t->nq = (size_t)sh.b * sh.s * sh.h * sh.d;
  const size_t nkv = t->nkv = (size_t)sh.b * sh.skv * sh.hkv * sh.d;
  const size_t nl = (size_t)sh.b * sh.h * sh.s;
  void** half[] = {&t->q, &t->out, &t->dout, &t->dq, &t->k, &t->v, &t->dk, &t->dv};
  for (int i = 0; i < 8; i++) CUDA_OK(cudaMalloc(half[i], (i < 4 ? nq : nkv) * 2));
  CUDA_OK(cudaMalloc(&t->lse, nl * 4));
  CUDA_OK(cudaMalloc(&t->delta, nl * 4));
  CUDA_OK(cudaMalloc(&t->dq_acc, nq * 4));
  CUDA_OK(cudaMalloc(&t->err, sizeof *t->err));
  CUDA_OK(cudaMalloc(&t->bad, sizeof *t->bad));
  CUDA_OK(cudaMemset(t->err, 0, sizeof *t->err));
  CUDA_OK(cudaMemset(t->bad, 0, sizeof *t->bad));
  CUDA_OK(cudaMalloc(&t->words, MK_ATTN_BWD_PHASE_WORDS * sizeof(uint64_t)));
  CUDA_OK(cudaMemset(t->words, 0, MK_ATTN_BWD_PHASE_WORDS * sizeof(uint64_t)));
  t->ws = NULL;
  fill_random_bf16(t->q, nq, 11, 2.0f);
  fill_random_bf16(t->k, nkv, 12, 2.0f);
  fill_random_bf16(t->v, nkv, 13, 1.0f);
  fill_random_bf16(t->dout, nq, 14, 1.0f);
  poison(t->dq, nq * 2), poison(t->dk, nkv * 2), poison(t->dv, nkv * 2);
  struct mk_attn_args f =
      attn_whole_fwd_args(t->q, t->k, t->v, t->out, t->lse, sh.b, sh.s, sh.skv, sh.h, sh.hkv, sh.d, sh.causal);
  f.err = t->err;
  if (mk_attn_fwd_launch(&f, 0) != 0) exit(1);
}

static void bwd_bufs_free(struct bwd_bufs* t) {
  void* all[] = {t->q, t->out, t->dout, t->dq, t->k, t->v, t->dk, t->dv, t->lse, t->delta,
                 t->dq_acc, t->ws, t->words, t->err, t->bad};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cudaFree(all[i]);
}

/* Counts the first dq, dk, dv's non-finite elements, then poisons them again. */
static void bwd_check_written(const struct bwd_bufs* t) {
  count_nonfinite<<<1024, 256>>>((const __nv_bfloat16*)t->dq, t->nq, t->bad);
  count_nonfinite<<<1024, 256>>>((const __nv_bfloat16*)t->dk, t->nkv, t->bad);
  count_nonfinite<<<1024, 256>>>((const __nv_bfloat16*)t->dv, t->nkv, t->bad);
  CUDA_OK(cudaGetLastError());
  poison(t->dq, t->nq * 2), poison(t->dk, t->nkv * 2), poison(t->dv, t->nkv * 2);
}

/* Every run (variant x mode) timed interleaved, two warm-up rounds; mode bit 1: without the
 * workspace, bit 0: as one launch (phase words). */
static void bwd_time_runs(const struct bwd_bufs* t, struct mk_attn_bwd_args a, int modes, int iters,
                          std::vector<std::vector<float>>& ms) {
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  for (int it = -2; it < iters; it++) {
    for (size_t vi = 0; vi < ms.size(); vi++) {
      a.dkv_ws = vi % modes / 2 ? NULL : t->ws;
      a.phase_words = vi % 2 ? t->words : NULL;
      CUDA_OK(cudaEventRecord(e0));
      if (mk_attn_bwd_launch_variant(&a, 0, variants[vi / modes]) != 0) exit(1);
      CUDA_OK(cudaEventRecord(e1));
      CUDA_OK(cudaEventSynchronize(e1));
      if (it == -2) bwd_check_written(t); /* every run's first gradients */
      float ms_one;
      CUDA_OK(cudaEventElapsedTime(&ms_one, e0, e1));
      if (it >= 0) ms[vi].push_back(ms_one);
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
  cudaEventDestroy(e0), cudaEventDestroy(e1);
}

/* The backward core on one shape: one call = delta + the main kernel + dq's conversion.
 * Grouped-query heads: each variant with the workspace (a CTA per query head, "b0") and
 * without (a CTA per kv head's group, "b0g"), and each of those as one launch too ("o"). */
static void bench_bwd(struct shape sh, int iters) {
  struct bwd_bufs t;
  bwd_bufs_alloc(&t, sh);
  struct mk_attn_bwd_args a = attn_whole_bwd_args(t.q, t.k, t.v, t.out, t.lse, t.dout, t.dq, t.dk, t.dv, t.delta,
                                                  t.dq_acc, sh.b, sh.s, sh.skv, sh.h, sh.hkv, sh.d, sh.causal);
  a.err = t.err;
  const size_t ws_floats = mk_attn_bwd_dkv_ws_floats(&a);
  if (ws_floats) CUDA_OK(cudaMalloc(&t.ws, ws_floats * 4));
  const int modes = ws_floats ? 4 : 2, runs = num_variants * modes;
  std::vector<std::vector<float>> ms(runs);
  bwd_time_runs(&t, a, modes, iters, ms);
  struct mk_gemm_error he;
  unsigned long long hbad;
  CUDA_OK(cudaMemcpy(&he, t.err, sizeof he, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&hbad, t.bad, sizeof hbad, cudaMemcpyDeviceToHost));
  const double flops = 10.0 * sh.b * sh.h * (double)sh.s * sh.skv * sh.d / (sh.causal ? 2 : 1);
  for (int vi = 0; vi < runs; vi++) {
    char var[8];
    snprintf(var, sizeof var, "b%d%s%s", variants[vi / modes], vi % modes / 2 ? "g" : "", vi % 2 ? "o" : "");
    print_row(sh, var, ms[vi], flops, hbad, he.aborted);
  }
  fflush(stdout);
  bwd_bufs_free(&t);
}

int main(int argc, char** argv) {
  gpu_or_skip();
  int backward = 0;
  if (argc > 1 && !strcmp(argv[1], "-b")) backward = 1, argc--, argv++;
  int iters = argc > 1 ? atoi(argv[1]) : 20;
  if (iters < 1) iters = 20;
  std::vector<struct shape> shapes;
  for (int i = 2; i < argc; i++) {
    struct shape s;
    const int n = sscanf(argv[i], "%d,%d,%d,%d,%d,%d,%d", &s.b, &s.h, &s.hkv, &s.d, &s.s, &s.causal, &s.skv);
    if (n == 6) s.skv = s.s;
    if ((n != 6 && n != 7) || s.s < 1 || s.skv < 1) {
      fprintf(stderr, "bad shape '%s' (B,H,H_kv,D,S,causal[,S_kv])\n", argv[i]);
      return 2;
    }
    shapes.push_back(s);
  }
  if (shapes.empty())
    shapes = {{1, 64, 8, 128, 16384, 1, 16384}, {16, 16, 16, 128, 4096, 0, 4096}, {1, 64, 8, 64, 16384, 1, 16384},
              {16, 16, 16, 64, 4096, 0, 4096}};
  const char* vs = getenv("MK_ATTN_VARIANTS");
  const int nv = backward ? MK_ATTN_BWD_VARIANTS : MK_ATTN_VARIANTS;
  for (int v = 0; v < nv; v++) variants[num_variants++] = v;
  if (vs) {
    num_variants = 0;
    for (const char* c = vs; *c && num_variants < nv; c++)
      if (*c >= '0' && *c < '0' + nv) variants[num_variants++] = *c - '0';
  }
  if (backward) {
    printf("# attn_perf -b: backward attention core, one GPU, median of %d after 2 warm-up calls (delta + main kernel + dq conversion; FLOPs 10 B H S S_kv D, /2 causal; variants b0, b1, .. interleaved)\n", iters);
    printf("#  B    H H_kv    D      S   S_kv mask      var    med_ms    min_ms    max_ms   TFLOP/s  #nonfinite waits\n");
    for (const struct shape& s : shapes) bench_bwd(s, iters);
    return 0;
  }
  printf("# attn_perf: forward attention core, one GPU, median of %d after 3 warm-up runs (variants interleaved; #nonfinite: all variants' first outputs)\n", iters);
  printf("#  B    H H_kv    D      S   S_kv mask      var    med_ms    min_ms    max_ms   TFLOP/s  #nonfinite waits\n");
  for (const struct shape& s : shapes) bench(s, iters);
  return 0;
}
