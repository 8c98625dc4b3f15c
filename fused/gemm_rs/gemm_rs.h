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

/* The peer a timed-out wait of a one-kernel call depended on, read from the error record
 * alone (gemm.h MK_GEMM_ERR_TILE_*): a call bracket's wait for a peer's previous call (any op
 * with a bracket: blocks may be 0), or GEMM+RS/AR's wait for a peer's partial or reduced
 * row-block (blocks = row-blocks per shard of that call). *progress = what the peer had done
 * (the value seen) and *what says of what. -1 when the record is none of these. Pure. */
int mk_gemm_rs_hang_peer(int rank, int nranks, int blocks, const struct mk_gemm_error* e,
                         uint64_t* progress, char* what, size_t what_len);

#endif /* MK_GEMM_RS_H_ */
