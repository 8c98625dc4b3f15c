/* The net plugin's request trace (net_trace.h). A diagnostic: a mutex per event is fine. */
#include "net_trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "mk_log.h"
#include "mk_param.h"

#define TRACE_INFLIGHT 4096u /* open-addressed map request -> record (power of two) */
#define TRACE_COMMS 512u     /* comms with an isend NCCL is still asking for */

struct trace_rec {
  uint64_t asked, posted, done; /* ns, CLOCK_MONOTONIC; done 0: never reported */
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

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  int on, written;
  struct trace_rec* recs;
  uint32_t nrecs;
  struct trace_slot inflight[TRACE_INFLIGHT];
  struct trace_attempt attempts[TRACE_COMMS];
} tr = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
  uint64_t t = trace_now();
  pthread_mutex_lock(&tr.lock);
  struct trace_attempt* a = trace_attempt_of(comm, 1);
  if (a && !a->since) a->since = t;
  pthread_mutex_unlock(&tr.lock);
}

void mk_net_trace_post(const void* comm, const void* req, enum mk_net_trace_kind kind, size_t size,
                       int n, int tag) {
  uint64_t t = trace_now();
  pthread_mutex_lock(&tr.lock);
  uint64_t asked = t;
  struct trace_attempt* a = trace_attempt_of(comm, 0);
  if (a) asked = a->since ? a->since : t, a->comm = NULL;
  struct trace_slot* s = tr.nrecs < MK_NET_TRACE_MAX ? trace_slot_of(req) : NULL;
  if (s) {
    struct trace_rec* r = &tr.recs[tr.nrecs];
    *r = (struct trace_rec){.asked = asked, .posted = t, .comm = comm, .size = size, .tag = tag,
                            .kind = (uint8_t)kind, .n = (uint8_t)n};
    s->req = req, s->rec = tr.nrecs++;
  }
  pthread_mutex_unlock(&tr.lock);
}

void mk_net_trace_test(const void* req, int done) {
  uint64_t t = trace_now();
  pthread_mutex_lock(&tr.lock);
  struct trace_slot* s = trace_slot_of(req);
  if (s && s->req == req) {
    struct trace_rec* r = &tr.recs[s->rec];
    r->tests++;
    if (done) {
      r->done = t;
      trace_slot_clear(s);
    }
  }
  pthread_mutex_unlock(&tr.lock);
}

int mk_net_trace_flush(void) {
  if (!mk_net_trace_on()) return 0;
  pthread_mutex_lock(&tr.lock);
  char path[4096];
  snprintf(path, sizeof(path), "%s/mk-net-trace.%d.csv", mk_param_str(MK_PARAM_NET_TRACE_DIR),
           (int)getpid());
  FILE* f = fopen(path, "w");
  int rc = f ? 0 : -errno;
  if (f) {
    fprintf(f, "kind,comm,tag,n,size,asked_ns,posted_ns,done_ns,tests\n");
    for (uint32_t i = 0; i < tr.nrecs; i++) {
      const struct trace_rec* r = &tr.recs[i];
      fprintf(f, "%s,%p,%d,%u,%llu,%llu,%llu,%llu,%u\n", r->kind ? "recv" : "send", r->comm, r->tag,
              r->n, (unsigned long long)r->size, (unsigned long long)r->asked,
              (unsigned long long)r->posted, (unsigned long long)r->done, r->tests);
    }
    rc = fclose(f) ? -errno : (int)tr.nrecs;
  }
  if (rc < 0) MK_WARN("NCCL_MK_NET_TRACE_DIR: writing %s failed: errno %d", path, -rc);
  pthread_mutex_unlock(&tr.lock);
  return rc;
}
