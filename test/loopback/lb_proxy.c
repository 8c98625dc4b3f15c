/*
 * proxy_loopback CASE: the proxy (fused/proxy) between two real processes over the
 * transport (libfabric tcp;ofi_rxm on 127.0.0.1). Each process is a rank with the other
 * outside its local team; the main thread is the CPU stand-in for the kernel: it writes
 * data into its workspace, publishes descriptors and polls flags, and never calls the
 * transport itself (the proxy thread does, including the progress that lands the peer's
 * writes). Record exchanges, which NCCL's all-gather does in production, go over the pipes.
 * The cross-node fused ops' protocol cases are in lb_xnode.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lb_px.h"
#include "mk_err.h"
#include "xnode.h"

/* Shutdown in two steps, so that neither proxy sees the other's close as a death. */
static int px_stop(struct lb_ctx* ctx, struct px* x, int threads_running) {
  lb_tell(ctx, 100);
  LB_EXPECT(lb_hear(ctx) == 100);
  LB_OK(mk_proxy_quiesce(x->p));
  int tid = mk_proxy_tid(x->p); /* set by the thread's first statement: read after the join */
  lb_tell(ctx, 101);
  LB_EXPECT(lb_hear(ctx) == 101);
  LB_OK(mk_proxy_stop(x->p));
  x->p = NULL;
  const int gone = tid > 0 && thread_gone_within(tid, 1.0);
  int left = count_threads();
  printf("  [rank %d] threads: %d while the proxy ran, %d after mk_proxy_stop; proxy tid %d %s\n",
         ctx->is_sender, threads_running, left, tid, gone ? "gone" : "ALIVE after 1 s");
  LB_EXPECT(gone);
  LB_EXPECT(left <= threads_running - 1);
  return 0;
}

/* ---- put+signal stream: both ranks send and receive at once ---- */

#define CH (64u << 10)  /* largest chunk */
#define KSLOTS 32u      /* landing slots at the receiver; flags [0, K) data, [K, 2K) acks */
#define SSLOTS 32u      /* staging slots at the sender */
#define NCHUNKS 2000u
#define DEPTH 16u
#define INFLIGHT 8

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static size_t chunk_len(uint64_t seed, int rank, uint64_t i) {
  uint64_t h = mix64(seed ^ mix64(((uint64_t)rank << 32) | i));
  if (i % 10 == 9) return CH;
  return 1 + (size_t)(h % CH);
}

static uint64_t chunk_stream(int rank, uint64_t i) { return ((uint64_t)rank << 32) | i; }

/* Chunk j, three ways: put+signal; every 5th as a plain put then a (fenced) signal-only
 * descriptor, so the flag covers an earlier descriptor's data; every 7th put+signal with
 * the fence bit. */
static int send_chunk(struct lb_ctx* ctx, struct px* x, uint64_t j, uint64_t* stage_ticket,
                      uint64_t* bytes) {
  uint32_t k = (uint32_t)(j % KSLOTS), s = (uint32_t)(j % SSLOTS);
  size_t len = chunk_len(ctx->seed, x->rank, j);
  lb_fill(x->data + (size_t)s * CH, len, ctx->seed, chunk_stream(x->rank, j));
  struct mk_proxy_desc d = {.op = MK_PROXY_PUT_SIGNAL, .peer = x->peer,
                            .src_off = (uint64_t)s * CH,
                            .dst_off = (uint64_t)(SSLOTS + k) * CH, .size = len,
                            .flag_off = (uint64_t)k * 8, .flag_value = j / KSLOTS + 1,
                            .tag = (uint32_t)j};
  if (j % 7 == 3) d.op |= MK_PROXY_FENCE;
  uint64_t t;
  if (j % 5 == 1) {
    struct mk_proxy_desc put = d;
    put.op = MK_PROXY_PUT;
    LB_OK(mk_proxy_publish(&x->prod, &put, WAIT_NS, &t));
    d.op = MK_PROXY_SIGNAL;
    d.size = 0;
    LB_OK(mk_proxy_publish(&x->prod, &d, WAIT_NS, NULL));
  } else {
    LB_OK(mk_proxy_publish(&x->prod, &d, WAIT_NS, &t));
  }
  stage_ticket[s] = t + 1; /* the staging slot is free once completed > t */
  *bytes += len;
  return 0;
}

