/*
 * The MoE API's refusals that need no GPU: bad ncclMkConfig MoE fields (ncclMkCommInit checks
 * the config before it touches the communicator), NULL and misaligned arguments, layouts of a
 * communicator that has no ncclMkCommInit. Every refusal is an ncclResult_t, never a crash;
 * the communicator handle is a made-up pointer that must never be dereferenced.
 */
#include <stdint.h>

#include "mk_test.h"
#include "nccl_mk.h"

static ncclComm_t fake_comm(void) { return (ncclComm_t)(uintptr_t)0x10000; }
static void* fake_ptr(uintptr_t i) { return (void*)(uintptr_t)(0x100000 + 0x1000 * i); }

static ncclResult_t init_with(void (*change)(ncclMkConfig*)) {
  ncclMkConfig cfg;
  ncclMkConfigDefaults(&cfg);
  cfg.moe_max_tokens = 64, cfg.moe_max_hidden = 128, cfg.moe_max_topk = 2;
  change(&cfg);
  return ncclMkCommInit(fake_comm(), &cfg);
}

static void fp8_two(ncclMkConfig* c) { c->moe_dispatch_fp8 = 2; }
static void tokens_negative(ncclMkConfig* c) { c->moe_max_tokens = -1; }
static void recv_rows_negative(ncclMkConfig* c) { c->moe_max_recv_rows = -1; }
static void hidden_zero(ncclMkConfig* c) { c->moe_max_hidden = 0; }
static void hidden_not_8(ncclMkConfig* c) { c->moe_max_hidden = 12; }
static void topk_zero(ncclMkConfig* c) { c->moe_max_topk = 0; }
static void topk_17(ncclMkConfig* c) { c->moe_max_topk = 17; }
static void tokens_huge(ncclMkConfig* c) { c->moe_max_tokens = (1 << 20) + 1; }

static void config_fields_are_checked(void) {
  void (*bad[])(ncclMkConfig*) = {fp8_two,     tokens_negative, recv_rows_negative, hidden_zero,
                                  hidden_not_8, topk_zero,      topk_17,            tokens_huge};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) CHECK_EQ(init_with(bad[i]), ncclInvalidArgument);
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
}

static ncclResult_t dispatch(const void* x, ncclComm_t comm) {
  return ncclMkMoeDispatchGemm(x, fake_ptr(1), fake_ptr(2), fake_ptr(3), 16, 128, 64, 2, 8,
                               (ncclMkMoeLayout_t)fake_ptr(4), ncclBfloat16, comm, NULL);
}

static ncclResult_t combine(const void* act, ncclComm_t comm) {
  return ncclMkMoeGemmCombine(act, fake_ptr(2), fake_ptr(3), fake_ptr(5), 16, 128, 64,
                              (ncclMkMoeLayout_t)fake_ptr(4), ncclBfloat16, comm, NULL);
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

int main(void) {
  config_fields_are_checked();
  layouts_refuse_bad_arguments();
  ops_refuse_bad_arguments();
  return MK_TEST_RESULT();
}
