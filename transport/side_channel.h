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
int mk_side_listen_open(struct mk_side_listen* l, uint32_t magic, int transport, int dev,
                        void* handle);
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

struct mk_comm;

/* A transport's connection handshake over the side channel (its own hellos), driven through
 * connect and accept calls by mk_side_connect and mk_side_accept. */
struct mk_handshake_ops {
  const char* name;                     /* "ib", "ofi": in messages */
  int (*step)(void* hs);                /* 1: done, 0: call again, < 0: failed */
  struct mk_comm* (*comm_of)(void* hs); /* once done: the comm, which keeps the socket */
  void (*free)(void* hs, int keep);     /* keep: the comm (and its socket) live on */
  int (*heard)(const void* hs);         /* 1 once the caller's hello passed its checks */
  int transport;                        /* handle.h MK_HANDLE_TRANSPORT_*: its listeners' handles */
};

/* One connect call with handle (decoded: h): steps the handshake in progress for this handle
 * buffer, or one that start(ctx, h, &hs) begins (also when the buffer now holds another handle:
 * the old one is dropped). *out gets the comm once the handshake is done, NULL until then.
 * 0 or negative errno (the handshake is then gone). */
int mk_side_connect(struct mk_pending_list* pending, const struct mk_handshake_ops* ops, const void* handle,
                    const struct mk_handle* h, int (*start)(void* ctx, const struct mk_handle* h, void** hs),
                    void* ctx, struct mk_comm** out);

/* Every transport's listen comm: the listening socket and the accept in progress. */
struct mk_listen_comm {
  struct mk_side_listen side;
  void* hs; /* the transport's handshake, NULL when none is in progress */
};

/* A listen comm for the transport owning `magic` and ops (mk_side_listen_open; the handle names
 * ops->transport). 0 or negative errno. */
int mk_listen_comm_open(uint32_t magic, const struct mk_handshake_ops* ops, int dev, void* handle,
                        void** out);
/* Closes lc (checked against magic: -EINVAL with a WARN otherwise), dropping the accept in
 * progress through ops. */
int mk_listen_comm_close(void* lc, uint32_t magic, const struct mk_handshake_ops* ops);

/* One accept call on lc (checked against magic): a new socket, if one waits, gets the
 * handshake that start(ctx, fd, &hs) begins (it closes fd when it fails); *out gets the comm
 * once done. A caller that is not our peer (-EBADMSG, -ECONNRESET) is dropped and listening
 * goes on. 0 or negative errno. */
int mk_side_accept(void* lc, uint32_t magic, const struct mk_handshake_ops* ops,
                   int (*start)(void* ctx, int fd, void** hs), void* ctx, struct mk_comm** out);

#endif /* MK_SIDE_CHANNEL_H_ */
