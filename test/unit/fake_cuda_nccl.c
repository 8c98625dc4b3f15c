/*
 * A fake CUDA runtime and NCCL for the collectives harness (test/perf/coll/coll_perf.c) on a
 * host without a GPU: one rank, device memory is host memory, and a simulated clock. Each
 * collective on the first communicator (side A) takes 10 us, on its ncclCommSplit (side B)
 * 8 us, both times a drift of 1 + t / 20 ms, so that a side timed later looks slower unless
 * the two sides are timed close together. Events record the clock. The call order goes to
 * stderr: 'A' or 'B' per collective, '|' per event, a newline per stream wait (the harness's
 * own float64 reductions of its results are not collectives of either side and are not shown).
 * Writes on the legacy stream (cudaMemset, cudaMemcpy from the host) land only when that
 * stream is synchronised or runs its next copy back, as a real GPU may let them (cudaMemset
 * returns before it runs; a copy from pageable memory may still be in flight), so a harness
 * that hands them to a collective on its non-blocking stream without waiting reads stale data.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double clock_us;
struct fake_comm {
  int side;
};
static struct fake_comm fake_comms[2] = {{0}, {1}};

static void fake_collective(ncclComm_t comm) {
  const struct fake_comm* c = (const struct fake_comm*)comm;
  clock_us += (c->side ? 8.0 : 10.0) * (1.0 + clock_us / 20000.0);
  fputc(c->side ? 'B' : 'A', stderr);
}

static size_t fake_type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 4;
  }
}

/* The legacy stream's writes not yet landed, in order. */
struct legacy_write {
  void* dst;
  unsigned char* bytes;
  size_t n;
};
static struct legacy_write legacy_queue[64];
static int legacy_queued;

static void legacy_land(void) {
  for (int i = 0; i < legacy_queued; i++) {
    memcpy(legacy_queue[i].dst, legacy_queue[i].bytes, legacy_queue[i].n);
    free(legacy_queue[i].bytes);
  }
  legacy_queued = 0;
}
static cudaError_t legacy_write(void* d, const void* s, int v, size_t n) {
  if (legacy_queued == (int)(sizeof legacy_queue / sizeof legacy_queue[0])) legacy_land();
  unsigned char* bytes = malloc(n + 1);
  if (!bytes) return cudaErrorMemoryAllocation;
  if (s) memcpy(bytes, s, n); /* a copy: the host may reuse its buffer at once */
  if (!s) memset(bytes, v, n);
  legacy_queue[legacy_queued++] = (struct legacy_write){d, bytes, n};
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t n) {
  *p = calloc(1, n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, enum cudaMemcpyKind k) {
  if (k == cudaMemcpyHostToDevice) return legacy_write(d, s, 0, n);
  legacy_land(); /* a copy back runs after the stream's earlier work and waits for itself */
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st) {
  (void)k, (void)st; /* the harness's own stream: in order with its collectives */
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* d, int v, size_t n) {
  return legacy_write(d, NULL, v, n);
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = (cudaEvent_t)calloc(1, sizeof(double));
  return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
  (void)st;
  *(double*)e = clock_us;
  fputc('|', stderr);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = (float)((*(double*)end - *(double*)start) / 1000.0);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t st) {
  (void)st;
  fputc('\n', stderr);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t st) { /* the other streams' calls are done at once */
  if (st == cudaStreamLegacy || st == NULL) legacy_land();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  legacy_land();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* st, unsigned flags) {
  (void)flags;
  *st = (cudaStream_t)&clock_us;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) {
  (void)dev;
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t e) {
  (void)e;
  return "fake CUDA error";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof(*id));
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int n, ncclUniqueId id, int rank) {
  (void)id;
  if (n != 1 || rank != 0) return ncclInvalidUsage;
  *comm = (ncclComm_t)&fake_comms[0];
  return ncclSuccess;
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out,
                           ncclConfig_t* config) {
  (void)comm, (void)color, (void)key, (void)config;
  *out = (ncclComm_t)&fake_comms[1];
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  (void)comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  (void)comm;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* r) {
  (void)comm;
  *r = ncclSuccess;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  (void)r;
  return "fake NCCL error";
}
ncclResult_t ncclGroupStart(void) {
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  return ncclSuccess;
}

/* One rank: every collective's output is its input. */
ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t st) {
  (void)op, (void)st;
  memmove(r, s, n * fake_type_size(t));
  if (t != ncclFloat64) fake_collective(comm);
  return ncclSuccess;
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t st) {
  (void)st;
  memmove(r, s, n * fake_type_size(t));
  fake_collective(comm);
  return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t st) {
  (void)op;
  return ncclAllGather(s, r, n, t, comm, st);
}
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t st) {
  (void)s, (void)n, (void)t, (void)peer, (void)comm, (void)st;
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t st) {
  (void)r, (void)n, (void)t, (void)peer, (void)comm, (void)st;
  return ncclSuccess;
}
