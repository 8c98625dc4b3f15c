#include "tuner_rule.h"

#include <errno.h>

#include "tuner_channels.h"

static int time_of(const struct mk_tuner_model* m, const struct mk_tuner_query* q, int algo,
                   int proto, int nchannels, double* t) {
  return mk_tuner_model_time(m, q->coll, q->nranks, q->nnodes, q->nbytes, algo, proto,
                             nchannels, t);
}

static int clearly_faster(double t, double than) { return t * (1.0 + MK_TUNER_MIN_GAIN) < than; }

/* The channel count to pass for c (see tuner_rule.h); c->time_us follows what will run. */
static void settle_channels(const struct mk_tuner_model* m, const struct mk_tuner_query* q,
                            struct mk_tuner_choice* c) {
  if (c->nchannels == 0) return;
  /* Below the size where NCCL's own count reaches N, the capped run used NCCL's own count:
   * passing 0 repeats it, passing N would not. */
  if (mk_tuner_channels_to_pass(c->algo, c->proto, q->nranks, q->nbytes, c->nchannels) == 0) {
    c->nchannels = 0;
    return;
  }
  double t0;
  if (time_of(m, q, c->algo, c->proto, 0, &t0) == 0 && !clearly_faster(c->time_us, t0)) {
    c->nchannels = 0;
    c->time_us = t0;
  }
}

int mk_tuner_rule_decide(const struct mk_tuner_model* model, const struct mk_tuner_query* q,
                         struct mk_tuner_choice* out) {
  if (!model || !q || !out) return -ENOENT;
  if (q->nbytes <= mk_tuner_model_launch_bound(model, q->coll, q->nranks, q->nnodes) ||
      mk_tuner_model_kept(model, q->coll, q->nranks, q->nnodes, q->nbytes))
    return -ENOENT;
  struct mk_tuner_choice c;
  if (mk_tuner_model_choose(model, q->coll, q->nranks, q->nnodes, q->nbytes, q->allowed,
                            &c) < 0)
    return -ENOENT;
  settle_channels(model, q, &c);
  double t_nccl;
  if (q->nccl_algo >= 0 && q->nccl_proto >= 0 &&
      time_of(model, q, q->nccl_algo, q->nccl_proto, 0, &t_nccl) == 0) {
    int same = c.algo == q->nccl_algo && c.proto == q->nccl_proto && c.nchannels == 0;
    if (same || !clearly_faster(c.time_us, t_nccl)) return -ENOENT;
  }
  *out = c;
  return 0;
}
