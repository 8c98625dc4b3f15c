/*
 * What every sm_90a kernel launcher needs from the device and the driver (CUDA sources only):
 * the tensor-map encoder (the driver entry point resolved through the runtime, so libcuda is
 * never linked), the check that the current device is a Hopper, and loading a kernel ahead of its
 * first launch. Defined in gemm.cu.
 */
#ifndef MK_SM90_H_
#define MK_SM90_H_

#include <cudaTypedefs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cuTensorMapEncodeTiled, or NULL when the driver lacks it. */
PFN_cuTensorMapEncodeTiled_v12000 mk_encode_tiled(void);

/* The SM count of the current device in *sms; -ENOTSUP (with a WARN starting with `who`) when
 * there is no usable device or it is not sm_90. */
int mk_sm90_sms(const char* who, int* sms);

/* Loads `kernel` now (cudaFuncGetAttributes): under lazy module loading a kernel's first launch
 * waits for every kernel then running on the device, which hangs a fused call whose peers'
 * progress those kernels wait for. 0, or -EIO with a WARN naming `name`. */
int mk_kernel_load(const void* kernel, const char* name);

/* Right after launching kernel `name`: 0 when the launch was taken, else -EIO with a WARN
 * naming the kernel and CUDA's error (cudaGetLastError, which also clears it). */
int mk_kernel_launched(const char* name);

#ifdef __cplusplus
}
#endif

#endif /* MK_SM90_H_ */
