/* The net plugin's request trace (net_trace.h). A diagnostic: a mutex per event is fine. */
#include "net_trace.h"

#include <errno.h>
#include <pthread.h>
#include <sys/resource.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mk_clock.h"
#include "mk_log.h"
#include "mk_param.h"

#define TRACE_INFLIGHT 4096u /* open-addressed map request -> record (power of two) */
#define TRACE_COMMS 512u     /* comms with an isend NCCL is still asking for */
#define TRACE_THREADS 64u    /* threads that call the plugin (NCCL's proxy threads) */
#define TRACE_BUCKETS 6  /* durations and gaps between calls: < 1, 4, 16, 64, 256 us, more */
#define TRACE_RUSAGE_EVERY 256u /* calls between a thread's context-switch readings */

struct trace_rec {
  uint64_t asked, posted, done; /* ns, CLOCK_MONOTONIC; done 0: never reported */
  uint64_t post_ns, test_ns;    /* time inside the call that posted it, and its test()s */
  const void* comm;
  uint64_t size;
  uint32_t tests;
  int32_t tag;
  uint8_t kind, n;
};

struct trace_slot {
  const void* req;
  uint32_t rec;
};

struct trace_attempt {
  const void* comm;
  uint64_t since;
};

struct trace_calls {
  uint64_t count, total_ns, max_ns;
  uint64_t hist[TRACE_BUCKETS]; /* durations */
};

/* One thread's calls: time inside the plugin, gaps between its calls, context switches. */
struct trace_thread {
  uint64_t last_end, calls, inside_ns, outside_ns;
  uint64_t gaps[TRACE_BUCKETS];
  long vcsw0, ivcsw0, vcsw, ivcsw; /* at its first call and the latest reading */
};

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  int on, written;
  struct trace_rec* recs;
  uint32_t nrecs;
  struct trace_slot inflight[TRACE_INFLIGHT];
  struct trace_attempt attempts[TRACE_COMMS];
  struct trace_calls calls[MK_NET_CALL_KINDS];
  struct trace_thread threads[TRACE_THREADS];
  uint32_t nthreads;
} tr = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void trace_at_exit(void) { mk_net_trace_flush(); }

static void trace_init(void) {
  if (!mk_param_str(MK_PARAM_NET_TRACE_DIR)[0]) return;
  tr.recs = calloc(MK_NET_TRACE_MAX, sizeof(*tr.recs));
  if (!tr.recs) {
    MK_WARN("NCCL_MK_NET_TRACE_DIR: no memory for %u records; tracing off", MK_NET_TRACE_MAX);
    return;
  }
  tr.on = 1;
  atexit(trace_at_exit);
}

int mk_net_trace_on(void) {
  pthread_once(&tr.once, trace_init);
  return tr.on;
}

static uint32_t trace_hash(const void* p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
  return (uint32_t)x & (TRACE_INFLIGHT - 1);
}

/* The map's slot for req: its own, or the first empty one on its probe path. */
static struct trace_slot* trace_slot_of(const void* req) {
  uint32_t h = trace_hash(req);
  for (uint32_t i = 0; i < TRACE_INFLIGHT; i++) {
    struct trace_slot* s = &tr.inflight[(h + i) & (TRACE_INFLIGHT - 1)];
    if (s->req == req || !s->req) return s;
  }
  return NULL; /* full: the request goes untraced */
}

/* Removes slot s keeping every other key reachable (backward-shift deletion). */
static void trace_slot_clear(struct trace_slot* s) {
  uint32_t i = (uint32_t)(s - tr.inflight);
  for (uint32_t j = (i + 1) & (TRACE_INFLIGHT - 1);; j = (j + 1) & (TRACE_INFLIGHT - 1)) {
    if (!tr.inflight[j].req) break;
    uint32_t home = trace_hash(tr.inflight[j].req);
    /* j's entry may move to i when i lies on its probe path from home */
    if (((j - home) & (TRACE_INFLIGHT - 1)) >= ((j - i) & (TRACE_INFLIGHT - 1))) {
      tr.inflight[i] = tr.inflight[j];
      i = j;
    }
  }
  tr.inflight[i].req = NULL;
}

