/*
 * proxy_loopback CASE: the proxy (fused/proxy) between two real processes over the
 * transport (libfabric tcp;ofi_rxm on 127.0.0.1). Each process is a rank with the other
 * outside its local team; the main thread is the CPU stand-in for the kernel: it writes
 * data into its workspace, publishes descriptors and polls flags, and never calls the
 * transport itself (the proxy thread does, including the progress that lands the peer's
 * writes). Record exchanges, which NCCL's all-gather does in production, go over the pipes.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lb.h"
#include "proxy.h"
#include "queue.h"
#include "xnode.h"

#define SEC 1000000000ull
#define WAIT_NS (30 * SEC) /* producer waits: generous, the machine is shared */

struct px {
  int rank, peer;
  struct mk_proxy_queue* q;
  struct mk_proxy_producer prod;
  unsigned char* data;
  size_t data_bytes;
  uint64_t* flags;
  size_t flags_bytes;
  struct mk_proxy* p;
  struct mk_proxy_keys keys[2];
};

static void tell_bytes(struct lb_ctx* ctx, const void* buf, size_t len) {
  for (size_t off = 0; off < len; off += 8) {
    uint64_t w;
    memcpy(&w, (const char*)buf + off, 8);
    lb_tell(ctx, w);
  }
}

static void hear_bytes(struct lb_ctx* ctx, void* buf, size_t len) {
  for (size_t off = 0; off < len; off += 8) {
    uint64_t w = lb_hear(ctx);
    memcpy((char*)buf + off, &w, 8);
  }
}

static int count_threads(void) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static int thread_alive(int tid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/task/%d", tid);
  return access(path, F_OK) == 0;
}

/* pthread_join returns once the kernel clears the thread's tid, a little before the task
 * leaves /proc (seen in the slow soft-RoCE VM): a joined thread is gone within this bound. */
static int thread_gone_within(int tid, double seconds) {
  double t0 = lb_now();
  while (thread_alive(tid)) {
    if (lb_now() - t0 > seconds) return 0;
    usleep(1000);
  }
  return 1;
}

/* Both ranks: queue, regions, proxy, the two record exchanges. The thread is not started. */
static int px_setup(struct lb_ctx* ctx, struct px* x, uint32_t depth, int inflight,
                    size_t data_bytes, size_t nflags) {
  x->rank = ctx->is_sender ? 1 : 0;
  x->peer = 1 - x->rank;
  x->q = lb_alloc(mk_proxy_queue_bytes(depth));
  LB_OK(mk_proxy_queue_init(x->q, depth));
  mk_proxy_producer_init(&x->prod, x->q, x->rank);
  x->data_bytes = data_bytes;
  x->data = lb_alloc(data_bytes);
  memset(x->data, 0, data_bytes);
  x->flags_bytes = nflags * 8;
  x->flags = lb_alloc(x->flags_bytes);
  memset(x->flags, 0, x->flags_bytes);
  unsigned char remote[2] = {1, 1}; /* NCCL_MK_LOCAL_SIZE=1: every peer is remote */
  struct mk_proxy_conf conf = {
      .ops = NULL, .dev = ctx->dev, .rank = x->rank, .nranks = 2, .remote = remote,
      .data = x->data, .data_bytes = data_bytes, .data_type = MK_PTR_HOST,
      .flags = x->flags, .flags_bytes = x->flags_bytes,
      .flags_type = MK_PTR_HOST | MK_PTR_FORCE_SO, /* as the fused ops register their flags */
      .queue = x->q, .max_inflight = inflight};
  LB_OK(mk_proxy_create(&conf, &x->p));
  struct mk_proxy_addr addrs[2];
  LB_OK(mk_proxy_addr(x->p, &addrs[x->rank]));
  tell_bytes(ctx, &addrs[x->rank], sizeof(addrs[0]));
  hear_bytes(ctx, &addrs[x->peer], sizeof(addrs[0]));
  LB_OK(mk_proxy_connect(x->p, addrs));
  LB_OK(mk_proxy_keys(x->p, &x->keys[x->rank]));
  tell_bytes(ctx, &x->keys[x->rank], sizeof(x->keys[0]));
  hear_bytes(ctx, &x->keys[x->peer], sizeof(x->keys[0]));
  return 0;
}

static void px_free(struct px* x) {
  free(x->q);
  free(x->data);
  free(x->flags);
}

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

