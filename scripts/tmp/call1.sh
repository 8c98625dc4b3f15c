#!/usr/bin/env bash
# session 32 call 1: ring tier on the new backward core + ring forward 176-key A/B
set -u
tar xzf build-pack/b.tgz
B=build-dev
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv
P=$B/ab/8c96aa8+ring-attn-split-176
L=$OUT/ab; mkdir -p $L
for t in small large graph one_kernel; do
  timeout 120 $P/test_ring_attn $t > $L/patched_$t.log 2>&1; echo "patched test_ring_attn $t rc=$?"
done
for r in 1 2; do
  timeout 150 $P/ring_attn_perf -n 10 -w 2 > $L/patched_fwd_$r.log 2>&1; echo "patched fwd r$r rc=$?"; grep -A 5 '^#  B' $L/patched_fwd_$r.log
  timeout 150 $B/test/perf/fused/ring_attn_perf -n 10 -w 2 > $L/head_fwd_$r.log 2>&1; echo "head fwd r$r rc=$?"; grep -A 5 '^#  B' $L/head_fwd_$r.log
done
MK_BUILD=$B MK_SKIP_BUILD=1 scripts/gpu-check.sh ring
