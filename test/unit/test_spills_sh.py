#!/usr/bin/env python3
"""scripts/spills.sh compiles a source of the build with its own command plus -Xptxas -v and
prints each kernel's spill line: the build's trace_clock.cu (one kernel, nothing spilled), then
a modified copy of it given as COPY=ORIGINAL with a kernel whose dynamically indexed array lives
in local memory (a stack frame > 0: the figures are ptxas's, not a constant); the function
filter leaves out the other kernel; a source the build does not compile is an error.
Skipped (77) without nvcc or a build that compiles CUDA.

usage: test_spills_sh.py <scripts/spills.sh> <the build folder>
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from checks import expect, finish  # test/unit/checks.py, beside this file


def main():
    tool, build = sys.argv[1], sys.argv[2]
    root = pathlib.Path(tool).resolve().parent.parent
    if not shutil.which("nvcc") and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        print("SKIP: no nvcc on this machine")
        return 77
    db = pathlib.Path(build, "compile_commands.json")
    if not db.exists() or "trace_clock.cu" not in db.read_text():
        print("SKIP: this build compiles no CUDA source")
        return 77
    path = ":".join(p for p in os.environ["PATH"].split(":") if not os.path.exists(os.path.join(p, "cuobjdump")))
    env = dict(os.environ, MK_BUILD=str(pathlib.Path(build).resolve()), PATH=path)

    def run(*args):
        p = subprocess.run(["bash", tool, *args], capture_output=True, text=True, env=env, cwd=root)
        return p.returncode, p.stdout + p.stderr

    src = root / "fused/common/trace_clock.cu"
    rc, out = run(str(src))
    expect(rc == 0 and re.search(r"trace_read_timer\S*: 0 bytes stack frame, 0 bytes spill stores", out),
           "the build's kernel and its spill line", out)
    with tempfile.TemporaryDirectory() as d:
        copy = pathlib.Path(d, "trace_clock.cu")
        copy.write_text(src.read_text() + """
__global__ void local_array_kernel(float* out, int i) {
  float a[64];
  for (int k = 0; k < 64; k++) a[(k * i) & 63] = out[k];
  out[0] = a[(i >> 3) & 63];
}
""")
        rc, out = run(f"{copy}={src}", "local_array")
        m = re.search(r"local_array_kernel\S*: (\d+) bytes stack frame", out)
        expect(rc == 0 and m and int(m.group(1)) >= 256, "the copy's local array: a 256-byte frame", out)
        expect("trace_read_timer" not in out, "the filter leaves the other kernel out", out)
        other = pathlib.Path(d, "other.cu")
        other.write_text("__global__ void k() {}\n")
        rc, out = run(str(other))
        expect(rc != 0 and "is not compiled by the build" in out, "a source outside the build is refused", out)
    finish()


if __name__ == "__main__":
    sys.exit(main())
