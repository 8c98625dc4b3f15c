/* Receives that send no clear-to-send (the ofi eager path, versions 7 and 8) over the real
 * transport: small receives whose messages come eager, a small receive whose message is late
 * and sends its clear-to-send after all, a send too large for a small receive, and the receive
 * after a large message announcing itself. meson runs these with one stream and with four.
 * The eager cases themselves (credits, crossing posts, closes) are in lb_eager.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb.h"
#include "mk_param.h"

/* Receives whose buffers all fit a bounce buffer send no clear-to-send (version 7): their
 * messages come eager whether the receive was posted first or the send. With
 * NCCL_MK_OFI_NO_CTS_MS=0 (meson runs the case that way too) every receive sends one, as
 * before, and a message whose receive is posted first goes through it. */
#define NOCTS_COUNT 24
/* A receive posted first waits for its send's pipe round trip; on a loaded machine that took
 * longer than the default 100 ms once (session 65: "1 late"). The receiving end reads it; left
 * at 0 when meson sets it so. */
static void nocts_patient(void) {
  if (mk_param_int(MK_PARAM_OFI_NO_CTS_MS) > 0) lb_set_param("NCCL_MK_OFI_NO_CTS_MS", "10000");
}
static size_t nocts_cap(int m) {
  const size_t caps[4] = {1, 100, 4096, lb_eager_bytes()};
  return caps[m % 4];
}
static int nocts_recv(struct lb_ctx* ctx) {
  lb_eager_on();
  nocts_patient();
  /* messages up to the eager size, none followed by a clear-to-send (see pieces_recv) */
  lb_set_param("NCCL_MK_OFI_ANNOUNCE_AFTER", "1048576");
  LB_OK(lb_accept(ctx));
  LB_OK(lb_warm(ctx));
  for (int m = 0; m < NOCTS_COUNT; m++) {
    if (m % 2) LB_EXPECT(lb_hear(ctx) == (uint64_t)m); /* the send went first */
    unsigned char* buf = lb_alloc(nocts_cap(m));
    void* d = buf;
    size_t cap = nocts_cap(m), got = 0;
    int tag = 6;
    struct mk_request* req;
    LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
    if (m % 2 == 0) lb_tell(ctx, (uint64_t)m); /* posted: now the send */
    LB_OK(lb_wait(ctx, req, &got));
    LB_EXPECT(got == nocts_cap(m));
    LB_EXPECT(lb_check(buf, got, ctx->seed, 300 + (uint64_t)m, "small receive") == 0);
    free(buf);
  }
  uint64_t late = 0, unannounced = mk_ofi_receives_unannounced(ctx->comm, &late);
  const int on = mk_param_int(MK_PARAM_OFI_NO_CTS_MS) > 0;
  printf("  receiver: %llu of %d receives without a clear-to-send (%llu late)\n",
         (unsigned long long)unannounced, NOCTS_COUNT + 1, (unsigned long long)late);
  /* those posted before their send, and the warm-up's; a send that went first may have
   * arrived before its receive (then it needs no clear-to-send either) or not */
  if (on)
    LB_EXPECT(unannounced >= NOCTS_COUNT / 2 + 1 && unannounced <= NOCTS_COUNT + 1);
  else
    LB_EXPECT(unannounced == 0);
  LB_EXPECT(late == 0);
  lb_tell(ctx, (uint64_t)on);
  return lb_close(ctx);
}
static int nocts_send(struct lb_ctx* ctx) {
  lb_eager_on();
  LB_OK(lb_connect(ctx));
  LB_OK(lb_warm(ctx));
  for (int m = 0; m < NOCTS_COUNT; m++) {
    if (m % 2 == 0) LB_EXPECT(lb_hear(ctx) == (uint64_t)m);
    unsigned char* b;
    struct mk_request* r;
    LB_OK(lb_send_start(ctx, nocts_cap(m), 300 + (uint64_t)m, 6, &b, &r));
    if (m % 2) lb_tell(ctx, (uint64_t)m);
    LB_OK(lb_wait(ctx, r, NULL));
    free(b);
  }
  const uint64_t on = lb_hear(ctx), eager = mk_ofi_messages_eager(ctx->comm);
  printf("  sender: %llu of %d messages eager\n", (unsigned long long)eager, NOCTS_COUNT + 1);
  if (on)
    LB_EXPECT(eager == NOCTS_COUNT + 1); /* no clear-to-send ever came */
  else
    LB_EXPECT(eager < NOCTS_COUNT + 1); /* those whose receive went first used it */
  return lb_close(ctx);
}

