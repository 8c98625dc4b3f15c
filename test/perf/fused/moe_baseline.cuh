/*
 * moe_perf's sequential baseline (see moe_perf.cu's header comment), included by moe_perf.cu
 * after its types (struct baseline, struct lt_plans, struct rank): the dispatch's routing and
 * permutation kernels, cuBLASLt plans per row count, the buffers and the three timed parts.
 * The combine side of the baseline is in moe_combine_perf.cuh.
 */
#ifndef MK_MOE_BASELINE_CUH_
#define MK_MOE_BASELINE_CUH_

/* ---- baseline kernels --------------------------------------------------------------------- */

/* Exclusive place of each flagged thread among the block's flagged threads, after the
 * *running places of earlier rounds; every thread of the block calls it. */
static __device__ int block_place(int flag, int* warp_sum, int* running) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned ballot = __ballot_sync(0xffffffffu, flag);
  int before = __popc(ballot & ((1u << lane) - 1));
  if (lane == 0) warp_sum[warp] = __popc(ballot);
  __syncthreads();
  int base = *running;
  for (int w = 0; w < warp; w++) base += warp_sum[w];
  __syncthreads();
  if (threadIdx.x == blockDim.x - 1) *running = base + before + flag;
  __syncthreads();
  return base + before;
}

/* Block d: which tokens go to rank d (in token order) and how many rows each of d's experts
 * gets from this rank. */
static __global__ void plan_sends_kernel(const int* topk_idx, int tokens, int topk, int el,
                                         int* send_pos, int* send_hdr) {
  __shared__ int rows[MAX_LOCAL_EXPERTS], warp_sum[32], running;
  const int d = blockIdx.x;
  for (int j = threadIdx.x; j < el; j += blockDim.x) rows[j] = 0;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int t0 = 0; t0 < tokens; t0 += blockDim.x) {
    int t = t0 + threadIdx.x, to_d = 0;
    for (int s = 0; t < tokens && s < topk; s++) {
      int x = topk_idx[(size_t)t * topk + s];
      if (x / el == d) to_d = 1, atomicAdd(&rows[x - d * el], 1);
    }
    int pos = block_place(to_d, warp_sum, &running);
    if (t < tokens) send_pos[(size_t)d * tokens + t] = to_d ? pos : -1;
  }
  if (threadIdx.x == 0) send_hdr[d * (1 + el)] = running;
  for (int j = threadIdx.x; j < el; j += blockDim.x) send_hdr[d * (1 + el) + 1 + j] = rows[j];
}

/* Block (t, d): token t's row and top-k ids into d's part of the contiguous send buffers. */
static __global__ void gather_sends_kernel(const uint4* x, const int* topk_idx, int tokens,
                                           int hidden, int topk, int el, const int* send_pos,
                                           const int* send_hdr, uint4* send_x, int* send_meta) {
  const int t = blockIdx.x, d = blockIdx.y, pos = send_pos[(size_t)d * tokens + t];
  if (pos < 0) return;
  size_t at = pos;
  for (int p = 0; p < d; p++) at += send_hdr[p * (1 + el)];
  const int v = hidden / 8; /* 16-byte vectors per row */
  for (int i = threadIdx.x; i < v; i += blockDim.x) send_x[at * v + i] = x[(size_t)t * v + i];
  if (threadIdx.x <= topk)
    send_meta[at * (1 + topk) + threadIdx.x] =
        threadIdx.x ? topk_idx[(size_t)t * topk + threadIdx.x - 1] : t;
}

/* offsets[j] = rows of experts before j, summed over every source (one thread: el <= 256). */
static __global__ void expert_offsets_kernel(const int* recv_hdr, int nranks, int el,
                                             int* offsets) {
  int at = 0;
  for (int j = 0; j < el; j++) {
    offsets[j] = at;
    for (int p = 0; p < nranks; p++) at += recv_hdr[p * (1 + el) + 1 + j];
  }
  offsets[el] = at;
}

