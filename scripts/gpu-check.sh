#!/usr/bin/env bash
# The GPU suites and benchmarks, in tiers. Usage: scripts/gpu-check.sh [quick|gemm|attn|fused|ring|moe|net|torch|tune|tune-net|xnode|scale|scale-bench|pairs|all]
#   quick: the one-GPU test programs (GEMM, attention cores, the ring backward's zeroing) at
#          small sizes (< 3 minutes)
#   gemm:  the GEMM tests at large sizes (bf16 and fp8), then gemm_perf (bf16, then fp8)
#   attn:  the attention cores' tests (forward, backward; the other compiled variants against the
#          reference too), then attn_perf (forward, -b backward: every variant, interleaved),
#          ring_bwd_emul (the ring backward's core calls on one GPU) and the cores against cuDNN
#          in the same iterations (scripts/bench-torch-attn.py)
#   fused: the fused-op tests on 2 GPUs, then ag_gemm_perf, gemm_rs_perf, gemm_ar_perf
#   ring:  ncclMkRingAttention's tests on 2 GPUs (the forward's also with persistent CTAs, the
#          backward's with its split plan), then ring_attn_perf (the forward also with
#          persistent CTAs, 64K causal also with NCCL_MK_RA_FWD_CHUNK=16; the backward also
#          split), ring_bwd_emul and PyTorch's cuDNN attention (scripts/bench-torch-attn.py)
#   moe:   the MoE ops' tests on 2 GPUs (also with NCCL_MK_MOE_OVERLAP=1), then moe_perf
#          (also with the overlap, and with the fp8 dispatch: moe_perf -q)
#   net:   the net plugin under real NCCL on 2 GPUs (scripts/net-gpu-tests.sh), then
#          scripts/bench-net.sh with the default endpoints and one (MK_STREAMS, MK_EAGER,
#          MK_PROGRESS override; MK_NET_REPS interleaved runs, default 2),
#          then a traced 128 KiB all_reduce (NCCL_MK_NET_TRACE_DIR, scripts/mk-net-trace summary)
#   torch: the PyTorch package on 2 GPUs (test/gpu/test_torch_ops.py), then
#          scripts/bench-torch.py (MK_FUSED_SHAPES=small for M=4096 only)
#   tune:  scripts/tune.sh on all_reduce over NVLink (ring/tree x ll/ll128/simple x channels
#          0/8/16, 8 B-256 MiB x4), its one-process A/B check with 3 rounds and the keep
#          records; prints the check's goal lines (~2-3 minutes; not part of all)
#   tune-net: the same through the forced network path (tune.sh -H: a NCCL_HOSTID per rank; no
#          P2P, SHM or NVLS; our net plugin over libfabric tcp;ofi_rxm on lo), 1 KiB-64 MiB x4,
#          channels 0/4/8, 20 iterations; file $LOGS/tune-net.txt (aimed at < 4 minutes; not
#          part of all)
#   pairs: every 2-GPU test program's scenarios, no benchmarks (fused ops, MoE, ring attention,
#          the ring backward's split plan too); on a 1-GPU machine under
#          scripts/mps.sh the two ranks share the GPU (correctness only)
#   scale: issue 9 on 4 or 8 GPUs (skips with fewer): at 4 and 8 ranks (MK_SCALE_RANKS) every
#          GPU test program's scenarios (MK_TEST_RANKS; the fused ops also across emulated
#          nodes) (not part of all); MK_SCALE_PROGRAMS="fused xnode moe ring ring_bwd turn" picks
#          the programs (at 8 ranks on one GPU the whole tier needs more than one device call)
#   scale-bench: the same rank counts: {ag_gemm,gemm_rs,gemm_ar}_perf on the 8192 shapes and
#          bench-net (not part of all)
#   xnode: the fused ops' tests with each rank its own emulated node (NCCL_MK_LOCAL_SIZE=1: the
#          proxy over libfabric tcp;ofi_rxm), then {ag_gemm,gemm_rs,gemm_ar}_perf across those
#          nodes (not part of all)
# The build is made elsewhere (no GPU needed) and carried: MK_BUILD names it (default build).
# Logs go to MK_CHECK_LOGS (default $OUT/gpu-check when OUT is set, else /tmp/gpu-check).
# MK_CHECK_PROGRESS=1 also prints each step's row as it ends. MK_STEP_TIMEOUT bounds each step
# (seconds, default 480).
# To add a tier: write a tier_NAME function that calls `step NAME COMMAND...` and add it to
# the case at the bottom.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${MK_BUILD:-build}
source "$(dirname "$0")/common.sh" # mk_gpu_count
LOGS=${MK_CHECK_LOGS:-${OUT:+$OUT/gpu-check}}
LOGS=${LOGS:-/tmp/gpu-check}
mkdir -p "$LOGS"
ROWS=()
FAILED=0

# step NAME CMD...: runs CMD, logs it, records pass / FAIL / skip (exit 77) and seconds.
step() {
  local name=$1; shift
  local t0=$SECONDS rc
  timeout "${MK_STEP_TIMEOUT:-480}" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  local st=pass
  if [ $rc -eq 77 ]; then st=skip; elif [ $rc -ne 0 ]; then st=FAIL; FAILED=$((FAILED + 1)); fi
  ROWS+=("$(printf '%-48s %-5s %5ss' "$name" "$st" $((SECONDS - t0)))")
  [ "${MK_CHECK_PROGRESS:-0}" = 1 ] && echo "${ROWS[-1]}" # each row as it ends (a call that may be cut short)
  if [ "$st" = FAIL ]; then
    # what went wrong first (the WARN / failed / timed-out lines; NCCL's INFO lines drown a
    # plain tail), then the last lines
    echo "---- $name (rc $rc), its errors:"
    grep -E "WARN|failed|FAIL|timed out|error|Error|stuck:|SKIP" "$LOGS/$name.log" | grep -v "NCCL INFO" |
      sort | uniq -c | sort -rn | head -n 10 | cut -c1-240
    echo "---- last lines:"
    grep -v "NCCL INFO" "$LOGS/$name.log" | tail -n 8 | cut -c1-240
  fi
}

# gpus_at_least N TIER: 0 when this host has N GPUs (GPUS gets the count); else a skip row
# saying so, and 1.
# With MK_SHARE_GPU=1 the ranks share GPUs, one is enough: under scripts/mps.sh (concurrent), or
# without MPS, where the ranks' contexts time-slice the GPU (the peer_dies* scenarios need that).
gpus_at_least() {
  GPUS=$(mk_gpu_count)
  [ "$GPUS" -ge "$1" ] && return 0
  [ "${MK_SHARE_GPU:-0}" = 1 ] && [ "$GPUS" -ge 1 ] && return 0
  echo "$2: needs $1 GPUs, found $GPUS"
  ROWS+=("$(printf '%-48s %-5s %5ss' "$2_needs_$1_gpus" skip 0)")
  return 1
}

