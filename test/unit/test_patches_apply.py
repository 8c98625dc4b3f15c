#!/usr/bin/env python3
"""The experiments kept as patches (bench/patches/*.patch, built beside the tree with
scripts/ab-build.sh MK_AB_PATCH for A/B runs) still apply to the tree: one that no longer
does is stale and must be regenerated or deleted. Skips (77) outside a git checkout and when
there are none.

usage: test_patches_apply.py <repository root>"""
import pathlib
import subprocess
import sys

root = pathlib.Path(sys.argv[1]).resolve()
if subprocess.run(["git", "-C", str(root), "rev-parse"], capture_output=True).returncode:
    print("SKIP: not a git checkout")
    sys.exit(77)
patches = sorted((root / "bench" / "patches").glob("*.patch"))
if not patches:
    print("SKIP: no kept patches (bench/patches/*.patch) to check")
    sys.exit(77)
failures = []
for p in patches:
    r = subprocess.run(["git", "-C", str(root), "apply", "--check", str(p)], capture_output=True,
                       text=True)
    if r.returncode:
        failures.append(p.name)
        print(f"FAIL {p.name} no longer applies: {r.stderr.strip()[:300]}", file=sys.stderr)
print(f"{len(patches) - len(failures)} of {len(patches)} patches apply")
sys.exit(1 if failures else 0)
