/*
 * Tests of the fusion hooks (included by test_gemm.cu): ready flags and their timeout, the
 * row-block order, epilogue modes, per-tile flags, the SM count, the grouped variant and the
 * rejection of bad input.
 */
#include "late_raise.cuh" /* delayed_raise_kernel */
#include "ptx.cuh"

/* Before a launch beside a waiting kernel: load the kernel (a first launch would wait). */
static void prepare_for_overlap(void) {
  EXPECT(mk_gemm_prepare() == 0, "mk_gemm_prepare");
  if (test_variant >= 0) run_f64_case(256, 256, 256, 0); /* loads the configuration under test */
}

static int sm_count(void) {
  int sms;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms;
}

static void test_ready_flags(void) {
  const int m = 1024, n = 2048, k = 4096, bms = 8, tiles = 64, late_from = 4;
  const uint64_t delay_ns = 20000000;
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2);
  uint64_t *flags, *starts, *t_raise;
  CUDA_OK(cudaMalloc(&flags, bms * 8));
  CUDA_OK(cudaMalloc(&starts, tiles * 8));
  CUDA_OK(cudaMalloc(&t_raise, 16));
  std::vector<uint64_t> init(bms, 0);
  for (int i = 0; i < late_from; i++) init[i] = 7;
  CUDA_OK(cudaMemcpy(flags, init.data(), bms * 8, cudaMemcpyHostToDevice));
  memset_now(starts, 0, tiles * 8);
  prepare_for_overlap();
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CUDA_OK(cudaDeviceSynchronize());
  delayed_raise_kernel<<<1, 1, 0, s1>>>(flags + late_from, bms - late_from, 7, delay_ns, t_raise);
  struct mk_gemm_args g = problem_args(&p);
  g.ready_flags = flags;
  g.ready_target = 7;
  g.tile_start_ns = starts;
  g.num_sms = sm_count() - 4; /* leave room for the raising kernel */
  EXPECT(gemm_launch(&g, s2) == 0, "launch");
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint64_t> st(tiles);
  uint64_t tr, tr2[2];
  CUDA_OK(cudaMemcpy(st.data(), starts, tiles * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(tr2, t_raise, 16, cudaMemcpyDeviceToHost));
  tr = tr2[0];
  int early_ok = 0, late_ok = 0;
  uint64_t first = ~0ull;
  for (int t = 0; t < tiles; t++) first = st[t] < first ? st[t] : first;
  printf("  raising kernel started at 0, first tile at %+.3f ms, flags raised at %+.3f ms\n",
         ((double)first - (double)tr2[1]) * 1e-6, ((double)tr - (double)tr2[1]) * 1e-6);
  for (int t = 0; t < tiles; t++) {
    const int mb = t / (n / 256);
    if (mb < late_from) early_ok += st[t] != 0 && st[t] < tr;
    else late_ok += st[t] >= tr;
  }
  printf("  flag raised %.3f ms after the first tile; early tiles before it: %d/%d, late tiles after it: %d/%d\n",
         (double)(tr - first) * 1e-6, early_ok, tiles / 2, late_ok, tiles / 2);
  EXPECT(early_ok == tiles / 2, "tiles of ready row-blocks waited");
  EXPECT(late_ok == tiles / 2, "tiles of late row-blocks started before their flag");
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, m, n, k);
  expect_close_bf16(&p, "with ready flags");
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaFree(flags); cudaFree(starts); cudaFree(t_raise);
  problem_free(&p);
}