# scenarios LIST BINARY [SUFFIX]: one step per "scenario:step_name" of LIST (named
# step_name SUFFIX), running BINARY scenario; with SCENARIO_ENV set, under env $SCENARIO_ENV.
scenarios() {
  local list=$1 bin=$2 sfx=${3:-} t pre=()
  [ -n "${SCENARIO_ENV:-}" ] && read -ra pre <<< "env $SCENARIO_ENV"
  for t in $list; do step "${t#*:}$sfx" "${pre[@]}" "$bin" "${t%%:*}"; done
}


GEMM_TESTS="odd_shapes:gemm_matches_float64_on_odd_shapes cublas:gemm_matches_cublaslt
negative_control:gemm_checker_rejects_one_bad_element ready_flags:gemm_waits_for_row_block_flags
timeout:gemm_times_out_cleanly_on_a_missing_flag row_block_order:gemm_follows_row_block_order
error_record_claim:error_record_keeps_one_waits_fields_when_many_expire_together
epilogues:gemm_stores_or_adds_into_another_buffer tile_flags:gemm_raises_tile_flags_after_stores
num_sms:gemm_is_correct_with_any_sm_count grouped:gemm_grouped_handles_uneven_and_empty_groups
grouped_few_rows:gemm_grouped_with_a_few_rows_per_group grouped_ready_flags:gemm_grouped_waits_for_each_groups_flag
bad_input:gemm_rejects_bad_input_untouched a_local:gemm_reads_local_rows_in_place_without_waiting
block_m64:gemm_with_64_row_tiles_matches_float64
rs_epilogue:gemm_reduce_scatter_epilogue_sums_peers_partials_and_times_out_cleanly
scatter_epilogue:gemm_row_scatter_epilogue_sends_each_row_to_its_destination_and_notifies_nothing_when_it_gave_up
fp8_odd_shapes:gemm_fp8_matches_quantized_float64_on_odd_shapes fp8_cublas:gemm_fp8_matches_cublaslt_fp8
fp8_epilogues:gemm_fp8_adds_into_bf16_and_fp32_and_runs_grouped
fp8_negative_control:gemm_fp8_checker_rejects_missing_scales_and_one_bad_element
fp8_bad_input:gemm_fp8_rejects_bad_input_untouched"

ATTN_TESTS="reference_matches_cpu:attn_float64_reference_matches_a_cpu_loop
backward_reference_matches_cpu:attn_float64_backward_reference_matches_a_cpu_loop_and_finite_differences
rank_rows:attn_rank_rows_follow_the_zigzag_and_contiguous_splits"

# The forward attention core on one GPU (test/gpu/test_attn.cu).
ATTN_CORE_TESTS="forward:attn_forward_matches_float64
offsets:attn_forward_causal_offsets_match_float64
negative_control:attn_checker_rejects_one_bad_element bad_input:attn_forward_rejects_bad_input_untouched"

# The backward attention core on one GPU (test/gpu/test_attn_bwd.cu).
ATTN_BWD_TESTS="backward:attn_backward_matches_float64
offsets:attn_backward_ring_offsets_and_accumulation_match_float64
split:attn_backward_split_heads_each_output_kind_matches_float64_and_respects_the_gate
negative_control:attn_backward_checker_rejects_one_bad_element_and_a_wrong_lse
ready_flags:attn_backward_waits_for_its_key_tiles_ready_flags_and_times_out_naming_a_missing_one
addends:attn_backward_adds_peer_partials_once_ready_and_times_out_naming_a_missing_one
pdl:attn_backward_main_kernel_starts_beside_the_kernel_before_it_with_pdl
one_launch:attn_backward_with_phase_words_is_one_kernel_correct_in_graphs_and_beside_held_sms
bad_input:attn_backward_rejects_bad_input_untouched"

tier_quick() {
  scenarios "$GEMM_TESTS" "$B/test/gpu/test_gemm"
  scenarios "$ATTN_TESTS" "$B/test/gpu/test_attn_ref"
  scenarios "$ATTN_CORE_TESTS" "$B/test/gpu/test_attn"
  scenarios "$ATTN_BWD_TESTS" "$B/test/gpu/test_attn_bwd"
  step ring_backward_zero_waits_for_the_owners_previous_call_and_closes_the_gate_on_timeout \
    "$B/test/gpu/test_ring_bwd_zero"
}

tier_gemm() {
  local t
  for t in odd_shapes cublas grouped fp8_odd_shapes fp8_cublas; do
    step "gemm_large_$t" "$B/test/gpu/test_gemm" "$t" large
  done
  step gemm_perf "$B/test/perf/gemm/gemm_perf"
  grep -A 40 '^     M' "$LOGS/gemm_perf.log" || true
  # e4m3 operands against cuBLASLt's fp8 GEMM (fast accumulation, as ours), same shapes
  step gemm_fp8 "$B/test/perf/gemm/gemm_perf" fp8 20
  grep -A 40 '^     M' "$LOGS/gemm_fp8.log" || true
  step gemm_trace_overhead "$B/test/perf/gemm/gemm_perf" trace
  cat "$LOGS/gemm_trace_overhead.log"
}

