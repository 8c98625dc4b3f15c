#include "perf_spawn.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static void exec_child(int argc, char** argv, int p, const char* hex, int distinct, pid_t launcher) {
  /* killed with the launcher; if it already died before this line, the death was missed */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(126);
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

int perf_spawn_ranks(int argc, char** argv, int nprocs, const char* hex, int distinct_hosts) {
  const pid_t launcher = getpid();
  pid_t pids[64];
  int n = nprocs < 64 ? nprocs : 64;
  for (int p = 0; p < n; p++)
    if ((pids[p] = fork()) == 0) exec_child(argc, argv, p, hex, distinct_hosts, launcher);
  int worst = 0;
  for (int p = 0; p < n; p++) {
    int status = 0;
    waitpid(pids[p], &status, 0);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc > worst) worst = rc;
  }
  return worst;
}