static void test_timeout(void) {
  struct problem p;
  problem_alloc(&p, 512, 512, 512, 1, 2);
  uint64_t* flags;
  CUDA_OK(cudaMalloc(&flags, 4 * 8));
  memset_now(flags, 0, 4 * 8);
  struct mk_gemm_error* err;
  uint32_t* claim; /* as a fused communicator's record has: the producers' path takes it */
  CUDA_OK(cudaHostAlloc((void**)&err, sizeof(*err), cudaHostAllocMapped));
  memset(err, 0, sizeof(*err));
  CUDA_OK(cudaMalloc(&claim, sizeof(*claim)));
  memset_now(claim, 0, sizeof(*claim));
  err->claim = claim;
  struct mk_gemm_args g = problem_args(&p);
  g.ready_flags = flags;
  g.ready_target = 1;
  g.timeout_ms = 50;
  g.err = err;
  g.err_tag = 0xABC;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  EXPECT(gemm_launch(&g, 0) == 0, "launch");
  cudaError_t e = cudaDeviceSynchronize();
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
  printf("  kernel returned %s after %.1f ms: aborted=%u tag=%x tile=%u flag=%u expected=%llu seen=%llu\n",
         cudaGetErrorString(e), ms, err->aborted, err->tag, err->tile, err->flag_index,
         (unsigned long long)err->expected, (unsigned long long)err->seen);
  EXPECT(e == cudaSuccess, "the kernel must exit cleanly");
  EXPECT(err->aborted == 1 && err->tag == 0xABC && err->flag_index < 4 && err->expected == 1 && err->seen == 0,
         "error record");
  EXPECT(ms < 2000, "timed out after %.0f ms, limit 50", ms);
  uint32_t taken = 0;
  CUDA_OK(cudaMemcpy(&taken, claim, sizeof(taken), cudaMemcpyDeviceToHost));
  EXPECT(taken == 1, "the record's claim word reads %u after the timeout, not 1", taken);
  CUDA_OK(cudaFreeHost(err));
  cudaFree(flags), cudaFree(claim);
  problem_free(&p);
  run_f64_case(300, 264, 512, 0); /* the context still works */
}

static void test_row_block_order(void) {
  const int m = 1024, n = 512, k = 256, bms = 8, tn = 2;
  const int order[bms] = {5, 2, 7, 0, 1, 6, 3, 4};
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2);
  int* d_order;
  uint64_t* starts;
  CUDA_OK(cudaMalloc(&d_order, sizeof(order)));
  CUDA_OK(cudaMemcpy(d_order, order, sizeof(order), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&starts, bms * tn * 8));
  memset_now(starts, 0, bms * tn * 8);
  struct mk_gemm_args g = problem_args(&p);
  g.row_block_order = d_order;
  g.raster_group_m = 1;
  g.num_sms = 1; /* one CTA: tiles start in visiting order */
  g.tile_start_ns = starts;
  EXPECT(launch_sync(&g) == 0, "launch");
  std::vector<uint64_t> st(bms * tn);
  CUDA_OK(cudaMemcpy(st.data(), starts, st.size() * 8, cudaMemcpyDeviceToHost));
  int in_order = 1, started = 0;
  uint64_t prev = 0;
  for (int pos = 0; pos < bms; pos++)
    for (int nb = 0; nb < tn; nb++) {
      uint64_t t = st[order[pos] * tn + nb];
      started += t != 0; /* zeroed before: a tile that never ran cannot pass as in order */
      if (t < prev) in_order = 0;
      prev = t;
    }
  printf("  tiles started in the given row-block order: %s (%d of %d timed)\n", in_order ? "yes" : "no", started,
         bms * tn);
  EXPECT(in_order && started == bms * tn, "row_block_order not followed, or %d of %d tiles not timed", bms * tn - started,
         bms * tn);
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, m, n, k);
  expect_close_bf16(&p, "row_block_order");
  poison(p.c, (size_t)m * n * 2);
  g.raster_group_m = 0; g.num_sms = 0; g.tile_start_ns = NULL;
  EXPECT(launch_sync(&g) == 0, "launch");
  expect_close_bf16(&p, "row_block_order, grouped");
  cudaFree(d_order); cudaFree(starts);
  problem_free(&p);
}

