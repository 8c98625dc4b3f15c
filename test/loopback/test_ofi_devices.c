/* The ofi devices NCCL sees follow NCCL_MK_SOCKET_IFNAME (tcp provider, real interfaces): "=lo"
 * lists loopback alone, "^lo" everything but loopback, a name that matches nothing no device
 * at all. Each setting in a process of its own
 * (discovery runs once per process). Skips where libfabric's tcp provider is missing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mk_test.h"
#include "transport.h"

/* In a child: discovery under `ifname`; exit 0 when every listed device satisfies `want_lo`
 * (1: exactly one device, loopback; 0: none is loopback), 77 when nothing usable, 1 else. */
static int child_lists(const char* ifname, int want_lo) {
  setenv("NCCL_MK_SOCKET_IFNAME", ifname, 1);
  setenv("NCCL_MK_OFI_PROVIDER", "tcp;ofi_rxm", 1);
  if (mk_ofi_ops.init() != 0) return 77;
  int ndev = 0, bad = 0;
  if (mk_ofi_ops.devices(&ndev) || ndev < 1) return 77;
  if (want_lo && ndev != 1) bad = 1;
  for (int d = 0; d < ndev; d++) {
    struct mk_dev_props p;
    if (mk_ofi_ops.get_properties(d, &p)) return 1;
    printf("NCCL_MK_SOCKET_IFNAME=%s: dev %d %s\n", ifname, d, p.name);
    if ((strcmp(p.name, "lo") == 0) != want_lo) bad = 1;
  }
  mk_ofi_ops.fini();
  return bad;
}

static int run_child(const char* ifname, int want_lo) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = child_lists(ifname, want_lo);
    fflush(stdout);
    _exit(rc);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) return 1;
  return WEXITSTATUS(status);
}

int main(void) {
  int only_lo = run_child("=lo", 1);
  if (only_lo == 77) MK_TEST_SKIP("libfabric tcp;ofi_rxm finds no loopback device here");
  CHECK_EQ(only_lo, 0);
  /* an interface that does not exist leaves no device: discovery refuses (and WARNs naming
   * the interfaces there are) rather than falling back to another */
  CHECK_EQ(run_child("=no-such-interface", 0), 77);
  int rc = run_child("^lo", 0);
  if (rc == 77) printf("no interface besides loopback here: the exclusion is not checked\n");
  else CHECK_EQ(rc, 0);
  return MK_TEST_RESULT();
}
