/*
 * Host launcher for the forward attention core (attn.h): validation, the 4-D tensor maps, and
 * one launch of (query tiles, heads, batch) CTAs.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "attn_fwd.cuh"
#include "sm90.h"
extern "C" {
#include "mk_err.h"
#include "mk_log.h"
}

/* Variant 0 (the default): the consumer warp groups ping-pong (mk_attn_cfg PINGPONG), KV
 * tiles of 176 keys (FlashAttention-3's non-causal D = 128 tile: fewer softmax reductions,
 * barrier waits and wgmma issues per key) whose K and V are released separately (attn_fwd.cuh
 * SPLIT_KV): D = 128 in 2 stages (Q 32 KB + 2 x (44 + 44) KB = 208 KB), D = 64 in 3 (148 KB).
 * On an H200 3-7% above the 128-key tiles of variant 5 at D = 128, causal and not, 0-3% at
 * D = 64 (bench/NOTES.md, session 30).
 * Variant 1: no ping-pong (the first version), D = 128 with 2 stages.
 * Variant 2: ping-pong, D = 128 with 2 stages, D = 64 with 4.
 * Variants 3 and 4: variant 5 persistent (attn_fwd.cuh PERSISTENT), one CTA per SM over the
 * items head-major (3) or tile-major, longest first (4) (attn.h mk_attn_item_work's chunk
 * MK_ATTN_CHUNK_HEADS and 1).
 * Variant 5: 128-key tiles in 3 stages, K and V released together (the default until session
 * 30; the ring kernel's configuration).
 * Variant 6: 128-key tiles in 2 stages whose K and V are released separately. */
typedef mk_attn_cfg<128, 2, 1, 0, 176, 1> mk_attn_cfg_d128;
typedef mk_attn_cfg<64, 3, 1, 0, 176, 1> mk_attn_cfg_d64;
typedef mk_attn_cfg<128, 3, 1> mk_attn_cfg_d128_bn128;
typedef mk_attn_cfg<64, 3, 1> mk_attn_cfg_d64_bn128;
typedef mk_attn_cfg<128, 2, 0> mk_attn_cfg_d128_plain;
typedef mk_attn_cfg<64, 3, 0> mk_attn_cfg_d64_plain;
typedef mk_attn_cfg<128, 2, 1> mk_attn_cfg_d128_pp2;
typedef mk_attn_cfg<64, 4, 1> mk_attn_cfg_d64_pp4;
typedef mk_attn_cfg<128, 3, 1, 1> mk_attn_cfg_d128_pers;
typedef mk_attn_cfg<64, 3, 1, 1> mk_attn_cfg_d64_pers;
typedef mk_attn_cfg<128, 2, 1, 0, 128, 1> mk_attn_cfg_d128_split2;
typedef mk_attn_cfg<64, 2, 1, 0, 128, 1> mk_attn_cfg_d64_split2;

#define MK_ATTN_DEFAULT_TIMEOUT_MS 10000u

#define ATTN_REJECT(...)  \
  do {                    \
    MK_WARN(__VA_ARGS__); \
    return -EINVAL;       \
  } while (0)

static int attn_misaligned(const void* p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) != 0; }

