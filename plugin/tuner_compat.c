/*
 * ncclTuner_v4_t for NCCL 2.24-2.27: a thin named adapter over the v5 implementation in
 * plugin/tuner.c. getCollInfo has the same signature in both; only init (no comm id, NVL
 * domain info or constants, context last) and the name of the last entry differ. Proven by
 * a test that loads a build exporting only this table (test/unit/meson.build).
 */
#include "abi/tuner_v4.h"
#include "net.h"
#include "tuner.h"

static ncclResult_t v4_init(size_t nranks, size_t nnodes, ncclDebugLogger_t log, void** ctx) {
  return mk_tuner_init(ctx, 0, nranks, nnodes, log, NULL, NULL);
}

MK_EXPORT const ncclTuner_v4_t ncclTunerPlugin_v4 = {
    .name = "mk",
    .init = v4_init,
    .getCollInfo = mk_tuner_get_coll_info,
    .destroy = mk_tuner_finalize,
};
