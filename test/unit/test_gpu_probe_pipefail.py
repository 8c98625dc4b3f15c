#!/usr/bin/env python3
"""scripts/common.sh's mk_have_gpu under `set -o pipefail` (tune.sh runs with it): a GPU
listing that is still writing after its first line must still count as a GPU. With `grep -q`
the reader left at the first match, the lister died of SIGPIPE, the pipeline failed and
tune.sh said "no NVIDIA GPU" on a GPU host (seen once under a parallel test run). The fake
nvidia-smi here pauses between its lines, so the old probe fails every time.

usage: test_gpu_probe_pipefail.py <scripts/common.sh>
"""
import os
import pathlib
import subprocess
import sys
import tempfile

FAKE_SMI = """#!/bin/sh
echo "GPU 0: NVIDIA H200 (UUID: GPU-fake-0)"
sleep 0.3
echo "GPU 1: NVIDIA H200 (UUID: GPU-fake-1)"
"""


def probe(common_sh, smi_text):
    with tempfile.TemporaryDirectory() as d:
        smi = pathlib.Path(d) / "nvidia-smi"
        smi.write_text(smi_text)
        smi.chmod(0o755)
        env = dict(os.environ, PATH=f"{d}:{os.environ['PATH']}")
        script = f"set -euo pipefail; source '{common_sh}'; if mk_have_gpu; then echo yes; else echo no; fi"
        r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        return r.stdout.strip()


def main():
    common_sh = sys.argv[1]
    failures = 0
    got = probe(common_sh, FAKE_SMI)
    if got != "yes":
        print(f"FAIL a slow two-GPU listing: mk_have_gpu said {got!r}, want 'yes'")
        failures += 1
    got = probe(common_sh, "#!/bin/sh\necho 'No devices were found'\n")
    if got != "no":
        print(f"FAIL a listing without GPUs: mk_have_gpu said {got!r}, want 'no'")
        failures += 1
    print("ok" if not failures else f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
