/*
 * Moves real bytes through one version's plugin table, as NCCL would drive it, inside one
 * process (connect/accept/isend/irecv/test are non-blocking, so one thread can play both
 * sides): listen, connect/accept, register, a grouped receive of 8 buffers whose tags the
 * sends hit in reverse order, integrity of every byte, the sizes test() reports, then close;
 * a second deregMr or close is refused.
 *
 * usage: test_net_table_traffic <lib.so> <v11|v10|v9|v8>
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "abi/net_v10.h"
#include "abi/net_v11.h"
#include "abi/net_v8.h"
#include "abi/net_v9.h"
#include "mk_test.h"

#define NBUF 8

/* The calls the driver needs, whatever the table's version. */
struct drive {
  ncclResult_t (*listen)(const void* t, void* handle, void** lc);
  ncclResult_t (*connect)(const void* t, void* handle, void** sc);
  ncclResult_t (*reg)(const void* t, void* comm, void* p, size_t n, void** mh);
  ncclResult_t (*isend)(const void* t, void* sc, void* p, size_t n, int tag, void* mh, void** r);
  ncclResult_t (*irecv)(const void* t, void* rc, int n, void** p, size_t* sz, int* tags,
                        void** mh, void** r);
  const void* table;
  void* ctx; /* v11 only */
};

/* Shared-prefix members (accept, test, closes, deregMr) sit at the same place in every
 * version's table up to irecv's signature, so v8's table serves as the common view for
 * them; each version's own thunks cover the rest. */
