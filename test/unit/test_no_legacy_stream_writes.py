#!/usr/bin/env python3
"""The library writes no device memory on the legacy stream: no cudaMemset, no cudaMemcpy to
the device, no cudaMemcpyToSymbol and no kernel launch without a stream in fused/, plugin/,
transport/ or include/. The callers' streams (and the library's internal one) may be
non-blocking and then do not wait for the legacy stream, so such a write can land after a
kernel has read it (session 49: the MoE layout's zeroing and the cross-node state's upload;
the collectives harness's inputs). Copies back to the host are allowed (they wait for
themselves). The tests and harnesses follow the same rule through their own helpers.

usage: test_no_legacy_stream_writes.py <repository root>"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1])
DIRS = ("fused", "plugin", "transport", "include")
# a statement from the call to its semicolon (calls span lines)
CALL = re.compile(r"\b(cudaMemset|cudaMemcpy|cudaMemcpyToSymbol)\s*\(([^;]*);", re.S)
LAUNCH = re.compile(r"<<<([^>]*)>>>")


def strip_comments(text):
    """Comments and string literals out (an error message may name a call), lines kept."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)


def problems_in(text, name):
    """Each legacy-stream write in the source text of file `name`, as 'name:line: what'."""
    text = strip_comments(text)
    found = []
    for m in CALL.finditer(text):
        call, args = m.group(1), m.group(2)
        if call == "cudaMemcpy" and "cudaMemcpyDeviceToHost" in args:
            continue
        line = text.count("\n", 0, m.start()) + 1
        found.append(f"{name}:{line}: {call} (on the legacy stream)")
    for m in LAUNCH.finditer(text):
        if len(m.group(1).split(",")) < 4:
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{name}:{line}: a launch without a stream")
    return found


def main():
    files = [p for d in DIRS for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in (".c", ".h", ".cu", ".cuh")]
    problems = [p for f in files
                for p in problems_in(f.read_text(errors="replace"), f.relative_to(ROOT))]
    # the rule's own control: the same check on a sample with three legacy-stream writes
    # (lines 1, 2 and 4) and three lookalikes (a comment, a copy back, a string)
    sample = ("x<<<1, 2>>>(a);\ncudaMemset(p, 0, 8);\n/* cudaMemset(q, 0, 8); */\n"
              "cudaMemcpy(d, h, 8,\n cudaMemcpyHostToDevice);\ncudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost);\n"
              'f(cudaMemsetAsync(p, 0, 8, s), "cudaMemset (p)");\n')
    caught = sorted(problems_in(sample, "sample"))
    want = sorted(["sample:1: a launch without a stream", "sample:2: cudaMemset (on the legacy stream)",
                   "sample:4: cudaMemcpy (on the legacy stream)"])
    if caught != want:
        problems.append(f"control: the sample gave {caught}, want {want}")
    for p in problems:
        print(f"FAIL {p}")
    print(f"{len(files)} files checked" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