FUSED_TESTS="correctness:fused_ops_match_float64_on_odd_shapes bad_input:fused_ops_reject_bad_input_untouched
graph:fused_ops_replay_in_cuda_graphs_with_fresh_inputs back_to_back:fused_ops_back_to_back_with_a_delayed_rank
negative_control:fused_checker_rejects_one_bad_element group_init:fused_init_inside_nccl_group_one_thread_two_gpus
hang_report:planted_missing_flag_gives_a_hang_report_naming_rank_tile_flag_and_peer
one_kernel:fused_ops_are_one_kernel_per_call_on_their_overlapped_paths
two_comms:two_fused_communicators_at_once_share_no_state
nonblocking_comm:fused_ops_on_a_nonblocking_communicator_wait_out_its_in_progress_answers
init_fails_on_one_rank:an_init_that_fails_on_one_rank_fails_on_every_rank_none_waiting
init_config_refused_on_one_rank:a_config_refused_on_one_rank_fails_every_ranks_init
init_configs_differ:configs_that_differ_between_ranks_fail_every_ranks_init
group_init_refused_first_call:a_refused_first_call_after_a_grouped_init_still_finishes_its_exchange
absent_peer:fused_op_without_its_peer_ends_in_an_async_error_and_later_calls_fail
absent_peer_graph:fused_op_graph_replayed_without_its_peer_errs_and_on_the_broken_comm_ends_at_once
late_peer:ag_gemm_of_a_late_peer_ends_in_an_error_or_the_right_output
late_peer_rs:gemm_rs_of_a_late_peer_ends_in_an_error_or_the_right_output
late_peer_ar:gemm_ar_of_a_late_peer_ends_in_an_error_or_the_right_output
killed_peer:fused_op_whose_peer_process_died_ends_in_an_async_error
peer_dies_mid_call:fused_op_whose_peer_died_mid_call_ends_in_an_async_error_without_a_fault
peer_dies_mid_call_rs:gemm_rs_whose_peer_died_mid_call_ends_in_an_async_error_without_a_fault
peer_dies_mid_call_ar:gemm_ar_whose_peer_died_mid_call_ends_in_an_async_error_without_a_fault
proxy_bytes:fused_ops_send_nothing_through_the_proxy_when_every_rank_is_local
busy_sms:fused_ops_finish_correct_while_another_kernel_holds_a_quarter_of_the_sms
busy_sms_most:fused_ops_finish_correct_while_another_kernel_holds_three_quarters_of_the_sms"

# The same on 2 GPUs with each rank its own emulated node (NCCL_MK_LOCAL_SIZE=1): the overlapped
# ops go through the proxy over libfabric tcp;ofi_rxm on loopback. group_init does not apply
# (a thread per rank is needed to connect the proxies).
XNODE_TESTS="correctness:xnode_fused_ops_match_float64_on_odd_shapes bad_input:xnode_fused_ops_reject_bad_input_untouched
one_kernel:xnode_fused_ops_are_one_kernel_per_call_across_nodes
graph:xnode_fused_ops_replay_in_cuda_graphs_with_fresh_inputs back_to_back:xnode_fused_ops_back_to_back_with_a_delayed_rank
negative_control:xnode_fused_checker_rejects_one_bad_element
hang_report:xnode_planted_missing_flag_gives_a_hang_report_naming_rank_tile_flag_and_peer
absent_peer:xnode_fused_op_without_its_peer_ends_in_an_async_error_and_later_calls_fail
late_peer:xnode_ag_gemm_of_a_late_peer_ends_in_an_error_or_the_right_output
late_peer_rs:xnode_gemm_rs_of_a_late_peer_ends_in_an_error_or_the_right_output
late_peer_ar:xnode_gemm_ar_of_a_late_peer_ends_in_an_error_or_the_right_output
proxy_bytes:xnode_proxy_sends_exactly_each_ops_rows
killed_peer:xnode_fused_op_whose_peer_process_died_ends_in_an_async_error
peer_dies_mid_call:xnode_fused_op_whose_peer_died_mid_call_ends_in_an_async_error_without_a_fault
no_proxy_fallback:xnode_without_a_transport_every_rank_falls_back_to_the_reference_paths
group_init_refused_first_call:xnode_a_refused_first_call_after_a_grouped_init_joins_the_cross_node_exchange"

# The fused ops on 2 GPUs (skipped with fewer), then their benchmarks at the shapes of
# DESIGN.md (MK_FUSED_SHAPES=small for a short run).
tier_fused() {
  local t
  scenarios "$FUSED_TESTS" "$B/test/gpu/test_fused_ops"
  # The planted hang's report file, rendered by scripts/mk-trace (the test left it in /tmp).
  step hang_report_renders_with_mk_trace bash -c \
    'f=$(ls -t /tmp/mk-hang-report.*/*.hang.txt | head -1) && scripts/mk-trace hang "$f"'
  # The reference path (NCCL_MK_FUSED=0: NCCL's collective, then the GEMM core) that the
  # overlapped AllGather+GEMM (the default, for shapes with 128-row shards) falls back to.
  for t in correctness graph back_to_back group_init; do
    step "fused_ops_${t}_on_the_reference_path" env NCCL_MK_FUSED=0 "$B/test/gpu/test_fused_ops" "$t"
  done
  local m="2048,4096,8192,16384"
  [ "${MK_FUSED_SHAPES:-}" = small ] && m="4096"
  for op in ag_gemm gemm_rs gemm_ar; do
    step "${op}_perf" "$B/test/perf/fused/${op}_perf" -M "$m" -n 20 -w 3 -J "$LOGS/${op}_perf.json"
    grep -A 20 '^#    M' "$LOGS/${op}_perf.log" || true
  done
  # A traced AllGather+GEMM call on its overlapped path: every tile once, no tile before the
  # row-block it reads arrived (scripts/mk-trace check), and the picture.
  step trace_of_a_real_ag_gemm_call_passes_mk_trace_check bash -c "rm -rf '$LOGS/trace' &&
    mkdir -p '$LOGS/trace' && NCCL_MK_TRACE=1 NCCL_MK_TRACE_DIR='$LOGS/trace' \
    '$B/test/perf/fused/ag_gemm_perf' -M 4096 -N 8192 -n 2 -w 1 >/dev/null &&
    scripts/mk-trace check '$LOGS'/trace/mk-trace.rank*.call3.trace &&
    scripts/mk-trace summary '$LOGS'/trace/mk-trace.rank*.call3.trace"
  step ag_gemm_perf_reference env NCCL_MK_FUSED=0 "$B/test/perf/fused/ag_gemm_perf" -M "$m" -n 20 -w 3
  grep -A 20 '^#    M' "$LOGS/ag_gemm_perf_reference.log" || true
}

# Every 2-GPU test program's scenarios (fused ops, MoE, ring attention forward and backward),
# no benchmarks: the check after a change to what they share (test/gpu/rank_harness.cuh).
tier_pairs() {
  scenarios "$FUSED_TESTS" "$B/test/gpu/test_fused_ops"
  scenarios "$MOE_TESTS" "$B/test/gpu/test_moe"
  step moe_ops_busy_sms_with_overlap env NCCL_MK_MOE_OVERLAP=1 "$B/test/gpu/test_moe" busy_sms
  scenarios "$RING_TESTS" "$B/test/gpu/test_ring_attn"
  NCCL_MK_RA_FWD_PERSISTENT=1 scenarios "$RING_PERSISTENT_TESTS" "$B/test/gpu/test_ring_attn"
  scenarios "$RING_BWD_TESTS" "$B/test/gpu/test_ring_attn_bwd"
  NCCL_MK_RA_BWD_ONE_LAUNCH=1 scenarios "$RING_BWD_ONE_LAUNCH_TESTS" "$B/test/gpu/test_ring_attn_bwd"
  NCCL_MK_RA_BWD_ONE_KERNEL=1 scenarios "$RING_BWD_ONE_KERNEL_TESTS" "$B/test/gpu/test_ring_attn_bwd"
  NCCL_MK_RA_BWD_MERGED=0 NCCL_MK_RA_BWD_OWN_LAST=0 scenarios "$RING_BWD_SPLIT_TESTS" "$B/test/gpu/test_ring_attn_bwd"
  ops_in_turn
}

