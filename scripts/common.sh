# Sourced by the scripts: paths, and a build that happens only when something changed.
MK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MK_BUILD="${MK_BUILD:-$MK_ROOT/build}"
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

# Meson before 1.3 passes nvcc no depfile flags, so ninja does not see a CUDA source's headers:
# when any header is newer than the last build, every CUDA source is marked changed.
mk_cuda_header_deps() {
  local stamp="$MK_BUILD/.cuda-headers.stamp"
  if [ ! -f "$stamp" ] || [ -n "$(find "$MK_ROOT/fused" "$MK_ROOT/include" "$MK_ROOT/test" \
      "$MK_ROOT/plugin" "$MK_ROOT/transport" \( -name '*.cuh' -o -name '*.h' \) \
      -newer "$stamp" -print -quit)" ]; then
    find "$MK_ROOT/fused" "$MK_ROOT/test" -name '*.cu' -exec touch {} +
  fi
  mkdir -p "$MK_BUILD" && touch "$stamp"
}

mk_build() {
  [ "${MK_SKIP_BUILD:-0}" = 1 ] && return 0  # a build made elsewhere and carried (GPU runs)
  meson --version | awk -F. '{ exit !($1 == 0 || ($1 == 1 && $2 < 3)) }' && mk_cuda_header_deps
  if [ ! -f "$MK_BUILD/build.ninja" ]; then
    meson setup "$MK_BUILD" "$MK_ROOT" "$@" >"$MK_ROOT/.meson-setup.log" 2>&1 || {
      cat "$MK_ROOT/.meson-setup.log"; return 1; }
  fi
  ninja -C "$MK_BUILD" >"$MK_BUILD/.ninja.log" 2>&1 || { tail -50 "$MK_BUILD/.ninja.log"; return 1; }
}

# How many NVIDIA GPUs nvidia-smi lists (0 without it). grep -c reads the whole listing: grep -q
# would leave at the first match and, under pipefail, nvidia-smi's SIGPIPE would fail the probe.
mk_gpu_count() {
  command -v nvidia-smi >/dev/null 2>&1 || { echo 0; return 0; }
  nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
}

# 0 when a usable NVIDIA GPU is present.
mk_have_gpu() {
  [ "$(mk_gpu_count)" -gt 0 ]
}
