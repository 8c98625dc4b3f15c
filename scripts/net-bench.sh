#!/usr/bin/env bash
# Builds if needed, then runs the transport loopback benchmark (two processes on this host,
# libfabric tcp;ofi_rxm over 127.0.0.1 vs a plain TCP socket pair). No GPU needed.
# Usage: scripts/net-bench.sh [iterations per point, default 20] [variants, default 1,2,4]
#                             [largest size in bytes, default 268435456]
# A variant is a stream count (NCCL_MK_OFI_STREAMS), optionally with an eager size
# (NCCL_MK_OFI_EAGER_BYTES) after a colon: "1:0,1:65536" compares eager off and on.
# Each variant is its own comm pair, measured interleaved.
set -euo pipefail
source "$(dirname "$0")/common.sh"
mk_build || { echo "build failed"; exit 1; }
exe="$MK_BUILD/test/perf/net/net_loopback_perf"
[ -x "$exe" ] || { echo "net_loopback_perf was not built (libfabric headers missing?)"; exit 1; }
export NCCL_MK_SOCKET_IFNAME="${NCCL_MK_SOCKET_IFNAME:-lo}"
export NCCL_MK_OFI_PROVIDER="${NCCL_MK_OFI_PROVIDER:-tcp;ofi_rxm}"
exec "$exe" "${1:-20}" "${2:-1,2,4}" "${3:-268435456}"
