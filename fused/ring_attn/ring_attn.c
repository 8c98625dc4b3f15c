/*
 * ncclMkRingAttention (issue 11): argument rules, the workspace's slots and flags, one kernel
 * per call (ring_attn.h has the protocol, ring_attn.cu the kernel). Every rank on one host,
 * 2 to 8 ranks, NCCL_MK_FUSED=1 (the data area); there is no reference path yet.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_push.h"
#include "err_text.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "op_check.h"
#include "ra_schedule.h"
#include "ring_attn.h"
#include "schedule.h"

#define MK_RA_NAME "ncclMkRingAttention"
/* 16-byte NVLink stores from 4 SMs reach ~350 GB/s (DESIGN.md), but 8 push CTAs took the forward
 * +2% at S = 16384 causal and B = 16 S_local = 4096, +0.2% at 65536 (6-16 alike; backward
 * within +-1%): a KV block lands sooner (bench/NOTES.md, session 27). */
#define MK_RA_DEFAULT_PUSH_CTAS 8
#define MK_RA_MAX_PUSH_CTAS 32

#define RA_REJECT(...)    \
  do {                    \
    MK_WARN(__VA_ARGS__); \
    return -EINVAL;       \
  } while (0)

/* The rules that need no communicator (ncclInvalidArgument); `name` prefixes the WARN. */
int mk_ra_shape_check(const char* name, const void* lse, size_t batch, size_t s_local, size_t heads, size_t kv_heads,
                      size_t d_head, int causal) {
  if (d_head != 64 && d_head != 128) RA_REJECT("%s: D = %zu, must be 64 or 128", name, d_head);
  if (batch < 1 || batch > 65535) RA_REJECT("%s: B = %zu, must be in [1, 65535]", name, batch);
  if (heads < 1 || heads > 65535) RA_REJECT("%s: H = %zu, must be in [1, 65535]", name, heads);
  if (kv_heads < 1 || heads % kv_heads)
    RA_REJECT("%s: H = %zu must be a positive multiple of H_kv = %zu", name, heads, kv_heads);
  if (causal != 0 && causal != 1) RA_REJECT("%s: causal = %d, must be 0 or 1", name, causal);
  if (s_local < 1 || s_local > (1u << 30))
    RA_REJECT("%s: S_local = %zu, must be in [1, 2^30]", name, s_local);
  if (causal && s_local % 2)
    RA_REJECT("%s: S_local = %zu must be even when causal (the two zigzag chunks)", name, s_local);
  if (batch * s_local > INT32_MAX)
    RA_REJECT("%s: B x S_local = %zu, must be below 2^31", name, batch * s_local);
  if ((uintptr_t)lse % 4) RA_REJECT("%s: lse (%p) is not 4-byte aligned", name, lse);
  return 0;
}

/* The rules that need the communicator (ncclInvalidUsage): 2..8 ranks on one host, the fused
 * workspace, need_bytes of it; and the flags' chunk: the smallest multiple of 128 rows (doubling)
 * whose flags (n-1 slots of them, plus extra_words) fit the word area (ncclInvalidArgument
 * when none does: B too large for the rank count). */
