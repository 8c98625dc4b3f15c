/*
 * The MoE ops (ncclMkMoeDispatchGemm, ncclMkMoeGemmCombine) on 2 ranks against a float64
 * reference: the scenarios. One case's inputs, calls and checks are in moe_test_common.cuh.
 *   correctness       every routing at T from 1 to 16384, top-1/2/8, E = 8 and 256
 *   fp8               a subset of those on a communicator with ncclMkConfig.moe_dispatch_fp8:
 *                     act against the reference on x quantized and dequantized, act rows off
 *                     the unquantized reference (the rows were quantized), combine, rows_sent
 *   graph             dispatch, act2 and combine in a CUDA graph replayed with new routings
 *   empty_rank_tokens one rank (either, or both) calls with T = 0 and NULL token-side pointers
 *                     while the other has tokens: both still check against the reference
 *   bad_input         every bad call rejected before it launches anything
 *   negative_control  every checker fails on one planted error
 *   peer_writes       every rank's stores into its peers' workspaces (a running kernel's
 *                     handshake on counts_flag, markers across the area) land where they
 *                     read them (moe_peer_writes.cuh)
 *   busy_sms          both ops correct while another kernel holds a quarter of the SMs
 *                     (moe_busy_sms.cuh)
 *   with_dense_ops    a training step's every fused op on one communicator, 3 rounds:
 *                     AllGather+GEMM, ring attention (causal, GQA), dispatch, GEMM+ReduceScatter,
 *                     the attention's backward, combine, GEMM+AllReduce; a rank late at random
 *                     before each call; every output checked
 *   dead_peer         rank 1 never dispatches: rank 0's dispatch ends in an asynchronous error
 *   recv_overflow     more rows routed to a rank than moe_max_recv_rows: ncclRemoteError
 *                     naming the limit, an empty layout
 *   late_peer         the other ranks dispatch after rank 0's layer gave up without them, and
 *   late_peer_combine combine after rank 0's combine gave up: an error, or the right layout,
 *                     act and out; never rows that rank 0 skipped (rank_harness.cuh)
 *   peer_dies_mid_call rank 1's process dies with its dispatch kernel in flight: rank 0's
 *                     calls end in ncclRemoteError, its GPU healthy (rank_harness.cuh)
 *
 * usage: test_moe <correctness|fp8|graph|empty_rank_tokens|bad_input|negative_control|dead_peer|
 *                 late_peer|late_peer_combine|recv_overflow|peer_dies_mid_call|peer_writes|busy_sms|
 *                 with_dense_ops>
 * The binary starts one process per GPU itself.
 */
#include <unistd.h>

#include "gemm_ops_bufs.cuh"
#include "moe_test_common.cuh"
#include "ring_bwd_bufs.cuh"
#include "perf_launch.h"
#include "rank_harness.cuh"
#include "moe_peer_writes.cuh" /* after rank_harness.cuh: its rank_barrier */
#include "moe_busy_sms.cuh"

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

/* The fp8 dispatch (rank_main sets ncclMkConfig.moe_dispatch_fp8 for this scenario): top-1/2/8,
 * E = 8 and 256, T = 1, 300 and 4096, every routing; x's rows shaped (fill_x: per-token scales
 * 2^-8 to 2^8, zero rows). */
/* clang-format off */
static const struct moe_case fp8_cases[] = {
    {1, 136, 64, 32, 1, 8, UNIFORM},            {1, 256, 128, 64, 8, 256, SKEWED},
    {300, 136, 128, 72, 2, 8, SKEWED},          {300, 256, 128, 64, 8, 256, UNIFORM},
    {300, 256, 128, 64, 2, 8, MASKED},          {300, 136, 64, 64, 1, 256, ONE_RANK_EMPTY},
    {4096, 256, 128, 64, 2, 256, MASKED},       {4096, 136, 128, 64, 8, 256, SKEWED},
    {4096, 512, 256, 128, 1, 8, UNIFORM},       {4096, 256, 128, 64, 8, 8, EMPTY_EXPERTS},
};
/* clang-format on */

