/*
 * The tuner plugin, implemented once for ncclTuner_v5_t (plugin/tuner.c); the v4 table in
 * plugin/tuner_compat.c is a thin adapter over these functions. Every entry returns
 * ncclSuccess: NCCL 2.28 fails the collective on a tuner error, and a tuner that cannot
 * help should leave NCCL's choice alone instead.
 */
#ifndef MK_TUNER_H_
#define MK_TUNER_H_

#include <stddef.h>
#include <stdint.h>

#include "abi/tuner_v5.h"
#include "tuner_model.h"

/* Per-communicator context handed out by init. */
struct mk_tuner_ctx {
  uint64_t comm_id;
  size_t nranks, nnodes;
  const struct mk_tuner_model* model; /* the process-wide model; NULL: change nothing */
  int warned_bad_args;                /* one WARN per communicator, not per call */
};

ncclResult_t mk_tuner_init(void** ctx, uint64_t comm_id, size_t nranks, size_t nnodes,
                           ncclDebugLogger_t log, ncclNvlDomainInfo_v5_t* nvl_domain_info,
                           ncclTunerConstants_v5_t* constants);
ncclResult_t mk_tuner_get_coll_info(void* ctx, ncclFunc_t coll, size_t nbytes,
                                    int num_pipe_ops, float** cost_table, int num_algo,
                                    int num_proto, int reg_buff, int* nchannels);
ncclResult_t mk_tuner_finalize(void* ctx);

/*
 * The process-wide model read from NCCL_MK_TUNER_FILE on first use (thread-safe; NCCL may
 * create several communicators at once). Never NULL; empty when there is no usable file.
 * It lives until the process ends: a communicator may still be tuning while another is
 * destroyed, and the few kilobytes are not worth a reference count.
 */
const struct mk_tuner_model* mk_tuner_shared_model(void);

/*
 * Fused-op defaults for the fused operations (include/nccl_mk.h): the communication SM
 * count and chunk size measured fastest for op ("allgather_gemm", "gemm_reducescatter",
 * "gemm_allreduce", ...) at this per-rank shape, from the tuning file's "fused" records
 * (same n and k, nearest m). 0, or -ENOENT when the file has nothing for it.
 */
int mk_tuner_fused_defaults(const char* op, int64_t m, int64_t n, int64_t k, int* comm_sms,
                            size_t* chunk_bytes);

#endif /* MK_TUNER_H_ */
