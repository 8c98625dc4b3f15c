/*
 * Host side of the trace format (trace.h): header setup, the file writer and the hang report.
 * Pure C with no CUDA, so the unit tests exercise it on machines without a GPU; copying the
 * buffer off the device is fused/comm/trace_comm.c's job.
 */
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "mk_log.h"

static const char* const role_names[MK_TRACE_ROLE_COUNT] = {
    "producer", "consumer", "storer", "comm-send", "comm-recv", "proxy"};
static const char* const kind_names[MK_TRACE_KIND_COUNT] = {"tile", "chunk", "wait", "phase"};

const char* mk_trace_role_name(uint32_t role) {
  return role < MK_TRACE_ROLE_COUNT ? role_names[role] : "?";
}
const char* mk_trace_kind_name(uint32_t kind) {
  return kind < MK_TRACE_KIND_COUNT ? kind_names[kind] : "?";
}

void mk_trace_init_header(struct mk_trace_buf* b, uint32_t rank, uint32_t nranks, uint32_t op,
                          uint32_t ctas, uint32_t capacity) {
  struct mk_trace_header* h = &b->h;
  h->magic = MK_TRACE_MAGIC;
  h->version = MK_TRACE_VERSION;
  h->event_bytes = sizeof(struct mk_trace_event);
  h->rank = rank, h->nranks = nranks, h->op = op;
  h->ctas = ctas;
  h->nrings = ctas * MK_TRACE_LANES;
  h->capacity = capacity;
  struct mk_trace_ring* r = mk_trace_rings(b);
  for (uint32_t i = 0; i < h->nrings; i++) {
    r[i].cta = (uint16_t)(i / MK_TRACE_LANES);
    r[i].lane = (uint8_t)(i % MK_TRACE_LANES);
  }
}

uint64_t mk_trace_count_dropped(struct mk_trace_buf* b) {
  uint64_t dropped = 0;
  const struct mk_trace_ring* r = mk_trace_rings(b);
  for (uint32_t i = 0; i < b->h.nrings; i++)
    if (r[i].count > b->h.capacity) dropped += r[i].count - b->h.capacity;
  b->h.dropped = dropped;
  return dropped;
}

int mk_trace_validate(const struct mk_trace_buf* b, size_t bytes) {
  const struct mk_trace_header* h = &b->h;
  if (bytes < sizeof(*h) || h->magic != MK_TRACE_MAGIC || h->version != MK_TRACE_VERSION ||
      h->event_bytes != sizeof(struct mk_trace_event))
    return -EINVAL;
  /* A power of two, so that a slot is count & (capacity - 1) on the device. */
  if (h->capacity == 0 || (h->capacity & (h->capacity - 1)) != 0) return -EINVAL;
  if (h->nrings != h->ctas * MK_TRACE_LANES) return -EINVAL;
  return bytes >= mk_trace_buf_bytes(h->nrings, h->capacity) ? 0 : -EINVAL;
}

/* Ring i's kept events, oldest first, as at most two contiguous runs of the slot array. */
static int write_ring_events(FILE* f, struct mk_trace_buf* b, uint32_t ring) {
  const struct mk_trace_ring* r = mk_trace_rings(b) + ring;
  const struct mk_trace_event* ev = mk_trace_events(b) + (size_t)ring * b->h.capacity;
  uint32_t cap = b->h.capacity;
  uint32_t kept = r->count < cap ? r->count : cap;
  uint32_t first = (r->count - kept) & (cap - 1); /* slot of the oldest kept event */
  uint32_t run1 = kept < cap - first ? kept : cap - first;
  if (fwrite(ev + first, sizeof(*ev), run1, f) != run1) return -EIO;
  if (fwrite(ev, sizeof(*ev), kept - run1, f) != kept - run1) return -EIO;
  return 0;
}