/* A rank with T = 0 beside one with tokens (no_tokens: bit 0 rank 0, bit 1 rank 1, 3 both):
 * the empty rank still takes its peer's rows through both GEMMs and sends them back. With
 * ONE_RANK_EMPTY every row goes to rank 0: all of them to the empty rank (1), or rank 1 has
 * nothing to send nor receive (2). The last case checks that the calls after are unharmed. */
struct empty_rank_case {
  struct moe_case c;
  int no_tokens;
};
/* clang-format off */
static const struct empty_rank_case empty_rank_cases[] = {
    {{1, 136, 64, 32, 1, 8, UNIFORM}, 1},            {{1, 136, 64, 32, 1, 8, UNIFORM}, 2},
    {{300, 256, 128, 64, 2, 8, UNIFORM}, 1},         {{300, 256, 128, 64, 2, 8, UNIFORM}, 2},
    {{300, 256, 128, 64, 8, 256, MASKED}, 1},        {{300, 136, 128, 72, 8, 256, SKEWED}, 2},
    {{4096, 256, 128, 64, 2, 8, ONE_RANK_EMPTY}, 1},
    {{4096, 256, 128, 64, 2, 8, ONE_RANK_EMPTY}, 2},
    {{4096, 136, 128, 64, 8, 256, SKEWED}, 1},       {{4096, 256, 128, 64, 8, 8, EMPTY_EXPERTS}, 2},
    {{16384, 256, 128, 64, 8, 256, UNIFORM}, 1},     {{16384, 256, 128, 64, 2, 8, UNIFORM}, 2},
    {{300, 256, 128, 64, 2, 8, UNIFORM}, 3},         {{300, 256, 128, 64, 2, 8, UNIFORM}, 0},
};
/* clang-format on */

/* ---- scenarios ----------------------------------------------------------------------------- */

static void scenario_correctness(struct rank_env* e) {
  for (size_t i = 0; i < sizeof(correctness_cases) / sizeof(correctness_cases[0]); i++)
    run_case(e, &correctness_cases[i], g_seed + i * 7, 0);
}

static void scenario_empty_rank_tokens(struct rank_env* e) {
  for (size_t i = 0; i < sizeof(empty_rank_cases) / sizeof(empty_rank_cases[0]); i++) {
    e->no_tokens = empty_rank_cases[i].no_tokens;
    run_case(e, &empty_rank_cases[i].c, g_seed + 2000 + i * 7, 0);
  }
  e->no_tokens = 0;
}

