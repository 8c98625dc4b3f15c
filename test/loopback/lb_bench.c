/* Benchmarks over the loopback harness (not part of the test suites; scripts/rxe-vm.sh bench
 * runs them beside perftest). LB_BENCH_SIZE bytes, LB_BENCH_ITERS messages.
 *  bench_bw:  the receiver keeps LB_BENCH_WINDOW receives posted, the sender streams; the
 *             sender prints MiB/s from its first isend to its last completion; with
 *             LB_BENCH_RECV_SIZE the receives are that large (NCCL posts whole step slots).
 *  bench_lat: ping-pong over two comms (one each way), receives pre-posted; prints the
 *             median and mean of round trip / 2 in microseconds, like ib_write_lat (any
 *             LB_BENCH_SIZE: the per-message cost of the middle sizes too).
 *  bench_put_bw: one-sided puts (or put+signals) with a window, the proxy's path. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>

#include "lb.h"

/* Like lb_wait, but yields the CPU between polls, as NCCL's progress thread does when idle:
 * on a small VM the soft-RoCE kernel work needs the same CPUs. */
static int bench_wait(struct lb_ctx* ctx, struct mk_request* req) {
  static int spin = -1;
  if (spin < 0) spin = lb_env("LB_BENCH_SPIN") != NULL;
  int done = 0, rc = 0;
  while (!done && rc == 0) {
    rc = ctx->ops->test(req, &done, NULL);
    if (!done && !spin) sched_yield();
  }
  return rc;
}

/* What a windowed benchmark posts: message m into window slot w (bench_window). */
struct bench_op {
  int (*post)(const struct bench_op* op, size_t m, int w, struct mk_request** req);
  struct lb_ctx* ctx;
  unsigned char* buf;
  size_t len;
  struct mk_mr* mr;
  const struct mk_rkey* rkey; /* puts */
  int signal;                 /* puts: put+signal */
};

/* Keeps `window` operations in flight until `iters` have completed; *seconds from the first
 * post to the last completion. */
static int bench_window(const struct bench_op* op, size_t iters, int window, double* seconds) {
  struct mk_request** reqs = calloc((size_t)window, sizeof(*reqs));
  int rc = reqs ? 0 : -ENOMEM;
  const double t0 = lb_now();
  for (size_t m = 0; !rc && m < iters + (size_t)window; m++) {
    int w = (int)(m % (size_t)window);
    if (m >= (size_t)window) rc = bench_wait(op->ctx, reqs[w]);
    if (!rc && m < iters) rc = op->post(op, m, w, &reqs[w]);
  }
  *seconds = lb_now() - t0;
  free(reqs);
  return rc;
}

/* bench_window after one untimed window: a stream's fabric connection forms on its first
 * message and the provider grows its buffer pools then (tens of ms per stream over tcp,
 * bench/NOTES.md session 47), which is not the rate. */
static int bench_window_warm(const struct bench_op* op, size_t iters, int window, double* seconds) {
  double warm;
  int rc = bench_window(op, (size_t)window, window, &warm);
  return rc ? rc : bench_window(op, iters, window, seconds);
}

static int recv_post(const struct bench_op* op, size_t m, int w, struct mk_request** req) {
  (void)m;
  void* d = op->buf + (size_t)w * op->len;
  size_t len = op->len;
  int tag = 0;
  struct mk_mr* mr = op->mr;
  return lb_recv(op->ctx, 1, &d, &len, &tag, &mr, req);
}

static int send_post(const struct bench_op* op, size_t m, int w, struct mk_request** req) {
  (void)m, (void)w;
  return lb_send(op->ctx, op->buf, op->len, 0, op->mr, req);
}

static int bw_recv(struct lb_ctx* ctx) {
  size_t iters = lb_env_size("LB_BENCH_ITERS", 200);
  /* LB_BENCH_RECV_SIZE: buffers larger than the messages, as NCCL posts a whole step's slot */
  size_t len = lb_env_size("LB_BENCH_RECV_SIZE", lb_env_size("LB_BENCH_SIZE", 1 << 20));
  int window = (int)lb_env_size("LB_BENCH_WINDOW", 32);
  LB_OK(lb_accept(ctx));
  unsigned char* buf = lb_alloc(len * (size_t)window);
  struct mk_mr* mr;
  LB_OK(ctx->ops->reg_mr(ctx->comm, buf, len * (size_t)window, MK_PTR_HOST, &mr));
  const struct bench_op op = {.post = recv_post, .ctx = ctx, .buf = buf, .len = len, .mr = mr};
  double dt;
  LB_OK(bench_window_warm(&op, iters, window, &dt));
  lb_tell(ctx, 1);
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(buf);
  return lb_close(ctx);
}

