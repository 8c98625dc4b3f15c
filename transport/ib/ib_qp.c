/* A comm's verbs resources: CQs, the registered control block, RC QPs and their state
 * transitions (INIT -> RTR -> RTS), and the loopback QPs that iflush reads through. */
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "ib.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"

#define IB_HELLO_MAGIC 0x48424d4bu /* "KMBH" */

int ib_reg_internal(struct ib_nic* nic, void* addr, size_t len, struct ibv_mr** out) {
  /* no relaxed ordering: control memory holds FIFO entries, sizes and signals */
  *out = ib_sym.reg_mr(nic->pd, addr, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!*out) {
    MK_WARN("ib %s: registering %zu bytes of control memory failed: %s", nic->name, len,
            strerror(errno));
    return errno ? -errno : -ENOMEM;
  }
  return 0;
}

static int ib_comm_rails(struct ib_comm* c) {
  for (int r = 0; r < c->nrails; r++) {
    struct ib_nic* nic = ib_port_nic(c->vdev->rails[r]);
    int cqe = IB_CQ_DEPTH < nic->attr.max_cqe ? IB_CQ_DEPTH : nic->attr.max_cqe;
    c->cq[r] = ib_sym.create_cq(nic->ctx, cqe, NULL, NULL, 0);
    if (!c->cq[r]) {
      MK_WARN("ib %s: creating a CQ of %d entries failed: %s", nic->name, cqe, strerror(errno));
      return -ENOMEM;
    }
    MK_CHECK(ib_reg_internal(nic, c->ctrl, sizeof(*c->ctrl), &c->ctrl_mr[r]));
  }
  return 0;
}

int ib_comm_create(struct ib_vdev* vdev, int is_send, int tc, struct ib_comm** out) {
  struct ib_comm* c = calloc(1, sizeof(*c));
  if (!c) return -ENOMEM;
  c->base.ops = &mk_ib_ops;
  c->is_send = is_send;
  c->vdev = vdev;
  c->nrails = vdev->nrails;
  c->tc = tc >= 0 ? tc : (int)mk_param_int(MK_PARAM_IB_TC);
  c->sock = -1;
  pthread_mutex_init(&c->lock, NULL);
  int rc = -ENOMEM;
  if (posix_memalign((void**)&c->ctrl, 4096, sizeof(*c->ctrl)) != 0) goto fail;
  memset(c->ctrl, 0, sizeof(*c->ctrl));
  uint32_t nreq = is_send ? MK_MAX_REQUESTS * MK_MAX_RECVS : 2 * MK_MAX_REQUESTS;
  MK_CHECK_GOTO(mk_req_pool_init(&c->pool, nreq, sizeof(struct ib_req)), rc, fail);
  MK_CHECK_GOTO(ib_comm_rails(c), rc, fail);
  *out = c;
  return 0;
fail:
  ib_comm_destroy(c);
  return rc;
}

static struct ibv_qp* ib_qp_new(struct ib_comm* c, int rail, int recv_depth) {
  struct ib_nic* nic = ib_port_nic(c->vdev->rails[rail]);
  struct ibv_qp_init_attr a = {.send_cq = c->cq[rail], .recv_cq = c->cq[rail], .qp_type = IBV_QPT_RC};
  a.cap.max_send_wr = IB_SQ_DEPTH < nic->attr.max_qp_wr ? IB_SQ_DEPTH : nic->attr.max_qp_wr;
  a.cap.max_recv_wr = (uint32_t)recv_depth;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  struct ibv_qp* qp = ib_sym.create_qp(nic->pd, &a);
  if (!qp) {
    MK_WARN("ib %s: creating an RC QP failed: %s", nic->name, strerror(errno));
    return NULL;
  }
  const struct ib_port* p = &ib.ports[c->vdev->rails[rail]];
  struct ibv_qp_attr m = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = (uint8_t)p->port,
                          .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                             IBV_ACCESS_REMOTE_READ};
  if (ib_sym.modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                   IBV_QP_ACCESS_FLAGS)) {
    MK_WARN("ib %s: QP to INIT failed: %s", nic->name, strerror(errno));
    ib_sym.destroy_qp(qp);
    return NULL;
  }
  return qp;
}

/* Creates the data QPs (nqps chosen by the connector) and fills our half of the hello. */
int ib_comm_plan_qps(struct ib_comm* c, int nqps) {
  if (nqps < 1 || nqps > IB_MAX_QPS) return -EPROTO;
  c->nqps = nqps;
  struct ib_hello* h = &c->local;
  h->magic = IB_HELLO_MAGIC;
  h->version = IB_PROTO_VERSION;
  h->nqps = (uint16_t)nqps;
  h->nrails = (uint32_t)c->nrails;
  h->ctrl_addr = (uint64_t)(uintptr_t)c->ctrl;
  for (int r = 0; r < c->nrails; r++) {
    const struct ib_port* p = &ib.ports[c->vdev->rails[r]];
    memcpy(h->rails[r].gid, p->gid.raw, 16);
    h->rails[r].lid = p->lid;
    h->rails[r].mtu = p->mtu;
    h->rails[r].link_layer = (uint32_t)p->link_layer;
    h->rails[r].ctrl_rkey = c->ctrl_mr[r]->rkey;
  }
  for (int q = 0; q < nqps; q++) {
    int rail = q % c->nrails;
    c->qps[q] = ib_qp_new(c, rail, c->is_send ? 1 : 2 * IB_FIFO_DEPTH);
    if (!c->qps[q]) return -ENOMEM;
    h->qps[q].qpn = c->qps[q]->qp_num;
    h->qps[q].rail = (uint32_t)rail;
  }
  return 0;
}

