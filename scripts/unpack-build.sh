#!/usr/bin/env bash
# Unpacks scripts/pack-build.sh's pack into build-dev/ on the GPU machine (run from the
# repository root, with build-pack carried): build-pack/b.tar.xz (xz there) or b.tgz.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f build-pack/b.tar.xz ]; then
  xz -dc build-pack/b.tar.xz | tar xf -
elif [ -f build-pack/b.tgz ]; then
  tar xzf build-pack/b.tgz
else
  echo "unpack-build: no build-pack/b.tar.xz or b.tgz (carry [\"build-pack\"])" >&2
  exit 1
fi
