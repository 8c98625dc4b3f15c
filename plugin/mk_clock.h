/* The host's one clock for timeouts and traces: CLOCK_MONOTONIC in ns. */
#ifndef MK_CLOCK_H_
#define MK_CLOCK_H_

#include <stdint.h>
#include <time.h>

static inline uint64_t mk_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

#endif /* MK_CLOCK_H_ */
