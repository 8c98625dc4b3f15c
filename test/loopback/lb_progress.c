/* The ofi comm's progress thread (NCCL_MK_OFI_PROGRESS_THREAD=1 or 2, set by meson for these
 * cases): it moves a message that no test() asks about, it sleeps when its comm is idle, and
 * one device thread serves several comms.
 * Without the thread, libfabric tcp's manual progress moves nothing between test() calls. */
#include <stdio.h>
#include <stdlib.h>
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

#define SEVERAL_COMMS 3
#define SEVERAL_BYTES (1u << 20)

static int several_open(struct lb_ctx* ctx, struct mk_comm** comms) {
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  comms[0] = ctx->comm;
  for (int i = 1; i < SEVERAL_COMMS; i++) { /* in turn: the i-th accept is the i-th connect */
    LB_OK(lb_reconnect(ctx));
    comms[i] = ctx->comm;
  }
  return 0;
}

/* Message i of round `round` on comm i (ctx->comm set to it): posted, not waited for. */
static int several_post(struct lb_ctx* ctx, unsigned char* buf, uint64_t stream,
                        struct mk_request** req) {
  size_t len = SEVERAL_BYTES;
  int tag = 11;
  void* d = buf;
  if (!ctx->is_sender) {
    memset(buf, 0, len);
    return lb_recv(ctx, 1, &d, &len, &tag, NULL, req);
  }
  lb_fill(buf, len, ctx->seed, stream);
  return lb_send(ctx, buf, len, tag, NULL, req);
}

/* Several comms of one process (with NCCL_MK_OFI_PROGRESS_THREAD=2 all on the device's one
 * thread, which skips idle comms between its periodic sweeps): first every comm carries a
 * message at once; then each in turn after all sat idle longer than a sweep and the linger,
 * its message landing before any test() asks about it (a post must bring its comm back into
 * the thread's sweeps at once). */
static int several_role(struct lb_ctx* ctx) {
  struct mk_comm* comms[SEVERAL_COMMS];
  struct mk_request* req[SEVERAL_COMMS];
  unsigned char* buf[SEVERAL_COMMS];
  LB_OK(several_open(ctx, comms));
  for (int i = 0; i < SEVERAL_COMMS; i++) buf[i] = lb_alloc(SEVERAL_BYTES);
  if (ctx->is_sender) LB_EXPECT(lb_hear(ctx) == 1); /* the receives first */
  for (int i = 0; i < SEVERAL_COMMS; i++) {
    ctx->comm = comms[i];
    LB_OK(several_post(ctx, buf[i], 30 + (uint64_t)i, &req[i]));
  }
  if (!ctx->is_sender) lb_tell(ctx, 1);
  for (int i = 0; i < SEVERAL_COMMS; i++) {
    ctx->comm = comms[i];
    LB_OK(lb_wait(ctx, req[i], NULL));
    LB_EXPECT(ctx->is_sender || lb_check(buf[i], SEVERAL_BYTES, ctx->seed, 30 + (uint64_t)i,
                                         "message at once") == 0);
  }
  for (int i = 0; i < SEVERAL_COMMS; i++) {
    usleep(20000); /* every comm idle: past the linger (0.5 ms) and a sweep (1 ms) */
    ctx->comm = comms[i];
    const uint64_t stream = 40 + (uint64_t)i;
    if (ctx->is_sender) {
      LB_EXPECT(lb_hear(ctx) == 2);
      LB_OK(several_post(ctx, buf[i], stream, &req[i]));
      LB_EXPECT(lb_hear(ctx) == 3);
    } else {
      LB_OK(several_post(ctx, buf[i], stream, &req[i]));
      lb_tell(ctx, 2);
      int landed = 0;
      for (double t0 = lb_now(); !landed && lb_now() - t0 < PROGRESS_WAIT_S; usleep(2000))
        landed = lb_check_quiet(buf[i], SEVERAL_BYTES, ctx->seed, stream);
      lb_tell(ctx, 3);
      LB_EXPECT(landed);
    }
    LB_OK(lb_wait(ctx, req[i], NULL));
  }
  lb_tell(ctx, 4); /* both done before any comm closes */
  LB_EXPECT(lb_hear(ctx) == 4);
  for (int i = 1; i < SEVERAL_COMMS; i++) LB_OK(ctx->ops->close(comms[i]));
  for (int i = 0; i < SEVERAL_COMMS; i++) free(buf[i]);
  ctx->comm = comms[0];
  return lb_close(ctx);
}

