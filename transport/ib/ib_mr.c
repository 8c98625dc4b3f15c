/*
 * Registrations. One registration per rail of the comm's device, each through its NIC's
 * cache (regIsGlobal: NCCL registers the same buffer on every comm). Data buffers get
 * relaxed ordering when NCCL_MK_IB_RELAXED_ORDERING allows it, unless the caller marks the
 * region MK_PTR_FORCE_SO (signal and flag regions: a flag must never pass its data on PCIe).
 * DMA-BUF (GPU memory) registers through ibv_reg_dmabuf_mr when the probe at init succeeded.
 */
#include <stdlib.h>
#include <string.h>

#include "ib.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"

#define IB_MR_MAGIC 0x524d4249u /* "IBMR" */
#define IB_TYPE_DMABUF_RO (MK_PTR_DMABUF << 8) /* cache type of dmabuf registrations */

struct ib_mr {
  uint32_t magic;
  int type;
  int nrails;
  int rails[IB_MAX_RAILS];
  struct mk_mr_entry* entry[IB_MAX_RAILS];
  uintptr_t addr;
  size_t size;
};

static struct ib_mr* ib_mr_get(struct mk_mr* m) {
  struct ib_mr* mr = (struct ib_mr*)m;
  return mr && mr->magic == IB_MR_MAGIC ? mr : NULL;
}

static int ib_data_access(int force_so) {
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  int64_t ro = mk_param_int(MK_PARAM_IB_RELAXED_ORDERING);
  if (!force_so && (ro == 1 || (ro == 2 && ib_sym.reg_mr_iova2)))
    access |= IBV_ACCESS_RELAXED_ORDERING;
  return access;
}

static struct ibv_mr* ib_mr_verbs(struct ib_nic* nic, void* data, size_t size, int access,
                                  int fd, uint64_t offset) {
  if (fd >= 0) {
    if (!nic->dmabuf_ok) return errno = ENOTSUP, NULL;
    return ib_sym.reg_dmabuf_mr(nic->pd, offset, size, (uint64_t)(uintptr_t)data, fd, access);
  }
  if (ib_sym.reg_mr_iova2) /* relaxed ordering is an "optional" access bit only here */
    return ib_sym.reg_mr_iova2(nic->pd, data, size, (uint64_t)(uintptr_t)data, (unsigned)access);
  return ib_sym.reg_mr(nic->pd, data, size, access & ~IBV_ACCESS_RELAXED_ORDERING);
}

static int ib_mr_rail(struct ib_mr* mr, int r, int port, void* data, size_t size, int access,
                      int fd, uint64_t offset) {
  struct ib_nic* nic = ib_port_nic(port);
  int ctype = fd >= 0 ? IB_TYPE_DMABUF_RO : mr->type | (access & IBV_ACCESS_RELAXED_ORDERING ? 0x1000 : 0);
  if (fd < 0) mr->entry[r] = mk_mr_cache_find(&nic->mr_cache, (uintptr_t)data, size, ctype);
  if (mr->entry[r]) return 0;
  struct ibv_mr* v = ib_mr_verbs(nic, data, size, access, fd, offset);
  if (!v) {
    int err = errno ? errno : ENOMEM;
    MK_WARN("ib %s: registering %zu bytes at %p failed: %s", nic->name, size, data, strerror(err));
    return -err;
  }
  /* dmabuf registrations are never looked up (fd < 0 above), so they are never shared */
  mr->entry[r] = mk_mr_cache_insert(&nic->mr_cache, (uintptr_t)data, size, ctype, v, v->rkey);
  if (!mr->entry[r]) {
    ib_sym.dereg_mr(v);
    return -ENOMEM;
  }
  return 0;
}

static int ib_mr_release(struct ib_mr* mr) {
  int rc = 0;
  for (int r = 0; r < mr->nrails; r++) {
    if (!mr->entry[r]) continue;
    void* handle = NULL;
    int k = mk_mr_cache_release(&ib_port_nic(mr->rails[r])->mr_cache, mr->entry[r], &handle);
    if (k == 1 && ib_sym.dereg_mr((struct ibv_mr*)handle)) rc = -EIO;
    if (k < 0) rc = k;
  }
  mr->magic = 0;
  free(mr);
  return rc;
}

static int ib_reg_common(struct ib_comm* c, void* data, size_t size, int type, int fd,
                         uint64_t offset, struct mk_mr** out) {
  struct ib_mr* mr = calloc(1, sizeof(*mr));
  if (!mr) return -ENOMEM;
  mr->type = type & (MK_PTR_HOST | MK_PTR_CUDA | MK_PTR_DMABUF);
  mr->addr = (uintptr_t)data;
  mr->size = size;
  mr->nrails = c->nrails;
  int access = ib_data_access(type & MK_PTR_FORCE_SO);
  for (int r = 0; r < c->nrails; r++) {
    mr->rails[r] = c->vdev->rails[r];
    int rc = ib_mr_rail(mr, r, mr->rails[r], data, size, access, fd, offset);
    if (rc < 0) {
      ib_mr_release(mr);
      return rc;
    }
  }
  mr->magic = IB_MR_MAGIC;
  *out = (struct mk_mr*)mr;
  return 0;
}

