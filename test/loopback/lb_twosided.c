/* Two-sided messaging over the real transport: sizes, depth, grouping, order, integrity. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb.h"

#define MiB (1024ull * 1024)

/* One message of each size; the receiver checks the reported size and every byte. */
static int sizes_recv(struct lb_ctx* ctx, const size_t* sizes, int count) {
  LB_OK(lb_accept(ctx));
  for (int k = 0; k < count; k++) {
    size_t len = sizes[k], got = 0;
    unsigned char* buf = lb_alloc(len + 1);
    memset(buf, 0xee, len + 1);
    struct mk_mr* mr = NULL;
    struct mk_request* req;
    int tag = 1;
    void* data = buf;
    if (len) LB_OK(ctx->ops->reg_mr(ctx->comm, buf, len + 1, MK_PTR_HOST, &mr));
    LB_OK(lb_recv(ctx, 1, &data, &len, &tag, &mr, &req));
    LB_OK(lb_wait(ctx, req, &got));
    LB_EXPECT(got == len);
    LB_EXPECT(lb_check(buf, len, ctx->seed, len, "payload") == 0);
    LB_EXPECT(buf[len] == 0xee); /* nothing past the message */
    if (mr) LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
    free(buf);
    printf("  %zu bytes ok\n", len);
  }
  return lb_close(ctx);
}

static int sizes_send(struct lb_ctx* ctx, const size_t* sizes, int count) {
  LB_OK(lb_connect(ctx));
  for (int k = 0; k < count; k++) {
    size_t len = sizes[k];
    unsigned char* buf = lb_alloc(len);
    lb_fill(buf, len, ctx->seed, len);
    struct mk_mr* mr = NULL;
    struct mk_request* req;
    if (len) LB_OK(ctx->ops->reg_mr(ctx->comm, buf, len, MK_PTR_HOST, &mr));
    LB_OK(lb_send(ctx, buf, len, 1, mr, &req));
    LB_OK(lb_wait(ctx, req, NULL));
    if (mr) LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
    free(buf);
  }
  return lb_close(ctx);
}

static const size_t small_sizes[] = {0, 1, 4096, 1 * MiB, 64 * MiB};
static int sizes_small_recv(struct lb_ctx* ctx) { return sizes_recv(ctx, small_sizes, 5); }
static int sizes_small_send(struct lb_ctx* ctx) { return sizes_send(ctx, small_sizes, 5); }
static const size_t huge_sizes[] = {1024 * MiB};
static int sizes_huge_recv(struct lb_ctx* ctx) { return sizes_recv(ctx, huge_sizes, 1); }
static int sizes_huge_send(struct lb_ctx* ctx) { return sizes_send(ctx, huge_sizes, 1); }

/* 32 grouped receives of 8 buffers in flight, then 32x8 sends in flight, all checked. */
#define DEPTH_BYTES 8192
static int depth_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  unsigned char* buf = lb_alloc((size_t)MK_MAX_REQUESTS * MK_MAX_RECVS * DEPTH_BYTES);
  struct mk_request* reqs[MK_MAX_REQUESTS];
  for (int k = 0; k < MK_MAX_REQUESTS; k++) {
    void* data[MK_MAX_RECVS];
    size_t sizes[MK_MAX_RECVS];
    int tags[MK_MAX_RECVS];
    for (int j = 0; j < MK_MAX_RECVS; j++) {
      data[j] = buf + ((size_t)k * MK_MAX_RECVS + j) * DEPTH_BYTES;
      sizes[j] = DEPTH_BYTES;
      tags[j] = j;
    }
    /* NULL is also "not now" while the comm's thread holds its lock (a call goes back instead
     * of waiting for it, as NCCL expects): asked again, for up to 5 s, then 32 must fit */
    LB_OK(lb_recv_within(ctx, MK_MAX_RECVS, data, sizes, tags, NULL, 5.0, &reqs[k]));
    LB_EXPECT(reqs[k] != NULL); /* 32 must fit */
  }
  void* d = buf;
  size_t sz = 1;
  int tag = 0;
  struct mk_request* extra = (struct mk_request*)1;
  LB_OK(ctx->ops->irecv(ctx->comm, 1, &d, &sz, &tag, NULL, 0, &extra));
  LB_EXPECT(extra == NULL); /* the 33rd: "not now", not an error */
  lb_tell(ctx, 1);
  for (int k = 0; k < MK_MAX_REQUESTS; k++) {
    size_t got[MK_MAX_RECVS];
    LB_OK(lb_wait(ctx, reqs[k], got));
    for (int j = 0; j < MK_MAX_RECVS; j++) LB_EXPECT(got[j] == DEPTH_BYTES);
  }
  for (int m = 0; m < MK_MAX_REQUESTS * MK_MAX_RECVS; m++)
    LB_EXPECT(lb_check(buf + (size_t)m * DEPTH_BYTES, DEPTH_BYTES, ctx->seed, (uint64_t)m,
                       "depth message") == 0);
  free(buf);
  return lb_close(ctx);
}

