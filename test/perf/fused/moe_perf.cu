/*
 * moe_perf: ncclMkMoeDispatchGemm (dispatch + the first grouped GEMM) against the sequential
 * baseline, in the same run, interleaved, on the same inputs (uniform random routing):
 *   baseline  a routing kernel (per destination: its tokens' places and per-expert row
 *             counts), a permutation kernel into one contiguous send buffer, NCCL all-to-all
 *             of the counts, a host synchronisation to read them, NCCL all-to-all of the
 *             deduplicated token rows (and their top-k ids), a permutation kernel into the
 *             per-expert layout, then one cuBLASLt GEMM per local expert; all timed together;
 *   floor     our grouped GEMM alone on the baseline's per-expert rows, and one read of the
 *             local experts' w1 (what any dispatch + GEMM must at least spend).
 * Medians of -n timed iterations after -w warm-ups, the max over ranks. The fused act rows
 * are checked against the baseline's, matched through the layout's row_source (per row,
 * ||fused - baseline|| / ||baseline|| < 1e-2): #wrong counts rows that differ or are missing.
 * rows_sent (the layout's, summed over ranks) is printed beside the host's deduplicated count.
 * -q: the fp8 dispatch (ncclMkConfig.moe_dispatch_fp8 = 1); the baseline then reads x's rows
 * quantized and dequantized as the fused op's GEMM sees them (rounded once before timing, so it
 * moves the same values as bf16, at the bf16 baseline's cost), which keeps #wrong exact.
 *
 * The combine side, on a second line per shape (bf16 with or without -q), timed after the
 * dispatch variants on the layout of one more fused dispatch, its variants interleaved:
 *   combine   ncclMkMoeGemmCombine (the second grouped GEMM, rows back, weighted sum);
 *   baseline  one cuBLASLt GEMM per local expert on the baseline's per-expert rows, a kernel
 *             packing the output rows (with their token and slot) per source rank, NCCL
 *             all-to-all of them (counts from the dispatch's exchange: no host sync), then on
 *             each source an index kernel and a kernel summing each token's k rows weighted
 *             (fp32, one bf16 rounding); all timed together;
 *   floor     our grouped GEMM alone on the baseline's per-expert act2 rows with w2.
 * act2 (the combine's input, standing for the activation) is a hash of (source rank, token,
 * slot, column) in both layouts, so the fused out and the baseline's out must agree: per token
 * row ||fused - baseline|| / ||baseline|| < 1e-2, rows that do not are counted in #wrong.
 *
 * Files: moe_perf.cu (types, the fused variants, checks, timing, the table),
 * moe_baseline.cuh (the dispatch baseline), moe_combine_perf.cuh (the combine variants).
 *
 * usage: moe_perf [-p procs] [-s mixtral|deepseek|decode|all] [-n iters] [-w warmup] [-q]
 *                 [-c] [-T tokens] [-J json]
 * -c adds the combine line (opt-in; first run on 2 H200s in session 18, bench/NOTES.md).
 * -T sets every shape's tokens per rank (e.g. -p 1 -T 8192 gives one rank the rows per
 * local expert that EP=2 gives each rank at T = 4096).
 */
#include <nccl.h>
#include <string.h>
#include <unistd.h>

#include "gemm.h"
#include "moe.h"
#include "moe_check.cuh"
#include "nccl_mk.h"
#include "perf_launch.h"
#include "perf_median.h"
#include "perf_rank_reduce.cuh"

enum { MAX_RANKS = 8, MAX_LOCAL_EXPERTS = 256, MAX_PLANS = 1024 };

struct moe_shape {
  const char* name;
  /* tokens per rank; inter = I, as the reference figures of the MoE issue were measured
   * (gate and up fused would be 2 I: twice the GEMM and the weights, the same dispatch) */
  int tokens, hidden, inter, experts, topk;
};
static const struct moe_shape shapes[] = {
    {"mixtral", 4096, 4096, 14336, 8, 2},
    {"deepseek", 4096, 7168, 2048, 256, 8},
    {"decode", 128, 7168, 2048, 256, 8},
};
enum { NSHAPES = sizeof(shapes) / sizeof(shapes[0]) };

