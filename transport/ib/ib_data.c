/* Two-sided messaging (the protocol is described in ib.h), iflush and test. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "ib.h"
#include "mk_err.h"
#include "mk_log.h"

static struct ib_comm* ib_comm_of(struct mk_comm* comm, int is_send) {
  struct ib_comm* c = (struct ib_comm*)comm;
  return comm && comm->ops == &mk_ib_ops && c->is_send == is_send ? c : NULL;
}

static uint32_t ib_req_index(struct ib_comm* c, struct ib_req* r) {
  return (uint32_t)(((uint8_t*)r - c->pool.slots) / c->pool.slot_size);
}

/* Sticky comm error, or a fatal event on one of its NICs. */
int ib_comm_check(struct ib_comm* c) {
  if (c->error) return c->error;
  for (int r = 0; r < c->nrails; r++)
    if (__atomic_load_n(&ib_port_nic(c->vdev->rails[r])->fatal, __ATOMIC_ACQUIRE)) {
      MK_WARN("ib: comm %p lost its device %s (fatal async event)", (void*)c,
              ib_port_nic(c->vdev->rails[r])->name);
      c->error = -EIO;
    }
  return c->error;
}

/* The FIFO slot of the current receive, once every entry of it has landed, else NULL. */
static struct ib_cts* ib_fifo_ready(struct ib_comm* c) {
  struct ib_cts* e = c->ctrl->fifo[c->seq % IB_FIFO_DEPTH];
  uint32_t marker = c->seq + 1;
  if (__atomic_load_n(&e[0].marker, __ATOMIC_ACQUIRE) != marker) return NULL;
  uint32_t n = e[0].nreqs;
  if (n < 1 || n > MK_MAX_RECVS) return NULL;
  for (uint32_t i = 1; i < n; i++)
    if (__atomic_load_n(&e[i].marker, __ATOMIC_ACQUIRE) != marker) return NULL;
  return e;
}

