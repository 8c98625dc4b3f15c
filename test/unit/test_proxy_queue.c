/* The proxy's descriptor queue (fused/proxy/queue.h) without network or GPU: layout,
 * publish/consume order across threads (one producer, and several on a shared tail), wrap-around, a full ring, bounded waits and their
 * error records, descriptor bounds checks, the local-team split. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "mk_test.h"
#include "proxy.h"
#include "queue.h"

static struct mk_proxy_queue* queue_new(uint32_t depth) {
  void* m = NULL;
  REQUIRE(posix_memalign(&m, 64, mk_proxy_queue_bytes(depth)) == 0);
  REQUIRE(mk_proxy_queue_init(m, depth) == 0);
  return m;
}

/* The descriptor of ticket t carries values derived from t, so any mix-up shows. */
static struct mk_proxy_desc desc_of(uint64_t t) {
  struct mk_proxy_desc d = {0};
  d.op = MK_PROXY_PUT_SIGNAL;
  d.peer = (int)(t % 7);
  d.src_off = t * 3;
  d.dst_off = t * 5;
  d.size = t ^ 0x5555;
  d.flag_off = (t % 64) * 8;
  d.flag_value = t + 1;
  d.tag = (uint32_t)(t * 11);
  return d;
}

static int desc_matches(const struct mk_proxy_desc* d, uint64_t t) {
  struct mk_proxy_desc e = desc_of(t);
  return d->seq == t + 1 && d->op == e.op && d->peer == e.peer && d->src_off == e.src_off &&
         d->dst_off == e.dst_off && d->size == e.size && d->flag_off == e.flag_off &&
         d->flag_value == e.flag_value && d->tag == e.tag;
}

static void layout(void) {
  CHECK_EQ(sizeof(struct mk_proxy_desc), 64);
  CHECK_EQ(sizeof(struct mk_proxy_error), 64);
  CHECK_EQ(sizeof(struct mk_proxy_queue), 256);
  CHECK_EQ(offsetof(struct mk_proxy_queue, consumed), 64);
  CHECK_EQ(offsetof(struct mk_proxy_queue, completed), 72);
  CHECK_EQ(offsetof(struct mk_proxy_queue, proxy_err), 128);
  CHECK_EQ(offsetof(struct mk_proxy_queue, producer_err), 192);
  CHECK_EQ(offsetof(struct mk_proxy_error, aborted), 0);
  CHECK_EQ(mk_proxy_queue_bytes(16), 256 + 16 * 64);
  CHECK_EQ(sizeof(struct mk_proxy_addr), 144);
  CHECK_EQ(sizeof(struct mk_proxy_keys), 64);
  struct mk_proxy_queue* q = queue_new(8);
  CHECK_EQ((char*)mk_proxy_queue_slot(q, 0) - (char*)q, 256);
  CHECK_EQ((char*)mk_proxy_queue_slot(q, 9) - (char*)q, 256 + 64);
  CHECK_EQ(q->magic, MK_PROXY_QUEUE_MAGIC);
  CHECK_EQ(mk_proxy_queue_init(q, 6), -EINVAL); /* not a power of two */
  CHECK_EQ(mk_proxy_queue_init(q, 0), -EINVAL);
  free(q);
}

/* One thread: a slot is invisible until its seq is published; order is kept. */
static void order_single(void) {
  struct mk_proxy_queue* q = queue_new(8);
  struct mk_proxy_producer p;
  mk_proxy_producer_init(&p, q, 0);
  struct mk_proxy_desc out;
  CHECK(!mk_proxy_queue_peek(q, 0, &out));
  /* fields written without the publishing store: the consumer must not take them */
  struct mk_proxy_desc* s = mk_proxy_queue_slot(q, 0);
  s->size = 99;
  CHECK(!mk_proxy_queue_peek(q, 0, &out));
  for (uint64_t t = 0; t < 3; t++) {
    struct mk_proxy_desc d = desc_of(t);
    uint64_t ticket = 77;
    CHECK_EQ(mk_proxy_try_publish(&p, &d, &ticket), 0);
    CHECK_EQ(ticket, t);
  }
  CHECK(!mk_proxy_queue_peek(q, 3, &out)); /* not yet */
  for (uint64_t t = 0; t < 3; t++) CHECK(mk_proxy_queue_peek(q, t, &out) && desc_matches(&out, t));
  free(q);
}

/* Wrap-around: depth 4, thousands of tickets in random batches; a slot one lap old is
 * never taken for the current ticket. */
