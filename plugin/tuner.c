/*
 * ncclTuner_v5_t over the measured model (plugin/tuner_model.h). This file is the edge: it
 * checks what NCCL hands in, asks the model, and edits NCCL's cost table. It never returns
 * an error: NCCL 2.28 wraps getCollInfo in NCCLCHECK, so an error would fail the user's
 * collective where leaving NCCL's own choice is always safe.
 */
#include "tuner.h"

#include <stdio.h>
#include <stdlib.h>

#include "mk_log.h"
#include "mk_param.h"
#include "net.h"
#include "tuner_file.h"
#include "tuner_rule.h"

/* One INFO line per communicator: how many points apply, and up to which size each
 * collective is launch-bound (NCCL's own choice stands there: plugin/tuner_rule.h). */
static void log_shape(const struct mk_tuner_ctx* c) {
  char bounds[256] = "";
  size_t used = 0;
  for (int coll = 0; coll < MK_TUNER_NUM_COLLS && used < sizeof(bounds); coll++) {
    uint64_t lb = mk_tuner_model_launch_bound(c->model, coll, c->nranks, c->nnodes);
    if (lb > 0)
      used += (size_t)snprintf(bounds + used, sizeof(bounds) - used, " %s<=%llu",
                               mk_tuner_coll_name(coll), (unsigned long long)lb);
  }
  MK_INFO(MK_NCCL_SUBSYS_TUNING, "tuner: comm %#llx, %zu ranks on %zu node(s): %zu measured "
          "point(s) apply; launch-bound, NCCL's choice kept:%s", (unsigned long long)c->comm_id,
          c->nranks, c->nnodes, mk_tuner_model_count_shape(c->model, c->nranks, c->nnodes),
          used ? bounds : " none");
}

/* NCCL_MK_TUNER_AB: the communicators of a process alternate, NCCL's side first (the
 * harness's -A creates its NCCL-side communicator, then the tuned one, one GPU per process). */
static int tuner_ab_side_is_nccl(void) {
  static unsigned inits;
  return __atomic_add_fetch(&inits, 1, __ATOMIC_RELAXED) % 2 == 1;
}

ncclResult_t mk_tuner_init(void** ctx, uint64_t comm_id, size_t nranks, size_t nnodes,
                           ncclDebugLogger_t log, ncclNvlDomainInfo_v5_t* nvl_domain_info,
                           ncclTunerConstants_v5_t* constants) {
  mk_log_set_logger(log);
  if (!ctx) {
    MK_WARN("tuner init: ctx is NULL; this communicator keeps NCCL's own choices");
    return ncclSuccess;
  }
  *ctx = NULL; /* getCollInfo and finalize accept NULL: "change nothing" */
  struct mk_tuner_ctx* c = calloc(1, sizeof(*c));
  if (!c) {
    MK_WARN("tuner init: out of memory; this communicator keeps NCCL's own choices");
    return ncclSuccess;
  }
  c->comm_id = comm_id;
  c->nranks = nranks;
  c->nnodes = nnodes;
  c->model = mk_tuner_shared_model();
  if (mk_param_int(MK_PARAM_TUNER_AB) && tuner_ab_side_is_nccl()) {
    c->model = NULL;
    MK_INFO(MK_NCCL_SUBSYS_TUNING, "tuner: comm %#llx is the NCCL side of an A/B run "
            "(NCCL_MK_TUNER_AB=1): NCCL's own choices", (unsigned long long)comm_id);
  }
  /* NCCL's cost-model constants are left alone: the file measures whole choices. */
  if (c->model) log_shape(c);
  *ctx = c;
  return ncclSuccess;
}

/* Cells NCCL will run: in the table we know, and not marked NCCL_ALGO_PROTO_IGNORE (any
 * negative or NaN time counts as "not applicable": never enable what NCCL disabled). */
static uint32_t allowed_cells(const float* table, int num_algo, int num_proto) {
  uint32_t allowed = 0;
  for (int a = 0; a < num_algo && a < NCCL_NUM_ALGORITHMS_V5; a++)
    for (int p = 0; p < num_proto && p < NCCL_NUM_PROTOCOLS_V5; p++)
      if (table[a * num_proto + p] >= 0.0f) allowed |= mk_tuner_cell_bit(a, p);
  return allowed;
}

/* The cell NCCL will pick without us, as topoGetAlgoInfo does (src/enqueue.cc): the first
 * smallest non-negative cost. -1/-1 when none, or when it is outside the cells we know. */
static void nccl_own_choice(const float* table, int num_algo, int num_proto, int* algo,
                            int* proto) {
  float best = 0.0f;
  *algo = *proto = -1;
  for (int a = 0; a < num_algo; a++)
    for (int p = 0; p < num_proto; p++) {
      float t = table[a * num_proto + p];
      if (t >= 0.0f && (*algo < 0 || t < best)) best = t, *algo = a, *proto = p;
    }
  if (*algo >= NCCL_NUM_ALGORITHMS_V5 || *proto >= NCCL_NUM_PROTOCOLS_V5) *algo = *proto = -1;
}

static void warn_bad_table_once(struct mk_tuner_ctx* c, const void* table, int num_algo,
                                int num_proto) {
  if (c->warned_bad_args) return;
  c->warned_bad_args = 1;
  MK_WARN("tuner getCollInfo: cost table %p of %d x %d; NCCL's own choice stands", table,
          num_algo, num_proto);
}

ncclResult_t mk_tuner_get_coll_info(void* ctx, ncclFunc_t coll, size_t nbytes,
                                    int num_pipe_ops, float** cost_table, int num_algo,
                                    int num_proto, int reg_buff, int* nchannels) {
  struct mk_tuner_ctx* c = ctx;
  if (!c || !c->model || c->model->npoints == 0) return ncclSuccess;
  if ((int)coll < 0 || (int)coll >= MK_TUNER_NUM_COLLS) return ncclSuccess; /* not tuned */
  if (!cost_table || num_algo <= 0 || num_proto <= 0) {
    warn_bad_table_once(c, cost_table, num_algo, num_proto);
    return ncclSuccess;
  }
  /* A float[numAlgo][numProto] array cast to float**: index it flat. */
  float* table = (float*)cost_table;
  struct mk_tuner_query q = {(int)coll, c->nranks, c->nnodes, nbytes,
                             allowed_cells(table, num_algo, num_proto), -1, -1};
  nccl_own_choice(table, num_algo, num_proto, &q.nccl_algo, &q.nccl_proto);
  struct mk_tuner_choice choice;
  if (mk_tuner_rule_decide(c->model, &q, &choice) < 0) return ncclSuccess; /* NCCL's stands */
  table[choice.algo * num_proto + choice.proto] = 0.0f; /* NCCL takes the minimum */
  if (choice.nchannels > 0 && nchannels) *nchannels = choice.nchannels;
  MK_TRACE(MK_NCCL_SUBSYS_TUNING, "tuner: %s %zu bytes -> %s/%s nchannels %d (%.1f us)",
           mk_tuner_coll_name((int)coll), nbytes, mk_tuner_algo_name(choice.algo),
           mk_tuner_proto_name(choice.proto), choice.nchannels, choice.time_us);
  return ncclSuccess;
}

ncclResult_t mk_tuner_finalize(void* ctx) {
  free(ctx);
  return ncclSuccess;
}

MK_EXPORT const ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = "mk",
    .init = mk_tuner_init,
    .getCollInfo = mk_tuner_get_coll_info,
    .finalize = mk_tuner_finalize,
};
