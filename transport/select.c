#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "transport.h"

static const struct mk_transport_ops* selected;
static int select_rc = -ENODEV;
static pthread_once_t select_once = PTHREAD_ONCE_INIT;

#if MK_HAVE_OFI || MK_HAVE_VERBS
static int transport_try(const struct mk_transport_ops* ops) {
  if (ops->size != sizeof(*ops)) {
    MK_WARN("transport %s was built against another transport.h", ops->name);
    return -EPROTO;
  }
  int rc = ops->init();
  if (rc < 0) {
    MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET, "transport %s unavailable (%s)",
            ops->name, strerror(-rc));
    return rc;
  }
  selected = ops;
  MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET, "using transport %s", ops->name);
  return 0;
}
#endif

static void transport_select(void) {
  const char* want = mk_param_str(MK_PARAM_TRANSPORT);
  int any = strcasecmp(want, "auto") == 0;
#if MK_HAVE_VERBS
  if (any || strcasecmp(want, "ib") == 0) {
    select_rc = transport_try(&mk_ib_ops);
    if (select_rc == 0) return;
  }
#endif
#if MK_HAVE_OFI
  if (any || strcasecmp(want, "ofi") == 0) {
    select_rc = transport_try(&mk_ofi_ops);
    if (select_rc == 0) return;
  }
#endif
  if (!any && select_rc == -ENODEV)
    MK_WARN("NCCL_MK_TRANSPORT=%s: that transport is not built into this library or has no "
            "device here", want);
}

int mk_transport_get(const struct mk_transport_ops** ops) {
  pthread_once(&select_once, transport_select);
  if (select_rc < 0) return select_rc;
  *ops = selected;
  return 0;
}

uint64_t mk_connect_timeout_ns(void) {
  return (uint64_t)mk_param_int(MK_PARAM_CONNECT_TIMEOUT_MS) * 1000000;
}