static struct ib_comm* ib_comm_any(struct mk_comm* comm) {
  return comm && comm->ops == &mk_ib_ops ? (struct ib_comm*)comm : NULL;
}

int ib_reg_mr(struct mk_comm* comm, void* data, size_t size, int type, struct mk_mr** out) {
  struct ib_comm* c = ib_comm_any(comm);
  int kind = type & ~MK_PTR_FORCE_SO;
  if (!c || !data || size == 0 || !out || (kind != MK_PTR_HOST && kind != MK_PTR_CUDA)) {
    MK_WARN("ib reg_mr: bad argument (comm %p, data %p, size %zu, type %d)", (void*)comm, data,
            size, type);
    return -EINVAL;
  }
  if (kind == MK_PTR_CUDA) {
    MK_WARN("ib reg_mr: GPU memory needs DMA-BUF here (nvidia-peermem is not used)");
    return -ENOTSUP;
  }
  return ib_reg_common(c, data, size, type, -1, 0, out);
}

int ib_reg_mr_dmabuf(struct mk_comm* comm, void* data, size_t size, int type, uint64_t offset,
                     int fd, struct mk_mr** out) {
  struct ib_comm* c = ib_comm_any(comm);
  if (!c || !data || size == 0 || !out || fd < 0) {
    MK_WARN("ib reg_mr_dmabuf: bad argument (comm %p, data %p, size %zu, fd %d)", (void*)comm,
            data, size, fd);
    return -EINVAL;
  }
  if (!ib_port_nic(c->vdev->rails[0])->dmabuf_ok) {
    MK_WARN("ib reg_mr_dmabuf: this device or kernel cannot register DMA-BUF memory");
    return -ENOTSUP;
  }
  return ib_reg_common(c, data, size, type | MK_PTR_DMABUF, fd, offset, out);
}

int ib_mr_temp_release(struct mk_mr* m) {
  struct ib_mr* mr = ib_mr_get(m);
  return mr ? ib_mr_release(mr) : -EINVAL;
}

int ib_dereg_mr(struct mk_comm* comm, struct mk_mr* m) {
  struct ib_mr* mr = ib_mr_get(m);
  if (!ib_comm_any(comm) || !mr) {
    MK_WARN("ib dereg_mr: unknown registration %p", (void*)m);
    return -EINVAL;
  }
  return ib_mr_release(mr);
}

/* [data, data+size) inside m; m NULL is allowed (the transport registers on the fly). */
int ib_mr_check(struct mk_mr* m, const void* data, size_t size) {
  if (!m) return 0;
  struct ib_mr* mr = ib_mr_get(m);
  if (!mr) return -EINVAL;
  uintptr_t a = (uintptr_t)data;
  if (size && (a < mr->addr || a - mr->addr > mr->size || size > mr->size - (a - mr->addr)))
    return -EINVAL;
  return 0;
}

int ib_mr_keys(struct mk_mr* m, int rail, uint32_t* lkey, uint32_t* rkey) {
  struct ib_mr* mr = ib_mr_get(m);
  if (!mr || rail < 0 || rail >= mr->nrails) return -EINVAL;
  const struct ibv_mr* v = mr->entry[rail]->handle;
  if (lkey) *lkey = v->lkey;
  if (rkey) *rkey = v->rkey;
  return 0;
}

/* A registration for a buffer NCCL passed without one (tests do this; NCCL itself always
 * registers). Cache hits make repeated use cheap. */
int ib_mr_temp(struct ib_comm* c, void* data, size_t size, struct mk_mr** mr) {
  *mr = NULL;
  if (!size) return 0;
  return ib_reg_common(c, data, size, MK_PTR_HOST, -1, 0, mr);
}

int ib_mr_rkey(struct mk_mr* m, struct mk_rkey* out) {
  struct ib_mr* mr = ib_mr_get(m);
  if (!mr || !out) {
    MK_WARN("ib mr_rkey: bad argument (mr %p, out %p)", (void*)m, (void*)out);
    return -EINVAL;
  }
  /* One-sided operations go over QP 0, which joins rail 0 to the peer's rail 0. */
  out->base = mr->addr; /* verbs address by virtual address */
  out->key = ((const struct ibv_mr*)mr->entry[0]->handle)->rkey;
  out->size = mr->size;
  return 0;
}
