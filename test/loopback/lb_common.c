#include "lb.h"
#include "mk_param.h"

#include "mk_config.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double lb_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void* lb_alloc(size_t len) {
  void* p = NULL;
  if (posix_memalign(&p, 4096, len ? len : 1) != 0) {
    fprintf(stderr, "out of memory (%zu bytes)\n", len);
    exit(1);
  }
  return p;
}

static void pipe_write(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n <= 0 && errno != EINTR) exit(1);
    if (n > 0) { p += n; len -= (size_t)n; }
  }
}

static void pipe_read(int fd, void* buf, size_t len) {
  char* p = buf;
  while (len) {
    ssize_t n = read(fd, p, len);
    if (n == 0) { fprintf(stderr, "peer process went away\n"); exit(1); }
    if (n < 0 && errno != EINTR) exit(1);
    if (n > 0) { p += n; len -= (size_t)n; }
  }
}

void lb_tell(struct lb_ctx* ctx, uint64_t v) { pipe_write(ctx->to_peer, &v, sizeof(v)); }

int lb_peer_spoke(struct lb_ctx* ctx) {
  struct pollfd p = {.fd = ctx->from_peer, .events = POLLIN};
  return poll(&p, 1, 0) > 0;
}

uint64_t lb_hear(struct lb_ctx* ctx) {
  uint64_t v;
  pipe_read(ctx->from_peer, &v, sizeof(v));
  return v;
}

void lb_tell_handle(struct lb_ctx* ctx, const unsigned char* handle) {
  pipe_write(ctx->to_peer, handle, MK_HANDLE_MAX);
}

int lb_hear_handle(struct lb_ctx* ctx) {
  pipe_read(ctx->from_peer, ctx->handle, sizeof(ctx->handle));
  return 0;
}

int lb_accept(struct lb_ctx* ctx) {
  int rc = ctx->ops->listen(ctx->dev, ctx->handle, &ctx->listen_comm);
  if (rc) return rc;
  lb_tell_handle(ctx, ctx->handle);
  return lb_reconnect(ctx);
}

int lb_connect(struct lb_ctx* ctx) {
  lb_hear_handle(ctx);
  return lb_reconnect(ctx);
}

int lb_reconnect(struct lb_ctx* ctx) {
  int rc = 0;
  ctx->comm = NULL;
  while (rc == 0 && !ctx->comm)
    rc = ctx->is_sender ? ctx->ops->connect(ctx->dev, ctx->handle, -1, &ctx->comm)
                        : ctx->ops->accept(ctx->listen_comm, &ctx->comm);
  return rc;
}

void lb_set_param(const char* name, const char* value) {
  setenv(name, value, 1);
  mk_param_reload();
}

int lb_close(struct lb_ctx* ctx) {
  int rc = ctx->comm ? ctx->ops->close(ctx->comm) : 0;
  ctx->comm = NULL;
  if (ctx->listen_comm) ctx->ops->close_listen(ctx->listen_comm);
  ctx->listen_comm = NULL;
  return rc;
}

int lb_wait(struct lb_ctx* ctx, struct mk_request* req, size_t* sizes) {
  int done = 0, rc = 0;
  while (!done && rc == 0) rc = ctx->ops->test(req, &done, sizes);
  return rc;
}

/* After a "not now" of a call first asked at *t0 (< 0: not yet read, read now): whether to ask
 * again. The clock is read only once a call went back, so a send that is taken at once (the
 * benchmarks' timed ones) costs no clock read. */
static int lb_ask_again(double* t0, double seconds) {
  const double now = lb_now();
  if (*t0 < 0) *t0 = now;
  return now - *t0 < seconds;
}

int lb_send_within(struct lb_ctx* ctx, void* buf, size_t size, int tag, struct mk_mr* mr,
                   double seconds, struct mk_request** req) {
  double t0 = -1;
  int rc;
  *req = NULL;
  while ((rc = ctx->ops->isend(ctx->comm, buf, size, tag, mr, req)) == 0 && !*req && lb_ask_again(&t0, seconds)) {}
  return rc;
}

int lb_recv_within(struct lb_ctx* ctx, int n, void** bufs, const size_t* sizes, const int* tags,
                   struct mk_mr** mrs, double seconds, struct mk_request** req) {
  double t0 = -1;
  int rc;
  *req = NULL;
  while ((rc = ctx->ops->irecv(ctx->comm, n, bufs, sizes, tags, mrs, 0, req)) == 0 && !*req &&
         lb_ask_again(&t0, seconds)) {}
  return rc;
}

int lb_send(struct lb_ctx* ctx, void* buf, size_t size, int tag, struct mk_mr* mr,
            struct mk_request** req) {
  return lb_send_within(ctx, buf, size, tag, mr, HUGE_VAL, req);
}

int lb_recv(struct lb_ctx* ctx, int n, void** bufs, const size_t* sizes, const int* tags,
            struct mk_mr** mrs, struct mk_request** req) {
  return lb_recv_within(ctx, n, bufs, sizes, tags, mrs, HUGE_VAL, req);
}

