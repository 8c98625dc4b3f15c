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
#define PX_MAX_RANKS 3     /* lb_bye3.c's three ranks; the other cases have two */

struct px {
  int rank, peer;
  struct mk_proxy_queue* q;
  struct mk_proxy_producer prod;
  unsigned char* data;
  size_t data_bytes;
  uint64_t* flags;
  size_t flags_bytes;
  struct mk_proxy* p;
  struct mk_proxy_keys keys[PX_MAX_RANKS];
  uint64_t inflight_bytes; /* set before px_setup: the proxy's per-peer cap (0: default) */
  const struct mk_transport_ops* ops; /* set before px_setup: the proxy's transport (NULL: default) */
};

/* One rank's queue, regions and proxy (not connected), every peer remote. */
int px_make(struct px* x, int rank, int nranks, int dev, uint32_t depth, int inflight, size_t data_bytes,
            size_t nflags);
/* Bytes over the harness's pipe (a multiple of 8). */
void px_tell(struct lb_ctx* ctx, const void* buf, size_t len);
void px_hear(struct lb_ctx* ctx, void* buf, size_t len);
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
/* lb_bye3.c: the goodbye across three ranks, one of them closing first. */
int lb_bye3_parent(struct lb_ctx* ctx);
int lb_bye3_child(struct lb_ctx* ctx);

#endif /* MK_LB_PX_H_ */
