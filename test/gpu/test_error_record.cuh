/*
 * The error record's claim word (gemm.h mk_gemm_error.claim): many waits that expire at the
 * same moment leave the fields of one of them, never a mix. One thread per CTA meets the
 * others at a grid barrier, then raises RECORD_RAISES times with fields derived from its CTA
 * index, so a record that pairs one CTA's tile with another's flag is recognised. Without the
 * word no mix was seen on an H200 (session 46: 200 rounds of 132 CTAs, once or 16 times each;
 * one thread's stores to one 32-byte sector of host memory seem to arrive together), so the
 * count without it is printed, not asserted: the word makes the record whole by design, not
 * by the way a GPU happens to combine writes.
 */
#ifndef MK_TEST_ERROR_RECORD_CUH_
#define MK_TEST_ERROR_RECORD_CUH_

#include "expect.h"
#include "gemm_check.cuh"
#include "wait.cuh"

#define RECORD_TAG_BASE 0x100u
#define RECORD_RAISES 16

static __device__ __host__ uint32_t record_flag_of(uint32_t cta) { return cta ^ 0x5555u; }
static __device__ __host__ uint64_t record_expected_of(uint32_t cta) { return 3ull * cta + 1; }
static __device__ __host__ uint64_t record_seen_of(uint32_t cta) { return 7ull * cta + 2; }

/* Every CTA's thread 0 arrives at *meet, waits for the whole grid (co-resident: at most one
 * CTA per SM is asked for), then raises. */
static __global__ void raise_together_kernel(struct mk_gemm_error* err, unsigned* meet) {
  if (threadIdx.x) return;
  const uint32_t cta = blockIdx.x;
  atomicAdd(meet, 1u);
  while (*(volatile unsigned*)meet < gridDim.x) {
  }
  for (int i = 0; i < RECORD_RAISES; i++)
    mk_gemm_error_raise(err, RECORD_TAG_BASE + cta, cta, record_flag_of(cta), record_expected_of(cta),
                        record_seen_of(cta));
}

/* 1 when every field comes from the same raising CTA. */
static int record_from_one_raiser(const struct mk_gemm_error* e, uint32_t ctas) {
  const uint32_t cta = e->tile;
  return e->aborted == 1 && cta < ctas && e->tag == RECORD_TAG_BASE + cta && e->flag_index == record_flag_of(cta) &&
         e->expected == record_expected_of(cta) && e->seen == record_seen_of(cta);
}

/* Rounds of all CTAs raising at once into a fresh host-mapped record; the number of rounds
 * whose record mixed two raisers' fields. With `claim` (device) the word is reset each round. */
static int count_mixed_records(struct mk_gemm_error* err, uint32_t* claim, unsigned* meet, int ctas, int rounds) {
  int mixed = 0;
  for (int r = 0; r < rounds; r++) {
    memset(err, 0, sizeof(*err));
    err->claim = claim;
    if (claim) memset_now(claim, 0, sizeof(*claim));
    memset_now(meet, 0, sizeof(*meet));
    raise_together_kernel<<<ctas, 32>>>(err, meet);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    if (!record_from_one_raiser(err, (uint32_t)ctas)) {
      if (!mixed)
        printf("  round %d: aborted=%u tag=%#x tile=%u flag=%#x expected=%llu seen=%llu\n", r, err->aborted,
               err->tag, err->tile, err->flag_index, (unsigned long long)err->expected,
               (unsigned long long)err->seen);
      mixed++;
    }
  }
  return mixed;
}

static void test_error_record_claim(void) {
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int rounds = 200;
  struct mk_gemm_error* err;
  uint32_t* claim;
  unsigned* meet;
  CUDA_OK(cudaHostAlloc((void**)&err, sizeof(*err), cudaHostAllocMapped));
  CUDA_OK(cudaMalloc(&claim, sizeof(*claim)));
  CUDA_OK(cudaMalloc(&meet, sizeof(*meet)));

  /* the checker's negative control: one field from another raiser */
  struct mk_gemm_error mix = {1, RECORD_TAG_BASE + 3, 3, record_flag_of(3), record_expected_of(3), record_seen_of(5),
                             NULL};
  EXPECT(!record_from_one_raiser(&mix, 8), "the checker accepted a record with another raiser's seen");
  mix.seen = record_seen_of(3);
  EXPECT(record_from_one_raiser(&mix, 8), "the checker rejected a consistent record");

  const int with_claim = count_mixed_records(err, claim, meet, sms, rounds);
  uint32_t taken = 0;
  CUDA_OK(cudaMemcpy(&taken, claim, sizeof(taken), cudaMemcpyDeviceToHost));
  /* Without the word the mix is a race: counted to show what the word prevents, not asserted. */
  const int without = count_mixed_records(err, NULL, meet, sms, rounds);
  printf("  %d CTAs raising %d times each together, %d rounds: %d mixed records with the claim word, %d without\n",
         sms, RECORD_RAISES, rounds, with_claim, without);
  EXPECT(with_claim == 0, "%d of %d records mixed two waits' fields although the claim word was set", with_claim,
         rounds);
  EXPECT(taken == 1, "the claim word reads %u after the raises, not 1", taken);
  CUDA_OK(cudaFreeHost(err));
  cudaFree(claim), cudaFree(meet);
}

#endif /* MK_TEST_ERROR_RECORD_CUH_ */
