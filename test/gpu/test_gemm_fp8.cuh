/*
 * Tests of the e4m3 operands (args.dtype = MK_GEMM_E4M3; included by test_gemm.cu): the same
 * kernel with 128-element K-blocks and wgmma k32. Checked against a float64 reference computed
 * from the e4m3 inputs themselves and the random non-unit scales, so what is left is the
 * tensor cores' accumulation and the bf16 rounding of the output (rel < 1e-2 as for bf16);
 * against cuBLASLt's fp8 GEMM (TN, the scales as its alpha, bf16 out, fast accumulation like ours);
 * the epilogues and groups on e4m3; bad input; and a negative control for these checks.
 */

/* An e4m3 byte decoded on the host from its bits (sign, 4 exponent bits with bias 7, 3
 * mantissa bits; subnormals below exponent 1; S.1111.111 is NaN, no infinities), without
 * cuda_fp8.h, to check the device reference's decoding. */
static double e4m3_to_double(uint8_t v) {
  const int e = (v >> 3) & 15, mant = v & 7;
  if (e == 15 && mant == 7) return NAN;
  const double mag = e ? ldexp(1.0 + mant / 8.0, e - 7) : ldexp(mant / 8.0, -6);
  return (v & 0x80) ? -mag : mag;
}

/* 2^(+-[1, 3)) from the seed, log-uniform: at least a factor 2 away from 1 either way, so a
 * scale left out cannot pass. */
static float draw_scale(uint64_t seed) {
  const uint64_t h = seed * 0x9E3779B97F4A7C15ull;
  const double u = (double)(h >> 11) * (1.0 / 9007199254740992.0);
  return (float)exp2(((h >> 10) & 1 ? 1.0 : -1.0) * (1.0 + 2.0 * u));
}

/* Fresh e4m3 inputs uniform in [-4, 4) before rounding (subnormals to the top binade), C
 * poisoned, random scales on the device. null_scales: bit 0 leaves scale_a NULL, bit 1
 * scale_b (each then counts as 1). */
static void problem_alloc_e4m3(struct problem* p, int m, int n, int k, int groups, size_t c_elem, int null_scales) {
  memset(p, 0, sizeof(*p));
  p->m = m; p->n = n; p->k = k; p->groups = groups;
  p->dtype = MK_GEMM_E4M3;
  CUDA_OK(cudaMalloc(&p->a, (size_t)m * k));
  CUDA_OK(cudaMalloc(&p->b, (size_t)groups * n * k));
  CUDA_OK(cudaMalloc(&p->c, (size_t)m * n * c_elem));
  CUDA_OK(cudaMalloc(&p->ref, (size_t)m * n * sizeof(double)));
  CUDA_OK(cudaMalloc(&p->scales, 2 * sizeof(float)));
  p->seed = next_seed();
  fill_random_e4m3(p->a, (size_t)m * k, p->seed, 4.0f);
  fill_random_e4m3(p->b, (size_t)groups * n * k, p->seed + 1, 4.0f);
  poison(p->c, (size_t)m * n * c_elem);
  const float s[2] = {draw_scale(p->seed + 2), draw_scale(p->seed + 3)};
  CUDA_OK(cudaMemcpy(p->scales, s, sizeof(s), cudaMemcpyHostToDevice));
  p->scale_a = (null_scales & 1) ? NULL : p->scales;
  p->scale_b = (null_scales & 2) ? NULL : p->scales + 1;
  p->scale = (double)((p->scale_a ? s[0] : 1.f) * (p->scale_b ? s[1] : 1.f));
}