static void wrap(void) {
  struct mk_proxy_queue* q = queue_new(4);
  struct mk_proxy_producer p;
  mk_proxy_producer_init(&p, q, 0);
  uint64_t head = 0, next = 0, rnd = 12345;
  struct mk_proxy_desc out;
  while (head < 5000) {
    rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
    int burst = (int)(rnd >> 60) % 6;
    for (int i = 0; i < burst; i++) {
      struct mk_proxy_desc d = desc_of(next);
      int rc = mk_proxy_try_publish(&p, &d, NULL);
      if (rc == -EAGAIN) {
        CHECK_EQ(next - head, 4); /* full exactly when depth are outstanding */
        break;
      }
      CHECK_EQ(rc, 0);
      next++;
    }
    int take = (int)(rnd >> 56) % 5;
    for (int i = 0; i < take && head < next; i++) {
      CHECK(mk_proxy_queue_peek(q, head, &out) && desc_matches(&out, head));
      head++;
      mk_proxy_queue_release(q, head);
    }
    /* the slot of the next ticket still holds a ticket one lap old (or nothing) */
    if (head == next) CHECK(!mk_proxy_queue_peek(q, head, &out));
  }
  CHECK(p.tail > 4 * 100); /* many laps */
  free(q);
}

/* Two threads, a small ring: every descriptor arrives once, in order, with its fields. */
struct stress {
  struct mk_proxy_queue* q;
  uint64_t n;
  int bad;
};

static void* consumer_main(void* arg) {
  struct stress* s = arg;
  struct mk_proxy_desc out;
  for (uint64_t t = 0; t < s->n;) {
    if (!mk_proxy_queue_peek(s->q, t, &out)) continue;
    if (!desc_matches(&out, t)) s->bad++;
    t++;
    mk_proxy_queue_release(s->q, t);
    mk_proxy_queue_complete(s->q, t);
  }
  return NULL;
}

static void order_threads(void) {
  struct stress s = {.q = queue_new(8), .n = 300000};
  struct mk_proxy_producer p;
  mk_proxy_producer_init(&p, s.q, 0);
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, consumer_main, &s) == 0);
  for (uint64_t t = 0; t < s.n; t++) {
    struct mk_proxy_desc d = desc_of(t);
    CHECK_EQ(mk_proxy_publish(&p, &d, 20ull * 1000000000, NULL), 0);
  }
  CHECK_EQ(mk_proxy_wait_completed(&p, s.n - 1, 20ull * 1000000000), 0);
  pthread_join(th, NULL);
  CHECK_EQ(s.bad, 0);
  CHECK_EQ(s.q->consumed, s.n);
  CHECK(p.full_waits > 0); /* the producer did meet a full ring */
  printf("  %llu descriptors through depth 8, %llu publishes waited for a slot\n",
         (unsigned long long)s.n, (unsigned long long)p.full_waits);
  free(s.q);
}

/* Several producers on one tail word (mk_proxy_mp_publish), a ring of 8: every producer's
 * descriptors arrive exactly once and in its own order, tickets without gaps. */
enum { MP_THREADS = 4, MP_EACH = 5000 };
struct mp_arg {
  struct mk_proxy_queue* q;
  uint64_t* tail;
  int id, rc;
};

static void* mp_producer_main(void* arg) {
  struct mp_arg* a = arg;
  for (uint64_t i = 0; i < MP_EACH && !a->rc; i++) {
    struct mk_proxy_desc d = {0};
    d.op = MK_PROXY_PUT;
    d.peer = a->id;
    d.src_off = i;
    d.size = i ^ (uint64_t)a->id;
    a->rc = mk_proxy_mp_publish(a->q, a->tail, &d, 20ull * 1000000000, a->id, NULL);
  }
  return NULL;
}

