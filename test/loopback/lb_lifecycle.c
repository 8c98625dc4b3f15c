/* Lifecycle: reconnect on one listen comm, close with requests in flight, a killed peer,
 * a handshake that never completes, bad arguments, a caller that is not our peer, a
 * connect whose handle buffer changes under it, and fini with comms still open. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lb.h"
#include "handle.h"
#include "mk_param.h"
#include "sock.h"

static int one_message(struct lb_ctx* ctx, uint64_t stream) {
  unsigned char buf[4096];
  size_t len = sizeof(buf), got = 0;
  struct mk_request* req;
  int tag = 3;
  if (ctx->is_sender) {
    lb_fill(buf, len, ctx->seed, stream);
    LB_OK(lb_send(ctx, buf, len, tag, NULL, &req));
    return lb_wait(ctx, req, NULL);
  }
  void* d = buf;
  LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
  LB_OK(lb_wait(ctx, req, &got));
  LB_EXPECT(got == len && lb_check(buf, len, ctx->seed, stream, "message") == 0);
  return 0;
}

static int reconnect_recv(struct lb_ctx* ctx) {
  static unsigned char spare[1 << 20];
  LB_OK(lb_accept(ctx));
  LB_OK(one_message(ctx, 1));
  /* leave two receives in flight, then close: they are cancelled, nothing crashes */
  void* d = spare;
  size_t len = sizeof(spare);
  int tag = 3;
  struct mk_request* req;
  LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
  LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
  LB_OK(ctx->ops->close(ctx->comm));
  ctx->comm = NULL;
  for (int round = 2; round <= 4; round++) { /* same listen comm, new connections */
    LB_OK(lb_reconnect(ctx));
    LB_OK(one_message(ctx, (uint64_t)round));
    LB_OK(ctx->ops->close(ctx->comm));
    ctx->comm = NULL;
  }
  return lb_close(ctx);
}

static int reconnect_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  LB_OK(one_message(ctx, 1));
  LB_OK(lb_close(ctx));
  for (int round = 2; round <= 4; round++) { /* the same handle again */
    LB_OK(lb_reconnect(ctx));
    LB_OK(one_message(ctx, (uint64_t)round));
    LB_OK(lb_close(ctx));
  }
  return 0;
}

/* The sender is SIGKILLed with a 256 MiB message half way: the receiver's test must fail
 * with -ECONNRESET within a bound, and so must a later receive. */
#define KILL_LEN (256u << 20)
#define KILL_BOUND_S 5.0
static int killed_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  unsigned char* buf = lb_alloc(KILL_LEN);
  void* d = buf;
  size_t len = KILL_LEN;
  int tag = 1, done = 0, rc = 0;
  struct mk_request* req;
  LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
  while (!lb_peer_spoke(ctx)) LB_OK(ctx->ops->test(req, &done, NULL)); /* data moves */
  LB_EXPECT(!done);
  LB_EXPECT(lb_hear(ctx) == 1); /* the sender is mid-transfer */
  kill(ctx->child, SIGKILL);
  double t0 = lb_now();
  while (rc == 0 && !done && lb_now() - t0 < 30) rc = ctx->ops->test(req, &done, NULL);
  double dt = lb_now() - t0;
  printf("  survivor saw rc=%d (%s) after %.3f s\n", rc, strerror(-rc), dt);
  LB_EXPECT(rc == -ECONNRESET && dt < KILL_BOUND_S);
  struct mk_request* later = NULL;
  rc = ctx->ops->irecv(ctx->comm, 1, &d, &len, &tag, NULL, 0, &later);
  printf("  a later irecv gave rc=%d\n", rc);
  LB_EXPECT(rc == -ECONNRESET);
  LB_EXPECT(later == NULL);
  int closed = lb_close(ctx); /* before the buffer goes: stripes may still be posted into it */
  free(buf);
  return closed == 0 ? 0 : 1;
}

