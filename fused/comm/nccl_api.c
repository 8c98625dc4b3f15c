#include "nccl_api.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>

#include "mk_clock.h"
#include "mk_log.h"
#include "mk_param.h"

static struct mk_nccl_api api;
static int api_rc = -ENOTSUP;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

/* Where NCCL lives: a program linked with it exports the symbols globally; PyTorch loads
 * it privately, but RTLD_NOLOAD finds that copy by soname without loading a second one.
 * 0 with *lib set (RTLD_DEFAULT is a null handle, hence the separate status), or -1. */
static int nccl_find_library(void** lib) {
  if (dlsym(RTLD_DEFAULT, "ncclGetVersion")) {
    *lib = RTLD_DEFAULT;
    return 0;
  }
  *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!*lib) *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  return *lib ? 0 : -1;
}

struct nccl_sym {
  const char* name;
  void** slot;
};

static void api_resolve(void) {
  void* lib = NULL;
  if (nccl_find_library(&lib) < 0) {
    MK_WARN("fused ops: no NCCL in this process and libnccl.so.2 cannot be loaded");
    return;
  }
  const struct nccl_sym syms[] = {
      {"ncclGetVersion", (void**)&api.get_version},
      {"ncclGetErrorString", (void**)&api.get_error_string},
      {"ncclCommCount", (void**)&api.comm_count},
      {"ncclCommUserRank", (void**)&api.comm_user_rank},
      {"ncclCommCuDevice", (void**)&api.comm_cu_device},
      {"ncclCommGetAsyncError", (void**)&api.comm_get_async_error},
      {"ncclGroupStart", (void**)&api.group_start},
      {"ncclGroupEnd", (void**)&api.group_end},
      {"ncclAllGather", (void**)&api.all_gather},
      {"ncclReduceScatter", (void**)&api.reduce_scatter},
      {"ncclAllReduce", (void**)&api.all_reduce},
  };
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
    *syms[i].slot = dlsym(lib, syms[i].name);
    if (!*syms[i].slot) {
      MK_WARN("fused ops: NCCL in this process has no %s", syms[i].name);
      return;
    }
  }
  if (api.get_version(&api.version) != ncclSuccess || api.version < MK_NCCL_MIN_VERSION) {
    MK_WARN("fused ops: NCCL version %d is older than 2.19", api.version);
    return;
  }
  MK_INFO(MK_NCCL_SUBSYS_INIT, "fused ops use NCCL %d found in the process", api.version);
  api_rc = 0;
}

int mk_nccl_api_get(const struct mk_nccl_api** out) {
  pthread_once(&api_once, api_resolve);
  if (api_rc == 0) *out = &api;
  return api_rc;
}

int mk_nccl_check(ncclResult_t res, const char* what) {
  if (res == ncclSuccess) return 0;
  MK_WARN("%s failed: %s", what, api.get_error_string ? api.get_error_string(res) : "?");
  switch (res) {
    case ncclInvalidArgument: return -EINVAL;
    case ncclInvalidUsage: return -ENOTSUP;
    case ncclRemoteError: return -ECONNRESET;
    default: return -EIO;
  }
}

ncclResult_t mk_nccl_comm_state(const struct mk_nccl_api* a, ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t query = a->comm_get_async_error(comm, &state);
  return query != ncclSuccess ? query : state;
}

/* Unbounded, as NCCL's own calls on the communicator are (its call may still write our
 * buffers, so giving up here could not free them), but not silent: a WARN every
 * NCCL_MK_TIMEOUT_MS names what is still in progress. */
int mk_nccl_comm_check(const struct mk_nccl_api* a, ncclComm_t comm, ncclResult_t res, const char* what) {
  const uint64_t every_ns = (uint64_t)mk_param_int(MK_PARAM_TIMEOUT_MS) * 1000000ull;
  uint64_t t0 = 0, next = 0;
  while (res == ncclInProgress) {
    const uint64_t now = mk_now_ns();
    if (!t0) {
      t0 = now, next = now + every_ns;
    } else if (now >= next) {
      MK_WARN("%s: the communicator is still ncclInProgress after %llu ms; waiting on, as NCCL does (every rank "
              "must make this call: has one failed or not reached it?)",
              what, (unsigned long long)((now - t0) / 1000000));
      next = now + every_ns;
    }
    sched_yield();
    res = mk_nccl_comm_state(a, comm);
  }
  return mk_nccl_check(res, what);
}
