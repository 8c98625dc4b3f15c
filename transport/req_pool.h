/*
 * A fixed-size pool of equally sized request slots, allocated once per comm. Running out is
 * not an error: alloc returns NULL and the caller reports "retry" (*req == NULL) to NCCL.
 * Not locked: the owning comm's mutex protects it.
 */
#ifndef MK_REQ_POOL_H_
#define MK_REQ_POOL_H_

#include <stddef.h>
#include <stdint.h>

struct mk_req_pool {
  uint8_t* slots;     /* count * slot_size bytes, zeroed */
  uint32_t* free_idx; /* stack of free slot indices */
  uint8_t* live;      /* per slot: 1 while allocated (a request in flight) */
  size_t slot_size;
  uint32_t count;
  uint32_t nfree;
};

int mk_req_pool_init(struct mk_req_pool* pool, uint32_t count, size_t slot_size);
void mk_req_pool_fini(struct mk_req_pool* pool);
/* A zeroed slot, or NULL when all are in use. */
void* mk_req_pool_alloc(struct mk_req_pool* pool);
/* -EINVAL if slot is not a slot of this pool or is already free. */
int mk_req_pool_free(struct mk_req_pool* pool, void* slot);
/* 1 if slot is a slot of this pool that is allocated now: a request handed out and not yet
 * freed (a request tested again after it completed is not). */
int mk_req_pool_live(const struct mk_req_pool* pool, const void* slot);
/* Slot i (0 <= i < count), allocated or not: for walking in-flight requests at close. */
void* mk_req_pool_slot(struct mk_req_pool* pool, uint32_t i);
static inline uint32_t mk_req_pool_in_use(const struct mk_req_pool* pool) {
  return pool->count - pool->nfree;
}

#endif /* MK_REQ_POOL_H_ */
