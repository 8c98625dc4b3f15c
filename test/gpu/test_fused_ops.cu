/*
 * The fused operations on 2 ranks (or MK_TEST_RANKS, 2 to 8: hang_report, absent_peer,
 * killed_peer and peer_dies_mid_call plant their fault on rank 1 and skip above 2) against a
 * float64 reference: correctness on odd and small shapes, bad input rejected before launch
 * with outputs untouched, CUDA-graph capture and replays with fresh inputs, back-to-back calls
 * with a randomly delayed rank, ncclMkCommInit inside ncclGroupStart/End from one thread
 * driving 2 GPUs, a planted missing flag that must end in a hang report naming the right rank,
 * tile, flag and peer, a peer that never calls (also under a graph: absent_peer_graph), a peer whose process dies with its kernel in
 * flight, peers that call after rank 0 gave up (late_peer[_rs|_ar], at any rank count: an error
 * or the right output, never stale data), two fused communicators in use at once (two_comms), one kernel per call on the overlapped paths, and a negative control for the
 * checker, and the proxy's byte counter (all of them also run with NCCL_MK_LOCAL_SIZE=1,
 * each rank its own emulated node: AllGather+GEMM then goes through the proxy).
 *
 * usage: test_fused_ops <correctness|bad_input|graph|back_to_back|negative_control|group_init|
 *                        hang_report|absent_peer[_graph]|late_peer[_rs|_ar]|one_kernel|two_comms|proxy_bytes|killed_peer|
 *                        peer_dies_mid_call[_rs|_ar]|
 *                        no_proxy_fallback|busy_sms|busy_sms_most|group_init_refused_first_call>
 * The binary starts one process per GPU itself (group_init: one process, two GPUs).
 */
#include <glob.h>
#include <nccl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fused_comm.h"
#include "gemm_check.cuh"
#include "gemm_ops_bufs.cuh"
#include "graph_kernels.cuh"
#include "mk_param.h"
#include "nccl_mk.h"
#include "nccl_ok.h"
#include "perf_launch.h"
#include "rank_harness.cuh"


/* Ranks: 2, or MK_TEST_RANKS (4 and 8 on a larger machine, gpu-check's scale tier); every
 * shape below is a per-rank row count times NR, so M divides by the ranks whatever they are. */
static int NR = 2;

struct rank_env {
  int rank;
  ncclComm_t comm;
  cudaStream_t stream;
  int failures;
};

/* M per rank; the last takes GEMM+AllReduce's overlapped path (M = 8192 on 2 ranks). */
static const struct shape odd_shapes[] = {{1, 8, 8}, {127, 72, 1000}, {64, 256, 256},
                                          {4097, 64, 72}, {256, 1000, 136}, {4096, 264, 136}};

/* A shape of m_per_rank rows on each rank. */
static struct shape per_rank(size_t m_per_rank, size_t n, size_t k) {
  struct shape s = {m_per_rank * (size_t)NR, n, k};
  return s;
}

static void expect(struct rank_env* e, int ok, const char* what, double rel) {
  if (!ok) {
    fprintf(stderr, "rank %d: %s failed (rel err %g)\n", e->rank, what, rel);
    e->failures++;
  }
}

/* gemm_ops_bufs.cuh's checks, judged: AllGather+GEMM's C (and, with ag, the gathered A). */
static void check_ag(struct rank_env* e, struct shape s, uint64_t base, void* c, void* ag, int corrupt) {
  struct check_result g;
  const struct check_result r = gemm_ops_check_ag(s, base, e->rank, NR, c, ag, &g, corrupt);
  expect(e, r.pass != corrupt, corrupt ? "negative control (AG)" : "AG+GEMM output", r.rel);
  if (ag) expect(e, g.pass, "AG+GEMM gathered A", g.rel);
}

static void check_sum(struct rank_env* e, struct shape s, uint64_t base, void* c, int rs) {
  const struct check_result r = gemm_ops_check_sum(s, base, e->rank, NR, c, rs);
  expect(e, r.pass, rs ? "GEMM+RS output" : "GEMM+AR output", r.rel);
}

static void bufs_alloc(struct op_bufs* o, struct shape s) { gemm_ops_alloc(o, s, NR); }
static void bufs_free(struct op_bufs* o) { gemm_ops_free(o); }
static void bufs_fill(struct rank_env* e, struct op_bufs* o, struct shape s, uint64_t base) {
  gemm_ops_fill(o, s, base, e->rank, NR);
}
static void run_op(struct rank_env* e, struct op_bufs* o, struct shape s, int op, void* ag) {
  NCCL_OK(gemm_ops_run(e->comm, e->stream, o, s, op, ag));
}

