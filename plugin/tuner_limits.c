/*
 * Each shape's limits (plugin/tuner_model.h): the fastest time of its sweep and the largest
 * measured size that is launch-bound, where the calibration cannot tell configurations
 * apart and NCCL's own choice stands; and the sizes each keep record covers.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "tuner_model.h"

static int same_shape(const struct mk_tuner_point* a, const struct mk_tuner_point* b) {
  return a->coll == b->coll && a->nranks == b->nranks && a->nnodes == b->nnodes;
}

/* The limits of the shape whose points are pts[0..n). */
static struct mk_tuner_shape_limit shape_limit(const struct mk_tuner_point* pts, size_t n) {
  struct mk_tuner_shape_limit l = {pts[0].coll, pts[0].nranks, pts[0].nnodes,
                                   pts[0].time_us, 0};
  for (size_t i = 1; i < n; i++)
    if (pts[i].time_us < l.floor_us) l.floor_us = pts[i].time_us;
  /* A size is launch-bound when any configuration ran there within the factor of the floor:
   * its best time is then indistinguishable from the per-call cost. */
  for (size_t i = 0; i < n; i++)
    if (pts[i].time_us < MK_TUNER_LAUNCH_BOUND_FACTOR * l.floor_us &&
        pts[i].bytes > l.launch_bound_bytes)
      l.launch_bound_bytes = pts[i].bytes;
  return l;
}

int mk_tuner_model_find_limits(struct mk_tuner_model* model) {
  free(model->limits);
  model->limits = NULL;
  model->nlimits = 0;
  size_t nshapes = 0;
  for (size_t i = 0; i < model->npoints; i++)
    nshapes += i == 0 || !same_shape(&model->points[i], &model->points[i - 1]);
  if (nshapes == 0) return 0;
  model->limits = calloc(nshapes, sizeof(*model->limits));
  if (!model->limits) return -ENOMEM;
  for (size_t b = 0; b < model->npoints;) {
    size_t e = b + 1;
    while (e < model->npoints && same_shape(&model->points[e], &model->points[b])) e++;
    model->limits[model->nlimits++] = shape_limit(&model->points[b], e - b);
    b = e;
  }
  return 0;
}

uint64_t mk_tuner_model_launch_bound(const struct mk_tuner_model* model, int coll,
                                     size_t nranks, size_t nnodes) {
  for (size_t i = 0; model && i < model->nlimits; i++) {
    const struct mk_tuner_shape_limit* l = &model->limits[i];
    if (l->coll == coll && (size_t)l->nranks == nranks && (size_t)l->nnodes == nnodes)
      return l->launch_bound_bytes;
  }
  return 0;
}

/* The measured sizes of k's shape nearest to k.bytes below (*lo) and above (*hi); 0: none. */
static void neighbour_sizes(const struct mk_tuner_model* model, const struct mk_tuner_point* k,
                            uint64_t* lo, uint64_t* hi) {
  *lo = *hi = 0;
  for (size_t i = 0; i < model->npoints; i++) {
    const struct mk_tuner_point* p = &model->points[i];
    if (!same_shape(p, k)) continue;
    if (p->bytes < k->bytes && p->bytes > *lo) *lo = p->bytes;
    if (p->bytes > k->bytes && (*hi == 0 || p->bytes < *hi)) *hi = p->bytes;
  }
}

/* Within 2x of the kept size, and no farther than the geometric midpoint to a neighbour. */
static struct mk_tuner_keep_span keep_span(const struct mk_tuner_model* model,
                                           const struct mk_tuner_point* k) {
  uint64_t lo, hi;
  neighbour_sizes(model, k, &lo, &hi);
  struct mk_tuner_keep_span s = {k->bytes / 2, k->bytes > UINT64_MAX / 2 ? UINT64_MAX : 2 * k->bytes};
  if (lo > 0) {
    double mid = ceil(sqrt((double)lo * (double)k->bytes));
    if (mid > (double)s.from) s.from = (uint64_t)mid;
  }
  if (hi > 0) {
    double mid = ceil(sqrt((double)k->bytes * (double)hi));
    if (mid < (double)s.to) s.to = (uint64_t)mid;
  }
  return s;
}

int mk_tuner_model_find_keep_spans(struct mk_tuner_model* model) {
  free(model->keep_spans);
  model->keep_spans = NULL;
  if (model->nkeeps == 0) return 0;
  struct mk_tuner_keep_span* spans = calloc(model->nkeeps, sizeof(*spans));
  if (!spans) return -ENOMEM;
  for (size_t i = 0; i < model->nkeeps; i++) spans[i] = keep_span(model, &model->keeps[i]);
  model->keep_spans = spans;
  return 0;
}
