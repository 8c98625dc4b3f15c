#include "perf_launch.h"
#include "perf_spawn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void perf_id_to_hex(const ncclUniqueId* id, char* hex) {
  for (size_t i = 0; i < sizeof(*id); i++) sprintf(hex + 2 * i, "%02x", (uint8_t)id->internal[i]);
}

void perf_hex_to_id(const char* hex, ncclUniqueId* id) {
  memset(id, 0, sizeof(*id));
  for (size_t i = 0; i < sizeof(*id) && hex[2 * i] && hex[2 * i + 1]; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    id->internal[i] = (char)v;
  }
}

int perf_launch_local(int argc, char** argv, int nprocs, int distinct_hosts) {
  ncclUniqueId id;
  char hex[PERF_ID_HEX_LEN];
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId failed\n");
    return 1;
  }
  perf_id_to_hex(&id, hex);
  return perf_spawn_ranks(argc, argv, nprocs, hex, perf_gpus_shared() || distinct_hosts);
}