static void run_ops(struct rank_env* e, struct op_bufs* o, struct shape s) {
  for (int op = 0; op < 3; op++) run_op(e, o, s, op, o->ag);
}

static void check_ops(struct rank_env* e, struct op_bufs* o, struct shape s, uint64_t base) {
  CUDA_OK(cudaStreamSynchronize(e->stream));
  struct check_result r[GEMM_OPS_CHECKS];
  gemm_ops_check_all(o, s, base, e->rank, NR, r);
  for (int i = 0; i < GEMM_OPS_CHECKS; i++) expect(e, r[i].pass, gemm_ops_check_names[i], r[i].rel);
}

static void scenario_correctness(struct rank_env* e) {
  for (size_t i = 0; i < sizeof(odd_shapes) / sizeof(odd_shapes[0]); i++) {
    struct shape s = per_rank(odd_shapes[i].m, odd_shapes[i].n, odd_shapes[i].k);
    struct op_bufs o;
    bufs_alloc(&o, s);
    uint64_t base = g_seed + i * 7;
    bufs_fill(e, &o, s, base);
    run_ops(e, &o, s);
    check_ops(e, &o, s, base);
    printf("rank %d: M=%zu N=%zu K=%zu checked\n", e->rank, s.m, s.n, s.k);
    bufs_free(&o);
  }
}

