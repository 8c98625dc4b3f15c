/* Provider and device discovery, domains, and the properties reported to NCCL. */
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "handle.h"
#include "ofi.h"
#include "sock.h"

struct ofi_state ofi;

/* What we ask for: tagged messages for two-sided, RMA for one-sided (tcp also needs FI_RMA
 * requested to hand out usable MR keys). mr_mode lists every bit we know how to honour;
 * FI_MR_ENDPOINT is left out because one registration serves every comm of a domain. */
static struct fi_info* ofi_hints(const char* prov, int want_hmem, int delivery_complete) {
  struct fi_info* h = ofi_allocinfo();
  if (!h) return NULL;
  h->caps = FI_TAGGED | FI_MSG | FI_RMA | FI_LOCAL_COMM | FI_REMOTE_COMM | (want_hmem ? FI_HMEM : 0);
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->ep_attr->type = FI_EP_RDM;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                            (want_hmem ? FI_MR_HMEM : 0);
  h->domain_attr->threading = FI_THREAD_SAFE;
  if (delivery_complete) h->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  h->fabric_attr->prov_name = strdup(prov);
  return h;
}

static int ofi_query(const char* prov, int want_hmem, int delivery_complete, struct fi_info** out) {
  struct fi_info* h = ofi_hints(prov, want_hmem, delivery_complete);
  if (!h || !h->fabric_attr->prov_name) {
    if (h) ofi_sym.freeinfo(h);
    return -ENOMEM;
  }
  int rc = ofi_sym.getinfo(ofi.api_version, NULL, NULL, 0, h, out);
  ofi_sym.freeinfo(h);
  return rc;
}

/* Which devices NCCL sees, in what order (-1: not listed). A provider whose domains are network
 * interfaces (tcp) follows NCCL_MK_SOCKET_IFNAME as NCCL's Socket transport follows
 * NCCL_SOCKET_IFNAME: only the named ones; unset, every one but loopback (loopback only when
 * nothing else exists). Domains that are not interfaces (efa's) are never filtered. Listing
 * loopback beside a real interface made NCCL see two NICs and open twice the channels. */
static int ofi_dev_rank(const struct fi_info* i, int allow_lo) {
  const char* want = mk_param_str(MK_PARAM_SOCKET_IFNAME);
  const char* name = i->domain_attr->name;
  if (if_nametoindex(name) == 0) return 1;
  if (want[0]) return mk_sock_ifname_matches(want, name) ? 0 : -1;
  if (strcmp(name, "lo") == 0) return allow_lo ? 1 : -1;
  return 1;
}

static int ofi_dev_known(const char* name) {
  for (int d = 0; d < ofi.ndev; d++)
    if (strcmp(ofi.devs[d].name, name) == 0) return 1;
  return 0;
}

static void ofi_dev_add(const struct fi_info* i, int delivery_complete) {
  struct ofi_dev* dev = &ofi.devs[ofi.ndev];
  memset(dev, 0, sizeof(*dev));
  dev->info = ofi_sym.dupinfo(i);
  if (!dev->info) return;
  snprintf(dev->name, sizeof(dev->name), "%s", i->domain_attr->name);
  pthread_mutex_init(&dev->lock, NULL);
  ofi_runner_init(&dev->runner);
  mk_mr_cache_init(&dev->mr_cache);
  uint64_t m = i->domain_attr->mr_mode;
  dev->mr_local = !!(m & FI_MR_LOCAL);
  dev->mr_virt_addr = !!(m & FI_MR_VIRT_ADDR);
  dev->mr_prov_key = !!(m & FI_MR_PROV_KEY);
  dev->mr_allocated = !!(m & FI_MR_ALLOCATED);
  dev->hmem = !!(i->caps & FI_HMEM);
  dev->delivery_complete = delivery_complete;
  dev->can_write_data = (i->caps & FI_RMA) && i->domain_attr->cq_data_size >= sizeof(uint64_t);
  /* Larger is never a real message: treat it as a bad size (and advertise at most this). */
  dev->max_msg_size = i->ep_attr->max_msg_size < MK_OFI_MAX_P2P_BYTES ? i->ep_attr->max_msg_size
                                                                       : MK_OFI_MAX_P2P_BYTES;
  dev->next_key = 1;
  ofi.ndev++;
  MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET,
          "ofi dev %d: %s (%s) mr_mode%s%s%s%s hmem=%d delivery_complete=%d write_data=%d", ofi.ndev - 1,
          dev->name, i->fabric_attr->prov_name, dev->mr_local ? " LOCAL" : "",
          dev->mr_virt_addr ? " VIRT_ADDR" : "", dev->mr_prov_key ? " PROV_KEY" : "",
          dev->mr_allocated ? " ALLOCATED" : "", dev->hmem, delivery_complete, dev->can_write_data);
}

