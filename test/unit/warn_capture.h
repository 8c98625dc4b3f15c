/*
 * The C tests' copy of the last WARN, so that a refusal can be checked to name its reason:
 * call warn_capture_on() first (it installs the logger, plugin/mk_log.h), then read last_warn
 * (every WARN is also printed to stderr).
 */
#ifndef MK_WARN_CAPTURE_H_
#define MK_WARN_CAPTURE_H_

#include <stdarg.h>
#include <stdio.h>

#include "mk_log.h"

static char last_warn[1024];

static void capture_logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                           const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  if (level != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_warn, sizeof last_warn, fmt, ap);
  va_end(ap);
  fprintf(stderr, "WARN %s\n", last_warn);
}

static void warn_capture_on(void) { mk_log_set_logger(capture_logger); }

#endif /* MK_WARN_CAPTURE_H_ */
