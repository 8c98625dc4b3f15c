/* Registration (through the domain's cache), remote keys, put and put-with-signal. */
#include <stdlib.h>
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "ofi.h"

#define OFI_MR_MAGIC 0x4d524f46u /* "FORM" */

struct ofi_mr {
  uint32_t magic;
  int type;
  struct ofi_dev* dev;
  struct mk_mr_entry* entry;
  uintptr_t addr;
  size_t size;
};

static struct ofi_mr* ofi_mr_get(struct mk_mr* m) {
  struct ofi_mr* mr = (struct ofi_mr*)m;
  return mr && mr->magic == OFI_MR_MAGIC ? mr : NULL;
}

static struct ofi_comm* ofi_comm_get(struct mk_comm* comm) {
  return comm && comm->ops == &mk_ofi_ops ? (struct ofi_comm*)comm : NULL;
}

static int ofi_mr_register(struct ofi_dev* dev, void* data, size_t size, int type,
                           struct fid_mr** out) {
  struct iovec iov = {.iov_base = data, .iov_len = size};
  struct fi_mr_attr attr = {
      .mr_iov = &iov, .iov_count = 1,
      .access = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE,
      .requested_key = dev->mr_prov_key ? 0
                                        : __atomic_fetch_add(&dev->next_key, 1, __ATOMIC_RELAXED),
      .iface = type == MK_PTR_CUDA ? FI_HMEM_CUDA : FI_HMEM_SYSTEM};
  int rc = fi_mr_regattr(dev->domain, &attr, 0, out);
  if (rc != 0)
    MK_WARN("ofi dev %s: registering %zu bytes at %p failed: %s", dev->name, size, data,
            ofi_sym.strerror(-rc));
  return rc;
}

int ofi_reg_mr(struct mk_comm* comm, void* data, size_t size, int type, struct mk_mr** out) {
  struct ofi_comm* c = ofi_comm_get(comm);
  type &= ~MK_PTR_FORCE_SO; /* libfabric exposes no relaxed ordering to turn off */
  if (!c || !data || size == 0 || !out || (type != MK_PTR_HOST && type != MK_PTR_CUDA)) {
    MK_WARN("ofi reg_mr: bad argument (comm %p, data %p, size %zu, type %d)", (void*)comm, data,
            size, type);
    return -EINVAL;
  }
  struct ofi_dev* dev = c->dev;
  if (type == MK_PTR_CUDA && !dev->hmem) {
    MK_WARN("ofi dev %s: the provider cannot register GPU memory (no FI_HMEM)", dev->name);
    return -ENOTSUP;
  }
  struct ofi_mr* mr = calloc(1, sizeof(*mr));
  if (!mr) return -ENOMEM;
  mr->entry = mk_mr_cache_find(&dev->mr_cache, (uintptr_t)data, size, type);
  if (!mr->entry) {
    struct fid_mr* fmr = NULL;
    int rc = ofi_mr_register(dev, data, size, type, &fmr);
    if (rc == 0) mr->entry = mk_mr_cache_insert(&dev->mr_cache, (uintptr_t)data, size, type, fmr,
                                                fi_mr_key(fmr));
    if (!mr->entry) {
      if (fmr) fi_close(&fmr->fid);
      free(mr);
      return rc ? rc : -ENOMEM;
    }
  }
  mr->magic = OFI_MR_MAGIC;
  mr->type = type;
  mr->dev = dev;
  mr->addr = (uintptr_t)data;
  mr->size = size;
  *out = (struct mk_mr*)mr;
  return 0;
}

int ofi_reg_mr_dmabuf(struct mk_comm* comm, void* data, size_t size, int type, uint64_t offset,
                      int fd, struct mk_mr** mr) {
  MK_WARN("ofi: DMA-BUF registration is not supported by this transport (not advertised)");
  return -ENOTSUP;
}