/* A small receive whose message does not come within NCCL_MK_OFI_NO_CTS_MS sends its
 * clear-to-send after all (its registered buffers then written): the messages sent after that
 * land whole, through it or eager if they crossed it. */
#define SLOW_COUNT 3
static int slow_recv(struct lb_ctx* ctx) {
  lb_eager_on();
  lb_set_param("NCCL_MK_OFI_NO_CTS_MS", "20");
  LB_OK(lb_accept(ctx));
  LB_OK(lb_warm(ctx));
  unsigned char* bufs[SLOW_COUNT];
  struct mk_mr* mrs[SLOW_COUNT];
  struct mk_request* reqs[SLOW_COUNT];
  int tag = 8, done = 0;
  uint64_t late0 = 0, late = 0; /* the warm-up's may have been late too (a first connection) */
  mk_ofi_receives_unannounced(ctx->comm, &late0);
  for (int m = 0; m < SLOW_COUNT; m++) {
    size_t cap = 4096;
    bufs[m] = lb_alloc(cap);
    void* d = bufs[m];
    LB_OK(ctx->ops->reg_mr(ctx->comm, bufs[m], cap, MK_PTR_HOST, &mrs[m]));
    LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, &mrs[m], &reqs[m]));
  }
  const double t0 = lb_now(); /* test() meanwhile: the late clear-to-sends go out from it */
  while (lb_now() - t0 < 0.1) {
    LB_OK(ctx->ops->test(reqs[0], &done, NULL));
    LB_EXPECT(!done);
  }
  mk_ofi_receives_unannounced(ctx->comm, &late);
  printf("  receiver: %llu of %d receives sent their clear-to-send late\n",
         (unsigned long long)(late - late0), SLOW_COUNT);
  LB_EXPECT(late - late0 == SLOW_COUNT);
  lb_tell(ctx, 1);
  for (int m = 0; m < SLOW_COUNT; m++) {
    size_t got = 0;
    LB_OK(lb_wait(ctx, reqs[m], &got));
    LB_EXPECT(got == 1000 + (size_t)m);
    LB_EXPECT(lb_check(bufs[m], got, ctx->seed, 400 + (uint64_t)m, "late receive") == 0);
    LB_OK(ctx->ops->dereg_mr(ctx->comm, mrs[m]));
    free(bufs[m]);
  }
  lb_tell(ctx, 2);
  return lb_close(ctx);
}
static int slow_send(struct lb_ctx* ctx) {
  lb_eager_on();
  LB_OK(lb_connect(ctx));
  LB_OK(lb_warm(ctx));
  LB_EXPECT(lb_hear(ctx) == 1);
  for (int m = 0; m < SLOW_COUNT; m++) {
    unsigned char* b = lb_alloc(1000 + (size_t)m);
    struct mk_mr* mr;
    struct mk_request* r;
    lb_fill(b, 1000 + (size_t)m, ctx->seed, 400 + (uint64_t)m);
    LB_OK(ctx->ops->reg_mr(ctx->comm, b, 1000 + (size_t)m, MK_PTR_HOST, &mr));
    LB_OK(lb_send(ctx, b, 1000 + (size_t)m, 8, mr, &r));
    LB_OK(lb_wait(ctx, r, NULL));
    LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
    free(b);
  }
  LB_EXPECT(lb_hear(ctx) == 2);
  return lb_close(ctx);
}

/* A send larger than the eager size into a small receive (which sends no clear-to-send, and
 * takes only eager messages): the sender waits, and gets -EMSGSIZE once the receive's late
 * clear-to-send shows the buffer, instead of waiting forever. */