/* One device per domain name, IPv4 entries preferred, in rank order. */
static void ofi_devs_from(struct fi_info* list, int delivery_complete, int allow_lo) {
  for (int rank = 0; rank <= 1; rank++)
    for (int v4 = 1; v4 >= 0; v4--)
      for (struct fi_info* i = list; i && ofi.ndev < MK_OFI_MAX_DEVS; i = i->next) {
        if (ofi_dev_rank(i, allow_lo) != rank || ofi_dev_known(i->domain_attr->name)) continue;
        if (v4 && i->addr_format != FI_SOCKADDR_IN) continue;
        ofi_dev_add(i, delivery_complete);
      }
}

/* The provider has devices but NCCL_MK_SOCKET_IFNAME left none: say which there were. */
static void ofi_warn_filtered(const char* prov, const struct fi_info* list) {
  char names[256] = " ", word[72];
  size_t used = 1;
  for (const struct fi_info* i = list; i && used + 1 < sizeof(names); i = i->next) {
    snprintf(word, sizeof(word), " %s ", i->domain_attr->name);
    if (strstr(names, word)) continue; /* one entry per domain (IPv4 and IPv6 repeat it) */
    int n = snprintf(names + used, sizeof(names) - used, "%s", word + 1);
    if (n < 0) break;
    used += (size_t)n;
  }
  if (used > 1) names[used - 1] = '\0'; /* the last name's trailing space */
  MK_WARN("libfabric %s: NCCL_MK_SOCKET_IFNAME=%s names none of its interfaces (%s)", prov,
          mk_param_str(MK_PARAM_SOCKET_IFNAME), names + 1);
}

/* hmem first (GPU buffers), then host only. */
static int ofi_discover(const char* prov) {
  struct fi_info* list = NULL;
  int rc = ofi_query(prov, 1, 0, &list);
  if (rc != 0) rc = ofi_query(prov, 0, 0, &list);
  if (rc != 0) return rc;
  struct fi_info* dc = NULL;
  int delivery_complete = ofi_query(prov, list->caps & FI_HMEM ? 1 : 0, 1, &dc) == 0;
  if (dc) ofi_sym.freeinfo(dc);
  ofi_devs_from(list, delivery_complete, 0);
  if (ofi.ndev == 0) ofi_devs_from(list, delivery_complete, 1);
  if (ofi.ndev == 0) ofi_warn_filtered(prov, list);
  ofi_sym.freeinfo(list);
  return ofi.ndev > 0 ? 0 : -ENODEV;
}

static int ofi_init(void) {
  if (ofi.ndev > 0) return 0;
  MK_CHECK(ofi_syms_load());
  uint32_t built = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
  uint32_t have = ofi_sym.version();
  ofi.api_version = have < built ? have : built;
  const char* want = mk_param_str(MK_PARAM_OFI_PROVIDER);
  int rc = -ENODEV;
  if (want[0]) {
    rc = ofi_discover(want);
    if (rc < 0) MK_WARN("NCCL_MK_OFI_PROVIDER=%s: no usable RDM endpoint with tagged messages and "
                        "RMA (%s)", want, ofi_sym.strerror(-rc));
  } else {
    rc = ofi_discover("efa");
    if (rc < 0) rc = ofi_discover("tcp;ofi_rxm");
    if (rc < 0) MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET,
                        "libfabric: neither efa nor tcp;ofi_rxm is usable");
  }
  if (rc < 0) {
    ofi_syms_unload();
    return -ENODEV;
  }
  return 0;
}

