/*
 * When the tuner overrides NCCL. The model (plugin/tuner_model.h) says which measured
 * configuration is fastest; this decides whether that is evidence enough to replace NCCL's
 * own choice, and which channel count to pass. NCCL's choice stands (nothing is edited)
 * when any of these holds:
 *
 * 1. The size is launch-bound (mk_tuner_model_launch_bound): at or below the largest
 *    measured size where some configuration ran within 2x the sweep's fastest time, the
 *    calibration's differences are per-call noise, not the configurations'.
 * 1b. The file keeps NCCL's choice around the size (a "keep" record, mk_tuner_model_kept):
 *    the check of scripts/tune.sh found the tuned runs slower there in every round, whatever
 *    the calibration said (session 20: 512 KiB all-reduce on 2xH200, 0.68-0.85x).
 * 2. The best configuration is not faster than NCCL's own choice by more than
 *    MK_TUNER_MIN_GAIN. NCCL's own choice is the cheapest cell of the cost table it hands
 *    the tuner; its measured time is that algorithm/protocol's channels-0 run (NCCL_ALGO and
 *    NCCL_PROTO forced, NCCL's own channel count), i.e. what NCCL runs without the tuner.
 *    When that run was not measured around the size, the best measured choice is taken.
 *
 * A measured channel count N is passed only where it repeats the measured run
 * (plugin/tuner_channels.h: from the size where NCCL's own count reaches N) and only when
 * it beat the same algorithm/protocol at channels 0 by more than MK_TUNER_MIN_GAIN;
 * otherwise the algorithm/protocol is forced with NCCL's own count.
 */
#ifndef MK_TUNER_RULE_H_
#define MK_TUNER_RULE_H_

#include <stddef.h>
#include <stdint.h>

#include "tuner_model.h"

/* 3%: an override must promise more than the 0.97x the tuner's goal lets a size lose. */
#define MK_TUNER_MIN_GAIN 0.03

/* One getCollInfo call as the rule sees it. */
struct mk_tuner_query {
  int coll;
  size_t nranks, nnodes;
  uint64_t nbytes;
  uint32_t allowed;          /* cells NCCL allows (mk_tuner_cell_bit) */
  int nccl_algo, nccl_proto; /* NCCL's own choice; -1 when the table has none */
};

/* 0 with *out set: force out->algo/proto and pass out->nchannels (0: leave it).
 * -ENOENT: leave NCCL's table and channel count alone. */
int mk_tuner_rule_decide(const struct mk_tuner_model* model, const struct mk_tuner_query* q,
                         struct mk_tuner_choice* out);

#endif /* MK_TUNER_RULE_H_ */