int ofi_dereg_mr(struct mk_comm* comm, struct mk_mr* m) {
  struct ofi_mr* mr = ofi_mr_get(m);
  if (!ofi_comm_get(comm) || !mr) {
    MK_WARN("ofi dereg_mr: unknown registration %p", (void*)m);
    return -EINVAL;
  }
  void* handle = NULL;
  int rc = mk_mr_cache_release(&mr->dev->mr_cache, mr->entry, &handle);
  if (rc == 1) fi_close(&((struct fid_mr*)handle)->fid);
  mr->magic = 0;
  free(mr);
  return rc < 0 ? rc : 0;
}

void* ofi_mr_desc(struct mk_mr* m) {
  struct ofi_mr* mr = ofi_mr_get(m);
  return mr ? fi_mr_desc((struct fid_mr*)mr->entry->handle) : NULL;
}

/* Checks that [data, data+size) lies in m (when given) and that m is known; m may be NULL
 * only when the provider needs no local descriptors. */
int ofi_mr_check(struct ofi_comm* c, struct mk_mr* m, const void* data, size_t size) {
  if (!m) return c->dev->mr_local && size > 0 ? -EINVAL : 0;
  struct ofi_mr* mr = ofi_mr_get(m);
  if (!mr) return -EINVAL;
  uintptr_t a = (uintptr_t)data;
  if (size && (a < mr->addr || a - mr->addr > mr->size || size > mr->size - (a - mr->addr)))
    return -EINVAL;
  return 0;
}

int ofi_mr_rkey(struct mk_mr* m, struct mk_rkey* out) {
  struct ofi_mr* mr = ofi_mr_get(m);
  if (!mr || !out) return -EINVAL;
  /* Offset addressing counts from the start of the provider's registration, which the cache
   * may share with a larger range: the peer names our offset 0 as base. */
  out->base = mr->dev->mr_virt_addr ? mr->addr : mr->addr - mr->entry->addr;
  out->key = mr->entry->key;
  out->size = mr->size;
  return 0;
}

/* Where data (inside registration m) is for a peer that writes into it. */
int ofi_mr_remote(struct mk_mr* m, const void* data, uint64_t* addr, uint64_t* key) {
  struct mk_rkey k;
  MK_CHECK(ofi_mr_rkey(m, &k));
  *addr = k.base + (uint64_t)((uintptr_t)data - ((struct ofi_mr*)m)->addr);
  *key = k.key;
  return 0;
}

static ssize_t ofi_write_on(struct ofi_stream* st, struct ofi_op* op, const void* buf, size_t len,
                            void* desc, uint64_t addr, uint64_t key, uint64_t flags, uint64_t data) {
  struct iovec iov = {.iov_base = (void*)buf, .iov_len = len};
  struct fi_rma_iov rma = {.addr = addr, .len = len, .key = key};
  struct fi_msg_rma msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = st->peer,
                           .rma_iov = &rma, .rma_iov_count = 1, .context = &op->ctx,
                           .data = data};
  return fi_writemsg(st->ep, &msg, FI_COMPLETION | flags);
}

/* A put's stripe, or a written send's (its remote CQ data names the receive, entry and
 * stripe, and the bytes it carries). */
ssize_t ofi_put_stripe_write(struct ofi_stream* st, struct ofi_op* op, void* buf, size_t len,
                             void* desc) {
  const struct ofi_req* r = op->req;
  uint64_t addr = r->put_addr + (uint64_t)((const char*)buf - r->put_src);
  uint64_t imm = op->kind == OFI_OP_WRITE_SEND
                     ? mk_ofi_imm(r->write_seq, op->last, op->idx, op->stripe, len)
                     : 0;
  return ofi_write_on(st, op, buf, len, desc, addr, r->put_key, r->flags, imm);
}

static void ofi_signal_unwait(struct ofi_comm* c, struct ofi_req* r) {
  r->signal_waiting = 0;
  for (int i = 0; i < c->signals_waiting; i++)
    if (c->sig_wait[i] == r) {
      c->sig_wait[i] = c->sig_wait[--c->signals_waiting];
      return;
    }
}

/* The signal write of a put_signal, once every data stripe has completed (pending == 1: only
 * the signal is left); called from stream 0's progress, under the comm lock. A failed stripe
 * means the signal is never written. */
