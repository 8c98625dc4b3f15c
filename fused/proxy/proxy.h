/*
 * The proxy thread of one communicator on one GPU (DESIGN.md "Inter-node for fused ops"):
 * it reads descriptors from a queue (queue.h) and drives the one-sided operations of
 * transport.h for the ranks outside the local team.
 *
 * Setup is collective and runs in two exchanges of fixed-size records, so that in
 * production each is one ncclAllGather on the caller's communicator (as peer_mem.c does)
 * and in tests a pipe:
 *
 *   mk_proxy_create(&conf, &p)              listen; nothing connected yet
 *   mk_proxy_addr(p, &addrs[rank])          record 1: our listen handle
 *     ... gather addrs[nranks] ...
 *   mk_proxy_connect(p, addrs)              connect to and accept from every remote rank,
 *                                           register data and flag regions once
 *   mk_proxy_keys(p, &keys[rank])           record 2: our remote keys
 *     ... gather keys[nranks] ...
 *   mk_proxy_arm(p, keys)                   checked and taken; the thread exists, held
 *   mk_proxy_go(p)                          the thread runs (mk_proxy_start: both)
 *   mk_proxy_stop(p)                        joins it, closes, deregisters, frees
 *
 * The connections are one send comm per remote rank (our puts) and one receive comm per
 * remote rank (the endpoint the peer's puts land on: the thread calls progress on it, so
 * providers with manual progress land them). Data and flags are registered once, on the
 * first connection; the transport must report reg_is_global (one registration serves every
 * comm of the device), else -ENOTSUP.
 *
 * A failure (transport error, dead peer, malformed descriptor) ends the thread: it raises
 * the queue's proxy error record (which every producer wait sees) and calls conf.on_error,
 * then waits for mk_proxy_stop. It never hangs: every transport call is non-blocking and a
 * dead peer turns into -ECONNRESET within the transport's detection bound.
 */
#ifndef MK_PROXY_H_
#define MK_PROXY_H_

#include <stddef.h>
#include <stdint.h>

#include "queue.h"
#include "transport.h"

#define MK_PROXY_RECORD_MAGIC 0x4d4b5052u /* "MKPR" */

/* 1 when ranks a and b are in one local team (reachable by load/store) as far as
 * NCCL_MK_LOCAL_SIZE is concerned: with local_size > 0, ranks are split into emulated nodes
 * of local_size consecutive ranks; 0 puts every rank in one team (the caller then also
 * requires one host and peer access). */
static inline int mk_local_team_same(int a, int b, int local_size) {
  return local_size <= 0 || a / local_size == b / local_size;
}

/* Record 1 (ncclAllGather'd as bytes). addr: 1 x 144. */
struct mk_proxy_addr {
  uint32_t magic;
  int32_t rank;
  uint64_t reserved;
  unsigned char handle[MK_HANDLE_MAX];
};

/* Record 2. keys: 1 x 64. */
struct mk_proxy_keys {
  uint32_t magic;
  int32_t rank;
  uint64_t reserved;
  struct mk_rkey data;
  struct mk_rkey flags;
};

_Static_assert(sizeof(struct mk_proxy_addr) == 144, "addr record");
_Static_assert(sizeof(struct mk_proxy_keys) == 64, "keys record");

struct mk_proxy_conf {
  const struct mk_transport_ops* ops; /* NULL: mk_transport_get() */
  int dev;                            /* transport device */
  int rank, nranks;
  const unsigned char* remote;        /* [nranks]: 1 for a rank outside the local team */
  void* data;                         /* our data region: sources of puts, targets of peers' */
  size_t data_bytes;
  int data_type;                      /* MK_PTR_HOST or MK_PTR_CUDA */
  void* flags;                        /* our flag region (8-byte flags) */
  size_t flags_bytes;
  int flags_type;
  struct mk_proxy_queue* queue;       /* initialised (mk_proxy_queue_init), host-mapped */
  int max_inflight;                   /* operations in flight at once; 0: 16 */
  uint64_t inflight_bytes;            /* per peer: data posted at once (one descriptor always
                                         goes); 0: NCCL_MK_PROXY_INFLIGHT_BYTES */
  int streams;                        /* endpoints per connection where the transport has
                                         them (puts striped over them); 0: NCCL_MK_PROXY_STREAMS */
  /* Called once from the proxy thread when it fails, after the queue's record is raised
   * (e.g. to mark the communicator broken). Optional. */
  void (*on_error)(void* arg, const struct mk_proxy_error* err);
  void* on_error_arg;
};