static int ib_wr_data(struct ib_comm* c, struct ib_group* g, const struct ib_cts* e, int q,
                      struct ibv_send_wr* wr, struct ibv_sge* sge, int cap) {
  int nw = 0, lrail = q % c->nrails;
  uint32_t rrail = c->remote.qps[q].rail;
  const uint64_t* sizes = c->ctrl->sizes_out[c->seq % IB_GROUPS];
  for (uint32_t i = 0; i < g->nreqs; i++) {
    uint64_t size = sizes[i];
    uint64_t chunk = (size + (uint64_t)c->nqps - 1) / (uint64_t)c->nqps;
    chunk = (chunk + IB_CHUNK_ALIGN - 1) / IB_CHUNK_ALIGN * IB_CHUNK_ALIGN;
    uint64_t off = chunk * (uint64_t)q;
    if (off >= size) continue;
    uint64_t len = size - off < chunk ? size - off : chunk;
    uint32_t lkey;
    if (ib_mr_keys(g->mrs[i], lrail, &lkey, NULL)) return -EINVAL;
    while (len) {
      if (nw >= cap) return -E2BIG;
      uint64_t piece = len < IB_MAX_WR_BYTES ? len : IB_MAX_WR_BYTES;
      sge[nw] = (struct ibv_sge){.addr = (uintptr_t)g->data[i] + off, .length = (uint32_t)piece,
                                 .lkey = lkey};
      wr[nw] = (struct ibv_send_wr){.wr_id = ib_wr_id(IB_WR_NONE, 0), .sg_list = &sge[nw],
                                    .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
      wr[nw].wr.rdma.remote_addr = e[i].addr + off;
      wr[nw].wr.rdma.rkey = e[i].rkeys[rrail];
      off += piece;
      len -= piece;
      nw++;
    }
  }
  return nw;
}

/* Every entry has its send: data on every QP, then one WRITE_WITH_IMM per QP (QP 0's carries
 * the sizes). RC places one QP's writes in order, so each imm follows its QP's data. */
static int ib_group_post(struct ib_comm* c, struct ib_group* g, struct ib_cts* fifo) {
  enum { CAP = MK_MAX_RECVS * IB_WR_PER_PIECE + 1 };
  uint32_t gidx = c->seq % IB_GROUPS, slot = c->seq % IB_FIFO_DEPTH;
  /* Consume the slot BEFORE posting: once the data lands, the receiver may at once write the
   * clear-to-send of receive seq + 32 into this same slot (soft-RoCE on lo can complete the
   * whole exchange inside ibv_post_send), and clearing after the post would erase it. */
  struct ib_cts e[MK_MAX_RECVS];
  memcpy(e, fifo, sizeof(e[0]) * g->nreqs);
  for (uint32_t i = 0; i < g->nreqs; i++) __atomic_store_n(&fifo[i].marker, 0, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  for (int q = 0; q < c->nqps; q++) {
    struct ibv_send_wr wr[CAP], *bad = NULL;
    struct ibv_sge sge[CAP];
    int nw = ib_wr_data(c, g, e, q, wr, sge, CAP - 1);
    if (nw < 0) return nw;
    int lrail = q % c->nrails;
    uint32_t rrail = c->remote.qps[q].rail;
    struct ibv_send_wr* f = &wr[nw];
    *f = (struct ibv_send_wr){.wr_id = ib_wr_id(IB_WR_GROUP, gidx), .num_sge = 0,
                              .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
                              .imm_data = htonl(g->seq)};
    f->wr.rdma.remote_addr = c->remote.ctrl_addr + offsetof(struct ib_ctrl, sizes) +
                             slot * sizeof(c->ctrl->sizes[0]);
    f->wr.rdma.rkey = c->remote.rails[rrail].ctrl_rkey;
    if (q == 0) {
      sge[nw] = (struct ibv_sge){.addr = (uintptr_t)c->ctrl->sizes_out[gidx],
                                 .length = g->nreqs * sizeof(uint64_t), .lkey = c->ctrl_mr[lrail]->lkey};
      f->sg_list = &sge[nw];
      f->num_sge = 1;
    }
    for (int k = 0; k < nw; k++) wr[k].next = &wr[k + 1];
    int rc = ibv_post_send(c->qps[q], wr, &bad);
    if (rc) {
      MK_WARN("ib: posting %d writes on QP %d failed: %s; the comm is unusable", nw + 1, q,
              strerror(rc));
      return -EIO;
    }
    g->pending++;
  }
  return 0;
}

static int ib_group_match(const struct ib_group* g, const struct ib_cts* e, int tag) {
  for (uint32_t i = 0; i < g->nreqs; i++)
    if (!(g->matched & (1u << i)) && e[i].tag == tag) return (int)i;
  return -1;
}

static int ib_isend_locked(struct ib_comm* c, void* data, size_t size, int tag, struct mk_mr* mr,
                           struct ib_req** out) {
  int rc = ib_cq_progress(c);
  if (rc < 0) return rc;
  struct ib_cts* e = ib_fifo_ready(c);
  if (!e) return rc > 0 ? 0 : ib_peer_check(c);
  struct ib_group* g = &c->groups[c->seq % IB_GROUPS];
  if (g->used && g->seq != c->seq) return 0; /* its previous receive is still completing */
  if (!g->used) *g = (struct ib_group){.used = 1, .seq = c->seq, .nreqs = e[0].nreqs};
  int i = ib_group_match(g, e, tag);
  if (i < 0) {
    MK_WARN("ib isend: tag %d matches no pending buffer of receive %u", tag, c->seq);
    return -EINVAL;
  }
  if (size > e[i].size) {
    MK_WARN("ib isend: %zu bytes do not fit the receiver's %llu-byte buffer (tag %d)", size,
            (unsigned long long)e[i].size, tag);
    return -EMSGSIZE;
  }
  struct ib_req* r = mk_req_pool_alloc(&c->pool);
  if (!r) return 0;
  if (!mr && (rc = ib_mr_temp(c, data, size, &r->tmp_mr[0])) < 0) {
    mk_req_pool_free(&c->pool, r);
    return rc;
  }
  *r = (struct ib_req){.kind = IB_REQ_SEND, .pending = 1, .n = 1, .seq = c->seq,
                       .sizes = {size}, .tmp_mr = {r->tmp_mr[0]}};
  g->reqs[i] = r;
  g->data[i] = data;
  g->mrs[i] = mr ? mr : r->tmp_mr[0];
  c->ctrl->sizes_out[c->seq % IB_GROUPS][i] = size;
  g->matched |= 1u << i;
  *out = r;
  if (g->matched != (1u << g->nreqs) - 1) return 0;
  rc = ib_group_post(c, g, e);
  c->seq++;
  return rc;
}

int ib_isend(struct mk_comm* comm, void* data, size_t size, int tag, struct mk_mr* mr,
             struct mk_request** req) {
  struct ib_comm* c = ib_comm_of(comm, 1);
  if (req) *req = NULL;
  if (!c || !req || (!data && size) || size > IB_MAX_WR_BYTES * IB_WR_PER_PIECE ||
      ib_mr_check(mr, data, size) < 0) {
    MK_WARN("ib isend: bad argument (comm %p, data %p, size %zu, mr %p)", (void*)comm, data,
            size, (void*)mr);
    return -EINVAL;
  }
  struct ib_req* r = NULL;
  pthread_mutex_lock(&c->lock);
  int rc = ib_comm_check(c);
  if (rc == 0) rc = ib_isend_locked(c, data, size, tag, mr, &r);
  if (rc < 0 && rc != -EINVAL && rc != -EMSGSIZE && !c->error) c->error = rc;
  if (r) r->base.comm = comm;
  pthread_mutex_unlock(&c->lock);
  if (rc == 0 && r) *req = &r->base;
  return rc;
}

static int ib_cts_post(struct ib_comm* c, struct ib_req* r, uint32_t slot, int n) {
  struct ibv_sge sge = {.addr = (uintptr_t)c->ctrl->cts_out[slot], .length = (uint32_t)n * 64,
                        .lkey = c->ctrl_mr[0]->lkey};
  struct ibv_send_wr wr = {.wr_id = ib_wr_id(IB_WR_CTS, ib_req_index(c, r)), .sg_list = &sge,
                           .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_SIGNALED}, *bad = NULL;
  wr.wr.rdma.remote_addr = c->remote.ctrl_addr + offsetof(struct ib_ctrl, fifo) +
                           slot * sizeof(c->ctrl->fifo[0]);
  wr.wr.rdma.rkey = c->remote.rails[c->remote.qps[0].rail].ctrl_rkey;
  int rc = ibv_post_send(c->qps[0], &wr, &bad);
  if (rc) MK_WARN("ib: posting a clear-to-send failed: %s", strerror(rc));
  return rc ? -EIO : 0;
}

static int ib_recv_post(struct ib_comm* c, struct ib_req* r, int n, void** data,
                        const size_t* sizes, const int* tags, struct mk_mr** mrs) {
  uint32_t slot = c->seq % IB_FIFO_DEPTH;
  for (int i = 0; i < n; i++) {
    struct mk_mr* mr = mrs ? mrs[i] : NULL;
    if (!mr) MK_CHECK(ib_mr_temp(c, data[i], sizes[i], &r->tmp_mr[i]));
    if (!mr) mr = r->tmp_mr[i];
    struct ib_cts* e = &c->ctrl->cts_out[slot][i];
    *e = (struct ib_cts){.addr = (uintptr_t)data[i], .size = sizes[i], .tag = tags[i],
                         .nreqs = (uint32_t)n, .seq = c->seq, .marker = c->seq + 1};
    for (int rail = 0; mr && rail < c->nrails; rail++) ib_mr_keys(mr, rail, NULL, &e->rkeys[rail]);
  }
  for (int q = 0; q < c->nqps; q++) {
    struct ibv_recv_wr wr = {.wr_id = ib_wr_id(IB_WR_RECV, 0), .num_sge = 0}, *bad = NULL;
    int rc = ibv_post_recv(c->qps[q], &wr, &bad);
    if (rc) {
      MK_WARN("ib: posting a receive on QP %d failed: %s", q, strerror(rc));
      return -EIO;
    }
  }
  r->pending = c->nqps + 1;
  MK_CHECK(ib_cts_post(c, r, slot, n));
  return 0;
}

static int ib_irecv_check(struct ib_comm* c, int n, void** data, const size_t* sizes,
                          const int* tags, struct mk_mr** mrs) {
  if (!c || n < 1 || n > MK_MAX_RECVS || !data || !sizes || !tags) return -EINVAL;
  for (int i = 0; i < n; i++) {
    if ((!data[i] && sizes[i]) || sizes[i] > IB_MAX_WR_BYTES * IB_WR_PER_PIECE) return -EINVAL;
    if (ib_mr_check(mrs ? mrs[i] : NULL, data[i], sizes[i]) < 0) return -EINVAL;
  }
  return 0;
}

int ib_irecv(struct mk_comm* comm, int n, void** data, const size_t* sizes, const int* tags,
             struct mk_mr** mrs, int optional, struct mk_request** req) {
  struct ib_comm* c = ib_comm_of(comm, 0);
  if (req) *req = NULL;
  if (!req || ib_irecv_check(c, n, data, sizes, tags, mrs) < 0) {
    MK_WARN("ib irecv: bad argument (comm %p, n %d, data %p, sizes %p, tags %p)", (void*)comm, n,
            (void*)data, (const void*)sizes, (const void*)tags);
    return -EINVAL;
  }
  pthread_mutex_lock(&c->lock);
  int rc = ib_comm_check(c);
  uint32_t slot = c->seq % IB_FIFO_DEPTH;
  struct ib_req* r = rc || c->recv_by_slot[slot] ? NULL : mk_req_pool_alloc(&c->pool);
  if (r) {
    *r = (struct ib_req){.base.comm = comm, .kind = IB_REQ_RECV, .n = n, .seq = c->seq};
    rc = ib_recv_post(c, r, n, data, sizes, tags, mrs);
    if (rc == 0) {
      c->recv_by_slot[slot] = r;
      c->seq++;
      *req = &r->base;
    } else {
      MK_WARN("ib irecv: posting failed (%s); the comm is unusable", strerror(-rc));
      c->error = rc; /* half-posted: the comm cannot stay in step with its peer */
      r->pending = 0;
      ib_req_release(c, r);
    }
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* An RDMA read of the last non-empty buffer through each rail's loopback QP: its completion
 * means every earlier write of the NIC into that memory is visible (NCCL's GDR flush). */
static int ib_flush_post(struct ib_comm* c, struct ib_req* r, void* data, struct mk_mr* mr) {
  for (int rail = 0; rail < c->nrails; rail++) {
    uint32_t rkey;
    MK_CHECK(ib_mr_keys(mr, rail, NULL, &rkey));
    struct ibv_sge sge = {.addr = (uintptr_t)&c->ctrl->flush_sink, .length = 1,
                          .lkey = c->ctrl_mr[rail]->lkey};
    struct ibv_send_wr wr = {.wr_id = ib_wr_id(IB_WR_FLUSH, ib_req_index(c, r)), .sg_list = &sge,
                             .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
                             .send_flags = IBV_SEND_SIGNALED}, *bad = NULL;
    wr.wr.rdma.remote_addr = (uintptr_t)data;
    wr.wr.rdma.rkey = rkey;
    int rc = ibv_post_send(c->flush_qp[rail], &wr, &bad);
    if (rc) {
      MK_WARN("ib: posting a flush read failed: %s", strerror(rc));
      return -EIO;
    }
    r->pending++;
  }
  return 0;
}

int ib_iflush(struct mk_comm* comm, int n, void** data, const int* sizes, struct mk_mr** mrs,
              struct mk_request** req) {
  struct ib_comm* c = ib_comm_of(comm, 0);
  if (req) *req = NULL;
  int last = -1;
  for (int i = 0; c && req && data && sizes && n >= 1 && n <= MK_MAX_RECVS && i < n; i++) {
    if (sizes[i] < 0 || (!data[i] && sizes[i]) ||
        ib_mr_check(mrs ? mrs[i] : NULL, data[i], (size_t)sizes[i]) < 0) {
      last = -2;
      break;
    }
    if (sizes[i] > 0) last = i;
  }
  if (!c || !req || !data || !sizes || n < 1 || n > MK_MAX_RECVS || last == -2) {
    MK_WARN("ib iflush: bad argument (comm %p, n %d, data %p, sizes %p)", (void*)comm, n,
            (void*)data, (const void*)sizes);
    return -EINVAL;
  }
  if (last < 0) return 0; /* nothing landed: nothing to flush (NULL request = done) */
  pthread_mutex_lock(&c->lock);
  int rc = ib_comm_check(c);
  struct ib_req* r = rc ? NULL : mk_req_pool_alloc(&c->pool);
  if (r) {
    *r = (struct ib_req){.base.comm = comm, .kind = IB_REQ_FLUSH, .n = 1};
    struct mk_mr* mr = mrs ? mrs[last] : NULL;
    if (!mr) rc = ib_mr_temp(c, data[last], (size_t)sizes[last], &r->tmp_mr[0]);
    if (rc == 0) rc = ib_flush_post(c, r, data[last], mr ? mr : r->tmp_mr[0]);
    if (rc == 0) *req = &r->base;
    else if (r->pending == 0) ib_req_release(c, r);
    else c->error = rc; /* some reads are out: leave the request to close */
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int ib_test(struct mk_request* req, int* done, size_t* sizes) {
  if (!req || !done || !req->comm || req->comm->ops != &mk_ib_ops) {
    MK_WARN("ib test: bad request %p", (void*)req);
    return -EINVAL;
  }
  struct ib_req* r = (struct ib_req*)req;
  struct ib_comm* c = (struct ib_comm*)req->comm;
  *done = 0;
  pthread_mutex_lock(&c->lock);
  if (!mk_req_pool_live(&c->pool, r)) { /* completed and freed by an earlier test */
    pthread_mutex_unlock(&c->lock);
    MK_WARN("ib test: request %p is not in flight (tested again after it completed?)", (void*)req);
    return -EINVAL;
  }
  int rc = ib_cq_progress(c);
  if (rc >= 0 && r->pending == 0) {
    *done = 1;
    if (sizes) memcpy(sizes, r->sizes, sizeof(size_t) * (size_t)r->n);
    rc = r->error;
    ib_req_release(c, r);
  } else if (rc == 0) {
    rc = ib_peer_check(c); /* waiting without progress: is the peer still there? */
  }
  pthread_mutex_unlock(&c->lock);
  return rc < 0 ? rc : 0;
}
