/*
 * moe_perf's combine side (see moe_perf.cu's header comment), included by moe_perf.cu after
 * its types, the dispatch baseline (moe_baseline.cuh) and row_differs:
 *   fused     ncclMkMoeGemmCombine on the layout of the last fused dispatch;
 *   baseline  per local expert a cuBLASLt GEMM on the baseline's per-expert act2 rows (y rows),
 *             a kernel packing each y row with its (token, slot) into its source rank's part
 *             of a send buffer (the dispatch's row_src says where a row came from), NCCL
 *             all-to-all (grouped ncclSend/ncclRecv; counts from the dispatch's exchange, on
 *             the host since its synchronisation), then on each source a kernel indexing the
 *             returned rows by (token, slot) and one summing each token's rows weighted by
 *             topk_weights (fp32, one bf16 rounding);
 *   gemm      our grouped GEMM alone on the baseline's act2 rows with w2 (the floor).
 * act2 is a hash of (source rank, token, slot, column) in both layouts, so both outs must
 * agree; check_combine counts the token rows where they do not.
 */
#ifndef MK_MOE_COMBINE_PERF_CUH_
#define MK_MOE_COMBINE_PERF_CUH_

/* ---- inputs and buffers ------------------------------------------------------------------- */

/* act2 rows [0, group_offsets[groups]) (at most cap): row i is a function of row_src[i]'s
 * (source rank, token, slot) and the column, uniform in [-1, 1). The row count is read on the
 * device, so no host synchronisation is needed after a dispatch. */
static __global__ void fill_act2_kernel(__nv_bfloat16* act2, const int* row_src,
                                        const int* group_offsets, int groups, size_t cap,
                                        int inter) {
  const int count = group_offsets[groups];
  const size_t rows = count < 0 ? 0 : (size_t)count < cap ? (size_t)count : cap;
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int* s = row_src + 3 * r;
    const uint64_t key = splitmix64(
        splitmix64(splitmix64(0xAC72u + (unsigned)s[0]) + (unsigned)s[1]) + (unsigned)s[2]);
    for (int c = threadIdx.x; c < inter; c += blockDim.x) {
      double u = (double)(splitmix64(key + c) >> 11) * (1.0 / 9007199254740992.0);
      act2[r * inter + c] = __float2bfloat16((float)(2.0 * u - 1.0));
    }
  }
}

/* Both act2s from the current layouts: the fused one from the layout of the last fused
 * dispatch, the baseline's from its dispatch's row_src and offsets. */
static void combine_fill_act2(struct rank* k) {
  struct combine* c = &k->cb;
  const int el = k->sh.experts / k->n;
  ncclMkMoeLayoutInfo info;
  NCCL_OK(ncclMkMoeLayoutGetInfo(k->layout, &info));
  fill_act2_kernel<<<2048, 256, 0, k->s>>>((__nv_bfloat16*)c->act2, info.row_source,
                                           info.group_offsets, el, k->max_recv_rows, k->sh.inter);
  fill_act2_kernel<<<2048, 256, 0, k->s>>>((__nv_bfloat16*)c->act2_base, k->b.row_src,
                                           k->b.offsets, el, rows_cap(k), k->sh.inter);
  CUDA_OK(cudaGetLastError());
}

/* n top-k weights, uniform in [0.1, 1), from the host's generator. */
static void fill_weights(float* dev, size_t n, uint64_t seed) {
  float* w = (float*)malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    w[i] = 0.1f + 0.9f * (float)((double)(host_mix(&seed) >> 11) / 9007199254740992.0);
  CUDA_OK(cudaMemcpy(dev, w, n * sizeof(float), cudaMemcpyHostToDevice));
  free(w);
}

static void combine_alloc(struct rank* k) {
  struct combine* c = &k->cb;
  const struct moe_shape* sh = &k->sh;
  const size_t t = sh->tokens, h = sh->hidden, in = sh->inter, el = sh->experts / k->n;
  const size_t tk = t * sh->topk, cap = rows_cap(k);
  CUDA_OK(cudaMalloc(&c->w2, el * h * in * 2));
  CUDA_OK(cudaMalloc(&c->act2, k->max_recv_rows * in * 2));
  CUDA_OK(cudaMalloc(&c->weights, tk * sizeof(float)));
  CUDA_OK(cudaMalloc(&c->out, t * h * 2));
  CUDA_OK(cudaMalloc(&c->out_base, t * h * 2));
  CUDA_OK(cudaMalloc(&c->act2_base, cap * in * 2));
  CUDA_OK(cudaMalloc(&c->y, cap * h * 2));
  CUDA_OK(cudaMalloc(&c->send_y, cap * h * 2));
  CUDA_OK(cudaMalloc(&c->recv_y, tk * h * 2));
  CUDA_OK(cudaMalloc(&c->send_meta, cap * sizeof(int2)));
  CUDA_OK(cudaMalloc(&c->recv_meta, tk * sizeof(int2)));
  CUDA_OK(cudaMalloc(&c->cursor, MAX_RANKS * sizeof(int)));
  CUDA_OK(cudaMalloc(&c->slot_row, tk * sizeof(int)));
  fill_random_bf16(c->w2, el * h * in, 211 + k->r, 1.0f);
  fill_weights(c->weights, tk, 7927u * (k->r + 1) + sh->experts);
  CUDA_OK(cudaDeviceSynchronize());
  lt_plans_init(&c->lt, sh->hidden, sh->inter);
}

