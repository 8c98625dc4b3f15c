/*
 * The collectives harness (nccl-tests style): one binary per collective, built from these
 * sources with MK_COLL_NAME set to the collective's name. One process per GPU (-p launches them on this host and
 * shares the NCCL id) or -g GPUs driven by one process; NCCL_COMM_ID for several hosts.
 */
#ifndef MK_COLL_PERF_H_
#define MK_COLL_PERF_H_

#include <cuda_runtime.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#define MK_PERF_MAX_GPUS 16

struct perf_args {
  size_t min_bytes, max_bytes, step_factor;
  int gpus_per_proc;      /* -g */
  int nprocs, proc;       /* -p / internal --proc, or -N/-P across hosts */
  int iters, warmup;      /* -n, -w */
  int check;              /* -c: check iterations (0 disables) */
  ncclDataType_t dtype;   /* -d */
  ncclRedOp_t op;         /* -o */
  const char* json_path;  /* -J */
  int distinct_hosts;     /* -H */
  int corrupt;            /* -X */
  int repeats;            /* -R */
  int batch;              /* -T: iterations per timed batch, 0 = the mean (coll_stats.h) */
  int ab, ab_first;       /* -A F: a second communicator timed in turn with the first (A/B) */
  char id_hex[2 * sizeof(ncclUniqueId) + 1]; /* -I, given by the launcher */
};

/* How one collective sizes its buffers and what each rank expects. Sizes follow
 * nccl-tests: bytes = the full buffer (all-reduce's, all-gather's output, reduce-scatter's
 * input, all-to-all's per-rank buffer, send/recv's message). */
struct coll_desc {
  const char* name;
  int reduces;                       /* uses the redop */
  double (*bus_factor)(int nranks);
  void (*counts)(size_t bytes, size_t esize, int nranks, size_t* send, size_t* recv);
  ncclResult_t (*run)(const void* send, void* recv, size_t send_count, ncclDataType_t dt,
                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t s, int rank, int nranks);
  /* Expected value of output element i on rank, given the input pattern of coll_data.c. */
  double (*expect)(size_t i, size_t recv_count, int rank, int nranks, ncclRedOp_t op,
                   ncclDataType_t dt, int seed);
  /* In-place layout, as NCCL defines it for this collective. */
  enum {
    INPLACE_NONE,         /* not defined for point-to-point patterns */
    INPLACE_SAME,         /* send == recv */
    INPLACE_SEND_AT_RANK, /* send = recv + rank * send_count (all-gather) */
    INPLACE_RECV_AT_RANK  /* recv = send + rank * recv_count (reduce-scatter) */
  } inplace;
};

const struct coll_desc* coll_find(const char* name);

/* coll_data.c: the input pattern (small integers, exact in every type) and the checker. */
double coll_input_value(size_t i, int rank, ncclDataType_t dt, int seed);
size_t coll_type_size(ncclDataType_t dt);
const char* coll_type_name(ncclDataType_t dt);
const char* coll_op_name(ncclRedOp_t op);
int coll_parse_type(const char* s, ncclDataType_t* dt);
int coll_parse_op(const char* s, ncclRedOp_t* op);
int coll_fill(void* dev_buf, size_t count, int rank, ncclDataType_t dt, int seed);
int coll_poison(void* dev_buf, size_t bytes);
/* Counts elements of dev_buf that differ from expect(); negative on a CUDA error. */
long coll_count_wrong(const struct coll_desc* coll, const void* dev_buf, size_t recv_count,
                      int rank, int nranks, ncclRedOp_t op, ncclDataType_t dt, int seed);
double coll_reduce_expect(size_t i, int nranks, ncclRedOp_t op, ncclDataType_t dt, int seed);

#endif /* MK_COLL_PERF_H_ */
