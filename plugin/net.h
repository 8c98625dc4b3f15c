/*
 * The net plugin, implemented once for ncclNet_v11_t (plugin/net.c); the older tables in
 * plugin/net_compat.c are thin adapters over these functions.
 */
#ifndef MK_NET_H_
#define MK_NET_H_

#include "abi/net_v11.h"

/* Per-communicator context handed out by v11 init (older versions share one). */
struct mk_net_ctx {
  uint64_t comm_id;
  int traffic_class;          /* NCCL_NET_TRAFFIC_CLASS_UNDEF unless the app set one */
  ncclNetAttr_v11_t attr;     /* last hints from setNetAttr */
  int attr_set;               /* attr holds a call's hints */
};

ncclResult_t mk_net_init(void** ctx, uint64_t comm_id, ncclNetCommConfig_v11_t* config,
                         ncclDebugLogger_t log, ncclProfilerCallback_t prof);
ncclResult_t mk_net_finalize(void* ctx);
ncclResult_t mk_net_devices(int* ndev);
ncclResult_t mk_net_get_properties(int dev, ncclNetProperties_v11_t* props);
ncclResult_t mk_net_listen(void* ctx, int dev, void* handle, void** listen_comm);
ncclResult_t mk_net_connect(void* ctx, int dev, void* handle, void** send_comm,
                            ncclNetDeviceHandle_v11_t** send_dev_comm);
ncclResult_t mk_net_accept(void* listen_comm, void** recv_comm,
                           ncclNetDeviceHandle_v11_t** recv_dev_comm);
ncclResult_t mk_net_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t mk_net_reg_mr_dmabuf(void* comm, void* data, size_t size, int type,
                                  uint64_t offset, int fd, void** mhandle);
ncclResult_t mk_net_dereg_mr(void* comm, void* mhandle);
ncclResult_t mk_net_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                          void* phandle, void** request);
ncclResult_t mk_net_irecv(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                          void** mhandles, void** phandles, void** request);
ncclResult_t mk_net_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                           void** request);
ncclResult_t mk_net_test(void* request, int* done, int* sizes);
ncclResult_t mk_net_close_send(void* send_comm);
ncclResult_t mk_net_close_recv(void* recv_comm);
ncclResult_t mk_net_close_listen(void* listen_comm);
ncclResult_t mk_net_set_net_attr(void* ctx, ncclNetAttr_v11_t* attr);
ncclResult_t mk_net_make_vdevice(int* d, ncclNetVDeviceProps_v11_t* props);

/* The context that the per-process (v10 and older) tables use for every connection. */
struct mk_net_ctx* mk_net_shared_ctx(void);

#define MK_EXPORT __attribute__((visibility("default")))

#endif /* MK_NET_H_ */