static int killed_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  unsigned char* buf = lb_alloc(KILL_LEN);
  memset(buf, 1, KILL_LEN);
  struct mk_request* req;
  int done = 0;
  LB_OK(lb_send(ctx, buf, KILL_LEN, 1, NULL, &req));
  for (int i = 0; i < 200; i++) LB_OK(ctx->ops->test(req, &done, NULL));
  lb_tell(ctx, 1);
  for (;;) pause(); /* killed here, mid-transfer */
}

/* A listener that never accepts: connect gives up with -ETIMEDOUT after the bound. */
static int timeout_recv(struct lb_ctx* ctx) {
  LB_OK(ctx->ops->listen(ctx->dev, ctx->handle, &ctx->listen_comm));
  lb_tell(ctx, 0);
  for (size_t off = 0; off < sizeof(ctx->handle); off += 8) {
    uint64_t w;
    memcpy(&w, ctx->handle + off, 8);
    lb_tell(ctx, w);
  }
  LB_EXPECT(lb_hear(ctx) == 1);
  return lb_close(ctx);
}

static int timeout_send(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_CONNECT_TIMEOUT_MS", "500");
  LB_EXPECT(lb_hear(ctx) == 0);
  for (size_t off = 0; off < sizeof(ctx->handle); off += 8) {
    uint64_t w = lb_hear(ctx);
    memcpy(ctx->handle + off, &w, 8);
  }
  int rc = 0;
  double t0 = lb_now();
  while (rc == 0 && !ctx->comm) rc = ctx->ops->connect(ctx->dev, ctx->handle, -1, &ctx->comm);
  double dt = lb_now() - t0;
  printf("  connect gave rc=%d (%s) after %.3f s\n", rc, strerror(-rc), dt);
  LB_EXPECT(rc == -ETIMEDOUT && dt >= 0.4 && dt < 5);
  unsigned char junk[MK_HANDLE_MAX];
  memset(junk, 0x11, sizeof(junk));
  LB_EXPECT(ctx->ops->connect(ctx->dev, junk, -1, &ctx->comm) == -EBADMSG);
  LB_EXPECT(ctx->comm == NULL);
  lb_tell(ctx, 1);
  return 0;
}

/* Bad arguments: -EINVAL, *req stays NULL, canary untouched, and the comms stay in step
 * (the next good message lands where it should). An oversized send is -EMSGSIZE at the
 * sender: with ofi eager off (set here, at the receiver, it is off for both ends), since an
 * eager message is found too large at the receiver instead (lb_eager.c). */
