/*
 * The ring attention tests' own helpers (attn_check.cuh), checked before any attention kernel
 * leans on them. One binary, one behaviour per argv[1]; exit 77 without a Hopper GPU.
 *   reference_matches_cpu: the device float64 reference attention equals a CPU float64 loop
 *     (out and lse) on small shapes: causal and not, H = H_kv and grouped-query heads,
 *     sequences shorter and longer than one batch of keys.
 *   backward_reference_matches_cpu: the device float64 reference backward (dq, dk, dv) equals
 *     a CPU float64 loop on small shapes (causal and not, H = H_kv, GQA 2:1 and 8:1, more
 *     keys and queries than one batch), and is the gradient of sum(out * dout): finite
 *     differences of the reference forward in one element each of q, k and v agree.
 *   rank_rows: a rank's rows (inputs and reference outputs) are the zigzag chunks r and
 *     2n-1-r, or the contiguous block, written out by hand; the checker rejects another
 *     rank's rows.
 */
#include <string.h>
#include <time.h>
#include <vector>
#include "attn_check.cuh"
#include "expect.h"


static double bf(const std::vector<__nv_bfloat16>& x, size_t i) { return (double)__bfloat162float(x[i]); }

/* CPU float64: the softmax weights w[j] of the keys j < nk that query row i of head h (batch b)
 * sees (nk = i + 1 causal, else S), and the row's lse. */
