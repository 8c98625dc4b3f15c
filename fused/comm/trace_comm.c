/*
 * The trace buffer of a communicator (NCCL_MK_TRACE=1): allocated at ncclMkCommInit, reset
 * before each traced launch, copied out after it and written to
 * NCCL_MK_TRACE_DIR/mk-trace.rank<R>.call<C>.trace. Off (the default): nothing is allocated
 * and mk_trace_comm_begin hands the kernel a NULL pointer, so its helpers cost one branch.
 *
 * Copying out needs the call to have finished, so a traced call synchronises its stream:
 * tracing is for looking, not for timing the whole job. Inside graph capture nothing can be
 * synchronised; the kernel still records and the trace is skipped with one WARN.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err_text.h"
#include "fused_comm.h"
#include "mk_err.h"
#include "mk_log.h"
#include "mk_param.h"
#include "trace.h"

/* Events per lane: a 16384 x 28672 AllGather+GEMM gives each CTA ~110 tiles (~220 producer
 * events); more is kept as the newest (header.dropped says how many were lost). */
#define MK_TRACE_CAPACITY 1024u

/* trace_clock.cu: host CLOCK_REALTIME - this GPU's %globaltimer, in ns. 0 or -1. */
int mk_trace_clock_offset(cudaStream_t stream, int64_t* offset_ns);

struct mk_trace_state {
  struct mk_trace_buf* dev; /* device buffer the kernel writes */
  struct mk_trace_buf* host; /* pinned copy */
  size_t bytes;
  uint64_t calls;
  int warned_capture;
};

int mk_trace_comm_open(struct mk_fused_comm* fc) {
  if (mk_param_int(MK_PARAM_TRACE) == 0) return 0;
  int sms = 0;
  MK_CHECK(mk_cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, fc->dev),
                         "cudaDeviceGetAttribute (SM count)"));
  struct mk_trace_state* t = calloc(1, sizeof(*t));
  if (!t) return -ENOMEM;
  fc->trace = t;
  const char* dir = mk_param_str(MK_PARAM_TRACE_DIR);
  int rc = mk_trace_make_dir(dir);
  if (rc) MK_WARN("trace: cannot create NCCL_MK_TRACE_DIR=%s: %s (the calls run, their traces are lost)", dir,
                  strerror(-rc));
  t->bytes = mk_trace_buf_bytes((uint32_t)sms * MK_TRACE_LANES, MK_TRACE_CAPACITY);
  MK_CHECK(mk_cuda_check(cudaMalloc((void**)&t->dev, t->bytes), "cudaMalloc (trace)"));
  MK_CHECK(mk_cuda_check(cudaHostAlloc((void**)&t->host, t->bytes, cudaHostAllocDefault),
                         "cudaHostAlloc (trace)"));
  memset(t->host, 0, t->bytes);
  mk_trace_init_header(t->host, (uint32_t)fc->rank, (uint32_t)fc->nranks, 0, (uint32_t)sms,
                       MK_TRACE_CAPACITY);
  int64_t offset = 0;
  if (mk_trace_clock_offset(fc->internal, &offset) == 0) t->host->h.clock_offset_ns = offset;
  else MK_WARN("trace: rank %d could not read its GPU clock; its times are not aligned", fc->rank);
  MK_INFO(MK_NCCL_SUBSYS_ALL, "trace: rank %d records %u events per lane on %d SMs (%zu bytes) "
          "into %s", fc->rank, MK_TRACE_CAPACITY, sms, t->bytes,
          mk_param_str(MK_PARAM_TRACE_DIR)[0] ? mk_param_str(MK_PARAM_TRACE_DIR) : ".");
  return 0;
}

void mk_trace_comm_close(struct mk_fused_comm* fc) {
  struct mk_trace_state* t = fc->trace;
  if (!t) return;
  cudaFree(t->dev);
  cudaFreeHost(t->host);
  free(t);
  fc->trace = NULL;
}

