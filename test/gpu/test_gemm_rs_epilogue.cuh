/*
 * The reduce-scatter epilogue (gemm.h, rs) on one GPU (included by test_gemm.cu): the peers'
 * workspaces are plain buffers here, their partials and counters written before the launch.
 */

static __global__ void add_bf16_to_f64(double* ref, const __nv_bfloat16* x, size_t count) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    ref[i] += (double)__bfloat162float(x[i]);
}

static __global__ void fill_u64(uint64_t* p, int count, uint64_t v) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) p[i] = v;
}

/* Buffers standing in for the peers: partials in, slots out, gather slots, counters. */
struct rs_fake_peers {
  struct mk_gemm_rs rs;
  void* bufs[3][MK_GEMM_RS_MAX_RANKS]; /* in, out, gather */
  uint64_t* counts;                    /* [3][nranks][blocks] */
};

static void rs_fake_peers_make(struct rs_fake_peers* f, int rank, int nranks, int shard, int n, int tiles_n,
                               int peers_ready, uint64_t seed) {
  const int blocks = shard / 128;
  const size_t slot = (size_t)shard * n;
  memset(f, 0, sizeof(*f));
  f->rs.shard_rows = shard, f->rs.rank = rank, f->rs.nranks = nranks;
  CUDA_OK(cudaMalloc(&f->counts, (size_t)3 * nranks * blocks * 8));
  CUDA_OK(cudaMemset(f->counts, 0, (size_t)3 * nranks * blocks * 8));
  for (int d = 0; d < nranks; d++) {
    if (d == rank) continue;
    for (int b = 0; b < 3; b++) CUDA_OK(cudaMalloc(&f->bufs[b][d], slot * 2));
    fill_random_bf16(f->bufs[0][d], slot, seed + d, 4.0f); /* large: a missing partial shows */
    poison(f->bufs[1][d], slot * 2);
    poison(f->bufs[2][d], slot * 2);
    uint64_t* cnt = f->counts + (size_t)d * blocks;
    if (peers_ready) fill_u64<<<1, 128>>>(cnt, blocks, (uint64_t)tiles_n);
    f->rs.in[d] = f->bufs[0][d], f->rs.in_counts[d] = cnt;
    f->rs.out[d] = f->bufs[1][d], f->rs.out_counts[d] = cnt + (size_t)nranks * blocks;
    f->rs.gather[d] = f->bufs[2][d], f->rs.gather_counts[d] = cnt + (size_t)2 * nranks * blocks;
  }
}

static void rs_fake_peers_free(struct rs_fake_peers* f) {
  for (int d = 0; d < MK_GEMM_RS_MAX_RANKS; d++)
    for (int b = 0; b < 3; b++) cudaFree(f->bufs[b][d]);
  cudaFree(f->counts);
}

/* Every counter of `which` (1 out, 2 gather) of every peer == want. */
static int rs_counts_all(const struct rs_fake_peers* f, int which, int blocks, uint64_t want) {
  const int nr = f->rs.nranks;
  std::vector<uint64_t> h((size_t)3 * nr * blocks);
  CUDA_OK(cudaMemcpy(h.data(), f->counts, h.size() * 8, cudaMemcpyDeviceToHost));
  for (int d = 0; d < nr; d++)
    for (int b = 0; d != f->rs.rank && b < blocks; b++)
      if (h[(size_t)which * nr * blocks + (size_t)d * blocks + b] != want) return 0;
  return 1;
}

