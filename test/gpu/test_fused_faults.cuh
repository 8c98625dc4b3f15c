/*
 * The fused ops' fault scenarios (included by test_fused_ops.cu, whose buffers, checks and
 * calls they use): the planted missing flag and its hang report, a peer that never calls (also
 * under a graph), a peer whose process dies (before its call, and with its kernel in flight),
 * and a peer that calls after the other gave up.
 */
#ifndef MK_TEST_FUSED_FAULTS_CUH_
#define MK_TEST_FUSED_FAULTS_CUH_

/* The planted fault: rank 1's push never raises rank 0's flag for row-block HANG_BLOCK (its
 * shard's third), so rank 0's GEMM times out on it (NCCL_MK_DEBUG_DROP_FLAG, set per rank by
 * hang_report_env before the library reads its parameters) while rank 1 completes. */
enum { HANG_M_PER_RANK = 512, HANG_N = 256, HANG_K = 256, HANG_BLOCK = 6 };

static const char* hang_dir(void) {
  static char dir[256];
  if (!dir[0]) snprintf(dir, sizeof(dir), "/tmp/mk-hang-report.%llu", (unsigned long long)g_seed);
  return dir;
}

static void hang_report_env(int rank) {
  char v[16];
  snprintf(v, sizeof(v), "%d", rank == 1 ? (int)HANG_BLOCK : -1);
  setenv("NCCL_MK_DEBUG_DROP_FLAG", v, 1);
  setenv("NCCL_MK_TIMEOUT_MS", "3000", 1);
  setenv("NCCL_MK_TRACE", "1", 1);
  setenv("NCCL_MK_TRACE_DIR", hang_dir(), 1);
  mkdir(hang_dir(), 0755);
}

static int file_has(const char* text, const char* want, struct rank_env* e) {
  int ok = strstr(text, want) != NULL;
  if (!ok) fprintf(stderr, "rank %d: the hang report lacks \"%s\"\n", e->rank, want);
  return ok;
}

/* Rank 0: the async error names the tile and flag, and the report file names the rank, the
 * tile, the flag, the peer that owed it (rank 1, 3 of its 4 row-blocks arrived) and the CTA.
 * Rank 1: no error (every flag it waited for was raised). */
static void scenario_hang_report(struct rank_env* e) {
  struct shape s = per_rank(HANG_M_PER_RANK, HANG_N, HANG_K);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  char msg[256];
  const ncclResult_t async = ag_call_then_async_error(e, &o, s, msg, sizeof(msg));
  bufs_free(&o);
  if (e->rank == 1) {
    expect(e, async == ncclSuccess, "the rank that dropped the flag has no error", 0);
    return;
  }
  expect(e, async != ncclSuccess, "the waiting rank reports an asynchronous error", 0);
  /* Across emulated nodes (NCCL_MK_LOCAL_SIZE=1) row-blocks are copied in from the proxy's
   * bounce buffer in order, so the missing row-block 6 also holds back 7, and whichever wait
   * started first (the copy-in's on 6, a GEMM tile's on 7) reports. */
  const int xnode = emulated_nodes();
  const int names_6 = strstr(msg, "tile 6 waiting for flag 6") != NULL;
  const int names_7 = xnode && strstr(msg, "tile 7 waiting for flag 7") != NULL;
  expect(e, names_6 || names_7, "the error names tile and flag 6 (or 7 behind it across nodes)", 0);
  char pattern[320], text[16384] = "";
  snprintf(pattern, sizeof(pattern), "%s/mk-trace.rank0.call*.trace.hang.txt", hang_dir());
  glob_t g;
  if (glob(pattern, 0, NULL, &g) || g.gl_pathc != 1) {
    expect(e, 0, "exactly one hang report file on rank 0", 0);
    return;
  }
  FILE* f = fopen(g.gl_pathv[0], "r");
  size_t len = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
  text[len] = '\0';
  if (f) fclose(f);
  printf("rank 0: %s:\n%s", g.gl_pathv[0], text);
  globfree(&g);
  const char* stuck = names_7 ? "stuck: tile 7 waiting for flag 7:" : "stuck: tile 6 waiting for flag 6:";
  const char* peer = xnode ? "peer: rank 1 progress 2 (row-blocks of its shard arrived, of 4)"
                           : "peer: rank 1 progress 3 (row-blocks of its shard arrived, of 4)";
  int ok = file_has(text, "rank 0 op 1 ", e) && file_has(text, stuck, e) && file_has(text, peer, e) &&
           file_has(text, "\ncta: ", e);
  expect(e, ok, "the hang report names rank 0, tile 6, flag 6, peer 1 and the stuck CTA", 0);
}