/* Sizes on both sides of NCCL_MK_OFI_THREAD_SEND_MIN (16 KiB by default): with a progress
 * thread, sends from it on are posted by the thread, smaller ones at once by the caller, so
 * a later small send may leave before an earlier large one. Posted back to back and waited
 * for only at the end, each must still land whole in its own receive. */
static const size_t threshold_sizes[] = {100, 16383, 16384, 70000, 8, 1u << 20, 8192, 32768};
#define THRESHOLD_MSGS (sizeof threshold_sizes / sizeof threshold_sizes[0])

static int threshold_role(struct lb_ctx* ctx) {
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  unsigned char* buf[THRESHOLD_MSGS];
  struct mk_request* req[THRESHOLD_MSGS];
  for (size_t i = 0; i < THRESHOLD_MSGS; i++) {
    buf[i] = lb_alloc(threshold_sizes[i]);
    if (ctx->is_sender) lb_fill(buf[i], threshold_sizes[i], ctx->seed, 50 + i);
    else memset(buf[i], 0, threshold_sizes[i]);
  }
  if (ctx->is_sender) LB_EXPECT(lb_hear(ctx) == 1); /* every receive posted first */
  for (size_t i = 0; i < THRESHOLD_MSGS; i++) {
    size_t len = threshold_sizes[i];
    int tag = 60 + (int)i;
    void* d = buf[i];
    if (ctx->is_sender) LB_OK(lb_send(ctx, buf[i], len, tag, NULL, &req[i]));
    else LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req[i]));
  }
  if (!ctx->is_sender) lb_tell(ctx, 1);
  for (size_t i = 0; i < THRESHOLD_MSGS; i++) {
    size_t got = 0;
    LB_OK(lb_wait(ctx, req[i], &got));
    LB_EXPECT(ctx->is_sender || (got == threshold_sizes[i] &&
                                 lb_check(buf[i], got, ctx->seed, 50 + i, "message") == 0));
  }
  lb_tell(ctx, 2); /* both done before either closes */
  LB_EXPECT(lb_hear(ctx) == 2);
  for (size_t i = 0; i < THRESHOLD_MSGS; i++) free(buf[i]);
  return lb_close(ctx);
}

/* Sends asked for before their receives are posted, as NCCL's proxy asks: again and again
 * until a request comes (the progress thread reads for the clear-to-send meanwhile). Every
 * message still lands whole, in its receive. Eager off at both ends: it would take the sends
 * at once. */
#define EARLY_ROUNDS 12
#define EARLY_BYTES 4096

static int early_send_role(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_OFI_EAGER_BYTES", "0");
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  unsigned char* buf = lb_alloc(EARLY_BYTES);
  for (int round = 1; round <= EARLY_ROUNDS; round++) {
    const uint64_t stream = 70 + (uint64_t)round;
    struct mk_request* req = NULL;
    size_t len = EARLY_BYTES, got = 0;
    int tag = 3;
    if (ctx->is_sender) {
      lb_fill(buf, len, ctx->seed, stream);
      LB_OK(ctx->ops->isend(ctx->comm, buf, len, tag, NULL, &req));
      LB_EXPECT(req == NULL); /* the receive is not posted yet */
      lb_tell(ctx, round);    /* asked once: now post it */
      LB_OK(lb_send(ctx, buf, len, tag, NULL, &req));
    } else {
      memset(buf, 0, len);
      void* d = buf;
      LB_EXPECT(lb_hear(ctx) == (uint64_t)round);
      usleep(3000); /* the sender keeps asking meanwhile */
      LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
    }
    LB_OK(lb_wait(ctx, req, &got));
    LB_EXPECT(ctx->is_sender || (got == EARLY_BYTES &&
                                 lb_check(buf, got, ctx->seed, stream, "early send") == 0));
  }
  lb_tell(ctx, 100); /* both done before either closes */
  LB_EXPECT(lb_hear(ctx) == 100);
  free(buf);
  return lb_close(ctx);
}

/* Progress handed to NCCL's calls and back (NCCL_MK_OFI_CALLER_PROGRESS_MAX, 16 KiB by
 * default): after a run of small messages both ends' calls read their comm themselves; a
 * large message gives the sender's comm back to its thread as it is posted and the
 * receiver's once it has landed; small ones hand both over again. Every message lands whole,
 * whoever moved it. (Without a progress thread NCCL's calls always read and no comm reports
 * a hand-over.) */
#define HANDOVER_SMALL 20 /* more than MK_OFI_SMALL_STREAK */
#define HANDOVER_LARGE (1u << 20)

