/*
 * The one model per process, read from NCCL_MK_TUNER_FILE the first time a communicator
 * (or a fused op) asks for it, and shared read-only by every tuner context afterwards.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "mk_log.h"
#include "mk_param.h"
#include "tuner.h"
#include "tuner_file.h"

static pthread_once_t shared_once = PTHREAD_ONCE_INIT;
static struct mk_tuner_model shared_model;

static void shared_load(void) {
  const char* path = mk_param_str(MK_PARAM_TUNER_FILE);
  const char* env = mk_param_env_name(MK_PARAM_TUNER_FILE);
  if (!path[0]) {
    MK_INFO(MK_NCCL_SUBSYS_TUNING, "tuner: %s not set; NCCL's own choices stand", env);
    return;
  }
  int nbad = 0;
  int rc = mk_tuner_file_load(path, &shared_model, &nbad);
  if (rc < 0) {
    /* The user asked for this file, so say it loudly; then carry on as if unset. */
    MK_WARN("tuner: %s=%s cannot be read (%s); NCCL's own choices stand", env, path,
            strerror(-rc));
    mk_tuner_model_free(&shared_model);
    return;
  }
  if (shared_model.npoints == 0 && shared_model.nfused == 0 && shared_model.nkeeps == 0) {
    MK_INFO(MK_NCCL_SUBSYS_TUNING, "tuner: tuning file %s has no records; NCCL's own choices "
            "stand", path);
    return;
  }
  MK_INFO(MK_NCCL_SUBSYS_TUNING, "tuner: loaded tuning file %s: %zu collective points, %zu "
          "fused records, %zu keep records, %d line(s) skipped", path, shared_model.npoints,
          shared_model.nfused, shared_model.nkeeps, nbad);
}

const struct mk_tuner_model* mk_tuner_shared_model(void) {
  pthread_once(&shared_once, shared_load);
  return &shared_model;
}

int mk_tuner_fused_defaults(const char* op, int64_t m, int64_t n, int64_t k, int* comm_sms,
                            size_t* chunk_bytes) {
  int64_t chunk = 0;
  int rc = mk_tuner_model_fused(mk_tuner_shared_model(), op, m, n, k, comm_sms, &chunk);
  if (rc == 0 && chunk_bytes) *chunk_bytes = (size_t)chunk;
  return rc;
}
