#!/usr/bin/env python3
"""The shipped .so must load in any NCCL job: on a host without libfabric, verbs, the CUDA
driver or a GPU. So its NEEDED entries are system libraries only, none of its undefined
symbols belongs to libfabric, verbs, the CUDA driver/runtime or NCCL (those are reached
through dlopen/dlsym or linked statically), and it exports only the plugin tables and the
ncclMk* calls.

usage: so_deps_check.py <lib.so>   (argument 'selftest' runs the checker's negative control)
"""
import re
import subprocess
import sys

ALLOWED_NEEDED = re.compile(r"^(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[-\w]*)\.so")
FORBIDDEN_UNDEFINED = re.compile(r"^(fi_|ibv_|rdma_|cu[A-Z]|cuda[A-Z]|nccl[A-Z]|cublas)")
ALLOWED_EXPORTS = re.compile(r"^(ncclNetPlugin_v(8|9|10|11)|ncclTunerPlugin_v[45]|ncclMk[A-Z]\w*)$")


def problems(needed, undefined, exported):
    out = []
    out += [f"NEEDED {n}: hosts may lack it" for n in needed if not ALLOWED_NEEDED.match(n)]
    out += [f"undefined {s}: must be resolved at run time" for s in undefined
            if FORBIDDEN_UNDEFINED.match(s)]
    out += [f"exported {s}: not part of the ABI" for s in exported if not ALLOWED_EXPORTS.match(s)]
    return out


def read_so(path):
    dyn = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", dyn)
    und = subprocess.run(["nm", "-D", "-u", path], check=True, capture_output=True, text=True).stdout
    undefined = [l.split()[-1].split("@")[0] for l in und.splitlines() if l.strip()]
    defs = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True,
                          text=True).stdout
    exported = [l.split()[-1].split("@")[0] for l in defs.splitlines()
                if len(l.split()) >= 3 and l.split()[1] in "TDRBV"]
    return needed, undefined, exported


def selftest():
    bad = problems(["libfabric.so.1", "libc.so.6"], ["fi_getinfo", "malloc", "cuInit"],
                   ["ncclNetPlugin_v11", "mk_net_isend"])
    assert len(bad) == 4, bad
    assert problems(["libc.so.6"], ["malloc"], ["ncclNetPlugin_v11", "ncclMkGetVersion"]) == []
    print("checker catches forbidden NEEDED, undefined and exported symbols")
    return 0


def main():
    if sys.argv[1] == "selftest":
        return selftest()
    needed, undefined, exported = read_so(sys.argv[1])
    bad = problems(needed, undefined, exported)
    for b in bad:
        print("FAIL:", b)
    if "ncclNetPlugin_v11" not in exported:
        print("FAIL: ncclNetPlugin_v11 is not exported")
        bad.append("missing table")
    print(f"NEEDED: {' '.join(needed)}; {len(undefined)} undefined, exports: {' '.join(sorted(exported))}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
