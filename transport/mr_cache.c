#include "mr_cache.h"

#include <errno.h>
#include <stdlib.h>

void mk_mr_cache_init(struct mk_mr_cache* c) {
  pthread_mutex_init(&c->lock, NULL);
  c->head = NULL;
  c->entries = 0;
}

int mk_mr_cache_fini(struct mk_mr_cache* c) {
  int leaked = 0;
  pthread_mutex_lock(&c->lock);
  for (struct mk_mr_entry* e = c->head; e;) {
    struct mk_mr_entry* next = e->next;
    if (e->refs > 0) leaked++;
    free(e);
    e = next;
  }
  c->head = NULL;
  c->entries = 0;
  pthread_mutex_unlock(&c->lock);
  pthread_mutex_destroy(&c->lock);
  return leaked;
}

struct mk_mr_entry* mk_mr_cache_find(struct mk_mr_cache* c, uintptr_t addr, size_t len, int type) {
  struct mk_mr_entry* hit = NULL;
  pthread_mutex_lock(&c->lock);
  for (struct mk_mr_entry* e = c->head; e; e = e->next) {
    if (e->type == type && addr >= e->addr && addr - e->addr <= e->len &&
        len <= e->len - (addr - e->addr)) {
      e->refs++;
      hit = e;
      break;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return hit;
}

struct mk_mr_entry* mk_mr_cache_insert(struct mk_mr_cache* c, uintptr_t addr, size_t len, int type,
                                       void* handle, uint64_t key) {
  struct mk_mr_entry* e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->addr = addr;
  e->len = len;
  e->type = type;
  e->refs = 1;
  e->handle = handle;
  e->key = key;
  pthread_mutex_lock(&c->lock);
  e->next = c->head;
  c->head = e;
  c->entries++;
  pthread_mutex_unlock(&c->lock);
  return e;
}

int mk_mr_cache_release(struct mk_mr_cache* c, struct mk_mr_entry* e, void** handle) {
  int rc = -EINVAL;
  pthread_mutex_lock(&c->lock);
  for (struct mk_mr_entry** pp = &c->head; *pp; pp = &(*pp)->next) {
    if (*pp != e) continue;
    rc = 0;
    if (--e->refs == 0) {
      *pp = e->next;
      c->entries--;
      if (handle) *handle = e->handle;
      free(e);
      rc = 1;
    }
    break;
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}