int mk_ra_comm_check(const struct mk_fused_comm* fc, const char* name, size_t need, int batch, int s_local,
                     long extra_words, int* chunk_rows) {
  if (fc->nranks < 2 || fc->nranks > MK_RA_MAX_RANKS || fc->local_size != fc->nranks) {
    MK_WARN("%s: needs 2 to %d ranks, all on one host (this communicator: %d ranks, %d local)", name,
            MK_RA_MAX_RANKS, fc->nranks, fc->local_size);
    return -ENOTSUP;
  }
  if (!fc->fused) {
    MK_WARN("%s: needs NCCL_MK_FUSED=1 at ncclMkCommInit (the peers' K/V slots); there is no "
            "reference path yet", name);
    return -ENOTSUP;
  }
  if (need > mk_fused_data_bytes(fc)) {
    MK_WARN("%s: needs %zu bytes of workspace, %zu are prepared: raise ncclMkConfig's max_m x max(max_n, max_k) "
            "x 2 bytes", name, need, mk_fused_data_bytes(fc));
    return -ENOTSUP;
  }
  int rows = 128;
  while ((long)(fc->nranks - 1) * mk_ra_flags_per_slot(batch, s_local, rows) + extra_words > MK_AG_MAX_BLOCKS &&
         rows < s_local)
    rows *= 2;
  if ((long)(fc->nranks - 1) * mk_ra_flags_per_slot(batch, s_local, rows) + extra_words > MK_AG_MAX_BLOCKS) {
    /* a flag per (peer, sequence) at the least: a limit on B for the rank count, not the workspace's size */
    MK_WARN("%s: B = %d, at most %ld on %d ranks: B x (nranks - 1) + %ld flag words must fit the %d the "
            "communicator has (no setting raises it)", name, batch, (MK_AG_MAX_BLOCKS - extra_words) / (fc->nranks - 1),
            fc->nranks, extra_words, MK_AG_MAX_BLOCKS);
    return -EINVAL;
  }
  *chunk_rows = rows;
  return 0;
}

static int ra_push_ctas(const struct mk_fused_comm* fc) {
  int ctas = fc->cfg.comm_sms ? fc->cfg.comm_sms : MK_RA_DEFAULT_PUSH_CTAS;
  if (ctas > MK_RA_MAX_PUSH_CTAS) ctas = MK_RA_MAX_PUSH_CTAS;
  if (ctas > fc->num_sms / 2) ctas = fc->num_sms / 2;
  return ctas < 1 ? 1 : ctas;
}

/* Everything of the launch arguments but q, out and lse: the slots, the peers' slots and flags,
 * the call words, the error record (tagged `op`). Shared with the backward (ring_attn_bwd.c). */
void mk_ra_fill_args(struct mk_fused_comm* fc, int op, const void* k, const void* v, int batch, int s_local,
                     int heads, int kv_heads, int d_head, int causal, int chunk_rows, size_t kv_bytes,
                     struct mk_ra_args* a) {
  memset(a, 0, sizeof *a);
  a->k = k, a->v = v;
  a->batch = batch, a->s_local = s_local, a->heads = heads, a->kv_heads = kv_heads, a->d_head = d_head;
  a->causal = causal, a->rank = fc->rank, a->nranks = fc->nranks;
  a->push_ctas = ra_push_ctas(fc);
  a->item_chunk = (int)mk_param_int(MK_PARAM_RA_FWD_CHUNK);
  a->chunk_rows = chunk_rows;
  uint64_t* own = (uint64_t*)fc->sym;
  a->slots = (char*)fc->sym + MK_AG_DATA_OFFSET;
  a->flags = own + MK_AG_FLAG0;
  const long fps = mk_ra_flags_per_slot(batch, s_local, chunk_rows);
  mk_ag_call_words(&a->call, fc->rank, fc->nranks, own, 1, 1);
  for (int d = 0; d < fc->nranks; d++) {
    if (d == fc->rank) continue;
    const int slot = mk_sched_rs_slot(fc->rank, d); /* this rank's slot on d */
    a->peer_slot[d] = (char*)fc->peer_sym[d] + MK_AG_DATA_OFFSET + (size_t)slot * 2 * kv_bytes;
    a->peer_flags[d] = (uint64_t*)fc->peer_sym[d] + MK_AG_FLAG0 + slot * fps;
    a->call.peer_done[d] = (const uint64_t*)fc->peer_sym[d] + MK_AG_WORD_DONE;
  }
  a->err = fc->err;
  a->err_tag = mk_op_err_tag(fc, (enum mk_op_id)op);
  a->timeout_ms = (uint32_t)fc->cfg.timeout_ms;
  fc->ra_flags_per_slot = (int)fps;
}

_Static_assert(MK_RA_MAX_RANKS <= MK_ATTN_PUSH_MAX_RANKS, "the push reaches every peer");

