/* Discovery: verbs devices and their active ports, NCCL_MK_IB_HCA, GID choice, speed,
 * PCI path, virtual devices, and the per-NIC asynchronous-event watcher. */
#include <limits.h>
#include <poll.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <endian.h>

#include "ib.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"

struct ib_state ib = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* NCCL_IB_HCA syntax: "^" excludes, "=" matches names exactly (else by prefix), entries are
 * name[:port] separated by commas. 1 when (name, port) is selected. */
int ib_hca_match(const char* list, const char* name, int port) {
  if (!list[0]) return 1;
  int exclude = 0, exact = 0;
  if (*list == '^') { exclude = 1; list++; }
  if (*list == '=') { exact = 1; list++; }
  char tmp[256];
  snprintf(tmp, sizeof(tmp), "%s", list);
  int hit = 0;
  for (char *save = NULL, *tok = strtok_r(tmp, ",", &save); tok && !hit;
       tok = strtok_r(NULL, ",", &save)) {
    char* colon = strchr(tok, ':');
    int want_port = colon ? atoi(colon + 1) : -1;
    if (colon) *colon = '\0';
    int name_ok = exact ? strcmp(tok, name) == 0 : strncmp(tok, name, strlen(tok)) == 0;
    hit = name_ok && (want_port < 0 || want_port == port);
  }
  return exclude ? !hit : hit;
}

/* Mbit/s from the port's active_speed and active_width enumerations. */
int ib_port_speed(const struct ibv_port_attr* a) {
  int lane;
  switch (a->active_speed) {
    case 1: lane = 2500; break;    case 2: lane = 5000; break;
    case 4: case 8: lane = 10000; break; case 16: lane = 14000; break;
    case 32: lane = 25000; break;  case 64: lane = 50000; break;
    case 128: lane = 100000; break;
    default: lane = 10000; break;
  }
  int width;
  switch (a->active_width) {
    case 1: width = 1; break; case 2: width = 4; break; case 4: width = 8; break;
    case 8: width = 12; break; case 16: width = 2; break; default: width = 1; break;
  }
  return lane * width;
}

static void ib_read_sysfs(const char* path, char* buf, size_t len) {
  buf[0] = '\0';
  FILE* f = fopen(path, "r");
  if (!f) return;
  if (fgets(buf, (int)len, f)) buf[strcspn(buf, "\n")] = '\0';
  fclose(f);
}

/* RoCE GID ranking: v2 IPv4-mapped 3, v2 other (not link-local) 2, v1 or link-local 1,
 * empty 0. Only the first 16 indices are read (a long sysfs scan is slow on small hosts). */
static int ib_gid_rank(const char* dev, int port, int idx, const union ibv_gid* g) {
  static const uint8_t zero[16];
  if (memcmp(g->raw, zero, 16) == 0) return 0;
  char path[256], type[64];
  snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
           idx);
  ib_read_sysfs(path, type, sizeof(type));
  if (!strstr(type, "v2")) return 1;
  int v4 = memcmp(g->raw, zero, 10) == 0 && g->raw[10] == 0xff && g->raw[11] == 0xff;
  int ll = g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
  return v4 ? 3 : ll ? 1 : 2;
}

static int ib_pick_gid(struct ib_port* p, const char* dev, const struct ibv_port_attr* a) {
  struct ibv_context* ctx = ib.nics[p->nic].ctx;
  int want = (int)mk_param_int(MK_PARAM_IB_GID_INDEX);
  if (p->link_layer != IBV_LINK_LAYER_ETHERNET) want = want < 0 ? 0 : want;
  if (want >= 0) {
    p->gid_index = want;
    return ib_sym.query_gid(ctx, (uint8_t)p->port, want, &p->gid) ? -EINVAL : 0;
  }
  int best = 0, n = a->gid_tbl_len < 16 ? a->gid_tbl_len : 16;
  for (int i = 0; i < n; i++) {
    union ibv_gid g;
    if (ib_sym.query_gid(ctx, (uint8_t)p->port, i, &g)) continue;
    int r = ib_gid_rank(dev, p->port, i, &g);
    if (r > best) {
      best = r;
      p->gid_index = i;
      p->gid = g;
    }
  }
  return best ? 0 : -ENODEV;
}

