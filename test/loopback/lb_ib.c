/* Cases that matter most for the verbs transport (they run over any transport that has the
 * feature, and skip with 77 otherwise): iflush, a virtual device over two devices, and the
 * device vanishing mid-transfer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lb.h"

#define MiB (1024ull * 1024)

static int xfer_recv(struct lb_ctx* ctx, size_t len, uint64_t stream, int flush) {
  unsigned char* buf = lb_alloc(len);
  struct mk_mr* mr = NULL;
  struct mk_request* req;
  size_t got = 0;
  int tag = 2;
  void* d = buf;
  LB_OK(ctx->ops->reg_mr(ctx->comm, buf, len, MK_PTR_HOST, &mr));
  LB_OK(lb_recv(ctx, 1, &d, &len, &tag, &mr, &req));
  LB_OK(lb_wait(ctx, req, &got));
  LB_EXPECT(got == len);
  if (flush) { /* a read-back through the loopback QP; NULL means nothing to wait for */
    int isz = (int)len, zero = 0;
    struct mk_request* f = NULL;
    LB_OK(ctx->ops->iflush(ctx->comm, 1, &d, &isz, &mr, &f));
    if (f) LB_OK(lb_wait(ctx, f, NULL));
    LB_OK(ctx->ops->iflush(ctx->comm, 1, &d, &zero, &mr, &f));
    LB_EXPECT(f == NULL); /* empty receive: no flush */
  }
  LB_EXPECT(lb_check(buf, len, ctx->seed, stream, "payload") == 0);
  LB_OK(ctx->ops->dereg_mr(ctx->comm, mr));
  free(buf);
  return 0;
}

static int xfer_send(struct lb_ctx* ctx, size_t len, uint64_t stream) {
  unsigned char* buf = lb_alloc(len);
  struct mk_request* req;
  lb_fill(buf, len, ctx->seed, stream);
  LB_OK(lb_send(ctx, buf, len, 2, NULL, &req));
  LB_OK(lb_wait(ctx, req, NULL));
  free(buf);
  return 0;
}

static const size_t flush_sizes[] = {1, 4096, 3 * MiB + 17};
static int flush_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  for (int k = 0; k < 3; k++) LB_OK(xfer_recv(ctx, flush_sizes[k], (uint64_t)k, 1));
  return lb_close(ctx);
}
static int flush_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  for (int k = 0; k < 3; k++) LB_OK(xfer_send(ctx, flush_sizes[k], (uint64_t)k));
  return lb_close(ctx);
}

/* Devices 0 and 1 merged into one virtual device: both ends use it, messages go over both. */
static int vdev_pick(struct lb_ctx* ctx) {
  int ndev = 0, devs[2] = {0, 1};
  if (!ctx->ops->make_vdevice || ctx->ops->devices(&ndev) || ndev < 2) {
    fprintf(stderr, "needs make_vdevice and two devices (have %d)\n", ndev);
    return 77;
  }
  LB_OK(ctx->ops->make_vdevice(2, devs, &ctx->dev));
  struct mk_dev_props p;
  LB_OK(ctx->ops->get_properties(ctx->dev, &p));
  printf("  virtual device %d: %s, %d Mbit/s\n", ctx->dev, p.name, p.speed_mbps);
  int bad = devs[0];
  LB_EXPECT(ctx->ops->make_vdevice(0, devs, &bad) == -EINVAL && bad == devs[0]);
  return 0;
}
static const size_t vdev_sizes[] = {0, 100, 65536, 8 * MiB + 3};
static int vdev_recv(struct lb_ctx* ctx) {
  int rc = vdev_pick(ctx);
  if (rc) return rc;
  LB_OK(lb_accept(ctx));
  for (int k = 1; k < 4; k++) LB_OK(xfer_recv(ctx, vdev_sizes[k], (uint64_t)k, 1));
  return lb_close(ctx);
}
static int vdev_send(struct lb_ctx* ctx) {
  int rc = vdev_pick(ctx);
  if (rc) return rc;
  LB_OK(lb_connect(ctx));
  for (int k = 1; k < 4; k++) LB_OK(xfer_send(ctx, vdev_sizes[k], (uint64_t)k));
  return lb_close(ctx);
}

/* LB_DEVICE_REMOVE_CMD runs (in the background: on soft-RoCE `rdma link delete` blocks in the
 * kernel until every process has closed the device) while 8 MiB messages stream over device
 * LB_DEV: both ends must get an error within a bound, not hang, and then close cleanly. */
#define RM_LEN (8 * MiB)
#define RM_BOUND_S 15.0
static int remove_loop(struct lb_ctx* ctx, int is_recv) {
  unsigned char* buf = lb_alloc(RM_LEN);
  memset(buf, 7, RM_LEN);
  const char* cmd = lb_env("LB_DEVICE_REMOVE_CMD");
  double t_rm = 0;
  int rc = 0;
  for (int m = 0; rc == 0 && m < 100000; m++) {
    struct mk_request* req = NULL;
    size_t len = RM_LEN;
    int tag = 1;
    void* d = buf;
    rc = is_recv ? lb_recv(ctx, 1, &d, &len, &tag, NULL, &req) : lb_send(ctx, buf, len, 1, NULL, &req);
    if (rc == 0) rc = lb_wait(ctx, req, NULL);
    if (is_recv && m == 4) {
      printf("  running: %s\n", cmd);
      fflush(stdout);
      t_rm = lb_now();
      char bg[512];
      snprintf(bg, sizeof(bg), "(%s) &", cmd);
      LB_EXPECT(system(bg) == 0);
    }
    if (t_rm && lb_now() - t_rm > RM_BOUND_S) break;
  }
  double dt = t_rm ? lb_now() - t_rm : 0;
  printf("  %s saw rc=%d (%s)%s%.3f s after the removal\n", is_recv ? "receiver" : "sender", rc,
         strerror(-rc), is_recv ? " " : " (sender clock) ", dt);
  free(buf);
  LB_EXPECT(rc < 0);
  if (is_recv) LB_EXPECT(dt < RM_BOUND_S);
  lb_close(ctx); /* closing on a dead device must not crash or hang either */
  return 0;
}
static int remove_recv(struct lb_ctx* ctx) {
  if (!lb_env("LB_DEVICE_REMOVE_CMD")) {
    fprintf(stderr, "set LB_DEVICE_REMOVE_CMD to run this case (the VM does)\n");
    return 77;
  }
  ctx->dev = lb_env("LB_DEV") ? atoi(lb_env("LB_DEV")) : 0;
  LB_OK(lb_accept(ctx));
  return remove_loop(ctx, 1);
}
static int remove_send(struct lb_ctx* ctx) {
  if (!lb_env("LB_DEVICE_REMOVE_CMD")) return 77;
  ctx->dev = lb_env("LB_DEV") ? atoi(lb_env("LB_DEV")) : 0;
  LB_OK(lb_connect(ctx));
  return remove_loop(ctx, 0);
}

const struct lb_case lb_cases_ib[] = {
    {"iflush_reads_back_received_buffers", flush_recv, flush_send, 30, 0},
    {"vdevice_over_two_devices_intact", vdev_recv, vdev_send, 60, 0},
    {"device_removed_mid_transfer_errors", remove_recv, remove_send, 60, 0},
    {NULL, NULL, NULL, 0, 0},
};
