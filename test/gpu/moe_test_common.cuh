/*
 * The harness of test_moe.cu: one MoE case (x, topk_idx and topk_weights of every rank from
 * seeds, so every rank regenerates its peers' inputs for the reference) run through
 * ncclMkMoeDispatchGemm and ncclMkMoeGemmCombine on 2 ranks, then checked against float64.
 * Routings: uniform, skewed (one hot expert), empty experts, one rank receiving nothing,
 * masked slots (ids outside [0, E)); any rank may call with tokens = 0 (rank_env.no_tokens).
 * Checks on every rank after a dispatch: (a) the layout's rows are exactly the (source, token,
 * slot) triples routed to this rank's experts, each under its expert's group (row order inside
 * a group is not specified, so everything goes through row_source); (b) every act row against
 * x_src[t] . w1[j]^T, per row ||out - ref|| / ||ref|| < 1e-2, rows past the last untouched;
 * (c) rows_sent equals the deduplicated count. After the combine (act2 a hash of (source,
 * token, slot)): every out row against the float64 weighted sum.
 * On a communicator with ncclMkConfig.moe_dispatch_fp8 (rank_env.fp8), x's rows are shaped
 * (fill_x) and (b) compares act with x_src[t] quantized and dequantized as include/nccl_mk.h
 * says (moe_check.cuh), and also requires at least half of the rows to be further than 1e-2
 * from the unquantized reference (a negative control against the bf16 path).
 */
#ifndef MK_MOE_TEST_COMMON_CUH_
#define MK_MOE_TEST_COMMON_CUH_

#include <limits.h>
#include <string.h>

#include "moe_check.cuh"
#include "nccl_mk.h"
#include "rank_harness.cuh" /* g_seed */

/* Ranks: 2, or MK_TEST_RANKS (set once in main, before anything reads it; 4 and 8 on a larger
 * machine, gpu-check's scale tier). */
static int NR = 2;
static const double TOL = 1e-2;

/* The limits given to ncclMkCommInit (moe_max_recv_rows 0: the worst case); every case fits. */
enum { MAX_TOKENS = 16384, MAX_HIDDEN = 512, MAX_TOPK = 8 };
/* act's rows, per header: the worst case, every rank's every slot */
static size_t rows_cap(void) { return (size_t)NR * MAX_TOKENS * MAX_TOPK; }

struct rank_env {
  int rank;
  ncclComm_t comm;
  cudaStream_t stream;
  ncclMkMoeLayout_t layout;
  int failures;
  int fp8;       /* the communicator's ncclMkConfig.moe_dispatch_fp8 */
  int no_tokens; /* bit p set: in this case rank p calls both ops with tokens = 0 and NULL x,
                  * topk_idx, topk_weights, out; the reference sees its slots all masked */
};

enum routing { UNIFORM, SKEWED, EMPTY_EXPERTS, ONE_RANK_EMPTY, MASKED };
static const char* routing_names[] = {"uniform", "skewed", "empty_experts", "one_rank_empty",
                                      "masked"};

/* inter: the dispatch's output width; inter2: the combine's input width (after activation). */
struct moe_case {
  int tokens, hidden, inter, inter2, topk, experts;
  enum routing mode;
};

/* The tokens rank p passes to the calls (rank_env.no_tokens). */
static int tokens_of(const struct rank_env* e, const struct moe_case* c, int p) {
  return e->no_tokens >> p & 1 ? 0 : c->tokens;
}


/* which: 1 x, 2 w1, 3 w2, 4 topk_weights, 5 routing. */
static uint64_t seed_of(uint64_t base, int r, int which) { return base * 1000 + r * 10 + which; }
/* act2 is a function of (source, token, slot) only, fixed per run: a graph's frozen kernel
 * arguments then still describe the rows of every replay. */
static uint64_t act2_seed(void) { return g_seed * 1000 + 6; }

static void expect(struct rank_env* e, int ok, const char* what, double rel) {
  if (!ok) {
    fprintf(stderr, "rank %d: %s failed (rel err %g)\n", e->rank, what, rel);
    e->failures++;
  }
}

/* ---- routing, on the host ------------------------------------------------------------ */

static int host_below(uint64_t* s, int n) { return (int)(host_mix(s) % (uint64_t)n); }
static double host_unit(uint64_t* s) { return (double)(host_mix(s) >> 11) / 9007199254740992.0; }

