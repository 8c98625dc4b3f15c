/*
 * Device side of the proxy queue (queue.h): how a kernel's inter-node role publishes a
 * descriptor for data its CTA has written, and waits for a flag a remote peer's proxy
 * raises. NOT YET RUN ON A GPU: compiled only (queue_dev_check.cu), no kernel uses it yet.
 *
 * Producer: exactly one thread of the whole grid owns a struct mk_proxy_producer (its
 * tail lives in registers or shared memory); other CTAs hand it their chunks through
 * device-memory flags, or each CTA gets its own queue (one proxy polls several).
 */
#ifndef MK_PROXY_QUEUE_DEV_CUH_
#define MK_PROXY_QUEUE_DEV_CUH_

#include "queue.h"

/* Every thread of the CTA calls this after writing its part of the data d names with
 * ordinary global stores (TMA writers first: cp.async.bulk.wait_group 0, then
 * fence.proxy.async.global). Thread 0 publishes, waiting up to timeout_ns for a slot.
 * Returns thread 0's result to every thread. */
__device__ __forceinline__ int mk_proxy_dev_publish_cta(struct mk_proxy_producer* p,
                                                        const struct mk_proxy_desc* d,
                                                        uint64_t timeout_ns, int* rc_shared) {
  __syncthreads(); /* every writer's stores happen before thread 0's fence */
  if (threadIdx.x == 0) {
    mk_pq_fence_sys(); /* cumulative: the CTA's stores are visible at system scope */
    *rc_shared = mk_proxy_publish(p, d, timeout_ns, NULL);
  }
  __syncthreads();
  return *rc_shared;
}

/* Thread 0 waits for a flag in our flag region (raised by a peer's proxy after its data);
 * then the CTA may read the data (TMA readers after fence.proxy.async.global). */
__device__ __forceinline__ int mk_proxy_dev_wait_flag_cta(struct mk_proxy_queue* q,
                                                          const uint64_t* flag,
                                                          uint64_t flag_off, uint64_t value,
                                                          uint64_t timeout_ns, int rank,
                                                          uint32_t tag, int* rc_shared) {
  if (threadIdx.x == 0) *rc_shared = mk_proxy_wait_flag(q, flag, flag_off, value, timeout_ns, rank, tag);
  __syncthreads();
  asm volatile("fence.proxy.async.global;" ::: "memory");
  return *rc_shared;
}

#endif /* MK_PROXY_QUEUE_DEV_CUH_ */
