/*
 * What every transport offers (DESIGN.md "Transports"): two-sided messaging with NCCL's
 * net semantics, which the net plugin maps one to one, and one-sided operations (put,
 * put-with-signal) that the cross-node fused ops need.
 *
 * Contract, for every function:
 *  - returns 0 or a negative errno (plugin/mk_err.h lists the meanings); never blocks
 *    for a peer; never aborts;
 *  - thread safety: NCCL's service thread (listen/connect/accept/reg/dereg) and progress
 *    thread (isend/irecv/test/iflush) may call into the same comm concurrently;
 *  - a dead peer turns every pending and later operation on its comms into -ECONNRESET
 *    (or -ETIMEDOUT during a handshake); nothing waits forever.
 */
#ifndef MK_TRANSPORT_H_
#define MK_TRANSPORT_H_

#include <stddef.h>
#include <stdint.h>

#include "mk_config.h"

#define MK_HANDLE_MAX 128     /* NCCL_NET_HANDLE_MAXSIZE */
#define MK_MAX_RECVS 8        /* grouped receives per irecv */
#define MK_MAX_REQUESTS 32    /* per comm: NCCL_NET_MAX_REQUESTS (times maxRecvs on a send comm) */

#define MK_PTR_HOST 0x1
#define MK_PTR_CUDA 0x2
#define MK_PTR_DMABUF 0x4
/* Optional bit for reg_mr's type: the region holds flags or signals (put_signal targets), so
 * it must be registered with strict PCIe ordering (no relaxed ordering). Transports that
 * never use relaxed ordering may ignore it. */
#define MK_PTR_FORCE_SO 0x100

struct mk_transport_ops;

/* Hints for the comms that this thread's next connect and accept calls create, where one
 * user of a transport wants other settings than NCCL's comms (the fused ops' proxy wants more
 * streams); zero fields leave the transport's parameters. Thread-local; transports may
 * ignore them (ib does). */
struct mk_conn_hints {
  int streams;         /* ofi: endpoints per comm (NCCL_MK_OFI_STREAMS otherwise) */
  int progress_thread; /* ofi: -1 none, 1 the comm's own, 2 the device's (0:
                          NCCL_MK_OFI_PROGRESS_THREAD) */
  int connect_ahead;   /* ofi: 1 forms every stream's fabric connection right after the
                          handshake (both ends must ask: the proxy's comms, whose every put
                          uses every stream), not on its first write */
};
void mk_conn_hints_set(const struct mk_conn_hints* h); /* NULL clears */
const struct mk_conn_hints* mk_conn_hints_get(void);

/* First member of every transport's comm, so that generic code finds the ops. */
struct mk_comm {
  const struct mk_transport_ops* ops;
  int dev;
};

/* First member of every transport's request. */
struct mk_request {
  struct mk_comm* comm;
};

struct mk_mr; /* opaque, per transport */

/* What a remote peer needs to write into a registered region (one-sided ops). It travels
 * between processes as plain bytes; `base` is the address the initiator names for offset 0
 * (the virtual address, or 0 when the provider addresses by offset). */
struct mk_rkey {
  uint64_t base;
  uint64_t key;
  uint64_t size;
};

struct mk_dev_props {
  char name[64];
  char pci_path[256];      /* "" when the device has no PCI function (software provider) */
  uint64_t guid;
  int ptr_support;         /* MK_PTR_* */
  int reg_is_global;
  int force_flush;
  int speed_mbps;
  int port;
  float latency_us;
  int max_comms;
  int max_recvs;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
};

struct mk_transport_ops {
  size_t size;       /* sizeof(struct mk_transport_ops), checked at selection */
  const char* name;  /* "ofi", "ib" */

  /* Once per process: load the library (dlopen) and discover devices. -ENODEV when the
   * transport is unusable here (no library, no provider, no device). */
  int (*init)(void);
  void (*fini)(void);
  int (*devices)(int* ndev);
  int (*get_properties)(int dev, struct mk_dev_props* props);