/* The experts a mode draws from. EMPTY_EXPERTS leaves the first, the last and every fourth
 * local expert of each rank without rows; ONE_RANK_EMPTY uses rank 0's experts only. */
static int allowed_experts(enum routing mode, int experts, int* out) {
  int el = experts / NR, n = 0;
  for (int x = 0; x < experts; x++) {
    int j = x % el;
    if (mode == EMPTY_EXPERTS && (j == 0 || j == el - 1 || j % 4 == 1)) continue;
    if (mode == ONE_RANK_EMPTY && x / el != 0) continue;
    out[n++] = x;
  }
  return n;
}

/* MASKED: about a third of the slots get ids outside [0, E) (both sides), and every fifth
 * token is masked entirely (its output must be zeros). */
static void mask_slots(uint64_t* s, int* slots, int k, int experts, int t) {
  const int invalid[] = {-1, experts, experts + 3, -7, INT_MAX, INT_MIN};
  for (int i = 0; i < k; i++)
    if (t % 5 == 2 || host_below(s, 3) == 0) slots[i] = invalid[host_below(s, 6)];
}

/* k distinct experts from `allowed` (SKEWED: slot 0 is the hot expert 85% of the time);
 * slots left over when fewer experts are allowed than k are masked with -1. */
static void route_token(uint64_t* s, const struct moe_case* c, const int* allowed, int n_allowed,
                        int* pool, int t, int* slots) {
  const int hot = c->experts / NR + 1; /* on rank 1 */
  int n = n_allowed, i = 0;
  memcpy(pool, allowed, sizeof(int) * n_allowed);
  if (c->mode == SKEWED && host_below(s, 100) < 85) {
    for (int p = 0; p < n; p++)
      if (pool[p] == hot) pool[p] = pool[--n], slots[i++] = hot;
  }
  for (; i < c->topk && n > 0; i++) {
    int p = host_below(s, n);
    slots[i] = pool[p], pool[p] = pool[--n];
  }
  for (; i < c->topk; i++) slots[i] = -1;
  if (c->mode == MASKED) mask_slots(s, slots, c->topk, c->experts, t);
}

/* topk_idx [tokens, topk] of one rank, from its seed. */
static void make_routing(const struct moe_case* c, uint64_t seed, int* idx) {
  int* allowed = (int*)malloc(sizeof(int) * c->experts);
  int* pool = (int*)malloc(sizeof(int) * c->experts);
  int n = allowed_experts(c->mode, c->experts, allowed);
  uint64_t s = seed;
  for (int t = 0; t < c->tokens; t++)
    route_token(&s, c, allowed, n, pool, t, idx + (size_t)t * c->topk);
  free(allowed), free(pool);
}

static int slot_valid(int expert, int experts) { return expert >= 0 && expert < experts; }

/* Rows this rank pushes to other ranks: one per (token, other rank owning one of its experts). */
static unsigned long long dedup_rows_sent(const struct moe_case* c, int me, const int* idx) {
  int el = c->experts / NR;
  unsigned long long n = 0;
  for (int t = 0; t < c->tokens; t++) {
    unsigned mask = 0;
    for (int s = 0; s < c->topk; s++) {
      int x = idx[(size_t)t * c->topk + s];
      if (slot_valid(x, c->experts) && x / el != me) mask |= 1u << (x / el);
    }
    n += (unsigned long long)__builtin_popcount(mask);
  }
  return n;
}

/* ---- device helpers -------------------------------------------------------------------- */

static __device__ __nv_bfloat16 act2_value(uint64_t seed, int src, int t, int s, int i) {
  uint64_t key = (((uint64_t)(unsigned)src * 1048576u + (unsigned)t) * 64u + (unsigned)s) * 65536u +
                 (unsigned)i;
  double u = (double)(splitmix64(seed * 0x100000001B3ull + key) >> 11) * (1.0 / 9007199254740992.0);
  return __float2bfloat16((float)(2.0 * u - 1.0));
}

/* The combine's input, from the layout on the device (so a graph can hold it): row i of act2
 * is act2_value of row_source[i]. The row count is read from group_offsets[experts_local]. */