static void scenario_fp8(struct rank_env* e) {
  for (size_t i = 0; i < sizeof(fp8_cases) / sizeof(fp8_cases[0]); i++)
    run_case(e, &fp8_cases[i], g_seed + 500 + i * 7, 0);
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

static void moe_config(const char* scenario, ncclMkConfig* cfg);

/* One dispatch of case c (rank_harness.cuh's call shape). */
struct dispatch_arg { struct moe_bufs* b; const struct moe_case* c; };

static ncclResult_t dispatch_call(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  const struct dispatch_arg* a = (const struct dispatch_arg*)arg;
  const struct moe_case* c = a->c;
  return ncclMkMoeDispatchGemm(a->b->x, a->b->topk_idx, a->b->w1, a->b->act, c->tokens, c->hidden, c->inter, c->topk,
                               c->experts, e->layout, ncclBfloat16, e->comm, e->stream);
}

/* A layout of an earlier init is refused after the communicator's next ncclMkCommInit (its
 * buffers were sized from that init's config); a new one takes its place. Every rank. */
static void layout_of_an_earlier_init_is_refused(struct rank_env* e, struct dispatch_arg* arg) {
  CUDA_OK(cudaDeviceSynchronize());
  NCCL_OK(ncclMkCommRelease(e->comm));
  ncclMkConfig cfg;
  NCCL_OK(ncclMkConfigDefaults(&cfg));
  moe_config("bad_input", &cfg);
  NCCL_OK(ncclMkCommInit(e->comm, &cfg));
  const ncclResult_t rc = dispatch_call(e, arg);
  expect(e, rc == ncclInvalidArgument, "a layout made before the last ncclMkCommInit is refused", 0);
  NCCL_OK(ncclMkMoeLayoutDestroy(e->layout));
  NCCL_OK(ncclMkMoeLayoutCreate(e->comm, &e->layout));
}

/* Every bad call returns its error before launching anything; then the good calls still
 * work on the same layout and communicator; last, a layout of the previous init is refused. */
static void scenario_bad_input(struct rank_env* e) {
  const struct moe_case c = {64, 128, 64, 64, 2, 8, UNIFORM};
  const struct moe_case big = {MAX_TOKENS + 8, MAX_HIDDEN + 8, 72, 72, MAX_TOPK + 1, 8, UNIFORM};
  const size_t act_bytes = rows_cap() * big.inter * 2,
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
  struct dispatch_arg arg = {&b, &c};
  layout_of_an_earlier_init_is_refused(e, &arg);
  bufs_free(&b);
}

/* One element of act and of out, one row_source entry and rows_sent corrupted: every checker
 * must fail (check_case counts a checker that passes as the failure). */
static void scenario_negative_control(struct rank_env* e) {
  const struct moe_case c = {300, 136, 64, 64, 2, 8, UNIFORM}; /* rows on both ranks */
  run_case(e, &c, g_seed, 1);
}

/* Rank 1 never dispatches (NCCL_MK_TIMEOUT_MS=2000, set by rank_main): rank 0's dispatch
 * must end (no hang) with an asynchronous error naming the rank, the MoE op and the peer's
 * token counts it waited for (not its own layout step, which waits on them), and its next
 * call must fail at once. Rank 1 waits on an NCCL barrier so that its workspace, which rank 0
 * still writes, outlives rank 0's call. */
static void scenario_dead_peer(struct rank_env* e) {
  const struct moe_case c = {64, 128, 64, 64, 2, 8, UNIFORM};
  struct moe_bufs b;
  bufs_alloc(&b, &c);
  inputs_fill(e, &b, &c, g_seed);
  struct dispatch_arg arg = {&b, &c};
  ncclResult_t async = ncclSuccess;
  char msg[256] = "";
  if (e->rank == 0) {
    NCCL_OK(dispatch_call(e, &arg));
    CUDA_OK(cudaStreamSynchronize(e->stream));
    NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof(msg)));
    printf("rank 0: asynchronous error %d: %s\n", (int)async, msg);
    expect(e, async == ncclRemoteError, "a dispatch without its peer ends in ncclRemoteError", 0);
    expect(e, strstr(msg, "rank 0: ncclMkMoeDispatchGemm (op 0x4) timed out") != NULL, "the error names rank 0 and the dispatch", 0);
    /* the cause, not its own layout step that waited on it (session 45) */
    expect(e, strstr(msg, "waiting for a peer's token counts") != NULL, "the error names the peer's counts", 0);
    expect(e, dispatch_call(e, &arg) == ncclRemoteError, "the next call fails at once", 0);
  }
  CUDA_OK(cudaStreamSynchronize(e->stream));
  rank_barrier(e->comm, e->stream);
  bufs_free(&b);
}

/* moe_max_recv_rows = 16 (moe_config) against a case that routes ~128 rows to every rank: each
 * dispatch ends in ncclRemoteError whose text names the limit (no timeout: it said "timed out
 * at tile 0" before session 45), the layout is empty, and the next call fails at once. */
