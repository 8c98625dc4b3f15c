#!/usr/bin/env python3
"""scripts/tune.sh on a machine without a GPU must say so and exit non-zero before it
builds or runs anything. A fake nvidia-smi that finds no device stands first on PATH, so
the test behaves the same on the GPU host (where it must not start a calibration).

usage: test_tune_sh_no_gpu.py <scripts/tune.sh>
"""
import os
import pathlib
import subprocess
import sys
import tempfile


def main():
    tune_sh = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        fake = pathlib.Path(d) / "nvidia-smi"
        fake.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
        fake.chmod(0o755)
        env = dict(os.environ, PATH=f"{d}:{os.environ['PATH']}", MK_BUILD=f"{d}/build")
        r = subprocess.run(["bash", tune_sh, "-o", f"{d}/out.txt"], env=env,
                           capture_output=True, text=True, timeout=60)
        problems = []
        if r.returncode == 0:
            problems.append("exit status 0 without a GPU")
        if "no NVIDIA GPU" not in r.stderr:
            problems.append(f"no clear message on stderr: {r.stderr!r}")
        if os.path.exists(f"{d}/build") or os.path.exists(f"{d}/out.txt"):
            problems.append("it built or wrote something before giving up")
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"tune.sh without a GPU: exit {r.returncode}: {r.stderr.strip()}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