static void combine_free(struct combine* c) {
  lt_plans_fini(&c->lt);
  cudaFree(c->w2), cudaFree(c->act2), cudaFree(c->weights), cudaFree(c->out);
  cudaFree(c->out_base), cudaFree(c->act2_base), cudaFree(c->y), cudaFree(c->send_y);
  cudaFree(c->recv_y), cudaFree(c->send_meta), cudaFree(c->recv_meta), cudaFree(c->cursor);
  cudaFree(c->slot_row);
}

/* ---- baseline kernels --------------------------------------------------------------------- */

struct rank_bases {
  int at[MAX_RANKS]; /* first row of each source rank's part of the send buffer */
};

/* Block i: y row i (per-expert layout) into its source rank's part of send_y, in any order
 * (the receiver goes by the (token, slot) sent along). */
static __global__ void pack_returns_kernel(const uint4* y, const int* row_src, int hidden,
                                           struct rank_bases base, int* cursor, uint4* send_y,
                                           int2* send_meta) {
  __shared__ int at;
  const int* s = row_src + 3 * (size_t)blockIdx.x;
  if (threadIdx.x == 0) {
    at = base.at[s[0]] + atomicAdd(&cursor[s[0]], 1);
    send_meta[at] = make_int2(s[1], s[2]);
  }
  __syncthreads();
  const int v = hidden / 8; /* 16-byte vectors per row */
  for (int i = threadIdx.x; i < v; i += blockDim.x)
    send_y[(size_t)at * v + i] = y[(size_t)blockIdx.x * v + i];
}

/* slot_row[token][slot] = the returned row holding it. */
static __global__ void index_returns_kernel(const int2* meta, int rows, int topk, int* slot_row) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x)
    slot_row[(size_t)meta[i].x * topk + meta[i].y] = i;
}

/* Block t: out[t] = sum over slots s of weights[t][s] * row(t, s), in fp32, rounded once. */
static __global__ void weighted_sum_kernel(const uint4* rows, const int* slot_row,
                                           const float* weights, int topk, int hidden, uint4* out) {
  const size_t t = blockIdx.x;
  const int v = hidden / 8;
  for (int i = threadIdx.x; i < v; i += blockDim.x) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < topk; s++) {
      const int row = slot_row[t * topk + s];
      if (row < 0) continue; /* no row (a masked slot) */
      const float w = weights[t * topk + s];
      const uint4 q = rows[(size_t)row * v + i];
      const __nv_bfloat162* p = (const __nv_bfloat162*)&q;
      for (int e = 0; e < 4; e++) {
        const float2 f = __bfloat1622float2(p[e]);
        acc[2 * e] += w * f.x, acc[2 * e + 1] += w * f.y;
      }
    }
    uint4 o;
    __nv_bfloat162* po = (__nv_bfloat162*)&o;
    for (int e = 0; e < 4; e++) po[e] = __floats2bfloat162_rn(acc[2 * e], acc[2 * e + 1]);
    out[t * v + i] = o;
  }
}

/* ---- the variants ------------------------------------------------------------------------- */

static void run_combine_fused(struct rank* k) {
  const struct moe_shape* sh = &k->sh;
  struct combine* c = &k->cb;
  NCCL_OK(ncclMkMoeGemmCombine(c->act2, c->w2, c->weights, c->out, sh->tokens, sh->hidden,
                               sh->inter, k->layout, ncclBfloat16, k->comm, k->s));
}

/* Baseline combine, part 1: y = act2 . w2^T, one cuBLASLt GEMM per local expert. */
static void combine_base_gemm(struct rank* k) {
  struct combine* c = &k->cb;
  const int el = k->sh.experts / k->n;
  const size_t h = k->sh.hidden, in = k->sh.inter;
  size_t off = 0;
  for (int j = 0; j < el; j++) {
    if (k->b.h_rows[j])
      lt_plan_run(&c->lt, k->b.h_rows[j], (char*)c->act2_base + off * in * 2,
                  (char*)c->w2 + j * h * in * 2, (char*)c->y + off * h * 2, k->s);
    off += k->b.h_rows[j];
  }
}

/* Part 2: y rows packed per source rank and sent back with their (token, slot). The counts
 * are the dispatch's (pinned host copies read after its synchronisation): rows back to p are
 * the rows p sent to this rank's experts, rows from p the rows this rank sent to p's. */
