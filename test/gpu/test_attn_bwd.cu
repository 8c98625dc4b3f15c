/*
 * The backward attention core (fused/common/attn.h mk_attn_bwd_launch) on one GPU against the
 * float64 reference backward of attn_check.cuh. One binary, one behaviour per argv[1] (`all`
 * runs every one); exit 77 without a Hopper GPU.
 *   backward: small shapes (S = 1, 100, 128, 300, 1024; H = H_kv and GQA 8:1; D = 64, 128;
 *     causal and not): out and lse from the forward core, then dq, dk, dv (poisoned first),
 *     every element checked against ref_attn_bwd_f64.
 *   offsets: one rank of a 2-rank ring emulated, as the ring backward will call the core: per
 *     local half of its queries (zigzag chunks r and 3-r of 4 when causal: q positions are not
 *     row indices), two calls (ring steps), each with the two KV chunks of one rank as two
 *     blocks at their global positions (rows [kh * chunk, +chunk) of the rank's tensors): the
 *     second call adds to the first's dq_acc (dq_accumulate, delta_ready) and writes dq; dk, dv
 *     add into fp32 dk_acc / dv_acc per source rank over every call of both ranks. dq of each
 *     rank's rows and dk, dv of each rank's rows must equal the reference's.
 *   split (and every GQA shape of `backward` a second time): a CTA per query head, the group's
 *     dK, dV partials added in fp32 through the dkv_ws workspace or straight into accumulators;
 *     each kind of output (bf16; accumulators added to or stored) correct, and behind a closed
 *     accumulator gate the accumulators untouched.
 *   negative_control: one element of dk moved (the checker must reject it), and a backward run
 *     with every lse + 1 (P off by a factor e: must be rejected).
 *   ready_flags: a KV block whose rows arrive during the call (mk_attn_bwd_kv_block.ready_flags,
 *     128-row chunks, call number *ready_done + 1): flags already up, correct; flags raised
 *     20 ms after the launch by a kernel on another stream, correct and the call took >= 15 ms
 *     (its CTAs waited); one chunk's flag never raised, the call ends (no hang) with the error
 *     record naming that chunk's flag and the call number; the refused argument sets.
 *   addends: fp32 partials of another call (a ring peer's) added to a block's bf16 dk, dv:
 *     ready already, ready 20 ms late (the CTAs waited), never ready (the error record names
 *     the addend's flag; no hang); the refused argument sets.
 *   pdl: the main kernel launched as a programmatic dependent starts while the kernel before
 *     it still runs (that kernel waits for the call's CTAs to touch dq_acc before it raises the
 *     flags they need; without pdl, the control, it gives up), also captured in a CUDA graph;
 *     correct gradients every time.
 *   one_launch: the call with phase words (mk_attn_bwd_args.phase_words) is one kernel in a
 *     CUDA graph (without them, the control, 3 to 5), its replays give the gradients and leave
 *     the words zero, and it finishes correct while another kernel holds three quarters of
 *     the SMs; split GQA (dkv_ws zeroed and written out inside), D = 64, causal and not.
 *     MK_ATTN_ONE_LAUNCH=1 runs every other behaviour's calls as one launch too (the words
 *     zero after each, a call that timed out included).
 *   bad_input: refused with -EINVAL, outputs untouched.
 * Checker (host, float64): ||x - ref|| <= 2e-2 ||ref|| + 3e-3 sqrt(n), every element
 * |x - ref| <= 2e-2 (|ref| + rms(ref)) + 3e-3 + 2^-8 mag, nothing non-finite (the poison never
 * passes). The reference takes delta from its out rounded to bf16, as the kernel gets it
 * (ATTN_REF_DELTA_STORED_OUT). mag: the sum of the magnitudes of the element's terms
 * (attn_ref_mag): the kernel rounds P and dS to bf16 for its matrix products, which moves an
 * element by up to 2^-8 of that however much the terms cancel (measured on an H200: up to
 * 2.2x the other bound at the keys and queries of few partners, without it).
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <vector>
#include "attn.h"
#include "attn_check.cuh"
#include "attn_run.h"
#include "expect.h"
#include "gemm.h"
#include "graph_kernels.cuh"
#include "late_raise.cuh"
#include "sm_hold.cuh"


struct bwd_bufs {
  int batch, seq, heads, kv_heads, d, causal;
  size_t nq, nkv, nl;
  void *q, *k, *v, *dout, *out, *dq, *dk, *dv;
  float *lse, *delta, *dq_acc;
  double *ref_dq, *ref_dk, *ref_dv;
  struct attn_ref_mag mag; /* the reference's term magnitudes, for the element bound */
  struct mk_gemm_error* err;
};

static void check_err(struct mk_gemm_error* err, const char* what) {
  struct mk_gemm_error e;
  CUDA_OK(cudaMemcpy(&e, err, sizeof e, cudaMemcpyDeviceToHost));
  EXPECT(!e.aborted, "%s: a wait timed out: tile %u barrier %u parity %llu", what, e.tile, e.flag_index,
         (unsigned long long)e.expected);
}

/* The forward core's out and lse for the whole sequence (test_attn checks it). */
static void forward(const void* q, const void* k, const void* v, void* out, float* lse, int batch, int seq, int heads,
                    int kv_heads, int d, int causal, struct mk_gemm_error* err) {
  struct mk_attn_args a = attn_whole_fwd_args(q, k, v, out, lse, batch, seq, seq, heads, kv_heads, d, causal);
  a.err = err;
  a.timeout_ms = 5000;
  const int rc = mk_attn_fwd_launch(&a, 0);
  EXPECT(rc == 0, "mk_attn_fwd_launch returned %d", rc);
  CUDA_OK(cudaDeviceSynchronize());
  check_err(err, "forward");
}

