/*
 * ring_bwd_emul: the backward core calls that each rank of ncclMkRingAttentionBackward makes
 * (ra_bwd_plan.h's plan, mk_ra_bwd_core_args's arguments), emulated on one GPU: every rank's
 * data area (slots, accumulators, delta, dq_acc) is a buffer here, the peers' K/V already in the
 * slots. It times the core's share of the ring backward and the reduce (ring_attn.cu, its waits
 * already satisfied), without the gather and NVLink, so that the call structure can be worked
 * on with one GPU (issue 12).
 * For each shape (S = the whole sequence, S_local = S / n): the core alone on the whole
 * sequence (the single-GPU figure ring_attn_perf's "core" column gives), then rank r's calls in
 * order (as one stream runs them), r = 0 .. n-1 one after another, each timed whole, for the
 * ring's plan (own block first, then the peers'; then the reduce), the merged one
 * (mk_ra_bwd_plan_merged: fewer calls, each range against every block; then the reduce) and,
 * non-causal, the own-last one (mk_ra_bwd_plan_own_last: delta first, the peers' blocks, the
 * own block last with the peers' partials added as it writes dk, dv; no reduce) and the
 * one-kernel call (mk_ra_bwd_plan_one, NCCL_MK_RA_BWD_ONE_KERNEL's: every block in one launch
 * with the ring's announcements and end, less its push CTAs; with grouped heads at D = 128
 * also without its split workspace, "one-group"; and with its push CTAs, whose chunk flags its
 * own peer-block CTAs wait for, "one-push"), interleaved. Every plan but the
 * ring's waits for its peer blocks' chunk flags as the op's do (here all already raised).
 * TFLOP/s
 * per GPU = (FLOPs of the whole sequence / n) / the slowest rank's time; FLOPs as attn_perf -b
 * (10 B H S S D, halved causal). Medians of ITERS after two warm-ups. A benchmark, not a test:
 * correctness is test_ring_attn_bwd's (2 GPUs); inputs random, lse zero (finite P), values
 * not checked.
 * Usage: ring_bwd_emul [-r ranks (2)] [-p plan] [iters] [shape ...] with shapes B,H,H_kv,D,S,causal;
 * -p ring|merged|own-last|one|one-group|one-push: that plan alone, without the whole-sequence core (for ncu);
 * MK_ATTN_VARIANT (the backward variant of every call, attn.h, attn_run.h's test knob; 0).
 */
#include <algorithm>
#include <string.h>
#include <vector>

#include "attn.h"
#include "attn_run.h"
#include "gemm_check.cuh"
#include "perf_median.h"
#include "ra_bwd_plan.h"
#include "ring_attn.h"
#include "schedule.h"

struct shape {
  int b, h, hkv, d, s, causal;
};

/* the ring's plan, the merged plan, the own-last plan (non-causal), the one-kernel call (with
 * grouped heads at D = 128, a CTA per query head: as the op makes it when its workspace holds
 * the split's), the one-kernel call with a CTA per kv head's group (its fallback), and the
 * one-kernel call with its push (emul_one_push) */
#define EMUL_PLANS 6
#define EMUL_ONE 3
#define EMUL_ONE_GROUP 4
#define EMUL_ONE_PUSH 5
#define EMUL_PUSH_CTAS 8 /* ring_attn.c MK_RA_DEFAULT_PUSH_CTAS */

/* The one-kernel call's words: its phase words, its done word (raised by every call; the
 * call number its waits read is words[0]'s, which stays 0), then the words it announces to. */
#define EMUL_ONE_DONE MK_ATTN_BWD_PHASE_WORDS
#define EMUL_ONE_WORDS (MK_ATTN_BWD_PHASE_WORDS + 1 + MK_RA_MAX_RANKS)
/* one-push's words after one's: the same layout, then MK_RA_MAX_RANKS "partials ready" words
 * that never hold it back (1 << 62) */
#define EMUL_PUSH_WORDS (2 * EMUL_ONE_WORDS + MK_RA_MAX_RANKS)

/* One rank's tensors and data area (ra_bwd_plan.h's layout), its calls per plan and its reduce
 * (every wait of it already satisfied: words[0] is done = 0, the ready words are 1). */
