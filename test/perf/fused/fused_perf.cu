/*
 * ag_gemm_perf, gemm_rs_perf, gemm_ar_perf: a fused op against the sequential baseline
 * (NCCL collective then cuBLASLt on one stream), in the same run, interleaved, on the same
 * inputs. Also times our GEMM alone and the collective alone, for the overlap efficiency
 * E = (T_gemm + T_comm - T_fused) / min(T_gemm, T_comm). Medians of -n timed iterations after
 * -w warm-ups, the max over ranks; TFLOP/s = 2 M N K / t per rank; the fused output is
 * checked against the baseline's (relative error < 1e-2). Every timed variant starts after an
 * NCCL barrier (a one-element all-reduce, not timed), so none of them absorbs the ranks' start
 * skew for the others: without it (-U) the first variant after the host's sync (the fused op)
 * waits out the skew and leaves the ranks aligned for the baseline after it.
 *
 * usage: <op>_perf [-p procs] [-M list] [-N list] [-K list] [-n iters] [-w warmup] [-J json]
 *                  [-S comm_sms] [-F] [-U] [-H] [-B sms]
 * lists are comma-separated; defaults are the shapes of DESIGN.md for the op. -S sets
 * ncclMkConfig.comm_sms (0: the library's choice, from NCCL_MK_TUNER_FILE when it has the
 * shape); -F times the fused op alone (scripts/tune.sh's sweeps; the check still runs).
 * -H gives each rank its own NCCL_HOSTID, so NCCL's baseline crosses the network (NCCL_NET
 * picks the transport: NCCL_NET_PLUGIN=mk NCCL_NET=mk for ours); with NCCL_MK_LOCAL_SIZE=1
 * the fused op then also goes between "nodes", through its proxy. The last line gives the
 * bytes each rank's proxy sent (ncclMkCommGetProxyBytes; 0 when every rank is local).
 * -B holds that many SMs of each rank's GPU with another kernel (test/gpu/sm_hold.cuh) while
 * every variant is timed (after the warm-ups, which load every kernel first), as a
 * data-parallel NCCL kernel on another stream would: a persistent kernel's CTAs that do not
 * fit start late, and a static tile walk leaves their share to the end.
 */
#include <nccl.h>
#include <string.h>
#include <unistd.h>

#include "gemm.h"
#include "gemm_check.cuh"
#include "nccl_mk.h"
#include "nccl_ok.h"
#include "perf_launch.h"
#include "perf_median.h"
#include "perf_rank_reduce.cuh"
#include "sm_hold.cuh"


enum op { AG, RS, AR };
static const char* op_names[] = {"ag_gemm", "gemm_rs", "gemm_ar"};

struct opts {
  enum op op;
  int nprocs, proc, iters, warmup;
  size_t ms[16], ns[16], ks[16];
  int nm, nn, nk;
  const char* json;
  int comm_sms, fused_only, no_barrier, distinct_hosts, hold_sms;
  char id[PERF_ID_HEX_LEN];
};

struct rank {
  int r, n;
  ncclComm_t comm;
  cudaStream_t s;
  void *a, *b, *c, *c_base, *a_full, *partial;
  struct lt_gemm lt;
  double* scratch;
};

static int parse_list(const char* s, size_t* out) {
  int n = 0;
  for (const char* p = s; *p && n < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p))
    out[n++] = strtoull(p, NULL, 10);
  return n;
}

static void default_shapes(struct opts* o) {
  size_t ms[] = {2048, 4096, 8192, 16384}, wide[] = {8192, 14336, 28672};
  o->nm = 4, o->nn = o->nk = 1;
  memcpy(o->ms, ms, sizeof(ms));
  if (o->op == AG) memcpy(o->ns, wide, sizeof(wide)), o->nn = 3, o->ks[0] = 8192;
  else memcpy(o->ks, wide, sizeof(wide)), o->nk = 3, o->ns[0] = 8192;
}

static int parse(int argc, char** argv, struct opts* o) {
  int c, launched = 0;
  o->nprocs = 2, o->iters = 20, o->warmup = 5;
  default_shapes(o);
  while ((c = getopt(argc, argv, "p:M:N:K:n:w:J:P:I:S:B:FUH")) != -1) {
    switch (c) {
      case 'p': o->nprocs = atoi(optarg); break;
      case 'M': o->nm = parse_list(optarg, o->ms); break;
      case 'N': o->nn = parse_list(optarg, o->ns); break;
      case 'K': o->nk = parse_list(optarg, o->ks); break;
      case 'n': o->iters = atoi(optarg); break;
      case 'w': o->warmup = atoi(optarg); break;
      case 'J': o->json = optarg; break;
      case 'S': o->comm_sms = atoi(optarg); break;
      case 'F': o->fused_only = 1; break;
      case 'U': o->no_barrier = 1; break;
      case 'H': o->distinct_hosts = 1; break;
      case 'B': o->hold_sms = atoi(optarg); break;
      case 'P': o->proc = atoi(optarg), launched = 1; break;
      case 'I': snprintf(o->id, sizeof(o->id), "%s", optarg), launched = 1; break;
      default: return -1;
    }
  }
  return o->iters < 1 || o->nprocs < 1 || o->comm_sms < 0 ? -1 : launched;
}

