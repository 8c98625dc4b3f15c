/*
 * The cross-node state of one fused-op communicator (issue 13; DESIGN.md "Inter-node for
 * fused ops"): what a kernel needs to reach the ranks outside its local team through the
 * proxy thread (proxy.h) and its descriptor queue (queue.h). Host side: fused/comm/xnode.c.
 *
 * Regions (host memory, pinned and mapped into the GPU's address space; the transport
 * registers both once):
 *   bounce: max_m x max(max_k, 3 max_n) x 2 B. AllGather+GEMM lays it out as its gathered A:
 *           this rank's own rows are the source of its puts (staged there from the caller's
 *           shard by the kernel); a remote rank's rows are where its puts land, to be copied
 *           into the GPU workspace by the kernel. GEMM+ReduceScatter/AllReduce: the slots
 *           below (mk_xn_rs_off). With a transport that can register GPU memory the puts
 *           could land in the workspace itself (GPUDirect); not done yet: every transport
 *           goes through this bounce buffer.
 *   flags:  MK_XN_FLAG_WORDS u64 words, raised by the peers' proxies (put+signal, signal):
 *           [MK_XN_DONE0 + p]   peer p finished with what we put there in call e (copied
 *                               it in, summed it): our next cross-node call may overwrite it
 *                               (value e)
 *           [MK_XN_ROW_FLAG0 + mb]  AllGather+GEMM: the gathered A's row-block mb has landed
 *                               (value e)
 *           [MK_XN_BYE0 + p]    peer p is releasing the communicator, its descriptors all
 *                               completed (value 1; written by the host at release)
 *           [MK_XN_RS_FLAG0 + src x blocks + mb]  GEMM+ReduceScatter: src's partial of row-block
 *                               mb of this rank's shard has landed (value: its tile count, as
 *                               an NVLink peer's counter; zeroed by this rank at the end of the
 *                               call, before its done signal lets src put the next call's)
 *           [MK_XN_GATHER_FLAG0 + src x blocks + mb]  GEMM+AllReduce: src's reduced row-block mb
 *                               has landed (the same count-and-zero rule)
 * Call e is the workspace's done + 1, as for the NVLink paths; done and row flags only grow
 * and count flags are zeroed within the call, so the state survives CUDA graph replays.
 *
 * mk_xnode_dev lives in device memory. Its producer (the queue's tail) is AllGather+GEMM's
 * send CTA's alone during that op, and the tail word that GEMM+ReduceScatter/AllReduce's
 * sender claims tickets on (mk_proxy_mp_publish); calls never overlap, so both are right.
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
#define MK_XN_GATHER_FLAG0 (MK_XN_RS_FLAG0 + MK_XN_MAX_BLOCKS)
#define MK_XN_FLAG_WORDS (MK_XN_GATHER_FLAG0 + MK_XN_MAX_BLOCKS)
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
  /* CTAs done with each received row-block; 0 between calls */
  uint32_t recv_counts[MK_XN_MAX_BLOCKS];
};

/* ---- the descriptors of the protocol (shared by the kernel, the host's release and the CPU
 * stand-in of test/loopback/lb_xnode.c) ---- */

/* Row-block mb of this rank's shard (bytes each, at the same offset in every rank's bounce
 * buffer) to peer for call e; with signal, its flag ROW_FLAG0 + mb = e after the rows. */
MK_HD struct mk_proxy_desc mk_xn_block_desc(int peer, int mb, uint64_t bytes, uint64_t e,
                                            int signal, uint32_t tag) {
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

/* ---- GEMM+ReduceScatter / AllReduce: the bounce buffer's slots ----
 * Each slot is one shard ([blocks] row-blocks of `bytes`, row-major [shard][n]); a rank's
 * peers are numbered by mk_xn_peer_slot (the others in rank order, itself skipped):
 *   out       [nranks - 1]  this rank's partial of peer d's rows, put to d
 *   in        [nranks - 1]  src's partial of this rank's rows, put here by src
 *   gather    1             this rank's reduced rows (all-reduce), put to every peer
 *   gathered  [nranks - 1]  src's reduced rows, put here by src
 * 3 (nranks - 1) + 1 slots: on 2 ranks twice C, or C without the gather. */
enum mk_xn_rs_group {
  MK_XN_RS_OUT = 0,
  MK_XN_RS_IN = 1,
  MK_XN_RS_GATHER = 2,
  MK_XN_RS_GATHERED = 3
};

MK_HD int mk_xn_peer_slot(int other, int self) {
  return other < self ? other : other - 1;
}

/* Byte offset of row-block mb of `group`'s slot for peer `other` on rank `self`. */
MK_HD uint64_t mk_xn_rs_off(int group, int other, int self, int nranks, int blocks, int mb,
                            uint64_t bytes) {
  const uint64_t peers = (uint64_t)(nranks - 1);
  uint64_t slot = group == MK_XN_RS_OUT  ? (uint64_t)mk_xn_peer_slot(other, self)
                  : group == MK_XN_RS_IN ? peers + (uint64_t)mk_xn_peer_slot(other, self)
                  : group == MK_XN_RS_GATHER
                      ? 2 * peers
                      : 2 * peers + 1 + (uint64_t)mk_xn_peer_slot(other, self);
  return (slot * (uint64_t)blocks + (uint64_t)mb) * bytes;
}

/* Bounce bytes the slots take (with the all-reduce's gather or without). */
MK_HD uint64_t mk_xn_rs_bytes(int nranks, int blocks, uint64_t bytes, int gather) {
  return (uint64_t)(gather ? 3 * (nranks - 1) + 1 : 2 * (nranks - 1)) * blocks * bytes;
}

/* This rank's partial of row-block mb of owner's shard, out slot -> owner's in slot for this
 * rank, then owner's flag RS_FLAG0 + rank x blocks + mb = value (the row-block's tile count);
 * with gather, this rank's reduced row-block mb, gather slot -> peer's gathered slot for this
 * rank, flag GATHER_FLAG0 + rank x blocks + mb = value. */
MK_HD struct mk_proxy_desc mk_xn_rs_block_desc(int rank, int peer, int nranks, int blocks, int mb,
                                               uint64_t bytes, uint64_t value, int gather,
                                               uint32_t tag) {
  struct mk_proxy_desc d = mk_xn_block_desc(peer, 0, bytes, value, 1, tag);
  d.src_off =
      mk_xn_rs_off(gather ? MK_XN_RS_GATHER : MK_XN_RS_OUT, peer, rank, nranks, blocks, mb, bytes);
  d.dst_off =
      mk_xn_rs_off(gather ? MK_XN_RS_GATHERED : MK_XN_RS_IN, rank, peer, nranks, blocks, mb, bytes);
  d.flag_off = (uint64_t)((gather ? MK_XN_GATHER_FLAG0 : MK_XN_RS_FLAG0) + rank * blocks + mb) * 8;
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
int mk_xn_goodbye(struct mk_proxy* p, struct mk_proxy_producer* prod, const uint64_t* flags,
                  int rank, int nranks, const unsigned char* remote, uint64_t timeout_ns);
#endif

#endif /* MK_XNODE_H_ */
