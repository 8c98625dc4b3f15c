/*
 * Transport loopback benchmark (not a test): two processes on one host; for each size the
 * same transfers go (a) through our transport (isend/irecv, a window of messages in flight)
 * and (b) through a plain TCP socket pair between the same two processes, interleaved
 * iteration by iteration. Prints GB/s (median, min-max over >= 20 iterations), the ratio,
 * and ping-pong latency for small messages. Usage: net_loopback_perf [iterations]
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lb.h"
#include "sock.h"

#define MAX_WINDOW 8
#define SOCK_TIMEOUT_MS 60000

static int iters = 20;

struct perf {
  struct mk_comm* back;     /* receiver -> sender: acknowledgements and pongs */
  void* back_listen;
  int fd;                   /* the socket pair */
  unsigned char* buf[MAX_WINDOW];
  struct mk_mr* mr[MAX_WINDOW];
};

static int window_for(size_t s) {
  size_t w = (16u << 20) / (s ? s : 1);
  return w < 1 ? 1 : w > MAX_WINDOW ? MAX_WINDOW : (int)w;
}
static int reps_for(size_t s, int w) {
  size_t r = (4u << 20) / (s * (size_t)w);
  return r < 1 ? 1 : r > 200 ? 200 : (int)r;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* One 8-byte message on comm, in the direction the comm allows. */
static int small_msg(struct lb_ctx* ctx, struct mk_comm* comm, int sending) {
  uint64_t v = 0;
  void* d = &v;
  size_t len = sizeof(v);
  int tag = 0;
  struct mk_comm* keep = ctx->comm;
  struct mk_request* req;
  ctx->comm = comm;
  int rc = sending ? lb_send(ctx, &v, len, 0, NULL, &req) : lb_recv(ctx, 1, &d, &len, &tag, NULL, &req);
  if (rc == 0) rc = lb_wait(ctx, req, NULL);
  ctx->comm = keep;
  return rc;
}

/* Our transport: reps batches of w messages in flight, then an acknowledgement back. */
static int ours_iter(struct lb_ctx* ctx, struct perf* p, size_t s, int w, int reps) {
  struct mk_request* req[MAX_WINDOW];
  int tag = 1;
  for (int r = 0; r < reps; r++) {
    for (int i = 0; i < w; i++) {
      void* d = p->buf[i];
      if (ctx->is_sender) LB_OK(lb_send(ctx, p->buf[i], s, tag, p->mr[i], &req[i]));
      else LB_OK(lb_recv(ctx, 1, &d, &s, &tag, &p->mr[i], &req[i]));
    }
    for (int i = 0; i < w; i++) LB_OK(lb_wait(ctx, req[i], NULL));
  }
  return small_msg(ctx, p->back, !ctx->is_sender);
}

static int sock_iter(struct lb_ctx* ctx, struct perf* p, size_t s, int w, int reps) {
  char ack = 0;
  for (int r = 0; r < reps; r++)
    for (int i = 0; i < w; i++)
      LB_OK(ctx->is_sender ? mk_sock_send_all(p->fd, p->buf[i], s, SOCK_TIMEOUT_MS)
                           : mk_sock_recv_all(p->fd, p->buf[i], s, SOCK_TIMEOUT_MS));
  return ctx->is_sender ? mk_sock_recv_all(p->fd, &ack, 1, SOCK_TIMEOUT_MS)
                        : mk_sock_send_all(p->fd, &ack, 1, SOCK_TIMEOUT_MS);
}

static void report(const char* label, double* v, int n, double scale) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  printf(" %8.3f [%7.3f-%7.3f]", v[n / 2] * scale, v[0] * scale, v[n - 1] * scale);
  (void)label;
}

static int bandwidth(struct lb_ctx* ctx, struct perf* p, size_t s) {
  int w = window_for(s), reps = reps_for(s, w);
  double ours[256], sock[256];
  for (int i = 0; i < w; i++) {
    p->buf[i] = lb_alloc(s);
    memset(p->buf[i], i + 1, s);
    LB_OK(ctx->ops->reg_mr(ctx->comm, p->buf[i], s, MK_PTR_HOST, &p->mr[i]));
  }
  for (int it = -2; it < iters; it++) { /* two warm-up iterations */
    double t0 = lb_now();
    LB_OK(ours_iter(ctx, p, s, w, reps));
    double t1 = lb_now();
    LB_OK(sock_iter(ctx, p, s, w, reps));
    double t2 = lb_now();
    if (it >= 0) {
      ours[it] = (double)s * w * reps / (t1 - t0) / 1e9;
      sock[it] = (double)s * w * reps / (t2 - t1) / 1e9;
    }
  }
  if (ctx->is_sender) {
    qsort(ours, (size_t)iters, sizeof(double), cmp_double);
    qsort(sock, (size_t)iters, sizeof(double), cmp_double);
    printf("%12zu %3d", s, w);
    report("ours", ours, iters, 1);
    report("sock", sock, iters, 1);
    printf(" %6.2f\n", ours[iters / 2] / sock[iters / 2]);
    fflush(stdout);
  }
  for (int i = 0; i < w; i++) {
    LB_OK(ctx->ops->dereg_mr(ctx->comm, p->mr[i]));
    free(p->buf[i]);
  }
  return 0;
}