  /* Connection setup. handle is MK_HANDLE_MAX bytes, filled by listen and shipped by NCCL.
   * connect/accept are state machines: 0 with *out == NULL means "call again". A corrupt
   * or foreign handle is -EBADMSG. traffic_class is -1 when undefined. */
  int (*listen)(int dev, void* handle, void** listen_comm);
  int (*connect)(int dev, const void* handle, int traffic_class, struct mk_comm** send_comm);
  int (*accept)(void* listen_comm, struct mk_comm** recv_comm);
  int (*close_listen)(void* listen_comm);
  int (*close)(struct mk_comm* comm);  /* send or receive comm */

  /* Registration on a comm's domain. With reg_is_global the region is usable by every comm
   * of the device, and registering the same range again is a cache hit. type is MK_PTR_*. */
  int (*reg_mr)(struct mk_comm* comm, void* data, size_t size, int type, struct mk_mr** mr);
  int (*reg_mr_dmabuf)(struct mk_comm* comm, void* data, size_t size, int type,
                       uint64_t offset, int fd, struct mk_mr** mr);
  int (*dereg_mr)(struct mk_comm* comm, struct mk_mr* mr);

  /* Two-sided, NCCL net semantics: strict in-order matching per comm; tags pick the buffer
   * of the first pending grouped receive. *req == NULL with 0 means "not now, retry"
   * (the receiver has not posted yet, or the request pool is full). A send larger than the
   * matching receive buffer is -EMSGSIZE. optional: NCCL_NET_OPTIONAL_RECV_COMPLETION. */
  int (*isend)(struct mk_comm* send_comm, void* data, size_t size, int tag, struct mk_mr* mr,
               struct mk_request** req);
  int (*irecv)(struct mk_comm* recv_comm, int n, void** data, const size_t* sizes,
               const int* tags, struct mk_mr** mrs, int optional, struct mk_request** req);
  int (*iflush)(struct mk_comm* recv_comm, int n, void** data, const int* sizes,
                struct mk_mr** mrs, struct mk_request** req);
  /* done=1 frees the request; sizes (may be NULL) gets the bytes of each buffer. */
  int (*test)(struct mk_request* req, int* done, size_t* sizes);

  /* One-sided. mr_rkey describes a region registered with remote access for a peer.
   * put writes size bytes from src (inside src_mr) to dst.base + dst_off on the peer of
   * send_comm. put_signal does the same and then writes the 8-byte value at
   * sig.base + sig_off, never visible before the data. progress drives a comm's
   * target-side work on providers with manual progress (call it while waiting for a
   * signal). */
  int (*mr_rkey)(struct mk_mr* mr, struct mk_rkey* out);
  int (*iput)(struct mk_comm* send_comm, const void* src, size_t size, struct mk_mr* src_mr,
              const struct mk_rkey* dst, uint64_t dst_off, struct mk_request** req);
  int (*iput_signal)(struct mk_comm* send_comm, const void* src, size_t size,
                     struct mk_mr* src_mr, const struct mk_rkey* dst, uint64_t dst_off,
                     const struct mk_rkey* sig, uint64_t sig_off, uint64_t value,
                     struct mk_request** req);
  int (*progress)(struct mk_comm* comm);

  /* Optional (NULL when unsupported), appended last so older transports stay valid: a new
   * device made of the listed devices' ports (NCCL's makeVDevice); *new_dev gets its index. */
  int (*make_vdevice)(int ndevs, const int* devs, int* new_dev);
};

/* The transport NCCL_MK_TRANSPORT names (auto: ib when it initialises with devices, else
 * ofi), initialised once. -ENODEV when none can run here. */
int mk_transport_get(const struct mk_transport_ops** ops);

/* NCCL_MK_CONNECT_TIMEOUT_MS in ns: the bound of every connection step (a handshake, a
 * stream's first post, a post the provider keeps refusing). */
uint64_t mk_connect_timeout_ns(void);

#if MK_HAVE_OFI
extern const struct mk_transport_ops mk_ofi_ops;
/* The endpoints per comm ofi opens with NCCL_MK_OFI_STREAMS=0 (auto) over this libfabric
 * provider: 2 over tcp, 1 elsewhere. */
int mk_ofi_auto_streams(const char* provider);
/* ofi: the endpoints per comm a provider is given when want are asked for. */
int mk_ofi_streams_cap(const char* provider, int want);
/* Which progress thread a comm gets (NCCL_MK_OFI_PROGRESS_THREAD: 0 none, 1 its own, 2 its
 * device's; -1, auto: its own over tcp, whose progress costs syscalls, with 8 or more usable
 * cores, none elsewhere). */
