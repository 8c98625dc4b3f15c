/*
 * A comm's progress thread (NCCL_MK_OFI_PROGRESS_THREAD; by default on over tcp with 8 or more
 * usable cores).
 *
 * Why: tcp;ofi_rxm has manual progress, so every step of a message (our clear-to-send,
 * rxm's rendezvous request, the data, rxm's acknowledgement) moves only when someone reads
 * the endpoint's CQ. Without this thread that someone is NCCL's proxy thread, inside isend
 * and test(), in turn with every other connection it drives: under NCCL on 2xH200 a 128
 * KiB all_reduce spent 95% of the proxy thread's time inside the plugin (syscalls in
 * fi_cq_read and fi_tsend) and each hop of a 32 KiB message waited for the other side's
 * proxy loop (bench/NOTES.md, session 24). With it, the thread answers each hop at once and
 * NCCL's thread only posts and checks its requests.
 *
 * Rules: stream 0's CQ is read only under c->lock (by this thread, or by a caller that
 * must wait out an EAGAIN), so completions are dispatched exactly as before. The thread
 * spins while the comm has requests in flight (or NCCL is asking for a send), and sleeps on
 * a condition variable otherwise; posts bump progress_gen so that no wake-up is lost.
 */
#include <sched.h>
#include <string.h>

#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"

#define OFI_PROGRESS_SPINS 32 /* empty reads in a row before yielding the core */
/* How long the thread keeps reading after the comm's last request, before it sleeps: a
 * sleeping thread takes tens of microseconds to wake, which small messages feel (NCCL posts
 * the next collective's receives right after the last one's completions). */
#define OFI_PROGRESS_LINGER_NS 500000ull

/* Whether the thread has something to drive (caller holds c->lock). */
static int ofi_progress_has_work(const struct ofi_comm* c) {
  return !c->error && (mk_req_pool_in_use(&c->pool) > 0 || c->asking || c->cts_waiting ||
                       c->signals_waiting || c->ctrl_unposted || c->bounce_unposted);
}

/* Sleeps until a post changes progress_gen from seen, or close. progress_sleeping and
 * progress_gen are both sequentially consistent, so a waker that missed the flag bumped the
 * generation before this thread looked at it. */
static void ofi_progress_sleep(struct ofi_comm* c, unsigned seen) {
  pthread_mutex_lock(&c->progress_mu);
  __atomic_store_n(&c->progress_sleeping, 1, __ATOMIC_SEQ_CST);
  while (!__atomic_load_n(&c->progress_stop, __ATOMIC_SEQ_CST) &&
         __atomic_load_n(&c->progress_gen, __ATOMIC_SEQ_CST) == seen)
    pthread_cond_wait(&c->progress_cv, &c->progress_mu);
  __atomic_store_n(&c->progress_sleeping, 0, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&c->progress_mu);
}

static void* ofi_progress_main(void* arg) {
  struct ofi_comm* c = arg;
  int empty = 0;
  uint64_t last_work = ofi_now_ns();
  while (!__atomic_load_n(&c->progress_stop, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&c->lock);
    unsigned gen = __atomic_load_n(&c->progress_gen, __ATOMIC_SEQ_CST);
    int n = ofi_cq_progress(c);
    int work = ofi_progress_has_work(c);
    if (n == 0 && work) ofi_peer_check(c); /* rate-limited; an error ends the work */
    pthread_mutex_unlock(&c->lock);
    while (__atomic_load_n(&c->callers, __ATOMIC_ACQUIRE) > 0) sched_yield();
    if (work || n > 0) last_work = ofi_now_ns();
    if (n > 0) {
      empty = 0;
    } else if (!work && (c->error || ofi_now_ns() - last_work > OFI_PROGRESS_LINGER_NS)) {
      ofi_progress_sleep(c, gen);
      empty = 0;
      last_work = ofi_now_ns();
    } else if (++empty >= OFI_PROGRESS_SPINS) {
      sched_yield(); /* lets NCCL's thread take the lock, and other threads the core */
      empty = 0;
    }
  }
  return NULL;
}

void ofi_progress_wake(struct ofi_comm* c) {
  if (!c->has_progress) return;
  __atomic_add_fetch(&c->progress_gen, 1, __ATOMIC_SEQ_CST);
  if (!__atomic_load_n(&c->progress_sleeping, __ATOMIC_SEQ_CST)) return;
  pthread_mutex_lock(&c->progress_mu);
  pthread_cond_signal(&c->progress_cv);
  pthread_mutex_unlock(&c->progress_mu);
}

int ofi_progress_start(struct ofi_comm* c) {
  if (c->has_progress || !c->progress_wanted) return 0;
  static int logged;
  if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED)) /* where they may run, once */
    MK_INFO(MK_NCCL_SUBSYS_NET, "ofi: a progress thread per comm, on the %d cores of the thread "
            "that connects", ofi_thread_cores());
  c->has_progress = 1; /* before the thread runs: the calls stop reading the CQ themselves */
  int rc = pthread_create(&c->progress, NULL, ofi_progress_main, c);
  if (rc != 0) {
    c->has_progress = 0;
    MK_WARN("ofi: cannot start a comm progress thread: %s", strerror(rc));
    return -rc;
  }
  return 0;
}

void ofi_progress_stop(struct ofi_comm* c) {
  if (!c->has_progress) return;
  pthread_mutex_lock(&c->progress_mu);
  __atomic_store_n(&c->progress_stop, 1, __ATOMIC_RELEASE);
  pthread_cond_signal(&c->progress_cv);
  pthread_mutex_unlock(&c->progress_mu);
  pthread_join(c->progress, NULL);
  c->has_progress = 0;
}
