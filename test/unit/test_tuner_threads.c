/*
 * NCCL may create several communicators at once, from several threads. Released together
 * by a barrier, 16 threads init through the v5 table and tune a collective: the file must
 * be read exactly once, every context must share that one model, and every thread must
 * get the measured choice. NCCL_MK_TUNER_FILE = data/tuner_basic.txt (set by meson).
 */
#include <pthread.h>

#include "tuner.h"
#include "tuner_test_util.h"

#define NTHREADS 16

extern const ncclTuner_v5_t ncclTunerPlugin_v5;

struct worker {
  pthread_t thread;
  pthread_barrier_t* start;
  int index;
  void* ctx;
  int forced_ring_simple;
};

static void* worker_main(void* arg) {
  struct worker* w = arg;
  pthread_barrier_wait(w->start);
  ncclTunerPlugin_v5.init(&w->ctx, (uint64_t)w->index, 2, 1, tuner_test_logger, NULL, NULL);
  float table[NA][NP];
  tuner_test_fill_table(table);
  int nch = 0;
  ncclTunerPlugin_v5.getCollInfo(w->ctx, ncclFuncAllReduce, 2 << 20, 1, (float**)table, NA,
                                 NP, 0, &nch);
  w->forced_ring_simple = table[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] == 0.0f;
  return NULL;
}

int main(void) {
  pthread_barrier_t start;
  struct worker workers[NTHREADS];
  pthread_barrier_init(&start, NULL, NTHREADS);
  for (int i = 0; i < NTHREADS; i++) {
    workers[i] = (struct worker){.start = &start, .index = i};
    CHECK_EQ(pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]), 0);
  }
  for (int i = 0; i < NTHREADS; i++) pthread_join(workers[i].thread, NULL);
  pthread_barrier_destroy(&start);

  CHECK_EQ(tuner_test_log_count("loaded tuning file"), 1);
  CHECK_EQ(tuner_test_log_warns, 0);
  const struct mk_tuner_model* model = mk_tuner_shared_model();
  CHECK_EQ(model->npoints, 18);
  for (int i = 0; i < NTHREADS; i++) {
    const struct mk_tuner_ctx* c = workers[i].ctx;
    CHECK(c != NULL);
    if (c) CHECK(c->model == model);
    CHECK(workers[i].forced_ring_simple);
    CHECK_EQ(ncclTunerPlugin_v5.finalize(workers[i].ctx), ncclSuccess);
  }
  return MK_TEST_RESULT();
}