static void run_rs_epilogue_case(int rank, int nranks, int n, int k) {
  const int shard = 256, m = shard * nranks, blocks = shard / 128;
  int bm, bn;
  mk_gemm_tile_shape(&bm, &bn);
  const int tiles_n = (n + bn - 1) / bn;
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2); /* c: only its first shard rows are written */
  struct rs_fake_peers f;
  rs_fake_peers_make(&f, rank, nranks, shard, n, tiles_n, 1, p.seed + 7);
  struct mk_gemm_args g = problem_args(&p);
  g.rs = &f.rs;
  EXPECT(launch_sync(&g) == 0, "launch (rank %d of %d)", rank, nranks);
  const size_t slot = (size_t)shard * n;
  char label[64];
  for (int d = 0; d < nranks; d++) { /* each peer's slot: the plain GEMM of its rows */
    if (d == rank) continue;
    ref_gemm_f64<double>((const __nv_bfloat16*)p.a + (size_t)d * shard * k, p.b, NULL, NULL, p.ref, shard, n, k);
    struct check_result r = check_close((const __nv_bfloat16*)f.rs.out[d], p.ref, slot, TOL);
    printf("  rank %d/%d: slot of owner %d rel=%.3e %s\n", rank, nranks, d, r.rel, r.pass ? "ok" : "FAIL");
    EXPECT(r.pass, "rank %d of %d: owner %d's slot rel=%.3e", rank, nranks, d, r.rel);
  }
  /* own rows: the GEMM + every peer's partial */
  ref_gemm_f64<double>((const __nv_bfloat16*)p.a + (size_t)rank * shard * k, p.b, NULL, NULL, p.ref, shard, n, k);
  for (int d = 0; d < nranks; d++)
    if (d != rank) add_bf16_to_f64<<<256, 256>>>(p.ref, (const __nv_bfloat16*)f.rs.in[d], slot);
  struct check_result r = check_close((const __nv_bfloat16*)p.c, p.ref, slot, TOL);
  snprintf(label, sizeof label, "rank %d/%d own rows", rank, nranks);
  printf("  %s: rel=%.3e %s\n", label, r.rel, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "%s rel=%.3e", label, r.rel);
  std::vector<uint16_t> own(slot), got(slot);
  CUDA_OK(cudaMemcpy(own.data(), p.c, slot * 2, cudaMemcpyDeviceToHost));
  for (int d = 0; d < nranks; d++) {
    if (d == rank) continue;
    CUDA_OK(cudaMemcpy(got.data(), f.rs.gather[d], slot * 2, cudaMemcpyDeviceToHost));
    EXPECT(own == got, "%s: gather slot on %d differs from c", label, d);
  }
  EXPECT(rs_counts_all(&f, 1, blocks, (uint64_t)tiles_n) && rs_counts_all(&f, 2, blocks, (uint64_t)tiles_n),
         "%s: every out and gather counter must be %d", label, tiles_n);
  rs_fake_peers_free(&f);
  problem_free(&p);
}

/* A peer's partial that never comes: the kernel exits cleanly with the error record naming the
 * counter, and this rank's rows are not written. */
static void run_rs_missing_peer_case(void) {
  const int rank = 0, nranks = 2, shard = 256, n = 512, k = 256;
  struct problem p;
  problem_alloc(&p, shard * nranks, n, k, 1, 2);
  struct rs_fake_peers f;
  rs_fake_peers_make(&f, rank, nranks, shard, n, 2, 0, p.seed + 7);
  struct mk_gemm_error* err;
  CUDA_OK(cudaHostAlloc((void**)&err, sizeof(*err), cudaHostAllocMapped));
  memset(err, 0, sizeof(*err));
  struct mk_gemm_args g = problem_args(&p);
  g.rs = &f.rs, g.err = err, g.err_tag = 0x5A, g.timeout_ms = 50;
  EXPECT(gemm_launch(&g, 0) == 0, "launch");
  cudaError_t e = cudaDeviceSynchronize();
  printf("  missing partial: kernel %s, aborted=%u tag=%x flag=%u expected=%llu seen=%llu\n", cudaGetErrorString(e),
         err->aborted, err->tag, err->flag_index, (unsigned long long)err->expected, (unsigned long long)err->seen);
  EXPECT(e == cudaSuccess && err->aborted == 1 && err->tag == 0x5A && err->expected == 2 && err->seen == 0 &&
             err->flag_index < 2 + (unsigned)shard / 128,
         "error record of a missing partial");
  EXPECT(all_bytes_ff(p.c, (size_t)shard * n * 2), "own rows written without the peer's partial");
  CUDA_OK(cudaFreeHost(err));
  rs_fake_peers_free(&f);
  problem_free(&p);
  run_f64_case(300, 264, 512, 0); /* the context still works */
}

static void test_rs_epilogue(void) {
  run_rs_epilogue_case(0, 2, 520, 384);
  run_rs_epilogue_case(1, 2, 1000, 200);
  run_rs_epilogue_case(1, 3, 264, 128);
  run_rs_missing_peer_case();
}
