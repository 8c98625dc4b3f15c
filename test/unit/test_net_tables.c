/*
 * Loads a build of the plugin the way NCCL does (dlopen, dlsym of the versioned table) and
 * checks the table: only the expected versions are exported, name "mk", every mandatory
 * entry set, bad arguments rejected, and (when a transport is built and expected to work)
 * init/devices/getProperties give honest, sane properties.
 *
 * usage: test_net_tables <path to .so> <v11|v10|v9|v8|all> <expect-devices 0|1>
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi/net_v10.h"
#include "abi/net_v11.h"
#include "abi/net_v8.h"
#include "abi/net_v9.h"
#include "mk_test.h"

static const char* versions[] = {"v11", "v10", "v9", "v8"};

static void only_expected_versions_are_exported(void* lib, const char* want) {
  for (int i = 0; i < 4; i++) {
    char sym[64];
    snprintf(sym, sizeof(sym), "ncclNetPlugin_%s", versions[i]);
    int expect = strcmp(want, "all") == 0 || strcmp(want, versions[i]) == 0;
    if (expect != (dlsym(lib, sym) != NULL))
      fprintf(stderr, "%s: expected %s\n", sym, expect ? "present" : "absent");
    CHECK(expect == (dlsym(lib, sym) != NULL));
  }
  CHECK(dlsym(lib, "mk_net_isend") == NULL); /* internals stay hidden */
  CHECK(dlsym(lib, "mk_param_int") == NULL);
}

/* The fields every version shares, in the same order up to getDeviceMr. */
#define CHECK_COMMON_ENTRIES(t)                                                         \
  do {                                                                                  \
    CHECK_STR((t)->name, "mk");                                                         \
    CHECK((t)->init && (t)->devices && (t)->getProperties && (t)->listen);              \
    CHECK((t)->connect && (t)->accept && (t)->regMr && (t)->regMrDmaBuf);               \
    CHECK((t)->deregMr && (t)->isend && (t)->irecv && (t)->iflush && (t)->test);        \
    CHECK((t)->closeSend && (t)->closeRecv && (t)->closeListen);                        \
  } while (0)

static void check_sane_props(const char* name, int ptr_support, int speed, int max_recvs,
                             int dev_type) {
  CHECK(name && name[0]);
  CHECK(ptr_support & NCCL_PTR_HOST);
  CHECK(speed > 0);
  CHECK_EQ(max_recvs, 8);
  CHECK_EQ(dev_type, NCCL_NET_DEVICE_HOST);
}

/* NCCL's logger as the plugin sees it: counts the lines that carry setNetAttr's hints */
static int hint_lines;
static void count_hint_lines(ncclDebugLogLevel level, unsigned long flags, const char* file,
                             int line, const char* fmt, ...) {
  (void)level, (void)flags, (void)file, (void)line;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (strstr(msg, "hints:")) hint_lines++;
}

/* NCCL 2.28 calls setNetAttr before every collective: one INFO line per change of hints,
 * not one per call (an 8-byte all_reduce loop logged thousands). */
static void set_net_attr_logs_only_changes(const ncclNet_v11_t* t, void* ctx) {
  ncclNetAttr_v11_t attr;
  memset(&attr, 0xff, sizeof(attr));
  hint_lines = 0;
  for (int i = 0; i < 3; i++) CHECK_EQ(t->setNetAttr(ctx, &attr), ncclSuccess);
  CHECK_EQ(hint_lines, 1);
  attr.op = 0x10;
  CHECK_EQ(t->setNetAttr(ctx, &attr), ncclSuccess);
  CHECK_EQ(t->setNetAttr(ctx, &attr), ncclSuccess);
  CHECK_EQ(hint_lines, 2);
  CHECK_EQ(t->setNetAttr(ctx, NULL), ncclInvalidArgument);
}

