/*
 * The cross-node fused ops' protocols (fused/proxy/xnode.h) with a CPU stand-in for the
 * kernels, between two real processes over the proxy and the transport (issue 13's test "driven
 * by a CPU stand-in for the kernel"): AllGather+GEMM, GEMM+ReduceScatter with several producers,
 * GEMM+AllReduce's gather, each ending in the release's goodbye; the goodbye alone, answered
 * and not (a dead peer).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lb_px.h"
#include "xnode.h"

/* ---- the AllGather+GEMM cross-node protocol (fused/proxy/xnode.h) with a CPU stand-in ----
 * Each rank holds XBLOCKS row-blocks of XB bytes, at rows [rank x XBLOCKS, ...) of a bounce
 * buffer laid out as the gathered A. Per call e, as gemm_push_xnode.cuh does (its send and
 * receive roles here one after the other in one thread): the staging rows are free once every
 * earlier descriptor completed and the peer's done flag reached the previous call; stage the
 * rows (call e's bytes) and publish a put+signal per row-block; wait for each of the peer's
 * row-blocks (flag == e, never ahead) and check every byte under it (the copy-in); signal done.
 * Rank 1 sleeps 0-3 ms before each call, so calls overlap as back-to-back kernels do; a rank
 * that overwrote rows its peer had not copied in yet fails the byte check. Then the goodbye. */
#define XB (32u << 10)
#define XBLOCKS 4
#define XCALLS 200

/* Waits (bounded) until flag `word` of this rank's flag region reaches value. */
static int px_wait_word(struct px* x, uint64_t word, uint64_t value) {
  return mk_proxy_wait_flag(x->q, &x->flags[word], word * 8, value, WAIT_NS, x->rank, 0);
}

/* The same, and the flag is exactly value (never ahead of the protocol). */
static int px_expect_word(struct lb_ctx* ctx, struct px* x, uint64_t word, uint64_t value) {
  LB_OK(px_wait_word(x, word, value));
  LB_EXPECT(mk_pq_load_acquire(&x->flags[word]) == value);
  return 0;
}

static uint64_t xnode_stream(int rank, uint64_t e, int b) {
  return ((uint64_t)rank << 40) | (e << 8) | (uint64_t)b;
}

static int xnode_call(struct lb_ctx* ctx, struct px* x, uint64_t e, uint64_t last_call) {
  if (x->prod.tail) LB_OK(mk_proxy_wait_completed(&x->prod, x->prod.tail - 1, WAIT_NS));
  LB_OK(px_wait_word(x, MK_XN_DONE0 + (uint64_t)x->peer, last_call));
  for (int b = 0; b < XBLOCKS; b++) {
    const int mb = x->rank * XBLOCKS + b;
    lb_fill(x->data + (size_t)mb * XB, XB, ctx->seed, xnode_stream(x->rank, e, b));
    const struct mk_proxy_desc d = mk_xn_block_desc(x->peer, mb, XB, e, 1, (uint32_t)e);
    LB_OK(mk_proxy_publish(&x->prod, &d, WAIT_NS, NULL));
  }
  for (int b = 0; b < XBLOCKS; b++) {
    const int mb = x->peer * XBLOCKS + b;
    LB_OK(px_expect_word(ctx, x, MK_XN_ROW_FLAG0 + (uint64_t)mb, e));
    LB_EXPECT(lb_check(x->data + (size_t)mb * XB, XB, ctx->seed, xnode_stream(x->peer, e, b),
                       "a row-block under its flag") == 0);
  }
  const struct mk_proxy_desc done = mk_xn_done_desc(x->rank, x->peer, e, (uint32_t)e);
  LB_OK(mk_proxy_publish(&x->prod, &done, WAIT_NS, NULL));
  return 0;
}

int lb_xnode_allgather_rank(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, 64, 16, 2 * XBLOCKS * (size_t)XB, MK_XN_FLAG_WORDS));
  LB_OK(mk_proxy_start(x.p, x.keys));
  srand((unsigned)ctx->seed + (unsigned)x.rank);
  double t0 = lb_now();
  for (uint64_t e = 1; e <= XCALLS; e++) {
    if (x.rank == 1) usleep((useconds_t)(rand() % 3000));
    LB_OK(xnode_call(ctx, &x, e, e - 1));
  }
  printf("  [rank %d] %d calls in %.3f s, %" PRIu64 " bytes put\n", x.rank, XCALLS, lb_now() - t0,
         mk_proxy_sent_bytes(x.p, x.peer));
  const unsigned char remote[2] = {1, 1};
  LB_OK(mk_xn_goodbye(x.p, &x.prod, x.flags, x.rank, 2, remote, WAIT_NS)); /* the release's */
  LB_EXPECT(mk_proxy_sent_bytes(x.p, x.peer) ==
            (uint64_t)XCALLS * XBLOCKS * XB); /* all completed */
  LB_EXPECT(mk_proxy_quiesce(x.p) == 0);
  LB_EXPECT(mk_proxy_stop(x.p) == 0);
  px_free(&x);
  return 0;
}

