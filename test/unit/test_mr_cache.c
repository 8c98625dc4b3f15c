/* Registration cache: hits inside a range, misses on partial overlap or another memory
 * type, refcounts, and release handing the handle back exactly once. */
#include <errno.h>

#include "mk_test.h"
#include "mr_cache.h"
#include "transport.h"

int main(void) {
  struct mk_mr_cache c;
  int h1 = 1, h2 = 2;
  void* out = NULL;
  mk_mr_cache_init(&c);
  CHECK(mk_mr_cache_find(&c, 0x1000, 0x100, MK_PTR_HOST) == NULL); /* empty: miss */
  struct mk_mr_entry* a = mk_mr_cache_insert(&c, 0x1000, 0x1000, MK_PTR_HOST, &h1, 11);
  REQUIRE(a);
  CHECK(mk_mr_cache_find(&c, 0x1000, 0x1000, MK_PTR_HOST) == a);  /* same range */
  CHECK(mk_mr_cache_find(&c, 0x1800, 0x800, MK_PTR_HOST) == a);   /* inside, to the end */
  CHECK_EQ(a->refs, 3);
  CHECK(mk_mr_cache_find(&c, 0x1800, 0x801, MK_PTR_HOST) == NULL); /* one byte past */
  CHECK(mk_mr_cache_find(&c, 0x0fff, 0x10, MK_PTR_HOST) == NULL);  /* starts before */
  CHECK(mk_mr_cache_find(&c, 0x1000, 0x10, MK_PTR_CUDA) == NULL);  /* other memory type */
  CHECK(mk_mr_cache_find(&c, (uintptr_t)-16, 0x100, MK_PTR_HOST) == NULL); /* no wrap */
  /* partial overlap: a separate registration, both live */
  struct mk_mr_entry* b = mk_mr_cache_insert(&c, 0x1800, 0x1000, MK_PTR_HOST, &h2, 22);
  REQUIRE(b && b != a);
  CHECK_EQ(c.entries, 2);
  CHECK(mk_mr_cache_find(&c, 0x2000, 0x100, MK_PTR_HOST) == b);
  CHECK_EQ(mk_mr_cache_release(&c, a, &out), 0);
  CHECK_EQ(mk_mr_cache_release(&c, a, &out), 0);
  CHECK(out == NULL);
  CHECK_EQ(mk_mr_cache_release(&c, a, &out), 1); /* last reference */
  CHECK(out == &h1);
  CHECK_EQ(mk_mr_cache_release(&c, a, &out), -EINVAL); /* gone */
  CHECK(mk_mr_cache_find(&c, 0x1000, 0x10, MK_PTR_HOST) == NULL);
  CHECK_EQ(c.entries, 1);
  CHECK_EQ(mk_mr_cache_fini(&c), 1); /* b still held twice: reported as a leak */
  return MK_TEST_RESULT();
}
