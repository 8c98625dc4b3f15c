/* Ring attention's backward schedule (fused/ring_attn/ra_schedule.h) for 2 to 16 ranks: a whole
 * backward pass is simulated from the schedule functions alone, partial by partial. Each
 * block's dK/dV gets one part from every (query rank, query half, key half) pair the causal
 * mask does not skip, and none from a skipped one; every partial ends at its owner; no two
 * ranks hold the same block's partial at a step; every receive matches a send to that rank of
 * the same block, made one step before by the rank the KV block came from; n-1 transfers per
 * block. */
#include <string.h>

#include "mk_test.h"
#include "ra_schedule.h"

#define MAX_N 16

/* A dK/dV partial: how many parts it holds from each (query rank, query half, key half). */
struct partial {
  int block;
  int parts[MAX_N][2][2];
};

/* A partial in flight between two steps. */
struct message {
  int from, to;
  struct partial* p;
  int taken;
};

static struct partial own[MAX_N];        /* the owner's dk/dv output, per block */
static struct partial travel[MAX_N];     /* the travelling partial, per block */
static struct message sent[2][MAX_N];    /* sent after the previous step / this step */
static int nsent[2];

/* What one simulated step counts across ranks. */
struct step_tally {
  int started[MAX_N]; /* travelling partials begun, per block (the whole pass) */
  int holders[MAX_N]; /* ranks holding each block's partial (this step) */
  int arrivals[MAX_N]; /* partials sent to each rank (this step) */
  int transfers;      /* partials sent (the whole pass) */
};

/* The partial rank r works on at step s: its own part, a new travelling partial, or the one
 * its predecessor sent after the previous step (taken from `in`). NULL when none matches. */
static struct partial* partial_at(int r, int n, int s, int blk, struct message* in, int nin,
                                  struct step_tally* t) {
  struct partial* p = NULL;
  const int from = mk_ra_dkv_recv_from(r, n, s);
  if (from == MK_RA_NOBODY) {
    if (s == 0) { /* the owner's own part, in its dk/dv */
      CHECK_EQ(blk, r);
      p = &own[blk];
    } else { /* a travelling partial starts, once per block */
      CHECK_EQ(t->started[blk], 0);
      t->started[blk]++;
      p = &travel[blk];
    }
    p->block = blk;
    return p;
  }
  REQUIRE(from >= 0 && from < n);
  /* It comes over the link the KV block came over, one step after that rank held it. */
  CHECK_EQ(from, mk_ra_recv_from(r, n));
  CHECK(s > 0 && mk_ra_kv_forwarded(n, s - 1));
  for (int i = 0; i < nin; i++)
    if (in[i].from == from && !in[i].taken) {
      CHECK_EQ(in[i].to, r); /* the sender meant it for r */
      in[i].taken = 1;
      p = in[i].p;
      break;
    }
  if (!p) return NULL; /* the predecessor sent nothing after the last step */
  CHECK_EQ(p->block, blk); /* a partial is held by the rank that holds its KV block */
  CHECK(p != &own[blk]);   /* the owner's part never travels */
  return p;
}

/* Rank r at step s: takes its partial, adds the parts the mask lets through, sends it on
 * (into out). A schedule broken beyond checking further ends the test (REQUIRE). */
static void rank_step(int r, int n, int s, int causal, struct message* in, int nin,
                     struct message* out, int* nout, struct step_tally* t) {
  const int blk = mk_ra_kv_source(r, n, s);
  REQUIRE(blk >= 0 && blk < n);
  CHECK_EQ(mk_ra_kv_holder(blk, n, s), r);
  struct partial* p = partial_at(r, n, s, blk, in, nin, t);
  REQUIRE(p != NULL);
  t->holders[blk]++;
  for (int qh = 0; qh < 2; qh++)
    for (int kh = 0; kh < 2; kh++)
      if (mk_ra_step_mask(r, n, s, qh, kh, causal) != MK_RA_NONE) p->parts[r][qh][kh]++;
  const int to = mk_ra_dkv_send_to(r, n, s);
  if (to == MK_RA_NOBODY) {
    CHECK(p == &own[blk]); /* only the owner's own part stays */
    return;
  }
  REQUIRE(to >= 0 && to < n && *nout < MAX_N);
  CHECK(to != r);
  /* The last hop, and only it, ends at the owner. */
  CHECK_EQ(to == blk, mk_ra_dkv_arrives_home(n, s));
  out[*nout] = (struct message){.from = r, .to = to, .p = p, .taken = 0};
  (*nout)++;
  t->arrivals[to]++;
  t->transfers++;
}

