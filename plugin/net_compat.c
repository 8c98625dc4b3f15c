/*
 * ncclNet_v10_t, _v9_t and _v8_t for NCCL 2.20-2.27: thin named adapters over the v11
 * implementation in plugin/net.c. Each older table is proven by a test that loads a build
 * exporting only that version (test/unit/meson.build).
 *
 * Before v11, init runs once per process and listen/connect carry no context: they use the
 * shared context, and v10's per-connection traffic class rides on a copy of it.
 */
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include "abi/net_v10.h"
#include "abi/net_v8.h"
#include "abi/net_v9.h"
#include "mk_log.h"
#include "net.h"
#include "transport.h"

static ncclResult_t compat_init(ncclDebugLogger_t log) {
  void* ctx = NULL;
  ncclResult_t res = mk_net_init(&ctx, 0, NULL, log, NULL);
  if (res == ncclSuccess) mk_net_finalize(ctx);
  return res;
}

static ncclResult_t compat_listen(int dev, void* handle, void** listen_comm) {
  return mk_net_listen(mk_net_shared_ctx(), dev, handle, listen_comm);
}

static ncclResult_t compat_connect(int dev, void* handle, void** send_comm,
                                   ncclNetDeviceHandle_v11_t** dev_comm) {
  return mk_net_connect(mk_net_shared_ctx(), dev, handle, send_comm, dev_comm);
}

_Static_assert(offsetof(ncclNetProperties_v10_t, maxCollBytes) ==
                   offsetof(ncclNetProperties_v11_t, maxCollBytes),
               "v10 properties must be a prefix of v11's");
_Static_assert(sizeof(ncclNetProperties_v10_t) <= sizeof(ncclNetProperties_v11_t),
               "v10 properties must be a prefix of v11's");

/* ---- v10 (2.26-2.27) ---------------------------------------------------------------- */

static ncclResult_t v10_init(ncclDebugLogger_t log, ncclProfilerCallback_t prof) {
  return compat_init(log);
}

static ncclResult_t v10_get_properties(int dev, ncclNetProperties_v10_t* props) {
  ncclNetProperties_v11_t p11;
  if (!props) return ncclInvalidArgument;
  ncclResult_t res = mk_net_get_properties(dev, &p11);
  if (res != ncclSuccess) return res;
  /* v10's layout is v11's without the trailing maxMultiRequestSize. */
  memcpy(props, &p11, sizeof(*props));
  return ncclSuccess;
}

static ncclResult_t v10_connect(int dev, ncclNetCommConfig_v10_t* config, void* handle,
                                void** send_comm, ncclNetDeviceHandle_v10_t** dev_comm) {
  struct mk_net_ctx ctx = *mk_net_shared_ctx();
  if (config) ctx.traffic_class = config->trafficClass;
  return mk_net_connect(&ctx, dev, handle, send_comm, dev_comm);
}

MK_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = "mk",
    .init = v10_init,
    .devices = mk_net_devices,
    .getProperties = v10_get_properties,
    .listen = compat_listen,
    .connect = v10_connect,
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
};

/* ---- v9 (2.24-2.25) ----------------------------------------------------------------- */

static ncclResult_t v9_isend(void* send_comm, void* data, size_t size, int tag,
                             void* mhandle, void** request) {
  return mk_net_isend(send_comm, data, size, tag, mhandle, NULL, request);
}

static ncclResult_t v9_irecv(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                             void** mhandles, void** request) {
  return mk_net_irecv(recv_comm, n, data, sizes, tags, mhandles, NULL, request);
}

MK_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = "mk",
    .init = compat_init,
    .devices = mk_net_devices,
    .getProperties = v10_get_properties,
    .listen = compat_listen,
    .connect = compat_connect,
    .accept = mk_net_accept,
    .regMr = mk_net_reg_mr,
    .regMrDmaBuf = mk_net_reg_mr_dmabuf,
    .deregMr = mk_net_dereg_mr,
    .isend = v9_isend,
    .irecv = v9_irecv,
    .iflush = mk_net_iflush,
    .test = mk_net_test,
    .closeSend = mk_net_close_send,
    .closeRecv = mk_net_close_recv,
    .closeListen = mk_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = mk_net_make_vdevice,
};

/* ---- v8 (2.20-2.23): int sizes ------------------------------------------------------ */

static ncclResult_t v8_get_properties(int dev, ncclNetProperties_v8_t* props) {
  ncclNetProperties_v11_t p;
  if (!props) return ncclInvalidArgument;
  ncclResult_t res = mk_net_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  *props = (ncclNetProperties_v8_t){
      .name = p.name, .pciPath = p.pciPath, .guid = p.guid, .ptrSupport = p.ptrSupport,
      .regIsGlobal = p.regIsGlobal, .speed = p.speed, .port = p.port, .latency = p.latency,
      .maxComms = p.maxComms, .maxRecvs = p.maxRecvs, .netDeviceType = p.netDeviceType,
      .netDeviceVersion = p.netDeviceVersion};
  return ncclSuccess;
}

static ncclResult_t v8_isend(void* send_comm, void* data, int size, int tag, void* mhandle,
                             void** request) {
  if (size < 0) {
    MK_WARN("isend: negative size %d", size);
    return ncclInvalidArgument;
  }
  return mk_net_isend(send_comm, data, (size_t)size, tag, mhandle, NULL, request);
}

static ncclResult_t v8_irecv(void* recv_comm, int n, void** data, int* sizes, int* tags,
                             void** mhandles, void** request) {
  size_t sizes64[MK_MAX_RECVS];
  if (!sizes || n < 1 || n > MK_MAX_RECVS) {
    MK_WARN("irecv: bad sizes array or %d grouped receives (1 to %d)", n, MK_MAX_RECVS);
    return ncclInvalidArgument;
  }
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) {
      MK_WARN("irecv: negative size %d at %d", sizes[i], i);
      return ncclInvalidArgument;
    }
    sizes64[i] = (size_t)sizes[i];
  }
  return mk_net_irecv(recv_comm, n, data, sizes64, tags, mhandles, NULL, request);
}

MK_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "mk",
    .init = compat_init,
    .devices = mk_net_devices,
    .getProperties = v8_get_properties,
    .listen = compat_listen,
    .connect = compat_connect,
    .accept = mk_net_accept,
    .regMr = mk_net_reg_mr,
    .regMrDmaBuf = mk_net_reg_mr_dmabuf,
    .deregMr = mk_net_dereg_mr,
    .isend = v8_isend,
    .irecv = v8_irecv,
    .iflush = mk_net_iflush,
    .test = mk_net_test,
    .closeSend = mk_net_close_send,
    .closeRecv = mk_net_close_recv,
    .closeListen = mk_net_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
};
