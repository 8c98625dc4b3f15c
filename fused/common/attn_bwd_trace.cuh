/*
 * NCCL_MK_TRACE in the ring backward's one launch (attn_bwd.cuh's RING kernel; trace.h).
 *
 * That launch has a CTA per item (push slices, start slices, key tiles, end slices), thousands
 * of them, so its trace rings are per SM, not per CTA (the file's `cta` is the SM): each event
 * takes its slot with an atomic on its ring's count (mk_trace_emit_per_sm), whichever CTA of
 * the SM writes it. One CTA fits an SM (168 registers x 384 threads), so a lane's events of
 * one SM still do not overlap in time. Writers: thread 0 on the producer lane (the part
 * waits, the start and end slices, the K/V chunk-flag waits), each consumer warp group's
 * thread 0 on its consumer lane (the wait for the peers' partials), thread 0 after a key tile
 * CTA's closing barrier on the consumer0 lane (the CTA's span), thread 0 of a push CTA on the
 * comm lane.
 *
 * Only the RING kernel has them (TRACED template parameters elsewhere), so the other kernels'
 * code is what it was; in it every step loop's SASS is the same as without the events, and
 * nothing spills. That took inlining the event (called from the noinline waits, a call of its
 * own made them spill a register of the kernel's) and keeping the parts' start times in the
 * CTA's shared note rather than in registers across the parts' calls. Without a trace each
 * place is one branch on the pointer.
 */
#ifndef MK_ATTN_BWD_TRACE_CUH_
#define MK_ATTN_BWD_TRACE_CUH_

#include "attn_bwd_cfg.cuh"
#include "trace.h"

/* When an event begins (0 without a trace: the timer is not read). */
__device__ __forceinline__ uint64_t attn_bwd_trace_begin(const struct mk_attn_bwd_params& p) {
  return p.trace ? globaltimer_ns() : 0;
}

/* The CTA's note in shared memory: when its part (a key tile's work, a push, start or end
 * slice, the call's last wait) began and, for a key tile, what it is. Thread 0 writes and reads
 * it; start times held in registers across the parts' calls made the kernel spill. */
struct attn_bwd_traced_item {
  uint64_t from;
  uint32_t block, steps;
};

/* Thread 0: a part begins now. */
__device__ __forceinline__ void attn_bwd_trace_mark(const struct mk_attn_bwd_params& p, struct attn_bwd_traced_item* t) {
  if (p.trace && threadIdx.x == 0) t->from = globaltimer_ns();
}

/* Thread 0, after the part's closing barrier: its span, a phase event (the push's on the comm
 * lane, the others on the producer lane); flag = the CTA's index in its part. */
__device__ __forceinline__ void attn_bwd_trace_span(const struct mk_attn_bwd_params& p,
                                                    const struct attn_bwd_traced_item* t, uint32_t id, uint32_t item) {
  if (p.trace && threadIdx.x == 0)
    mk_trace_emit_per_sm(p.trace, id == MK_ATTN_BWD_TRACE_PUSH ? MK_TRACE_LANE_COMM : MK_TRACE_LANE_PRODUCER, t->from,
                         id == MK_ATTN_BWD_TRACE_PUSH ? MK_TRACE_COMM_SEND : MK_TRACE_PRODUCER, MK_TRACE_PHASE, id,
                         item, 0, 0);
}

/* Thread 0 of the call's last CTA: its wait for the push CTAs (seen: how many were done). */
__device__ __forceinline__ void attn_bwd_trace_wait_push(const struct mk_attn_bwd_params& p,
                                                         const struct attn_bwd_traced_item* t, int pushed) {
  if (p.trace)
    mk_trace_emit_per_sm(p.trace, MK_TRACE_LANE_PRODUCER, t->from, MK_TRACE_PRODUCER, MK_TRACE_PHASE,
                         MK_ATTN_BWD_TRACE_WAIT_PUSH, 0, (uint64_t)p.push.ctas, pushed ? (uint64_t)p.push.ctas : 0);
}

/* A key tile's CTA: thread 0 notes the work's start and what it is (c or the tile kept in
 * registers until the end made the consumers spill) ... */
__device__ __forceinline__ void attn_bwd_trace_item_begin(const struct mk_attn_bwd_params& p,
                                                          struct attn_bwd_traced_item* t, int block, int steps) {
  if (p.trace && threadIdx.x == 0) t->from = globaltimer_ns(), t->block = (uint32_t)block, t->steps = (uint32_t)steps;
}

/* ... and after the CTA's closing barrier ends the span as a tile event on the consumer0 lane
 * (the CTA's, both groups'; that lane's waits come before the barrier); id = the CTA's index
 * among the key tiles, flag = its block, expected = its steps. */
__device__ __forceinline__ void attn_bwd_trace_item_end(const struct mk_attn_bwd_params& p,
                                                        const struct attn_bwd_traced_item* t, uint32_t c) {
  if (p.trace)
    mk_trace_emit_per_sm(p.trace, MK_TRACE_LANE_CONSUMER0, t->from, MK_TRACE_CONSUMER, MK_TRACE_TILE, c, t->block,
                         t->steps, t->steps);
}

/* A part wait of thread 0 (attn_bwd_part_wait), from `start` to now, id = the word waited for. */
__device__ __forceinline__ void attn_bwd_trace_part_wait(const struct mk_attn_bwd_params& p, uint64_t start,
                                                         uint32_t word, uint64_t want, int ok) {
  if (p.trace)
    mk_trace_emit_per_sm(p.trace, MK_TRACE_LANE_PRODUCER, start, MK_TRACE_PRODUCER, MK_TRACE_PHASE, word, 0, want,
                         ok ? want : 0);
}

#endif /* MK_ATTN_BWD_TRACE_CUH_ */
