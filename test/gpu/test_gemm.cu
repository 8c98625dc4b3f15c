/*
 * GPU tests of the GEMM core. One binary, one behaviour per argv[1] (meson registers each
 * under a behavioural name); argv[2] == "large" selects the large shapes. Exit 77 without a
 * Hopper GPU. Every check draws fresh random inputs (seed printed), poisons the output first
 * and compares every element: ||out - ref|| / ||ref|| < 1e-2, no NaN. The fp8_* tests run the
 * e4m3 operands (test_gemm_fp8.cuh), which have configuration 0 only.
 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <vector>
#include "gemm.h"
#include "gemm_tune.h"
#include "gemm_check.cuh"
#include "expect.h"

static uint64_t seed_counter;
static const double TOL = 1e-2;

/* A third argument n runs the test on configuration n of gemm.cu (default: mk_gemm_launch). */
static int test_variant = -1;
static int test_block_m = 0; /* args.block_m of every problem_args (test_block_m64) */
static int gemm_launch(const struct mk_gemm_args* g, cudaStream_t s) {
  return test_variant < 0 ? mk_gemm_launch(g, s) : mk_gemm_launch_variant(g, s, test_variant);
}

static uint64_t next_seed(void) { return ++seed_counter * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL); }

/* Device buffers of one problem: A [m,k], B [groups*n, k], C [m,n] (bf16 or f32), ref f64.
 * e4m3 problems (test_gemm_fp8.cuh) also carry their scales: scales[0] = scale_a, [1] = b. */
struct problem {
  int m, n, k, groups;
  void *a, *b, *c;
  double* ref;
  uint64_t seed;
  int dtype;
  float* scales;                /* device; NULL for bf16 */
  const float *scale_a, *scale_b; /* what the launch is given: scales + 0/1 or NULL */
  double scale;                 /* scale_a * scale_b as the kernel forms it (fp32 product) */
};

static void problem_alloc(struct problem* p, int m, int n, int k, int groups, size_t c_elem) {
  memset(p, 0, sizeof(*p));
  p->m = m; p->n = n; p->k = k; p->groups = groups;
  CUDA_OK(cudaMalloc(&p->a, (size_t)m * k * 2));
  CUDA_OK(cudaMalloc(&p->b, (size_t)groups * n * k * 2));
  CUDA_OK(cudaMalloc(&p->c, (size_t)m * n * c_elem));
  CUDA_OK(cudaMalloc(&p->ref, (size_t)m * n * sizeof(double)));
  p->seed = next_seed();
  fill_random_bf16(p->a, (size_t)m * k, p->seed, 1.0f);
  fill_random_bf16(p->b, (size_t)groups * n * k, p->seed + 1, 1.0f);
  poison(p->c, (size_t)m * n * c_elem);
}
static void problem_free(struct problem* p) {
  cudaFree(p->a); cudaFree(p->b); cudaFree(p->c); cudaFree(p->ref);
  if (p->scales) cudaFree(p->scales);
}
static struct mk_gemm_args problem_args(const struct problem* p) {
  struct mk_gemm_args g;
  memset(&g, 0, sizeof(g));
  g.m = p->m; g.n = p->n; g.k = p->k; g.a = p->a; g.b = p->b; g.c = p->c;
  g.dtype = p->dtype; g.scale_a = p->scale_a; g.scale_b = p->scale_b;
  g.block_m = test_block_m;
  return g;
}
static int launch_sync(const struct mk_gemm_args* g) {
  int rc = gemm_launch(g, 0);
  if (rc == 0) CUDA_OK(cudaDeviceSynchronize());
  return rc;
}
/* Argument sets a launch must refuse, each the good set with one change: bad_args_add gives the
 * next one. The list is bounded, and an add past its end fails the test (a fixed array of 26
 * once took 27 sets, the last written past its end). */
enum { BAD_ARGS_MAX = 40 };
struct bad_args {
  struct mk_gemm_args ok, set[BAD_ARGS_MAX + 1]; /* set[BAD_ARGS_MAX]: scratch past the end */
  const char* why[BAD_ARGS_MAX];
  int n;
};
static void bad_args_init(struct bad_args* b, const struct mk_gemm_args* ok) {
  b->ok = *ok;
  b->n = 0;
}
static struct mk_gemm_args* bad_args_add(struct bad_args* b, const char* why) {
  EXPECT(b->n < BAD_ARGS_MAX, "more than %d bad argument sets (%s)", BAD_ARGS_MAX, why);
  const int i = b->n < BAD_ARGS_MAX ? b->n++ : BAD_ARGS_MAX;
  b->set[i] = b->ok;
  if (i < BAD_ARGS_MAX) b->why[i] = why;
  return &b->set[i];
}
/* Every set refused with -EINVAL by `launch`; the count back. */
static int bad_args_expect_refused(const struct bad_args* b, int (*launch)(const struct mk_gemm_args*, cudaStream_t)) {
  for (int i = 0; i < b->n; i++) {
    const int rc = launch(&b->set[i], 0);
    EXPECT(rc == -EINVAL, "%s: rc = %d, want -EINVAL", b->why[i], rc);
  }
  return b->n;
}
static void expect_close_bf16(const struct problem* p, const char* what) {
  struct check_result r = check_close((const __nv_bfloat16*)p->c, p->ref, (size_t)p->m * p->n, TOL);
  printf("  %-28s m=%5d n=%5d k=%5d seed=%016llx rel=%.3e nonfinite=%ld %s\n", what, p->m, p->n, p->k,
         (unsigned long long)p->seed, r.rel, r.nonfinite, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "%s: m=%d n=%d k=%d rel=%.3e nonfinite=%ld", what, p->m, p->n, p->k, r.rel, r.nonfinite);
}