static void drive_v11(const ncclNet_v11_t* t, int expect_devices) {
  CHECK_COMMON_ENTRIES(t);
  CHECK(t->finalize && t->setNetAttr);
  void* ctx = NULL;
  ncclNetCommConfig_v11_t cfg = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
  ncclResult_t res = t->init(&ctx, 42, &cfg, count_hint_lines, NULL);
  CHECK_EQ(t->init(NULL, 42, &cfg, NULL, NULL), ncclInvalidArgument);
  int ndev = -1;
  t->devices(&ndev);
  if (!expect_devices) {
    if (res == ncclSuccess) CHECK(ndev > 0); else CHECK_EQ(ndev, 0);
    return;
  }
  CHECK_EQ(res, ncclSuccess);
  CHECK(ndev > 0);
  ncclNetProperties_v11_t p;
  CHECK_EQ(t->getProperties(0, &p), ncclSuccess);
  check_sane_props(p.name, p.ptrSupport, p.speed, p.maxRecvs, p.netDeviceType);
  CHECK_EQ(p.maxMultiRequestSize, 1);
  CHECK(p.maxP2pBytes > 0 && p.maxP2pBytes <= NCCL_MAX_NET_SIZE_BYTES);
  CHECK_EQ(t->getProperties(ndev, &p), ncclInvalidArgument);
  CHECK_EQ(t->getProperties(0, NULL), ncclInvalidArgument);
  CHECK_EQ(t->isend(NULL, NULL, 0, 0, NULL, NULL, NULL), ncclInvalidArgument);
  CHECK_EQ(t->test(NULL, NULL, NULL), ncclInvalidArgument);
  int garbage[16] = {0};
  void* req = NULL;
  CHECK_EQ(t->isend(garbage, NULL, 0, 0, NULL, NULL, &req), ncclInvalidArgument);
  /* libfabric devices never merge: a clear refusal, not a crash */
  ncclNetVDeviceProps_v11_t vp = {.ndevs = 1, .devs = {0}};
  int vd = -1;
  CHECK(t->makeVDevice != NULL);
  CHECK_EQ(t->makeVDevice(&vd, NULL), ncclInvalidArgument);
  ncclResult_t vres = t->makeVDevice(&vd, &vp);
  CHECK(vres == ncclInvalidUsage || vres == ncclSuccess);
  set_net_attr_logs_only_changes(t, ctx);
  CHECK_EQ(t->finalize(ctx), ncclSuccess);
}

static void drive_v10(const ncclNet_v10_t* t, int expect_devices) {
  CHECK_COMMON_ENTRIES(t);
  ncclResult_t res = t->init(NULL, NULL);
  int ndev = 0;
  t->devices(&ndev);
  if (!expect_devices) return;
  CHECK_EQ(res, ncclSuccess);
  ncclNetProperties_v10_t p;
  CHECK_EQ(t->getProperties(0, &p), ncclSuccess);
  check_sane_props(p.name, p.ptrSupport, p.speed, p.maxRecvs, p.netDeviceType);
  CHECK(p.maxP2pBytes > 0);
  CHECK_EQ(p.vProps.ndevs, 1);
}

static void drive_v9(const ncclNet_v9_t* t, int expect_devices) {
  CHECK_COMMON_ENTRIES(t);
  ncclResult_t res = t->init(NULL);
  if (!expect_devices) return;
  CHECK_EQ(res, ncclSuccess);
  ncclNetProperties_v9_t p;
  CHECK_EQ(t->getProperties(0, &p), ncclSuccess);
  check_sane_props(p.name, p.ptrSupport, p.speed, p.maxRecvs, p.netDeviceType);
}

static void drive_v8(const ncclNet_v8_t* t, int expect_devices) {
  CHECK_COMMON_ENTRIES(t);
  ncclResult_t res = t->init(NULL);
  void* req = NULL;
  int sizes[2] = {-1, 4};
  CHECK_EQ(t->irecv((void*)1, 2, NULL, sizes, NULL, NULL, &req), ncclInvalidArgument);
  CHECK_EQ(t->isend(NULL, NULL, -5, 0, NULL, &req), ncclInvalidArgument);
  if (!expect_devices) return;
  CHECK_EQ(res, ncclSuccess);
  ncclNetProperties_v8_t p;
  CHECK_EQ(t->getProperties(0, &p), ncclSuccess);
  check_sane_props(p.name, p.ptrSupport, p.speed, p.maxRecvs, p.netDeviceType);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s <lib.so> <v11|v10|v9|v8|all> <expect-devices>\n", argv[0]);
    return 2;
  }
  int expect_devices = atoi(argv[3]);
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  only_expected_versions_are_exported(lib, argv[2]);
  const char* v = argv[2];
  if (!strcmp(v, "all") || !strcmp(v, "v11"))
    drive_v11(dlsym(lib, "ncclNetPlugin_v11"), expect_devices);
  if (!strcmp(v, "v10")) drive_v10(dlsym(lib, "ncclNetPlugin_v10"), expect_devices);
  if (!strcmp(v, "v9")) drive_v9(dlsym(lib, "ncclNetPlugin_v9"), expect_devices);
  if (!strcmp(v, "v8")) drive_v8(dlsym(lib, "ncclNetPlugin_v8"), expect_devices);
  return MK_TEST_RESULT();
}