int mk_ofi_progress_thread_on(const char* provider);
/* The automatic rule alone: over tcp with at least 8 usable cores. */
int mk_ofi_progress_auto(const char* provider, int cores);
/* Who drives a comm that has a progress thread, after one of its requests of bytes bytes
 * completed (NCCL_MK_OFI_CALLER_PROGRESS_MAX = max; 0 keeps the thread): returns the new run
 * of small requests from streak, and sets *callers to 1 once MK_OFI_SMALL_STREAK requests in a
 * row were each below max (NCCL's own calls then read the comm's completions), to 0 on a
 * request of max bytes or more (the thread again). */
#define MK_OFI_SMALL_STREAK 16
uint32_t mk_ofi_caller_progress_step(uint32_t streak, uint64_t bytes, uint64_t max, int* callers);
/* Whether a send of size bytes on a comm with a progress thread is posted by that thread:
 * from NCCL_MK_OFI_THREAD_SEND_MIN = min bytes always, a smaller one while the thread drives
 * the comm (thread_drives; else at once, by the caller). */
int mk_ofi_thread_posts_send(uint64_t size, uint64_t min, int thread_drives);
/* ofi: NCCL's calls that went back without the comm's lock while its progress thread held
 * it (isend gave no request, test() said not yet); for tests. */
uint64_t mk_ofi_calls_sent_back(const struct mk_comm* comm);
/* ofi, for tests: the calling thread takes (hold 1) or lets go of (0) the comm's lock, as
 * the progress thread holds it while it posts. */
void mk_ofi_hold_lock(struct mk_comm* comm, int hold);
/* ofi send comm: sends its progress thread posted (mk_ofi_thread_posts_send). */
uint64_t mk_ofi_sends_by_thread(const struct mk_comm* comm);
/* A send comm's sends that found no room in the provider after their first stripe and were
 * resumed later by the progress thread (0 for any other comm); for tests. */
uint64_t mk_ofi_sends_resumed(const struct mk_comm* comm);
/* ofi: 1 while NCCL's calls read this comm's completions instead of its progress thread
 * (mk_ofi_caller_progress_step); for tests. */
int mk_ofi_caller_progress(const struct mk_comm* comm);
/* ofi: messages this comm sent (send) or expected (recv) as RMA writes (protocol version 5). */
uint64_t mk_ofi_messages_written(const struct mk_comm* comm);
/* ofi: the pieces of written messages this comm posted (send) or counted landed (recv). */
uint64_t mk_ofi_pieces_written(const struct mk_comm* comm);
/* ofi receive comm: receives posted without a clear-to-send (protocol version 7), and those
 * of them that sent it late (NCCL_MK_OFI_NO_CTS_MS passed first); 0 for any other comm. */
uint64_t mk_ofi_receives_unannounced(const struct mk_comm* comm, uint64_t* late);
/* ofi: messages this comm sent (send) or delivered (recv) eager. */
uint64_t mk_ofi_messages_eager(const struct mk_comm* comm);
/* ofi: messages this comm sent (send) or announced (recv) through a clear-to-send. */
uint64_t mk_ofi_messages_announced(const struct mk_comm* comm);
/* ofi send comm: isends that went eager without first reading the CQ for their
 * clear-to-send (mk_ofi_isend_reads_cq). */
uint64_t mk_ofi_isend_reads_skipped(const struct mk_comm* comm);
/* ofi receive comm: credit-only messages it sent back to its sender. */
uint64_t mk_ofi_credit_messages(const struct mk_comm* comm);
/* ofi: send comms of this process whose close stopped waiting for their eager credits at the
 * bound while the receiver was still there (ofi_eager_close.c). */
uint64_t mk_ofi_close_drains_short(void);
/* The streams of a comm whose fabric connection was formed ahead (the hint connect_ahead)
 * and has carried its 0-byte message; for tests. */
int mk_ofi_streams_connected_ahead(const struct mk_comm* comm);
#endif
#if MK_HAVE_VERBS
extern const struct mk_transport_ops mk_ib_ops;
#endif

#endif /* MK_TRANSPORT_H_ */