/* Every bad call returns its error before launching anything: the outputs stay poisoned. */
static void scenario_bad_input(struct rank_env* e) {
  struct shape s = per_rank(64, 64, 64);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  void* c = o.c_ag;
  struct { ncclResult_t got, want; const char* what; } cases[] = {
      {ncclMkAllGatherGemm(NULL, o.b, c, NULL, s.m, s.n, s.k, ncclBfloat16, e->comm, e->stream),
       ncclInvalidArgument, "NULL a_shard"},
      {ncclMkAllGatherGemm(o.a_shard, o.b, c, NULL, s.m, 12, s.k, ncclBfloat16, e->comm, e->stream),
       ncclInvalidArgument, "N not a multiple of 8"},
      {ncclMkAllGatherGemm(o.a_shard, o.b, c, NULL, s.m + 1, s.n, s.k, ncclBfloat16, e->comm,
                           e->stream), ncclInvalidArgument, "M not a multiple of the ranks"},
      {ncclMkAllGatherGemm(o.a_shard, (char*)o.b + 2, c, NULL, s.m, s.n, s.k, ncclBfloat16,
                           e->comm, e->stream), ncclInvalidArgument, "misaligned b"},
      {ncclMkAllGatherGemm(o.a_shard, o.b, c, NULL, s.m, s.n, s.k, ncclFloat32, e->comm, e->stream),
       ncclInvalidUsage, "unsupported type"},
      {ncclMkAllGatherGemm(o.a_shard, o.b, c, NULL, s.m, s.n, s.k, ncclBfloat16,
                           (ncclComm_t)&o, e->stream), ncclInvalidUsage, "comm without ncclMkCommInit"},
      {ncclMkGemmReduceScatter(o.a, o.b, NULL, s.m, s.n, s.k, ncclBfloat16, e->comm, e->stream),
       ncclInvalidArgument, "NULL c_shard"},
      {ncclMkGemmAllReduce(o.a, o.b, c, s.m, s.n, 0, ncclBfloat16, e->comm, e->stream),
       ncclInvalidArgument, "K = 0"},
      {ncclMkCommInit(e->comm, NULL), ncclInvalidUsage, "second ncclMkCommInit"},
      {ncclMkCommInit(NULL, NULL), ncclInvalidArgument, "NULL comm"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    if (cases[i].got != cases[i].want) {
      fprintf(stderr, "rank %d: %s: got %d, want %d\n", e->rank, cases[i].what,
              (int)cases[i].got, (int)cases[i].want);
      e->failures++;
    }
  CUDA_OK(cudaDeviceSynchronize());
  expect(e, all_bytes_are(c, s.m * s.n * 2, 0xFF), "outputs untouched after bad calls", 0);
  expect(e, all_bytes_are(o.c_rs, s.m / NR * s.n * 2, 0xFF), "c_shard untouched", 0);
  bufs_free(&o);
}

/* The three ops captured once, replayed with fresh inputs written into the same buffers. */
static void scenario_graph(struct rank_env* e) {
  struct shape s = per_rank(128, 256, 512);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  run_ops(e, &o, s); /* warm-up outside capture */
  CUDA_OK(cudaStreamSynchronize(e->stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeGlobal));
  run_ops(e, &o, s);
  CUDA_OK(cudaStreamEndCapture(e->stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 50; rep++) {
    uint64_t base = g_seed + 1000 + rep;
    bufs_fill(e, &o, s, base);
    CUDA_OK(cudaGraphLaunch(exec, e->stream));
    check_ops(e, &o, s, base);
  }
  printf("rank %d: 50 graph replays checked\n", e->rank);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  bufs_free(&o);
}

static void fused_config(const char* scenario, ncclMkConfig* cfg);

/* e's communicator reports no asynchronous error (its text printed when it does). */
static void expect_no_async_error(struct rank_env* e, const char* what) {
  ncclResult_t async = ncclSuccess;
  char msg[256] = "";
  NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof msg));
  if (async != ncclSuccess) fprintf(stderr, "rank %d: asynchronous error: %s\n", e->rank, msg);
  expect(e, async == ncclSuccess, what, 0);
}

/* Two fused communicators on every rank (the world's and a split of it, as a job's tensor-
 * and data-parallel groups): AllGather+GEMM on one and GEMM+ReduceScatter on the other,
 * enqueued on two streams in the same order on every rank, so that they run at once where
 * the SMs allow; 10 rounds with fresh inputs, every output checked: the two share no state. */
static void scenario_two_comms(struct rank_env* e) {
  ncclComm_t comm2;
  NCCL_OK(ncclCommSplit(e->comm, 0, e->rank, &comm2, NULL));
  ncclMkConfig cfg;
  NCCL_OK(ncclMkConfigDefaults(&cfg));
  fused_config("two_comms", &cfg);
  NCCL_OK(ncclMkCommInit(comm2, &cfg));
  struct rank_env e2 = {e->rank, comm2, NULL, 0};
  CUDA_OK(cudaStreamCreateWithFlags(&e2.stream, cudaStreamNonBlocking));
  const struct shape s = per_rank(128, 256, 512); /* one kernel per call (one_kernel) */
  struct op_bufs o1, o2;
  bufs_alloc(&o1, s), bufs_alloc(&o2, s);
  for (int round = 0; round < 10; round++) {
    const uint64_t b1 = g_seed + 100 + round, b2 = g_seed + 200 + round;
    bufs_fill(e, &o1, s, b1), bufs_fill(&e2, &o2, s, b2);
    run_op(e, &o1, s, 0, o1.ag);
    run_op(&e2, &o2, s, 1, NULL);
    CUDA_OK(cudaStreamSynchronize(e->stream));
    CUDA_OK(cudaStreamSynchronize(e2.stream));
    check_ag(e, s, b1, o1.c_ag, o1.ag, 0);
    check_sum(&e2, s, b2, o2.c_rs, 1);
  }
  printf("rank %d: 10 rounds on two communicators checked\n", e->rank);
  expect_no_async_error(&e2, "no asynchronous error on the second communicator");
  e->failures += e2.failures;
  bufs_free(&o1), bufs_free(&o2);
  NCCL_OK(ncclMkCommRelease(comm2));
  NCCL_OK(ncclCommDestroy(comm2));
  CUDA_OK(cudaStreamDestroy(e2.stream));
}

/* A non-blocking communicator's pending work, waited out (its NCCL calls answer ncclInProgress). */
static void nonblocking_settle(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) NCCL_OK(ncclCommGetAsyncError(comm, &state));
  NCCL_OK(state);
}

/* The ops on a non-blocking communicator (ncclConfig_t.blocking = 0, split from the world):
 * its NCCL calls may answer ncclInProgress, which the init and the reference paths' collectives
 * wait out (they once took it for a failure). Every op on the odd shapes (reference paths) and
 * on 128-row shards (the overlapped ones with NCCL_MK_FUSED=1), every output checked. */