static double cpu_softmax_row(const std::vector<__nv_bfloat16>& hq,
                              const std::vector<__nv_bfloat16>& hk, int b, int i, int h, int seq,
                              int heads, int kv_heads, int d_head, int nk, double* w) {
  const int hk_ = h / (heads / kv_heads);
  const double scale = 1.0 / sqrt((double)d_head);
  double mx = -INFINITY;
  for (int j = 0; j < nk; j++) {
    double s = 0;
    for (int d = 0; d < d_head; d++)
      s += bf(hq, attn_row_at(b, i, h, seq, heads, d_head) + d) *
           bf(hk, attn_row_at(b, j, hk_, seq, kv_heads, d_head) + d);
    w[j] = s * scale;
    mx = fmax(mx, w[j]);
  }
  double sum = 0;
  for (int j = 0; j < nk; j++) sum += exp(w[j] - mx);
  const double lse = mx + log(sum);
  for (int j = 0; j < nk; j++) w[j] = exp(w[j] - lse);
  return lse;
}

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
  for (int b = 0; b < batch; b++)
    for (int h = 0; h < heads; h++) {
      const int hk_ = h / (heads / kv_heads);
      for (int i = 0; i < seq; i++) {
        const int nk = causal ? i + 1 : seq;
        const double want_lse =
            cpu_softmax_row(hq, hk, b, i, h, seq, heads, kv_heads, d_head, nk, sc.data());
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

/* The largest |got[e] - want[e]|, infinite when a got is not finite (poison never passes). */
static double worst_abs_diff(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t e = 0; e < got.size(); e++)
    worst = isfinite(got[e]) ? fmax(worst, fabs(got[e] - want[e])) : INFINITY;
  return worst;
}

/* The inputs and float64 gradients of one backward check, on the device: q, dout [B,S,H,D] and
 * k, v [B,S,H_kv,D] bf16 filled at random from seed (q, k at scale 2, v, dout at 1), dq, dk, dv
 * float64 of the same shapes, poisoned. */
struct bwd_bufs {
  size_t nq, nkv;
  void *q, *k, *v, *dout;
  double *dq, *dk, *dv;
};

static void bwd_bufs_alloc(struct bwd_bufs* t, int batch, int seq, int heads, int kv_heads, int d_head,
                           uint64_t seed) {
  t->nq = (size_t)batch * seq * heads * d_head, t->nkv = (size_t)batch * seq * kv_heads * d_head;
  CUDA_OK(cudaMalloc(&t->q, t->nq * 2));
  CUDA_OK(cudaMalloc(&t->k, t->nkv * 2));
  CUDA_OK(cudaMalloc(&t->v, t->nkv * 2));
  CUDA_OK(cudaMalloc(&t->dout, t->nq * 2));
  CUDA_OK(cudaMalloc(&t->dq, t->nq * 8));
  CUDA_OK(cudaMalloc(&t->dk, t->nkv * 8));
  CUDA_OK(cudaMalloc(&t->dv, t->nkv * 8));
  fill_random_bf16(t->q, t->nq, seed, 2.0f);
  fill_random_bf16(t->k, t->nkv, seed + 1, 2.0f);
  fill_random_bf16(t->v, t->nkv, seed + 2, 1.0f);
  fill_random_bf16(t->dout, t->nq, seed + 3, 1.0f);
  poison(t->dq, t->nq * 8);
  poison(t->dk, t->nkv * 8);
  poison(t->dv, t->nkv * 8);
}

static void bwd_bufs_free(struct bwd_bufs* t) {
  cudaFree(t->q), cudaFree(t->k), cudaFree(t->v), cudaFree(t->dout);
  cudaFree(t->dq), cudaFree(t->dk), cudaFree(t->dv);
}

/* The device float64 backward against a CPU float64 loop written from the formulas, with its
 * own softmax rows: D_i = dout_i . out_i, dS_ij = P_ij (dout_i . v_j - D_i), dq_i += dS_ij k_j
 * scale, dk_j += dS_ij q_i scale, dv_j += P_ij dout_i (dk, dv summed over the kv head's
 * query heads). */
static void backward_case(int batch, int seq, int heads, int kv_heads, int d_head, int causal,
                          uint64_t seed) {
  struct bwd_bufs t;
  bwd_bufs_alloc(&t, batch, seq, heads, kv_heads, d_head, seed);
  const size_t nq = t.nq, nkv = t.nkv;
  void *q = t.q, *k = t.k, *v = t.v, *dout = t.dout;
  double *dq = t.dq, *dk = t.dk, *dv = t.dv;
  ref_attn_bwd_f64(q, k, v, dout, dq, dk, dv, batch, seq, heads, kv_heads, d_head, causal, ATTN_REF_DELTA_EXACT, NULL);

  std::vector<__nv_bfloat16> hq(nq), hk(nkv), hv(nkv), hdo(nq);
  std::vector<double> gdq(nq), gdk(nkv), gdv(nkv), wdq(nq), wdk(nkv), wdv(nkv), w(seq);
  CUDA_OK(cudaMemcpy(hq.data(), q, nq * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hk.data(), k, nkv * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hv.data(), v, nkv * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hdo.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(gdq.data(), dq, nq * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(gdk.data(), dk, nkv * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(gdv.data(), dv, nkv * 8, cudaMemcpyDeviceToHost));
  const double scale = 1.0 / sqrt((double)d_head);
  for (int b = 0; b < batch; b++)
    for (int h = 0; h < heads; h++) {
      const int hk_ = h / (heads / kv_heads);
      for (int i = 0; i < seq; i++) {
        const int nk = causal ? i + 1 : seq;
        const size_t qr = attn_row_at(b, i, h, seq, heads, d_head);
        cpu_softmax_row(hq, hk, b, i, h, seq, heads, kv_heads, d_head, nk, w.data());
        double di = 0;
        for (int d = 0; d < d_head; d++) {
          double o = 0;
          for (int j = 0; j < nk; j++) o += w[j] * bf(hv, attn_row_at(b, j, hk_, seq, kv_heads, d_head) + d);
          di += bf(hdo, qr + d) * o;
        }
        for (int j = 0; j < nk; j++) {
          const size_t kr = attn_row_at(b, j, hk_, seq, kv_heads, d_head);
          double dp = 0;
          for (int d = 0; d < d_head; d++) dp += bf(hdo, qr + d) * bf(hv, kr + d);
          const double ds = w[j] * (dp - di);
          for (int d = 0; d < d_head; d++) {
            wdq[qr + d] += ds * bf(hk, kr + d) * scale;
            wdk[kr + d] += ds * bf(hq, qr + d) * scale;
            wdv[kr + d] += w[j] * bf(hdo, qr + d);
          }
        }
      }
    }
  const double e_dq = worst_abs_diff(gdq, wdq), e_dk = worst_abs_diff(gdk, wdk);
  const double e_dv = worst_abs_diff(gdv, wdv);
  printf("  B=%d S=%4d H=%d H_kv=%d D=%3d %-10s: max abs diff dq %.3e dk %.3e dv %.3e\n", batch,
         seq, heads, kv_heads, d_head, causal ? "causal" : "non-causal", e_dq, e_dk, e_dv);
  EXPECT(e_dq < 1e-9 && e_dk < 1e-9 && e_dv < 1e-9,
         "device float64 backward disagrees with the CPU (B=%d S=%d H=%d H_kv=%d D=%d causal=%d)",
         batch, seq, heads, kv_heads, d_head, causal);
  bwd_bufs_free(&t);
}

/* Element i of a device bf16 tensor set to x, which must be a bf16 exactly. */
static void set_bf16(void* p, size_t i, double x) {
  const __nv_bfloat16 h = __float2bfloat16((float)x);
  if ((double)__bfloat162float(h) != x) {
    fprintf(stderr, "set_bf16: %.17g is not a bf16\n", x);
    exit(1);
  }
  CUDA_OK(cudaMemcpy((__nv_bfloat16*)p + i, &h, 2, cudaMemcpyHostToDevice));
}

/* sum(out * dout) over the whole tensor, out from the device float64 forward: the function
 * whose gradients ref_attn_bwd_f64 gives. */
static double attn_loss(const void* q, const void* k, const void* v,
                        const std::vector<__nv_bfloat16>& hdo, double* out, int batch, int seq,
                        int heads, int kv_heads, int d_head, int causal) {
  std::vector<double> hout(hdo.size());
  ref_attn_f64(q, k, v, out, NULL, batch, seq, heads, kv_heads, d_head, causal);
  CUDA_OK(cudaMemcpy(hout.data(), out, hout.size() * 8, cudaMemcpyDeviceToHost));
  double f = 0;
  for (size_t e = 0; e < hout.size(); e++) f += hout[e] * bf(hdo, e);
  return f;
}

/* The reference backward is the gradient of sum(out * dout): one element each of q, k and v is
 * set to x0, then moved by +-h and +-h/2 (all bf16 exactly), and the central differences of
 * the loss, combined by Richardson (4 fd(h/2) - fd(h)) / 3 to cancel their h^2 error, must
 * match dq, dk, dv there. Tiny shape with GQA 2:1 and two batches; the k and v elements are of
 * kv head 1 (read by heads 2 and 3) at row 2, which (causal) query rows 2 .. 5 see. */
static void finite_difference_case(int causal, uint64_t seed) {
  const int batch = 2, seq = 6, heads = 4, kv_heads = 2, d_head = 8;
  struct bwd_bufs t;
  bwd_bufs_alloc(&t, batch, seq, heads, kv_heads, d_head, seed);
  const size_t nq = t.nq;
  void *q = t.q, *k = t.k, *v = t.v, *dout = t.dout;
  double *dq = t.dq, *dk = t.dk, *dv = t.dv, *out;
  CUDA_OK(cudaMalloc(&out, nq * 8));
  std::vector<__nv_bfloat16> hdo(nq);
  CUDA_OK(cudaMemcpy(hdo.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
  const struct {
    const char* name;
    void* x;
    size_t at;
    const double* grad;
  } el[3] = {{"q", q, attn_row_at(1, 4, 3, seq, heads, d_head), dq},
             {"k", k, attn_row_at(1, 2, 1, seq, kv_heads, d_head) + 2, dk},
             {"v", v, attn_row_at(1, 2, 1, seq, kv_heads, d_head) + 3, dv}};
  const double x0 = 0.25, h = 1.0 / 256; /* bf16 steps near 0.25: 1/512 above, 1/1024 below */
  for (int e = 0; e < 3; e++) set_bf16(el[e].x, el[e].at, x0);
  ref_attn_bwd_f64(q, k, v, dout, dq, dk, dv, batch, seq, heads, kv_heads, d_head, causal, ATTN_REF_DELTA_EXACT, NULL);
  for (int e = 0; e < 3; e++) {
    double g, fd[2];
    CUDA_OK(cudaMemcpy(&g, el[e].grad + el[e].at, 8, cudaMemcpyDeviceToHost));
    for (int t = 0; t < 2; t++) {
      const double step = h / (1 << t);
      set_bf16(el[e].x, el[e].at, x0 + step);
      const double fp = attn_loss(q, k, v, hdo, out, batch, seq, heads, kv_heads, d_head, causal);
      set_bf16(el[e].x, el[e].at, x0 - step);
      const double fm = attn_loss(q, k, v, hdo, out, batch, seq, heads, kv_heads, d_head, causal);
      fd[t] = (fp - fm) / (2 * step);
    }
    set_bf16(el[e].x, el[e].at, x0);
    const double rich = (4 * fd[1] - fd[0]) / 3, err = fabs(rich - g);
    printf("  %-10s d%s %+.12f: central differences %+.12f %+.12f, extrapolated %+.12f (diff %.1e)\n",
           causal ? "causal" : "non-causal", el[e].name, g, fd[0], fd[1], rich, err);
    EXPECT(isfinite(g) && err < 1e-7 * fmax(1.0, fabs(g)),
           "d%s disagrees with the finite differences of sum(out * dout) (causal=%d)", el[e].name,
           causal);
    EXPECT(fabs(g) > 1e-2, "d%s is %.3e: too small for the finite-difference check to mean much",
           el[e].name, g);
  }
  cudaFree(out);
  bwd_bufs_free(&t);
}

static void test_backward_reference_matches_cpu(void) {
  const uint64_t seed = (uint64_t)time(NULL);
  printf("  seed %016llx\n", (unsigned long long)seed);
  for (int causal = 0; causal < 2; causal++) {
    backward_case(1, 37, 8, 1, 64, causal, seed);        /* GQA 8:1, odd S */
    backward_case(2, 64, 4, 4, 128, causal, seed + 10);  /* H = H_kv */
    backward_case(1, 150, 4, 2, 64, causal, seed + 20);  /* GQA 2:1, keys and queries past a batch */
  }
  /* A fixed seed: the gradients it checks are known not to be near zero. */
  for (int causal = 0; causal < 2; causal++) finite_difference_case(causal, 0x5eed);
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

/* On a real reference: rank 1's rows are the reference's global rows 64 .. 191 (chunks 1 and 2
 * of 4, compared on the host), and they fail against rank 0's rows (a test comparing the wrong
 * rows cannot pass by accident). */
static void rank_rows_on_a_real_reference(void) {
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
  std::vector<double> h_out(nq), h_own(nq / n);
  CUDA_OK(cudaMemcpy(h_out.data(), out, nq * 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_own.data(), own, nq / n * 8, cudaMemcpyDeviceToHost));
  const int same = !memcmp(h_own.data(), h_out.data() + (size_t)64 * heads * d_head, nq / n * 8);
  struct check_result wrong = check_close(own, other, nq / n, 1e-2);
  struct check_result wrong_lse = check_close(own_lse, other_lse, (size_t)batch * heads * seq / n, 1e-2);
  printf("  rank 1 out: the global rows 64 .. 191 %s; vs rank 0's rows rel=%.3e (%s), lse rel=%.3e (%s)\n",
         same ? "exactly" : "NOT", wrong.rel, wrong.pass ? "passed (BAD)" : "rejected", wrong_lse.rel,
         wrong_lse.pass ? "passed (BAD)" : "rejected");
  EXPECT(same, "rank 1's reference rows are not the global rows 64 .. 191");
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
  rank_rows_on_a_real_reference();
}

int main(int argc, char** argv) {
  gpu_or_skip();
  const char* what = argc > 1 ? argv[1] : "";
  printf("%s\n", what);
  if (!strcmp(what, "reference_matches_cpu")) test_reference_matches_cpu();
  else if (!strcmp(what, "backward_reference_matches_cpu")) test_backward_reference_matches_cpu();
  else if (!strcmp(what, "rank_rows")) test_rank_rows();
  else {
    fprintf(stderr, "unknown test '%s'\n", what);
    return 2;
  }
  printf("%s: %s\n", what, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
