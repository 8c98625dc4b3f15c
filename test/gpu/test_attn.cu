/*
 * The forward attention core (fused/common/attn.h) on one GPU against the float64 reference of
 * attn_check.cuh. One binary, one behaviour per argv[1] (`all` runs every one); exit 77 without
 * a Hopper GPU.
 *   forward: small shapes (S = 1, 100, 128, 300, 1024; H = H_kv and GQA 8:1; D = 64, 128;
 *     causal and not), outputs poisoned first, every element checked.
 *   offsets: the rows one rank of a 2-rank ring computes, as the ring kernel will: per local
 *     half of its queries (zigzag chunks r and 3-r of 4, so q positions are not row indices),
 *     the four KV chunks of both ranks as separate blocks at their global positions, merged in
 *     registers; causal (zigzag) and non-causal (contiguous split); chunk lengths below, at and
 *     past one tile. Must equal the reference's rows of that rank.
 *   negative_control: one element of out (then of lse) moved; the checker must reject it.
 *   bad_input: refused with -EINVAL, outputs untouched.
 * MK_ATTN_VARIANT=v runs them on compiled variant v (attn.h) instead of the default.
 * Checker: ||out - ref|| / ||ref|| < 1e-2, every element |out - ref| <= 2e-2 (1 + |ref|), lse
 * within 2e-3, nothing non-finite (the poison never passes).
 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <vector>
#include "attn.h"
#include "attn_check.cuh"
#include "attn_run.h"
#include "expect.h"
#include "gemm.h"

struct attn_bufs {
  int batch, seq, heads, kv_heads, d;
  size_t nq, nkv, nl;
  void *q, *k, *v, *out;
  float* lse;
  double *ref_out, *ref_lse;
  struct mk_gemm_error* err;
};

static void bufs_alloc(struct attn_bufs* t, int batch, int seq, int heads, int kv_heads, int d, uint64_t seed) {
  t->batch = batch, t->seq = seq, t->heads = heads, t->kv_heads = kv_heads, t->d = d;
  t->nq = (size_t)batch * seq * heads * d, t->nkv = (size_t)batch * seq * kv_heads * d;
  t->nl = (size_t)batch * heads * seq;
  CUDA_OK(cudaMalloc(&t->q, t->nq * 2));
  CUDA_OK(cudaMalloc(&t->k, t->nkv * 2));
  CUDA_OK(cudaMalloc(&t->v, t->nkv * 2));
  CUDA_OK(cudaMalloc(&t->out, t->nq * 2));
  CUDA_OK(cudaMalloc(&t->lse, t->nl * 4));
  CUDA_OK(cudaMalloc(&t->ref_out, t->nq * 8));
  CUDA_OK(cudaMalloc(&t->ref_lse, t->nl * 8));
  CUDA_OK(cudaMalloc(&t->err, sizeof(struct mk_gemm_error)));
  memset_now(t->err, 0, sizeof(struct mk_gemm_error));
  fill_random_bf16(t->q, t->nq, seed, 2.0f); /* scores of a few units: a softmax with peaks */
  fill_random_bf16(t->k, t->nkv, seed + 1, 2.0f);
  fill_random_bf16(t->v, t->nkv, seed + 2, 1.0f);
  poison(t->out, t->nq * 2);
  poison(t->lse, t->nl * 4);
}

static void bufs_free(struct attn_bufs* t) {
  cudaFree(t->q), cudaFree(t->k), cudaFree(t->v), cudaFree(t->out), cudaFree(t->lse);
  cudaFree(t->ref_out), cudaFree(t->ref_lse), cudaFree(t->err);
}

/* The whole sequence as one block. */
static struct mk_attn_args whole_args(const struct attn_bufs* t, int causal) {
  struct mk_attn_args a = attn_whole_fwd_args(t->q, t->k, t->v, t->out, t->lse, t->batch, t->seq, t->seq,
                                              t->heads, t->kv_heads, t->d, causal);
  a.err = t->err;
  a.timeout_ms = 5000;
  return a;
}

/* MK_ATTN_VARIANT (attn.h mk_attn_fwd_launch_variant; default 0) picks the compiled variant. */
static int variant;

/* Launch, wait, and fail the test on an error code or a timed-out wait. */
static int run_core(const struct mk_attn_args* a) {
  const int rc = mk_attn_fwd_launch_variant(a, 0, variant);
  EXPECT(rc == 0, "mk_attn_fwd_launch returned %d", rc);
  CUDA_OK(cudaDeviceSynchronize());
  if (a->err) {
    struct mk_gemm_error e;
    CUDA_OK(cudaMemcpy(&e, a->err, sizeof e, cudaMemcpyDeviceToHost));
    EXPECT(!e.aborted, "a wait timed out: tile %u barrier %u parity %llu", e.tile, e.flag_index,
           (unsigned long long)e.expected);
    if (e.aborted) return 0;
  }
  return rc == 0;
}

