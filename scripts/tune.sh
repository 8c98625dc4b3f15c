#!/usr/bin/env bash
# Calibrates the tuner on this host's GPUs and writes the tuning file (NCCL_MK_TUNER_FILE).
#
# For every collective, algorithm, protocol and channel count it runs the collectives
# harness (build/test/perf/coll/<coll>_perf) over a range of sizes with that choice forced
# (NCCL_ALGO, NCCL_PROTO, NCCL_MAX_NCHANNELS) and NCCL_TUNER_PLUGIN=none, so that NCCL's
# own choice and any earlier tuning file play no part. Combinations NCCL refuses (PAT with
# several GPUs per node, Tree for all-gather, ...) fail fast and are skipped. Then
# For the fused ops it runs each op's harness (build/test/perf/fused/<op>_perf -F) once per
# communication SM count over the M values; the fastest count per shape becomes the op's
# default (a "fused" record). Then scripts/tune-write.py turns the JSON results into the tuning
# file, and a check (new runs) puts NCCL alone beside NCCL with the new file, and each fused op
# with the file's choice beside every SM count (-r rounds, medians).
# Every collectives run times its -n iterations in batches of -k and takes the median batch
# (the harness's -T), so that one stall cannot decide a ~10 us size. Beside the forced
# combinations it measures NCCL's own choice (nothing forced), and the calibration is repeated
# -R times: the first repeat runs everything, later ones NCCL's own choice and only the
# combinations that came within 1.5x of the fastest at some size (over those sizes; the rest
# cannot win). tune-write.py takes each combination's median over its repeats and writes a
# "keep" record (NCCL's choice stands) at every size where no combination beat NCCL's own
# choice clearly: by more than -m percent in the medians and in every repeat (noise on the
# network path is 20-35% between single runs; a margin alone cannot tell that from a gain). The check runs NCCL alone
# and NCCL with the file -r times, each round one harness run with both (-A: the two sides take
# turns batch by batch; which side opens alternates per size and per round), and
# scripts/tune-check.py prints per size each round's ratio (tuned busbw / NCCL busbw, from the
# times), the median over rounds, then "geomean: G over M sizes" and, last,
# "goal: N of M sizes >= 0.97" (the tuner issue's goal; 3 rounds or more for a robust median).
#
# usage: scripts/tune.sh [-o FILE] [-g NGPUS] [-c COLLS] [-a ALGOS] [-P PROTOS] [-C CHANNELS]
#                        [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-k BATCH] [-w WARMUP]
#                        [-R REPEATS] [-m MARGIN] [-r ROUNDS] [-H] [-V] [-x FUSED_OPS]
#                        [-s COMM_SMS] [-M MLIST]
#   -o  tuning file to write (default build/tune/nccl-mk-tuning.txt)
#   -g  GPUs (one process each; default: every GPU nvidia-smi lists)
#   -c  harness collectives (default "all_reduce all_gather reduce_scatter"; "none": skip)
#   -a  algorithms (default "ring tree pat"; also nvls nvls_tree collnet_direct collnet_chain)
#   -P  protocols (default "ll ll128 simple")
#   -C  channel counts, 0 = NCCL's own (default "0 2 4 8 16 32")
#   -b/-e/-f  sizes, as the harness takes them (default 8 to 1G, factor 2)
#   -n/-w     timed and warm-up iterations per size (default 20 and 5)
#   -k  iterations per timed batch of the collectives (default 4; -n / -k batches, the median
#       batch is the size's time; 1: the median of per-iteration times)
#   -R  repeats of the collectives' calibration (default 3; 1: one run per combination, no
#       repeat can contradict a gain then)
#   -m  percent by which the fastest combination must beat NCCL's own choice (medians over the
#       repeats, and every repeat of the one faster than every repeat of the other) for the
#       file to override NCCL at a size (default 3, the goal's 0.97)
#   -r  rounds of the final check (default 3; 0 skips it): NCCL vs tuned, and for the fused
#       ops one run of the file's choice and of each SM count per round (medians compared)
#   -H  one NCCL node per process: each rank gets its own NCCL_HOSTID (the harness's -H), so
#       NCCL connects this host's GPUs through its network path (name the net plugin with
#       NCCL_NET_PLUGIN / NCCL_NET; scripts/gpu-check.sh tune-net does); the file's records
#       then say nnodes = GPUs, as the tuner will see them (collectives only; -x as without)
#   -V  print each harness command
#   -x  fused ops to calibrate (default "ag_gemm", the op with a communication SM count; "none")
#   -s  communication SM counts to try (default "2 4 6 8 12 16")
#   -M  M values for the fused ops, comma-separated (default 2048,4096,8192,16384; N and K are
#       the harness's defaults)
# One host only (-H emulates one node per GPU on it): for several real nodes run the harness
# with your launcher per combination and call scripts/tune-write.py --nnodes N yourself.
set -euo pipefail
source "$(dirname "$0")/common.sh"