# Issue 9 on a machine with 4 or 8 GPUs (skipped with fewer), at MK_SCALE_RANKS ranks (default
# "4 8"; one rank count per call keeps each tier inside the device tool's 10 minutes).
# scale: every GPU test program's scenarios (MK_TEST_RANKS; the fused ops also with one
# emulated node per rank through the proxy; the planted-fault and absent-peer scenarios are
# 2-rank and skip themselves). scale-bench: the fused ops' benchmarks on the issue's 8192
# shapes against NCCL + cuBLASLt, then the net plugin against Socket through the forced
# network path.
# Under scripts/mps.sh (MK_SHARE_GPU=1) the ranks share the GPUs: every count runs, each rank's
# MPS client with 100/N % of the SMs (tier_scale sets it); correctness only.
scale_ranks() {
  local n
  for n in ${MK_SCALE_RANKS:-4 8}; do
    if [ "$GPUS" -ge "$n" ] || [ "${MK_SHARE_GPU:-0}" = 1 ]; then echo "$n"; fi
  done
}

# MK_SCALE_PROGRAMS (default "fused xnode moe ring ring_bwd turn") picks the test programs: at 8
# ranks on one GPU the whole tier takes longer than one 10-minute device call (session 39).
scale_program() { [[ " ${MK_SCALE_PROGRAMS:-fused xnode moe ring ring_bwd turn} " == *" $1 "* ]]; }

tier_scale() {
  local n
  gpus_at_least 4 scale || return
  for n in $(scale_ranks); do
    # shared GPUs (scripts/mps.sh): each of the n ranks' MPS clients gets 100/n % of the SMs
    [ "${MK_SHARE_GPU:-0}" = 1 ] && export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / n))
    scale_program fused && MK_TEST_RANKS=$n scenarios "$FUSED_TESTS" "$B/test/gpu/test_fused_ops" "_${n}_ranks"
    scale_program xnode && MK_TEST_RANKS=$n NCCL_MK_LOCAL_SIZE=1 NCCL_MK_TRANSPORT=ofi \
      NCCL_MK_OFI_PROVIDER="tcp;ofi_rxm" NCCL_MK_TIMEOUT_MS=15000 \
      scenarios "$XNODE_TESTS" "$B/test/gpu/test_fused_ops" "_${n}_ranks"
    scale_program moe && MK_TEST_RANKS=$n scenarios "$MOE_TESTS" "$B/test/gpu/test_moe" "_${n}_ranks"
    scale_program ring && MK_TEST_RANKS=$n scenarios "$RING_TESTS" "$B/test/gpu/test_ring_attn" "_${n}_ranks"
    scale_program ring_bwd &&
      MK_TEST_RANKS=$n scenarios "$RING_BWD_TESTS" "$B/test/gpu/test_ring_attn_bwd" "_${n}_ranks"
    scale_program turn && MK_TEST_RANKS=$n scenarios "$OPS_IN_TURN_TESTS" "$B/test/gpu/test_ops_in_turn" "_${n}_ranks"
  done
  return 0
}

tier_scale_bench() {
  local n op
  gpus_at_least 4 scale-bench || return
  local m="4096,8192,16384"
  [ "${MK_FUSED_SHAPES:-}" = small ] && m="8192"
  for n in $(scale_ranks); do
    for op in ag_gemm gemm_rs gemm_ar; do
      step "${op}_perf_${n}_ranks" "$B/test/perf/fused/${op}_perf" -p "$n" -M "$m" -N 8192 -K 8192 \
        -n 20 -w 3 -J "$LOGS/${op}_perf_${n}.json"
      grep -A 10 '^#    M' "$LOGS/${op}_perf_${n}_ranks.log" || true
    done
    step "bench_net_${n}_ranks" env OUT="$LOGS/bench-net-$n" MK_SKIP_BUILD=1 MK_NET_PROCS="$n" \
      "$(dirname "$0")/bench-net.sh" all_reduce 256M
    sed -n '/== busbw/,$p' "$LOGS/bench_net_${n}_ranks.log"
  done
}