int ofi_signal_post(struct ofi_comm* c, struct ofi_req* r) {
  if (!r->signal_waiting || __atomic_load_n(&r->pending, __ATOMIC_ACQUIRE) > 1) return 0;
  if (__atomic_load_n(&r->error, __ATOMIC_RELAXED)) {
    ofi_signal_unwait(c, r);
    __atomic_sub_fetch(&r->pending, 1, __ATOMIC_RELEASE);
    return 0;
  }
  int rc = ofi_rc(ofi_write_on(&c->st[0], &r->ops[OFI_OP_SIGNAL_AT], &r->signal_value,
                               sizeof(r->signal_value), c->pool_desc, r->signal_addr,
                               r->signal_key, r->flags, 0));
  if (rc == -FI_EAGAIN) return 0; /* retried from ofi_cq_progress */
  ofi_signal_unwait(c, r);
  if (rc != 0) {
    MK_WARN("ofi: posting the signal write failed: %s", ofi_sym.strerror(-rc));
    ofi_req_complete(r, &r->ops[OFI_OP_SIGNAL_AT], 0, rc);
  }
  return 0;
}

/* [off, off+len) inside a remote region of size bytes, without overflow. */
static int ofi_rkey_fits(const struct mk_rkey* k, uint64_t off, uint64_t len) {
  return k && off <= k->size && len <= k->size - off;
}

static int ofi_put_check(struct ofi_comm* c, const void* src, size_t size, struct mk_mr* src_mr,
                         const struct mk_rkey* dst, uint64_t dst_off) {
  if (!c || (!src && size) || size > c->dev->max_msg_size || !ofi_rkey_fits(dst, dst_off, size) ||
      ofi_mr_check(c, src_mr, src, size) < 0) {
    MK_WARN("ofi put: bad argument (comm %p, src %p, size %zu, dst off %llu of %llu, mr %p)",
            (void*)c, src, size, (unsigned long long)dst_off,
            dst ? (unsigned long long)dst->size : 0ull, (void*)src_mr);
    return -EINVAL;
  }
  return 0;
}

/* The streams a put's data goes to (mk_ofi_put_streams). */
static int ofi_put_streams(const struct ofi_comm* c, const struct ofi_req* r, int* first) {
  return mk_ofi_put_streams(c->nstreams, c->dev->delivery_complete, r->signal_waiting, first);
}

/* Posts the data writes of a put, one stripe per stream as a receive would be cut (so the
 * comm's helper threads copy in parallel); with a signal, the signal follows once all of
 * them completed (ofi_signal_post). Returns -FI_EAGAIN when nothing was posted; an error
 * after the first stripe was posted fails the comm (the request stays with the provider). */
static int ofi_put_start(struct ofi_comm* c, struct ofi_req* r, const void* src, size_t size,
                         struct mk_mr* src_mr, const struct mk_rkey* dst, uint64_t dst_off) {
  int first;
  int streams = ofi_put_streams(c, r, &first);
  uint8_t nst = 0;
  uint64_t chunk = size;
  if (size) mk_ofi_stripe_plan(size, streams, c->stripe_min, &nst, &chunk);
  r->put_src = src;
  r->put_addr = dst->base + dst_off;
  r->put_key = dst->key;
  r->n = 1;
  r->sizes[0] = size;
  r->pending = (int)nst + (r->signal_waiting ? 1 : 0); /* before any post */
  void* desc = ofi_mr_desc(src_mr);
  for (unsigned k = 0; k < nst; k++) {
    struct ofi_op* op = &r->ops[OFI_OP_AT(0, k)];
    *op = (struct ofi_op){.req = r, .kind = OFI_OP_PUT, .stripe = (uint8_t)k};
    char* buf = (char*)src + (size_t)k * chunk;
    size_t len = nst == 1 ? size : (size_t)mk_ofi_stripe_len(size, chunk, k);
    struct ofi_stream* st = &c->st[first + (int)k];
    if (c->stream_posts && st->has_thread) { /* its thread posts it, beside the other streams' */
      op->buf = buf, op->len = len, op->desc = desc;
      ofi_stream_post_later(st, op);
      continue;
    }
    int rc = ofi_stripe_post_in_turn(c, k == 0 ? OFI_POST_FIRST : OFI_POST_WAITED, (unsigned)first + k,
                                     buf, len, desc, 0, op);
    if (rc != 0) return rc;
  }
  return ofi_signal_post(c, r); /* at once when there was nothing to write */
}