struct opts {
  int nprocs, proc, iters, warmup, shape; /* shape -1: all */
  int fp8;                                /* -q: the fp8 dispatch */
  int combine;                            /* -c: the combine variants too */
  int tokens;                             /* -T: tokens per rank for every shape (0: the shape's) */
  const char* json;
  char id[PERF_ID_HEX_LEN];
};

/* cuBLASLt plans per row count m: one handle, descriptor and workspace; the heuristic runs
 * once per distinct m (the routing is fixed across iterations, as a framework's cache is). */
struct lt_plan {
  int m;
  cublasLtMatrixLayout_t la, lc;
  cublasLtMatmulAlgo_t algo;
};
struct lt_plans {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t lw; /* the weight [n, k], taken transposed */
  void* ws;
  size_t ws_size;
  int n, k, count;
  struct lt_plan plan[MAX_PLANS];
};

/* The baseline's buffers (el: experts per rank, k: top-k). */
struct baseline {
  int* send_pos;            /* [NR][T]: token t's place among the tokens sent to d, or -1 */
  int *send_hdr, *recv_hdr; /* [NR][1 + el]: tokens, then rows for each expert of the receiver */
  int *h_send_hdr, *h_recv_hdr; /* pinned copies */
  void *send_x, *recv_x;        /* [NR * T][h] */
  int *send_meta, *recv_meta;   /* [NR * T][1 + k]: token index, then its top-k ids */
  int* row_pos;                 /* [NR * T][k]: a received slot's place among its expert's rows */
  int* offsets;                 /* [el + 1]: each expert's rows */
  int* h_rows;                  /* [el]: rows per expert on the host */
  void *a_rows, *c;             /* [rows_cap][h], [rows_cap][inter] */
  int* row_src;                 /* [rows_cap][3]: source rank, token, slot */
  int recv_tokens, rows;
  struct lt_plans lt;
};

/* The combine's buffers: inputs of both sides, each side's output, the baseline's rows. */
struct combine {
  void *w2, *act2;       /* [el][h][inter]; [max_recv_rows][inter] in the fused layout */
  float* weights;        /* [T][k], in [0.1, 1] */
  void *out, *out_base;  /* [T][h]: the fused op's, the baseline's */
  void *act2_base, *y;   /* [rows_cap][inter], [rows_cap][h]: the baseline's per-expert rows */
  void *send_y, *recv_y; /* [rows_cap][h], [T * k][h]: rows going back, rows come back */
  int2 *send_meta, *recv_meta; /* their (token, slot) */
  int* cursor;                 /* [MAX_RANKS]: rows packed so far per source rank */
  int* slot_row;               /* [T][k]: the returned row of each (token, slot), or -1 */
  struct lt_plans lt;          /* y = act2 . w2^T per expert */
};

struct rank {
  int r, n;
  ncclComm_t comm;
  cudaStream_t s;
  ncclMkMoeLayout_t layout;
  double* scratch;
  struct moe_shape sh;
  size_t max_recv_rows;
  int fp8; /* the communicator's moe_dispatch_fp8 */
  int combine; /* -c */
  void *x, *w1, *act;
  void* x_base; /* the baseline's x: x, or (fp8) x quantized and dequantized */
  int* topk_idx;
  int* idx_host;
  unsigned* sink;
  struct baseline b;
  struct combine cb;
};

/* ---- routing (host) ----------------------------------------------------------------------- */

/* topk distinct experts per token, uniform. */
static void uniform_routing(int tokens, int topk, int experts, uint64_t seed, int* idx) {
  int* pool = (int*)malloc(sizeof(int) * experts);
  for (int t = 0; t < tokens; t++) {
    for (int x = 0; x < experts; x++) pool[x] = x;
    for (int s = 0, n = experts; s < topk; s++) {
      int p = (int)(host_mix(&seed) % (uint64_t)n);
      idx[(size_t)t * topk + s] = pool[p], pool[p] = pool[--n];
    }
  }
  free(pool);
}

