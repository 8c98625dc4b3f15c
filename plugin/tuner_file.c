#include "tuner_file.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mk_log.h"

#define RECORD_FIELDS 8                 /* both record kinds have 8 fields */
#define MAX_FIELDS (RECORD_FIELDS + 1) /* one more, to catch extra fields */
#define KEEP_FIELDS 5                   /* collective nranks nnodes bytes keep */
#define MAX_RANKS (1 << 20)
#define MAX_DIM (INT64_C(1) << 40)
#define MAX_COMM_SMS 1024

static const char* const coll_names[MK_TUNER_NUM_COLLS] = {
    [ncclFuncBroadcast] = "broadcast",         [ncclFuncReduce] = "reduce",
    [ncclFuncAllGather] = "allgather",         [ncclFuncReduceScatter] = "reducescatter",
    [ncclFuncAllReduce] = "allreduce"};
static const char* const algo_names[NCCL_NUM_ALGORITHMS_V5] = {
    [NCCL_ALGO_TREE] = "tree",
    [NCCL_ALGO_RING] = "ring",
    [NCCL_ALGO_COLLNET_DIRECT] = "collnet_direct",
    [NCCL_ALGO_COLLNET_CHAIN] = "collnet_chain",
    [NCCL_ALGO_NVLS] = "nvls",
    [NCCL_ALGO_NVLS_TREE] = "nvls_tree",
    [NCCL_ALGO_PAT] = "pat"};
static const char* const proto_names[NCCL_NUM_PROTOCOLS_V5] = {
    [NCCL_PROTO_LL] = "ll", [NCCL_PROTO_LL128] = "ll128", [NCCL_PROTO_SIMPLE] = "simple"};

const char* mk_tuner_coll_name(int c) {
  return c >= 0 && c < MK_TUNER_NUM_COLLS ? coll_names[c] : "?";
}
const char* mk_tuner_algo_name(int a) {
  return a >= 0 && a < NCCL_NUM_ALGORITHMS_V5 ? algo_names[a] : "?";
}
const char* mk_tuner_proto_name(int p) {
  return p >= 0 && p < NCCL_NUM_PROTOCOLS_V5 ? proto_names[p] : "?";
}

/* Equal without regard to case or '_': "NVLSTree" == "nvls_tree", "all_reduce" == "allreduce". */
static int name_equal(const char* a, const char* b) {
  for (;;) {
    while (*a == '_') a++;
    while (*b == '_') b++;
    if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
    if (!*a) return 1;
    a++, b++;
  }
}

static int name_index(const char* word, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (name_equal(word, names[i])) return i;
  return -1;
}

static int fail(char* why, size_t why_len, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char* why, size_t why_len, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (why && why_len) vsnprintf(why, why_len, fmt, ap);
  va_end(ap);
  return -EINVAL;
}

/* A decimal integer in [lo, hi], the whole token. */
static int parse_int_field(const char* tok, const char* what, int64_t lo, int64_t hi,
                           int64_t* out, char* why, size_t why_len) {
  char* end = NULL;
  errno = 0;
  long long v = strtoll(tok, &end, 10);
  if (errno || end == tok || *end != '\0' || v < lo || v > hi)
    return fail(why, why_len, "%s '%s' is not an integer in [%lld, %lld]", what, tok,
                (long long)lo, (long long)hi);
  *out = v;
  return 0;
}

static int parse_time_field(const char* tok, double* out, char* why, size_t why_len) {
  char* end = NULL;
  errno = 0;
  double v = strtod(tok, &end);
  if (errno || end == tok || *end != '\0' || !isfinite(v) || v <= 0.0)
    return fail(why, why_len, "time_us '%s' is not a positive number", tok);
  *out = v;
  return 0;
}

/* Splits text (a private copy in buf) into blank-separated fields, dropping a '#' comment. */
static int split_fields(const char* text, char* buf, size_t buf_len, char** fields) {
  snprintf(buf, buf_len, "%s", text);
  char* hash = strchr(buf, '#');
  if (hash) *hash = '\0';
  int n = 0;
  for (char* save = NULL, *tok = strtok_r(buf, " \t\r\n", &save); tok;
       tok = strtok_r(NULL, " \t\r\n", &save)) {
    if (n == MAX_FIELDS) return n + 1; /* too many: the caller only needs to know that */
    fields[n++] = tok;
  }
  return n;
}

/* The first four fields both collective records share: collective nranks nnodes bytes. */
static int parse_shape_fields(char** f, struct mk_tuner_point* p, char* why, size_t why_len) {
  p->coll = name_index(f[0], coll_names, MK_TUNER_NUM_COLLS);
  if (p->coll < 0) return fail(why, why_len, "unknown collective '%s'", f[0]);
  int64_t nranks = 0, nnodes = 0, bytes = 0;
  int rc = parse_int_field(f[1], "nranks", 1, MAX_RANKS, &nranks, why, why_len);
  if (!rc) rc = parse_int_field(f[2], "nnodes", 1, nranks, &nnodes, why, why_len);
  if (!rc) rc = parse_int_field(f[3], "bytes", 1, INT64_MAX, &bytes, why, why_len);
  if (rc) return rc;
  p->nranks = (int)nranks, p->nnodes = (int)nnodes, p->bytes = (uint64_t)bytes;
  return 0;
}

