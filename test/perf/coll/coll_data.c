/* Input pattern and checker: small signed integers, exact in every supported type, so
 * every reduction is exact and the check is equality. The seed changes between checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coll_perf.h"

static int type_modulus(ncclDataType_t dt) {
  /* Sums over 16 ranks stay exact: bf16 has 8 significant bits, half 11. */
  return dt == ncclBfloat16 ? 17 : dt == ncclFloat16 ? 61 : 97;
}

double coll_input_value(size_t i, int rank, ncclDataType_t dt, int seed) {
  int m = type_modulus(dt);
  long v = (long)((i * 13 + (size_t)rank * 7 + (size_t)seed * 31) % (size_t)m);
  return (double)(v - m / 2);
}

double coll_reduce_expect(size_t i, int nranks, ncclRedOp_t op, ncclDataType_t dt, int seed) {
  double acc = coll_input_value(i, 0, dt, seed);
  for (int r = 1; r < nranks; r++) {
    double v = coll_input_value(i, r, dt, seed);
    acc = op == ncclSum ? acc + v : op == ncclMax ? fmax(acc, v) : fmin(acc, v);
  }
  return acc;
}

size_t coll_type_size(ncclDataType_t dt) {
  switch (dt) {
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclFloat32: return 4;
    case ncclInt64: case ncclFloat64: return 8;
    default: return 0;
  }
}

static const struct { const char* name; ncclDataType_t dt; } type_names[] = {
    {"float", ncclFloat32}, {"double", ncclFloat64}, {"half", ncclFloat16},
    {"bfloat16", ncclBfloat16}, {"int32", ncclInt32}, {"int64", ncclInt64}};
static const struct { const char* name; ncclRedOp_t op; } op_names[] = {
    {"sum", ncclSum}, {"max", ncclMax}, {"min", ncclMin}};

const char* coll_type_name(ncclDataType_t dt) {
  for (size_t k = 0; k < sizeof(type_names) / sizeof(type_names[0]); k++)
    if (type_names[k].dt == dt) return type_names[k].name;
  return "?";
}

const char* coll_op_name(ncclRedOp_t op) {
  for (size_t k = 0; k < sizeof(op_names) / sizeof(op_names[0]); k++)
    if (op_names[k].op == op) return op_names[k].name;
  return "?";
}

int coll_parse_type(const char* s, ncclDataType_t* dt) {
  for (size_t k = 0; k < sizeof(type_names) / sizeof(type_names[0]); k++)
    if (!strcmp(s, type_names[k].name)) return *dt = type_names[k].dt, 0;
  return -1;
}

int coll_parse_op(const char* s, ncclRedOp_t* op) {
  for (size_t k = 0; k < sizeof(op_names) / sizeof(op_names[0]); k++)
    if (!strcmp(s, op_names[k].name)) return *op = op_names[k].op, 0;
  return -1;
}

/* Small integers convert exactly: write the top bits of the float (bf16) or build the
 * half by hand. */
static uint16_t to_bf16(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

static uint16_t to_half(double v) {
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  double a = fabs(v);
  int e = (int)floor(log2(a));
  uint16_t mant = (uint16_t)((a / ldexp(1.0, e) - 1.0) * 1024.0);
  return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | mant);
}

static double from_half(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? NAN : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

static void put_value(void* host, size_t i, ncclDataType_t dt, double v) {
  switch (dt) {
    case ncclFloat32: ((float*)host)[i] = (float)v; break;
    case ncclFloat64: ((double*)host)[i] = v; break;
    case ncclInt32: ((int32_t*)host)[i] = (int32_t)v; break;
    case ncclInt64: ((int64_t*)host)[i] = (int64_t)v; break;
    case ncclBfloat16: ((uint16_t*)host)[i] = to_bf16(v); break;
    case ncclFloat16: ((uint16_t*)host)[i] = to_half(v); break;
    default: break;
  }
}

static double get_value(const void* host, size_t i, ncclDataType_t dt) {
  switch (dt) {
    case ncclFloat32: return ((const float*)host)[i];
    case ncclFloat64: return ((const double*)host)[i];
    case ncclInt32: return ((const int32_t*)host)[i];
    case ncclInt64: return (double)((const int64_t*)host)[i];
    case ncclBfloat16: {
      uint32_t u = (uint32_t)((const uint16_t*)host)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case ncclFloat16: return from_half(((const uint16_t*)host)[i]);
    default: return NAN;
  }
}

int coll_fill(void* dev_buf, size_t count, int rank, ncclDataType_t dt, int seed) {
  size_t es = coll_type_size(dt);
  void* host = malloc(count * es + 1);
  if (!host) return -1;
  for (size_t i = 0; i < count; i++) put_value(host, i, dt, coll_input_value(i, rank, dt, seed));
  /* done before it returns: from pageable memory the copy may still be in flight on the
   * legacy stream, which the harness's non-blocking streams do not wait for (session 49: the
   * last 256 KiB of a 1 MiB in-place all_reduce's input came after NCCL had read it) */
  cudaError_t err = cudaMemcpy(dev_buf, host, count * es, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamLegacy);
  free(host);
  return err == cudaSuccess ? 0 : -1;
}

int coll_poison(void* dev_buf, size_t bytes) {
  /* 0x7f bytes: NaN in half, about 3e38 in float/bf16, a huge integer otherwise; never a
   * value of the pattern, so an unwritten element is always counted wrong. */
  /* done before it returns: the harness's non-blocking streams do not wait for the legacy
   * stream cudaMemset runs on (gemm_check.cuh poison) */
  return cudaMemset(dev_buf, 0x7f, bytes) == cudaSuccess && cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess
             ? 0
             : -1;
}

long coll_count_wrong(const struct coll_desc* coll, const void* dev_buf, size_t recv_count,
                      int rank, int nranks, ncclRedOp_t op, ncclDataType_t dt, int seed) {
  size_t es = coll_type_size(dt);
  void* host = malloc(recv_count * es + 1);
  if (!host) return -1;
  if (cudaMemcpy(host, dev_buf, recv_count * es, cudaMemcpyDeviceToHost) != cudaSuccess) {
    free(host);
    return -1;
  }
  long wrong = 0;
  for (size_t i = 0; i < recv_count; i++) {
    double want = coll->expect(i, recv_count, rank, nranks, op, dt, seed);
    double got = get_value(host, i, dt);
    if (!(got == want)) wrong++; /* NaN never equals */
  }
  free(host);
  return wrong;
}
