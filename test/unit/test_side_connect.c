/* The shared connect driver (transport/side_channel.c mk_side_connect) over a fake handshake,
 * no network: a handshake in progress is kept per handle buffer and stepped again, a buffer
 * that now holds another handle starts over (the old handshake freed, not kept), a done one
 * hands its comm over and is freed keeping it, a failed one is freed and its error returned,
 * a start that fails leaves nothing pending, and a handle of the other transport is refused. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "handle.h"
#include "mk_test.h"
#include "side_channel.h"
#include "transport.h"

struct fake_hs {
  uint64_t nonce; /* the handle it was started for */
  int steps_left; /* steps answering 0 before the last one */
  int result;     /* the last step's answer: 1 or a negative errno */
  struct mk_comm comm;
};

static int started, freed, freed_keeping, next_steps, next_result, fail_start;

static int fake_step(void* p) {
  struct fake_hs* hs = p;
  return hs->steps_left-- > 0 ? 0 : hs->result;
}
static struct mk_comm* fake_comm(void* p) { return &((struct fake_hs*)p)->comm; }
static void fake_free(void* p, int keep) {
  freed++;
  freed_keeping += keep;
  if (!keep) free(p); /* kept: the test frees it with its comm */
}
static int fake_heard(const void* p) { (void)p; return 0; }
static const struct mk_handshake_ops fake_ops = {
    "fake", fake_step, fake_comm, fake_free, fake_heard, MK_HANDLE_TRANSPORT_OFI};

static int fake_start(void* ctx, const struct mk_handle* h, void** out) {
  (void)ctx;
  if (fail_start) return -ENOMEM;
  struct fake_hs* hs = calloc(1, sizeof(*hs));
  hs->nonce = h->nonce, hs->steps_left = next_steps, hs->result = next_result;
  started++;
  *out = hs;
  return 0;
}

static struct mk_handle handle_of(uint64_t nonce) {
  struct mk_handle h;
  memset(&h, 0, sizeof(h));
  h.addr.ss_family = AF_INET;
  h.nonce = nonce;
  return h;
}

static int connect_once(struct mk_pending_list* l, const void* buf, uint64_t nonce, struct mk_comm** out) {
  const struct mk_handle h = handle_of(nonce);
  return mk_side_connect(l, &fake_ops, buf, &h, fake_start, NULL, out);
}

static void a_handshake_in_progress_is_stepped_again_then_hands_its_comm_over(void) {
  struct mk_pending_list l = MK_PENDING_LIST_INIT;
  unsigned char buf[8];
  struct mk_comm* comm = NULL;
  started = freed = freed_keeping = 0, next_steps = 2, next_result = 1, fail_start = 0;
  CHECK_EQ(connect_once(&l, buf, 7, &comm), 0);
  CHECK(comm == NULL);
  CHECK_EQ(connect_once(&l, buf, 7, &comm), 0);
  CHECK(comm == NULL);
  CHECK_EQ(connect_once(&l, buf, 7, &comm), 0);
  CHECK(comm != NULL);
  CHECK_EQ(started, 1);
  CHECK_EQ(freed_keeping, 1);
  CHECK(l.head == NULL);
  free((char*)comm - offsetof(struct fake_hs, comm));
}

static void a_buffer_holding_another_handle_starts_over(void) {
  struct mk_pending_list l = MK_PENDING_LIST_INIT;
  unsigned char buf[8], other[8];
  struct mk_comm* comm = NULL;
  started = freed = freed_keeping = 0, next_steps = 5, next_result = 1, fail_start = 0;
  CHECK_EQ(connect_once(&l, buf, 1, &comm), 0);
  CHECK_EQ(connect_once(&l, other, 9, &comm), 0); /* another buffer: its own handshake */
  CHECK_EQ(started, 2);
  next_steps = 0;
  CHECK_EQ(connect_once(&l, buf, 2, &comm), 0); /* buf now holds handle 2 */
  CHECK(comm != NULL && ((struct fake_hs*)((char*)comm - offsetof(struct fake_hs, comm)))->nonce == 2);
  CHECK_EQ(started, 3);
  CHECK_EQ(freed - freed_keeping, 1); /* handle 1's, dropped */
  if (comm) free((char*)comm - offsetof(struct fake_hs, comm));
  CHECK(l.head != NULL && l.head->handle == other); /* the other buffer's waits its turn */
  struct mk_pending_connect* p = mk_pending_take(&l, other);
  fake_free(p->state, 0);
  free(p);
}

static void a_failed_handshake_is_freed_and_its_error_returned(void) {
  struct mk_pending_list l = MK_PENDING_LIST_INIT;
  unsigned char buf[8];
  struct mk_comm* comm = (struct mk_comm*)buf; /* overwritten with NULL */
  started = freed = freed_keeping = 0, next_steps = 1, next_result = -ECONNREFUSED, fail_start = 0;
  CHECK_EQ(connect_once(&l, buf, 3, &comm), 0);
  CHECK_EQ(connect_once(&l, buf, 3, &comm), -ECONNREFUSED);
  CHECK(comm == NULL);
  CHECK_EQ(freed, 1);
  CHECK_EQ(freed_keeping, 0);
  CHECK(l.head == NULL);
  fail_start = 1;
  CHECK_EQ(connect_once(&l, buf, 4, &comm), -ENOMEM);
  CHECK(comm == NULL && l.head == NULL);
}

/* A handle made by a listener of the other transport (an ib host's, dialled from an ofi rank)
 * is refused with -EPROTO before any handshake starts; an unnamed one (an older build's) and
 * one of this transport start theirs. */
static void a_handle_from_the_other_transport_is_refused_before_any_handshake(void) {
  struct mk_pending_list l = MK_PENDING_LIST_INIT;
  unsigned char buf[8];
  struct mk_comm* comm = NULL;
  started = freed = freed_keeping = 0, next_steps = 1, next_result = 1, fail_start = 0;
  struct mk_handle h = handle_of(9);
  h.transport = MK_HANDLE_TRANSPORT_IB;
  CHECK_EQ(mk_side_connect(&l, &fake_ops, buf, &h, fake_start, NULL, &comm), -EPROTO);
  CHECK(comm == NULL && l.head == NULL);
  CHECK_EQ(started, 0);
  h.transport = MK_HANDLE_TRANSPORT_OFI;
  CHECK_EQ(mk_side_connect(&l, &fake_ops, buf, &h, fake_start, NULL, &comm), 0);
  CHECK_EQ(started, 1);
  CHECK_EQ(mk_side_connect(&l, &fake_ops, buf, &h, fake_start, NULL, &comm), 0);
  CHECK(comm != NULL);
  free((char*)comm - offsetof(struct fake_hs, comm));
}

int main(void) {
  a_handshake_in_progress_is_stepped_again_then_hands_its_comm_over();
  a_buffer_holding_another_handle_starts_over();
  a_failed_handshake_is_freed_and_its_error_returned();
  a_handle_from_the_other_transport_is_refused_before_any_handshake();
  return MK_TEST_RESULT();
}
