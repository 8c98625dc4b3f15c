#!/usr/bin/env bash
# The ofi transport's threads under ThreadSanitizer: builds the loopback program alone with
# -fsanitize=thread (no CUDA, no verbs) in $MK_BUILD/tsan, then runs the two-sided cases where
# NCCL's thread, the comm's progress thread (its own, or the device's) and the stream threads
# meet, and fails on any report; last, builds every other target of that build (the project
# without CUDA and verbs must build). Ends with "N passed, N failed, N skipped".
#
# Left out: the cases that read a buffer while it lands on purpose (a message no test() asks
# about, puts watched until their flag turns, the proxy's stand-in kernels polling words),
# where the synchronisation is the peer's write through the network, which ThreadSanitizer
# cannot see; and cases whose time bounds do not allow its 5-15x slowdown. The cases run with
# LB_LAX_TIME_BOUNDS=1: a case that checks a bound of the transport's own (the eager close's
# 200 ms) then reports it without failing on it; the plain loopback runs check it. And with
# NCCL_MK_BYE_GRACE_MS=30000: a sender that closes right after its sends completed leaves data
# in flight, which its receiver, this slowed, did not always take within the default 1 s
# (session 70: the provider-queue-4 ordering case failed once so).
# usage: scripts/tsan-check.sh (exit 77 where the compiler has no ThreadSanitizer)
set -uo pipefail
source "$(dirname "$0")/common.sh"
tsan="$MK_BUILD/tsan"
if ! echo 'int main(void){return 0;}' | cc -fsanitize=thread -x c - -o /tmp/mk-tsan-probe.$$ 2>/dev/null; then
  echo "SKIP tsan-check: the C compiler cannot build with -fsanitize=thread"
  exit 77
fi
rm -f /tmp/mk-tsan-probe.$$
if [ ! -f "$tsan/build.ninja" ]; then
  meson setup "$tsan" "$MK_ROOT" -Dcuda=disabled -Dverbs=disabled -Db_sanitize=thread \
    -Db_lundef=false >"$tsan.setup.log" 2>&1 || { cat "$tsan.setup.log"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
fi
ninja -C "$tsan" test/loopback/loopback >"$tsan.ninja.log" 2>&1 ||
  { tail -30 "$tsan.ninja.log"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
[ -x "$tsan/test/loopback/loopback" ] || { echo "SKIP tsan-check: no loopback program (libfabric missing)"; exit 77; }

# progress thread mode (1: the comm's, 2: the device's) x endpoints per comm, then the cases
configs="1:4 2:4 1:1"
cases="killed_peer_gives_econnreset_within_bound
sends_either_side_of_the_thread_send_threshold_land_in_their_receives
ordering_300_striped_messages
grouped_recv_with_striped_buffers
eager_crossing_posted_receives_3000_messages_in_order
eager_crossing_written_and_unannounced_receives_3000_messages_in_order
a_small_receive_whose_message_is_late_sends_its_clear_to_send_after_all
a_sender_closing_after_its_eager_sends_completed_loses_none
both_ends_closing_their_send_comms_at_once_get_their_credits_back
a_sender_closing_after_its_receiver_closed_stops_at_the_bye
close_joins_every_stream_thread
connection_hint_connect_ahead_forms_every_streams_connection_before_any_data
written_messages_land_exact_and_both_ends_count_them
sends_asked_before_their_receive_is_posted_land_whole
progress_goes_to_the_callers_after_small_messages_and_back_for_a_large_one"
pass=0 fail=0
# one case under ThreadSanitizer: run_case CASE LABEL LOG-SUFFIX [VAR=value ...]
run_case() {
  local c=$1 label=$2 log="$tsan/tsan.$1.$3.log" rc
  shift 3
  env NCCL_MK_TRANSPORT=ofi NCCL_MK_SOCKET_IFNAME=lo LB_LAX_TIME_BOUNDS=1 \
    NCCL_MK_BYE_GRACE_MS=30000 "$@" \
    TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" \
    timeout 300 "$tsan/test/loopback/loopback" "$c" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && ! grep -q "WARNING: ThreadSanitizer" "$log"; then
    pass=$((pass + 1)); echo "ok    $c ($label)"
  else
    fail=$((fail + 1)); echo "FAIL  $c ($label): rc $rc, $log"
    grep -m1 -A12 "WARNING: ThreadSanitizer" "$log" | sed 's/^/      /'
  fi
}
for cfg in $configs; do
  p=${cfg%%:*} s=${cfg##*:}
  for c in $cases; do
    run_case "$c" "progress $p, streams $s" "p${p}s$s" NCCL_MK_OFI_PROGRESS_THREAD="$p" NCCL_MK_OFI_STREAMS="$s"
  done
done
# the device's thread resuming half-posted sends: the provider's queue shortened to 4 sends
run_case ordering_300_striped_messages_resuming_sends_the_provider_had_no_room_for \
  "progress 2, streams 4, provider queue 4" p2s4 NCCL_MK_OFI_PROGRESS_THREAD=2 NCCL_MK_OFI_STREAMS=4 FI_OFI_RXM_TX_SIZE=4
# This build is also the project without CUDA and verbs: every target of it must build (session
# 45: a unit test of CUDA-only code, declared outside the CUDA-only block, broke it unnoticed).
if ninja -C "$tsan" >"$tsan.ninja-all.log" 2>&1; then
  pass=$((pass + 1)); echo "ok    every target builds without CUDA and verbs"
else
  fail=$((fail + 1)); echo "FAIL  the build without CUDA and verbs: $tsan.ninja-all.log"
  grep -m3 -B1 -A4 "FAILED\|error:" "$tsan.ninja-all.log" | sed 's/^/      /'
fi
echo "$pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