static void bufs_alloc(struct bwd_bufs* t, int batch, int seq, int heads, int kv_heads, int d, int causal,
                       uint64_t seed) {
  t->batch = batch, t->seq = seq, t->heads = heads, t->kv_heads = kv_heads, t->d = d, t->causal = causal;
  t->nq = (size_t)batch * seq * heads * d, t->nkv = (size_t)batch * seq * kv_heads * d;
  t->nl = (size_t)batch * heads * seq;
  CUDA_OK(cudaMalloc(&t->q, t->nq * 2));
  CUDA_OK(cudaMalloc(&t->dout, t->nq * 2));
  CUDA_OK(cudaMalloc(&t->out, t->nq * 2));
  CUDA_OK(cudaMalloc(&t->dq, t->nq * 2));
  CUDA_OK(cudaMalloc(&t->k, t->nkv * 2));
  CUDA_OK(cudaMalloc(&t->v, t->nkv * 2));
  CUDA_OK(cudaMalloc(&t->dk, t->nkv * 2));
  CUDA_OK(cudaMalloc(&t->dv, t->nkv * 2));
  CUDA_OK(cudaMalloc(&t->lse, t->nl * 4));
  CUDA_OK(cudaMalloc(&t->delta, t->nl * 4));
  CUDA_OK(cudaMalloc(&t->dq_acc, t->nq * 4));
  CUDA_OK(cudaMalloc(&t->ref_dq, t->nq * 8));
  CUDA_OK(cudaMalloc(&t->ref_dk, t->nkv * 8));
  CUDA_OK(cudaMalloc(&t->ref_dv, t->nkv * 8));
  CUDA_OK(cudaMalloc(&t->mag.dq, t->nq * 8));
  CUDA_OK(cudaMalloc(&t->mag.dk, t->nkv * 8));
  CUDA_OK(cudaMalloc(&t->mag.dv, t->nkv * 8));
  CUDA_OK(cudaMalloc(&t->err, sizeof(struct mk_gemm_error)));
  memset_now(t->err, 0, sizeof(struct mk_gemm_error));
  fill_random_bf16(t->q, t->nq, seed, 2.0f);
  fill_random_bf16(t->k, t->nkv, seed + 1, 2.0f);
  fill_random_bf16(t->v, t->nkv, seed + 2, 1.0f);
  fill_random_bf16(t->dout, t->nq, seed + 3, 1.0f);
  poison(t->dq, t->nq * 2);
  poison(t->dk, t->nkv * 2);
  poison(t->dv, t->nkv * 2);
  poison(t->delta, t->nl * 4);
  poison(t->dq_acc, t->nq * 4);
  forward(t->q, t->k, t->v, t->out, t->lse, batch, seq, heads, kv_heads, d, causal, t->err);
  ref_attn_bwd_f64(t->q, t->k, t->v, t->dout, t->ref_dq, t->ref_dk, t->ref_dv, batch, seq, heads, kv_heads, d,
                   causal, ATTN_REF_DELTA_STORED_OUT, &t->mag);
}

static void bufs_free(struct bwd_bufs* t) {
  cudaFree(t->q), cudaFree(t->dout), cudaFree(t->out), cudaFree(t->dq), cudaFree(t->k), cudaFree(t->v);
  cudaFree(t->dk), cudaFree(t->dv), cudaFree(t->lse), cudaFree(t->delta), cudaFree(t->dq_acc);
  cudaFree(t->ref_dq), cudaFree(t->ref_dk), cudaFree(t->ref_dv), cudaFree(t->err);
  cudaFree(t->mag.dq), cudaFree(t->mag.dk), cudaFree(t->mag.dv);
}

static struct mk_attn_bwd_args whole_args(const struct bwd_bufs* t) {
  struct mk_attn_bwd_args a = attn_whole_bwd_args(t->q, t->k, t->v, t->out, t->lse, t->dout, t->dq, t->dk, t->dv,
                                                  t->delta, t->dq_acc, t->batch, t->seq, t->seq, t->heads, t->kv_heads,
                                                  t->d, t->causal);
  a.err = t->err;
  a.timeout_ms = 5000;
  return a;
}

/* MK_ATTN_VARIANT (attn.h mk_attn_bwd_launch_variant; default 0) picks the compiled variant. */
static int variant;

/* MK_ATTN_ONE_LAUNCH=1: every call that run_bwd and expect_timeout_named make is one launch
 * (mk_attn_bwd_args.phase_words, these words) and must leave the words zero. */
static int one_launch;
static uint64_t* g_phase_words;

static uint64_t* phase_words(void) {
  if (!g_phase_words) {
    CUDA_OK(cudaMalloc(&g_phase_words, MK_ATTN_BWD_PHASE_WORDS * sizeof(uint64_t)));
    CUDA_OK(cudaMemset(g_phase_words, 0, MK_ATTN_BWD_PHASE_WORDS * sizeof(uint64_t)));
  }
  return g_phase_words;
}

/* After a one-launch call (synchronized): its words back at zero, for the next call. */
static int phase_words_zero(const uint64_t* words, const char* what) {
  uint64_t h[MK_ATTN_BWD_PHASE_WORDS];
  CUDA_OK(cudaMemcpy(h, words, sizeof h, cudaMemcpyDeviceToHost));
  int zero = 1;
  char left[MK_ATTN_BWD_PHASE_WORDS * 22] = "";
  for (int i = 0, at = 0; i < MK_ATTN_BWD_PHASE_WORDS; i++) {
    zero &= h[i] == 0;
    at += snprintf(left + at, sizeof left - at, " %llu", (unsigned long long)h[i]);
  }
  EXPECT(zero, "%s: phase words left at%s", what, left);
  return zero;
}

static struct mk_attn_bwd_args with_one_launch(const struct mk_attn_bwd_args* a) {
  struct mk_attn_bwd_args b = *a;
  if (one_launch && !b.phase_words) b.phase_words = phase_words();
  return b;
}