static void scenario_nonblocking_comm(struct rank_env* e) {
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 0;
  ncclComm_t comm2 = NULL;
  const ncclResult_t split = ncclCommSplit(e->comm, 0, e->rank, &comm2, &nb);
  if (split != ncclInProgress) NCCL_OK(split);
  nonblocking_settle(comm2);
  ncclMkConfig cfg;
  NCCL_OK(ncclMkConfigDefaults(&cfg));
  fused_config("nonblocking_comm", &cfg);
  NCCL_OK(ncclMkCommInit(comm2, &cfg));
  struct rank_env e2 = {e->rank, comm2, e->stream, 0};
  for (size_t i = 0; i <= sizeof(odd_shapes) / sizeof(odd_shapes[0]); i++) {
    const int last = i == sizeof(odd_shapes) / sizeof(odd_shapes[0]);
    const struct shape s = last ? per_rank(128, 256, 512) : per_rank(odd_shapes[i].m, odd_shapes[i].n, odd_shapes[i].k);
    struct op_bufs o;
    bufs_alloc(&o, s);
    const uint64_t base = g_seed + 300 + i;
    bufs_fill(&e2, &o, s, base);
    run_ops(&e2, &o, s);
    check_ops(&e2, &o, s, base);
    bufs_free(&o);
  }
  printf("rank %d: every op on a non-blocking communicator checked\n", e->rank);
  expect_no_async_error(&e2, "no asynchronous error on the non-blocking communicator");
  e->failures += e2.failures;
  NCCL_OK(ncclMkCommRelease(comm2));
  const ncclResult_t fin = ncclCommFinalize(comm2);
  if (fin != ncclInProgress) NCCL_OK(fin);
  nonblocking_settle(comm2);
  NCCL_OK(ncclCommDestroy(comm2));
}

/* One op captured alone: the graph's node count and how many of them are kernels. */
static void capture_op(struct rank_env* e, struct op_bufs* o, struct shape s, int op, size_t* nodes,
                       size_t* kernels) {
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeGlobal));
  run_op(e, o, s, op, NULL);
  CUDA_OK(cudaStreamEndCapture(e->stream, &graph));
  *kernels = graph_kernel_nodes(graph, nodes);
  cudaGraphDestroy(graph);
}

/* Each op on its overlapped path (128-row shards) is one kernel per call and nothing else:
 * no kernel, copy or event before or after it (issue 6). */
static void scenario_one_kernel(struct rank_env* e) {
  static const char* names[] = {"AllGather+GEMM", "GEMM+ReduceScatter", "GEMM+AllReduce"};
  struct shape s = per_rank(128, 256, 512);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  for (int op = 0; op < 3; op++) {
    size_t nodes, kernels;
    capture_op(e, &o, s, op, &nodes, &kernels);
    printf("rank %d: %s captured as %zu node(s), %zu kernel(s)\n", e->rank, names[op], nodes, kernels);
    expect(e, nodes == 1 && kernels == 1, names[op], 0);
  }
  bufs_free(&o);
}

/* 100 calls in a row into 100 outputs, inputs changed between calls, one rank delayed at
 * random before each call; every output checked afterwards. */
static void scenario_back_to_back(struct rank_env* e) {
  enum { CALLS = 100 };
  struct shape s = per_rank(128, 128, 256); /* 128-row shards: NCCL_MK_FUSED=1 overlaps these */
  void *a[CALLS], *b[CALLS], *c[CALLS];
  srand((unsigned)g_seed + e->rank);
  for (int i = 0; i < CALLS; i++) {
    CUDA_OK(cudaMalloc(&a[i], s.m / NR * s.k * 2));
    CUDA_OK(cudaMalloc(&b[i], s.n * s.k * 2));
    CUDA_OK(cudaMalloc(&c[i], s.m * s.n * 2));
    fill_random_bf16(a[i], s.m / NR * s.k, gemm_ops_seed(g_seed + i, e->rank, 1), 1.0f);
    fill_random_bf16(b[i], s.n * s.k, gemm_ops_seed(g_seed + i, e->rank, 2), 1.0f);
    poison(c[i], s.m * s.n * 2);
  }
  CUDA_OK(cudaDeviceSynchronize());
  for (int i = 0; i < CALLS; i++) {
    if (e->rank == 1) usleep((useconds_t)(rand() % 3000));
    NCCL_OK(ncclMkAllGatherGemm(a[i], b[i], c[i], NULL, s.m, s.n, s.k, ncclBfloat16, e->comm,
                                e->stream));
  }
  CUDA_OK(cudaStreamSynchronize(e->stream));
  for (int i = 0; i < CALLS; i++) check_ag(e, s, g_seed + i, c[i], NULL, 0);
  for (int i = 0; i < CALLS; i++) cudaFree(a[i]), cudaFree(b[i]), cudaFree(c[i]);
}

