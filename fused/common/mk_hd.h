/*
 * MK_HD marks a small pure function that host code calls and, under nvcc, device code too
 * (schedules, layouts, queue tickets): one definition, shared by every header that needs it.
 */
#ifndef MK_HD_H_
#define MK_HD_H_

#ifdef __CUDACC__
#define MK_HD __host__ __device__ static inline
#else
#define MK_HD static inline
#endif

#endif /* MK_HD_H_ */