static void ib_port_add(int nic, int port, const struct ibv_port_attr* a) {
  if (ib.nports >= IB_MAX_PORTS) return;
  struct ib_nic* n = &ib.nics[nic];
  struct ib_port* p = &ib.ports[ib.nports];
  memset(p, 0, sizeof(*p));
  p->nic = nic;
  p->port = port;
  p->link_layer = a->link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                           : IBV_LINK_LAYER_INFINIBAND;
  p->lid = a->lid;
  p->mtu = a->active_mtu;
  p->speed_mbps = ib_port_speed(a);
  p->guid = be64toh(n->attr.node_guid);
  char path[256], real[PATH_MAX];
  snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device", n->name);
  if (realpath(path, real) && strstr(real, "/pci"))
    snprintf(p->pci_path, sizeof(p->pci_path), "%.255s", real);
  if (ib_pick_gid(p, n->name, a) < 0) {
    MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET, "ib: %s:%d has no usable GID, skipped",
            n->name, port);
    return;
  }
  ib.nports++;
  MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET,
          "ib: port %s:%d %s, %d Mbit/s, mtu %d, gid index %d, lid %u, pci %s", n->name, port,
          p->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB", p->speed_mbps,
          128 << p->mtu, p->gid_index, p->lid, p->pci_path[0] ? p->pci_path : "(none)");
}

/* The probe NCCL uses: a dmabuf registration with fd -1 fails with EOPNOTSUPP or
 * EPROTONOSUPPORT when the kernel or provider lacks dmabuf, with EBADF otherwise. */
static int ib_probe_dmabuf(struct ib_nic* n) {
  if (!ib_sym.reg_dmabuf_mr) return 0;
  errno = 0;
  struct ibv_mr* mr = ib_sym.reg_dmabuf_mr(n->pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE);
  if (mr) ib_sym.dereg_mr(mr);
  return !(errno == EOPNOTSUPP || errno == EPROTONOSUPPORT);
}

/* Async events: fatal device or port errors mark the NIC, and every later operation on its
 * comms fails. The event fd is polled with a timeout so fini can stop the thread. */
