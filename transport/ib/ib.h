/*
 * Private structures of the IB verbs transport (InfiniBand and RoCE, RC QPs).
 *
 * Object model:
 *  - nic: one opened verbs device (context, PD, async-event watcher, registration cache);
 *  - port: one active port of a nic (what discovery finds and NCCL_MK_IB_HCA filters);
 *  - device (what NCCL sees): a virtual device of 1..IB_MAX_RAILS ports ("rails"); ports of
 *    one nic are merged by default, and make_vdevice merges any list;
 *  - comm: per rail a CQ and the registration of the comm's control block; nqps RC QPs, QP q
 *    on local rail q % nrails and remote rail q % remote_nrails; a side-channel socket kept
 *    open as dead-peer detector; a mutex (NCCL's service and progress threads share comms).
 *
 * Two-sided protocol (same shape as NCCL's net_ib):
 *  1. irecv posts one receive WR per QP, then RDMA-writes n clear-to-send entries
 *     {addr, size, rkeys per rail, tag, seq marker} into the sender's FIFO slot seq % 32.
 *  2. isend waits for that slot, matches its tag, and once every entry of the slot has a send,
 *     RDMA-writes each entry's data striped over the QPs (128-byte aligned chunks), then on
 *     every QP a WRITE_WITH_IMM (imm = seq); the one on QP 0 carries the n sizes into the
 *     receiver's sizes slot. RC executes one QP's operations in order, so a receive completion
 *     on QP q means all of q's chunks have landed; the receive completes after all nqps.
 */
#ifndef MK_IB_H_
#define MK_IB_H_

#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#include "mk_clock.h"
#include "mr_cache.h"
#include "req_pool.h"
#include "sock.h"
#include "transport.h"

#define IB_MAX_NICS 16
#define IB_MAX_PORTS 32
#define IB_MAX_DEVS 64
#define IB_MAX_RAILS 4
#define IB_MAX_QPS 32
#define IB_FIFO_DEPTH MK_MAX_REQUESTS
#define IB_GROUPS (2 * IB_FIFO_DEPTH)         /* sender-side in-flight receive groups */
#define IB_CHUNK_ALIGN 128                     /* LL/LL128 lines stay inside one chunk */
#define IB_MAX_WR_BYTES (1ull << 30)           /* one work request moves at most 1 GiB */
#define IB_WR_PER_PIECE 4                      /* so a message is at most 4 GiB per QP */
#define IB_SQ_DEPTH 2048
#define IB_CQ_DEPTH 4096
#define IB_PROTO_VERSION 1
#define IB_PEER_CHECK_NS 1000000ull

/* The libibverbs functions that are exported symbols (the header's inline helpers, such as
 * ibv_post_send and ibv_poll_cq, go through the context's ops and need no symbol). */
struct ib_syms {
  void* lib;
  struct ibv_device** (*get_device_list)(int* num);
  void (*free_device_list)(struct ibv_device** list);
  const char* (*get_device_name)(struct ibv_device* dev);
  struct ibv_context* (*open_device)(struct ibv_device* dev);
  int (*close_device)(struct ibv_context* ctx);
  int (*query_device)(struct ibv_context* ctx, struct ibv_device_attr* attr);
  int (*query_port)(struct ibv_context* ctx, uint8_t port, struct ibv_port_attr* attr);
  int (*query_gid)(struct ibv_context* ctx, uint8_t port, int index, union ibv_gid* gid);
  struct ibv_pd* (*alloc_pd)(struct ibv_context* ctx);
  int (*dealloc_pd)(struct ibv_pd* pd);
  struct ibv_mr* (*reg_mr)(struct ibv_pd* pd, void* addr, size_t len, int access);
  struct ibv_mr* (*reg_mr_iova2)(struct ibv_pd* pd, void* addr, size_t len, uint64_t iova,
                                 unsigned access); /* optional (rdma-core >= 29) */
  struct ibv_mr* (*reg_dmabuf_mr)(struct ibv_pd* pd, uint64_t off, size_t len, uint64_t iova,
                                  int fd, int access); /* optional (rdma-core >= 34) */
  int (*dereg_mr)(struct ibv_mr* mr);
  struct ibv_cq* (*create_cq)(struct ibv_context* ctx, int cqe, void* cq_ctx,
                              struct ibv_comp_channel* ch, int vector);
  int (*destroy_cq)(struct ibv_cq* cq);
  struct ibv_qp* (*create_qp)(struct ibv_pd* pd, struct ibv_qp_init_attr* attr);
  int (*destroy_qp)(struct ibv_qp* qp);
  int (*modify_qp)(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask);
  int (*get_async_event)(struct ibv_context* ctx, struct ibv_async_event* ev);
  void (*ack_async_event)(struct ibv_async_event* ev);
  const char* (*wc_status_str)(enum ibv_wc_status st);
  const char* (*event_type_str)(enum ibv_event_type ev);
};
extern struct ib_syms ib_sym;
int ib_syms_load(void);
void ib_syms_unload(void);