static int run_bwd(const struct mk_attn_bwd_args* a0) {
  const struct mk_attn_bwd_args b = with_one_launch(a0), *a = &b;
  const int rc = mk_attn_bwd_launch_variant(a, 0, variant);
  EXPECT(rc == 0, "mk_attn_bwd_launch returned %d", rc);
  CUDA_OK(cudaDeviceSynchronize());
  struct mk_gemm_error e;
  CUDA_OK(cudaMemcpy(&e, a->err, sizeof e, cudaMemcpyDeviceToHost));
  EXPECT(!e.aborted, "a wait timed out: tile %u barrier %u parity %llu", e.tile, e.flag_index,
         (unsigned long long)e.expected);
  if (a->phase_words && !phase_words_zero(a->phase_words, "after a call")) return 0;
  return rc == 0 && !e.aborted;
}

static int check_all(const char* what, const struct bwd_bufs* t) {
  char w[200];
  int ok = 1;
  snprintf(w, sizeof w, "%s dq", what);
  ok &= attn_grad_check(w, (const __nv_bfloat16*)t->dq, t->ref_dq, t->mag.dq, t->nq);
  snprintf(w, sizeof w, "%s dk", what);
  ok &= attn_grad_check(w, (const __nv_bfloat16*)t->dk, t->ref_dk, t->mag.dk, t->nkv);
  snprintf(w, sizeof w, "%s dv", what);
  ok &= attn_grad_check(w, (const __nv_bfloat16*)t->dv, t->ref_dv, t->mag.dv, t->nkv);
  return ok;
}

/* A case's name: its shape, its mask, and whether a CTA takes one query head (split). */
static void case_name(char* what, size_t n, const struct bwd_bufs* t, int split) {
  snprintf(what, n, "B=%d S=%4d H=%d H_kv=%d D=%3d %s%s", t->batch, t->seq, t->heads, t->kv_heads, t->d,
           t->causal ? "causal" : "non-causal", split ? " split" : "");
}

/* Grouped-query heads at D = 128 run twice: a CTA per kv head's group (no workspace), then a
 * CTA per query head (split) with the dkv_ws workspace, outputs poisoned between. */
static void backward_case(int batch, int seq, int heads, int kv_heads, int d, int causal, uint64_t seed) {
  struct bwd_bufs t;
  bufs_alloc(&t, batch, seq, heads, kv_heads, d, causal, seed);
  struct mk_attn_bwd_args a = whole_args(&t);
  const size_t ws_floats = mk_attn_bwd_dkv_ws_floats(&a);
  EXPECT((ws_floats > 0) == (heads > kv_heads && d == 128), "workspace of %zu floats at H=%d H_kv=%d D=%d", ws_floats,
         heads, kv_heads, d);
  for (int split = 0; split <= (ws_floats > 0); split++) {
    char what[128];
    case_name(what, sizeof what, &t, split);
    if (split) {
      CUDA_OK(cudaMalloc(&a.dkv_ws, ws_floats * 4));
      poison(a.dkv_ws, ws_floats * 4); /* the core zeroes it */
      poison(t.dq, t.nq * 2), poison(t.dk, t.nkv * 2), poison(t.dv, t.nkv * 2);
    }
    if (run_bwd(&a)) EXPECT(check_all(what, &t), "%s: dq, dk or dv wrong", what);
  }
  cudaFree(a.dkv_ws);
  bufs_free(&t);
}

static void test_backward(void) { attn_small_shape_sweep(backward_case); }

/* One emulated rank of `offsets`: its rows of the whole problem's inputs, and its outputs. */
struct offsets_rank {
  void *q, *out, *dout, *k, *v, *dq;
  float *lse, *delta, *dq_acc, *dk_acc, *dv_acc;
};

static void offsets_rank_alloc(struct offsets_rank* o, const struct bwd_bufs* t, int r, int n) {
  const size_t nq_l = t->nq / n, nkv_l = t->nkv / n, nl_l = t->nl / n;
  const long qw = (long)t->heads * t->d, kw = (long)t->kv_heads * t->d;
  const int zz = t->causal;
  CUDA_OK(cudaMalloc(&o->q, nq_l * 2));
  CUDA_OK(cudaMalloc(&o->out, nq_l * 2));
  CUDA_OK(cudaMalloc(&o->dout, nq_l * 2));
  CUDA_OK(cudaMalloc(&o->dq, nq_l * 2));
  CUDA_OK(cudaMalloc(&o->k, nkv_l * 2));
  CUDA_OK(cudaMalloc(&o->v, nkv_l * 2));
  CUDA_OK(cudaMalloc(&o->lse, nl_l * 4));
  CUDA_OK(cudaMalloc(&o->delta, nl_l * 4));
  CUDA_OK(cudaMalloc(&o->dq_acc, nq_l * 4));
  CUDA_OK(cudaMalloc(&o->dk_acc, nkv_l * 4));
  CUDA_OK(cudaMalloc(&o->dv_acc, nkv_l * 4));
  attn_take_rank_rows((const __nv_bfloat16*)t->q, (__nv_bfloat16*)o->q, t->batch, t->seq, qw, r, n, zz);
  attn_take_rank_rows((const __nv_bfloat16*)t->out, (__nv_bfloat16*)o->out, t->batch, t->seq, qw, r, n, zz);
  attn_take_rank_rows((const __nv_bfloat16*)t->dout, (__nv_bfloat16*)o->dout, t->batch, t->seq, qw, r, n, zz);
  attn_take_rank_rows((const __nv_bfloat16*)t->k, (__nv_bfloat16*)o->k, t->batch, t->seq, kw, r, n, zz);
  attn_take_rank_rows((const __nv_bfloat16*)t->v, (__nv_bfloat16*)o->v, t->batch, t->seq, kw, r, n, zz);
  attn_take_rank_lse(t->lse, o->lse, t->batch, t->heads, t->seq, r, n, zz);
  poison(o->dq, nq_l * 2);
  poison(o->delta, nl_l * 4);
  poison(o->dq_acc, nq_l * 4);
  memset_now(o->dk_acc, 0, nkv_l * 4);
  memset_now(o->dv_acc, 0, nkv_l * 4);
}