static void* ib_async_main(void* arg) {
  struct ib_nic* n = arg;
  int fl = fcntl(n->ctx->async_fd, F_GETFL);
  fcntl(n->ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
  while (!ib.stop) {
    struct pollfd p = {.fd = n->ctx->async_fd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0) continue;
    struct ibv_async_event ev;
    if (ib_sym.get_async_event(n->ctx, &ev)) continue;
    int fatal = ev.event_type == IBV_EVENT_DEVICE_FATAL || ev.event_type == IBV_EVENT_PORT_ERR ||
                ev.event_type == IBV_EVENT_QP_FATAL || ev.event_type == IBV_EVENT_CQ_ERR ||
                ev.event_type == IBV_EVENT_QP_ACCESS_ERR || ev.event_type == IBV_EVENT_QP_REQ_ERR;
    MK_WARN("ib %s: async event %s%s", n->name, ib_sym.event_type_str(ev.event_type),
            fatal ? ": the NIC's comms fail from now on" : "");
    if (ev.event_type == IBV_EVENT_DEVICE_FATAL || ev.event_type == IBV_EVENT_PORT_ERR)
      __atomic_store_n(&n->fatal, 1, __ATOMIC_RELEASE);
    ib_sym.ack_async_event(&ev);
    if (ev.event_type == IBV_EVENT_DEVICE_FATAL) break;
  }
  return NULL;
}

static int ib_nic_open(struct ibv_device* d) {
  if (ib.nnics >= IB_MAX_NICS) return 0;
  struct ib_nic* n = &ib.nics[ib.nnics];
  memset(n, 0, sizeof(*n));
  snprintf(n->name, sizeof(n->name), "%s", ib_sym.get_device_name(d));
  n->ctx = ib_sym.open_device(d);
  if (!n->ctx) return 0;
  if (ib_sym.query_device(n->ctx, &n->attr) || !(n->pd = ib_sym.alloc_pd(n->ctx))) {
    ib_sym.close_device(n->ctx);
    return 0;
  }
  int nic = ib.nnics++, before = ib.nports;
  for (int port = 1; port <= n->attr.phys_port_cnt; port++) {
    struct ibv_port_attr a;
    if (ib_query_port(n->ctx, (uint8_t)port, &a) || a.state != IBV_PORT_ACTIVE) continue;
    if (!ib_hca_match(mk_param_str(MK_PARAM_IB_HCA), n->name, port)) continue;
    ib_port_add(nic, port, &a);
  }
  if (ib.nports == before) { /* nothing usable: give the NIC back */
    ib_sym.dealloc_pd(n->pd);
    ib_sym.close_device(n->ctx);
    ib.nnics--;
    return 0;
  }
  mk_mr_cache_init(&n->mr_cache);
  n->dmabuf_ok = ib_probe_dmabuf(n);
  n->async_started = pthread_create(&n->async_thread, NULL, ib_async_main, n) == 0;
  return 0;
}

/* One virtual device per NIC (ports merged) or per port. */
static void ib_make_default_devs(void) {
  int merge = (int)mk_param_int(MK_PARAM_IB_MERGE_NICS);
  for (int p = 0; p < ib.nports; p++) {
    struct ib_vdev* v = NULL;
    if (merge)
      for (int d = 0; d < ib.ndevs; d++)
        if (ib.ports[ib.devs[d].rails[0]].nic == ib.ports[p].nic &&
            ib.devs[d].nrails < IB_MAX_RAILS)
          v = &ib.devs[d];
    if (!v) {
      v = &ib.devs[ib.ndevs++];
      memset(v, 0, sizeof(*v));
      memcpy(v->name, ib_port_nic(p)->name, sizeof(v->name)); /* same size, NUL-terminated */
    }
    v->rails[v->nrails++] = p;
  }
}

int ib_init(void) {
  if (ib.nports) return 0;
  MK_CHECK(ib_syms_load());
  int num = 0;
  struct ibv_device** list = ib_sym.get_device_list(&num);
  if (!list || num == 0) {
    if (list) ib_sym.free_device_list(list);
    MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET, "ib: no verbs devices");
    ib_syms_unload();
    return -ENODEV;
  }
  ib.stop = 0;
  for (int i = 0; i < num; i++) ib_nic_open(list[i]);
  ib_sym.free_device_list(list);
  if (ib.nports == 0) {
    MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET, "ib: no active port%s%s",
            mk_param_str(MK_PARAM_IB_HCA)[0] ? " matches NCCL_MK_IB_HCA=" : "",
            mk_param_str(MK_PARAM_IB_HCA));
    ib_fini();
    return -ENODEV;
  }
  ib_make_default_devs();
  return 0;
}

void ib_fini(void) {
  ib.stop = 1;
  for (int i = 0; i < ib.nnics; i++) {
    struct ib_nic* n = &ib.nics[i];
    if (n->async_started) pthread_join(n->async_thread, NULL);
    int leaked = mk_mr_cache_fini(&n->mr_cache);
    if (leaked) MK_WARN("ib %s: %d registrations were never deregistered", n->name, leaked);
    ib_sym.dealloc_pd(n->pd);
    ib_sym.close_device(n->ctx);
  }
  ib.nnics = ib.nports = ib.ndevs = 0;
  ib_syms_unload();
}

