/* The sender's CQ read before an eager send (mk_ofi_isend_reads_cq): skipped while the
 * receiver announces none of its receives, taken again as soon as a clear-to-send shows up.
 * Phase 1: receives of 64 bytes (they fit a bounce buffer, so they announce nothing); phase 2:
 * receives of 128 KiB (above the eager size: every one announces itself). The receiver posts
 * each receive before it tells the sender to send, so in phase 2 every clear-to-send is out
 * before its message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb.h"

#define PHASE1 41 /* phase 2 starts on a message that is no probe (mk_ofi_isend_reads_cq) */
#define PHASE2 20
#define LEN 48

static int recv_one(struct lb_ctx* ctx, size_t cap, uint64_t stream) {
  unsigned char* buf = lb_alloc(cap);
  void* d = buf;
  size_t got = 0;
  int tag = 3;
  struct mk_request* req;
  LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
  lb_tell(ctx, stream); /* posted (and announced, if it does): now the send */
  LB_OK(lb_wait(ctx, req, &got));
  LB_EXPECT(got == LEN);
  LB_EXPECT(lb_check(buf, LEN, ctx->seed, stream, "payload") == 0);
  free(buf);
  return 0;
}

static int send_one(struct lb_ctx* ctx, uint64_t stream) {
  unsigned char buf[LEN];
  struct mk_request* req;
  LB_EXPECT(lb_hear(ctx) == stream);
  lb_fill(buf, LEN, ctx->seed, stream);
  LB_OK(lb_send(ctx, buf, LEN, 3, NULL, &req));
  return lb_wait(ctx, req, NULL);
}

static int reads_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  for (uint64_t m = 0; m < PHASE1; m++) LB_OK(recv_one(ctx, 64, m));
  for (uint64_t m = PHASE1; m < PHASE1 + PHASE2; m++) LB_OK(recv_one(ctx, 128 * 1024, m));
  LB_EXPECT(lb_hear(ctx) == 99);
  return lb_close(ctx);
}

static int reads_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  for (uint64_t m = 0; m < PHASE1; m++) LB_OK(send_one(ctx, m));
  const uint64_t skipped1 = mk_ofi_isend_reads_skipped(ctx->comm);
  const uint64_t announced1 = mk_ofi_messages_announced(ctx->comm);
  for (uint64_t m = PHASE1; m < PHASE1 + PHASE2; m++) LB_OK(send_one(ctx, m));
  const uint64_t skipped2 = mk_ofi_isend_reads_skipped(ctx->comm) - skipped1;
  const uint64_t announced2 = mk_ofi_messages_announced(ctx->comm) - announced1;
  printf("  unannounced receives: %llu of %d sends skipped the read; announced receives: %llu "
         "skipped, %llu of %d sent through their clear-to-send\n",
         (unsigned long long)skipped1, PHASE1, (unsigned long long)skipped2,
         (unsigned long long)announced2, PHASE2);
  fflush(stdout);
  /* phase 1: 8 reads to learn, then 7 in 8 skipped */
  LB_EXPECT(skipped1 >= (PHASE1 - 8) * 7 / 8 - 1);
  LB_EXPECT(announced1 <= 2); /* a message later than NCCL_MK_OFI_NO_CTS_MS may be */
  /* phase 2: at most the first send misses its clear-to-send; the rest read and find it */
  LB_EXPECT(skipped2 <= 1);
  LB_EXPECT(announced2 >= PHASE2 - 1);
  lb_tell(ctx, 99);
  return lb_close(ctx);
}

const struct lb_case lb_cases_eager_reads[] = {
    {"isend_skips_its_cq_read_while_no_receive_announces_and_reads_again_once_one_does",
     reads_recv, reads_send, 30, 0},
    {NULL, NULL, NULL, 0, 0},
};