/* The per-peer cap on posted data (proxy_may_post): below INFLIGHT chunks of the largest size,
 * above any single chunk. */
#define STREAM_CAP (3u * CH / 2)

/* Chunk i from the peer: *got = 1 when its flag was up and every byte behind it checked (then
 * it is acknowledged), 0 when the flag is not up yet. Returns 0, or 1 on a failure. */
static int stream_recv_next(struct lb_ctx* ctx, struct px* x, uint64_t i, uint64_t* checked,
                            int* got) {
  uint32_t k = (uint32_t)(i % KSLOTS);
  uint64_t r = i / KSLOTS + 1;
  uint64_t v = mk_pq_load_acquire(&x->flags[k]);
  LB_EXPECT(v <= r); /* never ahead of what we acknowledged */
  *got = v == r;
  if (!*got) return 0;
  size_t len = chunk_len(ctx->seed, x->peer, i);
  if (lb_check(x->data + (size_t)(SSLOTS + k) * CH, len, ctx->seed, chunk_stream(x->peer, i),
               "data under its flag")) {
    fprintf(stderr, "  chunk %" PRIu64 " (slot %u, round %" PRIu64 ") seen before its data\n", i,
            k, r);
    return 1;
  }
  *checked += len;
  /* A signal-only descriptor's size field means nothing (the proxy posts no data for it): a
   * stale one must count toward neither the cap nor the peak checked below. */
  struct mk_proxy_desc ack = {.op = MK_PROXY_SIGNAL, .peer = x->peer,
                              .flag_off = (uint64_t)(KSLOTS + k) * 8, .flag_value = r,
                              .size = (uint64_t)STREAM_CAP << 20};
  LB_OK(mk_proxy_publish(&x->prod, &ack, WAIT_NS, NULL));
  return 0;
}

/* Chunk j to the peer once it has freed the landing slot and our staging slot is free:
 * *sent = 1 when sent, 0 not yet. Returns 0, or 1 on a failure. */
static int stream_send_next(struct lb_ctx* ctx, struct px* x, uint64_t j, uint64_t* stage_ticket,
                            uint64_t* sent_bytes, int* sent) {
  uint32_t k = (uint32_t)(j % KSLOTS), s = (uint32_t)(j % SSLOTS);
  uint64_t r = j / KSLOTS + 1;
  int acked = r == 1 || mk_pq_load_acquire(&x->flags[KSLOTS + k]) >= r - 1;
  int staged = mk_pq_load_acquire(&x->q->completed) >= stage_ticket[s];
  *sent = acked && staged;
  if (*sent) LB_OK(send_chunk(ctx, x, j, stage_ticket, sent_bytes));
  return 0;
}

/* After the stream: the proxy's counters against what was put, and the cap on posted data. */
static int stream_check_counters(struct lb_ctx* ctx, struct px* x, double dt,
                                 uint64_t sent_bytes, uint64_t checked_bytes) {
  uint64_t counted = mk_proxy_sent_bytes(x->p, x->peer), ops = mk_proxy_sent_ops(x->p, x->peer);
  uint64_t peak = mk_proxy_peak_posted_bytes(x->p, x->peer);
  printf("  [rank %d] %u chunks each way in %.2f s: put %" PRIu64 " bytes, proxy counted %"
         PRIu64 " bytes in %" PRIu64 " descriptors (%" PRIu64 " published, %" PRIu64
         " laps of the ring, %" PRIu64 " publishes waited for a slot); checked %" PRIu64
         " bytes received; at most %" PRIu64 " bytes posted at once (cap %u)\n", x->rank,
         NCHUNKS, dt, sent_bytes, counted, ops, x->prod.tail, x->prod.tail / DEPTH,
         x->prod.full_waits, checked_bytes, peak, STREAM_CAP);
  LB_EXPECT(counted == sent_bytes);
  LB_EXPECT(ops == x->prod.tail);
  LB_EXPECT(mk_proxy_sent_bytes(x->p, x->rank) == 0);
  LB_EXPECT(x->prod.tail / DEPTH > 100);
  LB_EXPECT(peak > 0 && peak <= STREAM_CAP);
  return 0;
}

