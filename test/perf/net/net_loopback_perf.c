/*
 * Transport loopback benchmark (not a test): two processes on one host; for each size the
 * same transfers go (a) through our transport (isend/irecv, a window of messages in flight)
 * and (b) through a plain TCP socket pair between the same two processes, interleaved
 * iteration by iteration. Prints GB/s (median, min-max over >= 20 iterations), the ratio,
 * and ping-pong latency for small messages.
 * Usage: net_loopback_perf [iterations] [streams[:eager],...] [max bytes]
 * With a list of variants (e.g. 1,2,4 or 1:0,1:65536), "ours" is measured once per variant,
 * each on a comm pair created with NCCL_MK_OFI_STREAMS (and NCCL_MK_OFI_EAGER_BYTES, when
 * given after a colon) set to it, all interleaved iteration by iteration with the socket
 * pair, so the variants see the same machine load. Sizes go from 8 B to max bytes (256 MiB).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lb.h"
#include "mk_param.h"
#include "sock.h"

#define MAX_WINDOW 8
#define MAX_VARIANTS 4
#define SOCK_TIMEOUT_MS 60000

static int iters = 20;
static int nvariants = 1;
static int variant_streams[MAX_VARIANTS] = {0}; /* 0: whatever the environment says */
static long variant_eager[MAX_VARIANTS] = {-1, -1, -1, -1}; /* -1: the environment's */
static size_t max_bytes = 256u << 20;

