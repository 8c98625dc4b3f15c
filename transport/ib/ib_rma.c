/*
 * One-sided put and put-with-signal, over QP 0 of a comm (rail 0 to the peer's rail 0, whose
 * rkey mr_rkey hands out).
 *
 * Why the signal can never be seen before its data: put_signal posts the data RDMA write(s)
 * and then the 8-byte signal RDMA write on the SAME RC QP. An RC responder executes a QP's
 * requests in order, and places a write's payload before it acknowledges it, so the signal's
 * bytes are placed after the data's. What could still reorder them is the PCIe path into
 * target memory when the target region is registered with relaxed ordering; signal regions
 * are therefore registered with MK_PTR_FORCE_SO (no relaxed ordering), as NCCL registers its
 * FIFO and flags. (NCCL's GIN uses an atomic fetch-add for the signal for the same reason;
 * a plain write keeps "value" semantics, which is what our fused ops need.)
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ib.h"
#include "mk_err.h"
#include "mk_log.h"

static int ib_rkey_fits(const struct mk_rkey* k, uint64_t off, uint64_t len) {
  return k && off <= k->size && len <= k->size - off;
}

static int ib_put_wrs(struct ib_comm* c, struct ib_req* r, const void* src, size_t size,
                      struct mk_mr* mr, uint64_t raddr, uint32_t rkey, int signaled_last) {
  enum { CAP = IB_WR_PER_PIECE };
  struct ibv_send_wr wr[CAP], *bad = NULL;
  struct ibv_sge sge[CAP];
  uint32_t lkey;
  MK_CHECK(ib_mr_keys(mr, 0, &lkey, NULL));
  int nw = 0;
  for (uint64_t off = 0; off < size; nw++) {
    uint64_t piece = size - off < IB_MAX_WR_BYTES ? size - off : IB_MAX_WR_BYTES;
    sge[nw] = (struct ibv_sge){.addr = (uintptr_t)src + off, .length = (uint32_t)piece, .lkey = lkey};
    wr[nw] = (struct ibv_send_wr){.wr_id = ib_wr_id(IB_WR_NONE, 0), .sg_list = &sge[nw],
                                  .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                                  .next = off + piece < size ? &wr[nw + 1] : NULL};
    wr[nw].wr.rdma.remote_addr = raddr + off;
    wr[nw].wr.rdma.rkey = rkey;
    off += piece;
  }
  if (signaled_last) {
    wr[nw - 1].wr_id = ib_wr_id(IB_WR_PUT, (uint32_t)(((uint8_t*)r - c->pool.slots) / c->pool.slot_size));
    wr[nw - 1].send_flags = IBV_SEND_SIGNALED;
  }
  int rc = ibv_post_send(c->qps[0], wr, &bad);
  if (rc) MK_WARN("ib: posting an RDMA write of %zu bytes failed: %s", size, strerror(rc));
  return rc ? -EIO : 0;
}

static int ib_signal_wr(struct ib_comm* c, struct ib_req* r, uint64_t value, uint64_t raddr,
                        uint32_t rkey) {
  uint32_t idx = (uint32_t)(((uint8_t*)r - c->pool.slots) / c->pool.slot_size);
  uint64_t* v = &c->ctrl->signal_values[idx];
  *v = value;
  struct ibv_sge sge = {.addr = (uintptr_t)v, .length = sizeof(*v), .lkey = c->ctrl_mr[0]->lkey};
  struct ibv_send_wr wr = {.wr_id = ib_wr_id(IB_WR_PUT, idx), .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED}, *bad;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  int rc = ibv_post_send(c->qps[0], &wr, &bad);
  if (rc) MK_WARN("ib: posting a signal write failed: %s", strerror(rc));
  return rc ? -EIO : 0;
}

static int ib_put_check(struct ib_comm* c, const void* src, size_t size, struct mk_mr* src_mr,
                        const struct mk_rkey* dst, uint64_t dst_off, const struct mk_rkey* sig,
                        uint64_t sig_off, int want_sig) {
  if (!c || (!src && size) || size > IB_MAX_WR_BYTES * IB_WR_PER_PIECE ||
      !ib_rkey_fits(dst, dst_off, size) || ib_mr_check(src_mr, src, size) < 0 ||
      (want_sig && !ib_rkey_fits(sig, sig_off, sizeof(uint64_t)))) {
    MK_WARN("ib put: bad argument (comm %p, src %p, size %zu, dst off %llu of %llu, signal off "
            "%llu of %llu, mr %p)", (void*)c, src, size, (unsigned long long)dst_off,
            dst ? (unsigned long long)dst->size : 0ull, (unsigned long long)sig_off,
            sig ? (unsigned long long)sig->size : 0ull, (void*)src_mr);
    return -EINVAL;
  }
  return 0;
}

static int ib_put_common(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
                         const struct mk_rkey* dst, uint64_t dst_off, const struct mk_rkey* sig,
                         uint64_t sig_off, uint64_t value, int want_sig, struct mk_request** req) {
  struct ib_comm* c = comm && comm->ops == &mk_ib_ops ? (struct ib_comm*)comm : NULL;
  if (!req) return -EINVAL;
  *req = NULL;
  MK_CHECK(ib_put_check(c, src, size, src_mr, dst, dst_off, sig, sig_off, want_sig));
  pthread_mutex_lock(&c->lock);
  int rc = ib_comm_check(c);
  struct ib_req* r = rc ? NULL : mk_req_pool_alloc(&c->pool);
  if (r) {
    *r = (struct ib_req){.base.comm = comm, .kind = IB_REQ_PUT, .n = 1, .sizes = {size}};
    if (!src_mr && size) rc = ib_mr_temp(c, (void*)src, size, &r->tmp_mr[0]);
    struct mk_mr* mr = src_mr ? src_mr : r->tmp_mr[0];
    if (rc == 0 && size)
      rc = ib_put_wrs(c, r, src, size, mr, dst->base + dst_off, (uint32_t)dst->key, !want_sig);
    if (rc == 0 && want_sig) rc = ib_signal_wr(c, r, value, sig->base + sig_off, (uint32_t)sig->key);
    if (rc == 0 && !want_sig && !size) r->pending = 0; /* nothing to write */
    else if (rc == 0) r->pending = 1;
    if (rc == 0) *req = &r->base;
    else ib_req_release(c, r);
    if (rc == -EIO) c->error = rc;
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int ib_iput(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
            const struct mk_rkey* dst, uint64_t dst_off, struct mk_request** req) {
  return ib_put_common(comm, src, size, src_mr, dst, dst_off, NULL, 0, 0, 0, req);
}