/* splitmix64 over (seed, stream, word index): cheap, fast, and seekable. */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void lb_fill(void* buf, size_t len, uint64_t seed, uint64_t stream) {
  uint64_t base = mix(seed ^ mix(stream));
  unsigned char* p = buf;
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w = mix(base + i);
    memcpy(p + i, &w, 8);
  }
  uint64_t w = mix(base + i);
  memcpy(p + i, &w, len - i);
}

int lb_check_quiet(const void* buf, size_t len, uint64_t seed, uint64_t stream) {
  uint64_t base = mix(seed ^ mix(stream));
  const unsigned char* p = buf;
  for (size_t i = 0; i < len; i += 8) {
    uint64_t w = mix(base + i);
    if (memcmp(p + i, &w, len - i < 8 ? len - i : 8) != 0) return 0;
  }
  return 1;
}

size_t lb_check(const void* buf, size_t len, uint64_t seed, uint64_t stream, const char* what) {
  uint64_t base = mix(seed ^ mix(stream));
  const unsigned char* p = buf;
  size_t bad = 0, first = (size_t)-1;
  for (size_t i = 0; i < len; i += 8) {
    uint64_t w = mix(base + i);
    size_t n = len - i < 8 ? len - i : 8;
    if (memcmp(p + i, &w, n) == 0) continue;
    const unsigned char* e = (const unsigned char*)&w;
    for (size_t k = 0; k < n; k++)
      if (p[i + k] != e[k]) {
        if (first == (size_t)-1) first = i + k;
        bad++;
      }
  }
  if (bad)
    fprintf(stderr, "%s: %zu wrong byte(s) of %zu, first at offset %zu\n", what, bad, len, first);
  return bad;
}

/* The harness's own knobs (LB_SEED, LB_DEV, LB_BENCH_*...): read here only. The library's
 * NCCL_MK_* variables go through the registry like everywhere else. */
const char* lb_env(const char* name) { return getenv(name); }

size_t lb_env_size(const char* name, size_t def) {
  const char* v = lb_env(name);
  return v ? (size_t)strtoull(v, NULL, 0) : def;
}

/* The transport under test: NCCL_MK_TRANSPORT=ib runs the same cases over verbs. */
const struct mk_transport_ops* lb_transport(void) {
  const char* t = mk_param_str(MK_PARAM_TRANSPORT);
#if MK_HAVE_VERBS
  if (strcasecmp(t, "ib") == 0) return &mk_ib_ops;
#endif
#if MK_HAVE_OFI
  if (strcasecmp(t, "ofi") == 0 || strcasecmp(t, "auto") == 0) return &mk_ofi_ops;
#endif
  return NULL;
}

static int lb_role(const struct lb_case* c, struct lb_ctx* ctx) {
  int rc = ctx->ops->init();
  if (rc == -ENODEV) return 77;
  if (rc) return 1;
  int ndev = 0;
  if (ctx->ops->devices(&ndev) || ndev < 1) return 77;
  rc = (ctx->is_sender ? c->sender : c->receiver)(ctx);
  ctx->ops->fini();
  return rc;
}

static int lb_reap(const struct lb_case* c, pid_t child, int parent_rc) {
  int status = 0;
  if (waitpid(child, &status, 0) < 0) return 1;
  if (parent_rc == 77) {
    fprintf(stderr, "SKIP: no usable %s device here (or the case needs what this machine lacks)\n",
            lb_transport()->name);
    return 77;
  }
  if (WIFSIGNALED(status) && !c->child_may_die) {
    fprintf(stderr, "sender died of signal %d%s\n", WTERMSIG(status),
            WTERMSIG(status) == SIGALRM ? " (watchdog: it hung)" : "");
    return 1;
  }
  int child_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  if (parent_rc == 77 || child_rc == 77) {
    fprintf(stderr, "SKIP: no usable %s device here (or the case needs what this machine lacks)\n",
            lb_transport()->name);
    return 77;
  }
  return parent_rc || child_rc ? 1 : 0;
}

int lb_ofi_streams(void) {
  int set = (int)mk_param_int(MK_PARAM_OFI_STREAMS);
#if MK_HAVE_OFI
  if (set <= 0) return mk_ofi_auto_streams(mk_param_str(MK_PARAM_OFI_PROVIDER));
#endif
  return set > 0 ? set : 1;
}

int lb_ofi_progress_thread(void) {
#if MK_HAVE_OFI
  return mk_ofi_progress_thread_on(mk_param_str(MK_PARAM_OFI_PROVIDER)) != 0;
#else
  return 0;
#endif
}

