/*
 * Private structures of the libfabric transport. Object model (DESIGN.md "Transports"):
 * device = one fabric + domain, opened on first use and shared by its comms, with the
 * domain's registration cache; comm = 1..MK_OFI_MAX_STREAMS "streams", each an RDM endpoint
 * + CQ + AV of its own (progress of one never contends with another), a mutex (NCCL's
 * service thread may register while the progress thread sends), and the side-channel socket
 * kept open as dead-peer detector. Stream 0 carries everything up to 64 KiB and all
 * control; it is progressed by the comm's progress thread (ofi_progress.c; over tcp by
 * default) or else by NCCL's thread inside test(), as with one stream. Larger
 * messages start on a rotating stream and those above NCCL_MK_OFI_STRIPE_MIN are striped
 * over all; streams 1.. each have a helper thread that progresses its CQ while it has
 * operations posted (manual data progress: the bytes are copied inside fi_cq_read, so one
 * thread per stream is what spreads the copies over cores).
 */
#ifndef MK_OFI_H_
#define MK_OFI_H_

#include <pthread.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "eager.h"
#include "mk_clock.h"
#include "mr_cache.h"
#include "proto.h"
#include "req_pool.h"
#include "sock.h"
#include "transport.h"

#define MK_OFI_MAX_DEVS 16
#define MK_OFI_MAX_P2P_BYTES (1ull << 40) /* 1 TiB cap on what we advertise */
#define MK_OFI_FALLBACK_SPEED_MBPS 10000   /* NCCL's socket transport assumes the same */
#define MK_OFI_PEER_CHECK_NS 1000000ull    /* dead-peer check at most once per ms */
/* Control receives a send comm keeps posted: one clear-to-send per receive the peer can have
 * posted, plus the one credit-only message it can have in flight, plus slack. */
#define MK_OFI_CTRL_BUFS (MK_MAX_REQUESTS + 4)
/* Receives with written entries, by sequence number: twice the live receives, so that one
 * still live from long ago rarely shares a slot (a receive that would falls back to posted
 * receives); divides 2^16, the sequence bits a write carries. */
#define MK_OFI_WRITTEN_SLOTS (2 * MK_MAX_REQUESTS)

/* The libfabric functions we call by symbol: everything else goes through the providers'
 * ops tables (the header's inline helpers), so the .so has no load-time link to libfabric. */
struct ofi_syms {
  void* lib;
  int (*getinfo)(uint32_t version, const char* node, const char* service, uint64_t flags,
                 const struct fi_info* hints, struct fi_info** info);
  void (*freeinfo)(struct fi_info* info);
  struct fi_info* (*dupinfo)(const struct fi_info* info);
  int (*fabric)(struct fi_fabric_attr* attr, struct fid_fabric** fabric, void* context);
  const char* (*strerror)(int errnum);
  uint32_t (*version)(void);
};
extern struct ofi_syms ofi_sym;
int ofi_syms_load(void);
void ofi_syms_unload(void);
/* fi_allocinfo() is an inline calling fi_dupinfo: this is the same through the table. */
static inline struct fi_info* ofi_allocinfo(void) { return ofi_sym.dupinfo(NULL); }

struct ofi_comm;

/* Who reads a comm's stream-0 completions (NCCL_MK_OFI_PROGRESS_THREAD). */
enum ofi_progress_mode {
  OFI_PROGRESS_NCCL = 0,   /* NCCL's thread, inside test() and isend */
  OFI_PROGRESS_COMM = 1,   /* a thread of the comm's own */
  OFI_PROGRESS_DEVICE = 2, /* one thread per device serving all its comms */
};

/* A progress thread and the comms it serves (ofi_progress.c): a comm's own (one comm) or a
 * device's (all its comms in OFI_PROGRESS_DEVICE mode). */
struct ofi_runner {
  pthread_mutex_t life_mu;     /* starting and stopping the thread */
  pthread_mutex_t list_mu;     /* comms[]; held while the thread steps through them */
  pthread_mutex_t sleep_mu;    /* only to sleep on cv */
  pthread_cond_t cv;
  pthread_t thread;
  int running;                 /* started and not yet joined (under life_mu) */
  int stop;                    /* atomic: asks the thread to leave */
  unsigned gen;                /* atomic: bumped by every post; it sleeps only while unchanged */
  int sleeping;                /* atomic: it is (about to be) waiting on cv */
  struct ofi_comm** comms;
  int ncomms, cap;
};
void ofi_runner_init(struct ofi_runner* r);
/* Joins a thread still running (comms never closed), then frees r's resources. */
void ofi_runner_destroy(struct ofi_runner* r);