int ib_iput_signal(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
                   const struct mk_rkey* dst, uint64_t dst_off, const struct mk_rkey* sig,
                   uint64_t sig_off, uint64_t value, struct mk_request** req) {
  return ib_put_common(comm, src, size, src_mr, dst, dst_off, sig, sig_off, value, 1, req);
}

int ib_progress(struct mk_comm* comm) {
  struct ib_comm* c = comm && comm->ops == &mk_ib_ops ? (struct ib_comm*)comm : NULL;
  if (!c) {
    MK_WARN("ib progress: bad comm %p", (void*)comm);
    return -EINVAL;
  }
  pthread_mutex_lock(&c->lock);
  int rc = ib_cq_progress(c);
  if (rc == 0) rc = ib_peer_check(c);
  pthread_mutex_unlock(&c->lock);
  return rc < 0 ? rc : 0;
}

const struct mk_transport_ops mk_ib_ops = {
    .size = sizeof(struct mk_transport_ops),
    .name = "ib",
    .init = ib_init,
    .fini = ib_fini,
    .devices = ib_devices,
    .get_properties = ib_get_properties,
    .listen = ib_listen,
    .connect = ib_connect,
    .accept = ib_accept,
    .close_listen = ib_close_listen,
    .close = ib_close,
    .reg_mr = ib_reg_mr,
    .reg_mr_dmabuf = ib_reg_mr_dmabuf,
    .dereg_mr = ib_dereg_mr,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .iflush = ib_iflush,
    .test = ib_test,
    .mr_rkey = ib_mr_rkey,
    .iput = ib_iput,
    .iput_signal = ib_iput_signal,
    .progress = ib_progress,
    .make_vdevice = ib_make_vdevice,
};