static void order_producers(void) {
  struct mk_proxy_queue* q = queue_new(8);
  uint64_t tail = 0, next[MP_THREADS] = {0};
  struct mp_arg args[MP_THREADS];
  pthread_t th[MP_THREADS];
  for (int i = 0; i < MP_THREADS; i++) {
    args[i] = (struct mp_arg){.q = q, .tail = &tail, .id = i};
    REQUIRE(pthread_create(&th[i], NULL, mp_producer_main, &args[i]) == 0);
  }
  int bad = 0;
  struct mk_proxy_desc out;
  for (uint64_t t = 0; t < (uint64_t)MP_THREADS * MP_EACH;) {
    if (!mk_proxy_queue_peek(q, t, &out)) {
      sched_yield(); /* five threads on few cores */
      continue;
    }
    const int id = out.peer;
    bad += id < 0 || id >= MP_THREADS || out.seq != t + 1 || out.src_off != next[id] ||
           out.size != (next[id] ^ (uint64_t)id);
    if (id >= 0 && id < MP_THREADS) next[id]++;
    t++;
    mk_proxy_queue_release(q, t);
  }
  for (int i = 0; i < MP_THREADS; i++) {
    pthread_join(th[i], NULL);
    CHECK_EQ(args[i].rc, 0);
    CHECK_EQ(next[i], MP_EACH);
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(tail, (uint64_t)MP_THREADS * MP_EACH);
  CHECK(!mk_proxy_queue_peek(q, tail, &out)); /* nothing beyond the last ticket */
  printf("  %d producers x %d descriptors through depth 8 on one tail, each in its order\n", MP_THREADS,
         MP_EACH);
  free(q);
}

/* A full ring: try says -EAGAIN; a bounded publish times out and names itself in the
 * producer's record; once a slot is released, publishing works again. A failed proxy ends
 * every wait at once with its error. */
static void full(void) {
  struct mk_proxy_queue* q = queue_new(4);
  struct mk_proxy_producer p;
  mk_proxy_producer_init(&p, q, 3);
  for (uint64_t t = 0; t < 4; t++) {
    struct mk_proxy_desc d = desc_of(t);
    CHECK_EQ(mk_proxy_try_publish(&p, &d, NULL), 0);
  }
  struct mk_proxy_desc d = desc_of(4);
  CHECK_EQ(mk_proxy_try_publish(&p, &d, NULL), -EAGAIN);
  CHECK_EQ(q->producer_err.aborted, 0);
  uint64_t t0 = mk_pq_now_ns();
  CHECK_EQ(mk_proxy_publish(&p, &d, 50 * 1000000ull, NULL), -ETIMEDOUT);
  uint64_t dt = mk_pq_now_ns() - t0;
  CHECK(dt >= 50 * 1000000ull && dt < 5000 * 1000000ull);
  CHECK_EQ(q->producer_err.aborted, 1);
  CHECK_EQ(q->producer_err.err, -ETIMEDOUT);
  CHECK_EQ(q->producer_err.kind, MK_PROXY_ERR_QUEUE_FULL);
  CHECK_EQ(q->producer_err.rank, 3);
  CHECK_EQ(q->producer_err.peer, d.peer);
  CHECK_EQ(q->producer_err.seq, 4);
  CHECK_EQ(q->producer_err.expected, 1);
  CHECK_EQ(q->producer_err.seen, 0);
  char msg[256];
  mk_proxy_error_format(&q->producer_err, msg, sizeof(msg));
  printf("  %s\n", msg);
  CHECK(strstr(msg, "rank 3") && strstr(msg, "descriptor 4") && strstr(msg, "queue full"));

  /* a fresh queue: release one slot, the next publish goes through */
  struct mk_proxy_queue* q2 = queue_new(4);
  mk_proxy_producer_init(&p, q2, 0);
  for (uint64_t t = 0; t < 4; t++) {
    struct mk_proxy_desc e = desc_of(t);
    CHECK_EQ(mk_proxy_try_publish(&p, &e, NULL), 0);
  }
  mk_proxy_queue_release(q2, 1);
  CHECK_EQ(mk_proxy_publish(&p, &d, 50 * 1000000ull, NULL), 0);
  struct mk_proxy_desc out;
  CHECK(mk_proxy_queue_peek(q2, 4, &out) && desc_matches(&out, 4));

  /* the proxy failed: a producer waiting on the full ring returns its error at once */
  mk_proxy_error_raise(&q2->proxy_err, -ECONNRESET, 0, 1, MK_PROXY_ERR_TRANSPORT, 0, 2,
                       MK_PROXY_PUT, 0, 0, 0);
  struct mk_proxy_desc e = desc_of(5);
  t0 = mk_pq_now_ns();
  CHECK_EQ(mk_proxy_publish(&p, &e, 10ull * 1000000000, NULL), -ECONNRESET);
  CHECK(mk_pq_now_ns() - t0 < 1000000000ull);
  CHECK_EQ(q2->producer_err.aborted, 0); /* the producer did not time out: nothing of its own */
  uint64_t flag = 0;
  CHECK_EQ(mk_proxy_wait_flag(q2, &flag, 0, 1, 10ull * 1000000000, 0, 0), -ECONNRESET);
  free(q);
  free(q2);
}

/* Flag and completion waits: success, and expiry with the record naming the flag. */
static void waits(void) {
  struct mk_proxy_queue* q = queue_new(4);
  struct mk_proxy_producer p;
  mk_proxy_producer_init(&p, q, 1);
  uint64_t flags[4] = {0, 0, 5, 0};
  CHECK_EQ(mk_proxy_wait_flag(q, &flags[2], 16, 5, 1000000, 1, 0), 0);
  CHECK_EQ(mk_proxy_wait_flag(q, &flags[2], 16, 4, 1000000, 1, 0), 0); /* >= */
  CHECK_EQ(mk_proxy_wait_flag(q, &flags[3], 24, 2, 20 * 1000000ull, 1, 0x42), -ETIMEDOUT);
  CHECK_EQ(q->producer_err.kind, MK_PROXY_ERR_FLAG_TIMEOUT);
  CHECK_EQ(q->producer_err.flag_off, 24);
  CHECK_EQ(q->producer_err.expected, 2);
  CHECK_EQ(q->producer_err.seen, 0);
  CHECK_EQ(q->producer_err.tag, 0x42);
  /* the first error stays: a second one does not overwrite it */
  mk_proxy_error_raise(&q->producer_err, -EIO, 1, -1, MK_PROXY_ERR_QUEUE_FULL, 0, 0, 0, 0, 0, 0);
  CHECK_EQ(q->producer_err.kind, MK_PROXY_ERR_FLAG_TIMEOUT);
  struct mk_proxy_queue* q2 = queue_new(4);
  mk_proxy_producer_init(&p, q2, 1);
  struct mk_proxy_desc d = desc_of(0);
  CHECK_EQ(mk_proxy_try_publish(&p, &d, NULL), 0);
  CHECK_EQ(mk_proxy_wait_completed(&p, 0, 20 * 1000000ull), -ETIMEDOUT);
  CHECK_EQ(q2->producer_err.kind, MK_PROXY_ERR_COMPLETION_TIMEOUT);
  free(q);
  free(q2);
  q2 = queue_new(4);
  mk_proxy_producer_init(&p, q2, 1);
  mk_proxy_queue_complete(q2, 1);
  CHECK_EQ(mk_proxy_wait_completed(&p, 0, 20 * 1000000ull), 0);
  free(q2);
}

static void desc_check(void) {
  unsigned char remote[3] = {0, 1, 1};
  struct mk_rkey data = {.base = 0, .key = 1, .size = 1000};
  struct mk_rkey flags = {.base = 0, .key = 2, .size = 64};
  struct mk_proxy_desc d = {.op = MK_PROXY_PUT_SIGNAL, .peer = 1, .src_off = 0, .dst_off = 500,
                            .size = 500, .flag_off = 56, .flag_value = 1};
  CHECK_EQ(mk_proxy_desc_check(&d, 3, remote, 600, &data, &flags), 0);
  struct mk_proxy_desc e = d;
  e.size = 501; /* past the peer's region */
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 2000, &data, &flags), -EINVAL);
  e = d;
  e.src_off = 101; /* past ours */
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), -EINVAL);
  e = d;
  e.flag_off = 60; /* unaligned */
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), -EINVAL);
  e.flag_off = 64; /* past the flags */
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), -EINVAL);
  e = d;
  e.peer = 0; /* a local rank is not the proxy's */
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), -EINVAL);
  e.peer = 3;
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), -EINVAL);
  e = d;
  e.op = 9;
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), -EINVAL);
  e.op = MK_PROXY_PUT | MK_PROXY_FENCE;
  e.flag_off = 4096; /* a plain put ignores the flag */
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), 0);
  e = d;
  e.op = MK_PROXY_SIGNAL;
  e.size = ~0ull; /* a signal ignores the data */
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), 0);
  e.dst_off = ~0ull - 3; /* overflow-proof */
  e.op = MK_PROXY_PUT;
  e.size = 8;
  CHECK_EQ(mk_proxy_desc_check(&e, 3, remote, 600, &data, &flags), -EINVAL);
}

static void local_team(void) {
  CHECK(mk_local_team_same(0, 7, 0));  /* 0: one team */
  CHECK(!mk_local_team_same(0, 1, 1)); /* 1: every rank its own node */
  CHECK(mk_local_team_same(2, 3, 2));
  CHECK(!mk_local_team_same(1, 2, 2));
  CHECK(mk_local_team_same(4, 7, 4) && !mk_local_team_same(3, 4, 4));
}

int main(int argc, char** argv) {
  alarm(60);
  const char* what = argc > 1 ? argv[1] : "all";
  int all = strcmp(what, "all") == 0;
  if (all || !strcmp(what, "layout")) layout();
  if (all || !strcmp(what, "order")) order_single(), order_threads(), order_producers();
  if (all || !strcmp(what, "wrap")) wrap();
  if (all || !strcmp(what, "full")) full(), waits();
  if (all || !strcmp(what, "check")) desc_check(), local_team();
  return MK_TEST_RESULT();
}
