/*
 * ncclMkMoeDispatchGemm, ncclMkMoeGemmCombine and their layouts (the kernels and the protocol
 * are in moe.h). Every rank must share this host: peers are reached by load/store. A rank may
 * have 0 tokens in a call (mk_op_call.m_may_be_zero); it still runs every kernel for its peers.
 *
 * NCCL_MK_MOE_OVERLAP=0 (the default) gives the dispatch's comm kernel every SM, then runs the
 * grouped GEMM on every SM; 1 runs the comm kernel on 12 SMs beside the GEMM, which starts each
 * expert once its rows are in. On 2 H200s the first is faster at every shape measured
 * (bench/NOTES.md): an expert's rows come from every source, so experts become ready late,
 * and the GEMM then runs on 120 SMs throughout.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ag_push.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "moe.h"
#include "op_check.h"

#define MOE_PUSH_CTAS 4
#define MOE_EXPAND_CTAS 8

struct ncclMkMoeLayout {
  ncclComm_t comm;
  uint64_t generation;            /* the comm's init it was sized from (fused_comm.h) */
  int* group_offsets;             /* [MK_MOE_MAX_LOCAL_EXPERTS + 1] */
  int* row_source;                /* [max_recv_rows][3] */
  int* slot_dest;                 /* [max_tokens][max_topk] */
  unsigned long long* rows_sent;
  int max_recv_rows;
  int dispatched, tokens, topk, num_experts, e_local; /* the last dispatch's (host) */
  struct ncclMkMoeLayout* next;   /* in the live layouts */
};

/* The live layouts (made by ncclMkMoeLayoutCreate, not yet destroyed): a handle not among them
 * (destroyed already, or never made) is refused before it is read or freed. */
static pthread_mutex_t layouts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclMkMoeLayout* layouts;

static void layout_add(struct ncclMkMoeLayout* l) {
  pthread_mutex_lock(&layouts_lock);
  l->next = layouts, layouts = l;
  pthread_mutex_unlock(&layouts_lock);
}

/* 1 when l is live; with `take`, it is no longer (the caller frees it). */
static int layout_find(const struct ncclMkMoeLayout* l, int take) {
  pthread_mutex_lock(&layouts_lock);
  struct ncclMkMoeLayout** at = &layouts;
  while (*at && *at != l) at = &(*at)->next;
  const int live = *at != NULL;
  if (live && take) *at = l->next;
  pthread_mutex_unlock(&layouts_lock);
  return live;
}

/* 1 when l is live (with `take`, no longer: the caller frees it); else 0 after a WARN. */
static int layout_live(const char* op, ncclMkMoeLayout_t l, int take) {
  if (!l) {
    MK_WARN("%s: layout is NULL", op);
    return 0;
  }
  if (layout_find(l, take)) return 1;
  MK_WARN("%s: layout %p is not one of ncclMkMoeLayoutCreate's live layouts (destroyed already?)", op, (void*)l);
  return 0;
}

static void layout_free(struct ncclMkMoeLayout* l) {
  cudaFree(l->group_offsets);
  cudaFree(l->row_source);
  cudaFree(l->slot_dest);
  cudaFree(l->rows_sent);
  free(l);
}

static size_t moe_take(size_t* at, size_t bytes) {
  size_t off = *at;
  *at += (bytes + 255) & ~(size_t)255;
  return off;
}

