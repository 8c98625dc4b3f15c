/*
 * The MoE ops (ncclMkMoeDispatchGemm, ncclMkMoeGemmCombine) on 2 ranks against a float64
 * reference. Every rank's x, topk_idx and topk_weights come from seeds, so every rank
 * regenerates its peers' inputs for the reference. Routings: uniform, skewed (one hot
 * expert), empty experts, one rank receiving nothing, masked slots (ids outside [0, E)).
 * Checks on every rank after a dispatch: (a) the layout's rows are exactly the (source,
 * token, slot) triples routed to this rank's experts, each under its expert's group (row
 * order inside a group is not specified, so everything goes through row_source); (b) every
 * act row against x_src[t] . w1[j]^T, per row ||out - ref|| / ||ref|| < 1e-2, rows past the
 * last untouched; (c) rows_sent equals the deduplicated count. After the combine (act2 a
 * hash of (source, token, slot)): every out row against the float64 weighted sum.
 *
 * usage: test_moe <correctness|graph|bad_input|negative_control>
 * The binary starts one process per GPU itself.
 */
#include <limits.h>
#include <nccl.h>
#include <string.h>
#include <unistd.h>

#include "gemm_check.cuh"
#include "nccl_mk.h"
#include "perf_launch.h"

#define NCCL_OK(call)                                                                        \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    if (r_ != ncclSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

static const int NR = 2;
static const double TOL = 1e-2;
static uint64_t g_seed; /* from the NCCL id: fresh each run, the same on every rank, printed */

/* The limits given to ncclMkCommInit (moe_max_recv_rows 0: the worst case); every case fits. */
enum { MAX_TOKENS = 16384, MAX_HIDDEN = 512, MAX_TOPK = 8 };
static const size_t ROWS_CAP = (size_t)NR * MAX_TOKENS * MAX_TOPK; /* act's rows, per header */

struct rank_env {
  int rank;
  ncclComm_t comm;
  cudaStream_t stream;
  ncclMkMoeLayout_t layout;
  int failures;
};

enum routing { UNIFORM, SKEWED, EMPTY_EXPERTS, ONE_RANK_EMPTY, MASKED };
static const char* routing_names[] = {"uniform", "skewed", "empty_experts", "one_rank_empty",
                                      "masked"};

/* inter: the dispatch's output width; inter2: the combine's input width (after activation). */
struct moe_case {
  int tokens, hidden, inter, inter2, topk, experts;
  enum routing mode;
};

/* clang-format off */
static const struct moe_case correctness_cases[] = {
    {1, 136, 64, 32, 1, 8, UNIFORM},            {1, 256, 128, 64, 8, 256, ONE_RANK_EMPTY},
    {7, 256, 128, 64, 2, 8, UNIFORM},           {7, 512, 256, 128, 8, 8, MASKED},
    {7, 136, 128, 72, 8, 256, SKEWED},          {300, 136, 128, 72, 2, 8, SKEWED},
    {300, 256, 128, 64, 8, 256, UNIFORM},       {300, 136, 64, 64, 1, 256, EMPTY_EXPERTS},
    {300, 256, 128, 64, 2, 8, MASKED},          {4096, 256, 128, 64, 2, 8, ONE_RANK_EMPTY},
    {4096, 136, 128, 64, 8, 256, SKEWED},       {4096, 256, 128, 64, 2, 256, MASKED},
    {4096, 256, 128, 64, 8, 8, EMPTY_EXPERTS},  {16384, 256, 128, 64, 2, 8, UNIFORM},
    {16384, 256, 128, 64, 8, 256, UNIFORM},     {16384, 136, 128, 64, 1, 8, EMPTY_EXPERTS},
    {16384, 256, 128, 64, 8, 256, ONE_RANK_EMPTY}, {16384, 256, 128, 64, 2, 8, SKEWED},
};
/* clang-format on */

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