static struct trace_attempt* trace_attempt_of(const void* comm, int add) {
  struct trace_attempt* empty = NULL;
  for (uint32_t i = 0; i < TRACE_COMMS; i++) {
    if (tr.attempts[i].comm == comm) return &tr.attempts[i];
    if (!tr.attempts[i].comm && !empty) empty = &tr.attempts[i];
  }
  if (add && empty) empty->comm = comm, empty->since = 0;
  return add ? empty : NULL;
}

void mk_net_trace_attempt(const void* comm) {
  uint64_t t = mk_now_ns();
  pthread_mutex_lock(&tr.lock);
  struct trace_attempt* a = trace_attempt_of(comm, 1);
  if (a && !a->since) a->since = t;
  pthread_mutex_unlock(&tr.lock);
}

void mk_net_trace_post(const void* comm, const void* req, enum mk_net_trace_kind kind, size_t size,
                       int n, int tag, uint64_t t0) {
  uint64_t t = mk_now_ns();
  pthread_mutex_lock(&tr.lock);
  uint64_t asked = t;
  struct trace_attempt* a = trace_attempt_of(comm, 0);
  if (a) asked = a->since ? a->since : t, a->comm = NULL;
  struct trace_slot* s = tr.nrecs < MK_NET_TRACE_MAX ? trace_slot_of(req) : NULL;
  if (s) {
    struct trace_rec* r = &tr.recs[tr.nrecs];
    *r = (struct trace_rec){.asked = asked, .posted = t, .comm = comm, .size = size, .tag = tag,
                            .kind = (uint8_t)kind, .n = (uint8_t)n,
                            .post_ns = t0 && t0 < t ? t - t0 : 0};
    s->req = req, s->rec = tr.nrecs++;
  }
  pthread_mutex_unlock(&tr.lock);
}

void mk_net_trace_test(const void* req, int done, uint64_t t0) {
  uint64_t t = mk_now_ns();
  pthread_mutex_lock(&tr.lock);
  struct trace_slot* s = trace_slot_of(req);
  if (s && s->req == req) {
    struct trace_rec* r = &tr.recs[s->rec];
    r->tests++;
    if (t0 && t0 < t) r->test_ns += t - t0;
    if (done) {
      r->done = t;
      trace_slot_clear(s);
    }
  }
  pthread_mutex_unlock(&tr.lock);
}

uint64_t mk_net_trace_clock(void) { return mk_net_trace_on() ? mk_now_ns() : 0; }

static void trace_thread_rusage(struct trace_thread* th, int first) {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return;
  if (first) th->vcsw0 = ru.ru_nvcsw, th->ivcsw0 = ru.ru_nivcsw;
  th->vcsw = ru.ru_nvcsw, th->ivcsw = ru.ru_nivcsw;
}

/* The calling thread's record, registered at its first call (NULL once the table is full). */
static struct trace_thread* trace_thread_self(void) {
  static __thread int idx = -1;
  if (idx >= 0) return &tr.threads[idx];
  if (tr.nthreads >= TRACE_THREADS) return NULL;
  idx = (int)tr.nthreads++;
  trace_thread_rusage(&tr.threads[idx], 1);
  return &tr.threads[idx];
}

static unsigned trace_bucket(uint64_t ns) {
  unsigned b = 0;
  for (uint64_t lim = 1000; b + 1 < TRACE_BUCKETS && ns >= lim; lim *= 4) b++;
  return b;
}

void mk_net_trace_call(enum mk_net_call kind, uint64_t t0) {
  if (!t0 || (unsigned)kind >= MK_NET_CALL_KINDS) return;
  uint64_t t = mk_now_ns(), d = t - t0;
  pthread_mutex_lock(&tr.lock);
  struct trace_calls* c = &tr.calls[kind];
  c->count++, c->total_ns += d;
  c->hist[trace_bucket(d)]++;
  if (d > c->max_ns) c->max_ns = d;
  struct trace_thread* th = trace_thread_self();
  if (th) {
    if (th->last_end && t0 > th->last_end) {
      th->outside_ns += t0 - th->last_end;
      th->gaps[trace_bucket(t0 - th->last_end)]++;
    }
    th->last_end = t, th->inside_ns += d;
    if (++th->calls % TRACE_RUSAGE_EVERY == 0) trace_thread_rusage(th, 0);
  }
  pthread_mutex_unlock(&tr.lock);
}