int lb_run(const struct lb_case* c) {
  setenv("NCCL_MK_SOCKET_IFNAME", "lo", 0);
  setenv("NCCL_MK_OFI_PROVIDER", "tcp;ofi_rxm", 0);
  const struct mk_transport_ops* ops = lb_transport();
  if (!ops) {
    fprintf(stderr, "SKIP: transport %s is not built into this library\n",
            mk_param_str(MK_PARAM_TRANSPORT));
    return 77;
  }
  const char* s = lb_env("LB_SEED");
  uint64_t seed = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
  printf("case %s: seed %llu (rerun with LB_SEED=%llu)\n", c->name, (unsigned long long)seed,
         (unsigned long long)seed);
  fflush(stdout);
  int p2c[2], c2p[2];
  if (pipe(p2c) || pipe(c2p)) return 1;
  struct lb_ctx ctx = {.ops = ops, .seed = seed};
  pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed parent */
    alarm((unsigned)c->timeout_s);
    ctx.is_sender = 1;
    ctx.to_peer = c2p[1];
    ctx.from_peer = p2c[0];
    close(p2c[1]);
    close(c2p[0]);
    _exit(lb_role(c, &ctx));
  }
  alarm((unsigned)c->timeout_s + 5);
  ctx.child = child;
  ctx.to_peer = p2c[1];
  ctx.from_peer = c2p[0];
  close(p2c[0]);
  close(c2p[1]);
  int rc = lb_role(c, &ctx);
  if (rc == 1) kill(child, SIGKILL); /* a failed receiver must not leave its sender waiting */
  rc = lb_reap(c, child, rc);
  printf("case %s: %s\n", c->name, rc == 0 ? "PASS" : rc == 77 ? "SKIP" : "FAIL");
  return rc;
}

void lb_tell_rkey(struct lb_ctx* ctx, const struct mk_rkey* k) {
  lb_tell(ctx, k->base);
  lb_tell(ctx, k->key);
  lb_tell(ctx, k->size);
}

struct mk_rkey lb_hear_rkey(struct lb_ctx* ctx) {
  struct mk_rkey k;
  k.base = lb_hear(ctx);
  k.key = lb_hear(ctx);
  k.size = lb_hear(ctx);
  return k;
}

int lb_cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* The reverse comm: this side listens, the peer connects (handle through the pipe). */
int lb_open_reverse(struct lb_ctx* ctx, void** lc, struct mk_comm** back) {
  unsigned char h[MK_HANDLE_MAX];
  *back = NULL;
  if (ctx->is_sender) {
    LB_OK(ctx->ops->listen(ctx->dev, h, lc));
    for (size_t off = 0; off < sizeof(h); off += 8) {
      uint64_t w;
      memcpy(&w, h + off, 8);
      lb_tell(ctx, w);
    }
    while (!*back) LB_OK(ctx->ops->accept(*lc, back));
  } else {
    for (size_t off = 0; off < sizeof(h); off += 8) {
      uint64_t w = lb_hear(ctx);
      memcpy(h + off, &w, 8);
    }
    while (!*back) LB_OK(ctx->ops->connect(ctx->dev, h, -1, back));
  }
  return 0;
}

/* The eager cases' helpers (lb_eager.c, lb_unannounced.c). */
void lb_eager_on(void) {
  lb_set_param("NCCL_MK_OFI_EAGER_BYTES", "16384");
}

size_t lb_eager_bytes(void) {
  return (size_t)mk_param_int(MK_PARAM_OFI_EAGER_BYTES);
}

int lb_recv_check(struct lb_ctx* ctx, size_t cap, size_t len, uint64_t stream, int tag) {
  unsigned char* buf = lb_alloc(cap + 1);
  memset(buf, 0xee, cap + 1);
  void* d = buf;
  size_t got = 0;
  struct mk_request* req;
  LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
  LB_OK(lb_wait(ctx, req, &got));
  if (got != len)
    fprintf(stderr, "  message %llu: got %zu bytes, sent %zu\n", (unsigned long long)stream, got,
            len);
  LB_EXPECT(got == len);
  LB_EXPECT(lb_check(buf, len, ctx->seed, stream, "eager payload") == 0);
  LB_EXPECT(buf[len] == 0xee);
  free(buf);
  return 0;
}

int lb_send_start(struct lb_ctx* ctx, size_t len, uint64_t stream, int tag, unsigned char** buf,
                  struct mk_request** req) {
  *buf = lb_alloc(len);
  lb_fill(*buf, len, ctx->seed, stream);
  return lb_send(ctx, *buf, len, tag, NULL, req);
}

int lb_send_whole(struct lb_ctx* ctx, size_t len, uint64_t stream, int tag) {
  unsigned char* b;
  struct mk_request* r;
  LB_OK(lb_send_start(ctx, len, stream, tag, &b, &r));
  int rc = lb_wait(ctx, r, NULL);
  free(b);
  return rc;
}

int lb_warm(struct lb_ctx* ctx) {
  if (!ctx->is_sender) return lb_recv_check(ctx, 64, 8, 777, 0);
  return lb_send_whole(ctx, 8, 777, 0);
}