/* ---- the GEMM+ReduceScatter cross-node protocol (xnode.h), CPU stand-in, several producers ----
 * Per call e, RS_PRODUCERS threads per rank (the GEMM's CTAs) take the peer's tiles from a
 * shared counter, write each into the out slot for the peer (call e's bytes) and count it in
 * its row-block's counter; the thread that completes a row-block publishes its put+signal on
 * the shared tail (mk_proxy_mp_publish). Before any tile of call e: every descriptor up to the
 * tail the previous call left has completed, and the peer's done flag reached e - 1. The owner
 * (the main thread) then waits for each row-block's flag (the tile count, never more) and
 * checks every byte in its in slot (the own-rows sum), with the all-reduce's gather puts its
 * reduced rows to the peer and collects the peer's (rs_gather_side), zeroes the flags, and
 * signals done. Rank 1 sleeps 0-3 ms per call. */
#define RS_BLOCKS 4
#define RS_TILES 4
#define RS_TILE (16u << 10)
#define RS_PRODUCERS 3
#define RS_CALLS 100
#define RS_ROW_BYTES ((uint64_t)RS_TILES * RS_TILE)

struct rs_call {
  struct lb_ctx* ctx;
  struct px* x;
  uint64_t e;
  uint64_t* tail;
  uint32_t next_tile;
  uint32_t counts[RS_BLOCKS];
  int rc;
};

static uint64_t rs_stream(int rank, uint64_t e, int mb, int t) {
  return ((uint64_t)rank << 48) | (e << 16) | ((uint64_t)mb << 8) | (uint64_t)t;
}

static void* rs_producer_main(void* arg) {
  struct rs_call* c = arg;
  for (uint32_t i; !c->rc && (i = __atomic_fetch_add(&c->next_tile, 1, __ATOMIC_RELAXED)) <
                                 RS_BLOCKS * RS_TILES;) {
    const int mb = (int)(i * 3 % RS_BLOCKS), t = (int)(i / RS_BLOCKS); /* row-blocks interleaved */
    unsigned char* out =
        c->x->data +
        mk_xn_rs_off(MK_XN_RS_OUT, c->x->peer, c->x->rank, 2, RS_BLOCKS, mb, RS_ROW_BYTES) +
        (size_t)t * RS_TILE;
    lb_fill(out, RS_TILE, c->ctx->seed, rs_stream(c->x->rank, c->e, mb, t));
    if (__atomic_add_fetch(&c->counts[mb], 1, __ATOMIC_ACQ_REL) < RS_TILES)
      continue; /* others' tiles seen */
    const struct mk_proxy_desc d =
        mk_xn_rs_block_desc(c->x->rank, c->x->peer, 2, RS_BLOCKS, mb, RS_ROW_BYTES, RS_TILES, 0, 0);
    const int rc = mk_proxy_mp_publish(c->x->q, c->tail, &d, WAIT_NS, c->x->rank, NULL);
    if (rc) c->rc = rc;
  }
  return NULL;
}

static int rs_owner_side(struct lb_ctx* ctx, struct px* x, uint64_t e) {
  for (int mb = 0; mb < RS_BLOCKS; mb++) {
    const uint64_t word = MK_XN_RS_FLAG0 + (uint64_t)x->peer * RS_BLOCKS + (uint64_t)mb;
    LB_OK(px_expect_word(ctx, x, word, RS_TILES));
    const unsigned char* in =
        x->data + mk_xn_rs_off(MK_XN_RS_IN, x->peer, x->rank, 2, RS_BLOCKS, mb, RS_ROW_BYTES);
    for (int t = 0; t < RS_TILES; t++)
      LB_EXPECT(lb_check(in + (size_t)t * RS_TILE, RS_TILE, ctx->seed, rs_stream(x->peer, e, mb, t),
                         "a partial row-block under its flag") == 0);
  }
  return 0;
}