struct ofi_dev {
  struct fi_info* info; /* this device's entry (our own copy) */
  char name[64];
  pthread_mutex_t lock; /* opening the domain */
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct mk_mr_cache mr_cache;
  uint64_t next_key;    /* user-chosen MR keys when the provider does not pick them */
  /* What the provider reported, which drives behaviour. */
  int mr_local, mr_virt_addr, mr_prov_key, mr_allocated, hmem, delivery_complete;
  int can_write_data;   /* FI_RMA with 8 bytes of remote CQ data: messages may be written */
  size_t max_msg_size;
  struct ofi_runner runner; /* OFI_PROGRESS_DEVICE: the one progress thread of its comms */
};

struct ofi_state {
  uint32_t api_version;
  int ndev;
  struct ofi_dev devs[MK_OFI_MAX_DEVS];
};
extern struct ofi_state ofi;

int ofi_dev_open(struct ofi_dev* dev);

struct ofi_req;

/* What a completion means; one per posted libfabric operation. */
enum ofi_op_kind {
  OFI_OP_SEND,
  OFI_OP_RECV,
  OFI_OP_CTS_SEND,
  OFI_OP_CTRL_RECV,
  OFI_OP_PUT,
  OFI_OP_SIGNAL,
  OFI_OP_EAGER_RECV,
  OFI_OP_CREDIT_SEND,
  OFI_OP_WRITE_SEND,
  OFI_OP_CONNECT,   /* a stream's connection formed ahead: no request */
  OFI_OP_FLUSH_SEND /* a closing sender's request for its credits */
};

struct ofi_op {
  struct fi_context2 ctx; /* first: libfabric hands this pointer back in the CQ entry */
  struct ofi_req* req;    /* NULL for the send comm's control receives */
  uint8_t kind;
  uint8_t idx;            /* entry of a grouped receive */
  uint8_t stripe;         /* stripe of that entry = the stream it was posted on */
  uint8_t cancelled;      /* a recv whose message came eager: its FI_ECANCELED is no error */
  uint8_t last;           /* a written send's last piece (its remote CQ data says so) */
  /* a put stripe handed to its stream's thread (ofi_stream_post_later): what to write */
  void* buf;
  size_t len;
  void* desc;
  struct ofi_op* next_post;
};

/* Data ops: entry i, stripe k at OFI_OP_AT(i, k); the clear-to-send after all of them. */
#define OFI_OP_AT(i, k) ((i) * MK_OFI_MAX_STREAMS + (k))
#define OFI_OP_CTS_AT (MK_MAX_RECVS * MK_OFI_MAX_STREAMS)
/* A put's stripes sit at OFI_OP_AT(0, k); its signal takes the slot a put has no use for. */
#define OFI_OP_SIGNAL_AT OFI_OP_CTS_AT

enum ofi_req_kind { OFI_REQ_SEND, OFI_REQ_RECV, OFI_REQ_PUT };