static void test_epilogues(void) {
  const int m = 1000, n = 1000, k = 1000;
  const size_t mn = (size_t)m * n;
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 4); /* c sized for fp32 */
  /* "peer" store: the destination is another buffer; the first stays untouched */
  void* other;
  CUDA_OK(cudaMalloc(&other, mn * 2));
  poison(other, mn * 2);
  poison(p.c, mn * 2);
  struct mk_gemm_args g = problem_args(&p);
  g.c = other;
  EXPECT(launch_sync(&g) == 0, "launch");
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, m, n, k);
  struct check_result r = check_close((const __nv_bfloat16*)other, p.ref, mn, TOL);
  printf("  store into a second buffer: rel=%.3e %s\n", r.rel, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass && all_bytes_are(p.c, mn * 2, 0xFF), "store to another pointer");
  /* add into bf16 */
  void* base;
  CUDA_OK(cudaMalloc(&base, mn * 4));
  fill_random_bf16(base, mn, p.seed + 7, 4.0f);
  CUDA_OK(cudaMemcpy(other, base, mn * 2, cudaMemcpyDeviceToDevice));
  g.epilogue = MK_GEMM_ADD_BF16;
  EXPECT(launch_sync(&g) == 0, "launch");
  ref_gemm_f64<__nv_bfloat16>(p.a, p.b, (const __nv_bfloat16*)base, NULL, p.ref, m, n, k);
  r = check_close((const __nv_bfloat16*)other, p.ref, mn, TOL);
  printf("  add into bf16: rel=%.3e %s\n", r.rel, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "ADD_BF16");
  /* two GEMMs adding into one fp32 buffer at once, on two streams */
  struct problem q;
  problem_alloc(&q, m, n, k, 1, 2);
  fill_random_f32(base, mn, p.seed + 9, 4.0f);
  CUDA_OK(cudaMemcpy(p.c, base, mn * 4, cudaMemcpyDeviceToDevice));
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CUDA_OK(cudaDeviceSynchronize());
  g.c = p.c;
  g.epilogue = MK_GEMM_ADD_F32;
  g.num_sms = sm_count() / 2;
  struct mk_gemm_args g2 = g;
  g2.a = q.a;
  g2.b = q.b;
  EXPECT(gemm_launch(&g, s1) == 0 && gemm_launch(&g2, s2) == 0, "launch");
  CUDA_OK(cudaDeviceSynchronize());
  ref_gemm_f64<float>(p.a, p.b, (const float*)base, NULL, q.ref, m, n, k);
  ref_gemm_f64<double>(q.a, q.b, q.ref, NULL, p.ref, m, n, k);
  r = check_close((const float*)p.c, p.ref, mn, TOL);
  printf("  two concurrent adds into fp32: rel=%.3e %s\n", r.rel, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "ADD_F32 concurrent");
  cudaStreamDestroy(s1); cudaStreamDestroy(s2);
  cudaFree(base); cudaFree(other);
  problem_free(&q);
  problem_free(&p);
}

/* One block per tile: waits for its flag (acquire.sys), then copies the tile out. */
static __global__ void copy_tiles_when_raised(const uint64_t* flags, const __nv_bfloat16* c, __nv_bfloat16* out,
                                              int m, int n, int bm, int bn, int tiles_n, int* timeouts) {
  const int t = blockIdx.x, mb = t / tiles_n, nb = t % tiles_n;
  __shared__ int ok;
  if (threadIdx.x == 0) {
    uint64_t t0 = globaltimer_ns();
    ok = 1;
    while (ld_acquire_sys_u64(flags + t) < 1)
      if (globaltimer_ns() - t0 > 5000000000ull) { ok = 0; atomicAdd(timeouts, 1); break; }
  }
  __syncthreads();
  if (!ok) return;
  for (int i = threadIdx.x; i < bm * bn; i += blockDim.x) {
    const int r = mb * bm + i / bn, col = nb * bn + i % bn;
    if (r < m && col < n) out[(size_t)r * n + col] = ((const volatile __nv_bfloat16*)c)[(size_t)r * n + col];
  }
}