size_t mk_moe_geom_layout(struct mk_moe_geom* g) {
  const size_t nr = (size_t)g->nranks, t = (size_t)g->max_tokens, h = (size_t)g->max_hidden;
  const size_t meta = (size_t)(MK_MOE_META_HEAD + g->max_topk) * 4, chunks = (t + MK_MOE_CHUNK_ROWS - 1) / MK_MOE_CHUNK_ROWS;
  size_t at = 0;
  g->counts_flag = moe_take(&at, MK_MOE_MAX_RANKS * 8);
  g->comb_flag = moe_take(&at, (size_t)MK_MOE_MAX_RANKS * 8);
  g->counts = moe_take(&at, (size_t)MK_MOE_MAX_RANKS * MK_MOE_COUNT_STRIDE * 4);
  g->chunk_flag = moe_take(&at, (size_t)MK_MOE_MAX_RANKS * chunks * 8);
  g->meta = moe_take(&at, nr * t * meta);
  g->recv = moe_take(&at, nr * t * h * 2);
  g->comb = moe_take(&at, t * (size_t)g->max_topk * h * 2);
  g->ready = moe_take(&at, MK_MOE_MAX_LOCAL_EXPERTS * 8);
  g->rows_done = moe_take(&at, MK_MOE_MAX_LOCAL_EXPERTS * 4);
  g->route_done = moe_take(&at, 4);
  g->expand_next = moe_take(&at, 4);
  g->claims = moe_take(&at, MK_MOE_CLAIMS * 4);
  g->routed = moe_take(&at, 8);
  g->offsets_ready = moe_take(&at, 8);
  g->send_counts = moe_take(&at, (size_t)MK_MOE_MAX_RANKS * MK_MOE_COUNT_STRIDE * 4);
  g->send_list = moe_take(&at, nr * t * 4);
  g->send_meta = moe_take(&at, nr * t * meta);
  g->seg = moe_take(&at, (size_t)MK_MOE_MAX_LOCAL_EXPERTS * MK_MOE_MAX_RANKS * 4);
  g->rows = moe_take(&at, (size_t)g->max_recv_rows * h * 2);
  g->bytes = at;
  return at;
}

NCCL_MK_API ncclResult_t ncclMkMoeLayoutCreate(ncclComm_t comm, ncclMkMoeLayout_t* layout) {
  if (!comm || !layout) {
    MK_WARN("ncclMkMoeLayoutCreate: %s is NULL", comm ? "layout" : "comm");
    return mk_result_from_errno(mk_op_refuse(comm, NULL, -EINVAL));
  }
  struct mk_fused_comm* fc;
  int prev, rc = mk_fused_comm_get(comm, NULL, &fc);
  if (rc) return mk_result_from_errno(rc);
  if (!fc->moe_bytes && fc->nranks > MK_MOE_MAX_RANKS) {
    MK_WARN("ncclMkMoeLayoutCreate: the MoE ops take at most %d ranks, this communicator has %d",
            MK_MOE_MAX_RANKS, fc->nranks);
    return ncclInvalidUsage;
  }
  if (!fc->moe_bytes) {
    MK_WARN("ncclMkMoeLayoutCreate: the communicator has no MoE workspace: set ncclMkConfig.moe_max_tokens, "
            "moe_max_hidden and moe_max_topk before ncclMkCommInit");
    return ncclInvalidUsage;
  }
  struct ncclMkMoeLayout* l = calloc(1, sizeof(*l));
  if (!l) return ncclSystemError;
  l->comm = comm, l->generation = fc->generation;
  l->max_recv_rows = fc->cfg.moe_max_recv_rows;
  rc = mk_op_device_enter(fc, &prev);
  const size_t slots = (size_t)fc->cfg.moe_max_tokens * fc->cfg.moe_max_topk;
  if (!rc) rc = mk_cuda_check(cudaMalloc((void**)&l->group_offsets, (MK_MOE_MAX_LOCAL_EXPERTS + 1) * 4), "cudaMalloc (layout)");
  if (!rc) rc = mk_cuda_check(cudaMalloc((void**)&l->row_source, (size_t)l->max_recv_rows * 12), "cudaMalloc (layout)");
  if (!rc) rc = mk_cuda_check(cudaMalloc((void**)&l->slot_dest, slots * 4), "cudaMalloc (layout)");
  if (!rc) rc = mk_cuda_check(cudaMalloc((void**)&l->rows_sent, 8), "cudaMalloc (layout)");
  /* zeroed before the layout is handed out: on the internal stream, synchronised, as the
   * caller's stream need not wait for the legacy stream that cudaMemset uses */
  if (!rc)
    rc = mk_cuda_check(
        cudaMemsetAsync(l->group_offsets, 0, (MK_MOE_MAX_LOCAL_EXPERTS + 1) * 4, fc->internal),
        "cudaMemset");
  if (!rc) rc = mk_cuda_check(cudaMemsetAsync(l->rows_sent, 0, 8, fc->internal), "cudaMemset");
  if (!rc)
    rc = mk_cuda_check(cudaStreamSynchronize(fc->internal), "cudaStreamSynchronize (layout)");
  mk_op_device_leave(prev);
  if (rc) {
    layout_free(l);
    return mk_result_from_errno(rc);
  }
  layout_add(l);
  *layout = l;
  return ncclSuccess;
}

