/*
 * The reduce-scatter and row-scatter epilogues (gemm.h rs, scatter) on one GPU (included by test_gemm.cu): the peers'
 * workspaces are plain buffers here, their partials, reduced rows and counters written before
 * the launch. With the call bracket the launch is the whole call: peers' done words, the
 * collect of the peers' reduced rows into c_full, counters zeroed and done = e at the end.
 */

static __global__ void add_bf16_to_f64(double* ref, const __nv_bfloat16* x, size_t count) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    ref[i] += (double)__bfloat162float(x[i]);
}

static __global__ void fill_u64(uint64_t* p, int count, uint64_t v) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) p[i] = v;
}

/* Buffers standing in for this rank's workspace and its peers'. */
struct rs_fake_peers {
  struct mk_gemm_rs rs;
  struct mk_gemm_call call;
  void* bufs[4][MK_GEMM_RS_MAX_RANKS]; /* in, gathered (this rank's), out, gather (the peers') */
  uint64_t* counts;                    /* [4][nranks][blocks], the same four; own = the first two,
                                          * then the 3 claim words (rs_region) */
  uint64_t* words;                     /* [0] done [1] call [2] exits, then each peer's done */
};

enum { RS_IN, RS_GATHERED, RS_OUT, RS_GATHER };

/* Region b's counters: this rank's own two, the claim words, then the peers' two, so
 * that the call's counters (zeroed at its end) are contiguous as in gemm_rs.c. */
static size_t rs_region(int b, size_t region) { return (size_t)b * region + (b >= RS_OUT ? MK_GEMM_RS_CLAIM_WORDS : 0); }

/* peers_ready: the peers' partials and reduced rows are complete before the launch. */
static void rs_fake_peers_make(struct rs_fake_peers* f, int rank, int nranks, int shard, int n, int tiles_n,
                               int peers_ready, uint64_t seed) {
  const int blocks = shard / 128;
  const size_t slot = (size_t)shard * n, region = (size_t)nranks * blocks;
  memset(f, 0, sizeof(*f));
  f->rs.shard_rows = shard, f->rs.rank = rank, f->rs.nranks = nranks;
  CUDA_OK(cudaMalloc(&f->counts, (4 * region + MK_GEMM_RS_CLAIM_WORDS) * 8));
  memset_now(f->counts, 0, (4 * region + MK_GEMM_RS_CLAIM_WORDS) * 8);
  f->rs.collect_claims = f->counts + 2 * region;
  CUDA_OK(cudaMalloc(&f->words, (3 + MK_GEMM_RS_MAX_RANKS) * 8));
  memset_now(f->words, 0, (3 + MK_GEMM_RS_MAX_RANKS) * 8);
  for (int d = 0; d < nranks; d++) {
    if (d == rank) continue;
    for (int b = 0; b < 4; b++) CUDA_OK(cudaMalloc(&f->bufs[b][d], slot * 2));
    fill_random_bf16(f->bufs[RS_IN][d], slot, seed + d, 4.0f); /* large: a missing partial shows */
    fill_random_bf16(f->bufs[RS_GATHERED][d], slot, seed + 100 + d, 1.0f);
    poison(f->bufs[RS_OUT][d], slot * 2);
    poison(f->bufs[RS_GATHER][d], slot * 2);
    uint64_t* cnt[4];
    for (int b = 0; b < 4; b++) cnt[b] = f->counts + rs_region(b, region) + (size_t)d * blocks;
    if (peers_ready) {
      fill_u64<<<1, 128>>>(cnt[RS_IN], blocks, (uint64_t)tiles_n);
      fill_u64<<<1, 128>>>(cnt[RS_GATHERED], blocks, (uint64_t)tiles_n);
    }
    f->rs.in[d] = f->bufs[RS_IN][d], f->rs.in_counts[d] = cnt[RS_IN];
    f->rs.gathered[d] = f->bufs[RS_GATHERED][d], f->rs.gathered_counts[d] = cnt[RS_GATHERED];
    f->rs.out[d] = f->bufs[RS_OUT][d], f->rs.out_counts[d] = cnt[RS_OUT];
    f->rs.gather[d] = f->bufs[RS_GATHER][d], f->rs.gather_counts[d] = cnt[RS_GATHER];
  }
}

