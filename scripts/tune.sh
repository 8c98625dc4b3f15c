#!/usr/bin/env bash
# Calibrates the tuner on this host's GPUs and writes the tuning file (NCCL_MK_TUNER_FILE).
#
# For every collective, algorithm, protocol and channel count it runs the collectives
# harness (build/test/perf/coll/<coll>_perf) over a range of sizes with that choice forced
# (NCCL_ALGO, NCCL_PROTO, NCCL_MIN/MAX_NCHANNELS) and NCCL_TUNER_PLUGIN=none, so that NCCL's
# own choice and any earlier tuning file play no part. Combinations NCCL refuses (PAT with
# several GPUs per node, Tree for all-gather, ...) fail fast and are skipped. Then
# scripts/tune-write.py turns the JSON results into the tuning file, and a check runs NCCL
# alone and NCCL with the new file side by side (interleaved) and prints busbw for both.
#
# usage: scripts/tune.sh [-o FILE] [-g NGPUS] [-c COLLS] [-a ALGOS] [-P PROTOS] [-C CHANNELS]
#                        [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-r ROUNDS] [-V]
#   -o  tuning file to write (default build/tune/nccl-mk-tuning.txt)
#   -g  GPUs (one process each; default: every GPU nvidia-smi lists)
#   -c  harness collectives (default "all_reduce all_gather reduce_scatter")
#   -a  algorithms (default "ring tree pat"; also nvls nvls_tree collnet_direct collnet_chain)
#   -P  protocols (default "ll ll128 simple")
#   -C  channel counts, 0 = NCCL's own (default "0 2 4 8 16 32")
#   -b/-e/-f  sizes, as the harness takes them (default 8 to 1G, factor 2)
#   -n/-w     timed and warm-up iterations per size (default 20 and 5)
#   -r  rounds of the final NCCL-vs-tuned check (default 2; 0 skips it)
#   -V  print each harness command
# One host only: for several nodes run the harness with your launcher per combination and
# call scripts/tune-write.py --nnodes N yourself.
set -euo pipefail
source "$(dirname "$0")/common.sh"

out="$MK_BUILD/tune/nccl-mk-tuning.txt"
ngpus="" colls="all_reduce all_gather reduce_scatter" algos="ring tree pat"
protos="ll ll128 simple" channels="0 2 4 8 16 32"
minb=8 maxb=1G factor=2 iters=20 warmup=5 rounds=2 verbose=0

usage() { sed -n '/^# usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }

while getopts "o:g:c:a:P:C:b:e:f:n:w:r:Vh" opt; do
  case $opt in
    o) out=$OPTARG ;; g) ngpus=$OPTARG ;; c) colls=$OPTARG ;; a) algos=$OPTARG ;;
    P) protos=$OPTARG ;; C) channels=$OPTARG ;; b) minb=$OPTARG ;; e) maxb=$OPTARG ;;
    f) factor=$OPTARG ;; n) iters=$OPTARG ;; w) warmup=$OPTARG ;; r) rounds=$OPTARG ;;
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
  if ! mk_have_gpu; then
    echo "tune.sh: no NVIDIA GPU on this machine (nvidia-smi -L lists none)." >&2
    echo "tune.sh: calibration measures the GPUs it tunes for; run it on the GPU host." >&2
    exit 2
  fi
  local found
  found=$(nvidia-smi -L | grep -c '^GPU')
  ngpus=${ngpus:-$found}
  if [ "$ngpus" -lt 2 ] || [ "$ngpus" -gt "$found" ]; then
    echo "tune.sh: need 2..$found GPUs for collectives, asked for $ngpus" >&2
    exit 2
  fi
}