/* One row per (token, other rank owning one of its experts). */
static unsigned long long dedup_routed(const struct moe_shape* sh, int me, int nranks,
                                       const int* idx) {
  int el = sh->experts / nranks;
  unsigned long long n = 0;
  for (int t = 0; t < sh->tokens; t++) {
    unsigned mask = 0;
    for (int s = 0; s < sh->topk; s++) {
      int d = idx[(size_t)t * sh->topk + s] / el;
      if (d != me) mask |= 1u << d;
    }
    n += (unsigned long long)__builtin_popcount(mask);
  }
  return n;
}

/* ---- kernels of the floor and the checks ------------------------------------------------- */

/* Reads n 16-byte words; the sink is written only on an impossible value (keeps the loads). */
static __global__ void read_bytes_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

/* Whether a row differs from its reference (cols bf16 each): ||row - ref|| / ||ref|| >= 1e-2
 * or a non-finite value; the answer is in thread 0 (every thread of the block must call it). */
static __device__ int row_differs(const __nv_bfloat16* row, const __nv_bfloat16* ref, int cols,
                                  double* shared) {
  double d2 = 0, r2 = 0, bad = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    double o = __bfloat162float(row[c]), x = __bfloat162float(ref[c]);
    bad += !isfinite(o);
    d2 += (o - x) * (o - x), r2 += x * x;
  }
  d2 = block_sum(d2, shared), r2 = block_sum(r2, shared), bad = block_sum(bad, shared);
  return bad > 0 || !(sqrt(d2 / r2) < 1e-2);
}

/* A floor's GEMM: our grouped GEMM alone on the baseline's per-expert rows (no communication),
 * with the fused ops' tiles; the dispatch's (a_rows x w1) and the combine's (act2 x w2). */
static void run_floor_gemm(struct rank* k, const void* a, const void* w, void* c, int n, int kdim) {
  if (k->b.rows < 1) return;
  struct mk_gemm_args g;
  memset(&g, 0, sizeof(g));
  g.m = k->b.rows, g.n = n, g.k = kdim;
  g.a = a, g.b = w, g.c = c;
  g.num_groups = k->sh.experts / k->n, g.group_offsets = k->b.offsets;
  g.block_m = mk_moe_gemm_block_m(k->sh.tokens, k->sh.topk, k->n, k->sh.experts);
  if (mk_gemm_launch(&g, k->s)) exit(1);
}

#include "moe_baseline.cuh"

#include "moe_combine_perf.cuh"

/* ---- buffers ------------------------------------------------------------------------------ */

/* Inputs (x, w1 and the routing from per-rank seeds) and every variant's buffers. */
static void alloc_shape(struct rank* k, const struct moe_shape* sh) {
  k->sh = *sh;
  const size_t t = sh->tokens, h = sh->hidden, el = sh->experts / k->n, tk = t * sh->topk;
  CUDA_OK(cudaMalloc(&k->x, t * h * 2));
  CUDA_OK(cudaMalloc(&k->w1, el * sh->inter * h * 2));
  CUDA_OK(cudaMalloc(&k->act, k->max_recv_rows * sh->inter * 2)); /* [max_recv_rows, inter] */
  CUDA_OK(cudaMalloc(&k->topk_idx, tk * sizeof(int)));
  k->idx_host = (int*)malloc(tk * sizeof(int));
  uniform_routing(sh->tokens, sh->topk, sh->experts, 7919u * (k->r + 1) + sh->experts, k->idx_host);
  CUDA_OK(cudaMemcpy(k->topk_idx, k->idx_host, tk * sizeof(int), cudaMemcpyHostToDevice));
  fill_random_bf16(k->x, t * h, 11 + k->r, 1.0f);
  fill_random_bf16(k->w1, el * sh->inter * h, 101 + k->r, 1.0f);
  k->x_base = k->x;
  if (k->fp8) {
    CUDA_OK(cudaMalloc(&k->x_base, t * h * 2));
    CUDA_OK(cudaMemcpy(k->x_base, k->x, t * h * 2, cudaMemcpyDeviceToDevice));
    fp8_round_rows(k->x_base, t, sh->hidden, 0);
  }
  CUDA_OK(cudaDeviceSynchronize());
  baseline_alloc(k);
  if (k->combine) combine_alloc(k);
}