static int stream_rank(struct lb_ctx* ctx) {
  struct px x = {.inflight_bytes = STREAM_CAP};
  LB_OK(px_setup(ctx, &x, DEPTH, INFLIGHT, (size_t)(SSLOTS + KSLOTS) * CH, 2 * KSLOTS));
  uint64_t stage_ticket[SSLOTS] = {0}, sent_bytes = 0, checked_bytes = 0, j = 0, i = 0;
  /* Before the proxy runs: fill the ring, then it must say "full". */
  while (x.prod.tail < DEPTH - 1) LB_OK(send_chunk(ctx, &x, j++, stage_ticket, &sent_bytes));
  struct mk_proxy_desc extra = {.op = MK_PROXY_SIGNAL, .peer = x.peer, .flag_off = 8 * KSLOTS};
  while (x.prod.tail < DEPTH) LB_OK(mk_proxy_try_publish(&x.prod, &extra, NULL)); /* ack 0: no-op */
  LB_EXPECT(mk_proxy_try_publish(&x.prod, &extra, NULL) == -EAGAIN);
  int threads_before = count_threads();
  LB_OK(mk_proxy_start(x.p, x.keys));
  int threads_running = count_threads();
  LB_EXPECT(threads_running == threads_before + 1);
  double t0 = lb_now();
  while (j < NCHUNKS || i < NCHUNKS) {
    int got = 0, sent = 0;
    if (i < NCHUNKS) LB_OK(stream_recv_next(ctx, &x, i, &checked_bytes, &got));
    if (j < NCHUNKS) LB_OK(stream_send_next(ctx, &x, j, stage_ticket, &sent_bytes, &sent));
    i += (uint64_t)got, j += (uint64_t)sent;
    char msg[256];
    if (mk_proxy_error(x.p, msg, sizeof(msg))) {
      fprintf(stderr, "  unexpected proxy error: %s\n", msg);
      return 1;
    }
    if (lb_now() - t0 > 90) {
      fprintf(stderr, "  stuck: sent %" PRIu64 ", received %" PRIu64 ", consumed %" PRIu64
              ", completed %" PRIu64 ", tail %" PRIu64 "\n", j, i, x.q->consumed,
              x.q->completed, x.prod.tail);
      return 1;
    }
    if (!got && !sent) sched_yield();
  }
  LB_OK(mk_proxy_wait_completed(&x.prod, x.prod.tail - 1, WAIT_NS));
  LB_OK(stream_check_counters(ctx, &x, lb_now() - t0, sent_bytes, checked_bytes));
  LB_OK(px_stop(ctx, &x, threads_running));
  px_free(&x);
  return 0;
}

/* ---- a peer killed mid-run ---- */

#define KILL_CHUNK (256u << 10)
#define KILL_BOUND_S 10.0