# Issue 13's emulated two-node setup (above), then the three ops' benchmarks with each rank its
# own NCCL node too (-H), so that NCCL's baseline crosses our net plugin (ofi tcp;ofi_rxm) too.
tier_xnode() {
  # new paths: a hang must cost little device time (waits 15 s, steps 120 s unless set)
  MK_STEP_TIMEOUT=${MK_STEP_TIMEOUT:-120}
  export NCCL_MK_TIMEOUT_MS=${NCCL_MK_TIMEOUT_MS:-15000}
  export NCCL_MK_LOCAL_SIZE=1 NCCL_MK_TRANSPORT=ofi NCCL_MK_OFI_PROVIDER="tcp;ofi_rxm"
  scenarios "$XNODE_TESTS" "$B/test/gpu/test_fused_ops"
  local op
  for op in ag_gemm gemm_rs gemm_ar; do
    step "${op}_perf_across_emulated_nodes" env NCCL_NET_PLUGIN="$B/libnccl-net-mk.so" NCCL_NET=mk \
      NCCL_TUNER_PLUGIN=none "$B/test/perf/fused/${op}_perf" -H -M 2048,4096 -N 8192 -K 8192 -n 5 -w 2
    grep -E '^(#    M|  [0-9]|# rank)' "$LOGS/${op}_perf_across_emulated_nodes.log" || true
  done
  # The transport's own bandwidth on this host, one direction, as the proxy drives it (2 MiB
  # put+signals over 4 streams) and two-sided: issue 13's E is the fused op's bytes per second
  # over it.
  step transport_put_bw env NCCL_MK_OFI_STREAMS=4 LB_BENCH_SIZE=2097152 LB_BENCH_SIGNAL=1 \
    LB_BENCH_WINDOW=8 LB_BENCH_ITERS=400 "$B/test/loopback/loopback" bench_put_bw
  step transport_bw env NCCL_MK_OFI_STREAMS=4 LB_BENCH_SIZE=2097152 LB_BENCH_WINDOW=8 \
    LB_BENCH_ITERS=400 "$B/test/loopback/loopback" bench_bw
  grep -h BENCH "$LOGS/transport_put_bw.log" "$LOGS/transport_bw.log" || true
  # The proxy itself as the ops drive it, both ways at once (2 MiB put+signals and their
  # unfenced acknowledgements), at 1 and 4 streams, with each block's publish-to-flag latency:
  # the instrument to set NCCL_MK_PROXY_STREAMS and _INFLIGHT_BYTES by (session 47 on the GPU
  # host: 4 streams 3.1-3.4 GB/s each way, the two-sided transport's rate both ways at once).
  local s
  for s in 1 4; do
    step "proxy_bw_${s}_streams" env NCCL_MK_PROXY_STREAMS=$s LB_BENCH_ITERS=200 \
      "$B/test/loopback/proxy_loopback" bench_proxy_bw
    grep -h BENCH "$LOGS/proxy_bw_${s}_streams.log" | sed "s/^/streams $s: /" || true
  done
  # Where a cross-node AllGather+GEMM's time goes: its send CTA's staged-and-published blocks,
  # the receivers' waits and copy-ins, the GEMM's tiles (the summary is informational).
  step trace_of_an_ag_gemm_call_across_emulated_nodes bash -c "rm -rf '$LOGS/xtrace' &&
    mkdir -p '$LOGS/xtrace' && NCCL_MK_TRACE=1 NCCL_MK_TRACE_DIR='$LOGS/xtrace' \
    '$B/test/perf/fused/ag_gemm_perf' -M 4096 -N 8192 -n 2 -w 1 >/dev/null &&
    ls '$LOGS'/xtrace/mk-trace.rank*.call3.trace >/dev/null &&
    (scripts/mk-trace summary '$LOGS'/xtrace/mk-trace.rank*.call3.trace || true) &&
    (scripts/mk-trace arrivals '$LOGS'/xtrace/mk-trace.rank*.call3.trace || true)"
  unset NCCL_MK_LOCAL_SIZE NCCL_MK_TRANSPORT NCCL_MK_OFI_PROVIDER
}

MOE_TESTS="correctness:moe_dispatch_and_combine_match_float64_on_random_and_skewed_routings
fp8:moe_fp8_dispatch_matches_quantized_float64_reference
graph:moe_ops_replay_in_cuda_graphs_with_changed_routing bad_input:moe_ops_reject_bad_input_untouched empty_rank_tokens:moe_rank_with_zero_tokens_dispatches_and_combines_correctly
negative_control:moe_checker_rejects_one_bad_element dead_peer:moe_dispatch_without_its_peer_ends_in_an_async_error
late_peer:moe_layer_of_a_late_peer_ends_in_an_error_or_the_right_output
late_peer_combine:moe_combine_of_a_late_peer_ends_in_an_error_or_the_right_output
recv_overflow:moe_dispatch_past_moe_max_recv_rows_ends_in_an_error_naming_the_limit
peer_dies_mid_call:moe_dispatch_whose_peer_died_mid_call_ends_in_an_async_error_without_a_fault
peer_writes:moe_peer_writes_land_where_the_peer_reads_them busy_sms:moe_ops_finish_correct_while_another_kernel_holds_a_quarter_of_the_sms
with_dense_ops:every_fused_op_in_one_training_step_on_one_communicator_matches_float64"

# The MoE ops on 2 GPUs (skipped with fewer), on the default dispatch and on the overlapped one
# (NCCL_MK_MOE_OVERLAP=1), then moe_perf on the Mixtral, DeepSeek-V3 and decode shapes against
# NCCL all-to-all + per-expert cuBLASLt, also overlapped and with the fp8 dispatch (-q)
# (MK_FUSED_SHAPES=small for fewer iterations).
tier_moe() {
  local t n=20
  [ "${MK_FUSED_SHAPES:-}" = small ] && n=5
  scenarios "$MOE_TESTS" "$B/test/gpu/test_moe"
  # The same with the dispatch beside the GEMM (NCCL_MK_MOE_OVERLAP=1; the default is 0).
  # busy_sms: the GEMM, the dispatch's programmatic dependent, leaves the dispatch its SMs
  for t in correctness fp8 graph busy_sms; do
    step "moe_ops_${t}_with_overlap" env NCCL_MK_MOE_OVERLAP=1 "$B/test/gpu/test_moe" "$t"
  done
  step moe_perf "$B/test/perf/fused/moe_perf" -n "$n" -w 3 -J "$LOGS/moe_perf.json"
  grep -A 6 '^# shape' "$LOGS/moe_perf.log" || true
  step moe_perf_with_overlap env NCCL_MK_MOE_OVERLAP=1 "$B/test/perf/fused/moe_perf" -n "$n" -w 3
  grep -A 6 '^# shape' "$LOGS/moe_perf_with_overlap.log" || true
  # The fp8 dispatch (ncclMkConfig.moe_dispatch_fp8): #wrong against the baseline on x
  # quantized and dequantized.
  step moe_perf_fp8 "$B/test/perf/fused/moe_perf" -q -n "$n" -w 3 -J "$LOGS/moe_perf_fp8.json"
  grep -A 6 '^# shape' "$LOGS/moe_perf_fp8.log" || true
  # The combine side (moe_perf -c): fused combine against cuBLASLt + NCCL all-to-all back + sum.
  step moe_perf_with_combine "$B/test/perf/fused/moe_perf" -c -n "$n" -w 3 -J "$LOGS/moe_perf_combine.json"
  grep -A 6 '^# shape' "$LOGS/moe_perf_with_combine.log" || true
}

# The tuner's calibration and check (the tuner issue's command; bench/NOTES.md, Tuner).
tier_tune() {
  step tune_calibrate_and_check env MK_SKIP_BUILD=1 "$(dirname "$0")/tune.sh" -o "$LOGS/tune.txt" \
    -c all_reduce -a "ring tree" -P "ll ll128 simple" -C "0 8 16" -b 8 -e 256M -f 4 -n 30 -k 5 \
    -w 5 -r 3 -x none
  grep -E '^(geomean|goal|keep|==)' "$LOGS/tune_calibrate_and_check.log" || true
}