/* The call bracket: this rank's words and counters, peers whose done words read peer_done. */
static void rs_fake_peers_bracket(struct rs_fake_peers* f, uint64_t done, uint64_t peer_done) {
  const uint64_t words[3] = {done, 0, 0};
  CUDA_OK(cudaMemcpy(f->words, words, sizeof words, cudaMemcpyHostToDevice));
  fill_u64<<<1, 32>>>(f->words + 3, MK_GEMM_RS_MAX_RANKS, peer_done);
  struct mk_gemm_call* c = &f->call;
  c->rank = f->rs.rank, c->nranks = f->rs.nranks, c->set_done = 1;
  c->done = f->words, c->call = f->words + 1, c->exits = (uint32_t*)(f->words + 2);
  for (int d = 0; d < f->rs.nranks; d++)
    if (d != f->rs.rank) c->peer_done[d] = f->words + 3 + d;
  c->counters = f->counts, c->num_counters = 2 * f->rs.nranks * (f->rs.shard_rows / 128) + MK_GEMM_RS_CLAIM_WORDS;
  c->claims = f->rs.collect_claims + 2; /* the claimed walk, as gemm_rs.c */
}

static void rs_fake_peers_free(struct rs_fake_peers* f) {
  for (int d = 0; d < MK_GEMM_RS_MAX_RANKS; d++)
    for (int b = 0; b < 4; b++) cudaFree(f->bufs[b][d]);
  cudaFree(f->counts);
  cudaFree(f->words);
}

/* Every counter of region `which` for every peer == want. */
static int rs_counts_all(const struct rs_fake_peers* f, int which, int blocks, uint64_t want) {
  const int nr = f->rs.nranks;
  const size_t region = (size_t)nr * blocks;
  std::vector<uint64_t> h(4 * region + MK_GEMM_RS_CLAIM_WORDS);
  CUDA_OK(cudaMemcpy(h.data(), f->counts, h.size() * 8, cudaMemcpyDeviceToHost));
  for (int d = 0; d < nr; d++)
    for (int b = 0; d != f->rs.rank && b < blocks; b++)
      if (h[rs_region(which, region) + (size_t)d * blocks + b] != want) return 0;
  return 1;
}

static int bytes_equal(const void* x, const void* y, size_t bytes) {
  std::vector<unsigned char> hx(bytes), hy(bytes);
  CUDA_OK(cudaMemcpy(hx.data(), x, bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hy.data(), y, bytes, cudaMemcpyDeviceToHost));
  return hx == hy;
}

/* The peers' slots hold the plain GEMM of their rows; c = own rows + every peer's partial. */
static void rs_expect_slots_and_sum(struct problem* p, struct rs_fake_peers* f, const void* c_own, int shard,
                                    const char* label) {
  const int rank = f->rs.rank, nranks = f->rs.nranks, n = p->n, k = p->k;
  const size_t slot = (size_t)shard * n;
  for (int d = 0; d < nranks; d++) {
    if (d == rank) continue;
    ref_gemm_f64<double>((const __nv_bfloat16*)p->a + (size_t)d * shard * k, p->b, NULL, NULL, p->ref, shard, n, k);
    struct check_result r = check_close((const __nv_bfloat16*)f->rs.out[d], p->ref, slot, TOL);
    printf("  %s: slot of owner %d rel=%.3e %s\n", label, d, r.rel, r.pass ? "ok" : "FAIL");
    EXPECT(r.pass, "%s: owner %d's slot rel=%.3e", label, d, r.rel);
  }
  ref_gemm_f64<double>((const __nv_bfloat16*)p->a + (size_t)rank * shard * k, p->b, NULL, NULL, p->ref, shard, n, k);
  for (int d = 0; d < nranks; d++)
    if (d != rank) add_bf16_to_f64<<<256, 256>>>(p->ref, (const __nv_bfloat16*)f->rs.in[d], slot);
  struct check_result r = check_close((const __nv_bfloat16*)c_own, p->ref, slot, TOL);
  printf("  %s own rows: rel=%.3e %s\n", label, r.rel, r.pass ? "ok" : "FAIL");
  EXPECT(r.pass, "%s own rows rel=%.3e", label, r.rel);
  for (int d = 0; d < nranks; d++)
    EXPECT(d == rank || bytes_equal(c_own, f->rs.gather[d], slot * 2), "%s: gather slot on %d differs from c", label, d);
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
  char label[64];
  snprintf(label, sizeof label, "rank %d/%d", rank, nranks);
  rs_expect_slots_and_sum(&p, &f, p.c, shard, label);
  EXPECT(rs_counts_all(&f, RS_OUT, blocks, (uint64_t)tiles_n) && rs_counts_all(&f, RS_GATHER, blocks, (uint64_t)tiles_n),
         "%s: every out and gather counter must be %d", label, tiles_n);
  rs_fake_peers_free(&f);
  problem_free(&p);
}