/* Block j: the place of every received slot of expert expert0 + j among that expert's rows. */
static __global__ void plan_rows_kernel(const int* recv_meta, int recv_tokens, int topk,
                                        int expert0, int* row_pos) {
  __shared__ int warp_sum[32], running;
  const int expert = expert0 + blockIdx.x;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int r0 = 0; r0 < recv_tokens; r0 += blockDim.x) {
    int r = r0 + threadIdx.x, slot = -1;
    for (int s = 0; r < recv_tokens && s < topk; s++)
      if (recv_meta[(size_t)r * (1 + topk) + 1 + s] == expert) slot = s;
    int pos = block_place(slot >= 0, warp_sum, &running);
    if (slot >= 0) row_pos[(size_t)r * topk + slot] = pos;
  }
}

/* Block (r, s): received token r's row into its expert's rows, with where it came from. */
static __global__ void gather_rows_kernel(const uint4* recv_x, const int* recv_meta,
                                          const int* recv_hdr, int hidden, int topk, int expert0,
                                          int el, const int* row_pos, const int* offsets,
                                          uint4* a_rows, int* row_src) {
  const int r = blockIdx.x, s = blockIdx.y;
  const int j = recv_meta[(size_t)r * (1 + topk) + 1 + s] - expert0;
  if (j < 0 || j >= el) return;
  const size_t row = (size_t)offsets[j] + row_pos[(size_t)r * topk + s];
  const int v = hidden / 8;
  for (int i = threadIdx.x; i < v; i += blockDim.x) a_rows[row * v + i] = recv_x[(size_t)r * v + i];
  if (threadIdx.x == 0) {
    int src = 0, end = recv_hdr[0];
    while (r >= end) end += recv_hdr[++src * (1 + el)];
    int* to = row_src + 3 * row;
    to[0] = src, to[1] = recv_meta[(size_t)r * (1 + topk)], to[2] = s;
  }
}

/* ---- cuBLASLt, one GEMM per expert -------------------------------------------------------- */

