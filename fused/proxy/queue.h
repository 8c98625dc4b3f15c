/*
 * The descriptor queue between a kernel and its proxy thread (DESIGN.md "Inter-node for
 * fused ops"): one single-producer/single-consumer ring of fixed-size descriptors in
 * host-mapped memory (cudaHostAllocMapped in production, plain memory in CPU tests). The
 * producer is one GPU thread (or the CPU stand-in of the tests); the consumer is the proxy
 * thread (proxy.c), which turns each descriptor into a one-sided transport operation.
 *
 * A descriptor says: put `size` bytes from our data region at `src_off` to peer `peer`'s data
 * region at `dst_off`, then (PUT_SIGNAL) write `flag_value` into the peer's flag region at
 * `flag_off`, never visible before the data; or (SIGNAL) only write the flag. A SIGNAL, and
 * any descriptor with MK_PROXY_FENCE, is posted only after every earlier descriptor to the
 * same peer has completed, so its flag also covers those earlier puts.
 *
 * Layout (bytes; every part a whole number of 64-byte lines, so producer-written and
 * consumer-written words never share a line):
 *   header    : 1 x 256           struct mk_proxy_queue
 *     line 0  : magic, depth                     (constant after mk_proxy_queue_init)
 *     line 1  : consumed, completed              (written by the proxy only)
 *     line 2  : proxy_err    1 x 64              (written by the proxy only)
 *     line 3  : producer_err 1 x 64              (written by the producers only)
 *   slots     : depth x 64        struct mk_proxy_desc, slot = ticket % depth
 *
 * Protocol. Tickets count descriptors from 0. The producer owns ticket t when
 * t < consumed + depth; it writes the slot's fields, then publishes with a release store of
 * slot.seq = t + 1. The consumer waiting for ticket t acquires slot.seq and takes the slot
 * when it reads t + 1 (a slot one lap old reads t + 1 - depth, so laps never alias); after
 * copying the fields out it release-stores consumed = t + 1, which hands the slot back.
 * completed = t + 1 once the operations of tickets <= t have completed at the source (the
 * bytes at src_off may be rewritten; with a signal, the peer may see the flag).
 *
 * Fences each side needs:
 *  - GPU producer: the data a descriptor names must be visible at system scope before the
 *    publish. Threads that wrote it with TMA stores wait for their bulk groups
 *    (cp.async.bulk.wait_group 0) and do fence.proxy.async.global; then all writers and the
 *    publishing thread meet at a barrier (bar.sync / named barrier); the publisher does
 *    fence.acq_rel.sys, writes the slot's fields (plain stores to host-mapped memory), and
 *    st.release.sys the seq. It reads `consumed` / `completed` / `proxy_err` with
 *    ld.acquire.sys (slot reuse must not overtake the proxy's reads of the old contents).
 *  - CPU proxy: acquire load of seq, then the fields; release store of consumed after the
 *    copy; release store of completed after the transport reported completion.
 *  - Waiting for a flag a peer's proxy raises: ld.acquire.sys of the flag (on the GPU then
 *    fence.proxy.async.global before TMA loads of the data behind it); the transport
 *    guarantees the flag is written after its data is visible.
 *
 * Errors. Each side writes only its own record: the fields, then a release store of
 * `aborted` = 1. Every wait here is bounded by a timeout and returns at once when the
 * other side's record is set, so neither a dead proxy nor a dead producer leaves the other
 * waiting. The producers' record may be raised by several producers at once (the CTAs of
 * mk_proxy_mp_publish, host-mapped memory without atomics), so its fields can mix; only
 * `aborted` and `err` (-ETIMEDOUT from every producer) are read (mk_proxy_queue_failed), and
 * a fused call's account of what it waited for is the GEMM error record, which a claim word
 * keeps whole (gemm.h mk_gemm_error).
 *
 * GPU status: the device paths of this header (the __CUDA_ARCH__ branches) run in the
 * cross-node fused ops (gemm_push_xnode.cuh, gemm_rs.cuh; `scripts/gpu-check.sh xnode`) and
 * in queue_dev_check.cu's compile check.
 */
#ifndef MK_PROXY_QUEUE_H_
#define MK_PROXY_QUEUE_H_

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/mk_hd.h"
#include <sched.h>
#include <time.h>

#if defined(__cplusplus)
#define MK_PQ_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define MK_PQ_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