/* One call of each variant; all on the rank's stream. */
static void run_fused(struct rank* k, enum op op, size_t m, size_t n, size_t kk) {
  if (op == AG)
    NCCL_OK(ncclMkAllGatherGemm(k->a, k->b, k->c, NULL, m, n, kk, ncclBfloat16, k->comm, k->s));
  else if (op == RS)
    NCCL_OK(ncclMkGemmReduceScatter(k->a, k->b, k->c, m, n, kk, ncclBfloat16, k->comm, k->s));
  else
    NCCL_OK(ncclMkGemmAllReduce(k->a, k->b, k->c, m, n, kk, ncclBfloat16, k->comm, k->s));
}

static void run_comm(struct rank* k, enum op op, size_t m, size_t n, size_t kk) {
  size_t rows = m / k->n;
  if (op == AG) NCCL_OK(ncclAllGather(k->a, k->a_full, rows * kk, ncclBfloat16, k->comm, k->s));
  else if (op == RS)
    NCCL_OK(ncclReduceScatter(k->partial, k->c_base, rows * n, ncclBfloat16, ncclSum, k->comm, k->s));
  else NCCL_OK(ncclAllReduce(k->c_base, k->c_base, m * n, ncclBfloat16, ncclSum, k->comm, k->s));
}

static void run_gemm_cublas(struct rank* k, enum op op) {
  const void* a = op == AG ? k->a_full : k->a;
  lt_gemm_run(&k->lt, a, k->b, op == RS ? k->partial : k->c_base, k->s);
}

static void run_baseline(struct rank* k, enum op op, size_t m, size_t n, size_t kk) {
  if (op == AG) run_comm(k, op, m, n, kk), run_gemm_cublas(k, op);
  else run_gemm_cublas(k, op), run_comm(k, op, m, n, kk);
}

static void run_gemm_ours(struct rank* k, enum op op, size_t m, size_t n, size_t kk) {
  struct mk_gemm_args g;
  memset(&g, 0, sizeof(g));
  g.m = (int)m, g.n = (int)n, g.k = (int)kk;
  g.a = op == AG ? k->a_full : k->a, g.b = k->b, g.c = op == RS ? k->partial : k->c_base;
  if (mk_gemm_launch(&g, k->s)) exit(1);
}

enum { V_FUSED, V_BASE, V_GEMM, V_COMM, NV };

static void run_variant(struct rank* k, enum op op, int v, size_t m, size_t n, size_t kk) {
  if (v == V_FUSED) run_fused(k, op, m, n, kk);
  else if (v == V_BASE) run_baseline(k, op, m, n, kk);
  else if (v == V_GEMM) run_gemm_ours(k, op, m, n, kk);
  else run_comm(k, op, m, n, kk);
}

static void alloc_shape(struct rank* k, enum op op, size_t m, size_t n, size_t kk) {
  size_t rows = m / k->n, a_rows = op == AG ? rows : m, c_rows = op == RS ? rows : m;
  CUDA_OK(cudaMalloc(&k->a, a_rows * kk * 2));
  CUDA_OK(cudaMalloc(&k->b, n * kk * 2));
  CUDA_OK(cudaMalloc(&k->c, c_rows * n * 2));
  CUDA_OK(cudaMalloc(&k->c_base, m * n * 2));
  CUDA_OK(cudaMalloc(&k->a_full, op == AG ? m * kk * 2 : 16));
  CUDA_OK(cudaMalloc(&k->partial, op == RS ? m * n * 2 : 16));
  fill_random_bf16(k->a, a_rows * kk, 11 + k->r, 1.0f);
  fill_random_bf16(k->b, n * kk, 101 + k->r, 1.0f);
  CUDA_OK(cudaDeviceSynchronize());
  lt_gemm_init(&k->lt, (int)m, (int)n, (int)kk);
}

static void free_shape(struct rank* k) {
  lt_gemm_fini(&k->lt);
  cudaFree(k->a), cudaFree(k->b), cudaFree(k->c), cudaFree(k->c_base);
  cudaFree(k->a_full), cudaFree(k->partial);
}