struct ib_nic {
  char name[64];
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_device_attr attr;
  struct mk_mr_cache mr_cache;
  int dmabuf_ok;       /* ibv_reg_dmabuf_mr exists and the device did not refuse a probe */
  int fatal;           /* set by the async-event thread; every later op fails (-EIO) */
  pthread_t async_thread;
  int async_started;
};

struct ib_port {
  int nic;
  int port;
  char pci_path[256];
  uint64_t guid;
  int link_layer;      /* IBV_LINK_LAYER_* */
  int speed_mbps;
  int gid_index;
  union ibv_gid gid;
  uint16_t lid;
  enum ibv_mtu mtu;
};

struct ib_vdev {
  int nrails;
  int rails[IB_MAX_RAILS]; /* port indices */
  char name[64];
};

struct ib_state {
  int nnics, nports, ndevs;
  struct ib_nic nics[IB_MAX_NICS];
  struct ib_port ports[IB_MAX_PORTS];
  struct ib_vdev devs[IB_MAX_DEVS];
  pthread_mutex_t lock; /* make_vdevice */
  volatile int stop;    /* async threads */
};
extern struct ib_state ib;

/* ib_dev.c */
int ib_init(void);
void ib_fini(void);
int ib_devices(int* ndev);
int ib_get_properties(int dev, struct mk_dev_props* props);
int ib_make_vdevice(int ndevs, const int* devs, int* new_dev);
int ib_vdev_get(int dev, struct ib_vdev** out);
static inline struct ib_nic* ib_port_nic(int port) { return &ib.nics[ib.ports[port].nic]; }
int ib_query_port(struct ibv_context* ctx, uint8_t port, struct ibv_port_attr* attr);
/* Pure helpers, unit-tested: NCCL_IB_HCA-style selection, and Mbit/s of an active port. */
int ib_hca_match(const char* list, const char* name, int port);
int ib_port_speed(const struct ibv_port_attr* a);

/* A clear-to-send entry: one buffer of a posted receive. 64 bytes; `marker` = seq + 1 is
 * written last by the NIC only within one entry's bytes in practice, and the sender checks
 * it on every entry (a multi-entry write may land in any order). */
struct ib_cts {
  uint64_t addr;
  uint64_t size;
  uint32_t rkeys[IB_MAX_RAILS];
  int32_t tag;
  uint32_t nreqs;
  uint32_t seq;
  uint32_t marker;
  uint8_t pad[16];
};
_Static_assert(sizeof(struct ib_cts) == 64, "cts entry layout");

/* Per comm, registered on every rail (never with relaxed ordering: it holds the FIFO and
 * flags, which must never be seen before what they announce). */
struct ib_ctrl {
  struct ib_cts fifo[IB_FIFO_DEPTH][MK_MAX_RECVS];    /* send comm: written by the receiver */
  struct ib_cts cts_out[IB_FIFO_DEPTH][MK_MAX_RECVS]; /* recv comm: source of CTS writes */
  uint64_t sizes[IB_FIFO_DEPTH][MK_MAX_RECVS];        /* recv: in; send: out (per group) */
  uint64_t sizes_out[IB_GROUPS][MK_MAX_RECVS];
  uint64_t signal_values[MK_MAX_REQUESTS * MK_MAX_RECVS]; /* put_signal sources, per request */
  uint64_t flush_sink;                                 /* recv: target of flush reads */
};

/* Side-channel hello. Integers in host order (both ends run the same build family). */
struct ib_qp_info {
  uint32_t qpn;
  uint32_t rail;
};
struct ib_rail_info {
  uint8_t gid[16];
  uint32_t lid;
  uint32_t mtu;
  uint32_t link_layer;
  uint32_t ctrl_rkey;
};
struct ib_hello {
  uint32_t magic;
  uint16_t version;
  uint16_t nqps;
  uint64_t nonce;
  uint32_t nrails;
  uint32_t pad;
  uint64_t ctrl_addr;
  struct ib_rail_info rails[IB_MAX_RAILS];
  struct ib_qp_info qps[IB_MAX_QPS];
};

enum ib_req_kind { IB_REQ_SEND = 1, IB_REQ_RECV, IB_REQ_PUT, IB_REQ_FLUSH };

struct ib_req {
  struct mk_request base;
  int kind;
  int pending;                     /* completions still expected */
  int error;
  int n;
  uint32_t seq;
  size_t sizes[MK_MAX_RECVS];
  struct mk_mr* tmp_mr[MK_MAX_RECVS]; /* registrations we made for buffers given without one */
};

/* Sender side: the sends matched to one receive (one FIFO slot), posted together. */
struct ib_group {
  int used;
  uint32_t seq;
  uint32_t nreqs;
  uint32_t matched;
  int pending;                     /* signaled WRs outstanding once posted */
  struct ib_req* reqs[MK_MAX_RECVS];
  void* data[MK_MAX_RECVS];
  struct mk_mr* mrs[MK_MAX_RECVS];
};

