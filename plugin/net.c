/*
 * ncclNet_v11_t over the selected transport (transport/transport.h). This file is the edge:
 * it checks what NCCL hands in, calls the transport, and turns negative errno into
 * ncclResult_t. It holds no protocol logic.
 */
#include "net.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "net_live.h"
#include "net_trace.h"
#include "transport.h"

#define MK_NET_MAX_DEVS 64
#define MK_NET_SUBSYS (MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET)

static pthread_once_t net_once = PTHREAD_ONCE_INIT;
static int net_discover_rc = -ENODEV;
static const struct mk_transport_ops* net_ops;
static int net_ndev;
static struct mk_dev_props net_props[MK_NET_MAX_DEVS];

static void net_discover(void) {
  mk_param_dump();
  int rc = mk_transport_get(&net_ops);
  if (rc == 0) rc = net_ops->devices(&net_ndev);
  if (rc == 0 && net_ndev <= 0) rc = -ENODEV;
  if (net_ndev > MK_NET_MAX_DEVS) net_ndev = MK_NET_MAX_DEVS;
  for (int d = 0; rc == 0 && d < net_ndev; d++) {
    rc = net_ops->get_properties(d, &net_props[d]);
    if (rc == 0)
      MK_INFO(MK_NET_SUBSYS, "dev %d: %s speed %d Mb/s ptrSupport 0x%x pci %s", d,
              net_props[d].name, net_props[d].speed_mbps, net_props[d].ptr_support,
              net_props[d].pci_path[0] ? net_props[d].pci_path : "(none)");
  }
  if (rc < 0) {
    MK_WARN("no usable network device (%s); NCCL will use another transport",
            strerror(-rc));
    net_ndev = 0;
  }
  net_discover_rc = rc;
}

struct mk_net_ctx* mk_net_shared_ctx(void) {
  static struct mk_net_ctx shared = {
      .comm_id = 0,
      .traffic_class = NCCL_NET_TRAFFIC_CLASS_UNDEF,
      .attr = {{-1, -1, -1, -1}, {-1, -1, -1, -1}, UINT32_MAX, UINT32_MAX, UINT32_MAX},
  };
  return &shared;
}

/* Our comms start with struct mk_comm whose ops is the selected transport's. */
static int net_comm_check(const void* comm, const char* what) {
  const struct mk_comm* c = comm;
  if (!c || !net_ops || c->ops != net_ops) {
    MK_WARN("%s: not a comm of this plugin (%p)", what, comm);
    return -EINVAL;
  }
  return 0;
}

/* An object NCCL takes back (close*, deregMr): refused unless this plugin handed it out and has
 * not taken it back already, without reading it (net_live.h). */
static int net_live_check_take(const void* p, const char* what, const char* kind) {
  if (mk_net_live_take(p) == 0) return 0;
  MK_WARN("%s: %p is not %s of this plugin (already taken back, or never given)", what, p, kind);
  return -EINVAL;
}

/* A new object is made known (net_live.h); when that fails it is undone and the call fails. */
static int net_live_add_or_undo(void* p, int (*undo)(void* p)) {
  int rc = mk_net_live_add(p);
  if (rc < 0) {
    MK_WARN("out of memory recording %p", p);
    undo(p);
  }
  return rc;
}

static int net_close_comm(void* comm) { return net_ops->close(comm); }
static int net_close_listen_comm(void* lc) { return net_ops->close_listen(lc); }

static int net_dev_check(int dev, const char* what) {
  if (dev < 0 || dev >= net_ndev) {
    MK_WARN("%s: device %d out of range [0, %d)", what, dev, net_ndev);
    return -EINVAL;
  }
  return 0;
}

ncclResult_t mk_net_init(void** ctx, uint64_t comm_id, ncclNetCommConfig_v11_t* config,
                         ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  mk_log_set_logger(log);
  if (!ctx) {
    MK_WARN("init: ctx is NULL");
    return ncclInvalidArgument;
  }
  pthread_once(&net_once, net_discover);
  if (net_discover_rc < 0) return mk_result_from_errno(net_discover_rc);
  struct mk_net_ctx* c = calloc(1, sizeof(*c));
  if (!c) return ncclSystemError;
  c->comm_id = comm_id;
  c->traffic_class = config ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
  memset(&c->attr, 0xff, sizeof(c->attr)); /* every hint NCCL_NET_ATTR_UNDEF */
  *ctx = c;
  return ncclSuccess;
}

