/*
 * The TCP side channel every transport's connection setup rides on: the listening socket
 * whose address and nonce go into the handle NCCL ships, and the connects still in progress
 * (NCCL calls connect again with the same handle buffer until a comm comes back, and the
 * handle is const, so the state lives here, keyed by the buffer's address).
 */
#ifndef MK_SIDE_CHANNEL_H_
#define MK_SIDE_CHANNEL_H_

#include <pthread.h>
#include <stdint.h>

#include "handle.h"

/* First member of each transport's listen comm. */
struct mk_side_listen {
  uint32_t magic; /* the transport's, checked on every use; 0 once closed */
  int dev;
  int fd;
  uint64_t nonce; /* in the handle: a connector that dials a reused port is told apart */
};

/* Opens the listening socket on the interface NCCL_MK_SOCKET_IFNAME picks and encodes the
 * handle (MK_HANDLE_MAX bytes). 0 or negative errno; nothing left open on failure. */
int mk_side_listen_open(struct mk_side_listen* l, uint32_t magic, int dev, void* handle);
/* 1 when l is an open listen comm of the transport owning `magic`. */
int mk_side_listen_valid(const struct mk_side_listen* l, uint32_t magic);
void mk_side_listen_close(struct mk_side_listen* l);

struct mk_pending_connect {
  const void* handle;         /* the caller's handle buffer: the key */
  struct mk_handle decoded;
  void* state;                /* the transport's handshake */
  struct mk_pending_connect* next;
};

struct mk_pending_list {
  pthread_mutex_t lock;
  struct mk_pending_connect* head;
};
#define MK_PENDING_LIST_INIT {PTHREAD_MUTEX_INITIALIZER, NULL}

/* Removes and returns the connect in progress for this handle buffer, or NULL. */
struct mk_pending_connect* mk_pending_take(struct mk_pending_list* list, const void* handle);
void mk_pending_put(struct mk_pending_list* list, struct mk_pending_connect* p);

#endif /* MK_SIDE_CHANNEL_H_ */