/* record,key,count,total_us,max_us: one "call" row per entry point, then per thread its
 * time inside and outside the plugin, its gaps by size and its context switches. */
static void trace_write_calls(FILE* f) {
  static const char* names[MK_NET_CALL_KINDS] = {"isend", "isend_none", "irecv", "test",
                                                 "test_done"};
  static const char* bucket_names[TRACE_BUCKETS] = {"lt1us", "lt4us", "lt16us", "lt64us",
                                                        "lt256us", "ge256us"};
  fprintf(f, "record,key,count,total_us,max_us\n");
  for (int k = 0; k < MK_NET_CALL_KINDS; k++) {
    fprintf(f, "call,%s,%llu,%.1f,%.1f\n", names[k], (unsigned long long)tr.calls[k].count,
            tr.calls[k].total_ns / 1e3, tr.calls[k].max_ns / 1e3);
    for (int b = 0; b < TRACE_BUCKETS; b++)
      fprintf(f, "dur,%s:%s,%llu,0,0\n", names[k], bucket_names[b],
              (unsigned long long)tr.calls[k].hist[b]);
  }
  for (uint32_t i = 0; i < tr.nthreads; i++) {
    const struct trace_thread* th = &tr.threads[i];
    fprintf(f, "inside,t%u,%llu,%.1f,0\n", i, (unsigned long long)th->calls, th->inside_ns / 1e3);
    fprintf(f, "outside,t%u,%llu,%.1f,0\n", i, (unsigned long long)th->calls,
            th->outside_ns / 1e3);
    for (int b = 0; b < TRACE_BUCKETS; b++)
      fprintf(f, "gap,t%u:%s,%llu,0,0\n", i, bucket_names[b], (unsigned long long)th->gaps[b]);
    fprintf(f, "csw,t%u:voluntary,%ld,0,0\n", i, th->vcsw - th->vcsw0);
    fprintf(f, "csw,t%u:involuntary,%ld,0,0\n", i, th->ivcsw - th->ivcsw0);
  }
}

static int trace_write(const char* name, void (*write)(FILE*)) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s.%d.csv", mk_param_str(MK_PARAM_NET_TRACE_DIR), name,
           (int)getpid());
  FILE* f = fopen(path, "w");
  int rc = f ? 0 : -errno;
  if (f) {
    write(f);
    rc = fclose(f) ? -errno : 0;
  }
  if (rc < 0) MK_WARN("NCCL_MK_NET_TRACE_DIR: writing %s failed: errno %d", path, -rc);
  return rc;
}

static void trace_write_recs(FILE* f) {
  fprintf(f, "kind,comm,tag,n,size,asked_ns,posted_ns,done_ns,tests,post_ns,test_ns\n");
  for (uint32_t i = 0; i < tr.nrecs; i++) {
    const struct trace_rec* r = &tr.recs[i];
    fprintf(f, "%s,%p,%d,%u,%llu,%llu,%llu,%llu,%u,%llu,%llu\n", r->kind ? "recv" : "send",
            r->comm, r->tag, r->n, (unsigned long long)r->size, (unsigned long long)r->asked,
            (unsigned long long)r->posted, (unsigned long long)r->done, r->tests,
            (unsigned long long)r->post_ns, (unsigned long long)r->test_ns);
  }
}

int mk_net_trace_flush(void) {
  if (!mk_net_trace_on()) return 0;
  pthread_mutex_lock(&tr.lock);
  int rc = trace_write("mk-net-trace", trace_write_recs);
  if (rc == 0) rc = trace_write("mk-net-calls", trace_write_calls);
  if (rc == 0) rc = (int)tr.nrecs;
  pthread_mutex_unlock(&tr.lock);
  return rc;
}