/* The whole call in one launch: c is this rank's rows of c_full, the peers' reduced rows are
 * collected into the others, and the call ends with the counters zeroed and done = e. */
static void run_rs_bracket_case(int rank, int nranks, int n, int k) {
  const int shard = 256, m = shard * nranks, blocks = shard / 128;
  int bm, bn;
  mk_gemm_tile_shape(&bm, &bn);
  const int tiles_n = (n + bn - 1) / bn;
  struct problem p;
  problem_alloc(&p, m, n, k, 1, 2); /* c: [m, n], the whole all-reduce output */
  struct rs_fake_peers f;
  rs_fake_peers_make(&f, rank, nranks, shard, n, tiles_n, 1, p.seed + 7);
  rs_fake_peers_bracket(&f, 6, 6); /* call 7; the peers finished 6 */
  const size_t slot = (size_t)shard * n;
  void* c_own = (__nv_bfloat16*)p.c + (size_t)rank * slot;
  f.rs.c_full = p.c;
  struct mk_gemm_args g = problem_args(&p);
  g.c = c_own, g.rs = &f.rs, g.call = &f.call, g.row_block_rotate = ((rank + 1) % nranks) * blocks;
  EXPECT(launch_sync(&g) == 0, "launch (rank %d of %d, bracket)", rank, nranks);
  char label[64];
  snprintf(label, sizeof label, "bracket rank %d/%d", rank, nranks);
  rs_expect_slots_and_sum(&p, &f, c_own, shard, label);
  for (int d = 0; d < nranks; d++)
    EXPECT(d == rank || bytes_equal((__nv_bfloat16*)p.c + (size_t)d * slot, f.rs.gathered[d], slot * 2),
           "%s: rows of %d in c differ from its reduced rows", label, d);
  uint64_t words[3];
  CUDA_OK(cudaMemcpy(words, f.words, sizeof words, cudaMemcpyDeviceToHost));
  printf("  %s: done %llu call %llu exits %llu\n", label, (unsigned long long)words[0], (unsigned long long)words[1],
         (unsigned long long)words[2]);
  EXPECT(words[0] == 7 && words[1] == 7 && words[2] == 0, "%s: done/call must be 7, exits 0", label);
  uint64_t claims[MK_GEMM_RS_CLAIM_WORDS];
  CUDA_OK(cudaMemcpy(claims, f.rs.collect_claims, sizeof claims, cudaMemcpyDeviceToHost));
  EXPECT(rs_counts_all(&f, RS_IN, blocks, 0) && rs_counts_all(&f, RS_GATHERED, blocks, 0) && !claims[0] && !claims[1] &&
             !claims[2],
         "%s: this rank's counters and the collect's claims must be back to 0", label);
  EXPECT(rs_counts_all(&f, RS_OUT, blocks, (uint64_t)tiles_n), "%s: the peers' counters must be %d", label, tiles_n);
  rs_fake_peers_free(&f);
  problem_free(&p);
}

/* What never comes (a peer's partial; a peer still in its previous call): the kernel exits
 * cleanly with the error record naming the counter or the peer, and c is not written. */
static void run_rs_missing_case(int peer_busy) {
  const int rank = 0, nranks = 2, shard = 256, n = 512, k = 256;
  struct problem p;
  problem_alloc(&p, shard * nranks, n, k, 1, 2);
  struct rs_fake_peers f;
  rs_fake_peers_make(&f, rank, nranks, shard, n, 2, peer_busy, p.seed + 7);
  if (peer_busy) { /* call 6 while the peer has only finished 4 */
    rs_fake_peers_bracket(&f, 5, 4);
    f.rs.c_full = p.c;
  }
  struct mk_gemm_error* err;
  CUDA_OK(cudaHostAlloc((void**)&err, sizeof(*err), cudaHostAllocMapped));
  memset(err, 0, sizeof(*err));
  struct mk_gemm_args g = problem_args(&p);
  g.rs = &f.rs, g.err = err, g.err_tag = 0x5A, g.timeout_ms = 50;
  g.row_block_rotate = (rank + 1) % nranks * (shard / 128); /* the claimed walk's order (bracket) */
  if (peer_busy) g.call = &f.call;
  EXPECT(gemm_launch(&g, 0) == 0, "launch");
  cudaError_t e = cudaDeviceSynchronize();
  printf("  %s: kernel %s, aborted=%u tag=%x flag=%u expected=%llu seen=%llu\n",
         peer_busy ? "peer still busy" : "missing partial", cudaGetErrorString(e), err->aborted, err->tag,
         err->flag_index, (unsigned long long)err->expected, (unsigned long long)err->seen);
  if (peer_busy)
    EXPECT(e == cudaSuccess && err->aborted == 1 && err->tag == 0x5A && err->flag_index == 1 && err->expected == 5 &&
               err->seen == 4, "error record of a busy peer");
  else
    EXPECT(e == cudaSuccess && err->aborted == 1 && err->tag == 0x5A && err->expected == 2 && err->seen == 0 &&
               err->flag_index >= 2 && err->flag_index < 4, "error record of a missing partial");
  EXPECT(all_bytes_are(p.c, (size_t)shard * n * 2, 0xFF), "own rows written without the peer");
  CUDA_OK(cudaFreeHost(err));
  rs_fake_peers_free(&f);
  problem_free(&p);
  run_f64_case(300, 264, 512, 0); /* the context still works */
}