static int oversized_recv(struct lb_ctx* ctx) {
  lb_eager_on();
  lb_set_param("NCCL_MK_OFI_NO_CTS_MS", "20");
  LB_OK(lb_accept(ctx));
  LB_OK(lb_warm(ctx));
  unsigned char buf[1024];
  void* d = buf;
  size_t cap = sizeof(buf);
  int tag = 9, done = 0;
  struct mk_request* req;
  LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
  lb_tell(ctx, 1);
  while (!lb_peer_spoke(ctx)) { /* test() meanwhile: the late clear-to-send goes out from it */
    LB_OK(ctx->ops->test(req, &done, NULL));
    LB_EXPECT(!done);
  }
  LB_EXPECT(lb_hear(ctx) == 2);
  return lb_close(ctx); /* with the receive still pending: its message never comes */
}
static int oversized_send(struct lb_ctx* ctx) {
  lb_eager_on();
  LB_OK(lb_connect(ctx));
  LB_OK(lb_warm(ctx));
  LB_EXPECT(lb_hear(ctx) == 1);
  const size_t len = 4 * lb_eager_bytes();
  unsigned char* b = lb_alloc(len);
  struct mk_request* r = NULL;
  const double t0 = lb_now();
  const int rc = lb_send_within(ctx, b, len, 9, NULL, 10.0, &r);
  printf("  %zu bytes into a 1024-byte receive: rc=%d (%s) after %.0f ms\n", len, rc, strerror(-rc),
         (lb_now() - t0) * 1e3);
  LB_EXPECT(r == NULL && rc == -EMSGSIZE);
  lb_tell(ctx, 2);
  free(b);
  return lb_close(ctx);
}

/* NCCL posts its 64 KiB LL slots for messages of any size: after a receive that took a message
 * above NCCL_MK_OFI_ANNOUNCE_AFTER (8 KiB here), the next receive announces itself (its message
 * is then written once into the buffer); after a small one, the next goes without a
 * clear-to-send again. Each receive is posted before its send starts, so which it does is not
 * left to timing. */
static const size_t pieces_lens[] = {8, 3 * 16384 - 100, 8, 8192, 8193, 64};
static const int pieces_announced[] = {0, 0, 1, 0, 0, 1}; /* by the message before */
#define PIECES_COUNT (int)(sizeof(pieces_lens) / sizeof(pieces_lens[0]))
static int pieces_recv(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_OFI_EAGER_BYTES", "65536");
  lb_set_param("NCCL_MK_OFI_ANNOUNCE_AFTER", "8192");
  LB_OK(lb_accept(ctx));
  LB_OK(lb_warm(ctx));
  for (int m = 0; m < PIECES_COUNT; m++) {
    uint64_t late = 0, before = mk_ofi_receives_unannounced(ctx->comm, &late);
    size_t cap = 65536, got = 0;
    unsigned char* buf = lb_alloc(cap);
    void* d = buf;
    int tag = 8;
    struct mk_request* req;
    LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
    const uint64_t after = mk_ofi_receives_unannounced(ctx->comm, &late);
    lb_tell(ctx, (uint64_t)m); /* posted: now the send */
    LB_OK(lb_wait(ctx, req, &got));
    LB_EXPECT(got == pieces_lens[m]);
    LB_EXPECT(lb_check(buf, got, ctx->seed, 600 + (uint64_t)m, "after pieces") == 0);
    free(buf);
    printf("  receive %d (message %zu B): %s\n", m, pieces_lens[m],
           after == before ? "announced" : "no clear-to-send");
    LB_EXPECT((after == before) == pieces_announced[m]);
  }
  return lb_close(ctx);
}
static int pieces_send(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_OFI_EAGER_BYTES", "65536");
  LB_OK(lb_connect(ctx));
  LB_OK(lb_warm(ctx));
  for (int m = 0; m < PIECES_COUNT; m++) {
    LB_EXPECT(lb_hear(ctx) == (uint64_t)m);
    LB_OK(lb_send_whole(ctx, pieces_lens[m], 600 + (uint64_t)m, 8));
  }
  return lb_close(ctx);
}

const struct lb_case lb_cases_unannounced[] = {
    {"small_receives_send_no_clear_to_send_and_their_messages_come_eager", nocts_recv, nocts_send,
     30, 0},
    {"a_small_receive_whose_message_is_late_sends_its_clear_to_send_after_all", slow_recv,
     slow_send, 30, 0},
    {"a_send_too_large_for_a_small_receive_fails_emsgsize_instead_of_waiting", oversized_recv,
     oversized_send, 30, 0},
    {"after_a_large_message_the_next_small_receive_sends_a_clear_to_send", pieces_recv, pieces_send,
     30, 0},
    {NULL, NULL, NULL, 0, 0},
};
