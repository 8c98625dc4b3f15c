/*
 * Two-sided messaging. The receiver posts its buffers (tags DATA|seq|i) and then sends a
 * clear-to-send {seq, n, sizes, tags}; the sender waits for the clear-to-send of its current
 * seq, picks the first unmatched entry with its tag, and sends to exactly that buffer. So a
 * message never arrives unexpected, matching is strictly in posting order, and an oversized
 * send is caught at the sender (-EMSGSIZE) before anything moves.
 */
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "ofi.h"

static struct ofi_comm* ofi_comm_of(struct mk_comm* comm, int is_send) {
  struct ofi_comm* c = (struct ofi_comm*)comm;
  return comm && comm->ops == &mk_ofi_ops && c->is_send == is_send ? c : NULL;
}

void ofi_req_release(struct ofi_comm* c, struct ofi_req* r) {
  if (mk_req_pool_free(&c->pool, r) < 0) MK_WARN("ofi: request %p freed twice", (void*)r);
}

/* Index of the first unmatched entry of the clear-to-send with this tag, or -1. */
static int ofi_cts_match(const struct ofi_cts_slot* s, int tag) {
  for (uint32_t i = 0; i < s->cts.n; i++)
    if (!(s->matched & (1u << i)) && s->cts.tags[i] == tag) return (int)i;
  return -1;
}

static int ofi_send_post(struct ofi_comm* c, struct ofi_cts_slot* s, int i, void* data,
                         size_t size, struct mk_mr* mr, struct ofi_req** out) {
  struct ofi_req* r = mk_req_pool_alloc(&c->pool);
  if (!r) return 0;
  r->kind = OFI_REQ_SEND;
  r->n = 1;
  r->sizes[0] = size;
  r->pending = 1;
  r->ops[0] = (struct ofi_op){.req = r, .kind = OFI_OP_SEND, .idx = (uint8_t)i};
  ssize_t rc = fi_tsend(c->ep, data, size, ofi_mr_desc(mr), c->peer,
                        mk_ofi_tag_data(s->cts.seq, (unsigned)i), &r->ops[0].ctx);
  if (rc != 0) {
    mk_req_pool_free(&c->pool, r);
    if (rc == -FI_EAGAIN) return 0;
    MK_WARN("ofi: posting a send of %zu bytes failed: %s", size, ofi_sym.strerror((int)-rc));
    return (int)rc;
  }
  s->matched |= 1u << i;
  if (s->matched == (1u << s->cts.n) - 1) { /* every buffer of this receive has its send */
    s->valid = 0;
    c->seq++;
  }
  *out = r;
  return 0;
}

static int ofi_isend_locked(struct ofi_comm* c, void* data, size_t size, int tag,
                            struct mk_mr* mr, struct ofi_req** out) {
  int rc = ofi_cq_progress(c);
  if (rc < 0) return rc;
  struct ofi_cts_slot* s = &c->slots[c->seq % MK_MAX_REQUESTS];
  if (!s->valid || s->cts.seq != c->seq) return rc > 0 ? 0 : ofi_peer_check(c);
  int i = ofi_cts_match(s, tag);
  if (i < 0) {
    MK_WARN("ofi isend: tag %d matches no pending buffer of receive %u", tag, c->seq);
    return -EINVAL;
  }
  if (size > s->cts.sizes[i]) {
    MK_WARN("ofi isend: %zu bytes do not fit the receiver's %llu-byte buffer (tag %d)", size,
            (unsigned long long)s->cts.sizes[i], tag);
    return -EMSGSIZE;
  }
  return ofi_send_post(c, s, i, data, size, mr, out);
}