# The tuner's calibration and check through the forced network path, as scripts/bench-net.sh
# and scripts/net-gpu-tests.sh take it: a node per process, our plugin, libfabric tcp;ofi_rxm.
tier_tune_net() {
  local lib
  lib="$(cd "$B" && pwd)/libnccl-net-mk.so"
  step tune_net_calibrate_and_check env MK_SKIP_BUILD=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
    NCCL_NET_PLUGIN="$lib" NCCL_NET=mk NCCL_MK_TRANSPORT=ofi NCCL_MK_OFI_PROVIDER='tcp;ofi_rxm' \
    NCCL_MK_SOCKET_IFNAME="${NCCL_MK_SOCKET_IFNAME:-lo}" \
    "$(dirname "$0")/tune.sh" -H -o "$LOGS/tune-net.txt" -c all_reduce -a "ring tree" \
    -P "ll ll128 simple" -C "0 4 8" -b 1K -e 64M -f 4 -n 20 -k 4 -w 3 -r 3 -x none
  grep -E '^(geomean|goal|keep|==)' "$LOGS/tune_net_calibrate_and_check.log" || true
}

# The net plugin under real NCCL on 2 GPUs, then the busbw comparison with NCCL's Socket.
tier_net() {
  gpus_at_least 2 net || return
  step net_gpu_tests env MK_CHECK_LOGS="$LOGS/net" "$(dirname "$0")/net-gpu-tests.sh"
  grep -E '^(pass|FAIL) ' "$LOGS/net_gpu_tests.log" | grep -c '^pass' | sed 's/^/net checks passed: /'
  # the default endpoints per comm (2 over tcp) and one; eager sends and the progress thread at
  # their defaults (eager 64 KiB since session 55, protocol v8). MK_STREAMS / MK_EAGER /
  # MK_PROGRESS override.
  # two interleaved runs each: Socket 4x4 alone swung 2-9 GB/s between runs (session 24)
  step bench_net env OUT="$LOGS/bench-net" MK_SKIP_BUILD=1 MK_STREAMS="${MK_STREAMS:-default 1}" \
    MK_EAGER="${MK_EAGER:-default}" MK_PROGRESS="${MK_PROGRESS:-default}" MK_NET_REPS="${MK_NET_REPS:-2}" \
    "$(dirname "$0")/bench-net.sh" all_reduce 256M
  sed -n '/== busbw/,$p' "$LOGS/bench_net.log"
  # Where a middle-size all_reduce's time goes between NCCL's proxy and the plugin (issue 3:
  # 128 KiB takes 300-440 us through us, ~65 us of it message time): every request's asked,
  # posted and done times (NCCL_MK_NET_TRACE_DIR), summarised by scripts/mk-net-trace.
  step net_trace_of_a_128k_all_reduce bash -c "rm -rf '$LOGS/net-trace' && mkdir -p '$LOGS/net-trace' &&
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_TUNER_PLUGIN=none NCCL_NET_PLUGIN='$B/libnccl-net-mk.so' \
    NCCL_NET=mk NCCL_MK_NET_TRACE_DIR='$LOGS/net-trace' '$B/test/perf/coll/all_reduce_perf' -p 2 -g 1 -H \
    -b 128K -e 128K -n 200 -w 10 -c 0 && scripts/mk-net-trace check '$LOGS'/net-trace/mk-net-trace.*.csv &&
    scripts/mk-net-trace summary '$LOGS'/net-trace/mk-net-trace.*.csv"
  sed -n '/^kind/,$p' "$LOGS/net_trace_of_a_128k_all_reduce.log"
}

# The PyTorch package (python/nccl_mk) on 2 GPUs, then the head-to-head with PyTorch.
tier_torch() {
  # the package finds the library on the loader's path when the build is not ./build
  export LD_LIBRARY_PATH="$(cd "$B" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  step torch_ops python3 test/gpu/test_torch_ops.py
  local m="2048,4096,8192,16384"
  [ "${MK_FUSED_SHAPES:-}" = small ] && m="4096"
  step bench_torch python3 -m torch.distributed.run --nproc-per-node 2 scripts/bench-torch.py \
    --rows "$m" --json "$LOGS/bench_torch.json"
  grep -E '^ *(op|ag|rs|ar|#) ' "$LOGS/bench_torch.log" || true
}

# The forward attention core's tests, then its benchmark on one GPU (attn_perf).
# ncclMkRingAttention on 2 GPUs (test/gpu/test_ring_attn.cu).
RING_TESTS="small:ring_attention_matches_float64_causal_noncausal_gqa_d64_d128
large:ring_attention_matches_the_core_on_the_whole_sequence
graph:ring_attention_replays_in_cuda_graphs_with_fresh_inputs one_kernel:ring_attention_is_one_kernel_per_call
back_to_back:ring_attention_back_to_back_with_a_delayed_rank bad_input:ring_attention_rejects_bad_input_untouched
negative_control:ring_attention_checker_rejects_one_bad_element
absent_peer:ring_attention_without_its_peer_ends_in_an_async_error
late_peer:ring_attention_of_a_late_peer_ends_in_an_error_or_the_right_output
peer_dies_mid_call:ring_attention_whose_peer_died_mid_call_ends_in_an_async_error_without_a_fault
busy_sms:ring_attention_finishes_correct_while_another_kernel_holds_a_quarter_of_the_sms
busy_sms_most:ring_attention_finishes_correct_while_another_kernel_holds_three_quarters_of_the_sms"
# The forward with persistent attention CTAs claiming the query tiles (NCCL_MK_RA_FWD_PERSISTENT=1;
# session 58, not the default: 2-4% slower under MPS on one H200).
RING_PERSISTENT_TESTS="small:ring_attention_persistent_matches_float64_causal_noncausal_gqa_d64_d128
large:ring_attention_persistent_matches_the_core_on_the_whole_sequence
graph:ring_attention_persistent_replays_in_cuda_graphs_with_fresh_inputs
one_kernel:ring_attention_persistent_is_one_kernel_per_call
back_to_back:ring_attention_persistent_back_to_back_with_a_delayed_rank
late_peer:ring_attention_persistent_of_a_late_peer_ends_in_an_error_or_the_right_output
busy_sms:ring_attention_persistent_finishes_correct_while_another_kernel_holds_a_quarter_of_the_sms
busy_sms_most:ring_attention_persistent_finishes_correct_while_another_kernel_holds_three_quarters_of_the_sms"
# ncclMkRingAttentionBackward on 2 GPUs (test/gpu/test_ring_attn_bwd.cu).
RING_BWD_TESTS="small:ring_attention_backward_matches_float64_causal_noncausal_gqa_d64_d128
large:ring_attention_backward_matches_the_core_on_the_whole_sequence
graph:ring_attention_backward_replays_in_cuda_graphs_with_fresh_inputs
bad_input:ring_attention_backward_rejects_bad_input_untouched
negative_control:ring_attention_backward_checker_rejects_one_bad_element
absent_peer:ring_attention_backward_without_its_peer_ends_in_an_async_error
peer_dies_mid_call:ring_attention_backward_whose_peer_died_mid_call_ends_in_an_async_error_without_a_fault
absent_peer_noncausal:ring_attention_backward_that_times_out_stores_nothing_into_its_peers_accumulator
late_peer:ring_attention_backward_of_a_late_peer_ends_in_an_error_not_in_stale_partials
late_peer_noncausal:ring_attention_backward_of_a_late_peer_ends_in_an_error_not_in_stale_partials_noncausal
busy_sms:ring_attention_backward_finishes_correct_while_another_kernel_holds_a_quarter_of_the_sms
busy_sms_most:ring_attention_backward_finishes_correct_while_another_kernel_holds_three_quarters_of_the_sms
one_kernel:ring_attention_backward_in_one_kernel_is_one_node_and_matches_float64_split_heads_counted
one_kernel_no_room:ring_attention_backward_in_one_kernel_without_room_to_split_heads_matches_float64
one_kernel_trace:ring_attention_backward_one_kernel_trace_records_every_key_tile_once_and_its_parts
one_kernel_absent_owner:ring_attention_backward_one_kernel_stores_nothing_into_an_absent_owner_even_for_tiles_no_query_sees"