out="$MK_BUILD/tune/nccl-mk-tuning.txt"
ngpus="" colls="all_reduce all_gather reduce_scatter" algos="ring tree pat"
protos="ll ll128 simple" channels="0 2 4 8 16 32"
minb=8 maxb=1G factor=2 iters=20 batch=4 warmup=5 rounds=3 verbose=0 hosts=0 repeats=3 margin=3
candidate_factor=1.5 # later repeats: combinations within this of the fastest (tune-write.py)
fused_ops="ag_gemm" fused_sms="2 4 6 8 12 16" fused_m="2048,4096,8192,16384"

usage() { sed -n '/^# usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }

while getopts "o:g:c:a:P:C:b:e:f:n:k:w:r:R:m:HVx:s:M:h" opt; do
  case $opt in
    x) fused_ops=$OPTARG ;; s) fused_sms=$OPTARG ;; M) fused_m=$OPTARG ;;
    o) out=$OPTARG ;; g) ngpus=$OPTARG ;; c) colls=$OPTARG ;; a) algos=$OPTARG ;;
    P) protos=$OPTARG ;; C) channels=$OPTARG ;; b) minb=$OPTARG ;; e) maxb=$OPTARG ;;
    f) factor=$OPTARG ;; n) iters=$OPTARG ;; k) batch=$OPTARG ;; w) warmup=$OPTARG ;;
    r) rounds=$OPTARG ;; R) repeats=$OPTARG ;; m) margin=$OPTARG ;; H) hosts=1 ;;
    V) verbose=1 ;; *) usage ;;
  esac
done

# NCCL's spelling of our names (tune-write.py and the tuning file use the lower-case ones).
nccl_algo() {
  case $1 in
    tree) echo Tree ;; ring) echo Ring ;; pat) echo PAT ;; nvls) echo NVLS ;;
    nvls_tree) echo NVLSTree ;; collnet_direct) echo CollnetDirect ;;
    collnet_chain) echo CollnetChain ;; *) echo "tune.sh: unknown algorithm '$1'" >&2; exit 2 ;;
  esac
}
nccl_proto() {
  case $1 in
    ll) echo LL ;; ll128) echo LL128 ;; simple) echo Simple ;;
    *) echo "tune.sh: unknown protocol '$1'" >&2; exit 2 ;;
  esac
}

require_gpus() {
  local found
  found=$(mk_gpu_count)
  if [ "$found" -eq 0 ]; then
    echo "tune.sh: no NVIDIA GPU on this machine (nvidia-smi -L lists none)." >&2
    echo "tune.sh: calibration measures the GPUs it tunes for; run it on the GPU host." >&2
    exit 2
  fi
  ngpus=${ngpus:-$found}
  if [ "$ngpus" -lt 2 ] || [ "$ngpus" -gt "$found" ]; then
    echo "tune.sh: need 2..$found GPUs for collectives, asked for $ngpus" >&2
    exit 2
  fi
}

# -H: the harness's own flag (a distinct NCCL_HOSTID per process) and the node count NCCL and
# the tuner then see; else one node.
set_nodes() {
  host_flag=() nnodes=1
  if [ "$hosts" = 1 ]; then host_flag=(-H) nnodes=$ngpus; fi
}

# One collectives run: coll json log, then environment assignments, then (after --) harness
# arguments. Calibration and check both
# take the median batch (-T), not the mean over -n: the file's time_us decides which
# configuration the tuner forces, and a stall in one configuration's mean (the session-18 check
# saw 50x at 32 B) would rank it by that stall rather than by its per-call time. With both
# sides timed the same way, the check also judges the quantity the calibration ranked.
harness() {
  local coll=$1 json=$2 log=$3 envs=() extra=(); shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift && extra=("$@")
  local cmd=(env "${envs[@]}" "$MK_BUILD/test/perf/coll/${coll}_perf" -p "$ngpus" -g 1
             "${host_flag[@]}" -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -T "$batch"
             -w "$warmup" -c 1 -J "$json" "${extra[@]}")
  [ "$verbose" = 1 ] && echo "  + ${cmd[*]}"
  "${cmd[@]}" >"$log" 2>&1
}

