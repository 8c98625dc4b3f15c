/* The five collectives: buffer sizes, bus-bandwidth factor, the NCCL calls, and the value
 * each output element must hold. Each binary picks one by name (MK_COLL_NAME). */
#include <string.h>

#include "coll_perf.h"

static double factor_one(int n) { (void)n; return 1.0; }
static double factor_ring(int n) { return (double)(n - 1) / n; }
static double factor_all_reduce(int n) { return 2.0 * (n - 1) / n; }

static void counts_same(size_t bytes, size_t es, int n, size_t* send, size_t* recv) {
  *send = *recv = bytes / es;
}
static void counts_gather(size_t bytes, size_t es, int n, size_t* send, size_t* recv) {
  *send = bytes / es / (size_t)n;
  *recv = *send * (size_t)n;
}
static void counts_scatter(size_t bytes, size_t es, int n, size_t* send, size_t* recv) {
  *recv = bytes / es / (size_t)n;
  *send = *recv * (size_t)n;
}
static void counts_alltoall(size_t bytes, size_t es, int n, size_t* send, size_t* recv) {
  *send = *recv = bytes / es / (size_t)n * (size_t)n;
}

static ncclResult_t run_all_reduce(const void* s, void* r, size_t count, ncclDataType_t dt,
                                   ncclRedOp_t op, ncclComm_t c, cudaStream_t st, int rank,
                                   int n) {
  return ncclAllReduce(s, r, count, dt, op, c, st);
}
static ncclResult_t run_all_gather(const void* s, void* r, size_t count, ncclDataType_t dt,
                                   ncclRedOp_t op, ncclComm_t c, cudaStream_t st, int rank,
                                   int n) {
  return ncclAllGather(s, r, count, dt, c, st);
}
static ncclResult_t run_reduce_scatter(const void* s, void* r, size_t count, ncclDataType_t dt,
                                       ncclRedOp_t op, ncclComm_t c, cudaStream_t st, int rank,
                                       int n) {
  return ncclReduceScatter(s, r, count / (size_t)n, dt, op, c, st);
}
/* All-to-all and send/recv as grouped point-to-point calls: every NCCL since 2.7 has them. */
static ncclResult_t run_alltoall(const void* s, void* r, size_t count, ncclDataType_t dt,
                                 ncclRedOp_t op, ncclComm_t c, cudaStream_t st, int rank,
                                 int n) {
  size_t chunk = count / (size_t)n, bytes = chunk * coll_type_size(dt);
  ncclResult_t res = ncclGroupStart();
  for (int p = 0; p < n && res == ncclSuccess; p++) {
    res = ncclSend((const char*)s + p * bytes, chunk, dt, p, c, st);
    if (res == ncclSuccess) res = ncclRecv((char*)r + p * bytes, chunk, dt, p, c, st);
  }
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}
static ncclResult_t run_sendrecv(const void* s, void* r, size_t count, ncclDataType_t dt,
                                 ncclRedOp_t op, ncclComm_t c, cudaStream_t st, int rank,
                                 int n) {
  ncclResult_t res = ncclGroupStart();
  if (res == ncclSuccess) res = ncclSend(s, count, dt, (rank + 1) % n, c, st);
  if (res == ncclSuccess) res = ncclRecv(r, count, dt, (rank + n - 1) % n, c, st);
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

/* Rank r's input element j is coll_input_value(j, r). */
static double expect_all_reduce(size_t i, size_t rc, int rank, int n, ncclRedOp_t op,
                                ncclDataType_t dt, int seed) {
  return coll_reduce_expect(i, n, op, dt, seed);
}
static double expect_all_gather(size_t i, size_t rc, int rank, int n, ncclRedOp_t op,
                                ncclDataType_t dt, int seed) {
  size_t per = rc / (size_t)n;
  return coll_input_value(i % per, (int)(i / per), dt, seed);
}
static double expect_reduce_scatter(size_t i, size_t rc, int rank, int n, ncclRedOp_t op,
                                    ncclDataType_t dt, int seed) {
  return coll_reduce_expect((size_t)rank * rc + i, n, op, dt, seed);
}
static double expect_alltoall(size_t i, size_t rc, int rank, int n, ncclRedOp_t op,
                              ncclDataType_t dt, int seed) {
  size_t chunk = rc / (size_t)n; /* chunk p of the output came from rank p's chunk `rank` */
  return coll_input_value((size_t)rank * chunk + i % chunk, (int)(i / chunk), dt, seed);
}
static double expect_sendrecv(size_t i, size_t rc, int rank, int n, ncclRedOp_t op,
                              ncclDataType_t dt, int seed) {
  return coll_input_value(i, (rank + n - 1) % n, dt, seed);
}

const struct coll_desc mk_colls[] = {
    {"all_reduce", 1, factor_all_reduce, counts_same, run_all_reduce, expect_all_reduce,
     INPLACE_SAME},
    {"all_gather", 0, factor_ring, counts_gather, run_all_gather, expect_all_gather,
     INPLACE_SEND_AT_RANK},
    {"reduce_scatter", 1, factor_ring, counts_scatter, run_reduce_scatter,
     expect_reduce_scatter, INPLACE_RECV_AT_RANK},
    {"alltoall", 0, factor_ring, counts_alltoall, run_alltoall, expect_alltoall, INPLACE_NONE},
    {"sendrecv", 0, factor_one, counts_same, run_sendrecv, expect_sendrecv, INPLACE_NONE},
};

const struct coll_desc* coll_find(const char* name) {
  for (size_t k = 0; k < sizeof(mk_colls) / sizeof(mk_colls[0]); k++)
    if (!strcmp(mk_colls[k].name, name)) return &mk_colls[k];
  return NULL;
}