static void test_tile_flags(void) {
  const int m = 1000, n = 1000, k = 2048;
  int bm, bn;
  mk_gemm_tile_shape(&bm, &bn);
  const int tiles_n = (n + bn - 1) / bn, tiles = ((m + bm - 1) / bm) * tiles_n;
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2);
  struct mk_gemm_args g = problem_args(&p);
  EXPECT(mk_gemm_max_tiles(&g) == tiles, "mk_gemm_max_tiles");
  uint64_t* flags;
  void* mirror;
  int* timeouts;
  CUDA_OK(cudaMalloc(&flags, tiles * 8));
  memset_now(flags, 0, tiles * 8);
  CUDA_OK(cudaMalloc(&mirror, (size_t)m * n * 2));
  poison(mirror, (size_t)m * n * 2);
  CUDA_OK(cudaMalloc(&timeouts, 4));
  memset_now(timeouts, 0, 4);
  prepare_for_overlap();
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CUDA_OK(cudaDeviceSynchronize());
  /* the reader runs first, on SMs the GEMM leaves free, and copies each tile once raised */
  copy_tiles_when_raised<<<tiles, 256, 0, s1>>>(flags, (const __nv_bfloat16*)p.c, (__nv_bfloat16*)mirror, m, n, bm, bn, tiles_n, timeouts);
  g.tile_flags = flags;
  g.num_sms = sm_count() - tiles - 2;
  EXPECT(gemm_launch(&g, s2) == 0, "launch");
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT(gemm_launch(&g, s2) == 0, "launch");
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint64_t> h(tiles);
  int to;
  CUDA_OK(cudaMemcpy(h.data(), flags, tiles * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&to, timeouts, 4, cudaMemcpyDeviceToHost));
  int twos = 0;
  for (int t = 0; t < tiles; t++) twos += h[t] == 2;
  printf("  %d/%d tile flags == 2 after two launches; reader timeouts %d\n", twos, tiles, to);
  EXPECT(twos == tiles && to == 0, "tile flags");
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, m, n, k);
  expect_close_bf16(&p, "with tile flags");
  struct check_result r = check_close((const __nv_bfloat16*)mirror, p.ref, (size_t)m * n, TOL);
  printf("  tiles read right after their flag: rel=%.3e nonfinite=%ld %s\n", r.rel, r.nonfinite, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "a tile read after its flag was incomplete");
  cudaStreamDestroy(s1); cudaStreamDestroy(s2);
  cudaFree(flags); cudaFree(mirror); cudaFree(timeouts);
  problem_free(&p);
}

static void test_num_sms(void) {
  const int counts[] = {1, 3, 66, 100000};
  for (int i = 0; i < 4; i++) run_f64_case(2048, 1024, 512, counts[i]);
}

/* The grouped GEMM of groups with these row counts against float64. */
static void check_grouped(const std::vector<int>& sizes, int n, int k) {
  const int groups = (int)sizes.size();
  std::vector<int> offs(groups + 1, 0);
  for (int i = 0; i < groups; i++) offs[i + 1] = offs[i] + sizes[i];
  const int m = offs[groups];
  std::vector<int> row_group(m);
  for (int gi = 0; gi < groups; gi++)
    for (int r = offs[gi]; r < offs[gi + 1]; r++) row_group[r] = gi;
  struct problem p;
  problem_alloc(&p, m, n, k, groups, 2);
  int *d_offs, *d_rg;
  CUDA_OK(cudaMalloc(&d_offs, offs.size() * 4));
  CUDA_OK(cudaMalloc(&d_rg, m * 4));
  CUDA_OK(cudaMemcpy(d_offs, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_rg, row_group.data(), m * 4, cudaMemcpyHostToDevice));
  struct mk_gemm_args g = problem_args(&p);
  g.num_groups = groups;
  g.group_offsets = d_offs;
  EXPECT(launch_sync(&g) == 0, "launch");
  ref_gemm_f64<double>(p.a, p.b, NULL, d_rg, p.ref, m, n, k);
  char what[64];
  snprintf(what, sizeof(what), "grouped, %d groups", groups);
  expect_close_bf16(&p, what);
  cudaFree(d_offs); cudaFree(d_rg);
  problem_free(&p);
}

static void test_grouped(int large) {
  std::vector<int> sizes = {300, 0, 1, 128, 1000, 0, 257, 129};
  int n = 520, k = 264;
  if (large) {
    sizes.clear();
    for (int i = 0; i < 16; i++) sizes.push_back(i == 5 ? 0 : 200 + (i * 997) % 1500);
    n = 4096;
    k = 2048;
  }
  check_grouped(sizes, n, k);
}

/* MoE decode's shape of work: many groups of 0-20 rows, so most tiles have a consumer warp
 * group whose 64 rows all lie past the group's end (it skips its wgmmas, gemm.cuh
 * gemm_skip_k_blocks) next to tiles of 64-80 rows where both multiply. */