# One fused harness run: op json log comm_sms, then environment assignments.
fused_harness() {
  local op=$1 json=$2 log=$3 sms=$4; shift 4
  local cmd=(env "$@" "$MK_BUILD/test/perf/fused/${op}_perf" -p "$ngpus" -F -S "$sms" -M "$fused_m"
             -n "$iters" -w "$warmup" -J "$json")
  [ "$verbose" = 1 ] && echo "  + ${cmd[*]}"
  "${cmd[@]}" >"$log" 2>&1
}

# Every communication SM count for every fused op; appends fused=JSON to the specs array.
measure_fused() {
  local op sms
  for op in $fused_ops; do
    if [ ! -x "$MK_BUILD/test/perf/fused/${op}_perf" ]; then
      echo "== $op: no harness binary (built only where NCCL and CUDA are found); skipped"
      continue
    fi
    echo "== $op"
    for sms in $fused_sms; do
      if fused_harness "$op" "$work/fused-$op-$sms.json" "$work/fused-$op-$sms.log" "$sms" \
           NCCL_MK_TUNER_FILE=; then
        specs+=("fused=$work/fused-$op-$sms.json")
        echo "  $sms communication SMs: measured"
      else
        echo "  $sms communication SMs: the run failed; skipped ($work/fused-$op-$sms.log)"
      fi
    done
  done
}