/* One plain GEMM against the float64 reference. */
static void run_f64_case(int m, int n, int k, int num_sms) {
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2);
  struct mk_gemm_args g = problem_args(&p);
  g.num_sms = num_sms;
  EXPECT(launch_sync(&g) == 0, "launch m=%d n=%d k=%d", m, n, k);
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, m, n, k);
  expect_close_bf16(&p, num_sms ? "num_sms" : "float64 ref");
  problem_free(&p);
}

/* The device float64 reference is itself checked against a CPU float64 loop once. */
static void check_reference_on_cpu(void) {
  const int m = 37, n = 72, k = 136;
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2);
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, m, n, k);
  std::vector<__nv_bfloat16> a((size_t)m * k), b((size_t)n * k);
  std::vector<double> ref((size_t)m * n);
  CUDA_OK(cudaMemcpy(a.data(), p.a, a.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(b.data(), p.b, b.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(ref.data(), p.ref, ref.size() * 8, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int r = 0; r < m; r++)
    for (int c = 0; c < n; c++) {
      double s = 0;
      for (int i = 0; i < k; i++) s += (double)__bfloat162float(a[(size_t)r * k + i]) * (double)__bfloat162float(b[(size_t)c * k + i]);
      worst = fmax(worst, fabs(s - ref[(size_t)r * n + c]));
    }
  printf("  device float64 reference vs CPU: max abs diff %.3e\n", worst);
  EXPECT(worst < 1e-9, "device float64 reference disagrees with the CPU (%.3e)", worst);
  problem_free(&p);
}

static void test_odd_shapes(int large) {
  check_reference_on_cpu();
  const int ms[] = {1, 127, 4095}, nks[] = {8, 72, 1000};
  for (int mi = 0; mi < 3; mi++)
    for (int ni = 0; ni < 3; ni++)
      for (int ki = 0; ki < 3; ki++) run_f64_case(ms[mi], nks[ni], nks[ki], 0);
  run_f64_case(129, 264, 200, 0);
  if (large) {
    run_f64_case(4095, 8200, 4104, 0);
    run_f64_case(8191, 4104, 8192, 0);
  }
}

/* Against cuBLASLt on the same inputs (both bf16 out; they differ by bf16 rounding). */
static void run_cublas_case(int m, int n, int k) {
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2);
  void* c_lt;
  CUDA_OK(cudaMalloc(&c_lt, (size_t)m * n * 2));
  poison(c_lt, (size_t)m * n * 2);
  struct lt_gemm lt;
  lt_gemm_init(&lt, m, n, k);
  lt_gemm_run(&lt, p.a, p.b, c_lt, 0);
  struct mk_gemm_args g = problem_args(&p);
  EXPECT(launch_sync(&g) == 0, "launch");
  struct check_result r = check_close((const __nv_bfloat16*)p.c, (const __nv_bfloat16*)c_lt, (size_t)m * n, TOL);
  printf("  vs cuBLASLt m=%5d n=%5d k=%5d seed=%016llx rel=%.3e nonfinite=%ld %s\n", m, n, k,
         (unsigned long long)p.seed, r.rel, r.nonfinite, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "vs cuBLASLt m=%d n=%d k=%d rel=%.3e", m, n, k, r.rel);
  lt_gemm_fini(&lt);
  cudaFree(c_lt);
  problem_free(&p);
}

static void test_cublas(int large) {
  run_cublas_case(2048, 2048, 2048);
  run_cublas_case(3000, 2056, 1000);
  if (large) {
    run_cublas_case(4096, 14336, 8192);
    run_cublas_case(16384, 8192, 8192);
    run_cublas_case(8192, 28672, 8192);
    run_cublas_case(2048, 8192, 14336);
  }
}

/* The checker must fail on one unwritten (NaN) element and on one wrong element. */
static void test_checker_negative_control(void) {
  struct problem p;
  problem_alloc(&p, 1000, 1000, 512, 1, 2);
  struct mk_gemm_args g = problem_args(&p);
  EXPECT(launch_sync(&g) == 0, "launch");
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, p.m, p.n, p.k);
  struct check_result r = check_close((const __nv_bfloat16*)p.c, p.ref, (size_t)p.m * p.n, TOL);
  EXPECT(r.pass, "clean output must pass (rel=%.3e)", r.rel);
  const size_t idx = 123457;
  __nv_bfloat16 saved, bad = __float2bfloat16(1e6f);
  CUDA_OK(cudaMemcpy(&saved, (__nv_bfloat16*)p.c + idx, 2, cudaMemcpyDeviceToHost));
  poison((__nv_bfloat16*)p.c + idx, 2);
  r = check_close((const __nv_bfloat16*)p.c, p.ref, (size_t)p.m * p.n, TOL);
  printf("  one NaN element: rel=%.3e nonfinite=%ld -> %s\n", r.rel, r.nonfinite, r.pass ? "passed (BAD)" : "rejected");
  EXPECT(!r.pass, "checker passed an output with one NaN");
  CUDA_OK(cudaMemcpy((__nv_bfloat16*)p.c + idx, &bad, 2, cudaMemcpyHostToDevice));
  r = check_close((const __nv_bfloat16*)p.c, p.ref, (size_t)p.m * p.n, TOL);
  printf("  one element = 1e6: rel=%.3e -> %s\n", r.rel, r.pass ? "passed (BAD)" : "rejected");
  EXPECT(!r.pass, "checker passed an output with one wrong element");
  CUDA_OK(cudaMemcpy((__nv_bfloat16*)p.c + idx, &saved, 2, cudaMemcpyHostToDevice));
  r = check_close((const __nv_bfloat16*)p.c, p.ref, (size_t)p.m * p.n, TOL);
  EXPECT(r.pass, "restored output must pass again");
  problem_free(&p);
}