int mk_trace_comm_begin(struct mk_fused_comm* fc, uint32_t op, uint32_t m, uint32_t n,
                        cudaStream_t stream, struct mk_trace_buf** dev) {
  struct mk_trace_state* t = fc->trace;
  *dev = NULL;
  if (!t) return 0;
  /* Header and ring table fresh for this call; the event slots need no clearing, the
   * counts say which are valid. */
  struct mk_trace_header* h = &t->host->h;
  h->op = op, h->m = m, h->n = n, h->call = t->calls, h->dropped = 0;
  struct mk_trace_ring* rings = mk_trace_rings(t->host);
  for (uint32_t i = 0; i < h->nrings; i++) rings[i].count = 0, rings[i].opened = 0, rings[i].sm = 0;
  size_t head = (size_t)((char*)mk_trace_events(t->host) - (char*)t->host);
  MK_CHECK(mk_cuda_check(cudaMemcpyAsync(t->dev, t->host, head, cudaMemcpyHostToDevice, stream),
                         "cudaMemcpyAsync (trace header)"));
  *dev = t->dev;
  return 0;
}

/* Copies the device buffer into the pinned copy (the stream must be done with the kernel). */
static int trace_copy_out(struct mk_trace_state* t, cudaStream_t stream) {
  MK_CHECK(mk_cuda_check(cudaMemcpyAsync(t->host, t->dev, t->bytes, cudaMemcpyDeviceToHost, stream),
                         "cudaMemcpyAsync (trace)"));
  return mk_cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (trace)");
}

int mk_trace_comm_end(struct mk_fused_comm* fc, cudaStream_t stream) {
  struct mk_trace_state* t = fc->trace;
  if (!t) return 0;
  uint64_t call = t->calls++;
  if (mk_stream_capturing(stream)) {
    if (!t->warned_capture++)
      MK_WARN("trace: a call inside graph capture is not written (run it outside capture)");
    return 0;
  }
  MK_CHECK(trace_copy_out(t, stream));
  char path[4096];
  mk_trace_file_name(mk_param_str(MK_PARAM_TRACE_DIR), (uint32_t)fc->rank, call, path, sizeof(path));
  if (mk_trace_count_dropped(t->host))
    MK_WARN("trace: %s lost its oldest %llu events (ring full)", path,
            (unsigned long long)t->host->h.dropped);
  /* The call itself is done and correct: a trace that cannot be written (mk_trace_write
   * said why) does not fail it. */
  mk_trace_write(t->host, path);
  return 0;
}

int mk_trace_comm_hang(struct mk_fused_comm* fc, const struct mk_gemm_error* e, const char* account, int peer,
                       uint64_t peer_progress, const char* progress_what) {
  struct mk_trace_state* t = fc->trace;
  struct mk_trace_hang h = {(uint32_t)fc->rank, mk_err_tag_op(e->tag), e->tile, e->flag_index,
                            e->expected, e->seen, peer, peer_progress, progress_what, account};
  /* The kernel exited cleanly on the timeout, so the buffer is complete; the internal
   * stream avoids waiting on whatever the caller queued behind the kernel. */
  if (t) MK_CHECK(trace_copy_out(t, fc->internal));
  char report[8192];
  mk_trace_hang_report(t ? t->host : NULL, &h, 16, report, sizeof(report));
  if (!t) { /* no file unless asked for: the log has it all */
    MK_WARN("hang report:\n%s", report);
    return 0;
  }
  char path[4096];
  mk_trace_file_name(mk_param_str(MK_PARAM_TRACE_DIR), (uint32_t)fc->rank, t->host->h.call, path,
                     sizeof(path) - 16);
  strcat(path, ".hang.txt");
  FILE* f = fopen(path, "w");
  if (f) {
    fputs(report, f);
    fclose(f);
  }
  MK_WARN("trace: hang report in %s:\n%s", f ? path : "(not written)", report);
  return 0;
}
