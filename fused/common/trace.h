/*
 * Trace events from inside a persistent kernel (issue 14), C and CUDA.
 *
 * With NCCL_MK_TRACE=1 every writer of every CTA (the producer thread, each consumer warp
 * group's leader, the storer warps' leader, the comm warps) appends compact events to a ring
 * of its own in one device buffer; the host copies the buffer out after the call and writes
 * one file per rank, which scripts/mk-trace turns into a Perfetto trace, a PNG timeline, a
 * summary and hang reports. With the trace pointer NULL every helper below is one uniform
 * branch on a register and nothing else (no load, no store, no timer read).
 *
 * Why one ring per writer ("lane") rather than one per CTA: a single writer needs no atomics
 * (the count lives in a register and is stored after each event, so the host still sees it
 * after a hang), and events of one lane never overlap in time, which is exactly one Perfetto
 * track. A CTA owns MK_TRACE_LANES consecutive rings.
 *
 * Buffer layout (device memory, also the file layout; little-endian):
 *   header: 1 x sizeof(struct mk_trace_header)            = 64 bytes
 *   rings:  nrings x sizeof(struct mk_trace_ring)         = nrings x 16  (nrings = ctas x lanes)
 *   events: nrings x capacity x sizeof(struct mk_trace_event) = nrings x capacity x 32
 * Ring i's event j lives at events[i * capacity + (j & (capacity - 1))]: a ring overwrites its
 * oldest events when full (a hang report wants the newest ones); `count` keeps counting, so
 * count - capacity events were lost.
 *
 * File (version 1, written by mk_trace_write, read by scripts/mktrace/fmt.py): the header
 * (with `dropped` filled in), the ring table, then each ring's kept events oldest first,
 * ring after ring: min(count, capacity) events for ring i. Nothing else; no padding.
 *
 * Where the calls go in fused/common/gemm.cuh (wired by the session that runs it on a GPU):
 *   kernel entry:   pass `struct mk_trace_buf* trace` in mk_gemm_params (NULL when off).
 *   gemm_producer:  w = mk_trace_open(p.trace, blockIdx.x, MK_TRACE_LANE_PRODUCER);
 *                   around gemm_wait_row_block: t0 = mk_trace_now(&w) before, then
 *                   mk_trace_wait(&w, MK_TRACE_PRODUCER, t0, t.linear, mb, target, seen)
 *                   after, on success and on timeout alike (the last event of a hang);
 *                   around the K-block loop of a tile: mk_trace_begin / mk_trace_end(...,
 *                   MK_TRACE_TILE, t.linear, t.mb (the ready flag it needed), ...).
 *   gemm_consumer:  lane MK_TRACE_LANE_CONSUMER0 + wg, thread 0 of the warp group; one tile
 *                   event from the first wgmma to the end of its epilogue.
 *   gemm_storer:    lane MK_TRACE_LANE_STORER, thread stid == 0; one tile event from the
 *                   c_full wait's end to the tile flag's release.
 *   comm warps:     lane MK_TRACE_LANE_COMM; one MK_TRACE_CHUNK event per chunk pushed
 *                   (role COMM_SEND, peer = destination, flag = the destination's flag index,
 *                   expected = the value raised to, end = after the release store) or pulled
 *                   (role COMM_RECV, peer = source, flag = the local flag raised).
 *   MoE dispatch:   its kernel's thread 0 of each CTA, lane MK_TRACE_LANE_COMM (the grouped GEMM
 *                   after it writes the other lanes): MK_TRACE_PHASE events (route on every
 *                   CTA, the counts exchange on the last one, then push or expand), the push's
 *                   chunks, and the waits for `routed` / `offsets_ready` (fused/moe/moe.h).
 */
#ifndef MK_TRACE_H_
#define MK_TRACE_H_

#include <stddef.h>
#include <stdint.h>

#define MK_TRACE_MAGIC 0x52544b4du /* "MKTR" read as little-endian bytes */
#define MK_TRACE_VERSION 1
#define MK_TRACE_LANES 5          /* rings per CTA, see enum mk_trace_lane */
#define MK_TRACE_NO_PEER 0xffffu

/* Who wrote an event. */
enum mk_trace_role {
  MK_TRACE_PRODUCER = 0,  /* TMA-issuing thread: waits for ready flags, loads A and B */
  MK_TRACE_CONSUMER = 1,  /* a consumer warp group: wgmma and (sync) epilogue */
  MK_TRACE_STORER = 2,    /* storer warps: write the staged tile out, raise its flag */
  MK_TRACE_COMM_SEND = 3, /* comm warps pushing a chunk to a peer */
  MK_TRACE_COMM_RECV = 4, /* comm warps pulling a chunk from a peer */
  MK_TRACE_PROXY = 5,     /* the host proxy thread of an inter-node op (host-written ring) */
  MK_TRACE_ROLE_COUNT
};