static uint64_t host_mix(uint64_t* s) {
  uint64_t x = (*s += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
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
                                            int rows, int tokens, int hidden,
                                            __nv_bfloat16* a_rows) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    int src = row_source[3 * r], t = row_source[3 * r + 1];
    int ok = src >= 0 && src < NR && t >= 0 && t < tokens;
    const __nv_bfloat16* from = x_all + ((size_t)src * tokens + t) * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x)
      a_rows[(size_t)r * hidden + c] = ok ? from[c] : __float2bfloat16(0.0f);
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

static __device__ double block_sum(double v, double* shared) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += shared[i];
  __syncthreads();
  return s;
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
  CUDA_OK(cudaMemset(d, 0, sizeof(*d)));
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
  CUDA_OK(cudaMalloc(&b->act, ROWS_CAP * c->inter * 2)); /* [max_recv_rows, inter] */
  CUDA_OK(cudaMalloc(&b->act2, ROWS_CAP * c->inter2 * 2));
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

/* Fresh inputs for `base` (written into the same buffers), outputs poisoned; synchronous.
 * Weights are positive, as after a softmax: no cancellation between slots. */
static void inputs_fill(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                        uint64_t base) {
  size_t t = c->tokens, h = c->hidden, el = c->experts / NR, tk = t * c->topk;
  for (int p = 0; p < NR; p++) make_routing(c, seed_of(base, p, 5), b->idx_all + p * tk);
  uint64_t s = seed_of(base, e->rank, 4);
  for (size_t i = 0; i < tk; i++) b->weights_host[i] = (float)(0.1 + 0.9 * host_unit(&s));
  CUDA_OK(
      cudaMemcpy(b->topk_idx, b->idx_all + e->rank * tk, tk * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(b->weights, b->weights_host, tk * sizeof(float), cudaMemcpyHostToDevice));
  fill_random_bf16(b->x, t * h, seed_of(base, e->rank, 1), 1.0f);
  fill_random_bf16(b->w1, el * c->inter * h, seed_of(base, e->rank, 2), 1.0f);
  fill_random_bf16(b->w2, el * h * c->inter2, seed_of(base, e->rank, 3), 1.0f);
  poison(b->act, ROWS_CAP * c->inter * 2), poison(b->act2, ROWS_CAP * c->inter2 * 2);
  poison(b->out, t * h * 2);
  CUDA_OK(cudaDeviceSynchronize());
}

/* The dispatch, then act2 from the layout on the device (standing for the activation). The
 * layout's device pointers are taken right after the dispatch is enqueued: they must stay
 * the same for the layout's life for a graph to hold them. */
static void run_dispatch(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c) {
  NCCL_OK(ncclMkMoeDispatchGemm(b->x, b->topk_idx, b->w1, b->act, c->tokens, c->hidden, c->inter,
                                c->topk, c->experts, e->layout, ncclBfloat16, e->comm, e->stream));
  ncclMkMoeLayoutInfo info;
  NCCL_OK(ncclMkMoeLayoutGetInfo(e->layout, &info));
  fill_act2_kernel<<<1024, 256, 0, e->stream>>>((__nv_bfloat16*)b->act2, info.row_source,
                                                info.group_offsets, c->experts / NR, c->inter2,
                                                ROWS_CAP, act2_seed());
  CUDA_OK(cudaGetLastError());
}

static void run_combine(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c) {
  NCCL_OK(ncclMkMoeGemmCombine(b->act2, b->w2, b->weights, b->out, c->tokens, c->hidden, c->inter2,
                               e->layout, ncclBfloat16, e->comm, e->stream));
}

/* ---- checks ------------------------------------------------------------------------------ */

/* Host copies of what the last dispatch left in the layout. */
struct layout_host {
  int rows;       /* group_offsets[experts_local], clamped to [0, ROWS_CAP] */
  int* offsets;   /* [el + 1] */
  int* source;    /* [rows][3] */
  int* row_group; /* [rows]: local expert of each row, from the offsets */
};

static void layout_copy(struct layout_host* L, const ncclMkMoeLayoutInfo* info, int el) {
  L->offsets = (int*)malloc((el + 1) * sizeof(int));
  CUDA_OK(
      cudaMemcpy(L->offsets, info->group_offsets, (el + 1) * sizeof(int), cudaMemcpyDeviceToHost));
  long rows = L->offsets[el];
  L->rows = rows < 0 ? 0 : rows > (long)ROWS_CAP ? (int)ROWS_CAP : (int)rows;
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

/* (b): act row r = x of its source token . w1[its group]^T, from every rank's regenerated x. */
static void check_act(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                      uint64_t base, const struct layout_host* L, const int* row_source,
                      int corrupt) {
  size_t t = c->tokens, h = c->hidden, rows = L->rows;
  void *x_all, *a_rows;
  int* group;
  double* ref;
  CUDA_OK(cudaMalloc(&x_all, NR * t * h * 2));
  CUDA_OK(cudaMalloc(&a_rows, rows * h * 2 + 16));
  CUDA_OK(cudaMalloc(&group, rows * sizeof(int) + 16));
  CUDA_OK(cudaMalloc(&ref, rows * c->inter * sizeof(double) + 16));
  for (int p = 0; p < NR; p++)
    fill_random_bf16((char*)x_all + p * t * h * 2, t * h, seed_of(base, p, 1), 1.0f);
  if (rows) {
    const int grid = rows < 65535 ? (int)rows : 65535;
    gather_x_rows_kernel<<<grid, 128>>>((const __nv_bfloat16*)x_all, row_source, (int)rows,
                                        c->tokens, c->hidden, (__nv_bfloat16*)a_rows);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(group, L->row_group, rows * sizeof(int), cudaMemcpyHostToDevice));
    ref_gemm_rows_f64(a_rows, b->w1, group, ref, rows, c->inter, c->hidden);
    if (corrupt) corrupt_element(b->act, rows / 2 * c->inter);
  }
  report_rows(e, check_rows(b->act, ref, rows, c->inter), corrupt && rows, "dispatch act rows");
  unsigned long long tail =
      count_not_ff((char*)b->act + rows * c->inter * 2, (ROWS_CAP - rows) * c->inter * 2);
  if (tail)
    fprintf(stderr, "rank %d: %llu byte(s) of act past row %zu written\n", e->rank, tail, rows);
  expect(e, tail == 0, "act rows past the last untouched", 0);
  cudaFree(x_all), cudaFree(a_rows), cudaFree(group), cudaFree(ref);
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

static void check_out(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                      uint64_t base, int corrupt) {
  double* ref = ref_combine(e, b, c, base);
  if (corrupt) corrupt_element(b->out, (size_t)c->tokens / 2 * c->hidden + 1);
  report_rows(e, check_rows(b->out, ref, c->tokens, c->hidden), corrupt, "combine out rows");
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
  expect(e, (size_t)info.max_recv_rows >= ROWS_CAP, "layout max_recv_rows is the worst case", 0);
  struct layout_host L;
  layout_copy(&L, &info, el);
  if (corrupt && L.rows) L.source[1] ^= 1; /* row 0 now names a neighbouring token */
  int ok = check_layout(c, e->rank, b->idx_all, &L);
  expect(e, ok != (corrupt && L.rows), corrupt ? "negative control: layout" : "layout rows", 0);
  check_act(e, b, c, base, &L, info.row_source, corrupt);
  check_rows_sent(e, b, c, &info, corrupt);
  check_out(e, b, c, base, corrupt);
  printf("rank %d: T=%d h=%d inter=%d/%d top-%d E=%d %s: %d rows in, checked\n", e->rank, c->tokens,
         c->hidden, c->inter, c->inter2, c->topk, c->experts, routing_names[c->mode], L.rows);
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

/* ---- scenarios ----------------------------------------------------------------------------- */

static void scenario_correctness(struct rank_env* e) {
  for (size_t i = 0; i < sizeof(correctness_cases) / sizeof(correctness_cases[0]); i++)
    run_case(e, &correctness_cases[i], g_seed + i * 7, 0);
}

/* Dispatch, act2 and combine captured once, replayed with new routing, x and weights written
 * into the same buffers (rank 1 receiving nothing in one replay, masked slots in another). */
static void scenario_graph(struct rank_env* e) {
  struct moe_case c = {4096, 256, 128, 64, 8, 256, UNIFORM};
  static const enum routing replays[] = {SKEWED, ONE_RANK_EMPTY, MASKED};
  struct moe_bufs b;
  bufs_alloc(&b, &c);
  inputs_fill(e, &b, &c, g_seed);
  run_dispatch(e, &b, &c), run_combine(e, &b, &c); /* warm-up outside capture, checked */
  check_case(e, &b, &c, g_seed, 0);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeGlobal));
  run_dispatch(e, &b, &c), run_combine(e, &b, &c);
  CUDA_OK(cudaStreamEndCapture(e->stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; rep++) {
    uint64_t base = g_seed + 1000 + rep;
    c.mode = replays[rep];
    inputs_fill(e, &b, &c, base);
    CUDA_OK(cudaGraphLaunch(exec, e->stream));
    check_case(e, &b, &c, base, 0);
  }
  printf("rank %d: 3 graph replays checked\n", e->rank);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
  bufs_free(&b);
}

struct bad_call {
  ncclResult_t got;
  int want; /* an ncclResult_t, or ANY: any error (the header names no code for it) */
  const char* what;
};
enum { ARG = ncclInvalidArgument, USAGE = ncclInvalidUsage, ANY = -1 };

static void expect_rejected(struct rank_env* e, const struct bad_call* calls, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int ok = calls[i].want < 0 ? calls[i].got != ncclSuccess : (int)calls[i].got == calls[i].want;
    if (!ok) {
      fprintf(stderr, "rank %d: %s: got %d, want %d\n", e->rank, calls[i].what, (int)calls[i].got,
              calls[i].want);
      e->failures++;
    }
  }
}

#define DISPATCH(x, idx, w1, act, t, h, in, k, ex, lay, ty) \
  ncclMkMoeDispatchGemm(x, idx, w1, act, t, h, in, k, ex, lay, ty, e->comm, e->stream)
#define COMBINE(act, w2, w, out, t, h, in, lay, ty) \
  ncclMkMoeGemmCombine(act, w2, w, out, t, h, in, lay, ty, e->comm, e->stream)

/* Bad dispatches on buffers big enough for any of them: act must stay poisoned. */
static void bad_dispatches(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                           size_t act_bytes) {
  void *x = b->x, *w1 = b->w1, *act = b->act;
  const int* idx = b->topk_idx;
  const size_t t = c->tokens, h = c->hidden, in = c->inter;
  const int k = c->topk, ex = c->experts;
  ncclMkMoeLayout_t lay = e->layout;
  const ncclDataType_t bf = ncclBfloat16;
  const struct bad_call calls[] = {
      {DISPATCH(NULL, idx, w1, act, t, h, in, k, ex, lay, bf), ARG, "NULL x"},
      {DISPATCH(x, NULL, w1, act, t, h, in, k, ex, lay, bf), ARG, "NULL topk_idx"},
      {DISPATCH(x, idx, NULL, act, t, h, in, k, ex, lay, bf), ARG, "NULL w1"},
      {DISPATCH(x, idx, w1, NULL, t, h, in, k, ex, lay, bf), ARG, "NULL act"},
      {DISPATCH(x, idx, w1, act, t, h, in, k, ex, NULL, bf), ARG, "NULL layout"},
      {DISPATCH((char*)x + 2, idx, w1, act, t, h, in, k, ex, lay, bf), ARG, "misaligned x"},
      {DISPATCH(x, idx, w1, act, MAX_TOKENS + 1, h, in, k, ex, lay, bf), ANY, "tokens > max"},
      {DISPATCH(x, idx, w1, act, t, h, in, MAX_TOPK + 1, ex, lay, bf), ANY, "topk > max"},
      {DISPATCH(x, idx, w1, act, t, MAX_HIDDEN + 8, in, k, ex, lay, bf), ANY, "hidden > max"},
      {DISPATCH(x, idx, w1, act, t, h, in, k, 7, lay, bf), ARG, "num_experts 7 on 2 ranks"},
      {DISPATCH(x, idx, w1, act, t, h, in, k, 0, lay, bf), ARG, "num_experts 0"},
      {DISPATCH(x, idx, w1, act, t, h, in, k, -2, lay, bf), ARG, "num_experts -2"},
      {DISPATCH(x, idx, w1, act, t, 132, in, k, ex, lay, bf), ARG, "hidden 132"},
      {DISPATCH(x, idx, w1, act, t, h, 68, k, ex, lay, bf), ARG, "inter 68"},
      {DISPATCH(x, idx, w1, act, t, h, in, k, ex, lay, ncclFloat32), USAGE, "ncclFloat32"},
  };
  expect_rejected(e, calls, sizeof(calls) / sizeof(calls[0]));
  CUDA_OK(cudaDeviceSynchronize());
  expect(e, count_not_ff(act, act_bytes) == 0, "act untouched after bad dispatches", 0);
}

/* Bad combines after a good dispatch of c: out must stay poisoned. */
static void bad_combines(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c,
                         size_t out_bytes) {
  void *act2 = b->act2, *w2 = b->w2, *out = b->out;
  const float* w = b->weights;
  const size_t t = c->tokens, h = c->hidden, in2 = c->inter2;
  ncclMkMoeLayout_t lay = e->layout, none = NULL;
  const ncclDataType_t bf = ncclBfloat16;
  ncclMkMoeLayoutInfo info;
  const struct bad_call calls[] = {
      {COMBINE(NULL, w2, w, out, t, h, in2, lay, bf), ARG, "NULL act"},
      {COMBINE(act2, NULL, w, out, t, h, in2, lay, bf), ARG, "NULL w2"},
      {COMBINE(act2, w2, NULL, out, t, h, in2, lay, bf), ARG, "NULL topk_weights"},
      {COMBINE(act2, w2, w, NULL, t, h, in2, lay, bf), ARG, "NULL out"},
      {COMBINE(act2, w2, w, out, t, h, in2, NULL, bf), ARG, "NULL layout"},
      {COMBINE(act2, w2, w, out, t / 2, h, in2, lay, bf), ANY, "tokens not the dispatch's"},
      {COMBINE(act2, w2, w, out, t, 132, in2, lay, bf), ARG, "combine hidden 132"},
      {COMBINE(act2, w2, w, out, t, h, 68, lay, bf), ARG, "combine inter 68"},
      {COMBINE(act2, w2, w, out, t, h, in2, lay, ncclFloat32), USAGE, "combine ncclFloat32"},
      {ncclMkMoeLayoutCreate(e->comm, NULL), ARG, "ncclMkMoeLayoutCreate(comm, NULL)"},
      {ncclMkMoeLayoutCreate(NULL, &none), ARG, "ncclMkMoeLayoutCreate(NULL, &l)"},
      {ncclMkMoeLayoutGetInfo(NULL, &info), ARG, "ncclMkMoeLayoutGetInfo(NULL, &i)"},
      {ncclMkMoeLayoutGetInfo(lay, NULL), ARG, "ncclMkMoeLayoutGetInfo(l, NULL)"},
  };
  expect_rejected(e, calls, sizeof(calls) / sizeof(calls[0]));
  CUDA_OK(cudaStreamSynchronize(e->stream));
  expect(e, count_not_ff(out, out_bytes) == 0, "out untouched after bad combines", 0);
}

/* Every bad call returns its error before launching anything; then the good calls still
 * work on the same layout and communicator. */
static void scenario_bad_input(struct rank_env* e) {
  const struct moe_case c = {64, 128, 64, 64, 2, 8, UNIFORM};
  const struct moe_case big = {MAX_TOKENS + 8, MAX_HIDDEN + 8, 72, 72, MAX_TOPK + 1, 8, UNIFORM};
  const size_t act_bytes = ROWS_CAP * big.inter * 2,
               out_bytes = (size_t)big.tokens * big.hidden * 2;
  struct moe_bufs b;
  bufs_alloc(&b, &big);
  inputs_fill(e, &b, &c, g_seed);
  poison(b.act, act_bytes), poison(b.out, out_bytes);
  CUDA_OK(cudaDeviceSynchronize());
  bad_dispatches(e, &b, &c, act_bytes);
  run_dispatch(e, &b, &c);
  bad_combines(e, &b, &c, out_bytes);
  run_combine(e, &b, &c);
  check_case(e, &b, &c, g_seed, 0);
  bufs_free(&b);
}

/* One element of act and of out, one row_source entry and rows_sent corrupted: every checker
 * must fail (check_case counts a checker that passes as the failure). */
static void scenario_negative_control(struct rank_env* e) {
  const struct moe_case c = {300, 136, 64, 64, 2, 8, UNIFORM}; /* rows on both ranks */
  run_case(e, &c, g_seed, 1);
}

static void run_scenario(struct rank_env* e, const char* name) {
  ncclResult_t async = ncclSuccess;
  char msg[256] = "";
  static const struct {
    const char* name;
    void (*run)(struct rank_env*);
  } scenarios[] = {{"correctness", scenario_correctness},
                   {"graph", scenario_graph},
                   {"bad_input", scenario_bad_input},
                   {"negative_control", scenario_negative_control}};
  size_t i = 0, n = sizeof(scenarios) / sizeof(scenarios[0]);
  while (i < n && strcmp(name, scenarios[i].name)) i++;
  if (i < n) scenarios[i].run(e);
  else fprintf(stderr, "unknown scenario %s\n", name), e->failures++;
  NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof(msg)));
  if (async != ncclSuccess) fprintf(stderr, "rank %d: asynchronous error: %s\n", e->rank, msg);
  expect(e, async == ncclSuccess, "no asynchronous error", 0);
}