static void scenario_recv_overflow(struct rank_env* e) {
  const struct moe_case c = {64, 128, 64, 64, 2, 8, UNIFORM};
  struct moe_bufs b;
  bufs_alloc(&b, &c);
  inputs_fill(e, &b, &c, g_seed);
  struct dispatch_arg arg = {&b, &c};
  char msg[256];
  const ncclResult_t r = rank_call_outcome(e->comm, e->stream, dispatch_call, e, &arg, msg, sizeof msg);
  printf("rank %d: %d %s\n", e->rank, (int)r, msg);
  expect(e, r == ncclRemoteError, "a dispatch past moe_max_recv_rows ends in ncclRemoteError", 0);
  expect(e, strstr(msg, "ncclMkConfig.moe_max_recv_rows = 16") && !strstr(msg, "timed out"),
         "the error names the limit, not a timeout", 0);
  ncclMkMoeLayoutInfo info;
  NCCL_OK(ncclMkMoeLayoutGetInfo(e->layout, &info));
  int rows = -1;
  CUDA_OK(cudaMemcpy(&rows, info.group_offsets + c.experts / NR, sizeof rows, cudaMemcpyDeviceToHost));
  expect(e, rows == 0, "the layout of the call is empty", 0);
  expect(e, dispatch_call(e, &arg) == ncclRemoteError, "the next call fails at once", 0);
  rank_barrier(e->comm, e->stream);
  bufs_free(&b);
}

/* The MoE layer between the dense ops on one communicator, as a training step calls them
 * (test_ops_in_turn.cu has the dense ops with ring attention): per round AllGather+GEMM, the
 * dispatch, GEMM+ReduceScatter, the combine, GEMM+AllReduce, with no host wait between them
 * and every rank but 0 a random 0-3 ms late before each; then the MoE case and the three GEMM
 * outputs against float64 (gemm_ops_bufs.cuh). The ops share the communicator's done word. */
/* Call i of a round of with_dense_ops, in a training step's order. */
static void dense_round_call(struct rank_env* e, struct moe_bufs* b, const struct moe_case* c, struct op_bufs* o,
                             struct shape s, struct rb_bufs* attn, int i) {
  switch (i) {
  case 0: NCCL_OK(gemm_ops_run(e->comm, e->stream, o, s, 0, o->ag)); break;
  case 1: NCCL_OK(rb_fwd(e->comm, e->stream, attn)); break;
  case 2: run_dispatch(e, b, c); break;
  case 3: NCCL_OK(gemm_ops_run(e->comm, e->stream, o, s, 1, NULL)); break;
  case 4: NCCL_OK(rb_bwd(e->comm, e->stream, attn)); break;
  case 5: run_combine(e, b, c); break;
  default: NCCL_OK(gemm_ops_run(e->comm, e->stream, o, s, 2, NULL)); break;
  }
}

static void scenario_with_dense_ops(struct rank_env* e) {
  const struct moe_case c = {4096, 256, 128, 64, 2, 8, UNIFORM};
  const struct shape s = {(size_t)1024 * NR, 1024, 1024};
  const struct rb_case attn_case = {1, 512, 8, 2, 128, 1}; /* causal GQA, S_local a multiple of 256 */
  struct moe_bufs b;
  struct op_bufs o;
  struct rb_bufs attn;
  bufs_alloc(&b, &c), gemm_ops_alloc(&o, s, NR), rb_alloc(&attn, attn_case, e->rank, NR);
  srand((unsigned)g_seed + e->rank);
  for (int round = 0; round < 3; round++) {
    const uint64_t base = g_seed + 7000 + 13 * round;
    inputs_fill(e, &b, &c, base), gemm_ops_fill(&o, s, base, e->rank, NR), rb_fill(&attn, base, 1);
    for (int i = 0; i < 7; i++) {
      if (e->rank) usleep((useconds_t)(rand() % 3000));
      dense_round_call(e, &b, &c, &o, s, &attn, i);
    }
    check_case(e, &b, &c, base, 0);
    struct check_result r[GEMM_OPS_CHECKS];
    gemm_ops_check_all(&o, s, base, e->rank, NR, r);
    for (int i = 0; i < GEMM_OPS_CHECKS; i++) expect(e, r[i].pass, gemm_ops_check_names[i], r[i].rel);
    expect(e, rb_check(&attn, ""), "ring attention's gradients", 0);
  }
  bufs_free(&b), gemm_ops_free(&o), rb_free(&attn);
}