struct ofi_req {
  struct mk_request base;
  int kind;
  int pending;                 /* posted operations without a completion yet (atomic: the
                                  stream threads complete stripes) */
  int error;                   /* first error reported by a completion (atomic, first wins) */
  int n;
  size_t sizes[MK_MAX_RECVS];  /* recv: bytes that landed, summed over stripes (atomic);
                                  send/put: bytes sent */
  struct ofi_op ops[OFI_OP_CTS_AT + 1];
  struct mk_ofi_cts cts;       /* recv: the clear-to-send we post (lives until it completes) */
  uint64_t signal_value;       /* put_signal: the 8 bytes written after the data */
  uint64_t signal_addr, signal_key;
  uint64_t flags;              /* FI_DELIVERY_COMPLETE when the provider has it */
  const char* put_src;         /* put, written send: the source, and where its first byte lands */
  uint64_t put_addr, put_key;
  uint32_t write_seq;          /* written send: the receive it goes to (its remote CQ data) */
  int signal_waiting;          /* put_signal: signal not posted yet (data stripes still
                                  pending, or EAGAIN) */
  int cts_waiting;             /* recv: clear-to-send not posted yet (EAGAIN, or left to the
                                  progress thread) */
  /* send left to the progress thread (ofi_send_post): entry send_idx of the clear-to-send
   * copied into cts, from send_data (sizes[0] bytes) */
  int send_waiting;
  uint8_t send_next;           /* its first stripe not posted yet (0: none posted) */
  uint64_t send_deadline;      /* a later stripe found no room: give up after this (ns) */
  int send_idx;
  void* send_data;
  void* send_desc;
  /* recv, eager (ofi_eager.c): */
  void* data[MK_MAX_RECVS];    /* where each entry's bytes go */
  uint32_t msn0;               /* message number of entry 0's message */
  uint8_t eager_done;          /* leading messages of this receive delivered from bounces */
  uint8_t eager_active;        /* its next one has pieces in, not all (version 7): */
  uint8_t eager_entry;         /*   the entry it took */
  uint8_t eager_bad;           /*   it does not fit that buffer (-EMSGSIZE) */
  struct mk_ofi_pieces eager_pieces; /* its pieces so far */
  uint8_t eager_mask;          /* the entries they took */
  uint8_t posted_mask;         /* entries whose stripes are posted (cancelled on eager) */
  uint8_t posting;             /* stripes being posted: eager arrivals wait in the queue */
  uint8_t unannounced;         /* no clear-to-send sent yet (version 7): its messages come
                                  eager, each counted in pending until it is delivered */
  uint64_t announce_ns;        /* unannounced: when it sends its clear-to-send after all */
  struct mk_mr* mrs[MK_MAX_RECVS]; /* the buffers' registrations: their stripes are posted
                                      (or written) when the receive is announced, which an
                                      unannounced one does late */
  uint8_t tail_from[MK_MAX_RECVS]; /* recv: entry i's message ended before stripe
                                      tail_from[i] (atomic; 0: not seen) */
  uint8_t tail_cancelled;      /* recv: entries whose later stripes were cancelled */
};

/* A receive comm's bounce buffer for one eager message. */
struct ofi_bounce {
  struct ofi_op op;            /* first: the CQ entry's context */
  char* buf;                   /* a piece (ofi_bounce_len) inside the comm's bounce region */
  int unposted;                /* its repost met EAGAIN: retried from progress */
  int credit_due;              /* held a consumed message: a credit once reposted */
};

struct ofi_ctrl_buf {
  struct ofi_op op;
  struct mk_ofi_cts cts;
};

/* A clear-to-send the sender has received, indexed by seq % MK_MAX_REQUESTS. */
struct ofi_cts_slot {
  int valid;
  uint32_t matched; /* bit i: entry i has been given a send */
  struct mk_ofi_cts cts;
};

/* One endpoint of a comm. Fields below `thread` are shared with its helper thread. */
struct ofi_stream {
  struct ofi_comm* comm;
  struct fid_ep* ep;
  struct fid_cq* cq;
  struct fid_av* av;
  fi_addr_t peer;
  uint8_t addr[MK_OFI_ADDR_MAX];
  size_t addr_len;
  pthread_t thread;
  int has_thread;             /* streams 1..: started once the handshake is done */
  int can_wait;               /* its CQ has a wait object: the thread may sleep in sread */
  pthread_mutex_t mu;         /* only to sleep on cv when nothing is posted */
  pthread_cond_t cv;
  int active;                 /* atomic: posted operations not completed yet */
  int stop;                   /* atomic: close asks the thread to leave */
  int error;                  /* atomic: the connection failed (-ECONNRESET / -EIO) */
  /* ofi_streams_connect_ahead: send side, the thread retries the 0-byte send until this
   * deadline (atomic, 0 once posted or given up); both sides, the op it completes */
  uint64_t connect_deadline_ns;
  struct ofi_op connect_op;
  int connected_ahead; /* atomic: connect_op completed without error */
  /* put stripes its thread posts (NCCL_MK_OFI_STREAM_POSTS), oldest first; under mu */
  struct ofi_op *posts_head, *posts_tail;
  uint64_t posts_refused_since; /* the thread's: first EAGAIN of the head, 0 when none */
};