/* What an event covers. */
enum mk_trace_kind {
  MK_TRACE_TILE = 0,  /* one output tile, id = linear tile, flag = ready flag it needed */
  MK_TRACE_CHUNK = 1, /* one chunk moved, id = chunk, flag = flag raised when it landed */
  MK_TRACE_WAIT = 2,  /* a bounded wait, id = tile or chunk it was for, flag = flag index */
  MK_TRACE_PHASE = 3, /* one phase of a multi-phase kernel on this CTA, id = the op's phase number
                         (MoE dispatch: enum mk_moe_trace_phase in fused/moe/moe.h) */
  MK_TRACE_KIND_COUNT
};

/* Which ring of its CTA a writer owns. */
enum mk_trace_lane {
  MK_TRACE_LANE_PRODUCER = 0,
  MK_TRACE_LANE_CONSUMER0 = 1,
  MK_TRACE_LANE_CONSUMER1 = 2,
  MK_TRACE_LANE_STORER = 3,
  MK_TRACE_LANE_COMM = 4,
};

/* One event, 32 bytes. Times are %globaltimer nanoseconds; ranks on one host share that
 * clock (ASSUMPTION, checked by the GPU session; header.clock_offset_ns corrects it). */
struct mk_trace_event {
  uint64_t start_ns;
  uint32_t dur_ns;   /* end - start, saturated at 0xffffffff (4.29 s: a wait that long hung) */
  uint8_t role;      /* enum mk_trace_role */
  uint8_t kind;      /* enum mk_trace_kind */
  uint16_t peer;     /* comm roles: the other rank; else MK_TRACE_NO_PEER */
  uint32_t id;       /* tile or chunk id */
  uint32_t flag;     /* flag index (see kind) */
  uint32_t expected; /* low 32 bits of the flag value waited for / raised to; flags are epoch
                        counters, whose low half is unambiguous within 2^32 calls */
  uint32_t seen;     /* low 32 bits of the value seen when the wait ended (waits only) */
};

/* One writer's ring head, 16 bytes. */
struct mk_trace_ring {
  uint32_t count;   /* events ever written; the newest is count - 1 */
  uint16_t sm;      /* %smid, written by the device when the ring is opened */
  uint16_t cta;     /* blockIdx.x, written by the host */
  uint8_t lane;     /* enum mk_trace_lane, written by the host */
  uint8_t opened;   /* 1 once the device opened it (sm is valid) */
  uint16_t reserved0;
  uint32_t reserved1;
};

/* The buffer's header, 64 bytes. */
struct mk_trace_header {
  uint32_t magic;           /* MK_TRACE_MAGIC */
  uint16_t version;         /* MK_TRACE_VERSION */
  uint16_t event_bytes;     /* sizeof(struct mk_trace_event), a check on the reader's layout */
  uint32_t rank, nranks;
  uint32_t op;              /* enum mk_op_id: 1 AllGather+GEMM, 2 GEMM+RS, 3 GEMM+AR, 4 MoE dispatch,
                               7 ring attention backward (its one launch: the rings are per SM,
                               `cta` an SM index, its CTAs being one per item) */
  uint32_t nrings;          /* ctas x MK_TRACE_LANES */
  uint32_t capacity;        /* events per ring, a power of two */
  uint32_t ctas;
  uint64_t call;            /* which call on this communicator (0, 1, ...) */
  int64_t clock_offset_ns;  /* added to every time of this rank to put ranks on one clock */
  uint64_t dropped;         /* events overwritten; filled by the host when it copies out */
  uint32_t m, n;            /* the op's shape, for the tools' labels */
};

/* What the device sees: the header, with the rings and events right behind it. */
struct mk_trace_buf {
  struct mk_trace_header h;
};

#ifdef __cplusplus
#define MK_TRACE_STATIC_ASSERT static_assert
#else
#define MK_TRACE_STATIC_ASSERT _Static_assert
#endif
MK_TRACE_STATIC_ASSERT(sizeof(struct mk_trace_event) == 32, "event layout is part of the file format");
MK_TRACE_STATIC_ASSERT(sizeof(struct mk_trace_ring) == 16, "ring layout is part of the file format");
MK_TRACE_STATIC_ASSERT(sizeof(struct mk_trace_header) == 64, "header layout is part of the file format");
MK_TRACE_STATIC_ASSERT(offsetof(struct mk_trace_event, id) == 16, "event layout");
MK_TRACE_STATIC_ASSERT(offsetof(struct mk_trace_header, call) == 32, "header layout");

