#!/bin/sh
# The plugin must load on hosts without libfabric: no NEEDED entry for it and no undefined
# fi_* symbol (everything goes through dlopen + dlsym).
so="$1"
[ -f "$so" ] || { echo "no $so"; exit 1; }
if readelf -d "$so" | grep NEEDED | grep -qiE "fabric|ibverbs|rdmacm"; then
  echo "FAIL: $so has a load-time dependency on libfabric or libibverbs"; readelf -d "$so" | grep NEEDED; exit 1
fi
bad=$(nm -D --undefined-only "$so" | grep -E ' (fi_|ibv_)' || true)
if [ -n "$bad" ]; then echo "FAIL: undefined libfabric/verbs symbols:"; echo "$bad"; exit 1; fi
echo "ok: no load-time libfabric or libibverbs dependency"; readelf -d "$so" | grep NEEDED
