/* For gemm_perf and the tests only: launch one of the compiled configurations by number.
 * 0: the default (mk_gemm_launch); 1: epilogue by the consumers, 4 stages; 2: as 1 with 2-CTA
 * clusters multicasting B; 3: the default with 2-CTA clusters; 4: 64-row tiles (args.block_m =
 * 64 launches only as 4, and 4 only with args.block_m = 64: the ready flags, the row-block
 * order and the claims count row-blocks of the tile's rows). 2 and 3 fall back to single CTAs
 * with ready flags or num_sms == 1.
 * e4m3 (args.dtype) exists as configuration 0 only; any other number is rejected (-EINVAL). */
#ifndef MK_GEMM_TUNE_H_
#define MK_GEMM_TUNE_H_
#include "gemm.h"
#ifdef __cplusplus
extern "C" {
#endif
int mk_gemm_launch_variant(const struct mk_gemm_args* args, cudaStream_t stream, int variant);
#ifdef __cplusplus
}
#endif
#endif
