/*
 * What the proxy's loopback cases share (lb_proxy.c: the proxy itself; lb_xnode.c: the
 * cross-node fused ops' protocols with a CPU stand-in for the kernels): a rank's queue,
 * regions and proxy, set up over the harness's pipes as NCCL's all-gather does in production.
 */
#ifndef MK_LB_PX_H_
#define MK_LB_PX_H_

#include <stddef.h>
#include <stdint.h>

#include "lb.h"
#include "proxy.h"
#include "queue.h"

#define SEC 1000000000ull
#define WAIT_NS (30 * SEC) /* producer waits: generous, the machine is shared */

struct px {
  int rank, peer;
  struct mk_proxy_queue* q;
  struct mk_proxy_producer prod;
  unsigned char* data;
  size_t data_bytes;
  uint64_t* flags;
  size_t flags_bytes;
  struct mk_proxy* p;
  struct mk_proxy_keys keys[2];
  uint64_t inflight_bytes; /* set before px_setup: the proxy's per-peer cap (0: default) */
};

/* Both ranks: queue, regions, proxy, the two record exchanges. The thread is not started. */
int px_setup(struct lb_ctx* ctx, struct px* x, uint32_t depth, int inflight, size_t data_bytes,
             size_t nflags);
void px_free(struct px* x);
int count_threads(void);
/* A joined thread's task is gone from /proc within this bound. */
int thread_gone_within(int tid, double seconds);

/* lb_xnode.c: the cross-node protocols' cases (each rank runs the same function). */
int lb_xnode_allgather_rank(struct lb_ctx* ctx);
int lb_xnode_reducescatter_rank(struct lb_ctx* ctx);
int lb_xnode_allreduce_rank(struct lb_ctx* ctx);
int lb_xnode_goodbye_rank(struct lb_ctx* ctx);
int lb_xnode_goodbye_survivor(struct lb_ctx* ctx);
int lb_xnode_goodbye_victim(struct lb_ctx* ctx);

#endif /* MK_LB_PX_H_ */