/* Each op on its overlapped paths while another kernel holds held_of_4 quarters of the SMs
 * (rank_harness.cuh rank_held_call): no timeout, a checked output, and the holder held its SMs to the end of the
 * call. The widest shape is wider than busy_sms's prepared N (fused_config): there the
 * GEMM+RS and GEMM+AllReduce take the reference path and grow its scratch, which waited for
 * the holder to end (cudaFree syncs the device) before mk_fused_scratch grew it in stream
 * order. The first calls run held (ncclMkCommInit loaded the kernels; a lazy load would wait
 * for the holder). The ops' CTAs wait for one another through their peers (a tile's owner sums
 * every rank's partial; the all-reduce's collect waits for reduced rows): GEMM+AllReduce timed
 * out here before its collect waited for every CTA to have started (gemm_rs.cuh). */
struct held_op {
  struct op_bufs* o;
  struct shape s;
  int op;
};

static ncclResult_t held_op_run(void* e, void* arg) {
  const struct held_op* h = (const struct held_op*)arg;
  run_op((struct rank_env*)e, h->o, h->s, h->op, NULL);
  return ncclSuccess;
}

static void busy_sms_run(struct rank_env* e, int held_of_4) {
  static const char* names[] = {"AllGather+GEMM", "GEMM+ReduceScatter", "GEMM+AllReduce"};
  const struct shape shapes[] = {per_rank(128, 256, 512), per_rank(4096, 264, 136), per_rank(4096, 4096, 136)};
  for (int i = 0; i < 3; i++) {
    const struct shape s = shapes[i];
    const uint64_t base = g_seed + 5000 + i;
    struct op_bufs o;
    bufs_alloc(&o, s);
    for (int op = 0; op < 3; op++) {
      bufs_fill(e, &o, s, base);
      struct held_op arg = {&o, s, op};
      const struct held_call h = rank_held_call(e->rank, e->comm, e->stream, held_of_4, held_op_run, e, &arg);
      expect(e, h.started == h.ctas && h.held == h.ctas, "the SMs held throughout the call", 0);
      ncclResult_t async = ncclSuccess;
      char msg[256] = "";
      NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof(msg)));
      printf("rank %d: %s M=%zu N=%zu K=%zu with %d of %d SMs held: %s (%.1f ms)\n", e->rank, names[op], s.m, s.n,
             s.k, h.started, h.sms, async == ncclSuccess ? "no error" : msg, h.ms);
      if (async != ncclSuccess) { /* the communicator is broken: nothing after can run */
        e->failures++;
        bufs_free(&o);
        return;
      }
      if (op == 0) check_ag(e, s, base, o.c_ag, NULL, 0);
      else check_sum(e, s, base, op == 1 ? o.c_rs : o.c_ar, op == 1);
    }
    bufs_free(&o);
  }
}

static void scenario_busy_sms(struct rank_env* e) { busy_sms_run(e, 1); }

/* Three quarters of the SMs held: fewer CTAs resident than GEMM+ReduceScatter's and
 * GEMM+AllReduce's static walk needs at 8192 x 4096 (bench/models/residency.py: with 16
 * column tiles it deadlocks at 31 or fewer of 66 on 2 ranks under MPS; it timed out here in
 * session 37); the claimed walk (gemm.h collect_claims) passes at any residency. */
static void scenario_busy_sms_most(struct rank_env* e) { busy_sms_run(e, 3); }

/* 1 when this run emulates one node per rank (NCCL_MK_LOCAL_SIZE=1, as gpu-check's xnode tier
 * sets it): the ops then go through the proxy, and some expectations differ. */
static int emulated_nodes(void) { return mk_param_int(MK_PARAM_LOCAL_SIZE) == 1; }

/* One AllGather+GEMM on o (filled for s), waited for; the communicator's asynchronous error
 * after it, printed, its account in msg. A call on a communicator already known broken fails
 * at once with ncclRemoteError, and that is an outcome too: across emulated nodes the proxy
 * may see a killed peer's connection close before the call (session 45, under MPS). */