static int handover_one(struct lb_ctx* ctx, unsigned char* buf, size_t len, uint64_t stream) {
  struct mk_request* req;
  size_t got = 0;
  int tag = 9;
  void* d = buf;
  if (ctx->is_sender) {
    lb_fill(buf, len, ctx->seed, stream);
    LB_EXPECT(lb_hear(ctx) == stream); /* the receive is posted */
    LB_OK(lb_send(ctx, buf, len, tag, NULL, &req));
    if (len >= HANDOVER_LARGE) LB_EXPECT(!mk_ofi_caller_progress(ctx->comm));
  } else {
    memset(buf, 0, len);
    LB_OK(lb_recv(ctx, 1, &d, &len, &tag, NULL, &req));
    lb_tell(ctx, stream);
  }
  LB_OK(lb_wait(ctx, req, &got));
  LB_EXPECT(ctx->is_sender ||
            (got == len && lb_check(buf, len, ctx->seed, stream, "message") == 0));
  return 0;
}

static int handover_role(struct lb_ctx* ctx) {
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  unsigned char* buf = lb_alloc(HANDOVER_LARGE);
  uint64_t stream = 100;
  for (int phase = 0; phase < 2; phase++) {
    for (int i = 0; i < HANDOVER_SMALL; i++)
      LB_OK(handover_one(ctx, buf, 8u << (i % 10), stream++));
    const int callers = mk_ofi_caller_progress(ctx->comm);
    fprintf(stderr, "[%s] after %d small messages: %s\n", ctx->is_sender ? "sender" : "receiver",
            HANDOVER_SMALL, callers ? "NCCL's calls progress the comm" : "its thread does");
    LB_EXPECT(callers == lb_ofi_progress_thread()); /* no thread: nothing to hand over */
    LB_OK(handover_one(ctx, buf, HANDOVER_LARGE, stream++));
    LB_EXPECT(!mk_ofi_caller_progress(ctx->comm));
  }
  lb_tell(ctx, 1); /* both done before either closes */
  LB_EXPECT(lb_hear(ctx) == 1);
  free(buf);
  return lb_close(ctx);
}

/* Sends below NCCL_MK_OFI_THREAD_SEND_MIN into receives that announce themselves (eager off,
 * as NCCL's Simple buffers are above the eager size): while the thread drives the sender's
 * comm (after a large message) it posts them too, as it does the large ones; once a run of
 * small messages has handed the comm to NCCL's calls they are posted at once. Without a
 * thread nothing is. Every message lands whole in its receive. */
#define SMALL_POST_BYTES 8

static int small_post_one(struct lb_ctx* ctx, unsigned char* buf, size_t len, uint64_t stream,
                          uint64_t* by_thread) {
  struct mk_request* req;
  size_t got = 0, cap = HANDOVER_LARGE;
  int tag = 11;
  void* d = buf;
  *by_thread = 0;
  if (ctx->is_sender) {
    lb_fill(buf, len, ctx->seed, stream);
    LB_EXPECT(lb_hear(ctx) == stream); /* the receive is posted */
    const uint64_t before = mk_ofi_sends_by_thread(ctx->comm);
    LB_OK(lb_send(ctx, buf, len, tag, NULL, &req));
    *by_thread = mk_ofi_sends_by_thread(ctx->comm) - before;
  } else {
    memset(buf, 0, cap);
    LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
    lb_tell(ctx, stream);
  }
  LB_OK(lb_wait(ctx, req, &got));
  LB_EXPECT(ctx->is_sender ||
            (got == len && lb_check(buf, len, ctx->seed, stream, "message") == 0));
  return 0;
}

static int small_posts_role(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_OFI_EAGER_BYTES", "0");
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  const int thread = lb_ofi_progress_thread();
  unsigned char* buf = lb_alloc(HANDOVER_LARGE);
  uint64_t stream = 200, large = 0, first = 0, last = 0;
  LB_OK(small_post_one(ctx, buf, HANDOVER_LARGE, stream++, &large));
  LB_OK(small_post_one(ctx, buf, SMALL_POST_BYTES, stream++, &first));
  for (int i = 1; i < HANDOVER_SMALL; i++)
    LB_OK(small_post_one(ctx, buf, SMALL_POST_BYTES, stream++, &last));
  if (ctx->is_sender) {
    fprintf(stderr, "[sender] posted by the thread: large %llu, first small %llu, last small %llu\n",
            (unsigned long long)large, (unsigned long long)first, (unsigned long long)last);
    LB_EXPECT(large == (uint64_t)thread && first == (uint64_t)thread && last == 0);
  }
  lb_tell(ctx, 1); /* both done before either closes */
  LB_EXPECT(lb_hear(ctx) == 1);
  free(buf);
  return lb_close(ctx);
}