int mk_trace_write(struct mk_trace_buf* b, const char* path) {
  if (mk_trace_validate(b, mk_trace_buf_bytes(b->h.nrings, b->h.capacity)) != 0) return -EINVAL;
  mk_trace_count_dropped(b);
  FILE* f = fopen(path, "wb");
  if (!f) {
    int rc = -errno;
    MK_WARN("trace: cannot write %s: %s", path, strerror(errno));
    return rc;
  }
  int rc = 0;
  if (fwrite(&b->h, sizeof(b->h), 1, f) != 1 ||
      fwrite(mk_trace_rings(b), sizeof(struct mk_trace_ring), b->h.nrings, f) != b->h.nrings)
    rc = -EIO;
  for (uint32_t i = 0; rc == 0 && i < b->h.nrings; i++) rc = write_ring_events(f, b, i);
  if (fclose(f) != 0 && rc == 0) rc = -EIO;
  if (rc) MK_WARN("trace: short write to %s", path);
  return rc;
}

int mk_trace_make_dir(const char* dir) {
  char path[4096];
  if (!dir || !dir[0]) return 0;
  if (strlen(dir) >= sizeof(path)) return -ENAMETOOLONG;
  strcpy(path, dir);
  for (char* p = path + 1;; p++) {
    const char c = *p;
    if (c != '/' && c != '\0') continue;
    *p = '\0';
    if (mkdir(path, 0777) != 0 && errno != EEXIST) return -errno;
    struct stat st;
    if (stat(path, &st) != 0) return -errno;
    if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
    if (c == '\0') return 0;
    *p = c;
  }
}

void mk_trace_file_name(const char* dir, uint32_t rank, uint64_t call, char* out, size_t len) {
  snprintf(out, len, "%s/mk-trace.rank%" PRIu32 ".call%" PRIu64 ".trace",
           dir && dir[0] ? dir : ".", rank, call);
}

/* ---- hang reports -------------------------------------------------------------------------- */

/* seen < expected, compared as 32-bit epoch counters that may wrap. */
static int wait_timed_out(const struct mk_trace_event* e) { return (int32_t)(e->seen - e->expected) < 0; }

/* Events of ring i that survived (at most capacity), and the k-th of them, oldest first. */
static uint32_t kept_events(const struct mk_trace_buf* b, uint32_t ring) {
  uint32_t c = mk_trace_rings((struct mk_trace_buf*)b)[ring].count;
  return c < b->h.capacity ? c : b->h.capacity;
}
static const struct mk_trace_event* kept_event(struct mk_trace_buf* b, uint32_t ring, uint32_t k) {
  uint32_t first = mk_trace_rings(b)[ring].count - kept_events(b, ring);
  return mk_trace_events(b) + (size_t)ring * b->h.capacity + ((first + k) & (b->h.capacity - 1));
}

/* The newest event of ring i, or NULL when it has none. */
static const struct mk_trace_event* newest_event(struct mk_trace_buf* b, uint32_t ring) {
  uint32_t kept = kept_events(b, ring);
  return kept ? kept_event(b, ring, kept - 1) : NULL;
}

int mk_trace_find_stuck_ring(struct mk_trace_buf* b, const struct mk_trace_hang* h) {
  int by_tile = -1;
  for (uint32_t i = 0; i < b->h.nrings; i++) {
    const struct mk_trace_event* e = newest_event(b, i);
    if (!e) continue;
    /* The kernel records the timed-out wait on its way out: that names the CTA exactly. */
    if (e->kind == MK_TRACE_WAIT && e->flag == h->flag && wait_timed_out(e)) return (int)i;
    if (by_tile < 0 && e->id == h->tile) by_tile = (int)i;
  }
  return by_tile;
}