static ncclResult_t ag_call_then_async_error(struct rank_env* e, struct op_bufs* o, struct shape s, char* msg,
                                             size_t len) {
  const ncclResult_t launched =
      ncclMkAllGatherGemm(o->a_shard, o->b, o->c_ag, NULL, s.m, s.n, s.k, ncclBfloat16, e->comm, e->stream);
  if (launched == ncclRemoteError) printf("rank %d: the call failed at once (a broken communicator)\n", e->rank);
  else NCCL_OK(launched);
  CUDA_OK(cudaStreamSynchronize(e->stream));
  ncclResult_t async = ncclSuccess;
  msg[0] = '\0';
  NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, len));
  printf("rank %d: asynchronous error %d: %s\n", e->rank, (int)async, msg);
  return async;
}

/* The proxy's bytes since `before` once they reach `want` (the counter moves when the proxy sees
 * a put complete, which may trail the peer's kernel a little), or after a second. */
static uint64_t proxy_bytes_since(struct rank_env* e, uint64_t before, uint64_t want) {
  uint64_t now = 0;
  for (int ms = 0; ms < 1000; ms++) {
    NCCL_OK(ncclMkCommGetProxyBytes(e->comm, &now));
    if (now - before >= want) break;
    usleep(1000);
  }
  return now - before;
}

/* The proxy's byte counter per op, each call checked: with NCCL_MK_LOCAL_SIZE=1 every rank is
 * its own emulated node, and its proxy sends exactly its shard to each peer per
 * AllGather+GEMM (three calls), its partial of each peer's rows per GEMM+ReduceScatter, and
 * those plus its reduced rows to each peer per GEMM+AllReduce; with every rank local it sends
 * nothing. */
static void scenario_proxy_bytes(struct rank_env* e) {
  struct shape s = per_rank(256, 256, 512);
  const int xnode = emulated_nodes();
  const uint64_t shard_a = (s.m / NR) * s.k * 2, shard_c = (s.m / NR) * s.n * 2;
  const uint64_t peers = (uint64_t)NR - 1;
  const uint64_t want[3] = {xnode ? 3 * peers * shard_a : 0, xnode ? peers * shard_c : 0,
                            xnode ? 2 * peers * shard_c : 0};
  const char* names[3] = {"AllGather+GEMM (3 calls)", "GEMM+ReduceScatter", "GEMM+AllReduce"};
  for (int op = 0; op < 3; op++) {
    uint64_t before = 0;
    NCCL_OK(ncclMkCommGetProxyBytes(e->comm, &before));
    for (int i = 0; i < (op == 0 ? 3 : 1); i++) {
      struct op_bufs o;
      bufs_alloc(&o, s);
      bufs_fill(e, &o, s, g_seed + i);
      if (op == 0)
        NCCL_OK(ncclMkAllGatherGemm(o.a_shard, o.b, o.c_ag, NULL, s.m, s.n, s.k, ncclBfloat16, e->comm, e->stream));
      else if (op == 1)
        NCCL_OK(ncclMkGemmReduceScatter(o.a, o.b, o.c_rs, s.m, s.n, s.k, ncclBfloat16, e->comm, e->stream));
      else
        NCCL_OK(ncclMkGemmAllReduce(o.a, o.b, o.c_ar, s.m, s.n, s.k, ncclBfloat16, e->comm, e->stream));
      CUDA_OK(cudaStreamSynchronize(e->stream));
      if (op == 0) check_ag(e, s, g_seed + i, o.c_ag, NULL, 0);
      else check_sum(e, s, g_seed + i, op == 1 ? o.c_rs : o.c_ar, op == 1);
      bufs_free(&o);
    }
    const uint64_t sent = proxy_bytes_since(e, before, want[op]);
    printf("rank %d: %s: proxy sent %llu bytes (want %llu)\n", e->rank, names[op], (unsigned long long)sent,
           (unsigned long long)want[op]);
    expect(e, sent == want[op], "the proxy sent exactly the op's rows (LOCAL_SIZE=1) or nothing", 0);
  }
}

/* Across emulated nodes with no usable transport (NCCL_MK_OFI_PROVIDER names none, set per
 * rank before init): init still succeeds, every rank falls back to the reference paths
 * together (no proxy, no bytes), and the ops stay correct. */
static void scenario_no_proxy_fallback(struct rank_env* e) {
  struct shape s = per_rank(256, 256, 512);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  run_ops(e, &o, s);
  check_ops(e, &o, s, g_seed);
  uint64_t sent = 1;
  NCCL_OK(ncclMkCommGetProxyBytes(e->comm, &sent));
  printf("rank %d: without a transport: ops checked, proxy bytes %llu\n", e->rank, (unsigned long long)sent);
  expect(e, sent == 0, "no proxy ran: the reference paths carried the ops", 0);
  bufs_free(&o);
}