ncclResult_t mk_net_finalize(void* ctx) {
  if (ctx != mk_net_shared_ctx()) free(ctx);
  return ncclSuccess;
}

ncclResult_t mk_net_devices(int* ndev) {
  if (!ndev) return ncclInvalidArgument;
  pthread_once(&net_once, net_discover);
  *ndev = net_ndev;
  return mk_result_from_errno(net_discover_rc);
}

ncclResult_t mk_net_get_properties(int dev, ncclNetProperties_v11_t* props) {
  if (!props || net_dev_check(dev, "getProperties") < 0) return ncclInvalidArgument;
  const struct mk_dev_props* p = &net_props[dev];
  memset(props, 0, sizeof(*props));
  props->name = (char*)p->name;
  props->pciPath = p->pci_path[0] ? (char*)p->pci_path : NULL;
  props->guid = p->guid;
  props->ptrSupport = p->ptr_support;
  props->regIsGlobal = p->reg_is_global;
  props->forceFlush = p->force_flush;
  props->speed = p->speed_mbps;
  props->port = p->port;
  props->latency = p->latency_us;
  props->maxComms = p->max_comms;
  props->maxRecvs = p->max_recvs;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  props->maxP2pBytes = p->max_p2p_bytes < NCCL_MAX_NET_SIZE_BYTES ? p->max_p2p_bytes
                                                                 : NCCL_MAX_NET_SIZE_BYTES;
  props->maxCollBytes = p->max_coll_bytes < NCCL_MAX_NET_SIZE_BYTES ? p->max_coll_bytes
                                                                   : NCCL_MAX_NET_SIZE_BYTES;
  props->maxMultiRequestSize = 1;
  return ncclSuccess;
}

