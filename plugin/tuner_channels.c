#include "tuner_channels.h"

#include "abi/tuner_v5.h"

/* NCCL 2.28 defaults (src/include/device.h, src/include/comm.h, src/graph/tuning.cc):
 * threads per channel NCCL_LL_MAX_NTHREADS 512, NCCL_LL128_MAX_NTHREADS 640,
 * NCCL_SIMPLE_MAX_NTHREADS 512 (ring/simple drops to 256 on a PCI-bound ring; the larger
 * value errs towards leaving NCCL's count alone); bytes per thread NCCL_LL_THREAD_THRESHOLD
 * 8 (times nRanks for ring), NCCL_LL128_THREAD_THRESHOLD 8, NCCL_SIMPLE_THREAD_THRESHOLD 64. */
static uint64_t threads_per_channel(int proto) {
  switch (proto) {
    case NCCL_PROTO_LL: return 512;
    case NCCL_PROTO_LL128: return 640;
    case NCCL_PROTO_SIMPLE: return 512;
    default: return 0;
  }
}

static uint64_t bytes_per_thread(int algo, int proto, size_t nranks) {
  switch (proto) {
    case NCCL_PROTO_LL: return algo == NCCL_ALGO_RING ? 8 * (uint64_t)nranks : 8;
    case NCCL_PROTO_LL128: return 8;
    case NCCL_PROTO_SIMPLE: return 64;
    default: return 0;
  }
}

uint64_t mk_tuner_channels_full_size(int algo, int proto, size_t nranks, int nchannels) {
  if (algo != NCCL_ALGO_RING && algo != NCCL_ALGO_TREE) return 0;
  if (nchannels <= 0 || nranks == 0) return 0;
  return (uint64_t)nchannels * threads_per_channel(proto) * bytes_per_thread(algo, proto, nranks);
}

int mk_tuner_channels_to_pass(int algo, int proto, size_t nranks, uint64_t nbytes,
                              int nchannels) {
  uint64_t full = mk_tuner_channels_full_size(algo, proto, nranks, nchannels);
  return full > 0 && nbytes >= full ? nchannels : 0;
}
