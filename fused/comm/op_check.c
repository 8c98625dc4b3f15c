#include "op_check.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "mk_log.h"

static int pointer_check(const char* op, const char* name, const void* p, int required) {
  if (!p) {
    if (!required) return 0;
    MK_WARN("%s: %s is NULL", op, name);
    return -EINVAL;
  }
  if ((uintptr_t)p % 16) {
    MK_WARN("%s: %s (%p) is not 16-byte aligned", op, name, p);
    return -EINVAL;
  }
  return 0;
}

/* The shape rules that need no communicator: checked before it is looked up, so a bad shape
 * is ncclInvalidArgument whether or not the comm has ncclMkCommInit. */
static int shape_check(const struct mk_op_call* c) {
  const char* m = c->dims[0] ? c->dims[0] : "M";
  const char* n = c->dims[1] ? c->dims[1] : "N";
  const char* k = c->dims[2] ? c->dims[2] : "K";
  if (c->type != ncclBfloat16) {
    MK_WARN("%s: type %d is not supported; bf16 (ncclBfloat16) only", c->name, (int)c->type);
    return -ENOTSUP;
  }
  if ((c->m < 1 && !c->m_may_be_zero) || c->n < 8 || c->k < 8 || c->n % 8 || c->k % 8) {
    if (c->m_may_be_zero)
      MK_WARN("%s: %s=%zu %s=%zu %s=%zu: %s and %s must be positive multiples of 8", c->name, m, c->m, n, c->n, k,
              c->k, n, k);
    else
      MK_WARN("%s: %s=%zu %s=%zu %s=%zu: %s must be at least 1, %s and %s positive multiples of 8", c->name, m, c->m,
              n, c->n, k, c->k, m, n, k);
    return -EINVAL;
  }
  if (c->m > INT32_MAX || c->n > INT32_MAX || c->k > INT32_MAX) {
    MK_WARN("%s: %s=%zu %s=%zu %s=%zu: each must be below 2^31", c->name, m, c->m, n, c->n, k, c->k);
    return -EINVAL;
  }
  return 0;
}

static int split_check(const struct mk_op_call* c, int nranks) {
  if (c->m_split && c->m % (size_t)nranks) {
    MK_WARN("%s: M=%zu is not a multiple of the %d ranks", c->name, c->m, nranks);
    return -EINVAL;
  }
  return 0;
}

int mk_op_check(const struct mk_op_call* c, struct mk_fused_comm** out) {
  struct mk_fused_comm* fc;
  if (!c->comm) {
    MK_WARN("%s: comm is NULL", c->name);
    return -EINVAL;
  }
  for (int i = 0; i < c->nptrs; i++) {
    if (c->m == 0 && (c->m_rows_ptrs >> i & 1)) continue; /* no rows: never dereferenced */
    int rc = pointer_check(c->name, c->ptr_names[i], c->ptrs[i], 1);
    if (rc) return mk_op_refuse(c->comm, c->stream, rc);
  }
  int rc = pointer_check(c->name, c->optional_name, c->optional_ptr, 0);
  if (!rc) rc = shape_check(c);
  if (rc) return mk_op_refuse(c->comm, c->stream, rc);
  rc = mk_fused_comm_get(c->comm, c->stream, &fc);
  if (!rc) rc = split_check(c, fc->nranks);
  if (!rc) rc = mk_fused_comm_health(fc, NULL, 0);
  if (!rc) *out = fc;
  return rc;
}

int mk_op_overlap_check(const char* op, const void* const* ptrs, const char* const* names, const size_t* bytes, int n,
                        int first_output) {
  for (int o = first_output; o < n; o++)
    for (int i = 0; i < o; i++) {
      if (!ptrs[o] || !ptrs[i] || !bytes[o] || !bytes[i]) continue;
      const uintptr_t a = (uintptr_t)ptrs[o], b = (uintptr_t)ptrs[i];
      if (a < b + bytes[i] && b < a + bytes[o]) {
        MK_WARN("%s: %s (%p, %zu bytes) overlaps %s (%p, %zu bytes): the outputs must not overlap the inputs or "
                "each other", op, names[o], ptrs[o], bytes[o], names[i], ptrs[i], bytes[i]);
        return -EINVAL;
      }
    }
  return 0;
}

int mk_op_gemm_overlap_check(const char* op, const void* a, size_t a_rows, const void* b, void* c, size_t c_rows,
                             void* a_gathered, size_t m, size_t n, size_t k) {
  const void* ptrs[] = {a, b, c, a_gathered};
  const char* names[] = {a_rows == m ? "a" : "a_shard", "b", c_rows == m ? "c" : "c_shard", "a_gathered"};
  const size_t bytes[] = {a_rows * k * 2, n * k * 2, c_rows * n * 2, m * k * 2};
  return mk_op_overlap_check(op, ptrs, names, bytes, 4, 2);
}

int mk_op_refuse(ncclComm_t comm, cudaStream_t stream, int rc) {
  mk_fused_comm_settle(comm, stream);
  return rc;
}

int mk_op_device_enter(const struct mk_fused_comm* fc, int* prev) {
  *prev = -1;
  cudaGetDevice(prev);
  return mk_cuda_check(cudaSetDevice(fc->dev), "cudaSetDevice");
}

void mk_op_device_leave(int prev) {
  if (prev >= 0) cudaSetDevice(prev);
}

uint32_t mk_op_err_tag(const struct mk_fused_comm* fc, enum mk_op_id op) {
  return ((uint32_t)fc->rank << 8) | (uint32_t)op;
}

void mk_op_gemm_args(const struct mk_fused_comm* fc, enum mk_op_id op, struct mk_gemm_args* g) {
  memset(g, 0, sizeof(*g));
  g->epilogue = MK_GEMM_STORE;
  g->err = fc->err;
  g->err_tag = mk_op_err_tag(fc, op);
  g->timeout_ms = (uint32_t)fc->cfg.timeout_ms;
}
