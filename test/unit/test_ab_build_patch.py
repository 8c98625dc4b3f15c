#!/usr/bin/env python3
"""scripts/ab-build.sh's patch option (MK_AB_PATCH) refuses what it cannot use before any
build: a patch file that does not exist (exit 2, named), and one that does not apply to the
revision (exit 1, named; the worktree made for it is removed, so that a later run cannot take
the unpatched tree for the patched one).

usage: test_ab_build_patch.py <scripts/ab-build.sh>"""
import os
import pathlib
import subprocess
import sys
import tempfile

SCRIPT = os.path.abspath(sys.argv[1])
root = pathlib.Path(SCRIPT).parent.parent
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", file=sys.stderr)


with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, TMPDIR=tmp, MK_BUILD=os.path.join(tmp, "build"))
    r = subprocess.run(["bash", SCRIPT, "HEAD", "libnccl-net-mk.so"],
                       env=dict(env, MK_AB_PATCH=os.path.join(tmp, "missing.patch")),
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "missing.patch" in r.stderr,
          f"a missing patch: exit 2 naming it: {r.returncode} {r.stderr!r}")
    bad = pathlib.Path(tmp, "bad.patch")
    bad.write_text("--- a/no/such/file.c\n+++ b/no/such/file.c\n@@ -1 +1 @@\n-x\n+y\n")
    r = subprocess.run(["bash", SCRIPT, "HEAD", "libnccl-net-mk.so"],
                       env=dict(env, MK_AB_PATCH=str(bad)), capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 1 and "does not apply" in r.stderr,
          f"a patch that does not apply: exit 1: {r.returncode} {r.stderr[-300:]!r}")
    check(not pathlib.Path(tmp, "build", "ab").exists(), "nothing built or copied")
    check(not list(pathlib.Path(tmp).glob("mk-ab-src-*")), "the unpatched worktree is removed")
subprocess.run(["git", "-C", str(root), "worktree", "prune"], capture_output=True)

print("ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