harness() { # coll json log, then environment assignments
  local coll=$1 json=$2 log=$3; shift 3
  local cmd=(env "$@" "$MK_BUILD/test/perf/coll/${coll}_perf" -p "$ngpus" -g 1
             -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" -c 1 -J "$json")
  [ "$verbose" = 1 ] && echo "  + ${cmd[*]}"
  "${cmd[@]}" >"$log" 2>&1
}

# Runs every combination; appends ALGO/PROTO/NCH=JSON for tune-write.py to the specs array.
measure_all() {
  local coll algo proto nch label env_args
  for coll in $colls; do
    if [ ! -x "$MK_BUILD/test/perf/coll/${coll}_perf" ]; then
      echo "== $coll: no harness binary (built only where NCCL and CUDA are found); skipped"
      continue
    fi
    echo "== $coll"
    for algo in $algos; do for proto in $protos; do for nch in $channels; do
      label="$coll-$algo-$proto-$nch"
      env_args=(NCCL_TUNER_PLUGIN=none NCCL_ALGO="$(nccl_algo "$algo")"
                NCCL_PROTO="$(nccl_proto "$proto")")
      [ "$nch" -gt 0 ] && env_args+=(NCCL_MIN_NCHANNELS="$nch" NCCL_MAX_NCHANNELS="$nch")
      if harness "$coll" "$work/$label.json" "$work/$label.log" "${env_args[@]}"; then
        specs+=("$algo/$proto/$nch=$work/$label.json")
        echo "  $algo/$proto/$nch: measured"
      else
        echo "  $algo/$proto/$nch: NCCL refused or the run failed; skipped ($work/$label.log)"
      fi
    done; done; done
  done
}

# NCCL alone vs NCCL with the new file, interleaved, busbw side by side per round.
check_tuned() {
  local coll r plugin="$MK_BUILD/libnccl-net-mk.so"
  for coll in $colls; do
    [ -x "$MK_BUILD/test/perf/coll/${coll}_perf" ] || continue
    for r in $(seq 1 "$rounds"); do
      harness "$coll" "$work/check-$coll-nccl-$r.json" "$work/check-$coll-nccl-$r.log" \
        NCCL_TUNER_PLUGIN=none || { echo "check: $coll NCCL run failed"; return 1; }
      harness "$coll" "$work/check-$coll-tuned-$r.json" "$work/check-$coll-tuned-$r.log" \
        NCCL_TUNER_PLUGIN="$plugin" NCCL_MK_TUNER_FILE="$out" NCCL_DEBUG=INFO \
        NCCL_DEBUG_SUBSYS=INIT,TUNING || { echo "check: $coll tuned run failed"; return 1; }
      if ! grep -q "NET/MK tuner: loaded tuning file" "$work/check-$coll-tuned-$r.log"; then
        echo "check: NCCL did not load the tuner from $plugin ($work/check-$coll-tuned-$r.log)"
        return 1
      fi
      echo "== $coll, round $r: busbw (GB/s), tuned/nccl > 1 means the file helps"
      python3 "$MK_ROOT/scripts/bench-compare.py" tuned="$work/check-$coll-tuned-$r.json" \
        nccl="$work/check-$coll-nccl-$r.json"
    done
  done
}

# Fails on a misspelt name now, not an hour into the measurements.
check_names() {
  local x
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
  mk_build
  work="$(dirname "$out")/runs-$(date +%Y%m%d-%H%M%S)"
  mkdir -p "$work"
  unset NCCL_ALGO NCCL_PROTO NCCL_MIN_NCHANNELS NCCL_MAX_NCHANNELS NCCL_MK_TUNER_FILE
  export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" # DESIGN.md: NVLink multicast stays off
  specs=()
  measure_all
  if [ "${#specs[@]}" -eq 0 ]; then
    echo "tune.sh: no combination could be measured; see the logs in $work" >&2
    exit 1
  fi
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)
  python3 "$MK_ROOT/scripts/tune-write.py" -o "$out" --nnodes 1 \
    --comment "nccl-mk tuning file: scripts/tune.sh on $(hostname), $(date -u +%FT%TZ)" \
    --comment "$ngpus GPU(s): $gpus; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" \
    --comment "sizes $minb..$maxb x$factor, $iters iterations after $warmup warm-up" \
    "${specs[@]}"
  echo "wrote $out"
  if [ "$rounds" -gt 0 ]; then check_tuned; fi
  echo "use it: export NCCL_MK_TUNER_FILE=$out (with NCCL_NET_PLUGIN or NCCL_TUNER_PLUGIN" \
       "pointing at libnccl-net-mk.so)"
}

main
