/*
 * The channel count a tuner may pass to NCCL, given how NCCL applies it (read in NCCL 2.28,
 * src/enqueue.cc):
 *
 * - NCCL's own count: topoGetAlgoInfo starts from comm->nChannels and, for ring and tree,
 *   lowers it while nBytes < nc * nt * threshold (nt: the threads per channel of the
 *   algorithm/protocol, threshold: bytes per thread, from src/graph/tuning.cc). Small
 *   messages thus get few channels.
 * - NCCL_MAX_NCHANNELS=N (how tune.sh measures a count) caps comm->nChannels, the starting
 *   point of that loop: the run uses min(N, NCCL's own count at that size).
 * - A tuner's *nChannels = N replaces the loop's result outright (getAlgoInfo:
 *   info->nMaxChannels = nMaxChannels == 0 ? info->nMaxChannels : nMaxChannels); nothing
 *   lowers it for small messages. scheduleCollTasksToPlan then spreads the message over up
 *   to N channels (in cells of 16 KiB of traffic, MinTrafficPerChannel).
 *
 * So passing N repeats the measured run only from the size at which NCCL's own count
 * reaches N (nBytes >= N * nt * threshold): below it the capped run used NCCL's own count,
 * which leaving *nChannels at 0 repeats exactly, while passing N would run up to N blocks
 * where the calibration ran fewer. For algorithms whose reduction we do not model (NVLS,
 * CollNet, PAT) a count is never passed.
 */
#ifndef MK_TUNER_CHANNELS_H_
#define MK_TUNER_CHANNELS_H_

#include <stddef.h>
#include <stdint.h>

/* The smallest message size at which NCCL's own count for (algo, proto) on nranks reaches
 * nchannels, with NCCL 2.28's default thread counts; 0 when we do not model the algorithm
 * (never pass a count then). */
uint64_t mk_tuner_channels_full_size(int algo, int proto, size_t nranks, int nchannels);

/* What to hand NCCL in *nChannels for a measured count at nbytes: nchannels where it
 * repeats the measured run, else 0 (NCCL's own count, which is what was measured there). */
int mk_tuner_channels_to_pass(int algo, int proto, size_t nranks, uint64_t nbytes,
                              int nchannels);

#endif /* MK_TUNER_CHANNELS_H_ */
