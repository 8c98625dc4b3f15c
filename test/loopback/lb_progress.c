/* The ofi comm's progress thread (NCCL_MK_OFI_PROGRESS_THREAD=1, set by meson for these
 * cases): it moves a message that no test() asks about, and it sleeps when its comm is idle.
 * Without the thread, libfabric tcp's manual progress moves nothing between test() calls. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "lb.h"

#define PROGRESS_MSG_BYTES (4u << 20) /* above rxm's eager size: a rendezvous, several hops */
#define PROGRESS_WAIT_S 10.0

/* The receiver posts a receive and, without calling test(), watches its buffer fill: the
 * progress threads of both ends (the sender calls no test() either) must carry every hop.
 * Only then does each side test its request once it has been told the data is in. */
static int untested_recv(struct lb_ctx* ctx) {
  LB_OK(lb_accept(ctx));
  size_t len = PROGRESS_MSG_BYTES, got = 0;
  unsigned char* buf = lb_alloc(len);
  memset(buf, 0, len);
  void* d = buf;
  int tag = 5;
  struct mk_request* req;
  LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
  lb_tell(ctx, 1); /* the receive is posted: send */
  int landed = 0;
  for (double t0 = lb_now(); !landed && lb_now() - t0 < PROGRESS_WAIT_S; usleep(2000))
    landed = lb_check_quiet(buf, len, ctx->seed, 9);
  fprintf(stderr, "[receiver] %s without a test() call\n",
          landed ? "the message landed" : "the message did not land");
  lb_tell(ctx, 2); /* the sender may test now */
  LB_EXPECT(landed);
  LB_OK(lb_wait(ctx, req, &got));
  LB_EXPECT(got == len && lb_check(buf, len, ctx->seed, 9, "untested message") == 0);
  free(buf);
  return lb_close(ctx);
}

static int untested_send(struct lb_ctx* ctx) {
  LB_OK(lb_connect(ctx));
  size_t len = PROGRESS_MSG_BYTES;
  unsigned char* buf = lb_alloc(len);
  lb_fill(buf, len, ctx->seed, 9);
  LB_EXPECT(lb_hear(ctx) == 1);
  struct mk_request* req;
  LB_OK(lb_send(ctx, buf, len, 5, NULL, &req));
  LB_EXPECT(lb_hear(ctx) == 2);
  LB_OK(lb_wait(ctx, req, NULL));
  free(buf);
  return lb_close(ctx);
}

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

#define IDLE_WINDOW_US 400000
#define IDLE_CPU_MAX 0.1 /* of the window: one spinning thread would burn ~1.0 */

/* After traffic, an open comm whose requests are all done must not burn a core: its
 * progress thread sleeps once its linger is over, its stream threads sleep in their CQ waits.
 * Each process measures its own CPU time over the same idle window. */
static int idle_role(struct lb_ctx* ctx) {
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  for (int i = 0; i < 4; i++) { /* a few messages, striped ones included */
    static unsigned char buf[1 << 20];
    size_t len = sizeof(buf), got = 0;
    int tag = 7;
    struct mk_request* req;
    void* d = buf;
    if (ctx->is_sender) {
      lb_fill(buf, len, ctx->seed, 20 + (uint64_t)i);
      LB_OK(lb_send(ctx, buf, len, tag, NULL, &req));
      LB_OK(lb_wait(ctx, req, NULL));
    } else {
      LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
      LB_OK(lb_wait(ctx, req, &got));
      LB_EXPECT(got == len && lb_check(buf, len, ctx->seed, 20 + (uint64_t)i, "message") == 0);
    }
  }
  usleep(50000); /* past the thread's linger (0.5 ms) */
  double c0 = cpu_seconds();
  usleep(IDLE_WINDOW_US);
  double share = (cpu_seconds() - c0) / (IDLE_WINDOW_US / 1e6);
  fprintf(stderr, "[%s] idle comm: %.3f of a core over %.1f s\n",
          ctx->is_sender ? "sender" : "receiver", share, IDLE_WINDOW_US / 1e6);
  LB_EXPECT(share < IDLE_CPU_MAX);
  lb_tell(ctx, 3); /* neither closes before both have measured */
  LB_EXPECT(lb_hear(ctx) == 3);
  return lb_close(ctx);
}

const struct lb_case lb_cases_progress[] = {
    {"progress_thread_moves_a_message_no_test_asks_about", untested_recv, untested_send, 30, 0},
    {"idle_comm_threads_burn_no_cpu", idle_role, idle_role, 30, 0},
    {NULL, NULL, NULL, 0, 0},
};