static int depth_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  const int total = MK_MAX_REQUESTS * MK_MAX_RECVS;
  unsigned char* buf = lb_alloc((size_t)total * DEPTH_BYTES);
  struct mk_request** reqs = calloc((size_t)total, sizeof(*reqs));
  lb_hear(ctx); /* every receive is posted */
  for (int m = 0; m < total; m++) {
    lb_fill(buf + (size_t)m * DEPTH_BYTES, DEPTH_BYTES, ctx->seed, (uint64_t)m);
    LB_OK(lb_send(ctx, buf + (size_t)m * DEPTH_BYTES, DEPTH_BYTES, m % MK_MAX_RECVS, NULL,
                  &reqs[m]));
  }
  struct mk_request* extra = (struct mk_request*)1;
  /* larger than any eager size (ofi: NCCL_MK_OFI_EAGER_BYTES <= 1 MiB), so it needs the
   * clear-to-send of a receive that is not posted */
  LB_OK(ctx->ops->isend(ctx->comm, buf, 1 * MiB + 1, 0, NULL, &extra));
  LB_EXPECT(extra == NULL); /* no receive 33 posted: not now */
  for (int m = 0; m < total; m++) LB_OK(lb_wait(ctx, reqs[m], NULL));
  free(reqs);
  free(buf);
  return lb_close(ctx);
}

/* n=8 with distinct tags and sizes; the sender goes in a scrambled tag order, and each
 * message must land in the buffer of its tag, with its own size reported. */
static const int group_tags[MK_MAX_RECVS] = {70, 11, 52, 3, 94, 25, 6, 87};
static const int send_order[MK_MAX_RECVS] = {5, 2, 7, 0, 3, 6, 1, 4};
static size_t group_len(int j) { return (size_t)(j + 1) * 1000 + 7; }

static int group_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  for (int round = 0; round < 4; round++) {
    void* data[MK_MAX_RECVS];
    size_t sizes[MK_MAX_RECVS], got[MK_MAX_RECVS];
    for (int j = 0; j < MK_MAX_RECVS; j++) {
      sizes[j] = 16384;
      data[j] = lb_alloc(sizes[j]);
    }
    struct mk_request* req;
    LB_OK(lb_recv(ctx, MK_MAX_RECVS, data, sizes, group_tags, NULL, &req));
    LB_OK(lb_wait(ctx, req, got));
    for (int j = 0; j < MK_MAX_RECVS; j++) {
      LB_EXPECT(got[j] == group_len(j));
      LB_EXPECT(lb_check(data[j], got[j], ctx->seed, (uint64_t)(round * 1000 + group_tags[j]),
                         "grouped buffer") == 0);
      free(data[j]);
    }
  }
  return lb_close(ctx);
}

static int group_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  for (int round = 0; round < 4; round++) {
    struct mk_request* reqs[MK_MAX_RECVS];
    void* bufs[MK_MAX_RECVS];
    for (int k = 0; k < MK_MAX_RECVS; k++) {
      int j = send_order[k];
      bufs[k] = lb_alloc(group_len(j));
      lb_fill(bufs[k], group_len(j), ctx->seed, (uint64_t)(round * 1000 + group_tags[j]));
      LB_OK(lb_send(ctx, bufs[k], group_len(j), group_tags[j], NULL, &reqs[k]));
    }
    for (int k = 0; k < MK_MAX_RECVS; k++) {
      LB_OK(lb_wait(ctx, reqs[k], NULL));
      free(bufs[k]);
    }
  }
  return lb_close(ctx);
}

/* 3000 messages of varying sizes, a window of 8 in flight: they arrive in posting order. */
#define ORDER_COUNT 3000
#define ORDER_WINDOW 8
static size_t order_len(int m) { return 8 + (size_t)(m * 7919) % 5000; }