struct ib_comm {
  struct mk_comm base;
  int is_send;
  struct ib_vdev* vdev;
  pthread_mutex_t lock;
  int nrails, remote_nrails;
  struct ibv_cq* cq[IB_MAX_RAILS];
  struct ib_ctrl* ctrl;
  struct ibv_mr* ctrl_mr[IB_MAX_RAILS];
  int nqps;
  struct ibv_qp* qps[IB_MAX_QPS];
  struct ibv_qp* flush_qp[IB_MAX_RAILS]; /* recv comm: connected to itself */
  struct ib_hello local, remote;
  int tc;
  int sock;
  int error;
  enum mk_peer_state peer_state;
  uint64_t last_check_ns, bye_ns;
  struct mk_req_pool pool;
  uint32_t seq;                    /* recv: next receive; send: next receive to match */
  int recvs_active;
  struct ib_req* recv_by_slot[IB_FIFO_DEPTH];
  struct ib_group groups[IB_GROUPS];
  uint32_t next_put_qp;
};

/* wr_id: kind in the top byte, an index below. */
enum ib_wr_kind { IB_WR_GROUP = 1, IB_WR_RECV, IB_WR_CTS, IB_WR_PUT, IB_WR_FLUSH, IB_WR_NONE };
static inline uint64_t ib_wr_id(int kind, uint32_t idx) { return ((uint64_t)kind << 56) | idx; }
static inline int ib_wr_kind(uint64_t id) { return (int)(id >> 56); }
static inline uint32_t ib_wr_idx(uint64_t id) { return (uint32_t)id; }

/* A completed receive's sizes, as the peer wrote them into the sizes slot, into out[]: -EPROTO
 * (out left partly filled) when one is larger than the buffer its clear-to-send offered, else
 * 0. The sender checks the same rule; a corrupt or mismatched peer must not make NCCL read
 * past a buffer. */
static inline int ib_recv_sizes_take(const uint64_t* reported, const struct ib_cts* posted, int n,
                                     size_t* out) {
  for (int i = 0; i < n; i++) {
    if (reported[i] > posted[i].size) return -EPROTO;
    out[i] = (size_t)reported[i];
  }
  return 0;
}

/* ib_conn.c */
int ib_listen(int dev, void* handle, void** listen_comm);
int ib_connect(int dev, const void* handle, int traffic_class, struct mk_comm** send_comm);
int ib_accept(void* listen_comm, struct mk_comm** recv_comm);
int ib_close_listen(void* listen_comm);
int ib_close(struct mk_comm* comm);
/* ib_qp.c */
int ib_comm_create(struct ib_vdev* vdev, int is_send, int tc, struct ib_comm** out);
void ib_comm_destroy(struct ib_comm* c);
int ib_comm_plan_qps(struct ib_comm* c, int nqps);
int ib_comm_connect_qps(struct ib_comm* c);
int ib_hello_valid(const struct ib_hello* h, uint64_t nonce);
/* ib_data.c */
int ib_isend(struct mk_comm* comm, void* data, size_t size, int tag, struct mk_mr* mr,
             struct mk_request** req);
int ib_irecv(struct mk_comm* comm, int n, void** data, const size_t* sizes, const int* tags,
             struct mk_mr** mrs, int optional, struct mk_request** req);
int ib_iflush(struct mk_comm* comm, int n, void** data, const int* sizes, struct mk_mr** mrs,
              struct mk_request** req);
int ib_test(struct mk_request* req, int* done, size_t* sizes);
int ib_comm_check(struct ib_comm* c);
/* ib_cq.c */
int ib_cq_progress(struct ib_comm* c);
int ib_peer_check(struct ib_comm* c);
void ib_req_release(struct ib_comm* c, struct ib_req* r);
/* ib_mr.c */
int ib_reg_mr(struct mk_comm* comm, void* data, size_t size, int type, struct mk_mr** mr);
int ib_reg_mr_dmabuf(struct mk_comm* comm, void* data, size_t size, int type, uint64_t offset,
                     int fd, struct mk_mr** mr);
int ib_dereg_mr(struct mk_comm* comm, struct mk_mr* mr);
/* A request's temporary registration released without its comm (which a close has already
 * taken out of use: ib_close). */
int ib_mr_temp_release(struct mk_mr* mr);
int ib_mr_check(struct mk_mr* mr, const void* data, size_t size);
int ib_mr_keys(struct mk_mr* mr, int rail, uint32_t* lkey, uint32_t* rkey);
int ib_mr_temp(struct ib_comm* c, void* data, size_t size, struct mk_mr** mr);
int ib_reg_internal(struct ib_nic* nic, void* addr, size_t len, struct ibv_mr** out);
/* ib_rma.c */
int ib_mr_rkey(struct mk_mr* mr, struct mk_rkey* out);
int ib_iput(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
            const struct mk_rkey* dst, uint64_t dst_off, struct mk_request** req);
int ib_iput_signal(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
                   const struct mk_rkey* dst, uint64_t dst_off, const struct mk_rkey* sig,
                   uint64_t sig_off, uint64_t value, struct mk_request** req);
int ib_progress(struct mk_comm* comm);

#endif /* MK_IB_H_ */
