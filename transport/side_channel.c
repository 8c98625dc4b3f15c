#include "side_channel.h"

#include <errno.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "mk_err.h"
#include "sock.h"
#include "transport.h"

static uint64_t side_nonce(void) {
  uint64_t n;
  if (getrandom(&n, sizeof(n), 0) == sizeof(n)) return n;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
}

int mk_side_listen_open(struct mk_side_listen* l, uint32_t magic, int dev, void* handle) {
  struct mk_handle h;
  struct sockaddr_storage addr;
  MK_CHECK(mk_sock_pick_addr(&addr, NULL, 0));
  MK_CHECK(mk_sock_listen(&addr, &l->fd, &h.addr));
  l->nonce = side_nonce();
  h.nonce = l->nonce;
  int rc = mk_handle_encode(&h, handle, MK_HANDLE_MAX);
  if (rc < 0) {
    close(l->fd);
    return rc;
  }
  l->magic = magic;
  l->dev = dev;
  return 0;
}

int mk_side_listen_valid(const struct mk_side_listen* l, uint32_t magic) {
  return l && l->magic == magic;
}

void mk_side_listen_close(struct mk_side_listen* l) {
  close(l->fd);
  l->magic = 0;
}

struct mk_pending_connect* mk_pending_take(struct mk_pending_list* list, const void* handle) {
  pthread_mutex_lock(&list->lock);
  struct mk_pending_connect* p = NULL;
  for (struct mk_pending_connect** pp = &list->head; *pp; pp = &(*pp)->next) {
    if ((*pp)->handle != handle) continue;
    p = *pp;
    *pp = p->next;
    break;
  }
  pthread_mutex_unlock(&list->lock);
  return p;
}

void mk_pending_put(struct mk_pending_list* list, struct mk_pending_connect* p) {
  pthread_mutex_lock(&list->lock);
  p->next = list->head;
  list->head = p;
  pthread_mutex_unlock(&list->lock);
}
