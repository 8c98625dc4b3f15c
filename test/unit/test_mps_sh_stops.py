#!/usr/bin/env python3
"""scripts/mps.sh's ending, with a stand-in for nvidia-cuda-mps-control (its -d starts a
stand-in server, a sleeping process named nvidia-cuda-mps-server; `quit` on stdin ends it,
or with FAKE_MPS_QUIT_HANGS=1 hangs):
  - a command that ends: its status comes back and the server is gone;
  - timeout(1) stopping mps.sh: the command's children (the ranks a test starts) are stopped
    too, and mps.sh ends within seconds; in session 39 a rank left running kept the server
    busy, mps.sh's `quit` waited for it, and a device call ran past its limit;
  - a `quit` that hangs: mps.sh still ends, and kills its own server;
  - processes that exit while mps.sh looks for its server's leave no error on its stderr
    (session 40: "/proc/847/cmdline: No such file or directory" from the redirection).

usage: test_mps_sh_stops.py <scripts/mps.sh>
"""
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from checks import expect, finish  # test/unit/checks.py, beside this file

FAKE_CONTROL = """#!/bin/bash
if [ "$1" = -d ]; then
  (exec -a nvidia-cuda-mps-server sleep 600) </dev/null >/dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/server.pid"
  echo $! >> "$FAKE_MPS_RECORD"
  exit 0
fi
read -r cmd
[ "$cmd" = quit ] || exit 1
[ "${FAKE_MPS_QUIT_HANGS:-0}" = 1 ] && exec sleep 600
kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/server.pid")"
"""


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of an exited parent counts as gone
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def pids(path):
    p = pathlib.Path(path)
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def run(mps_sh, tmp, command, timeout_s=None, quit_hangs=False):
    bindir = pathlib.Path(tmp) / "bin"
    bindir.mkdir(exist_ok=True)
    control = bindir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_CONTROL)
    control.chmod(0o755)
    record = pathlib.Path(tmp) / "servers"
    record.unlink(missing_ok=True)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", TMPDIR=tmp,
               FAKE_MPS_RECORD=str(record), FAKE_MPS_QUIT_HANGS="1" if quit_hangs else "0")
    argv = ["bash", mps_sh] + command
    if timeout_s:
        argv = ["timeout", str(timeout_s)] + argv
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=40)
    except subprocess.TimeoutExpired:  # mps.sh hung: say so, and leave nothing running
        r = subprocess.CompletedProcess(argv, -1, "", "(hung: killed after 40 s)")
    took = time.monotonic() - t0
    time.sleep(0.5)
    servers_left = [p for p in pids(record) if alive(p)]
    for p in servers_left:
        os.kill(p, signal.SIGKILL)
    return r, took, servers_left


def main():
    mps_sh = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        r, took, servers_left = run(mps_sh, tmp, ["bash", "-c", "exit 3"])
        expect(r.returncode == 3, f"the command's status comes back (got {r.returncode})")
        expect(not servers_left, "the server is gone after a normal end")

        kids = pathlib.Path(tmp) / "kids"
        cmd = f"sleep 300 & echo $! >> {kids}; sleep 300 & echo $! >> {kids}; wait"
        r, took, servers_left = run(mps_sh, tmp, ["bash", "-c", cmd], timeout_s=2)
        expect(r.returncode == 124, f"timeout(1) ended mps.sh (status {r.returncode})")
        expect(took < 15, f"mps.sh ended {took:.1f} s after its start, within seconds of the TERM")
        left = [p for p in pids(kids) if alive(p)]
        expect(len(pids(kids)) == 2 and not left, f"the command's children were stopped (left: {left})")
        expect(not servers_left, "the server is gone after a TERM")
        for p in left:
            os.kill(p, signal.SIGKILL)

        r, took, servers_left = run(mps_sh, tmp, ["true"], quit_hangs=True)
        expect(r.returncode == 0 and took < 25, f"a hanging quit still ends mps.sh ({took:.1f} s)")
        expect(not servers_left, "mps.sh killed its own server when quit hung")
        expect("did not quit" in r.stderr, "mps.sh says the server did not quit")
        churn = subprocess.Popen(["bash", "-c", "while :; do /bin/true; done"])
        try:
            for _ in range(3):
                r, took, servers_left = run(mps_sh, tmp, ["true"])
                if "No such file" in r.stderr:
                    break
        finally:
            churn.kill()
            churn.wait()
        expect("No such file" not in r.stderr,
               f"processes exiting during the server search leave no error ({r.stderr.strip()[:120]!r})")
    finish()


if __name__ == "__main__":
    main()