static int badargs_recv(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_OFI_EAGER_BYTES", "0");
  LB_OK(lb_accept(ctx));
  const struct mk_transport_ops* o = ctx->ops;
  static unsigned char canary[4096];
  memset(canary, 0xcd, sizeof(canary));
  uint64_t junk_mr[8] = {0};
  void* d = canary;
  size_t len = sizeof(canary), huge = (size_t)-1;
  int tag = 5, neg = -1, done = 0;
  void* null_data = NULL;
  struct mk_request* req = NULL;
  struct mk_mr* bad_mr = (struct mk_mr*)junk_mr;
  struct mk_mr* mr = NULL;
  LB_EXPECT(o->irecv(ctx->comm, 0, &d, &len, &tag, NULL, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->irecv(ctx->comm, 9, &d, &len, &tag, NULL, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->irecv(ctx->comm, -1, &d, &len, &tag, NULL, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->irecv(ctx->comm, 1, &d, NULL, &tag, NULL, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->irecv(ctx->comm, 1, &null_data, &len, &tag, NULL, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->irecv(ctx->comm, 1, &d, &huge, &tag, NULL, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->irecv(ctx->comm, 1, &d, &len, &tag, &bad_mr, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->irecv(NULL, 1, &d, &len, &tag, NULL, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->iflush(ctx->comm, 1, &d, &neg, NULL, &req) == -EINVAL && !req);
  LB_EXPECT(o->test(NULL, &done, NULL) == -EINVAL);
  LB_EXPECT(o->reg_mr(ctx->comm, NULL, 10, MK_PTR_HOST, &mr) == -EINVAL && !mr);
  LB_EXPECT(o->reg_mr(ctx->comm, canary, 0, MK_PTR_HOST, &mr) == -EINVAL && !mr);
  LB_EXPECT(o->reg_mr(ctx->comm, canary, 10, 77, &mr) == -EINVAL && !mr);
  LB_EXPECT(o->dereg_mr(ctx->comm, bad_mr) == -EINVAL);
  LB_EXPECT(o->mr_rkey(bad_mr, NULL) == -EINVAL);
  struct mk_rkey k = {.base = 0, .key = 1, .size = 100};
  LB_EXPECT(o->iput(ctx->comm, canary, 10, NULL, &k, 95, &req) == -EINVAL && !req);
  LB_EXPECT(o->iput(ctx->comm, canary, 10, NULL, NULL, 0, &req) == -EINVAL && !req);
  LB_EXPECT(o->iput_signal(ctx->comm, canary, 10, NULL, &k, 0, &k, 96, 1, &req) == -EINVAL && !req);
  for (size_t i = 0; i < sizeof(canary); i++) LB_EXPECT(canary[i] == 0xcd);
  lb_tell(ctx, 1);
  /* the first good receive takes the first good send */
  unsigned char buf[100];
  size_t cap = sizeof(buf), got = 0;
  d = buf;
  LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
  LB_OK(lb_wait(ctx, req, &got));
  LB_EXPECT(got == 100 && lb_check(buf, 100, ctx->seed, 5, "good message") == 0);
  /* tested again after it completed (its slot free, nothing allocated since): refused, not
   * reported done a second time with the old sizes */
  done = 1;
  LB_EXPECT(o->test(req, &done, NULL) == -EINVAL && !done);
  LB_EXPECT(lb_hear(ctx) == 2);
  return lb_close(ctx);
}

static int badargs_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  const struct mk_transport_ops* o = ctx->ops;
  uint64_t junk_mr[8] = {0};
  unsigned char buf[200];
  struct mk_request* req = NULL;
  lb_fill(buf, sizeof(buf), ctx->seed, 5);
  LB_EXPECT(lb_hear(ctx) == 1);
  LB_EXPECT(o->isend(ctx->comm, NULL, 10, 5, NULL, &req) == -EINVAL && !req);
  LB_EXPECT(o->isend(ctx->comm, buf, 10, 5, (struct mk_mr*)junk_mr, &req) == -EINVAL && !req);
  LB_EXPECT(o->isend(NULL, buf, 10, 5, NULL, &req) == -EINVAL && !req);
  LB_EXPECT(o->isend(ctx->comm, buf, (size_t)-1, 5, NULL, &req) == -EINVAL && !req);
  /* wait for the receive to be posted, then try too much, then the right size */
  int rc;
  while ((rc = o->isend(ctx->comm, buf, 200, 5, NULL, &req)) == 0 && !req) {}
  LB_EXPECT(rc == -EMSGSIZE && !req);
  LB_EXPECT(o->isend(ctx->comm, buf, 100, 6, NULL, &req) == -EINVAL && !req); /* no such tag */
  LB_OK(lb_send(ctx, buf, 100, 5, NULL, &req));
  LB_OK(lb_wait(ctx, req, NULL));
  lb_tell(ctx, 2);
  return lb_close(ctx);
}

/* Something that is not our peer dials the listener first (a port scanner, a stale job): the
 * receiver's accept drops it and keeps listening, and the real connection that follows is
 * accepted and carries a message (transport/side_channel.c mk_side_accept). */
static int foreign_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  LB_OK(one_message(ctx, 7));
  return lb_close(ctx);
}

/* A plain TCP connection to the listener whose handle the peer sent, as a stranger makes one:
 * its socket in *fd once connected. */
static int stranger_dial(struct lb_ctx* ctx, int* fd) {
  struct mk_handle h;
  *fd = -1;
  LB_EXPECT(lb_hear_handle(ctx) == 0);
  LB_OK(mk_handle_decode(ctx->handle, MK_HANDLE_MAX, &h));
  LB_OK(mk_sock_connect_start(&h.addr, fd));
  int rc = 0;
  while ((rc = mk_sock_connect_poll(*fd)) == 0) {}
  LB_EXPECT(rc == 1);
  return 0;
}

static int foreign_send(struct lb_ctx* ctx) {
  int fd = -1;
  unsigned char junk[1024];
  memset(junk, 0x11, sizeof(junk));
  LB_OK(stranger_dial(ctx, &fd));
  LB_EXPECT(write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk));
  close(fd);
  LB_OK(lb_reconnect(ctx));
  LB_OK(one_message(ctx, 7));
  return lb_close(ctx);
}

/* A caller that connects and says nothing (a stale job, a scanner) holds the listener's
 * handshake only until the connect timeout (500 ms here): it is dropped, the listener goes on,
 * and our peer, connecting after it, is accepted (before, the accept failed with ETIMEDOUT). */
static int silent_recv(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_CONNECT_TIMEOUT_MS", "500");
  LB_OK(lb_accept(ctx));
  LB_OK(one_message(ctx, 8));
  return lb_close(ctx);
}

static int silent_send(struct lb_ctx* ctx) {
  int fd = -1;
  LB_OK(stranger_dial(ctx, &fd));
  usleep(1500 * 1000); /* past the listener's 500 ms: it has given up on this caller */
  LB_OK(lb_reconnect(ctx));
  close(fd);
  LB_OK(one_message(ctx, 8));
  return lb_close(ctx);
}

/* NCCL calls connect again with the same handle buffer until a comm comes back; a buffer that
 * meanwhile holds another listener's handle must start over there, not finish the first
 * connection. The receiver listens twice (A, B) and accepts on B only; the sender connects
 * to A for a while (its handshake cannot finish: A never accepts), then the buffer gets B's
 * handle and the connect must end on B, with a message through it. */
static int handle_change_recv(struct lb_ctx* ctx) {
  void* listen_a = NULL;
  unsigned char handle_a[MK_HANDLE_MAX];
  LB_OK(ctx->ops->listen(ctx->dev, handle_a, &listen_a));
  lb_tell_handle(ctx, handle_a);
  LB_OK(lb_accept(ctx)); /* B: sends its handle, then accepts */
  LB_OK(one_message(ctx, 9));
  LB_OK(ctx->ops->close_listen(listen_a));
  return lb_close(ctx);
}

static int handle_change_send(struct lb_ctx* ctx) {
  unsigned char handle_b[MK_HANDLE_MAX];
  LB_EXPECT(lb_hear_handle(ctx) == 0); /* A */
  for (int i = 0; i < 50; i++) {
    LB_OK(ctx->ops->connect(ctx->dev, ctx->handle, -1, &ctx->comm));
    LB_EXPECT(ctx->comm == NULL); /* A never accepts */
    usleep(1000);
  }
  memcpy(handle_b, ctx->handle, sizeof(handle_b));
  LB_EXPECT(lb_hear_handle(ctx) == 0); /* B, into the same buffer */
  LB_EXPECT(memcmp(handle_b, ctx->handle, sizeof(handle_b)) != 0);
  LB_OK(lb_reconnect(ctx));
  LB_OK(one_message(ctx, 9));
  return lb_close(ctx);
}

/* The transport's fini with a comm still open on both ends (NCCL after an abort): the comms'
 * progress and stream threads must be stopped before the domain and libfabric go. Both roles
 * return without closing; the harness then calls fini (lb_role). Before the fix (session 45)
 * the sender died of SIGSEGV in ofi_cq_progress with streams and a progress thread. */
/* Fini follows at once, the threads still polling. The sender waits until the receiver has
 * its message: a send's completion means its buffer may be reused, not that the message
 * landed, and a fini with the comm open closes it without a bye, so under load the receiver
 * could see its peer vanish first (CI at db295d2; 10 of 30 runs beside 16 busy cores). */
static int fini_open_role(struct lb_ctx* ctx) {
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  LB_OK(one_message(ctx, 11));
  if (ctx->is_sender) return lb_hear(ctx) == 11 ? 0 : -EPROTO;
  lb_tell(ctx, 11);
  return 0;
}

/* Threads of this process (/proc/self/task). */
static int thread_count(void) {
  DIR* d = opendir("/proc/self/task");
  int n = 0;
  if (!d) return -1;
  for (struct dirent* e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* The threads a comm of S streams runs while open: S-1 stream helpers, and its progress
 * thread (NCCL_MK_OFI_PROGRESS_THREAD). */
static int comm_threads(int streams) {
  return (mk_param_int(MK_PARAM_OFI_STREAM_THREADS) ? streams - 1 : 0) +
         lb_ofi_progress_thread();
}

/* A comm runs comm_threads() threads while open, and close joins them all: after close the
 * process has exactly the threads it had before the connection. A first connection warms
 * up whatever libfabric starts once per process. */
static int threads_role(struct lb_ctx* ctx) {
  static unsigned char big[4 << 20];
  int streams = lb_ofi_streams();
  int helpers = comm_threads(streams);
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  LB_OK(one_message(ctx, 1));
  LB_OK(ctx->ops->close(ctx->comm));
  ctx->comm = NULL;
  int base = thread_count();
  LB_OK(lb_reconnect(ctx));
  int open_n = thread_count();
  size_t len = sizeof(big), got = 0;
  struct mk_request* req;
  int tag = 3;
  void* d = big;
  if (ctx->is_sender) LB_OK(lb_send(ctx, big, len, tag, NULL, &req));
  else LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
  LB_OK(lb_wait(ctx, req, &got));
  LB_OK(ctx->ops->close(ctx->comm));
  ctx->comm = NULL;
  int closed = thread_count();
  printf("  [%s] streams %d: %d threads before, %d open, %d after close\n",
         ctx->is_sender ? "sender" : "receiver", streams, base, open_n, closed);
  LB_EXPECT(open_n - base == helpers);
  LB_EXPECT(closed == base);
  lb_tell(ctx, 7); /* the peer's comm is closed only after ours: no "bye" race */
  LB_EXPECT(lb_hear(ctx) == 7);
  return lb_close(ctx);
}

/* Connects again (same listen comm) with this thread's connection hints set to h, exchanges
 * a message, and returns the threads the new comm started. */
static int helpers_with_hint(struct lb_ctx* ctx, struct mk_conn_hints h, int* helpers) {
  mk_conn_hints_set(&h);
  int base = thread_count();
  LB_OK(lb_reconnect(ctx));
  mk_conn_hints_set(NULL);
  *helpers = thread_count() - base;
  LB_OK(one_message(ctx, 2));
  LB_OK(ctx->ops->close(ctx->comm));
  ctx->comm = NULL;
  lb_tell(ctx, 8); /* both closed before the next connection */
  LB_EXPECT(lb_hear(ctx) == 8);
  return 0;
}

/* The fused ops' proxy asks for its own stream count, and no progress thread, through
 * per-thread connection hints (NCCL's comms keep the parameters): a hinted comm has that
 * many streams, the next one without a hint the parameter's, and one hinted off has no
 * progress thread. */
static int hints_role(struct lb_ctx* ctx) {
  int streams = lb_ofi_streams();
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  LB_OK(one_message(ctx, 1));
  LB_OK(ctx->ops->close(ctx->comm));
  ctx->comm = NULL;
  int hinted, plain, unthreaded;
  LB_OK(helpers_with_hint(ctx, (struct mk_conn_hints){.streams = 3}, &hinted));
  LB_OK(helpers_with_hint(ctx, (struct mk_conn_hints){0}, &plain));
  LB_OK(helpers_with_hint(ctx, (struct mk_conn_hints){.streams = 3, .progress_thread = -1},
                          &unthreaded));
  printf("  [%s] threads: %d with a hint of 3 streams, %d without (parameter %d), %d with 3 "
         "streams and no progress thread\n", ctx->is_sender ? "sender" : "receiver", hinted,
         plain, streams, unthreaded);
  LB_EXPECT(hinted == comm_threads(3));
  LB_EXPECT(plain == comm_threads(streams));
  LB_EXPECT(unthreaded == comm_threads(3) - lb_ofi_progress_thread());
  return lb_close(ctx);
}

/* Waits (bounded) until want streams of ctx->comm were connected ahead; the count seen. */
static int connected_ahead_within(struct lb_ctx* ctx, int want, double seconds) {
  const double t0 = lb_now();
  int n;
  while ((n = mk_ofi_streams_connected_ahead(ctx->comm)) < want && lb_now() - t0 < seconds)
    usleep(1000);
  return n;
}

/* The proxy's hint connect_ahead: right after the handshake, with no data posted, every
 * stream 1.. of both ends forms its fabric connection (its 0-byte message lands), so a put's
 * first write does not pay for it; a comm without the hint forms none, and both still carry
 * messages. */
static int connect_ahead_role(struct lb_ctx* ctx) {
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  const int plain = connected_ahead_within(ctx, 1, 0.2);
  LB_OK(one_message(ctx, 1));
  LB_OK(ctx->ops->close(ctx->comm));
  ctx->comm = NULL;
  lb_tell(ctx, 8);
  LB_EXPECT(lb_hear(ctx) == 8);
  const struct mk_conn_hints h = {.streams = 4, .connect_ahead = 1};
  mk_conn_hints_set(&h);
  int rc = lb_reconnect(ctx);
  mk_conn_hints_set(NULL);
  LB_OK(rc);
  const int ahead = connected_ahead_within(ctx, 3, 10.0);
  printf("  [%s] streams connected ahead: %d with the hint (of 3), %d without\n",
         ctx->is_sender ? "sender" : "receiver", ahead, plain);
  LB_EXPECT(plain == 0);
  LB_EXPECT(ahead == (mk_param_int(MK_PARAM_OFI_STREAM_THREADS) ? 3 : 0));
  LB_OK(one_message(ctx, 2));
  LB_OK(ctx->ops->close(ctx->comm));
  ctx->comm = NULL;
  lb_tell(ctx, 9);
  LB_EXPECT(lb_hear(ctx) == 9);
  return lb_close(ctx);
}

const struct lb_case lb_cases_lifecycle[] = {
    {"connection_hint_connect_ahead_forms_every_streams_connection_before_any_data",
     connect_ahead_role, connect_ahead_role, 30, 0},
    {"connection_hints_set_the_stream_count_and_progress_thread", hints_role, hints_role, 30, 0},
    {"close_joins_every_stream_thread", threads_role, threads_role, 30, 0},
    {"reconnect_on_same_listen_comm_and_close_in_flight", reconnect_recv, reconnect_send, 30, 0},
    {"killed_peer_gives_econnreset_within_bound", killed_recv, killed_send, 40, 1},
    {"connect_times_out_when_never_accepted", timeout_recv, timeout_send, 30, 0},
    {"bad_arguments_einval_nothing_written", badargs_recv, badargs_send, 30, 0},
    {"accept_drops_a_caller_that_is_not_our_peer_and_keeps_listening", foreign_recv, foreign_send, 30, 0},
    {"accept_drops_a_silent_caller_at_the_connect_timeout_and_keeps_listening", silent_recv, silent_send, 30, 0},
    {"connect_starts_over_when_its_handle_buffer_holds_another_handle", handle_change_recv, handle_change_send, 30, 0},
    {"fini_with_a_comm_still_open_stops_its_threads_first", fini_open_role, fini_open_role, 30, 0},
    {NULL, NULL, NULL, 0, 0},
};
