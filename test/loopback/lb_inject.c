/* Injected sends (NCCL_MK_OFI_INJECT_BYTES): a send piece that fits the provider's inject
 * size is handed over with fi_tinject, which reports no completion, so the request is over
 * when isend returns. The case checks that, and that injected and ordinary messages still
 * arrive intact and in order. meson runs it with injection on (the default), off, and with
 * four streams. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb.h"
#include "mk_param.h"

/* Sizes either side of tcp;ofi_rxm's 64-byte inject size, mixed so that injected and
 * ordinary sends follow each other (all eager: below 64 KiB). */
#define INJECT_COUNT 12
static const size_t inject_lens[INJECT_COUNT] = {0, 1, 8, 64, 65, 24, 4096, 63, 16, 1000, 40, 2};

/* One message with both ends progressing first: tcp;ofi_rxm connects on the first send. */
static int warm(struct lb_ctx* ctx) {
  unsigned char b[8] = {0};
  void* d = b;
  size_t sz = sizeof(b);
  int tag = 0;
  struct mk_request* req;
  if (ctx->is_sender)
    LB_OK(lb_send(ctx, b, sz, tag, NULL, &req));
  else
    LB_OK(lb_recv(ctx, 1, &d, &sz, &tag, NULL, &req));
  return lb_wait(ctx, req, NULL);
}

static int inject_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  LB_OK(warm(ctx));
  LB_EXPECT(lb_hear(ctx) == 1); /* every send is over before any receive is posted */
  for (int m = 0; m < INJECT_COUNT; m++) {
    const size_t cap = 4096, len = inject_lens[m];
    unsigned char* buf = lb_alloc(cap + 1);
    memset(buf, 0xee, cap + 1);
    void* d = buf;
    size_t sz = cap, got = 0;
    int tag = 5;
    struct mk_request* req;
    LB_OK(lb_recv(ctx, 1, &d, &sz, &tag, NULL, &req));
    LB_OK(lb_wait(ctx, req, &got));
    LB_EXPECT(got == len);
    LB_EXPECT(lb_check(buf, len, ctx->seed, 900 + (uint64_t)m, "injected payload") == 0);
    LB_EXPECT(buf[len] == 0xee);
    free(buf);
  }
  lb_tell(ctx, 2);
  return lb_close(ctx);
}

/* A first test() of every injected send says done, with nothing posted at the other end. */
static int inject_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  LB_OK(warm(ctx));
  const size_t limit = (size_t)mk_param_int(MK_PARAM_OFI_INJECT_BYTES);
  const uint64_t before = mk_ofi_pieces_injected(ctx->comm);
  unsigned char* bufs[INJECT_COUNT];
  struct mk_request* reqs[INJECT_COUNT];
  uint64_t expected = 0;
  for (int m = 0; m < INJECT_COUNT; m++) {
    bufs[m] = lb_alloc(inject_lens[m]);
    lb_fill(bufs[m], inject_lens[m], ctx->seed, 900 + (uint64_t)m);
    LB_OK(lb_send(ctx, bufs[m], inject_lens[m], 5, NULL, &reqs[m]));
    const int small = limit > 0 && inject_lens[m] <= 64 && inject_lens[m] <= limit;
    expected += (uint64_t)small;
    int done = 0;
    LB_OK(ctx->ops->test(reqs[m], &done, NULL));
    if (small && !done)
      fprintf(stderr, "  message %d (%zu B): not done at once\n", m, inject_lens[m]);
    LB_EXPECT(done || !small);
    if (done) reqs[m] = NULL;
  }
  const uint64_t injected = mk_ofi_pieces_injected(ctx->comm) - before;
  printf("  %llu of %d sends injected (NCCL_MK_OFI_INJECT_BYTES=%zu)\n",
         (unsigned long long)injected, INJECT_COUNT, limit);
  fflush(stdout);
  LB_EXPECT(injected == expected);
  lb_tell(ctx, 1);
  for (int m = 0; m < INJECT_COUNT; m++)
    if (reqs[m]) LB_OK(lb_wait(ctx, reqs[m], NULL));
  for (int m = 0; m < INJECT_COUNT; m++) free(bufs[m]);
  LB_EXPECT(lb_hear(ctx) == 2);
  return lb_close(ctx);
}

const struct lb_case lb_cases_inject[] = {
    {"sends_within_the_inject_size_are_done_when_posted_and_arrive_in_order", inject_recv,
     inject_send, 30, 0},
    {NULL, NULL, NULL, 0, 0},
};
