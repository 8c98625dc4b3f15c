/*
 * The tuner's in-memory model: measured collective runs and fused-op defaults, as read from
 * the tuning file (plugin/tuner_file.h). Pure functions over a struct the caller owns, so
 * they are unit-tested without NCCL, files or the environment. The process-wide instance
 * that the tuner tables use lives in plugin/tuner_shared.c.
 */
#ifndef MK_TUNER_MODEL_H_
#define MK_TUNER_MODEL_H_

#include <stddef.h>
#include <stdint.h>

#include "abi/tuner_v5.h"

#define MK_TUNER_MAX_CHANNELS 64 /* NCCL's MAXCHANNELS */
#define MK_TUNER_OP_NAME_MAX 32  /* fused-op names, with the terminating NUL */

/* One measured collective: this (algo, proto, nchannels) took time_us at this size. */
struct mk_tuner_point {
  int coll;            /* ncclFunc_t, broadcast .. allreduce */
  int nranks, nnodes;
  int algo, proto;     /* NCCL_ALGO_*, NCCL_PROTO_* */
  int nchannels;       /* 0: NCCL's own channel count was measured */
  uint64_t bytes;      /* NCCL's nBytes: the larger of the send and receive buffers */
  double time_us;
};

/* One measured fused-op configuration for a per-rank shape. */
struct mk_tuner_fused_point {
  char op[MK_TUNER_OP_NAME_MAX]; /* e.g. allgather_gemm, gemm_reducescatter */
  int64_t m, n, k;
  int comm_sms;
  int64_t chunk_bytes;
  double time_us;
};

struct mk_tuner_model {
  struct mk_tuner_point* points;
  size_t npoints, points_cap;
  struct mk_tuner_fused_point* fused;
  size_t nfused, fused_cap;
};

/* What the model recommends for one collective call. */
struct mk_tuner_choice {
  int algo, proto, nchannels;
  double time_us; /* interpolated */
};

/* Bit for (algo, proto) in the allowed-cell masks below. */
static inline uint32_t mk_tuner_cell_bit(int algo, int proto) {
  return 1u << (algo * NCCL_NUM_PROTOCOLS_V5 + proto);
}
#define MK_TUNER_ALL_CELLS ((1u << (NCCL_NUM_ALGORITHMS_V5 * NCCL_NUM_PROTOCOLS_V5)) - 1u)

int mk_tuner_model_add_point(struct mk_tuner_model* model, const struct mk_tuner_point* p);
int mk_tuner_model_add_fused(struct mk_tuner_model* model,
                             const struct mk_tuner_fused_point* p);
/* Sorts the points for lookup and keeps the fastest of repeated measurements.
 * Call once after the last add, before any lookup. */
void mk_tuner_model_finish(struct mk_tuner_model* model);
void mk_tuner_model_free(struct mk_tuner_model* model);

/* How many measured points a communicator of this shape can use (for its INFO line). */
size_t mk_tuner_model_count_shape(const struct mk_tuner_model* model, size_t nranks,
                                  size_t nnodes);

/*
 * The fastest configuration for coll on nranks/nnodes at nbytes, among the cells set in
 * allowed (mk_tuner_cell_bit). A configuration is a candidate only when its measured sizes
 * bracket nbytes; its time there is interpolated linearly between the two nearest measured
 * sizes (time is close to latency + bytes/bandwidth, so linear in bytes). The model never
 * extrapolates: outside the measured range NCCL's own choice stands.
 * Returns 0 with *out set, or -ENOENT.
 */
int mk_tuner_model_choose(const struct mk_tuner_model* model, int coll, size_t nranks,
                          size_t nnodes, uint64_t nbytes, uint32_t allowed,
                          struct mk_tuner_choice* out);

/*
 * Fused-op defaults: among the records of op with exactly this n and k, those measured at
 * the m nearest to the asked one (by ratio: tiles per rank scale with m; equally near, the
 * smaller m), the fastest.
 * Returns 0 with *comm_sms and *chunk_bytes set, or -ENOENT.
 */
int mk_tuner_model_fused(const struct mk_tuner_model* model, const char* op, int64_t m,
                         int64_t n, int64_t k, int* comm_sms, int64_t* chunk_bytes);

#endif /* MK_TUNER_MODEL_H_ */