#ifdef __CUDACC__
#define MK_TRACE_HD __host__ __device__ static inline
#else
#define MK_TRACE_HD static inline
#endif

/* Layout arithmetic, shared by the device helpers, the host code and the tests. */
MK_TRACE_HD struct mk_trace_ring* mk_trace_rings(struct mk_trace_buf* b) {
  return (struct mk_trace_ring*)(b + 1);
}
MK_TRACE_HD struct mk_trace_event* mk_trace_events(struct mk_trace_buf* b) {
  return (struct mk_trace_event*)(mk_trace_rings(b) + b->h.nrings);
}
MK_TRACE_HD size_t mk_trace_buf_bytes(uint32_t nrings, uint32_t capacity) {
  return sizeof(struct mk_trace_header) + (size_t)nrings * sizeof(struct mk_trace_ring) +
         (size_t)nrings * capacity * sizeof(struct mk_trace_event);
}
MK_TRACE_HD uint32_t mk_trace_dur(uint64_t start, uint64_t end) {
  uint64_t d = end > start ? end - start : 0;
  return d > 0xffffffffu ? 0xffffffffu : (uint32_t)d;
}

#ifdef __CUDACC__
/* A writer's handle, kept in registers by the role's loop. ev == NULL: tracing is off. */
struct mk_trace_writer {
  struct mk_trace_event* ev; /* this ring's slots */
  uint32_t* count;           /* this ring's count in global memory */
  uint32_t n;                /* events written so far */
  uint32_t mask;             /* capacity - 1 */
};

__device__ __forceinline__ uint64_t mk_trace_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Called once by the one thread that writes `lane` of CTA `cta`. */
__device__ __forceinline__ struct mk_trace_writer mk_trace_open(struct mk_trace_buf* b, uint32_t cta,
                                                                uint32_t lane) {
  struct mk_trace_writer w = {0, 0, 0, 0};
  if (b == 0) return w;
  uint32_t ring = cta * MK_TRACE_LANES + lane;
  struct mk_trace_ring* r = mk_trace_rings(b) + ring;
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  r->sm = (uint16_t)sm;
  r->opened = 1;
  w.ev = mk_trace_events(b) + (size_t)ring * b->h.capacity;
  w.count = &r->count;
  w.n = r->count; /* a second open in the same call (a relaunch) appends */
  w.mask = b->h.capacity - 1;
  return w;
}

/* The start time of an event (0 when off, so the timer is not even read). */
__device__ __forceinline__ uint64_t mk_trace_begin(const struct mk_trace_writer* w) {
  return w->ev ? mk_trace_timer_ns() : 0;
}

/* An event that began at `start` and ends now. */
__device__ __forceinline__ struct mk_trace_event mk_trace_event_now(uint64_t start, uint32_t role, uint32_t kind,
                                                                   uint32_t peer, uint32_t id, uint32_t flag,
                                                                   uint64_t expected, uint64_t seen) {
  struct mk_trace_event e;
  e.start_ns = start;
  e.dur_ns = mk_trace_dur(start, mk_trace_timer_ns());
  e.role = (uint8_t)role, e.kind = (uint8_t)kind, e.peer = (uint16_t)peer;
  e.id = id, e.flag = flag, e.expected = (uint32_t)expected, e.seen = (uint32_t)seen;
  return e;
}

__device__ __forceinline__ void mk_trace_put(struct mk_trace_writer* w, uint64_t start, uint32_t role,
                                             uint32_t kind, uint32_t peer, uint32_t id, uint32_t flag,
                                             uint64_t expected, uint64_t seen) {
  w->ev[w->n & w->mask] = mk_trace_event_now(start, role, kind, peer, id, flag, expected, seen);
  w->n++;
  /* Plain store after the event: the host reads both after the kernel ended (or exited on a
   * timeout), so no ordering beyond program order is needed. */
  *(volatile uint32_t*)w->count = w->n;
}

/* A tile or chunk that began at `start` (from mk_trace_begin) ends now. */
__device__ __forceinline__ void mk_trace_end(struct mk_trace_writer* w, uint64_t start, uint32_t role,
                                             uint32_t kind, uint32_t peer, uint32_t id, uint32_t flag,
                                             uint64_t value) {
  if (w->ev) mk_trace_put(w, start, role, kind, peer, id, flag, value, value);
}

/* A wait that began at `start` for flag `flag` >= expected ends now having seen `seen`
 * (seen < expected: it timed out, the last event of a hang). */