static void test_grouped_few_rows(void) {
  std::vector<int> sizes;
  for (int i = 0; i < 96; i++) sizes.push_back(i % 11 == 3 ? 64 + i % 17 : (i * 7) % 21);
  check_grouped(sizes, 768, 1024);
}

/* Grouped mode waits per group: groups 0 and 2 are ready at launch, group 3's flag is raised
 * 20 ms later (group 1 is empty and waits for nothing). Every tile of group 3 must start after
 * the raise, every other tile before it, and the result must be right. */
static void test_grouped_ready_flags(void) {
  const std::vector<int> sizes = {300, 0, 200, 129};
  const int n = 512, k = 256, groups = 4, tiles_n = n / 256;
  std::vector<int> offs(groups + 1, 0), row_group;
  for (int i = 0; i < groups; i++) offs[i + 1] = offs[i] + sizes[i];
  const int m = offs[groups];
  for (int gi = 0; gi < groups; gi++) row_group.insert(row_group.end(), sizes[gi], gi);
  std::vector<int> tile_group; /* linear tile -> group, as the scheduler numbers them */
  for (int gi = 0; gi < groups; gi++) tile_group.insert(tile_group.end(), (sizes[gi] + 127) / 128 * tiles_n, gi);
  const int tiles = (int)tile_group.size();
  struct problem p;
  problem_alloc(&p, m, n, k, groups, 2);
  int *d_offs, *d_rg;
  uint64_t *flags, *starts, *t_raise;
  CUDA_OK(cudaMalloc(&d_offs, offs.size() * 4));
  CUDA_OK(cudaMalloc(&d_rg, m * 4));
  CUDA_OK(cudaMalloc(&flags, groups * 8));
  CUDA_OK(cudaMalloc(&starts, tiles * 8));
  CUDA_OK(cudaMalloc(&t_raise, 16));
  CUDA_OK(cudaMemcpy(d_offs, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_rg, row_group.data(), m * 4, cudaMemcpyHostToDevice));
  const uint64_t init[4] = {5, 0, 5, 0};
  CUDA_OK(cudaMemcpy(flags, init, sizeof(init), cudaMemcpyHostToDevice));
  memset_now(starts, 0, tiles * 8);
  prepare_for_overlap();
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CUDA_OK(cudaDeviceSynchronize());
  delayed_raise_kernel<<<1, 1, 0, s1>>>(flags + 3, 1, 5, 20000000, t_raise);
  struct mk_gemm_args g = problem_args(&p);
  g.num_groups = groups, g.group_offsets = d_offs;
  g.ready_flags = flags, g.ready_target = 5, g.tile_start_ns = starts;
  g.num_sms = sm_count() - 4; /* leave room for the raising kernel */
  EXPECT(gemm_launch(&g, s2) == 0, "launch");
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint64_t> st(tiles);
  uint64_t tr[2];
  CUDA_OK(cudaMemcpy(st.data(), starts, tiles * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(tr, t_raise, 16, cudaMemcpyDeviceToHost));
  int in_order = 0;
  for (int t = 0; t < tiles; t++) in_order += tile_group[t] == 3 ? st[t] >= tr[0] : st[t] != 0 && st[t] < tr[0];
  printf("  %d of %d tiles started on the right side of group 3's flag\n", in_order, tiles);
  EXPECT(in_order == tiles, "group 3's tiles wait for its flag, the others do not");
  ref_gemm_f64<double>(p.a, p.b, NULL, d_rg, p.ref, m, n, k);
  expect_close_bf16(&p, "grouped, with ready flags");
  cudaStreamDestroy(s1), cudaStreamDestroy(s2);
  cudaFree(d_offs), cudaFree(d_rg), cudaFree(flags), cudaFree(starts), cudaFree(t_raise);
  problem_free(&p);
}

/* Rows [row0, row0 + rows) come from a_local (A's own rows there are poison) and never wait:
 * their flags stay 0 while every other row-block's is raised; a wait would time out. */
static void run_a_local_case(int m, int row0, int rows) {
  const int n = 520, k = 264, bms = (m + 127) / 128;
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2);
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, m, n, k);
  void* a_local;
  uint64_t* flags;
  struct mk_gemm_error* err;
  CUDA_OK(cudaMalloc(&a_local, (size_t)rows * k * 2));
  CUDA_OK(cudaMemcpy(a_local, (char*)p.a + (size_t)row0 * k * 2, (size_t)rows * k * 2, cudaMemcpyDeviceToDevice));
  poison((char*)p.a + (size_t)row0 * k * 2, (size_t)rows * k * 2);
  std::vector<uint64_t> init(bms, 1);
  for (int mb = row0 / 128; mb < (row0 + rows + 127) / 128; mb++) init[mb] = 0;
  CUDA_OK(cudaMalloc(&flags, bms * 8));
  CUDA_OK(cudaMemcpy(flags, init.data(), bms * 8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaHostAlloc((void**)&err, sizeof(*err), cudaHostAllocMapped));
  memset(err, 0, sizeof(*err));
  struct mk_gemm_args g = problem_args(&p);
  g.a_local = a_local, g.a_local_row0 = row0, g.a_local_rows = rows;
  g.ready_flags = flags, g.ready_target = 1, g.timeout_ms = 200, g.err = err;
  EXPECT(launch_sync(&g) == 0, "launch");
  EXPECT(err->aborted == 0, "a local row-block waited for its flag (flag %u)", err->flag_index);
  char what[64];
  snprintf(what, sizeof(what), "a_local rows [%d, %d)", row0, row0 + rows);
  expect_close_bf16(&p, what);
  CUDA_OK(cudaFreeHost(err));
  cudaFree(flags);
  cudaFree(a_local);
  problem_free(&p);
}

