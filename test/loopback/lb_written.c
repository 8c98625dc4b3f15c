/* Messages written with RMA (ofi protocol versions 5, 6) over the real transport: every size
 * and stripe shape lands exact, cut evenly over the stripes; grouped receives mix written
 * and posted entries; both ends count the written messages and their pieces; writes off at
 * one end are off for both. meson runs these with one stream and with four. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb.h"
#include "mk_param.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

/* One receive each: buffer capacity and message length. Into 2 MiB with four streams the
 * stripes are 512 KiB: 100 bytes end in stripe 0, 1 MiB ends exactly on stripe 2's start (a
 * zero-length stripe), 0 bytes is a zero-length write. */
static const size_t caps[] = {4 * KiB, 64 * KiB + 3, 2 * MiB, 2 * MiB, 2 * MiB, 3 * MiB + 7, 1};
static const size_t lens[] = {1, 64 * KiB + 3, 100, 1 * MiB, 0, 3 * MiB + 7, 1};
#define NMSG (int)(sizeof(caps) / sizeof(caps[0]))
/* Then one grouped receive: entries 0 and 2 registered (written), 1 and 3 not (posted). */
#define NGROUP 4
static size_t group_len(int j) { return (size_t)(j + 1) * 200 * KiB + 13; }

/* Eager off at both ends (lb_eager.c has eager crossing written entries): with it on, a
 * small message may go eager before its receive's clear-to-send arrives (the receiver
 * expected a write, the sender made none), and receives that fit a bounce buffer expect no
 * write at all (protocol version 7), so the counts below would not be exact. */
static void eager_off(void) {
  lb_set_param("NCCL_MK_OFI_EAGER_BYTES", "0");
}
static int eager_on(void) {
  return mk_param_int(MK_PARAM_OFI_EAGER_BYTES) != 0;
}
static int writes_expected(void) {
  return mk_param_int(MK_PARAM_OFI_WRITES) && !eager_on();
}

static int recv_one(struct lb_ctx* ctx, size_t cap, size_t len, uint64_t stream) {
  unsigned char* buf = lb_alloc(cap + 1);
  memset(buf, 0xee, cap + 1);
  struct mk_mr* mr = NULL;
  struct mk_request* req;
  int tag = 7;
  void* d = buf;
  size_t got = 0;
  LB_OK(ctx->ops->reg_mr(ctx->comm, buf, cap, MK_PTR_HOST, &mr));
  LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, &mr, &req));
  LB_OK(lb_wait(ctx, req, &got));
  if (got != len) fprintf(stderr, "  message %llu: got %zu bytes, sent %zu\n", (unsigned long long)stream, got, len);
  LB_EXPECT(got == len);
  LB_EXPECT(lb_check(buf, len, ctx->seed, stream, "written payload") == 0);
  LB_EXPECT(len == cap || buf[len] == 0xee); /* nothing past the message */
  LB_EXPECT(buf[cap] == 0xee);
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(buf);
  return 0;
}

static int recv_group(struct lb_ctx* ctx) {
  void* data[NGROUP];
  size_t sizes[NGROUP], got[NGROUP];
  int tags[NGROUP];
  struct mk_mr* mrs[NGROUP] = {0};
  for (int j = 0; j < NGROUP; j++) {
    sizes[j] = group_len(j);
    tags[j] = 20 + j;
    data[j] = lb_alloc(sizes[j]);
    if (j % 2 == 0) LB_OK(ctx->ops->reg_mr(ctx->comm, data[j], sizes[j], MK_PTR_HOST, &mrs[j]));
  }
  struct mk_request* req;
  LB_OK(lb_recv(ctx, NGROUP, data, sizes, tags, mrs, &req));
  LB_OK(lb_wait(ctx, req, got));
  for (int j = 0; j < NGROUP; j++) {
    LB_EXPECT(got[j] == sizes[j]);
    LB_EXPECT(lb_check(data[j], sizes[j], ctx->seed, 100 + (uint64_t)j, "grouped payload") == 0);
    if (mrs[j]) LB_OK(ctx->ops->dereg_mr(ctx->comm, mrs[j]));
    free(data[j]);
  }
  return 0;
}

