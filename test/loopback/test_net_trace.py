#!/usr/bin/env python3
"""NCCL_MK_NET_TRACE_DIR with real traffic through the plugin's table: the table-traffic
driver (8 sends into one grouped receive of 8) leaves one file whose records scripts/
mk-net-trace finds consistent: 8 sends and one receive, every one done; and one file of call
timings that counts the same 8 posted sends, one receive and 9 test() calls that said done;
without the variable no file is written.

usage: test_net_trace.py TABLE_TRAFFIC LIB_SO MK_NET_TRACE"""
import csv
import glob
import os
import subprocess
import sys
import tempfile

DRIVER, SO, TOOL = sys.argv[1:4]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", file=sys.stderr)


def drive(env):
    r = subprocess.run([DRIVER, SO, "v11"], env=env, capture_output=True, text=True, timeout=80)
    if r.returncode == 77:
        print("SKIP: the driver found no usable ofi device")
        sys.exit(77)
    check(r.returncode == 0, f"table traffic exited {r.returncode}: {r.stderr[-400:]}")


base = dict(os.environ, NCCL_MK_SOCKET_IFNAME="lo", NCCL_MK_TRANSPORT="ofi")
with tempfile.TemporaryDirectory() as tmp:
    drive(dict(base, NCCL_MK_NET_TRACE_DIR=tmp))
    files = glob.glob(os.path.join(tmp, "mk-net-trace.*.csv"))
    check(len(files) == 1, f"one trace file, found {files}")
    if files:
        with open(files[0], newline="") as f:
            rows = list(csv.DictReader(f))
        sends = [r for r in rows if r["kind"] == "send"]
        recvs = [r for r in rows if r["kind"] == "recv"]
        check(len(sends) == 8 and len(recvs) == 1, f"8 sends and 1 receive: {len(sends)}, {len(recvs)}")
        check(all(int(r["done_ns"]) > 0 for r in rows), "every request reported done")
        check(recvs and int(recvs[0]["n"]) == 8, "the receive is a group of 8")
        r = subprocess.run([sys.executable, TOOL, "check", *files], capture_output=True, text=True)
        check(r.returncode == 0, f"mk-net-trace check: {r.stdout}")
    calls = glob.glob(os.path.join(tmp, "mk-net-calls.*.csv"))
    check(len(calls) == 1, f"one call-timing file, found {calls}")
    if calls:
        with open(calls[0], newline="") as f:
            count = {r["key"]: int(r["count"]) for r in csv.DictReader(f) if r["record"] == "call"}
        check(count.get("isend") == 8 and count.get("irecv") == 1 and count.get("test_done") == 9,
              f"calls counted: 8 isend, 1 irecv, 9 test_done: {count}")
        r = subprocess.run([sys.executable, TOOL, "summary", *files], capture_output=True, text=True)
        check(r.returncode == 0 and "isend" in r.stdout and "between calls" in r.stdout,
              f"the summary shows the call timings: {r.stdout[-600:]!r}")
with tempfile.TemporaryDirectory() as tmp:
    drive(dict(base, NCCL_MK_NET_TRACE_DIR=""))
    check(not os.listdir(tmp), "no file without the variable")

print("ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
