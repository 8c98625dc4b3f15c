/* The trace format's host side without a GPU: a synthetic buffer filled the way the device
 * helpers fill it (trace.h), rings that wrapped, the file writer, and the hang report.
 *
 *   unit_trace               the C checks
 *   unit_trace write PATH    writes the synthetic buffer to PATH for test_mk_trace.py, which
 *                            checks that scripts/mk-trace reads back exactly these events
 *   unit_trace hang PATH     writes the planted hang's report (rank 1, tile 40, flag 9) */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mk_test.h"
#include "trace.h"

#define CTAS 3
#define CAP 8

/* What the device's mk_trace_put does, on the host. */
static void put(struct mk_trace_buf* b, uint32_t ring, struct mk_trace_event e) {
  struct mk_trace_ring* r = mk_trace_rings(b) + ring;
  mk_trace_events(b)[(size_t)ring * b->h.capacity + (r->count & (b->h.capacity - 1))] = e;
  r->count++;
  r->opened = 1;
  r->sm = (uint16_t)(100 + r->cta);
}

/* Ring i gets count_of(i) events; event j of ring i is a function of (i, j) that
 * test_mk_trace.py recomputes: start 1000000 * i + 100 * j, dur 50 + j, id j, flag i. */
static uint32_t count_of(uint32_t ring) { return ring == 0 ? CAP + 5 : ring % 4 == 1 ? 3 : 0; }

static struct mk_trace_buf* synthetic_buffer(void) {
  size_t bytes = mk_trace_buf_bytes(CTAS * MK_TRACE_LANES, CAP);
  struct mk_trace_buf* b = calloc(1, bytes);
  mk_trace_init_header(b, 1, 2, 1, CTAS, CAP);
  b->h.call = 7;
  for (uint32_t i = 0; i < b->h.nrings; i++)
    for (uint32_t j = 0; j < count_of(i); j++) {
      struct mk_trace_event e = {1000000ull * i + 100 * j, 50 + j, MK_TRACE_PRODUCER, MK_TRACE_TILE,
                                 MK_TRACE_NO_PEER, j, i, 1, 1};
      put(b, i, e);
    }
  return b;
}

static void header_and_layout_are_what_the_file_format_says(void) {
  struct mk_trace_buf* b = synthetic_buffer();
  CHECK_EQ(mk_trace_validate(b, mk_trace_buf_bytes(b->h.nrings, CAP)), 0);
  CHECK(mk_trace_validate(b, mk_trace_buf_bytes(b->h.nrings, CAP) - 1) != 0);
  CHECK_EQ((char*)mk_trace_events(b) - (char*)b, 64 + 16 * CTAS * MK_TRACE_LANES);
  CHECK_EQ(mk_trace_rings(b)[7].cta, 1);
  CHECK_EQ(mk_trace_rings(b)[7].lane, 2);
  b->h.capacity = 6; /* not a power of two: slots could not be count & (capacity - 1) */
  CHECK(mk_trace_validate(b, 1 << 20) != 0);
  free(b);
}

static void wrapped_ring_counts_its_dropped_events(void) {
  struct mk_trace_buf* b = synthetic_buffer();
  CHECK_EQ(mk_trace_count_dropped(b), 5);
  CHECK_EQ(b->h.dropped, 5);
  free(b);
}

/* Rank 1, CTA 2: the producer's tile 40 waited for flag 9 (expected 3) and timed out after
 * the consumers had finished tile 39. */
