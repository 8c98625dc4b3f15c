/* nccl-tests-style driver: arguments, the launcher, the timed loop and the table.
 * -A F (A/B in one run): the second communicator (side B) is timed in the same pass as the
 * first (side A), batch by batch: after both sides' warm-up, each of the -n / -T batches runs
 * once per side, A1 B1 A2 B2 ... (or B1 A1 B2 A2 ...), each batch between two events of its
 * own on every local GPU; each side's time is the median of its batches (the mean without
 * -T), the slowest rank's. The side that opens every turn is F at the first size and
 * alternates per size and per -R repetition (not per batch: each batch then follows one of the
 * other side, the warm-up included). Without -A the pass is side A's batches alone, as before. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll_perf.h"
#include "coll_stats.h"
#include "perf_launch.h"

static const struct coll_desc* coll; /* MK_COLL_NAME, set in main */

struct rank_ctx {
  int dev, rank;
  ncclComm_t comm;
  ncclComm_t comm_b;   /* -A: the second communicator (ncclCommSplit of comm), the tuned side */
  cudaStream_t stream;
  cudaEvent_t* marks;  /* the timed pass's events: before each side's batches, one after */
  double* batch_us;    /* per-iteration time of each of one side's batches */
  void *send, *recv;   /* out-of-place buffers */
  double *scratch;     /* 2 doubles for the cross-rank reductions of the results */
};

#define CUDA_OK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d CUDA %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return -1; } } while (0)
#define NCCL_OK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) { \
  fprintf(stderr, "%s:%d NCCL %s\n", __FILE__, __LINE__, ncclGetErrorString(r_)); return -1; } } while (0)

static size_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'G': case 'g': v *= 1 << 30; break;
    case 'M': case 'm': v *= 1 << 20; break;
    case 'K': case 'k': v *= 1 << 10; break;
  }
  return (size_t)v;
}

static void usage(const char* prog) {
  fprintf(stderr, "usage: %s [-b minbytes] [-e maxbytes] [-f factor] [-g gpus/process] "
          "[-p processes on this host | -N total processes -P this process] [-n iters] "
          "[-w warmup] [-c checks] [-d float|double|half|bfloat16|int32|int64] "
          "[-o sum|max|min] [-J file.json] [-H: with -p, a distinct NCCL_HOSTID per process, so "
          "NCCL sees one node per process] [-X: corrupt one received element before checking, "
          "the checker's negative control: the run must report it] [-R N: time each size N times, "
          "each a wait that watches NCCL's asynchronous errors (long runs)] [-T K: time the -n "
          "iterations in batches of K and report the median batch's time per iteration, which "
          "one stall cannot move (default: the mean over all -n, as nccl-tests)] [-A F: A/B in "
          "one run: a second communicator (ncclCommSplit of the first) timed beside the first, "
          "interleaved batch by batch (after both warm-ups, one -T batch of each side in turn, "
          "each side's time the median of its batches; without -T one -n batch each), side F "
          "(0: A, 1: B) opening every turn at the first size, the order alternating per size "
          "and per -R repetition, its time as time_us_b in the JSON; with NCCL_MK_TUNER_AB=1 "
          "the tuner leaves the first to NCCL and tunes the second; one GPU per process]\n", prog);
}

