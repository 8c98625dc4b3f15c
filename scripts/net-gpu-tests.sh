#!/usr/bin/env bash
# The net plugin carrying real NCCL traffic on a 2-GPU machine, forced through the network
# path: every collective with correct results under each NCCL_PROTO, with each NCCL library
# found (the system one and PyTorch's), that NCCL_DEBUG=INFO shows our transport, the
# harness checker's negative control, and a killed rank ending the other with an error.
# Prints one line per check and "N passed, N failed" last. The build is carried (MK_BUILD).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$(cd "${MK_BUILD:-build}" && pwd)
LOGS=${MK_CHECK_LOGS:-${OUT:+$OUT/net-gpu}}
LOGS=${LOGS:-/tmp/net-gpu}
mkdir -p "$LOGS"
PASS=0 FAIL=0
NET_ENV=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_TUNER_PLUGIN=none
         NCCL_NET_PLUGIN="$B/libnccl-net-mk.so" NCCL_NET=mk
         NCCL_MK_SOCKET_IFNAME="${NCCL_MK_SOCKET_IFNAME:-lo}")

result() { # name, 0|1
  if [ "$2" -eq 0 ]; then PASS=$((PASS + 1)); echo "pass  $1"; else FAIL=$((FAIL + 1)); echo "FAIL  $1"; tail -n 8 "$LOGS/$1.log" | sed 's/^/      /'; fi
}

nccl_libs() { # prints label=dir for each NCCL found
  local sys
  sys=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')
  [ -n "$sys" ] && echo "system=$(dirname "$sys")"
  local torch
  torch=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$torch" ] && [ -f "$torch/libnccl.so.2" ] && echo "pytorch=$torch"
}

run_coll() { # name, lib dir, proto, collective, max bytes
  local name=$1 dir=$2 proto=$3 coll=$4 max=$5
  timeout 300 env "${NET_ENV[@]}" LD_LIBRARY_PATH="$dir" NCCL_PROTO="$proto" \
    "$B/test/perf/coll/${coll}_perf" -p 2 -H -b 8 -e "$max" -f 64 -n 1 -w 0 -c 1 \
    >"$LOGS/$name.log" 2>&1
  local rc=$?
  grep -q "Out of bounds values : 0 OK" "$LOGS/$name.log" || rc=1
  result "$name" $rc
}


check_collectives() {
  for entry in $(nccl_libs); do
    label=${entry%%=*} dir=${entry#*=}
    for proto in Simple LL LL128; do
      max=256M; [ "$proto" != Simple ] && max=8M  # LL/LL128 carry flags with the data: slow
      for coll in all_reduce all_gather reduce_scatter alltoall sendrecv; do
        run_coll "${label}_${proto}_${coll}" "$dir" "$proto" "$coll" "$max"
      done
    done
  done
}

# NCCL says which transport it used: our lines carry NET/MK and NCCL names NET/mk.
check_debug_line() {
  name=nccl_debug_shows_our_transport
  env "${NET_ENV[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$B/test/perf/coll/all_reduce_perf" \
    -p 2 -H -b 1M -e 1M -n 1 -w 0 >"$LOGS/$name.log" 2>&1
  grep -q "NET/MK" "$LOGS/$name.log" && grep -qi "via NET/mk" "$LOGS/$name.log"
  result $name $?
}

# The checker's negative control: one corrupted element must be reported.
check_negative_control() {
  name=harness_checker_reports_a_corrupted_element
  env "${NET_ENV[@]}" "$B/test/perf/coll/all_reduce_perf" -p 2 -H -b 1M -e 1M -n 1 -w 0 -X \
    >"$LOGS/$name.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && grep -q "FAILED" "$LOGS/$name.log"
  result $name $?
}

# A rank killed mid-run: the survivor must end with an error, not hang.
# The launcher's own status is the victim's; what counts is that the survivor said why it
# stopped (NCCL's asynchronous error or a failed call) before the 60 s timeout.
check_killed_rank() {
  name=killed_rank_ends_the_other_with_an_error
  # Short timed loops (-n 10), repeated: the host waits often, watching NCCL's errors.
  ( env "${NET_ENV[@]}" timeout 60 "$B/test/perf/coll/all_reduce_perf" -p 2 -H -b 64M -e 64M \
      -n 10 -R 100000 -w 0 -c 0 >"$LOGS/$name.log" 2>&1; echo "exit $?" >>"$LOGS/$name.log" ) &
  sleep 8
  victim=$(pgrep -f "all_reduce_perf.*-P 1" | head -1)
  [ -n "$victim" ] && kill -9 "$victim"
  wait
  ! grep -q "exit 124" "$LOGS/$name.log" && [ -n "$victim" ] &&
    grep -qE "NCCL reported|NCCL (remote|system|internal|unhandled)" "$LOGS/$name.log" &&
    ! grep -qE "terminated with signal|Segmentation fault" "$LOGS/$name.log"
  result $name $?
}

# usage: net-gpu-tests.sh [collectives|debug_line|negative_control|killed_rank ...]
for c in ${@:-collectives debug_line negative_control killed_rank}; do "check_$c"; done

echo "$PASS passed, $FAIL failed"
[ $FAIL -eq 0 ]
