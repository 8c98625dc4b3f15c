#!/usr/bin/env python3
"""gemm_perf's arguments are checked before it looks for a GPU: iterations below 1 (the medians
would read an empty list) and an empty configuration list (the report reads the first) are
refused with exit 2 and a line naming the argument; good arguments get past the check, to the
GPU lookup, which every case here is denied (CUDA_VISIBLE_DEVICES empty: exit 77), so nothing
is benchmarked on a machine that has a GPU.

usage: test_gemm_perf_args.py <gemm_perf>
"""
import os
import subprocess
import sys

from checks import expect, finish  # test/unit/checks.py, beside this file


def run(binary, *args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    binary = sys.argv[1]
    for args, needle in ((["quick", "0"], "iters must be at least 1"),
                         (["full", "-3"], "iters must be at least 1"),
                         (["trace", "x"], "iters must be at least 1"),
                         (["quick", "5", ""], "no configuration in ''")):
        rc, out = run(binary, *args)
        expect(rc == 2 and needle in out, f"gemm_perf {' '.join(repr(a) for a in args)} is refused: {needle}",
               f"rc {rc}\n{out}")
    for args in (["quick", "5", "0,4"], ["fp8", "3", "precise"], ["trace"], []):
        rc, out = run(binary, *args)
        expect(rc == 77, f"gemm_perf {' '.join(args)} gets past the argument check (77: no GPU)", f"rc {rc}\n{out}")
    finish()


if __name__ == "__main__":
    main()