NCCL_MK_API ncclResult_t ncclMkMoeLayoutDestroy(ncclMkMoeLayout_t l) {
  if (!layout_live("ncclMkMoeLayoutDestroy", l, 1)) return ncclInvalidArgument;
  layout_free(l);
  return ncclSuccess;
}

NCCL_MK_API ncclResult_t ncclMkMoeLayoutGetInfo(ncclMkMoeLayout_t l, ncclMkMoeLayoutInfo* info) {
  if (!info) {
    MK_WARN("ncclMkMoeLayoutGetInfo: info is NULL");
    return ncclInvalidArgument;
  }
  if (!layout_live("ncclMkMoeLayoutGetInfo", l, 0)) return ncclInvalidArgument;
  info->group_offsets = l->group_offsets;
  info->row_source = l->row_source;
  info->rows_sent = l->rows_sent;
  info->max_recv_rows = l->max_recv_rows;
  info->experts_local = l->e_local;
  return ncclSuccess;
}

/* What both ops check of the layout before reading it: live, this communicator's, of its
 * last init. */
static int moe_layout_check(const char* op, const struct mk_fused_comm* fc, ncclMkMoeLayout_t l, ncclComm_t comm) {
  if (!layout_live(op, l, 0)) return -EINVAL;
  if (l->comm != comm) {
    MK_WARN("%s: layout was made for another communicator", op);
    return -EINVAL;
  }
  if (l->generation != fc->generation) { /* its buffers were sized from an earlier config */
    MK_WARN("%s: layout was made before this communicator's last ncclMkCommInit: create it again", op);
    return -EINVAL;
  }
  return 0;
}

/* What both ops check beyond mk_op_check and the layout: the workspace, the MoE shape limits. */
static int moe_check(const char* op, const struct mk_fused_comm* fc, size_t tokens, size_t hidden, int topk,
                     int num_experts) {
  const ncclMkConfig* c = &fc->cfg;
  if (fc->local_size != fc->nranks || fc->nranks > MK_MOE_MAX_RANKS) {
    MK_WARN("%s: every rank must share this host (%d of %d do), at most %d ranks", op, fc->local_size,
            fc->nranks, MK_MOE_MAX_RANKS);
    return -ENOTSUP;
  }
  if (!fc->moe_bytes) {
    MK_WARN("%s: no MoE workspace: set ncclMkConfig.moe_max_* before ncclMkCommInit", op);
    return -ENOTSUP;
  }
  if (tokens > (size_t)c->moe_max_tokens || hidden > (size_t)c->moe_max_hidden || topk < 1 ||
      topk > c->moe_max_topk || topk > MK_MOE_MAX_TOPK) {
    MK_WARN("%s: tokens %zu, hidden %zu, topk %d exceed the configured moe_max_tokens %d, moe_max_hidden %d, "
            "moe_max_topk %d (topk at most %d)", op, tokens, hidden, topk, c->moe_max_tokens, c->moe_max_hidden,
            c->moe_max_topk, MK_MOE_MAX_TOPK);
    return -EINVAL;
  }
  if (num_experts < fc->nranks || num_experts % fc->nranks || num_experts / fc->nranks > MK_MOE_MAX_LOCAL_EXPERTS) {
    MK_WARN("%s: num_experts %d must be a positive multiple of the %d ranks, at most %d per rank", op, num_experts,
            fc->nranks, MK_MOE_MAX_LOCAL_EXPERTS);
    return -EINVAL;
  }
  return 0;
}

