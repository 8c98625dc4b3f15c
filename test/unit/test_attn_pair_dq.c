/*
 * Backward variant 5's step pairs (attn_bwd_cfg.cuh PAIR_DQ) as a model of its two consumer
 * warp groups and their shared-memory barriers, built from the kernel's own helpers (attn.h
 * mk_attn_pair_*). Each group runs, per pair pr, for its steps it = 2 pr and 2 pr + 1: wait
 * ds_free[buf] (it >= 2), store its half of dS^T into buf, arrive on ds_ready[buf]; then waits
 * ds_ready[g] and reads buffer g for the whole dQ of step 2 pr + g, arrives on ds_free[g].
 * mbarriers as the hardware keeps them: a phase completes when its arrivals are all in, and a
 * wait on parity P passes once the current phase's parity is not P. Under every interleaving a
 * seeded scheduler picks (and round robin), for 0-41 steps: no deadlock, every read sees both
 * groups' dS^T of its own step (neither older nor newer), no buffer is rewritten before its
 * read, and the pairs cover every step once (a dummy only after an odd count).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "mk_test.h"

struct bar {
  int count, arrived, phase; /* phase: completed phases */
};

static void bar_arrive(struct bar* b) {
  if (++b->arrived == b->count) b->arrived = 0, b->phase++;
}

static int bar_passes(const struct bar* b, unsigned parity) { return (unsigned)(b->phase & 1) != parity; }

struct model {
  struct bar ready[2], freed[2];
  int stored[2][2]; /* stored[buf][group]: step of the group's last dS^T in buf (-1: none) */
  int read[2];      /* read[buf]: pair whose dQ last read buf (-1: none) */
  int failures;
};

/* A group's program counter: pair pr, position 0/1 (steps), 2 (dQ); done when pr == pairs. */
struct group {
  int g, pr, pos;
};

/* One action of group gr if it can move (0 when blocked or done). */
static int group_step(struct model* m, struct group* gr, int pairs) {
  if (gr->pr >= pairs) return 0;
  if (gr->pos < 2) {
    const int it = 2 * gr->pr + gr->pos, buf = mk_attn_pair_buf(it);
    if (it >= 2 && !bar_passes(&m->freed[buf], mk_attn_pair_free_parity(it))) return 0;
    if (it >= 2 && m->read[buf] != (it >> 1) - 1) m->failures++; /* rewritten before its read */
    m->stored[buf][gr->g] = it;
    bar_arrive(&m->ready[buf]);
    gr->pos++;
    return 1;
  }
  const int buf = gr->g;
  if (!bar_passes(&m->ready[buf], mk_attn_pair_ready_parity(gr->pr))) return 0;
  const int want = 2 * gr->pr + gr->g;
  if (m->stored[buf][0] != want || m->stored[buf][1] != want) m->failures++; /* stale or newer */
  m->read[buf] = gr->pr;
  bar_arrive(&m->freed[buf]);
  gr->pos = 0, gr->pr++;
  return 1;
}

/* Runs both groups to the end; the picks come from `seed` (0: round robin). 1 on a deadlock. */
static int run(int steps, unsigned seed, int* failures) {
  struct model m;
  memset(&m, 0, sizeof m);
  for (int b = 0; b < 2; b++) {
    m.ready[b].count = 2; /* both groups' threads; a group's 128 as one arrival here */
    m.freed[b].count = 1; /* the reading group's warps as one */
    m.stored[b][0] = m.stored[b][1] = -1;
    m.read[b] = -1;
  }
  const int pairs = mk_attn_pair_steps(steps) / 2;
  struct group gs[2] = {{0, 0, 0}, {1, 0, 0}};
  unsigned rng = seed ? seed : 1;
  for (int turn = 0;; turn++) {
    int first = turn & 1;
    if (seed) {
      rng = rng * 1103515245u + 12345u;
      first = (int)(rng >> 16) & 1;
    }
    if (!group_step(&m, &gs[first], pairs) && !group_step(&m, &gs[!first], pairs)) break;
  }
  *failures = m.failures;
  return gs[0].pr < pairs || gs[1].pr < pairs;
}

static void pairs_never_deadlock_and_read_their_own_step(void) {
  for (int steps = 0; steps <= 41; steps++)
    for (unsigned seed = 0; seed < 200; seed++) {
      int failures = 0;
      CHECK_EQ(run(steps, seed, &failures), 0);
      CHECK_EQ(failures, 0);
    }
}

/* The pairs run every step once; only an odd count adds one (the dummy past the range). */
static void pairs_cover_every_step_and_a_dummy_only_after_an_odd_count(void) {
  for (int steps = 0; steps <= 41; steps++) {
    const int l = mk_attn_pair_steps(steps);
    CHECK(l % 2 == 0 && l >= steps && l - steps == (steps & 1));
  }
  for (int it = 0; it < 64; it++) CHECK_EQ(mk_attn_pair_buf(it), it % 2);
}

/* A control: a wrong parity (the previous pair's) is caught by the model. */
static void model_catches_a_wait_on_the_wrong_phase(void) {
  struct bar b = {1, 0, 0};
  CHECK(!bar_passes(&b, 0) && bar_passes(&b, 1)); /* phase 0 open: a wait for it blocks */
  bar_arrive(&b);
  CHECK(bar_passes(&b, 0) && !bar_passes(&b, 1));
  /* pair 1's dQ waiting with pair 0's parity would pass before pair 1's stores: seen as stale */
  struct model m;
  memset(&m, 0, sizeof m);
  m.ready[0].count = 2, m.ready[0].phase = 1; /* pair 0 complete, pair 1 not stored yet */
  m.stored[0][0] = m.stored[0][1] = 0;
  struct group g0 = {0, 1, 2};
  const unsigned wrong = mk_attn_pair_ready_parity(1) ^ 1u;
  CHECK(bar_passes(&m.ready[0], wrong)); /* the wrong wait would not block ... */
  CHECK(!bar_passes(&m.ready[0], mk_attn_pair_ready_parity(1))); /* the right one does */
  CHECK_EQ(group_step(&m, &g0, 2), 0);
}

int main(void) {
  pairs_never_deadlock_and_read_their_own_step();
  pairs_cover_every_step_and_a_dummy_only_after_an_odd_count();
  model_catches_a_wait_on_the_wrong_phase();
  return MK_TEST_RESULT();
}
