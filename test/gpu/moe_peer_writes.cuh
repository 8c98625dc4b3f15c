/*
 * test_moe's peer_writes scenario: every rank's stores into each peer's workspace through its
 * peer mapping (fc->peer_sym, as the MoE kernels address it) land where the peer reads them.
 *   - a handshake from a running kernel on every rank, as the dispatch's counts exchange does:
 *     a release store into each peer's counts_flag[rank], then a bounded acquire wait for each
 *     peer's store into this rank's own counts_flag[peer];
 *   - markers at the dense data area's end, the MoE area's recv and the workspace's last bytes
 *     (a slot per writing rank), checked by their owner after a barrier.
 * The handshake is the scenario's first GPU work, with no barrier after ncclMkCommInit (whose
 * exchange has opened every mapping): a peer's first store must survive the owner's zeroing of
 * its workspace. Under MPS (two ranks sharing one GPU, scripts/mps.sh) the dispatch's first
 * call hung because it did not (session 35: the zeroing was on the legacy stream, unordered
 * with the exchange; session 36 fixed it). Everything written is zeroed again before the end.
 */
#ifndef MK_MOE_PEER_WRITES_CUH_
#define MK_MOE_PEER_WRITES_CUH_

#include "fused_comm.h"
#include "ptx.cuh"
#include "wait.cuh"
#include "rank_harness.cuh"

#define PEER_WRITES_MAX 8 /* MK_MOE_MAX_RANKS */

struct peer_handshake_args {
  uint64_t* peer_slot[PEER_WRITES_MAX]; /* peer p's counts_flag[rank], through the mapping */
  const uint64_t* own_slot;             /* this rank's counts_flag[0..nranks) */
  unsigned long long* seen;             /* [nranks]: what this rank saw from each peer */
  int rank, nranks;
};

static __host__ __device__ uint64_t peer_marker(int rank) { return 0xC0DE0000ull + (uint64_t)rank; }

/* Thread p: the store into peer p, then the bounded wait (5 s, as the kernels wait: wait.cuh)
 * for p's store here; what it saw (the check wants exactly p's marker). */
static __global__ void peer_handshake_kernel(struct peer_handshake_args a) {
  const int p = threadIdx.x;
  if (p >= a.nranks || p == a.rank) return;
  fence_acq_rel_sys();
  st_release_sys_u64(a.peer_slot[p], peer_marker(a.rank));
  a.seen[p] = mk_wait_geq_inline(a.own_slot + p, peer_marker(p), NULL, 0, 0, (uint32_t)p, 5000000000ull);
}

/* Writing rank `rank`'s marker into slot `rank` at `off` of every peer's workspace. */
static __global__ void peer_marker_kernel(char* const* peers, int nranks, int rank, size_t off) {
  const int p = threadIdx.x;
  if (p < nranks && p != rank) *(volatile uint64_t*)(peers[p] + off + 8 * (size_t)rank) = peer_marker(rank);
}

/* This rank's own slots at `off` hold every peer's marker (its own slot untouched: 0). */
static void peer_writes_check(struct rank_env* e, const struct mk_fused_comm* fc, size_t off, const char* where) {
  uint64_t got[PEER_WRITES_MAX];
  CUDA_OK(cudaMemcpy(got, (char*)fc->sym + off, 8 * (size_t)NR, cudaMemcpyDeviceToHost));
  for (int p = 0; p < NR; p++) {
    const uint64_t want = p == e->rank ? 0 : peer_marker(p);
    if (got[p] != want)
      fprintf(stderr, "rank %d: %s (offset %zu of %zu): slot %d holds 0x%llx, want 0x%llx\n", e->rank, where, off,
              fc->sym_bytes, p, (unsigned long long)got[p], (unsigned long long)want);
    expect(e, got[p] == want, where, 0);
  }
  memset_now((char*)fc->sym + off, 0, 8 * (size_t)NR);
}

static void scenario_peer_writes(struct rank_env* e) {
  struct mk_fused_comm* fc = NULL;
  expect(e, mk_fused_comm_get(e->comm, e->stream, &fc) == 0 && fc && fc->moe_bytes && fc->local_size == NR,
         "a fused comm with a MoE area and every rank local", 0);
  if (!fc || !fc->moe_bytes || fc->local_size != NR) return;
  const size_t flags = fc->moe_offset + fc->moe_geom.counts_flag;
  struct peer_handshake_args h;
  memset(&h, 0, sizeof h);
  char* peers_host[PEER_WRITES_MAX];
  for (int p = 0; p < NR; p++) {
    peers_host[p] = (char*)fc->peer_sym[p];
    h.peer_slot[p] = (uint64_t*)(peers_host[p] + flags) + e->rank;
  }
  h.own_slot = (const uint64_t*)((char*)fc->sym + flags);
  h.rank = e->rank, h.nranks = NR;
  CUDA_OK(cudaMalloc(&h.seen, sizeof(unsigned long long) * NR));
  CUDA_OK(cudaMemsetAsync(h.seen, 0, sizeof(unsigned long long) * NR, e->stream));
  peer_handshake_kernel<<<1, 32, 0, e->stream>>>(h);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(e->stream));
  unsigned long long seen[PEER_WRITES_MAX];
  CUDA_OK(cudaMemcpy(seen, h.seen, sizeof(unsigned long long) * NR, cudaMemcpyDeviceToHost));
  for (int p = 0; p < NR; p++)
    if (p != e->rank) {
      if (seen[p] != peer_marker(p))
        fprintf(stderr, "rank %d: the running kernel saw 0x%llx from rank %d in counts_flag, want 0x%llx\n", e->rank,
                seen[p], p, (unsigned long long)peer_marker(p));
      expect(e, seen[p] == peer_marker(p), "a running kernel sees each peer's release store", 0);
    }
  char** peers;
  CUDA_OK(cudaMalloc(&peers, sizeof(char*) * NR));
  CUDA_OK(cudaMemcpy(peers, peers_host, sizeof(char*) * NR, cudaMemcpyHostToDevice));
  legacy_stream_done(); /* the kernels below run on a non-blocking stream */
  const size_t offs[3] = {fc->moe_offset - 64, fc->moe_offset + fc->moe_geom.recv, fc->sym_bytes - 64};
  for (int i = 0; i < 3; i++) peer_marker_kernel<<<1, 32, 0, e->stream>>>(peers, NR, e->rank, offs[i]);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(e->stream));
  rank_barrier(e->comm, e->stream); /* every rank's markers are stored */
  peer_writes_check(e, fc, flags, "counts_flag, from the handshake");
  peer_writes_check(e, fc, offs[0], "the dense data area's end");
  peer_writes_check(e, fc, offs[1], "the MoE area's recv");
  peer_writes_check(e, fc, offs[2], "the workspace's last bytes");
  printf("rank %d: peer writes checked at 4 places of %zu bytes\n", e->rank, fc->sym_bytes);
  rank_barrier(e->comm, e->stream); /* nobody reads these any more */
  cudaFree(peers);
  cudaFree(h.seen);
}

#endif /* MK_MOE_PEER_WRITES_CUH_ */