static void free_shape(struct rank* k) {
  if (k->combine) combine_free(&k->cb);
  baseline_free(&k->b);
  if (k->x_base != k->x) cudaFree(k->x_base);
  cudaFree(k->x), cudaFree(k->w1), cudaFree(k->act), cudaFree(k->topk_idx);
  free(k->idx_host);
}

/* ---- the variants ------------------------------------------------------------------------- */

static void run_fused_with(struct rank* k, int inter) {
  const struct moe_shape* sh = &k->sh;
  NCCL_OK(ncclMkMoeDispatchGemm(k->x, k->topk_idx, k->w1, k->act, sh->tokens, sh->hidden, inter,
                                sh->topk, sh->experts, k->layout, ncclBfloat16, k->comm, k->s));
}

static void run_fused(struct rank* k) { run_fused_with(k, k->sh.inter); }

/* The dispatch's own cost: the fused op with an 8-column GEMM (w1's first 8 rows per expert). */
static void run_dispatch(struct rank* k) { run_fused_with(k, 8); }

/* The dispatch's floor GEMM. */
static void run_gemm_ours(struct rank* k) { run_floor_gemm(k, k->b.a_rows, k->w1, k->b.c, k->sh.inter, k->sh.hidden); }

static size_t w1_bytes(const struct rank* k) {
  return (size_t)(k->sh.experts / k->n) * k->sh.inter * k->sh.hidden * 2;
}

static void run_weight_read(struct rank* k) {
  read_bytes_kernel<<<1056, 512, 0, k->s>>>((const uint4*)k->w1, w1_bytes(k) / 16, k->sink);
  CUDA_OK(cudaGetLastError());
}

/* clang-format off */
enum {
  V_FUSED, V_BASE, V_GEMM, V_WREAD, V_DISPATCH, /* the dispatch variants */
  V_COMBINE, V_COMBINE_BASE, V_COMBINE_GEMM,    /* the combine variants, timed apart */
  NV
};
/* clang-format on */
static const char* variant_names[] = {
    "fused",   "baseline",         "gemm",        "w1_read", "dispatch",
    "combine", "combine_baseline", "combine_gemm"};

/* Holds the GPU for `ns` so that the host can queue the next variant before it starts. */
static __global__ void delay_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < ns);
}

/* Before each timed variant: the ranks' GPUs aligned by a one-element all-reduce, then 300 us
 * of delay while the host queues the variant. Without it, a variant that follows the
 * baseline's host synchronisation starts when each rank's host gets there, and the fused op,
 * which waits for its peers, would be charged for the other host's lag. */
static void align_ranks(struct rank* k) {
  NCCL_OK(ncclAllReduce(k->scratch, k->scratch, 1, ncclFloat64, ncclSum, k->comm, k->s));
  delay_kernel<<<1, 1, 0, k->s>>>(300000ull);
  CUDA_OK(cudaGetLastError());
}

static void run_variant(struct rank* k, int v) {
  if (v == V_FUSED) run_fused(k);
  else if (v == V_BASE) run_baseline(k);
  else if (v == V_GEMM) run_gemm_ours(k);
  else if (v == V_DISPATCH) run_dispatch(k);
  else if (v == V_COMBINE) run_combine_fused(k);
  else if (v == V_COMBINE_BASE) run_combine_baseline(k);
  else if (v == V_COMBINE_GEMM) run_combine_gemm(k);
  else run_weight_read(k);
}

/* ---- the check: fused rows against the baseline's, matched through row_source ------------- */

static __global__ void index_rows_kernel(const int* row_src, int rows, int tokens, int topk,
                                         int* index) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x) {
    const int* s = row_src + 3 * (size_t)i;
    index[((size_t)s[0] * tokens + s[1]) * topk + s[2]] = i;
  }
}

/* A fused row is wrong when the baseline has no row for its (source, token, slot), or when
 * they differ: ||fused - baseline|| / ||baseline|| >= 1e-2 or a non-finite value. */
