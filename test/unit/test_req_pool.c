/* Request pool: exactly count slots, the next alloc fails, frees make room, bad frees caught,
 * a slot is live (in flight) from its alloc to its free only. */
#include <errno.h>
#include <stdint.h>

#include "mk_test.h"
#include "req_pool.h"
#include "transport.h"

int main(void) {
  struct mk_req_pool pool;
  void* slot[MK_MAX_REQUESTS];
  REQUIRE(mk_req_pool_init(&pool, MK_MAX_REQUESTS, 200) == 0);
  CHECK(pool.slot_size % 64 == 0 && pool.slot_size >= 200);
  for (int i = 0; i < MK_MAX_REQUESTS; i++) {
    slot[i] = mk_req_pool_alloc(&pool);
    CHECK(slot[i] != NULL);
    CHECK((uintptr_t)slot[i] % 64 == 0);
    for (int j = 0; j < i; j++) CHECK(slot[i] != slot[j]);
  }
  CHECK_EQ(mk_req_pool_in_use(&pool), MK_MAX_REQUESTS);
  CHECK(mk_req_pool_alloc(&pool) == NULL); /* the 33rd */
  CHECK(mk_req_pool_live(&pool, slot[5]) && mk_req_pool_live(&pool, slot[6]));
  CHECK_EQ(mk_req_pool_free(&pool, slot[5]), 0);
  CHECK(!mk_req_pool_live(&pool, slot[5]) && mk_req_pool_live(&pool, slot[6])); /* freed: not in flight */
  CHECK(!mk_req_pool_live(&pool, (char*)slot[6] + 8));
  CHECK_EQ(mk_req_pool_free(&pool, slot[5]), -EINVAL); /* double free */
  CHECK_EQ(mk_req_pool_free(&pool, (char*)slot[6] + 1), -EINVAL); /* not a slot start */
  int outside;
  CHECK_EQ(mk_req_pool_free(&pool, &outside), -EINVAL);
  CHECK(!mk_req_pool_live(&pool, &outside));
  unsigned char* again = mk_req_pool_alloc(&pool);
  CHECK(again == slot[5] && mk_req_pool_live(&pool, again));
  int zero = 1;
  for (size_t i = 0; i < pool.slot_size; i++) zero &= again[i] == 0;
  CHECK(zero); /* a reused slot comes back zeroed */
  CHECK(mk_req_pool_alloc(&pool) == NULL);
  for (int i = 0; i < MK_MAX_REQUESTS; i++) CHECK_EQ(mk_req_pool_free(&pool, slot[i]), 0);
  CHECK_EQ(mk_req_pool_in_use(&pool), 0);
  mk_req_pool_fini(&pool);
  CHECK_EQ(mk_req_pool_init(&pool, 0, 8), -EINVAL);
  /* a send comm's pool: 32 x 8 */
  REQUIRE(mk_req_pool_init(&pool, MK_MAX_REQUESTS * MK_MAX_RECVS, 64) == 0);
  int n = 0;
  while (mk_req_pool_alloc(&pool)) n++;
  CHECK_EQ(n, MK_MAX_REQUESTS * MK_MAX_RECVS);
  mk_req_pool_fini(&pool);
  return MK_TEST_RESULT();
}
