/*
 * NCCL_MK_NET_TRACE_DIR: what NCCL's proxy does with the net plugin, request by request, to
 * find where a collective's time goes between the transport's messages (bench/NOTES.md,
 * session 23: a 128 KiB all_reduce takes 300-440 us through the plugin with ~65 us of message
 * time). Each request gets: when NCCL first asked for it (an isend that returned no request
 * because the clear-to-send had not arrived counts), when it was posted, how many test()
 * calls it took and when one first said done. Off when the variable is empty: one branch per
 * call. Records stay in memory (the first MK_NET_TRACE_MAX of the process) and are written to
 * DIR/mk-net-trace.<pid>.csv at exit; scripts/mk-net-trace summarises them.
 */
#ifndef MK_NET_TRACE_H_
#define MK_NET_TRACE_H_

#include <stddef.h>
#include <stdint.h>

#define MK_NET_TRACE_MAX (1u << 18)

enum mk_net_trace_kind { MK_NET_TRACE_SEND = 0, MK_NET_TRACE_RECV = 1 };

/* 1 when NCCL_MK_NET_TRACE_DIR is set (read once). */
int mk_net_trace_on(void);
/* An isend on comm that returned no request: NCCL will ask again; the first such time is the
 * next posted send's "asked" time. */
void mk_net_trace_attempt(const void* comm);
/* A request was posted on comm: size bytes (a grouped receive: their sum, n buffers) by a
 * call that began at t0 (mk_net_trace_clock). */
void mk_net_trace_post(const void* comm, const void* req, enum mk_net_trace_kind kind, size_t size,
                       int n, int tag, uint64_t t0);
/* A test() of req that began at t0; done as test() reported it. */
void mk_net_trace_test(const void* req, int done, uint64_t t0);
/* How long the plugin's entry points take and what the calling threads do between them: is
 * a slow collective's time spent inside the plugin, or in NCCL's proxy loop between calls
 * (or descheduled: each thread's context switches)? Written to DIR/mk-net-calls.<pid>.csv. */
enum mk_net_call {
  MK_NET_CALL_ISEND,      /* posted a send */
  MK_NET_CALL_ISEND_NONE, /* returned no request: NCCL asks again */
  MK_NET_CALL_IRECV,
  MK_NET_CALL_TEST,       /* not done yet */
  MK_NET_CALL_TEST_DONE,
  MK_NET_CALL_KINDS
};
/* The clock of the trace (ns, CLOCK_MONOTONIC); 0 when the trace is off. */
uint64_t mk_net_trace_clock(void);
/* The calling thread returns from a call of kind that began at t0 (mk_net_trace_clock). */
void mk_net_trace_call(enum mk_net_call kind, uint64_t t0);
/* Writes the records now (also done at exit); returns how many, or a negative errno. */
int mk_net_trace_flush(void);

#endif /* MK_NET_TRACE_H_ */