static void test_a_local(void) {
  run_a_local_case(1000, 256, 384); /* in the middle */
  run_a_local_case(1000, 768, 232); /* to the end, a partial row-block */
  run_a_local_case(1000, 0, 1000);  /* all of A */
}

/* args.block_m = 64 (one consumer, 64-row tiles) through mk_gemm_launch: odd plain shapes, and
 * grouped with uneven, empty and few-row groups (partial tiles of 1-63 rows), against float64. */
static void test_block_m64(void) {
  test_block_m = 64;
  run_f64_case(129, 264, 200, 0);
  run_f64_case(1000, 520, 264, 0);
  check_grouped({300, 0, 1, 128, 1000, 0, 257, 129, 63, 64, 65}, 520, 264);
  std::vector<int> few;
  for (int i = 0; i < 96; i++) few.push_back((i * 7) % 21);
  check_grouped(few, 768, 1024);
  test_block_m = 0;
}

/* The fused epilogues' and the call bracket's rules (gemm.h); `spare` is device memory that
 * stands in for the peers' buffers and words (never written: every set is refused). */
struct bad_epilogue_parts {
  struct mk_gemm_rs rs_ok, rs_bad_shard, rs_missing;
  struct mk_gemm_call call_bad;
  struct mk_gemm_scatter sc_ok, sc_bad;
};
static void add_bad_epilogue_sets(struct bad_args* b, struct bad_epilogue_parts* e, void* spare) {
  memset(e, 0, sizeof *e);
  e->rs_ok.shard_rows = 128, e->rs_ok.rank = 0, e->rs_ok.nranks = 2;
  e->rs_ok.out[1] = spare, e->rs_ok.out_counts[1] = (uint64_t*)spare, e->rs_ok.in[1] = spare;
  e->rs_ok.in_counts[1] = (uint64_t*)spare;
  e->rs_bad_shard = e->rs_ok, e->rs_bad_shard.shard_rows = 64;
  e->rs_missing = e->rs_ok, e->rs_missing.in[1] = NULL;
  e->call_bad.rank = 0, e->call_bad.nranks = 2, e->call_bad.done = (uint64_t*)spare, e->call_bad.exits = (uint32_t*)spare;
  e->sc_ok.row_dest = (const int*)spare, e->sc_ok.base[0] = spare;
  e->sc_bad = e->sc_ok, e->sc_bad.base[0] = (char*)spare + 2;
  struct mk_gemm_args* g;
  bad_args_add(b, "rs shard_rows 64 (not a row-block, m != 2 x shard)")->rs = &e->rs_bad_shard;
  bad_args_add(b, "rs without a peer's partial slot")->rs = &e->rs_missing;
  g = bad_args_add(b, "rs with an add epilogue"), g->rs = &e->rs_ok, g->epilogue = MK_GEMM_ADD_BF16;
  bad_args_add(b, "call without the peer's done word")->call = &e->call_bad;
  bad_args_add(b, "scatter base misaligned")->scatter = &e->sc_bad;
  g = bad_args_add(b, "scatter with rs"), g->scatter = &e->sc_ok, g->rs = &e->rs_ok;
}

