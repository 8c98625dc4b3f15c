/*
 * gemm_perf: our GEMM core against cuBLASLt on the same random inputs in the same run,
 * interleaved, median of ITERS timed runs each after warm-up; input sets rotate when they
 * would fit in L2. Prints M N K, both TFLOP/s, the ratio and the agreement of the outputs,
 * then the median and min ratio. Usage: gemm_perf [quick|full] [iters] [variants] [group_m] [num_sms]
 * (variants: comma-separated configuration numbers of gemm.cu, first is reported; default 0;
 * 100 + v: configuration v on the claimed walk, through a one-rank call bracket, as the fused
 * ops launch it: what the claims cost beside the static walk on a whole GPU).
 * `gemm_perf trace [iters]`: what the trace hooks cost: the same GEMM with its trace pointer
 * NULL (off) and with a trace buffer (on), interleaved, in rounds; prints both medians, the
 * difference and the run-to-run spread (max - min of the off rounds' medians).
 * `gemm_perf fp8 [iters] [precise]`: e4m3 operands with per-tensor scales (configuration 0)
 * against cuBLASLt's fp8 GEMM on the same shapes and scales (as its alpha: gemm_check.cuh), both bf16 out. cuBLASLt
 * runs with fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM: no periodic promotion, the
 * accumulation our kernel does); `precise` times its default, promoted accumulation instead.
 */
#include <algorithm>
#include <string.h>
#include <vector>
#include "ag_push.h" /* mk_ag_call_words: the fused ops' call words */
#include "gemm_tune.h"
#include "gemm_check.cuh"
#include "trace.h"

struct shape { int m, n, k; };

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#define MAX_VARIANTS 4
static int variants[MAX_VARIANTS] = {0}, num_variants = 1, group_m = 0, num_sms = 0;
static int fp8 = 0, lt_fast_accum = 1; /* gemm_perf fp8 [iters] [precise] */

struct result { struct shape s; double ours[MAX_VARIANTS], lt, rel; };

/* Variant 100 + v (see the usage): a one-rank call bracket over four device words laid out as
 * a fused op's (ag_push.h: done, call, exits, claims; 0 between calls, the last CTA zeroes the
 * counter). */
#define CLAIMED_VARIANT 100
static void claimed_call_init(struct mk_gemm_call* call, uint64_t* words) {
  mk_ag_call_words(call, 0, 1, words, 0, 0);
  mk_ag_call_claims(call, words);
}

static int launch_variant(struct mk_gemm_args* g, const struct mk_gemm_call* call, int variant) {
  g->call = variant >= CLAIMED_VARIANT ? call : NULL;
  g->block_m = variant % CLAIMED_VARIANT == 4 ? 64 : 0; /* configuration 4 is the 64-row tiles */
  return mk_gemm_launch_variant(g, 0, variant % CLAIMED_VARIANT);
}

/* Input sets (A, B) of the operand type, as many as keep 3x L2 rotating (at most 4). */
static int alloc_inputs(struct shape s, size_t l2_bytes, std::vector<void*>& a, std::vector<void*>& b) {
  const size_t eb = fp8 ? 1 : 2, ab = ((size_t)s.m * s.k + (size_t)s.n * s.k) * eb;
  const int sets = (int)std::min<size_t>(4, std::max<size_t>(1, (3 * l2_bytes + ab - 1) / ab));
  a.resize(sets), b.resize(sets);
  for (int i = 0; i < sets; i++) {
    CUDA_OK(cudaMalloc(&a[i], (size_t)s.m * s.k * eb));
    CUDA_OK(cudaMalloc(&b[i], (size_t)s.n * s.k * eb));
    if (fp8) {
      fill_random_e4m3(a[i], (size_t)s.m * s.k, 1000 + 2 * i, 4.0f);
      fill_random_e4m3(b[i], (size_t)s.n * s.k, 1001 + 2 * i, 4.0f);
    } else {
      fill_random_bf16(a[i], (size_t)s.m * s.k, 1000 + 2 * i, 1.0f);
      fill_random_bf16(b[i], (size_t)s.n * s.k, 1001 + 2 * i, 1.0f);
    }
  }
  return sets;
}