static int send_one(struct lb_ctx* ctx, size_t len, int tag, uint64_t stream) {
  unsigned char* buf = lb_alloc(len);
  lb_fill(buf, len, ctx->seed, stream);
  struct mk_mr* mr = NULL;
  struct mk_request* req;
  if (len) LB_OK(ctx->ops->reg_mr(ctx->comm, buf, len, MK_PTR_HOST, &mr));
  LB_OK(lb_send(ctx, buf, len, tag, mr, &req));
  LB_OK(lb_wait(ctx, req, NULL));
  if (mr) LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(buf);
  return 0;
}

/* The receiver reports how many of its entries it had written; both ends must count the
 * same number, every registered entry when writes are on, none when off. */
static int written_recv(struct lb_ctx* ctx) {
  eager_off();
  LB_OK(lb_accept(ctx));
  for (int m = 0; m < NMSG; m++) LB_OK(recv_one(ctx, caps[m], lens[m], (uint64_t)m));
  LB_OK(recv_group(ctx));
  const uint64_t n = mk_ofi_messages_written(ctx->comm);
  printf("  receiver: %llu of %d entries written\n", (unsigned long long)n, NMSG + NGROUP);
  if (eager_on())
    LB_EXPECT(n <= (mk_param_int(MK_PARAM_OFI_WRITES) ? (uint64_t)NMSG + NGROUP / 2 : 0));
  else
    LB_EXPECT(n == (writes_expected() ? (uint64_t)NMSG + NGROUP / 2 : 0));
  /* cut evenly over the stripes (version 6): with several streams the large messages land
   * in several pieces, with one each in one */
  const uint64_t pieces = mk_ofi_pieces_written(ctx->comm);
  const int64_t streams = mk_param_int(MK_PARAM_OFI_STREAMS);
  printf("  receiver: %llu pieces landed\n", (unsigned long long)pieces);
  if (streams == 1) LB_EXPECT(eager_on() ? pieces <= n : pieces == n);
  if (streams > 1 && n && !eager_on()) LB_EXPECT(pieces > n);
  lb_tell(ctx, n);
  lb_tell(ctx, pieces);
  return lb_close(ctx);
}

static int written_send(struct lb_ctx* ctx) {
  eager_off();
  LB_OK(lb_connect(ctx));
  for (int m = 0; m < NMSG; m++) LB_OK(send_one(ctx, lens[m], 7, (uint64_t)m));
  for (int j = NGROUP - 1; j >= 0; j--) LB_OK(send_one(ctx, group_len(j), 20 + j, 100 + (uint64_t)j));
  const uint64_t n = lb_hear(ctx), pieces = lb_hear(ctx);
  LB_EXPECT(eager_on() ? mk_ofi_messages_written(ctx->comm) <= n
                       : mk_ofi_messages_written(ctx->comm) == n);
  LB_EXPECT(mk_ofi_pieces_written(ctx->comm) == pieces);
  return lb_close(ctx);
}

/* NCCL_MK_OFI_WRITES=0 at the receiver only: the sender offered writes, and still none is
 * made (the receiver must then post every receive). */
static int off_recv(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_OFI_WRITES", "0");
  return written_recv(ctx);
}

static int off_send(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_OFI_WRITES", "1");
  eager_off();
  LB_EXPECT(writes_expected());
  return written_send(ctx);
}

const struct lb_case lb_cases_written[] = {
    {"written_messages_land_exact_and_both_ends_count_them", written_recv, written_send, 60, 0},
    {"writes_off_at_one_end_are_off_for_both", off_recv, off_send, 60, 0},
    {NULL, NULL, NULL, 0, 0},
};