/* rank_harness.cuh's rank_peer_dies_mid_call with a dispatch: rank 1's process dies while its
 * dispatch kernel waits for rank 0's counts. */
static void scenario_peer_dies_mid_call(struct rank_env* e) {
  const struct moe_case c = {64, 128, 64, 64, 2, 8, UNIFORM};
  struct moe_bufs b;
  bufs_alloc(&b, &c);
  inputs_fill(e, &b, &c, g_seed);
  struct dispatch_arg arg = {&b, &c};
  rank_peer_dies_mid_call(e->rank, e->comm, e->stream, "peer_dies_mid_call", dispatch_call, e, &arg, e->failures);
}

/* rank_harness.cuh's rank_late_peer over one MoE layer: late_peer makes the ranks but 0 late for the
 * dispatch (the call: dispatch, act2, combine), late_peer_combine for the combine only (every
 * rank dispatches in the setup). */
struct late_layer_arg { struct moe_bufs* b; const struct moe_case* c; uint64_t base; int combine_only; };

static ncclResult_t late_layer_call(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  const struct late_layer_arg* a = (const struct late_layer_arg*)arg;
  if (!a->combine_only) {
    struct dispatch_arg d = {a->b, a->c};
    const ncclResult_t r = dispatch_call(e, &d);
    if (r != ncclSuccess) return r;
    ncclMkMoeLayoutInfo info;
    NCCL_OK(ncclMkMoeLayoutGetInfo(e->layout, &info));
    fill_act2_kernel<<<1024, 256, 0, e->stream>>>((__nv_bfloat16*)a->b->act2, info.row_source, info.group_offsets,
                                                  a->c->experts / NR, a->c->inter2, rows_cap(), act2_seed());
    CUDA_OK(cudaGetLastError());
  }
  return ncclMkMoeGemmCombine(a->b->act2, a->b->w2, a->b->weights, a->b->out, a->c->tokens, a->c->hidden,
                              a->c->inter2, e->layout, ncclBfloat16, e->comm, e->stream);
}

static void late_layer_fill(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  struct late_layer_arg* a = (struct late_layer_arg*)arg;
  a->base += 7;
  inputs_fill(e, a->b, a->c, a->base);
}

/* late_peer_combine's setup (rank_late_op.setup): every rank dispatches the fresh inputs. */
static void late_layer_dispatch(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  const struct late_layer_arg* a = (const struct late_layer_arg*)arg;
  run_dispatch(e, a->b, a->c);
  CUDA_OK(cudaStreamSynchronize(e->stream));
}

static int late_layer_check(void* env, void* arg) {
  struct rank_env* e = (struct rank_env*)env;
  const struct late_layer_arg* a = (const struct late_layer_arg*)arg;
  const int before = e->failures;
  check_case(e, a->b, a->c, a->base, 0);
  return e->failures == before;
}

static void late_peer_run(struct rank_env* e, int combine_only) {
  const struct moe_case c = {64, 128, 64, 64, 2, 8, UNIFORM};
  struct moe_bufs b;
  bufs_alloc(&b, &c);
  struct late_layer_arg a = {&b, &c, g_seed, combine_only};
  const struct rank_late_op late = {late_layer_call, late_layer_fill, late_layer_check, NULL,
                                    combine_only ? late_layer_dispatch : NULL};
  e->failures += rank_late_peer(e->rank, e->comm, e->stream, &late, e, &a);
  bufs_free(&b);
}