static void forward_case(int batch, int seq, int heads, int kv_heads, int d, int causal, uint64_t seed) {
  struct attn_bufs t;
  bufs_alloc(&t, batch, seq, heads, kv_heads, d, seed);
  ref_attn_f64(t.q, t.k, t.v, t.ref_out, t.ref_lse, batch, seq, heads, kv_heads, d, causal);
  const struct mk_attn_args a = whole_args(&t, causal);
  char what[128];
  snprintf(what, sizeof what, "B=%d S=%4d H=%2d H_kv=%d D=%3d %s", batch, seq, heads, kv_heads, d,
           causal ? "causal" : "non-causal");
  if (run_core(&a))
    EXPECT(attn_check(what, t.out, t.lse, t.ref_out, t.ref_lse, t.nq, t.nl), "%s: out or lse wrong", what);
  bufs_free(&t);
}

static void test_forward(void) { attn_small_shape_sweep(forward_case); }

/* One rank of a 2-rank ring, emulated: rank r's local q, k, v (attn_take_rank_rows), then per
 * local half of its queries one launch that merges the four KV chunks of both ranks (in ring
 * order: its own block first), each a block at its global position. */
static void offsets_case(int batch, int chunk, int heads, int kv_heads, int d, int causal, uint64_t seed) {
  const int n = 2, seq = 2 * n * chunk, s_local = seq / n, zz = causal;
  struct attn_bufs t;
  bufs_alloc(&t, batch, seq, heads, kv_heads, d, seed);
  ref_attn_f64(t.q, t.k, t.v, t.ref_out, t.ref_lse, batch, seq, heads, kv_heads, d, causal);
  const size_t nq_l = t.nq / n, nkv_l = t.nkv / n, nl_l = t.nl / n;
  void *q_l, *out_l, *k_l[2], *v_l[2];
  float* lse_l;
  double *ref_out_l, *ref_lse_l;
  CUDA_OK(cudaMalloc(&q_l, nq_l * 2));
  CUDA_OK(cudaMalloc(&out_l, nq_l * 2));
  CUDA_OK(cudaMalloc(&lse_l, nl_l * 4));
  CUDA_OK(cudaMalloc(&ref_out_l, nq_l * 8));
  CUDA_OK(cudaMalloc(&ref_lse_l, nl_l * 8));
  for (int s = 0; s < n; s++) {
    CUDA_OK(cudaMalloc(&k_l[s], nkv_l * 2));
    CUDA_OK(cudaMalloc(&v_l[s], nkv_l * 2));
    attn_take_rank_rows((const __nv_bfloat16*)t.k, (__nv_bfloat16*)k_l[s], batch, seq, (long)kv_heads * d, s, n, zz);
    attn_take_rank_rows((const __nv_bfloat16*)t.v, (__nv_bfloat16*)v_l[s], batch, seq, (long)kv_heads * d, s, n, zz);
  }
  for (int r = 0; r < n; r++) {
    attn_take_rank_rows((const __nv_bfloat16*)t.q, (__nv_bfloat16*)q_l, batch, seq, (long)heads * d, r, n, zz);
    attn_take_rank_rows(t.ref_out, ref_out_l, batch, seq, (long)heads * d, r, n, zz);
    attn_take_rank_lse(t.ref_lse, ref_lse_l, batch, heads, seq, r, n, zz);
    poison(out_l, nq_l * 2);
    poison(lse_l, nl_l * 4);
    int ok = 1;
    for (int qh = 0; qh < 2; qh++) {
      struct mk_attn_args a;
      memset(&a, 0, sizeof a);
      a.q = q_l, a.out = out_l, a.lse = lse_l;
      a.batch = batch, a.seq_q = s_local, a.heads = heads, a.kv_heads = kv_heads, a.d_head = d;
      a.causal = causal;
      a.q_row0 = qh * chunk, a.q_rows = chunk;
      a.q_pos0 = attn_global_row(r, n, s_local, qh * chunk, zz);
      a.num_kv_blocks = 2 * n;
      for (int step = 0; step < n; step++) {
        const int src = mk_ra_kv_source(r, n, step);
        for (int kh = 0; kh < 2; kh++) {
          struct mk_attn_kv_block* b = &a.kv[2 * step + kh];
          b->k = k_l[src], b->v = v_l[src], b->seq = s_local;
          b->row0 = kh * chunk, b->rows = chunk;
          b->pos0 = attn_global_row(src, n, s_local, kh * chunk, zz);
        }
      }
      a.err = t.err;
      a.timeout_ms = 5000;
      ok &= run_core(&a);
    }
    char what[160];
    snprintf(what, sizeof what, "rank %d/2 B=%d chunk=%3d H=%d H_kv=%d D=%3d %s", r, batch, chunk, heads, kv_heads, d,
             causal ? "causal zigzag" : "non-causal");
    if (ok)
      EXPECT(attn_check(what, out_l, lse_l, ref_out_l, ref_lse_l, nq_l, nl_l), "%s: out or lse wrong", what);
  }
  for (int s = 0; s < n; s++) cudaFree(k_l[s]), cudaFree(v_l[s]);
  cudaFree(q_l), cudaFree(out_l), cudaFree(lse_l), cudaFree(ref_out_l), cudaFree(ref_lse_l);
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

static void test_negative_control(void) {
  struct attn_bufs t;
  bufs_alloc(&t, 2, 300, 8, 1, 128, 0x5eed);
  ref_attn_f64(t.q, t.k, t.v, t.ref_out, t.ref_lse, 2, 300, 8, 1, 128, 1);
  const struct mk_attn_args a = whole_args(&t, 1);
  if (!run_core(&a)) return;
  EXPECT(attn_check("correct output", t.out, t.lse, t.ref_out, t.ref_lse, t.nq, t.nl), "the correct output must pass");
  const size_t at = t.nq / 2 + 77, at_lse = t.nl / 3 + 5;
  nudge((__nv_bfloat16*)t.out, at, 0.1);
  EXPECT(!attn_check("out[n/2 + 77] + 0.1", t.out, t.lse, t.ref_out, t.ref_lse, t.nq, t.nl),
         "one element of out off by 0.1 passed");
  nudge((__nv_bfloat16*)t.out, at, -0.1);
  nudge(t.lse, at_lse, 0.01);
  EXPECT(!attn_check("lse[n/3 + 5] + 0.01", t.out, t.lse, t.ref_out, t.ref_lse, t.nq, t.nl),
         "one element of lse off by 0.01 passed");
  bufs_free(&t);
}

static void test_bad_input(void) {
  struct attn_bufs t;
  bufs_alloc(&t, 1, 256, 4, 2, 64, 42);
  const struct mk_attn_args g = whole_args(&t, 1);
  struct mk_attn_args a;
  a = g, a.d_head = 96;
  EXPECT(mk_attn_fwd_launch(&a, 0) == -EINVAL, "d_head 96 accepted");
  a = g, a.heads = 3;
  EXPECT(mk_attn_fwd_launch(&a, 0) == -EINVAL, "heads 3 with kv_heads 2 accepted");
  a = g, a.seq_q = 0;
  EXPECT(mk_attn_fwd_launch(&a, 0) == -EINVAL, "seq_q 0 accepted");
  a = g, a.kv[0].k = NULL;
  EXPECT(mk_attn_fwd_launch(&a, 0) == -EINVAL, "k NULL accepted");
  a = g, a.out = NULL;
  EXPECT(mk_attn_fwd_launch(&a, 0) == -EINVAL, "out NULL accepted");
  a = g, a.q = (const char*)t.q + 2;
  EXPECT(mk_attn_fwd_launch(&a, 0) == -EINVAL, "misaligned q accepted");
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<unsigned char> h(t.nq * 2);
  CUDA_OK(cudaMemcpy(h.data(), t.out, h.size(), cudaMemcpyDeviceToHost));
  size_t touched = 0;
  for (size_t i = 0; i < h.size(); i++) touched += h[i] != 0xFF;
  printf("  refused launches left %zu bytes of out changed\n", touched);
  EXPECT(touched == 0, "a refused launch wrote out");
  bufs_free(&t);
}

int main(int argc, char** argv) {
  gpu_or_skip();
  const char* what = argc > 1 ? argv[1] : "";
  variant = attn_test_variant();
  printf("%s (variant %d)\n", what, variant);
  static const struct named_test tests[] = {{"forward", test_forward},
                                            {"offsets", test_offsets},
                                            {"negative_control", test_negative_control},
                                            {"bad_input", test_bad_input}};
  return run_named_tests(what, tests, (int)(sizeof tests / sizeof *tests));
}