static int killed_survivor(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, DEPTH, INFLIGHT, 8 * (size_t)KILL_CHUNK, 64));
  LB_OK(mk_proxy_start(x.p, x.keys));
  int threads_running = count_threads();
  LB_EXPECT(lb_hear(ctx) == 1); /* the victim's proxy runs */
  lb_fill(x.data, 4 * (size_t)KILL_CHUNK, ctx->seed, 1);
  uint64_t n = 0;
  int rc = 0;
  double t_kill = 0;
  for (;;) {
    struct mk_proxy_desc d = {.op = MK_PROXY_PUT_SIGNAL, .peer = x.peer,
                              .src_off = (n % 4) * KILL_CHUNK, .dst_off = (4 + n % 4) * KILL_CHUNK,
                              .size = KILL_CHUNK, .flag_off = (n % 8) * 8, .flag_value = n + 1,
                              .tag = 0x13};
    rc = mk_proxy_publish(&x.prod, &d, WAIT_NS, NULL);
    if (rc) break;
    n++;
    if (!t_kill && mk_proxy_sent_ops(x.p, x.peer) >= 20) { /* traffic flows: kill it now */
      kill(ctx->child, SIGKILL);
      t_kill = lb_now();
    }
    LB_EXPECT(!t_kill || lb_now() - t_kill < 60);
  }
  double dt = lb_now() - t_kill;
  char msg[256];
  int err = mk_proxy_error(x.p, msg, sizeof(msg));
  printf("  producer's publish gave rc=%d (%s) %.3f s after the kill; proxy: %s\n", rc,
         strerror(-rc), dt, err ? msg : "(no error)");
  LB_EXPECT(t_kill > 0);
  LB_EXPECT(rc == -ECONNRESET && err == -ECONNRESET);
  LB_EXPECT(dt < KILL_BOUND_S);
  const struct mk_proxy_error* e = &x.q->proxy_err;
  LB_EXPECT(e->aborted == 1 && e->kind == MK_PROXY_ERR_TRANSPORT && e->rank == 0 && e->peer == 1);
  LB_EXPECT(e->seq == ~0ull || (e->seq < x.prod.tail && e->tag == 0x13 && e->op == MK_PROXY_PUT_SIGNAL));
  LB_EXPECT(strstr(msg, "rank 0") && strstr(msg, "peer 1"));
  /* any other wait of the producer also ends at once */
  double t1 = lb_now();
  LB_EXPECT(mk_proxy_wait_flag(x.q, &x.flags[0], 0, 1, WAIT_NS, 0, 0) == -ECONNRESET);
  LB_EXPECT(mk_proxy_wait_completed(&x.prod, x.prod.tail - 1, WAIT_NS) == -ECONNRESET);
  LB_EXPECT(lb_now() - t1 < 1.0);
  int tid = mk_proxy_tid(x.p);
  LB_EXPECT(mk_proxy_stop(x.p) == -ECONNRESET); /* joins, reports what ended it */
  const int gone = thread_gone_within(tid, 1.0);
  int left = count_threads();
  printf("  threads: %d while the proxy ran, %d after mk_proxy_stop\n", threads_running, left);
  LB_EXPECT(gone && left <= threads_running - 1);
  px_free(&x);
  return 0;
}

static int killed_victim(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, DEPTH, INFLIGHT, 8 * (size_t)KILL_CHUNK, 64));
  LB_OK(mk_proxy_start(x.p, x.keys));
  lb_tell(ctx, 1);
  for (;;) pause(); /* its proxy lands the survivor's writes until the kill */
}

/* ---- stop with work in flight: drained, joined, nothing left ----
 * The parent publishes 48 puts of 1 MiB and stops at once: mk_proxy_stop waits for what is
 * in flight (the peer's proxy keeps progressing meanwhile: with manual progress a put
 * completes only while its target progresses), joins and leaves no thread. */

static int stop_initiator(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, 64, 16, 16u << 20, 64));
  int before = count_threads();
  LB_OK(mk_proxy_start(x.p, x.keys));
  int running = count_threads();
  LB_EXPECT(running == before + 1);
  lb_fill(x.data, 8u << 20, ctx->seed, 1);
  for (int n = 0; n < 48; n++) {
    struct mk_proxy_desc d = {.op = MK_PROXY_PUT, .peer = x.peer, .src_off = (n % 8) * (1u << 20),
                              .dst_off = (8 + n % 8) * (1u << 20), .size = 1u << 20};
    LB_OK(mk_proxy_publish(&x.prod, &d, WAIT_NS, NULL));
  }
  /* the thread has taken a full window (16 in flight), but not everything has completed */
  while (__atomic_load_n(&x.q->consumed, __ATOMIC_ACQUIRE) < 16) sched_yield();
  uint64_t done_at_stop = __atomic_load_n(&x.q->completed, __ATOMIC_ACQUIRE);
  double t0 = lb_now();
  LB_OK(mk_proxy_quiesce(x.p));
  int tid = mk_proxy_tid(x.p);
  uint64_t done = __atomic_load_n(&x.q->completed, __ATOMIC_ACQUIRE);
  printf("  stop with %" PRIu64 " published, %" PRIu64 " completed: joined after %.3f s with "
         "%" PRIu64 " completed (%" PRIu64 " bytes counted)\n", x.prod.tail, done_at_stop,
         lb_now() - t0, done, mk_proxy_sent_bytes(x.p, x.peer));
  /* every descriptor the thread had taken completed; the rest were never read */
  LB_EXPECT(done == x.q->consumed && done >= 16);
  if (done_at_stop >= x.prod.tail) printf("  (all had completed before the stop this time)\n");
  LB_EXPECT(mk_proxy_sent_bytes(x.p, x.peer) == done * (1u << 20));
  LB_EXPECT(tid > 0 && thread_gone_within(tid, 1.0));
  LB_EXPECT(count_threads() == running - 1);
  lb_tell(ctx, 1); /* the peer may stop now */
  LB_EXPECT(lb_hear(ctx) == 2);
  LB_OK(mk_proxy_stop(x.p));
  printf("  threads: %d before start, %d while the proxy ran, %d after mk_proxy_stop\n", before,
         running, count_threads());
  LB_EXPECT(count_threads() <= before);
  px_free(&x);
  return 0;
}