static int combine_base_exchange(struct rank* k) {
  struct combine* c = &k->cb;
  const struct baseline* b = &k->b;
  const int el = k->sh.experts / k->n, n1 = 1 + el;
  const size_t h = k->sh.hidden;
  int to[MAX_RANKS], from[MAX_RANKS];
  struct rank_bases base;
  for (int p = 0, at = 0; p < k->n; at += to[p], p++) {
    to[p] = from[p] = 0, base.at[p] = at;
    for (int j = 0; j < el; j++)
      to[p] += b->h_recv_hdr[p * n1 + 1 + j], from[p] += b->h_send_hdr[p * n1 + 1 + j];
  }
  CUDA_OK(cudaMemsetAsync(c->cursor, 0, MAX_RANKS * sizeof(int), k->s));
  if (b->rows > 0)
    pack_returns_kernel<<<b->rows, 128, 0, k->s>>>((const uint4*)c->y, b->row_src, (int)h, base,
                                                   c->cursor, (uint4*)c->send_y, c->send_meta);
  CUDA_OK(cudaGetLastError());
  size_t so = 0, ro = 0;
  NCCL_OK(ncclGroupStart());
  for (int p = 0; p < k->n; p++) {
    NCCL_OK(ncclSend((char*)c->send_y + so * h * 2, to[p] * h, ncclBfloat16, p, k->comm, k->s));
    NCCL_OK(ncclRecv((char*)c->recv_y + ro * h * 2, from[p] * h, ncclBfloat16, p, k->comm, k->s));
    NCCL_OK(ncclSend(c->send_meta + so, 2 * to[p], ncclInt32, p, k->comm, k->s));
    NCCL_OK(ncclRecv(c->recv_meta + ro, 2 * from[p], ncclInt32, p, k->comm, k->s));
    so += to[p], ro += from[p];
  }
  NCCL_OK(ncclGroupEnd());
  return (int)ro;
}

/* Part 3: on the source, the returned rows indexed by (token, slot), then summed weighted. */
static void combine_base_sum(struct rank* k, int returned) {
  struct combine* c = &k->cb;
  const int t = k->sh.tokens, topk = k->sh.topk;
  CUDA_OK(cudaMemsetAsync(c->slot_row, 0xFF, (size_t)t * topk * sizeof(int), k->s));
  if (returned > 0)
    index_returns_kernel<<<(returned + 255) / 256, 256, 0, k->s>>>(c->recv_meta, returned, topk,
                                                                   c->slot_row);
  weighted_sum_kernel<<<t, 128, 0, k->s>>>((const uint4*)c->recv_y, c->slot_row, c->weights, topk,
                                           k->sh.hidden, (uint4*)c->out_base);
  CUDA_OK(cudaGetLastError());
}

static void run_combine_baseline(struct rank* k) {
  combine_base_gemm(k);
  combine_base_sum(k, combine_base_exchange(k));
}

/* The floor: our grouped GEMM on the baseline's per-expert act2 rows with w2. */
static void run_combine_gemm(struct rank* k) {
  run_floor_gemm(k, k->cb.act2_base, k->cb.w2, k->cb.y, k->sh.hidden, k->sh.inter);
}

/* ---- the check: the fused out against the baseline's, token by token --------------------- */

static __global__ void compare_out_kernel(const __nv_bfloat16* out, const __nv_bfloat16* ref,
                                          int rows, int cols, unsigned long long* wrong) {
  __shared__ double shared[32];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int differs = row_differs(out + (size_t)r * cols, ref + (size_t)r * cols, cols, shared);
    if (threadIdx.x == 0 && differs) atomicAdd(wrong, 1ull);
  }
}

/* After a fused dispatch and a baseline one (their layouts current): act2 filled for both,
 * outs poisoned, one fused combine and one baseline combine; the token rows that differ. */
static unsigned long long check_combine(struct rank* k) {
  struct combine* c = &k->cb;
  const int t = k->sh.tokens, h = k->sh.hidden, grid = t < 65535 ? t : 65535;
  unsigned long long *d_wrong, wrong = 0;
  CUDA_OK(cudaMalloc(&d_wrong, sizeof(*d_wrong)));
  CUDA_OK(cudaMemsetAsync(d_wrong, 0, sizeof(*d_wrong), k->s));
  CUDA_OK(cudaMemsetAsync(c->out, 0xFF, (size_t)t * h * 2, k->s));
  CUDA_OK(cudaMemsetAsync(c->out_base, 0xFF, (size_t)t * h * 2, k->s));
  combine_fill_act2(k);
  run_combine_fused(k);
  run_combine_baseline(k);
  compare_out_kernel<<<grid, 256, 0, k->s>>>((const __nv_bfloat16*)c->out,
                                             (const __nv_bfloat16*)c->out_base, t, h, d_wrong);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpyAsync(&wrong, d_wrong, sizeof(wrong), cudaMemcpyDeviceToHost, k->s));
  CUDA_OK(cudaStreamSynchronize(k->s));
  cudaFree(d_wrong);
  return wrong;
}

#endif /* MK_MOE_COMBINE_PERF_CUH_ */