static void test_rs_epilogue(void) {
  run_rs_epilogue_case(0, 2, 520, 384);
  run_rs_epilogue_case(1, 2, 1000, 200);
  run_rs_epilogue_case(1, 3, 264, 128);
  run_rs_bracket_case(0, 2, 520, 384);
  run_rs_bracket_case(2, 3, 264, 128);
  run_rs_missing_case(0);
  run_rs_missing_case(1);
}

/* The row-scatter epilogue's case (test_scatter_epilogue): row r goes to rank dest[3r] at row
 * dest[3r+1] * mult + dest[3r+2] (a third of the rows dropped). */
enum { SCATTER_M = 300, SCATTER_N = 264, SCATTER_K = 128, SCATTER_MULT = 4, SCATTER_RANKS = 2 };
struct scatter_case {
  struct problem p;
  std::vector<int> dest;
  int* d_dest;
  void* base[SCATTER_RANKS];
  uint64_t* words; /* [0] done [1] peer done [2] exits [3..4] notify */
  struct mk_gemm_scatter sc;
  struct mk_gemm_call call;
};

static void scatter_case_alloc(struct scatter_case* t) {
  const int m = SCATTER_M, n = SCATTER_N;
  problem_alloc(&t->p, m, n, SCATTER_K, 1, 2);
  t->dest.resize((size_t)m * 3);
  for (int r = 0; r < m; r++) { /* a permutation of (rank, i, j) over the kept rows */
    t->dest[3 * r] = r % 3 == 0 ? -1 : r % 2;
    t->dest[3 * r + 1] = (m - 1 - r) / SCATTER_MULT, t->dest[3 * r + 2] = (m - 1 - r) % SCATTER_MULT;
  }
  CUDA_OK(cudaMalloc(&t->d_dest, t->dest.size() * 4));
  CUDA_OK(cudaMemcpy(t->d_dest, t->dest.data(), t->dest.size() * 4, cudaMemcpyHostToDevice));
  for (int d = 0; d < SCATTER_RANKS; d++) {
    CUDA_OK(cudaMalloc(&t->base[d], (size_t)m * n * 2));
    poison(t->base[d], (size_t)m * n * 2);
  }
  CUDA_OK(cudaMalloc(&t->words, 5 * 8));
  memset(&t->sc, 0, sizeof t->sc), memset(&t->call, 0, sizeof t->call);
  t->sc.row_dest = t->d_dest, t->sc.row_mult = SCATTER_MULT, t->sc.base[0] = t->base[0], t->sc.base[1] = t->base[1];
  t->call.rank = 0, t->call.nranks = SCATTER_RANKS, t->call.done = t->words, t->call.peer_done[1] = t->words + 1;
  t->call.exits = (uint32_t*)(t->words + 2), t->call.notify[0] = t->words + 3, t->call.notify[1] = t->words + 4;
}

static void scatter_case_free(struct scatter_case* t) {
  cudaFree(t->d_dest), cudaFree(t->base[0]), cudaFree(t->base[1]), cudaFree(t->words);
  problem_free(&t->p);
}

