/* Striping (NCCL_MK_OFI_STREAMS > 1): large receives are cut into per-stream stripes. These
 * cases also pass, unstriped, with one stream; meson runs the suite with 1 and 4. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb.h"
#include "mk_config.h"
#include "mk_param.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

/* Receives into a buffer of cap bytes (a canary past it), expecting len bytes of stream. */
static int recv_one(struct lb_ctx* ctx, size_t cap, size_t len, uint64_t stream) {
  unsigned char* buf = lb_alloc(cap + 1);
  memset(buf, 0xee, cap + 1);
  void* d = buf;
  int tag = 1;
  size_t got = 0;
  struct mk_request* req;
  LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
  LB_OK(lb_wait(ctx, req, &got));
  if (got != len) fprintf(stderr, "  %zu-byte buffer: got %zu bytes, sent %zu\n", cap, got, len);
  LB_EXPECT(got == len);
  LB_EXPECT(lb_check(buf, len, ctx->seed, stream, "striped payload") == 0);
  for (size_t i = len; i <= cap; i++) LB_EXPECT(buf[i] == 0xee); /* nothing past the send */
  free(buf);
  return 0;
}

static int send_one(struct lb_ctx* ctx, size_t len, uint64_t stream) {
  unsigned char* buf = lb_alloc(len);
  lb_fill(buf, len, ctx->seed, stream);
  struct mk_request* req;
  LB_OK(lb_send(ctx, buf, len, 1, NULL, &req));
  LB_OK(lb_wait(ctx, req, NULL));
  free(buf);
  return 0;
}

/* Buffers exactly as large as the message: stripe multiples and odd sizes around them. */
static const size_t exact[] = {256 * KiB + 1, 1 * MiB, 1 * MiB + 4095, 3 * MiB + 7,
                               16 * MiB - 1, 16 * MiB, 33 * MiB + 12345};
#define NEXACT (sizeof(exact) / sizeof(exact[0]))
static int exact_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  for (size_t k = 0; k < NEXACT; k++) LB_OK(recv_one(ctx, exact[k], exact[k], k));
  return lb_close(ctx);
}
static int exact_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  for (size_t k = 0; k < NEXACT; k++) LB_OK(send_one(ctx, exact[k], k));
  return lb_close(ctx);
}

/* A 4 MiB receive (4 stripes of 1 MiB with 4 streams) and sends that fill none, part of one,
 * exactly one, or several stripes: the reported size is the send's, to the byte. */
#define SHORT_CAP (4 * MiB)
static const size_t shorts[] = {0, 1, 4095, 1 * MiB - 1, 1 * MiB, 1 * MiB + 1, 2 * MiB + 5,
                                3 * MiB, 4 * MiB - 1, 4 * MiB};
#define NSHORT (sizeof(shorts) / sizeof(shorts[0]))
static int short_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  for (size_t k = 0; k < NSHORT; k++) LB_OK(recv_one(ctx, SHORT_CAP, shorts[k], 100 + k));
  return lb_close(ctx);
}
static int short_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  for (size_t k = 0; k < NSHORT; k++) LB_OK(send_one(ctx, shorts[k], 100 + k));
  return lb_close(ctx);
}

/* A grouped receive of 8 striped buffers of distinct sizes, sent in a scrambled tag order. */
static const int gtags[MK_MAX_RECVS] = {70, 11, 52, 3, 94, 25, 6, 87};
static const int gorder[MK_MAX_RECVS] = {5, 2, 7, 0, 3, 6, 1, 4};
static size_t glen(int j) { return (size_t)(j + 1) * 300 * KiB + 4097; }
static int group_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  for (int round = 0; round < 3; round++) {
    void* data[MK_MAX_RECVS];
    size_t sizes[MK_MAX_RECVS], got[MK_MAX_RECVS];
    for (int j = 0; j < MK_MAX_RECVS; j++) {
      sizes[j] = glen(j) + (round == 1 ? 999 : 0); /* round 1: every send is short */
      data[j] = lb_alloc(sizes[j]);
    }
    struct mk_request* req;
    LB_OK(lb_recv(ctx, MK_MAX_RECVS, data, sizes, gtags, NULL, &req));
    LB_OK(lb_wait(ctx, req, got));
    for (int j = 0; j < MK_MAX_RECVS; j++) {
      LB_EXPECT(got[j] == glen(j));
      LB_EXPECT(lb_check(data[j], got[j], ctx->seed, (uint64_t)(round * 1000 + gtags[j]),
                         "grouped striped buffer") == 0);
      free(data[j]);
    }
  }
  return lb_close(ctx);
}
static int group_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  for (int round = 0; round < 3; round++) {
    struct mk_request* reqs[MK_MAX_RECVS];
    void* bufs[MK_MAX_RECVS];
    for (int k = 0; k < MK_MAX_RECVS; k++) {
      int j = gorder[k];
      bufs[k] = lb_alloc(glen(j));
      lb_fill(bufs[k], glen(j), ctx->seed, (uint64_t)(round * 1000 + gtags[j]));
      LB_OK(lb_send(ctx, bufs[k], glen(j), gtags[j], NULL, &reqs[k]));
    }
    for (int k = 0; k < MK_MAX_RECVS; k++) {
      LB_OK(lb_wait(ctx, reqs[k], NULL));
      free(bufs[k]);
    }
  }
  return lb_close(ctx);
}