static int stop_target(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, 64, 16, 16u << 20, 64));
  LB_OK(mk_proxy_start(x.p, x.keys));
  LB_EXPECT(lb_hear(ctx) == 1);
  LB_OK(mk_proxy_quiesce(x.p));
  lb_tell(ctx, 2);
  LB_OK(mk_proxy_stop(x.p));
  px_free(&x);
  return 0;
}

/* ---- bench_proxy_bw: the proxy as the cross-node fused ops drive it ----
 * Both ranks at once: each puts LB_BENCH_ITERS blocks of LB_BENCH_SIZE (default 2 MiB, the
 * ops' block) with a signal into LB_BENCH_SLOTS landing slots of its peer, at different
 * offsets as row-blocks land, and acknowledges each block it receives (a 0-byte put+signal,
 * unfenced as the ops' flags are; LB_BENCH_ACK=signal: a fenced SIGNAL); a slot is reused
 * once its peer has seen it. One untimed round of every slot first. The transport's own benchmarks
 * (loopback bench_bw, bench_put_bw) drive one direction from the calling thread; this one goes
 * through the proxy's queue and thread, with traffic both ways, which is what NCCL_MK_PROXY_STREAMS
 * and the proxy's settings should be tuned against (session 45: the one-direction put benchmark
 * ranked stream counts opposite to the ops). Prints MiB/s each way and each block's latency from
 * its publish to its flag at the peer. */
#define PB_DEPTH 64u

struct pb {
  size_t len;
  uint32_t slots;
  uint64_t iters;
  int ack_fenced; /* LB_BENCH_ACK=signal */
};

/* Block j to the peer once its landing slot is free (*sent = 1), else *sent = 0. */
static int pb_send_next(struct px* x, const struct pb* b, uint64_t j, int* sent) {
  const uint32_t k = (uint32_t)(j % b->slots);
  const uint64_t r = j / b->slots + 1;
  *sent = r == 1 || mk_pq_load_acquire(&x->flags[b->slots + k]) >= r - 1;
  if (!*sent) return 0;
  const struct mk_proxy_desc d = {.op = MK_PROXY_PUT_SIGNAL,
                                  .peer = x->peer,
                                  .src_off = 0,
                                  .dst_off = (uint64_t)(1 + k) * b->len,
                                  .size = b->len,
                                  .flag_off = (uint64_t)k * 8,
                                  .flag_value = mk_pq_now_ns(), /* the receiver times the block */
                                  .tag = (uint32_t)j};
  return mk_proxy_publish(&x->prod, &d, WAIT_NS, NULL);
}

/* The receiving side's record: the last flag value of each slot (a block's publish time on
 * the host's monotonic clock, which both processes share, so a newer one is the next round),
 * and each block's latency from its publish to its flag seen here. */
struct pb_rx {
  uint64_t* seen;
  double* lat_us;
};

/* Block i from the peer: once its flag is up (*got = 1), its acknowledgement: a 0-byte
 * PUT_SIGNAL (unfenced, as the ops' per-block flags are), or with LB_BENCH_ACK=signal a
 * SIGNAL (always fenced: it waits for every earlier put of ours to that peer, and the puts
 * after it wait for it to be posted, so each ack drains our direction's pipeline: 25% less
 * each way on the GPU host, session 47). */