struct ofi_comm {
  struct mk_comm base;
  int is_send;
  struct ofi_dev* dev;
  pthread_mutex_t lock;
  int nstreams;               /* opened; after the handshake, the number both ends use */
  struct ofi_stream st[MK_OFI_MAX_STREAMS];
  uint64_t stripe_min;        /* recv: NCCL_MK_OFI_STRIPE_MIN, read once */
  uint64_t thread_send_min;   /* send: NCCL_MK_OFI_THREAD_SEND_MIN, read once */
  int sock;
  int error;                  /* sticky: once the peer is gone every op returns it */
  enum mk_peer_state peer_state;
  uint64_t last_check_ns, bye_ns;
  struct mk_req_pool pool;
  struct fid_mr* pool_mr;     /* FI_MR_LOCAL: our own buffers inside requests */
  void* pool_desc;
  uint32_t seq;               /* recv: next receive; send: receive the next send goes to */
  struct ofi_ctrl_buf* ctrl;  /* send: MK_MAX_REQUESTS posted clear-to-send receives */
  struct fid_mr* ctrl_mr;
  void* ctrl_desc;
  uint64_t ctrl_unposted;     /* bit k: ctrl[k] could not be reposted yet (EAGAIN) */
  int signals_waiting;        /* put_signal requests whose signal is not posted yet: */
  struct ofi_req** sig_wait;  /*   those requests (one slot per request of the pool) */
  int streams_awake;          /* a put target: streams 1.. progressed without posts */
  int cts_waiting;            /* receive requests whose clear-to-send is not posted yet */
  int sends_waiting;          /* send requests the progress thread has not posted yet */
  struct ofi_cts_slot slots[MK_MAX_REQUESTS];
  /* eager (ofi_eager.c; the rules in eager.h) */
  uint32_t eager_bytes;       /* negotiated largest eager message; 0: eager is off */
  uint32_t msn;               /* send: the next message; recv: first message of the next receive */
  struct mk_ofi_credits credits; /* send: bounce buffers of the peer we may fill */
  int32_t sent_tags[MK_OFI_TAG_RING]; /* send: user tag of message m at m % MK_OFI_TAG_RING */
  uint32_t nbounce;           /* recv: bounce buffers */
  struct ofi_bounce* bounce;
  char* bounce_mem;           /* nbounce pieces, then the credit-only message */
  struct fid_mr* bounce_mr;
  void* bounce_desc;
  int bounce_unposted;        /* bounces whose repost met EAGAIN */
  struct mk_ofi_uq uq;        /* recv: eager messages waiting for their receive */
  struct mk_ofi_owed owed;    /* recv: credits to return */
  struct ofi_ctrl_buf* credit_msg; /* recv: inside bounce_mem */
  int credit_busy;            /* the credit-only message is in flight */
  int flush_asked;            /* recv: the sender is closing: owed credits go back at once */
  struct ofi_op flush_op;     /* send: the flush request (ofi_eager_close.c) */
  uint64_t n_credit_msgs;     /* recv: credit-only messages sent */
  struct ofi_req* rx[MK_MAX_REQUESTS]; /* recv: live receives in posting order */
  uint64_t no_cts_ns;                  /* recv: NCCL_MK_OFI_NO_CTS_MS in ns (0: every receive sends
                                          its clear-to-send at once) */
  int unannounced;                     /* recv: receives without a clear-to-send still waiting */
  /* messages written with RMA (ofi_write.c): both ends offered them */
  int write_data;
  struct ofi_req* written_rx[MK_OFI_WRITTEN_SLOTS]; /* recv: by seq % MK_OFI_WRITTEN_SLOTS,
                                                       the live receives with written entries
                                                       (atomic) */
  int tails_pending;          /* recv: entries whose later stripes await cancelling (atomic) */
  uint32_t nrx;
  int connect_ahead;          /* the hint: form the streams' connections after the handshake */
  int stream_posts;           /* NCCL_MK_OFI_STREAM_POSTS: streams' threads post put stripes */
  uint64_t stream_linger_ns;  /* NCCL_MK_OFI_STREAM_LINGER_US, in ns: the threads poll on */
  /* the progress thread (ofi_progress.c): while runner is set, stream 0's CQ is read by it
   * (always under lock) and NCCL's calls only post and look at their requests */
  int progress_wanted;        /* decided at creation (hint, parameter, provider): an
                                 enum ofi_progress_mode */
  struct ofi_runner* runner;  /* own_runner, the device's, or NULL (NCCL's thread reads) */
  struct ofi_runner own_runner;
  int runner_idle;            /* atomic: its runner found nothing to do (a post clears it) */
  /* atomic: the runner stands aside and NCCL's calls read stream 0's CQ themselves, as with
   * no thread: its last requests were all small (ofi_progress_observe), where sharing the
   * comm (our lock, the provider's) with a spinning thread costs more than it saves */
  int caller_progress;
  uint32_t small_streak;      /* requests in a row below caller_progress_max (under lock) */
  uint64_t caller_progress_max; /* NCCL_MK_OFI_CALLER_PROGRESS_MAX */
  int callers;                /* atomic: calls waiting for the lock (the thread lets them in) */
  int lock_wanted;            /* atomic: a call that went back without the lock (ofi_call_lock) */
  uint64_t n_sent_back;       /* atomic: NCCL's calls that went back without the lock */
  int asking;                 /* send: NCCL asked for a send whose clear-to-send is missing */
  /* counts, logged at close: messages sent or received eager and through a clear-to-send;
   * recv: eager ones that waited for their receive, and that crossed its clear-to-send */
  uint64_t n_eager, n_cts, n_queued, n_crossed;
  uint32_t cts_idle_reads;  /* send: isend CQ reads in a row that found no clear-to-send */
  uint64_t n_reads_skipped; /* send: isends that went eager without that read */
  int recv_took_large;      /* recv: its last finished receive took a message > announce_after */
  uint64_t announce_after; /* recv: NCCL_MK_OFI_ANNOUNCE_AFTER */
  uint64_t n_unannounced, n_late; /* recv: receives posted without a clear-to-send, and those
                                     of them that sent it after all */
  uint64_t n_written;         /* messages sent (send) or announced (recv) as written */
  uint64_t n_pieces;          /* their pieces posted (send) or landed (recv; atomic) */
  uint64_t write_piece_min;   /* send: NCCL_MK_OFI_WRITE_PIECE_MIN, read once */
  uint64_t n_resumed;         /* deferred sends resumed after a later stripe found no room */
  uint64_t n_thread_sends;    /* send: sends left to the progress thread to post */
  struct ofi_comm *live_prev, *live_next; /* every comm not yet destroyed (ofi_ep.c) */
};

