/*
 * Shared by the tuner tests: NCCL's cost table as a one-node, no-CollNet, no-NVLS job
 * would hand it over, a check that exactly one expected cell was forced, and a logger
 * that records what the plugin said (NCCL's logger is variadic: keep the formatted text).
 */
#ifndef MK_TUNER_TEST_UTIL_H_
#define MK_TUNER_TEST_UTIL_H_

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "abi/tuner_v5.h"
#include "mk_test.h"

#define NA NCCL_NUM_ALGORITHMS_V5
#define NP NCCL_NUM_PROTOCOLS_V5

/* Predicted times for every cell; CollNet, NVLS and PAT are not applicable (-1). */
static inline void tuner_test_fill_table(float table[NA][NP]) {
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++) table[a][p] = 100.0f + (float)(a * NP + p);
  for (int p = 0; p < NP; p++) {
    table[NCCL_ALGO_COLLNET_DIRECT][p] = (float)NCCL_ALGO_PROTO_IGNORE;
    table[NCCL_ALGO_COLLNET_CHAIN][p] = (float)NCCL_ALGO_PROTO_IGNORE;
    table[NCCL_ALGO_NVLS][p] = (float)NCCL_ALGO_PROTO_IGNORE;
    table[NCCL_ALGO_NVLS_TREE][p] = (float)NCCL_ALGO_PROTO_IGNORE;
    table[NCCL_ALGO_PAT][p] = (float)NCCL_ALGO_PROTO_IGNORE;
  }
}

/* after differs from before in exactly (algo, proto), which is now 0.0. */
#define CHECK_FORCED(before, after, algo, proto)                                        \
  do {                                                                                  \
    for (int a_ = 0; a_ < NA; a_++)                                                     \
      for (int p_ = 0; p_ < NP; p_++) {                                                 \
        if (a_ == (algo) && p_ == (proto)) CHECK((after)[a_][p_] == 0.0f);              \
        else CHECK(memcmp(&(before)[a_][p_], &(after)[a_][p_], sizeof(float)) == 0);    \
      }                                                                                 \
  } while (0)

#define CHECK_UNCHANGED(before, after) CHECK(memcmp((before), (after), sizeof(before)) == 0)

/* ---- a logger that keeps the lines, for "said it once" and "named file:line" checks ---- */
static pthread_mutex_t tuner_test_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char tuner_test_log[32768];
static int tuner_test_log_warns;

static void tuner_test_logger(ncclDebugLogLevel level, unsigned long flags, const char* file,
                              int line, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&tuner_test_log_lock);
  size_t used = strlen(tuner_test_log);
  snprintf(tuner_test_log + used, sizeof(tuner_test_log) - used, "%s\n", msg);
  if (level == NCCL_LOG_WARN) tuner_test_log_warns++;
  pthread_mutex_unlock(&tuner_test_log_lock);
}

static inline void tuner_test_log_clear(void) {
  pthread_mutex_lock(&tuner_test_log_lock);
  tuner_test_log[0] = '\0';
  tuner_test_log_warns = 0;
  pthread_mutex_unlock(&tuner_test_log_lock);
}

/* How many times needle occurs in what was logged. */
static inline int tuner_test_log_count(const char* needle) {
  int n = 0;
  for (const char* p = tuner_test_log; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

#endif /* MK_TUNER_TEST_UTIL_H_ */