#include "test_gemm_hooks.cuh"
#include "test_gemm_rs_epilogue.cuh"
#include "test_gemm_fp8.cuh"
#include "test_error_record.cuh"

/* Configuration 4 is the 64-row tiles (gemm_tune.h: args.block_m = 64 with it). The tests that
 * lay flags, orders or shards out in 128-row blocks do not run on it; these do. */
static int runs_on_64_row_tiles(const char* what) {
  static const char* const tests[] = {"odd_shapes", "cublas", "negative_control", "epilogues", "num_sms",
                                      "grouped", "grouped_few_rows", "block_m64"};
  for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
    if (!strcmp(what, tests[i])) return 1;
  return 0;
}

int main(int argc, char** argv) {
  gpu_or_skip();
  const char* what = argc > 1 ? argv[1] : "";
  const int large = argc > 2 && !strcmp(argv[2], "large");
  if (argc > 3) test_variant = atoi(argv[3]); /* test_gemm <test> small|large <configuration> */
  if (test_variant == 4) {
    if (!runs_on_64_row_tiles(what)) {
      fprintf(stderr, "test_gemm: '%s' lays its flags out in 128-row blocks; configuration 4 tiles 64 rows "
              "(its tests: test_gemm block_m64, or odd_shapes cublas negative_control epilogues num_sms "
              "grouped grouped_few_rows on it)\n", what);
      return 2;
    }
    test_block_m = 64;
  }
  printf("%s%s, configuration %d\n", what, large ? " (large)" : "", test_variant);
  if (!strcmp(what, "odd_shapes")) test_odd_shapes(large);
  else if (!strcmp(what, "cublas")) test_cublas(large);
  else if (!strcmp(what, "negative_control")) test_checker_negative_control();
  else if (!strcmp(what, "ready_flags")) test_ready_flags();
  else if (!strcmp(what, "timeout")) test_timeout();
  else if (!strcmp(what, "error_record_claim")) test_error_record_claim();
  else if (!strcmp(what, "row_block_order")) test_row_block_order();
  else if (!strcmp(what, "epilogues")) test_epilogues();
  else if (!strcmp(what, "tile_flags")) test_tile_flags();
  else if (!strcmp(what, "num_sms")) test_num_sms();
  else if (!strcmp(what, "grouped")) test_grouped(large);
  else if (!strcmp(what, "grouped_few_rows")) test_grouped_few_rows();
  else if (!strcmp(what, "grouped_ready_flags")) test_grouped_ready_flags();
  else if (!strcmp(what, "bad_input")) test_bad_input();
  else if (!strcmp(what, "a_local")) test_a_local();
  else if (!strcmp(what, "block_m64")) test_block_m64();
  else if (!strcmp(what, "rs_epilogue")) test_rs_epilogue();
  else if (!strcmp(what, "scatter_epilogue")) test_scatter_epilogue();
  else if (!strcmp(what, "fp8_odd_shapes")) test_fp8_odd_shapes(large);
  else if (!strcmp(what, "fp8_cublas")) test_fp8_cublas(large);
  else if (!strcmp(what, "fp8_epilogues")) test_fp8_epilogues_and_groups();
  else if (!strcmp(what, "fp8_negative_control")) test_fp8_negative_control();
  else if (!strcmp(what, "fp8_bad_input")) test_fp8_bad_input();
  else {
    fprintf(stderr, "unknown test '%s'\n", what);
    return 2;
  }
  printf("%s: %s\n", what, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
