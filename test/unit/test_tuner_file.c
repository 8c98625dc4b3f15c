/*
 * The tuning-file parser: good records in every spelling NCCL users write, every kind of
 * malformed line rejected with a reason, and whole files (good with bad lines mixed in,
 * empty, comments only, missing) with a WARN naming file:line for each skipped line.
 *
 * usage: test_tuner_file <folder with tuner_*.txt>
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "mk_log.h"
#include "tuner_file.h"
#include "tuner_test_util.h"

static int parse(const char* text, struct mk_tuner_line* line, char* why) {
  return mk_tuner_file_parse_line(text, line, why, 160);
}

static void good_collective_record_is_parsed(void) {
  struct mk_tuner_line l;
  char why[160] = "";
  CHECK_EQ(parse("allreduce 2 1 1048576 ring simple 0 21.4\n", &l, why), 0);
  CHECK_EQ(l.kind, MK_TUNER_LINE_COLL);
  CHECK_EQ(l.coll.coll, ncclFuncAllReduce);
  CHECK_EQ(l.coll.nranks, 2);
  CHECK_EQ(l.coll.nnodes, 1);
  CHECK_EQ(l.coll.bytes, 1048576);
  CHECK_EQ(l.coll.algo, NCCL_ALGO_RING);
  CHECK_EQ(l.coll.proto, NCCL_PROTO_SIMPLE);
  CHECK_EQ(l.coll.nchannels, 0);
  CHECK(l.coll.time_us == 21.4);
}

static void names_match_in_nccl_and_file_spellings(void) {
  struct mk_tuner_line l;
  char why[160] = "";
  CHECK_EQ(parse("AllGather 8 2 64 NVLSTree LL128 4 1.5 # trailing comment", &l, why), 0);
  CHECK_EQ(l.coll.coll, ncclFuncAllGather);
  CHECK_EQ(l.coll.algo, NCCL_ALGO_NVLS_TREE);
  CHECK_EQ(l.coll.proto, NCCL_PROTO_LL128);
  CHECK_EQ(parse("\treduce_scatter 4 4 8 collnet_chain ll 64 3", &l, why), 0);
  CHECK_EQ(l.coll.coll, ncclFuncReduceScatter);
  CHECK_EQ(l.coll.algo, NCCL_ALGO_COLLNET_CHAIN);
  CHECK_EQ(l.coll.nchannels, 64);
  CHECK_EQ(parse("broadcast 2 1 8 CollnetDirect Simple 1 1e2", &l, why), 0);
  CHECK_EQ(l.coll.coll, ncclFuncBroadcast);
  CHECK_EQ(l.coll.algo, NCCL_ALGO_COLLNET_DIRECT);
  CHECK(l.coll.time_us == 100.0);
  CHECK_EQ(parse("reduce 2 1 8 pat simple 0 1", &l, why), 0);
  CHECK_EQ(l.coll.coll, ncclFuncReduce);
  CHECK_EQ(l.coll.algo, NCCL_ALGO_PAT);
  CHECK_EQ(parse("all_reduce 2 1 8 Tree LL 0 1", &l, why), 0);
  CHECK_EQ(l.coll.algo, NCCL_ALGO_TREE);
  CHECK_EQ(l.coll.proto, NCCL_PROTO_LL);
  CHECK_STR(mk_tuner_algo_name(NCCL_ALGO_NVLS_TREE), "nvls_tree");
  CHECK_STR(mk_tuner_coll_name(ncclFuncReduceScatter), "reducescatter");
  CHECK_STR(mk_tuner_proto_name(NCCL_PROTO_LL128), "ll128");
  CHECK_STR(mk_tuner_algo_name(7), "?");
}

static void good_fused_record_is_parsed(void) {
  struct mk_tuner_line l;
  char why[160] = "";
  CHECK_EQ(parse("fused gemm_reducescatter 16384 8192 28672 20 4194304 3021.5", &l, why), 0);
  CHECK_EQ(l.kind, MK_TUNER_LINE_FUSED);
  CHECK_STR(l.fused.op, "gemm_reducescatter");
  CHECK_EQ(l.fused.m, 16384);
  CHECK_EQ(l.fused.n, 8192);
  CHECK_EQ(l.fused.k, 28672);
  CHECK_EQ(l.fused.comm_sms, 20);
  CHECK_EQ(l.fused.chunk_bytes, 4194304);
  CHECK(l.fused.time_us == 3021.5);
}

static void keep_record_is_parsed(void) {
  struct mk_tuner_line l;
  char why[160] = "";
  CHECK_EQ(parse("allreduce 2 1 524288 keep  # the check lost here\n", &l, why), 0);
  CHECK_EQ(l.kind, MK_TUNER_LINE_KEEP);
  CHECK_EQ(l.coll.coll, ncclFuncAllReduce);
  CHECK_EQ(l.coll.nranks, 2);
  CHECK_EQ(l.coll.nnodes, 1);
  CHECK_EQ(l.coll.bytes, 524288);
  CHECK_EQ(parse("AllGather 4 2 8 KEEP", &l, why), 0);
  CHECK_EQ(l.kind, MK_TUNER_LINE_KEEP);
  CHECK_EQ(l.coll.coll, ncclFuncAllGather);
}

static void blank_and_comment_lines_are_blank(void) {
  struct mk_tuner_line l;
  char why[160] = "";
  const char* blanks[] = {"", "\n", "   \t \r\n", "# allreduce 2 1 8 ring ll 0 1", "  # x"};
  for (size_t i = 0; i < sizeof(blanks) / sizeof(*blanks); i++) {
    CHECK_EQ(parse(blanks[i], &l, why), 0);
    CHECK_EQ(l.kind, MK_TUNER_LINE_BLANK);
  }
}

/* Every kind of bad line, with a word the reason must contain. */
static void each_kind_of_malformed_line_is_rejected_with_a_reason(void) {
  static const struct { const char* text; const char* reason; } bad[] = {
      {"allreduce 2 1 1024 ring simple 0", "7 fields"},
      {"allreduce 2 1 1024 kept", "5 fields"},
      {"allreduce 2 1 0 keep", "bytes"},
      {"alltoall 2 1 1024 keep", "unknown collective"},
      {"allreduce 2 3 1024 keep", "nnodes"},
      {"allreduce 2 1 1024 ring simple 0 5 extra", "more than 8"},
      {"alltoall 2 1 1024 ring simple 0 5", "unknown collective"},
      {"allreduce 2 1 1024 hypercube simple 0 5", "unknown algorithm"},
      {"allreduce 2 1 1024 ring ll64 0 5", "unknown protocol"},
      {"allreduce two 1 1024 ring simple 0 5", "nranks"},
      {"allreduce 0 1 1024 ring simple 0 5", "nranks"},
      {"allreduce 2 3 1024 ring simple 0 5", "nnodes"},
      {"allreduce 2 0 1024 ring simple 0 5", "nnodes"},
      {"allreduce 2 1 0 ring simple 0 5", "bytes"},
      {"allreduce 2 1 -8 ring simple 0 5", "bytes"},
      {"allreduce 2 1 1e6 ring simple 0 5", "bytes"},
      {"allreduce 2 1 99999999999999999999 ring simple 0 5", "bytes"},
      {"allreduce 2 1 1024 ring simple 65 5", "nchannels"},
      {"allreduce 2 1 1024 ring simple -1 5", "nchannels"},
      {"allreduce 2 1 1024 ring simple 0 0", "time_us"},
      {"allreduce 2 1 1024 ring simple 0 -3", "time_us"},
      {"allreduce 2 1 1024 ring simple 0 fast", "time_us"},
      {"allreduce 2 1 1024 ring simple 0 nan", "time_us"},
      {"allreduce 2 1 1024 ring simple 0 inf", "time_us"},
      {"allreduce 2 1 1024 ring simple 0 5us", "time_us"},
      {"fused allgather_gemm 4096 8192 8192 16 1048576", "7 fields"},
      {"fused AG-GEMM 4096 8192 8192 16 1048576 5", "op name"},
      {"fused allgather_gemm 0 8192 8192 16 1048576 5", "m '0'"},
      {"fused allgather_gemm 4096 8192 8192 0 1048576 5", "comm_sms"},
      {"fused allgather_gemm 4096 8192 8192 16 0 5", "chunk_bytes"},
      {"fused allgather_gemm 4096 8192 8192 16 1048576 -1", "time_us"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
    struct mk_tuner_line l;
    char why[160] = "";
    int rc = parse(bad[i].text, &l, why);
    if (rc != -EINVAL || !strstr(why, bad[i].reason))
      fprintf(stderr, "line \"%s\": rc %d, reason \"%s\" (want \"%s\")\n", bad[i].text, rc,
              why, bad[i].reason);
    CHECK_EQ(rc, -EINVAL);
    CHECK(strstr(why, bad[i].reason) != NULL);
  }
  char long_line[1024];
  memset(long_line, 'a', sizeof(long_line) - 1);
  long_line[sizeof(long_line) - 1] = '\0';
  struct mk_tuner_line l;
  char why[160] = "";
  CHECK_EQ(parse(long_line, &l, why), -EINVAL);
  CHECK(strstr(why, "longer than") != NULL);
  CHECK_EQ(mk_tuner_file_parse_line(NULL, &l, why, sizeof(why)), -EINVAL);
}

static void write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

static void malformed_lines_are_skipped_with_file_and_line(void) {
  char path[] = "/tmp/mk_tuner_mixed_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  write_file(path,
             "# mixed\n"                                  /* 1 */
             "allreduce 2 1 8 ring ll 0 5\n"              /* 2 good */
             "allreduce 2 1 8 ring\n"                     /* 3 bad: fields */
             "allreduce 2 1 64 ring ll 0 6\n"             /* 4 good */
             "sendrecv 2 1 8 ring ll 0 5\n"               /* 5 bad: collective */
             "\n"                                         /* 6 */
             "fused gemm_allreduce 4096 8192 8192 8 65536 10\n" /* 7 good */
             "fused gemm_allreduce 4096 8192 8192 8 65536 slow\n"); /* 8 bad: time */
  struct mk_tuner_model m = {0};
  int nbad = -1;
  tuner_test_log_clear();
  CHECK_EQ(mk_tuner_file_load(path, &m, &nbad), 3);
  CHECK_EQ(nbad, 3);
  CHECK_EQ(m.npoints, 2);
  CHECK_EQ(m.nfused, 1);
  CHECK_EQ(tuner_test_log_warns, 3);
  char where[256];
  int lines[] = {3, 5, 8};
  for (int i = 0; i < 3; i++) {
    snprintf(where, sizeof(where), "%s:%d:", path, lines[i]);
    CHECK_EQ(tuner_test_log_count(where), 1);
  }
  mk_tuner_model_free(&m);
  unlink(path);
}