int ofi_isend(struct mk_comm* comm, void* data, size_t size, int tag, struct mk_mr* mr,
              struct mk_request** req) {
  struct ofi_comm* c = ofi_comm_of(comm, 1);
  if (req) *req = NULL;
  if (!c || !req || (!data && size) || size > c->dev->max_msg_size ||
      ofi_mr_check(c, mr, data, size) < 0) {
    MK_WARN("ofi isend: bad argument (comm %p, data %p, size %zu, mr %p)", (void*)comm, data,
            size, (void*)mr);
    return -EINVAL;
  }
  struct ofi_req* r = NULL;
  pthread_mutex_lock(&c->lock);
  int rc = c->error ? c->error : ofi_isend_locked(c, data, size, tag, mr, &r);
  if (r) r->base.comm = comm;
  pthread_mutex_unlock(&c->lock);
  if (rc == 0 && r) *req = &r->base;
  return rc;
}

/* Posting after earlier posts of the same receive succeeded cannot be abandoned, so an
 * EAGAIN here is waited out (progressing the CQ frees provider resources), bounded. Receive
 * posts need only local resources, never the peer. */
static int ofi_trecv_retry(struct ofi_comm* c, void* buf, size_t len, void* desc, uint64_t tag,
                           struct ofi_op* op) {
  uint64_t deadline = ofi_now_ns() + (uint64_t)mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS) * 1000000;
  for (;;) {
    ssize_t rc = fi_trecv(c->ep, buf, len, desc, FI_ADDR_UNSPEC, tag, 0, &op->ctx);
    if (rc != -FI_EAGAIN) return ofi_rc(rc);
    int p = ofi_cq_progress(c);
    if (p < 0) return p;
    if (ofi_now_ns() > deadline) return -ETIMEDOUT;
  }
}

/* The clear-to-send may meet EAGAIN while the provider waits for the peer (connection
 * setup, flow control): then it is deferred and retried from ofi_cq_progress, so irecv
 * never waits for the peer. */
int ofi_cts_post(struct ofi_comm* c, struct ofi_req* r) {
  ssize_t rc = fi_tsend(c->ep, &r->cts, sizeof(r->cts), c->pool_desc, c->peer, MK_OFI_TAG_CTRL,
                        &r->ops[r->n].ctx);
  if (rc == -FI_EAGAIN) {
    if (!r->cts_waiting) c->cts_waiting++;
    r->cts_waiting = 1;
    return 0;
  }
  if (r->cts_waiting) c->cts_waiting--;
  r->cts_waiting = 0;
  if (rc != 0) {
    MK_WARN("ofi: posting a clear-to-send failed: %s", ofi_sym.strerror((int)-rc));
    return (int)rc;
  }
  return 0;
}

static int ofi_recv_post(struct ofi_comm* c, struct ofi_req* r, int n, void** data,
                         const size_t* sizes, const int* tags, struct mk_mr** mrs) {
  uint32_t seq = c->seq;
  for (int i = 0; i < n; i++) {
    struct mk_mr* mr = mrs ? mrs[i] : NULL;
    r->ops[i] = (struct ofi_op){.req = r, .kind = OFI_OP_RECV, .idx = (uint8_t)i};
    uint64_t tag = mk_ofi_tag_data(seq, (unsigned)i);
    if (i == 0) {
      ssize_t rc = fi_trecv(c->ep, data[0], sizes[0], ofi_mr_desc(mr), FI_ADDR_UNSPEC, tag, 0,
                            &r->ops[0].ctx);
      if (rc == -FI_EAGAIN) return 1; /* nothing posted: the caller may retry */
      MK_CHECK(ofi_rc(rc));
    } else {
      MK_CHECK(ofi_trecv_retry(c, data[i], sizes[i], ofi_mr_desc(mr), tag, &r->ops[i]));
    }
    r->pending++;
    r->cts.sizes[i] = sizes[i];
    r->cts.tags[i] = tags[i];
  }
  r->cts.magic = MK_OFI_CTS_MAGIC;
  r->cts.seq = seq;
  r->cts.n = (uint32_t)n;
  r->ops[n] = (struct ofi_op){.req = r, .kind = OFI_OP_CTS_SEND, .idx = (uint8_t)n};
  r->pending++;
  MK_CHECK(ofi_cts_post(c, r));
  c->seq++;
  return 0;
}