static int pb_recv_next(struct px* x, const struct pb* b, struct pb_rx* rx, uint64_t i, int* got) {
  const uint32_t k = (uint32_t)(i % b->slots);
  const uint64_t r = i / b->slots + 1, published = mk_pq_load_acquire(&x->flags[k]);
  *got = published > rx->seen[k];
  if (!*got) return 0;
  rx->seen[k] = published;
  rx->lat_us[i] = (double)(mk_pq_now_ns() - published) / 1e3;
  const struct mk_proxy_desc ack = {.op = b->ack_fenced ? MK_PROXY_SIGNAL : MK_PROXY_PUT_SIGNAL,
                                    .peer = x->peer,
                                    .flag_off = (uint64_t)(b->slots + k) * 8,
                                    .flag_value = r};
  return mk_proxy_publish(&x->prod, &ack, WAIT_NS, NULL);
}

/* 1 once the peer acknowledged our block `last`. */
static int pb_acked(struct px* x, const struct pb* b, uint64_t last) {
  return mk_pq_load_acquire(&x->flags[b->slots + last % b->slots]) >= last / b->slots + 1;
}

/* A block's publish-to-flag latency, us: the first timed block's (sent as the pipeline
 * starts), the median, p90 and the largest (a block posted behind a full cap waits for the
 * blocks before it). */
static void pb_print_latency(const struct pb* b, double* lat_us) {
  const double first = lat_us[0];
  qsort(lat_us, b->iters, sizeof(double), lb_cmp_double);
  printf("BENCH mk_proxy_lat_us first %.0f median %.0f p90 %.0f max %.0f\n", first,
         lat_us[b->iters / 2], lat_us[b->iters * 9 / 10], lat_us[b->iters - 1]);
}

/* Blocks [from, to) both ways, until the peer acknowledged our last one: 0, or 1 on a proxy
 * error or after 120 s. */
static int pb_run(struct lb_ctx* ctx, struct px* x, const struct pb* b, struct pb_rx* rx,
                  uint64_t from, uint64_t to) {
  const double t0 = lb_now();
  uint64_t i = from, j = from;
  while (i < to || j < to || !pb_acked(x, b, to - 1)) {
    int got = 0, sent = 0;
    if (i < to) LB_OK(pb_recv_next(x, b, rx, i, &got));
    if (j < to) LB_OK(pb_send_next(x, b, j, &sent));
    i += (uint64_t)got, j += (uint64_t)sent;
    char msg[256];
    if (mk_proxy_error(x->p, msg, sizeof(msg))) {
      fprintf(stderr, "  unexpected proxy error: %s\n", msg);
      return 1;
    }
    LB_EXPECT(lb_now() - t0 < 120);
    if (!got && !sent) sched_yield();
  }
  return 0;
}

static int proxy_bench_rank(struct lb_ctx* ctx) {
  const struct pb b = {lb_env_size("LB_BENCH_SIZE", 2u << 20),
                       (uint32_t)lb_env_size("LB_BENCH_SLOTS", 8),
                       lb_env_size("LB_BENCH_ITERS", 200),
                       lb_env("LB_BENCH_ACK") && strcmp(lb_env("LB_BENCH_ACK"), "signal") == 0};
  LB_EXPECT(b.len > 0 && b.slots > 0 && b.iters > 0);
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, PB_DEPTH, 16, (1 + (size_t)b.slots) * b.len, 2 * (size_t)b.slots));
  lb_fill(x.data, b.len, ctx->seed, (uint64_t)x.rank);
  LB_OK(mk_proxy_start(x.p, x.keys));
  const int threads_running = count_threads();
  /* one untimed round of every slot first: the streams' connections form on their first
   * write (tens of ms on a busy host), which is not the rate */
  const uint64_t warm = b.slots, total = warm + b.iters;
  struct pb_rx rx = {calloc(b.slots, sizeof(uint64_t)), calloc(total, sizeof(double))};
  LB_EXPECT(rx.seen && rx.lat_us);
  lb_tell(ctx, 7); /* both proxies run: start together */
  LB_EXPECT(lb_hear(ctx) == 7);
  LB_OK(pb_run(ctx, &x, &b, &rx, 0, warm));
  printf("BENCH mk_proxy_lat_us warm-up first %.0f\n", rx.lat_us[0]);
  lb_tell(ctx, 8); /* both sides' warm-up blocks landed and were acknowledged */
  LB_EXPECT(lb_hear(ctx) == 8);
  const double t0 = lb_now();
  LB_OK(pb_run(ctx, &x, &b, &rx, warm, total));
  const double dt = lb_now() - t0;
  LB_OK(mk_proxy_wait_completed(&x.prod, x.prod.tail - 1, WAIT_NS));
  LB_EXPECT(lb_check(x.data + b.len * (1 + (total - 1) % b.slots), b.len, ctx->seed,
                     (uint64_t)x.peer, "the last block received") == 0);
  LB_EXPECT(mk_proxy_sent_bytes(x.p, x.peer) == total * b.len);
  printf("BENCH mk_proxy_bw %zu %.1f\n", b.len, (double)b.len * (double)b.iters / dt / 1048576.0);
  pb_print_latency(&b, rx.lat_us + warm);
  fflush(stdout);
  free(rx.seen);
  free(rx.lat_us);
  LB_OK(px_stop(ctx, &x, threads_running));
  px_free(&x);
  return 0;
}

