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

/*
 * Per shape (collective, ranks, nodes), from its points: the fastest time of the whole sweep
 * (the per-call floor) and the largest measured size the calibration cannot resolve
 * (plugin/tuner_limits.c).
 */
struct mk_tuner_shape_limit {
  int coll, nranks, nnodes;
  double floor_us;
  uint64_t launch_bound_bytes; /* 0: no size is launch-bound */
};

/* The sizes a keep record covers: [from, to). */
struct mk_tuner_keep_span {
  uint64_t from, to;
};

struct mk_tuner_model {
  struct mk_tuner_point* points;
  size_t npoints, points_cap;
  struct mk_tuner_point* keeps; /* "keep" records: only coll, nranks, nnodes, bytes */
  size_t nkeeps, keeps_cap;
  struct mk_tuner_keep_span* keep_spans; /* one per keep, set by mk_tuner_model_finish */
  struct mk_tuner_fused_point* fused;
  size_t nfused, fused_cap;
  struct mk_tuner_shape_limit* limits; /* one per shape, set by mk_tuner_model_finish */
  size_t nlimits;
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
int mk_tuner_model_add_keep(struct mk_tuner_model* model, const struct mk_tuner_point* p);
/* Sorts the points for lookup, keeps the fastest of repeated measurements and finds each
 * shape's limits. Call once after the last add, before any lookup. Should the limits not
 * fit in memory, the collective points are dropped (NCCL's choices stand). */
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

/* The time of one configuration (algo, proto, nchannels as measured) at nbytes, interpolated
 * as in mk_tuner_model_choose. Returns 0 with *time_us set, or -ENOENT when it was not
 * measured around nbytes. */
int mk_tuner_model_time(const struct mk_tuner_model* model, int coll, size_t nranks,
                        size_t nnodes, uint64_t nbytes, int algo, int proto, int nchannels,
                        double* time_us);

/*
 * "keep" records (scripts/tune.sh writes them where the calibration found no clear gain over
 * NCCL's own choice, and where the check found the tuned runs slower): NCCL's own choice
 * stands for any size within a factor 2 of a kept size and nearer to it (by ratio) than to
 * the measured sizes of the shape on either side. In a 4x sweep that is [k/2, 2k), as far as
 * halfway to each neighbour; in a 2x sweep [k/1.41, 1.41k): a keep never covers a neighbour,
 * which may be a clear gain of its own. 1 or 0.
 */
int mk_tuner_model_kept(const struct mk_tuner_model* model, int coll, size_t nranks,
                        size_t nnodes, uint64_t nbytes);

/*
 * Launch-bound sizes: a measured size at which some configuration ran in less than
 * MK_TUNER_LAUNCH_BOUND_FACTOR times the fastest time of the shape's sweep is dominated by
 * the per-call cost (launch, host enqueue), not by the data. The calibration of 2xH200 in
 * session 19 shows that regime's spread: one configuration read ~6.5 us at some sizes and
 * ~10.3 us at others from 8 B to 512 KiB (1.6x, bimodal), so differences between
 * configurations there are below what the calibration resolves, and a choice made from them
 * lost up to 34% against NCCL's own. Returns the largest such size of the shape (every size
 * up to it is left to NCCL), or 0.
 */
#define MK_TUNER_LAUNCH_BOUND_FACTOR 2.0
uint64_t mk_tuner_model_launch_bound(const struct mk_tuner_model* model, int coll,
                                     size_t nranks, size_t nnodes);
/* Computes model->limits from the finished (sorted) points; -ENOMEM. */
int mk_tuner_model_find_limits(struct mk_tuner_model* model);
/* Computes model->keep_spans from the keeps and the finished points; -ENOMEM (the keeps then
 * cover 2x either way). */
int mk_tuner_model_find_keep_spans(struct mk_tuner_model* model);

/*
 * Fused-op defaults: among the records of op with exactly this n and k, those measured at
 * the m nearest to the asked one (by ratio: tiles per rank scale with m; equally near, the
 * smaller m), the fastest.
 * Returns 0 with *comm_sms and *chunk_bytes set, or -ENOENT.
 */
int mk_tuner_model_fused(const struct mk_tuner_model* model, const char* op, int64_t m,
                         int64_t n, int64_t k, int* comm_sms, int64_t* chunk_bytes);

#endif /* MK_TUNER_MODEL_H_ */