static int ofi_irecv_check(struct ofi_comm* c, int n, void** data, const size_t* sizes,
                           const int* tags, struct mk_mr** mrs) {
  if (!c || n < 1 || n > MK_MAX_RECVS || !data || !sizes || !tags) return -EINVAL;
  for (int i = 0; i < n; i++) {
    if ((!data[i] && sizes[i]) || sizes[i] > c->dev->max_msg_size) return -EINVAL;
    if (ofi_mr_check(c, mrs ? mrs[i] : NULL, data[i], sizes[i]) < 0) return -EINVAL;
  }
  return 0;
}

/* optional (NCCL_NET_OPTIONAL_RECV_COMPLETION) is a permission, not a duty: completions are
 * always reported when the data has landed, so a slot is never reused under the provider. */
int ofi_irecv(struct mk_comm* comm, int n, void** data, const size_t* sizes, const int* tags,
              struct mk_mr** mrs, int optional, struct mk_request** req) {
  struct ofi_comm* c = ofi_comm_of(comm, 0);
  if (req) *req = NULL;
  if (!req || ofi_irecv_check(c, n, data, sizes, tags, mrs) < 0) {
    MK_WARN("ofi irecv: bad argument (comm %p, n %d, data %p, sizes %p, tags %p)", (void*)comm, n,
            (void*)data, (const void*)sizes, (const void*)tags);
    return -EINVAL;
  }
  pthread_mutex_lock(&c->lock);
  int rc = c->error;
  struct ofi_req* r = rc ? NULL : mk_req_pool_alloc(&c->pool);
  if (r) {
    r->base.comm = comm;
    r->kind = OFI_REQ_RECV;
    r->n = n;
    rc = ofi_recv_post(c, r, n, data, sizes, tags, mrs);
    if (rc == 0) *req = &r->base;
    else if (rc == 1) mk_req_pool_free(&c->pool, r);
    if (rc == 1) rc = 0;
    if (rc < 0) { /* half-posted: the comm cannot stay in step with its peer */
      MK_WARN("ofi irecv: posting failed (%s); the comm is unusable", strerror(-rc));
      c->error = rc;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* Host memory needs no flush; GPU buffers (FI_HMEM) are reported with force_flush = 0 and
 * NCCL does not flush on Hopper; a read-back flush is a known gap. */
int ofi_iflush(struct mk_comm* comm, int n, void** data, const int* sizes, struct mk_mr** mrs,
               struct mk_request** req) {
  if (req) *req = NULL;
  if (!ofi_comm_of(comm, 0) || !req || n < 1 || n > MK_MAX_RECVS || !data || !sizes) {
    MK_WARN("ofi iflush: bad argument (comm %p, n %d)", (void*)comm, n);
    return -EINVAL;
  }
  for (int i = 0; i < n; i++)
    if (sizes[i] < 0) {
      MK_WARN("ofi iflush: negative size %d", sizes[i]);
      return -EINVAL;
    }
  return 0;
}

int ofi_test(struct mk_request* req, int* done, size_t* sizes) {
  if (!req || !done || !req->comm || req->comm->ops != &mk_ofi_ops) {
    MK_WARN("ofi test: bad request %p", (void*)req);
    return -EINVAL;
  }
  struct ofi_req* r = (struct ofi_req*)req;
  struct ofi_comm* c = (struct ofi_comm*)req->comm;
  *done = 0;
  pthread_mutex_lock(&c->lock);
  int rc = ofi_cq_progress(c);
  if (rc >= 0 && r->pending == 0) {
    *done = 1;
    if (sizes) memcpy(sizes, r->sizes, sizeof(size_t) * (size_t)r->n);
    rc = r->error;
    ofi_req_release(c, r);
  } else if (rc == 0) {
    rc = ofi_peer_check(c); /* waiting without progress: is the peer still there? */
  }
  pthread_mutex_unlock(&c->lock);
  return rc < 0 ? rc : 0;
}
