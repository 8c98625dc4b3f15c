#!/bin/sh
# Prints the version from include/nccl_mk.h, its one source.
h="$(dirname "$0")/../include/nccl_mk.h"
maj=$(sed -n 's/^#define NCCL_MK_VERSION_MAJOR \([0-9]*\).*/\1/p' "$h")
min=$(sed -n 's/^#define NCCL_MK_VERSION_MINOR \([0-9]*\).*/\1/p' "$h")
pat=$(sed -n 's/^#define NCCL_MK_VERSION_PATCH \([0-9]*\).*/\1/p' "$h")
echo "$maj.$min.$pat"
