/*
 * Host launcher for the GEMM core: validation, TMA descriptors (driver entry point resolved
 * through the runtime, so libcuda is never linked), and the persistent launch.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "gemm.cuh"
#include "sm90.h"
extern "C" {
#include "mk_err.h"
#include "mk_log.h"
}

/* The compiled configurations. Default: 128x256x64 tiles, 3 stages, one wgmma group in flight,
 * one CTA per cluster, the epilogue written out by the producer warp group's spare warps while
 * the consumers start the next tile (measured best: bench/NOTES.md "GEMM core"). The others
 * stay for gemm_perf's A/B runs and are tested as `test_gemm <test> small <n>` (gemm_tune.h). */
typedef mk_gemm_cfg<128, 256, 64, 3, 256, 1, 1, 1> mk_gemm_default_cfg; /* overlapped epilogue */
typedef mk_gemm_cfg<128, 256, 64, 4, 128, 1, 1, 0> mk_gemm_cfg_sync1;   /* epilogue by the consumers */
typedef mk_gemm_cfg<128, 256, 64, 4, 128, 1, 2, 0> mk_gemm_cfg_sync2;   /* same, clusters of 2 */
typedef mk_gemm_cfg<128, 256, 64, 3, 256, 1, 2, 1> mk_gemm_cfg_async2;
typedef mk_gemm_cfg<64, 256, 64, 4, 256, 1, 1, 1> mk_gemm_cfg_m64; /* args.block_m = 64: one consumer, 4 stages */
/* e4m3 operands: the default's tiles and stages in bytes (a 128-byte stage row holds 128
 * elements); compiled for this configuration only, to keep gemm.cu's compile time. */
typedef mk_gemm_cfg<128, 256, 128, 3, 256, 1, 1, 1, MK_GEMM_E4M3> mk_gemm_fp8_cfg;

#define MK_GEMM_DEFAULT_TIMEOUT_MS 30000u
#define MK_GEMM_DEFAULT_GROUP_M 8

extern "C" PFN_cuTensorMapEncodeTiled_v12000 mk_encode_tiled(void) {
  /* NOTES: a benign race: concurrent first calls resolve the same pointer. */
  static PFN_cuTensorMapEncodeTiled_v12000 fn;
  if (!fn) {
    void* p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
  }
  return fn;
}

static int gemm_misaligned(const void* p) { return ((uintptr_t)p & 15) != 0; }

#define GEMM_REJECT(...)      \
  do {                        \
    MK_WARN(__VA_ARGS__);     \
    return -EINVAL;           \
  } while (0)

/* The reduce-scatter epilogue's rules (gemm.h); only the ASYNC_EPI configurations have it. */
static int gemm_validate_rs(const struct mk_gemm_args* a, int bm, int async_epi) {
  const struct mk_gemm_rs* rs = a->rs;
  if (!async_epi) GEMM_REJECT("mk_gemm_launch: rs needs a configuration with the storer warps (ASYNC_EPI)");
  if (rs->nranks < 2 || rs->nranks > MK_GEMM_RS_MAX_RANKS || rs->rank < 0 || rs->rank >= rs->nranks)
    GEMM_REJECT("mk_gemm_launch: rs rank %d of %d, must be 0 <= rank < nranks, 2 <= nranks <= %d", rs->rank,
                rs->nranks, MK_GEMM_RS_MAX_RANKS);
  if (rs->shard_rows < 1 || rs->shard_rows % bm || (long)rs->shard_rows * rs->nranks != a->m)
    GEMM_REJECT("mk_gemm_launch: rs shard_rows %d, must be a multiple of %d with m = %d = nranks x shard_rows",
                rs->shard_rows, bm, a->m);
  if (a->epilogue != MK_GEMM_STORE || a->group_offsets || a->tile_flags)
    GEMM_REJECT("mk_gemm_launch: rs takes the STORE epilogue, no groups and no tile_flags");
  const int gather = rs->gather[rs->rank ? 0 : 1] != NULL;
  for (int d = 0; d < rs->nranks; d++) {
    if (d == rs->rank) continue;
    if (!rs->out[d] || !rs->out_counts[d] || !rs->in[d] || !rs->in_counts[d] ||
        (gather && (!rs->gather[d] || !rs->gather_counts[d])))
      GEMM_REJECT("mk_gemm_launch: rs pointers of rank %d missing", d);
    if (gemm_misaligned(rs->out[d]) || gemm_misaligned(rs->in[d]) || (gather && gemm_misaligned(rs->gather[d])))
      GEMM_REJECT("mk_gemm_launch: rs slots of rank %d must be 16-byte aligned", d);
    if (gather && a->call && (!rs->gathered[d] || !rs->gathered_counts[d] || gemm_misaligned(rs->gathered[d])))
      GEMM_REJECT("mk_gemm_launch: rs gathered slots of rank %d missing or misaligned", d);
  }
  if (gather && a->call && (!rs->c_full || gemm_misaligned(rs->c_full) || !rs->collect_claims))
    GEMM_REJECT("mk_gemm_launch: rs with the gather and a call bracket needs an aligned c_full and collect_claims");
  if ((rs->remote_mask && !rs->xn) || (rs->xn && (!a->call || !a->err || !a->push || rs->nranks > 32 ||
                                                  (rs->remote_mask >> rs->rank & 1))))
    GEMM_REJECT("mk_gemm_launch: rs across nodes needs xn with remote ranks, a call bracket, an error record, "
                "its sender CTA (push), at most 32 ranks and this rank outside remote_mask");
  return 0;
}