/* The all-reduce's gather: this rank's reduced row-blocks (call e's bytes) from its gather slot
 * to the peer, then the peer's ones collected (flag == the tile count, every byte checked). */
static int rs_gather_side(struct lb_ctx* ctx, struct px* x, uint64_t e, uint64_t* tail) {
  for (int mb = 0; mb < RS_BLOCKS; mb++) {
    unsigned char* g =
        x->data + mk_xn_rs_off(MK_XN_RS_GATHER, x->peer, x->rank, 2, RS_BLOCKS, mb, RS_ROW_BYTES);
    lb_fill(g, RS_ROW_BYTES, ctx->seed, rs_stream(x->rank, e, mb, 99));
    const struct mk_proxy_desc d =
        mk_xn_rs_block_desc(x->rank, x->peer, 2, RS_BLOCKS, mb, RS_ROW_BYTES, RS_TILES, 1, 0);
    LB_OK(mk_proxy_mp_publish(x->q, tail, &d, WAIT_NS, x->rank, NULL));
  }
  for (int mb = 0; mb < RS_BLOCKS; mb++) {
    const uint64_t word = MK_XN_GATHER_FLAG0 + (uint64_t)x->peer * RS_BLOCKS + (uint64_t)mb;
    LB_OK(px_expect_word(ctx, x, word, RS_TILES));
    const unsigned char* in =
        x->data + mk_xn_rs_off(MK_XN_RS_GATHERED, x->peer, x->rank, 2, RS_BLOCKS, mb, RS_ROW_BYTES);
    LB_EXPECT(lb_check(in, RS_ROW_BYTES, ctx->seed, rs_stream(x->peer, e, mb, 99),
                       "reduced rows under their flag") == 0);
  }
  return 0;
}

static int rs_call_run(struct lb_ctx* ctx, struct px* x, uint64_t e, uint64_t* tail,
                       uint64_t* call_tail, int gather) {
  if (*call_tail) LB_OK(mk_proxy_wait_completed(&x->prod, *call_tail - 1, WAIT_NS));
  LB_OK(px_wait_word(x, MK_XN_DONE0 + (uint64_t)x->peer, e - 1));
  struct rs_call c = {.ctx = ctx, .x = x, .e = e, .tail = tail};
  pthread_t th[RS_PRODUCERS];
  for (int i = 0; i < RS_PRODUCERS; i++)
    LB_EXPECT(pthread_create(&th[i], NULL, rs_producer_main, &c) == 0);
  for (int i = 0; i < RS_PRODUCERS; i++) pthread_join(th[i], NULL);
  LB_OK(c.rc);
  LB_OK(rs_owner_side(ctx, x, e));
  if (gather) LB_OK(rs_gather_side(ctx, x, e, tail));
  for (int mb = 0; mb < RS_BLOCKS;
       mb++) { /* the flags back to 0 before done, as the sender CTA does */
    __atomic_store_n(&x->flags[MK_XN_RS_FLAG0 + (uint64_t)x->peer * RS_BLOCKS + (uint64_t)mb], 0,
                     __ATOMIC_RELEASE);
    __atomic_store_n(&x->flags[MK_XN_GATHER_FLAG0 + (uint64_t)x->peer * RS_BLOCKS + (uint64_t)mb],
                     0, __ATOMIC_RELEASE);
  }
  const struct mk_proxy_desc done = mk_xn_done_desc(x->rank, x->peer, e, 0);
  LB_OK(mk_proxy_mp_publish(x->q, tail, &done, WAIT_NS, x->rank, NULL));
  *call_tail = __atomic_load_n(tail, __ATOMIC_ACQUIRE);
  return 0;
}

static int rs_run(struct lb_ctx* ctx, int gather) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, 16, 16, mk_xn_rs_bytes(2, RS_BLOCKS, RS_ROW_BYTES, gather),
                 MK_XN_FLAG_WORDS));
  LB_OK(mk_proxy_start(x.p, x.keys));
  srand((unsigned)ctx->seed + (unsigned)x.rank);
  uint64_t tail = 0, call_tail = 0;
  double t0 = lb_now();
  for (uint64_t e = 1; e <= RS_CALLS; e++) {
    if (x.rank == 1) usleep((useconds_t)(rand() % 3000));
    LB_OK(rs_call_run(ctx, &x, e, &tail, &call_tail, gather));
  }
  printf("  [rank %d] %d calls in %.3f s, %d producers on one tail\n", x.rank, RS_CALLS,
         lb_now() - t0, RS_PRODUCERS);
  x.prod.tail = tail; /* the release's single producer from here on */
  const unsigned char remote[2] = {1, 1};
  LB_OK(mk_xn_goodbye(x.p, &x.prod, x.flags, x.rank, 2, remote, WAIT_NS));
  LB_EXPECT(mk_proxy_sent_bytes(x.p, x.peer) ==
            (uint64_t)RS_CALLS * RS_BLOCKS * RS_ROW_BYTES * (gather ? 2 : 1));
  LB_EXPECT(mk_proxy_quiesce(x.p) == 0);
  LB_EXPECT(mk_proxy_stop(x.p) == 0);
  px_free(&x);
  return 0;
}