/* Rank 1 never calls: rank 0's AllGather+GEMM ends in an asynchronous error naming rank 0,
 * the op and the tile that waited (NCCL_MK_TIMEOUT_MS=2000), and its next call fails at once
 * instead of hanging. Both meet in an NCCL all-reduce at the end. */
static void scenario_absent_peer(struct rank_env* e) {
  struct shape s = per_rank(256, 256, 256);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  if (e->rank == 0) {
    char msg[256];
    const ncclResult_t async = ag_call_then_async_error(e, &o, s, msg, sizeof(msg));
    expect(e, async == ncclRemoteError, "a call without its peer ends in ncclRemoteError", 0);
    expect(e, strstr(msg, "rank 0: ncclMkAllGatherGemm (op 0x1) timed out") && strstr(msg, "tile "),
           "the error names rank 0, the AllGather+GEMM and the tile", 0);
    ncclResult_t again = ncclMkGemmReduceScatter(o.a, o.b, o.c_rs, s.m, s.n, s.k, ncclBfloat16, e->comm, e->stream);
    expect(e, again == ncclRemoteError, "the next call fails at once", 0);
  }
  double* one;
  CUDA_OK(cudaMalloc(&one, sizeof(double)));
  NCCL_OK(ncclAllReduce(one, one, 1, ncclFloat64, ncclSum, e->comm, e->stream)); /* the barrier */
  CUDA_OK(cudaStreamSynchronize(e->stream));
  cudaFree(one);
  bufs_free(&o);
}

/* A graph replay has no host call that could refuse it. Rank 1 stays away after one completed
 * replay of an AllGather+GEMM graph: rank 0's next replay ends in ncclRemoteError (a timeout),
 * and a replay on the now broken communicator must end at once (its waits see the abort
 * word), not after another timeout, with the error kept. */