/* NCCL's calls on a comm its progress thread drives (after a large message) do not wait for
 * the lock while the thread holds it (the test holds it here, as the thread does while it
 * posts): isend gives no request and test() says not yet, both at once, and each counts a
 * call sent back; once the lock is free the same calls go through and the message lands
 * whole. With the thread off, no call is ever sent back (the case then holds no lock). */
static int sent_back_role(struct lb_ctx* ctx) {
  lb_set_param("NCCL_MK_OFI_EAGER_BYTES", "0");
  LB_OK(ctx->is_sender ? lb_connect(ctx) : lb_accept(ctx));
  const int thread = lb_ofi_progress_thread();
  unsigned char* buf = lb_alloc(HANDOVER_LARGE);
  uint64_t stream = 300, ignored = 0;
  LB_OK(small_post_one(ctx, buf, HANDOVER_LARGE, stream++, &ignored)); /* the thread drives */
  struct mk_request* req = NULL;
  size_t got = 0, cap = HANDOVER_LARGE;
  int tag = 12;
  void* d = buf;
  if (ctx->is_sender) {
    lb_fill(buf, HANDOVER_LARGE, ctx->seed, stream);
    LB_EXPECT(lb_hear(ctx) == stream); /* the receive is posted */
    usleep(20000);                     /* and its clear-to-send filed by the thread */
    const uint64_t back0 = mk_ofi_calls_sent_back(ctx->comm);
    if (thread) {
      mk_ofi_hold_lock(ctx->comm, 1);
      const double t0 = lb_now();
      LB_OK(ctx->ops->isend(ctx->comm, buf, HANDOVER_LARGE, tag, NULL, &req));
      const double waited = lb_now() - t0;
      mk_ofi_hold_lock(ctx->comm, 0);
      LB_EXPECT(req == NULL && waited < 0.1);
      LB_EXPECT(mk_ofi_calls_sent_back(ctx->comm) == back0 + 1);
    }
    LB_OK(lb_send(ctx, buf, HANDOVER_LARGE, tag, NULL, &req));
    int done = 0;
    if (thread) {
      mk_ofi_hold_lock(ctx->comm, 1);
      LB_OK(ctx->ops->test(req, &done, NULL));
      mk_ofi_hold_lock(ctx->comm, 0);
      LB_EXPECT(!done); /* in flight, or done but not told while the lock is held */
    }
    LB_OK(lb_wait(ctx, req, NULL));
    fprintf(stderr, "[sender] calls sent back: %llu\n",
            (unsigned long long)(mk_ofi_calls_sent_back(ctx->comm) - back0));
    LB_EXPECT(thread ? mk_ofi_calls_sent_back(ctx->comm) > back0
                     : mk_ofi_calls_sent_back(ctx->comm) == 0);
  } else {
    memset(buf, 0, cap);
    LB_OK(lb_recv(ctx, 1, &d, &cap, &tag, NULL, &req));
    lb_tell(ctx, stream);
    LB_OK(lb_wait(ctx, req, &got));
    LB_EXPECT(got == HANDOVER_LARGE && lb_check(buf, got, ctx->seed, stream, "message") == 0);
  }
  lb_tell(ctx, 1); /* both done before either closes */
  LB_EXPECT(lb_hear(ctx) == 1);
  free(buf);
  return lb_close(ctx);
}

const struct lb_case lb_cases_progress[] = {
    {"progress_goes_to_the_callers_after_small_messages_and_back_for_a_large_one", handover_role,
     handover_role, 30, 0},
    {"sends_asked_before_their_receive_is_posted_land_whole", early_send_role, early_send_role, 30,
     0},
    {"several_comms_carry_messages_at_once_and_after_idling", several_role, several_role, 40, 0},
    {"progress_thread_moves_a_message_no_test_asks_about", untested_recv, untested_send, 30, 0},
    {"idle_comm_threads_burn_no_cpu", idle_role, idle_role, 30, 0},
    {"sends_either_side_of_the_thread_send_threshold_land_in_their_receives", threshold_role,
     threshold_role, 30, 0},
    {"small_sends_are_posted_by_the_thread_while_it_drives_the_comm_and_at_once_after_small_runs",
     small_posts_role, small_posts_role, 30, 0},
    {"calls_on_a_comm_the_thread_drives_go_back_instead_of_waiting_for_its_lock", sent_back_role,
     sent_back_role, 30, 0},
    {NULL, NULL, NULL, 0, 0},
};
