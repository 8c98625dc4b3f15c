/*
 * Logging through NCCL's logger, which the net and tuner init calls hand us. Before that
 * (tests, tools) WARN goes to stderr and INFO follows NCCL_DEBUG=INFO.
 * Every line carries the "NET/MK" prefix so users can grep for us.
 */
#ifndef MK_LOG_H_
#define MK_LOG_H_

#include "mk_config.h"
#include "abi/nccl_types.h"

void mk_log_set_logger(ncclDebugLogger_t logger);
void mk_log(ncclDebugLogLevel level, unsigned long subsys, const char* file, int line,
            const char* fmt, ...) __attribute__((format(printf, 5, 6)));

#define MK_WARN(...) mk_log(NCCL_LOG_WARN, MK_NCCL_SUBSYS_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define MK_INFO(subsys, ...) mk_log(NCCL_LOG_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__)
#if MK_ENABLE_TRACE
#define MK_TRACE(subsys, ...) mk_log(NCCL_LOG_TRACE, (subsys), __FILE__, __LINE__, __VA_ARGS__)
#else
#define MK_TRACE(subsys, ...) do { } while (0)
#endif

#endif /* MK_LOG_H_ */