# The whole call as one kernel (NCCL_MK_RA_BWD_ONE_KERNEL=1, session 62; first run in session
# 64, 6-18% slower than the default plans under MPS: not the default): the scenarios again
# (causal ones with S_local a multiple of 256 take it).
RING_BWD_ONE_KERNEL_TESTS="small:ring_attention_backward_one_kernel_matches_float64
large:ring_attention_backward_one_kernel_matches_the_core
graph:ring_attention_backward_one_kernel_replays_in_cuda_graphs
bad_input:ring_attention_backward_one_kernel_rejects_bad_input_untouched
absent_peer:ring_attention_backward_one_kernel_without_its_peer_ends_in_an_async_error
late_peer:ring_attention_backward_one_kernel_of_a_late_peer_ends_in_an_error_not_in_stale_partials_causal
absent_peer_noncausal:ring_attention_backward_one_kernel_that_times_out_stores_nothing_into_its_peers_accumulator
late_peer_noncausal:ring_attention_backward_one_kernel_of_a_late_peer_ends_in_an_error_not_in_stale_partials
peer_dies_mid_call:ring_attention_backward_one_kernel_whose_peer_died_mid_call_ends_in_an_async_error
busy_sms_most:ring_attention_backward_one_kernel_finishes_correct_while_another_kernel_holds_three_quarters_of_the_sms"

# The backward's core calls as one kernel each (NCCL_MK_RA_BWD_ONE_LAUNCH=1, session 59; not the
# default: 0-1.6% slower under MPS, session 60): the default plans (merged causal, own-last
# non-causal) again.
RING_BWD_ONE_LAUNCH_TESTS="small:ring_attention_backward_one_launch_matches_float64
large:ring_attention_backward_one_launch_matches_the_core
graph:ring_attention_backward_one_launch_replays_in_cuda_graphs
absent_peer:ring_attention_backward_one_launch_without_its_peer_ends_in_an_async_error
late_peer_noncausal:ring_attention_backward_one_launch_of_a_late_peer_ends_in_an_error_not_in_stale_partials
busy_sms_most:ring_attention_backward_one_launch_finishes_correct_while_another_kernel_holds_three_quarters_of_the_sms"

# The backward's split plan (NCCL_MK_RA_BWD_MERGED=0 NCCL_MK_RA_BWD_OWN_LAST=0; the default
# until session 43, which made the merged plan the causal default and the own-last plan the
# non-causal one): the own block's calls beside the gather, then the peers', then the reduce.
# Its causal absent_peer keeps the strict check (the accumulator of the absent peer's block
# unchanged); the default's merged plan may zero it once its owner ended its previous call.
RING_BWD_SPLIT_TESTS="small:ring_attention_backward_split_plan_matches_float64
large:ring_attention_backward_split_plan_matches_the_core
graph:ring_attention_backward_split_plan_replays_in_cuda_graphs
absent_peer:ring_attention_backward_split_plan_without_its_peer_leaves_its_accumulator_unchanged
absent_peer_noncausal:ring_attention_backward_split_plan_without_its_peer_stores_nothing_into_its_accumulator
late_peer_noncausal:ring_attention_backward_split_plan_of_a_late_peer_ends_in_an_error_not_in_stale_partials
busy_sms_most:ring_attention_backward_split_plan_finishes_correct_while_another_kernel_holds_three_quarters_of_the_sms"

# Every fused op on one communicator in turn (test/gpu/test_ops_in_turn.cu; test_moe
# with_dense_ops, the MoE ops too), with the default backward and with the one-kernel backward.
OPS_IN_TURN_TESTS="training_steps:fused_ops_in_turn_on_one_communicator_match_float64
training_steps_busy:fused_ops_in_turn_with_one_rank_slowed_match_float64"
ops_in_turn() {
  scenarios "$OPS_IN_TURN_TESTS" "$B/test/gpu/test_ops_in_turn"
  SCENARIO_ENV=NCCL_MK_RA_BWD_ONE_KERNEL=1 scenarios "$OPS_IN_TURN_TESTS" "$B/test/gpu/test_ops_in_turn" \
    _with_the_one_kernel_backward
  SCENARIO_ENV=NCCL_MK_RA_BWD_ONE_KERNEL=1 scenarios \
    "with_dense_ops:every_fused_op_in_one_training_step_on_one_communicator_matches_float64" \
    "$B/test/gpu/test_moe" _with_the_one_kernel_backward
}

