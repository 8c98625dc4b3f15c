/*
 * The ring attention tests' own helpers (attn_check.cuh), checked before any attention kernel
 * leans on them. One binary, one behaviour per argv[1]; exit 77 without a Hopper GPU.
 *   reference_matches_cpu: the device float64 reference attention equals a CPU float64 loop
 *     (out and lse) on small shapes: causal and not, H = H_kv and grouped-query heads,
 *     sequences shorter and longer than one batch of keys.
 *   rank_rows: a rank's rows (inputs and reference outputs) are the zigzag chunks r and
 *     2n-1-r, or the contiguous block, written out by hand; the checker rejects another
 *     rank's rows.
 */
#include <string.h>
#include <time.h>
#include <vector>
#include "attn_check.cuh"

static int failures;

#define EXPECT(cond, ...)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);   \
      fprintf(stderr, __VA_ARGS__);                           \
      fprintf(stderr, "\n");                                  \
      failures++;                                             \
    }                                                         \
  } while (0)

static double bf(const std::vector<__nv_bfloat16>& x, size_t i) { return (double)__bfloat162float(x[i]); }

static void reference_case(int batch, int seq, int heads, int kv_heads, int d_head, int causal,
                           uint64_t seed) {
  const size_t nq = (size_t)batch * seq * heads * d_head, nkv = (size_t)batch * seq * kv_heads * d_head;
  const size_t nl = (size_t)batch * heads * seq;
  void *q, *k, *v;
  double *out, *lse;
  CUDA_OK(cudaMalloc(&q, nq * 2));
  CUDA_OK(cudaMalloc(&k, nkv * 2));
  CUDA_OK(cudaMalloc(&v, nkv * 2));
  CUDA_OK(cudaMalloc(&out, nq * 8));
  CUDA_OK(cudaMalloc(&lse, nl * 8));
  fill_random_bf16(q, nq, seed, 2.0f); /* scores of a few units: a softmax with peaks */
  fill_random_bf16(k, nkv, seed + 1, 2.0f);
  fill_random_bf16(v, nkv, seed + 2, 1.0f);
  poison(out, nq * 8);
  poison(lse, nl * 8);
  ref_attn_f64(q, k, v, out, lse, batch, seq, heads, kv_heads, d_head, causal);
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<__nv_bfloat16> hq(nq), hk(nkv), hv(nkv);
  std::vector<double> hout(nq), hlse(nl), sc(seq);
  CUDA_OK(cudaMemcpy(hq.data(), q, nq * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hk.data(), k, nkv * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hv.data(), v, nkv * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hout.data(), out, nq * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hlse.data(), lse, nl * 8, cudaMemcpyDeviceToHost));
  double worst_out = 0, worst_lse = 0;
  const double scale = 1.0 / sqrt((double)d_head);
  for (int b = 0; b < batch; b++)
    for (int h = 0; h < heads; h++) {
      const int hk_ = h / (heads / kv_heads);
      for (int i = 0; i < seq; i++) {
        const int nk = causal ? i + 1 : seq;
        double mx = -INFINITY;
        for (int j = 0; j < nk; j++) {
          double s = 0;
          for (int d = 0; d < d_head; d++)
            s += bf(hq, (((size_t)b * seq + i) * heads + h) * d_head + d) *
                 bf(hk, (((size_t)b * seq + j) * kv_heads + hk_) * d_head + d);
          sc[j] = s * scale;
          mx = fmax(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j < nk; j++) sum += exp(sc[j] - mx);
        const double want_lse = mx + log(sum);
        for (int j = 0; j < nk; j++) sc[j] = exp(sc[j] - want_lse); /* the softmax weights */
        for (int d = 0; d < d_head; d++) {
          double o = 0;
          for (int j = 0; j < nk; j++)
            o += sc[j] * bf(hv, (((size_t)b * seq + j) * kv_heads + hk_) * d_head + d);
          const double got = hout[(((size_t)b * seq + i) * heads + h) * d_head + d];
          worst_out = isfinite(got) ? fmax(worst_out, fabs(got - o)) : INFINITY;
        }
        const double got = hlse[((size_t)b * heads + h) * seq + i];
        worst_lse = isfinite(got) ? fmax(worst_lse, fabs(got - want_lse)) : INFINITY;
      }
    }
  printf("  B=%d S=%4d H=%d H_kv=%d D=%3d %-10s: max abs diff out %.3e lse %.3e\n", batch, seq,
         heads, kv_heads, d_head, causal ? "causal" : "non-causal", worst_out, worst_lse);
  EXPECT(worst_out < 1e-9 && worst_lse < 1e-9,
         "device float64 reference disagrees with the CPU (B=%d S=%d H=%d H_kv=%d D=%d causal=%d)",
         batch, seq, heads, kv_heads, d_head, causal);
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(out); cudaFree(lse);
}

static void test_reference_matches_cpu(void) {
  const uint64_t seed = (uint64_t)time(NULL);
  printf("  seed %016llx\n", (unsigned long long)seed);
  for (int causal = 0; causal < 2; causal++) {
    reference_case(1, 37, 8, 1, 64, causal, seed);       /* GQA 8:1, odd S */
    reference_case(2, 64, 4, 4, 128, causal, seed + 10); /* H = H_kv */
    reference_case(2, 300, 4, 2, 128, causal, seed + 20); /* keys in three batches */
    reference_case(1, 129, 2, 1, 64, causal, seed + 30);  /* one key past a batch */
  }
}

/* The value tag_kernel puts at flat index e of a [B, S, width] tensor: its coordinates
 * (b * 1e6 + t * 1e3 + c), readable when one is off. */
static double tag_at(size_t e, long seq, long width) {
  return (double)(e / (seq * width)) * 1e6 + (double)(e / width % seq) * 1e3 + (double)(e % width);
}

static __global__ void tag_kernel(double* p, int batch, long seq, long width) {
  const size_t n = (size_t)batch * seq * width;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
    p[e] = (double)(e / (seq * width)) * 1e6 + (double)(e / width % seq) * 1e3 + (double)(e % width);
}

/* want[r]: the global rows of rank r, written out by hand. */
static void rank_rows_case(int nranks, long seq, int zigzag, const long* const* want) {
  const int batch = 2, width = 3;
  const long s_local = seq / nranks;
  double *g, *l;
  CUDA_OK(cudaMalloc(&g, (size_t)batch * seq * width * 8));
  CUDA_OK(cudaMalloc(&l, (size_t)batch * s_local * width * 8));
  tag_kernel<<<64, 256>>>(g, batch, seq, width);
  CUDA_OK(cudaGetLastError());
  std::vector<double> h((size_t)batch * s_local * width);
  for (int r = 0; r < nranks; r++) {
    for (long i = 0; i < s_local; i++)
      EXPECT(attn_global_row(r, nranks, s_local, i, zigzag) == want[r][i],
             "n=%d zigzag=%d rank %d row %ld: global row %ld, want %ld", nranks, zigzag, r, i,
             attn_global_row(r, nranks, s_local, i, zigzag), want[r][i]);
    poison(l, h.size() * 8);
    attn_take_rank_rows(g, l, batch, seq, width, r, nranks, zigzag);
    CUDA_OK(cudaMemcpy(h.data(), l, h.size() * 8, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int b = 0; b < batch; b++)
      for (long i = 0; i < s_local; i++)
        for (long c = 0; c < width; c++)
          bad += h[((size_t)b * s_local + i) * width + c] != tag_at(((size_t)b * seq + want[r][i]) * width + c, seq, width);
    EXPECT(bad == 0, "n=%d zigzag=%d rank %d: %d elements of the [B,S,width] rows off", nranks, zigzag, r, bad);
    /* The same buffer read as lse [B, H, S] with H = width: row (b, h) keeps entries want[r]. */
    poison(l, h.size() * 8);
    attn_take_rank_lse(g, l, batch, width, seq, r, nranks, zigzag);
    CUDA_OK(cudaMemcpy(h.data(), l, h.size() * 8, cudaMemcpyDeviceToHost));
    bad = 0;
    for (int b = 0; b < batch; b++)
      for (int hh = 0; hh < width; hh++)
        for (long i = 0; i < s_local; i++)
          bad += h[((size_t)b * width + hh) * s_local + i] != tag_at(((size_t)b * width + hh) * seq + want[r][i], seq, width);
    EXPECT(bad == 0, "n=%d zigzag=%d rank %d: %d elements of the [B,H,S] lse rows off", nranks, zigzag, r, bad);
  }
  cudaFree(g);
  cudaFree(l);
}

static void test_rank_rows(void) {
  /* S = 8 over 2 ranks (chunks of 2), S = 12 over 3 (chunks of 2), S = 12 over 2 (chunks of 3). */
  const long z2_0[] = {0, 1, 6, 7}, z2_1[] = {2, 3, 4, 5};
  const long* z2[] = {z2_0, z2_1};
  rank_rows_case(2, 8, 1, z2);
  const long z3_0[] = {0, 1, 10, 11}, z3_1[] = {2, 3, 8, 9}, z3_2[] = {4, 5, 6, 7};
  const long* z3[] = {z3_0, z3_1, z3_2};
  rank_rows_case(3, 12, 1, z3);
  const long z23_0[] = {0, 1, 2, 9, 10, 11}, z23_1[] = {3, 4, 5, 6, 7, 8};
  const long* z23[] = {z23_0, z23_1};
  rank_rows_case(2, 12, 1, z23);
  const long c3_0[] = {0, 1, 2, 3}, c3_1[] = {4, 5, 6, 7}, c3_2[] = {8, 9, 10, 11};
  const long* c3[] = {c3_0, c3_1, c3_2};
  rank_rows_case(3, 12, 0, c3);

  /* On a real reference: rank 1's rows pass against rank 1's reference rows and fail against
   * rank 0's (a test comparing the wrong rows cannot pass by accident). */
  const int batch = 1, seq = 256, heads = 4, kv_heads = 2, d_head = 64, n = 2;
  const size_t nq = (size_t)batch * seq * heads * d_head, nkv = (size_t)batch * seq * kv_heads * d_head;
  void *q, *k, *v;
  double *out, *lse, *own, *other, *own_lse, *other_lse;
  CUDA_OK(cudaMalloc(&q, nq * 2));
  CUDA_OK(cudaMalloc(&k, nkv * 2));
  CUDA_OK(cudaMalloc(&v, nkv * 2));
  CUDA_OK(cudaMalloc(&out, nq * 8));
  CUDA_OK(cudaMalloc(&lse, (size_t)batch * heads * seq * 8));
  CUDA_OK(cudaMalloc(&own, nq / n * 8));
  CUDA_OK(cudaMalloc(&other, nq / n * 8));
  CUDA_OK(cudaMalloc(&own_lse, (size_t)batch * heads * seq / n * 8));
  CUDA_OK(cudaMalloc(&other_lse, (size_t)batch * heads * seq / n * 8));
  const uint64_t seed = (uint64_t)time(NULL);
  fill_random_bf16(q, nq, seed, 2.0f);
  fill_random_bf16(k, nkv, seed + 1, 2.0f);
  fill_random_bf16(v, nkv, seed + 2, 1.0f);
  ref_attn_f64(q, k, v, out, lse, batch, seq, heads, kv_heads, d_head, 1);
  attn_take_rank_rows(out, own, batch, seq, (long)heads * d_head, 1, n, 1);
  attn_take_rank_rows(out, other, batch, seq, (long)heads * d_head, 0, n, 1);
  attn_take_rank_lse(lse, own_lse, batch, heads, seq, 1, n, 1);
  attn_take_rank_lse(lse, other_lse, batch, heads, seq, 0, n, 1);
  struct check_result same = check_close(own, own, nq / n, 1e-2);
  struct check_result wrong = check_close(own, other, nq / n, 1e-2);
  struct check_result wrong_lse = check_close(own_lse, other_lse, (size_t)batch * heads * seq / n, 1e-2);
  printf("  rank 1 out vs its rows rel=%.1e, vs rank 0's rows rel=%.3e (%s), lse rel=%.3e (%s)\n",
         same.rel, wrong.rel, wrong.pass ? "passed (BAD)" : "rejected", wrong_lse.rel,
         wrong_lse.pass ? "passed (BAD)" : "rejected");
  EXPECT(same.pass, "a rank's reference rows must pass against themselves");
  EXPECT(!wrong.pass, "rank 1's out passed against rank 0's reference rows");
  EXPECT(!wrong_lse.pass, "rank 1's lse passed against rank 0's reference rows");

  /* bf16 inputs split the same way: rank 1 of 2 holds chunks 1 and 2 of 4, rows 64 .. 191. */
  void* q1;
  CUDA_OK(cudaMalloc(&q1, nq / n * 2));
  attn_take_rank_rows((const __nv_bfloat16*)q, (__nv_bfloat16*)q1, batch, seq, (long)heads * d_head, 1, n, 1);
  std::vector<__nv_bfloat16> hq(nq), hq1(nq / n);
  CUDA_OK(cudaMemcpy(hq.data(), q, nq * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hq1.data(), q1, nq / n * 2, cudaMemcpyDeviceToHost));
  EXPECT(!memcmp(hq1.data(), hq.data() + (size_t)64 * heads * d_head, nq / n * 2),
         "rank 1's bf16 q rows are not global rows 64 .. 191");
  cudaFree(q1);
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(out); cudaFree(lse);
  cudaFree(own); cudaFree(other); cudaFree(own_lse); cudaFree(other_lse);
}

int main(int argc, char** argv) {
  gpu_or_skip();
  const char* what = argc > 1 ? argv[1] : "";
  printf("%s\n", what);
  if (!strcmp(what, "reference_matches_cpu")) test_reference_matches_cpu();
  else if (!strcmp(what, "rank_rows")) test_rank_rows();
  else {
    fprintf(stderr, "unknown test '%s'\n", what);
    return 2;
  }
  printf("%s: %s\n", what, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