static int stream_rank(struct lb_ctx* ctx) {
  struct px x;
  LB_OK(px_setup(ctx, &x, DEPTH, INFLIGHT, (size_t)(SSLOTS + KSLOTS) * CH, 2 * KSLOTS));
  uint64_t stage_ticket[SSLOTS] = {0}, sent_bytes = 0, j = 0, i = 0;
  /* Before the proxy runs: fill the ring, then it must say "full". */
  while (x.prod.tail < DEPTH - 1) LB_OK(send_chunk(ctx, &x, j++, stage_ticket, &sent_bytes));
  struct mk_proxy_desc extra = {.op = MK_PROXY_SIGNAL, .peer = x.peer, .flag_off = 8 * KSLOTS};
  while (x.prod.tail < DEPTH) LB_OK(mk_proxy_try_publish(&x.prod, &extra, NULL)); /* ack 0: no-op */
  LB_EXPECT(mk_proxy_try_publish(&x.prod, &extra, NULL) == -EAGAIN);
  int threads_before = count_threads();
  LB_OK(mk_proxy_start(x.p, x.keys));
  int threads_running = count_threads();
  LB_EXPECT(threads_running == threads_before + 1);

  uint64_t flags_seen_early = 0, checked_bytes = 0;
  double t0 = lb_now();
  while (j < NCHUNKS || i < NCHUNKS) {
    int did = 0;
    if (i < NCHUNKS) { /* receive: the flag, then every byte behind it */
      uint32_t k = (uint32_t)(i % KSLOTS);
      uint64_t r = i / KSLOTS + 1;
      uint64_t v = mk_pq_load_acquire(&x.flags[k]);
      LB_EXPECT(v <= r); /* never ahead of what we acknowledged */
      if (v == r) {
        size_t len = chunk_len(ctx->seed, x.peer, i);
        if (lb_check(x.data + (size_t)(SSLOTS + k) * CH, len, ctx->seed,
                     chunk_stream(x.peer, i), "data under its flag")) {
          fprintf(stderr, "  chunk %" PRIu64 " (slot %u, round %" PRIu64 ") seen before its data\n",
                  i, k, r);
          flags_seen_early++;
          return 1;
        }
        checked_bytes += len;
        struct mk_proxy_desc ack = {.op = MK_PROXY_SIGNAL, .peer = x.peer,
                                    .flag_off = (uint64_t)(KSLOTS + k) * 8, .flag_value = r};
        LB_OK(mk_proxy_publish(&x.prod, &ack, WAIT_NS, NULL));
        i++;
        did = 1;
      }
    }
    if (j < NCHUNKS) { /* send, when the peer has freed the landing slot and ours is free */
      uint32_t k = (uint32_t)(j % KSLOTS), s = (uint32_t)(j % SSLOTS);
      uint64_t r = j / KSLOTS + 1;
      int acked = r == 1 || mk_pq_load_acquire(&x.flags[KSLOTS + k]) >= r - 1;
      int staged = mk_pq_load_acquire(&x.q->completed) >= stage_ticket[s];
      if (acked && staged) {
        LB_OK(send_chunk(ctx, &x, j++, stage_ticket, &sent_bytes));
        did = 1;
      }
    }
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
    if (!did) sched_yield();
  }
  LB_OK(mk_proxy_wait_completed(&x.prod, x.prod.tail - 1, WAIT_NS));
  double dt = lb_now() - t0;
  uint64_t counted = mk_proxy_sent_bytes(x.p, x.peer), ops = mk_proxy_sent_ops(x.p, x.peer);
  printf("  [rank %d] %u chunks each way in %.2f s: put %" PRIu64 " bytes, proxy counted %"
         PRIu64 " bytes in %" PRIu64 " descriptors (%" PRIu64 " published, %" PRIu64
         " laps of the ring, %" PRIu64 " publishes waited for a slot); checked %" PRIu64
         " bytes received\n", x.rank, NCHUNKS, dt, sent_bytes, counted, ops, x.prod.tail,
         x.prod.tail / DEPTH, x.prod.full_waits, checked_bytes);
  LB_EXPECT(flags_seen_early == 0);
  LB_EXPECT(counted == sent_bytes);
  LB_EXPECT(ops == x.prod.tail);
  LB_EXPECT(mk_proxy_sent_bytes(x.p, x.rank) == 0);
  LB_EXPECT(x.prod.tail / DEPTH > 100);
  LB_OK(px_stop(ctx, &x, threads_running));
  px_free(&x);
  return 0;
}

/* ---- a peer killed mid-run ---- */

#define KILL_CHUNK (256u << 10)
#define KILL_BOUND_S 10.0