/* The call bracket and the row-scatter epilogue (gemm.h). */
static int gemm_validate_call(const struct mk_gemm_args* a) {
  const struct mk_gemm_call* c = a->call;
  if (c) {
    if (c->nranks < 1 || c->nranks > MK_GEMM_RS_MAX_RANKS || c->rank < 0 || c->rank >= c->nranks)
      GEMM_REJECT("mk_gemm_launch: call rank %d of %d out of range", c->rank, c->nranks);
    if (!c->done || !c->exits || c->num_counters < 0 || (c->num_counters && !c->counters))
      GEMM_REJECT("mk_gemm_launch: call bracket needs done, exits and counters (num_counters %d)", c->num_counters);
    const uint32_t remote = a->push ? a->push->remote_mask : 0; /* reached through the proxy */
    for (int d = 0; d < c->nranks; d++)
      if (d != c->rank && !c->peer_done[d] && !(remote >> d & 1))
        GEMM_REJECT("mk_gemm_launch: call bracket: peer_done of rank %d missing", d);
  }
  const struct mk_gemm_scatter* sc = a->scatter;
  if (sc && (!sc->row_dest || sc->row_mult < 0 || a->rs || a->epilogue != MK_GEMM_STORE || a->tile_flags))
    GEMM_REJECT("mk_gemm_launch: scatter needs row_dest, row_mult >= 0, the STORE epilogue, no rs, no tile_flags");
  if (sc)
    for (int d = 0; d < MK_GEMM_RS_MAX_RANKS; d++)
      if (gemm_misaligned(sc->base[d]))
        GEMM_REJECT("mk_gemm_launch: scatter base of rank %d must be 16-byte aligned", d);
  return 0;
}