static void ofi_fini(void) {
  /* comms NCCL never closed (an abort): their own progress and stream threads must not read
   * CQs while the domain and libfabric go (found in session 45: SIGSEGV in ofi_cq_progress) */
  ofi_comms_stop_threads();
  for (int d = 0; d < ofi.ndev; d++) {
    struct ofi_dev* dev = &ofi.devs[d];
    /* first: a device thread still serving comms NCCL never closed (an abort) must not read
     * their CQs while the domain goes */
    ofi_runner_destroy(&dev->runner);
    int leaked = mk_mr_cache_fini(&dev->mr_cache);
    if (leaked) MK_WARN("ofi dev %s: %d registrations still in use at fini", dev->name, leaked);
    if (dev->domain) fi_close(&dev->domain->fid);
    if (dev->fabric) fi_close(&dev->fabric->fid);
    ofi_sym.freeinfo(dev->info);
    pthread_mutex_destroy(&dev->lock);
  }
  memset(&ofi, 0, sizeof(ofi));
  ofi_syms_unload();
}

int ofi_dev_open(struct ofi_dev* dev) {
  int rc = 0;
  pthread_mutex_lock(&dev->lock);
  if (!dev->domain) {
    rc = ofi_sym.fabric(dev->info->fabric_attr, &dev->fabric, NULL);
    if (rc == 0) rc = fi_domain(dev->fabric, dev->info, &dev->domain, NULL);
    if (rc != 0) {
      MK_WARN("ofi dev %s: cannot open fabric/domain: %s", dev->name, ofi_sym.strerror(-rc));
      if (dev->fabric) fi_close(&dev->fabric->fid);
      dev->fabric = NULL;
      dev->domain = NULL;
    }
  }
  pthread_mutex_unlock(&dev->lock);
  return rc;
}

static int ofi_devices(int* ndev) {
  if (!ndev) return -EINVAL;
  *ndev = ofi.ndev;
  return 0;
}

/* Mb/s: nic link attr, else sysfs, else the documented fallback. */
static int ofi_speed_mbps(const struct ofi_dev* dev) {
  int64_t forced = mk_param_int(MK_PARAM_NET_SPEED_MBPS);
  if (forced > 0) return (int)forced;
  const struct fid_nic* nic = dev->info->nic;
  if (nic && nic->link_attr && nic->link_attr->speed > 0)
    return (int)(nic->link_attr->speed / 1000000);
  char path[128];
  snprintf(path, sizeof(path), "/sys/class/net/%s/speed", dev->name);
  FILE* f = fopen(path, "r");
  int mbps = 0;
  if (f) {
    if (fscanf(f, "%d", &mbps) != 1) mbps = 0;
    fclose(f);
  }
  if (mbps > 0) return mbps;
  MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET,
          "ofi dev %s: link speed unknown, assuming %d Mb/s (set NCCL_MK_NET_SPEED_MBPS)",
          dev->name, MK_OFI_FALLBACK_SPEED_MBPS);
  return MK_OFI_FALLBACK_SPEED_MBPS;
}

static void ofi_pci_path(const struct ofi_dev* dev, char* out, size_t len) {
  out[0] = '\0';
  const struct fid_nic* nic = dev->info->nic;
  if (!nic || !nic->bus_attr || nic->bus_attr->bus_type != FI_BUS_PCI) return;
  const struct fi_pci_attr* p = &nic->bus_attr->attr.pci;
  char link[128];
  snprintf(link, sizeof(link), "/sys/bus/pci/devices/%04x:%02x:%02x.%x", p->domain_id, p->bus_id,
           p->device_id, p->function_id);
  if (!realpath(link, out)) out[0] = '\0';
}

