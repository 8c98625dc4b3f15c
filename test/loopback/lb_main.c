/* loopback CASE (NCCL_MK_TRANSPORT=ofi|ib picks the transport): runs one two-process case (see the lb_cases_* tables). */
#include <stdio.h>
#include <string.h>

#include "lb.h"

extern const struct lb_case lb_cases_twosided[];
extern const struct lb_case lb_cases_onesided[];
extern const struct lb_case lb_cases_lifecycle[];
extern const struct lb_case lb_cases_ib[];
extern const struct lb_case lb_cases_bench[];
extern const struct lb_case lb_cases_striped[];
extern const struct lb_case lb_cases_eager[];
extern const struct lb_case lb_cases_unannounced[];
extern const struct lb_case lb_cases_progress[];
extern const struct lb_case lb_cases_written[];
extern const struct lb_case lb_cases_eager_reads[];

int main(int argc, char** argv) {
  const struct lb_case* tables[] = {lb_cases_twosided, lb_cases_onesided,    lb_cases_lifecycle,
                                    lb_cases_ib,       lb_cases_bench,       lb_cases_striped,
                                    lb_cases_eager,    lb_cases_unannounced, lb_cases_progress,
                                    lb_cases_written,  lb_cases_eager_reads};
  for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
    for (const struct lb_case* c = tables[t]; c->name; c++)
      if (argc > 1 && strcmp(argv[1], c->name) == 0) return lb_run(c);
  fprintf(stderr, "usage: %s CASE; cases:\n", argv[0]);
  for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
    for (const struct lb_case* c = tables[t]; c->name; c++) fprintf(stderr, "  %s\n", c->name);
  return 1;
}
