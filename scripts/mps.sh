#!/usr/bin/env bash
# Runs a command with the 2-rank GPU tests and harnesses sharing one GPU: starts an MPS control
# daemon of this user's own (its pipes under a private directory), runs the command with
# MK_SHARE_GPU=1 (perf_launch.h: rank r on device r % count, each process its own NCCL node)
# and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=MK_MPS_PERCENT (default 50: each of 2 ranks sees half
# the SMs, so two persistent kernels that wait for each other both stay resident), then stops
# the daemon, also when the command fails. The GPU's own settings (compute mode) are untouched.
# Without MPS the two processes' kernels take turns in ~4.5 ms time slices: correct, but each
# NCCL step costs a slice and the fused ops' bounded waits expire.
# What it is for: correctness of the 2-rank paths on a 1-GPU machine. Timings under it share
# one GPU's SMs, HBM and copy engines and have no NVLink: they are not 2-GPU figures.
# usage: scripts/mps.sh COMMAND [ARGS...]   e.g. scripts/mps.sh scripts/gpu-check.sh pairs
set -u
[ $# -ge 1 ] || { echo "usage: scripts/mps.sh COMMAND [ARGS...]" >&2; exit 2; }
command -v nvidia-cuda-mps-control >/dev/null ||
  { echo "mps.sh: nvidia-cuda-mps-control not found (the NVIDIA driver's MPS tools)" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/mk-mps.XXXXXX")
export CUDA_MPS_PIPE_DIRECTORY="$dir/pipe" CUDA_MPS_LOG_DIRECTORY="$dir/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d ||
  { echo "mps.sh: the MPS control daemon did not start (log: $CUDA_MPS_LOG_DIRECTORY)" >&2; exit 1; }
# The daemon and server of this server only (their environment names our pipe directory).
ours() {
  local d
  for d in /proc/[0-9]*; do
    # stderr first: a process that exits meanwhile fails the redirection itself
    tr '\0' ' ' 2>/dev/null <"$d/cmdline" | grep -q nvidia-cuda-mps || continue
    tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qxF "CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY" &&
      echo "${d#/proc/}"
  done
}
# Bounded: `quit` waits for the server's clients, and a client stuck in a kernel kept a device
# call past its limit (session 39); what is still ours after 10 s is killed.
stop() {
  echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
  sleep 1
  local left
  left=$(ours)
  [ -n "$left" ] && { echo "mps.sh: the MPS server did not quit; killing it" >&2; kill -9 $left 2>/dev/null; }
  rm -rf "$dir"
}
trap stop EXIT
child=
# A TERM (timeout(1)) stops the command's whole process group, the ranks it started included:
# a rank left running keeps the server busy, so stop() would wait and the next test fail.
stop_child() {
  [ -n "$child" ] || return
  kill -TERM -- "-$child" 2>/dev/null
  sleep 2
  kill -KILL -- "-$child" 2>/dev/null
}
trap 'stop_child; exit 143' TERM INT
export MK_SHARE_GPU=1 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="${MK_MPS_PERCENT:-50}"
echo "mps.sh: MPS server up, ranks share the GPUs, ${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE}% of the SMs each"
setsid "$@" & # a process group of its own (a background job of a script is no group leader, so pgid = pid)
child=$!
wait "$child" # the command in the background, so that a TERM reaches the trap at once
