/*
 * The cross-node state of one fused-op communicator (issue 13; DESIGN.md "Inter-node for
 * fused ops"): what a kernel needs to reach the ranks outside its local team through the
 * proxy thread (proxy.h) and its descriptor queue (queue.h). Host side: fused/comm/xnode.c.
 *
 * Regions (host memory, pinned and mapped into the GPU's address space; the transport
 * registers both once):
 *   bounce: max_m x max_k x 2 B, laid out as AllGather+GEMM's gathered A. This rank's own
 *           rows are the source of its puts (staged there from the caller's shard by the
 *           kernel); a remote rank's rows are where its puts land, to be copied into the GPU
 *           workspace by the kernel. With a transport that can register GPU memory the puts
 *           could land in the workspace itself (GPUDirect); not done yet: every transport
 *           goes through this bounce buffer.
 *   flags:  MK_XN_FLAG_WORDS u64 words, raised by the peers' proxies (put+signal, signal):
 *           [MK_XN_DONE0 + p]   peer p finished copying in call e's rows it got from us:
 *                               our puts of call e + 1 may overwrite them (value e)
 *           [MK_XN_AG_FLAG0 + mb]  row-block mb of the gathered A has landed (value e)
 *           [MK_XN_BYE0 + p]    peer p is releasing the communicator, its descriptors all
 *                               completed (value 1; written by the host at release)
 * Per call e (= the workspace's done + 1, as for the NVLink paths) the values only grow, so
 * the state survives CUDA graph replays.
 *
 * mk_xnode_dev lives in device memory; the producer state in it (the queue's tail) is owned
 * by one thread of every call (the send CTA), so the queue keeps exactly one producer.
 */
#ifndef MK_XNODE_H_
#define MK_XNODE_H_

#include <stdint.h>

#include "queue.h"

#define MK_XN_MAX_RANKS 64
#define MK_XN_MAX_BLOCKS 4096 /* row-blocks of M (>= AllGather+GEMM's MK_AG_MAX_BLOCKS) */
#define MK_XN_DONE0 0
#define MK_XN_AG_FLAG0 MK_XN_MAX_RANKS
#define MK_XN_BYE0 (MK_XN_AG_FLAG0 + MK_XN_MAX_BLOCKS)
#define MK_XN_FLAG_WORDS (MK_XN_BYE0 + MK_XN_MAX_RANKS)
#define MK_XN_QUEUE_DEPTH 1024u

struct mk_xnode_dev {
  struct mk_proxy_queue* q; /* the GPU's view of the host-mapped queue */
  char* bounce;             /* the GPU's view of the bounce region */
  uint64_t* flags;          /* the GPU's view of the flag region */
  uint64_t timeout_ns;      /* the queue's waits (NCCL_MK_TIMEOUT_MS) */
  uint64_t last_call;       /* the number of the last cross-node call (the send CTA's) */
  struct mk_proxy_producer prod;
  uint32_t recv_counts[MK_XN_MAX_BLOCKS]; /* CTAs done with each received row-block; 0 between calls */
};

#endif /* MK_XNODE_H_ */