/* ---- a corrupt key record: refused before any thread runs ---- */

/* The peer's key record damaged after the exchange (the rank it names, then its magic):
 * mk_proxy_arm and mk_proxy_start refuse it with -EBADMSG and create no thread; the intact
 * records are then taken and the thread runs. */
static int corrupt_keys_rank(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(px_setup(ctx, &x, DEPTH, INFLIGHT, 4096, 8));
  const int threads_before = count_threads();
  struct mk_proxy_keys bad[2];
  memcpy(bad, x.keys, sizeof bad);
  bad[x.peer].rank = x.rank;
  LB_EXPECT(mk_proxy_arm(x.p, bad) == -EBADMSG);
  bad[x.peer].rank = x.peer, bad[x.peer].magic ^= 1;
  LB_EXPECT(mk_proxy_arm(x.p, bad) == -EBADMSG);
  LB_EXPECT(mk_proxy_start(x.p, bad) == -EBADMSG);
  LB_EXPECT(count_threads() == threads_before);
  LB_OK(mk_proxy_start(x.p, x.keys));
  LB_EXPECT(count_threads() == threads_before + 1);
  LB_EXPECT(mk_proxy_arm(x.p, x.keys) == -EALREADY);
  LB_OK(px_stop(ctx, &x, threads_before + 1));
  px_free(&x);
  return 0;
}

/* ---- an armed thread is held until go ----
 * xnode.c arms every rank's proxy, learns whether every rank could, and only then lets the
 * threads run; if one rank could not, the others stop theirs held. The proxies here run over
 * the default transport wrapped to count the calls the thread makes on its connections (each
 * loop of a running thread progresses every one). Rank 0 arms and stops without go (its
 * connections close). Rank 1 stays armed across that close: no call, no error; once it goes,
 * the calls start and the running thread takes the close for a dead peer (ofi reports it after
 * a 1 s grace). */

#define HELD_BOUND_S 10.0
#define HELD_FOR_US 500000

static struct mk_transport_ops counted_ops;
static int (*uncounted_progress)(struct mk_comm* comm);
static uint64_t progress_calls; /* atomic */

static int counted_progress(struct mk_comm* comm) {
  __atomic_fetch_add(&progress_calls, 1, __ATOMIC_RELAXED);
  return uncounted_progress(comm);
}

static int counted_transport(const struct mk_transport_ops** out) {
  const struct mk_transport_ops* ops;
  MK_CHECK(mk_transport_get(&ops));
  counted_ops = *ops;
  uncounted_progress = ops->progress;
  counted_ops.progress = counted_progress;
  *out = &counted_ops;
  return 0;
}

