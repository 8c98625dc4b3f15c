/* libibverbs reached only through dlopen, so the plugin loads on hosts without it. The
 * header's macros that expand to exported symbols (ibv_get_device_list, ibv_query_port,
 * ibv_reg_mr) are never used directly: we call the table, see ib_query_port. */
#include <dlfcn.h>
#include <string.h>

#include "ib.h"
#include "mk_log.h"

struct ib_syms ib_sym;

#define IB_SYM(field, name, required)                                       \
  do {                                                                      \
    *(void**)&ib_sym.field = dlsym(ib_sym.lib, name);                       \
    if (!ib_sym.field && (required)) {                                      \
      MK_WARN("libibverbs.so.1 lacks %s: too old or broken", name);         \
      goto fail;                                                            \
    }                                                                       \
  } while (0)

int ib_syms_load(void) {
  if (ib_sym.lib) return 0;
  ib_sym.lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!ib_sym.lib) {
    MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET, "libibverbs not available: %s", dlerror());
    return -ENODEV;
  }
  IB_SYM(get_device_list, "ibv_get_device_list", 1);
  IB_SYM(free_device_list, "ibv_free_device_list", 1);
  IB_SYM(get_device_name, "ibv_get_device_name", 1);
  IB_SYM(open_device, "ibv_open_device", 1);
  IB_SYM(close_device, "ibv_close_device", 1);
  IB_SYM(query_device, "ibv_query_device", 1);
  IB_SYM(query_port, "ibv_query_port", 1);
  IB_SYM(query_gid, "ibv_query_gid", 1);
  IB_SYM(alloc_pd, "ibv_alloc_pd", 1);
  IB_SYM(dealloc_pd, "ibv_dealloc_pd", 1);
  IB_SYM(reg_mr, "ibv_reg_mr", 1);
  IB_SYM(reg_mr_iova2, "ibv_reg_mr_iova2", 0);
  IB_SYM(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", 0);
  IB_SYM(dereg_mr, "ibv_dereg_mr", 1);
  IB_SYM(create_cq, "ibv_create_cq", 1);
  IB_SYM(destroy_cq, "ibv_destroy_cq", 1);
  IB_SYM(create_qp, "ibv_create_qp", 1);
  IB_SYM(destroy_qp, "ibv_destroy_qp", 1);
  IB_SYM(modify_qp, "ibv_modify_qp", 1);
  IB_SYM(get_async_event, "ibv_get_async_event", 1);
  IB_SYM(ack_async_event, "ibv_ack_async_event", 1);
  IB_SYM(wc_status_str, "ibv_wc_status_str", 1);
  IB_SYM(event_type_str, "ibv_event_type_str", 1);
  return 0;
fail:
  ib_syms_unload();
  return -ENODEV;
}

void ib_syms_unload(void) {
  if (ib_sym.lib) dlclose(ib_sym.lib);
  memset(&ib_sym, 0, sizeof(ib_sym));
}

/* The header's ibv_query_port is an inline that asks the provider for the extended port
 * attributes and falls back to the exported symbol; same here, through the table. */
int ib_query_port(struct ibv_context* ctx, uint8_t port, struct ibv_port_attr* attr) {
  struct verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  memset(attr, 0, sizeof(*attr));
  if (vctx) return vctx->query_port(ctx, port, attr, sizeof(*attr));
  return ib_sym.query_port(ctx, port, attr);
}