static __global__ void compare_rows_kernel(const __nv_bfloat16* act, const int* row_source,
                                           int rows, const __nv_bfloat16* base, const int* index,
                                           int nranks, int tokens, int topk, int cols,
                                           unsigned long long* wrong) {
  __shared__ double shared[32];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int* s = row_source + 3 * (size_t)r;
    int known =
        s[0] >= 0 && s[0] < nranks && s[1] >= 0 && s[1] < tokens && s[2] >= 0 && s[2] < topk;
    int b = known ? index[((size_t)s[0] * tokens + s[1]) * topk + s[2]] : -1;
    if (b < 0) { /* the same for the whole block */
      if (threadIdx.x == 0) atomicAdd(wrong, 1ull);
      continue;
    }
    const int differs = row_differs(act + (size_t)r * cols, base + (size_t)b * cols, cols, shared);
    if (threadIdx.x == 0 && differs) atomicAdd(wrong, 1ull);
  }
}

struct shape_check {
  unsigned long long rows_sent, routed, wrong, combine_wrong;
  int fused_rows;
};

static unsigned long long count_wrong_rows(struct rank* k, const ncclMkMoeLayoutInfo* info,
                                           int fused_rows) {
  const size_t slots = (size_t)k->n * k->sh.tokens * k->sh.topk;
  int* index;
  unsigned long long *d_wrong, wrong = 0;
  CUDA_OK(cudaMalloc(&index, slots * sizeof(int)));
  CUDA_OK(cudaMalloc(&d_wrong, sizeof(*d_wrong)));
  CUDA_OK(cudaMemset(index, 0xFF, slots * sizeof(int)));
  CUDA_OK(cudaMemset(d_wrong, 0, sizeof(*d_wrong)));
  if (k->b.rows)
    index_rows_kernel<<<1024, 256>>>(k->b.row_src, k->b.rows, k->sh.tokens, k->sh.topk, index);
  const int grid = fused_rows < 65535 ? fused_rows : 65535;
  if (fused_rows)
    compare_rows_kernel<<<grid, 256>>>((const __nv_bfloat16*)k->act, info->row_source, fused_rows,
                                       (const __nv_bfloat16*)k->b.c, index, k->n, k->sh.tokens,
                                       k->sh.topk, k->sh.inter, d_wrong);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpy(&wrong, d_wrong, sizeof(wrong), cudaMemcpyDeviceToHost));
  cudaFree(index), cudaFree(d_wrong);
  return wrong + (unsigned long long)abs(fused_rows - k->b.rows); /* rows only one side has */
}

/* One fused dispatch (act poisoned first) and one baseline on the same inputs, then on their
 * layouts one fused combine and one baseline combine (check_combine). */
static struct shape_check check_shape(struct rank* k) {
  struct shape_check c;
  const int el = k->sh.experts / k->n;
  CUDA_OK(cudaMemsetAsync(k->act, 0xFF, k->max_recv_rows * k->sh.inter * 2, k->s));
  run_fused(k);
  run_baseline(k);
  CUDA_OK(cudaStreamSynchronize(k->s));
  ncclMkMoeLayoutInfo info;
  NCCL_OK(ncclMkMoeLayoutGetInfo(k->layout, &info));
  CUDA_OK(cudaMemcpy(&c.fused_rows, info.group_offsets + el, sizeof(int), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&c.rows_sent, info.rows_sent, sizeof(c.rows_sent), cudaMemcpyDeviceToHost));
  if (c.fused_rows < 0 || (size_t)c.fused_rows > k->max_recv_rows) { /* offsets are garbage */
    fprintf(stderr, "rank %d: the layout says %d rows\n", k->r, c.fused_rows);
    c.fused_rows = 0;
  }
  c.wrong = count_wrong_rows(k, &info, c.fused_rows);
  c.routed = dedup_routed(&k->sh, k->r, k->n, k->idx_host);
  c.combine_wrong = k->combine ? check_combine(k) : 0;
  return c;
}

/* ---- timing and the table ----------------------------------------------------------------- */

