#include "side_channel.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "mk_err.h"
#include "mk_log.h"
#include "sock.h"
#include "transport.h"

static uint64_t side_nonce(void) {
  uint64_t n;
  if (getrandom(&n, sizeof(n), 0) == sizeof(n)) return n;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
}

int mk_side_listen_open(struct mk_side_listen* l, uint32_t magic, int transport, int dev,
                        void* handle) {
  struct mk_handle h;
  h.transport = (uint16_t)transport;
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

/* The handshake in progress for this handle buffer, unless the buffer now holds another
 * handle (then dropped), else a new one. */
static int side_connect_state(struct mk_pending_list* pending, const struct mk_handshake_ops* ops, const void* handle,
                              const struct mk_handle* h, int (*start)(void* ctx, const struct mk_handle* h, void** hs),
                              void* ctx, struct mk_pending_connect** out) {
  struct mk_pending_connect* p = mk_pending_take(pending, handle);
  if (p && (p->decoded.nonce != h->nonce || memcmp(&p->decoded.addr, &h->addr, sizeof(h->addr)))) {
    ops->free(p->state, 0);
    free(p);
    p = NULL;
  }
  if (!p) {
    p = calloc(1, sizeof(*p));
    if (!p) return -ENOMEM;
    int rc = start(ctx, h, &p->state);
    if (rc < 0) {
      free(p);
      return rc;
    }
    p->handle = handle;
    p->decoded = *h;
  }
  *out = p;
  return 0;
}

int mk_side_connect(struct mk_pending_list* pending, const struct mk_handshake_ops* ops, const void* handle,
                    const struct mk_handle* h, int (*start)(void* ctx, const struct mk_handle* h, void** hs),
                    void* ctx, struct mk_comm** out) {
  struct mk_pending_connect* p;
  *out = NULL;
  if (h->transport != MK_HANDLE_TRANSPORT_UNNAMED && h->transport != ops->transport) {
    MK_WARN("%s connect: the listener's handle was made by its %s transport, this rank uses %s: "
            "set NCCL_MK_TRANSPORT to the same value on every host (auto picks ib where an RDMA "
            "device is)",
            ops->name, mk_handle_transport_name(h->transport), ops->name);
    return -EPROTO;
  }
  MK_CHECK(side_connect_state(pending, ops, handle, h, start, ctx, &p));
  int rc = ops->step(p->state);
  if (rc == 0) {
    mk_pending_put(pending, p);
    return 0;
  }
  if (rc == 1) *out = ops->comm_of(p->state);
  else MK_WARN("%s connect: handshake with the listener failed: %s", ops->name, strerror(-rc));
  ops->free(p->state, rc == 1);
  free(p);
  return rc < 0 ? rc : 0;
}

int mk_listen_comm_open(uint32_t magic, const struct mk_handshake_ops* ops, int dev, void* handle,
                        void** out) {
  struct mk_listen_comm* lc = calloc(1, sizeof(*lc));
  if (!lc) return -ENOMEM;
  int rc = mk_side_listen_open(&lc->side, magic, ops->transport, dev, handle);
  if (rc < 0) {
    free(lc);
    return rc;
  }
  *out = lc;
  return 0;
}

int mk_listen_comm_close(void* listen_comm, uint32_t magic, const struct mk_handshake_ops* ops) {
  struct mk_listen_comm* lc = listen_comm;
  if (!mk_side_listen_valid(&lc->side, magic)) {
    MK_WARN("%s close_listen: bad argument %p", ops->name, listen_comm);
    return -EINVAL;
  }
  if (lc->hs) ops->free(lc->hs, 0);
  mk_side_listen_close(&lc->side);
  free(lc);
  return 0;
}

int mk_side_accept(void* listen_comm, uint32_t magic, const struct mk_handshake_ops* ops,
                   int (*start)(void* ctx, int fd, void** hs), void* ctx, struct mk_comm** out) {
  struct mk_listen_comm* lc = listen_comm;
  if (!mk_side_listen_valid(&lc->side, magic) || !out) {
    MK_WARN("%s accept: bad argument (listen_comm %p)", ops->name, listen_comm);
    return -EINVAL;
  }
  *out = NULL;
  if (!lc->hs) {
    int fd;
    MK_CHECK(mk_sock_accept(lc->side.fd, &fd));
    if (fd < 0) return 0;
    MK_CHECK(start(ctx, fd, &lc->hs));
  }
  int rc = ops->step(lc->hs);
  if (rc == 0) return 0;
  if (rc == 1) *out = ops->comm_of(lc->hs);
  const int ours = rc < 0 && ops->heard(lc->hs);
  ops->free(lc->hs, rc == 1);
  lc->hs = NULL;
  if (rc >= 0) return 0;
  /* A caller whose hello never passed (junk, a reset, or silence until the connect timeout: a
   * port scanner, a stale job) is dropped and the listener goes on, so that it cannot fail our
   * peer's accept; once our peer's hello was in, its failure is the accept's (else a peer that
   * died mid-handshake would leave NCCL calling accept forever). */
  if (!ours && (rc == -EBADMSG || rc == -ECONNRESET || rc == -ETIMEDOUT)) {
    MK_INFO(MK_NCCL_SUBSYS_NET, "%s accept: dropped a caller that is not our peer (%s); listening on",
            ops->name, strerror(-rc));
    return 0;
  }
  MK_WARN("%s accept: the handshake with %s failed: %s", ops->name, ours ? "our peer" : "a caller",
          strerror(-rc));
  return rc;
}