/* The all-gather push (gemm.h struct mk_gemm_push). */
static int gemm_validate_push(const struct mk_gemm_args* a, int bm, int cluster_m) {
  const struct mk_gemm_push* pu = a->push;
  const struct mk_gemm_call* c = a->call;
  if (a->rs && a->rs->xn) { /* the cross-node reduce-scatter's sender CTA, nothing else */
    if (pu->ctas != 1 || pu->src || pu->xn || cluster_m != 1)
      GEMM_REJECT("mk_gemm_launch: with rs across nodes, push is its sender CTA: ctas 1, no src or xn, "
                  "one-CTA clusters");
    return 0;
  }
  if (!c || !a->ready_flags || a->group_offsets || a->rs || a->scatter || cluster_m != 1 || a->dtype != MK_GEMM_BF16)
    GEMM_REJECT("mk_gemm_launch: push needs a call bracket and ready_flags, plain mode, no rs or scatter, "
                "one-CTA clusters, bf16 operands");
  if (pu->ctas < 1) GEMM_REJECT("mk_gemm_launch: push ctas = %d, must be >= 1", pu->ctas);
  if (pu->shard_rows < 1 || pu->shard_rows % bm || (long)pu->shard_rows * c->nranks != a->m)
    GEMM_REJECT("mk_gemm_launch: push shard_rows %d, must be a multiple of %d with m = %d = nranks x shard_rows",
                pu->shard_rows, bm, a->m);
  if (!pu->src || gemm_misaligned(pu->src) || !pu->counts)
    GEMM_REJECT("mk_gemm_launch: push src (16-byte aligned) and counts must be set");
  for (int d = 0; d < c->nranks; d++)
    if (d != c->rank && !(pu->remote_mask >> d & 1) &&
        (!pu->dst[d] || gemm_misaligned(pu->dst[d]) || !pu->dst_flags[d]))
      GEMM_REJECT("mk_gemm_launch: push dst (16-byte aligned) and dst_flags of rank %d missing", d);
  if (pu->xn && (pu->ctas < 2 || !a->err || !pu->self_dst || gemm_misaligned(pu->self_dst) || !pu->self_flags ||
                 c->nranks > 32 || (pu->remote_mask >> c->rank & 1)))
    GEMM_REJECT("mk_gemm_launch: a cross-node push needs ctas >= 2, an error record, self_dst (16-byte aligned), self_flags, "
                "at most 32 ranks and this rank outside remote_mask");
  if (!pu->xn && pu->remote_mask) GEMM_REJECT("mk_gemm_launch: push remote_mask without xn");
  return 0;
}

/* The operand type's rules (gemm.h enum mk_gemm_dtype). */
static int gemm_validate_dtype(const struct mk_gemm_args* a) {
  if (a->dtype != MK_GEMM_BF16 && a->dtype != MK_GEMM_E4M3)
    GEMM_REJECT("mk_gemm_launch: dtype = %d is not an enum mk_gemm_dtype (bf16 %d, e4m3 %d)", a->dtype,
                MK_GEMM_BF16, MK_GEMM_E4M3);
  if (a->dtype == MK_GEMM_BF16 && (a->scale_a || a->scale_b))
    GEMM_REJECT("mk_gemm_launch: scale_a = %p, scale_b = %p: scales apply to e4m3 operands only, dtype is bf16",
                (const void*)a->scale_a, (const void*)a->scale_b);
  /* TMA needs 16-byte row strides: k bytes per e4m3 row */
  if (a->dtype == MK_GEMM_E4M3 && a->k % 16)
    GEMM_REJECT("mk_gemm_launch: k = %d, must be a multiple of 16 for e4m3 operands (16-byte rows)", a->k);
  if (((uintptr_t)a->scale_a | (uintptr_t)a->scale_b) & 3)
    GEMM_REJECT("mk_gemm_launch: scale_a = %p, scale_b = %p, must be 4-byte aligned floats",
                (const void*)a->scale_a, (const void*)a->scale_b);
  return 0;
}