static __global__ void fill_act2_kernel(__nv_bfloat16* act2, const int* row_source,
                                        const int* group_offsets, int experts_local, int inter2,
                                        size_t rows_cap, uint64_t seed) {
  size_t rows = (size_t)max(group_offsets[experts_local], 0);
  size_t n = (rows < rows_cap ? rows : rows_cap) * inter2;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const int* src = row_source + 3 * (i / inter2);
    act2[i] = act2_value(seed, src[0], src[1], src[2], (int)(i % inter2));
  }
}

/* The reference's copy of this rank's act2 rows, one per (token, slot): row t * topk + s. */
static __global__ void ref_act2_kernel(__nv_bfloat16* a2, size_t rows, int topk, int inter2, int me,
                                       uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * inter2;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / inter2;
    a2[i] = act2_value(seed, me, (int)(r / topk), (int)(r % topk), (int)(i % inter2));
  }
}

/* a_rows[i] = x of row i's source token, from every rank's x ([NR][tokens][hidden]); a row
 * naming no valid token gets zeros (the layout check reports it). */
static __global__ void gather_x_rows_kernel(const __nv_bfloat16* x_all, const int* row_source,
                                            int rows, int nranks, int tokens, int hidden,
                                            __nv_bfloat16* a_rows) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    int src = row_source[3 * r], t = row_source[3 * r + 1];
    int ok = src >= 0 && src < nranks && t >= 0 && t < tokens;
    const __nv_bfloat16* from = x_all + ((size_t)src * tokens + t) * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x)
      a_rows[(size_t)r * hidden + c] = ok ? from[c] : __float2bfloat16(0.0f);
  }
}

/* fp8 cases' x: token t's row times 2^((5 t mod 17) - 8) (exact in bf16: only a scale per
 * token keeps every row's precision), and every token with t mod 7 == 3 all zeros (amax 0). */
static __global__ void shape_x_rows_kernel(__nv_bfloat16* x, size_t tokens, int hidden) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < tokens * hidden;
       i += (size_t)gridDim.x * blockDim.x) {
    const int t = (int)(i / hidden);
    const float f = t % 7 == 3 ? 0.0f : ldexpf(1.0f, (5 * t) % 17 - 8);
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * f);
  }
}

/* ref[t, c] = sum over slots s of weight[t, s] * y[t * topk + s, c] (masked slots weigh 0). */
static __global__ void weighted_sum_kernel(const double* y, const float* w, int tokens, int topk,
                                           int hidden, double* ref) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)tokens * hidden;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t t = i / hidden, c = i % hidden;
    double s = 0;
    for (int k = 0; k < topk; k++) s += (double)w[t * topk + k] * y[(t * topk + k) * hidden + c];
    ref[i] = s;
  }
}

/* rel[r] = ||out_r - ref_r|| / ||ref_r||; infinite when an output is not finite or when ref_r
 * is zero (a fully masked token) and out_r is not exactly zero. */
static __global__ void row_rel_err_kernel(const __nv_bfloat16* out, const double* ref, int rows,
                                          int cols, double* rel) {
  __shared__ double shared[32];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    double d2 = 0, r2 = 0, bad = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      double o = (double)__bfloat162float(out[(size_t)r * cols + c]), x = ref[(size_t)r * cols + c];
      bad += !isfinite(o);
      d2 += (o - x) * (o - x), r2 += x * x;
    }
    d2 = block_sum(d2, shared), r2 = block_sum(r2, shared), bad = block_sum(bad, shared);
    if (threadIdx.x == 0)
      rel[r] = bad > 0 ? INFINITY : r2 > 0 ? sqrt(d2 / r2) : d2 > 0 ? INFINITY : 0.0;
  }
}

static __global__ void count_not_ff_kernel(const unsigned char* p, size_t n,
                                           unsigned long long* count) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    c += p[i] != 0xFF;
  if (c) atomicAdd(count, c);
}

static unsigned long long count_not_ff(const void* p, size_t bytes) {
  unsigned long long *d, h = 0;
  CUDA_OK(cudaMalloc(&d, sizeof(*d)));
  memset_now(d, 0, sizeof(*d));
  if (bytes) count_not_ff_kernel<<<1024, 256>>>((const unsigned char*)p, bytes, d);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
  cudaFree(d);
  return h;
}