/* The core's rules: shapes, pointers, row-block order and groups, a_local, block_m. */
static void add_bad_core_sets(struct bad_args* b, const struct problem* p) {
  struct mk_gemm_args* g;
  bad_args_add(b, "row_block_rotate past the row-blocks")->row_block_rotate = 2;
  bad_args_add(b, "row_block_rotate < 0")->row_block_rotate = -1;
  bad_args_add(b, "m = 0")->m = 0;
  bad_args_add(b, "n = 12")->n = 12;
  bad_args_add(b, "n = 0")->n = 0;
  bad_args_add(b, "k = 7")->k = 7;
  bad_args_add(b, "a = NULL")->a = NULL;
  bad_args_add(b, "a misaligned")->a = (const char*)p->a + 2;
  bad_args_add(b, "b misaligned")->b = (const char*)p->b + 8;
  bad_args_add(b, "c misaligned")->c = (char*)p->c + 4;
  bad_args_add(b, "epilogue = 7")->epilogue = 7;
  bad_args_add(b, "num_sms = -1")->num_sms = -1;
  g = bad_args_add(b, "num_groups = 0"), g->group_offsets = (const int*)p->ref, g->num_groups = 0;
  bad_args_add(b, "ready_flags misaligned")->ready_flags = (const uint64_t*)((char*)p->ref + 4);
  g = bad_args_add(b, "row_block_order with groups"), g->group_offsets = (const int*)p->ref, g->num_groups = 2;
  g->row_block_order = (const int*)p->ref;
  g = bad_args_add(b, "a_local off a row-block"), g->a_local = p->a, g->a_local_row0 = 64, g->a_local_rows = 128;
  g = bad_args_add(b, "a_local past m"), g->a_local = p->a, g->a_local_row0 = 128, g->a_local_rows = 256;
  g = bad_args_add(b, "a_local with 0 rows"), g->a_local = p->a, g->a_local_row0 = 0, g->a_local_rows = 0;
  g = bad_args_add(b, "a_local misaligned"), g->a_local = (const char*)p->a + 2, g->a_local_rows = 128;
  bad_args_add(b, "block_m = 32")->block_m = 32;
  g = bad_args_add(b, "block_m 64 with a_local"), g->block_m = 64, g->a_local = p->a, g->a_local_rows = 128;
}

static void test_bad_input(void) {
  struct problem p;
  problem_alloc(&p, 256, 256, 256, 1, 2);
  const struct mk_gemm_args ok = problem_args(&p);
  static struct bad_args bad;
  struct bad_epilogue_parts parts;
  bad_args_init(&bad, &ok);
  add_bad_epilogue_sets(&bad, &parts, p.ref);
  add_bad_core_sets(&bad, &p);
  const int nb = bad_args_expect_refused(&bad, gemm_launch);
  EXPECT(gemm_launch(NULL, 0) == -EINVAL, "NULL args");
  CUDA_OK(cudaDeviceSynchronize());
  int untouched = all_bytes_are(p.c, (size_t)256 * 256 * 2, 0xFF);
  printf("  %d bad argument sets rejected; output untouched: %s\n", nb + 1, untouched ? "yes" : "no");
  EXPECT(untouched, "output written after a rejected launch");
  EXPECT(launch_sync(&ok) == 0, "the good set launches"); /* the sets are refused for their changes */
  ref_gemm_f64<double>(p.a, p.b, NULL, NULL, p.ref, p.m, p.n, p.k);
  expect_close_bf16(&p, "good set after them");
  problem_free(&p);
}