struct emul_rank {
  void *q, *k, *v, *out, *dout, *dq, *dk, *dv, *data;
  float* lse;
  uint64_t* words; /* done, then the ready words, then the peers' ready words it announces to */
  uint64_t* flags; /* the chunk flags of every slot, all 1: the peers' K/V are there */
  uint64_t* one_words; /* the one-kernel call's: phase words, then its done, then what it announces to */
  uint32_t* exits;
  float* one_ws; /* the one-kernel call's split workspace (NULL: it takes none) */
  struct mk_attn_bwd_args core[EMUL_PLANS][MK_RA_BWD_MAX_CALLS];
  int ncalls[EMUL_PLANS];
  struct mk_ra_bwd_reduce_args reduce;
};

static void emul_alloc(struct emul_rank* e, const struct shape& sh, int s_local, const struct mk_ra_bwd_layout* l,
                       int r) {
  const size_t nq = (size_t)sh.b * s_local * sh.h * sh.d, nkv = l->kv_elems;
  CUDA_OK(cudaMalloc(&e->q, nq * 2));
  CUDA_OK(cudaMalloc(&e->out, nq * 2));
  CUDA_OK(cudaMalloc(&e->dout, nq * 2));
  CUDA_OK(cudaMalloc(&e->dq, nq * 2));
  CUDA_OK(cudaMalloc(&e->k, nkv * 2));
  CUDA_OK(cudaMalloc(&e->v, nkv * 2));
  CUDA_OK(cudaMalloc(&e->dk, nkv * 2));
  CUDA_OK(cudaMalloc(&e->dv, nkv * 2));
  CUDA_OK(cudaMalloc(&e->words, 32 * sizeof(uint64_t)));
  CUDA_OK(cudaMalloc(&e->exits, sizeof(uint32_t)));
  CUDA_OK(cudaMalloc(&e->one_words, EMUL_PUSH_WORDS * sizeof(uint64_t)));
  std::vector<uint64_t> ow(EMUL_PUSH_WORDS, 0);
  for (int i = 2 * EMUL_ONE_WORDS; i < EMUL_PUSH_WORDS; i++) ow[i] = 1ull << 62;
  CUDA_OK(cudaMemcpy(e->one_words, ow.data(), EMUL_PUSH_WORDS * sizeof(uint64_t), cudaMemcpyHostToDevice));
  const size_t nflags = (size_t)l->ready0 > 0 ? (size_t)l->ready0 : 1;
  CUDA_OK(cudaMalloc(&e->flags, nflags * sizeof(uint64_t)));
  std::vector<uint64_t> f(nflags, 1);
  CUDA_OK(cudaMemcpy(e->flags, f.data(), nflags * sizeof(uint64_t), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(e->exits, 0, sizeof(uint32_t)));
  std::vector<uint64_t> w(32, 1);
  w[0] = 0; /* done: every call is call 1 */
  CUDA_OK(cudaMemcpy(e->words, w.data(), 32 * sizeof(uint64_t), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&e->lse, (size_t)sh.b * sh.h * s_local * 4));
  CUDA_OK(cudaMalloc(&e->data, l->total));
  CUDA_OK(cudaMemset(e->data, 0, l->total));
  CUDA_OK(cudaMemset(e->lse, 0, (size_t)sh.b * sh.h * s_local * 4));
  fill_random_bf16(e->q, nq, 100 + r, 1.0f);
  fill_random_bf16(e->out, nq, 200 + r, 1.0f);
  fill_random_bf16(e->dout, nq, 300 + r, 1.0f);
  fill_random_bf16(e->k, nkv, 400 + r, 1.0f);
  fill_random_bf16(e->v, nkv, 500 + r, 1.0f);
  /* the slots (what the gather would have brought): random too */
  fill_random_bf16((char*)e->data + l->slots, (size_t)(l->acc - l->slots) / 2, 600 + r, 1.0f);
}

static void emul_free(struct emul_rank* e) {
  cudaFree(e->q), cudaFree(e->out), cudaFree(e->dout), cudaFree(e->dq), cudaFree(e->k), cudaFree(e->v);
  cudaFree(e->dk), cudaFree(e->dv), cudaFree(e->words), cudaFree(e->exits), cudaFree(e->flags), cudaFree(e->one_words), cudaFree(e->one_ws), cudaFree(e->lse), cudaFree(e->data);
}

/* The compiled backward variant every call runs (MK_ATTN_VARIANT, attn_run.h; 0 the default). */
static int variant;

/* Times `n` back-to-back launches of `calls` (one rank's sequence, or the whole-sequence core),
 * after `prep` (the own-last plan's delta) and before `reduce` where given. */
static float time_calls(const struct mk_attn_bwd_args* calls, int n, cudaEvent_t e0, cudaEvent_t e1,
                        const struct mk_attn_bwd_args* prep = NULL, const struct mk_ra_bwd_reduce_args* reduce = NULL) {
  CUDA_OK(cudaEventRecord(e0));
  if (prep && mk_attn_bwd_prep_launch(prep, 0) != 0) exit(1);
  for (int i = 0; i < n; i++)
    if (mk_attn_bwd_launch_variant(&calls[i], 0, variant) != 0) exit(1);
  if (reduce && mk_ra_bwd_reduce_launch(reduce, 0) != 0) exit(1);
  CUDA_OK(cudaEventRecord(e1));
  CUDA_OK(cudaEventSynchronize(e1));
  float t;
  CUDA_OK(cudaEventElapsedTime(&t, e0, e1));
  return t;
}

/* The core on the whole sequence: its own buffers, freed before the ranks' are made. */
static float time_whole(const struct shape& sh, int iters, cudaEvent_t e0, cudaEvent_t e1,
                        struct mk_gemm_error* err) {
  const size_t nq = (size_t)sh.b * sh.s * sh.h * sh.d, nkv = (size_t)sh.b * sh.s * sh.hkv * sh.d;
  void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *delta, *dq_acc;
  const size_t nl = (size_t)sh.b * sh.h * sh.s;
  void** bf16[] = {&q, &out, &dout, &dq};
  for (void** p : bf16) CUDA_OK(cudaMalloc(p, nq * 2));
  void** kv[] = {&k, &v, &dk, &dv};
  for (void** p : kv) CUDA_OK(cudaMalloc(p, nkv * 2));
  CUDA_OK(cudaMalloc(&dq_acc, nq * 4));
  CUDA_OK(cudaMalloc(&lse, nl * 4));
  CUDA_OK(cudaMalloc(&delta, nl * 4));
  fill_random_bf16(q, nq, 11, 1.0f);
  fill_random_bf16(k, nkv, 12, 1.0f);
  fill_random_bf16(v, nkv, 13, 1.0f);
  fill_random_bf16(out, nq, 14, 1.0f);
  fill_random_bf16(dout, nq, 15, 1.0f);
  CUDA_OK(cudaMemset(lse, 0, nl * 4));
  struct mk_attn_bwd_args a = attn_whole_bwd_args(q, k, v, out, lse, dout, dq, dk, dv, delta, dq_acc, sh.b, sh.s,
                                                  sh.s, sh.h, sh.hkv, sh.d, sh.causal);
  a.err = err;
  const size_t ws_floats = mk_attn_bwd_dkv_ws_floats(&a); /* the core at its best: split GQA heads */
  if (ws_floats) CUDA_OK(cudaMalloc(&a.dkv_ws, ws_floats * 4));
  std::vector<double> ms;
  for (int it = -2; it < iters; it++) {
    const float t = time_calls(&a, 1, e0, e1);
    if (it >= 0) ms.push_back(t);
  }
  cudaFree(a.dkv_ws);
  cudaFree(q), cudaFree(out), cudaFree(dout), cudaFree(dq), cudaFree(k), cudaFree(v), cudaFree(dk), cudaFree(dv);
  cudaFree(dq_acc), cudaFree(lse), cudaFree(delta);
  return (float)perf_median(ms.data(), (int)ms.size());
}

/* The own-last plan's prep (delta, dq_acc zeroed) sits after its calls in core[2]. */
#define EMUL_PREP (MK_RA_BWD_MAX_CALLS - 1)

/* Rank r's one-kernel call as ring_attn_bwd.c's builder makes it, less the push (the slots
 * hold the peers' K/V already) and with its waits satisfied: each peer block announced into a
 * word of this rank's. */
static void emul_one_parts(struct emul_rank* e) {
  struct mk_attn_bwd_args* a = &e->core[EMUL_ONE][0];
  a->phase_words = e->one_words;
  a->call_done = e->one_words + EMUL_ONE_DONE;
  for (int i = 0; i < a->num_kv_blocks; i++)
    if (i != a->addends.block || !a->addends.n) a->kv[i].announce = e->one_words + EMUL_ONE_DONE + 1 + i;
  e->core[EMUL_ONE_GROUP][0] = *a;
  e->ncalls[EMUL_ONE_GROUP] = e->ncalls[EMUL_ONE_PUSH] = e->ncalls[EMUL_ONE];
  const size_t ws = mk_attn_bwd_dkv_ws_floats(a);
  if (ws) CUDA_OK(cudaMalloc(&e->one_ws, ws * sizeof(float)));
  a->dkv_ws = e->one_ws;
  if (!ws) e->ncalls[EMUL_ONE_GROUP] = 0; /* the same call */
}

/* one-push: rank r's one-kernel call with its push CTAs too, run alone: they write r's K/V into
 * each peer's slot as the op's do, and raise the chunk flags that r's own CTAs wait for (the
 * peer's push would raise them), so the peer blocks' CTAs start as the chunks land. The call
 * number moves (its done word is its own), so the flags are waited for in every call; the
 * peers' announcements never hold it back. */
static void emul_one_push(struct emul_rank* e, const struct emul_rank* all, const struct shape& sh, int s_local,
                          const struct mk_ra_bwd_layout* l, int r, int nranks, struct mk_gemm_error* err) {
  struct mk_attn_bwd_args* a = &e->core[EMUL_ONE_PUSH][0];
  *a = e->core[EMUL_ONE][0];
  uint64_t* w = e->one_words + EMUL_ONE_WORDS; /* phase words, done, announcements */
  a->phase_words = w, a->call_done = w + EMUL_ONE_DONE, a->ready_done = w + EMUL_ONE_DONE;
  for (int i = 0; i < a->num_kv_blocks; i++)
    if (a->kv[i].announce) a->kv[i].announce = w + EMUL_ONE_DONE + 1 + i;
  for (int i = 0; i < a->addends.n; i++) a->addends.ready[i] = e->one_words + 2 * EMUL_ONE_WORDS + i;
  struct mk_ra_args ga; /* what the op's push is made from (mk_ra_kv_push) */
  memset(&ga, 0, sizeof ga);
  ga.k = e->k, ga.v = e->v, ga.batch = sh.b, ga.s_local = s_local, ga.kv_heads = sh.hkv, ga.d_head = sh.d;
  ga.rank = r, ga.nranks = nranks, ga.push_ctas = EMUL_PUSH_CTAS, ga.chunk_rows = 128;
  for (int d = 0; d < nranks; d++) {
    if (d == r) continue;
    ga.peer_slot[d] = (char*)all[d].data + l->slots + (size_t)mk_sched_rs_slot(r, d) * 2 * l->kv_elems * 2;
    ga.peer_flags[d] = e->flags + (long)mk_sched_rs_slot(d, r) * l->fps; /* the flags r waits for */
    ga.call.peer_done[d] = a->call_done; /* r's own: its previous call is done */
  }
  ga.call.done = a->call_done, ga.err = err, ga.timeout_ms = 10000;
  mk_ra_kv_push(&ga, l->kv_elems, &a->push);
}

/* Rank r's calls for each plan (the own-last one only non-causal) and its reduce. */
static void emul_plans(struct emul_rank* e, const struct emul_rank* all, const struct shape& sh, int s_local,
                       const struct mk_ra_bwd_layout* l, int r, int nranks, struct mk_gemm_error* err) {
  struct mk_ra_bwd_areas ar;
  memset(&ar, 0, sizeof ar);
  ar.rank = r, ar.nranks = nranks, ar.data = e->data, ar.err = err;
  for (int d = 0; d < nranks; d++) ar.peer_data[d] = all[d].data;
  const struct mk_ra_bwd_tensors t = {e->q,  e->k,     e->v,  e->out,   e->lse, e->dout, e->dq,  sh.b,
                                      s_local, sh.h, sh.hkv, sh.d, sh.causal, e->dk,   e->dv};
  struct mk_ra_bwd_call plan[EMUL_PLANS][MK_RA_BWD_MAX_CALLS];
  int own = 0;
  e->ncalls[0] = mk_ra_bwd_plan(r, nranks, sh.causal, plan[0], MK_RA_BWD_MAX_CALLS, &own);
  e->ncalls[1] = mk_ra_bwd_plan_merged(r, nranks, sh.causal, plan[1], MK_RA_BWD_MAX_CALLS);
  e->ncalls[2] = sh.causal ? 0 : mk_ra_bwd_plan_own_last(r, nranks, 0, plan[2], EMUL_PREP);
  /* the one-kernel call: 2-4 ranks, whole zigzag tiles, and the default variant (its ring kernels' only) */
  const int one_fits = variant == 0 && nranks <= MK_RA_BWD_MAX_SEGS &&
                       (!sh.causal || s_local % (2 * MK_ATTN_BWD_BLOCK_N) == 0);
  e->ncalls[EMUL_ONE] = one_fits ? mk_ra_bwd_plan_one(r, nranks, plan[EMUL_ONE], MK_RA_BWD_MAX_CALLS) : 0;
  for (int pl = 0; pl < EMUL_ONE_GROUP; pl++) { /* one-group: a copy of one's call (emul_one_parts) */
    if (pl >= 1) /* as ring_attn_bwd.c: the peers' segments wait for their chunks (here all there) */
      ar.flags = e->flags, ar.fps = l->fps, ar.chunk_rows = 128, ar.done = e->words;
    if (pl >= 2) ar.ready = e->words + 1, ar.ready_index0 = 1;
    if (e->ncalls[pl] < (pl == 2 && sh.causal ? 0 : pl == EMUL_ONE && !one_fits ? 0 : 1)) exit(1);
    for (int i = 0; i < e->ncalls[pl]; i++) mk_ra_bwd_core_args(&ar, l, &plan[pl][i], &t, &e->core[pl][i]);
  }
  if (e->ncalls[2]) { /* as ring_attn_bwd.c: delta apart, then every call accumulates (no gather: no pdl) */
    e->core[2][EMUL_PREP] = e->core[2][0];
    e->core[2][0].delta_ready = e->core[2][0].dq_accumulate = 1;
  }
  if (e->ncalls[EMUL_ONE]) emul_one_parts(e), emul_one_push(e, all, sh, s_local, l, r, nranks, err);
  for (int pl = EMUL_ONE; pl < EMUL_PLANS; pl++)
    if (e->ncalls[pl] && mk_attn_bwd_check(&e->core[pl][0]) != 0) {
      fprintf(stderr, "rank %d: the one-kernel call's arguments (%d) were refused\n", r, pl);
      exit(1);
    }
  struct mk_ra_bwd_reduce_args* ra = &e->reduce;
  memset(ra, 0, sizeof *ra);
  ra->mode = MK_RA_REDUCE_ALL, ra->own_acc = mk_ra_bwd_acc(e->data, l, r);
  for (int d = 0; d < nranks; d++) /* as ring_attn_bwd.c ra_bwd_reduce_args, every rank's area here */
    if (d != r)
      ra->peer_acc[d] = sh.causal ? mk_ra_bwd_acc(all[d].data, l, r) : mk_ra_bwd_acc(e->data, l, d),
      ra->peer_ready[d] = e->words + 16 + d;
  ra->ready = e->words + 1, ra->dk = e->dk, ra->dv = e->dv, ra->kv_elems = l->kv_elems;
  ra->rank = r, ra->nranks = nranks, ra->err = err;
  ra->call.done = e->words, ra->call.exits = e->exits; /* set_done 0: every call stays call 1 */
}

static const char* const plan_names[EMUL_PLANS] = {"ring", "merged", "own-last", "one", "one-group", "one-push"};

/* -p: the one plan timed (-1: all of them, and the core on the whole sequence). */
static int only_plan = -1;

static void bench(const struct shape& sh, int nranks, int iters) {
  const int s_local = sh.s / nranks;
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  struct mk_gemm_error* err;
  CUDA_OK(cudaMalloc(&err, sizeof *err));
  CUDA_OK(cudaMemset(err, 0, sizeof *err));
  const float whole = only_plan < 0 ? time_whole(sh, iters, e0, e1, err) : 0.f;

  struct mk_ra_bwd_layout l;
  mk_ra_bwd_layout(nranks, sh.b, s_local, sh.h, sh.hkv, sh.d, 128, &l);
  std::vector<struct emul_rank> ranks(nranks);
  for (int r = 0; r < nranks; r++) emul_alloc(&ranks[r], sh, s_local, &l, r);
  for (int r = 0; r < nranks; r++) emul_plans(&ranks[r], ranks.data(), sh, s_local, &l, r, nranks, err);
  std::vector<std::vector<double>> ms(EMUL_PLANS * nranks); /* [plan * nranks + rank] */
  for (int it = -2; it < iters; it++)
    for (int r = 0; r < nranks; r++)
      for (int pl = 0; pl < EMUL_PLANS; pl++) {
        const struct emul_rank* e = &ranks[r];
        if (!e->ncalls[pl] || (only_plan >= 0 && pl != only_plan)) continue;
        const float t = pl == 2          ? time_calls(e->core[pl], e->ncalls[pl], e0, e1, &e->core[pl][EMUL_PREP])
                        : pl >= EMUL_ONE ? time_calls(e->core[pl], e->ncalls[pl], e0, e1)
                                         : time_calls(e->core[pl], e->ncalls[pl], e0, e1, NULL, &e->reduce);
        if (it >= 0) ms[pl * nranks + r].push_back(t);
      }
  struct mk_gemm_error he;
  CUDA_OK(cudaMemcpy(&he, err, sizeof he, cudaMemcpyDeviceToHost));
  const double flops = 10.0 * sh.b * sh.h * (double)sh.s * sh.s * sh.d / (sh.causal ? 2 : 1);
  for (int pl = 0; pl < EMUL_PLANS; pl++) {
    if (!ranks[0].ncalls[pl] || (only_plan >= 0 && pl != only_plan)) continue;
    float slowest = 0.f;
    printf("%3d %4d %4d %4d %6d %7d %-10s %-8s | %9.3f %8.1f |", sh.b, sh.h, sh.hkv, sh.d, sh.s, s_local,
           sh.causal ? "causal" : "non-causal", plan_names[pl], whole, flops / (whole * 1e-3) / 1e12);
    for (int r = 0; r < nranks; r++) {
      const float m = (float)perf_median(ms[pl * nranks + r].data(), (int)ms[pl * nranks + r].size());
      slowest = std::max(slowest, m);
      printf(" r%d %d calls %8.3f |", r, ranks[r].ncalls[pl], m);
    }
    const double per_gpu = flops / nranks / (slowest * 1e-3) / 1e12;
    printf(" %8.1f %6.3f %s\n", per_gpu, whole / nranks / slowest, he.aborted ? "TIMEOUT" : "ok");
  }
  fflush(stdout);
  for (int r = 0; r < nranks; r++) emul_free(&ranks[r]);
  cudaFree(err);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
}

int main(int argc, char** argv) {
  gpu_or_skip();
  int nranks = 2;
  if (argc > 2 && !strcmp(argv[1], "-r")) nranks = atoi(argv[2]), argc -= 2, argv += 2;
  if (argc > 2 && !strcmp(argv[1], "-p")) {
    for (int pl = 0; pl < EMUL_PLANS; pl++)
      if (!strcmp(argv[2], plan_names[pl])) only_plan = pl;
    if (only_plan < 0) {
      fprintf(stderr, "-p %s: one of ring, merged, own-last, one, one-group, one-push\n", argv[2]);
      return 2;
    }
    argc -= 2, argv += 2;
  }
  if (nranks < 2 || nranks > MK_RA_MAX_RANKS) {
    fprintf(stderr, "-r %d: 2 to %d ranks\n", nranks, MK_RA_MAX_RANKS);
    return 2;
  }
  int iters = argc > 1 ? atoi(argv[1]) : 10;
  if (iters < 1) iters = 10;
  variant = attn_test_variant();
  std::vector<struct shape> shapes;
  for (int i = 2; i < argc; i++) {
    struct shape s;
    if (sscanf(argv[i], "%d,%d,%d,%d,%d,%d", &s.b, &s.h, &s.hkv, &s.d, &s.s, &s.causal) != 6 || s.s < 1 ||
        s.s % (2 * nranks * 128)) {
      fprintf(stderr, "bad shape '%s' (B,H,H_kv,D,S,causal; S a multiple of 256 x ranks)\n", argv[i]);
      return 2;
    }
    shapes.push_back(s);
  }
  if (shapes.empty()) /* the issue's three, as ring_attn_perf runs them */
    shapes = {{1, 64, 8, 128, 16384, 1}, {16, 16, 16, 128, 8192, 0}, {1, 64, 8, 128, 65536, 1}};
  printf("# ring_bwd_emul: each rank's backward core calls and reduce of a %d-rank ring on one GPU (no gather or "
         "NVLink), backward variant %d, medians of %d; ms\n",
         nranks, variant, iters);
  printf("#  B    H H_kv    D      S S_local causal     plan     | whole ms  TFLOP/s | per rank: calls, ms | "
         "per-GPU TFLOP/s, whole/n / slowest\n");
  for (const struct shape& s : shapes) bench(s, nranks, iters);
  return 0;
}
