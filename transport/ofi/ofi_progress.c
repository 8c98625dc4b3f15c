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
 * Rules: stream 0's CQ is read only under c->lock (by the thread, or by a caller that must
 * wait out an EAGAIN), so completions are dispatched exactly as before. The thread spins
 * while a comm it serves has requests in flight (or NCCL is asking for a send), and sleeps
 * on a condition variable otherwise; posts bump the runner's gen so that no wake-up is lost.
 * A runner serves one comm (its own thread, the default) or every comm of a device in
 * OFI_PROGRESS_DEVICE mode (one thread however many comms NCCL opens); the same loop runs
 * both. Lock order: list_mu, then a comm's lock; NCCL's calls hold a comm's lock and take
 * only sleep_mu (to wake the thread).
 *
 * Latency-bound traffic is the exception: a comm whose last requests were all small
 * (NCCL_MK_OFI_CALLER_PROGRESS_MAX) is read by NCCL's own calls, as with no thread, and the
 * thread leaves it alone until a large one comes. A small message is one hop, which NCCL's
 * calls read in time; sharing the comm with a thread that spins on its CQ cost each of NCCL's
 * posts a wait for our lock and the provider's (8-byte all_reduce under NCCL on one H200:
 * 59 us with the thread, 42 without; from 32 KiB the thread wins, bench/NOTES.md session 53).
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"

#define OFI_PROGRESS_SPINS 32 /* empty reads in a row before yielding the core */
/* How long the thread keeps reading after the last request, before it sleeps: a sleeping
 * thread takes tens of microseconds to wake, which small messages feel (NCCL posts the next
 * collective's receives right after the last one's completions). */
#define OFI_PROGRESS_LINGER_NS 500000ull
#define OFI_RUNNER_SWEEP_NS 1000000ull /* a device runner looks at its idle comms this often */

void ofi_runner_init(struct ofi_runner* r) {
  memset(r, 0, sizeof(*r));
  pthread_mutex_init(&r->life_mu, NULL);
  pthread_mutex_init(&r->list_mu, NULL);
  pthread_mutex_init(&r->sleep_mu, NULL);
  pthread_cond_init(&r->cv, NULL);
}

static void ofi_runner_join(struct ofi_runner* r);

/* Joins the thread if it still runs (comms left open at fini), then frees the runner. */
void ofi_runner_destroy(struct ofi_runner* r) {
  pthread_mutex_lock(&r->life_mu);
  if (r->running) ofi_runner_join(r);
  pthread_mutex_unlock(&r->life_mu);
  pthread_mutex_destroy(&r->life_mu);
  pthread_mutex_destroy(&r->list_mu);
  pthread_mutex_destroy(&r->sleep_mu);
  pthread_cond_destroy(&r->cv);
  free(r->comms);
  r->comms = NULL;
}

/* Whether the thread has something to drive on c (caller holds c->lock). */
static int ofi_progress_has_work(const struct ofi_comm* c) {
  return !c->error && (mk_req_pool_in_use(&c->pool) > 0 || c->asking || c->cts_waiting ||
                       c->sends_waiting || c->signals_waiting || c->ctrl_unposted ||
                       c->bounce_unposted);
}

/* A call of NCCL's went back without the lock (ofi_call_lock): the thread stays out until
 * that call has come back and taken it, or OFI_LET_IN_NS passed (NCCL may be busy with its
 * other requests), and then stops waiting for it. */
#define OFI_LET_IN_NS 50000
static void ofi_runner_let_in(struct ofi_comm* c) {
  const uint64_t t0 = mk_now_ns();
  while (__atomic_load_n(&c->lock_wanted, __ATOMIC_ACQUIRE)) {
    if (mk_now_ns() - t0 > OFI_LET_IN_NS) __atomic_store_n(&c->lock_wanted, 0, __ATOMIC_RELEASE);
    ofi_cpu_relax();
  }
}

/* One look at comm c: its completions read and dispatched; *work set when it has any. A comm
 * found with nothing to do is marked idle (under its lock, so that a post after it, which
 * clears the mark in ofi_progress_wake, is never lost). */