static struct result bench_shape(struct shape s, int iters, size_t l2_bytes) {
  std::vector<void*> a, b;
  const int sets = alloc_inputs(s, l2_bytes, a, b);
  float* scales = NULL; /* fp8: non-unit per-tensor scales, the same pointers for ours and cuBLASLt */
  const float hs[2] = {0.75f, 1.5f};
  CUDA_OK(cudaMalloc(&scales, sizeof(hs)));
  CUDA_OK(cudaMemcpy(scales, hs, sizeof(hs), cudaMemcpyHostToDevice));
  void *c_ours, *c_lt;
  CUDA_OK(cudaMalloc(&c_ours, (size_t)s.m * s.n * 2));
  CUDA_OK(cudaMalloc(&c_lt, (size_t)s.m * s.n * 2));
  poison(c_ours, (size_t)s.m * s.n * 2);
  poison(c_lt, (size_t)s.m * s.n * 2);
  struct lt_gemm lt;
  if (fp8) lt_gemm_init_e4m3(&lt, s.m, s.n, s.k, scales, scales + 1, lt_fast_accum);
  else lt_gemm_init(&lt, s.m, s.n, s.k);
  struct mk_gemm_args g;
  memset(&g, 0, sizeof(g));
  g.m = s.m; g.n = s.n; g.k = s.k; g.c = c_ours;
  if (fp8) g.dtype = MK_GEMM_E4M3, g.scale_a = scales, g.scale_b = scales + 1;
  g.raster_group_m = group_m;
  g.num_sms = num_sms;
  uint64_t* call_words;
  CUDA_OK(cudaMalloc((void**)&call_words, 4 * sizeof(uint64_t)));
  CUDA_OK(cudaMemset(call_words, 0, 4 * sizeof(uint64_t)));
  struct mk_gemm_call call;
  claimed_call_init(&call, call_words);
  cudaEvent_t ev[MAX_VARIANTS + 2];
  for (int i = 0; i < MAX_VARIANTS + 2; i++) CUDA_OK(cudaEventCreate(&ev[i]));
  std::vector<float> t_ours[MAX_VARIANTS], t_lt;
  for (int it = -3; it < iters; it++) {
    const int set = (it + 3) % sets;
    g.a = a[set]; g.b = b[set];
    CUDA_OK(cudaEventRecord(ev[0]));
    for (int v = 0; v < num_variants; v++) {
      if (launch_variant(&g, &call, variants[v]) != 0) exit(1);
      CUDA_OK(cudaEventRecord(ev[v + 1]));
    }
    lt_gemm_run(&lt, a[set], b[set], c_lt, 0);
    CUDA_OK(cudaEventRecord(ev[num_variants + 1]));
    CUDA_OK(cudaEventSynchronize(ev[num_variants + 1]));
    float ms;
    for (int v = 0; v <= num_variants; v++) {
      CUDA_OK(cudaEventElapsedTime(&ms, ev[v], ev[v + 1]));
      if (it >= 0) (v < num_variants ? t_ours[v] : t_lt).push_back(ms);
    }
  }
  /* the output checked is the last variant's */
  struct check_result r = check_close((const __nv_bfloat16*)c_ours, (const __nv_bfloat16*)c_lt, (size_t)s.m * s.n, 1e-2);
  const double flop = 2.0 * s.m * s.n * s.k;
  struct result res;
  res.s = s;
  for (int v = 0; v < num_variants; v++) res.ours[v] = flop / (median(t_ours[v]) * 1e-3) * 1e-12;
  res.lt = flop / (median(t_lt) * 1e-3) * 1e-12;
  res.rel = r.pass ? r.rel : -1;
  lt_gemm_fini(&lt);
  for (int i = 0; i < MAX_VARIANTS + 2; i++) cudaEventDestroy(ev[i]);
  for (int i = 0; i < sets; i++) { cudaFree(a[i]); cudaFree(b[i]); }
  cudaFree(c_ours); cudaFree(c_lt); cudaFree(scales); cudaFree(call_words);
  return res;
}