/* ofi_stream.c: per-stream endpoints and their helper threads. */
int ofi_stream_open(struct ofi_comm* c, struct ofi_stream* st);
void ofi_stream_close_ep(struct ofi_stream* st);
void ofi_stream_close_rest(struct ofi_stream* st);
int ofi_streams_start(struct ofi_comm* c);
/* After the handshake, with the streams' threads running: every stream 1.. forms its fabric
 * connection now, each on its own thread (the hint connect_ahead). */
void ofi_streams_connect_ahead(struct ofi_comm* c);
/* Asks every helper thread to leave and joins it; safe to call twice. */
void ofi_streams_stop(struct ofi_comm* c);
/* Hands a put stripe (op->buf, len, desc set) to st's thread, which posts it: over tcp the
 * post itself copies the data into the socket, so one poster serialised every stream's
 * copies. Counts as posted (busy) at once. */
void ofi_stream_post_later(struct ofi_stream* st, struct ofi_op* op);
/* Around posting an operation on st: wakes its thread, undone when the post failed. */
void ofi_stream_busy(struct ofi_stream* st);
void ofi_stream_idle(struct ofi_stream* st);
/* One batch of st's completions; how many were handled. Errors land in st->error. */
int ofi_stream_poll(struct ofi_stream* st, int block);
/* A comm that puts land on: its helper threads keep reading their CQs until close. */
void ofi_streams_keep_awake(struct ofi_comm* c);
/* Completion accounting shared by both progress paths. */
void ofi_req_complete(struct ofi_req* r, const struct ofi_op* op, size_t len, int err);
int ofi_errno_of(int fi_err);

