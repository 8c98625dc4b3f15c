/* Compile check of the queue's device paths (queue.h, queue_dev.cuh): a kernel that writes a
 * chunk, publishes a put+signal for it and waits for the peer's flag. Built, never linked
 * into the library, NOT YET RUN ON A GPU. */
#include "queue_dev.cuh"

extern "C" __global__ void mk_proxy_dev_check_kernel(struct mk_proxy_queue* q, uint64_t* data,
                                                     const uint64_t* flags, int peer, int rank,
                                                     uint64_t timeout_ns, int* result) {
  __shared__ struct mk_proxy_producer prod;
  __shared__ int rc;
  if (threadIdx.x == 0) mk_proxy_producer_init(&prod, q, rank);
  data[threadIdx.x] = threadIdx.x + 1; /* the chunk: 8 bytes per thread */
  struct mk_proxy_desc d = {0};
  d.op = MK_PROXY_PUT_SIGNAL;
  d.peer = peer;
  d.size = blockDim.x * sizeof(uint64_t);
  d.flag_off = 8;
  d.flag_value = 1;
  int r = mk_proxy_dev_publish_cta(&prod, &d, timeout_ns, &rc);
  if (r == 0) r = mk_proxy_dev_wait_flag_cta(q, flags + 1, 8, 1, timeout_ns, rank, 0, &rc);
  if (threadIdx.x == 0) *result = r;
}
