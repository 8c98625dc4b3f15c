# Sourced by the VM's /init in bench mode: perftest and our transport on the same soft-RoCE
# device (rxe0 on lo), interleaved, BENCH_REPS repetitions; prints BENCH lines for the host.
# Both sides use their defaults, except that ours has the NCCL-default ACK timeout (20).
reps=${BENCH_REPS:-5}
pt_bw() { # size iters
  ib_write_bw -d rxe0 -x 1 -s $1 -n $2 -F >/dev/null 2>&1 &
  sleep 0.5
  ib_write_bw -d rxe0 -x 1 -s $1 -n $2 -F 127.0.0.1 2>/dev/null |
    awk -v s=$1 '$1 == s && NF >= 4 {print "BENCH perftest_bw " s " " $4}'
  wait
}
pt_lat() {
  ib_write_lat -d rxe0 -x 1 -s $1 -n $2 -F >/dev/null 2>&1 &
  sleep 0.5
  ib_write_lat -d rxe0 -x 1 -s $1 -n $2 -F 127.0.0.1 2>/dev/null |
    awk -v s=$1 '$1 == s && NF >= 6 {print "BENCH perftest_lat " s " " $5 " " $6}'
  wait
}
mk_bw() { LB_BENCH_WINDOW=${3:-32} LB_BENCH_SIZE=$1 LB_BENCH_ITERS=$2 timeout 60 ./loopback bench_bw 2>/dev/null | grep '^BENCH' | sed "s/mk_bw/mk_bw${4}/"; }
mk_lat() { LB_BENCH_SIZE=$1 LB_BENCH_ITERS=$2 timeout 60 ./loopback bench_lat 2>/dev/null | grep '^BENCH'; }
for r in $(seq 1 $reps); do
  for s in 65536 1048576 4194304; do
    n=$((268435456 / s)); [ $n -gt 1000 ] && n=1000
    pt_bw $s $n
    mk_bw $s $n
  done
  mk_bw 1048576 256 8 _w8
  pt_lat 2 1000
  mk_lat 2 1000
done