/* The kept rows against the reference where dest sends them; the count of elements off. */
static long scatter_rows_off(const struct scatter_case* t) {
  const int m = SCATTER_M, n = SCATTER_N;
  ref_gemm_f64<double>(t->p.a, t->p.b, NULL, NULL, t->p.ref, m, n, SCATTER_K);
  std::vector<double> ref((size_t)m * n);
  CUDA_OK(cudaMemcpy(ref.data(), t->p.ref, ref.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<__nv_bfloat16> out[SCATTER_RANKS];
  for (int d = 0; d < SCATTER_RANKS; d++) {
    out[d].resize((size_t)m * n);
    CUDA_OK(cudaMemcpy(out[d].data(), t->base[d], (size_t)m * n * 2, cudaMemcpyDeviceToHost));
  }
  long bad = 0;
  for (int r = 0; r < m; r++) {
    if (t->dest[3 * r] < 0) continue;
    const size_t row = (size_t)t->dest[3 * r + 1] * SCATTER_MULT + t->dest[3 * r + 2];
    for (int c = 0; c < n; c++) {
      const double o = __bfloat162float(out[t->dest[3 * r]][row * n + c]), e = ref[(size_t)r * n + c];
      bad += !(fabs(o - e) <= 0.02 * fabs(e) + 0.05);
    }
  }
  return bad;
}

/* The peer has not finished its previous call (done 2 of 3): the call gives up before any store
 * into it and must raise no notify word (a late peer would sum the stale rows). */
static void scatter_peer_late(struct scatter_case* t, struct mk_gemm_args g) {
  const uint64_t w1[5] = {3, 2, 0, 0, 0};
  uint64_t w[5];
  CUDA_OK(cudaMemcpy(t->words, w1, sizeof w1, cudaMemcpyHostToDevice));
  struct mk_gemm_error* err;
  CUDA_OK(cudaMalloc(&err, sizeof *err));
  memset_now(err, 0, sizeof *err);
  g.err = err, g.err_tag = 0x5B, g.timeout_ms = 50;
  EXPECT(launch_sync(&g) == 0, "launch");
  struct mk_gemm_error e;
  CUDA_OK(cudaMemcpy(&e, err, sizeof e, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(w, t->words, sizeof w, cudaMemcpyDeviceToHost));
  printf("  scatter, the peer late: aborted %u tile %x flag %u; done %llu exits %llu notify %llu %llu\n", e.aborted,
         e.tile, e.flag_index, (unsigned long long)w[0], (unsigned long long)w[2], (unsigned long long)w[3],
         (unsigned long long)w[4]);
  EXPECT(e.aborted && e.tile == MK_GEMM_ERR_TILE_PEER_FREE && e.flag_index == 1,
         "the record must name the late peer's previous call");
  EXPECT(w[2] == 0 && w[3] == 0 && w[4] == 0, "a call that gave up raised its notify words (%llu %llu)",
         (unsigned long long)w[3], (unsigned long long)w[4]);
  cudaFree(err);
}

/* Row-scatter epilogue with a call bracket (the MoE combine's GEMM): the kept rows land where
 * dest says, and the last CTA raises both notify words to e without touching done; then with
 * the peer's previous call not done, the call gives up (the record names it) and raises no
 * notify word. */
static void test_scatter_epilogue(void) {
  struct scatter_case t;
  scatter_case_alloc(&t);
  const uint64_t w0[5] = {3, 3, 0, 0, 0}; /* call 4; the peer finished 3 */
  CUDA_OK(cudaMemcpy(t.words, w0, sizeof w0, cudaMemcpyHostToDevice));
  struct mk_gemm_args g = problem_args(&t.p);
  g.scatter = &t.sc, g.call = &t.call;
  EXPECT(launch_sync(&g) == 0, "launch");
  long kept = 0;
  for (int r = 0; r < SCATTER_M; r++) kept += t.dest[3 * r] >= 0;
  const long bad = scatter_rows_off(&t);
  uint64_t w[5];
  CUDA_OK(cudaMemcpy(w, t.words, sizeof w, cudaMemcpyDeviceToHost));
  printf("  scatter: %ld rows kept, %ld elements off; done %llu exits %llu notify %llu %llu\n", kept, bad,
         (unsigned long long)w[0], (unsigned long long)w[2], (unsigned long long)w[3], (unsigned long long)w[4]);
  EXPECT(bad == 0, "scattered rows differ from the reference (%ld elements)", bad);
  EXPECT(w[0] == 3 && w[2] == 0 && w[3] == 4 && w[4] == 4, "bracket words: done 3 (not set), exits 0, notify 4");
  EXPECT(all_bytes_are(t.p.c, (size_t)SCATTER_M * SCATTER_N * 2, 0xFF), "c must not be written with the scatter epilogue");
  scatter_peer_late(&t, g);
  scatter_case_free(&t);
}
