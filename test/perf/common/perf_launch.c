#include "perf_launch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

static void exec_child(int argc, char** argv, int p, const char* hex, int distinct) {
  char** args = calloc((size_t)argc + 8, sizeof(char*));
  char pbuf[16], host[32];
  snprintf(pbuf, sizeof(pbuf), "%d", p);
  int k = 0;
  for (int i = 0; i < argc; i++) args[k++] = argv[i];
  args[k++] = (char*)"-P", args[k++] = pbuf, args[k++] = (char*)"-I", args[k++] = (char*)hex;
  if (distinct) {
    snprintf(host, sizeof(host), "mk-perf-host-%d", p);
    setenv("NCCL_HOSTID", host, 1);
  }
  execv("/proc/self/exe", args);
  _exit(127);
}

int perf_launch_local(int argc, char** argv, int nprocs, int distinct_hosts) {
  ncclUniqueId id;
  char hex[PERF_ID_HEX_LEN];
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId failed\n");
    return 1;
  }
  perf_id_to_hex(&id, hex);
  if (perf_gpus_shared()) distinct_hosts = 1;
  pid_t pids[64];
  int n = nprocs < 64 ? nprocs : 64;
  for (int p = 0; p < n; p++)
    if ((pids[p] = fork()) == 0) exec_child(argc, argv, p, hex, distinct_hosts);
  int worst = 0;
  for (int p = 0; p < n; p++) {
    int status = 0;
    waitpid(pids[p], &status, 0);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc > worst) worst = rc;
  }
  return worst;
}