static struct mk_trace_buf* hung_buffer(struct mk_trace_hang* h) {
  struct mk_trace_buf* b = synthetic_buffer();
  uint32_t prod = 2 * MK_TRACE_LANES + MK_TRACE_LANE_PRODUCER;
  uint32_t cons = 2 * MK_TRACE_LANES + MK_TRACE_LANE_CONSUMER0;
  for (uint32_t l = 0; l < MK_TRACE_LANES; l++) mk_trace_rings(b)[prod + l].count = 0; /* CTA 2 only has these */
  struct mk_trace_event tile39 = {5000, 900, MK_TRACE_PRODUCER, MK_TRACE_TILE, MK_TRACE_NO_PEER, 39, 8, 3, 3};
  struct mk_trace_event mma39 = {5100, 1500, MK_TRACE_CONSUMER, MK_TRACE_TILE, MK_TRACE_NO_PEER, 39, 8, 3, 3};
  struct mk_trace_event wait40 = {6000, 0xffffffffu, MK_TRACE_PRODUCER, MK_TRACE_WAIT, MK_TRACE_NO_PEER, 40, 9, 3, 2};
  put(b, prod, tile39);
  put(b, cons, mma39);
  put(b, prod, wait40);
  struct mk_trace_hang hang = {1, 1, 40, 9, 3, 2, 0, 5};
  *h = hang;
  return b;
}

static void hang_report_names_rank_tile_flag_cta_and_peer(void) {
  struct mk_trace_hang h;
  struct mk_trace_buf* b = hung_buffer(&h);
  CHECK_EQ(mk_trace_find_stuck_ring(b, &h), 2 * MK_TRACE_LANES + MK_TRACE_LANE_PRODUCER);
  char out[4096];
  int n = mk_trace_hang_report(b, &h, 8, out, sizeof(out));
  CHECK(n > 0 && (size_t)n < sizeof(out));
  fputs(out, stderr);
  CHECK(strstr(out, "nccl-mk hang report v1\n") == out);
  CHECK(strstr(out, "rank 1 op 1 call 7\n") != NULL);
  CHECK(strstr(out, "stuck: tile 40 waiting for flag 9: expected 3, seen 2\n") != NULL);
  CHECK(strstr(out, "peer: rank 0 progress 5 (chunks it has sent)\n") != NULL);
  CHECK(strstr(out, "cta: 2 sm 102 lane 0\n") != NULL);
  /* Oldest first, across lanes: the producer's tile 39, the consumer's, then the wait. */
  const char* t39 = strstr(out, "producer  tile      39");
  const char* m39 = strstr(out, "consumer  tile      39");
  const char* w40 = strstr(out, "producer  wait      40");
  CHECK(t39 && m39 && w40 && t39 < m39 && m39 < w40);
  /* Truncation behaves like snprintf: the length it needed, a terminated prefix. */
  char small[32];
  CHECK_EQ(mk_trace_hang_report(b, &h, 8, small, sizeof(small)), n);
  CHECK_EQ(strlen(small), sizeof(small) - 1);
  free(b);
}

/* What comm/err_text.c would say of the planted hang (the report's account line). */
#define PLANTED_ACCOUNT "rank 1: ncclMkAllGatherGemm (op 0x1) timed out at tile 40 waiting for flag 9: expected 3, seen 2"

static void hang_report_without_trace_says_how_to_get_one(void) {
  struct mk_trace_hang h = {3, 2, 17, 4, 1, 0, -1, 0};
  char out[1024];
  mk_trace_hang_report(NULL, &h, 8, out, sizeof(out));
  CHECK(strstr(out, "rank 3 op 2") != NULL);
  CHECK(strstr(out, "stuck: tile 17 waiting for flag 4") != NULL);
  CHECK(strstr(out, "peer: unknown") != NULL);
  CHECK(strstr(out, "NCCL_MK_TRACE=1") != NULL);
  /* An op that knows what its peer's progress counts says so (AllGather+GEMM: row-blocks). */
  struct mk_trace_hang known = {0, 1, 6, 6, 1, 0, 1, 3, "row-blocks of its shard arrived, of 4"};
  mk_trace_hang_report(NULL, &known, 8, out, sizeof(out));
  CHECK(strstr(out, "peer: rank 1 progress 3 (row-blocks of its shard arrived, of 4)\n") != NULL);
  CHECK(strstr(out, "account:") == NULL); /* none given */
  /* The asynchronous error's text, when given, follows the stuck line. */
  known.account = PLANTED_ACCOUNT;
  mk_trace_hang_report(NULL, &known, 8, out, sizeof(out));
  CHECK(strstr(out, "seen 0\naccount: " PLANTED_ACCOUNT "\npeer: rank 1") != NULL);
}

