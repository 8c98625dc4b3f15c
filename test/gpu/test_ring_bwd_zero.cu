/*
 * The ring backward's accumulator zero (fused/ring_attn/ring_attn.h mk_ra_bwd_zero_launch) on one
 * GPU, every case in one run (exit 77 without a Hopper GPU):
 *   - gate open, no wait: every value zeroed;
 *   - gate closed (MK_ATTN_ACC_GATE_CLOSED): nothing written;
 *   - with the owner's done word (the merged plan): zeroed once it reaches this rank's, also when
 *     it is raised 20 ms after the launch by a kernel on another stream (the zero waited);
 *   - the owner's done word never reaching it: nothing written, the gate closed with the call
 *     number, the error record naming the peer (flag_index) and the words; no hang.
 */
#include <string.h>
#include <vector>

#include "attn.h"
#include "expect.h"
#include "gemm_check.cuh"
#include "late_raise.cuh"
#include "ring_attn.h"

#define ZERO_FLOATS (1 << 20)

struct zero_bufs {
  float* acc;
  uint64_t* words; /* [0] gave_up, [1] this rank's done, [2] the owner's done */
  struct mk_gemm_error* err;
};

static uint64_t get_word(const uint64_t* d) {
  uint64_t v;
  CUDA_OK(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

/* Values of acc that are not zero (after a fill with non-zero values). */
static size_t nonzero(const float* acc) {
  std::vector<float> h(ZERO_FLOATS);
  CUDA_OK(cudaMemcpy(h.data(), acc, h.size() * 4, cudaMemcpyDeviceToHost));
  size_t n = 0;
  for (float x : h) n += x != 0.f;
  return n;
}

/* Fills acc with 1.0f, resets the words (gate open, done 4, owner done `owner`) and the error. */
static void reset(struct zero_bufs* b, uint64_t owner) {
  std::vector<float> ones(ZERO_FLOATS, 1.0f);
  CUDA_OK(cudaMemcpy(b->acc, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  set_words(b->words, 1, 0), set_words(b->words + 1, 1, 4), set_words(b->words + 2, 1, owner);
  memset_now(b->err, 0, sizeof *b->err);
}

static struct mk_ra_bwd_zero_args args_of(const struct zero_bufs* b, int wait) {
  struct mk_ra_bwd_zero_args z;
  memset(&z, 0, sizeof z);
  z.acc = b->acc, z.bytes = ZERO_FLOATS * 4, z.gave_up = b->words;
  if (wait) z.peer_done = b->words + 2, z.done = b->words + 1, z.err = b->err, z.flag_index = 1, z.timeout_ms = 200;
  return z;
}

static int launch_and_wait(const struct mk_ra_bwd_zero_args* z) {
  const int rc = mk_ra_bwd_zero_launch(z, 0);
  EXPECT(rc == 0, "mk_ra_bwd_zero_launch returned %d", rc);
  CUDA_OK(cudaDeviceSynchronize());
  return rc == 0;
}

int main(void) {
  gpu_or_skip();
  struct zero_bufs b;
  CUDA_OK(cudaMalloc(&b.acc, ZERO_FLOATS * 4));
  CUDA_OK(cudaMalloc(&b.words, 3 * sizeof(uint64_t)));
  CUDA_OK(cudaMalloc(&b.err, sizeof *b.err));

  reset(&b, 0);
  struct mk_ra_bwd_zero_args z = args_of(&b, 0);
  if (launch_and_wait(&z)) EXPECT(nonzero(b.acc) == 0, "gate open: %zu values left", nonzero(b.acc));

  reset(&b, 0);
  set_words(b.words, 1, MK_ATTN_ACC_GATE_CLOSED | 5);
  if (launch_and_wait(&z)) EXPECT(nonzero(b.acc) == ZERO_FLOATS, "gate closed: values were written");

  reset(&b, 4); /* the owner ended call 4, this rank's previous one */
  z = args_of(&b, 1);
  if (launch_and_wait(&z)) EXPECT(nonzero(b.acc) == 0, "owner done: %zu values left", nonzero(b.acc));

  reset(&b, 3); /* the owner ends call 4 20 ms after the launch */
  int ran = 0;
  const float ms = time_beside_late_raise(b.words + 2, 1, 4, 20000000ull, [&] { return launch_and_wait(&z); }, &ran);
  printf("owner done 20 ms late: the zero took %.1f ms\n", ms);
  EXPECT(ms >= 15.f, "the zero took %.1f ms: it did not wait for the owner", ms);
  if (ran) EXPECT(nonzero(b.acc) == 0, "owner done late: %zu values left", nonzero(b.acc));

  reset(&b, 3); /* the owner never ends call 4 */
  if (launch_and_wait(&z)) {
    struct mk_gemm_error e;
    CUDA_OK(cudaMemcpy(&e, b.err, sizeof e, cudaMemcpyDeviceToHost));
    const uint64_t gate = get_word(b.words);
    printf("owner never done: gate %#llx, aborted %u, flag %u, expected %llu, seen %llu\n", (unsigned long long)gate,
           e.aborted, e.flag_index, (unsigned long long)e.expected, (unsigned long long)e.seen);
    EXPECT(nonzero(b.acc) == ZERO_FLOATS, "owner never done: values were written");
    EXPECT(gate == (MK_ATTN_ACC_GATE_CLOSED | 5), "the gate is not closed with call 5");
    EXPECT(e.aborted && e.tile == MK_GEMM_ERR_TILE_PEER_FREE && e.flag_index == 1 && e.expected == 4 && e.seen == 3,
           "the error record does not name the wait (a peer's previous call: tile %#x)", e.tile);
  }

  cudaFree(b.acc), cudaFree(b.words), cudaFree(b.err);
  printf("ring backward zero: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
