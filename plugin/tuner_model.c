#include "tuner_model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Grows *arr (of elem-sized items) so that one more fits. */
static int grow(void** arr, size_t* cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t new_cap = *cap ? *cap * 2 : 64;
  void* p = realloc(*arr, new_cap * elem);
  if (!p) return -ENOMEM;
  *arr = p;
  *cap = new_cap;
  return 0;
}

int mk_tuner_model_add_point(struct mk_tuner_model* model, const struct mk_tuner_point* p) {
  int rc = grow((void**)&model->points, &model->points_cap, model->npoints, sizeof(*p));
  if (rc < 0) return rc;
  model->points[model->npoints++] = *p;
  return 0;
}

int mk_tuner_model_add_fused(struct mk_tuner_model* model,
                             const struct mk_tuner_fused_point* p) {
  int rc = grow((void**)&model->fused, &model->fused_cap, model->nfused, sizeof(*p));
  if (rc < 0) return rc;
  model->fused[model->nfused++] = *p;
  return 0;
}

int mk_tuner_model_add_keep(struct mk_tuner_model* model, const struct mk_tuner_point* p) {
  int rc = grow((void**)&model->keeps, &model->keeps_cap, model->nkeeps, sizeof(*p));
  if (rc < 0) return rc;
  model->keeps[model->nkeeps++] = *p;
  return 0;
}

int mk_tuner_model_kept(const struct mk_tuner_model* model, int coll, size_t nranks,
                        size_t nnodes, uint64_t nbytes) {
  for (size_t i = 0; i < model->nkeeps; i++) {
    const struct mk_tuner_point* k = &model->keeps[i];
    if (k->coll != coll || (size_t)k->nranks != nranks || (size_t)k->nnodes != nnodes) continue;
    if (model->keep_spans ? nbytes >= model->keep_spans[i].from && nbytes < model->keep_spans[i].to
                          : nbytes >= k->bytes / 2 && nbytes / 2 < k->bytes)
      return 1;
  }
  return 0;
}

static int cmp_int(long long a, long long b) { return (a > b) - (a < b); }

/* Order of the shape: (coll, nranks, nnodes). */
static int cmp_shape(const struct mk_tuner_point* a, int coll, long long nranks,
                     long long nnodes) {
  int c = cmp_int(a->coll, coll);
  if (!c) c = cmp_int(a->nranks, nranks);
  if (!c) c = cmp_int(a->nnodes, nnodes);
  return c;
}

static int same_config(const struct mk_tuner_point* a, const struct mk_tuner_point* b) {
  return a->algo == b->algo && a->proto == b->proto && a->nchannels == b->nchannels;
}

/* Shape, then configuration, then size, then time: runs of one configuration are
 * contiguous and sorted by size, and the fastest repeat of a size comes first. */
static int cmp_point(const void* va, const void* vb) {
  const struct mk_tuner_point *a = va, *b = vb;
  int c = cmp_shape(a, b->coll, b->nranks, b->nnodes);
  if (!c) c = cmp_int(a->algo, b->algo);
  if (!c) c = cmp_int(a->proto, b->proto);
  if (!c) c = cmp_int(a->nchannels, b->nchannels);
  if (!c) c = (a->bytes > b->bytes) - (a->bytes < b->bytes);
  if (!c) c = (a->time_us > b->time_us) - (a->time_us < b->time_us);
  return c;
}

void mk_tuner_model_finish(struct mk_tuner_model* model) {
  if (model->npoints == 0) return;
  qsort(model->points, model->npoints, sizeof(*model->points), cmp_point);
  size_t kept = 1;
  for (size_t i = 1; i < model->npoints; i++) {
    const struct mk_tuner_point* prev = &model->points[kept - 1];
    const struct mk_tuner_point* p = &model->points[i];
    int repeat = cmp_shape(p, prev->coll, prev->nranks, prev->nnodes) == 0 &&
                 same_config(p, prev) && p->bytes == prev->bytes;
    if (!repeat) model->points[kept++] = *p;
  }
  model->npoints = kept;
  if (mk_tuner_model_find_limits(model) < 0) model->npoints = 0; /* no limits: no choices */
  (void)mk_tuner_model_find_keep_spans(model); /* without spans a keep covers 2x either way */
}

void mk_tuner_model_free(struct mk_tuner_model* model) {
  free(model->points);
  free(model->keeps);
  free(model->keep_spans);
  free(model->fused);
  free(model->limits);
  memset(model, 0, sizeof(*model));
}