/* Ping-pong of 8-byte messages; one sample = mean half round trip over 100 exchanges. */
static int latency(struct lb_ctx* ctx, struct perf* p) {
  double ours[256], sock[256];
  uint64_t v = 0;
  for (int it = -2; it < iters; it++) {
    double t0 = lb_now();
    for (int k = 0; k < 100; k++) {
      LB_OK(small_msg(ctx, ctx->comm, ctx->is_sender));
      LB_OK(small_msg(ctx, p->back, !ctx->is_sender));
    }
    double t1 = lb_now();
    for (int k = 0; k < 100; k++) {
      if (ctx->is_sender) {
        LB_OK(mk_sock_send_all(p->fd, &v, 8, SOCK_TIMEOUT_MS));
        LB_OK(mk_sock_recv_all(p->fd, &v, 8, SOCK_TIMEOUT_MS));
      } else {
        LB_OK(mk_sock_recv_all(p->fd, &v, 8, SOCK_TIMEOUT_MS));
        LB_OK(mk_sock_send_all(p->fd, &v, 8, SOCK_TIMEOUT_MS));
      }
    }
    double t2 = lb_now();
    if (it >= 0) {
      ours[it] = (t1 - t0) / 200 * 1e6;
      sock[it] = (t2 - t1) / 200 * 1e6;
    }
  }
  if (ctx->is_sender) {
    printf("\n# latency, 8-byte ping-pong, half round trip (us): median [min-max]\n#      ours");
    report("ours", ours, iters, 1);
    printf("\n#    socket");
    report("sock", sock, iters, 1);
    printf("\n");
    fflush(stdout); /* the sender leaves through _exit */
  }
  return 0;
}

/* Second transport comm in the other direction, and the socket pair. */
static int perf_setup(struct lb_ctx* ctx, struct perf* p) {
  uint64_t w;
  if (ctx->is_sender) {
    LB_OK(lb_connect(ctx));
    unsigned char h[MK_HANDLE_MAX];
    LB_OK(ctx->ops->listen(ctx->dev, h, &p->back_listen));
    for (size_t o = 0; o < sizeof(h); o += 8) memcpy(&w, h + o, 8), lb_tell(ctx, w);
    while (!p->back) LB_OK(ctx->ops->accept(p->back_listen, &p->back));
    struct sockaddr_storage a = {0};
    struct sockaddr_in* in = (struct sockaddr_in*)&a;
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    in->sin_port = htons((uint16_t)lb_hear(ctx));
    LB_OK(mk_sock_connect_start(&a, &p->fd));
    int rc;
    while ((rc = mk_sock_connect_poll(p->fd)) == 0) poll(NULL, 0, 1);
    return rc == 1 ? 0 : 1;
  }
  LB_OK(lb_accept(ctx));
  unsigned char h[MK_HANDLE_MAX];
  for (size_t o = 0; o < sizeof(h); o += 8) w = lb_hear(ctx), memcpy(h + o, &w, 8);
  while (!p->back) LB_OK(ctx->ops->connect(ctx->dev, h, -1, &p->back));
  struct sockaddr_storage a = {0}, bound;
  ((struct sockaddr_in*)&a)->sin_family = AF_INET;
  ((struct sockaddr_in*)&a)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int lfd;
  LB_OK(mk_sock_listen(&a, &lfd, &bound));
  lb_tell(ctx, ntohs(((struct sockaddr_in*)&bound)->sin_port));
  p->fd = -1;
  while (p->fd < 0) {
    struct pollfd pf = {.fd = lfd, .events = POLLIN};
    poll(&pf, 1, 100);
    LB_OK(mk_sock_accept(lfd, &p->fd));
  }
  close(lfd);
  return 0;
}

static int perf_role(struct lb_ctx* ctx) {
  struct perf p = {0};
  LB_OK(perf_setup(ctx, &p));
  if (ctx->is_sender) {
    printf("# nccl-mk transport loopback: ofi (%s) vs a TCP socket pair, %d iterations/point\n",
           getenv("NCCL_MK_OFI_PROVIDER"), iters);
    printf("# GB/s = 1e9 bytes/s, median [min-max]; win = messages in flight\n");
    printf("#       size win   ours GB/s  [   min -    max]  socket GB/s [   min -    max]  ratio\n");
  }
  for (size_t s = 8; s <= (256u << 20); s = s == (128u << 20) ? (256u << 20) : s * 4)
    LB_OK(bandwidth(ctx, &p, s));
  LB_OK(latency(ctx, &p));
  close(p.fd);
  ctx->ops->close(p.back);
  if (p.back_listen) ctx->ops->close_listen(p.back_listen);
  return lb_close(ctx);
}

int main(int argc, char** argv) {
  if (argc > 1) iters = atoi(argv[1]);
  if (iters < 1 || iters > 256) iters = 20;
  struct lb_case c = {"net_loopback_perf", perf_role, perf_role, 1200, 0};
  return lb_run(&c);
}