int ib_devices(int* ndev) {
  if (!ndev) return -EINVAL;
  pthread_mutex_lock(&ib.lock);
  *ndev = ib.ndevs;
  pthread_mutex_unlock(&ib.lock);
  return 0;
}

int ib_vdev_get(int dev, struct ib_vdev** out) {
  pthread_mutex_lock(&ib.lock);
  int n = ib.ndevs;
  pthread_mutex_unlock(&ib.lock);
  if (dev < 0 || dev >= n) {
    MK_WARN("ib: device %d does not exist (%d devices)", dev, n);
    return -EINVAL;
  }
  *out = &ib.devs[dev];
  return 0;
}

int ib_get_properties(int dev, struct mk_dev_props* props) {
  struct ib_vdev* v;
  if (!props) return -EINVAL;
  MK_CHECK(ib_vdev_get(dev, &v));
  const struct ib_port* p0 = &ib.ports[v->rails[0]];
  const struct ib_nic* n0 = &ib.nics[p0->nic];
  memset(props, 0, sizeof(*props));
  snprintf(props->name, sizeof(props->name), "%s", v->name);
  snprintf(props->pci_path, sizeof(props->pci_path), "%s", p0->pci_path);
  props->guid = p0->guid;
  props->ptr_support = MK_PTR_HOST | (n0->dmabuf_ok ? MK_PTR_DMABUF : 0);
  props->reg_is_global = 1;
  props->force_flush = 0;
  for (int r = 0; r < v->nrails; r++) props->speed_mbps += ib.ports[v->rails[r]].speed_mbps;
  if (mk_param_int(MK_PARAM_NET_SPEED_MBPS)) props->speed_mbps = (int)mk_param_int(MK_PARAM_NET_SPEED_MBPS);
  props->port = p0->port;
  props->latency_us = 0;
  props->max_comms = n0->attr.max_qp;
  props->max_recvs = MK_MAX_RECVS;
  uint64_t wr = n0->attr.max_mr_size < IB_MAX_WR_BYTES ? n0->attr.max_mr_size : IB_MAX_WR_BYTES;
  props->max_p2p_bytes = props->max_coll_bytes = (size_t)(wr * IB_WR_PER_PIECE);
  return 0;
}

/* A new device whose rails are the rails of the listed devices (each port at most once). */
int ib_make_vdevice(int ndevs, const int* devs, int* new_dev) {
  if (ndevs < 1 || !devs || !new_dev) {
    MK_WARN("ib make_vdevice: bad argument (ndevs %d, devs %p)", ndevs, (const void*)devs);
    return -EINVAL;
  }
  pthread_mutex_lock(&ib.lock);
  int rc = 0;
  struct ib_vdev v = {0};
  for (int i = 0; i < ndevs && rc == 0; i++) {
    if (devs[i] < 0 || devs[i] >= ib.ndevs) { rc = -EINVAL; break; }
    const struct ib_vdev* s = &ib.devs[devs[i]];
    for (int r = 0; r < s->nrails && rc == 0; r++) {
      if (v.nrails == IB_MAX_RAILS) { rc = -EINVAL; break; }
      for (int k = 0; k < v.nrails; k++)
        if (v.rails[k] == s->rails[r]) rc = -EINVAL;
      v.rails[v.nrails++] = s->rails[r];
    }
    size_t len = strlen(v.name);
    snprintf(v.name + len, sizeof(v.name) - len, "%s%s", i ? "+" : "", s->name);
  }
  if (rc == 0 && ib.ndevs >= IB_MAX_DEVS) rc = -ENOSPC;
  if (rc == 0) {
    ib.devs[ib.ndevs] = v;
    *new_dev = ib.ndevs++;
  }
  pthread_mutex_unlock(&ib.lock);
  if (rc) MK_WARN("ib make_vdevice: devices must exist, be distinct, and have at most %d ports "
                  "together", IB_MAX_RAILS);
  return rc;
}