static int ofi_get_properties(int d, struct mk_dev_props* props) {
  if (d < 0 || d >= ofi.ndev || !props) return -EINVAL;
  const struct ofi_dev* dev = &ofi.devs[d];
  char pci[4096];
  memset(props, 0, sizeof(*props));
  snprintf(props->name, sizeof(props->name), "%s", dev->name);
  ofi_pci_path(dev, pci, sizeof(pci));
  snprintf(props->pci_path, sizeof(props->pci_path), "%s", pci);
  props->guid = mk_fnv1a32(dev->name, strlen(dev->name)) | ((uint64_t)d << 32);
  props->ptr_support = MK_PTR_HOST | (dev->hmem ? MK_PTR_CUDA : 0);
  props->reg_is_global = 1;
  props->force_flush = 0;
  props->speed_mbps = ofi_speed_mbps(dev);
  props->port = 1;
  props->latency_us = 0; /* libfabric does not report one */
  props->max_comms = 65536;
  props->max_recvs = MK_MAX_RECVS;
  size_t cap = dev->max_msg_size < MK_OFI_MAX_P2P_BYTES ? dev->max_msg_size : MK_OFI_MAX_P2P_BYTES;
  props->max_p2p_bytes = cap;
  props->max_coll_bytes = cap;
  return 0;
}

/* Defined in the other files of this folder. */
int ofi_listen(int dev, void* handle, void** listen_comm);
int ofi_connect(int dev, const void* handle, int traffic_class, struct mk_comm** send_comm);
int ofi_accept(void* listen_comm, struct mk_comm** recv_comm);
int ofi_close_listen(void* listen_comm);
int ofi_close(struct mk_comm* comm);
int ofi_reg_mr(struct mk_comm* comm, void* data, size_t size, int type, struct mk_mr** mr);
int ofi_reg_mr_dmabuf(struct mk_comm* comm, void* data, size_t size, int type, uint64_t offset,
                      int fd, struct mk_mr** mr);
int ofi_dereg_mr(struct mk_comm* comm, struct mk_mr* mr);
int ofi_isend(struct mk_comm* comm, void* data, size_t size, int tag, struct mk_mr* mr,
              struct mk_request** req);
int ofi_irecv(struct mk_comm* comm, int n, void** data, const size_t* sizes, const int* tags,
              struct mk_mr** mrs, int optional, struct mk_request** req);
int ofi_iflush(struct mk_comm* comm, int n, void** data, const int* sizes, struct mk_mr** mrs,
               struct mk_request** req);
int ofi_test(struct mk_request* req, int* done, size_t* sizes);
int ofi_mr_rkey(struct mk_mr* mr, struct mk_rkey* out);
int ofi_iput(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
             const struct mk_rkey* dst, uint64_t dst_off, struct mk_request** req);
int ofi_iput_signal(struct mk_comm* comm, const void* src, size_t size, struct mk_mr* src_mr,
                    const struct mk_rkey* dst, uint64_t dst_off, const struct mk_rkey* sig,
                    uint64_t sig_off, uint64_t value, struct mk_request** req);
int ofi_progress(struct mk_comm* comm);

const struct mk_transport_ops mk_ofi_ops = {
    .size = sizeof(struct mk_transport_ops),
    .name = "ofi",
    .init = ofi_init,
    .fini = ofi_fini,
    .devices = ofi_devices,
    .get_properties = ofi_get_properties,
    .listen = ofi_listen,
    .connect = ofi_connect,
    .accept = ofi_accept,
    .close_listen = ofi_close_listen,
    .close = ofi_close,
    .reg_mr = ofi_reg_mr,
    .reg_mr_dmabuf = ofi_reg_mr_dmabuf,
    .dereg_mr = ofi_dereg_mr,
    .isend = ofi_isend,
    .irecv = ofi_irecv,
    .iflush = ofi_iflush,
    .test = ofi_test,
    .mr_rkey = ofi_mr_rkey,
    .iput = ofi_iput,
    .iput_signal = ofi_iput_signal,
    .progress = ofi_progress,
};
