/*
 * The harnesses' rank launcher (test/perf/common/perf_spawn.c): ranks die with their launcher.
 * A launcher stopped by gpu-check's step timeout used to leave its ranks running, holding the
 * GPU: the next steps failed to get the device (sessions 35 and 36). Here the launcher starts
 * two ranks that would sleep for a minute, the test kills the launcher, and both ranks must be
 * gone, killed by SIGKILL, within 10 s. The test adopts them (a child subreaper) to see that.
 * No GPU, no network.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mk_test.h"
#include "perf_spawn.h"

/* A rank: "<exe> launcher <dir> -P <p> -I <hex>": its pid into <dir>/<p>, then a minute asleep. */
static int rank_main(const char* dir, const char* p) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, p);
  FILE* f = fopen(path, "w");
  if (!f) return 1;
  fprintf(f, "%d\n", (int)getpid());
  fclose(f);
  sleep(60);
  return 0;
}

static pid_t pid_from(const char* dir, int p) {
  char path[512];
  snprintf(path, sizeof path, "%s/%d", dir, p);
  FILE* f = fopen(path, "r");
  int pid = 0;
  if (f) {
    if (fscanf(f, "%d", &pid) != 1) pid = 0;
    fclose(f);
  }
  return (pid_t)pid;
}

static void ranks_die_with_their_launcher(const char* self) {
  char dir[] = "/tmp/mk-spawn-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); /* orphaned ranks become our children */
  const pid_t launcher = fork();
  if (launcher == 0) {
    char* args[] = {(char*)self, (char*)"launcher", dir, NULL};
    _exit(perf_spawn_ranks(3, args, 2, "00", 0));
  }
  pid_t ranks[2] = {0, 0};
  for (int ms = 0; ms < 10000 && !(ranks[0] && ranks[1]); ms += 10) {
    for (int p = 0; p < 2; p++) ranks[p] = ranks[p] ? ranks[p] : pid_from(dir, p);
    usleep(10000);
  }
  CHECK(ranks[0] > 0 && ranks[1] > 0);
  kill(launcher, SIGTERM);
  int status = 0;
  CHECK(waitpid(launcher, &status, 0) == launcher && WIFSIGNALED(status));
  for (int p = 0; p < 2 && ranks[p] > 0; p++) {
    pid_t got = 0;
    for (int ms = 0; ms < 10000 && got == 0; ms += 10) {
      got = waitpid(ranks[p], &status, WNOHANG);
      if (got == 0) usleep(10000);
    }
    if (got != ranks[p]) {
      fprintf(stderr, "rank %d (pid %d) outlived its launcher\n", p, (int)ranks[p]);
      kill(ranks[p], SIGKILL);
      waitpid(ranks[p], &status, 0);
    }
    CHECK(got == ranks[p] && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  }
  for (int p = 0; p < 2; p++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%d", dir, p);
    unlink(path);
  }
  rmdir(dir);
}

int main(int argc, char** argv) {
  if (argc == 7 && !strcmp(argv[1], "launcher") && !strcmp(argv[3], "-P")) return rank_main(argv[2], argv[4]);
  ranks_die_with_their_launcher(argv[0]);
  return MK_TEST_RESULT();
}