static void offsets_rank_free(struct offsets_rank* o) {
  cudaFree(o->q), cudaFree(o->out), cudaFree(o->dout), cudaFree(o->dq), cudaFree(o->k), cudaFree(o->v);
  cudaFree(o->lse), cudaFree(o->delta), cudaFree(o->dq_acc), cudaFree(o->dk_acc), cudaFree(o->dv_acc);
}

/* Rank r's call for its query half qh at ring step `step`: the source rank's two KV chunks as
 * two blocks at their global positions. */
static struct mk_attn_bwd_args offsets_step_args(const struct bwd_bufs* t, const struct offsets_rank* rk, int r,
                                                 int n, int chunk, int qh, int step) {
  const int src = mk_ra_kv_source(r, n, step), s_local = t->seq / n, zz = t->causal;
  const struct offsets_rank* o = &rk[r];
  struct mk_attn_bwd_args a;
  memset(&a, 0, sizeof a);
  a.q = o->q, a.out = o->out, a.dout = o->dout, a.lse = o->lse, a.delta = o->delta, a.dq_acc = o->dq_acc;
  a.dq = step == n - 1 ? o->dq : NULL;
  a.batch = t->batch, a.seq_q = s_local, a.heads = t->heads, a.kv_heads = t->kv_heads, a.d_head = t->d;
  a.causal = t->causal;
  a.q_row0 = qh * chunk, a.q_rows = chunk;
  a.q_pos0 = attn_global_row(r, n, s_local, qh * chunk, zz);
  a.dq_accumulate = a.delta_ready = step > 0;
  a.num_kv_blocks = 2;
  for (int kh = 0; kh < 2; kh++) {
    struct mk_attn_bwd_kv_block* b = &a.kv[kh];
    b->k = rk[src].k, b->v = rk[src].v, b->seq = s_local;
    b->dk_acc = rk[src].dk_acc, b->dv_acc = rk[src].dv_acc;
    b->row0 = kh * chunk, b->rows = chunk;
    b->pos0 = attn_global_row(src, n, s_local, kh * chunk, zz);
  }
  a.err = t->err;
  a.timeout_ms = 5000;
  return a;
}

/* Rank r's dq and its dk_acc, dv_acc against the reference's rows of that rank; ref_l and mag_l
 * hold a rank's rows of the larger of q and kv. */
static void offsets_check_rank(const struct bwd_bufs* t, const struct offsets_rank* o, int r, int n, int chunk,
                               double* ref_l, double* mag_l) {
  const size_t nq_l = t->nq / n, nkv_l = t->nkv / n;
  const long qw = (long)t->heads * t->d, kw = (long)t->kv_heads * t->d;
  const int zz = t->causal;
  char what[160], w[200];
  snprintf(what, sizeof what, "rank %d/2 B=%d chunk=%3d H=%d H_kv=%d D=%3d %s", r, t->batch, chunk, t->heads,
           t->kv_heads, t->d, t->causal ? "causal zigzag" : "non-causal");
  attn_take_rank_rows(t->ref_dq, ref_l, t->batch, t->seq, qw, r, n, zz);
  attn_take_rank_rows(t->mag.dq, mag_l, t->batch, t->seq, qw, r, n, zz);
  snprintf(w, sizeof w, "%s dq", what);
  EXPECT(attn_grad_check(w, (const __nv_bfloat16*)o->dq, ref_l, mag_l, nq_l), "%s", w);
  attn_take_rank_rows(t->ref_dk, ref_l, t->batch, t->seq, kw, r, n, zz);
  attn_take_rank_rows(t->mag.dk, mag_l, t->batch, t->seq, kw, r, n, zz);
  snprintf(w, sizeof w, "%s dk_acc", what);
  EXPECT(attn_grad_check(w, o->dk_acc, ref_l, mag_l, nkv_l), "%s", w);
  attn_take_rank_rows(t->ref_dv, ref_l, t->batch, t->seq, kw, r, n, zz);
  attn_take_rank_rows(t->mag.dv, mag_l, t->batch, t->seq, kw, r, n, zz);
  snprintf(w, sizeof w, "%s dv_acc", what);
  EXPECT(attn_grad_check(w, o->dv_acc, ref_l, mag_l, nkv_l), "%s", w);
}

/* See the top: a 2-rank ring's calls, emulated on one GPU. */
static void offsets_case(int batch, int chunk, int heads, int kv_heads, int d, int causal, uint64_t seed) {
  enum { n = 2 };
  const int seq = 2 * n * chunk;
  struct bwd_bufs t;
  bufs_alloc(&t, batch, seq, heads, kv_heads, d, causal, seed);
  struct offsets_rank rk[n];
  for (int r = 0; r < n; r++) offsets_rank_alloc(&rk[r], &t, r, n);
  const size_t most = t.nq > t.nkv ? t.nq / n : t.nkv / n;
  double *ref_l, *mag_l;
  CUDA_OK(cudaMalloc(&ref_l, most * 8));
  CUDA_OK(cudaMalloc(&mag_l, most * 8));
  int ok = 1;
  for (int r = 0; r < n; r++)
    for (int qh = 0; qh < 2; qh++)
      for (int step = 0; step < n; step++) {
        struct mk_attn_bwd_args a = offsets_step_args(&t, rk, r, n, chunk, qh, step);
        ok &= run_bwd(&a);
      }
  for (int r = 0; ok && r < n; r++) offsets_check_rank(&t, &rk[r], r, n, chunk, ref_l, mag_l);
  for (int r = 0; r < n; r++) offsets_rank_free(&rk[r]);
  cudaFree(ref_l), cudaFree(mag_l);
  bufs_free(&t);
}

static void test_offsets(void) {
  const uint64_t seed = (uint64_t)time(NULL) + 7;
  printf("  seed %016llx\n", (unsigned long long)seed);
  const int chunks[] = {64, 100, 128, 300};
  int i = 0;
  for (int causal = 1; causal >= 0; causal--)
    for (int c = 0; c < 4; c++) {
      offsets_case(2, chunks[c], 8, 1, 128, causal, seed + 10 * i++);
      offsets_case(1, chunks[c], 4, 4, 64, causal, seed + 10 * i++);
    }
}

