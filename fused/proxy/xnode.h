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
 *           [MK_XN_ROW_FLAG0 + mb]  AllGather+GEMM: the gathered A's row-block mb has landed
 *                               (value e)
 *           [MK_XN_BYE0 + p]    peer p is releasing the communicator, its descriptors all
 *                               completed (value 1; written by the host at release)
 *           [MK_XN_RS_FLAG0 + src x blocks + mb]  GEMM+ReduceScatter: src's partial of row-block
 *                               mb of this rank's shard has landed (value: its tile count, as
 *                               an NVLink peer's counter; zeroed by this rank at the end of the
 *                               call, before its done signal lets src put the next call's)
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
#define MK_XN_ROW_FLAG0 MK_XN_MAX_RANKS
#define MK_XN_BYE0 (MK_XN_ROW_FLAG0 + MK_XN_MAX_BLOCKS)
#define MK_XN_RS_FLAG0 (MK_XN_BYE0 + MK_XN_MAX_RANKS)
#define MK_XN_FLAG_WORDS (MK_XN_RS_FLAG0 + MK_XN_MAX_BLOCKS)
#define MK_XN_QUEUE_DEPTH 1024u

struct mk_xnode_dev {
  struct mk_proxy_queue* q; /* the GPU's view of the host-mapped queue */
  char* bounce;             /* the GPU's view of the bounce region */
  uint64_t* flags;          /* the GPU's view of the flag region */
  uint64_t timeout_ns;      /* the queue's waits (NCCL_MK_TIMEOUT_MS) */
  uint64_t last_call;       /* the number of the last cross-node call */
  uint64_t call_tail;       /* the queue's tail when that call had published everything */
  /* The queue's producer. AllGather+GEMM's send CTA publishes through it alone; the CTAs of
   * GEMM+ReduceScatter claim tickets on prod.tail together (mk_proxy_mp_publish). */
  struct mk_proxy_producer prod;
  uint32_t recv_counts[MK_XN_MAX_BLOCKS]; /* CTAs done with each received row-block; 0 between calls */
};

/* ---- the descriptors of the protocol (shared by the kernel, the host's release and the CPU
 * stand-in of test/loopback/lb_xnode.c) ---- */

/* Row-block mb of this rank's shard (bytes each, at the same offset in every rank's bounce
 * buffer) to peer for call e; with signal, its flag AG_FLAG0 + mb = e after the rows. */
MK_HD struct mk_proxy_desc mk_xn_block_desc(int peer, int mb, uint64_t bytes, uint64_t e, int signal,
                                            uint32_t tag) {
  struct mk_proxy_desc d;
  d.seq = 0;
  d.op = signal ? MK_PROXY_PUT_SIGNAL : MK_PROXY_PUT;
  d.peer = peer;
  d.src_off = d.dst_off = (uint64_t)mb * bytes;
  d.size = bytes;
  d.flag_off = (uint64_t)(MK_XN_ROW_FLAG0 + mb) * 8;
  d.flag_value = e;
  d.tag = tag;
  d.reserved = 0;
  return d;
}

/* GEMM+ReduceScatter: this rank's partial of row-block mb of peer's shard (bytes per
 * row-block) from its out slot for peer to peer's in slot for this rank, then peer's flag
 * RS_FLAG0 + rank x blocks + mb = value (the row-block's tile count). Bounce layout: out slots
 * [nranks][blocks], then in slots [nranks][blocks], each row-block `bytes` (a slot is indexed
 * by the other rank). */
MK_HD struct mk_proxy_desc mk_xn_rs_block_desc(int rank, int peer, int nranks, int blocks, int mb, uint64_t bytes,
                                               uint64_t value, uint32_t tag) {
  struct mk_proxy_desc d = mk_xn_block_desc(peer, 0, bytes, value, 1, tag);
  d.src_off = ((uint64_t)peer * blocks + mb) * bytes;
  d.dst_off = ((uint64_t)(nranks + rank) * blocks + mb) * bytes;
  d.flag_off = (uint64_t)(MK_XN_RS_FLAG0 + rank * blocks + mb) * 8;
  return d;
}

/* Flag `word` of peer's flag region = value, after every earlier descriptor to peer. */
MK_HD struct mk_proxy_desc mk_xn_signal_desc(int peer, int word, uint64_t value, uint32_t tag) {
  struct mk_proxy_desc d;
  d.seq = 0;
  d.op = MK_PROXY_SIGNAL;
  d.peer = peer;
  d.src_off = d.dst_off = d.size = 0;
  d.flag_off = (uint64_t)word * 8;
  d.flag_value = value;
  d.tag = tag;
  d.reserved = 0;
  return d;
}

/* Rank has copied in peer's rows of call e: peer may overwrite them. */
MK_HD struct mk_proxy_desc mk_xn_done_desc(int rank, int peer, uint64_t e, uint32_t tag) {
  return mk_xn_signal_desc(peer, MK_XN_DONE0 + rank, e, tag);
}

/* Rank is releasing the communicator (its descriptors to peer all completed before this). */
MK_HD struct mk_proxy_desc mk_xn_bye_desc(int rank, int peer) {
  return mk_xn_signal_desc(peer, MK_XN_BYE0 + rank, 1, 0);
}

#if !defined(__CUDACC__)
struct mk_proxy;
/* The release's goodbye (xnode_bye.c), host only: a bye signal to every remote rank (after
 * everything this producer published before), the proxy told that the peers will close, then
 * a wait (bounded by timeout_ns) for every remote rank's bye in `flags`, then briefly for our
 * own byes to complete. 0, or the error / timeout of a wait (a peer that never came). */
int mk_xn_goodbye(struct mk_proxy* p, struct mk_proxy_producer* prod, const uint64_t* flags, int rank,
                  int nranks, const unsigned char* remote, uint64_t timeout_ns);
#endif

#endif /* MK_XNODE_H_ */
