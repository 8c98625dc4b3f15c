#include "req_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Slot sizes are rounded up so every slot stays 64-byte aligned (no false sharing). */
#define SLOT_ALIGN 64

int mk_req_pool_init(struct mk_req_pool* pool, uint32_t count, size_t slot_size) {
  if (!pool || count == 0 || slot_size == 0) return -EINVAL;
  memset(pool, 0, sizeof(*pool));
  pool->slot_size = (slot_size + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
  if (posix_memalign((void**)&pool->slots, SLOT_ALIGN, pool->slot_size * count)) return -ENOMEM;
  pool->free_idx = malloc(sizeof(uint32_t) * count);
  pool->live = calloc(count, 1);
  if (!pool->free_idx || !pool->live) {
    free(pool->slots), free(pool->free_idx), free(pool->live);
    memset(pool, 0, sizeof(*pool));
    return -ENOMEM;
  }
  memset(pool->slots, 0, pool->slot_size * count);
  pool->count = count;
  /* Lowest index on top, so allocation order is predictable in tests and traces. */
  for (uint32_t i = 0; i < count; i++) pool->free_idx[i] = count - 1 - i;
  pool->nfree = count;
  return 0;
}

void mk_req_pool_fini(struct mk_req_pool* pool) {
  if (!pool) return;
  free(pool->slots);
  free(pool->free_idx);
  free(pool->live);
  memset(pool, 0, sizeof(*pool));
}

void* mk_req_pool_alloc(struct mk_req_pool* pool) {
  if (pool->nfree == 0) return NULL;
  uint32_t i = pool->free_idx[--pool->nfree];
  void* slot = pool->slots + (size_t)i * pool->slot_size;
  memset(slot, 0, pool->slot_size);
  pool->live[i] = 1;
  return slot;
}

/* Slot index of p, or -1 if p is not the start of a slot of this pool. */
static long req_pool_index(const struct mk_req_pool* pool, const void* p) {
  const uint8_t* b = p;
  if (!pool->slots || b < pool->slots || b >= pool->slots + pool->slot_size * pool->count)
    return -1;
  const size_t off = (size_t)(b - pool->slots);
  return off % pool->slot_size ? -1 : (long)(off / pool->slot_size);
}

int mk_req_pool_live(const struct mk_req_pool* pool, const void* slot) {
  const long i = req_pool_index(pool, slot);
  return i >= 0 && pool->live[i];
}

int mk_req_pool_free(struct mk_req_pool* pool, void* slot) {
  const long i = req_pool_index(pool, slot);
  if (i < 0 || !pool->live[i]) return -EINVAL; /* not ours, or a double free */
  pool->live[i] = 0;
  pool->free_idx[pool->nfree++] = (uint32_t)i;
  return 0;
}

void* mk_req_pool_slot(struct mk_req_pool* pool, uint32_t i) {
  return i < pool->count ? pool->slots + (size_t)i * pool->slot_size : NULL;
}
