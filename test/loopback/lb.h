/*
 * Two-process loopback harness over the real transport: the parent listens and receives,
 * a forked child connects and sends (NCCL's roles); the listen handle, the random seed and
 * small sync messages travel through pipes. Both processes run under alarm() watchdogs, so
 * a bug fails the test instead of hanging CI.
 */
#ifndef MK_LB_H_
#define MK_LB_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport.h"

struct lb_ctx {
  const struct mk_transport_ops* ops;
  int is_sender;
  int to_peer, from_peer; /* pipes */
  pid_t child;            /* in the parent */
  uint64_t seed;
  int dev;
  void* listen_comm;
  struct mk_comm* comm;
  unsigned char handle[MK_HANDLE_MAX];
};

typedef int (*lb_fn)(struct lb_ctx* ctx);

struct lb_case {
  const char* name;
  lb_fn receiver; /* parent */
  lb_fn sender;   /* child */
  int timeout_s;
  int child_may_die; /* the case kills its child on purpose */
};

/* NCCL_MK_TRANSPORT's transport (ofi when unset), or NULL when it is not built. */
const struct mk_transport_ops* lb_transport(void);
/* The harness's own settings (LB_*), read in one place. */
const char* lb_env(const char* name);
/* The variable as a size (strtoull, any base), or def when it is not set. */
size_t lb_env_size(const char* name, size_t def);
/* qsort order of doubles, ascending */
int lb_cmp_double(const void* a, const void* b);
/* The endpoints per comm these cases get: NCCL_MK_OFI_STREAMS, or with 0 (auto) what the ofi
 * transport picks for NCCL_MK_OFI_PROVIDER (tcp;ofi_rxm unless the caller set another). */
int lb_ofi_streams(void);
/* Whether ofi comms get a progress thread here (NCCL_MK_OFI_PROGRESS_THREAD, auto resolved). */
int lb_ofi_progress_thread(void);
/* Runs one case; returns the process exit code (0 pass, 1 fail, 77 skip). */
int lb_run(const struct lb_case* c);

/* A listener's handle through the pipe: sent, or read into ctx->handle (returns 0). */
void lb_tell_handle(struct lb_ctx* ctx, const unsigned char* handle);
int lb_hear_handle(struct lb_ctx* ctx);
/* Connection: the receiver listens (sends the handle) and accepts; the sender connects. */
int lb_accept(struct lb_ctx* ctx);
int lb_connect(struct lb_ctx* ctx);
/* Another connection on the same listen comm and handle (ctx->comm becomes it): the receiver
 * accepts, the sender connects again. */
int lb_reconnect(struct lb_ctx* ctx);
int lb_close(struct lb_ctx* ctx);
/* A second comm the other way round: the sender listens, the receiver connects; *back is
 * the sender's receive comm and the receiver's send comm; *lc the sender's listen comm. */
int lb_open_reverse(struct lb_ctx* ctx, void** lc, struct mk_comm** back);
/* Sets an NCCL_MK_* parameter for this process and reloads the registry (before the comm
 * it is meant for is made). */
void lb_set_param(const char* name, const char* value);
/* Small messages between the two processes, outside the transport. */
void lb_tell(struct lb_ctx* ctx, uint64_t v);
uint64_t lb_hear(struct lb_ctx* ctx);
/* A remote key through the pipes (one-sided cases and benchmarks). */
void lb_tell_rkey(struct lb_ctx* ctx, const struct mk_rkey* k);
struct mk_rkey lb_hear_rkey(struct lb_ctx* ctx);
/* 1 when the peer process has sent something (lb_hear will not block). */
int lb_peer_spoke(struct lb_ctx* ctx);
/* Spins test() until done; returns its error. sizes may be NULL. */
int lb_wait(struct lb_ctx* ctx, struct mk_request* req, size_t* sizes);
/* isend / irecv retried while the transport says "not now". */
int lb_send(struct lb_ctx* ctx, void* buf, size_t size, int tag, struct mk_mr* mr,
            struct mk_request** req);
int lb_recv(struct lb_ctx* ctx, int n, void** bufs, const size_t* sizes, const int* tags,
            struct mk_mr** mrs, struct mk_request** req);
/* The same for at most `seconds`: *req still NULL after them means "not now" all along. */
int lb_send_within(struct lb_ctx* ctx, void* buf, size_t size, int tag, struct mk_mr* mr,
                   double seconds, struct mk_request** req);
int lb_recv_within(struct lb_ctx* ctx, int n, void** bufs, const size_t* sizes, const int* tags,
                   struct mk_mr** mrs, double seconds, struct mk_request** req);
/* Deterministic pseudo-random bytes from (seed, stream); check returns the number of
 * wrong bytes and prints the first. */
void lb_fill(void* buf, size_t len, uint64_t seed, uint64_t stream);
size_t lb_check(const void* buf, size_t len, uint64_t seed, uint64_t stream, const char* what);
/* 1 when buf holds exactly the expected bytes; stops at the first difference, silently. */
int lb_check_quiet(const void* buf, size_t len, uint64_t seed, uint64_t stream);
void* lb_alloc(size_t len);
double lb_now(void);

/* The eager cases (lb_eager.c, lb_unannounced.c). Most set the eager size at both ends,
 * before their comm is made: 16 KiB (the default is 64 KiB), so that their sizes straddle it;
 * lb_eager_bytes is the size in force. */
void lb_eager_on(void);
size_t lb_eager_bytes(void);
/* One receive of one buffer of cap bytes; checks the size and bytes of message `stream`. */
int lb_recv_check(struct lb_ctx* ctx, size_t cap, size_t len, uint64_t stream, int tag);
/* Starts a send of message `stream` (len bytes, tag); *buf must be freed after the wait. */
int lb_send_start(struct lb_ctx* ctx, size_t len, uint64_t stream, int tag, unsigned char** buf,
                  struct mk_request** req);
/* One message of len bytes (`stream`'s bytes), sent and waited for. */
int lb_send_whole(struct lb_ctx* ctx, size_t len, uint64_t stream, int tag);
/* One message the ordinary way first: tcp;ofi_rxm opens its connection on the first send,
 * which needs the receiver to progress; only once it is open can sends complete while the
 * receiver does nothing. */
int lb_warm(struct lb_ctx* ctx);

#define LB_EXPECT(cond)                                                         \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "[%s] %s:%d: failed: %s\n", ctx->is_sender ? "sender" : "receiver", \
              __FILE__, __LINE__, #cond);                                       \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

#define LB_OK(call) LB_EXPECT((call) == 0)

#endif /* MK_LB_H_ */