/* C[m, n] = A[m, k] . W[n, k]^T in column-major terms (gemm_check.cuh's lt_gemm). */
static void lt_plans_init(struct lt_plans* P, int n, int k) {
  memset(P, 0, sizeof(*P));
  P->n = n, P->k = k, P->ws_size = 64u << 20;
  CUDA_OK(cudaMalloc(&P->ws, P->ws_size));
  LT_OK(cublasLtCreate(&P->h));
  LT_OK(cublasLtMatmulDescCreate(&P->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  LT_OK(cublasLtMatmulDescSetAttribute(P->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  LT_OK(cublasLtMatmulDescSetAttribute(P->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof(nt)));
  LT_OK(cublasLtMatrixLayoutCreate(&P->lw, CUDA_R_16BF, k, n, k));
}

static const struct lt_plan* lt_plan_for(struct lt_plans* P, int m) {
  for (int i = 0; i < P->count; i++)
    if (P->plan[i].m == m) return &P->plan[i];
  if (P->count == MAX_PLANS) {
    fprintf(stderr, "moe_perf: more than %d distinct expert sizes\n", MAX_PLANS);
    exit(1);
  }
  struct lt_plan* q = &P->plan[P->count++];
  q->m = m;
  LT_OK(cublasLtMatrixLayoutCreate(&q->la, CUDA_R_16BF, P->k, m, P->k));
  LT_OK(cublasLtMatrixLayoutCreate(&q->lc, CUDA_R_16BF, P->n, m, P->n));
  cublasLtMatmulPreference_t pref;
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &P->ws_size, sizeof(P->ws_size)));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  LT_OK(cublasLtMatmulAlgoGetHeuristic(P->h, P->op, P->lw, q->la, q->lc, q->lc, pref, 1, &res,
                                       &found));
  if (!found) {
    fprintf(stderr, "cublasLt: no algorithm for %d x %d x %d\n", m, P->n, P->k);
    exit(1);
  }
  q->algo = res.algo;
  cublasLtMatmulPreferenceDestroy(pref);
  return q;
}

static void lt_plan_run(struct lt_plans* P, int m, const void* a, const void* w, void* c,
                        cudaStream_t s) {
  const struct lt_plan* q = lt_plan_for(P, m);
  const float one = 1.0f, zero = 0.0f;
  LT_OK(cublasLtMatmul(P->h, P->op, &one, w, P->lw, a, q->la, &zero, c, q->lc, c, q->lc, &q->algo,
                       P->ws, P->ws_size, s));
}

static void lt_plans_fini(struct lt_plans* P) {
  for (int i = 0; i < P->count; i++)
    cublasLtMatrixLayoutDestroy(P->plan[i].la), cublasLtMatrixLayoutDestroy(P->plan[i].lc);
  cublasLtMatrixLayoutDestroy(P->lw);
  cublasLtMatmulDescDestroy(P->op);
  cublasLtDestroy(P->h);
  cudaFree(P->ws);
}

/* ---- buffers ------------------------------------------------------------------------------ */

static size_t rows_cap(const struct rank* k) {
  int el = k->sh.experts / k->n;
  return (size_t)k->n * k->sh.tokens * (k->sh.topk < el ? k->sh.topk : el);
}

static void baseline_alloc(struct rank* k) {
  struct baseline* b = &k->b;
  const size_t nt = (size_t)k->n * k->sh.tokens, h = k->sh.hidden, tk = k->sh.topk,
               el = k->sh.experts / k->n;
  const size_t hdr = k->n * (1 + el) * sizeof(int), cap = rows_cap(k);
  CUDA_OK(cudaMalloc(&b->send_pos, nt * sizeof(int)));
  CUDA_OK(cudaMalloc(&b->send_hdr, hdr));
  CUDA_OK(cudaMalloc(&b->recv_hdr, hdr));
  CUDA_OK(cudaMallocHost(&b->h_send_hdr, hdr));
  CUDA_OK(cudaMallocHost(&b->h_recv_hdr, hdr));
  CUDA_OK(cudaMalloc(&b->send_x, nt * h * 2));
  CUDA_OK(cudaMalloc(&b->recv_x, nt * h * 2));
  CUDA_OK(cudaMalloc(&b->send_meta, nt * (1 + tk) * sizeof(int)));
  CUDA_OK(cudaMalloc(&b->recv_meta, nt * (1 + tk) * sizeof(int)));
  CUDA_OK(cudaMalloc(&b->row_pos, nt * tk * sizeof(int)));
  CUDA_OK(cudaMalloc(&b->offsets, (el + 1) * sizeof(int)));
  b->h_rows = (int*)calloc(el, sizeof(int));
  CUDA_OK(cudaMalloc(&b->a_rows, cap * h * 2));
  CUDA_OK(cudaMalloc(&b->c, cap * k->sh.inter * 2));
  CUDA_OK(cudaMalloc(&b->row_src, cap * 3 * sizeof(int)));
  lt_plans_init(&b->lt, k->sh.inter, k->sh.hidden);
}

static void baseline_free(struct baseline* b) {
  lt_plans_fini(&b->lt);
  cudaFree(b->send_pos), cudaFree(b->send_hdr), cudaFree(b->recv_hdr);
  cudaFreeHost(b->h_send_hdr), cudaFreeHost(b->h_recv_hdr);
  cudaFree(b->send_x), cudaFree(b->recv_x), cudaFree(b->send_meta), cudaFree(b->recv_meta);
  cudaFree(b->row_pos), cudaFree(b->offsets), cudaFree(b->a_rows), cudaFree(b->c),
      cudaFree(b->row_src);
  free(b->h_rows);
}

/* ---- the timed parts ---------------------------------------------------------------------- */

/* Baseline, part 1: plan the sends, pack the send buffers, exchange the counts. */
static void baseline_pack_and_count(struct rank* k) {
  struct baseline* b = &k->b;
  const int t = k->sh.tokens, el = k->sh.experts / k->n, n1 = 1 + el;
  plan_sends_kernel<<<k->n, 1024, 0, k->s>>>(k->topk_idx, t, k->sh.topk, el, b->send_pos,
                                             b->send_hdr);
  gather_sends_kernel<<<dim3(t, k->n), 128, 0, k->s>>>(
      (const uint4*)k->x_base, k->topk_idx, t, k->sh.hidden, k->sh.topk, el, b->send_pos,
      b->send_hdr, (uint4*)b->send_x, b->send_meta);
  CUDA_OK(cudaGetLastError());
  NCCL_OK(ncclGroupStart());
  for (int p = 0; p < k->n; p++) {
    NCCL_OK(ncclSend(b->send_hdr + p * n1, n1, ncclInt32, p, k->comm, k->s));
    NCCL_OK(ncclRecv(b->recv_hdr + p * n1, n1, ncclInt32, p, k->comm, k->s));
  }
  NCCL_OK(ncclGroupEnd());
}

/* Part 2: the host waits for the counts (the sizes of everything after), then the token
 * rows and their top-k ids go to their ranks. */
static void baseline_sync_and_exchange(struct rank* k) {
  struct baseline* b = &k->b;
  const int el = k->sh.experts / k->n, n1 = 1 + el, m1 = 1 + k->sh.topk;
  const size_t hdr = k->n * n1 * sizeof(int), h = k->sh.hidden;
  CUDA_OK(cudaMemcpyAsync(b->h_send_hdr, b->send_hdr, hdr, cudaMemcpyDeviceToHost, k->s));
  CUDA_OK(cudaMemcpyAsync(b->h_recv_hdr, b->recv_hdr, hdr, cudaMemcpyDeviceToHost, k->s));
  CUDA_OK(cudaStreamSynchronize(k->s));
  size_t so = 0, ro = 0;
  memset(b->h_rows, 0, el * sizeof(int));
  NCCL_OK(ncclGroupStart());
  for (int p = 0; p < k->n; p++) {
    size_t sc = b->h_send_hdr[p * n1], rc = b->h_recv_hdr[p * n1];
    for (int j = 0; j < el; j++) b->h_rows[j] += b->h_recv_hdr[p * n1 + 1 + j];
    NCCL_OK(ncclSend((char*)b->send_x + so * h * 2, sc * h, ncclBfloat16, p, k->comm, k->s));
    NCCL_OK(ncclRecv((char*)b->recv_x + ro * h * 2, rc * h, ncclBfloat16, p, k->comm, k->s));
    NCCL_OK(ncclSend(b->send_meta + so * m1, sc * m1, ncclInt32, p, k->comm, k->s));
    NCCL_OK(ncclRecv(b->recv_meta + ro * m1, rc * m1, ncclInt32, p, k->comm, k->s));
    so += sc, ro += rc;
  }
  NCCL_OK(ncclGroupEnd());
  b->recv_tokens = (int)ro;
  b->rows = 0;
  for (int j = 0; j < el; j++) b->rows += b->h_rows[j];
}

/* Part 3: the received rows into the per-expert layout, then one cuBLASLt GEMM per expert. */
static void baseline_expand_and_gemm(struct rank* k) {
  struct baseline* b = &k->b;
  const int el = k->sh.experts / k->n, r = b->recv_tokens;
  expert_offsets_kernel<<<1, 1, 0, k->s>>>(b->recv_hdr, k->n, el, b->offsets);
  if (r > 0) {
    plan_rows_kernel<<<el, 1024, 0, k->s>>>(b->recv_meta, r, k->sh.topk, k->r * el, b->row_pos);
    gather_rows_kernel<<<dim3(r, k->sh.topk), 128, 0, k->s>>>(
        (const uint4*)b->recv_x, b->recv_meta, b->recv_hdr, k->sh.hidden, k->sh.topk, k->r * el, el,
        b->row_pos, b->offsets, (uint4*)b->a_rows, b->row_src);
  }
  CUDA_OK(cudaGetLastError());
  const size_t h = k->sh.hidden, in = k->sh.inter;
  size_t off = 0;
  for (int j = 0; j < el; j++) {
    if (b->h_rows[j])
      lt_plan_run(&b->lt, b->h_rows[j], (char*)b->a_rows + off * h * 2,
                  (char*)k->w1 + j * in * h * 2, (char*)b->c + off * in * 2, k->s);
    off += b->h_rows[j];
  }
}

static void run_baseline(struct rank* k) {
  baseline_pack_and_count(k);
  baseline_sync_and_exchange(k);
  baseline_expand_and_gemm(k);
}

#endif /* MK_MOE_BASELINE_CUH_ */