/* The device e4m3 reference against a CPU loop over host-decoded bytes, once. */
static void check_e4m3_reference_on_cpu(void) {
  const int m = 37, n = 72, k = 144;
  struct problem p;
  problem_alloc_e4m3(&p, m, n, k, 1, 2, 0);
  ref_gemm_f64_e4m3<double>(p.a, p.b, NULL, NULL, p.scale, p.ref, m, n, k);
  std::vector<uint8_t> a((size_t)m * k), b((size_t)n * k);
  std::vector<double> ref((size_t)m * n);
  CUDA_OK(cudaMemcpy(a.data(), p.a, a.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(b.data(), p.b, b.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(ref.data(), p.ref, ref.size() * 8, cudaMemcpyDeviceToHost));
  double worst = 0;
  int codes[256] = {0}, distinct = 0;
  for (size_t i = 0; i < a.size(); i++) distinct += codes[a[i]]++ == 0;
  for (int r = 0; r < m; r++)
    for (int c = 0; c < n; c++) {
      double s = 0;
      for (int i = 0; i < k; i++) s += e4m3_to_double(a[(size_t)r * k + i]) * e4m3_to_double(b[(size_t)c * k + i]);
      worst = fmax(worst, fabs(s * p.scale - ref[(size_t)r * n + c]));
    }
  printf("  device e4m3 float64 reference vs CPU decode: max abs diff %.3e (%d distinct codes in A)\n", worst,
         distinct);
  EXPECT(worst < 1e-9, "device e4m3 reference disagrees with the CPU (%.3e)", worst);
  EXPECT(distinct > 100, "e4m3 inputs use only %d codes", distinct); /* ~135 of the 143 below 4 */
  problem_free(&p);
}

static void run_e4m3_f64_case(int m, int n, int k, int null_scales) {
  struct problem p;
  problem_alloc_e4m3(&p, m, n, k, 1, 2, null_scales);
  struct mk_gemm_args g = problem_args(&p);
  EXPECT(launch_sync(&g) == 0, "e4m3 launch m=%d n=%d k=%d", m, n, k);
  ref_gemm_f64_e4m3<double>(p.a, p.b, NULL, NULL, p.scale, p.ref, m, n, k);
  char what[64];
  snprintf(what, sizeof(what), "e4m3 ref, scale %.4g%s", p.scale, null_scales ? " (NULL)" : "");
  expect_close_bf16(&p, what);
  problem_free(&p);
}

static void test_fp8_odd_shapes(int large) {
  check_e4m3_reference_on_cpu();
  const int ms[] = {1, 127, 4095}, ns[] = {8, 72, 1000}, ks[] = {16, 80, 1008};
  for (int mi = 0; mi < 3; mi++)
    for (int ni = 0; ni < 3; ni++)
      for (int ki = 0; ki < 3; ki++) run_e4m3_f64_case(ms[mi], ns[ni], ks[ki], 0);
  run_e4m3_f64_case(129, 264, 208, 0);
  run_e4m3_f64_case(300, 520, 144, 1); /* scale_a NULL */
  run_e4m3_f64_case(300, 520, 144, 2); /* scale_b NULL */
  run_e4m3_f64_case(300, 520, 144, 3); /* both NULL: 1 */
  if (large) {
    run_e4m3_f64_case(4095, 8200, 4112, 0);
    run_e4m3_f64_case(8191, 4104, 8192, 0);
  }
}

/* Against cuBLASLt's fp8 GEMM on the same inputs and scales. */
static void run_e4m3_cublas_case(int m, int n, int k) {
  struct problem p;
  problem_alloc_e4m3(&p, m, n, k, 1, 2, 0);
  void* c_lt;
  CUDA_OK(cudaMalloc(&c_lt, (size_t)m * n * 2));
  poison(c_lt, (size_t)m * n * 2);
  struct lt_gemm lt;
  lt_gemm_init_e4m3(&lt, m, n, k, p.scale_a, p.scale_b, 1);
  lt_gemm_run(&lt, p.a, p.b, c_lt, 0);
  struct mk_gemm_args g = problem_args(&p);
  EXPECT(launch_sync(&g) == 0, "launch");
  struct check_result r = check_close((const __nv_bfloat16*)p.c, (const __nv_bfloat16*)c_lt, (size_t)m * n, TOL);
  printf("  e4m3 vs cuBLASLt fp8 m=%5d n=%5d k=%5d seed=%016llx rel=%.3e nonfinite=%ld %s\n", m, n, k,
         (unsigned long long)p.seed, r.rel, r.nonfinite, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "e4m3 vs cuBLASLt m=%d n=%d k=%d rel=%.3e", m, n, k, r.rel);
  lt_gemm_fini(&lt);
  /* for information: how far the unpromoted accumulation is from cuBLASLt's promoted one */
  lt_gemm_init_e4m3(&lt, m, n, k, p.scale_a, p.scale_b, 0);
  lt_gemm_run(&lt, p.a, p.b, c_lt, 0);
  r = check_close((const __nv_bfloat16*)p.c, (const __nv_bfloat16*)c_lt, (size_t)m * n, TOL);
  printf("    (information, not checked) vs cuBLASLt fp8 with promoted accumulation: rel=%.3e\n", r.rel);
  lt_gemm_fini(&lt);
  cudaFree(c_lt);
  problem_free(&p);
}

static void test_fp8_cublas(int large) {
  run_e4m3_cublas_case(2048, 2048, 2048);
  run_e4m3_cublas_case(3000, 2064, 1008); /* cuBLASLt fp8 may want N % 16 == 0 */
  if (large) {
    run_e4m3_cublas_case(4096, 14336, 8192);
    run_e4m3_cublas_case(16384, 8192, 8192);
    run_e4m3_cublas_case(8192, 28672, 8192);
    run_e4m3_cublas_case(2048, 8192, 14336);
    run_e4m3_cublas_case(2048, 26624, 16384);
  }
}

/* The epilogues only see the scaled fp32 accumulator: add into bf16 and into fp32 (from the
 * consumers' registers), and a grouped GEMM of uneven and empty groups. */
static void run_e4m3_add_case(int epilogue) {
  const int m = 1000, n = 1000, k = 1008;
  const size_t mn = (size_t)m * n, c_elem = epilogue == MK_GEMM_ADD_F32 ? 4 : 2;
  struct problem p;
  problem_alloc_e4m3(&p, m, n, k, 1, c_elem, 0);
  void* base;
  CUDA_OK(cudaMalloc(&base, mn * c_elem));
  if (c_elem == 4) fill_random_f32(base, mn, p.seed + 7, 4.0f);
  else fill_random_bf16(base, mn, p.seed + 7, 4.0f);
  CUDA_OK(cudaMemcpy(p.c, base, mn * c_elem, cudaMemcpyDeviceToDevice));
  struct mk_gemm_args g = problem_args(&p);
  g.epilogue = epilogue;
  EXPECT(launch_sync(&g) == 0, "launch");
  struct check_result r;
  if (c_elem == 4) {
    ref_gemm_f64_e4m3<float>(p.a, p.b, (const float*)base, NULL, p.scale, p.ref, m, n, k);
    r = check_close((const float*)p.c, p.ref, mn, TOL);
  } else {
    ref_gemm_f64_e4m3<__nv_bfloat16>(p.a, p.b, (const __nv_bfloat16*)base, NULL, p.scale, p.ref, m, n, k);
    r = check_close((const __nv_bfloat16*)p.c, p.ref, mn, TOL);
  }
  printf("  e4m3 add into %s: rel=%.3e %s\n", c_elem == 4 ? "fp32" : "bf16", r.rel, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "e4m3 add epilogue %d rel=%.3e", epilogue, r.rel);
  cudaFree(base);
  problem_free(&p);
}

static void run_e4m3_grouped_case(void) {
  const std::vector<int> sizes = {300, 0, 1, 128, 1000, 257};
  const int n = 520, k = 272, groups = (int)sizes.size();
  std::vector<int> offs(groups + 1, 0), row_group;
  for (int i = 0; i < groups; i++) offs[i + 1] = offs[i] + sizes[i];
  for (int gi = 0; gi < groups; gi++) row_group.insert(row_group.end(), sizes[gi], gi);
  const int m = offs[groups];
  struct problem p;
  problem_alloc_e4m3(&p, m, n, k, groups, 2, 0);
  int *d_offs, *d_rg;
  CUDA_OK(cudaMalloc(&d_offs, offs.size() * 4));
  CUDA_OK(cudaMalloc(&d_rg, m * 4));
  CUDA_OK(cudaMemcpy(d_offs, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_rg, row_group.data(), m * 4, cudaMemcpyHostToDevice));
  struct mk_gemm_args g = problem_args(&p);
  g.num_groups = groups, g.group_offsets = d_offs;
  EXPECT(launch_sync(&g) == 0, "launch");
  ref_gemm_f64_e4m3<double>(p.a, p.b, NULL, d_rg, p.scale, p.ref, m, n, k);
  expect_close_bf16(&p, "e4m3 grouped, 6 groups");
  cudaFree(d_offs); cudaFree(d_rg);
  problem_free(&p);
}

static void test_fp8_epilogues_and_groups(void) {
  run_e4m3_add_case(MK_GEMM_ADD_BF16);
  run_e4m3_add_case(MK_GEMM_ADD_F32);
  run_e4m3_grouped_case();
}

/* The checks above must fail on an output whose scales were not applied (the reference
 * without them), on one unwritten element and on one wrong element. */
static void test_fp8_negative_control(void) {
  struct problem p;
  problem_alloc_e4m3(&p, 1000, 1000, 512, 1, 2, 0);
  const float hs[2] = {1.5f, 2.0f}; /* product 3: far from the unscaled product */
  CUDA_OK(cudaMemcpy(p.scales, hs, sizeof(hs), cudaMemcpyHostToDevice));
  p.scale = 3.0;
  struct mk_gemm_args g = problem_args(&p);
  EXPECT(launch_sync(&g) == 0, "launch");
  const size_t mn = (size_t)p.m * p.n;
  ref_gemm_f64_e4m3<double>(p.a, p.b, NULL, NULL, p.scale, p.ref, p.m, p.n, p.k);
  struct check_result r = check_close((const __nv_bfloat16*)p.c, p.ref, mn, TOL);
  EXPECT(r.pass, "clean e4m3 output must pass (rel=%.3e)", r.rel);
  ref_gemm_f64_e4m3<double>(p.a, p.b, NULL, NULL, 1.0, p.ref, p.m, p.n, p.k);
  r = check_close((const __nv_bfloat16*)p.c, p.ref, mn, TOL);
  printf("  against the unscaled product (scale %.4g): rel=%.3e -> %s\n", p.scale, r.rel,
         r.pass ? "passed (BAD)" : "rejected");
  EXPECT(!r.pass, "checker passed an output against a reference without the scales");
  ref_gemm_f64_e4m3<double>(p.a, p.b, NULL, NULL, p.scale, p.ref, p.m, p.n, p.k);
  const size_t idx = 654321;
  __nv_bfloat16 bad = __float2bfloat16(1e6f);
  poison((__nv_bfloat16*)p.c + idx, 2);
  r = check_close((const __nv_bfloat16*)p.c, p.ref, mn, TOL);
  printf("  one NaN element: rel=%.3e nonfinite=%ld -> %s\n", r.rel, r.nonfinite, r.pass ? "passed (BAD)" : "rejected");
  EXPECT(!r.pass, "checker passed an e4m3 output with one NaN");
  CUDA_OK(cudaMemcpy((__nv_bfloat16*)p.c + idx, &bad, 2, cudaMemcpyHostToDevice));
  r = check_close((const __nv_bfloat16*)p.c, p.ref, mn, TOL);
  printf("  one element = 1e6: rel=%.3e -> %s\n", r.rel, r.pass ? "passed (BAD)" : "rejected");
  EXPECT(!r.pass, "checker passed an e4m3 output with one wrong element");
  problem_free(&p);
}

/* e4m3's own rules (gemm.h enum mk_gemm_dtype): refused before launch, output untouched. */
static void test_fp8_bad_input(void) {
  struct problem p;
  problem_alloc_e4m3(&p, 256, 256, 256, 1, 2, 0);
  const struct mk_gemm_args ok = problem_args(&p);
  static struct bad_args bad;
  bad_args_init(&bad, &ok);
  bad_args_add(&bad, "e4m3 k = 24 (not a multiple of 16)")->k = 24;
  bad_args_add(&bad, "e4m3 k = 8")->k = 8;
  bad_args_add(&bad, "dtype = 2")->dtype = 2;
  bad_args_add(&bad, "dtype = -1")->dtype = -1;
  bad_args_add(&bad, "scale_a misaligned")->scale_a = (const float*)((const char*)p.scales + 2);
  bad_args_add(&bad, "bf16 with scales")->dtype = MK_GEMM_BF16;
  bad_args_add(&bad, "e4m3 a 8-byte aligned only")->a = (const char*)p.a + 8;
  const int nb = bad_args_expect_refused(&bad, mk_gemm_launch);
  const int rc = mk_gemm_launch_variant(&ok, 0, 1);
  EXPECT(rc == -EINVAL, "e4m3 on configuration 1: rc = %d, want -EINVAL", rc);
  CUDA_OK(cudaDeviceSynchronize());
  const int untouched = all_bytes_are(p.c, (size_t)256 * 256 * 2, 0xFF);
  printf("  %d bad e4m3 argument sets rejected; output untouched: %s\n", nb + 1, untouched ? "yes" : "no");
  EXPECT(untouched, "output written after a rejected launch");
  EXPECT(launch_sync(&ok) == 0, "the good set launches");
  ref_gemm_f64_e4m3<double>(p.a, p.b, NULL, NULL, p.scale, p.ref, p.m, p.n, p.k);
  expect_close_bf16(&p, "e4m3 good set after them");
  problem_free(&p);
}
