/*
 * The MoE API's refusals that need no GPU: bad ncclMkConfig MoE fields and sizes (mk_config_read,
 * ncclMkCommInit's check before its exchange), NULL and misaligned arguments, layouts of a
 * communicator that has no ncclMkCommInit; tokens = 0 passing the argument checks (token-side
 * pointers NULL) while the dense ops still refuse M = 0. Every refusal is an ncclResult_t,
 * never a crash; the communicator handle is a made-up pointer that must never be dereferenced.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fused_comm.h"
#include "mk_err.h"
#include "mk_test.h"
#include "nccl_mk.h"
#include "warn_capture.h"

static ncclComm_t fake_comm(void) { return (ncclComm_t)(uintptr_t)0x10000; }
static void* fake_ptr(uintptr_t i) { return (void*)(uintptr_t)(0x100000 + 0x1000 * i); }

/* ncclMkCommInit's reading of a config (mk_config_read), without the exchange that follows
 * it on every rank even for a refused config (so that the peers learn of it). */
static ncclResult_t config_read(const ncclMkConfig* config) {
  ncclMkConfig cfg;
  return mk_result_from_errno(mk_config_read(config, &cfg));
}

static ncclResult_t init_with(void (*change)(ncclMkConfig*)) {
  ncclMkConfig cfg;
  ncclMkConfigDefaults(&cfg);
  cfg.moe_max_tokens = 64, cfg.moe_max_hidden = 128, cfg.moe_max_topk = 2;
  change(&cfg);
  return config_read(&cfg);
}

static void fp8_two(ncclMkConfig* c) { c->moe_dispatch_fp8 = 2; }
static void tokens_negative(ncclMkConfig* c) { c->moe_max_tokens = -1; }
static void recv_rows_negative(ncclMkConfig* c) { c->moe_max_recv_rows = -1; }
static void hidden_zero(ncclMkConfig* c) { c->moe_max_hidden = 0; }
static void hidden_not_8(ncclMkConfig* c) { c->moe_max_hidden = 12; }
static void topk_zero(ncclMkConfig* c) { c->moe_max_topk = 0; }
static void topk_17(ncclMkConfig* c) { c->moe_max_topk = 17; }
static void tokens_huge(ncclMkConfig* c) { c->moe_max_tokens = (1 << 20) + 1; }
/* tokens x topk rows of one expert from one rank (a token naming it in every slot): 2^21 */
static void slots_past_2_20(ncclMkConfig* c) { c->moe_max_tokens = 1 << 18, c->moe_max_topk = 8; }
static void slots_at_2_20(ncclMkConfig* c) { c->moe_max_tokens = 1 << 17, c->moe_max_topk = 8; }
/* a config not filled by ncclMkConfigDefaults (version 0), or by a later library's header */
static void version_zero(ncclMkConfig* c) { c->version = 0; }
static void version_later(ncclMkConfig* c) { c->version = NCCL_MK_VERSION + 1; }

static void config_fields_are_checked(void) {
  void (*bad[])(ncclMkConfig*) = {fp8_two,     tokens_negative, recv_rows_negative, hidden_zero,
                                  hidden_not_8, topk_zero,      topk_17,            tokens_huge,
                                  slots_past_2_20, version_zero,    version_later};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) CHECK_EQ(init_with(bad[i]), ncclInvalidArgument);
  last_warn[0] = '\0';
  CHECK_EQ(init_with(slots_past_2_20), ncclInvalidArgument);
  CHECK(strstr(last_warn, "moe_max_tokens x moe_max_topk") != NULL);
  CHECK_EQ(init_with(slots_at_2_20), ncclSuccess);
}

/* The dense sizes: each below 2^31 (the GEMM's ints), and max_m x max(max_n, max_k) at most
 * 2^44, so the workspaces sized from them cannot wrap (2^32 x 2^31 x 2 bytes once wrapped to
 * 0 and gave a 128 KiB workspace to a fused path that takes 2^64). */
static ncclResult_t init_sized(size_t m, size_t n, size_t k) {
  ncclMkConfig cfg;
  ncclMkConfigDefaults(&cfg);
  cfg.max_m = m, cfg.max_n = n, cfg.max_k = k;
  return config_read(&cfg);
}