static int parse_args(int argc, char** argv, struct perf_args* a) {
  *a = (struct perf_args){.min_bytes = 32 << 20, .max_bytes = 32 << 20, .step_factor = 2,
                          .gpus_per_proc = 1, .nprocs = 1, .iters = 20, .warmup = 5,
                          .check = 1, .dtype = ncclFloat32, .op = ncclSum, .repeats = 1};
  int c, launched = 0;
  while ((c = getopt(argc, argv, "b:e:f:g:p:N:P:n:w:c:d:o:J:I:HXR:T:A:")) != -1) {
    switch (c) {
      case 'b': a->min_bytes = parse_size(optarg); break;
      case 'e': a->max_bytes = parse_size(optarg); break;
      case 'f': a->step_factor = (size_t)atol(optarg); break;
      case 'g': a->gpus_per_proc = atoi(optarg); break;
      case 'p': a->nprocs = atoi(optarg); break;
      case 'N': a->nprocs = atoi(optarg); launched = 1; break;
      case 'P': a->proc = atoi(optarg); launched = 1; break;
      case 'n': a->iters = atoi(optarg); break;
      case 'w': a->warmup = atoi(optarg); break;
      case 'c': a->check = atoi(optarg); break;
      case 'd': if (coll_parse_type(optarg, &a->dtype)) return -1; break;
      case 'o': if (coll_parse_op(optarg, &a->op)) return -1; break;
      case 'J': a->json_path = optarg; break;
      case 'I': snprintf(a->id_hex, sizeof(a->id_hex), "%s", optarg); launched = 1; break;
      case 'H': a->distinct_hosts = 1; break;
      case 'X': a->corrupt = 1; break;
      case 'R': a->repeats = atoi(optarg); break;
      case 'T': a->batch = atoi(optarg); if (a->batch < 1) return -1; break;
      case 'A': a->ab = 1, a->ab_first = atoi(optarg) & 1; break;
      default: return -1;
    }
  }
  if (a->gpus_per_proc < 1 || a->gpus_per_proc > MK_PERF_MAX_GPUS || a->nprocs < 1 ||
      a->iters < 1 || a->warmup < 0 || a->step_factor < 2 || a->min_bytes > a->max_bytes ||
      a->proc < 0 || a->proc >= a->nprocs || a->repeats < 1 || a->batch > a->iters ||
      (a->ab && a->gpus_per_proc != 1))
    return -1;
  return launched;
}

static int init_ranks(const struct perf_args* a, struct rank_ctx* rk, int nranks) {
  ncclUniqueId id;
  if (a->id_hex[0]) perf_hex_to_id(a->id_hex, &id);
  else NCCL_OK(ncclGetUniqueId(&id)); /* single process, or NCCL_COMM_ID across hosts */
  int ndev = 0;
  CUDA_OK(cudaGetDeviceCount(&ndev));
  NCCL_OK(ncclGroupStart());
  for (int g = 0; g < a->gpus_per_proc; g++) {
    rk[g].rank = a->proc * a->gpus_per_proc + g;
    rk[g].dev = rk[g].rank % ndev;
    CUDA_OK(cudaSetDevice(rk[g].dev));
    NCCL_OK(ncclCommInitRank(&rk[g].comm, nranks, id, rk[g].rank));
  }
  NCCL_OK(ncclGroupEnd());
  /* -A: the B side, split from A after A exists (a tuner sees A's init first) */
  if (a->ab) NCCL_OK(ncclCommSplit(rk[0].comm, 0, rk[0].rank, &rk[0].comm_b, NULL));
  return 0;
}

/* The communicator of a side: 0 = A (the only one without -A), 1 = B. */
static ncclComm_t side_comm(const struct rank_ctx* r, int side) { return side ? r->comm_b : r->comm; }

/* The events of the timed pass (coll_stats.h), created on the rank's device. */
static int alloc_marks(const struct perf_args* a, struct rank_ctx* r) {
  int n = coll_mark_count(a->iters, a->batch, a->ab ? 2 : 1);
  r->marks = calloc((size_t)n, sizeof(*r->marks));
  r->batch_us = calloc((size_t)n, sizeof(*r->batch_us));
  if (!r->marks || !r->batch_us) {
    fprintf(stderr, "out of memory for %d timing events\n", n);
    return -1;
  }
  for (int i = 0; i < n; i++) CUDA_OK(cudaEventCreate(&r->marks[i]));
  return 0;
}

static int alloc_ranks(const struct perf_args* a, struct rank_ctx* rk, int nranks) {
  size_t es = coll_type_size(a->dtype), sc, rc;
  coll->counts(a->max_bytes, es, nranks, &sc, &rc);
  for (int g = 0; g < a->gpus_per_proc; g++) {
    CUDA_OK(cudaSetDevice(rk[g].dev));
    CUDA_OK(cudaStreamCreateWithFlags(&rk[g].stream, cudaStreamNonBlocking));
    if (alloc_marks(a, &rk[g])) return -1;
    CUDA_OK(cudaMalloc(&rk[g].send, (sc > rc ? sc : rc) * es + 256));
    CUDA_OK(cudaMalloc(&rk[g].recv, (sc > rc ? sc : rc) * es + 256));
    CUDA_OK(cudaMalloc((void**)&rk[g].scratch, 2 * sizeof(double)));
  }
  return 0;
}

