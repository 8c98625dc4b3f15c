/* The net plugin's set of live objects (plugin/net_live.c): what was added is there once, a
 * second take is refused, and a random run of adds and takes over pointers that share home
 * slots (so runs wrap and removals shift members back), through several growths, agrees with
 * a plain list at every step. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "mk_test.h"
#include "net_live.h"

#define POOL 3000

static void a_second_take_is_refused(void) {
  static char objs[3];
  const unsigned long n0 = mk_net_live_count();
  CHECK_EQ(mk_net_live_add(&objs[0]), 0);
  CHECK_EQ(mk_net_live_add(&objs[1]), 0);
  CHECK_EQ(mk_net_live_add(&objs[0]), 0); /* once, however often added */
  CHECK_EQ(mk_net_live_count(), n0 + 2);
  CHECK_EQ(mk_net_live_take(&objs[0]), 0);
  CHECK_EQ(mk_net_live_take(&objs[0]), -ENOENT);
  CHECK_EQ(mk_net_live_take(&objs[2]), -ENOENT); /* never added */
  CHECK_EQ(mk_net_live_take(NULL), -ENOENT);
  CHECK_EQ(mk_net_live_add(NULL), -EINVAL);
  CHECK_EQ(mk_net_live_take(&objs[1]), 0);
  CHECK_EQ(mk_net_live_count(), n0);
}

static void random_adds_and_takes_agree_with_a_list(void) {
  static char pool[POOL * 64]; /* 64 bytes apart: many share a home slot */
  static unsigned char in[POOL];
  unsigned long live = mk_net_live_count(), bad = 0;
  srand(71);
  for (int step = 0; step < 200000; step++) {
    const int i = rand() % POOL;
    const int add = rand() % 3 != 0; /* grows to most of the pool, then churns */
    const void* p = &pool[(size_t)i * 64];
    if (add) {
      bad += mk_net_live_add(p) != 0;
      live += !in[i], in[i] = 1;
    } else {
      bad += mk_net_live_take(p) != (in[i] ? 0 : -ENOENT);
      live -= in[i], in[i] = 0;
    }
    bad += mk_net_live_count() != live;
  }
  for (int i = 0; i < POOL; i++)
    bad += mk_net_live_take(&pool[(size_t)i * 64]) != (in[i] ? 0 : -ENOENT);
  CHECK_EQ(bad, 0);
  CHECK_EQ(mk_net_live_count(), 0);
}

int main(void) {
  a_second_take_is_refused();
  random_adds_and_takes_agree_with_a_list();
  return MK_TEST_RESULT();
}