#define MK_PROXY_QUEUE_MAGIC 0x4d4b5051u /* "MKPQ" */
#define MK_PROXY_QUEUE_MAX_DEPTH (1u << 20)

/* desc.op: one operation, optionally | MK_PROXY_FENCE. */
enum mk_proxy_op {
  MK_PROXY_PUT = 1,        /* size bytes, no flag */
  MK_PROXY_PUT_SIGNAL = 2, /* size bytes, then the flag (never visible before the data) */
  MK_PROXY_SIGNAL = 3,     /* the flag only; always fenced */
};
#define MK_PROXY_OP_MASK 0xffu
#define MK_PROXY_FENCE 0x100u /* post after every earlier descriptor to this peer completed */

/* error.kind */
enum mk_proxy_err_kind {
  MK_PROXY_ERR_NONE = 0,
  MK_PROXY_ERR_TRANSPORT = 1,    /* proxy: a transport operation failed (dead peer, ...) */
  MK_PROXY_ERR_BAD_DESC = 2,     /* proxy: a descriptor out of bounds or malformed */
  MK_PROXY_ERR_QUEUE_FULL = 3,   /* producer: no free slot within the timeout */
  MK_PROXY_ERR_FLAG_TIMEOUT = 4, /* waiter: a flag did not reach its value within the timeout */
  MK_PROXY_ERR_COMPLETION_TIMEOUT = 5, /* producer: a ticket did not complete in time */
};

/* One descriptor slot. desc: 1 x 64. */
struct mk_proxy_desc {
  uint64_t seq;        /* ticket + 1, stored last (release); 0: never written */
  uint32_t op;         /* enum mk_proxy_op | MK_PROXY_FENCE */
  int32_t peer;        /* destination rank */
  uint64_t src_off;    /* in our data region */
  uint64_t dst_off;    /* in the peer's data region */
  uint64_t size;       /* bytes; 0 allowed */
  uint64_t flag_off;   /* in the peer's flag region, 8-byte aligned */
  uint64_t flag_value;
  uint32_t tag;        /* the caller's op/rank tag, copied into an error record */
  uint32_t reserved;
};

/* What went wrong, for the host's asynchronous error. error: 1 x 64.
 * TRANSPORT / BAD_DESC: seq/op/peer/flag_off of the descriptor (seq = ~0 when the failure
 *   was on an idle connection), expected = its flag value, seen = tickets completed so far.
 * QUEUE_FULL: seq = the ticket that found no slot, expected = the `consumed` it needed,
 *   seen = the `consumed` it read.
 * FLAG_TIMEOUT: flag_off, expected = the value waited for, seen = the last value read.
 * COMPLETION_TIMEOUT: seq = the ticket waited for, expected = seq + 1, seen = `completed`. */
struct mk_proxy_error {
  uint32_t aborted; /* stored last (release) */
  int32_t err;      /* negative errno */
  int32_t rank;     /* who wrote it */
  int32_t peer;     /* -1 when none */
  uint32_t kind;    /* enum mk_proxy_err_kind */
  uint32_t tag;
  uint64_t seq;
  uint32_t op;
  uint32_t reserved;
  uint64_t flag_off;
  uint64_t expected;
  uint64_t seen;
};

/* The header; the slots follow it. header: 1 x 256. */
struct mk_proxy_queue {
  uint32_t magic;
  uint32_t depth;          /* a power of two */
  uint64_t pad0[7];
  uint64_t consumed;       /* proxy: tickets < consumed have been read; slots free */
  uint64_t completed;      /* proxy: tickets < completed have completed at the source */
  uint64_t pad1[6];
  struct mk_proxy_error proxy_err;
  struct mk_proxy_error producer_err;
};

MK_PQ_STATIC_ASSERT(sizeof(struct mk_proxy_desc) == 64, "descriptor: one 64-byte line");
MK_PQ_STATIC_ASSERT(sizeof(struct mk_proxy_error) == 64, "error record: one 64-byte line");
MK_PQ_STATIC_ASSERT(sizeof(struct mk_proxy_queue) == 256, "header: four 64-byte lines");
MK_PQ_STATIC_ASSERT(offsetof(struct mk_proxy_queue, consumed) == 64, "consumer line");
MK_PQ_STATIC_ASSERT(offsetof(struct mk_proxy_queue, proxy_err) == 128, "proxy error line");
MK_PQ_STATIC_ASSERT(offsetof(struct mk_proxy_queue, producer_err) == 192, "producer error line");
MK_PQ_STATIC_ASSERT(offsetof(struct mk_proxy_desc, seq) == 0, "seq first");