static ncclResult_t v11_listen(const void* t, void* h, void** lc) {
  static void* ctx;
  const ncclNet_v11_t* n = t;
  if (!ctx) n->init(&ctx, 1, NULL, NULL, NULL);
  return n->listen(ctx, 0, h, lc);
}
static ncclResult_t v11_connect(const void* t, void* h, void** sc) {
  ncclNetDeviceHandle_v11_t* dev = NULL;
  return ((const ncclNet_v11_t*)t)->connect(NULL, 0, h, sc, &dev);
}
static ncclResult_t v11_isend(const void* t, void* sc, void* p, size_t n, int tag, void* mh,
                              void** r) {
  return ((const ncclNet_v11_t*)t)->isend(sc, p, n, tag, mh, NULL, r);
}
static ncclResult_t v11_irecv(const void* t, void* rc, int n, void** p, size_t* sz, int* tags,
                              void** mh, void** r) {
  return ((const ncclNet_v11_t*)t)->irecv(rc, n, p, sz, tags, mh, NULL, r);
}
static ncclResult_t v10_listen(const void* t, void* h, void** lc) {
  ((const ncclNet_v10_t*)t)->init(NULL, NULL);
  return ((const ncclNet_v10_t*)t)->listen(0, h, lc);
}
static ncclResult_t v10_connect(const void* t, void* h, void** sc) {
  ncclNetCommConfig_v10_t cfg = {.trafficClass = 3};
  ncclNetDeviceHandle_v10_t* dev = NULL;
  return ((const ncclNet_v10_t*)t)->connect(0, &cfg, h, sc, &dev);
}
static ncclResult_t v9_listen(const void* t, void* h, void** lc) {
  ((const ncclNet_v9_t*)t)->init(NULL);
  return ((const ncclNet_v9_t*)t)->listen(0, h, lc);
}
static ncclResult_t v9_connect(const void* t, void* h, void** sc) {
  ncclNetDeviceHandle_v9_t* dev = NULL;
  return ((const ncclNet_v9_t*)t)->connect(0, h, sc, &dev);
}
static ncclResult_t v9_isend(const void* t, void* sc, void* p, size_t n, int tag, void* mh,
                             void** r) {
  return ((const ncclNet_v9_t*)t)->isend(sc, p, n, tag, mh, r);
}
static ncclResult_t v9_irecv(const void* t, void* rc, int n, void** p, size_t* sz, int* tags,
                             void** mh, void** r) {
  return ((const ncclNet_v9_t*)t)->irecv(rc, n, p, sz, tags, mh, r);
}
static ncclResult_t v8_isend(const void* t, void* sc, void* p, size_t n, int tag, void* mh,
                             void** r) {
  return ((const ncclNet_v8_t*)t)->isend(sc, p, (int)n, tag, mh, r);
}
static ncclResult_t v8_irecv(const void* t, void* rc, int n, void** p, size_t* sz, int* tags,
                             void** mh, void** r) {
  int isz[NBUF];
  for (int i = 0; i < n; i++) isz[i] = (int)sz[i];
  return ((const ncclNet_v8_t*)t)->irecv(rc, n, p, isz, tags, mh, r);
}
static ncclResult_t any_reg(const void* t, void* comm, void* p, size_t n, void** mh) {
  return ((const ncclNet_v8_t*)t)->regMr(comm, p, n, NCCL_PTR_HOST, mh);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void connect_pair(const struct drive* d, const ncclNet_v8_t* c, void** sc, void** rc,
                         void** lc) {
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
  CHECK_EQ(d->listen(d->table, handle, lc), ncclSuccess);
  ncclNetDeviceHandle_v8_t* dev = NULL;
  *sc = *rc = NULL;
  for (double t0 = now_s(); (!*sc || !*rc) && now_s() - t0 < 20;) {
    if (!*sc) CHECK_EQ(d->connect(d->table, handle, sc), ncclSuccess);
    if (!*rc) CHECK_EQ(c->accept(*lc, rc, &dev), ncclSuccess);
  }
  CHECK(*sc && *rc);
}

static void wait_done(const ncclNet_v8_t* c, void* req, int* sizes) {
  int done = 0;
  for (double t0 = now_s(); !done && now_s() - t0 < 20;)
    if (c->test(req, &done, sizes) != ncclSuccess) break;
  CHECK(done);
}

/* 8 grouped buffers with tags 100..107; sends carry tags in reverse order, each a
 * different size, and must land in the buffer whose tag they carry. */
static void grouped_receive_matches_tags(const struct drive* d, const ncclNet_v8_t* c,
                                         void* sc, void* rc) {
  enum { CAP = 1 << 16 };
  static uint8_t src[NBUF][CAP], dst[NBUF][CAP];
  void *smh[NBUF], *rmh[NBUF], *rptr[NBUF], *sreq[NBUF], *rreq = NULL;
  size_t rsz[NBUF];
  int tags[NBUF], got[NBUF];
  srand((unsigned)time(NULL));
  for (int i = 0; i < NBUF; i++) {
    for (int j = 0; j < CAP; j++) src[i][j] = (uint8_t)rand();
    memset(dst[i], 0xee, CAP);
    CHECK_EQ(d->reg(d->table, sc, src[i], CAP, &smh[i]), ncclSuccess);
    CHECK_EQ(d->reg(d->table, rc, dst[i], CAP, &rmh[i]), ncclSuccess);
    rptr[i] = dst[i], rsz[i] = CAP, tags[i] = 100 + i;
  }
  CHECK_EQ(d->irecv(d->table, rc, NBUF, rptr, rsz, tags, rmh, &rreq), ncclSuccess);
  CHECK(rreq != NULL);
  for (int k = 0; k < NBUF; k++) {
    int i = NBUF - 1 - k; /* reverse tag order */
    sreq[k] = NULL;
    for (double t0 = now_s(); !sreq[k] && now_s() - t0 < 20;) {
      CHECK_EQ(d->isend(d->table, sc, src[i], 1000u * (i + 1), 100 + i, smh[i], &sreq[k]),
               ncclSuccess);
      if (!sreq[k]) { int done; c->test(rreq, &done, NULL); }
    }
  }
  for (int k = 0; k < NBUF; k++) wait_done(c, sreq[k], NULL);
  wait_done(c, rreq, got);
  /* tested again after it completed: refused, not done twice (nothing allocated since) */
  int again = 1;
  CHECK_EQ(c->test(rreq, &again, NULL), ncclInvalidArgument);
  CHECK_EQ(again, 0);
  void* dmh = NULL; /* a DMA-BUF registration of an unknown pointer type: refused before the transport */
  CHECK_EQ(c->regMrDmaBuf(rc, dst[0], CAP, 0x77, 0, -1, &dmh), ncclInvalidArgument);
  CHECK(dmh == NULL);
  for (int i = 0; i < NBUF; i++) {
    CHECK_EQ(got[i], 1000 * (i + 1));
    CHECK(memcmp(src[i], dst[i], 1000u * (i + 1)) == 0);
    CHECK_EQ(dst[i][1000u * (i + 1)], 0xee); /* nothing past the message */
    CHECK_EQ(c->deregMr(sc, smh[i]), ncclSuccess);
    CHECK_EQ(c->deregMr(rc, rmh[i]), ncclSuccess);
    /* a second deregMr is refused without reading the freed registration (net_live.h) */
    CHECK_EQ(c->deregMr(sc, smh[i]), ncclInvalidArgument);
  }
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  alarm(60); /* a bug must not hang CI */
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  char sym[64];
  snprintf(sym, sizeof(sym), "ncclNetPlugin_%s", argv[2]);
  const void* t = dlsym(lib, sym);
  if (!t) { fprintf(stderr, "%s not exported\n", sym); return 1; }
  struct drive d = {.table = t, .reg = any_reg};
  const char* v = argv[2];
  d.listen = !strcmp(v, "v11") ? v11_listen : !strcmp(v, "v10") ? v10_listen : v9_listen;
  d.connect = !strcmp(v, "v11") ? v11_connect : !strcmp(v, "v10") ? v10_connect : v9_connect;
  d.isend = !strcmp(v, "v8") ? v8_isend : !strcmp(v, "v9") ? v9_isend : v11_isend;
  d.irecv = !strcmp(v, "v8") ? v8_irecv : !strcmp(v, "v9") ? v9_irecv : v11_irecv;
  void *sc, *rc, *lc;
  connect_pair(&d, t, &sc, &rc, &lc);
  if (sc && rc) grouped_receive_matches_tags(&d, t, sc, rc);
  const ncclNet_v8_t* c = t;
  if (sc) CHECK_EQ(c->closeSend(sc), ncclSuccess);
  if (rc) CHECK_EQ(c->closeRecv(rc), ncclSuccess);
  CHECK_EQ(c->closeListen(lc), ncclSuccess);
  /* closed twice: refused, the freed comms not read (under ASan, a read would be reported) */
  if (sc) CHECK_EQ(c->closeSend(sc), ncclInvalidArgument);
  if (rc) CHECK_EQ(c->closeRecv(rc), ncclInvalidArgument);
  CHECK_EQ(c->closeListen(lc), ncclInvalidArgument);
  return MK_TEST_RESULT();
}