__device__ __forceinline__ void mk_trace_wait(struct mk_trace_writer* w, uint64_t start, uint32_t role,
                                              uint32_t id, uint32_t flag, uint64_t expected, uint64_t seen) {
  if (w->ev) mk_trace_put(w, start, role, MK_TRACE_WAIT, MK_TRACE_NO_PEER, id, flag, expected, seen);
}
/* One event on this SM's ring of `lane`, for a kernel whose CTAs are one per item (the ring
 * attention backward's one launch): the rings are per SM (`cta` is the SM) and several CTAs
 * fill one after another, so the slot is taken with an atomic on the count, no writer relying
 * on seeing the count the one before it stored. %smid is read once; an SM past the buffer's
 * (MPS numbers its share from 0) drops the event. */
__device__ __forceinline__ void mk_trace_emit_per_sm(struct mk_trace_buf* b, uint32_t lane, uint64_t start,
                                                     uint32_t role, uint32_t kind, uint32_t id, uint32_t flag,
                                                     uint64_t expected, uint64_t seen) {
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (sm >= b->h.ctas) return;
  const uint32_t ring = sm * MK_TRACE_LANES + lane;
  struct mk_trace_ring* r = mk_trace_rings(b) + ring;
  r->sm = (uint16_t)sm;
  r->opened = 1;
  const uint32_t n = atomicAdd(&r->count, 1u);
  mk_trace_events(b)[(size_t)ring * b->h.capacity + (n & (b->h.capacity - 1))] =
      mk_trace_event_now(start, role, kind, MK_TRACE_NO_PEER, id, flag, expected, seen);
}

/* One event from a writer that keeps no handle (a role whose registers are scarce, such as
 * the GEMM's producer thread): opens its ring, appends, stores the count. One load more than
 * mk_trace_put; nothing at all when b is NULL. */
__device__ __forceinline__ void mk_trace_emit(struct mk_trace_buf* b, uint32_t cta, uint32_t lane,
                                              uint64_t start, uint32_t role, uint32_t kind, uint32_t peer,
                                              uint32_t id, uint32_t flag, uint64_t expected, uint64_t seen) {
  if (b == 0) return;
  struct mk_trace_writer w = mk_trace_open(b, cta, lane);
  mk_trace_put(&w, start, role, kind, peer, id, flag, expected, seen);
}
#endif /* __CUDACC__ */

/* ---- host side (trace.c): pure functions, no CUDA ------------------------------------------ */
#ifdef __cplusplus
extern "C" {
#endif

/* Fills a zeroed host buffer's header and ring table (cta, lane). */
void mk_trace_init_header(struct mk_trace_buf* b, uint32_t rank, uint32_t nranks, uint32_t op,
                          uint32_t ctas, uint32_t capacity);
/* Sets header.dropped from the ring counts; returns it. */
uint64_t mk_trace_count_dropped(struct mk_trace_buf* b);
/* Checks magic, version, sizes and that `bytes` holds the whole layout. 0 or -EINVAL. */
int mk_trace_validate(const struct mk_trace_buf* b, size_t bytes);
/* Writes the file described above to `path`. 0 or negative errno. */
int mk_trace_write(struct mk_trace_buf* b, const char* path);
/* Creates `dir` and its missing parents (mode 0777 before umask); an existing directory is
 * fine. 0 or negative errno (-ENOTDIR: a part of the path is a file). */
int mk_trace_make_dir(const char* dir);
/* "<dir>/mk-trace.rank<R>.call<C>.trace" ("." when dir is empty). */
void mk_trace_file_name(const char* dir, uint32_t rank, uint64_t call, char* out, size_t len);

/* What the error record and the communicator know about a hang. */
struct mk_trace_hang {
  uint32_t rank, op, tile, flag;
  uint64_t expected, seen;
  int32_t peer;           /* the rank whose data the flag announces; -1 unknown */
  uint64_t peer_progress; /* that peer's progress counter */
  const char* progress_what; /* what peer_progress counts; NULL: "chunks it has sent" */
  const char* account;       /* the asynchronous error's text (comm/err_text.c), or NULL */
};
/* The ring (cta x lanes + lane) whose newest event is the timed-out wait on h->flag, else the
 * one whose newest event names h->tile; -1 when no ring matches. */
int mk_trace_find_stuck_ring(struct mk_trace_buf* b, const struct mk_trace_hang* h);
/* The hang report (format in README and scripts/mktrace/hang.py): the error, the peer's
 * progress, then the last `last_n` events of the stuck CTA (all its lanes, oldest first).
 * Returns the length it needed (like snprintf). */
int mk_trace_hang_report(struct mk_trace_buf* b, const struct mk_trace_hang* h, int last_n, char* out,
                         size_t len);
const char* mk_trace_role_name(uint32_t role);
const char* mk_trace_kind_name(uint32_t kind);
#ifdef __cplusplus
}
#endif

#endif /* MK_TRACE_H_ */