/* Sums (or maxima) of `count` doubles over the ranks, through the scratch buffer. */
static void reduce_over_ranks(struct rank* k, double* v, int count, ncclRedOp_t op) {
  perf_rank_reduce(v, count, op, k->scratch, k->comm, k->s);
}

/* Medians over the iterations of variants [v0, v1), interleaved, each after align_ranks. */
static void time_variants(struct rank* k, const struct opts* o, int v0, int v1, double* med) {
  double* t = (double*)malloc(sizeof(double) * NV * o->iters);
  cudaEvent_t ev[NV][2];
  for (int v = v0; v < v1; v++) {
    CUDA_OK(cudaEventCreate(&ev[v][0]));
    CUDA_OK(cudaEventCreate(&ev[v][1]));
  }
  for (int i = 0; i < o->warmup; i++)
    for (int v = v0; v < v1; v++) run_variant(k, v);
  for (int i = 0; i < o->iters; i++) {
    for (int v = v0; v < v1; v++) {
      align_ranks(k);
      CUDA_OK(cudaEventRecord(ev[v][0], k->s));
      run_variant(k, v);
      CUDA_OK(cudaEventRecord(ev[v][1], k->s));
    }
    CUDA_OK(cudaStreamSynchronize(k->s));
    for (int v = v0; v < v1; v++) {
      float ms;
      CUDA_OK(cudaEventElapsedTime(&ms, ev[v][0], ev[v][1]));
      t[v * o->iters + i] = ms;
    }
  }
  for (int v = v0; v < v1; v++) med[v] = perf_median(t + v * o->iters, o->iters);
  for (int v = v0; v < v1; v++) cudaEventDestroy(ev[v][0]), cudaEventDestroy(ev[v][1]);
  free(t);
}

/* The dispatch variants, then the combine variants on the layout of one more fused dispatch
 * (act2 refilled from it: its row order need not be the last one's); the max over ranks. */
static void time_shape(struct rank* k, const struct opts* o, double med[NV]) {
  for (int v = 0; v < NV; v++) med[v] = 0;
  time_variants(k, o, 0, V_COMBINE, med);
  if (k->combine) {
    run_fused(k);
    combine_fill_act2(k);
    time_variants(k, o, V_COMBINE, NV, med);
  }
  reduce_over_ranks(k, med, NV, ncclMax);
}

static void print_header(const struct rank* k, const struct opts* o) {
  printf("# moe_perf on %d ranks: dispatch + first grouped GEMM, bf16%s, uniform routing\n"
         "# medians of %d (warm-up %d), times in ms (max over ranks), TFLOP/s per GPU;\n"
         "# rows, rows_sent, routed and #wrong summed over ranks; speedup = baseline / fused;\n"
         "# f/gemm = fused / our grouped GEMM alone; w1_read: one read of the local experts' w1;\n"
         "# dispatch: the fused op with an 8-column GEMM (the dispatch's own cost);\n"
         "# combine line: ncclMkMoeGemmCombine, the baseline combine (per-expert cuBLASLt, NCCL\n"
         "# all-to-all back, weighted sum), our grouped GEMM alone on act2 and w2; speedup =\n"
         "# baseline / fused; #wrong: token rows of out off the baseline's, summed over ranks\n",
         k->n, k->fp8 ? ", fp8 dispatch" : "", o->iters, o->warmup);
  if (k->fp8)
    printf("# fp8 dispatch: rows move as e4m3 with a scale per token; #wrong against the baseline"
           " on x quantized and dequantized\n");
  printf("# shape        T     h  inter    E  k    rows     fused TFLOP/s  baseline speedup"
         "      gemm f/gemm   w1_read    GB/s  dispatch  rows_sent     routed  #wrong\n");
}

