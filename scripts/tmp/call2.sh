#!/usr/bin/env bash
# session 32 call 2: backward step order (variant 5) A/B on the core and the ring; pairs tier
set -u
tar xzf build-pack/b.tgz
B=build-dev
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P=$B/ab/5772596+qmajor-default
L=$OUT/ab; mkdir -p $L
for t in backward offsets negative_control; do
  MK_ATTN_VARIANT=5 timeout 120 $B/test/gpu/test_attn_bwd $t > $L/v5_$t.log 2>&1; echo "test_attn_bwd v5 $t rc=$?"
done
SH="1,64,8,128,16384,1 16,16,16,128,4096,0 1,64,8,128,65536,1 1,64,8,64,16384,1"
for r in 1 2; do
  MK_ATTN_VARIANTS=0,5 timeout 200 $B/test/perf/attn/attn_perf -b 5 $SH > $L/attn_bwd_$r.log 2>&1; echo "attn_perf -b r$r rc=$?"; grep -E "causal" $L/attn_bwd_$r.log
done
for r in 1 2; do
  timeout 150 $P/ring_attn_perf -b -n 5 -w 1 -c 0,1 > $L/ring_q_$r.log 2>&1; echo "qmajor ring bwd r$r rc=$?"; grep -A 3 '^#  B' $L/ring_q_$r.log
  timeout 150 $B/test/perf/fused/ring_attn_perf -b -n 5 -w 1 -c 0,1 > $L/ring_h_$r.log 2>&1; echo "head ring bwd r$r rc=$?"; grep -A 3 '^#  B' $L/ring_h_$r.log
done
MK_BUILD=$B MK_SKIP_BUILD=1 MK_CHECK_LOGS=$OUT/pairs timeout 240 scripts/gpu-check.sh pairs
