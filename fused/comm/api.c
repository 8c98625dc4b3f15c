/* The edge of the fused ops' per-communicator calls: argument checks, then negative errno
 * to ncclResult_t. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fused_comm.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"

NCCL_MK_API ncclResult_t ncclMkConfigDefaults(ncclMkConfig* config) {
  if (!config) {
    MK_WARN("ncclMkConfigDefaults: config is NULL");
    return ncclInvalidArgument;
  }
  memset(config, 0, sizeof(*config));
  config->size = sizeof(*config);
  config->version = NCCL_MK_VERSION;
  config->max_m = 8192;
  config->max_n = 8192;
  config->max_k = 8192;
  return ncclSuccess;
}

/* moe_max_tokens 0: no MoE; else a hidden size (multiple of 8) and 1..16 experts per token. */
static int moe_config_check(const ncclMkConfig* c) {
  if (c->moe_dispatch_fp8 != 0 && c->moe_dispatch_fp8 != 1) {
    MK_WARN("ncclMkCommInit: moe_dispatch_fp8 is %d, must be 0 or 1", c->moe_dispatch_fp8);
    return -EINVAL;
  }
  if (c->moe_max_tokens < 0 || c->moe_max_recv_rows < 0) {
    MK_WARN("ncclMkCommInit: moe_max_tokens (%d) and moe_max_recv_rows (%d) must not be negative",
            c->moe_max_tokens, c->moe_max_recv_rows);
    return -EINVAL;
  }
  if (c->moe_max_tokens && (c->moe_max_hidden < 8 || c->moe_max_hidden % 8 || c->moe_max_topk < 1 ||
                            c->moe_max_topk > 16 || c->moe_max_tokens > (1 << 20))) {
    MK_WARN("ncclMkCommInit: with moe_max_tokens = %d (at most 2^20), moe_max_hidden (%d) must be a positive "
            "multiple of 8 and moe_max_topk (%d) in 1..16", c->moe_max_tokens, c->moe_max_hidden, c->moe_max_topk);
    return -EINVAL;
  }
  /* a dispatched row's place among its expert's rows from one rank has 20 bits (moe.h
   * MK_MOE_POS_BITS): tokens x topk places, a token's slots naming one expert twice included */
  if ((long long)c->moe_max_tokens * c->moe_max_topk > (1 << 20)) {
    MK_WARN("ncclMkCommInit: moe_max_tokens x moe_max_topk = %d x %d, must be at most 2^20 (the rows one rank "
            "can send one expert)", c->moe_max_tokens, c->moe_max_topk);
    return -EINVAL;
  }
  return 0;
}

/* max_m x max(max_n, max_k): 2^44 elements, a 32 TiB workspace (no GPU has one), so every
 * size computed from the config fits a size_t many times over. */
#define MK_CONFIG_MAX_ELEMS_LOG2 44
#define MK_CONFIG_MAX_ELEMS ((size_t)1 << MK_CONFIG_MAX_ELEMS_LOG2)

static int config_check(const ncclMkConfig* c) {
  if (!c->max_m || !c->max_n || !c->max_k || c->max_n % 8 || c->max_k % 8) {
    MK_WARN("ncclMkCommInit: config max_m/max_n/max_k (%zu/%zu/%zu) must be positive, max_n "
            "and max_k multiples of 8", c->max_m, c->max_n, c->max_k);
    return -EINVAL;
  }
  /* the GEMM's shapes are ints; the buffers they size (max_m x 3 max(max_n, max_k) x 2 bytes at
   * most) stay far from size_t's end */
  const size_t widest = c->max_n > c->max_k ? c->max_n : c->max_k;
  if (c->max_m > INT32_MAX || widest > INT32_MAX || c->max_m * widest > MK_CONFIG_MAX_ELEMS) {
    MK_WARN("ncclMkCommInit: config max_m/max_n/max_k (%zu/%zu/%zu): each must be below 2^31 and "
            "max_m x max(max_n, max_k) at most 2^%d", c->max_m, c->max_n, c->max_k, MK_CONFIG_MAX_ELEMS_LOG2);
    return -EINVAL;
  }
  if (c->comm_sms < 0 || c->timeout_ms < 0) {
    MK_WARN("ncclMkCommInit: comm_sms (%d) and timeout_ms (%d) must not be negative",
            c->comm_sms, c->timeout_ms);
    return -EINVAL;
  }
  return moe_config_check(c);
}