static int killed_survivor(struct lb_ctx* ctx) {
  struct px x;
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
  struct px x;
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
  struct px x;
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
  struct px x;
  LB_OK(px_setup(ctx, &x, 64, 16, 16u << 20, 64));
  LB_OK(mk_proxy_start(x.p, x.keys));
  LB_EXPECT(lb_hear(ctx) == 1);
  LB_OK(mk_proxy_quiesce(x.p));
  lb_tell(ctx, 2);
  LB_OK(mk_proxy_stop(x.p));
  px_free(&x);
  return 0;
}

/* ---- goodbye: the shutdown of the fused ops' release, with no out-of-band agreement ----
 * Each rank puts a chunk, then a signal-only "bye" (fenced: it lands after the chunk), tells
 * its proxy that the peer's close is now orderly, waits (bounded) for the peer's bye and checks
 * the chunk before it. Rank 0 then stops at once, closing its connections while rank 1's thread
 * still runs (rank 1 waits 200 ms more): rank 1's thread must take the close quietly, and
 * neither rank may report an error. */
static int goodbye_rank(struct lb_ctx* ctx) {
  struct px x;
  LB_OK(px_setup(ctx, &x, 16, 8, 2 * (size_t)CH, 2));
  LB_OK(mk_proxy_start(x.p, x.keys));
  lb_fill(x.data, CH, ctx->seed, chunk_stream(x.rank, 0));
  struct mk_proxy_desc put = {.op = MK_PROXY_PUT, .peer = x.peer, .dst_off = CH, .size = CH};
  struct mk_proxy_desc bye = {.op = MK_PROXY_SIGNAL, .peer = x.peer, .flag_off = 0, .flag_value = 1};
  LB_OK(mk_proxy_publish(&x.prod, &put, WAIT_NS, NULL));
  LB_OK(mk_proxy_publish(&x.prod, &bye, WAIT_NS, NULL));
  mk_proxy_peers_leaving(x.p);
  double t0 = lb_now();
  while (__atomic_load_n(&x.flags[0], __ATOMIC_ACQUIRE) < 1) {
    LB_EXPECT(lb_now() - t0 < 30.0);
    usleep(100);
  }
  LB_EXPECT(lb_check(x.data + CH, CH, ctx->seed, chunk_stream(x.peer, 0), "chunk before the bye") == 0);
  if (x.rank == 1) usleep(200000); /* rank 0 has closed by now; this thread still progresses */
  char msg[256] = "";
  const int err = mk_proxy_error(x.p, msg, sizeof(msg));
  printf("  [rank %d] bye after %.3f s; proxy error before the stop: %d %s\n", x.rank, lb_now() - t0, err, msg);
  LB_EXPECT(err == 0);
  LB_EXPECT(mk_proxy_quiesce(x.p) == 0);
  LB_EXPECT(mk_proxy_stop(x.p) == 0);
  px_free(&x);
  return 0;
}

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

static uint64_t xnode_stream(int rank, uint64_t e, int b) { return ((uint64_t)rank << 40) | (e << 8) | (uint64_t)b; }

static int xnode_call(struct lb_ctx* ctx, struct px* x, uint64_t e, uint64_t last_call) {
  if (x->prod.tail) LB_OK(mk_proxy_wait_completed(&x->prod, x->prod.tail - 1, WAIT_NS));
  LB_OK(mk_proxy_wait_flag(x->q, &x->flags[MK_XN_DONE0 + x->peer], (MK_XN_DONE0 + x->peer) * 8, last_call,
                           WAIT_NS, x->rank, 0));
  for (int b = 0; b < XBLOCKS; b++) {
    const int mb = x->rank * XBLOCKS + b;
    lb_fill(x->data + (size_t)mb * XB, XB, ctx->seed, xnode_stream(x->rank, e, b));
    const struct mk_proxy_desc d = mk_xn_block_desc(x->peer, mb, XB, e, 1, (uint32_t)e);
    LB_OK(mk_proxy_publish(&x->prod, &d, WAIT_NS, NULL));
  }
  for (int b = 0; b < XBLOCKS; b++) {
    const int mb = x->peer * XBLOCKS + b;
    uint64_t* flag = &x->flags[MK_XN_ROW_FLAG0 + mb];
    LB_OK(mk_proxy_wait_flag(x->q, flag, (MK_XN_ROW_FLAG0 + mb) * 8, e, WAIT_NS, x->rank, 0));
    LB_EXPECT(mk_pq_load_acquire(flag) == e);
    LB_EXPECT(lb_check(x->data + (size_t)mb * XB, XB, ctx->seed, xnode_stream(x->peer, e, b),
                       "a row-block under its flag") == 0);
  }
  const struct mk_proxy_desc done = mk_xn_done_desc(x->rank, x->peer, e, (uint32_t)e);
  LB_OK(mk_proxy_publish(&x->prod, &done, WAIT_NS, NULL));
  return 0;
}

