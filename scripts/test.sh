#!/usr/bin/env bash
# Builds if needed, then runs every test suite this machine can run and says which it
# skipped and why. Ends with one line "N passed, N failed, N skipped".
set -uo pipefail
source "$(dirname "$0")/common.sh"

mk_build || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

suites=(unit loopback)
skipped=()
# The soft-RoCE VM (verbs transport on a real RDMA device, ~30 s); RXE_VM=0 leaves it out.
if [ "${RXE_VM:-1}" != 0 ]; then suites+=(vm); else skipped+=("vm: RXE_VM=0"); fi
# The ofi transport's threads under ThreadSanitizer (~2 min); TSAN=0 leaves it out.
if [ "${TSAN:-1}" != 0 ]; then suites+=(tsan); else skipped+=("tsan: TSAN=0"); fi
# The transport and the proxy under ASan and UBSan (~1 min); ASAN=0 leaves it out.
if [ "${ASAN:-1}" != 0 ]; then suites+=(asan); else skipped+=("asan: ASAN=0"); fi
if mk_have_gpu; then
  suites+=(gpu)
else
  skipped+=("gpu: no NVIDIA GPU on this machine (run scripts/gpu-check.sh on a GPU machine)")
fi

args=()
for s in "${suites[@]}"; do args+=(--suite "$s"); done
meson test -C "$MK_BUILD" --print-errorlogs --num-processes 2 "${args[@]}"
rc=$?

for s in "${skipped[@]}"; do echo "skipped suite $s"; done
python3 "$MK_ROOT/scripts/testlog-summary.py" "$MK_BUILD/meson-logs/testlog.json"
exit $rc