/* ofi_progress.c: the comm's progress thread (NCCL_MK_OFI_PROGRESS_THREAD). Started after
 * the handshake (the comm joins its runner); stopped before close takes the comm lock (the
 * comm leaves it; the thread is joined once it serves no comm). wake: something was posted
 * or asked for (caller holds c->lock). */
int ofi_progress_start(struct ofi_comm* c);
void ofi_progress_stop(struct ofi_comm* c);
void ofi_progress_wake(struct ofi_comm* c);
/* A request of bytes bytes completed, or a send that the thread posts was asked for (caller
 * holds c->lock): moves the comm between its thread and NCCL's calls
 * (mk_ofi_caller_progress_step). */
void ofi_progress_observe(struct ofi_comm* c, uint64_t bytes);
/* Whether c's progress thread reads its completions now (else NCCL's calls do). */
static inline int ofi_runner_drives(const struct ofi_comm* c) {
  return c->runner && !__atomic_load_n(&c->caller_progress, __ATOMIC_ACQUIRE);
}
/* Asks a helper thread that sleeps on (mu, cv) when idle to leave (*stop = 1 under mu, so it
 * cannot miss the wake-up between its check and its wait), wakes it, and joins it. */
static inline void ofi_thread_stop_join(pthread_mutex_t* mu, pthread_cond_t* cv, int* stop, pthread_t thread) {
  pthread_mutex_lock(mu);
  __atomic_store_n(stop, 1, __ATOMIC_SEQ_CST);
  pthread_cond_signal(cv);
  pthread_mutex_unlock(mu);
  pthread_join(thread, NULL);
}

/* The comm lock as NCCL's calls take it: announced, so that a spinning progress thread
 * steps aside instead of taking it again at once. */
static inline void ofi_cpu_relax(void) {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}
/* The thread holds the lock for one CQ read at a time (microseconds) and then lets callers
 * in: spinning for it costs less than a futex sleep and wake-up. */
#define OFI_LOCK_SPINS 2048
static inline void ofi_comm_lock(struct ofi_comm* c) {
  if (pthread_mutex_trylock(&c->lock) == 0) return;
  __atomic_add_fetch(&c->callers, 1, __ATOMIC_ACQ_REL);
  int got = 0;
  for (int i = 0; i < OFI_LOCK_SPINS && !got; i++) {
    ofi_cpu_relax();
    got = pthread_mutex_trylock(&c->lock) == 0;
  }
  if (!got) pthread_mutex_lock(&c->lock);
  __atomic_sub_fetch(&c->callers, 1, __ATOMIC_ACQ_REL);
}

/* The lock for NCCL's isend, irecv and test: on a comm the progress thread drives, only if
 * it comes within a short spin; else 0, and the thread lets the call in at its next turn
 * (lock_wanted): NCCL repeats a post that gave no request and a test that found nothing, and
 * meanwhile serves its other requests instead of waiting here while the thread posts a large
 * write (12.5 us per 128 KiB isend at 1 MiB, bench/NOTES.md session 57). */
#define OFI_CALL_LOCK_SPINS 64
static inline int ofi_call_lock(struct ofi_comm* c) {
  if (!ofi_runner_drives(c)) {
    ofi_comm_lock(c);
    return 1;
  }
  for (int i = 0; i < OFI_CALL_LOCK_SPINS; i++) {
    if (pthread_mutex_trylock(&c->lock) == 0) {
      __atomic_store_n(&c->lock_wanted, 0, __ATOMIC_RELEASE);
      return 1;
    }
    ofi_cpu_relax();
  }
  __atomic_store_n(&c->lock_wanted, 1, __ATOMIC_RELEASE);
  __atomic_add_fetch(&c->n_sent_back, 1, __ATOMIC_RELAXED);
  return 0;
}

/* The comm fails with rc; its first error stays. Callers hold c->lock; the store is atomic
 * because test() reads c->error without the lock while a progress thread drives the comm. */
static inline void ofi_comm_fail(struct ofi_comm* c, int rc) {
  if (!c->error) __atomic_store_n(&c->error, rc, __ATOMIC_RELAXED);
}