/* snprintf into a running buffer that keeps counting once full (like snprintf itself). */
struct report_buf {
  char* out;
  size_t len, used;
};
static void rb_printf(struct report_buf* rb, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void rb_printf(struct report_buf* rb, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = rb->used < rb->len ? rb->len - rb->used : 0;
  int n = vsnprintf(room ? rb->out + rb->used : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) rb->used += (size_t)n;
}

/* The last `last_n` events of CTA `cta` over all its lanes, merged by start time. Lanes are
 * each in time order, so this is a merge that walks backwards from every lane's newest. */
static void report_events(struct report_buf* rb, struct mk_trace_buf* b, uint32_t cta, int last_n) {
  uint32_t left[MK_TRACE_LANES], base = cta * MK_TRACE_LANES;
  for (int l = 0; l < MK_TRACE_LANES; l++) left[l] = kept_events(b, base + l);
  const struct mk_trace_event* picked[64];
  int n = 0;
  if (last_n > 64) last_n = 64;
  while (n < last_n) {
    int best = -1;
    const struct mk_trace_event* be = NULL;
    for (int l = 0; l < MK_TRACE_LANES; l++) {
      if (!left[l]) continue;
      const struct mk_trace_event* e = kept_event(b, base + l, left[l] - 1);
      if (!be || e->start_ns > be->start_ns) be = e, best = l;
    }
    if (best < 0) break;
    picked[n++] = be;
    left[best]--;
  }
  rb_printf(rb, "last %d events of cta %" PRIu32 " (oldest first; t in ns after the first shown):\n", n, cta);
  rb_printf(rb, "  %12s %10s %-9s %-5s %6s %6s %9s %9s %5s\n", "t", "dur", "role", "kind", "id", "flag",
            "expected", "seen", "peer");
  uint64_t t0 = n ? picked[n - 1]->start_ns : 0;
  for (int i = n - 1; i >= 0; i--) {
    const struct mk_trace_event* e = picked[i];
    char peer[8] = "-";
    if (e->peer != MK_TRACE_NO_PEER) snprintf(peer, sizeof(peer), "%u", (unsigned)e->peer);
    rb_printf(rb, "  %12" PRIu64 " %10" PRIu32 " %-9s %-5s %6" PRIu32 " %6" PRIu32 " %9" PRIu32 " %9" PRIu32 " %5s\n",
              e->start_ns - t0, e->dur_ns, mk_trace_role_name(e->role), mk_trace_kind_name(e->kind), e->id,
              e->flag, e->expected, e->seen, peer);
  }
}

int mk_trace_hang_report(struct mk_trace_buf* b, const struct mk_trace_hang* h, int last_n, char* out,
                         size_t len) {
  struct report_buf rb = {out, len, 0};
  if (out && len) out[0] = '\0';
  rb_printf(&rb, "nccl-mk hang report v1\n");
  rb_printf(&rb, "rank %" PRIu32 " op %" PRIu32 " call %" PRIu64 "\n", h->rank, h->op, b ? b->h.call : 0);
  rb_printf(&rb, "stuck: tile %" PRIu32 " waiting for flag %" PRIu32 ": expected %" PRIu64 ", seen %" PRIu64 "\n",
            h->tile, h->flag, h->expected, h->seen);
  if (h->account) rb_printf(&rb, "account: %s\n", h->account); /* what the wait was for, in words */
  if (h->peer >= 0)
    rb_printf(&rb, "peer: rank %" PRId32 " progress %" PRIu64 " (%s)\n", h->peer, h->peer_progress,
              h->progress_what ? h->progress_what : "chunks it has sent");
  else
    rb_printf(&rb, "peer: unknown\n");
  int ring = b ? mk_trace_find_stuck_ring(b, h) : -1;
  if (ring < 0) {
    rb_printf(&rb, "cta: unknown (%s)\n", b ? "no ring ends at this wait" : "tracing was off: NCCL_MK_TRACE=1");
    return (int)rb.used;
  }
  const struct mk_trace_ring* r = mk_trace_rings(b) + ring;
  rb_printf(&rb, "cta: %u sm %u lane %u\n", (unsigned)r->cta, (unsigned)r->sm, (unsigned)r->lane);
  report_events(&rb, b, r->cta, last_n);
  return (int)rb.used;
}
