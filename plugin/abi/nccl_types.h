/*
 * The NCCL types shared by every plugin ABI version, written from
 * ../shared/reference/nccl-abi.md. Never include NCCL internals.
 *
 * ncclResult_t comes from NCCL's public <nccl.h> where it is installed (the build finds it),
 * so plugin and fused-op code agree on one type; otherwise it is declared here with the
 * same values.
 */
#ifndef MK_ABI_NCCL_TYPES_H_
#define MK_ABI_NCCL_TYPES_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
#endif
#endif

#ifndef NCCL_H_
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;
#endif

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem bits for INFO/TRACE filtering (NCCL_DEBUG_SUBSYS). */
enum {
  MK_NCCL_SUBSYS_INIT = 0x1,
  MK_NCCL_SUBSYS_NET = 0x10,
  MK_NCCL_SUBSYS_TUNING = 0x40,
  MK_NCCL_SUBSYS_ENV = 0x80,
  MK_NCCL_SUBSYS_ALLOC = 0x100,
  MK_NCCL_SUBSYS_PROXY = 0x400,
  MK_NCCL_SUBSYS_REG = 0x2000,
  MK_NCCL_SUBSYS_ALL = ~0
};

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char* file, int line, const char* fmt, ...);
typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* phandle,
                                               int64_t pluginId, void* extData);

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_MAX_NET_SIZE_BYTES (1ULL << 40)
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_NET_MAX_REQUESTS 32
#define NCCL_NET_MAX_DEVS_PER_NIC 4

#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4

typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1,
  NCCL_NET_DEVICE_GIN_PROXY = 2,
  NCCL_NET_DEVICE_GIN_GDAKI = 3
} ncclNetDeviceType;

/* Same layout from v7 to v11. */
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v11_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v11_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v11_t ncclNetDeviceHandle_v8_t;

typedef struct {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC];
} ncclNetVDeviceProps_v11_t;
typedef ncclNetVDeviceProps_v11_t ncclNetVDeviceProps_v10_t;
typedef ncclNetVDeviceProps_v11_t ncclNetVDeviceProps_v9_t;

typedef struct {
  int trafficClass; /* -1 unless the application set ncclConfig_t.trafficClass */
} ncclNetCommConfig_v11_t;
typedef ncclNetCommConfig_v11_t ncclNetCommConfig_v10_t;
#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)

#endif /* MK_ABI_NCCL_TYPES_H_ */
