/*
 * The process side of perf_launch.h, apart so that it needs neither NCCL nor CUDA (a unit test
 * runs it): copies of this binary, one per rank, that die with their launcher.
 */
#ifndef MK_PERF_SPAWN_H_
#define MK_PERF_SPAWN_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Runs nprocs copies of /proc/self/exe with argv and "-P <index> -I <hex>" appended (with
 * distinct_hosts each its own NCCL_HOSTID), waits for them and returns the worst exit status
 * (128 + signal for a killed one). Each copy is killed (SIGKILL) when the launcher dies, so a
 * launcher stopped by a timeout leaves no rank holding a GPU. */
int perf_spawn_ranks(int argc, char** argv, int nprocs, const char* hex, int distinct_hosts);

#ifdef __cplusplus
}
#endif

#endif /* MK_PERF_SPAWN_H_ */