/* 300 messages from 0 B to 3 MiB (mostly striped), 8 in flight, into 3 MiB buffers: each
 * arrives in posting order, whole, with its own size. */
#define ORD_COUNT 300
#define ORD_WIN 8
#define ORD_CAP (3 * MiB)
static size_t ord_len(int m) { return m % 10 == 0 ? (size_t)m : 4 + (size_t)m * 10007 % ORD_CAP; }
static int order_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  unsigned char* bufs[ORD_WIN];
  struct mk_request* reqs[ORD_WIN];
  for (int w = 0; w < ORD_WIN; w++) bufs[w] = lb_alloc(ORD_CAP);
  int tag = 9;
  size_t cap = ORD_CAP;
  for (int m = 0; m < ORD_COUNT + ORD_WIN; m++) {
    int w = m % ORD_WIN;
    if (m >= ORD_WIN) {
      int old = m - ORD_WIN;
      size_t got = 0;
      uint32_t idx = 0;
      LB_OK(lb_wait(ctx, reqs[w], &got));
      LB_EXPECT(got == ord_len(old));
      if (got >= 4) memcpy(&idx, bufs[w], 4);
      LB_EXPECT(got < 4 || idx == (uint32_t)old);
      if (got > 4) LB_EXPECT(lb_check(bufs[w] + 4, got - 4, ctx->seed, (uint64_t)old, "msg") == 0);
    }
    void* d = bufs[w];
    if (m < ORD_COUNT) LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &reqs[w]));
  }
  for (int w = 0; w < ORD_WIN; w++) free(bufs[w]);
  return lb_close(ctx);
}
/* order_send up to the close. */
static int order_send_open(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  unsigned char* bufs[ORD_WIN];
  struct mk_request* reqs[ORD_WIN];
  for (int w = 0; w < ORD_WIN; w++) bufs[w] = lb_alloc(ORD_CAP);
  for (int m = 0; m < ORD_COUNT + ORD_WIN; m++) {
    int w = m % ORD_WIN;
    if (m >= ORD_WIN) LB_OK(lb_wait(ctx, reqs[w], NULL));
    if (m >= ORD_COUNT) continue;
    size_t len = ord_len(m);
    uint32_t idx = (uint32_t)m;
    if (len >= 4) memcpy(bufs[w], &idx, 4);
    if (len > 4) lb_fill(bufs[w] + 4, len - 4, ctx->seed, (uint64_t)m);
    LB_OK(lb_send(ctx, bufs[w], len, 9, NULL, &reqs[w]));
  }
  for (int w = 0; w < ORD_WIN; w++) free(bufs[w]);
  return 0;
}
static int order_send(struct lb_ctx* ctx) {
  LB_OK(order_send_open(ctx));
  return lb_close(ctx);
}

/* The same with the provider's queue shortened by meson (FI_OFI_RXM_TX_SIZE) and the device's
 * progress thread posting the sends: a send whose later stripe finds no room goes back on the
 * thread's list and is resumed from that stripe (the thread serves its other comms meanwhile);
 * the sender checks that this happened. */
static int order_send_resumed(struct lb_ctx* ctx) {
  LB_OK(order_send_open(ctx));
#if MK_HAVE_OFI
  const uint64_t resumed = mk_ofi_sends_resumed(ctx->comm);
  fprintf(stderr, "[sender] %llu sends resumed after a later stripe found no room\n", (unsigned long long)resumed);
  LB_EXPECT(resumed > 0);
#endif
  return lb_close(ctx);
}

/* Peers configured with different stream counts agree on the smaller one. */
static int mismatch_recv(struct lb_ctx* ctx) { return exact_recv(ctx); }
static int mismatch_send(struct lb_ctx* ctx) {
  int mine = lb_ofi_streams();
  lb_set_param("NCCL_MK_OFI_STREAMS", mine > 2 ? "2" : "3");
  return exact_send(ctx);
}

const struct lb_case lb_cases_striped[] = {
    {"striped_sizes_intact_at_and_off_stripe_multiples", exact_recv, exact_send, 60, 0},
    {"short_send_into_striped_buffer_reports_exact_size", short_recv, short_send, 60, 0},
    {"grouped_recv_with_striped_buffers", group_recv, group_send, 60, 0},
    {"ordering_300_striped_messages", order_recv, order_send, 90, 0},
    {"ordering_300_striped_messages_resuming_sends_the_provider_had_no_room_for", order_recv, order_send_resumed, 90,
     0},
    {"mismatched_stream_counts_use_the_smaller", mismatch_recv, mismatch_send, 60, 0},
    {NULL, NULL, NULL, 0, 0},
};
