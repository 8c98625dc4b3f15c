/* The checks every fused op makes before anything is launched (DESIGN.md "Bad input"). */
#ifndef MK_OP_CHECK_H_
#define MK_OP_CHECK_H_

#include <stddef.h>

#include "fused_comm.h"

enum mk_op_id {
  MK_OP_AG_GEMM = 1,
  MK_OP_GEMM_RS = 2,
  MK_OP_GEMM_AR = 3,
  MK_OP_MOE_DISPATCH = 4,
  MK_OP_MOE_COMBINE = 5,
  MK_OP_RING_ATTN = 6,
  MK_OP_RING_ATTN_BWD = 7
};

struct mk_op_call {
  enum mk_op_id op;
  const char* name;          /* for messages: "ncclMkAllGatherGemm" */
  size_t m, n, k;
  const char* dims[3];       /* the op's own names of m, n, k in messages (NULL: "M", "N", "K") */
  ncclDataType_t type;
  int m_split;               /* 1: M must be a multiple of the rank count */
  int m_may_be_zero;         /* 1: M == 0 is legal (MoE: a rank with no tokens in a micro-batch) */
  const void* ptrs[4];       /* required pointers (NULL entries past nptrs) */
  const char* ptr_names[4];
  int nptrs;
  unsigned m_rows_ptrs;      /* bit i: ptrs[i] holds M rows; with M == 0 not read, not checked */
  const void* optional_ptr;  /* checked for alignment only */
  const char* optional_name;
  ncclComm_t comm;
  cudaStream_t stream;
};

/* 0 with *fc set, or negative errno after a one-line WARN naming the problem. */
int mk_op_check(const struct mk_op_call* call, struct mk_fused_comm** fc);

/* A call refused by checks made before its comm was looked up: returns rc (negative errno)
 * after mk_fused_comm_settle, so that a refused first call still joins the exchange its peers
 * wait in. The ops' own checks that come before mk_op_check return through it. */
int mk_op_refuse(ncclComm_t comm, cudaStream_t stream, int rc);

/* The outputs, ptrs[first_output] on, overlap no input and no earlier output (bytes[i]: tensor
 * i's extent; a NULL or empty tensor is skipped): the kernels read the inputs while they write
 * the outputs. 0, or -EINVAL after a WARN naming both tensors. */
int mk_op_overlap_check(const char* op, const void* const* ptrs, const char* const* names, const size_t* bytes, int n,
                        int first_output);

/* The dense ops' bf16 tensors: A [a_rows, K] and B [N, K] read, C [c_rows, N] and the optional
 * gathered A [M, K] written (a_rows, c_rows: M, or M / nranks for a shard, named so). */
int mk_op_gemm_overlap_check(const char* op, const void* a, size_t a_rows, const void* b, void* c, size_t c_rows,
                             void* a_gathered, size_t m, size_t n, size_t k);

/* Makes the comm's GPU current for the launch and restores the caller's afterwards. */
int mk_op_device_enter(const struct mk_fused_comm* fc, int* prev);
void mk_op_device_leave(int prev);

/* The tag kernels write into the error record: rank << 8 | op. */
uint32_t mk_op_err_tag(const struct mk_fused_comm* fc, enum mk_op_id op);

/* The GEMM arguments shared by the ops: bf16 C = A . B^T with the comm's error record. */
void mk_op_gemm_args(const struct mk_fused_comm* fc, enum mk_op_id op, struct mk_gemm_args* g);

#endif /* MK_OP_CHECK_H_ */