int ib_hello_valid(const struct ib_hello* h, uint64_t nonce) {
  if (h->magic != IB_HELLO_MAGIC || h->nonce != nonce) return -EBADMSG;
  if (h->version != IB_PROTO_VERSION) {
    MK_WARN("ib: peer speaks protocol %u, we speak %d", h->version, IB_PROTO_VERSION);
    return -EPROTO;
  }
  if (h->nrails < 1 || h->nrails > IB_MAX_RAILS || h->nqps < 1 || h->nqps > IB_MAX_QPS)
    return -EBADMSG;
  return 0;
}

/* RTR then RTS towards (remote qpn, remote rail); RoCE always needs the GRH. */
static int ib_qp_ready(struct ib_comm* c, struct ibv_qp* qp, int rail, uint32_t rqpn,
                       const struct ib_rail_info* ri) {
  const struct ib_port* p = &ib.ports[c->vdev->rails[rail]];
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .dest_qp_num = rqpn, .rq_psn = 0,
                          .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
  a.path_mtu = p->mtu < (enum ibv_mtu)ri->mtu ? p->mtu : (enum ibv_mtu)ri->mtu;
  a.ah_attr.port_num = (uint8_t)p->port;
  a.ah_attr.sl = (uint8_t)mk_param_int(MK_PARAM_IB_SL);
  if (p->link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, ri->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)p->gid_index;
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.grh.traffic_class = (uint8_t)c->tc;
  } else {
    a.ah_attr.dlid = (uint16_t)ri->lid;
  }
  if (ib_sym.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                   IBV_QP_MIN_RNR_TIMER)) {
    MK_WARN("ib %s: QP to RTR failed: %s", ib_port_nic(c->vdev->rails[rail])->name, strerror(errno));
    return -EHOSTUNREACH;
  }
  struct ibv_qp_attr s = {.qp_state = IBV_QPS_RTS, .sq_psn = 0, .max_rd_atomic = 1,
                          .timeout = (uint8_t)mk_param_int(MK_PARAM_IB_TIMEOUT),
                          .retry_cnt = (uint8_t)mk_param_int(MK_PARAM_IB_RETRY_CNT), .rnr_retry = 7};
  if (ib_sym.modify_qp(qp, &s, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC |
                                   IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY)) {
    MK_WARN("ib: QP to RTS failed: %s", strerror(errno));
    return -EIO;
  }
  return 0;
}

/* The loopback QP of each rail, connected to itself: iflush's RDMA reads go through it. */
static int ib_flush_qps(struct ib_comm* c) {
  for (int r = 0; r < c->nrails; r++) {
    c->flush_qp[r] = ib_qp_new(c, r, 1);
    if (!c->flush_qp[r]) return -ENOMEM;
    MK_CHECK(ib_qp_ready(c, c->flush_qp[r], r, c->flush_qp[r]->qp_num, &c->local.rails[r]));
  }
  return 0;
}

/* After the peer's hello: QP q goes to the peer's QP q on its rail q % remote nrails. */
int ib_comm_connect_qps(struct ib_comm* c) {
  const struct ib_hello* rh = &c->remote;
  if (rh->nqps != c->nqps) return -EPROTO;
  c->remote_nrails = (int)rh->nrails;
  for (int q = 0; q < c->nqps; q++) {
    uint32_t rr = rh->qps[q].rail;
    if (rr >= rh->nrails) return -EBADMSG;
    MK_CHECK(ib_qp_ready(c, c->qps[q], q % c->nrails, rh->qps[q].qpn, &rh->rails[rr]));
  }
  if (!c->is_send) MK_CHECK(ib_flush_qps(c));
  return 0;
}

void ib_comm_destroy(struct ib_comm* c) {
  if (!c) return;
  for (int q = 0; q < IB_MAX_QPS; q++)
    if (c->qps[q]) ib_sym.destroy_qp(c->qps[q]);
  for (int r = 0; r < IB_MAX_RAILS; r++) {
    if (c->flush_qp[r]) ib_sym.destroy_qp(c->flush_qp[r]);
    if (c->ctrl_mr[r]) ib_sym.dereg_mr(c->ctrl_mr[r]);
    if (c->cq[r]) ib_sym.destroy_cq(c->cq[r]);
  }
  /* registrations made for buffers passed without one, still held by live requests */
  for (uint32_t i = 0; c->pool.slots && i < c->pool.count; i++) {
    struct ib_req* r = mk_req_pool_slot(&c->pool, i);
    for (int k = 0; r->kind && k < MK_MAX_RECVS; k++)
      if (r->tmp_mr[k]) ib_mr_temp_release(r->tmp_mr[k]);
  }
  mk_req_pool_fini(&c->pool);
  if (c->sock >= 0) mk_sock_close_graceful(c->sock);
  free(c->ctrl);
  pthread_mutex_destroy(&c->lock);
  free(c);
}