int mk_config_read(const ncclMkConfig* config, ncclMkConfig* cfg) {
  int rc = 0;
  if (config && config->size != sizeof(ncclMkConfig)) { /* before the copy: an older, smaller struct */
    MK_WARN("ncclMkCommInit: config.size is %zu, this library expects %zu: fill the config "
            "with ncclMkConfigDefaults", config->size, sizeof(ncclMkConfig));
    rc = -EINVAL;
  }
  if (config && !rc) *cfg = *config; else ncclMkConfigDefaults(cfg);
  /* made by a header at most this library's (same size): 0 or a later version means it was
   * not filled by ncclMkConfigDefaults, or came from another library's header */
  if (!rc && (cfg->version == 0 || cfg->version > NCCL_MK_VERSION)) {
    MK_WARN("ncclMkCommInit: config.version is %u, this library is %d: fill the config with ncclMkConfigDefaults",
            cfg->version, NCCL_MK_VERSION);
    rc = -EINVAL;
  }
  if (!rc) rc = config_check(cfg);
  if (!cfg->timeout_ms) cfg->timeout_ms = (int)mk_param_int(MK_PARAM_TIMEOUT_MS);
  return rc;
}

NCCL_MK_API ncclResult_t ncclMkCommInit(ncclComm_t comm, const ncclMkConfig* config) {
  if (!comm) {
    MK_WARN("ncclMkCommInit: comm is NULL");
    return ncclInvalidArgument;
  }
  ncclMkConfig cfg;
  const int config_rc = mk_config_read(config, &cfg);
  /* a refused config still joins the ranks' exchange, which tells them (they would wait) */
  return mk_result_from_errno(mk_fused_comm_create(comm, &cfg, config_rc));
}

NCCL_MK_API ncclResult_t ncclMkCommRelease(ncclComm_t comm) {
  if (!comm) {
    MK_WARN("ncclMkCommRelease: comm is NULL");
    return ncclInvalidArgument;
  }
  return mk_result_from_errno(mk_fused_comm_destroy(comm));
}

NCCL_MK_API ncclResult_t ncclMkCommGetProxyBytes(ncclComm_t comm, uint64_t* bytes) {
  struct mk_fused_comm* fc;
  if (!comm || !bytes) {
    MK_WARN("ncclMkCommGetProxyBytes: %s is NULL", comm ? "bytes" : "comm");
    return ncclInvalidArgument;
  }
  int rc = mk_fused_comm_lookup(comm, &fc);
  if (rc) return mk_result_from_errno(rc);
  /* while the exchange is pending the first op may be setting the proxy up */
  *bytes = __atomic_load_n(&fc->exchange_pending, __ATOMIC_ACQUIRE) ? 0 : mk_xnode_sent_bytes(fc);
  return ncclSuccess;
}

NCCL_MK_API ncclResult_t ncclMkCommGetAsyncError(ncclComm_t comm, ncclResult_t* result,
                                                 char* msg, size_t msg_len) {
  struct mk_fused_comm* fc;
  if (!comm || !result) {
    MK_WARN("ncclMkCommGetAsyncError: %s is NULL", comm ? "result" : "comm");
    return ncclInvalidArgument;
  }
  if (msg && msg_len) msg[0] = '\0';
  int rc = mk_fused_comm_lookup(comm, &fc);
  if (rc) return mk_result_from_errno(rc);
  const int failed = __atomic_load_n(&fc->exchange_failed, __ATOMIC_ACQUIRE);
  if (failed && msg && msg_len)
    snprintf(msg, msg_len, "ncclMkCommInit failed (%s; its WARN says why)", strerror(-failed));
  /* while the exchange is pending no kernel ran, and the first op may be setting the proxy up */
  const int pending = __atomic_load_n(&fc->exchange_pending, __ATOMIC_ACQUIRE);
  *result = mk_result_from_errno(failed ? failed : pending ? 0 : mk_fused_comm_health(fc, msg, msg_len));
  return ncclSuccess;
}
