/*
 * Loads a build of the plugin the way NCCL does (dlopen, dlsym of the versioned tuner
 * table) and drives it: only the expected tables are exported, name "mk", every entry set,
 * a measured choice forced through each table (NCCL_MK_TUNER_FILE = data/tuner_basic.txt,
 * set by meson), and NULL arguments answered with ncclSuccess.
 *
 * usage: test_tuner_tables <path to .so> <all|v4>
 */
#include <dlfcn.h>

#include "abi/tuner_v4.h"
#include "tuner_test_util.h"

static void only_expected_tables_are_exported(void* lib, const char* want) {
  int all = strcmp(want, "all") == 0;
  CHECK_EQ(dlsym(lib, "ncclTunerPlugin_v5") != NULL, all);
  CHECK(dlsym(lib, "ncclTunerPlugin_v4") != NULL);
  if (!all) CHECK(dlsym(lib, "ncclNetPlugin_v11") == NULL); /* a v4-era build: nothing else */
  CHECK(dlsym(lib, "mk_tuner_init") == NULL);               /* internals stay hidden */
  CHECK(dlsym(lib, "mk_tuner_fused_defaults") == NULL);
}

/* The same getCollInfo behind both tables: all-reduce of 2 MiB on 2 ranks is ring/simple. */
typedef ncclResult_t (*get_coll_info_fn)(void*, ncclFunc_t, size_t, int, float**, int, int,
                                         int, int*);

static void check_get_coll_info(get_coll_info_fn get, void* ctx) {
  float before[NA][NP], after[NA][NP];
  tuner_test_fill_table(before);
  memcpy(after, before, sizeof(after));
  int nch = 0;
  CHECK_EQ(get(ctx, ncclFuncAllReduce, 2 << 20, 1, (float**)after, NA, NP, 0, &nch),
           ncclSuccess);
  CHECK_FORCED(before, after, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE);
  nch = 0;
  CHECK_EQ(get(ctx, ncclFuncReduceScatter, 1 << 20, 1, (float**)after, NA, NP, 0, &nch),
           ncclSuccess);
  CHECK_EQ(nch, 16);
  CHECK_EQ(get(ctx, ncclFuncAllReduce, 64, 1, NULL, NA, NP, 0, NULL), ncclSuccess);
  CHECK_EQ(get(NULL, ncclFuncAllReduce, 64, 1, (float**)after, NA, NP, 0, &nch), ncclSuccess);
}

static void drive_v5(const ncclTuner_v5_t* t) {
  CHECK_STR(t->name, "mk");
  CHECK(t->init && t->getCollInfo && t->finalize);
  void* ctx = NULL;
  ncclNvlDomainInfo_v5_t nvl = {1, 2, 2};
  ncclTunerConstants_v5_t constants, untouched;
  memset(&constants, 0x5a, sizeof(constants));
  untouched = constants;
  CHECK_EQ(t->init(&ctx, 77, 2, 1, tuner_test_logger, &nvl, &constants), ncclSuccess);
  CHECK(ctx != NULL);
  CHECK(memcmp(&constants, &untouched, sizeof(constants)) == 0);
  check_get_coll_info(t->getCollInfo, ctx);
  CHECK_EQ(t->finalize(ctx), ncclSuccess);
  CHECK_EQ(t->init(NULL, 77, 2, 1, NULL, NULL, NULL), ncclSuccess);
  CHECK_EQ(t->finalize(NULL), ncclSuccess);
}

static void drive_v4(const ncclTuner_v4_t* t) {
  CHECK_STR(t->name, "mk");
  CHECK(t->init && t->getCollInfo && t->destroy);
  void* ctx = NULL;
  CHECK_EQ(t->init(2, 1, tuner_test_logger, &ctx), ncclSuccess);
  CHECK(ctx != NULL);
  check_get_coll_info(t->getCollInfo, ctx);
  CHECK_EQ(t->destroy(ctx), ncclSuccess);
  CHECK_EQ(t->init(2, 1, NULL, NULL), ncclSuccess);
  CHECK_EQ(t->destroy(NULL), ncclSuccess);
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[2], "all") && strcmp(argv[2], "v4"))) {
    fprintf(stderr, "usage: %s <lib.so> <all|v4>\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  only_expected_tables_are_exported(lib, argv[2]);
  const ncclTuner_v5_t* v5 = dlsym(lib, "ncclTunerPlugin_v5");
  const ncclTuner_v4_t* v4 = dlsym(lib, "ncclTunerPlugin_v4");
  if (v5) drive_v5(v5);
  if (v4) drive_v4(v4);
  return MK_TEST_RESULT();
}
