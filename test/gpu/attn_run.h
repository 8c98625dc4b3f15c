/*
 * One attention-core call over a whole sequence, as the tests and benchmarks make it (C, so the
 * ctypes benchmark library shares it): one KV block of seq_kv keys at position 0 against seq_q
 * queries at position 0 (causal: query i sees keys 0..i). The error record and timeout are the
 * caller's to set. And the compiled variant they run (attn.h mk_attn_fwd_launch_variant,
 * mk_attn_bwd_launch_variant): MK_ATTN_VARIANT, a test-only knob outside the library's
 * registry; 0 (the default) when unset.
 */
#ifndef MK_ATTN_RUN_H_
#define MK_ATTN_RUN_H_

#include <stdlib.h>
#include <string.h>

#include "attn.h"

static inline int attn_test_variant(void) {
  const char* v = getenv("MK_ATTN_VARIANT");
  return v ? atoi(v) : 0;
}

/* MK_ATTN_ONE_LAUNCH=1: the backward tests' calls as one launch (mk_attn_bwd_args.phase_words). */
static inline int attn_test_one_launch(void) {
  const char* v = getenv("MK_ATTN_ONE_LAUNCH");
  return v && atoi(v) != 0;
}

static inline struct mk_attn_args attn_whole_fwd_args(const void* q, const void* k, const void* v, void* out,
                                                      float* lse, int batch, int seq_q, int seq_kv, int heads,
                                                      int kv_heads, int d, int causal) {
  struct mk_attn_args a;
  memset(&a, 0, sizeof a);
  a.q = q, a.out = out, a.lse = lse;
  a.batch = batch, a.seq_q = seq_q, a.heads = heads, a.kv_heads = kv_heads, a.d_head = d, a.causal = causal;
  a.num_kv_blocks = 1;
  a.kv[0].k = k, a.kv[0].v = v, a.kv[0].seq = seq_kv;
  return a;
}

static inline struct mk_attn_bwd_args attn_whole_bwd_args(const void* q, const void* k, const void* v, const void* out,
                                                          const float* lse, const void* dout, void* dq, void* dk,
                                                          void* dv, float* delta, float* dq_acc, int batch, int seq_q,
                                                          int seq_kv, int heads, int kv_heads, int d, int causal) {
  struct mk_attn_bwd_args a;
  memset(&a, 0, sizeof a);
  a.q = q, a.out = out, a.dout = dout, a.lse = lse, a.delta = delta, a.dq_acc = dq_acc, a.dq = dq;
  a.batch = batch, a.seq_q = seq_q, a.heads = heads, a.kv_heads = kv_heads, a.d_head = d, a.causal = causal;
  a.num_kv_blocks = 1;
  a.kv[0].k = k, a.kv[0].v = v, a.kv[0].dk = dk, a.kv[0].dv = dv, a.kv[0].seq = seq_kv;
  return a;
}

#endif /* MK_ATTN_RUN_H_ */