static void scenario_negative_control(struct rank_env* e) {
  struct shape s = per_rank(64, 128, 128);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  run_ops(e, &o, s);
  CUDA_OK(cudaStreamSynchronize(e->stream));
  check_ag(e, s, g_seed, o.c_ag, NULL, 1); /* one element corrupted: the check must fail */
  bufs_free(&o);
}

#include "test_fused_faults.cuh" /* hang_report, absent_peer*, killed_peer, peer_dies*, late_peer* */

static void run_scenario(struct rank_env* e, const char* name) {
  if (!strcmp(name, "killed_peer")) { /* ends the process itself */
    scenario_killed_peer(e);
    return;
  }
  static const struct {
    const char* name;
    ncclResult_t (*call)(void* env, void* arg);
  } peer_dies[] = {{"peer_dies_mid_call", ag_call}, {"peer_dies_mid_call_rs", rs_call}, {"peer_dies_mid_call_ar", ar_call}};
  for (size_t i = 0; i < sizeof peer_dies / sizeof *peer_dies; i++)
    if (!strcmp(name, peer_dies[i].name)) peer_dies_mid_call_run(e, name, peer_dies[i].call); /* ends the process */
  if (!strcmp(name, "hang_report")) { /* ends with an asynchronous error on purpose */
    scenario_hang_report(e);
    return;
  }
  if (!strcmp(name, "absent_peer")) { /* likewise */
    scenario_absent_peer(e);
    return;
  }
  if (!strcmp(name, "absent_peer_graph")) { /* likewise */
    scenario_absent_peer_graph(e);
    return;
  }
  static const struct {
    const char* name;
    int op;
  } late[] = {{"late_peer", 0}, {"late_peer_rs", 1}, {"late_peer_ar", 2}};
  for (size_t i = 0; i < sizeof late / sizeof *late; i++)
    if (!strcmp(name, late[i].name)) { /* likewise */
      late_peer_run(e, late[i].op);
      return;
    }
  if (!strcmp(name, "correctness") || !strcmp(name, "group_init")) scenario_correctness(e);
  else if (!strcmp(name, "bad_input")) scenario_bad_input(e);
  else if (!strcmp(name, "graph")) scenario_graph(e);
  else if (!strcmp(name, "back_to_back")) scenario_back_to_back(e);
  else if (!strcmp(name, "negative_control")) scenario_negative_control(e);
  else if (!strcmp(name, "one_kernel")) scenario_one_kernel(e);
  else if (!strcmp(name, "two_comms")) scenario_two_comms(e);
  else if (!strcmp(name, "nonblocking_comm")) scenario_nonblocking_comm(e);
  else if (!strcmp(name, "proxy_bytes")) scenario_proxy_bytes(e);
  else if (!strcmp(name, "no_proxy_fallback")) scenario_no_proxy_fallback(e);
  else if (!strcmp(name, "busy_sms")) scenario_busy_sms(e);
  else if (!strcmp(name, "busy_sms_most")) scenario_busy_sms_most(e);
  else { fprintf(stderr, "unknown scenario %s\n", name); e->failures++; }
  expect_no_async_error(e, "no asynchronous error");
}

static void fused_scenario_env(const char* scenario, int rank) {
  if (!strcmp(scenario, "hang_report")) hang_report_env(rank);
  if (!strcmp(scenario, "killed_peer")) setenv("NCCL_MK_TIMEOUT_MS", "5000", 1);
  if (!strcmp(scenario, "no_proxy_fallback")) setenv("NCCL_MK_OFI_PROVIDER", "no-such-provider", 1);
}

static void fused_config(const char* scenario, ncclMkConfig* cfg) {
  cfg->max_m = (size_t)NR * 4097, cfg->max_n = 1024, cfg->max_k = 1024;
  if (!strcmp(scenario, "busy_sms_most")) cfg->max_n = 4096; /* its widest shape overlapped */
}

static int fused_run(const char* scenario, int rank, ncclComm_t comm, cudaStream_t stream) {
  struct rank_env e = {rank, comm, stream, 0};
  run_scenario(&e, scenario);
  return e.failures;
}

/* ncclMkCommInit inside ncclGroupStart/End on each rank, then rank 1's first call refused by
 * its argument checks (NULL a_shard): it still finishes the init's exchange, as a valid first
 * call would (across emulated nodes its peers' first calls wait in that exchange's
 * all-gathers; before session 67 it returned first and left them there). So its comm is no
 * longer pending when the refusal returns, and then every rank's valid calls are checked. */