static int ofi_runner_step(struct ofi_comm* c, int* work) {
  pthread_mutex_lock(&c->lock);
  if (__atomic_load_n(&c->caller_progress, __ATOMIC_RELAXED)) { /* handed over meanwhile */
    pthread_mutex_unlock(&c->lock);
    return 0;
  }
  int n = ofi_cq_progress(c);
  int w = ofi_progress_has_work(c);
  if (n == 0 && w) ofi_peer_check(c); /* rate-limited; an error ends the work */
  __atomic_store_n(&c->runner_idle, n <= 0 && !w, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&c->lock);
  while (__atomic_load_n(&c->callers, __ATOMIC_ACQUIRE) > 0) sched_yield();
  if (__atomic_load_n(&c->lock_wanted, __ATOMIC_ACQUIRE)) ofi_runner_let_in(c);
  *work |= w;
  return n > 0 ? n : 0;
}

/* Sleeps until a post changes gen from seen, or stop. sleeping and gen are both
 * sequentially consistent, so a waker that missed the flag bumped gen before this thread
 * looked at it. */
static void ofi_runner_sleep(struct ofi_runner* r, unsigned seen) {
  pthread_mutex_lock(&r->sleep_mu);
  __atomic_store_n(&r->sleeping, 1, __ATOMIC_SEQ_CST);
  while (!__atomic_load_n(&r->stop, __ATOMIC_SEQ_CST) &&
         __atomic_load_n(&r->gen, __ATOMIC_SEQ_CST) == seen)
    pthread_cond_wait(&r->cv, &r->sleep_mu);
  __atomic_store_n(&r->sleeping, 0, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&r->sleep_mu);
}

/* Whether to look at comm c in this sweep: always when the runner serves c alone (its linger
 * reads pick up the next clear-to-send early); else when c is not idle, or at the periodic
 * sweep (a device runner would otherwise pay a CQ read, syscalls over tcp, per idle comm). */
static int ofi_runner_wants(const struct ofi_runner* r, struct ofi_comm* c, int sweep) {
  if (__atomic_load_n(&c->caller_progress, __ATOMIC_ACQUIRE)) return 0; /* NCCL's calls read it */
  return r->ncomms == 1 || sweep || !__atomic_load_n(&c->runner_idle, __ATOMIC_ACQUIRE);
}

static void* ofi_runner_main(void* arg) {
  struct ofi_runner* r = arg;
  int empty = 0;
  uint64_t last_work = mk_now_ns(), last_sweep = last_work;
  while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
    unsigned gen = __atomic_load_n(&r->gen, __ATOMIC_SEQ_CST);
    int n = 0, work = 0;
    uint64_t now = mk_now_ns();
    int sweep = now - last_sweep > OFI_RUNNER_SWEEP_NS;
    if (sweep) last_sweep = now;
    pthread_mutex_lock(&r->list_mu);
    for (int i = 0; i < r->ncomms; i++)
      if (ofi_runner_wants(r, r->comms[i], sweep)) n += ofi_runner_step(r->comms[i], &work);
    pthread_mutex_unlock(&r->list_mu);
    if (work || n > 0) last_work = mk_now_ns();
    if (n > 0) {
      empty = 0;
    } else if (!work && mk_now_ns() - last_work > OFI_PROGRESS_LINGER_NS) {
      ofi_runner_sleep(r, gen);
      empty = 0;
      last_work = mk_now_ns();
    } else if (++empty >= OFI_PROGRESS_SPINS) {
      sched_yield(); /* lets NCCL's threads take the locks, and other threads the core */
      empty = 0;
    }
  }
  return NULL;
}

void ofi_progress_wake(struct ofi_comm* c) {
  if (!ofi_runner_drives(c)) return; /* no thread, or NCCL's calls read this comm */
  struct ofi_runner* r = c->runner;
  __atomic_store_n(&c->runner_idle, 0, __ATOMIC_RELEASE);
  __atomic_add_fetch(&r->gen, 1, __ATOMIC_SEQ_CST);
  if (!__atomic_load_n(&r->sleeping, __ATOMIC_SEQ_CST)) return;
  pthread_mutex_lock(&r->sleep_mu);
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->sleep_mu);
}