static __global__ void add_f32(float* p, size_t n, float x) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += x;
}

static void test_negative_control(void) {
  struct bwd_bufs t;
  bufs_alloc(&t, 2, 300, 8, 1, 128, 1, 0x5eed);
  const struct mk_attn_bwd_args a = whole_args(&t);
  if (!run_bwd(&a)) return;
  EXPECT(check_all("correct gradients", &t), "the correct gradients must pass");
  const size_t at = t.nkv / 2 + 77;
  nudge((__nv_bfloat16*)t.dk, at, 0.25);
  EXPECT(!attn_grad_check("dk[n/2 + 77] + 0.25", (const __nv_bfloat16*)t.dk, t.ref_dk, t.mag.dk, t.nkv),
         "one element of dk off by 0.25 passed");
  add_f32<<<256, 256>>>(t.lse, t.nl, 1.0f);
  CUDA_OK(cudaGetLastError());
  poison(t.dq, t.nq * 2), poison(t.dk, t.nkv * 2), poison(t.dv, t.nkv * 2);
  if (run_bwd(&a)) EXPECT(!check_all("backward with lse + 1", &t), "a backward with lse + 1 passed");
  bufs_free(&t);
}

/* Split (a CTA per query head, GQA 8:1) with each kind of output: bf16 dk, dv with fp32
 * accumulators added to (prefilled with 1) through the workspace; accumulators stored
 * (acc_overwrite, poisoned before) through the workspace; accumulators only, added to directly
 * (no workspace); then with the accumulator gate closed, bf16 outputs written and the
 * accumulators untouched, through the workspace and directly. */
static void split_case(int d, int causal, uint64_t seed) {
  struct bwd_bufs t;
  bufs_alloc(&t, 2, 300, 8, 1, d, causal, seed);
  float *dk_acc, *dv_acc, *ws;
  uint64_t* gate;
  CUDA_OK(cudaMalloc(&dk_acc, t.nkv * 4));
  CUDA_OK(cudaMalloc(&dv_acc, t.nkv * 4));
  CUDA_OK(cudaMalloc(&gate, 8));
  memset_now(gate, 0, 8);
  struct mk_attn_bwd_args a = whole_args(&t);
  a.kv[0].dk_acc = dk_acc, a.kv[0].dv_acc = dv_acc, a.acc_gate = gate;
  CUDA_OK(cudaMalloc(&ws, mk_attn_bwd_dkv_ws_floats(&a) * 4));
  a.dkv_ws = ws;
  static const char* const modes[5] = {"bf16 + acc added", "acc stored", "acc added directly",
                                       "gate closed, workspace", "gate closed, direct"};
  char what[128], w[160];
  for (int mode = 0; mode < 5; mode++) {
    const int overwrite = mode == 1, direct = mode == 2 || mode == 4, closed = mode >= 3;
    snprintf(what, sizeof what, "split D=%d %s: %s", d, causal ? "causal" : "non-causal", modes[mode]);
    a.kv[0].dk = direct ? NULL : t.dk, a.kv[0].dv = direct ? NULL : t.dv, a.kv[0].acc_overwrite = overwrite;
    a.dkv_ws = direct ? NULL : ws;
    EXPECT(mk_attn_bwd_dkv_ws_floats(&a) == (direct ? 0u : 2 * t.nkv), "%s: workspace size", what);
    poison(t.dq, t.nq * 2), poison(t.dk, t.nkv * 2), poison(t.dv, t.nkv * 2);
    for (float* acc : {dk_acc, dv_acc}) {
      if (overwrite) {
        poison(acc, t.nkv * 4);
        continue;
      }
      memset_now(acc, 0, t.nkv * 4);
      add_f32<<<256, 256>>>(acc, t.nkv, 1.f);
    }
    const uint64_t g = closed ? MK_ATTN_ACC_GATE_CLOSED | 5 : 0;
    CUDA_OK(cudaMemcpy(gate, &g, 8, cudaMemcpyHostToDevice));
    if (!run_bwd(&a)) continue;
    if (!direct) EXPECT(check_all(what, &t), "%s: dq, bf16 dk or dv wrong", what);
    snprintf(w, sizeof w, "%s dq", what);
    if (direct) EXPECT(attn_grad_check(w, (const __nv_bfloat16*)t.dq, t.ref_dq, t.mag.dq, t.nq), "%s", w);
    if (closed) { /* the accumulators still hold 1 everywhere */
      std::vector<float> h(t.nkv);
      for (float* acc : {dk_acc, dv_acc}) {
        CUDA_OK(cudaMemcpy(h.data(), acc, t.nkv * 4, cudaMemcpyDeviceToHost));
        size_t moved = 0;
        for (float x : h) moved += x != 1.f;
        EXPECT(moved == 0, "%s: %zu accumulator elements written behind the closed gate", what, moved);
      }
      continue;
    }
    if (!overwrite)
      for (float* acc : {dk_acc, dv_acc}) add_f32<<<256, 256>>>(acc, t.nkv, -1.f);
    snprintf(w, sizeof w, "%s dk_acc", what);
    EXPECT(attn_grad_check(w, dk_acc, t.ref_dk, t.mag.dk, t.nkv), "%s", w);
    snprintf(w, sizeof w, "%s dv_acc", what);
    EXPECT(attn_grad_check(w, dv_acc, t.ref_dv, t.mag.dv, t.nkv), "%s", w);
  }
  cudaFree(dk_acc), cudaFree(dv_acc), cudaFree(ws), cudaFree(gate);
  bufs_free(&t);
}

static void test_split(void) {
  const uint64_t seed = (uint64_t)time(NULL) + 11;
  printf("  seed %016llx\n", (unsigned long long)seed);
  for (int causal = 0; causal < 2; causal++) split_case(128, causal, seed + 10 * causal); /* D = 128 only */
}