static int bw_send(struct lb_ctx* ctx) {
  size_t len = lb_env_size("LB_BENCH_SIZE", 1 << 20), iters = lb_env_size("LB_BENCH_ITERS", 200);
  int window = (int)lb_env_size("LB_BENCH_WINDOW", 32);
  LB_OK(lb_connect(ctx));
  unsigned char* buf = lb_alloc(len);
  memset(buf, 3, len);
  struct mk_mr* mr;
  LB_OK(ctx->ops->reg_mr(ctx->comm, buf, len, MK_PTR_HOST, &mr));
  const struct bench_op op = {.post = send_post, .ctx = ctx, .buf = buf, .len = len, .mr = mr};
  double dt;
  LB_OK(bench_window_warm(&op, iters, window, &dt));
  printf("BENCH mk_bw %zu %.1f\n", len, (double)len * (double)iters / dt / 1048576.0);
  fflush(stdout);
  LB_EXPECT(lb_hear(ctx) == 1);
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(buf);
  return lb_close(ctx);
}

/* bench_put_bw: the one-sided path the cross-node proxy drives. The target registers a
 * LB_BENCH_SIZE region and progresses until told; the initiator keeps LB_BENCH_WINDOW puts (with
 * LB_BENCH_SIGNAL=1 put+signals) of it in flight and prints MiB/s from its first post to its
 * last completion, beside bench_bw's two-sided figure for the same size. */
static int put_bw_target(struct lb_ctx* ctx) {
  size_t len = lb_env_size("LB_BENCH_SIZE", 1 << 20);
  LB_OK(lb_accept(ctx));
  unsigned char* region = lb_alloc(len + 4096);
  struct mk_mr* mr;
  struct mk_rkey k;
  LB_OK(ctx->ops->reg_mr(ctx->comm, region, len + 4096, MK_PTR_HOST, &mr));
  LB_OK(ctx->ops->mr_rkey(mr, &k));
  lb_tell_rkey(ctx, &k);
  while (!lb_peer_spoke(ctx)) LB_OK(ctx->ops->progress(ctx->comm)); /* lands the writes */
  LB_EXPECT(lb_hear(ctx) == 1);
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(region);
  return lb_close(ctx);
}

/* One put (or put+signal, the flag just past the data, value m + 1) of the whole region,
 * retried while the transport says "not now". */
static int put_post(const struct bench_op* op, size_t m, int w, struct mk_request** req) {
  (void)w;
  const struct mk_transport_ops* ops = op->ctx->ops;
  struct mk_comm* c = op->ctx->comm;
  *req = NULL;
  while (!*req) {
    const int rc = op->signal ? ops->iput_signal(c, op->buf, op->len, op->mr, op->rkey, 0, op->rkey, op->len,
                                                 m + 1, req)
                              : ops->iput(c, op->buf, op->len, op->mr, op->rkey, 0, req);
    if (rc) return rc;
  }
  return 0;
}

static int put_bw_initiator(struct lb_ctx* ctx) {
  size_t len = lb_env_size("LB_BENCH_SIZE", 1 << 20), iters = lb_env_size("LB_BENCH_ITERS", 200);
  int window = (int)lb_env_size("LB_BENCH_WINDOW", 16),
      signal = lb_env_size("LB_BENCH_SIGNAL", 0) != 0;
  LB_OK(lb_connect(ctx));
  struct mk_rkey k = lb_hear_rkey(ctx);
  unsigned char* buf = lb_alloc(len);
  memset(buf, 5, len);
  struct mk_mr* mr;
  LB_OK(ctx->ops->reg_mr(ctx->comm, buf, len, MK_PTR_HOST, &mr));
  const struct bench_op op = {.post = put_post, .ctx = ctx, .buf = buf, .len = len, .mr = mr, .rkey = &k,
                              .signal = signal};
  double dt;
  LB_OK(bench_window_warm(&op, iters, window, &dt));
  printf("BENCH mk_put%s_bw %zu %.1f\n", signal ? "_signal" : "", len, (double)len * (double)iters / dt / 1048576.0);
  fflush(stdout);
  lb_tell(ctx, 1);
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(buf);
  return lb_close(ctx);
}

