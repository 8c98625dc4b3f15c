/* The proxy loopback cases' shared setup (lb_px.h). */
#include "lb_px.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int count_threads(void) {
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
int thread_gone_within(int tid, double seconds) {
  double t0 = lb_now();
  while (thread_alive(tid)) {
    if (lb_now() - t0 > seconds) return 0;
    usleep(1000);
  }
  return 1;
}

int px_make(struct px* x, int rank, int nranks, int dev, uint32_t depth, int inflight, size_t data_bytes,
            size_t nflags) {
  x->rank = rank;
  x->peer = 1 - rank; /* the 2-rank cases' one peer */
  x->q = lb_alloc(mk_proxy_queue_bytes(depth));
  const int rc = mk_proxy_queue_init(x->q, depth);
  if (rc) return rc;
  mk_proxy_producer_init(&x->prod, x->q, x->rank);
  x->data_bytes = data_bytes;
  x->data = lb_alloc(data_bytes);
  memset(x->data, 0, data_bytes);
  x->flags_bytes = nflags * 8;
  x->flags = lb_alloc(x->flags_bytes);
  memset(x->flags, 0, x->flags_bytes);
  unsigned char remote[PX_MAX_RANKS] = {1, 1, 1}; /* NCCL_MK_LOCAL_SIZE=1: every peer is remote */
  struct mk_proxy_conf conf = {
      .ops = x->ops,
      .dev = dev,
      .rank = x->rank,
      .nranks = nranks,
      .remote = remote,
      .data = x->data,
      .data_bytes = data_bytes,
      .data_type = MK_PTR_HOST,
      .flags = x->flags,
      .flags_bytes = x->flags_bytes,
      .flags_type = MK_PTR_HOST | MK_PTR_FORCE_SO, /* as the fused ops register their flags */
      .queue = x->q,
      .max_inflight = inflight,
      .inflight_bytes = x->inflight_bytes};
  return mk_proxy_create(&conf, &x->p);
}

void px_tell(struct lb_ctx* ctx, const void* buf, size_t len) { tell_bytes(ctx, buf, len); }
void px_hear(struct lb_ctx* ctx, void* buf, size_t len) { hear_bytes(ctx, buf, len); }

int px_setup(struct lb_ctx* ctx, struct px* x, uint32_t depth, int inflight, size_t data_bytes,
             size_t nflags) {
  LB_OK(px_make(x, ctx->is_sender ? 1 : 0, 2, ctx->dev, depth, inflight, data_bytes, nflags));
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

void px_free(struct px* x) {
  free(x->q);
  free(x->data);
  free(x->flags);
}
