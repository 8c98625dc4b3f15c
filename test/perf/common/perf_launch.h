/*
 * Starting one process per GPU on this host without MPI: the launcher makes the NCCL id
 * (so it hosts NCCL's bootstrap root), then runs copies of its own binary with
 * "-P <index> -I <id in hex>" appended (the process count is in the caller's own arguments). Used by the harnesses and GPU tests.
 */
#ifndef MK_PERF_LAUNCH_H_
#define MK_PERF_LAUNCH_H_

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PERF_ID_HEX_LEN (2 * sizeof(ncclUniqueId) + 1)

/* Runs nprocs children and returns the worst exit status (128 + signal for a killed one).
 * distinct_hosts: each child gets its own NCCL_HOSTID, so NCCL sees one node per process
 * (always so when the GPUs are shared: perf_gpus_shared). */
int perf_launch_local(int argc, char** argv, int nprocs, int distinct_hosts);

/* 1 with MK_SHARE_GPU=1, which scripts/mps.sh sets beside a running MPS server: ranks may
 * share a GPU (rank r on device r % count), so the 2-rank tests run on one GPU. Each process
 * is then its own NCCL node, because NCCL refuses two ranks of one node on one GPU; without
 * MPS the two processes' kernels would take turns in time slices (~4.5 ms per NCCL step). */
static inline int perf_gpus_shared(void) {
  const char* v = getenv("MK_SHARE_GPU");
  return v && strcmp(v, "1") == 0;
}

/* The device of a rank: its own GPU, or with shared GPUs rank % device count. */
static inline int perf_rank_device(int rank) {
  int n = 0;
  if (!perf_gpus_shared() || cudaGetDeviceCount(&n) != cudaSuccess || n < 1) return rank;
  return rank % n;
}

/* The GPUs that nranks ranks need here: one each, or one when they may share (MK_SHARE_GPU). */
static inline int perf_gpus_needed(int nranks) { return perf_gpus_shared() ? 1 : nranks; }

void perf_id_to_hex(const ncclUniqueId* id, char* hex);
void perf_hex_to_id(const char* hex, ncclUniqueId* id);

/* A two-or-more-GPU harness's launcher side: 77 (meson's skip), saying why, when this host has
 * fewer than nprocs GPUs; else perf_launch_local's status. */
static inline int perf_launch_local_or_skip_hosts(int argc, char** argv, int nprocs, int distinct_hosts) {
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < perf_gpus_needed(nprocs)) {
    printf("needs %d GPUs, found %d (MK_SHARE_GPU=1 under scripts/mps.sh shares one)\n", nprocs, ngpu);
    return 77;
  }
  return perf_launch_local(argc, argv, nprocs, distinct_hosts);
}

static inline int perf_launch_local_or_skip(int argc, char** argv, int nprocs) {
  return perf_launch_local_or_skip_hosts(argc, argv, nprocs, 0);
}

/* In a GPU test started by perf_launch_local: 1 when this process is a child ("<scenario> -P
 * rank -I id"), with its rank and the NCCL id filled in; else 0. */
static inline int perf_test_child(int argc, char** argv, int* rank, ncclUniqueId* id) {
  if (argc != 6 || strcmp(argv[2], "-P") != 0) return 0;
  perf_hex_to_id(argv[5], id);
  *rank = atoi(argv[3]);
  return 1;
}

/* A seed from the NCCL id's hex (the tests' inputs): random per run, the same on every rank. */
static inline unsigned long long perf_seed_from_id(const char* hex) {
  unsigned long long h = 1469598103934665603ULL;
  for (const char* p = hex; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
  return h % 100000;
}

#ifdef __cplusplus
}
#endif

#endif /* MK_PERF_LAUNCH_H_ */