struct mk_proxy;

int mk_proxy_create(const struct mk_proxy_conf* conf, struct mk_proxy** out);
int mk_proxy_addr(struct mk_proxy* p, struct mk_proxy_addr* mine);
/* Bounded by NCCL_MK_CONNECT_TIMEOUT_MS (twice: connects and accepts run together). */
int mk_proxy_connect(struct mk_proxy* p, const struct mk_proxy_addr* all);
int mk_proxy_keys(struct mk_proxy* p, struct mk_proxy_keys* mine);
/* The gathered key records checked (each remote rank's magic and rank, connected both ways)
 * and taken, and the thread created but held before its first transport call: 0, -EBADMSG
 * (no thread), -EALREADY, or pthread_create's error. Apart from mk_proxy_go, every rank can
 * learn whether every other's thread exists before any runs (xnode.c); a held thread that is
 * stopped exits without touching a connection. */
int mk_proxy_arm(struct mk_proxy* p, const struct mk_proxy_keys* all);
void mk_proxy_go(struct mk_proxy* p); /* the armed thread runs */
int mk_proxy_start(struct mk_proxy* p, const struct mk_proxy_keys* all); /* arm, then go */
/* Stops the thread (descriptors not yet consumed are dropped, operations in flight are
 * waited for up to NCCL_MK_TIMEOUT_MS), joins it, closes the connections and frees p.
 * Returns 0, or the asynchronous error the proxy had failed with. NULL is a no-op. */
int mk_proxy_stop(struct mk_proxy* p);
/* Stops and joins the thread only (no more progress; connections stay open), returning
 * what mk_proxy_stop would. For a shutdown in two steps: quiesce everywhere, agree, then
 * stop, so that no proxy still running mistakes a peer's orderly close for its death. */
int mk_proxy_quiesce(struct mk_proxy* p);
/* From now on the peers may close their connections (they are shutting down too): a
 * transport error ends the thread without raising an error record. For a shutdown without
 * an out-of-band agreement: say goodbye through the queue, call this, wait for the peers'
 * goodbyes (bounded), quiesce, stop. NULL is a no-op. */
void mk_proxy_peers_leaving(struct mk_proxy* p);

/* Readable from any thread while the proxy runs. */
uint64_t mk_proxy_sent_bytes(const struct mk_proxy* p, int peer); /* data bytes completed */
uint64_t mk_proxy_sent_ops(const struct mk_proxy* p, int peer);   /* descriptors completed */
/* The most data that was ever posted to peer at once (conf.inflight_bytes bounds it). */
uint64_t mk_proxy_peak_posted_bytes(const struct mk_proxy* p, int peer);
/* 0 while healthy; else the error, with a one-line description in msg. */
int mk_proxy_error(const struct mk_proxy* p, char* msg, size_t len);
/* Describes a raised record in one line. */
void mk_proxy_error_format(const struct mk_proxy_error* e, char* msg, size_t len);
/* The proxy thread's kernel thread id (0 before start): tests check it is gone after stop. */
int mk_proxy_tid(const struct mk_proxy* p);

/* Checks a descriptor against our region and the peer's keys: 0 or -EINVAL. */
int mk_proxy_desc_check(const struct mk_proxy_desc* d, int nranks, const unsigned char* remote,
                        size_t data_bytes, const struct mk_rkey* peer_data,
                        const struct mk_rkey* peer_flags);

#endif /* MK_PROXY_H_ */