/* ref_gemm_f64 over any row count (its grid has one y-block per row, at most 65535). */
static void ref_gemm_rows_f64(const void* a, const void* b, const int* group, double* ref, size_t m,
                              int n, int k) {
  for (size_t r0 = 0; r0 < m; r0 += 32768) {
    int rows = (int)(m - r0 < 32768 ? m - r0 : 32768);
    ref_gemm_f64<double>((const char*)a + r0 * k * 2, b, NULL, group + r0, ref + r0 * n, rows, n,
                         k);
  }
}

struct row_check {
  double worst;
  long worst_row, bad_rows;
  int pass;
};

/* Every row within TOL of its reference: one wrong row among 10^5 cannot hide in a norm. */
static struct row_check check_rows(const void* out, const double* ref, size_t rows, int cols) {
  struct row_check r = {0, -1, 0, 1};
  if (!rows) return r;
  double *rel, *h = (double*)malloc(rows * sizeof(double));
  CUDA_OK(cudaMalloc(&rel, rows * sizeof(double)));
  const int grid = rows < 65535 ? (int)rows : 65535;
  row_rel_err_kernel<<<grid, 128>>>((const __nv_bfloat16*)out, ref, (int)rows, cols, rel);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(h, rel, rows * sizeof(double), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < rows; i++) {
    double v = h[i] == h[i] ? h[i] : INFINITY; /* NaN counts as the worst */
    r.bad_rows += !(v < TOL);
    if (r.worst_row < 0 || v > r.worst) r.worst = v, r.worst_row = (long)i;
  }
  r.pass = r.bad_rows == 0;
  cudaFree(rel), free(h);
  return r;
}

static void corrupt_element(void* bf16, size_t index) { /* 32768: far outside the tolerance */
  const uint16_t big = 0x4700;
  CUDA_OK(cudaMemcpy((char*)bf16 + 2 * index, &big, 2, cudaMemcpyHostToDevice));
}

static void report_rows(struct rank_env* e, struct row_check r, int corrupt, const char* what) {
  if (!r.pass && !corrupt)
    fprintf(stderr, "rank %d: %s: %ld bad row(s), worst row %ld rel %g\n", e->rank, what,
            r.bad_rows, r.worst_row, r.worst);
  char name[96];
  snprintf(name, sizeof(name), "%s%s", corrupt ? "negative control: " : "", what);
  expect(e, r.pass != corrupt, name, r.worst);
}

/* ---- one case: buffers, inputs, the two calls ------------------------------------------ */

struct moe_bufs {
  void *x, *w1, *act, *act2, *w2, *out;
  int* topk_idx;
  float* weights;
  int* idx_all;        /* host: every rank's topk_idx, [NR][tokens * topk] */
  float* weights_host; /* host: this rank's topk_weights */
};

static void bufs_alloc(struct moe_bufs* b, const struct moe_case* c) {
  size_t t = c->tokens, h = c->hidden, el = c->experts / NR, tk = t * c->topk;
  CUDA_OK(cudaMalloc(&b->x, t * h * 2));
  CUDA_OK(cudaMalloc(&b->w1, el * c->inter * h * 2));
  CUDA_OK(cudaMalloc(&b->act, rows_cap() * c->inter * 2)); /* [max_recv_rows, inter] */
  CUDA_OK(cudaMalloc(&b->act2, rows_cap() * c->inter2 * 2));
  CUDA_OK(cudaMalloc(&b->w2, el * h * c->inter2 * 2));
  CUDA_OK(cudaMalloc(&b->out, t * h * 2));
  CUDA_OK(cudaMalloc(&b->topk_idx, tk * sizeof(int)));
  CUDA_OK(cudaMalloc(&b->weights, tk * sizeof(float)));
  b->idx_all = (int*)malloc(NR * tk * sizeof(int));
  b->weights_host = (float*)malloc(tk * sizeof(float));
}

static void bufs_free(struct moe_bufs* b) {
  cudaFree(b->x), cudaFree(b->w1), cudaFree(b->act), cudaFree(b->act2), cudaFree(b->w2);
  cudaFree(b->out), cudaFree(b->topk_idx), cudaFree(b->weights);
  free(b->idx_all), free(b->weights_host);
}