/* Medians over the iterations, variants interleaved, then the max over ranks. */
static void time_shape(struct rank* k, const struct opts* o, size_t m, size_t n, size_t kk,
                       double med[NV]) {
  const int nv = o->fused_only ? 1 : NV; /* V_FUSED first */
  double* t = (double*)calloc(NV * o->iters, sizeof(double));
  cudaEvent_t ev[NV][2];
  for (int v = 0; v < NV; v++) {
    CUDA_OK(cudaEventCreate(&ev[v][0]));
    CUDA_OK(cudaEventCreate(&ev[v][1]));
  }
  for (int i = 0; i < o->warmup; i++)
    for (int v = 0; v < nv; v++) run_variant(k, o->op, v, m, n, kk);
  struct sm_hold hold;
  if (o->hold_sms) { /* the barrier's kernel loaded too: a first launch would wait for the holder */
    NCCL_OK(ncclAllReduce(k->scratch, k->scratch, 1, ncclFloat64, ncclSum, k->comm, k->s));
    CUDA_OK(cudaStreamSynchronize(k->s));
    if (sm_hold_start_ctas(&hold, perf_rank_device(k->r), o->hold_sms) < o->hold_sms)
      fprintf(stderr, "rank %d: only %u of %d holding CTAs started\n", k->r, hold.flags[0], o->hold_sms);
  }
  for (int i = 0; i < o->iters; i++) {
    for (int v = 0; v < nv; v++) {
      if (!o->no_barrier) NCCL_OK(ncclAllReduce(k->scratch, k->scratch, 1, ncclFloat64, ncclSum, k->comm, k->s));
      CUDA_OK(cudaEventRecord(ev[v][0], k->s));
      run_variant(k, o->op, v, m, n, kk);
      CUDA_OK(cudaEventRecord(ev[v][1], k->s));
    }
    CUDA_OK(cudaStreamSynchronize(k->s));
    for (int v = 0; v < nv; v++) {
      float ms;
      CUDA_OK(cudaEventElapsedTime(&ms, ev[v][0], ev[v][1]));
      t[v * o->iters + i] = ms;
    }
  }
  if (o->hold_sms) sm_hold_end(&hold);
  for (int v = 0; v < NV; v++) med[v] = perf_median(t + v * o->iters, o->iters);
  perf_rank_reduce(med, NV, ncclMax, k->scratch, k->comm, k->s);
  for (int v = 0; v < NV; v++) cudaEventDestroy(ev[v][0]), cudaEventDestroy(ev[v][1]);
  free(t);
}

/* The fused output against the baseline's, both from the same inputs. */
static struct check_result check_shape(struct rank* k, enum op op, size_t m, size_t n, size_t kk) {
  size_t rows = op == RS ? m / k->n : m;
  poison(k->c, rows * n * 2);
  run_fused(k, op, m, n, kk);
  run_baseline(k, op, m, n, kk);
  CUDA_OK(cudaStreamSynchronize(k->s));
  struct check_result cr = check_close((const __nv_bfloat16*)k->c, (const __nv_bfloat16*)k->c_base, rows * n, 1e-2);
  if (!cr.pass) { /* whether the call reported its failure, or none was: silent corruption */
    ncclResult_t async;
    char msg[256] = "";
    NCCL_OK(ncclMkCommGetAsyncError(k->comm, &async, msg, sizeof(msg)));
    fprintf(stderr, "# rank %d: M=%zu wrong, %ld non-finite of %zu (poison left), async error: %s\n", k->r, m,
            cr.nonfinite, rows * n, async == ncclSuccess ? "none" : msg);
  }
  return cr;
}