/* The producer's private state (registers or shared memory on the GPU). */
struct mk_proxy_producer {
  struct mk_proxy_queue* q;
  uint64_t tail;     /* next ticket */
  uint64_t consumed; /* last value read from q->consumed */
  uint32_t depth;
  int32_t rank;
  uint64_t full_waits; /* publishes that found the ring full (statistics) */
};

/* ---- memory-model primitives: system scope on the GPU, C11-style atomics on the host ---- */

MK_HD uint64_t mk_pq_load_acquire(const uint64_t* p) {
#ifdef __CUDA_ARCH__
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

MK_HD uint32_t mk_pq_load_acquire_u32(const uint32_t* p) {
#ifdef __CUDA_ARCH__
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

MK_HD void mk_pq_store_release(uint64_t* p, uint64_t v) {
#ifdef __CUDA_ARCH__
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

MK_HD void mk_pq_store_release_u32(uint32_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

/* Claims the next ticket of a tail word shared by several producers. */
MK_HD uint64_t mk_pq_fetch_add(uint64_t* p, uint64_t v) {
#ifdef __CUDA_ARCH__
  return (uint64_t)atomicAdd((unsigned long long*)p, (unsigned long long)v);
#else
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
#endif
}

/* Before publishing data other threads wrote (after they met the publisher at a barrier). */
MK_HD void mk_pq_fence_sys(void) {
#ifdef __CUDA_ARCH__
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

MK_HD uint64_t mk_pq_now_ns(void) {
#ifdef __CUDA_ARCH__
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
#endif
}

/* One step of a bounded wait: back off a little. */
MK_HD void mk_pq_pause(uint32_t spins) {
#ifdef __CUDA_ARCH__
  (void)spins;
  __nanosleep(128);
#else
  if ((spins & 15u) == 15u) sched_yield(); /* CPU stand-in: share the cores */
#endif
}

/* ---- layout ---- */

MK_HD size_t mk_proxy_queue_bytes(uint32_t depth) {
  return sizeof(struct mk_proxy_queue) + (size_t)depth * sizeof(struct mk_proxy_desc);
}

MK_HD struct mk_proxy_desc* mk_proxy_queue_slot(struct mk_proxy_queue* q, uint64_t ticket) {
  return (struct mk_proxy_desc*)(q + 1) + (ticket & (uint64_t)(q->depth - 1));
}

/* Host, before the queue is shared: zero everything, set the constants. 0 or -EINVAL
 * (depth not a power of two in [1, MK_PROXY_QUEUE_MAX_DEPTH]). */
MK_HD int mk_proxy_queue_init(struct mk_proxy_queue* q, uint32_t depth) {
  if (!q || depth == 0 || depth > MK_PROXY_QUEUE_MAX_DEPTH || (depth & (depth - 1))) return -EINVAL;
  unsigned char* b = (unsigned char*)q;
  for (size_t i = 0; i < mk_proxy_queue_bytes(depth); i++) b[i] = 0;
  q->magic = MK_PROXY_QUEUE_MAGIC;
  q->depth = depth;
  return 0;
}

/* ---- error records ---- */

/* Fills a record owned by the caller (one writer per record), then raises it. The first
 * error wins: a record already raised is left as it is. */
MK_HD void mk_proxy_error_raise(struct mk_proxy_error* e, int err, int rank, int peer,
                                uint32_t kind, uint32_t tag, uint64_t seq, uint32_t op,
                                uint64_t flag_off, uint64_t expected, uint64_t seen) {
  if (mk_pq_load_acquire_u32(&e->aborted)) return;
  e->err = err;
  e->rank = rank;
  e->peer = peer;
  e->kind = kind;
  e->tag = tag;
  e->seq = seq;
  e->op = op;
  e->flag_off = flag_off;
  e->expected = expected;
  e->seen = seen;
  mk_pq_store_release_u32(&e->aborted, 1);
}

/* 0 while neither side has raised its record, else that record's negative errno. */
MK_HD int mk_proxy_queue_failed(const struct mk_proxy_queue* q) {
  if (mk_pq_load_acquire_u32(&q->proxy_err.aborted)) return q->proxy_err.err ? q->proxy_err.err : -EIO;
  if (mk_pq_load_acquire_u32(&q->producer_err.aborted))
    return q->producer_err.err ? q->producer_err.err : -EIO;
  return 0;
}

/* ---- producer ---- */

/* Writes ticket t's slot (the ticket is the caller's, the slot free) and publishes it. */
MK_HD void mk_proxy_slot_fill(struct mk_proxy_queue* q, uint64_t t, const struct mk_proxy_desc* d) {
  struct mk_proxy_desc* s = mk_proxy_queue_slot(q, t);
  s->op = d->op;
  s->peer = d->peer;
  s->src_off = d->src_off;
  s->dst_off = d->dst_off;
  s->size = d->size;
  s->flag_off = d->flag_off;
  s->flag_value = d->flag_value;
  s->tag = d->tag;
  s->reserved = 0;
  mk_pq_store_release(&s->seq, t + 1); /* publish: the fields above are visible first */
}

MK_HD void mk_proxy_producer_init(struct mk_proxy_producer* p, struct mk_proxy_queue* q,
                                  int rank) {
  p->q = q;
  p->tail = 0;
  p->consumed = 0;
  p->depth = q->depth;
  p->rank = rank;
  p->full_waits = 0;
}

/* Publishes *d (its seq is ignored) as the next ticket: 0 (and *ticket when not NULL), or
 * -EAGAIN when the ring is full, or the proxy's error once it has failed. Never waits. */
MK_HD int mk_proxy_try_publish(struct mk_proxy_producer* p, const struct mk_proxy_desc* d,
                               uint64_t* ticket) {
  struct mk_proxy_queue* q = p->q;
  if (p->tail - p->consumed >= p->depth) {
    p->consumed = mk_pq_load_acquire(&q->consumed);
    if (p->tail - p->consumed >= p->depth) {
      int failed = mk_proxy_queue_failed(q);
      return failed ? failed : -EAGAIN;
    }
  }
  mk_proxy_slot_fill(q, p->tail, d);
  if (ticket) *ticket = p->tail;
  p->tail++;
  return 0;
}

/* As mk_proxy_try_publish, waiting up to timeout_ns for a free slot; on expiry it raises
 * the producer's record (QUEUE_FULL) and returns -ETIMEDOUT. */
MK_HD int mk_proxy_publish(struct mk_proxy_producer* p, const struct mk_proxy_desc* d,
                           uint64_t timeout_ns, uint64_t* ticket) {
  int rc = mk_proxy_try_publish(p, d, ticket);
  if (rc != -EAGAIN) return rc;
  p->full_waits++;
  uint64_t t0 = mk_pq_now_ns();
  for (uint32_t spins = 0;; spins++) {
    mk_pq_pause(spins);
    rc = mk_proxy_try_publish(p, d, ticket);
    if (rc != -EAGAIN) return rc;
    if (mk_pq_now_ns() - t0 > timeout_ns) {
      mk_proxy_error_raise(&p->q->producer_err, -ETIMEDOUT, p->rank, d->peer,
                           MK_PROXY_ERR_QUEUE_FULL, d->tag, p->tail, d->op, d->flag_off,
                           p->tail + 1 - p->depth, p->consumed);
      return -ETIMEDOUT;
    }
  }
}

/* Waits until ticket has completed at the source (its src bytes may be rewritten), bounded
 * like mk_proxy_publish (COMPLETION_TIMEOUT, raised in the producers' record as `rank`). For
 * any producer of q, the shared-tail ones (mk_proxy_mp_publish) included. */
MK_HD int mk_proxy_queue_wait_completed(struct mk_proxy_queue* q, int rank, uint64_t ticket,
                                        uint64_t timeout_ns) {
  uint64_t t0 = mk_pq_now_ns(), seen = 0;
  for (uint32_t spins = 0;; spins++) {
    seen = mk_pq_load_acquire(&q->completed);
    if (seen > ticket) return 0;
    int failed = mk_proxy_queue_failed(q);
    if (failed) return failed;
    if (mk_pq_now_ns() - t0 > timeout_ns) break;
    mk_pq_pause(spins);
  }
  mk_proxy_error_raise(&q->producer_err, -ETIMEDOUT, rank, -1,
                       MK_PROXY_ERR_COMPLETION_TIMEOUT, 0, ticket, 0, 0, ticket + 1, seen);
  return -ETIMEDOUT;
}

/* The same for the single producer p. */
MK_HD int mk_proxy_wait_completed(struct mk_proxy_producer* p, uint64_t ticket,
                                  uint64_t timeout_ns) {
  return mk_proxy_queue_wait_completed(p->q, p->rank, ticket, timeout_ns);
}

/* ---- several producers (the GEMM's CTAs, each publishing its own tiles) ----
 * Each claims a ticket with an atomic add on a tail word they share (device memory for
 * kernel producers; it only grows, 0 at init), waits (bounded) until the ring has room for
 * that ticket, fills its slot and publishes it as the single producer does. The consumer reads
 * tickets in order, so a slow producer holds back the ones after it, never reorders them.
 * A producer that gives up (timeout, failed proxy) leaves its ticket unpublished: the queue
 * stops there for good, which only a failed communicator tolerates (the producer's record is
 * raised, every wait of the others then ends at once). */
MK_HD int mk_proxy_mp_publish(struct mk_proxy_queue* q, uint64_t* tail, const struct mk_proxy_desc* d,
                              uint64_t timeout_ns, int rank, uint64_t* ticket) {
  const uint64_t t = mk_pq_fetch_add(tail, 1);
  uint64_t consumed = mk_pq_load_acquire(&q->consumed);
  if (t - consumed >= q->depth) {
    const uint64_t t0 = mk_pq_now_ns();
    for (uint32_t spins = 0; t - consumed >= q->depth; spins++) {
      int failed = mk_proxy_queue_failed(q);
      if (failed) return failed;
      if (mk_pq_now_ns() - t0 > timeout_ns) {
        mk_proxy_error_raise(&q->producer_err, -ETIMEDOUT, rank, d->peer, MK_PROXY_ERR_QUEUE_FULL, d->tag, t,
                             d->op, d->flag_off, t + 1 - q->depth, consumed);
        return -ETIMEDOUT;
      }
      mk_pq_pause(spins);
      consumed = mk_pq_load_acquire(&q->consumed);
    }
  }
  mk_proxy_slot_fill(q, t, d);
  if (ticket) *ticket = t;
  return 0;
}

/* Waits until *flag >= value (a flag a peer's proxy raises in our flag region), bounded:
 * on expiry it raises the producer's record (FLAG_TIMEOUT, naming flag_off) and returns
 * -ETIMEDOUT; returns the proxy's error at once when the proxy has failed. */
MK_HD int mk_proxy_wait_flag(struct mk_proxy_queue* q, const uint64_t* flag, uint64_t flag_off,
                             uint64_t value, uint64_t timeout_ns, int rank, uint32_t tag) {
  uint64_t t0 = mk_pq_now_ns(), seen = 0;
  for (uint32_t spins = 0;; spins++) {
    seen = mk_pq_load_acquire(flag);
    if (seen >= value) return 0;
    int failed = mk_proxy_queue_failed(q);
    if (failed) return failed;
    if (mk_pq_now_ns() - t0 > timeout_ns) break;
    mk_pq_pause(spins);
  }
  mk_proxy_error_raise(&q->producer_err, -ETIMEDOUT, rank, -1, MK_PROXY_ERR_FLAG_TIMEOUT, tag,
                       ~0ull, MK_PROXY_SIGNAL, flag_off, value, seen);
  return -ETIMEDOUT;
}

/* ---- consumer (the proxy thread; host) ---- */

/* 1 and a copy of ticket's descriptor in *out when it is published, else 0. */
MK_HD int mk_proxy_queue_peek(struct mk_proxy_queue* q, uint64_t ticket, struct mk_proxy_desc* out) {
  struct mk_proxy_desc* s = mk_proxy_queue_slot(q, ticket);
  if (mk_pq_load_acquire(&s->seq) != ticket + 1) return 0;
  *out = *s;
  return 1;
}

/* Hands slots back: tickets < consumed have been copied out. */
MK_HD void mk_proxy_queue_release(struct mk_proxy_queue* q, uint64_t consumed) {
  mk_pq_store_release(&q->consumed, consumed);
}

/* Tickets < completed have completed at the source. */
MK_HD void mk_proxy_queue_complete(struct mk_proxy_queue* q, uint64_t completed) {
  mk_pq_store_release(&q->completed, completed);
}

#endif /* MK_PROXY_QUEUE_H_ */