static void stuck_ring_falls_back_to_the_tile_and_wraps_epochs(void) {
  struct mk_trace_hang h;
  struct mk_trace_buf* b = hung_buffer(&h);
  /* A wait that ended satisfied is not a timeout, even across a 32-bit wrap. */
  struct mk_trace_event* ev = mk_trace_events(b) + (size_t)(2 * MK_TRACE_LANES) * CAP + 1; /* wait40 */
  CHECK_EQ(ev->kind, MK_TRACE_WAIT);
  ev->expected = 0xffffffffu, ev->seen = 0;
  CHECK_EQ(mk_trace_find_stuck_ring(b, &h), 2 * MK_TRACE_LANES); /* by tile 40 */
  ev->id = 41;
  CHECK_EQ(mk_trace_find_stuck_ring(b, &h), -1);
  free(b);
}

/* NCCL_MK_TRACE_DIR is created with its parents (a run that named a new folder lost every trace
 * and failed its calls before, session 27); an existing one is fine; a file in the way is not. */
static void trace_dir_is_created_with_its_parents(void) {
  char base[] = "/tmp/mk-trace-dir-XXXXXX", dir[256], file[256];
  CHECK(mkdtemp(base) != NULL);
  snprintf(dir, sizeof(dir), "%s/a/b/c/", base);
  CHECK(mk_trace_make_dir(dir) == 0);
  struct stat st;
  CHECK(stat(dir, &st) == 0 && S_ISDIR(st.st_mode));
  CHECK(mk_trace_make_dir(dir) == 0);
  CHECK(mk_trace_make_dir("") == 0);
  snprintf(file, sizeof(file), "%s/a/f", base);
  FILE* f = fopen(file, "w");
  CHECK(f != NULL);
  if (f) fclose(f);
  snprintf(dir, sizeof(dir), "%s/a/f/g", base);
  CHECK(mk_trace_make_dir(dir) == -ENOTDIR);
  unlink(file);
  char sub[256];
  const char* parts[] = {"/a/b/c", "/a/b", "/a", ""};
  for (int i = 0; i < 4; i++) {
    snprintf(sub, sizeof(sub), "%s%s", base, parts[i]);
    CHECK(rmdir(sub) == 0);
  }
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "write") == 0) {
    struct mk_trace_buf* b = synthetic_buffer();
    int rc = mk_trace_write(b, argv[2]);
    free(b);
    return rc == 0 ? 0 : 1;
  }
  if (argc == 3 && strcmp(argv[1], "hang") == 0) {
    struct mk_trace_hang h;
    struct mk_trace_buf* b = hung_buffer(&h);
    h.account = PLANTED_ACCOUNT;
    char out[4096];
    mk_trace_hang_report(b, &h, 8, out, sizeof(out));
    free(b);
    FILE* f = fopen(argv[2], "w");
    if (!f || fputs(out, f) < 0) return 1;
    return fclose(f) == 0 ? 0 : 1;
  }
  header_and_layout_are_what_the_file_format_says();
  wrapped_ring_counts_its_dropped_events();
  hang_report_names_rank_tile_flag_cta_and_peer();
  hang_report_without_trace_says_how_to_get_one();
  stuck_ring_falls_back_to_the_tile_and_wraps_epochs();
  trace_dir_is_created_with_its_parents();
  /* every kind and role has its name (a kind added without one would print NULL) */
  for (uint32_t k = 0; k < MK_TRACE_KIND_COUNT; k++) CHECK(mk_trace_kind_name(k) && mk_trace_kind_name(k)[0] != '?');
  for (uint32_t r = 0; r < MK_TRACE_ROLE_COUNT; r++) CHECK(mk_trace_role_name(r) && mk_trace_role_name(r)[0] != '?');
  CHECK_STR(mk_trace_kind_name(MK_TRACE_PHASE), "phase");
  char name[256];
  mk_trace_file_name("", 3, 12, name, sizeof(name));
  CHECK_STR(name, "./mk-trace.rank3.call12.trace");
  return MK_TEST_RESULT();
}