/* collective nranks nnodes bytes algo proto nchannels time_us */
static int parse_coll_record(char** f, int n, struct mk_tuner_point* p, char* why,
                             size_t why_len) {
  if (n != RECORD_FIELDS)
    return fail(why, why_len, "%d fields; a collective record has 8 "
                "(collective nranks nnodes bytes algo proto nchannels time_us)", n);
  int rc = parse_shape_fields(f, p, why, why_len);
  if (rc) return rc;
  p->algo = name_index(f[4], algo_names, NCCL_NUM_ALGORITHMS_V5);
  if (p->algo < 0) return fail(why, why_len, "unknown algorithm '%s'", f[4]);
  p->proto = name_index(f[5], proto_names, NCCL_NUM_PROTOCOLS_V5);
  if (p->proto < 0) return fail(why, why_len, "unknown protocol '%s'", f[5]);
  int64_t nch = 0;
  rc = parse_int_field(f[6], "nchannels", 0, MK_TUNER_MAX_CHANNELS, &nch, why, why_len);
  if (!rc) rc = parse_time_field(f[7], &p->time_us, why, why_len);
  if (rc) return rc;
  p->nchannels = (int)nch;
  return 0;
}

/* collective nranks nnodes bytes keep */
static int parse_keep_record(char** f, struct mk_tuner_point* p, char* why, size_t why_len) {
  int rc = parse_shape_fields(f, p, why, why_len);
  p->algo = p->proto = -1;
  return rc;
}

/* Fused-op names are identifiers: [a-z0-9_], at most MK_TUNER_OP_NAME_MAX - 1 long. */
static int valid_op_name(const char* s) {
  size_t len = strlen(s);
  if (len == 0 || len >= MK_TUNER_OP_NAME_MAX) return 0;
  for (; *s; s++)
    if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '_')) return 0;
  return 1;
}

/* fused op m n k comm_sms chunk_bytes time_us */
static int parse_fused_record(char** f, int n, struct mk_tuner_fused_point* p, char* why,
                              size_t why_len) {
  if (n != RECORD_FIELDS)
    return fail(why, why_len, "%d fields; a fused record has 8 "
                "(fused op m n k comm_sms chunk_bytes time_us)", n);
  if (!valid_op_name(f[1]))
    return fail(why, why_len, "fused op name '%s' is not [a-z0-9_]{1,%d}", f[1],
                MK_TUNER_OP_NAME_MAX - 1);
  snprintf(p->op, sizeof(p->op), "%s", f[1]);
  int64_t sms = 0;
  int rc = parse_int_field(f[2], "m", 1, MAX_DIM, &p->m, why, why_len);
  if (!rc) rc = parse_int_field(f[3], "n", 1, MAX_DIM, &p->n, why, why_len);
  if (!rc) rc = parse_int_field(f[4], "k", 1, MAX_DIM, &p->k, why, why_len);
  if (!rc) rc = parse_int_field(f[5], "comm_sms", 1, MAX_COMM_SMS, &sms, why, why_len);
  if (!rc) rc = parse_int_field(f[6], "chunk_bytes", 1, MAX_DIM, &p->chunk_bytes, why, why_len);
  if (!rc) rc = parse_time_field(f[7], &p->time_us, why, why_len);
  p->comm_sms = (int)sms;
  return rc;
}

int mk_tuner_file_parse_line(const char* text, struct mk_tuner_line* out, char* why,
                             size_t why_len) {
  char buf[512];
  char* fields[MAX_FIELDS];
  if (!text || !out) return fail(why, why_len, "no line");
  memset(out, 0, sizeof(*out));
  if (strlen(text) >= sizeof(buf))
    return fail(why, why_len, "longer than %zu characters", sizeof(buf) - 1);
  int n = split_fields(text, buf, sizeof(buf), fields);
  if (n == 0) {
    out->kind = MK_TUNER_LINE_BLANK;
    return 0;
  }
  if (n > RECORD_FIELDS) return fail(why, why_len, "more than %d fields", RECORD_FIELDS);
  if (strcmp(fields[0], "fused") == 0) {
    out->kind = MK_TUNER_LINE_FUSED;
    return parse_fused_record(fields, n, &out->fused, why, why_len);
  }
  if (n == KEEP_FIELDS && name_equal(fields[4], "keep")) {
    out->kind = MK_TUNER_LINE_KEEP;
    return parse_keep_record(fields, &out->coll, why, why_len);
  }
  out->kind = MK_TUNER_LINE_COLL;
  return parse_coll_record(fields, n, &out->coll, why, why_len);
}

static int add_line(struct mk_tuner_model* model, const struct mk_tuner_line* line) {
  if (line->kind == MK_TUNER_LINE_COLL) return mk_tuner_model_add_point(model, &line->coll);
  if (line->kind == MK_TUNER_LINE_FUSED) return mk_tuner_model_add_fused(model, &line->fused);
  if (line->kind == MK_TUNER_LINE_KEEP) return mk_tuner_model_add_keep(model, &line->coll);
  return 0;
}

int mk_tuner_file_read(FILE* f, const char* name, struct mk_tuner_model* model, int* nbad) {
  char* text = NULL;
  size_t cap = 0;
  int lineno = 0, added = 0, bad = 0, rc = 0;
  while (getline(&text, &cap, f) >= 0) {
    struct mk_tuner_line line;
    char why[160];
    lineno++;
    if (mk_tuner_file_parse_line(text, &line, why, sizeof(why)) < 0) {
      MK_WARN("tuning file %s:%d: %s; line skipped", name, lineno, why);
      bad++;
      continue;
    }
    rc = add_line(model, &line);
    if (rc < 0) break;
    added += line.kind != MK_TUNER_LINE_BLANK;
  }
  free(text);
  if (nbad) *nbad = bad;
  return rc < 0 ? rc : added;
}

int mk_tuner_file_load(const char* path, struct mk_tuner_model* model, int* nbad) {
  if (nbad) *nbad = 0;
  FILE* f = fopen(path, "r");
  if (!f) return -errno;
  int rc = mk_tuner_file_read(f, path, model, nbad);
  fclose(f);
  if (rc >= 0) mk_tuner_model_finish(model);
  return rc;
}