/* sums: rows_sent, routed, #wrong, fused rows, combine #wrong (over ranks). */
static void print_row(const struct rank* k, const double med[NV], const double sums[5],
                      FILE* json) {
  const struct moe_shape* sh = &k->sh;
  double flop = 2.0 * sums[3] * sh->inter * sh->hidden / k->n; /* per GPU, on average */
  double tf = flop / (med[V_FUSED] * 1e9), gbs = (double)w1_bytes(k) / (med[V_WREAD] * 1e6);
  double speedup = med[V_BASE] / med[V_FUSED], over_gemm = med[V_FUSED] / med[V_GEMM];
  printf("%-9s %6d %5d %6d %4d %2d %7.0f  %8.3f %7.1f  %8.3f %7.3f  %8.3f %6.2f  %8.3f %7.0f",
         sh->name, sh->tokens, sh->hidden, sh->inter, sh->experts, sh->topk, sums[3], med[V_FUSED],
         tf, med[V_BASE], speedup, med[V_GEMM], over_gemm, med[V_WREAD], gbs);
  printf("  %8.3f  %9.0f %9.0f%s  %6.0f\n", med[V_DISPATCH], sums[0], sums[1], sums[0] == sums[1] ? " " : "!",
         sums[2]);
  if (k->combine)
    printf("  combine: fused %.3f ms, baseline %.3f ms (speedup %.3f), gemm %.3f ms (f/gemm %.2f),"
           " #wrong %.0f\n",
           med[V_COMBINE], med[V_COMBINE_BASE], med[V_COMBINE_BASE] / med[V_COMBINE],
           med[V_COMBINE_GEMM], med[V_COMBINE] / med[V_COMBINE_GEMM], sums[4]);
  fflush(stdout);
  if (!json) return;
  fprintf(json, "{\"op\": \"moe_dispatch_gemm\", \"shape\": \"%s\", \"ranks\": %d, \"tokens\": %d",
          sh->name, k->n, sh->tokens);
  fprintf(json, ", \"hidden\": %d, \"inter\": %d, \"experts\": %d, \"topk\": %d, \"rows\": %.0f",
          sh->hidden, sh->inter, sh->experts, sh->topk, sums[3]);
  fprintf(json, ", \"fp8_dispatch\": %d", k->fp8);
  for (int v = 0; v < NV; v++) fprintf(json, ", \"%s_ms\": %.4f", variant_names[v], med[v]);
  fprintf(json, ", \"tflops\": %.1f, \"speedup\": %.4f, \"fused_over_gemm\": %.4f", tf, speedup,
          over_gemm);
  fprintf(json, ", \"w1_read_gbs\": %.0f, \"rows_sent\": %.0f, \"routed\": %.0f", gbs, sums[0],
          sums[1]);
  fprintf(json, ", \"wrong\": %.0f, \"combine_wrong\": %.0f}\n", sums[2], sums[4]);
}

/* One shape: check, time, print; returns 1 when something was wrong. */
static int run_shape(struct rank* k, const struct opts* o, const struct moe_shape* sh, FILE* json) {
  alloc_shape(k, sh);
  struct shape_check c = check_shape(k);
  double med[NV];
  double sums[5] = {(double)c.rows_sent, (double)c.routed, (double)c.wrong, (double)c.fused_rows,
                    (double)c.combine_wrong};
  time_shape(k, o, med);
  reduce_over_ranks(k, sums, 5, ncclSum);
  if (k->r == 0) print_row(k, med, sums, json);
  free_shape(k);
  return sums[2] > 0 || sums[4] > 0 || sums[0] != sums[1];
}

/* Shape i as this run takes it (-T). */
static struct moe_shape shape_of(const struct opts* o, int i) {
  struct moe_shape s = shapes[i];
  if (o->tokens > 0) s.tokens = o->tokens;
  return s;
}

static void moe_config(const struct opts* o, int nranks, ncclMkConfig* cfg, size_t* max_recv_rows) {
  NCCL_OK(ncclMkConfigDefaults(cfg));
  for (int i = 0; i < NSHAPES; i++) {
    if (o->shape >= 0 && i != o->shape) continue;
    const struct moe_shape sh = shape_of(o, i), *s = &sh;
    if (s->tokens > cfg->moe_max_tokens) cfg->moe_max_tokens = s->tokens;
    if (s->hidden > cfg->moe_max_hidden) cfg->moe_max_hidden = s->hidden;
    if (s->topk > cfg->moe_max_topk) cfg->moe_max_topk = s->topk;
  }
  cfg->moe_dispatch_fp8 = o->fp8;
  /* moe_max_recv_rows 0: the worst case, which act must hold */
  *max_recv_rows = (size_t)nranks * cfg->moe_max_tokens * cfg->moe_max_topk;
}

