/*
 * A fake CUDA runtime and NCCL for the collectives harness (test/perf/coll/coll_perf.c) on a
 * host without a GPU: one rank, device memory is host memory, and a simulated clock. Each
 * collective on the first communicator (side A) takes 10 us, on its ncclCommSplit (side B)
 * 8 us, both times a drift of 1 + t / 20 ms, so that a side timed later looks slower unless
 * the two sides are timed close together. Events record the clock. The call order goes to
 * stderr: 'A' or 'B' per collective, '|' per event, a newline per stream wait (the harness's
 * own float64 reductions of its results are not collectives of either side and are not shown).
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

cudaError_t cudaMalloc(void** p, size_t n) {
  *p = calloc(1, n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, enum cudaMemcpyKind k) {
  (void)k;
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st) {
  (void)st;
  return cudaMemcpy(d, s, n, k);
}
cudaError_t cudaMemset(void* d, int v, size_t n) {
  memset(d, v, n);
  return cudaSuccess;
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
cudaError_t cudaStreamSynchronize(cudaStream_t st) { /* every fake call is done when it returns */
  (void)st;
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
