#!/usr/bin/env bash
# The main job. Builds if needed; then, on a machine with 2+ NVIDIA GPUs, the collectives
# harness through NCCL with our net plugin against NCCL's Socket transport
# (scripts/bench-net.sh); on a machine without GPUs, the transport loopback benchmark
# against a plain TCP socket pair (scripts/net-bench.sh).
set -euo pipefail
source "$(dirname "$0")/common.sh"
mk_build

ngpu=$(mk_gpu_count)
if [ "$ngpu" -ge 2 ]; then
  exec "$MK_ROOT/scripts/bench-net.sh" "$@"
fi
[ "$ngpu" -eq 1 ] && echo "run: one GPU only; the net path needs two. Running the CPU benchmark."
exec "$MK_ROOT/scripts/net-bench.sh" "$@"