uint32_t mk_ofi_caller_progress_step(uint32_t streak, uint64_t bytes, uint64_t max, int* callers) {
  if (!max || bytes >= max) {
    *callers = 0;
    return 0;
  }
  if (streak < MK_OFI_SMALL_STREAK) streak++;
  *callers = streak >= MK_OFI_SMALL_STREAK;
  return streak;
}

int mk_ofi_thread_posts_send(uint64_t size, uint64_t min, int thread_drives) {
  return size >= min || thread_drives;
}

void ofi_progress_observe(struct ofi_comm* c, uint64_t bytes) {
  if (!c->runner) return;
  int callers;
  c->small_streak = mk_ofi_caller_progress_step(c->small_streak, bytes, c->caller_progress_max,
                                                &callers);
  if (callers == __atomic_load_n(&c->caller_progress, __ATOMIC_RELAXED)) return;
  __atomic_store_n(&c->caller_progress, callers, __ATOMIC_RELEASE);
  if (!callers) ofi_progress_wake(c); /* the thread's again: it may be asleep */
}

static int ofi_runner_add(struct ofi_runner* r, struct ofi_comm* c) {
  pthread_mutex_lock(&r->list_mu);
  int rc = 0;
  if (r->ncomms == r->cap) {
    int cap = r->cap ? 2 * r->cap : 4;
    struct ofi_comm** m = realloc(r->comms, sizeof(*m) * (size_t)cap);
    if (m) r->comms = m, r->cap = cap;
    else rc = -ENOMEM;
  }
  if (rc == 0) r->comms[r->ncomms++] = c;
  pthread_mutex_unlock(&r->list_mu);
  return rc;
}

/* Takes c off r's list; returns how many comms r still serves. Waits for the thread to be
 * done stepping through the list (it holds list_mu meanwhile). */
static int ofi_runner_remove(struct ofi_runner* r, struct ofi_comm* c) {
  pthread_mutex_lock(&r->list_mu);
  for (int i = 0; i < r->ncomms; i++)
    if (r->comms[i] == c) r->comms[i] = r->comms[--r->ncomms];
  int left = r->ncomms;
  pthread_mutex_unlock(&r->list_mu);
  return left;
}

static void ofi_runner_join(struct ofi_runner* r) {
  ofi_thread_stop_join(&r->sleep_mu, &r->cv, &r->stop, r->thread);
  r->running = 0;
}

static void ofi_progress_log_once(int mode) {
  static int logged;
  if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED)) /* where they may run, once */
    MK_INFO(MK_NCCL_SUBSYS_NET, "ofi: a progress thread per %s, on the %d cores of the thread "
            "that connects", mode == OFI_PROGRESS_DEVICE ? "device" : "comm", ofi_thread_cores());
}

int ofi_progress_start(struct ofi_comm* c) {
  if (c->runner || c->progress_wanted == OFI_PROGRESS_NCCL) return 0;
  ofi_progress_log_once(c->progress_wanted);
  struct ofi_runner* r =
      c->progress_wanted == OFI_PROGRESS_DEVICE ? &c->dev->runner : &c->own_runner;
  pthread_mutex_lock(&r->life_mu);
  c->runner = r; /* the calls stop reading the CQ themselves */
  int rc = ofi_runner_add(r, c);
  if (rc == 0 && !r->running) {
    __atomic_store_n(&r->stop, 0, __ATOMIC_SEQ_CST);
    rc = -pthread_create(&r->thread, NULL, ofi_runner_main, r);
    r->running = rc == 0;
  }
  if (rc != 0) {
    ofi_runner_remove(r, c);
    c->runner = NULL;
    MK_WARN("ofi: cannot start a progress thread: %s", strerror(-rc));
  }
  pthread_mutex_unlock(&r->life_mu);
  return rc;
}

void ofi_progress_stop(struct ofi_comm* c) {
  struct ofi_runner* r = c->runner;
  if (!r) return;
  pthread_mutex_lock(&r->life_mu);
  if (ofi_runner_remove(r, c) == 0 && r->running) ofi_runner_join(r);
  c->runner = NULL;
  pthread_mutex_unlock(&r->life_mu);
}