/* One side of the ping-pong: `rx` receives, `tx` sends; the initiator sends first. */
static int lat_side(struct lb_ctx* ctx, struct mk_comm* rx, struct mk_comm* tx, int initiator) {
  size_t len = lb_env_size("LB_BENCH_SIZE", 2), iters = lb_env_size("LB_BENCH_ITERS", 1000);
  /* the first round trips pay connection set-up (rxm connects on first use): not counted */
  const size_t warm = lb_env_size("LB_BENCH_WARMUP", 20);
  const size_t cap = len < 4096 ? 4096 : len; /* messages of any size: the per-message cost */
  unsigned char* sbuf = calloc(1, cap);
  unsigned char* rbuf = calloc(1, cap);
  struct mk_mr *smr, *rmr;
  if (!sbuf || !rbuf) return 1;
  LB_OK(ctx->ops->reg_mr(tx, sbuf, cap, MK_PTR_HOST, &smr));
  LB_OK(ctx->ops->reg_mr(rx, rbuf, cap, MK_PTR_HOST, &rmr));
  double* t = calloc(iters + warm, sizeof(double));
  double* tpost = calloc(iters + warm, sizeof(double)); /* inside isend: the caller's cost */
  struct mk_request *rreq = NULL, *sreq = NULL;
  int tag = 0;
  void* d = rbuf;
  struct mk_comm* keep = ctx->comm;
  ctx->comm = rx;
  LB_OK(lb_recv(ctx, 1, &d, &len, &tag, &rmr, &rreq));
  for (size_t i = 0; i < iters + warm; i++) {
    double t0 = lb_now();
    if (!initiator) {
      ctx->comm = rx;
      LB_OK(bench_wait(ctx, rreq));
      if (i + 1 < iters + warm) LB_OK(lb_recv(ctx, 1, &d, &len, &tag, &rmr, &rreq));
    }
    ctx->comm = tx;
    const double tp = lb_now();
    LB_OK(lb_send(ctx, sbuf, len, 0, smr, &sreq));
    tpost[i] = (lb_now() - tp) * 1e6;
    LB_OK(bench_wait(ctx, sreq));
    if (initiator) {
      ctx->comm = rx;
      LB_OK(bench_wait(ctx, rreq));
      if (i + 1 < iters + warm) LB_OK(lb_recv(ctx, 1, &d, &len, &tag, &rmr, &rreq));
    }
    t[i] = (lb_now() - t0) * 1e6 / 2;
  }
  memmove(t, t + warm, iters * sizeof(double));
  memmove(tpost, tpost + warm, iters * sizeof(double));
  if (initiator) {
    double sum = 0;
    for (size_t i = 0; i < iters; i++) sum += t[i];
    qsort(t, iters, sizeof(double), lb_cmp_double);
    qsort(tpost, iters, sizeof(double), lb_cmp_double);
    /* size, median, mean, p90, p99, then the median time inside the send's post */
    printf("BENCH mk_lat %zu %.2f %.2f %.2f %.2f %.2f\n", len, t[iters / 2], sum / (double)iters,
           t[iters * 9 / 10], t[iters * 99 / 100], tpost[iters / 2]);
    fflush(stdout);
  }
  free(t);
  free(tpost);
  ctx->ops->dereg_mr(tx, smr);
  ctx->ops->dereg_mr(rx, rmr);
  free(sbuf);
  free(rbuf);
  ctx->comm = keep;
  return 0;
}

static int lat_run(struct lb_ctx* ctx) {
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  void* lc = NULL;
  struct mk_comm* back;
  LB_OK(lb_open_reverse(ctx, &lc, &back));
  int rc = ctx->is_sender ? lat_side(ctx, back, ctx->comm, 1) : lat_side(ctx, ctx->comm, back, 0);
  lb_tell(ctx, 9);
  LB_EXPECT(lb_hear(ctx) == 9);
  ctx->ops->close(back);
  if (lc) ctx->ops->close_listen(lc);
  lb_close(ctx);
  return rc;
}

const struct lb_case lb_cases_bench[] = {
    {"bench_bw", bw_recv, bw_send, 300, 0},
    {"bench_lat", lat_run, lat_run, 300, 0},
    {"bench_put_bw", put_bw_target, put_bw_initiator, 300, 0},
    {NULL, NULL, NULL, 0, 0},
};