extern "C" int mk_attn_fwd_check(const struct mk_attn_args* a) {
  if (!a) ATTN_REJECT("mk_attn_fwd: args is NULL");
  if (a->d_head != 64 && a->d_head != 128) ATTN_REJECT("mk_attn_fwd: d_head = %d, must be 64 or 128", a->d_head);
  if (a->batch < 1 || a->batch > 65535) ATTN_REJECT("mk_attn_fwd: batch = %d, must be in [1, 65535]", a->batch);
  if (a->heads < 1 || a->heads > 65535) ATTN_REJECT("mk_attn_fwd: heads = %d, must be in [1, 65535]", a->heads);
  if (a->kv_heads < 1 || a->heads % a->kv_heads)
    ATTN_REJECT("mk_attn_fwd: heads = %d must be a positive multiple of kv_heads = %d", a->heads, a->kv_heads);
  if (a->seq_q < 1) ATTN_REJECT("mk_attn_fwd: seq_q = %d, must be >= 1", a->seq_q);
  if (!a->q || attn_misaligned(a->q, 16)) ATTN_REJECT("mk_attn_fwd: q = %p, must be non-NULL and 16-byte aligned", a->q);
  if (!a->out || attn_misaligned(a->out, 16))
    ATTN_REJECT("mk_attn_fwd: out = %p, must be non-NULL and 16-byte aligned", a->out);
  if (attn_misaligned(a->lse, 4)) ATTN_REJECT("mk_attn_fwd: lse = %p, must be 4-byte aligned", (void*)a->lse);
  const int q_rows = a->q_rows ? a->q_rows : a->seq_q - a->q_row0;
  if (a->q_row0 < 0 || a->q_rows < 0 || q_rows < 1 || (long)a->q_row0 + q_rows > a->seq_q)
    ATTN_REJECT("mk_attn_fwd: q rows [%d, +%d) must be a non-empty part of seq_q = %d", a->q_row0, a->q_rows,
                a->seq_q);
  if ((long long)(q_rows + MK_ATTN_BLOCK_M - 1) / MK_ATTN_BLOCK_M * a->heads * a->batch > INT_MAX)
    ATTN_REJECT("mk_attn_fwd: batch %d x heads %d x query tiles of %d rows must be < 2^31", a->batch, a->heads,
                MK_ATTN_BLOCK_M);
  if (a->q_pos0 < 0) ATTN_REJECT("mk_attn_fwd: q_pos0 = %lld, must be >= 0", a->q_pos0);
  if (a->num_kv_blocks < 1 || a->num_kv_blocks > MK_ATTN_MAX_KV_BLOCKS)
    ATTN_REJECT("mk_attn_fwd: num_kv_blocks = %d, must be in [1, %d]", a->num_kv_blocks, MK_ATTN_MAX_KV_BLOCKS);
  for (int i = 0; i < a->num_kv_blocks; i++) {
    const struct mk_attn_kv_block* kv = &a->kv[i];
    if (!kv->k || attn_misaligned(kv->k, 16) || !kv->v || attn_misaligned(kv->v, 16))
      ATTN_REJECT("mk_attn_fwd: kv block %d: k = %p, v = %p, must be non-NULL and 16-byte aligned", i, kv->k, kv->v);
    if (kv->seq < 1) ATTN_REJECT("mk_attn_fwd: kv block %d: seq = %d, must be >= 1", i, kv->seq);
    const int rows = kv->rows ? kv->rows : kv->seq - kv->row0;
    if (kv->row0 < 0 || kv->rows < 0 || rows < 1 || (long)kv->row0 + rows > kv->seq)
      ATTN_REJECT("mk_attn_fwd: kv block %d: rows [%d, +%d) must be a non-empty part of seq = %d", i, kv->row0,
                  kv->rows, kv->seq);
    if (kv->pos0 < 0) ATTN_REJECT("mk_attn_fwd: kv block %d: pos0 = %lld, must be >= 0", i, kv->pos0);
  }
  return 0;
}

/* Rows [row0, row0 + rows) of each batch of a [batch, seq, heads, d] tensor of elem-byte
 * elements as a 4-D map (d, head, row, batch), box (128 bytes of d) x 1 x box_rows x 1,
 * 128-byte swizzle, zeros past them (loads) or nothing written there (stores, reductions). */
