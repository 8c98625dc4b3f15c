#!/usr/bin/env bash
# Packs the build for the GPU machine: the device tool carries at most 64 MiB of working tree
# and ignored paths, and build/ (fatbins in every test binary, ~230 MB) is larger than that.
# Writes build-pack/b.tar.xz (xz's fast preset with a 128 MiB dictionary, which finds the fatbins
# that every test binary repeats: ~5 MB in ~5 s; the GPU machine has xz, not zstd) or, without
# xz here or with MK_PACK_GZIP=1, build-pack/b.tgz (gzip's 32 KB window does not: ~60 MB, near
# the limit). Either holds build-dev/ (build/
# without object files, logs, the soft-RoCE VM's image and the sanitizer builds; build/ab/
# included for A/B runs).
# usage: scripts/pack-build.sh        (builds, then packs) then on the device (carry ["build-pack"]):
#   scripts/unpack-build.sh && MK_BUILD=build-dev MK_SKIP_BUILD=1 scripts/gpu-check.sh TIER
# MK_PACK_EXCLUDE: space-separated tar patterns, relative to the build, left out (with gzip the
# whole build is close to the limit: leave out what the call does not run, e.g.
# MK_PACK_EXCLUDE="./test/perf/fused/moe_perf ./test/gpu/test_moe").
set -euo pipefail
cd "$(dirname "$0")/.."
# Builds first, through mk_build: a bare `ninja` does not rebuild CUDA objects whose headers
# changed with this meson (mk_build touches them), and a stale kernel object cost a session
# its device time (bench/NOTES.md, cross-node AllGather+GEMM).
source scripts/common.sh
mk_build
B=$MK_BUILD
rm -rf build-dev build-pack && mkdir -p build-dev build-pack
excludes=(--exclude=rxe-vm --exclude=tsan --exclude=asan --exclude=core --exclude='*.p' --exclude=meson-logs)
for x in ${MK_PACK_EXCLUDE:-}; do excludes+=("--exclude=$x"); done
(cd "$B" && tar cf - "${excludes[@]}" .) |
  (cd build-dev && tar xf -)
if [ "${MK_PACK_GZIP:-0}" != 1 ] && command -v xz >/dev/null; then
  out=build-pack/b.tar.xz
  tar cf - build-dev | xz -T1 --lzma2=preset=1,dict=128MiB > "$out"
else
  out=build-pack/b.tgz
  tar czf "$out" build-dev
fi
rm -rf build-dev
ls -l "$out"
bytes=$(stat -c %s "$out")
if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
  echo "pack-build: $out is $bytes bytes, over the 64 MiB the device tool carries:" \
    "drop build/ab or set MK_PACK_EXCLUDE" >&2
  exit 1
fi