/* After the last step each partial arrives at its owner, which adds it to its own part; then
 * every block holds exactly the parts the mask allows, each once. */
static void partials_home_hold_every_part_once(int n, int causal, const struct step_tally* t) {
  CHECK(!mk_ra_kv_forwarded(n, n - 1)); /* the last step's block is the successor's own */
  for (int r = 0; r < n; r++) CHECK_EQ(mk_ra_kv_source(r, n, n - 1), mk_ra_send_to(r, n));
  const struct message* last = sent[n % 2];
  CHECK_EQ(nsent[n % 2], n);
  for (int i = 0; i < nsent[n % 2]; i++) {
    const int blk = last[i].p->block;
    CHECK_EQ(last[i].to, blk);
    for (int q = 0; q < n; q++)
      for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) own[blk].parts[q][qh][kh] += last[i].p->parts[q][qh][kh];
  }
  CHECK_EQ(t->transfers, n * (n - 1)); /* n-1 per block */
  for (int blk = 0; blk < n; blk++) {
    CHECK_EQ(t->started[blk], 1);
    int bad = 0;
    for (int q = 0; q < n; q++)
      for (int qh = 0; qh < 2; qh++)
        for (int kh = 0; kh < 2; kh++) {
          /* Causal: a key chunk contributes to a query chunk exactly when it is not later. */
          const int want =
              !causal || mk_ra_zigzag_chunk(blk, n, kh) <= mk_ra_zigzag_chunk(q, n, qh);
          if (own[blk].parts[q][qh][kh] != want && !bad++)
            fprintf(stderr, "n=%d causal=%d block %d: %d parts from rank %d half %d to key half"
                    " %d, want %d\n", n, causal, blk, own[blk].parts[q][qh][kh], q, qh, kh, want);
        }
    CHECK_EQ(bad, 0);
  }
}

static void backward_partials_bring_every_part_home_once(int n, int causal) {
  struct step_tally t;
  memset(&t, 0, sizeof(t));
  memset(own, 0, sizeof(own));
  memset(travel, 0, sizeof(travel));
  nsent[0] = nsent[1] = 0;
  for (int s = 0; s < n; s++) {
    struct message* in = sent[s % 2];
    const int nin = nsent[s % 2];
    int nout = 0;
    memset(t.holders, 0, sizeof(t.holders));
    memset(t.arrivals, 0, sizeof(t.arrivals));
    for (int r = 0; r < n; r++) rank_step(r, n, s, causal, in, nin, sent[(s + 1) % 2], &nout, &t);
    for (int blk = 0; blk < n; blk++) CHECK_EQ(t.holders[blk], 1);
    for (int r = 0; r < n; r++) CHECK(t.arrivals[r] <= 1); /* one partial per link and step */
    for (int i = 0; i < nin; i++) CHECK(in[i].taken); /* nothing sent is left unreceived */
    nsent[(s + 1) % 2] = nout;
  }
  partials_home_hold_every_part_once(n, causal, &t);
}

/* The holder of a block's partial, stepped by hand for 4 ranks: block 1 is worked on by ranks
 * 1, 2, 3, 0 at steps 0..3; its travelling partial starts on rank 2, goes 2 -> 3 -> 0 and
 * home 0 -> 1. */
static void partial_of_block_1_of_4_ranks_follows_the_written_path(void) {
  const int holder[4] = {1, 2, 3, 0}, recv[4] = {MK_RA_NOBODY, MK_RA_NOBODY, 2, 3};
  const int send[4] = {MK_RA_NOBODY, 3, 0, 1};
  for (int s = 0; s < 4; s++) {
    CHECK_EQ(mk_ra_kv_holder(1, 4, s), holder[s]);
    CHECK_EQ(mk_ra_dkv_recv_from(holder[s], 4, s), recv[s]);
    CHECK_EQ(mk_ra_dkv_send_to(holder[s], 4, s), send[s]);
    CHECK_EQ(mk_ra_dkv_arrives_home(4, s), s == 3);
    CHECK_EQ(mk_ra_kv_forwarded(4, s), s < 3);
  }
}

int main(void) {
  partial_of_block_1_of_4_ranks_follows_the_written_path();
  for (int n = 2; n <= MAX_N; n++) {
    backward_partials_bring_every_part_home_once(n, 1);
    backward_partials_bring_every_part_home_once(n, 0);
  }
  return MK_TEST_RESULT();
}