static void moe_args_fill(struct mk_fused_comm* fc, ncclMkMoeLayout_t l, enum mk_op_id op, struct mk_moe_args* a) {
  memset(a, 0, sizeof(*a));
  a->g = fc->moe_geom;
  a->rank = fc->rank, a->nranks = fc->nranks;
  for (int p = 0; p < fc->nranks; p++) {
    a->moe[p] = (char*)fc->peer_sym[p] + fc->moe_offset;
    a->words[p] = (uint64_t*)fc->peer_sym[p];
  }
  a->tokens = l->tokens, a->topk = l->topk, a->num_experts = l->num_experts, a->e_local = l->e_local;
  a->group_offsets = l->group_offsets, a->row_source = l->row_source, a->slot_dest = l->slot_dest;
  a->rows_sent = l->rows_sent;
  a->fp8 = fc->cfg.moe_dispatch_fp8;
  a->err = fc->err;
  /* these kernels' waits are the op's communication role's, not a GEMM tile's (err_text.c) */
  a->err_tag = mk_op_err_tag(fc, op) | MK_GEMM_ERR_TAG_PUSH;
  a->timeout_ns = (uint64_t)fc->cfg.timeout_ms * 1000000u;
}

/* The grouped GEMM over the layout's groups; m is the capacity (the offsets end earlier). */
static void moe_gemm_args(struct mk_fused_comm* fc, enum mk_op_id op, const struct mk_moe_args* a,
                          struct mk_gemm_args* g) {
  mk_op_gemm_args(fc, op, g);
  g->m = a->g.max_recv_rows;
  g->num_groups = a->e_local;
  g->group_offsets = a->group_offsets;
  g->block_m = mk_moe_gemm_block_m(a->tokens, a->topk, a->nranks, a->num_experts);
}

/* The bracket of a MoE GEMM (gemm.h struct mk_gemm_call), for the claimed walk: its counter
 * (word 3, 0 between calls: the last CTA zeroes it) and exit count; the call's done word, which
 * the finishing kernel (mk_moe_finish_launch) raises, not the GEMM; the peers' done words. The
 * dispatch and combine GEMMs run one after the other on the caller's stream, so they share it. */
static void moe_gemm_bracket(const struct mk_moe_args* a, struct mk_gemm_call* call) {
  mk_ag_call_words(call, a->rank, a->nranks, a->words[a->rank], 0, 0);
  mk_ag_call_claims(call, a->words[a->rank]);
  for (int d = 0; d < a->nranks; d++)
    if (d != a->rank) call->peer_done[d] = a->words[d] + MK_AG_WORD_DONE;
}