/* A device trace buffer for `ctas` CTAs, header and ring table filled as the library does. */
static struct mk_trace_buf* trace_buffer_alloc(int ctas) {
  const uint32_t nrings = (uint32_t)ctas * MK_TRACE_LANES, capacity = 1024;
  const size_t bytes = mk_trace_buf_bytes(nrings, capacity);
  std::vector<char> host(bytes, 0);
  mk_trace_init_header((struct mk_trace_buf*)host.data(), 0, 1, 0, (uint32_t)ctas, capacity);
  struct mk_trace_buf* dev;
  CUDA_OK(cudaMalloc((void**)&dev, bytes));
  CUDA_OK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
  return dev;
}

static int trace_overhead(int iters, int sms) {
  const struct shape shapes[] = {{4096, 8192, 8192}, {8192, 8192, 8192}, {2048, 8192, 8192}};
  const int rounds = 7;
  struct mk_trace_buf* trace = trace_buffer_alloc(sms);
  printf("trace overhead: GEMM core, trace off vs on, interleaved, %d rounds x %d runs\n", rounds, iters);
  printf("%6s %6s %6s %9s %9s %8s %9s %s\n", "M", "N", "K", "off ms", "on ms", "on-off", "spread", "within");
  for (const struct shape& s : shapes) {
    void *a, *b, *c;
    CUDA_OK(cudaMalloc(&a, (size_t)s.m * s.k * 2));
    CUDA_OK(cudaMalloc(&b, (size_t)s.n * s.k * 2));
    CUDA_OK(cudaMalloc(&c, (size_t)s.m * s.n * 2));
    fill_random_bf16(a, (size_t)s.m * s.k, 1, 1.0f);
    fill_random_bf16(b, (size_t)s.n * s.k, 2, 1.0f);
    struct mk_gemm_args g;
    memset(&g, 0, sizeof(g));
    g.m = s.m, g.n = s.n, g.k = s.k, g.a = a, g.b = b, g.c = c;
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) CUDA_OK(cudaEventCreate(&ev[i]));
    std::vector<float> off_rounds, on_rounds;
    for (int r = 0; r < rounds; r++) {
      std::vector<float> off, on;
      for (int it = -2; it < iters; it++) {
        CUDA_OK(cudaEventRecord(ev[0]));
        g.trace = NULL;
        if (mk_gemm_launch(&g, 0)) return 1;
        CUDA_OK(cudaEventRecord(ev[1]));
        g.trace = trace;
        if (mk_gemm_launch(&g, 0)) return 1;
        CUDA_OK(cudaEventRecord(ev[2]));
        CUDA_OK(cudaEventSynchronize(ev[2]));
        float t0, t1;
        CUDA_OK(cudaEventElapsedTime(&t0, ev[0], ev[1]));
        CUDA_OK(cudaEventElapsedTime(&t1, ev[1], ev[2]));
        if (it >= 0) off.push_back(t0), on.push_back(t1);
      }
      off_rounds.push_back(median(off)), on_rounds.push_back(median(on));
    }
    const float off = median(off_rounds), on = median(on_rounds);
    const float spread = *std::max_element(off_rounds.begin(), off_rounds.end()) -
                         *std::min_element(off_rounds.begin(), off_rounds.end());
    printf("%6d %6d %6d %9.4f %9.4f %+8.4f %9.4f %s\n", s.m, s.n, s.k, off, on, on - off, spread,
           fabsf(on - off) <= spread ? "yes" : "no");
    for (int i = 0; i < 3; i++) cudaEventDestroy(ev[i]);
    cudaFree(a), cudaFree(b), cudaFree(c);
  }
  cudaFree(trace);
  return 0;
}

/* The arguments, checked before the GPU is looked for (unit-tested without one); 0 or the
 * exit status of a refusal. */
