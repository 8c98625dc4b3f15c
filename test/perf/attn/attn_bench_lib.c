/*
 * libmk_attn_bench.so: the attention cores (fused/common/attn.h) behind a small C ABI, so that
 * scripts/bench-torch-attn.py can time them through ctypes in the same process as PyTorch's
 * cuDNN attention, interleaved per iteration (cuDNN's rate moves 10-15% between calls of one
 * session, ours with it: only an interleaved ratio is fair). A benchmark aid, not installed.
 *
 * Tensors as attn.h lays them out: q, out, dout, dq bf16 [batch, seq_q, heads, d]; k, v, dk,
 * dv bf16 [batch, seq_kv, kv_heads, d]; lse, delta fp32 [batch, heads, seq_q]; dq_acc fp32
 * like q. Causal: query i sees keys 0..i (top-left aligned, as torch's is_causal).
 * MK_ATTN_VARIANT=v runs compiled variant v (attn.h mk_attn_fwd_launch_variant and the
 * backward's) instead of the default, for A/B runs against cuDNN.
 * Returns attn.h's codes: 0, -EINVAL (a WARN names the argument), -ENOTSUP, -EIO.
 */
#include "attn_run.h"

#define MK_BENCH_API __attribute__((visibility("default")))

MK_BENCH_API int mk_bench_attn_fwd(const void* q, const void* k, const void* v, void* out, float* lse, int batch,
                                   int seq_q, int seq_kv, int heads, int kv_heads, int d, int causal, void* stream) {
  const struct mk_attn_args a =
      attn_whole_fwd_args(q, k, v, out, lse, batch, seq_q, seq_kv, heads, kv_heads, d, causal);
  return mk_attn_fwd_launch_variant(&a, (cudaStream_t)stream, attn_test_variant());
}

/* dkv_ws: NULL, or mk_bench_attn_bwd_ws_floats() floats (attn.h mk_attn_bwd_args.dkv_ws). */
MK_BENCH_API int mk_bench_attn_bwd(const void* q, const void* k, const void* v, const void* out, const float* lse,
                                   const void* dout, void* dq, void* dk, void* dv, float* delta, float* dq_acc,
                                   float* dkv_ws, int batch, int seq_q, int seq_kv, int heads, int kv_heads, int d,
                                   int causal, void* stream) {
  struct mk_attn_bwd_args a = attn_whole_bwd_args(q, k, v, out, lse, dout, dq, dk, dv, delta, dq_acc, batch, seq_q,
                                                  seq_kv, heads, kv_heads, d, causal);
  a.dkv_ws = dkv_ws;
  return mk_attn_bwd_launch_variant(&a, (cudaStream_t)stream, attn_test_variant());
}

/* The floats of the backward's dkv_ws workspace for these shapes (0: it uses none). */
MK_BENCH_API long long mk_bench_attn_bwd_ws_floats(int batch, int seq_q, int seq_kv, int heads, int kv_heads, int d,
                                                   int causal) {
  const struct mk_attn_bwd_args a = attn_whole_bwd_args(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                                        NULL, batch, seq_q, seq_kv, heads, kv_heads, d, causal);
  return (long long)mk_attn_bwd_dkv_ws_floats(&a);
}