/* ofi_ep.c: a comm's endpoint resources. */
int ofi_thread_cores(void);
int ofi_streams_default(const struct ofi_dev* dev);
int ofi_comm_create(struct ofi_dev* dev, int is_send, struct ofi_comm** out);
/* Closes the provider objects of a comm (endpoint first), leaving the comm itself. */
void ofi_comm_close_fabric(struct ofi_comm* c);
void ofi_comm_destroy(struct ofi_comm* c);
/* Stops the progress and stream threads of every comm not yet destroyed (joined): at fini,
 * for comms NCCL never closed (an abort), before the domain and libfabric go. */
void ofi_comms_stop_threads(void);
/* Calls fn on every other comm not yet closed whose lock is free, under that lock; skips the
 * rest, and does nothing when the list is busy: never blocks, whatever locks the caller holds. */
void ofi_comms_visit_idle(const struct ofi_comm* self, void (*fn)(struct ofi_comm*));
int ofi_comm_set_peer(struct ofi_comm* c, int k, const uint8_t* addr, size_t len);
int ofi_ctrl_post(struct ofi_comm* c, unsigned k);
/* FI_MR_LOCAL: registers a buffer of ours (no-op otherwise). */
int ofi_internal_reg(struct ofi_comm* c, void* buf, size_t len, struct fid_mr** mr, void** desc);
/* ofi_cq.c: reads the CQ and dispatches completions; returns how many it handled. */
int ofi_cq_progress(struct ofi_comm* c);
/* Rate-limited dead-peer check for an op that is waiting; returns c->error. */
int ofi_peer_check(struct ofi_comm* c);
/* The peer closed its end on purpose (its side channel said "bye"). */
int ofi_peer_bye(struct ofi_comm* c);
/* ofi_rma.c: the signal write of a put_signal, once its data write has completed. */
int ofi_signal_post(struct ofi_comm* c, struct ofi_req* r);
/* ofi_rma.c: the RMA write of one stripe of a put (buf inside the put's source) on stream st. */
ssize_t ofi_put_stripe_write(struct ofi_stream* st, struct ofi_op* op, void* buf, size_t len,
                             void* desc);
/* ofi_data.c: one stripe of a send, receive or put (op->kind) on stream k, in order. What
 * its EAGAIN means depends on what was posted before it: */
enum ofi_post_mode {
  OFI_POST_FIRST,     /* nothing of the message yet: it may still be abandoned, -FI_EAGAIN
                       * comes back with nothing posted */
  OFI_POST_RESUMABLE, /* a later stripe of a send the progress thread resumes from this one:
                       * -FI_EAGAIN comes back; any other failure fails the comm */
  OFI_POST_WAITED,    /* any other later stripe: EAGAIN is waited out (bounded); a failure
                       * fails the comm (the earlier stripes stay with the provider) */
};
int ofi_stripe_post_in_turn(struct ofi_comm* c, enum ofi_post_mode mode, unsigned k, void* buf,
                            size_t len, void* desc, uint64_t tag, struct ofi_op* op);
/* ofi_rma.c: registrations. */
void* ofi_mr_desc(struct mk_mr* mr);
int ofi_mr_check(struct ofi_comm* c, struct mk_mr* mr, const void* data, size_t size);
int ofi_mr_remote(struct mk_mr* mr, const void* data, uint64_t* addr, uint64_t* key);
/* ofi_data.c */
void ofi_req_release(struct ofi_comm* c, struct ofi_req* r);
/* How a receive cuts entry i's buffer of size bytes (mk_ofi_stripe_plan), written into its
 * clear-to-send: stripe k rides stream k (stream0 = 0 since version 4). Posted and written
 * entries alike. */
void ofi_recv_plan(const struct ofi_comm* c, struct mk_ofi_cts* cts, int i, size_t size);
int ofi_cts_post(struct ofi_comm* c, struct ofi_req* r);
/* Receives posted without a clear-to-send (version 7) whose NCCL_MK_OFI_NO_CTS_MS has passed
 * with messages still missing post their buffers and send it after all. */
