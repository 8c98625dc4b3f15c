/*
 * The tuning file (NCCL_MK_TUNER_FILE), written by scripts/tune.sh. Plain text, one record
 * per line, fields separated by blanks, '#' starts a comment:
 *
 *   # collective nranks nnodes bytes algo proto nchannels time_us
 *   allreduce 2 1 1048576 ring simple 0 21.4
 *   # fused op m n k comm_sms chunk_bytes time_us
 *   fused allgather_gemm 4096 8192 8192 16 1048576 812.5
 *   # collective nranks nnodes bytes keep: NCCL's own choice stands within 2x of this size
 *   allreduce 2 1 524288 keep
 *
 * collective: broadcast reduce allgather reducescatter allreduce
 * algo:       tree ring collnet_direct collnet_chain nvls nvls_tree pat
 * proto:      ll ll128 simple
 * Names are matched without regard to case or '_' (so NCCL_ALGO's "NVLSTree" works too).
 * bytes is NCCL's message size (nccl-tests' "size": all-gather's output, reduce-scatter's
 * input); nchannels 0 means NCCL's own channel count was measured; 1..64, NCCL's count capped
 * there (NCCL_MAX_NCHANNELS). A tuner's count replaces NCCL's own instead of capping it, so
 * the tuner passes it only where the cap binds (plugin/tuner_channels.h).
 * A malformed line is skipped with a WARN naming the file and line.
 */
#ifndef MK_TUNER_FILE_H_
#define MK_TUNER_FILE_H_

#include <stddef.h>
#include <stdio.h>

#include "tuner_model.h"

enum mk_tuner_line_kind {
  MK_TUNER_LINE_BLANK, /* empty or comment only */
  MK_TUNER_LINE_COLL,  /* a measured collective: .coll */
  MK_TUNER_LINE_FUSED, /* fused-op defaults: .fused */
  MK_TUNER_LINE_KEEP   /* NCCL's choice stands around a size: .coll (coll, ranks, nodes, bytes) */
};

struct mk_tuner_line {
  enum mk_tuner_line_kind kind;
  struct mk_tuner_point coll;
  struct mk_tuner_fused_point fused;
};

/* Parses one line. Returns 0, or -EINVAL with a short reason in why (why_len bytes). */
int mk_tuner_file_parse_line(const char* text, struct mk_tuner_line* out, char* why,
                             size_t why_len);

/* Adds every good record of f to model (name is for messages); *nbad counts skipped lines.
 * Returns the number of records added, or a negative errno. Does not finish the model. */
int mk_tuner_file_read(FILE* f, const char* name, struct mk_tuner_model* model, int* nbad);

/* Opens path, reads it and finishes the model. -errno when the file cannot be opened. */
int mk_tuner_file_load(const char* path, struct mk_tuner_model* model, int* nbad);

/* Names as the file spells them; "?" when out of range. */
const char* mk_tuner_coll_name(int coll);
const char* mk_tuner_algo_name(int algo);
const char* mk_tuner_proto_name(int proto);

#endif /* MK_TUNER_FILE_H_ */
