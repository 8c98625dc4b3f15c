#!/usr/bin/env bash
# Installs every system package the build and the tests need, but for the CUDA toolkit and
# NCCL's header (nccl.h), which the machine image provides (checked below: a warning if
# missing). Safe to run twice: it only calls apt-get when something is missing.
set -euo pipefail

pkgs=(meson ninja-build pkg-config gcc binutils python3 libfabric-dev libfabric-bin
      libibverbs-dev
      # the soft-RoCE VM for the verbs transport (scripts/rxe-vm.sh): the kernel itself is
      # downloaded into the build folder, never installed on the host
      rdma-core ibverbs-utils ibverbs-providers perftest iproute2 qemu-system-x86
      busybox-static cpio kmod
      # scripts/mk-trace png (numpy comes with it); Debian's build is seen by /usr/bin/python3
      python3-matplotlib)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: system packages already present"
fi

# nvcc and nccl.h come with the CUDA toolkit, which the machine image provides.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: nvcc is in /usr/local/cuda/bin; scripts add it to PATH themselves"
fi
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  echo "setup: WARNING nccl.h not found; the build needs NCCL's public header" >&2
fi
