#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on the ring backward's core kernels, one plan after another,
# as ring_bwd_emul emulates rank 0's calls (issue 12: where the one kernel, NCCL_MK_RA_BWD_ONE_KERNEL,
# loses to the default plans on a whole GPU). Per plan: one replayed profile of its
# mk_attn_bwd_kernel launches (--set full at base clocks, with L2's sectors by operation added),
# kept as three files under OUTDIR: PLAN-raw.csv.xz (every metric: scripts/ncu-l2.py),
# PLAN-src.csv.xz (per-instruction stall samples: scripts/ncu-stalls.py), PLAN-details.txt; then
# both tools' comparison of the plans.
# usage: scripts/ncu-bwd-plans.sh BUILD OUTDIR [SHAPE [PLAN ...]]
#   SHAPE: ring_bwd_emul's B,H,H_kv,D,S,causal (default 1,64,8,128,16384,1: 16K causal GQA)
#   PLAN: ring_bwd_emul -p's (default: one merged); merged makes two core launches causal
set -u
build=${1:?usage: ncu-bwd-plans.sh BUILD OUTDIR [SHAPE [PLAN ...]]} out=${2:?OUTDIR}
shape=${3:-1,64,8,128,16384,1}
shift $(($# < 3 ? $# : 3))
plans=("$@")
[ ${#plans[@]} -eq 0 ] && plans=(one merged)
here=$(cd "$(dirname "$0")" && pwd)
emul=$build/test/perf/attn/ring_bwd_emul
command -v ncu > /dev/null || { echo "ncu-bwd-plans: no ncu on PATH" >&2; exit 1; }
[ -x "$emul" ] || { echo "ncu-bwd-plans: $emul not built" >&2; exit 1; }
mkdir -p "$out"
# L2's sectors and lookup hits by operation, every unit: --set full's tables give the L1TEX unit's
extra=""
for op in read write red atom; do extra+="lts__t_sectors_op_$op.sum,lts__t_sectors_op_${op}_lookup_hit.sum,"; done
extra+="dram__bytes_read.sum,dram__bytes_write.sum"
tmp=$(mktemp -d)
for p in "${plans[@]}"; do
  launches=1
  [ "$p" = merged ] && [ "${shape##*,}" = 1 ] && launches=2
  base=(ncu --clock-control base -k regex:mk_attn_bwd_kernel -c "$launches" --set full --import-source yes -f
        -o "$tmp/$p")
  # a metric this ncu does not know fails the run: then without the additions
  if ! "${base[@]}" --metrics "$extra" "$emul" -r 2 -p "$p" 1 "$shape" > "$tmp/$p.log" 2>&1; then
    echo "ncu-bwd-plans: $p with the L2 additions failed (tail below); again without them"
    tail -n 3 "$tmp/$p.log"
    "${base[@]}" "$emul" -r 2 -p "$p" 1 "$shape" > "$tmp/$p.log" 2>&1 || { tail -n 5 "$tmp/$p.log"; continue; }
  fi
  ncu -i "$tmp/$p.ncu-rep" --page raw --csv 2> /dev/null | xz > "$out/$p-raw.csv.xz"
  ncu -i "$tmp/$p.ncu-rep" --page source --csv --print-source sass 2> /dev/null | xz > "$out/$p-src.csv.xz"
  ncu -i "$tmp/$p.ncu-rep" --page details --print-details all > "$out/$p-details.txt" 2> /dev/null
done
rm -rf "$tmp"
raws=() srcs=()
for p in "${plans[@]}"; do
  [ -s "$out/$p-raw.csv.xz" ] && raws+=("$out/$p-raw.csv.xz") && srcs+=("$out/$p-src.csv.xz")
done
[ ${#raws[@]} -gt 0 ] || { echo "ncu-bwd-plans: no profile made" >&2; exit 1; }
python3 "$here/ncu-l2.py" "${raws[@]}"
python3 "$here/ncu-stalls.py" "${srcs[@]:0:2}" --top 12
