/* The pure rules of the eager path (eager.h): matching, replay, the unexpected queue. */
#include "eager.h"

#include <stdlib.h>
#include <string.h>

int mk_ofi_match_entry(const int32_t* tags, uint32_t n, uint32_t taken, int32_t tag) {
  for (uint32_t i = 0; i < n && i < 32; i++)
    if (!(taken & (1u << i)) && tags[i] == tag) return (int)i;
  return -1;
}

int mk_ofi_replay(const int32_t* ring, uint32_t msn0, uint32_t count, const int32_t* tags,
                  uint32_t n, uint32_t* taken) {
  if (count > n || count > MK_OFI_TAG_RING) return -EPROTO;
  for (uint32_t k = 0; k < count; k++) {
    int i = mk_ofi_match_entry(tags, n, *taken, ring[(msn0 + k) % MK_OFI_TAG_RING]);
    if (i < 0) return -EPROTO;
    *taken |= 1u << i;
  }
  return 0;
}

int mk_ofi_eager_next(uint32_t m, uint32_t msn0, uint32_t n, uint32_t done) {
  if (!mk_ofi_msn_in(m, msn0, n)) return -EPROTO;
  int32_t d = mk_ofi_msn_diff(m, msn0);
  if ((uint32_t)d < done) return -EPROTO; /* that message was delivered already */
  return (uint32_t)d == done;
}

int mk_ofi_uq_init(struct mk_ofi_uq* q, uint32_t cap) {
  q->count = 0;
  q->cap = cap;
  q->e = cap ? calloc(cap, sizeof(*q->e)) : NULL;
  return cap && !q->e ? -ENOMEM : 0;
}

void mk_ofi_uq_fini(struct mk_ofi_uq* q) {
  free(q->e);
  memset(q, 0, sizeof(*q));
}

int mk_ofi_uq_push(struct mk_ofi_uq* q, const struct mk_ofi_uq_ent* ent) {
  if (q->count >= q->cap) return -ENOSPC;
  q->e[q->count++] = *ent;
  return 0;
}

int mk_ofi_uq_find(const struct mk_ofi_uq* q, uint32_t msn) {
  for (uint32_t i = 0; i < q->count; i++)
    if (q->e[i].msn == msn) return (int)i;
  return -1;
}

void mk_ofi_uq_remove(struct mk_ofi_uq* q, uint32_t idx) {
  if (idx >= q->count) return;
  memmove(&q->e[idx], &q->e[idx + 1], sizeof(*q->e) * (q->count - idx - 1));
  q->count--;
}