/* First point of the shape (binary search over the sorted points), or npoints. */
static size_t shape_begin(const struct mk_tuner_model* model, int coll, size_t nranks,
                          size_t nnodes) {
  size_t lo = 0, hi = model->npoints;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cmp_shape(&model->points[mid], coll, (long long)nranks, (long long)nnodes) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static size_t shape_end(const struct mk_tuner_model* model, size_t begin, int coll,
                        size_t nranks, size_t nnodes) {
  size_t end = begin;
  while (end < model->npoints &&
         cmp_shape(&model->points[end], coll, (long long)nranks, (long long)nnodes) == 0)
    end++;
  return end;
}

size_t mk_tuner_model_count_shape(const struct mk_tuner_model* model, size_t nranks,
                                  size_t nnodes) {
  size_t n = 0;
  for (int coll = 0; model && coll < MK_TUNER_NUM_COLLS; coll++) {
    size_t b = shape_begin(model, coll, nranks, nnodes);
    n += shape_end(model, b, coll, nranks, nnodes) - b;
  }
  return n;
}

/* Time of one configuration (points run[0..n), sorted by size) at nbytes, interpolated
 * between the measured sizes around it. -ENOENT when nbytes is outside the run. */
static int run_time_at(const struct mk_tuner_point* run, size_t n, uint64_t nbytes,
                       double* time_us) {
  if (nbytes < run[0].bytes || nbytes > run[n - 1].bytes) return -ENOENT;
  for (size_t i = 0; i + 1 < n; i++) {
    if (nbytes > run[i + 1].bytes) continue;
    if (nbytes == run[i].bytes) {
      *time_us = run[i].time_us;
      return 0;
    }
    double frac = (double)(nbytes - run[i].bytes) / (double)(run[i + 1].bytes - run[i].bytes);
    *time_us = run[i].time_us + frac * (run[i + 1].time_us - run[i].time_us);
    return 0;
  }
  *time_us = run[n - 1].time_us; /* one point, or nbytes is the last measured size */
  return 0;
}

static int cell_allowed(uint32_t allowed, int algo, int proto) {
  if (algo < 0 || algo >= NCCL_NUM_ALGORITHMS_V5) return 0;
  if (proto < 0 || proto >= NCCL_NUM_PROTOCOLS_V5) return 0;
  return (allowed & mk_tuner_cell_bit(algo, proto)) != 0;
}

/* End of the run of one configuration that starts at i (points of one shape end at end). */
static size_t run_end_of(const struct mk_tuner_model* model, size_t i, size_t end) {
  size_t run_end = i + 1;
  while (run_end < end && same_config(&model->points[run_end], &model->points[i])) run_end++;
  return run_end;
}

int mk_tuner_model_time(const struct mk_tuner_model* model, int coll, size_t nranks,
                        size_t nnodes, uint64_t nbytes, int algo, int proto, int nchannels,
                        double* time_us) {
  if (!model || !time_us) return -ENOENT;
  size_t i = shape_begin(model, coll, nranks, nnodes);
  size_t end = shape_end(model, i, coll, nranks, nnodes);
  const struct mk_tuner_point want = {.algo = algo, .proto = proto, .nchannels = nchannels};
  while (i < end) {
    size_t run_end = run_end_of(model, i, end);
    if (same_config(&model->points[i], &want))
      return run_time_at(&model->points[i], run_end - i, nbytes, time_us);
    i = run_end;
  }
  return -ENOENT;
}

int mk_tuner_model_choose(const struct mk_tuner_model* model, int coll, size_t nranks,
                          size_t nnodes, uint64_t nbytes, uint32_t allowed,
                          struct mk_tuner_choice* out) {
  if (!model || !out) return -ENOENT;
  size_t i = shape_begin(model, coll, nranks, nnodes);
  size_t end = shape_end(model, i, coll, nranks, nnodes);
  int found = 0;
  while (i < end) {
    size_t run_end = run_end_of(model, i, end);
    const struct mk_tuner_point* p = &model->points[i];
    double t;
    if (cell_allowed(allowed, p->algo, p->proto) &&
        run_time_at(p, run_end - i, nbytes, &t) == 0 && (!found || t < out->time_us)) {
      *out = (struct mk_tuner_choice){p->algo, p->proto, p->nchannels, t};
      found = 1;
    }
    i = run_end;
  }
  return found ? 0 : -ENOENT;
}

/* |log(a/b)|: how far apart two M values are, as a ratio. */
static double ratio_distance(int64_t a, int64_t b) { return fabs(log((double)a / (double)b)); }

/* Nearest M first; equally near, the smaller M; at the same M, the fastest record. */
static int fused_better(const struct mk_tuner_fused_point* f, double dist,
                        const struct mk_tuner_fused_point* best, double best_dist) {
  const double eps = 1e-12;
  if (!best || dist < best_dist - eps) return 1;
  if (dist > best_dist + eps) return 0;
  if (f->m != best->m) return f->m < best->m;
  return f->time_us < best->time_us;
}

int mk_tuner_model_fused(const struct mk_tuner_model* model, const char* op, int64_t m,
                         int64_t n, int64_t k, int* comm_sms, int64_t* chunk_bytes) {
  if (!model || !op || m <= 0) return -ENOENT;
  const struct mk_tuner_fused_point* best = NULL;
  double best_dist = 0.0;
  for (size_t i = 0; i < model->nfused; i++) {
    const struct mk_tuner_fused_point* f = &model->fused[i];
    if (strcmp(f->op, op) != 0 || f->n != n || f->k != k) continue;
    double dist = ratio_distance(f->m, m);
    if (fused_better(f, dist, best, best_dist)) {
      best = f;
      best_dist = dist;
    }
  }
  if (!best) return -ENOENT;
  if (comm_sms) *comm_sms = best->comm_sms;
  if (chunk_bytes) *chunk_bytes = best->chunk_bytes;
  return 0;
}