static void run_scenario(struct rank_env* e, const char* name) {
  ncclResult_t async = ncclSuccess;
  char msg[256] = "";
  if (!strcmp(name, "dead_peer")) { /* ends with an asynchronous error on purpose */
    scenario_dead_peer(e);
    return;
  }
  if (!strcmp(name, "recv_overflow")) { /* likewise */
    scenario_recv_overflow(e);
    return;
  }
  if (!strcmp(name, "late_peer") || !strcmp(name, "late_peer_combine")) { /* errors on purpose */
    late_peer_run(e, !strcmp(name, "late_peer_combine"));
    return;
  }
  if (!strcmp(name, "peer_dies_mid_call")) { /* ends the process itself */
    scenario_peer_dies_mid_call(e);
    return;
  }
  static const struct {
    const char* name;
    void (*run)(struct rank_env*);
  } scenarios[] = {{"correctness", scenario_correctness},
                   {"fp8", scenario_fp8},
                   {"graph", scenario_graph},
                   {"empty_rank_tokens", scenario_empty_rank_tokens},
                   {"bad_input", scenario_bad_input},
                   {"negative_control", scenario_negative_control},
                   {"peer_writes", scenario_peer_writes},
                   {"busy_sms", scenario_busy_sms},
                   {"with_dense_ops", scenario_with_dense_ops}};
  size_t i = 0, n = sizeof(scenarios) / sizeof(scenarios[0]);
  while (i < n && strcmp(name, scenarios[i].name)) i++;
  if (i < n) scenarios[i].run(e);
  else fprintf(stderr, "unknown scenario %s\n", name), e->failures++;
  NCCL_OK(ncclMkCommGetAsyncError(e->comm, &async, msg, sizeof(msg)));
  if (async != ncclSuccess) fprintf(stderr, "rank %d: asynchronous error: %s\n", e->rank, msg);
  expect(e, async == ncclSuccess, "no asynchronous error", 0);
}

static void moe_scenario_env(const char* scenario, int rank) {
  (void)rank;
  if (!strcmp(scenario, "dead_peer")) setenv("NCCL_MK_TIMEOUT_MS", "2000", 1);
  if (!strcmp(scenario, "recv_overflow")) setenv("NCCL_MK_TIMEOUT_MS", "5000", 1); /* no wait should expire */
  /* busy_sms: a hang ends before the holder's 30 s */
  if (!strcmp(scenario, "busy_sms")) setenv("NCCL_MK_TIMEOUT_MS", "10000", 1);
}

static void moe_config(const char* scenario, ncclMkConfig* cfg) {
  cfg->moe_max_tokens = MAX_TOKENS, cfg->moe_max_hidden = MAX_HIDDEN, cfg->moe_max_topk = MAX_TOPK;
  cfg->moe_dispatch_fp8 = !strcmp(scenario, "fp8");
  if (!strcmp(scenario, "recv_overflow")) cfg->moe_max_recv_rows = 16;
}

static int moe_run(const char* scenario, int rank, ncclComm_t comm, cudaStream_t stream) {
  struct rank_env e = {rank, comm, stream, NULL, 0, !strcmp(scenario, "fp8"), 0};
  NCCL_OK(ncclMkMoeLayoutCreate(e.comm, &e.layout));
  run_scenario(&e, scenario);
  NCCL_OK(ncclMkMoeLayoutDestroy(e.layout));
  return e.failures;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s <correctness|fp8|graph|empty_rank_tokens|bad_input|negative_control|"
            "dead_peer|late_peer|late_peer_combine|recv_overflow|peer_dies_mid_call|peer_writes|busy_sms|"
            "with_dense_ops>\n", argv[0]);
    return 2;
  }
  NR = test_ranks();
  static const char* const two_rank_only[] = {"dead_peer", NULL};
  const struct rank_harness h = {NR, moe_scenario_env, moe_config, two_rank_only, moe_run, NULL};
  return rank_harness_main(argc, argv, &h);
}
