/*
 * Test helper: loads a tuning file with the plugin's own parser (plugin/tuner_file.c) and
 * prints what it understood, one canonical line per record, then "skipped N". Lets the
 * Python tests check that scripts/tune-write.py writes what the C side reads.
 *
 * usage: tuner_file_dump <tuning file>    (exit 1 if it cannot be opened)
 */
#include <stdio.h>
#include <string.h>

#include "tuner_file.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <tuning file>\n", argv[0]);
    return 2;
  }
  struct mk_tuner_model m = {0};
  int nbad = 0;
  int rc = mk_tuner_file_load(argv[1], &m, &nbad);
  if (rc < 0) {
    fprintf(stderr, "%s: %s\n", argv[1], strerror(-rc));
    return 1;
  }
  for (size_t i = 0; i < m.npoints; i++) {
    const struct mk_tuner_point* p = &m.points[i];
    printf("%s %d %d %llu %s %s %d %.3f\n", mk_tuner_coll_name(p->coll), p->nranks, p->nnodes,
           (unsigned long long)p->bytes, mk_tuner_algo_name(p->algo),
           mk_tuner_proto_name(p->proto), p->nchannels, p->time_us);
  }
  for (size_t i = 0; i < m.nfused; i++) {
    const struct mk_tuner_fused_point* f = &m.fused[i];
    printf("fused %s %lld %lld %lld %d %lld %.3f\n", f->op, (long long)f->m, (long long)f->n,
           (long long)f->k, f->comm_sms, (long long)f->chunk_bytes, f->time_us);
  }
  for (size_t i = 0; i < m.nkeeps; i++)
    printf("keep %s %d %d %llu\n", mk_tuner_coll_name(m.keeps[i].coll), m.keeps[i].nranks,
           m.keeps[i].nnodes, (unsigned long long)m.keeps[i].bytes);
  printf("skipped %d\n", nbad);
  mk_tuner_model_free(&m);
  return 0;
}