static void scenario_absent_peer_graph(struct rank_env* e) {
  const struct shape s = per_rank(128, 256, 512); /* one kernel per call */
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  run_op(e, &o, s, 0, o.ag); /* outside capture first */
  CUDA_OK(cudaStreamSynchronize(e->stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(e->stream, cudaStreamCaptureModeGlobal));
  run_op(e, &o, s, 0, o.ag);
  CUDA_OK(cudaStreamEndCapture(e->stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  bufs_fill(e, &o, s, g_seed + 1);
  CUDA_OK(cudaGraphLaunch(exec, e->stream));
  CUDA_OK(cudaStreamSynchronize(e->stream));
  check_ag(e, s, g_seed + 1, o.c_ag, o.ag, 0);
  rank_barrier(e->comm, e->stream);
  if (e->rank == 0) {
    ncclResult_t async = ncclSuccess;
    char msg[256];
    for (int replay = 0; replay < 2; replay++) {
      const double t0 = sm_hold_now_ms();
      CUDA_OK(cudaGraphLaunch(exec, e->stream));
      CUDA_OK(cudaStreamSynchronize(e->stream));
      const double ms = sm_hold_now_ms() - t0;
      NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof msg));
      printf("rank 0: replay %d without the peer: %.0f ms, asynchronous error %d: %s\n", replay, ms, (int)async, msg);
      expect(e, async == ncclRemoteError && strstr(msg, "timed out"), "a replay without the peer ends in a timeout's ncclRemoteError", 0);
      if (replay == 1) expect(e, ms < 1000.0, "a replay on a broken communicator ends at once (< 1 s; the wait bound is 2 s)", ms);
    }
  }
  rank_barrier(e->comm, e->stream);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  bufs_free(&o);
}

/* Rank 1's process dies right after init (no call, no release). Rank 0's AllGather+GEMM must
 * end in an asynchronous error (across emulated nodes: its proxy's transport error, or a wait's
 * timeout; NCCL_MK_TIMEOUT_MS=5000), its next call fail at once, and its release return. NCCL's
 * communicator is aborted, not destroyed (a peer is gone). */
static void scenario_killed_peer(struct rank_env* e) {
  if (e->rank == 1) {
    fflush(stdout);
    _exit(0);
  }
  struct shape s = per_rank(256, 256, 256);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  char msg[256];
  const ncclResult_t async = ag_call_then_async_error(e, &o, s, msg, sizeof(msg));
  expect(e, async == ncclRemoteError, "a call whose peer died ends in ncclRemoteError", 0);
  expect(e, strstr(msg, "proxy failed") || strstr(msg, "timed out"), "the error says the proxy failed or a wait timed out", 0);
  expect(e, ncclMkAllGatherGemm(o.a_shard, o.b, o.c_ag, NULL, s.m, s.n, s.k, ncclBfloat16, e->comm, e->stream) ==
                ncclRemoteError, "the next call fails at once", 0);
  bufs_free(&o);
  rank_exit_after_peer_death(e->comm, "killed_peer", e->failures);
}

struct op_call_arg { struct op_bufs* o; struct shape s; };

static ncclResult_t ag_call(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  struct op_call_arg* a = (struct op_call_arg*)arg;
  return ncclMkAllGatherGemm(a->o->a_shard, a->o->b, a->o->c_ag, NULL, a->s.m, a->s.n, a->s.k, ncclBfloat16, e->comm,
                             e->stream);
}

static ncclResult_t rs_call(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  struct op_call_arg* a = (struct op_call_arg*)arg;
  return ncclMkGemmReduceScatter(a->o->a, a->o->b, a->o->c_rs, a->s.m, a->s.n, a->s.k, ncclBfloat16, e->comm,
                                 e->stream);
}

static ncclResult_t ar_call(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  struct op_call_arg* a = (struct op_call_arg*)arg;
  return ncclMkGemmAllReduce(a->o->a, a->o->b, a->o->c_ar, a->s.m, a->s.n, a->s.k, ncclBfloat16, e->comm, e->stream);
}

/* rank_harness.cuh's rank_peer_dies_mid_call with one op (128-row shards: the overlapped
 * paths): on the load/store path rank 0's waits time out, across emulated nodes its proxy
 * sees the connection reset. */
static void peer_dies_mid_call_run(struct rank_env* e, const char* scenario,
                                   ncclResult_t (*call)(void* env, void* arg)) {
  struct shape s = per_rank(256, 256, 256);
  struct op_bufs o;
  bufs_alloc(&o, s);
  bufs_fill(e, &o, s, g_seed);
  struct op_call_arg arg = {&o, s};
  rank_peer_dies_mid_call(e->rank, e->comm, e->stream, scenario, call, e, &arg, e->failures);
}

/* rank_harness.cuh's rank_late_peer with one op (256-row shards: one kernel per call, as in
 * one_kernel). The op's call reads its op_call_arg, the first member. */
struct late_op_arg { struct op_call_arg c; int op; uint64_t base; };

static void late_op_fill(void* env, void* arg) {
  struct late_op_arg* a = (struct late_op_arg*)arg;
  a->base += 7;
  bufs_fill((struct rank_env*)env, a->c.o, a->c.s, a->base);
}

static int late_op_check(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  const struct late_op_arg* a = (const struct late_op_arg*)arg;
  const int before = e->failures;
  if (a->op == 0) check_ag(e, a->c.s, a->base, a->c.o->c_ag, NULL, 0);
  else check_sum(e, a->c.s, a->base, a->op == 1 ? a->c.o->c_rs : a->c.o->c_ar, a->op == 1);
  return e->failures == before;
}

static void late_peer_run(struct rank_env* e, int op) {
  static ncclResult_t (*const calls[3])(void* env, void* arg) = {ag_call, rs_call, ar_call};
  struct shape s = per_rank(256, 256, 256);
  struct op_bufs o;
  bufs_alloc(&o, s);
  struct late_op_arg a = {{&o, s}, op, g_seed};
  const struct rank_late_op late = {calls[op], late_op_fill, late_op_check, NULL, NULL};
  e->failures += rank_late_peer(e->rank, e->comm, e->stream, &late, e, &a);
  bufs_free(&o);
}

#endif /* MK_TEST_FUSED_FAULTS_CUH_ */
