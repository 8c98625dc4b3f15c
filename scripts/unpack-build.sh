#!/usr/bin/env bash
# Unpacks scripts/pack-build.sh's pack into build-dev/ on the GPU machine (run from the
# repository root, with build-pack carried): build-pack/b.tar.zst needs zstd there; without it,
# pack again with MK_PACK_GZIP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f build-pack/b.tar.zst ]; then
  command -v zstd >/dev/null || {
    echo "unpack-build: no zstd on this machine: pack with MK_PACK_GZIP=1 scripts/pack-build.sh" >&2
    exit 1
  }
  zstd -q -d --long=27 -c build-pack/b.tar.zst | tar xf -
elif [ -f build-pack/b.tgz ]; then
  tar xzf build-pack/b.tgz
else
  echo "unpack-build: no build-pack/b.tar.zst or b.tgz (carry [\"build-pack\"])" >&2
  exit 1
fi