struct perf {
  struct mk_comm* fwd[MAX_VARIANTS]; /* sender -> receiver, one per stream count */
  void* fwd_listen[MAX_VARIANTS];
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
  double ours[MAX_VARIANTS][256], sock[256];
  for (int i = 0; i < w; i++) {
    p->buf[i] = lb_alloc(s);
    memset(p->buf[i], i + 1, s);
    LB_OK(ctx->ops->reg_mr(ctx->comm, p->buf[i], s, MK_PTR_HOST, &p->mr[i]));
  }
  for (int it = -2; it < iters; it++) { /* two warm-up iterations */
    for (int v = 0; v < nvariants; v++) {
      ctx->comm = p->fwd[v];
      double t0 = lb_now();
      LB_OK(ours_iter(ctx, p, s, w, reps));
      if (it >= 0) ours[v][it] = (double)s * w * reps / (lb_now() - t0) / 1e9;
    }
    double t1 = lb_now();
    LB_OK(sock_iter(ctx, p, s, w, reps));
    if (it >= 0) sock[it] = (double)s * w * reps / (lb_now() - t1) / 1e9;
  }
  ctx->comm = p->fwd[0];
  if (ctx->is_sender) {
    printf("%12zu %3d", s, w);
    for (int v = 0; v < nvariants; v++) report("ours", ours[v], iters, 1);
    report("sock", sock, iters, 1);
    for (int v = 0; v < nvariants; v++) printf(" %6.2f", ours[v][iters / 2] / sock[iters / 2]);
    printf("\n");
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
  double ours[MAX_VARIANTS][256], sock[256];
  uint64_t v = 0;
  for (int it = -2; it < iters; it++) {
    for (int x = 0; x < nvariants; x++) {
      double t0 = lb_now();
      for (int k = 0; k < 100; k++) {
        LB_OK(small_msg(ctx, p->fwd[x], ctx->is_sender));
        LB_OK(small_msg(ctx, p->back, !ctx->is_sender));
      }
      if (it >= 0) ours[x][it] = (lb_now() - t0) / 200 * 1e6;
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
    if (it >= 0) sock[it] = (lb_now() - t1) / 200 * 1e6;
  }
  if (ctx->is_sender) {
    printf("\n# latency, 8-byte ping-pong, half round trip (us): median [min-max]");
    for (int x = 0; x < nvariants; x++) {
      printf("\n# ours s=%d", variant_streams[x]);
      if (variant_eager[x] >= 0) printf(" e=%ld", variant_eager[x]);
      report("ours", ours[x], iters, 1);
    }
    printf("\n#    socket");
    report("sock", sock, iters, 1);
    printf("\n");
    fflush(stdout); /* the sender leaves through _exit */
  }
  return 0;
}

/* Second transport comm in the other direction, and the socket pair. */
/* NCCL_MK_OFI_STREAMS and _EAGER_BYTES are read when a comm is created: set them around
 * each creation (the receiver's eager size binds both ends). */
static void use_streams(int v) {
  char n[32];
  if (variant_streams[v]) {
    snprintf(n, sizeof(n), "%d", variant_streams[v]);
    setenv("NCCL_MK_OFI_STREAMS", n, 1);
  }
  if (variant_eager[v] >= 0) {
    snprintf(n, sizeof(n), "%ld", variant_eager[v]);
    setenv("NCCL_MK_OFI_EAGER_BYTES", n, 1);
  }
  mk_param_reload();
}

static int fwd_setup(struct lb_ctx* ctx, struct perf* p) {
  for (int v = 0; v < nvariants; v++) {
    use_streams(v);
    LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
    p->fwd[v] = ctx->comm;
    p->fwd_listen[v] = ctx->listen_comm;
    ctx->listen_comm = NULL;
  }
  ctx->comm = p->fwd[0];
  return 0;
}

static int perf_setup(struct lb_ctx* ctx, struct perf* p) {
  uint64_t w;
  LB_OK(fwd_setup(ctx, p));
  if (ctx->is_sender) {
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
           mk_param_str(MK_PARAM_OFI_PROVIDER), iters);
    printf("# GB/s = 1e9 bytes/s, median [min-max]; win = messages in flight\n");
    printf("# columns: size, win, ours per variant (streams[:eager bytes] ");
    for (int v = 0; v < nvariants; v++) {
      printf("%s%d", v ? "," : "", variant_streams[v]);
      if (variant_eager[v] >= 0) printf(":%ld", variant_eager[v]);
    }
    printf("; 0 = environment), socket, then ours/socket per variant\n");
  }
  for (size_t s = 8; s <= max_bytes; s = s == (128u << 20) ? (256u << 20) : s * 4)
    LB_OK(bandwidth(ctx, &p, s));
  LB_OK(latency(ctx, &p));
  close(p.fd);
  ctx->ops->close(p.back);
  if (p.back_listen) ctx->ops->close_listen(p.back_listen);
  for (int v = 0; v < nvariants; v++) {
    ctx->ops->close(p.fwd[v]);
    if (p.fwd_listen[v]) ctx->ops->close_listen(p.fwd_listen[v]);
  }
  ctx->comm = NULL;
  return 0;
}

/* "1,2,4" or "1:0,1:65536" -> variant_streams, variant_eager */
static void parse_streams(const char* list) {
  nvariants = 0;
  for (const char* q = list; *q && nvariants < MAX_VARIANTS;) {
    char* end;
    long n = strtol(q, &end, 10);
    long e = -1;
    if (*end == ':') e = strtol(end + 1, &end, 10);
    if (n >= 1 && n <= 8 && e >= -1) {
      variant_streams[nvariants] = (int)n;
      variant_eager[nvariants++] = e;
    }
    q = *end == ',' ? end + 1 : end;
    if (end == q && *q) q++;
  }
  if (!nvariants) nvariants = 1, variant_streams[0] = 0;
}

int main(int argc, char** argv) {
  if (argc > 1) iters = atoi(argv[1]);
  if (iters < 1 || iters > 256) iters = 20;
  if (argc > 2) parse_streams(argv[2]);
  if (argc > 3 && atol(argv[3]) >= 8) max_bytes = (size_t)atol(argv[3]);
  struct lb_case c = {"net_loopback_perf", perf_role, perf_role, 1200, 0};
  return lb_run(&c);
}