static int gemm_validate(const struct mk_gemm_args* a) {
  if (!a) GEMM_REJECT("mk_gemm_launch: args is NULL");
  if (a->m < 1) GEMM_REJECT("mk_gemm_launch: m = %d, must be >= 1", a->m);
  if (a->n < 8 || a->n % 8) GEMM_REJECT("mk_gemm_launch: n = %d, must be a positive multiple of 8", a->n);
  if (a->k < 8 || a->k % 8) GEMM_REJECT("mk_gemm_launch: k = %d, must be a positive multiple of 8", a->k);
  MK_CHECK(gemm_validate_dtype(a));
  if (!a->a || gemm_misaligned(a->a)) GEMM_REJECT("mk_gemm_launch: a = %p, must be non-NULL and 16-byte aligned", a->a);
  if (!a->b || gemm_misaligned(a->b)) GEMM_REJECT("mk_gemm_launch: b = %p, must be non-NULL and 16-byte aligned", a->b);
  if (!a->c || gemm_misaligned(a->c)) GEMM_REJECT("mk_gemm_launch: c = %p, must be non-NULL and 16-byte aligned", a->c);
  if (a->epilogue < MK_GEMM_STORE || a->epilogue > MK_GEMM_ADD_F32)
    GEMM_REJECT("mk_gemm_launch: epilogue = %d is not an enum mk_gemm_epilogue", a->epilogue);
  if (a->num_sms < 0) GEMM_REJECT("mk_gemm_launch: num_sms = %d, must be >= 0", a->num_sms);
  if (a->raster_group_m < 0) GEMM_REJECT("mk_gemm_launch: raster_group_m = %d, must be >= 0", a->raster_group_m);
  if (a->group_offsets && a->num_groups < 1)
    GEMM_REJECT("mk_gemm_launch: num_groups = %d with group_offsets set, must be >= 1", a->num_groups);
  if (a->group_offsets && (a->row_block_order || a->row_block_rotate))
    GEMM_REJECT("mk_gemm_launch: row_block_order and row_block_rotate are not supported with group_offsets");
  if (a->row_block_rotate < 0 || a->row_block_rotate >= (a->m + mk_gemm_default_cfg::BM - 1) / mk_gemm_default_cfg::BM)
    GEMM_REJECT("mk_gemm_launch: row_block_rotate = %d, must be in [0, row-blocks of m = %d)",
                a->row_block_rotate, a->m);
  if (a->a_local && (gemm_misaligned(a->a_local) || a->a_local_rows < 1 || a->a_local_row0 < 0 ||
                     a->a_local_row0 + (long)a->a_local_rows > a->m || a->group_offsets ||
                     a->a_local_row0 % mk_gemm_default_cfg::BM ||
                     ((a->a_local_row0 + a->a_local_rows) % mk_gemm_default_cfg::BM &&
                      a->a_local_row0 + a->a_local_rows != a->m)))
    GEMM_REJECT("mk_gemm_launch: a_local = %p rows [%d, +%d) of m = %d: must be 16-byte aligned, "
                "start and end on %d-row boundaries (or at m), not grouped", a->a_local,
                a->a_local_row0, a->a_local_rows, a->m, mk_gemm_default_cfg::BM);
  if (((uintptr_t)a->ready_flags | (uintptr_t)a->ready_target_ptr | (uintptr_t)a->tile_flags |
       (uintptr_t)a->tile_start_ns) & 7)
    GEMM_REJECT("mk_gemm_launch: ready_flags, ready_target_ptr, tile_flags and tile_start_ns must be "
                "8-byte aligned");
  return 0;
}

/* A row-major [rows, k] operand of 2-byte (bf16) or 1-byte (e4m3, as UINT8: TMA only moves
 * bytes) elements as a 2D tensor map: box = k_box x rows_box, 128B swizzle, zero fill outside
 * the tensor (partial tiles at M, N, K edges; zero bytes are +0 in e4m3 too). */
static int gemm_make_tmap(CUtensorMap* map, const void* ptr, long rows, int k, int rows_box, int k_box,
                          int elem_bytes) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = mk_encode_tiled();
  if (!encode) {
    MK_WARN("mk_gemm_launch: cuTensorMapEncodeTiled not found in the CUDA driver");
    return -ENOTSUP;
  }
  cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)k * elem_bytes};
  cuuint32_t box[2] = {(cuuint32_t)k_box, (cuuint32_t)rows_box};
  cuuint32_t estr[2] = {1, 1};
  const CUtensorMapDataType type = elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUresult r = encode(map, type, 2, (void*)ptr, dims, strides, box, estr,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    MK_WARN("mk_gemm_launch: cuTensorMapEncodeTiled failed (%d) for %ld x %d at %p", (int)r, rows, k, ptr);
    return -EINVAL;
  }
  return 0;
}

extern "C" int mk_sm90_sms(const char* who, int* sms) {
  int dev, major, minor;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    MK_WARN("%s: no usable CUDA device", who);
    return -ENOTSUP;
  }
  if (major != 9 || minor != 0) {
    MK_WARN("%s: device %d is sm_%d%d; the kernel is built for sm_90a (Hopper) only", who, dev, major, minor);
    return -ENOTSUP;
  }
  return 0;
}