static int rank_main(const char* scenario, int rank, const ncclUniqueId* id) {
  struct rank_env e = {rank, NULL, NULL, NULL, 0};
  printf("rank %d: %s, seed %llu\n", rank, scenario, (unsigned long long)g_seed);
  CUDA_OK(cudaSetDevice(rank));
  CUDA_OK(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
  NCCL_OK(ncclCommInitRank(&e.comm, NR, *id, rank));
  ncclMkConfig cfg;
  NCCL_OK(ncclMkConfigDefaults(&cfg));
  cfg.moe_max_tokens = MAX_TOKENS, cfg.moe_max_hidden = MAX_HIDDEN, cfg.moe_max_topk = MAX_TOPK;
  NCCL_OK(ncclMkCommInit(e.comm, &cfg));
  NCCL_OK(ncclMkMoeLayoutCreate(e.comm, &e.layout));
  run_scenario(&e, scenario);
  NCCL_OK(ncclMkMoeLayoutDestroy(e.layout));
  NCCL_OK(ncclMkCommRelease(e.comm));
  ncclCommDestroy(e.comm);
  printf("rank %d: %s: %d failure(s)\n", rank, scenario, e.failures);
  return e.failures ? 1 : 0;
}

/* The seed comes from the NCCL id: random per run, the same on every rank. */
static uint64_t seed_from_id(const char* hex) {
  uint64_t h = 1469598103934665603ULL;
  for (const char* p = hex; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
  return h % 100000;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <correctness|graph|bad_input|negative_control>\n", argv[0]);
    return 2;
  }
  alarm(300);                                /* a bug must not hang the suite */
  if (argc == 6 && !strcmp(argv[2], "-P")) { /* a child: <scenario> -P rank -I id */
    ncclUniqueId id;
    perf_hex_to_id(argv[5], &id);
    g_seed = seed_from_id(argv[5]);
    return rank_main(argv[1], atoi(argv[3]), &id);
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < NR) {
    printf("SKIP: needs %d GPUs, found %d\n", NR, n);
    return 77;
  }
  gpu_or_skip();
  return perf_launch_local(2, argv, NR, 0);
}
