/* For gemm_perf only: launch one of the compiled configurations by number (see gemm.cu). */
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
