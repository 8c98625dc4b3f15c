/*
 * Registration cache of one domain (regIsGlobal): NCCL registers the same buffers again on
 * every comm; a range lying inside an existing registration of the same memory type is a hit
 * and shares it (refcount). Ranges that only partly overlap a registration are misses and get
 * their own. The cache stores the transport's handle opaquely and never registers anything
 * itself, so it is transport-independent and testable without a network.
 * Thread-safe (own mutex): NCCL's service threads register while progress threads run.
 */
#ifndef MK_MR_CACHE_H_
#define MK_MR_CACHE_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct mk_mr_entry {
  uintptr_t addr;
  size_t len;
  int type;        /* MK_PTR_* */
  int refs;
  void* handle;    /* the transport's registration */
  uint64_t key;    /* the transport's remote key */
  struct mk_mr_entry* next;
};

struct mk_mr_cache {
  pthread_mutex_t lock;
  struct mk_mr_entry* head;
  int entries;
};

void mk_mr_cache_init(struct mk_mr_cache* c);
/* Frees the entries; returns how many were still referenced (leaks to WARN about). */
int mk_mr_cache_fini(struct mk_mr_cache* c);
/* A registration of type covering [addr, addr+len), with its refcount taken, or NULL. */
struct mk_mr_entry* mk_mr_cache_find(struct mk_mr_cache* c, uintptr_t addr, size_t len, int type);
/* Adds a fresh registration with one reference. NULL when out of memory. */
struct mk_mr_entry* mk_mr_cache_insert(struct mk_mr_cache* c, uintptr_t addr, size_t len, int type,
                                       void* handle, uint64_t key);
/* Drops a reference. Returns 1 when it was the last one: the entry is unlinked and freed,
 * and *handle receives the registration to undo; 0 otherwise; -EINVAL for an unknown entry. */
int mk_mr_cache_release(struct mk_mr_cache* c, struct mk_mr_entry* e, void** handle);

#endif /* MK_MR_CACHE_H_ */
