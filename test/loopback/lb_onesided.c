/* One-sided: put lands every byte at the right offset; with put_signal, whenever the signal
 * is seen the data is already complete. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb.h"

#define REGION (16u << 20)
#define PUT_OFF 4096u
#define PUT_LEN (REGION - 2 * PUT_OFF)
#define ROUNDS 8


/* Target side: progress the comm until the region matches (plain put has no signal). */
static int put_target(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  unsigned char* region = lb_alloc(REGION);
  memset(region, 0xab, REGION);
  struct mk_mr* mr;
  struct mk_rkey k;
  LB_OK(ctx->ops->reg_mr(ctx->comm, region, REGION, MK_PTR_HOST, &mr));
  LB_OK(ctx->ops->mr_rkey(mr, &k));
  lb_tell_rkey(ctx, &k);
  /* Manual-progress providers land the data only while the target progresses. */
  double t0 = lb_now();
  while (!lb_check_quiet(region + PUT_OFF, PUT_LEN, ctx->seed, 7)) {
    LB_OK(ctx->ops->progress(ctx->comm));
    LB_EXPECT(lb_now() - t0 < 10);
  }
  LB_EXPECT(lb_check(region + PUT_OFF, PUT_LEN, ctx->seed, 7, "put data") == 0);
  for (unsigned i = 0; i < PUT_OFF; i++) /* nothing outside the target range */
    LB_EXPECT(region[i] == 0xab && region[REGION - 1 - i] == 0xab);
  lb_tell(ctx, 2);
  LB_EXPECT(lb_hear(ctx) == 1); /* the initiator saw its put complete */
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(region);
  return lb_close(ctx);
}

static int put_initiator(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  struct mk_rkey k = lb_hear_rkey(ctx);
  unsigned char* src = lb_alloc(PUT_LEN);
  lb_fill(src, PUT_LEN, ctx->seed, 7);
  struct mk_mr* mr;
  struct mk_request* req;
  LB_OK(ctx->ops->reg_mr(ctx->comm, src, PUT_LEN, MK_PTR_HOST, &mr));
  do LB_OK(ctx->ops->iput(ctx->comm, src, PUT_LEN, mr, &k, PUT_OFF, &req));
  while (!req); /* NULL: not now, retry */
  LB_OK(lb_wait(ctx, req, NULL));
  LB_EXPECT(lb_hear(ctx) == 2);
  lb_tell(ctx, 1);
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(src);
  return lb_close(ctx);
}

/* The target polls the signal (calling progress) and checks every byte the moment it
 * changes; rounds rewrite the data, so a signal overtaking its data would be caught. */
static int signal_target(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  unsigned char* region = lb_alloc(REGION);
  volatile uint64_t* sig = lb_alloc(4096);
  memset(region, 0, REGION);
  memset((void*)sig, 0, 4096);
  struct mk_mr *mr, *smr;
  struct mk_rkey k, sk;
  LB_OK(ctx->ops->reg_mr(ctx->comm, region, REGION, MK_PTR_HOST, &mr));
  /* a signal region: strict ordering where the transport would use relaxed ordering */
  int sig_type = MK_PTR_HOST | (strcmp(ctx->ops->name, "ib") == 0 ? MK_PTR_FORCE_SO : 0);
  LB_OK(ctx->ops->reg_mr(ctx->comm, (void*)sig, 4096, sig_type, &smr));
  LB_OK(ctx->ops->mr_rkey(mr, &k));
  LB_OK(ctx->ops->mr_rkey(smr, &sk));
  lb_tell_rkey(ctx, &k);
  lb_tell_rkey(ctx, &sk);
  for (uint64_t r = 1; r <= ROUNDS; r++) {
    while (sig[8] != r) {
      LB_OK(ctx->ops->progress(ctx->comm));
      LB_EXPECT(sig[8] <= r);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    LB_EXPECT(lb_check(region + PUT_OFF, PUT_LEN, ctx->seed, r, "data under signal") == 0);
    lb_tell(ctx, r); /* verified: the initiator may overwrite */
  }
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  LB_OK(ctx->ops->dereg_mr(ctx->comm, smr));
  free(region);
  free((void*)sig);
  return lb_close(ctx);
}

static int signal_initiator(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  struct mk_rkey k = lb_hear_rkey(ctx), sk = lb_hear_rkey(ctx);
  unsigned char* src = lb_alloc(PUT_LEN);
  struct mk_mr* mr;
  LB_OK(ctx->ops->reg_mr(ctx->comm, src, PUT_LEN, MK_PTR_HOST, &mr));
  for (uint64_t r = 1; r <= ROUNDS; r++) {
    struct mk_request* req;
    lb_fill(src, PUT_LEN, ctx->seed, r);
    do LB_OK(ctx->ops->iput_signal(ctx->comm, src, PUT_LEN, mr, &k, PUT_OFF, &sk, 64, r, &req));
    while (!req);
    LB_OK(lb_wait(ctx, req, NULL));
    LB_EXPECT(lb_hear(ctx) == r);
  }
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(src);
  return lb_close(ctx);
}

const struct lb_case lb_cases_onesided[] = {
    {"put_lands_every_byte", put_target, put_initiator, 30, 0},
    {"put_signal_never_before_data", signal_target, signal_initiator, 60, 0},
    {NULL, NULL, NULL, 0, 0},
};