static int moe_dispatch_launch(struct mk_fused_comm* fc, struct mk_moe_args* a, const void* w1, void* act,
                               size_t inter, cudaStream_t stream) {
  const int overlap = (int)mk_param_int(MK_PARAM_MOE_OVERLAP);
  a->mark_ready = overlap; /* only a GEMM beside the dispatch waits on the per-expert flags */
  a->push_ctas = overlap ? MOE_PUSH_CTAS : fc->num_sms / 4;
  a->expand_ctas = overlap ? MOE_EXPAND_CTAS : fc->num_sms - a->push_ctas;
  const int ctas = a->push_ctas + a->expand_ctas;
  /* NCCL_MK_TRACE: the dispatch kernel's phases on each CTA's comm lane, the GEMM's tiles on the
   * others (fused/common/trace.h) */
  MK_CHECK(mk_trace_comm_begin(fc, MK_OP_MOE_DISPATCH, (uint32_t)a->tokens, (uint32_t)inter, stream, &a->trace));
  MK_CHECK(mk_moe_begin_launch(a, 1, stream));
  /* beside the GEMM, its scheduler needs the offsets before it starts: route first */
  if (overlap) MK_CHECK(mk_moe_dispatch_launch(a, MK_MOE_PHASE_ROUTE, fc->num_sms, stream));
  struct mk_gemm_args g;
  struct mk_gemm_call call;
  moe_gemm_args(fc, MK_OP_MOE_DISPATCH, a, &g);
  moe_gemm_bracket(a, &call);
  g.n = (int)inter, g.k = a->hidden;
  g.a = a->moe[a->rank] + a->g.rows, g.b = w1, g.c = act;
  g.trace = a->trace, g.call = &call; /* the claimed walk: no tile waits for a late CTA */
  if (overlap) {
    g.ready_flags = (const uint64_t*)(a->moe[a->rank] + a->g.ready);
    g.ready_target_ptr = a->words[a->rank] + MK_AG_WORD_CALL;
    g.num_sms = fc->num_sms - a->push_ctas - a->expand_ctas;
  }
  if (overlap) {
    /* the GEMM as the comm kernel's programmatic dependent (gemm.h pdl): on another stream it
     * could take every free SM first and wait for rows that the comm kernel, left without
     * one, never sent (test_moe busy_sms under MPS) */
    MK_CHECK(mk_moe_dispatch_launch(a, MK_MOE_PHASE_COMM, ctas, stream));
    g.pdl = 1;
  } else {
    MK_CHECK(mk_cuda_check(cudaEventRecord(fc->ev_fork, stream), "cudaEventRecord (fork)"));
    MK_CHECK(mk_cuda_check(cudaStreamWaitEvent(fc->side, fc->ev_fork, 0), "cudaStreamWaitEvent"));
    MK_CHECK(mk_moe_dispatch_launch(a, MK_MOE_PHASE_ROUTE | MK_MOE_PHASE_COMM, ctas, fc->side));
    MK_CHECK(mk_cuda_check(cudaEventRecord(fc->ev_join, fc->side), "cudaEventRecord (join)"));
    MK_CHECK(mk_cuda_check(cudaStreamWaitEvent(stream, fc->ev_join, 0), "cudaStreamWaitEvent"));
  }
  MK_CHECK(mk_gemm_launch(&g, stream));
  MK_CHECK(mk_moe_finish_launch(a, stream));
  return mk_trace_comm_end(fc, stream);
}