static int order_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  unsigned char* bufs[ORDER_WINDOW];
  struct mk_request* reqs[ORDER_WINDOW];
  for (int w = 0; w < ORDER_WINDOW; w++) bufs[w] = lb_alloc(8192);
  int tag = 9;
  size_t cap = 8192;
  for (int m = 0; m < ORDER_COUNT + ORDER_WINDOW; m++) {
    int w = m % ORDER_WINDOW;
    if (m >= ORDER_WINDOW) { /* the message posted a window ago */
      int old = m - ORDER_WINDOW;
      size_t got = 0;
      uint32_t idx;
      LB_OK(lb_wait(ctx, reqs[w], &got));
      memcpy(&idx, bufs[w], sizeof(idx));
      LB_EXPECT(idx == (uint32_t)old);
      LB_EXPECT(got == order_len(old));
      LB_EXPECT(lb_check(bufs[w] + 4, got - 4, ctx->seed, (uint64_t)old, "ordered msg") == 0);
    }
    if (m < ORDER_COUNT) {
      void* d = bufs[w];
      LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &reqs[w]));
    }
  }
  for (int w = 0; w < ORDER_WINDOW; w++) free(bufs[w]);
  return lb_close(ctx);
}

static int order_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  unsigned char* bufs[ORDER_WINDOW];
  struct mk_request* reqs[ORDER_WINDOW];
  for (int w = 0; w < ORDER_WINDOW; w++) bufs[w] = lb_alloc(8192);
  for (int m = 0; m < ORDER_COUNT + ORDER_WINDOW; m++) {
    int w = m % ORDER_WINDOW;
    if (m >= ORDER_WINDOW) LB_OK(lb_wait(ctx, reqs[w], NULL));
    if (m < ORDER_COUNT) {
      uint32_t idx = (uint32_t)m;
      memcpy(bufs[w], &idx, sizeof(idx));
      lb_fill(bufs[w] + 4, order_len(m) - 4, ctx->seed, (uint64_t)m);
      LB_OK(lb_send(ctx, bufs[w], order_len(m), 9, NULL, &reqs[w]));
    }
  }
  for (int w = 0; w < ORDER_WINDOW; w++) free(bufs[w]);
  return lb_close(ctx);
}

/* The integrity checker itself: a clean transfer passes, one flipped byte is reported. */
static int negative_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  size_t len = 4 * MiB, got = 0;
  unsigned char* buf = lb_alloc(len);
  void* d = buf;
  int tag = 0;
  struct mk_request* req;
  LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
  LB_OK(lb_wait(ctx, req, &got));
  LB_EXPECT(got == len);
  LB_EXPECT(lb_check(buf, len, ctx->seed, 42, "clean transfer") == 0);
  size_t at = (size_t)(ctx->seed % len);
  buf[at] ^= 0x01;
  fprintf(stderr, "negative control: flipped one bit at offset %zu; expect one report:\n", at);
  LB_EXPECT(lb_check(buf, len, ctx->seed, 42, "corrupted copy") == 1);
  LB_EXPECT(lb_check(buf, len, ctx->seed + 1, 42, "other seed") > len / 2);
  free(buf);
  return lb_close(ctx);
}

static int negative_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  size_t len = 4 * MiB;
  unsigned char* buf = lb_alloc(len);
  lb_fill(buf, len, ctx->seed, 42);
  struct mk_request* req;
  LB_OK(lb_send(ctx, buf, len, 0, NULL, &req));
  LB_OK(lb_wait(ctx, req, NULL));
  free(buf);
  return lb_close(ctx);
}

const struct lb_case lb_cases_twosided[] = {
    {"sizes_0B_to_64MiB_intact", sizes_small_recv, sizes_small_send, 60, 0},
    {"size_1GiB_intact", sizes_huge_recv, sizes_huge_send, 100, 0},
    {"depth_32_recvs_and_256_sends_in_flight", depth_recv, depth_send, 30, 0},
    {"grouped_recv_tags_pick_buffers", group_recv, group_send, 30, 0},
    {"ordering_3000_messages", order_recv, order_send, 60, 0},
    {"integrity_checker_catches_one_corrupt_byte", negative_recv, negative_send, 30, 0},
    {NULL, NULL, NULL, 0, 0},
};