static int xnode_rank(struct lb_ctx* ctx) {
  struct px x;
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
  LB_EXPECT(mk_proxy_sent_bytes(x.p, x.peer) == (uint64_t)XCALLS * XBLOCKS * XB); /* all completed */
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
  for (uint32_t i; !c->rc && (i = __atomic_fetch_add(&c->next_tile, 1, __ATOMIC_RELAXED)) < RS_BLOCKS * RS_TILES;) {
    const int mb = (int)(i * 3 % RS_BLOCKS), t = (int)(i / RS_BLOCKS); /* row-blocks interleaved */
    unsigned char* out = c->x->data + mk_xn_rs_off(MK_XN_RS_OUT, c->x->peer, c->x->rank, 2, RS_BLOCKS, mb, RS_ROW_BYTES) +
                         (size_t)t * RS_TILE;
    lb_fill(out, RS_TILE, c->ctx->seed, rs_stream(c->x->rank, c->e, mb, t));
    if (__atomic_add_fetch(&c->counts[mb], 1, __ATOMIC_ACQ_REL) < RS_TILES) continue; /* others' tiles seen */
    const struct mk_proxy_desc d = mk_xn_rs_block_desc(c->x->rank, c->x->peer, 2, RS_BLOCKS, mb, RS_ROW_BYTES, RS_TILES, 0, 0);
    const int rc = mk_proxy_mp_publish(c->x->q, c->tail, &d, WAIT_NS, c->x->rank, NULL);
    if (rc) c->rc = rc;
  }
  return NULL;
}

static int rs_owner_side(struct lb_ctx* ctx, struct px* x, uint64_t e) {
  for (int mb = 0; mb < RS_BLOCKS; mb++) {
    const uint64_t word = MK_XN_RS_FLAG0 + (uint64_t)x->peer * RS_BLOCKS + (uint64_t)mb;
    LB_OK(mk_proxy_wait_flag(x->q, &x->flags[word], word * 8, RS_TILES, WAIT_NS, x->rank, 0));
    LB_EXPECT(mk_pq_load_acquire(&x->flags[word]) == RS_TILES);
    const unsigned char* in = x->data + mk_xn_rs_off(MK_XN_RS_IN, x->peer, x->rank, 2, RS_BLOCKS, mb, RS_ROW_BYTES);
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
    unsigned char* g = x->data + mk_xn_rs_off(MK_XN_RS_GATHER, x->peer, x->rank, 2, RS_BLOCKS, mb, RS_ROW_BYTES);
    lb_fill(g, RS_ROW_BYTES, ctx->seed, rs_stream(x->rank, e, mb, 99));
    const struct mk_proxy_desc d = mk_xn_rs_block_desc(x->rank, x->peer, 2, RS_BLOCKS, mb, RS_ROW_BYTES, RS_TILES, 1, 0);
    LB_OK(mk_proxy_mp_publish(x->q, tail, &d, WAIT_NS, x->rank, NULL));
  }
  for (int mb = 0; mb < RS_BLOCKS; mb++) {
    const uint64_t word = MK_XN_GATHER_FLAG0 + (uint64_t)x->peer * RS_BLOCKS + (uint64_t)mb;
    LB_OK(mk_proxy_wait_flag(x->q, &x->flags[word], word * 8, RS_TILES, WAIT_NS, x->rank, 0));
    LB_EXPECT(mk_pq_load_acquire(&x->flags[word]) == RS_TILES);
    const unsigned char* in = x->data + mk_xn_rs_off(MK_XN_RS_GATHERED, x->peer, x->rank, 2, RS_BLOCKS, mb, RS_ROW_BYTES);
    LB_EXPECT(lb_check(in, RS_ROW_BYTES, ctx->seed, rs_stream(x->peer, e, mb, 99), "reduced rows under their flag") == 0);
  }
  return 0;
}