NCCL_MK_API ncclResult_t ncclMkMoeDispatchGemm(const void* x, const int* topk_idx, const void* w1, void* act,
                                               size_t tokens, size_t hidden, size_t inter, int topk,
                                               int num_experts, ncclMkMoeLayout_t layout, ncclDataType_t type,
                                               ncclComm_t comm, cudaStream_t stream) {
  struct mk_op_call call = {
      .op = MK_OP_MOE_DISPATCH, .name = "ncclMkMoeDispatchGemm", .m = tokens, .n = inter, .k = hidden,
      .dims = {"tokens", "inter", "hidden"}, .type = type, .m_may_be_zero = 1, .ptrs = {x, topk_idx, w1, act}, .ptr_names = {"x", "topk_idx", "w1", "act"},
      .nptrs = 4, .m_rows_ptrs = 0x3 /* x, topk_idx */, .comm = comm, .stream = stream};
  struct mk_fused_comm* fc;
  int prev, rc = mk_op_check(&call, &fc);
  if (!rc) rc = moe_layout_check(call.name, fc, layout, comm);
  if (!rc) rc = moe_check(call.name, fc, tokens, hidden, topk, num_experts);
  if (!rc) {
    const size_t e_local = (size_t)(num_experts / fc->nranks);
    /* x, topk_idx, w1 [E_local, inter, hidden] read; act [max_recv_rows, inter] written */
    const size_t bytes[] = {tokens * hidden * 2, tokens * (size_t)topk * 4, e_local * inter * hidden * 2,
                            (size_t)layout->max_recv_rows * inter * 2};
    rc = mk_op_overlap_check(call.name, call.ptrs, call.ptr_names, bytes, 4, 3);
  }
  if (rc) return mk_result_from_errno(rc);
  layout->dispatched = 1, layout->tokens = (int)tokens, layout->topk = topk;
  layout->num_experts = num_experts, layout->e_local = num_experts / fc->nranks;
  struct mk_moe_args a;
  moe_args_fill(fc, layout, MK_OP_MOE_DISPATCH, &a);
  a.hidden = (int)hidden;
  a.x = x, a.topk_idx = topk_idx;
  rc = mk_op_device_enter(fc, &prev);
  if (!rc) rc = moe_dispatch_launch(fc, &a, w1, act, inter, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}

/* The combine GEMM's epilogue sends each row to its source (moe.h): the scatter and the
 * bracket that raises every source's flag once this rank's rows are all there. */
static void moe_combine_scatter(const struct mk_moe_args* a, struct mk_gemm_scatter* sc, struct mk_gemm_call* call) {
  memset(sc, 0, sizeof(*sc));
  moe_gemm_bracket(a, call);
  sc->row_dest = a->row_source, sc->row_mult = a->g.max_topk;
  for (int d = 0; d < a->nranks; d++) {
    sc->base[d] = a->moe[d] + a->g.comb;
    call->notify[d] = (uint64_t*)(a->moe[d] + a->g.comb_flag) + a->rank;
  }
}

static int moe_combine_launch(struct mk_fused_comm* fc, struct mk_moe_args* a, const void* act, const void* w2,
                              size_t inter, cudaStream_t stream) {
  MK_CHECK(mk_moe_begin_launch(a, 0, stream));
  struct mk_gemm_scatter sc;
  struct mk_gemm_call call;
  moe_combine_scatter(a, &sc, &call);
  struct mk_gemm_args g;
  moe_gemm_args(fc, MK_OP_MOE_COMBINE, a, &g);
  g.n = a->hidden, g.k = (int)inter;
  g.a = act, g.b = w2, g.c = a->moe[a->rank] + a->g.rows; /* unused: every row is scattered */
  g.scatter = &sc, g.call = &call;
  MK_CHECK(mk_gemm_launch(&g, stream));
  MK_CHECK(mk_moe_reduce_launch(a, stream));
  return mk_moe_finish_launch(a, stream);
}

NCCL_MK_API ncclResult_t ncclMkMoeGemmCombine(const void* act, const void* w2, const float* topk_weights, void* out,
                                              size_t tokens, size_t hidden, size_t inter, ncclMkMoeLayout_t layout,
                                              ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  struct mk_op_call call = {
      .op = MK_OP_MOE_COMBINE, .name = "ncclMkMoeGemmCombine", .m = tokens, .n = hidden, .k = inter,
      .dims = {"tokens", "hidden", "inter"}, .type = type, .m_may_be_zero = 1, .ptrs = {act, w2, topk_weights, out},
      .ptr_names = {"act", "w2", "topk_weights", "out"}, .nptrs = 4, .m_rows_ptrs = 0xc /* topk_weights, out */,
      .comm = comm, .stream = stream};
  struct mk_fused_comm* fc;
  int prev, rc = mk_op_check(&call, &fc);
  if (!rc) rc = moe_layout_check(call.name, fc, layout, comm);
  if (!rc && (!layout->dispatched || (size_t)layout->tokens != tokens)) {
    MK_WARN("%s: tokens %zu, but the layout's dispatch %s %d", call.name, tokens,
            layout->dispatched ? "had" : "has not run: tokens", layout->tokens);
    rc = -EINVAL;
  }
  if (!rc) rc = moe_check(call.name, fc, tokens, hidden, layout->topk, layout->num_experts);
  if (!rc) {
    const size_t e_local = (size_t)(layout->num_experts / fc->nranks);
    /* act, w2 [E_local, hidden, inter], topk_weights read; out [tokens, hidden] written */
    const size_t bytes[] = {(size_t)layout->max_recv_rows * inter * 2, e_local * hidden * inter * 2,
                            tokens * (size_t)layout->topk * 4, tokens * hidden * 2};
    rc = mk_op_overlap_check(call.name, call.ptrs, call.ptr_names, bytes, 4, 3);
  }
  if (rc) return mk_result_from_errno(rc);
  struct mk_moe_args a;
  moe_args_fill(fc, layout, MK_OP_MOE_COMBINE, &a);
  a.hidden = (int)hidden;
  a.topk_weights = topk_weights, a.out = out;
  rc = mk_op_device_enter(fc, &prev);
  if (!rc) rc = moe_combine_launch(fc, &a, act, w2, inter, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
