#!/usr/bin/env bash
set -u
tar xzf build-pack/b.tgz
B=build-dev
export NCCL_NVLS_ENABLE=0
L=$OUT/ab; mkdir -p $L
MK_DIAG_EVENTS=1 timeout 200 $B/ab/bc3523e+diag-events/ring_attn_perf -b -n 3 -w 1 -c 0,1 > $L/diag.log 2>&1; echo "diag rc=$?"
grep -A 3 '^#  B' $L/diag.log
grep DIAG $L/diag.log | tail -12
timeout 200 $B/test/perf/fused/moe_perf -n 20 -w 3 > $L/moe.log 2>&1; echo "moe rc=$?"; grep -A 6 '^# shape' $L/moe.log