static int attn_tmap_encode_typed(CUtensorMap* map, const void* ptr, CUtensorMapDataType type, int elem, int batch,
                                  int seq, int row0, int rows, int heads, int d, int box_rows) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = mk_encode_tiled();
  if (!encode) {
    MK_WARN("mk_attn: cuTensorMapEncodeTiled not found in the CUDA driver");
    return -ENOTSUP;
  }
  const char* base = (const char*)ptr + (size_t)row0 * heads * d * elem;
  cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)heads, (cuuint64_t)rows, (cuuint64_t)batch};
  cuuint64_t strides[3] = {(cuuint64_t)d * elem, (cuuint64_t)heads * d * elem, (cuuint64_t)seq * heads * d * elem};
  cuuint32_t box[4] = {(cuuint32_t)(128 / elem), 1, (cuuint32_t)box_rows, 1};
  cuuint32_t estr[4] = {1, 1, 1, 1};
  CUresult r = encode(map, type, 4, (void*)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    MK_WARN("mk_attn: cuTensorMapEncodeTiled failed (%d) for rows [%d, +%d) of [%d, %d, %d, %d] x %d bytes at %p",
            (int)r, row0, rows, batch, seq, heads, d, elem, ptr);
    return -EINVAL;
  }
  return 0;
}

/* attn.h: bf16, box 64 x 1 x box_rows x 1. */
extern "C" int mk_attn_tmap_encode_rows(void* map_out, const void* ptr, int batch, int seq, int row0, int rows,
                                        int heads, int d, int box_rows) {
  return attn_tmap_encode_typed((CUtensorMap*)map_out, ptr, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, batch, seq, row0, rows,
                                heads, d, box_rows);
}

/* attn.h: fp32, box 32 x 1 x box_rows x 1. */
extern "C" int mk_attn_tmap_encode_rows_f32(void* map_out, const float* ptr, int batch, int seq, int row0, int rows,
                                            int heads, int d, int box_rows) {
  return attn_tmap_encode_typed((CUtensorMap*)map_out, ptr, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, batch, seq, row0, rows,
                                heads, d, box_rows);
}

/* attn.h: the whole tensor. */
extern "C" int mk_attn_tmap_encode(void* map_out, const void* ptr, int batch, int seq, int heads, int d, int box_rows) {
  return mk_attn_tmap_encode_rows(map_out, ptr, batch, seq, 0, seq, heads, d, box_rows);
}

/* Once per device and configuration: the kernel's dynamic shared-memory limit (also loads its
 * module; off the launch path, as gemm.cu's gemm_prepare_cfg says why). */
template <class Cfg>
static cudaError_t attn_prepare_cfg(void) {
  static int done[64];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 64 && __atomic_load_n(&done[dev], __ATOMIC_ACQUIRE)) return cudaSuccess;
  e = cudaFuncSetAttribute(mk_attn_fwd_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM_BYTES);
  cudaFuncAttributes fa;
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, mk_attn_fwd_kernel<Cfg>);
  if (e == cudaSuccess && dev < 64) __atomic_store_n(&done[dev], 1, __ATOMIC_RELEASE);
  return e;
}

