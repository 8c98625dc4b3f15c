#!/usr/bin/env bash
# Builds another revision's binaries next to this build, for A/B runs in one device call (the
# only comparison this project trusts: run-to-run spread on the GPU machine is 2-6%).
#
# usage: scripts/ab-build.sh REV [TARGET...]
#   REV      any git revision (a commit, HEAD~1, a branch)
#   TARGET   ninja targets, relative to the build dir (default: the fused perf binaries and
#            gemm_perf); every one must be a static binary of the test tree (they link the
#            internal library statically, so they carry that revision's kernels)
# MK_AB_PATCH=file applies a patch on top of REV first (an experiment kept as a patch, e.g.
# bench/patches/); its output folder is then <short rev>+<patch name>.
# Output: $MK_BUILD/ab/<short rev>/<binary name>, printed one per line. Carry $MK_BUILD (the
# ab/ folder travels with it) and run both, interleaved, in the same call, e.g.
#   for i in 1 2; do build-dev/test/perf/fused/gemm_rs_perf -M 4096; build-dev/ab/<rev>/gemm_rs_perf -M 4096; done
set -euo pipefail
source "$(dirname "$0")/common.sh"
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
rev=$(git -C "$MK_ROOT" rev-parse --short "$1") || { echo "ab-build: no revision '$1'" >&2; exit 2; }
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(test/perf/fused/ag_gemm_perf test/perf/fused/gemm_rs_perf
  test/perf/fused/gemm_ar_perf test/perf/fused/moe_perf test/perf/gemm/gemm_perf)
tag=$rev
patch=${MK_AB_PATCH:-}
if [ -n "$patch" ]; then
  patch=$(cd "$(dirname "$patch")" && pwd)/$(basename "$patch")
  [ -f "$patch" ] || { echo "ab-build: no patch file '$MK_AB_PATCH'" >&2; exit 2; }
  tag="$rev+$(basename "$patch" .patch)"
fi
src="${TMPDIR:-/tmp}/mk-ab-src-$tag" bld="${TMPDIR:-/tmp}/mk-ab-build-$tag"
if [ ! -d "$src" ]; then
  git -C "$MK_ROOT" worktree add --detach "$src" "$rev" >/dev/null
  if [ -n "$patch" ] && ! git -C "$src" apply "$patch"; then
    git -C "$MK_ROOT" worktree remove --force "$src" # not left to pass for the patched tree
    echo "ab-build: $patch does not apply to $rev" >&2
    exit 1
  fi
fi
[ -f "$bld/build.ninja" ] || meson setup "$bld" "$src" >"$bld.setup.log" 2>&1 || {
  cat "$bld.setup.log"; exit 1; }
ninja -C "$bld" "${targets[@]}" >"$bld.ninja.log" 2>&1 || { tail -30 "$bld.ninja.log"; exit 1; }
out="$MK_BUILD/ab/$tag"
mkdir -p "$out"
for t in "${targets[@]}"; do
  cp "$bld/$t" "$out/"
  echo "$out/$(basename "$t")"
done
