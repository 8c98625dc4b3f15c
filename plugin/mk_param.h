/*
 * The one registry of environment variables. Every variable nccl-mk reads is one line of
 * MK_PARAM_LIST: kind, id, environment name, default, bounds (INT) or choices (STR, "a|b|c",
 * "" = any), and one line of doc. Values are read once, validated (a bad value is a WARN
 * naming the variable, and the default is kept), and printed at NCCL_DEBUG=INFO by
 * mk_param_dump. README's table is generated from this list (scripts/param-doc.py) and a
 * unit test checks that they agree.
 */
#ifndef MK_PARAM_H_
#define MK_PARAM_H_

#include <stdint.h>

/* X(kind, id, env, default, min, max, choices, doc) */
#define MK_PARAM_LIST(X)                                                                       \
  X(STR, TRANSPORT, "NCCL_MK_TRANSPORT", "auto", 0, 0, "auto|ofi|ib",                          \
    "net plugin transport; auto picks ib when verbs devices are present, else ofi")            \
  X(STR, OFI_PROVIDER, "NCCL_MK_OFI_PROVIDER", "", 0, 0, "",                                   \
    "libfabric provider; empty picks efa when present, else tcp;ofi_rxm")                      \
  X(INT, OFI_STREAMS, "NCCL_MK_OFI_STREAMS", "0", 0, 8, "",                                  \
    "ofi: endpoints per comm; large messages are striped over them, each progressed by a "    \
    "thread of its own; 0: 2 over tcp (measured best with the progress thread under NCCL on " \
    "2xH200), 1 elsewhere")                                                                    \
  X(INT, PROXY_STREAMS, "NCCL_MK_PROXY_STREAMS", "4", 1, 8, "",                              \
    "fused ops across nodes, ofi: endpoints per proxy connection; each put is striped over "  \
    "them, each progressed by a thread of its own (NCCL's comms keep NCCL_MK_OFI_STREAMS)")   \
  X(INT, PROXY_INFLIGHT_BYTES, "NCCL_MK_PROXY_INFLIGHT_BYTES", "16777216", 1, 1099511627776, "",\
    "fused ops across nodes: data the proxy posts to one peer at once (one descriptor always " \
    "goes); more keeps more streams busy, less lands the first blocks sooner")                  \
  X(INT, OFI_STREAM_THREADS, "NCCL_MK_OFI_STREAM_THREADS", "1", 0, 1, "",                    \
    "ofi: 1 gives streams 1.. a progress thread each; 0 leaves them all to NCCL's thread")    \
  X(INT, OFI_STREAM_POSTS, "NCCL_MK_OFI_STREAM_POSTS", "1", 0, 2, "",                        \
    "ofi: 1 posts a put's and a written message's stripes on streams 1.. from those streams' " \
    "threads (over tcp a post copies its data into the socket; from one thread the proxy "     \
    "moved 4.6-4.7 GB/s each way on the GPU host, from the streams' threads 11-13); 2: a "     \
    "written message's only to threads that have operations in flight (-10..-28% from 4 MiB "\
    "under NCCL on one H200); 0 posts them all from the caller's thread")                      \
  X(INT, OFI_STREAM_LINGER_US, "NCCL_MK_OFI_STREAM_LINGER_US", "0", 0, 1000000, "",         \
    "ofi: a stream's thread keeps polling this many microseconds after its last operation "   \
    "before it sleeps (a sleeping thread takes a wake-up per message, which latency-bound "   \
    "sizes feel); 0 sleeps at once (200: 1 MiB +6%, inside the spread, and -8..-16% from 4 "  \
    "MiB under NCCL on one H200: the polling threads take the cores the copies need)")        \
  X(INT, OFI_PROGRESS_THREAD, "NCCL_MK_OFI_PROGRESS_THREAD", "-1", -1, 2, "",               \
    "ofi: 1 gives each comm a thread that reads stream 0's completions while it has work, so " \
    "NCCL's proxy thread only posts and checks; 2: one such thread per device serves all its " \
    "comms (not measured yet); 0: NCCL's thread progresses inside test(); " \
    "-1: on over tcp when the process may use 8 or more cores (1.5-1.9x busbw from 256 KiB " \
    "under NCCL on 2xH200), off elsewhere")                                                    \
  X(INT, OFI_THREAD_SEND_MIN, "NCCL_MK_OFI_THREAD_SEND_MIN", "16384", 0, 1099511627776, "",     \
    "ofi, with a progress thread: sends of at least this many bytes are posted by that thread "  \
    "(off NCCL's; 32 KiB all_reduce +29% under NCCL on 2xH200), and smaller ones while the "   \
    "thread drives the comm (see NCCL_MK_OFI_CALLER_PROGRESS_MAX; 64 KiB all_reduce -8..-11% "  \
    "under NCCL on one H200), else at once (2-8 KiB lost 15-25% when the thread posted them)") \
  X(INT, OFI_CALLER_PROGRESS_MAX, "NCCL_MK_OFI_CALLER_PROGRESS_MAX", "16384", 0,             \
    1099511627776, "",                                                                         \
    "ofi, with a progress thread: a comm whose last 16 requests each moved fewer bytes than "  \
    "this is read by NCCL's own calls, as with no thread, until a larger one comes (shared "    \
    "with a spinning thread, each small post waited for its locks; 8 B-4 KiB all_reduce "     \
    "-2..-46% under NCCL on one H200); 0: the thread always drives")                           \
  X(INT, OFI_STRIPE_MIN, "NCCL_MK_OFI_STRIPE_MIN", "262144", 0, 1099511627776, "",            \
    "ofi: receive buffers larger than this many bytes are striped over the streams")           \
  X(INT, OFI_EAGER_BYTES, "NCCL_MK_OFI_EAGER_BYTES", "65536", 0, 1048576, "",               \
    "ofi: a send of at most this many bytes whose clear-to-send has not arrived goes at once " \
    "into the receiver's bounce buffers (16 KiB pieces, NCCL_MK_OFI_EAGER_BUFS of them per "  \
    "receive comm), and receives whose buffers all fit send no clear-to-send "                \
    "(NCCL_MK_OFI_NO_CTS_MS); both ends use the smaller value; 0 turns eager off. 65536 "     \
    "against 0 under NCCL on one H200 (5 calls, bench/NOTES.md session 55): 8 B-4 KiB "       \
    "all_reduce 13-40% lower, 32 KiB (with NCCL_MK_OFI_ANNOUNCE_AFTER) and 256 KiB within "  \
    "the spread")                                                                             \
  X(INT, OFI_ANNOUNCE_AFTER, "NCCL_MK_OFI_ANNOUNCE_AFTER", "8192", 0, 1048576, "",          \
    "ofi, with eager on: after a receive that took a message of more than this many bytes, "  \
    "the next receive sends its clear-to-send even when its buffers fit the eager size (its " \
    "message is then written into the buffer instead of copied through a bounce buffer); "   \
    "the eager size or more: only NCCL_MK_OFI_NO_CTS_MS decides (32 KiB all_reduce under "   \
    "NCCL: 113 us against 156-169 with 1048576, session 55)")                                \
  X(INT, OFI_WRITES, "NCCL_MK_OFI_WRITES", "1", 0, 1, "",                                    \
    "ofi: 1 lets a receiver have each message written into its buffer with one RMA write "    \
    "(its clear-to-send carries the address) instead of sent to a posted receive, which over " \
    "tcp;ofi_rxm takes a rendezvous above 16 KiB; needs 8 bytes of remote CQ data from the "   \
    "provider; 0 posts receives for every message")                                           \
  X(INT, OFI_NO_CTS_MS, "NCCL_MK_OFI_NO_CTS_MS", "100", 0, 3600000, "",                       \
    "ofi, with eager on: a receive whose buffers all fit a bounce buffer sends no "           \
    "clear-to-send (its messages come eager) unless nothing has arrived after this many ms; " \
    "0: every receive sends one at once")                                                      \
  X(INT, OFI_WRITE_PIECE_MIN, "NCCL_MK_OFI_WRITE_PIECE_MIN", "262144", 0, 1099511627776, "",  \
    "ofi: a written message is cut evenly over the receive buffer's stripes (one stream each) " \
    "in pieces of at least this many bytes (64 KiB measured the same under NCCL on one H200); " \
    "a large value uses as few stripes as the buffer's cut allows")                           \
  X(INT, OFI_EAGER_BUFS, "NCCL_MK_OFI_EAGER_BUFS", "32", 1, 256, "",                          \
    "ofi: bounce buffers per receive comm, each one 16 KiB piece of an eager message: the "    \
    "pieces a sender may have in flight or unreceived (its credits)")                          \
  X(STR, SOCKET_IFNAME, "NCCL_MK_SOCKET_IFNAME", "", 0, 0, "",                                 \
    "interfaces (NCCL_SOCKET_IFNAME syntax: prefixes, =exact, ^ for all but) for connection "  \
    "setup and, with ofi tcp, the only devices NCCL sees; empty: all but loopback")           \
  X(INT, CONNECT_TIMEOUT_MS, "NCCL_MK_CONNECT_TIMEOUT_MS", "30000", 1, 3600000, "",            \
    "give up on a connection handshake after this many milliseconds")                          \
  X(INT, BYE_GRACE_MS, "NCCL_MK_BYE_GRACE_MS", "1000", 1, 3600000, "",                        \
    "after a peer closed its comm gracefully, how long data it sent may still land before an " \
    "operation still waiting on it fails")                                                     \
  X(INT, NET_SPEED_MBPS, "NCCL_MK_NET_SPEED_MBPS", "0", 0, 100000000, "",                      \
    "link speed reported to NCCL; 0 reads it from the provider or sysfs")                      \
  X(INT, FUSED, "NCCL_MK_FUSED", "1", 0, 1, "",                                                \
    "1: the fused ops overlap communication with the GEMM (a max_m x max(max_k, max_n) bf16 "  \
    "workspace; across hosts also the proxy's pinned host buffers); 0: NCCL's collective, "    \
    "then the GEMM")                                                                           \
  X(INT, MOE_OVERLAP, "NCCL_MK_MOE_OVERLAP", "0", 0, 1, "",                                   \
    "0: the MoE dispatch on every SM, then the grouped GEMM on every SM (faster on 2 H200s); "  \
    "1: the dispatch on 12 SMs beside the GEMM, which starts each expert once its rows are in") \
  X(INT, RA_BWD_MERGED, "NCCL_MK_RA_BWD_MERGED", "1", 0, 1, "",                             \
    "ring attention backward: 1 runs each query range against the own and the peers' blocks " \
    "in one core call whose CTAs wait for the peers' K/V chunks as they land (on one GPU: "    \
    "1.5-4% faster emulated, +4% at 16K and +0% at 64K causal under MPS; not yet run on 2 "   \
    "GPUs); 0: the own block's calls beside the gather, then the peers'")                     \
  X(INT, RA_BWD_OWN_LAST, "NCCL_MK_RA_BWD_OWN_LAST", "1", 0, 1, "",                         \
    "ring attention backward, non-causal: 1 computes the peers' blocks first (their CTAs "      \
    "waiting for each K/V chunk as it lands) and the own block last, whose CTAs add the peers' " \
    "partials as they write dk, dv: no reduce pass (7-11% faster on one GPU, emulated and "      \
    "under MPS; not yet run on 2 GPUs); 0: the plan of NCCL_MK_RA_BWD_MERGED")                  \
  X(INT, RA_BWD_ONE_LAUNCH, "NCCL_MK_RA_BWD_ONE_LAUNCH", "0", 0, 1, "",                     \
    "ring attention backward: 1 runs each backward core call as one kernel (delta and dq_acc's " \
    "zeroing, the key tiles, dq's conversion: three parts of one grid, each waiting for the "   \
    "one before; session 60, one H200: the core alone 0-1% faster, two ranks under MPS 0-1.6% " \
    "slower); 0: three to five kernels per core call")                                          \
  X(INT, RA_BWD_ONE_KERNEL, "NCCL_MK_RA_BWD_ONE_KERNEL", "0", 0, 1, "",                     \
    "ring attention backward on 2-4 ranks (causal: S_local a multiple of 256): 1 runs the "     \
    "whole call as one kernel (the push of this rank's K/V, delta, the peers' blocks, each "     \
    "announced to its owner by its last CTA, the own block with the peers' partials added, dq, " \
    "the call's end; grouped heads at D = 128 take a CTA per query head when the workspace "    \
    "holds their fp32 partials past the call's regions; correct, but 6-27% slower than these "  \
    "plans under MPS, sessions 64 and 66, 2-8% on a whole GPU, session 68; before the plans "  \
    "above); 0: those plans, "                                                               \
    "4 kernels plus the core calls' (NCCL_MK_RA_BWD_ONE_LAUNCH)")                                 \
  X(INT, RA_FWD_CHUNK, "NCCL_MK_RA_FWD_CHUNK", "0", 0, 1048576, "",                          \
    "ring attention forward: the order of its query tiles' CTAs; 0: tiles outermost (causal, "  \
    "under 64 tiles per SM) or head by head; N: in chunks of N tiles, head by head inside "      \
    "(16 took the persistent core +2.2% over head by head at 64K causal on one GPU; not yet "    \
    "run on 2 GPUs)")                                                                            \
  X(INT, RA_FWD_PERSISTENT, "NCCL_MK_RA_FWD_PERSISTENT", "0", 0, 1, "",                     \
    "ring attention forward: 1 runs one attention CTA per SM, each claiming query tiles in "    \
    "turn from a counter (the next tile's loads overlap the last one's end; 2-4% slower with "  \
    "two ranks under MPS on one H200, not yet run on 2 GPUs); 0: one CTA per query tile")     \
  X(INT, TIMEOUT_MS, "NCCL_MK_TIMEOUT_MS", "60000", 1, 86400000, "",                           \
    "bound on every wait inside a fused kernel (an attention kernel's waits on its own "       \
    "warps: 1.5x, so that the error names the peer's missing flag); expiry breaks the "         \
    "communicator. Also how often a WARN says that a non-blocking communicator's "             \
    "ncclInProgress still holds an op's NCCL call (that wait is unbounded, as NCCL's)")        \
  X(INT, LOCAL_SIZE, "NCCL_MK_LOCAL_SIZE", "0", 0, 1048576, "",                               \
    "ranks per emulated node, the others reached through the fused ops' proxy (1: each GPU "     \
    "its own node); 0 = every rank with peer access")                                           \
  X(INT, TRACE, "NCCL_MK_TRACE", "0", 0, 1, "",                                              \
    "1 records every CTA's tiles, chunks and waits in fused kernels (scripts/mk-trace)")      \
  X(STR, NET_TRACE_DIR, "NCCL_MK_NET_TRACE_DIR", "", 0, 0, "",                                \
    "net plugin: write every request's asked/posted/done times and test() count to "          \
    "DIR/mk-net-trace.<pid>.csv and each call's to DIR/mk-net-calls.<pid>.csv at exit "       \
    "(scripts/mk-net-trace summarises); empty: off")                                           \
  X(STR, TRACE_DIR, "NCCL_MK_TRACE_DIR", "", 0, 0, "",                                        \
    "where NCCL_MK_TRACE writes mk-trace.rank<R>.call<C>.trace and hang reports (created "     \
    "if missing); empty: cwd")                                                                 \
  X(INT, DEBUG_DROP_FLAG, "NCCL_MK_DEBUG_DROP_FLAG", "-1", -1, 1048576, "",                   \
    "testing only: AllGather+GEMM's push never raises the peers' flag of this row-block, so "  \
    "they time out and write a hang report; -1: off")                                           \
  X(STR, TUNER_FILE, "NCCL_MK_TUNER_FILE", "", 0, 0, "",                                     \
    "tuning file from scripts/tune.sh; empty or unreadable leaves NCCL's own choices")         \
  X(INT, TUNER_AB, "NCCL_MK_TUNER_AB", "0", 0, 1, "",                                       \
    "testing only: 1 leaves NCCL's choices to the 1st, 3rd, .. communicator the tuner sees in " \
    "a process and applies the file to the 2nd, 4th, ..: the harness's -A times both at once") \
  X(STR, IB_HCA, "NCCL_MK_IB_HCA", "", 0, 0, "",                                               \
    "verbs ports to use, like NCCL_IB_HCA: name[:port],...; ^ excludes, = matches exactly")    \
  X(INT, IB_GID_INDEX, "NCCL_MK_IB_GID_INDEX", "-1", -1, 65535, "",                            \
    "RoCE GID index; -1 picks a RoCE v2 IPv4-mapped GID, else v2, else the first valid")       \
  X(INT, IB_QPS, "NCCL_MK_IB_QPS", "1", 1, 8, "",                                              \
    "RC QPs per connection and rail; every message is striped across them")                   \
  X(INT, IB_TIMEOUT, "NCCL_MK_IB_TIMEOUT", "20", 1, 31, "",                                    \
    "QP local ACK timeout exponent: 4.096 us * 2^value (20 is about 4.3 s)")                   \
  X(INT, IB_RETRY_CNT, "NCCL_MK_IB_RETRY_CNT", "7", 0, 7, "",                                  \
    "QP transport retries before a send fails with a retry-exceeded completion")              \
  X(INT, IB_TC, "NCCL_MK_IB_TC", "0", 0, 255, "",                                              \
    "RoCE traffic class when NCCL gives none")                                                 \
  X(INT, IB_SL, "NCCL_MK_IB_SL", "0", 0, 15, "",                                               \
    "InfiniBand service level")                                                                \
  X(INT, IB_RELAXED_ORDERING, "NCCL_MK_IB_RELAXED_ORDERING", "2", 0, 2, "",                    \
    "register data buffers with relaxed ordering: 0 never; 1 always, but host memory only "   \
    "through ibv_reg_mr_iova2 (without it, as 0 there); 2 when libibverbs has that call")      \
  X(INT, IB_MERGE_NICS, "NCCL_MK_IB_MERGE_NICS", "1", 0, 1, "",                                \
    "present the ports of one NIC as one virtual device")                                      \
  X(STR, NCCL_DEBUG, "NCCL_DEBUG", "", 0, 0, "",                                               \
    "NCCL's own log level; read so that logging works before NCCL hands us its logger")

enum mk_param_id {
#define MK_PARAM_ENUM(kind, id, env, def, lo, hi, choices, doc) MK_PARAM_##id,
  MK_PARAM_LIST(MK_PARAM_ENUM)
#undef MK_PARAM_ENUM
  MK_PARAM_COUNT
};

#ifdef __cplusplus
extern "C" { /* the CUDA tests read parameters too */
#endif

int64_t mk_param_int(enum mk_param_id id);
const char* mk_param_str(enum mk_param_id id);
const char* mk_param_env_name(enum mk_param_id id);
/* INFO line per variable with its value and whether it came from the environment. */
void mk_param_dump(void);
/* Tests only: forget the cached values so the next read sees the environment again. */
void mk_param_reload(void);

#ifdef __cplusplus
}
#endif

#endif /* MK_PARAM_H_ */