/* Waits for a rank's stream like nccl-tests does: polling, so that an error NCCL reports
 * asynchronously (a dead peer, a plugin error) ends the run instead of hanging it. */
static int wait_stream(struct rank_ctx* r) {
  for (;;) {
    cudaError_t q = cudaStreamQuery(r->stream);
    if (q == cudaSuccess) return 0;
    if (q != cudaErrorNotReady) CUDA_OK(q);
    for (int side = 0; side < 2; side++) {
      ncclComm_t comm = side_comm(r, side);
      ncclResult_t async = ncclSuccess;
      if (!comm) continue;
      NCCL_OK(ncclCommGetAsyncError(comm, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        fprintf(stderr, "rank %d: NCCL reported %s; aborting the communicator\n", r->rank,
                ncclGetErrorString(async));
        ncclCommAbort(comm);
        if (side) r->comm_b = NULL;
        else r->comm = NULL;
        return -1;
      }
    }
    sched_yield();
  }
}

struct run_bufs { void* send[MK_PERF_MAX_GPUS]; void* recv[MK_PERF_MAX_GPUS]; };

/* Buffers of one placement: out-of-place, or NCCL's in-place layout for this collective. */
static void placement(const struct perf_args* a, struct rank_ctx* rk, int inplace, size_t sc,
                      size_t rc, struct run_bufs* b) {
  size_t es = coll_type_size(a->dtype);
  for (int g = 0; g < a->gpus_per_proc; g++) {
    char* base = rk[g].recv;
    b->send[g] = inplace ? base : rk[g].send;
    b->recv[g] = base;
    if (inplace && coll->inplace == INPLACE_SEND_AT_RANK)
      b->send[g] = base + (size_t)rk[g].rank * sc * es;
    if (inplace && coll->inplace == INPLACE_RECV_AT_RANK)
      b->send[g] = base, b->recv[g] = base + (size_t)rk[g].rank * rc * es;
  }
}

static int launch_all(const struct perf_args* a, struct rank_ctx* rk, const struct run_bufs* b,
                      size_t sc, int nranks, int side) {
  NCCL_OK(ncclGroupStart());
  for (int g = 0; g < a->gpus_per_proc; g++) {
    CUDA_OK(cudaSetDevice(rk[g].dev));
    NCCL_OK(coll->run(b->send[g], b->recv[g], sc, a->dtype, a->op, side_comm(&rk[g], side),
                      rk[g].stream, rk[g].rank, nranks));
  }
  NCCL_OK(ncclGroupEnd());
  return 0;
}

/* Reduces one double per local GPU across every rank (max or sum) with NCCL itself. */
static int global_reduce(const struct perf_args* a, struct rank_ctx* rk, const double* local,
                         ncclRedOp_t op, double* out) {
  NCCL_OK(ncclGroupStart());
  for (int g = 0; g < a->gpus_per_proc; g++) {
    CUDA_OK(cudaSetDevice(rk[g].dev));
    CUDA_OK(cudaMemcpyAsync(rk[g].scratch, &local[g], sizeof(double), cudaMemcpyHostToDevice,
                            rk[g].stream));
    NCCL_OK(ncclAllReduce(rk[g].scratch, rk[g].scratch + 1, 1, ncclFloat64, op, rk[g].comm,
                          rk[g].stream));
  }
  NCCL_OK(ncclGroupEnd());
  CUDA_OK(cudaSetDevice(rk[0].dev));
  CUDA_OK(cudaMemcpyAsync(out, rk[0].scratch + 1, sizeof(double), cudaMemcpyDeviceToHost,
                          rk[0].stream));
  for (int g = 0; g < a->gpus_per_proc; g++)
    if (wait_stream(&rk[g])) return -1;
  return 0;
}

static int check_placement(const struct perf_args* a, struct rank_ctx* rk,
                           const struct run_bufs* b, size_t sc, size_t rc, int nranks,
                           int inplace, int side, double* wrong) {
  double local[MK_PERF_MAX_GPUS] = {0};
  size_t es = coll_type_size(a->dtype);
  for (int it = 0; it < a->check; it++) {
    int seed = it * 7919 + (int)sc + inplace;
    for (int g = 0; g < a->gpus_per_proc; g++) {
      CUDA_OK(cudaSetDevice(rk[g].dev));
      if (coll_poison(rk[g].recv, (sc > rc ? sc : rc) * es) ||
          coll_fill(b->send[g], sc, rk[g].rank, a->dtype, seed))
        return -1;
    }
    if (launch_all(a, rk, b, sc, nranks, side)) return -1;
    for (int g = 0; g < a->gpus_per_proc; g++) {
      CUDA_OK(cudaSetDevice(rk[g].dev));
      if (wait_stream(&rk[g])) return -1;
      if (a->corrupt && rk[g].rank == 0 && coll_poison(b->recv[g], coll_type_size(a->dtype)))
        return -1;
      long w = coll_count_wrong(coll, b->recv[g], rc, rk[g].rank, nranks, a->op, a->dtype, seed);
      if (w < 0) return -1;
      local[g] += (double)w;
    }
  }
  return global_reduce(a, rk, local, ncclSum, wrong);
}

struct row { double usec, usec_mean, algbw, busbw, wrong; };

/* Records timing event m (coll_batch_mark) on every local GPU's stream. */
static int record_mark(const struct perf_args* a, struct rank_ctx* rk, int m) {
  for (int g = 0; g < a->gpus_per_proc; g++) {
    CUDA_OK(cudaSetDevice(rk[g].dev));
    CUDA_OK(cudaEventRecord(rk[g].marks[m], rk[g].stream));
  }
  return 0;
}

/* Which sides one timed pass runs: `sides` (1, or 2 with -A) in turn per batch, `first`
 * opening every turn (coll_stats.h). */
struct pass_order {
  int sides, first;
};

static int order_side(struct pass_order o, int pos) {
  return (o.first + pos) % o.sides;
}

/* Warm-up (each side's -w, the opening side first, so that the first timed batch follows the
 * other side as every later one does), then the timed pass: per batch, one batch of each side
 * in turn, an event on every local GPU before each and one after the last. */
static int run_timed_pass(const struct perf_args* a, struct rank_ctx* rk, const struct run_bufs* b,
                          size_t sc, int nranks, struct pass_order o) {
  for (int pos = 0; pos < o.sides; pos++)
    for (int i = 0; i < a->warmup; i++)
      if (launch_all(a, rk, b, sc, nranks, order_side(o, pos))) return -1;
  const int nb = coll_batch_count(a->iters, a->batch);
  for (int batch = 0; batch < nb; batch++)
    for (int pos = 0; pos < o.sides; pos++) {
      if (record_mark(a, rk, coll_batch_mark(batch, o.sides, pos))) return -1;
      for (int i = 0; i < coll_batch_iters(a->iters, a->batch, batch); i++)
        if (launch_all(a, rk, b, sc, nranks, order_side(o, pos))) return -1;
    }
  return record_mark(a, rk, coll_mark_count(a->iters, a->batch, o.sides) - 1);
}

/* One side's time per iteration (us) on one GPU once its stream is done: the mean over its -n
 * iterations and, with -T, its median batch's (without -T both are the mean). */
static int rank_side_times(const struct perf_args* a, struct rank_ctx* r, struct pass_order o,
                           int pos, double* usec, double* mean) {
  const int nb = coll_batch_count(a->iters, a->batch);
  double total_ms = 0;
  float ms = 0;
  for (int b = 0; b < nb; b++) {
    int m = coll_batch_mark(b, o.sides, pos);
    CUDA_OK(cudaEventElapsedTime(&ms, r->marks[m], r->marks[m + 1]));
    total_ms += ms;
    r->batch_us[b] = 1000.0 * ms / coll_batch_iters(a->iters, a->batch, b);
  }
  /* one side alone: its batches are contiguous, one span from the first event to the last */
  if (o.sides == 1) {
    CUDA_OK(cudaEventElapsedTime(&ms, r->marks[0], r->marks[nb]));
    total_ms = ms;
  }
  *usec = *mean = 1000.0 * total_ms / a->iters;
  if (a->batch > 0) *usec = perf_median(r->batch_us, nb);
  return 0;
}

/* Times one placement: side 0 alone, or (-A) both sides in one interleaved pass; rows[side]
 * gets the slowest rank's time (its median batch with -T) and mean. */
static int time_placement(const struct perf_args* a, struct rank_ctx* rk, const struct run_bufs* b,
                          size_t sc, int nranks, struct pass_order o, struct row* rows[2]) {
  if (run_timed_pass(a, rk, b, sc, nranks, o)) return -1;
  double usec[2][MK_PERF_MAX_GPUS], mean[2][MK_PERF_MAX_GPUS];
  for (int g = 0; g < a->gpus_per_proc; g++) {
    CUDA_OK(cudaSetDevice(rk[g].dev));
    if (wait_stream(&rk[g])) return -1;
    for (int pos = 0; pos < o.sides; pos++) {
      int side = order_side(o, pos);
      if (rank_side_times(a, &rk[g], o, pos, &usec[side][g], &mean[side][g])) return -1;
    }
  }
  for (int side = 0; side < o.sides; side++) {
    struct row* r = rows[side];
    if (global_reduce(a, rk, usec[side], ncclMax, &r->usec)) return -1;
    r->usec_mean = r->usec;
    if (a->batch > 0 && global_reduce(a, rk, mean[side], ncclMax, &r->usec_mean)) return -1;
  }
  return 0;
}

/* out[side][placement]: side 1 only with -A, timed in the same pass as side 0; the side that
 * opens every turn alternates per size (index nsize) and repetition, from -A's F (the last
 * repetition is reported). */
static int measure_size(const struct perf_args* a, struct rank_ctx* rk, int nranks,
                        size_t bytes, int nsize, struct row out[2][2]) {
  size_t sc, rc;
  coll->counts(bytes, coll_type_size(a->dtype), nranks, &sc, &rc);
  const int sides = a->ab ? 2 : 1;
  for (int inplace = 0; inplace < 2; inplace++) {
    for (int side = 0; side < 2; side++) out[side][inplace] = (struct row){-1, -1, 0, 0, -1};
    if (inplace && coll->inplace == INPLACE_NONE) continue;
    struct run_bufs b;
    placement(a, rk, inplace, sc, rc, &b);
    for (int side = 0; side < sides && a->check; side++)
      if (check_placement(a, rk, &b, sc, rc, nranks, inplace, side, &out[side][inplace].wrong)) return -1;
    struct row* rows[2] = {&out[0][inplace], &out[1][inplace]};
    for (int rep = 0; rep < a->repeats; rep++) {
      struct pass_order o = {sides, (a->ab_first + nsize + rep) % sides};
      if (time_placement(a, rk, &b, sc, nranks, o, rows)) return -1;
    }
    size_t real_bytes = (coll->inplace == INPLACE_RECV_AT_RANK ? sc : rc) *
                        coll_type_size(a->dtype);
    for (int side = 0; side < sides; side++) {
      struct row* r = &out[side][inplace];
      r->algbw = real_bytes / r->usec / 1e3;
      r->busbw = r->algbw * coll->bus_factor(nranks);
    }
  }
  return 0;
}

static void print_half(const struct row* r) {
  if (r->usec < 0) { printf("  %10s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A"); return; }
  if (r->wrong < 0) printf("  %10.2f %7.2f %7.2f %6s", r->usec, r->algbw, r->busbw, "N/A");
  else printf("  %10.2f %7.2f %7.2f %6.0f", r->usec, r->algbw, r->busbw, r->wrong);
}

static void print_header(const struct perf_args* a, int nranks) {
  printf("# %s: %d ranks (%d process(es) x %d GPU(s)), type %s, op %s, %d iters, %d warmup\n",
         coll->name, nranks, a->nprocs, a->gpus_per_proc, coll_type_name(a->dtype),
         coll_op_name(a->op), a->iters, a->warmup);
  if (a->batch > 0)
    printf("# time: per iteration, the median of %d batches of %d iterations (-T %d)\n",
           coll_batch_count(a->iters, a->batch), a->batch, a->batch);
  printf("#%11s %12s %8s %6s %5s  %10s %7s %7s %6s  %10s %7s %7s %6s\n", "size", "count",
         "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
         "busbw", "#wrong");
  printf("#%11s %12s %8s %6s %5s  %10s %7s %7s %6s  %10s %7s %7s %6s\n", "(B)",
         "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "out", "(us)", "(GB/s)",
         "(GB/s)", "in");
}

/* One JSON row; with -T, time_us is the median batch's and time_us_mean the mean; with -A,
 * the B side's out-of-place figures as time_us_b, busbw_b, wrong_b (and time_us_mean_b). */
static void json_row(FILE* json, const struct perf_args* a, size_t bytes, int nranks,
                     const struct row r[2], const struct row* rb) {
  fprintf(json, "%s  {\"collective\": \"%s\", \"bytes\": %zu, \"ranks\": %d, \"type\": \"%s\", "
          "\"time_us\": %.3f, \"algbw\": %.3f, \"busbw\": %.3f, \"wrong\": %.0f, "
          "\"time_us_inplace\": %.3f, \"busbw_inplace\": %.3f", bytes == a->min_bytes ? "" : ",",
          coll->name, bytes, nranks, coll_type_name(a->dtype), r[0].usec, r[0].algbw,
          r[0].busbw, r[0].wrong, r[1].usec, r[1].busbw);
  if (a->batch > 0)
    fprintf(json, ", \"time_stat\": \"median\", \"batch\": %d, \"batches\": %d, "
            "\"time_us_mean\": %.3f", a->batch, coll_batch_count(a->iters, a->batch), r[0].usec_mean);
  if (a->ab)
    fprintf(json, ", \"time_us_b\": %.3f, \"busbw_b\": %.3f, \"wrong_b\": %.0f, \"time_us_mean_b\": %.3f",
            rb->usec, rb->busbw, rb->wrong, rb->usec_mean);
  fprintf(json, "}\n");
}

static int run_rank_process(const struct perf_args* a) {
  int nranks = a->nprocs * a->gpus_per_proc;
  struct rank_ctx rk[MK_PERF_MAX_GPUS] = {0};
  if (init_ranks(a, rk, nranks) || alloc_ranks(a, rk, nranks)) return 1;
  int leader = a->proc == 0;
  FILE* json = leader && a->json_path ? fopen(a->json_path, "w") : NULL;
  if (leader) print_header(a, nranks);
  if (json) fprintf(json, "[\n");
  double bw_sum = 0, wrong_total = 0;
  int rows = 0, rc = 0, nsize = 0;
  size_t es = coll_type_size(a->dtype);
  for (size_t bytes = a->min_bytes; bytes <= a->max_bytes; bytes *= a->step_factor) {
    struct row rs[2][2];
    if (measure_size(a, rk, nranks, bytes, nsize++, rs)) { rc = 1; break; }
    const struct row* r = rs[0];
    for (int k = 0; k < 2; k++)
      if (r[k].usec >= 0) bw_sum += r[k].busbw, rows++, wrong_total += r[k].wrong > 0 ? r[k].wrong : 0;
    for (int k = 0; k < 2 && a->ab; k++) wrong_total += rs[1][k].wrong > 0 ? rs[1][k].wrong : 0;
    if (!leader) continue;
    printf("%12zu %12zu %8s %6s %5d", bytes, bytes / es, coll_type_name(a->dtype),
           coll->reduces ? coll_op_name(a->op) : "none", -1);
    print_half(&r[0]);
    print_half(&r[1]);
    if (a->ab) printf("  B: %10.2f us %6.0f wrong  A/B %.3f", rs[1][0].usec, rs[1][0].wrong, r[0].usec / rs[1][0].usec);
    printf("\n");
    fflush(stdout);
    if (json) json_row(json, a, bytes, nranks, r, &rs[1][0]);
  }
  if (leader) {
    printf("# Out of bounds values : %.0f %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n", rows ? bw_sum / rows : 0.0);
    if (json) fprintf(json, "]\n"), fclose(json);
  }
  for (int g = 0; g < a->gpus_per_proc; g++) {
    if (rk[g].comm_b) ncclCommDestroy(rk[g].comm_b);
    if (rk[g].comm) ncclCommDestroy(rk[g].comm);
  }
  return rc ? rc : wrong_total > 0 ? 2 : 0;
}

int main(int argc, char** argv) {
  coll = coll_find(MK_COLL_NAME);
  if (!coll) return 2;
  struct perf_args a;
  int launched = parse_args(argc, argv, &a);
  if (launched < 0) {
    usage(argv[0]);
    return 2;
  }
  if (!launched && a.nprocs > 1)
    return perf_launch_local(argc, argv, a.nprocs, a.distinct_hosts);
  return run_rank_process(&a);
}