static int rs_call_run(struct lb_ctx* ctx, struct px* x, uint64_t e, uint64_t* tail, uint64_t* call_tail, int gather) {
  if (*call_tail) LB_OK(mk_proxy_wait_completed(&x->prod, *call_tail - 1, WAIT_NS));
  LB_OK(mk_proxy_wait_flag(x->q, &x->flags[MK_XN_DONE0 + x->peer], (MK_XN_DONE0 + x->peer) * 8, e - 1, WAIT_NS,
                           x->rank, 0));
  struct rs_call c = {.ctx = ctx, .x = x, .e = e, .tail = tail};
  pthread_t th[RS_PRODUCERS];
  for (int i = 0; i < RS_PRODUCERS; i++) LB_EXPECT(pthread_create(&th[i], NULL, rs_producer_main, &c) == 0);
  for (int i = 0; i < RS_PRODUCERS; i++) pthread_join(th[i], NULL);
  LB_OK(c.rc);
  LB_OK(rs_owner_side(ctx, x, e));
  if (gather) LB_OK(rs_gather_side(ctx, x, e, tail));
  for (int mb = 0; mb < RS_BLOCKS; mb++) { /* the flags back to 0 before done, as the sender CTA does */
    __atomic_store_n(&x->flags[MK_XN_RS_FLAG0 + (uint64_t)x->peer * RS_BLOCKS + (uint64_t)mb], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&x->flags[MK_XN_GATHER_FLAG0 + (uint64_t)x->peer * RS_BLOCKS + (uint64_t)mb], 0, __ATOMIC_RELEASE);
  }
  const struct mk_proxy_desc done = mk_xn_done_desc(x->rank, x->peer, e, 0);
  LB_OK(mk_proxy_mp_publish(x->q, tail, &done, WAIT_NS, x->rank, NULL));
  *call_tail = __atomic_load_n(tail, __ATOMIC_ACQUIRE);
  return 0;
}

static int rs_run(struct lb_ctx* ctx, int gather) {
  struct px x;
  LB_OK(px_setup(ctx, &x, 16, 16, mk_xn_rs_bytes(2, RS_BLOCKS, RS_ROW_BYTES, gather), MK_XN_FLAG_WORDS));
  LB_OK(mk_proxy_start(x.p, x.keys));
  srand((unsigned)ctx->seed + (unsigned)x.rank);
  uint64_t tail = 0, call_tail = 0;
  double t0 = lb_now();
  for (uint64_t e = 1; e <= RS_CALLS; e++) {
    if (x.rank == 1) usleep((useconds_t)(rand() % 3000));
    LB_OK(rs_call_run(ctx, &x, e, &tail, &call_tail, gather));
  }
  printf("  [rank %d] %d calls in %.3f s, %d producers on one tail\n", x.rank, RS_CALLS, lb_now() - t0, RS_PRODUCERS);
  x.prod.tail = tail; /* the release's single producer from here on */
  const unsigned char remote[2] = {1, 1};
  LB_OK(mk_xn_goodbye(x.p, &x.prod, x.flags, x.rank, 2, remote, WAIT_NS));
  LB_EXPECT(mk_proxy_sent_bytes(x.p, x.peer) == (uint64_t)RS_CALLS * RS_BLOCKS * RS_ROW_BYTES * (gather ? 2 : 1));
  LB_EXPECT(mk_proxy_quiesce(x.p) == 0);
  LB_EXPECT(mk_proxy_stop(x.p) == 0);
  px_free(&x);
  return 0;
}

static int rs_rank(struct lb_ctx* ctx) { return rs_run(ctx, 0); }
static int ar_rank(struct lb_ctx* ctx) { return rs_run(ctx, 1); }

static const struct lb_case cases[] = {
    {"proxy_reducescatter_protocol_several_producers_back_to_back_stay_correct", rs_rank, rs_rank, 90, 0},
    {"proxy_allreduce_protocol_partials_then_reduced_rows_stay_correct", ar_rank, ar_rank, 90, 0},
    {"proxy_allgather_protocol_back_to_back_calls_with_a_delayed_rank_stay_correct", xnode_rank, xnode_rank,
     90, 0},
    {"proxy_goodbye_then_close_needs_no_agreement_and_raises_no_error", goodbye_rank, goodbye_rank, 60, 0},
    {"proxy_put_signal_stream_flags_never_before_data_and_byte_counters_exact", stream_rank,
     stream_rank, 150, 0},
    {"proxy_killed_peer_gives_async_error_within_bound_and_stops", killed_survivor, killed_victim,
     90, 1},
    {"proxy_stop_joins_thread_with_puts_in_flight", stop_initiator, stop_target, 60, 0},
    {NULL, NULL, NULL, 0, 0},
};

int main(int argc, char** argv) {
  for (const struct lb_case* c = cases; c->name; c++)
    if (argc > 1 && strcmp(argv[1], c->name) == 0) return lb_run(c);
  fprintf(stderr, "usage: %s CASE; cases:\n", argv[0]);
  for (const struct lb_case* c = cases; c->name; c++) fprintf(stderr, "  %s\n", c->name);
  return 1;
}