static int ofi_put_common(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
                          const struct mk_rkey* dst, uint64_t dst_off, const struct mk_rkey* sig,
                          uint64_t sig_off, uint64_t value, struct mk_request** req) {
  struct ofi_comm* c = ofi_comm_get(comm);
  if (!req) return -EINVAL;
  *req = NULL;
  MK_CHECK(ofi_put_check(c, src, size, src_mr, dst, dst_off));
  if (sig && !ofi_rkey_fits(sig, sig_off, sizeof(uint64_t))) {
    MK_WARN("ofi put_signal: signal offset %llu outside its %llu-byte region",
            (unsigned long long)sig_off, (unsigned long long)sig->size);
    return -EINVAL;
  }
  ofi_comm_lock(c);
  int rc = c->error;
  struct ofi_req* r = rc ? NULL : mk_req_pool_alloc(&c->pool);
  if (r) {
    r->base.comm = comm;
    r->kind = OFI_REQ_PUT;
    r->flags = c->dev->delivery_complete ? FI_DELIVERY_COMPLETE : 0;
    if (sig) {
      r->ops[OFI_OP_SIGNAL_AT] = (struct ofi_op){.req = r, .kind = OFI_OP_SIGNAL};
      r->signal_value = value;
      r->signal_addr = sig->base + sig_off;
      r->signal_key = sig->key;
      r->signal_waiting = 1;
      c->sig_wait[c->signals_waiting++] = r;
    }
    rc = ofi_put_start(c, r, src, size, src_mr, dst, dst_off);
    if (rc == 0) {
      *req = &r->base;
      ofi_progress_wake(c);
    } else if (!c->error) { /* nothing posted */
      if (r->signal_waiting) ofi_signal_unwait(c, r);
      mk_req_pool_free(&c->pool, r);
    }
    if (rc == -FI_EAGAIN) /* not now (e.g. the connection is still forming): retry later */
      rc = ofi_cq_progress(c) < 0 ? c->error : 0;
    else if (rc < 0) MK_WARN("ofi: posting an RMA write failed: %s", ofi_sym.strerror(-rc));
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int ofi_iput(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
             const struct mk_rkey* dst, uint64_t dst_off, struct mk_request** req) {
  return ofi_put_common(comm, src, size, src_mr, dst, dst_off, NULL, 0, 0, req);
}

/* The signal is written only after the data write has completed. With FI_DELIVERY_COMPLETE
 * (requested when the provider offers it) that completion means the data is visible at the
 * target, so the signal can never be seen first. Without it, the completion only means the
 * data left the source buffer; ordering then rests on the provider's RMA write-after-write
 * ordering (msg_order FI_ORDER_RMA_WAW), a weaker guarantee, logged at init. */
int ofi_iput_signal(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
                    const struct mk_rkey* dst, uint64_t dst_off, const struct mk_rkey* sig,
                    uint64_t sig_off, uint64_t value, struct mk_request** req) {
  if (!sig) {
    MK_WARN("ofi put_signal: no signal region");
    if (req) *req = NULL;
    return -EINVAL;
  }
  return ofi_put_common(comm, src, size, src_mr, dst, dst_off, sig, sig_off, value, req);
}

int ofi_progress(struct mk_comm* comm) {
  struct ofi_comm* c = ofi_comm_get(comm);
  if (!c) return -EINVAL;
  ofi_comm_lock(c);
  ofi_streams_keep_awake(c); /* progress is what a put target calls */
  int rc = ofi_cq_progress(c);
  if (rc == 0) rc = ofi_peer_check(c);
  pthread_mutex_unlock(&c->lock);
  return rc < 0 ? rc : 0;
}