int lb_xnode_reducescatter_rank(struct lb_ctx* ctx) {
  return rs_run(ctx, 0);
}
int lb_xnode_allreduce_rank(struct lb_ctx* ctx) {
  return rs_run(ctx, 1);
}

/* ---- the release's goodbye (mk_xn_goodbye), with no out-of-band agreement ----
 * Each rank puts a chunk, then says goodbye (its bye lands after the chunk) and checks the
 * peer's chunk once the peer's bye has come. Rank 0 then stops at once, closing its connections
 * while rank 1's thread still runs (rank 1 waits 200 ms more): neither may report an error. */
#define BYE_CHUNK (64u << 10)

int lb_xnode_goodbye_rank(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, 16, 8, 2 * (size_t)BYE_CHUNK, MK_XN_FLAG_WORDS));
  LB_OK(mk_proxy_start(x.p, x.keys));
  lb_fill(x.data, BYE_CHUNK, ctx->seed, (uint64_t)x.rank);
  const struct mk_proxy_desc put = {
      .op = MK_PROXY_PUT, .peer = x.peer, .dst_off = BYE_CHUNK, .size = BYE_CHUNK};
  LB_OK(mk_proxy_publish(&x.prod, &put, WAIT_NS, NULL));
  const unsigned char remote[2] = {1, 1};
  const double t0 = lb_now();
  LB_OK(mk_xn_goodbye(x.p, &x.prod, x.flags, x.rank, 2, remote, WAIT_NS));
  LB_EXPECT(lb_check(x.data + BYE_CHUNK, BYE_CHUNK, ctx->seed, (uint64_t)x.peer,
                     "the chunk before the bye") == 0);
  if (x.rank == 1) usleep(200000); /* rank 0 has closed by now; this thread still progresses */
  char msg[256] = "";
  const int err = mk_proxy_error(x.p, msg, sizeof(msg));
  printf("  [rank %d] goodbye after %.3f s; proxy error before the stop: %d %s\n", x.rank,
         lb_now() - t0, err, msg);
  LB_EXPECT(err == 0);
  LB_EXPECT(mk_proxy_quiesce(x.p) == 0);
  LB_EXPECT(mk_proxy_stop(x.p) == 0);
  px_free(&x);
  return 0;
}

/* ---- a goodbye the peer never answers ----
 * The child's process dies once its proxy runs (no goodbye): the parent's mk_xn_goodbye must
 * return an error within its bound (3 s, plus the detection), and the proxy stop and go. */
#define BYE_BOUND_NS (3 * SEC)

int lb_xnode_goodbye_survivor(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, 16, 8, 2 * (size_t)BYE_CHUNK, MK_XN_FLAG_WORDS));
  LB_OK(mk_proxy_start(x.p, x.keys));
  LB_EXPECT(lb_hear(ctx) == 1); /* its proxy ran */
  const unsigned char remote[2] = {1, 1};
  const double t0 = lb_now();
  const int rc = mk_xn_goodbye(x.p, &x.prod, x.flags, x.rank, 2, remote, BYE_BOUND_NS);
  const double took = lb_now() - t0;
  printf("  goodbye without the peer: %d (%s) after %.3f s\n", rc, strerror(-rc), took);
  LB_EXPECT(rc != 0);
  LB_EXPECT(took < 3.0 + 5.0);
  mk_proxy_quiesce(x.p);
  mk_proxy_stop(x.p); /* its error, if the death was seen, is the expected one */
  px_free(&x);
  return 0;
}

int lb_xnode_goodbye_victim(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, 16, 8, 2 * (size_t)BYE_CHUNK, MK_XN_FLAG_WORDS));
  LB_OK(mk_proxy_start(x.p, x.keys));
  lb_tell(ctx, 1);
  fflush(stdout);
  _exit(0); /* gone without a goodbye */
}
