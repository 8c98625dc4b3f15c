#!/usr/bin/env bash
# The main job. Builds if needed; then, on a machine with 2+ NVIDIA GPUs, the collectives
# harness through NCCL with our net plugin against NCCL's Socket transport
# (scripts/bench-net.sh); with one GPU the same with both ranks on it under an MPS server of
# our own (scripts/mps.sh: NCCL's small all_reduce then takes what it takes on two GPUs,
# bench/NOTES.md session 35), or, without the MPS tools, and on a machine without GPUs, the
# transport loopback benchmark against a plain TCP socket pair (scripts/net-bench.sh).
set -euo pipefail
source "$(dirname "$0")/common.sh"
mk_build

ngpu=$(mk_gpu_count)
if [ "$ngpu" -ge 2 ]; then
  exec "$MK_ROOT/scripts/bench-net.sh" "$@"
fi
if [ "$ngpu" -eq 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
  echo "run: one GPU: both ranks on it under MPS (scripts/mps.sh)"
  exec "$MK_ROOT/scripts/mps.sh" "$MK_ROOT/scripts/bench-net.sh" "$@"
fi
[ "$ngpu" -eq 1 ] && echo "run: one GPU and no MPS tools; the net path needs two ranks. Running the CPU benchmark."
exec "$MK_ROOT/scripts/net-bench.sh" "$@"