template <class Cfg>
static int attn_launch_cfg(const struct mk_attn_args* a, cudaStream_t stream, int sms, int chunk) {
  struct mk_attn_maps maps;
  struct mk_attn_params p;
  memset(&maps, 0, sizeof maps);
  memset(&p, 0, sizeof p);
  MK_CHECK(mk_attn_tmap_encode(&maps.q, a->q, a->batch, a->seq_q, a->heads, Cfg::D, Cfg::BM));
  for (int i = 0; i < a->num_kv_blocks; i++) {
    const struct mk_attn_kv_block* kv = &a->kv[i];
    MK_CHECK(mk_attn_tmap_encode(&maps.k[i], kv->k, a->batch, kv->seq, a->kv_heads, Cfg::D, Cfg::BN));
    MK_CHECK(mk_attn_tmap_encode(&maps.v[i], kv->v, a->batch, kv->seq, a->kv_heads, Cfg::D, Cfg::BN));
    p.kv[i].row0 = kv->row0;
    p.kv[i].rows = kv->rows ? kv->rows : kv->seq - kv->row0;
    p.kv[i].pos0 = kv->pos0;
  }
  p.seq_q = a->seq_q;
  p.batch = a->batch;
  p.heads = a->heads;
  p.kv_heads = a->kv_heads;
  p.causal = a->causal ? 1 : 0;
  p.q_row0 = a->q_row0;
  p.q_rows = a->q_rows ? a->q_rows : a->seq_q - a->q_row0;
  p.q_pos0 = a->q_pos0;
  p.q_tiles = (p.q_rows + Cfg::BM - 1) / Cfg::BM;
  p.n_items = p.q_tiles * a->heads * a->batch; /* < 2^31: mk_attn_fwd_check */
  p.chunk = Cfg::PERSISTENT ? chunk : MK_ATTN_CHUNK_HEADS; /* the grid's own order otherwise */
  p.num_kv_blocks = a->num_kv_blocks;
  p.out = (__nv_bfloat16*)a->out;
  p.lse = a->lse;
  p.scale = (float)(1.0 / sqrt((double)Cfg::D));
  p.scale_log2 = (float)(1.4426950408889634 / sqrt((double)Cfg::D));
  p.err = a->err;
  p.timeout_ns = (uint64_t)(a->timeout_ms ? a->timeout_ms : MK_ATTN_DEFAULT_TIMEOUT_MS) * 1000000ull;

  cudaError_t e = attn_prepare_cfg<Cfg>();
  if (e == cudaSuccess) {
    const dim3 grid = Cfg::PERSISTENT ? dim3((unsigned)(p.n_items < sms ? p.n_items : sms))
                                      : dim3((unsigned)p.q_tiles, (unsigned)a->heads, (unsigned)a->batch);
    mk_attn_fwd_kernel<Cfg><<<grid, Cfg::THREADS, Cfg::SMEM_BYTES, stream>>>(maps, p);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) {
    MK_WARN("mk_attn_fwd: launch failed: %s", cudaGetErrorString(e));
    return -EIO;
  }
  return 0;
}

/* The configuration of a variant for the call's head dimension. */
template <class Cfg128, class Cfg64>
static int attn_launch_d(const struct mk_attn_args* a, cudaStream_t stream, int sms, int chunk) {
  return a->d_head == 128 ? attn_launch_cfg<Cfg128>(a, stream, sms, chunk)
                          : attn_launch_cfg<Cfg64>(a, stream, sms, chunk);
}

extern "C" int mk_attn_fwd_launch_variant(const struct mk_attn_args* a, cudaStream_t stream, int variant) {
  MK_CHECK(mk_attn_fwd_check(a));
  if (variant < 0 || variant >= MK_ATTN_VARIANTS) ATTN_REJECT("mk_attn_fwd: variant %d unknown", variant);
  int sms = 0;
  MK_CHECK(mk_sm90_sms("mk_attn_fwd", &sms));
  switch (variant) {
    case 1: return attn_launch_d<mk_attn_cfg_d128_plain, mk_attn_cfg_d64_plain>(a, stream, sms, 0);
    case 2: return attn_launch_d<mk_attn_cfg_d128_pp2, mk_attn_cfg_d64_pp4>(a, stream, sms, 0);
    case 3: return attn_launch_d<mk_attn_cfg_d128_pers, mk_attn_cfg_d64_pers>(a, stream, sms, MK_ATTN_CHUNK_HEADS);
    case 4: return attn_launch_d<mk_attn_cfg_d128_pers, mk_attn_cfg_d64_pers>(a, stream, sms, 1);
    case 5: return attn_launch_d<mk_attn_cfg_d128_bn128, mk_attn_cfg_d64_bn128>(a, stream, sms, 0);
    case 6: return attn_launch_d<mk_attn_cfg_d128_split2, mk_attn_cfg_d64_split2>(a, stream, sms, 0);
    default: return attn_launch_d<mk_attn_cfg_d128, mk_attn_cfg_d64>(a, stream, sms, 0);
  }
}

extern "C" int mk_attn_fwd_launch(const struct mk_attn_args* a, cudaStream_t stream) {
  return mk_attn_fwd_launch_variant(a, stream, 0);
}