void mk_ra_kv_push(const struct mk_ra_args* a, size_t kv_elems, struct mk_kv_push* p) {
  memset(p, 0, sizeof *p);
  p->ctas = a->push_ctas, p->rank = a->rank, p->nranks = a->nranks;
  p->batch = a->batch, p->s_local = a->s_local, p->chunk_rows = a->chunk_rows;
  p->chunks_per_batch = (a->s_local + a->chunk_rows - 1) / a->chunk_rows;
  p->row_vecs = a->kv_heads * a->d_head / 8;
  p->k = a->k, p->v = a->v;
  for (int d = 0; d < a->nranks; d++) {
    if (d == a->rank) continue;
    p->dst_k[d] = a->peer_slot[d];
    p->dst_v[d] = (uint16_t*)a->peer_slot[d] + kv_elems; /* bf16 */
    p->dst_flags[d] = a->peer_flags[d];
    p->peer_done[d] = a->call.peer_done[d];
  }
  p->done = a->call.done;
  p->gave_up = a->gave_up;
  p->err = a->err, p->err_tag = a->err_tag;
  p->timeout_ns = mk_ra_timeout_ns(a->timeout_ms);
}

static int ra_fused(struct mk_fused_comm* fc, const void* q, const void* k, const void* v, void* out, float* lse,
                    int batch, int s_local, int heads, int kv_heads, int d_head, int causal, int chunk_rows,
                    size_t kv_bytes, cudaStream_t stream) {
  struct mk_ra_args a;
  mk_ra_fill_args(fc, MK_OP_RING_ATTN, k, v, batch, s_local, heads, kv_heads, d_head, causal, chunk_rows, kv_bytes,
                  &a);
  a.q = q, a.out = out, a.lse = lse;
  a.persistent = (int)mk_param_int(MK_PARAM_RA_FWD_PERSISTENT);
  if (a.persistent) mk_ag_call_claims(&a.call, (uint64_t*)fc->sym); /* the items' counter */
  return mk_ra_launch(&a, stream);
}

/* A timed-out wait's peer. A push wait (MK_GEMM_ERR_TAG_PUSH) waited for peer flag_index's done
 * word; the backward's "partials ready" word (flag_index from ready0 on) for its slot's source;
 * an attention CTA's wait (flag_index = slot x flags per slot + chunk) for the slot's source; a
 * one-launch call's part wait (MK_GEMM_ERR_TILE_OWN_CTAS) for this call's own CTAs: nobody. */
int mk_ra_hang_source(const struct mk_gemm_error* e, int rank, int nranks, int fps, enum mk_ra_hang_kind* kind) {
  if (mk_gemm_err_tile_is_own_wait(e->tile)) return -1;
  if (e->tag & MK_GEMM_ERR_TAG_PUSH) {
    *kind = MK_RA_HANG_DONE;
    return e->flag_index < (uint32_t)nranks ? (int)e->flag_index : -1;
  }
  if (fps <= 0) return -1;
  const uint32_t ready0 = (uint32_t)(nranks - 1) * (uint32_t)fps;
  const int ready = mk_err_tag_op(e->tag) == MK_OP_RING_ATTN_BWD && e->flag_index >= ready0;
  const int slot = ready ? (int)(e->flag_index - ready0) : (int)(e->flag_index / (uint32_t)fps);
  const int peer = slot < rank ? slot : slot + 1; /* the inverse of mk_sched_rs_slot */
  *kind = ready ? MK_RA_HANG_READY : MK_RA_HANG_CHUNK;
  return peer < nranks ? peer : -1;
}

/* The peer (mk_ra_hang_source) and its progress: the last call it finished, the last call whose
 * partials it announced, or how many of its K/V chunks arrived. */