static int parse_args(int argc, char** argv, int* iters, int* tracing, int* quick) {
  *tracing = argc > 1 && !strcmp(argv[1], "trace");
  *quick = argc > 1 && !strcmp(argv[1], "quick");
  *iters = argc > 2 ? atoi(argv[2]) : *tracing ? 20 : 25;
  if (*iters < 1) { /* the medians need a timed iteration */
    fprintf(stderr, "gemm_perf: iters must be at least 1, not '%s'\n", argv[2]);
    return 2;
  }
  fp8 = argc > 1 && !strcmp(argv[1], "fp8");
  if (fp8) lt_fast_accum = !(argc > 3 && !strcmp(argv[3], "precise"));
  else if (argc > 3) {
    num_variants = 0;
    for (const char* p = argv[3]; *p && num_variants < MAX_VARIANTS; p = strchr(p, ',') ? strchr(p, ',') + 1 : "")
      variants[num_variants++] = atoi(p);
    if (num_variants == 0) { /* ours[0] is the one reported */
      fprintf(stderr, "gemm_perf: no configuration in '%s' (e.g. 0 or 0,4)\n", argv[3]);
      return 2;
    }
  }
  group_m = argc > 4 ? atoi(argv[4]) : 0;
  num_sms = argc > 5 ? atoi(argv[5]) : 0;
  return 0;
}

int main(int argc, char** argv) {
  int iters, tracing, quick;
  const int bad = parse_args(argc, argv, &iters, &tracing, &quick);
  if (bad) return bad;
  gpu_or_skip();
  if (tracing) {
    cudaDeviceProp p;
    CUDA_OK(cudaGetDeviceProperties(&p, 0));
    return trace_overhead(iters, p.multiProcessorCount);
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::vector<struct shape> shapes;
  const int ms[] = {2048, 4096, 8192, 16384};
  const int nk[][2] = {{8192, 8192}, {14336, 8192}, {8192, 14336}, {28672, 8192}, {26624, 16384}};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 5; j++)
      if (!quick || (ms[i] == 4096 && j < 2)) shapes.push_back({ms[i], nk[j][0], nk[j][1]});
  printf("gemm_perf on %s (%d SMs), median of %d runs each, interleaved; variant %d, group_m %d\n", prop.name,
         prop.multiProcessorCount, iters, variants[0], group_m);
  if (fp8)
    printf("operands e4m3 with per-tensor scales, bf16 out; cuBLASLt fp8 with %s accumulation\n",
           lt_fast_accum ? "fast (unpromoted, as ours)" : "its default (promoted)");
  std::vector<struct result> rs;
  for (size_t i = 0; i < shapes.size(); i++) {
    rs.push_back(bench_shape(shapes[i], iters, prop.l2CacheSize));
    const struct result& r = rs.back();
    printf("  %6d %6d %6d  cublas %6.1f  rel %.1e  ours:", r.s.m, r.s.n, r.s.k, r.lt, r.rel);
    for (int v = 0; v < num_variants; v++) printf("  v%d %6.1f (%.3f)", variants[v], r.ours[v], r.ours[v] / r.lt);
    printf("\n");
    fflush(stdout);
  }
  std::vector<float> ratios;
  int wrong = 0;
  printf("\n%6s %6s %6s %10s %10s %7s %8s\n", "M", "N", "K", "ours TF/s", "cuBLAS", "ratio", "#wrong");
  for (size_t i = 0; i < rs.size(); i++) {
    const struct result& r = rs[i];
    ratios.push_back((float)(r.ours[0] / r.lt));
    wrong += r.rel < 0;
    printf("%6d %6d %6d %10.1f %10.1f %7.3f %8d\n", r.s.m, r.s.n, r.s.k, r.ours[0], r.lt, r.ours[0] / r.lt, r.rel < 0);
  }
  std::vector<float> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  printf("ratio ours/cuBLAS: median %.3f  min %.3f  (%zu shapes, %d disagree with cuBLAS)\n",
         sorted[sorted.size() / 2], sorted[0], sorted.size(), wrong);
  return wrong ? 1 : 0;
}