static int group_init_refused_first_call(int rank, ncclComm_t comm, const ncclMkConfig* cfg) {
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclMkCommInit(comm, cfg));
  NCCL_OK(ncclGroupEnd());
  struct rank_env e = {rank, comm, NULL, 0};
  CUDA_OK(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
  if (rank == 1) {
    struct shape s = per_rank(64, 64, 64);
    struct op_bufs o;
    bufs_alloc(&o, s);
    const ncclResult_t r = ncclMkAllGatherGemm(NULL, o.b, o.c_ag, NULL, s.m, s.n, s.k, ncclBfloat16, comm, e.stream);
    expect(&e, r == ncclInvalidArgument, "the refused first call returns ncclInvalidArgument", (double)r);
    struct mk_fused_comm* fc = NULL;
    expect(&e, mk_fused_comm_lookup(comm, &fc) == 0 && !__atomic_load_n(&fc->exchange_pending, __ATOMIC_ACQUIRE),
           "the refused first call finished the init's exchange", 0.0);
    bufs_free(&o);
  }
  scenario_correctness(&e);
  expect_no_async_error(&e, "no asynchronous error");
  CUDA_OK(cudaStreamDestroy(e.stream));
  NCCL_OK(ncclMkCommRelease(comm));
  return e.failures;
}

static int fused_init_scenario(const char* scenario, int rank, ncclComm_t comm, const ncclMkConfig* cfg) {
  if (!strcmp(scenario, "group_init_refused_first_call")) return group_init_refused_first_call(rank, comm, cfg);
  if (!strcmp(scenario, "init_fails_on_one_rank")) return rank_init_fails(RANK_INIT_FAILS, rank, comm, cfg);
  if (!strcmp(scenario, "init_config_refused_on_one_rank")) return rank_init_fails(RANK_INIT_REFUSED, rank, comm, cfg);
  if (!strcmp(scenario, "init_configs_differ")) return rank_init_fails(RANK_INIT_DIFFERS, rank, comm, cfg);
  return -1;
}

struct thread_arg { struct rank_env* e; const char* scenario; };

static void* thread_main(void* p) {
  struct thread_arg* t = (struct thread_arg*)p;
  CUDA_OK(cudaSetDevice(t->e->rank));
  run_scenario(t->e, t->scenario);
  return NULL;
}

/* One process, one thread initialising both GPUs inside ncclGroupStart/End (the exchange
 * completes at first use), then one thread per GPU running the ops. */
static int group_init_main(void) {
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  NCCL_OK(ncclCommInitAll(comms, 2, devs));
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NCCL_OK(ncclMkCommInit(comms[r], NULL));
  NCCL_OK(ncclGroupEnd());
  struct rank_env env[2];
  pthread_t th[2];
  struct thread_arg args[2];
  for (int r = 0; r < 2; r++) {
    env[r] = (struct rank_env){r, comms[r], NULL, 0};
    CUDA_OK(cudaSetDevice(r));
    CUDA_OK(cudaStreamCreateWithFlags(&env[r].stream, cudaStreamNonBlocking));
    args[r] = (struct thread_arg){&env[r], "group_init"};
    pthread_create(&th[r], NULL, thread_main, &args[r]);
  }
  int failures = 0;
  for (int r = 0; r < 2; r++) {
    pthread_join(th[r], NULL);
    failures += env[r].failures;
    NCCL_OK(ncclMkCommRelease(comms[r]));
    ncclCommDestroy(comms[r]);
  }
  printf("group_init: %d failure(s)\n", failures);
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <scenario>\n", argv[0]);
    return 2;
  }
  if (argc == 2 && !strcmp(argv[1], "group_init")) { /* one process, two GPUs */
    alarm(300);
    gpus_or_skip(NR);
    g_seed = (uint64_t)time(NULL) % 100000;
    printf("seed %llu\n", (unsigned long long)g_seed);
    return group_init_main();
  }
  NR = test_ranks();
  static const char* const two_rank_only[] = {"hang_report", "absent_peer", "absent_peer_graph", "killed_peer", NULL};
  const struct rank_harness h = {NR, fused_scenario_env, fused_config, two_rank_only, fused_run, fused_init_scenario};
  return rank_harness_main(argc, argv, &h);
}