/* A launch whose wait for flag `flag` of call `call` cannot succeed (it holds call - 1): it
 * returns (every wait is bounded) with the error record naming that flag and call. */
static void expect_timeout_named(const struct mk_attn_bwd_args* a0, const char* what, uint32_t flag, uint64_t call) {
  const struct mk_attn_bwd_args b = with_one_launch(a0), *a = &b;
  const int rc = mk_attn_bwd_launch_variant(a, 0, variant);
  EXPECT(rc == 0, "%s: launch returned %d", what, rc);
  CUDA_OK(cudaDeviceSynchronize());
  struct mk_gemm_error e;
  CUDA_OK(cudaMemcpy(&e, a->err, sizeof e, cudaMemcpyDeviceToHost));
  printf("  %s: aborted %u, flag %u, expected %llu, seen %llu\n", what, e.aborted, e.flag_index,
         (unsigned long long)e.expected, (unsigned long long)e.seen);
  EXPECT(e.aborted && e.flag_index == flag && e.expected == call && e.seen == call - 1,
         "%s: the error record does not name flag %u of call %llu", what, flag, (unsigned long long)call);
  if (a->phase_words) phase_words_zero(a->phase_words, what); /* a call that gave up too */
}

static void test_ready_flags(void) {
  struct bwd_bufs t;
  bufs_alloc(&t, 2, 300, 8, 2, 128, 1, 0xf1a9);
  const int chunks = 2 * 3; /* 2 batches x ceil(300 / 128) */
  uint64_t *flags, *done;
  CUDA_OK(cudaMalloc(&flags, chunks * sizeof(uint64_t)));
  CUDA_OK(cudaMalloc(&done, sizeof(uint64_t)));
  set_words(done, 1, 6); /* this call is number 7 */
  struct mk_attn_bwd_args a = whole_args(&t);
  a.kv[0].ready_flags = flags, a.kv[0].ready_chunk_rows = 128, a.ready_done = done;

  set_words(flags, chunks, 7);
  if (run_bwd(&a)) EXPECT(check_all("flags already up", &t), "wrong gradients with every flag up");

  set_words(flags, chunks, 6); /* the previous call's: not enough */
  poison(t.dq, t.nq * 2), poison(t.dk, t.nkv * 2), poison(t.dv, t.nkv * 2);
  int ran = 0;
  const float ms = time_beside_late_raise(flags, chunks, 7, 20000000ull, [&] { return run_bwd(&a); }, &ran);
  printf("  flags raised 20 ms late: the call took %.1f ms\n", ms);
  EXPECT(ms >= 15.f, "the call took %.1f ms: its CTAs did not wait for the flags", ms);
  if (ran) EXPECT(check_all("flags raised late", &t), "wrong gradients with the flags raised late");

  set_words(flags, chunks, 7);
  set_words(flags + 5, 1, 6); /* batch 1, rows 256..299: never raised */
  a.timeout_ms = 300;
  expect_timeout_named(&a, "a missing flag", 5, 7);

  struct mk_attn_bwd_args b = a;
  b.ready_done = NULL;
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "ready_flags without ready_done accepted");
  b = a, b.kv[0].ready_chunk_rows = 0;
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "ready_chunk_rows 0 accepted");
  cudaFree(flags), cudaFree(done);
  bufs_free(&t);
}

/* fp32 values in [-scale, scale) from a hash of the index. */
static __global__ void fill_hash_f32(float* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
    x ^= x >> 29, x *= 0xbf58476d1ce4e5b9ull, x ^= x >> 32;
    p[i] = ((float)(x & 0xffff) / 32768.f - 1.f) * scale;
  }
}

/* ref[i] += sign * a[i]. */
static __global__ void add_into_ref(double* ref, const float* a, size_t n, double sign) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    ref[i] += sign * (double)a[i];
}

/* Two addends (fp32 partials as a peer would leave them) on the block's bf16 dk, dv: their ready
 * words already at the call number, then one raised 20 ms late (the CTAs wait), then one never
 * raised (a bounded wait, the error record naming that addend's flag), and the refused sets. */
static void test_addends(void) {
  struct bwd_bufs t;
  bufs_alloc(&t, 2, 300, 8, 2, 128, 0, 0xadd5);
  float* part[4]; /* addend i: part[2i] (dk), part[2i + 1] (dv) */
  for (int i = 0; i < 4; i++) {
    CUDA_OK(cudaMalloc(&part[i], t.nkv * 4));
    fill_hash_f32<<<256, 256>>>(part[i], t.nkv, 0x5eed + i, 0.5f);
  }
  uint64_t *ready, *done;
  CUDA_OK(cudaMalloc(&ready, 2 * sizeof(uint64_t)));
  CUDA_OK(cudaMalloc(&done, sizeof(uint64_t)));
  set_words(done, 1, 6); /* this call is number 7 */
  struct mk_attn_bwd_args a = whole_args(&t);
  a.ready_done = done;
  a.addends.n = 2, a.addends.block = 0, a.addends.flag_index0 = 40;
  for (int i = 0; i < 2; i++) a.addends.dk[i] = part[2 * i], a.addends.dv[i] = part[2 * i + 1], a.addends.ready[i] = ready + i;
  for (int i = 0; i < 2; i++) { /* the reference with the addends in it */
    add_into_ref<<<256, 256>>>(t.ref_dk, part[2 * i], t.nkv, 1.0);
    add_into_ref<<<256, 256>>>(t.ref_dv, part[2 * i + 1], t.nkv, 1.0);
  }
  set_words(ready, 2, 7);
  if (run_bwd(&a)) EXPECT(check_all("addends ready", &t), "wrong dk, dv with the addends ready");

  set_words(ready + 1, 1, 6); /* the previous call's */
  poison(t.dq, t.nq * 2), poison(t.dk, t.nkv * 2), poison(t.dv, t.nkv * 2);
  int ran = 0;
  const float ms = time_beside_late_raise(ready + 1, 1, 7, 20000000ull, [&] { return run_bwd(&a); }, &ran);
  printf("  an addend ready 20 ms late: the call took %.1f ms\n", ms);
  EXPECT(ms >= 15.f, "the call took %.1f ms: its CTAs did not wait for the addend", ms);
  if (ran) EXPECT(check_all("an addend ready late", &t), "wrong dk, dv with an addend ready late");

  set_words(ready + 1, 1, 6); /* never raised */
  a.timeout_ms = 300;
  expect_timeout_named(&a, "a missing addend", 41, 7);

  struct mk_attn_bwd_args b = a;
  b.addends.n = MK_ATTN_MAX_ADDENDS + 1;
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "%d addends accepted", b.addends.n);
  b = a, b.addends.block = 1;
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "addends on a block the call does not have accepted");
  b = a, b.kv[0].dk_acc = part[0], b.kv[0].dv_acc = part[1];
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "addends on a block with accumulators accepted");
  b = a, b.ready_done = NULL;
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "addends without ready_done accepted");
  b = a, b.addends.ready[1] = NULL;
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "an addend without a ready word accepted");
  b = a, b.dkv_ws = part[2];
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "addends with dkv_ws accepted");
  for (int i = 0; i < 4; i++) cudaFree(part[i]);
  cudaFree(ready), cudaFree(done);
  bufs_free(&t);
}

