#!/usr/bin/env bash
# One message's cost over the ofi transport on this host (lo): two-sided ping-pong latency
# (median and mean, one and four endpoints, rxm's eager buffer at its default and 256 KiB)
# and one-sided puts one at a time. usage: scripts/net-lat.sh (MK_BUILD names the build)
B=${MK_BUILD:-build}
export NCCL_MK_SOCKET_IFNAME=lo
for sz in 4096 16384 32768 131072 524288; do
  for s in 1 4; do
    a=$(NCCL_MK_OFI_STREAMS=$s LB_BENCH_SIZE=$sz LB_BENCH_ITERS=400 timeout 60 $B/test/loopback/loopback bench_lat 2>&1 | grep BENCH | awk '{print $4, $5, $6, $7}')
    b=$(FI_OFI_RXM_BUFFER_SIZE=262144 NCCL_MK_OFI_STREAMS=$s LB_BENCH_SIZE=$sz LB_BENCH_ITERS=400 timeout 60 $B/test/loopback/loopback bench_lat 2>&1 | grep BENCH | awk '{print $4, $5, $6, $7}')
    c=$(NCCL_MK_OFI_STREAMS=$s LB_BENCH_SIZE=$sz LB_BENCH_WINDOW=1 LB_BENCH_ITERS=400 timeout 60 $B/test/loopback/loopback bench_put_bw 2>&1 | grep BENCH | awk -v n=$sz '{printf "%.1f", n/($4*1.048576)}')
    echo "size $sz streams $s: send lat median/mean/p90/p99 us [$a] rxmbuf256K [$b] put us/op (window 1) [$c]"
  done
done