static void config_sizes_are_bounded(void) {
  CHECK_EQ(init_sized((size_t)1 << 32, (size_t)1 << 31, (size_t)1 << 31), ncclInvalidArgument);
  CHECK_EQ(init_sized((size_t)1 << 31, 8, 8), ncclInvalidArgument);
  CHECK_EQ(init_sized(8192, (size_t)1 << 31, 8192), ncclInvalidArgument);
  CHECK_EQ(init_sized(8192, 8192, (size_t)1 << 31), ncclInvalidArgument);
  CHECK_EQ(init_sized((size_t)1 << 23, (size_t)1 << 22, 8), ncclInvalidArgument); /* 2^45 elements */
  CHECK_EQ(init_sized(0, 8192, 8192), ncclInvalidArgument);
  CHECK_EQ(init_sized(8192, 12, 8192), ncclInvalidArgument);
  /* at the bound the sizes pass: the refusal is then the next rule's (a negative comm_sms; a
   * good config would reach the made-up communicator) */
  ncclMkConfig cfg;
  ncclMkConfigDefaults(&cfg);
  cfg.max_m = (size_t)1 << 22, cfg.max_n = (size_t)1 << 22, cfg.max_k = 8, cfg.comm_sms = -1;
  last_warn[0] = '\0';
  CHECK_EQ(config_read(&cfg), ncclInvalidArgument);
  CHECK(strstr(last_warn, "comm_sms") != NULL);
}

/* A config of another size (an older library's, smaller) is refused after reading its size
 * alone: here it ends where an unreadable page begins, so a copy of the whole struct faults. */
static void config_of_another_size_is_refused_before_it_is_read(void) {
  const long page = sysconf(_SC_PAGESIZE);
  char* two = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(two != MAP_FAILED);
  if (two == MAP_FAILED) return;
  CHECK_EQ(mprotect(two + page, (size_t)page, PROT_NONE), 0);
  const size_t old_size = 2 * sizeof(size_t);
  char* at = two + page - old_size; /* size, then one more field: then the unreadable page */
  memcpy(at, &old_size, sizeof old_size);
  memset(at + sizeof old_size, 0, sizeof(size_t));
  last_warn[0] = '\0';
  CHECK_EQ(config_read((const ncclMkConfig*)(void*)at), ncclInvalidArgument);
  CHECK(strstr(last_warn, "config.size") != NULL);
  munmap(two, 2 * (size_t)page);
}

static void layouts_refuse_bad_arguments(void) {
  ncclMkMoeLayout_t l = NULL;
  ncclMkMoeLayoutInfo info;
  CHECK_EQ(ncclMkMoeLayoutCreate(NULL, &l), ncclInvalidArgument);
  CHECK_EQ(ncclMkMoeLayoutCreate(fake_comm(), NULL), ncclInvalidArgument);
  CHECK_EQ(ncclMkMoeLayoutCreate(fake_comm(), &l), ncclInvalidUsage); /* no ncclMkCommInit */
  CHECK(l == NULL);
  CHECK_EQ(ncclMkMoeLayoutDestroy(NULL), ncclInvalidArgument);
  CHECK_EQ(ncclMkMoeLayoutGetInfo(NULL, &info), ncclInvalidArgument);
  /* a handle ncclMkMoeLayoutCreate never made (or destroyed already) is refused, not read or
   * freed: the made-up pointer would fault on either */
  last_warn[0] = '\0';
  CHECK_EQ(ncclMkMoeLayoutDestroy((ncclMkMoeLayout_t)fake_ptr(4)), ncclInvalidArgument);
  CHECK(strstr(last_warn, "live layouts") != NULL);
  CHECK_EQ(ncclMkMoeLayoutGetInfo((ncclMkMoeLayout_t)fake_ptr(4), &info), ncclInvalidArgument);
  CHECK_EQ(ncclMkMoeLayoutGetInfo((ncclMkMoeLayout_t)fake_ptr(4), NULL), ncclInvalidArgument);
}

static ncclResult_t dispatch_of(const void* x, const int* idx, const void* w1, void* act,
                                size_t tokens, size_t hidden, ncclComm_t comm) {
  return ncclMkMoeDispatchGemm(x, idx, w1, act, tokens, hidden, 64, 2, 8,
                               (ncclMkMoeLayout_t)fake_ptr(4), ncclBfloat16, comm, NULL);
}

static ncclResult_t combine_of(const void* act, const void* w2, const float* w, void* out,
                               size_t tokens, ncclComm_t comm) {
  return ncclMkMoeGemmCombine(act, w2, w, out, tokens, 128, 64, (ncclMkMoeLayout_t)fake_ptr(4),
                              ncclBfloat16, comm, NULL);
}

static ncclResult_t dispatch(const void* x, ncclComm_t comm) {
  return dispatch_of(x, fake_ptr(1), fake_ptr(2), fake_ptr(3), 16, 128, comm);
}

static ncclResult_t combine(const void* act, ncclComm_t comm) {
  return combine_of(act, fake_ptr(2), fake_ptr(3), fake_ptr(5), 16, comm);
}