/* The kernel before a pdl call: lets its dependents launch, then waits (bounded, 2 s) until
 * *watch (an element of dq_acc) is no longer 0, which only the call's CTAs can do, then raises
 * the flags the call waits for. *waited_out = 1 when it had to give up. */
static __global__ void pdl_gate_kernel(const float* watch, uint64_t* flags, int count, uint64_t value,
                                       int* waited_out) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const uint64_t t0 = globaltimer_ns();
  while (*(volatile const float*)watch == 0.f)
    if (globaltimer_ns() - t0 > 2000000000ull) {
      *waited_out = 1;
      break;
    }
  fence_acq_rel_sys();
  for (int i = 0; i < count; i++) st_release_sys_u64(flags + i, value);
}

/* pdl: the main kernel starts while the kernel before it on the stream still runs. That kernel
 * (pdl_gate_kernel) raises the block's ready flags only once the call's CTAs have added into
 * dq_acc (from the one chunk raised before): with pdl = 1 it sees that at once; with pdl = 0
 * (the control) the call waits for it to end, and it gives up after 2 s. */
static void test_pdl(void) {
  struct bwd_bufs t;
  bufs_alloc(&t, 2, 300, 8, 2, 128, 0, 0x9d1);
  const int chunks = 2 * 3; /* 2 batches x ceil(300 / 128) */
  uint64_t *flags, *done;
  int* waited_out;
  CUDA_OK(cudaMalloc(&flags, chunks * sizeof(uint64_t)));
  CUDA_OK(cudaMalloc(&done, sizeof(uint64_t)));
  CUDA_OK(cudaMalloc(&waited_out, sizeof(int)));
  set_words(done, 1, 2); /* call 3 */
  struct mk_attn_bwd_args a = whole_args(&t);
  a.kv[0].ready_flags = flags, a.kv[0].ready_chunk_rows = 128, a.ready_done = done;
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int run = 0; run < 3; run++) { /* pdl, pdl in a CUDA graph, no pdl (the control) */
    const int pdl = run < 2, graph = run == 1;
    set_words(flags, chunks, 2);
    set_words(flags, 1, 3); /* batch 0's first 128 keys: the CTAs that wake the gate */
    memset_now(waited_out, 0, sizeof(int));
    poison(t.dq, t.nq * 2), poison(t.dk, t.nkv * 2), poison(t.dv, t.nkv * 2);
    struct mk_attn_bwd_args b = a;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (graph) CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    EXPECT(mk_attn_bwd_prep_launch(&b, st) == 0, "prep launch refused");
    b.delta_ready = b.dq_accumulate = 1, b.pdl = pdl;
    pdl_gate_kernel<<<1, 1, 0, st>>>(t.dq_acc, flags, chunks, 3, waited_out);
    CUDA_OK(cudaGetLastError());
    EXPECT(mk_attn_bwd_launch_variant(&b, st, variant) == 0, "launch refused (pdl %d)", pdl);
    if (graph) {
      CUDA_OK(cudaStreamEndCapture(st, &g));
      CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
      CUDA_OK(cudaGraphLaunch(ge, st));
    }
    CUDA_OK(cudaStreamSynchronize(st));
    if (graph) cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
    struct mk_gemm_error e;
    CUDA_OK(cudaMemcpy(&e, t.err, sizeof e, cudaMemcpyDeviceToHost));
    EXPECT(!e.aborted, "pdl %d: a wait timed out (flag %u)", pdl, e.flag_index);
    const int ran = !e.aborted;
    int w = 0;
    CUDA_OK(cudaMemcpy(&w, waited_out, sizeof w, cudaMemcpyDeviceToHost));
    static const char* const names[3] = {"pdl", "pdl, graph", "no pdl"};
    printf("  %s: the gate %s\n", names[run], w ? "gave up (the call had not started)" : "saw the call's CTAs");
    if (pdl) EXPECT(!w, "%s: the call's CTAs did not start while the kernel before them ran", names[run]);
    else EXPECT(w, "no pdl (control): the call started before the kernel before it ended");
    if (ran) EXPECT(check_all(names[run], &t), "wrong gradients (%s)", names[run]);
  }
  struct mk_attn_bwd_args b = a;
  b.pdl = 1;
  EXPECT(mk_attn_bwd_launch(&b, 0) == -EINVAL, "pdl with the prep kernel still to run accepted");
  cudaStreamDestroy(st);
  cudaFree(flags), cudaFree(done), cudaFree(waited_out);
  bufs_free(&t);
}