/* Rank p's x for `base` (fp8: its rows shaped as well, by shape_x_rows_kernel). */
static void fill_x(void* x, const struct moe_case* c, uint64_t base, int p, int fp8) {
  fill_random_bf16(x, (size_t)c->tokens * c->hidden, seed_of(base, p, 1), 1.0f);
  if (fp8) shape_x_rows_kernel<<<1024, 256>>>((__nv_bfloat16*)x, c->tokens, c->hidden);
  legacy_stream_done();
}

/* Fresh inputs for `base` (written into the same buffers), outputs poisoned; synchronous.
 * Weights are positive, as after a softmax: no cancellation between slots. */
static void inputs_fill(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                        uint64_t base) {
  size_t t = c->tokens, h = c->hidden, el = c->experts / NR, tk = t * c->topk;
  for (int p = 0; p < NR; p++) {
    make_routing(c, seed_of(base, p, 5), b->idx_all + p * tk);
    if (!tokens_of(e, c, p)) /* the reference's view of a rank that routes nothing */
      for (size_t i = 0; i < tk; i++) b->idx_all[p * tk + i] = -1;
  }
  uint64_t s = seed_of(base, e->rank, 4);
  for (size_t i = 0; i < tk; i++) b->weights_host[i] = (float)(0.1 + 0.9 * host_unit(&s));
  CUDA_OK(
      cudaMemcpy(b->topk_idx, b->idx_all + e->rank * tk, tk * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(b->weights, b->weights_host, tk * sizeof(float), cudaMemcpyHostToDevice));
  fill_x(b->x, c, base, e->rank, e->fp8);
  fill_random_bf16(b->w1, el * c->inter * h, seed_of(base, e->rank, 2), 1.0f);
  fill_random_bf16(b->w2, el * h * c->inter2, seed_of(base, e->rank, 3), 1.0f);
  poison(b->act, rows_cap() * c->inter * 2), poison(b->act2, rows_cap() * c->inter2 * 2);
  poison(b->out, t * h * 2);
  CUDA_OK(cudaDeviceSynchronize());
}

/* The dispatch, then act2 from the layout on the device (standing for the activation). The
 * layout's device pointers are taken right after the dispatch is enqueued: they must stay
 * the same for the layout's life for a graph to hold them. */
static void run_dispatch(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c) {
  const int t = tokens_of(e, c, e->rank);
  NCCL_OK(ncclMkMoeDispatchGemm(t ? b->x : NULL, t ? b->topk_idx : NULL, b->w1, b->act, t,
                                c->hidden, c->inter, c->topk, c->experts, e->layout, ncclBfloat16,
                                e->comm, e->stream));
  ncclMkMoeLayoutInfo info;
  NCCL_OK(ncclMkMoeLayoutGetInfo(e->layout, &info));
  fill_act2_kernel<<<1024, 256, 0, e->stream>>>((__nv_bfloat16*)b->act2, info.row_source,
                                                info.group_offsets, c->experts / NR, c->inter2,
                                                rows_cap(), act2_seed());
  CUDA_OK(cudaGetLastError());
}

static void run_combine(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c) {
  const int t = tokens_of(e, c, e->rank);
  NCCL_OK(ncclMkMoeGemmCombine(b->act2, b->w2, t ? b->weights : NULL, t ? b->out : NULL, t,
                               c->hidden, c->inter2, e->layout, ncclBfloat16, e->comm, e->stream));
}

/* ---- checks ------------------------------------------------------------------------------ */

/* Host copies of what the last dispatch left in the layout. */
struct layout_host {
  int rows;       /* group_offsets[experts_local], clamped to [0, rows_cap()] */
  int* offsets;   /* [el + 1] */
  int* source;    /* [rows][3] */
  int* row_group; /* [rows]: local expert of each row, from the offsets */
};

static void layout_copy(struct layout_host* L, const ncclMkMoeLayoutInfo* info, int el) {
  L->offsets = (int*)malloc((el + 1) * sizeof(int));
  CUDA_OK(
      cudaMemcpy(L->offsets, info->group_offsets, (el + 1) * sizeof(int), cudaMemcpyDeviceToHost));
  long rows = L->offsets[el];
  L->rows = rows < 0 ? 0 : rows > (long)rows_cap() ? (int)rows_cap() : (int)rows;
  L->source = (int*)malloc((size_t)L->rows * 3 * sizeof(int) + 16);
  L->row_group = (int*)calloc((size_t)L->rows + 1, sizeof(int));
  if (L->rows)
    CUDA_OK(cudaMemcpy(L->source, info->row_source, (size_t)L->rows * 3 * sizeof(int),
                       cudaMemcpyDeviceToHost));
  for (int j = 0; j < el; j++)
    for (int r = L->offsets[j] < 0 ? 0 : L->offsets[j]; r < L->offsets[j + 1] && r < L->rows; r++)
      L->row_group[r] = j;
}

static void layout_free(struct layout_host* L) {
  free(L->offsets), free(L->source), free(L->row_group);
}

/* One row of (a): (src, t, s) names a slot of a real token routed to local expert j, and no
 * other row names it. Returns 0 and says why otherwise. */
static int check_one_row(const struct moe_case* c, int me, const int* idx_all, const int* src,
                         int j, unsigned char* seen, int row) {
  int p = src[0], t = src[1], s = src[2], el = c->experts / NR;
  if (p < 0 || p >= NR || t < 0 || t >= c->tokens || s < 0 || s >= c->topk) {
    fprintf(stderr, "rank %d: row %d names (%d, %d, %d): out of range\n", me, row, p, t, s);
    return 0;
  }
  size_t slot = ((size_t)p * c->tokens + t) * c->topk + s;
  if (idx_all[slot] != me * el + j || seen[slot]) {
    fprintf(stderr, "rank %d: row %d in group %d names (%d, %d, %d) routed to expert %d%s\n", me,
            row, j, p, t, s, idx_all[slot], seen[slot] ? ", seen twice" : "");
    return 0;
  }
  seen[slot] = 1;
  return 1;
}

/* (a): offsets ordered, every row a distinct slot routed to its group's expert, and as many
 * rows as slots routed to this rank: the multiset of (source, token, slot) is exact. */
static int check_layout(const struct moe_case* c, int me, const int* idx_all,
                        const struct layout_host* L) {
  int el = c->experts / NR, ok = L->offsets[0] == 0;
  for (int j = 0; j < el; j++) ok = ok && L->offsets[j] <= L->offsets[j + 1];
  ok = ok && L->offsets[el] == L->rows;
  if (!ok) {
    fprintf(stderr, "rank %d: group_offsets not ordered from 0 to %d rows\n", me, L->offsets[el]);
    return 0;
  }
  size_t slots = (size_t)NR * c->tokens * c->topk, want = 0;
  unsigned char* seen = (unsigned char*)calloc(slots, 1);
  for (int j = 0; j < el && ok; j++)
    for (int r = L->offsets[j]; r < L->offsets[j + 1] && ok; r++)
      ok = check_one_row(c, me, idx_all, L->source + 3 * r, j, seen, r);
  for (size_t i = 0; i < slots; i++)
    want += slot_valid(idx_all[i], c->experts) && idx_all[i] / el == me;
  if (ok && want != (size_t)L->rows) {
    fprintf(stderr, "rank %d: %d rows received, %zu slots routed here\n", me, L->rows, want);
    ok = 0;
  }
  free(seen);
  return ok;
}

/* (b)'s scratch: every rank's x, this rank's rows of it, their groups, their float64 act. */
struct act_ref {
  void *x_all, *a_rows; /* [NR][tokens][hidden], [rows][hidden] */
  int* group;           /* [rows], on the device */
  double* ref;          /* [rows][inter] */
  const int* row_source;
  size_t rows;
};

/* R->ref[r] = x_all's row of row r's source token . w1[its group]^T. */
static void act_ref_compute(struct act_ref* R, struct moe_bufs* b, const struct moe_case* c) {
  const int grid = R->rows < 65535 ? (int)R->rows : 65535;
  gather_x_rows_kernel<<<grid, 128>>>((const __nv_bfloat16*)R->x_all, R->row_source, (int)R->rows,
                                      NR, c->tokens, c->hidden, (__nv_bfloat16*)R->a_rows);
  CUDA_OK(cudaGetLastError());
  ref_gemm_rows_f64(R->a_rows, b->w1, R->group, R->ref, R->rows, c->inter, c->hidden);
}

/* fp8, on x_all before it is quantized: the negative control against the bf16 path. e4m3
 * keeps 3 mantissa bits: a nonzero row's act moves by 1.4% to 4.7%, 2.5% on average (emulated
 * on the host, 20000 rows of each case's widths), so at least half of the rows must be further
 * than TOL from the reference on unquantized x (the zero rows match it). */
static void check_act_was_quantized(struct rank_env* e, struct act_ref* R, struct moe_bufs* b,
                                    const struct moe_case* c) {
  act_ref_compute(R, b, c);
  struct row_check r = check_rows(b->act, R->ref, R->rows, c->inter);
  const long want = ((long)R->rows + 1) / 2;
  printf("rank %d: fp8: %ld of %zu act rows off the unquantized reference by %g or more\n", e->rank,
         r.bad_rows, R->rows, TOL);
  if (r.bad_rows < want)
    fprintf(stderr, "rank %d: fp8: only %ld of %zu act rows off it (want %ld or more): rows moved"
            " unquantized?\n", e->rank, r.bad_rows, R->rows, want);
  expect(e, r.bad_rows >= want, "fp8: act rows off the unquantized reference", 0);
}

/* (b): act row r = x of its source token . w1[its group]^T, from every rank's regenerated x
 * (fp8: quantized and dequantized first). */
static void check_act(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                      uint64_t base, const struct layout_host* L, const int* row_source,
                      int corrupt) {
  const size_t t = c->tokens, h = c->hidden, rows = L->rows;
  struct act_ref R = {NULL, NULL, NULL, NULL, row_source, rows};
  CUDA_OK(cudaMalloc(&R.x_all, NR * t * h * 2));
  CUDA_OK(cudaMalloc(&R.a_rows, rows * h * 2 + 16));
  CUDA_OK(cudaMalloc(&R.group, rows * sizeof(int) + 16));
  CUDA_OK(cudaMalloc(&R.ref, rows * c->inter * sizeof(double) + 16));
  for (int p = 0; p < NR; p++) fill_x((char*)R.x_all + p * t * h * 2, c, base, p, e->fp8);
  if (rows) {
    CUDA_OK(cudaMemcpy(R.group, L->row_group, rows * sizeof(int), cudaMemcpyHostToDevice));
    if (e->fp8) {
      check_act_was_quantized(e, &R, b, c);
      fp8_round_rows(R.x_all, NR * t, c->hidden, 0);
    }
    act_ref_compute(&R, b, c);
    if (corrupt) corrupt_element(b->act, rows / 2 * c->inter);
  }
  report_rows(e, check_rows(b->act, R.ref, rows, c->inter), corrupt && rows,
              e->fp8 ? "dispatch act rows (fp8)" : "dispatch act rows");
  unsigned long long tail =
      count_not_ff((char*)b->act + rows * c->inter * 2, (rows_cap() - rows) * c->inter * 2);
  if (tail)
    fprintf(stderr, "rank %d: %llu byte(s) of act past row %zu written\n", e->rank, tail, rows);
  expect(e, tail == 0, "act rows past the last untouched", 0);
  cudaFree(R.x_all), cudaFree(R.a_rows), cudaFree(R.group), cudaFree(R.ref);
}

/* The combine's reference: y(t, s) = act2(me, t, s) . w2[expert]^T from every rank's w2
 * (stacked [NR * el] = global expert order), then the weighted sum over valid slots. */
static double* ref_combine(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                           uint64_t base) {
  size_t t = c->tokens, h = c->hidden, el = c->experts / NR, tk = t * c->topk;
  void *a2, *w2_all;
  int *group, *group_h = (int*)malloc(tk * sizeof(int));
  float *w, *w_h = (float*)malloc(tk * sizeof(float));
  double *y, *ref;
  CUDA_OK(cudaMalloc(&a2, tk * c->inter2 * 2));
  CUDA_OK(cudaMalloc(&w2_all, NR * el * h * c->inter2 * 2));
  CUDA_OK(cudaMalloc(&group, tk * sizeof(int)));
  CUDA_OK(cudaMalloc(&w, tk * sizeof(float)));
  CUDA_OK(cudaMalloc(&y, tk * h * sizeof(double)));
  CUDA_OK(cudaMalloc(&ref, t * h * sizeof(double)));
  for (int p = 0; p < NR; p++)
    fill_random_bf16((char*)w2_all + p * el * h * c->inter2 * 2, el * h * c->inter2,
                     seed_of(base, p, 3), 1.0f);
  ref_act2_kernel<<<1024, 256>>>((__nv_bfloat16*)a2, tk, c->topk, c->inter2, e->rank, act2_seed());
  const int* idx = b->idx_all + e->rank * tk;
  for (size_t i = 0; i < tk; i++) {
    int valid = slot_valid(idx[i], c->experts);
    group_h[i] = valid ? idx[i] : 0, w_h[i] = valid ? b->weights_host[i] : 0.0f;
  }
  CUDA_OK(cudaMemcpy(group, group_h, tk * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(w, w_h, tk * sizeof(float), cudaMemcpyHostToDevice));
  ref_gemm_rows_f64(a2, w2_all, group, y, tk, c->hidden, c->inter2);
  weighted_sum_kernel<<<1024, 256>>>(y, w, c->tokens, c->topk, c->hidden, ref);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(a2), cudaFree(w2_all), cudaFree(group), cudaFree(w), cudaFree(y);
  free(group_h), free(w_h);
  return ref;
}

/* out's rows of this rank's tokens (none with tokens = 0: out was NULL in the call). */
static void check_out(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                      uint64_t base, int corrupt) {
  const int rows = tokens_of(e, c, e->rank);
  double* ref = ref_combine(e, b, c, base);
  if (corrupt && rows) corrupt_element(b->out, (size_t)rows / 2 * c->hidden + 1);
  report_rows(e, check_rows(b->out, ref, rows, c->hidden), corrupt && rows, "combine out rows");
  cudaFree(ref);
}

/* (c) */
static void check_rows_sent(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                            const ncclMkMoeLayoutInfo* info, int corrupt) {
  unsigned long long got = 0;
  CUDA_OK(cudaMemcpy(&got, info->rows_sent, sizeof(got), cudaMemcpyDeviceToHost));
  unsigned long long want =
      dedup_rows_sent(c, e->rank, b->idx_all + (size_t)e->rank * c->tokens * c->topk);
  if (corrupt) want++;
  if (got != want && !corrupt)
    fprintf(stderr, "rank %d: rows_sent %llu, deduplicated routed count %llu\n", e->rank, got,
            want);
  expect(e, (got == want) != corrupt, corrupt ? "negative control: rows_sent" : "rows_sent", 0);
}

/* Everything after dispatch + combine; corrupt: plant one error for every checker, each of
 * which must then fail. */
static void check_case(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                       uint64_t base, int corrupt) {
  CUDA_OK(cudaStreamSynchronize(e->stream));
  ncclMkMoeLayoutInfo info;
  NCCL_OK(ncclMkMoeLayoutGetInfo(e->layout, &info));
  int el = c->experts / NR;
  expect(e, info.experts_local == el, "layout experts_local", 0);
  expect(e, (size_t)info.max_recv_rows >= rows_cap(), "layout max_recv_rows is the worst case", 0);
  struct layout_host L;
  layout_copy(&L, &info, el);
  if (corrupt && L.rows) L.source[1] ^= 1; /* row 0 now names a neighbouring token */
  int ok = check_layout(c, e->rank, b->idx_all, &L);
  expect(e, ok != (corrupt && L.rows), corrupt ? "negative control: layout" : "layout rows", 0);
  check_act(e, b, c, base, &L, info.row_source, corrupt);
  check_rows_sent(e, b, c, &info, corrupt);
  check_out(e, b, c, base, corrupt);
  printf("rank %d: T=%d h=%d inter=%d/%d top-%d E=%d %s: %d rows in, checked\n", e->rank,
         tokens_of(e, c, e->rank), c->hidden, c->inter, c->inter2, c->topk, c->experts,
         routing_names[c->mode], L.rows);
  layout_free(&L);
}

static void run_case(struct rank_env* e, const struct moe_case* c, uint64_t base, int corrupt) {
  struct moe_bufs b;
  bufs_alloc(&b, c);
  inputs_fill(e, &b, c, base);
  run_dispatch(e, &b, c);
  run_combine(e, &b, c);
  check_case(e, &b, c, base, corrupt);
  bufs_free(&b);
}

#endif /* MK_MOE_TEST_COMMON_CUH_ */
