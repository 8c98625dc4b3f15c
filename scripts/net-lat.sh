#!/usr/bin/env bash
# One message's cost over the ofi transport on this host (lo): two-sided ping-pong latency
# (median, mean, p90, p99, then the median time inside the send's post; one and four
# endpoints; rxm's eager buffer at its default and 256 KiB) and one-sided puts one at a time.
# usage: scripts/net-lat.sh (MK_BUILD names the build)
B=${MK_BUILD:-build}
export NCCL_MK_SOCKET_IFNAME=lo LB_BENCH_ITERS=400

# bench CASE [ENV...]: the loopback benchmark CASE's BENCH line, fields 4 on
bench() {
  local c=$1; shift
  env "$@" timeout 60 "$B/test/loopback/loopback" "$c" 2>&1 | awk '/^BENCH/ {for (i = 4; i <= NF; i++) printf "%s%s", $i, i < NF ? " " : "\n"}'
}

for sz in 4096 16384 32768 131072 524288; do
  for s in 1 4; do
    a=$(bench bench_lat NCCL_MK_OFI_STREAMS=$s LB_BENCH_SIZE=$sz)
    b=$(bench bench_lat NCCL_MK_OFI_STREAMS=$s LB_BENCH_SIZE=$sz FI_OFI_RXM_BUFFER_SIZE=262144)
    c=$(bench bench_put_bw NCCL_MK_OFI_STREAMS=$s LB_BENCH_SIZE=$sz LB_BENCH_WINDOW=1 |
        awk -v n=$sz '{printf "%.1f", n / ($1 * 1.048576)}')
    echo "size $sz streams $s: send lat median/mean/p90/p99, post median us [$a] rxmbuf256K [$b] put us/op (window 1) [$c]"
  done
done
