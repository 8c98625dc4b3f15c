#!/usr/bin/env bash
# Compiles one CUDA source of the build as the build does, plus `-Xptxas -v`, and prints each
# kernel's stack frame and spill bytes; with cuobjdump on PATH (scripts/sass-tools.sh) also the
# loops that hold local-memory instructions (scripts/sass-loops.py --spills): ptxas's bytes say
# how much a kernel spills, the loops say whether it is inside a hot loop. No GPU needed.
# usage: scripts/spills.sh SOURCE [FUNCTION_SUBSTR]
#   SOURCE: a .cu file of the build (fused/ring_attn/ring_attn.cu), or a modified copy of one
#           given as COPY=ORIGINAL (/tmp/ra.cu=fused/ring_attn/ring_attn.cu): compiled with the
#           original's command, the original's folder on the include path (its own headers)
#   FUNCTION_SUBSTR: only the kernels whose mangled names hold it
# The object and its SASS stay in ${TMPDIR:-/tmp}/mk-spills/ (x.o, x.sass).
set -euo pipefail
source "$(dirname "$0")/common.sh"
[ $# -ge 1 ] || { sed -n '2,11p' "$0"; exit 2; }
src=${1%%=*} orig=${1#*=}
filter=${2:-}
[ -f "$src" ] || { echo "spills: no file $src" >&2; exit 2; }
src=$(cd "$(dirname "$src")" && pwd)/$(basename "$src")
orig=$(cd "$(dirname "$orig")" && pwd)/$(basename "$orig")
out="${TMPDIR:-/tmp}/mk-spills"
mkdir -p "$out"
[ -f "$MK_BUILD/compile_commands.json" ] || mk_build >/dev/null
cmd=$(python3 - "$MK_BUILD/compile_commands.json" "$orig" "$src" "$out/x.o" <<'EOF'
import json, os, shlex, sys
db, orig, src, obj = sys.argv[1:]
for c in json.load(open(db)):
    f = os.path.normpath(os.path.join(c["directory"], c["file"]))
    if f != orig:
        continue
    args = shlex.split(c["command"])
    o = args.index("-o")
    args[o + 1] = obj
    args[args.index("-c") + 1] = src
    args[1:1] = ["-Xptxas", "-v", "-I" + os.path.dirname(orig)]
    print("cd " + shlex.quote(c["directory"]) + " && " + shlex.join(args))
    break
else:
    sys.exit(f"spills: {orig} is not compiled by the build ({db})")
EOF
)
bash -c "$cmd" >"$out/ptxas.log" 2>&1 || { tail -20 "$out/ptxas.log"; exit 1; }
awk -v f="$filter" '
  /Function properties for/ { name = $NF; next }
  /bytes stack frame/ && name != "" && index(name, f) { sub(/^ +/, ""); print name ": " $0 }
  ' "$out/ptxas.log" | grep -v "^_ZN.*_INTERNAL" || true
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$out/x.o" >"$out/x.sass"
  python3 "$MK_ROOT/scripts/sass-loops.py" "$out/x.sass" --function "$filter" --spills
else
  echo "(no cuobjdump on PATH: PATH=\$(scripts/sass-tools.sh):\$PATH for the loops)"
fi