static int rank_main(const struct opts* o) {
  struct rank k;
  memset(&k, 0, sizeof(k));
  ncclUniqueId id;
  perf_hex_to_id(o->id, &id);
  k.r = o->proc, k.n = o->nprocs, k.fp8 = o->fp8, k.combine = o->combine;
  CUDA_OK(cudaSetDevice(perf_rank_device(k.r)));
  CUDA_OK(cudaStreamCreateWithFlags(&k.s, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc((void**)&k.scratch, 16 * sizeof(double))); /* reduce_over_ranks: <= NV */
  CUDA_OK(cudaMalloc((void**)&k.sink, sizeof(unsigned)));
  NCCL_OK(ncclCommInitRank(&k.comm, k.n, id, k.r));
  ncclMkConfig cfg;
  moe_config(o, k.n, &cfg, &k.max_recv_rows);
  NCCL_OK(ncclMkCommInit(k.comm, &cfg));
  NCCL_OK(ncclMkMoeLayoutCreate(k.comm, &k.layout));
  FILE* json = k.r == 0 && o->json ? fopen(o->json, "w") : NULL;
  if (k.r == 0) print_header(&k, o);
  int bad = 0;
  for (int i = 0; i < NSHAPES; i++) {
    struct moe_shape sh = shape_of(o, i);
    if (o->shape < 0 || i == o->shape) bad += run_shape(&k, o, &sh, json);
  }
  if (json) fclose(json);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclMkCommGetAsyncError(k.comm, &async, NULL, 0));
  NCCL_OK(ncclMkMoeLayoutDestroy(k.layout));
  NCCL_OK(ncclMkCommRelease(k.comm));
  ncclCommDestroy(k.comm);
  return bad || async != ncclSuccess ? 2 : 0;
}

static int shape_index(const char* name) {
  if (!strcmp(name, "all")) return -1;
  for (int i = 0; i < NSHAPES; i++)
    if (!strcmp(name, shapes[i].name)) return i;
  return -2;
}

static int parse(int argc, char** argv, struct opts* o) {
  int c, launched = 0;
  o->nprocs = 2, o->iters = 5, o->warmup = 2, o->shape = -1;
  while ((c = getopt(argc, argv, "p:s:n:w:qcT:J:P:I:")) != -1) {
    /* clang-format off */
    switch (c) {
      case 'p': o->nprocs = atoi(optarg); break;
      case 's': o->shape = shape_index(optarg); break;
      case 'n': o->iters = atoi(optarg); break;
      case 'w': o->warmup = atoi(optarg); break;
      case 'q': o->fp8 = 1; break;
      case 'c': o->combine = 1; break;
      case 'T': o->tokens = atoi(optarg); break;
      case 'J': o->json = optarg; break;
      case 'P': o->proc = atoi(optarg), launched = 1; break;
      case 'I': snprintf(o->id, sizeof(o->id), "%s", optarg), launched = 1; break;
      default: return -1;
    }
    /* clang-format on */
  }
  if (o->iters < 1 || o->warmup < 0 || o->nprocs < 1 || o->nprocs > MAX_RANKS || o->shape < -1 ||
      o->tokens < 0)
    return -1;
  return launched;
}

int main(int argc, char** argv) {
  struct opts o;
  memset(&o, 0, sizeof(o));
  int launched = parse(argc, argv, &o);
  if (launched < 0) {
    fprintf(stderr, "usage: %s [-p procs] [-s mixtral|deepseek|decode|all] [-n iters] [-w warmup]"
            " [-q] [-c] [-T tokens] [-J json]\n", argv[0]);
    return 2;
  }
  if (!launched) return perf_launch_local_or_skip(argc, argv, o.nprocs);
  return rank_main(&o);
}
