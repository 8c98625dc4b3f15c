#include "mk_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "mk_param.h"

static _Atomic(ncclDebugLogger_t) nccl_logger;

void mk_log_set_logger(ncclDebugLogger_t logger) {
  if (logger) atomic_store(&nccl_logger, logger);
}

/* Without NCCL's logger: WARN always, INFO/TRACE when NCCL_DEBUG asks for them.
 * WARN must not consult the registry: the registry warns while it loads. */
static int stderr_wants(ncclDebugLogLevel level) {
  if (level <= NCCL_LOG_WARN) return 1;
  const char* dbg = mk_param_str(MK_PARAM_NCCL_DEBUG);
  if (strcasecmp(dbg, "TRACE") == 0) return 1;
  return level == NCCL_LOG_INFO && strcasecmp(dbg, "INFO") == 0;
}

void mk_log(ncclDebugLogLevel level, unsigned long subsys, const char* file, int line,
            const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(msg, sizeof(msg), "NET/MK ");
  vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
  va_end(ap);

  ncclDebugLogger_t logger = atomic_load(&nccl_logger);
  if (logger) {
    logger(level, subsys, file, line, "%s", msg);
  } else if (stderr_wants(level)) {
    fprintf(stderr, "nccl-mk %s %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", msg);
  }
}