static int armed_held_rank(struct lb_ctx* ctx) {
  struct px x = {0};
  LB_OK(counted_transport(&x.ops));
  LB_OK(px_setup(ctx, &x, DEPTH, INFLIGHT, 4096, 8));
  const int threads_before = count_threads();
  LB_OK(mk_proxy_arm(x.p, x.keys));
  const uint64_t calls_at_arm = __atomic_load_n(&progress_calls, __ATOMIC_RELAXED); /* the setup's */
  LB_EXPECT(count_threads() == threads_before + 1);
  if (x.rank == 0) {
    usleep(HELD_FOR_US);
    LB_EXPECT(__atomic_load_n(&progress_calls, __ATOMIC_RELAXED) == calls_at_arm);
    const int tid = mk_proxy_tid(x.p); /* its first statement, long done */
    LB_OK(mk_proxy_stop(x.p)); /* held: the stop lets it out at once (a thread that stayed would hang this join) */
    x.p = NULL;
    LB_EXPECT(tid > 0 && thread_gone_within(tid, 1.0));
    lb_tell(ctx, 1);
    LB_EXPECT(lb_hear(ctx) == 2);
    px_free(&x);
    return 0;
  }
  LB_EXPECT(lb_hear(ctx) == 1);
  usleep(HELD_FOR_US);
  char msg[256];
  LB_EXPECT(__atomic_load_n(&progress_calls, __ATOMIC_RELAXED) == calls_at_arm);
  LB_EXPECT(mk_proxy_error(x.p, msg, sizeof msg) == 0);
  mk_proxy_go(x.p);
  double t0 = lb_now();
  int err = 0;
  while (!(err = mk_proxy_error(x.p, msg, sizeof msg)) && lb_now() - t0 < HELD_BOUND_S) usleep(1000);
  const uint64_t calls = __atomic_load_n(&progress_calls, __ATOMIC_RELAXED) - calls_at_arm;
  fprintf(stderr, "  [rank 1] held: no transport call, no error; after go: %llu progress calls, %s (%.3f s)\n",
          (unsigned long long)calls, err ? msg : "(no error)", lb_now() - t0);
  LB_EXPECT(calls > 0 && err < 0);
  LB_EXPECT(mk_proxy_stop(x.p) == err);
  x.p = NULL;
  lb_tell(ctx, 2);
  px_free(&x);
  return 0;
}

static const struct lb_case cases[] = {
    {"proxy_reducescatter_protocol_several_producers_back_to_back_stay_correct",
     lb_xnode_reducescatter_rank, lb_xnode_reducescatter_rank, 90, 0},
    {"proxy_allreduce_protocol_partials_then_reduced_rows_stay_correct", lb_xnode_allreduce_rank,
     lb_xnode_allreduce_rank, 90, 0},
    {"proxy_allgather_protocol_back_to_back_calls_with_a_delayed_rank_stay_correct",
     lb_xnode_allgather_rank, lb_xnode_allgather_rank, 90, 0},
    {"proxy_goodbye_then_close_needs_no_agreement_and_raises_no_error", lb_xnode_goodbye_rank,
     lb_xnode_goodbye_rank, 60, 0},
    {"proxy_goodbye_without_the_peer_returns_within_its_bound", lb_xnode_goodbye_survivor,
     lb_xnode_goodbye_victim, 60, 1},
    {"proxy_goodbye_of_three_ranks_outlives_the_first_ranks_close", lb_bye3_parent, lb_bye3_child, 60, 0},
    {"proxy_put_signal_stream_flags_never_before_data_and_byte_counters_exact", stream_rank,
     stream_rank, 150, 0},
    {"proxy_killed_peer_gives_async_error_within_bound_and_stops", killed_survivor, killed_victim,
     90, 1},
    {"proxy_stop_joins_thread_with_puts_in_flight", stop_initiator, stop_target, 60, 0},
    {"proxy_refuses_a_corrupt_key_record_before_any_thread_runs", corrupt_keys_rank, corrupt_keys_rank, 60, 0},
    {"proxy_armed_thread_touches_no_connection_until_go", armed_held_rank, armed_held_rank, 60, 0},
    {"bench_proxy_bw", proxy_bench_rank, proxy_bench_rank, 150, 0},
    {NULL, NULL, NULL, 0, 0},
};

int main(int argc, char** argv) {
  for (const struct lb_case* c = cases; c->name; c++)
    if (argc > 1 && strcmp(argv[1], c->name) == 0) return lb_run(c);
  fprintf(stderr, "usage: %s CASE; cases:\n", argv[0]);
  for (const struct lb_case* c = cases; c->name; c++) fprintf(stderr, "  %s\n", c->name);
  return 1;
}
