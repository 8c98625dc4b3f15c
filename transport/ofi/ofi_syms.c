/* libfabric reached only through dlopen, so the plugin loads on hosts without it. */
#include <dlfcn.h>
#include <string.h>

#include "mk_log.h"
#include "ofi.h"

struct ofi_syms ofi_sym;

#define OFI_SYM(field, name)                                      \
  do {                                                            \
    *(void**)&ofi_sym.field = dlsym(ofi_sym.lib, name);           \
    if (!ofi_sym.field) {                                         \
      MK_WARN("libfabric.so.1 lacks %s: too old or broken", name); \
      goto fail;                                                  \
    }                                                             \
  } while (0)

int ofi_syms_load(void) {
  if (ofi_sym.lib) return 0;
  ofi_sym.lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!ofi_sym.lib) {
    MK_INFO(MK_NCCL_SUBSYS_INIT | MK_NCCL_SUBSYS_NET, "libfabric not available: %s", dlerror());
    return -ENODEV;
  }
  OFI_SYM(getinfo, "fi_getinfo");
  OFI_SYM(freeinfo, "fi_freeinfo");
  OFI_SYM(dupinfo, "fi_dupinfo");
  OFI_SYM(fabric, "fi_fabric");
  OFI_SYM(strerror, "fi_strerror");
  OFI_SYM(version, "fi_version");
  return 0;
fail:
  ofi_syms_unload();
  return -ENODEV;
}

void ofi_syms_unload(void) {
  if (ofi_sym.lib) dlclose(ofi_sym.lib);
  memset(&ofi_sym, 0, sizeof(ofi_sym));
}