int mk_ra_hang_peer(struct mk_fused_comm* fc, const struct mk_gemm_error* e, uint64_t* progress, char* what,
                    size_t what_len) {
  const int fps = fc->ra_flags_per_slot;
  enum mk_ra_hang_kind kind;
  const int peer = mk_ra_hang_source(e, fc->rank, fc->nranks, fps, &kind);
  if (peer < 0) return -1;
  if (kind == MK_RA_HANG_DONE) {
    if (!fc->peer_sym[peer] ||
        mk_fused_read(fc, progress, (uint64_t*)fc->peer_sym[peer] + MK_AG_WORD_DONE, 8) != cudaSuccess)
      return -1;
    snprintf(what, what_len, "the last call it finished");
    return peer;
  }
  if (kind == MK_RA_HANG_READY) {
    if (mk_fused_read(fc, progress, (uint64_t*)fc->sym + MK_AG_FLAG0 + e->flag_index, 8) != cudaSuccess)
      return -1;
    snprintf(what, what_len, "the last call whose partial dK/dV it announced");
    return peer;
  }
  const int slot = (int)(e->flag_index / (uint32_t)fps);
  uint64_t* flags = malloc((size_t)fps * 8);
  if (!flags ||
      mk_fused_read(fc, flags, (uint64_t*)fc->sym + MK_AG_FLAG0 + (size_t)slot * fps, (size_t)fps * 8) != cudaSuccess) {
    free(flags);
    return -1;
  }
  *progress = 0;
  for (int i = 0; i < fps; i++) *progress += flags[i] >= e->expected;
  free(flags);
  snprintf(what, what_len, "K/V chunks of its block arrived, of %d", fps);
  return peer;
}

int mk_ra_args_check(const void* q, const void* k, const void* v, const void* out, const float* lse, size_t batch,
                     size_t s_local, size_t heads, size_t kv_heads, size_t d_head, int causal) {
  MK_CHECK(mk_ra_shape_check(MK_RA_NAME, lse, batch, s_local, heads, kv_heads, d_head, causal));
  const size_t qb = batch * s_local * heads * d_head * 2, kb = batch * s_local * kv_heads * d_head * 2;
  const void* all[] = {q, k, v, out, lse};
  const char* names[] = {"q", "k", "v", "out", "lse"};
  const size_t bytes[] = {qb, kb, kb, qb, batch * heads * s_local * 4};
  return mk_op_overlap_check(MK_RA_NAME, all, names, bytes, 5, 3);
}

NCCL_MK_API ncclResult_t ncclMkRingAttention(const void* q, const void* k, const void* v, void* out, float* lse,
                                             size_t batch, size_t s_local, size_t heads, size_t kv_heads,
                                             size_t d_head, int causal, ncclDataType_t type, ncclComm_t comm,
                                             cudaStream_t stream) {
  int rc = mk_ra_args_check(q, k, v, out, lse, batch, s_local, heads, kv_heads, d_head, causal);
  if (rc) return mk_result_from_errno(mk_op_refuse(comm, stream, rc));
  /* the shared checks on the [B x S_local, H x D] view of q and out, [.., H_kv x D] of k, v */
  struct mk_op_call call = {
      .op = MK_OP_RING_ATTN, .name = MK_RA_NAME, .m = batch * s_local, .n = heads * d_head,
      .k = kv_heads * d_head, .type = type, .m_split = 0, .ptrs = {q, k, v, out},
      .ptr_names = {"q", "k", "v", "out"}, .nptrs = 4, .comm = comm, .stream = stream};
  struct mk_fused_comm* fc;
  rc = mk_op_check(&call, &fc);
  if (rc) return mk_result_from_errno(rc);
  const size_t kv_bytes = batch * s_local * kv_heads * d_head * 2;
  int chunk_rows = 0, prev;
  rc = mk_ra_comm_check(fc, MK_RA_NAME, (size_t)(fc->nranks - 1) * 2 * kv_bytes, (int)batch, (int)s_local, 0,
                        &chunk_rows);
  if (rc) return mk_result_from_errno(rc);
  rc = mk_op_device_enter(fc, &prev);
  if (!rc)
    rc = ra_fused(fc, q, k, v, out, lse, (int)batch, (int)s_local, (int)heads, (int)kv_heads, (int)d_head, causal,
                  chunk_rows, kv_bytes, stream);
  mk_op_device_leave(prev);
  return mk_result_from_errno(rc);
}
