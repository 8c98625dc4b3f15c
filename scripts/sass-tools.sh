#!/usr/bin/env bash
# Puts cuobjdump and nvdisasm on a machine that has nvcc but not them (this CPU machine: the
# CUDA install here is the compiler alone), from NVIDIA's PyPI wheels, into a cache folder,
# and prints that folder's bin/ (add it to PATH). For reading SASS without the GPU machine:
# `scripts/spills.sh` (spill instructions per loop) and `scripts/sass-loops.py` on
# `cuobjdump -sass` output. Developer tool only: nothing in the build or the tests needs it.
# usage: PATH=$(scripts/sass-tools.sh):$PATH
# MK_SASS_TOOLS_DIR: the cache folder (default ~/.cache/nccl-mk/sass-tools).
set -euo pipefail
dir=${MK_SASS_TOOLS_DIR:-$HOME/.cache/nccl-mk/sass-tools}
bin=$(find "$dir" -type f -name cuobjdump -path '*/bin/*' 2>/dev/null | head -1 || true)
if [ -n "$bin" ] && [ -x "$(dirname "$bin")/nvdisasm" ]; then
  dirname "$bin"
  exit 0
fi
mkdir -p "$dir/wheels" "$dir/x"
# The disassemblers read every older cubin; a newer one than nvcc's is fine.
for pkg in nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; do
  python3 -m pip download --quiet --no-deps "$pkg" -d "$dir/wheels" >&2 ||
    { echo "sass-tools: could not download $pkg from PyPI" >&2; exit 1; }
done
for w in "$dir"/wheels/*.whl; do python3 -m zipfile -e "$w" "$dir/x/"; done
bin=$(find "$dir/x" -type f -name cuobjdump -path '*/bin/*' | head -1)
[ -n "$bin" ] || { echo "sass-tools: no cuobjdump in the wheels" >&2; exit 1; }
chmod +x "$(dirname "$bin")"/*
dirname "$bin"
