#!/usr/bin/env python3
"""scripts/mk-net-trace on synthetic records: the summary's per-comm idle time (gaps where none
of a comm's requests is in flight, overlapping requests merged), the call timings file beside
a trace, the timeline of two files in one time order, and check with a negative control (a request done before it was posted,
one done with no test()).

usage: test_mk_net_trace.py MK_NET_TRACE"""
import importlib.machinery
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile

TOOL = os.path.abspath(sys.argv[1])
loader = importlib.machinery.SourceFileLoader("mk_net_trace", TOOL)
spec = importlib.util.spec_from_loader("mk_net_trace", loader)
mnt = importlib.util.module_from_spec(spec)
loader.exec_module(mnt)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", file=sys.stderr)


HEAD = "kind,comm,tag,n,size,asked_ns,posted_ns,done_ns,tests\n"


def write(tmp, name, rows):
    p = os.path.join(tmp, name)
    with open(p, "w") as f:
        f.write(HEAD + "".join(",".join(str(x) for x in r) + "\n" for r in rows))
    return p


with tempfile.TemporaryDirectory() as tmp:
    # comm A: [0,10] and [5,20] overlap, then [30,40]: one gap of 10 in a span of 40;
    # comm B: [0,100] alone: no gap.
    good = write(tmp, "good.csv", [
        ("recv", "0xa", 1, 1, 4096, 0, 0, 10, 2),
        ("recv", "0xa", 1, 1, 4096, 5, 5, 20, 1),
        ("send", "0xa", 1, 1, 4096, 25, 30, 40, 1),
        ("send", "0xb", 2, 1, 65536, 0, 0, 100, 7),
    ])
    recs = mnt.load([good])
    gaps = mnt.idle_gaps(recs)
    check(gaps[(good, "0xa")] == ([10], 40), f"comm A's gaps and span: {gaps.get((good, '0xa'))}")
    check(gaps[(good, "0xb")] == ([], 100), f"comm B's gaps and span: {gaps.get((good, '0xb'))}")
    check(mnt.bucket(4096) == 4096 and mnt.bucket(4097) == 8192, "size buckets are powers of two")
    r = subprocess.run([sys.executable, TOOL, "check", good], capture_output=True, text=True)
    check(r.returncode == 0 and "4 records (4 done), 0 inconsistent" in r.stdout,
          f"check passes consistent records: {r.returncode} {r.stdout!r}")
    r = subprocess.run([sys.executable, TOOL, "summary", good], capture_output=True, text=True)
    check(r.returncode == 0 and "nothing in flight 7.1% of their spans" in r.stdout,
          f"summary's idle share (10 of 140 ns): {r.stdout!r}")
    # timeline: two files' events in one time order from the first post, inside the span;
    # a send asked before it was posted has its own "ask" event
    a = write(tmp, "a.csv", [("recv", "0xa", 1, 1, 8, 1000, 1000, 9000, 2),
                             ("send", "0xb", 1, 1, 8, 2000, 4000, 6000, 1)])
    b = write(tmp, "b.csv", [("send", "0xc", 1, 1, 8, 3000, 3000, 8000, 1)])
    lines = mnt.timeline(mnt.load([a, b]), 0, 6)
    got = [tuple(l.split()[:5]) for l in lines]
    want = [("0.0", "p0", "c0", "recv", "post"), ("1.0", "p0", "c2", "send", "ask"),
            ("2.0", "p1", "c1", "send", "post"), ("3.0", "p0", "c2", "send", "post"),
            ("5.0", "p0", "c2", "send", "done")]
    check(got == want, f"timeline's first 6 us across both files: {got}")
    r = subprocess.run([sys.executable, TOOL, "timeline", "--from", "0", "--span", "50", a, b],
                       capture_output=True, text=True)
    check(r.returncode == 0 and len(r.stdout.splitlines()) == 7,
          f"timeline prints all 7 events in 50 us: {r.returncode} {r.stdout!r}")
    # the call timings beside a trace file (mk-net-calls.<pid>.csv): per entry point the count,
    # mean and duration histogram; per thread inside/between and context switches
    tdir = pathlib.Path(tmp, "calls")
    tdir.mkdir()
    trace = write(str(tdir), "mk-net-trace.42.csv", [("send", "0xa", 1, 1, 8, 0, 0, 10, 1)])
    (tdir / "mk-net-calls.42.csv").write_text(
        "record,key,count,total_us,max_us\n"
        "call,isend,4,40.0,20.0\n"
        "dur,isend:lt1us,0,0,0\ndur,isend:lt4us,1,0,0\ndur,isend:lt16us,2,0,0\n"
        "dur,isend:lt64us,1,0,0\ndur,isend:lt256us,0,0,0\ndur,isend:ge256us,0,0,0\n"
        "call,test,0,0.0,0.0\n"
        "inside,t0,4,40.0,0\noutside,t0,4,2000.0,0\n"
        "gap,t0:lt1us,3,0,0\ncsw,t0:voluntary,5,0,0\ncsw,t0:involuntary,1,0,0\n")
    per_pid = mnt.load_calls([trace])
    check(len(per_pid) == 1 and per_pid[0][0] == "42", f"the calls file beside the trace: {per_pid}")
    r = subprocess.run([sys.executable, TOOL, "summary", trace], capture_output=True, text=True)
    out = r.stdout
    isend = [l for l in out.splitlines() if l.startswith("pid 42: isend")]
    check(len(isend) == 1 and isend[0].split()[3:6] == ["4", "10.00", "20.0"]
          and isend[0].split()[6:12] == ["0", "1", "2", "1", "0", "0"],
          f"isend: count 4, mean 10 us, max 20, histogram 0 1 2 1 0 0: {isend}")
    check(not any(l.startswith("pid 42: test ") for l in out.splitlines()),
          "an entry point never called is left out")
    check("thread t0: 4 calls, inside 0.0 ms, between calls 2.0 ms; gaps lt1us=3; context "
          "switches 5 voluntary, 1 involuntary" in out, f"the thread line: {out!r}")
    # negative control: done before posted; done without a test()
    bad = write(tmp, "bad.csv", [
        ("send", "0xa", 1, 1, 4096, 0, 10, 5, 1),
        ("recv", "0xa", 1, 1, 4096, 0, 0, 10, 0),
        ("recv", "0xa", 1, 1, 4096, 0, 0, 10, 1),
    ])
    r = subprocess.run([sys.executable, TOOL, "check", bad], capture_output=True, text=True)
    check(r.returncode == 1 and "2 inconsistent" in r.stdout,
          f"check rejects the two bad records: {r.returncode} {r.stdout!r}")
    r = subprocess.run([sys.executable, TOOL, "check", os.path.join(tmp, "missing.csv")],
                       capture_output=True, text=True)
    check(r.returncode == 2, "a missing file is bad input (2)")

print("ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