ncclResult_t mk_net_listen(void* ctx, int dev, void* handle, void** listen_comm) {
  if (!handle || !listen_comm || net_dev_check(dev, "listen") < 0) return ncclInvalidArgument;
  int rc = net_ops->listen(dev, handle, listen_comm);
  if (rc == 0 && (rc = net_live_add_or_undo(*listen_comm, net_close_listen_comm)) < 0)
    *listen_comm = NULL;
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_connect(void* ctx, int dev, void* handle, void** send_comm,
                            ncclNetDeviceHandle_v11_t** send_dev_comm) {
  if (!handle || !send_comm || net_dev_check(dev, "connect") < 0) return ncclInvalidArgument;
  const struct mk_net_ctx* c = ctx ? ctx : mk_net_shared_ctx();
  struct mk_comm* sc = NULL;
  int rc = net_ops->connect(dev, handle, c->traffic_class, &sc);
  if (rc == 0 && sc && (rc = net_live_add_or_undo(sc, net_close_comm)) < 0) sc = NULL;
  *send_comm = sc;
  /* Device offload is not offered: leave NCCL's device handle alone. */
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_accept(void* listen_comm, void** recv_comm,
                           ncclNetDeviceHandle_v11_t** recv_dev_comm) {
  if (!listen_comm || !recv_comm || !net_ops) return ncclInvalidArgument;
  struct mk_comm* rc_comm = NULL;
  int rc = net_ops->accept(listen_comm, &rc_comm);
  if (rc == 0 && rc_comm && (rc = net_live_add_or_undo(rc_comm, net_close_comm)) < 0)
    rc_comm = NULL;
  *recv_comm = rc_comm;
  return mk_result_from_errno(rc);
}

static int net_ptr_type_check(const struct mk_comm* c, int type, const char* what) {
  if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
    MK_WARN("%s: unknown pointer type %d", what, type);
    return -EINVAL;
  }
  if (!(net_props[c->dev].ptr_support & type)) {
    MK_WARN("%s: device %s does not support %s memory", what, net_props[c->dev].name,
            type == NCCL_PTR_CUDA ? "CUDA" : "host");
    return -ENOTSUP;
  }
  return 0;
}

/* A new registration made known; deregistered again when that fails. */
static int net_mr_record(void* comm, void** mhandle) {
  if (!*mhandle) return 0; /* nothing handed out */
  int rc = mk_net_live_add(*mhandle);
  if (rc < 0) {
    MK_WARN("out of memory recording registration %p", *mhandle);
    net_ops->dereg_mr(comm, *mhandle);
    *mhandle = NULL;
  }
  return rc;
}

ncclResult_t mk_net_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  int rc = net_comm_check(comm, "regMr");
  if (rc == 0 && !mhandle) rc = -EINVAL;
  if (rc == 0) rc = net_ptr_type_check(comm, type, "regMr");
  if (rc == 0) rc = net_ops->reg_mr(comm, data, size, type, (struct mk_mr**)mhandle);
  if (rc == 0) rc = net_mr_record(comm, mhandle);
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_reg_mr_dmabuf(void* comm, void* data, size_t size, int type,
                                  uint64_t offset, int fd, void** mhandle) {
  int rc = net_comm_check(comm, "regMrDmaBuf");
  if (rc == 0 && !mhandle) rc = -EINVAL;
  if (rc == 0) rc = net_ptr_type_check(comm, type, "regMrDmaBuf");
  if (rc == 0 && !net_ops->reg_mr_dmabuf) {
    MK_WARN("regMrDmaBuf: transport %s has no DMA-BUF registration", net_ops->name);
    rc = -ENOTSUP;
  }
  if (rc == 0)
    rc = net_ops->reg_mr_dmabuf(comm, data, size, type, offset, fd, (struct mk_mr**)mhandle);
  if (rc == 0) rc = net_mr_record(comm, mhandle);
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_dereg_mr(void* comm, void* mhandle) {
  int rc = net_comm_check(comm, "deregMr");
  if (rc == 0) rc = net_live_check_take(mhandle, "deregMr", "a registration");
  if (rc == 0) rc = net_ops->dereg_mr(comm, mhandle);
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                          void* phandle, void** request) {
  int rc = net_comm_check(send_comm, "isend");
  if (rc == 0 && !request) rc = -EINVAL;
  struct mk_request* req = NULL;
  uint64_t t0 = mk_net_trace_clock();
  if (rc == 0) rc = net_ops->isend(send_comm, data, size, tag, mhandle, &req);
  if (rc == 0) *request = req;
  if (rc == 0 && t0) {
    if (req) mk_net_trace_post(send_comm, req, MK_NET_TRACE_SEND, size, 1, tag, t0);
    else mk_net_trace_attempt(send_comm);
    mk_net_trace_call(req ? MK_NET_CALL_ISEND : MK_NET_CALL_ISEND_NONE, t0);
  }
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_irecv(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                          void** mhandles, void** phandles, void** request) {
  int rc = net_comm_check(recv_comm, "irecv");
  if (rc == 0 && (!request || !data || !sizes || !tags || !mhandles)) rc = -EINVAL;
  if (rc == 0 && (n < 1 || n > MK_MAX_RECVS)) {
    MK_WARN("irecv: %d grouped receives, at most %d", n, MK_MAX_RECVS);
    rc = -EINVAL;
  }
  if (rc < 0) return mk_result_from_errno(rc);
  int optional = n == 1 && *request == (void*)(uintptr_t)NCCL_NET_OPTIONAL_RECV_COMPLETION;
  struct mk_request* req = NULL;
  uint64_t t0 = mk_net_trace_clock();
  rc = net_ops->irecv(recv_comm, n, data, sizes, tags, (struct mk_mr**)mhandles, optional,
                      &req);
  if (rc == 0) *request = req;
  if (rc == 0 && req && t0) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += sizes[i];
    mk_net_trace_post(recv_comm, req, MK_NET_TRACE_RECV, total, n, tags[0], t0);
    mk_net_trace_call(MK_NET_CALL_IRECV, t0);
  }
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                           void** request) {
  int rc = net_comm_check(recv_comm, "iflush");
  if (rc == 0 && (!request || n < 0 || n > MK_MAX_RECVS)) rc = -EINVAL;
  struct mk_request* req = NULL;
  if (rc == 0) rc = net_ops->iflush(recv_comm, n, data, sizes, (struct mk_mr**)mhandles, &req);
  if (rc == 0) *request = req;
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_test(void* request, int* done, int* sizes) {
  struct mk_request* req = request;
  if (!req || !done || net_comm_check(req->comm, "test") < 0) return ncclInvalidArgument;
  /* The transport writes one size per buffer of the request; the sentinel tells how many. */
  size_t got[MK_MAX_RECVS];
  for (int i = 0; i < MK_MAX_RECVS; i++) got[i] = SIZE_MAX;
  uint64_t t0 = mk_net_trace_clock();
  int rc = net_ops->test(req, done, got);
  if (rc == 0 && t0) {
    mk_net_trace_test(req, *done, t0);
    mk_net_trace_call(*done ? MK_NET_CALL_TEST_DONE : MK_NET_CALL_TEST, t0);
  }
  if (rc == 0 && *done && sizes) {
    for (int i = 0; i < MK_MAX_RECVS && got[i] != SIZE_MAX; i++)
      sizes[i] = got[i] > INT32_MAX ? INT32_MAX : (int)got[i];
  }
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_close_send(void* send_comm) {
  if (net_live_check_take(send_comm, "closeSend", "an open comm") < 0 ||
      net_comm_check(send_comm, "closeSend") < 0)
    return ncclInvalidArgument;
  return mk_result_from_errno(net_ops->close(send_comm));
}

ncclResult_t mk_net_close_recv(void* recv_comm) {
  if (net_live_check_take(recv_comm, "closeRecv", "an open comm") < 0 ||
      net_comm_check(recv_comm, "closeRecv") < 0)
    return ncclInvalidArgument;
  return mk_result_from_errno(net_ops->close(recv_comm));
}

ncclResult_t mk_net_close_listen(void* listen_comm) {
  if (!net_ops || net_live_check_take(listen_comm, "closeListen", "an open listen comm") < 0)
    return ncclInvalidArgument;
  return mk_result_from_errno(net_ops->close_listen(listen_comm));
}

/* NCCL merges devices (ports of one NIC) only where the transport can: the others answer
 * ncclInvalidUsage, which NCCL never triggers for them since it merges by PCI path. */
ncclResult_t mk_net_make_vdevice(int* d, ncclNetVDeviceProps_v11_t* props) {
  if (!d || !props || props->ndevs < 1 || props->ndevs > NCCL_NET_MAX_DEVS_PER_NIC || !net_ops)
    return ncclInvalidArgument;
  if (!net_ops->make_vdevice) {
    MK_WARN("makeVDevice: transport %s cannot merge devices", net_ops->name);
    return ncclInvalidUsage;
  }
  if (net_ndev >= MK_NET_MAX_DEVS) return ncclInvalidUsage;
  int dev = -1;
  int rc = net_ops->make_vdevice(props->ndevs, props->devs, &dev);
  if (rc == 0 && dev != net_ndev) rc = -EPROTO; /* devices are numbered densely */
  if (rc == 0) rc = net_ops->get_properties(dev, &net_props[dev]);
  if (rc == 0) {
    net_ndev = dev + 1;
    *d = dev;
    MK_INFO(MK_NET_SUBSYS, "dev %d: virtual device %s over %d device(s)", dev,
            net_props[dev].name, props->ndevs);
  }
  return mk_result_from_errno(rc);
}

ncclResult_t mk_net_set_net_attr(void* ctx, ncclNetAttr_v11_t* attr) {
  struct mk_net_ctx* c = ctx;
  if (!c || !attr) return ncclInvalidArgument;
  /* NCCL 2.28 calls this before every collective: a line only when the hints change */
  const int changed = !c->attr_set || memcmp(&c->attr, attr, sizeof(*attr)) != 0;
  c->attr = *attr;
  c->attr_set = 1;
  if (changed)
    MK_INFO(MK_NCCL_SUBSYS_NET,
            "comm %lx hints: send peers %d-%d flows %d-%d, op 0x%x algo 0x%x "
            "proto 0x%x",
            (unsigned long)c->comm_id, attr->sendCommAttr.minConcurrentPeers,
            attr->sendCommAttr.maxConcurrentPeers, attr->sendCommAttr.minFlowsPerPeer,
            attr->sendCommAttr.maxFlowsPerPeer, attr->op, attr->algo, attr->proto);
  return ncclSuccess;
}

MK_EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = "mk",
    .init = mk_net_init,
    .devices = mk_net_devices,
    .getProperties = mk_net_get_properties,
    .listen = mk_net_listen,
    .connect = mk_net_connect,
    .accept = mk_net_accept,
    .regMr = mk_net_reg_mr,
    .regMrDmaBuf = mk_net_reg_mr_dmabuf,
    .deregMr = mk_net_dereg_mr,
    .isend = mk_net_isend,
    .irecv = mk_net_irecv,
    .iflush = mk_net_iflush,
    .test = mk_net_test,
    .closeSend = mk_net_close_send,
    .closeRecv = mk_net_close_recv,
    .closeListen = mk_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = mk_net_make_vdevice,
    .finalize = mk_net_finalize,
    .setNetAttr = mk_net_set_net_attr,
};
