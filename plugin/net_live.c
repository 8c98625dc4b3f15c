#include "net_live.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

/* An open-addressed set of pointers (linear probing; a removal shifts its run back, so no
 * tombstones), grown at half full. NCCL holds a few comms and registrations per peer and
 * channel: thousands at most, added and taken only at setup and teardown. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static const void** live_slots;
static size_t live_cap, live_n;

static size_t live_home(const void* p, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 32) & (cap - 1);
}

static size_t live_find(const void* p) { /* its slot, or the empty one that ends its run */
  size_t i = live_home(p, live_cap);
  while (live_slots[i] && live_slots[i] != p) i = (i + 1) & (live_cap - 1);
  return i;
}

static int live_grow(void) {
  const size_t cap = live_cap ? 2 * live_cap : 64;
  const void** slots = calloc(cap, sizeof(*slots));
  if (!slots) return -ENOMEM;
  const void** old = live_slots;
  const size_t old_cap = live_cap;
  live_slots = slots, live_cap = cap;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i]) live_slots[live_find(old[i])] = old[i];
  free(old);
  return 0;
}

int mk_net_live_add(const void* p) {
  if (!p) return -EINVAL;
  pthread_mutex_lock(&live_lock);
  int rc = 2 * (live_n + 1) > live_cap ? live_grow() : 0;
  if (rc == 0) {
    const size_t i = live_find(p);
    if (!live_slots[i]) live_slots[i] = p, live_n++;
  }
  pthread_mutex_unlock(&live_lock);
  return rc;
}

int mk_net_live_take(const void* p) {
  int rc = -ENOENT;
  pthread_mutex_lock(&live_lock);
  if (p && live_cap) {
    size_t i = live_find(p);
    if (live_slots[i]) {
      live_slots[i] = NULL, live_n--, rc = 0;
      /* shift back each later member of the run that may sit at or before the hole */
      for (size_t j = (i + 1) & (live_cap - 1); live_slots[j]; j = (j + 1) & (live_cap - 1)) {
        const size_t home = live_home(live_slots[j], live_cap);
        const int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) live_slots[i] = live_slots[j], live_slots[j] = NULL, i = j;
      }
    }
  }
  pthread_mutex_unlock(&live_lock);
  return rc;
}

unsigned long mk_net_live_count(void) {
  pthread_mutex_lock(&live_lock);
  const unsigned long n = live_n;
  pthread_mutex_unlock(&live_lock);
  return n;
}