int ofi_recv_announce_late(struct ofi_comm* c);
/* The progress thread posts a send left to it; 1: not now (EAGAIN, nothing posted). */
int ofi_send_deferred_post(struct ofi_comm* c, struct ofi_req* r);
/* ofi_write.c: messages written with RMA (protocol version 5). Handshake: what our hello
 * offers, then what both ends agreed on. */
void ofi_write_offer(const struct ofi_comm* c, struct mk_ofi_hello* out);
void ofi_write_agree(struct ofi_comm* c, const struct mk_ofi_hello* ours,
                     const struct mk_ofi_hello* theirs);
/* Whether receive seq may have written entries (writes agreed, its slot free), and then
 * whether its entry (buffer data, size bytes, registration mr) is to be written. */
int ofi_write_slot_free(const struct ofi_comm* c, uint32_t seq);
int ofi_write_wanted(const struct ofi_comm* c, const void* data, size_t size, struct mk_mr* mr);
/* Receive side: entry i of r is written, nothing posted; its clear-to-send fields, pending
 * count and streams are set up (call once every posted entry is in, before the clear-to-send). */
int ofi_write_expect(struct ofi_comm* c, struct ofi_req* r, int i, void* data, size_t size,
                     struct mk_mr* mr);
/* Written entry i's message came eager instead (it crossed the clear-to-send): no write
 * will come for it. */
void ofi_write_unexpect(struct ofi_comm* c, struct ofi_req* r, int i);
/* A completion with no operation of ours arrived on stream k (any thread), with its CQ flags
 * and data: a written stripe's remote CQ data, counted. <0: it is not one, or it names no
 * stripe we expect (the comm is out of step). */
int ofi_write_landed(struct ofi_comm* c, unsigned k, uint64_t flags, uint64_t imm);
/* A receive is over: no write may name it any more. */
void ofi_write_forget(struct ofi_comm* c, struct ofi_req* r);
/* Send side: the pieces of a written send of size bytes from data into entry i of cts, from
 * piece k0 on; returns as the data path's stripes do (ofi_data.c, ofi_send_stripes). */
int ofi_write_send_pieces(struct ofi_comm* c, struct ofi_req* r, const struct mk_ofi_cts* cts,
                          int i, char* data, size_t size, void* desc, unsigned k0, int resumable);
/* ofi_eager.c. Handshake: what our hello offers, then what both ends agreed on. */
void ofi_eager_offer(const struct ofi_comm* c, struct mk_ofi_hello* out);
int ofi_eager_agree(struct ofi_comm* c, const struct mk_ofi_hello* ours,
                    const struct mk_ofi_hello* theirs);
/* ofi_eager_close.c: a send comm's close waits (bounded) for its credits, asking for them. */
void ofi_eager_close_drain(struct ofi_comm* c);
void ofi_eager_close_fabric(struct ofi_comm* c);
void ofi_eager_destroy(struct ofi_comm* c);
/* Receive side: a bounce buffer completed; the leading messages of a receive being posted;
 * deferred reposts and credit returns; receive bookkeeping. */
int ofi_eager_arrived(struct ofi_comm* c, struct ofi_bounce* b, uint64_t tag, size_t len);
int ofi_eager_drain(struct ofi_comm* c);
int ofi_eager_retry(struct ofi_comm* c);
int ofi_rx_add(struct ofi_comm* c, struct ofi_req* r);
/* Cancels entry i's stripes from..nstripes-1 (nothing will match them); each FI_ECANCELED
 * completion then counts as that stripe being done. */
int ofi_recv_cancel_stripes(struct ofi_comm* c, struct ofi_req* r, int i, unsigned from);
/* Cancels the stripes after the end of every message that ended early (tails_pending). */
int ofi_recv_cancel_tails(struct ofi_comm* c);
void ofi_rx_remove(struct ofi_comm* c, struct ofi_req* r);
/* Send side: an eager send (1: not now), and a clear-to-send arriving. */
int ofi_eager_send(struct ofi_comm* c, void* data, size_t size, int tag, struct mk_mr* mr,
                   struct ofi_req** out);
int ofi_eager_cts(struct ofi_comm* c, const struct mk_ofi_cts* cts, struct ofi_cts_slot* s);

static inline int ofi_rc(ssize_t fi_rc) { return fi_rc < 0 ? (int)fi_rc : 0; }

#endif /* MK_OFI_H_ */