static void print_row(const struct rank* k, const struct opts* o, size_t m, size_t n, size_t kk,
                      const double med[NV], struct check_result cr, FILE* json) {
  double flop = 2.0 * m * n * kk, tf = flop / (med[V_FUSED] * 1e9), tb = flop / (med[V_BASE] * 1e9);
  double lo = med[V_GEMM] < med[V_COMM] ? med[V_GEMM] : med[V_COMM];
  /* with -F only the fused op was timed: no E or speedup (0 keeps the JSON valid) */
  double e = lo > 0 ? (med[V_GEMM] + med[V_COMM] - med[V_FUSED]) / lo : 0;
  double speedup = med[V_BASE] > 0 ? med[V_BASE] / med[V_FUSED] : 0;
  printf("%6zu %6zu %6zu  %9.3f %7.1f  %9.3f %7.1f  %6.3f  %9.3f %9.3f  %6.2f  %8.1e %s\n", m, n, kk,
         med[V_FUSED], tf, med[V_BASE], tb, speedup, med[V_GEMM], med[V_COMM], e,
         cr.rel, cr.pass ? "ok" : "WRONG");
  fflush(stdout);
  if (json)
    fprintf(json, "{\"op\": \"%s\", \"ranks\": %d, \"comm_sms\": %d, \"m\": %zu, \"n\": %zu, \"k\": %zu, \"fused_ms\": %.4f, "
            "\"baseline_ms\": %.4f, \"gemm_ms\": %.4f, \"comm_ms\": %.4f, \"speedup\": %.4f, "
            "\"overlap_e\": %.4f, \"rel_err\": %.3e, \"ok\": %d}\n", op_names[o->op], k->n, o->comm_sms, m, n, kk,
            med[V_FUSED], med[V_BASE], med[V_GEMM], med[V_COMM], speedup, e,
            cr.rel, cr.pass);
}

static int rank_main(const struct opts* o) {
  struct rank k;
  memset(&k, 0, sizeof(k));
  ncclUniqueId id;
  perf_hex_to_id(o->id, &id);
  k.r = o->proc, k.n = o->nprocs;
  CUDA_OK(cudaSetDevice(perf_rank_device(k.r)));
  CUDA_OK(cudaStreamCreateWithFlags(&k.s, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc((void**)&k.scratch, NV * sizeof(double)));
  NCCL_OK(ncclCommInitRank(&k.comm, k.n, id, k.r));
  ncclMkConfig cfg;
  NCCL_OK(ncclMkConfigDefaults(&cfg));
  for (int i = 0; i < o->nm; i++) cfg.max_m = cfg.max_m > o->ms[i] ? cfg.max_m : o->ms[i];
  for (int i = 0; i < o->nn; i++) cfg.max_n = cfg.max_n > o->ns[i] ? cfg.max_n : o->ns[i];
  for (int i = 0; i < o->nk; i++) cfg.max_k = cfg.max_k > o->ks[i] ? cfg.max_k : o->ks[i];
  cfg.comm_sms = o->comm_sms;
  NCCL_OK(ncclMkCommInit(k.comm, &cfg));
  FILE* json = k.r == 0 && o->json ? fopen(o->json, "w") : NULL;
  if (k.r == 0)
    printf("# %s on %d ranks, bf16, medians of %d (warm-up %d), times in ms, max over ranks%s\n"
           "#    M      N      K      fused  TFLOP/s   baseline TFLOP/s speedup     gemm      comm  "
           "E      rel_err\n", op_names[o->op], k.n, o->iters, o->warmup,
           o->hold_sms ? ", another kernel holding -B SMs of each GPU while timed" : "");
  int wrong = 0;
  for (int im = 0; im < o->nm; im++)
    for (int in = 0; in < o->nn; in++)
      for (int ik = 0; ik < o->nk; ik++) {
        size_t m = o->ms[im], n = o->ns[in], kk = o->ks[ik];
        double med[NV];
        alloc_shape(&k, o->op, m, n, kk);
        struct check_result cr = check_shape(&k, o->op, m, n, kk);
        time_shape(&k, o, m, n, kk, med);
        if (k.r == 0) print_row(&k, o, m, n, kk, med, cr, json);
        wrong += !cr.pass;
        free_shape(&k);
      }
  if (json) fclose(json);
  uint64_t proxy_bytes = 0;
  NCCL_OK(ncclMkCommGetProxyBytes(k.comm, &proxy_bytes));
  printf("# rank %d: proxy sent %llu bytes to ranks outside its local team\n", k.r, (unsigned long long)proxy_bytes);
  NCCL_OK(ncclMkCommRelease(k.comm));
  ncclCommDestroy(k.comm);
  return wrong ? 2 : 0;
}

int main(int argc, char** argv) {
  struct opts o;
  memset(&o, 0, sizeof(o));
  const char* base = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  o.op = !strncmp(base, "ag_gemm", 7) ? AG : !strncmp(base, "gemm_rs", 7) ? RS : AR;
  int launched = parse(argc, argv, &o);
  if (launched < 0) {
    fprintf(stderr, "usage: %s [-p procs] [-M list] [-N list] [-K list] [-n iters] [-w warmup] "
            "[-J json] [-S comm_sms] [-F] [-U] [-H] [-B sms]\n", argv[0]);
    return 2;
  }
  if (!launched) return perf_launch_local_or_skip_hosts(argc, argv, o.nprocs, o.distinct_hosts);
  return rank_main(&o);
}
