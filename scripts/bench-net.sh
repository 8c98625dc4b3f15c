#!/usr/bin/env bash
# The net plugin against NCCL's Socket transport on 2 GPUs of one host, forced through the
# network path (no P2P, no SHM, one NCCL "node" per process), in one run. Prints busbw per
# size for each and the ratios. usage: scripts/bench-net.sh [collective] [maxbytes]
# MK_STREAMS="1 2 4 8" runs ours once per NCCL_MK_OFI_STREAMS value, MK_EAGER="0 16384"
# once per NCCL_MK_OFI_EAGER_BYTES value and MK_PROGRESS="default 2" once per
# NCCL_MK_OFI_PROGRESS_THREAD value (default: the library's for each). MK_NET_IFNAME names
# the interface for both sides (NCCL_MK_SOCKET_IFNAME and NCCL_SOCKET_IFNAME; default: each
# one's own choice, the first interface but loopback), so both see the same number of NICs.
# MK_NET_PROCS: ranks, one process and GPU each, each its own NCCL node (default 2).
# MK_NET_MIN, MK_NET_FACTOR, MK_NET_ITERS: the sizes (from MK_NET_MIN bytes, default 8, times
# MK_NET_FACTOR, default 4, up to maxbytes) and the timed iterations per size (default 20).
# MK_NET_REPS: runs of every configuration, interleaved (ours, Socket, Socket 4x4, then again);
# the table gives each one's median and its spread (max/min) over the runs (default 1).
# MK_AB_PLUGINS="name=path ...": other builds of the plugin (scripts/ab-build.sh REV
# libnccl-net-mk.so) run beside ours in every round, each as its own label, with the library's
# defaults. MK_NET_VARIANTS="label:VAR=VALUE[,VAR=VALUE...] ...": our build again under those
# settings, each as its own label in every round (e.g. "eager4k:NCCL_MK_OFI_EAGER_BYTES=4096").
set -euo pipefail
source "$(dirname "$0")/common.sh"
mk_build
coll="${1:-all_reduce}"
max="${2:-256M}"
out="${OUT:-$MK_BUILD/bench-net}"
mkdir -p "$out"
bin="$MK_BUILD/test/perf/coll/${coll}_perf"
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_TUNER_PLUGIN=none
if [ -n "${MK_NET_IFNAME:-}" ]; then
  export NCCL_MK_SOCKET_IFNAME="$MK_NET_IFNAME" NCCL_SOCKET_IFNAME="$MK_NET_IFNAME"
fi
reps=${MK_NET_REPS:-1}
for v in ${MK_NET_VARIANTS:-}; do # label:VAR=VALUE[,VAR=VALUE...]
  [[ "$v" =~ ^[A-Za-z0-9_]+:[A-Za-z_][A-Za-z0-9_]*=[^,]*(,[A-Za-z_][A-Za-z0-9_]*=[^,]*)*$ ]] || {
    echo "bench-net: MK_NET_VARIANTS entry '$v' is not label:VAR=VALUE[,VAR=VALUE...]" >&2; exit 2; }
done
run() { # label, then environment assignments; writes $out/$label.r$rep.json
  local label=$1; shift
  echo "== $label (run $rep of $reps)"
  env "$@" "$bin" -p "${MK_NET_PROCS:-2}" -g 1 -H -b "${MK_NET_MIN:-8}" -e "$max" -f "${MK_NET_FACTOR:-4}" \
    -n "${MK_NET_ITERS:-20}" -w 5 -c 1 \
    -J "$out/$label.r$rep.json"
}
# the runs of a label, as bench-compare.py takes them
files() { local f="" r; for r in $(seq 1 "$reps"); do f+="${f:+,}$out/$1.r$r.json"; done; echo "$f"; }
labels=()
for rep in $(seq 1 "$reps"); do
  for s in ${MK_STREAMS:-default}; do
    for e in ${MK_EAGER:-default}; do
      for p in ${MK_PROGRESS:-default}; do
        label=mk knobs=()
        [ "$s" != default ] && label+="_s$s" knobs+=(NCCL_MK_OFI_STREAMS="$s")
        [ "$e" != default ] && label+="_e$e" knobs+=(NCCL_MK_OFI_EAGER_BYTES="$e")
        [ "$p" != default ] && label+="_p$p" knobs+=(NCCL_MK_OFI_PROGRESS_THREAD="$p")
        run "$label" NCCL_NET_PLUGIN="$MK_BUILD/libnccl-net-mk.so" NCCL_NET=mk "${knobs[@]}"
        [ "$rep" = 1 ] && labels+=("$label")
      done
    done
  done
  for ab in ${MK_AB_PLUGINS:-}; do
    run "${ab%%=*}" NCCL_NET_PLUGIN="${ab#*=}" NCCL_NET=mk
    [ "$rep" = 1 ] && labels+=("${ab%%=*}")
  done
  for v in ${MK_NET_VARIANTS:-}; do
    IFS=, read -r -a knobs <<< "${v#*:}"
    run "${v%%:*}" NCCL_NET_PLUGIN="$MK_BUILD/libnccl-net-mk.so" NCCL_NET=mk "${knobs[@]}"
    [ "$rep" = 1 ] && labels+=("${v%%:*}")
  done
  run socket NCCL_NET_PLUGIN=none NCCL_NET=Socket
  run socket4x4 NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4
done
echo "== busbw (GB/s), $coll, 2 GPUs through the network path, median of $reps run(s)"
for l in "${labels[@]}"; do
  python3 "$MK_ROOT/scripts/bench-compare.py" "$l=$(files "$l")" socket="$(files socket)" \
      socket4x4="$(files socket4x4)"
done