# The check: each fused op with the file's choice (-S 0) beside every SM count, -r rounds of one
# run each; the order rotates per round (round r opens at entry r of "tuned, then the counts"),
# so no side always runs first or last. One configuration differs by several percent between
# separate processes (the file's count ran 7% slower with -S 0 than with -S N, same code path,
# 2xH200 2026-11-30), more than the 3% being judged: tune-fused-check.py compares medians over
# the rounds.
check_fused() {
  local op sms r i
  for op in $fused_ops; do
    [ -x "$MK_BUILD/test/perf/fused/${op}_perf" ] || continue
    local runs=() tuned=() order=(0 $fused_sms)
    echo "== $op: check, $rounds round(s) of the file's choice and every SM count"
    for r in $(seq 1 "$rounds"); do
      for i in "${!order[@]}"; do
        sms=${order[$(((i + r - 1) % ${#order[@]}))]}
        if [ "$sms" = 0 ]; then
          fused_harness "$op" "$work/check-$op-tuned-r$r.json" "$work/check-$op-tuned-r$r.log" 0 \
            NCCL_MK_TUNER_FILE="$out" || { echo "check: $op with the tuning file failed"; return 1; }
          tuned+=(--tuned "$work/check-$op-tuned-r$r.json")
        else
          fused_harness "$op" "$work/check-$op-$sms-r$r.json" "$work/check-$op-$sms-r$r.log" "$sms" \
            NCCL_MK_TUNER_FILE= || { echo "check: $op with $sms SMs failed"; return 1; }
          runs+=("$work/check-$op-$sms-r$r.json")
        fi
      done
      echo "  round $r: measured"
    done
    echo "== $op: the file's choice against the best SM count, medians over the rounds"
    python3 "$MK_ROOT/scripts/tune-fused-check.py" "${tuned[@]}" "${runs[@]}"
  done
}

# One calibration run: coll label first-size last-size, then environment assignments. Appends
# spec=JSON to the specs array (spec: ALGO/PROTO/NCH or nccl) and says how it went.
measure_one() {
  local coll=$1 spec=$2 label=$3 minb=$4 maxb=$5; shift 5 # harness reads minb/maxb
  if harness "$coll" "$work/$label.json" "$work/$label.log" NCCL_TUNER_PLUGIN=none "$@"; then
    specs+=("$spec=$work/$label.json")
    echo "  $spec: measured"
  else
    echo "  $spec: NCCL refused or the run failed; skipped ($work/$label.log)"
  fi
}

# One forced combination, over sizes first..last.
measure_combination() {
  local coll=$1 algo=$2 proto=$3 nch=$4 first=$5 last=$6 rep=$7 env_args
  env_args=(NCCL_ALGO="$(nccl_algo "$algo")" NCCL_PROTO="$(nccl_proto "$proto")")
  # A cap: NCCL still lowers its count for small sizes below it. A tuner's count replaces
  # NCCL's size-lowered one (NCCL 2.28 enqueue.cc getAlgoInfo), so the tuner passes it only
  # from the size where the cap binds (plugin/tuner_channels.h): that repeats this run.
  [ "$nch" -gt 0 ] && env_args+=(NCCL_MAX_NCHANNELS="$nch")
  measure_one "$coll" "$algo/$proto/$nch" "$coll-$algo-$proto-$nch-r$rep" "$first" "$last" \
    "${env_args[@]}"
}

# Runs every combination, then the repeats (see the top); appends ALGO/PROTO/NCH=JSON and
# nccl=JSON (NCCL's own choice) for tune-write.py to the specs array.
measure_all() {
  local coll algo proto nch rep first=() line
  [ "$colls" = none ] && return 0
  for coll in $colls; do
    if [ ! -x "$MK_BUILD/test/perf/coll/${coll}_perf" ]; then
      echo "== $coll: no harness binary (built only where NCCL and CUDA are found); skipped"
      continue
    fi
    echo "== $coll"
    local start=${#specs[@]}
    measure_one "$coll" nccl "$coll-nccl-r1" "$minb" "$maxb"
    for algo in $algos; do for proto in $protos; do for nch in $channels; do
      measure_combination "$coll" "$algo" "$proto" "$nch" "$minb" "$maxb" 1
    done; done; done
    first=("${specs[@]:$start}")
    for rep in $(seq 2 "$repeats"); do
      echo "== $coll, repeat $rep of $repeats: NCCL's own choice and the combinations within" \
           "${candidate_factor}x of the fastest"
      measure_one "$coll" nccl "$coll-nccl-r$rep" "$minb" "$maxb"
      python3 "$MK_ROOT/scripts/tune-write.py" --candidates "$candidate_factor" "${first[@]}" \
        >"$work/candidates-$coll.txt" || { echo "tune.sh: tune-write.py --candidates failed" >&2; exit 1; }
      # fd 3: the harness's processes must not read the list on stdin.
      while read -r line <&3; do
        [ -n "$line" ] || continue
        set -- $line # ALGO/PROTO/NCH FIRST LAST
        IFS=/ read -r algo proto nch <<<"$1"
        measure_combination "$coll" "$algo" "$proto" "$nch" "$2" "$3" "$rep"
      done 3<"$work/candidates-$coll.txt"
    done
  done
}

# NCCL loads the tuner and the file: one short run with NCCL_DEBUG=INFO, apart from the timed
# runs (with INFO on, NCCL logs per collective, which would slow only the tuned side).
check_tuner_loads() {
  local coll=$1 plugin=$2 log="$work/check-$1-loads.log"
  env NCCL_TUNER_PLUGIN="$plugin" NCCL_MK_TUNER_FILE="$out" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
    "$MK_BUILD/test/perf/coll/${coll}_perf" -p "$ngpus" -g 1 "${host_flag[@]}" -b 8 -e 8 -n 1 \
    -w 1 -c 1 >"$log" 2>&1 || return 1
  grep -q "NET/MK tuner: loaded tuning file" "$log"
}

# One round of the check: NCCL alone and NCCL with the file in one process, on two
# communicators timed in one pass, batch by batch in turn (the harness's -A;
# NCCL_MK_TUNER_AB=1 leaves the first to NCCL): drift and other jobs hit both sides alike.
# Which side opens each turn alternates per size and per round.
check_round() {
  local coll=$1 r=$2 plugin=$3 tag=${4:-}
  harness "$coll" "$work/check-$coll-ab-$tag$r.json" "$work/check-$coll-ab-$tag$r.log" \
    NCCL_TUNER_PLUGIN="$plugin" NCCL_MK_TUNER_FILE="$out" NCCL_MK_TUNER_AB=1 -- -A $((r % 2)) ||
    { echo "check: $coll A/B run failed ($work/check-$coll-ab-$tag$r.log)"; return 1; }
  echo "  round $tag$r: measured (NCCL and tuned in one run)"
}

# One collective's check: -r interleaved rounds, scripts/tune-check.py over them; $2 names the
# keep records' output (sizes whose median lost).
check_coll() {
  local coll=$1 keep=$2 tag=$3 plugin="$MK_BUILD/libnccl-net-mk.so" r pairs=()
  for r in $(seq 1 "$rounds"); do
    check_round "$coll" "$r" "$plugin" "$tag" || return 1
    pairs+=(--ab "$work/check-$coll-ab-$tag$r.json")
  done
  python3 "$MK_ROOT/scripts/tune-check.py" --label "$coll" --keep-out "$keep" --nnodes "$nnodes" \
    "${pairs[@]}" ||
    { echo "check: $coll: tune-check.py could not compare the runs"; return 1; }
}

# NCCL alone vs NCCL with the new file, -r interleaved rounds, both timed with the same
# (default) logging. Where the median over the rounds lost (below the goal), a "keep" record
# (NCCL's own choice stands around the size) goes into the file and the check runs once more.
check_tuned() {
  local coll plugin="$MK_BUILD/libnccl-net-mk.so" keep
  [ "$colls" = none ] && return 0
  for coll in $colls; do
    [ -x "$MK_BUILD/test/perf/coll/${coll}_perf" ] || continue
    if ! check_tuner_loads "$coll" "$plugin"; then
      echo "check: NCCL did not load the tuner from $plugin ($work/check-$coll-loads.log)"
      return 1
    fi
    echo "== $coll: check, $rounds round(s) of NCCL alone and NCCL with $out"
    keep="$work/keep-$coll.txt"
    check_coll "$coll" "$keep" "" || return 1
    [ -s "$keep" ] || continue
    { echo "# keep (the check's median lost there): NCCL's own choice around the size"; cat "$keep"; } >>"$out"
    echo "== $coll: check again, with the keep records added to $out"
    check_coll "$coll" "$work/keep-$coll-again.txt" "k" || return 1
  done
}

# Fails on a misspelt name or a bad count now, not an hour into the measurements.
check_names() {
  local x
  for x in "$iters" "$batch" "$warmup" "$rounds" "$repeats"; do
    [[ "$x" =~ ^[0-9]+$ ]] || { echo "tune.sh: '$x' is not a count (-n -k -w -r -R)" >&2; exit 2; }
  done
  if [ "$repeats" -lt 1 ]; then echo "tune.sh: need -R REPEATS >= 1" >&2; exit 2; fi
  if ! [[ "$margin" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
    echo "tune.sh: -m '$margin' is not a percentage" >&2
    exit 2
  fi
  if [ "$iters" -lt 1 ] || [ "$batch" -lt 1 ] || [ "$batch" -gt "$iters" ]; then
    echo "tune.sh: need 1 <= -k BATCH ($batch) <= -n ITERS ($iters)" >&2
    exit 2
  fi
  for x in $algos; do nccl_algo "$x" >/dev/null; done
  for x in $protos; do nccl_proto "$x" >/dev/null; done
  for x in $channels; do
    if ! [[ "$x" =~ ^[0-9]+$ ]] || [ "$x" -gt 64 ]; then
      echo "tune.sh: bad channel count '$x' (0..64)" >&2
      exit 2
    fi
  done
}

main() {
  check_names
  require_gpus
  set_nodes
  mk_build
  work="$(dirname "$out")/runs-$(date +%Y%m%d-%H%M%S)"
  mkdir -p "$work"
  unset NCCL_ALGO NCCL_PROTO NCCL_MIN_NCHANNELS NCCL_MAX_NCHANNELS NCCL_MK_TUNER_FILE
  export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" # DESIGN.md: NVLink multicast stays off
  specs=()
  measure_all
  [ "$fused_ops" = none ] || measure_fused
  if [ "${#specs[@]}" -eq 0 ]; then
    echo "tune.sh: no combination could be measured; see the logs in $work" >&2
    exit 1
  fi
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)
  local node_note="one node"
  [ "$hosts" = 1 ] && node_note="one NCCL node per process (-H: a NCCL_HOSTID each, the network path)"
  python3 "$MK_ROOT/scripts/tune-write.py" -o "$out" --nnodes "$nnodes" \
    --comment "nccl-mk tuning file: scripts/tune.sh on $(hostname), $(date -u +%FT%TZ)" \
    --comment "$ngpus GPU(s): $gpus; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE; $node_note" \
    --comment "sizes $minb..$maxb x$factor, $iters iterations after $warmup warm-up" \
    --comment "time_us: per iteration, the median batch of $batch (harness -T $batch), median of $repeats repeat(s)" \
    --margin "$(awk -v m="$margin" 'BEGIN { print m / 100 }')" "${specs[@]}"
  echo "wrote $out"
  if [ "$rounds" -gt 0 ]; then
    check_tuned
    [ "$fused_ops" = none ] || check_fused
  fi
  echo "use it: export NCCL_MK_TUNER_FILE=$out (with NCCL_NET_PLUGIN or NCCL_TUNER_PLUGIN" \
       "pointing at libnccl-net-mk.so)"
}

main
