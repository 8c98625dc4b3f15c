#!/usr/bin/env bash
# The transport and the proxy under AddressSanitizer and UndefinedBehaviorSanitizer: builds the
# project without CUDA and verbs with -fsanitize=address,undefined in $MK_BUILD/asan, then runs
# every two-process loopback case (one endpoint without, four with the progress thread), every
# proxy_loopback case and the plugin's v11 table driven with traffic, and fails on any report.
# Leaks are not judged: libfabric keeps 62 bytes of its own after its module is gone
# (bench/NOTES.md, session 45). Ends with "N passed, N failed, N skipped".
# usage: scripts/asan-check.sh (exit 77 where the compiler has no AddressSanitizer)
set -uo pipefail
source "$(dirname "$0")/common.sh"
asan="$MK_BUILD/asan"
if ! echo 'int main(void){return 0;}' | cc -fsanitize=address,undefined -x c - -o /tmp/mk-asan-probe.$$ 2>/dev/null; then
  echo "SKIP asan-check: the C compiler cannot build with -fsanitize=address,undefined"
  exit 77
fi
rm -f /tmp/mk-asan-probe.$$
if [ ! -f "$asan/build.ninja" ]; then
  meson setup "$asan" "$MK_ROOT" -Dcuda=disabled -Dverbs=disabled -Db_sanitize=address,undefined \
    -Db_lundef=false >"$asan.setup.log" 2>&1 || { cat "$asan.setup.log"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
fi
ninja -C "$asan" test/loopback/loopback test/loopback/proxy_loopback \
  test/loopback/test_net_table_traffic libnccl-net-mk.so >"$asan.ninja.log" 2>&1 ||
  { tail -30 "$asan.ninja.log"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
[ -x "$asan/test/loopback/loopback" ] || { echo "SKIP asan-check: no loopback program (libfabric missing)"; exit 77; }

# The cases the loopback suite runs (test/loopback/meson.build's lists), minus the verbs-only ones.
cases=$(python3 - "$MK_ROOT/test/loopback/meson.build" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
seen = dict.fromkeys(re.findall(r"\['([a-z0-9_]+)', \d+\]", s))
print(" ".join(c for c in seen if not c.startswith(("vdevice", "device_removed"))))
PY
)
pass=0 fail=0
# one run: run_judged NAME LABEL [VAR=value ...] -- COMMAND ...
run_judged() {
  local c=$1 label=$2 log="$asan/asan.$1.$2.log" rc vars=()
  shift 2
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  env NCCL_MK_TRANSPORT=ofi NCCL_MK_SOCKET_IFNAME=lo "${vars[@]}" ASAN_OPTIONS=detect_leaks=0 \
    UBSAN_OPTIONS=print_stacktrace=1 timeout 300 "$@" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && ! grep -qE "ERROR: AddressSanitizer|runtime error:" "$log"; then
    pass=$((pass + 1)); echo "ok    $c ($label)"
  else
    fail=$((fail + 1)); echo "FAIL  $c ($label): rc $rc, $log"
    grep -m1 -A12 -E "ERROR: AddressSanitizer|runtime error:" "$log" | sed 's/^/      /'
  fi
}
# one loopback case: run_case PROGRAM CASE LABEL [VAR=value ...]
run_case() {
  local prog=$1 c=$2 label=$3
  shift 3
  run_judged "$c" "$label" "$@" -- "$asan/test/loopback/$prog" "$c"
}
# The plugin's table as NCCL drives it, from the instrumented shared object: a second deregMr
# or close must be refused without reading the freed object (plugin/net_live.h)
run_judged net_table_v11 table -- \
  "$asan/test/loopback/test_net_table_traffic" "$asan/libnccl-net-mk.so" v11
for c in $cases; do
  if [[ $c == proxy_* ]]; then
    run_case proxy_loopback "$c" streams4 NCCL_MK_OFI_STREAMS=4
    continue
  fi
  # as the loopback suite runs them: its progress-thread cases only with the thread
  case $c in
    progress_thread_moves_*|idle_comm_threads_*|sends_either_side_of_the_thread_*|several_comms_carry_*|\
    progress_goes_to_the_callers_*) ;;
    *) run_case loopback "$c" streams1 NCCL_MK_OFI_STREAMS=1 NCCL_MK_OFI_PROGRESS_THREAD=0 ;;
  esac
  run_case loopback "$c" streams4 NCCL_MK_OFI_STREAMS=4 NCCL_MK_OFI_PROGRESS_THREAD=1
done
echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