tier_ring() {
  ops_in_turn
  scenarios "$RING_TESTS" "$B/test/gpu/test_ring_attn"
  NCCL_MK_RA_FWD_PERSISTENT=1 scenarios "$RING_PERSISTENT_TESTS" "$B/test/gpu/test_ring_attn"
  scenarios "$RING_BWD_TESTS" "$B/test/gpu/test_ring_attn_bwd"
  NCCL_MK_RA_BWD_ONE_LAUNCH=1 scenarios "$RING_BWD_ONE_LAUNCH_TESTS" "$B/test/gpu/test_ring_attn_bwd"
  NCCL_MK_RA_BWD_ONE_KERNEL=1 scenarios "$RING_BWD_ONE_KERNEL_TESTS" "$B/test/gpu/test_ring_attn_bwd"
  NCCL_MK_RA_BWD_MERGED=0 NCCL_MK_RA_BWD_OWN_LAST=0 scenarios "$RING_BWD_SPLIT_TESTS" "$B/test/gpu/test_ring_attn_bwd"
  step ring_attn_perf "$B/test/perf/fused/ring_attn_perf" -n 10 -w 2 -J "$LOGS/ring_attn_perf.json"
  grep -A 8 '^#  B' "$LOGS/ring_attn_perf.log" || true
  # persistent attention CTAs (NCCL_MK_RA_FWD_PERSISTENT=1, session 58): an A/B within this call
  step ring_attn_perf_persistent env NCCL_MK_RA_FWD_PERSISTENT=1 "$B/test/perf/fused/ring_attn_perf" -n 10 -w 2
  grep -A 8 '^#  B' "$LOGS/ring_attn_perf_persistent.log" || true
  # the forward's CTAs in chunks of 16 query tiles (NCCL_MK_RA_FWD_CHUNK; session 33's lead for
  # 64K causal, case 2), then the default (0) again: an A/B within this call
  local c
  for c in 16 0; do
    step "ring_attn_perf_64k_chunk$c" env NCCL_MK_RA_FWD_CHUNK=$c "$B/test/perf/fused/ring_attn_perf" -n 10 -w 2 -c 2
    grep -A 3 '^#  B' "$LOGS/ring_attn_perf_64k_chunk$c.log" || true
  done
  step ring_attn_perf_bwd "$B/test/perf/fused/ring_attn_perf" -b -n 5 -w 1 -J "$LOGS/ring_attn_perf_bwd.json"
  grep -A 8 '^#  B' "$LOGS/ring_attn_perf_bwd.log" || true
  step ring_attn_perf_bwd_split env NCCL_MK_RA_BWD_MERGED=0 NCCL_MK_RA_BWD_OWN_LAST=0 "$B/test/perf/fused/ring_attn_perf" -b -n 5 -w 1
  grep -A 8 '^#  B' "$LOGS/ring_attn_perf_bwd_split.log" || true
  # each core call one kernel (NCCL_MK_RA_BWD_ONE_LAUNCH=1, session 59): an A/B within this call
  step ring_attn_perf_bwd_one_launch env NCCL_MK_RA_BWD_ONE_LAUNCH=1 "$B/test/perf/fused/ring_attn_perf" -b -n 5 -w 1
  grep -A 8 '^#  B' "$LOGS/ring_attn_perf_bwd_one_launch.log" || true
  # each rank's backward core calls emulated on one GPU, every plan (test/perf/attn/ring_bwd_emul.cu)
  step ring_bwd_emul "$B/test/perf/attn/ring_bwd_emul" 10
  grep -A 8 '^#  B' "$LOGS/ring_bwd_emul.log" || true
  bench_attn_vs_cudnn
}

# PyTorch's cuDNN attention on the ring's per-GPU work, the issues' ceiling (fwd and bwd), with
# our cores timed in the same iterations (scripts/bench-torch-attn.py, libmk_attn_bench.so).
bench_attn_vs_cudnn() {
  local ours=()
  [ -f "$B/test/perf/attn/libmk_attn_bench.so" ] && ours=(--ours "$B/test/perf/attn/libmk_attn_bench.so")
  step bench_torch_attn python3 "$(dirname "$0")/bench-torch-attn.py" --iters 10 --warmup 3 "${ours[@]}" \
    --json "$LOGS/bench_torch_attn.json"
  grep -E '^(#|  )' "$LOGS/bench_torch_attn.log" || true
}

tier_attn() {
  scenarios "$ATTN_CORE_TESTS" "$B/test/gpu/test_attn"
  scenarios "$ATTN_BWD_TESTS" "$B/test/gpu/test_attn_bwd"
  # every backward behaviour's calls as one launch too (the phase words zero after each)
  SCENARIO_ENV="MK_ATTN_ONE_LAUNCH=1" scenarios "$ATTN_BWD_TESTS" "$B/test/gpu/test_attn_bwd" _one_launch
  # the other compiled variants that attn_perf times beside the default (attn.h
  # MK_ATTN_VARIANTS, MK_ATTN_BWD_VARIANTS) against the float64 reference too
  local v
  for v in 1 2 3 4 5 6; do
    step "attn_forward_matches_float64_variant_$v" env MK_ATTN_VARIANT=$v "$B/test/gpu/test_attn" forward
  done
  for v in 1 2 3 4 5; do
    step "attn_backward_matches_float64_variant_$v" env MK_ATTN_VARIANT=$v "$B/test/gpu/test_attn_bwd" backward
    step "attn_backward_one_launch_matches_float64_variant_$v" env MK_ATTN_VARIANT=$v MK_ATTN_ONE_LAUNCH=1 \
      "$B/test/gpu/test_attn_bwd" backward
  done
  step attn_perf "$B/test/perf/attn/attn_perf" 20
  grep -A 14 '^#  B' "$LOGS/attn_perf.log" || true
  step attn_perf_bwd "$B/test/perf/attn/attn_perf" -b 10
  grep -A 8 '^#  B' "$LOGS/attn_perf_bwd.log" || true
  # the ring backward's core calls on this one GPU, every plan (test/perf/attn/ring_bwd_emul.cu)
  step ring_bwd_emul "$B/test/perf/attn/ring_bwd_emul" 10
  grep -A 8 '^#  B' "$LOGS/ring_bwd_emul.log" || true
  bench_attn_vs_cudnn
}

tier=${1:-quick}
case $tier in
  quick) tier_quick ;;
  gemm) tier_gemm ;;
  attn) tier_attn ;;
  fused) tier_fused ;;
  ring) tier_ring ;;
  moe) tier_moe ;;
  net) tier_net ;;
  torch) tier_torch ;;
  tune) tier_tune ;;
  xnode) tier_xnode ;;
  tune-net) tier_tune_net ;;
  scale) tier_scale ;;
  scale-bench) tier_scale_bench ;;
  pairs) tier_pairs ;;
  all) tier_quick; tier_gemm; tier_attn; tier_fused; tier_ring; tier_moe; tier_net; tier_torch ;;
  *) echo "usage: $0 [quick|gemm|attn|fused|ring|moe|net|torch|tune|tune-net|xnode|scale|scale-bench|pairs|all]" >&2; exit 2 ;;
esac

echo
echo "gpu-check $tier on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) (logs: $LOGS)"
printf '%s\n' "${ROWS[@]}"
echo "failed: $FAILED"
[ $FAILED -eq 0 ]