static void ops_refuse_bad_arguments(void) {
  CHECK_EQ(dispatch(fake_ptr(0), NULL), ncclInvalidArgument);
  CHECK_EQ(dispatch(NULL, fake_comm()), ncclInvalidArgument);
  CHECK_EQ(dispatch((char*)fake_ptr(0) + 2, fake_comm()), ncclInvalidArgument); /* misaligned */
  CHECK_EQ(dispatch(fake_ptr(0), fake_comm()), ncclInvalidUsage);               /* no ncclMkCommInit */
  CHECK_EQ(combine(fake_ptr(0), NULL), ncclInvalidArgument);
  CHECK_EQ(combine(NULL, fake_comm()), ncclInvalidArgument);
  CHECK_EQ(combine(fake_ptr(0), fake_comm()), ncclInvalidUsage);
}

/* A rank with no tokens passes every argument check (ncclInvalidUsage: it reached the comm
 * lookup, and this comm has no ncclMkCommInit) with NULL token-side pointers; its expert-side
 * pointers and the shape rules are still checked. */
static void moe_ops_accept_zero_tokens(void) {
  void *w = fake_ptr(2), *act = fake_ptr(3);
  ncclComm_t comm = fake_comm();
  CHECK_EQ(dispatch_of(fake_ptr(0), fake_ptr(1), w, act, 0, 128, comm), ncclInvalidUsage);
  CHECK_EQ(dispatch_of(NULL, NULL, w, act, 0, 128, comm), ncclInvalidUsage);
  CHECK_EQ(dispatch_of(NULL, NULL, w, act, 16, 128, comm), ncclInvalidArgument); /* x, tokens 16 */
  CHECK_EQ(dispatch_of(NULL, NULL, NULL, act, 0, 128, comm), ncclInvalidArgument); /* w1 */
  CHECK_EQ(dispatch_of(NULL, NULL, w, NULL, 0, 128, comm), ncclInvalidArgument);   /* act */
  last_warn[0] = '\0';
  CHECK_EQ(dispatch_of(NULL, NULL, w, act, 0, 132, comm), ncclInvalidArgument);    /* hidden */
  CHECK(strstr(last_warn, "hidden=132") && strstr(last_warn, "tokens=0")); /* the op's own names, not M, N, K */
  CHECK_EQ(combine_of(act, w, fake_ptr(5), fake_ptr(6), 0, comm), ncclInvalidUsage);
  CHECK_EQ(combine_of(act, w, NULL, NULL, 0, comm), ncclInvalidUsage);
  CHECK_EQ(combine_of(act, w, NULL, NULL, 16, comm), ncclInvalidArgument); /* weights, tokens 16 */
  CHECK_EQ(combine_of(NULL, w, NULL, NULL, 0, comm), ncclInvalidArgument);   /* act */
  CHECK_EQ(combine_of(act, NULL, NULL, NULL, 0, comm), ncclInvalidArgument); /* w2 */
}

/* The dense ops still refuse M = 0, before the comm lookup; M = 8 reaches it (the control). */
static void dense_ops_refuse_zero_m(void) {
  void *a = fake_ptr(0), *b = fake_ptr(1), *c = fake_ptr(2);
  const ncclDataType_t bf = ncclBfloat16;
  ncclComm_t comm = fake_comm();
  CHECK_EQ(ncclMkAllGatherGemm(a, b, c, NULL, 0, 64, 64, bf, comm, NULL), ncclInvalidArgument);
  CHECK_EQ(ncclMkGemmReduceScatter(a, b, c, 0, 64, 64, bf, comm, NULL), ncclInvalidArgument);
  CHECK_EQ(ncclMkGemmAllReduce(a, b, c, 0, 64, 64, bf, comm, NULL), ncclInvalidArgument);
  CHECK_EQ(ncclMkAllGatherGemm(a, b, c, NULL, 8, 64, 64, bf, comm, NULL), ncclInvalidUsage);
  CHECK_EQ(ncclMkGemmReduceScatter(a, b, c, 8, 64, 64, bf, comm, NULL), ncclInvalidUsage);
  CHECK_EQ(ncclMkGemmAllReduce(a, b, c, 8, 64, 64, bf, comm, NULL), ncclInvalidUsage);
}

int main(void) {
  warn_capture_on();
  config_fields_are_checked();
  config_sizes_are_bounded();
  config_of_another_size_is_refused_before_it_is_read();
  layouts_refuse_bad_arguments();
  ops_refuse_bad_arguments();
  moe_ops_accept_zero_tokens();
  dense_ops_refuse_zero_m();
  return MK_TEST_RESULT();
}