extern "C" int mk_kernel_load(const void* kernel, const char* name) {
  cudaFuncAttributes fa;
  const cudaError_t e = cudaFuncGetAttributes(&fa, kernel);
  if (e == cudaSuccess) return 0;
  MK_WARN("loading kernel %s: %s", name, cudaGetErrorString(e));
  return -EIO;
}

extern "C" int mk_kernel_launched(const char* name) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  MK_WARN("launching kernel %s: %s", name, cudaGetErrorString(e));
  return -EIO;
}

extern "C" void mk_gemm_tile_shape(int* block_m, int* block_n) {
  *block_m = mk_gemm_default_cfg::BM;
  *block_n = mk_gemm_default_cfg::BN;
}

extern "C" long mk_gemm_max_tiles(const struct mk_gemm_args* a) {
  const long bm = a->block_m == mk_gemm_cfg_m64::BM ? mk_gemm_cfg_m64::BM : mk_gemm_default_cfg::BM;
  const long bn = mk_gemm_default_cfg::BN;
  long tiles_m = (a->m + bm - 1) / bm + (a->group_offsets ? a->num_groups : 0);
  return tiles_m * ((a->n + bn - 1) / bn);
}

/* Once per device and configuration: raise the kernel's dynamic shared-memory limit (this
 * also loads its module) and find how many CTAs can be resident at once, whole clusters only.
 * NOTES: kept off the launch path: a cudaFuncSetAttribute per launch was seen to wait for the
 * kernels already running, which serialised the GEMM behind a kernel meant to run beside it. */
template <class Cfg>
static cudaError_t gemm_prepare_cfg(int sms, int* max_ctas) {
  static int resident[64]; /* 0: not known yet */
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 64 && __atomic_load_n(&resident[dev], __ATOMIC_ACQUIRE)) {
    *max_ctas = resident[dev];
    return cudaSuccess;
  }
  e = cudaFuncSetAttribute(mk_gemm_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES);
  cudaFuncAttributes fa;
  /* NOTES: seen on the H200: a configuration first launched without this query waited for a
   * running kernel at a later launch; with it (as mk_gemm_prepare did) it did not. */
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, mk_gemm_kernel<Cfg>);
  if (e != cudaSuccess) return e;
  int n = sms;
  if (Cfg::CLUSTER_M > 1) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = Cfg::CLUSTER_M;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.gridDim = dim3(Cfg::CLUSTER_M * (sms / Cfg::CLUSTER_M));
    cfg.blockDim = dim3(Cfg::THREADS);
    cfg.dynamicSmemBytes = Cfg::SMEM_BYTES;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    e = cudaOccupancyMaxActiveClusters(&clusters, mk_gemm_kernel<Cfg>, &cfg);
    if (e != cudaSuccess) return e;
    n = clusters * Cfg::CLUSTER_M;
  }
  MK_INFO(MK_NCCL_SUBSYS_INIT, "mk_gemm: device %d, %d-CTA clusters, %d CTAs resident of %d SMs, %d B smem",
          dev, Cfg::CLUSTER_M, n, sms, Cfg::SMEM_BYTES);
  if (n < Cfg::CLUSTER_M) return cudaErrorInvalidConfiguration;
  if (dev < 64) __atomic_store_n(&resident[dev], n, __ATOMIC_RELEASE);
  *max_ctas = n;
  return cudaSuccess;
}

/* Storer threads that write a tile into a peer (the reduce-scatter epilogue). A burst of
 * NVLink stores from all 96 slows the SM's next tiles by ~12%, so they are spread over the
 * tile's time: one warp (~60-75 us per 128x256 tile) where the tile's MMA takes longer than
 * that (~0.7 us per 128-byte K-block, bf16 or e4m3: from 128 K-blocks, K = 8192 bf16), two
 * from 64, all three below, where fewer could not keep up with the consumers (bench/NOTES.md
 * "NVLink store bursts"). */
static int gemm_peer_store_lanes(int num_k_blocks) {
  return num_k_blocks >= 128 ? 32 : num_k_blocks >= 64 ? 64 : 96;
}

