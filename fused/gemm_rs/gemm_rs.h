/* The overlapped GEMM+ReduceScatter (gemm_rs.c), also the first half of GEMM+AllReduce. */
#ifndef MK_GEMM_RS_H_
#define MK_GEMM_RS_H_

#include <stddef.h>

#include "fused_comm.h"

/* 1 when (m, n, k) can take the overlapped path on this communicator (with the all-reduce's
 * gather when `gather`). */
int mk_gemm_rs_fits(const struct mk_fused_comm* fc, size_t m, size_t n, size_t k, int gather);
/* Without `gather`: c (this rank's m / nranks rows) = the sum over ranks of A.B^T's rows there.
 * With it: c ([m, n]) = the whole sum (all-reduce). 0 or negative errno. */
int mk_gemm_rs_overlapped(struct mk_fused_comm* fc, const void* a, const void* b, void* c,
                          size_t m, size_t n, size_t k, int gather, cudaStream_t stream);

#endif /* MK_GEMM_RS_H_ */