/* Kernel nodes of the call captured alone on `st`. */
static size_t captured_kernels(const struct mk_attn_bwd_args* a, cudaStream_t st, cudaGraph_t* graph) {
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  const int rc = mk_attn_bwd_launch_variant(a, st, variant);
  CUDA_OK(cudaStreamEndCapture(st, graph));
  EXPECT(rc == 0, "launch refused under capture (%d)", rc);
  return graph_kernel_nodes(*graph, NULL);
}

/* See the top: the call with phase words is one kernel (without, the control, 3 to 5), and
 * its graph replayed gives the gradients each time and leaves the words zero; then the same
 * call with all but a quarter of the SMs held by another kernel (its parts wait only for CTAs
 * before them in index order). */
static void one_launch_case(int batch, int seq, int heads, int kv_heads, int d, int causal, uint64_t seed) {
  struct bwd_bufs t;
  bufs_alloc(&t, batch, seq, heads, kv_heads, d, causal, seed);
  struct mk_attn_bwd_args a = whole_args(&t);
  const size_t ws_floats = mk_attn_bwd_dkv_ws_floats(&a);
  if (ws_floats) {
    CUDA_OK(cudaMalloc(&a.dkv_ws, ws_floats * 4));
    poison(a.dkv_ws, ws_floats * 4); /* the call zeroes it */
  }
  char what[128];
  case_name(what, sizeof what, &t, ws_floats > 0);
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  const size_t multi = captured_kernels(&a, st, &graph);
  cudaGraphDestroy(graph);
  a.phase_words = phase_words();
  const size_t one = captured_kernels(&a, st, &graph);
  printf("  %s: %zu kernels, one launch %zu\n", what, multi, one);
  EXPECT(one == 1 && multi >= 3, "%s: %zu kernels with phase words (%zu without)", what, one, multi);
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; replay++) {
    poison(t.dq, t.nq * 2), poison(t.dk, t.nkv * 2), poison(t.dv, t.nkv * 2), poison(t.dq_acc, t.nq * 4);
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    check_err(t.err, what);
    if (phase_words_zero(a.phase_words, what)) EXPECT(check_all(what, &t), "%s: replay %d wrong", what, replay);
  }
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
  struct sm_hold h;
  const int held = sm_hold_start(&h, 0, 3);
  poison(t.dq, t.nq * 2), poison(t.dk, t.nkv * 2), poison(t.dv, t.nkv * 2);
  const double t0 = sm_hold_now_ms();
  const int rc = mk_attn_bwd_launch_variant(&a, st, variant);
  CUDA_OK(cudaStreamSynchronize(st));
  const double ms = sm_hold_now_ms() - t0;
  const int still = sm_hold_end(&h);
  printf("  %s: %d of %d SMs held: %.1f ms, held to the end by %d\n", what, held, h.sms, ms, still);
  EXPECT(rc == 0, "launch refused (%d)", rc);
  check_err(t.err, "SMs held");
  if (phase_words_zero(a.phase_words, what)) EXPECT(check_all(what, &t), "%s: wrong with the SMs held", what);
  cudaStreamDestroy(st);
  cudaFree(a.dkv_ws);
  bufs_free(&t);
}

static void test_one_launch(void) {
  one_launch_case(2, 300, 8, 1, 128, 1, 0x0e1a); /* split: dkv_ws zeroed and written out in the call */
  one_launch_case(2, 300, 8, 2, 64, 0, 0x0e1b);
  one_launch_case(1, 1024, 4, 4, 128, 1, 0x0e1c);
}

static void test_bad_input(void) {
  struct bwd_bufs t;
  bufs_alloc(&t, 1, 256, 4, 2, 64, 1, 42);
  const struct mk_attn_bwd_args g = whole_args(&t);
  struct mk_attn_bwd_args a;
  a = g, a.d_head = 96;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "d_head 96 accepted");
  a = g, a.heads = 3;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "heads 3 with kv_heads 2 accepted");
  a = g, a.seq_q = 0;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "seq_q 0 accepted");
  a = g, a.kv[0].k = NULL;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "k NULL accepted");
  a = g, a.lse = NULL;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "lse NULL accepted");
  a = g, a.dq_acc = NULL;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "dq_acc NULL accepted");
  a = g, a.kv[0].dk = NULL;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "no dk output accepted");
  a = g, a.q = (const char*)t.q + 2;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "misaligned q accepted");
  a = g, a.kv[0].rows = 300;
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "kv rows past seq accepted");
  a = g, a.dkv_ws = (float*)((char*)t.dq_acc + 8);
  EXPECT(mk_attn_bwd_launch(&a, 0) == -EINVAL, "misaligned dkv_ws accepted");
  CUDA_OK(cudaDeviceSynchronize());
  size_t touched = 0;
  const void* outs[] = {t.dq, t.dk, t.dv, t.delta, t.dq_acc};
  const size_t bytes[] = {t.nq * 2, t.nkv * 2, t.nkv * 2, t.nl * 4, t.nq * 4};
  for (int o = 0; o < 5; o++) {
    std::vector<unsigned char> h(bytes[o]);
    CUDA_OK(cudaMemcpy(h.data(), outs[o], h.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); i++) touched += h[i] != 0xFF;
  }
  printf("  refused launches left %zu bytes of dq, dk, dv, delta, dq_acc changed\n", touched);
  EXPECT(touched == 0, "a refused launch wrote an output");
  bufs_free(&t);
}

int main(int argc, char** argv) {
  gpu_or_skip();
  const char* what = argc > 1 ? argv[1] : "";
  variant = attn_test_variant();
  one_launch = attn_test_one_launch();
  printf("%s (variant %d%s)\n", what, variant, one_launch ? ", one launch" : "");
  static const struct named_test tests[] = {{"backward", test_backward},     {"offsets", test_offsets},
                                            {"negative_control", test_negative_control},
                                            {"split", test_split},           {"ready_flags", test_ready_flags},
                                            {"addends", test_addends},       {"pdl", test_pdl},
                                            {"one_launch", test_one_launch},
                                            {"bad_input", test_bad_input}};
  return run_named_tests(what, tests, (int)(sizeof tests / sizeof *tests));
}