static void gemm_fill_params(struct mk_gemm_params* p, const struct mk_gemm_args* a, int bk) {
  memset(p, 0, sizeof(*p));
  p->m = a->m;
  p->n = a->n;
  p->k = a->k;
  p->epilogue = a->epilogue;
  p->c = a->c;
  p->num_k_blocks = (a->k + bk - 1) / bk;
  p->group_m = a->raster_group_m ? a->raster_group_m : MK_GEMM_DEFAULT_GROUP_M;
  p->num_groups = a->group_offsets ? a->num_groups : 1;
  p->group_offsets = a->group_offsets;
  p->row_block_order = a->row_block_order;
  p->row_block_rotate = a->row_block_rotate;
  p->a_local_row0 = a->a_local ? a->a_local_row0 : 0;
  p->a_local_row_end = a->a_local ? a->a_local_row0 + a->a_local_rows : 0;
  p->ready_flags = a->ready_flags;
  p->ready_target = a->ready_target;
  p->ready_target_ptr = a->ready_target_ptr;
  p->tile_flags = a->tile_flags;
  p->tile_flags_by_row_block = a->tile_flags_by_row_block;
  p->tile_start_ns = a->tile_start_ns;
  p->trace = a->trace;
  p->err = a->err;
  p->err_tag = a->err_tag;
  p->timeout_ns = (uint64_t)(a->timeout_ms ? a->timeout_ms : MK_GEMM_DEFAULT_TIMEOUT_MS) * 1000000ull;
  if (a->rs) {
    p->rs = *a->rs;
    p->rs_gather = a->rs->gather[a->rs->rank ? 0 : 1] != NULL;
  }
  if (a->call) p->call = *a->call;
  if (a->scatter) p->scatter = *a->scatter;
  if (a->push) p->push = *a->push;
  p->peer_store_lanes = gemm_peer_store_lanes(p->num_k_blocks);
  /* no raster group across two shards: this rank's rows are then the last slots */
  if (a->rs) p->group_m = mk_gemm_rs_group_m(p->group_m, a->rs->shard_rows / mk_gemm_default_cfg::BM);
  p->scale_a = a->scale_a;
  p->scale_b = a->scale_b;
}

/* The claimed walk's rules (gemm.h call.claims). */
template <class Cfg>
static int gemm_validate_claims(const struct mk_gemm_args* a) {
  if (!a->call || !a->call->claims) return 0;
  if (Cfg::CLUSTER_M != 1 || ((uintptr_t)a->call->claims & 7))
    GEMM_REJECT("mk_gemm_launch: call.claims (the claimed walk) needs one-CTA clusters and an 8-byte aligned "
                "counter");
  if (a->rs && a->row_block_rotate != (a->rs->rank + 1) % a->rs->nranks * (a->rs->shard_rows / Cfg::BM))
    GEMM_REJECT("mk_gemm_launch: call.claims with rs needs row_block_rotate = %d (this rank's rows last), not %d",
                (a->rs->rank + 1) % a->rs->nranks * (a->rs->shard_rows / Cfg::BM), a->row_block_rotate);
  return 0;
}

/* The slots of the plain schedule (sched.cuh): row-block clusters times column tiles. */
template <class Cfg>
static long gemm_plain_slots(const struct mk_gemm_args* a) {
  const long bm = Cfg::BM, bn = Cfg::BN;
  return ((a->m + bm * Cfg::CLUSTER_M - 1) / (bm * Cfg::CLUSTER_M)) * ((a->n + bn - 1) / bn);
}

/* CTAs in the persistent grid: num_sms (or all), no more than can be resident, no more than
 * there is work for, a whole number of clusters. */
template <class Cfg>
static int gemm_grid_size(const struct mk_gemm_args* a, int max_ctas) {
  int grid = a->num_sms && a->num_sms < max_ctas ? a->num_sms : max_ctas;
  if (!a->group_offsets) {
    const long slots = gemm_plain_slots<Cfg>(a);
    if (slots * Cfg::CLUSTER_M < grid) grid = (int)(slots * Cfg::CLUSTER_M);
  }
  grid -= grid % Cfg::CLUSTER_M;
  return grid < Cfg::CLUSTER_M ? Cfg::CLUSTER_M : grid;
}