static void good_file_loads_every_record(const char* dir) {
  char path[512];
  snprintf(path, sizeof(path), "%s/tuner_basic.txt", dir);
  struct mk_tuner_model m = {0};
  int nbad = -1;
  tuner_test_log_clear();
  CHECK_EQ(mk_tuner_file_load(path, &m, &nbad), 21);
  CHECK_EQ(nbad, 0);
  CHECK_EQ(m.npoints, 18);
  CHECK_EQ(m.nfused, 3);
  CHECK_EQ(tuner_test_log_warns, 0);
  mk_tuner_model_free(&m);
}

static void empty_and_comment_only_files_give_an_empty_model(const char* dir) {
  const char* names[] = {"tuner_empty.txt", "tuner_comments_only.txt"};
  for (int i = 0; i < 2; i++) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    struct mk_tuner_model m = {0};
    int nbad = -1;
    tuner_test_log_clear();
    CHECK_EQ(mk_tuner_file_load(path, &m, &nbad), 0);
    CHECK_EQ(nbad, 0);
    CHECK_EQ(m.npoints + m.nfused, 0);
    CHECK_EQ(tuner_test_log_warns, 0);
    mk_tuner_model_free(&m);
  }
}

static void missing_file_is_enoent(void) {
  struct mk_tuner_model m = {0};
  int nbad = -1;
  CHECK_EQ(mk_tuner_file_load("/nonexistent/mk_tuner.txt", &m, &nbad), -ENOENT);
  CHECK_EQ(nbad, 0);
  CHECK_EQ(m.npoints + m.nfused, 0);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <folder with tuner_*.txt>\n", argv[0]);
    return 2;
  }
  mk_log_set_logger(tuner_test_logger);
  good_collective_record_is_parsed();
  names_match_in_nccl_and_file_spellings();
  good_fused_record_is_parsed();
  keep_record_is_parsed();
  blank_and_comment_lines_are_blank();
  each_kind_of_malformed_line_is_rejected_with_a_reason();
  malformed_lines_are_skipped_with_file_and_line();
  good_file_loads_every_record(argv[1]);
  empty_and_comment_only_files_give_an_empty_model(argv[1]);
  missing_file_is_enoent();
  return MK_TEST_RESULT();
}