template <class Cfg>
static int gemm_launch_cfg(const struct mk_gemm_args* a, cudaStream_t stream) {
  MK_CHECK(gemm_validate(a));
  if (a->rs) MK_CHECK(gemm_validate_rs(a, Cfg::BM, Cfg::ASYNC_EPI));
  MK_CHECK(gemm_validate_call(a));
  MK_CHECK(gemm_validate_claims<Cfg>(a));
  if (a->push) MK_CHECK(gemm_validate_push(a, Cfg::BM, Cfg::CLUSTER_M));
  if (a->scatter && !Cfg::ASYNC_EPI) GEMM_REJECT("mk_gemm_launch: scatter needs the storer warps (ASYNC_EPI)");
  if (a->dtype != Cfg::DTYPE)
    GEMM_REJECT("mk_gemm_launch: dtype %d launched on a configuration compiled for %d", a->dtype, Cfg::DTYPE);
  int sms = 0, max_ctas = 0;
  MK_CHECK(mk_sm90_sms("mk_gemm_launch", &sms));
  const int groups = a->group_offsets ? a->num_groups : 1;
  CUtensorMap tmap_a, tmap_a_local, tmap_b;
  const int eb = Cfg::ELEM_BYTES;
  MK_CHECK(gemm_make_tmap(&tmap_a, a->a, a->m, a->k, Cfg::BM, Cfg::BK, eb));
  if (a->a_local) MK_CHECK(gemm_make_tmap(&tmap_a_local, a->a_local, a->a_local_rows, a->k, Cfg::BM, Cfg::BK, eb));
  else tmap_a_local = tmap_a;
  MK_CHECK(gemm_make_tmap(&tmap_b, a->b, (long)groups * a->n, a->k, Cfg::B_ROWS_PER_CTA, Cfg::BK, eb));
  struct mk_gemm_params p;
  gemm_fill_params(&p, a, Cfg::BK);
  if (a->call && a->call->claims) /* the claimed walk: every slot of the plain schedule */
    p.claim_end = a->group_offsets ? INT_MAX /* the end: the scheduler finds no slot */
                                   : (int)gemm_plain_slots<Cfg>(a);

  cudaError_t e = gemm_prepare_cfg<Cfg>(sms, &max_ctas);
  if (e == cudaSuccess && a->push && a->push->ctas >= max_ctas)
    GEMM_REJECT("mk_gemm_launch: push ctas = %d, must be below the %d CTAs resident on this device", a->push->ctas,
                max_ctas);
  if (e == cudaSuccess) {
    /* the push CTAs take SMs of their own: all of them resident together with the GEMM's */
    p.gemm_ctas = gemm_grid_size<Cfg>(a, max_ctas - p.push.ctas);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    memset(attr, 0, sizeof attr);
    int attrs = 0;
    if (Cfg::CLUSTER_M > 1) {
      attr[attrs].id = cudaLaunchAttributeClusterDimension;
      attr[attrs++].val.clusterDim = {(unsigned)Cfg::CLUSTER_M, 1, 1};
    }
    if (a->pdl) { /* gemm.h args.pdl */
      attr[attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[attrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    cfg.gridDim = dim3(p.push.ctas + p.gemm_ctas);
    cfg.blockDim = dim3(Cfg::THREADS);
    cfg.dynamicSmemBytes = Cfg::SMEM_BYTES;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = attrs;
    e = cudaLaunchKernelEx(&cfg, mk_gemm_kernel<Cfg>, tmap_a, tmap_a_local, tmap_b, p);
  }
  if (e != cudaSuccess) {
    MK_WARN("mk_gemm_launch: launch failed: %s", cudaGetErrorString(e));
    return -EIO;
  }
  return 0;
}

/* Clusters of two need every wait in the producer to end the same way in both CTAs; the ready
 * flags' timeout cannot promise that, and a single CTA cannot form a pair. */
static int gemm_use_pairs(const struct mk_gemm_args* a) {
  return a && !a->ready_flags && !a->rs && !a->call && !a->scatter && !a->push && a->num_sms != 1;
}

/* args.block_m (gemm.h): 64-row tiles for bf16 without the fused roles that assume 128. */
static int gemm_validate_block_m(const struct mk_gemm_args* a) {
  if (a->block_m != 0 && a->block_m != 64 && a->block_m != 128)
    GEMM_REJECT("mk_gemm_launch: block_m = %d, must be 0 (128), 64 or 128", a->block_m);
  if (a->block_m == 64 && (a->dtype != MK_GEMM_BF16 || a->a_local || a->push || a->rs))
    GEMM_REJECT("mk_gemm_launch: block_m = 64 needs bf16 operands and no a_local, push or rs");
  return 0;
}

extern "C" int mk_gemm_launch(const struct mk_gemm_args* a, cudaStream_t stream) {
  if (a) MK_CHECK(gemm_validate_block_m(a));
  if (a && a->block_m == 64) return gemm_launch_cfg<mk_gemm_cfg_m64>(a, stream);
  if (a && a->dtype == MK_GEMM_E4M3) return gemm_launch_cfg<mk_gemm_fp8_cfg>(a, stream);
  return gemm_launch_cfg<mk_gemm_default_cfg>(a, stream); /* also rejects an unknown dtype */
}

extern "C" int mk_gemm_launch_variant(const struct mk_gemm_args* a, cudaStream_t stream, int variant) {
  if (a) MK_CHECK(gemm_validate_block_m(a));
  if (a && a->block_m == 64 && variant != 4)
    GEMM_REJECT("mk_gemm_launch_variant: block_m = 64 is configuration 4, not %d", variant);
  /* and back: its flags, order and claims count 64-row blocks, which the caller must know */
  if (a && a->block_m != 64 && variant == 4)
    GEMM_REJECT("mk_gemm_launch_variant: configuration 4 tiles 64 rows: it needs block_m = 64, not %d", a->block_m);
  if (a && a->dtype == MK_GEMM_E4M3) {
    if (variant == 0) return gemm_launch_cfg<mk_gemm_fp8_cfg>(a, stream);
    GEMM_REJECT("mk_gemm_launch_variant: e4m3 is compiled for configuration 0 only, not %d", variant);
  }
  switch (variant) {
    case 0: return gemm_launch_cfg<mk_gemm_default_cfg>(a, stream);
    case 1: return gemm_launch_cfg<mk_gemm_cfg_sync1>(a, stream);
    case 2: return gemm_use_pairs(a) ? gemm_launch_cfg<mk_gemm_cfg_sync2>(a, stream)
                                     : gemm_launch_cfg<mk_gemm_cfg_sync1>(a, stream);
    case 3: return gemm_use_pairs(a) ? gemm_launch_cfg<mk_gemm_cfg_async2>(a, stream)
                                     : gemm_launch_cfg<mk_gemm_default_cfg>(a, stream);
    case 4: return gemm_launch_cfg<mk_gemm_cfg_m64>(a, stream);
    default: return -EINVAL;
  }
}

/* Loads the kernels now: under lazy module loading the first launch otherwise waits for the
 * kernels already running, which deadlocks a caller that overlaps the GEMM with a kernel
 * waiting on its flags. */
extern "C" int mk_gemm_prepare(void) {
  int sms, n;
  MK_CHECK(mk_sm90_sms("mk_gemm_prepare", &sms));
  if (!mk_encode_tiled()) {
    MK_WARN("mk_gemm_prepare: cuTensorMapEncodeTiled not found in the CUDA driver");
    return -ENOTSUP;
  }
  cudaError_t e = gemm_prepare_cfg<mk_gemm_default_cfg>(sms, &n);
  if (e == cudaSuccess) e = gemm_prepare_cfg<mk_gemm_fp8_cfg>(sms, &n);
  if (e == cudaSuccess) e = gemm_prepare_cfg<mk_gemm_cfg_m64>(sms, &n);
  if (e != cudaSuccess) {
    MK_WARN("mk_gemm_prepare: %s", cudaGetErrorString(e));
    return -EIO;
  }
  return 0;
}
