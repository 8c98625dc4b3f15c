#!/usr/bin/env python3
"""scripts/bench-net.sh end to end on a fake collectives harness (MK_BUILD/test/perf/coll/
all_reduce_perf writing synthetic JSON, MK_SKIP_BUILD=1), and scripts/bench-compare.py on
synthetic runs. With MK_NET_REPS=2 every configuration runs twice, interleaved (ours,
Socket, Socket 4x4, then again), each run into its own file, and the table gives the median
of the runs, the ratios of the medians and each configuration's spread; a run with wrong
elements is flagged; a missing file is bad input (exit 2). MK_AB_PLUGINS runs another build of
the plugin beside ours in every round, under its own label; MK_NET_VARIANTS runs ours again
under other settings, each its own label, and refuses a malformed entry; MK_NET_MIN,
MK_NET_FACTOR and MK_NET_ITERS reach every run's size range and iterations.

usage: test_bench_net_fake_harness.py <scripts/bench-net.sh> <scripts/bench-compare.py>"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

BENCH, COMPARE = sys.argv[1:3]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", file=sys.stderr)


# busbw: ours 4.0 on the first run and 6.0 on the second, Socket 2.0, Socket 4x4 3.0 (its
# threads variable tells them apart); every run appends its name to the order file.
FAKE = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
out = args[args.index("-J") + 1]
net = os.environ.get("NCCL_NET", "")
name = "mk" if net == "mk" else ("socket4x4" if os.environ.get("NCCL_SOCKET_NTHREADS") else "socket")
if net == "mk" and os.environ.get("NCCL_NET_PLUGIN", "").endswith("/ab/libold.so"):
    name = "old"
if net == "mk" and os.environ.get("NCCL_MK_OFI_EAGER_BYTES") == "4096" and os.environ.get("X_TWO") == "2":
    name = "eager"
order = os.environ["FAKE_ORDER"]
with open(order + ".args", "a") as f:
    f.write(" ".join(args[args.index("-b"):args.index("-J")]) + "\\n")
with open(order, "a") as f:
    f.write(name + "\\n")
runs = open(order).read().split().count(name)
bw = {"mk": 4.0 if runs == 1 else 6.0, "old": 5.0, "eager": 8.0, "socket": 2.0, "socket4x4": 3.0}[name]
recs = [{"bytes": b, "busbw": bw, "wrong": 0} for b in (1024, 1048576)]
json.dump(recs, open(out, "w"))
"""

with tempfile.TemporaryDirectory() as tmp:
    build = pathlib.Path(tmp, "build")
    harness = build / "test/perf/coll/all_reduce_perf"
    harness.parent.mkdir(parents=True)
    harness.write_text(FAKE)
    harness.chmod(0o755)
    env = dict(os.environ, MK_BUILD=str(build), MK_SKIP_BUILD="1", MK_NET_REPS="2",
               OUT=str(pathlib.Path(tmp, "out")), FAKE_ORDER=str(pathlib.Path(tmp, "order")))
    r = subprocess.run(["bash", BENCH, "all_reduce", "1M"], env=env, capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, f"bench-net.sh exits 0: {r.returncode} {r.stderr[-400:]}")
    order = pathlib.Path(tmp, "order").read_text().split()
    check(order == ["mk", "socket", "socket4x4"] * 2, f"runs interleaved: {order}")
    files = sorted(os.listdir(pathlib.Path(tmp, "out")))
    check(files == ["mk.r1.json", "mk.r2.json", "socket.r1.json", "socket.r2.json",
                    "socket4x4.r1.json", "socket4x4.r2.json"], f"one file per run: {files}")
    rows = [l.split() for l in r.stdout.splitlines() if l.strip().startswith("1048576")]
    # bytes, mk/socket/socket4x4 busbw (medians), 2 ratios, 3 spreads
    check(len(rows) == 1 and rows[0][1:4] == ["5.000", "2.000", "3.000"],
          f"medians 5 (4 and 6), 2, 3: {rows}")
    check(rows and rows[0][4:6] == ["2.50", "1.67"], f"ratios of the medians: {rows}")
    check(rows and rows[0][6:9] == ["1.50", "1.00", "1.00"], f"spreads: {rows}")

    def one_round_beside_ours(tag, knob, value, label, busbw):
        """One round with knob=value: label runs after ours, before Socket, with its own table."""
        e = dict(env, MK_NET_REPS="1", OUT=str(pathlib.Path(tmp, "out_" + tag)),
                 FAKE_ORDER=str(pathlib.Path(tmp, "order_" + tag)), **{knob: value})
        r = subprocess.run(["bash", BENCH, "all_reduce", "1M"], env=e, capture_output=True, text=True,
                           timeout=60)
        check(r.returncode == 0, f"bench-net.sh with {knob} exits 0: {r.returncode} {r.stderr[-400:]}")
        order = pathlib.Path(tmp, "order_" + tag).read_text().split()
        check(order == ["mk", label, "socket", "socket4x4"], f"{label} runs in the round: {order}")
        rows = [l.split() for l in r.stdout.splitlines() if l.strip().startswith("1048576")]
        check(len(rows) == 2 and rows[1][1:4] == [busbw, "2.000", "3.000"], f"{label}'s own table: {rows}")
        return e

    # another build beside ours; our build under other settings (every setting applied)
    one_round_beside_ours("ab", "MK_AB_PLUGINS", "old=/x/ab/libold.so", "old", "5.000")
    env_v = one_round_beside_ours("v", "MK_NET_VARIANTS", "eager:NCCL_MK_OFI_EAGER_BYTES=4096,X_TWO=2",
                                  "eager", "8.000")
    bad = dict(env_v, MK_NET_VARIANTS="eager=NCCL_MK_OFI_EAGER_BYTES")
    r = subprocess.run(["bash", BENCH, "all_reduce", "1M"], env=bad, capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 2 and "MK_NET_VARIANTS" in r.stderr, f"a malformed variant: exit 2: {r.returncode}")

    # the sizes and iterations: the defaults, then MK_NET_MIN / MK_NET_FACTOR / MK_NET_ITERS
    args = pathlib.Path(tmp, "order.args").read_text().splitlines()
    check(args and args[0].split()[:6] == ["-b", "8", "-e", "1M", "-f", "4"] and "-n 20" in args[0],
          f"default sizes 8 B x4 and 20 iterations: {args[:1]}")
    e = dict(env, MK_NET_REPS="1", MK_NET_MIN="1048576", MK_NET_FACTOR="2", MK_NET_ITERS="7",
             OUT=str(pathlib.Path(tmp, "out_sizes")), FAKE_ORDER=str(pathlib.Path(tmp, "order_sizes")))
    r = subprocess.run(["bash", BENCH, "all_reduce", "256M"], env=e, capture_output=True, text=True,
                       timeout=60)
    args = pathlib.Path(tmp, "order_sizes.args").read_text().splitlines()
    check(r.returncode == 0 and len(args) == 3 and all(
        a.split()[:6] == ["-b", "1048576", "-e", "256M", "-f", "2"] and "-n 7" in a for a in args),
          f"every run from 1 MiB x2 with 7 iterations: {args}")

    # bench-compare.py alone: one run per label (no spread column), #wrong flagged
    a = pathlib.Path(tmp, "a.json")
    b = pathlib.Path(tmp, "b.json")
    a.write_text(json.dumps([{"bytes": 8, "busbw": 1.0, "wrong": 0}]))
    b.write_text(json.dumps([{"bytes": 8, "busbw": 0.5, "wrong": 3}]))
    r = subprocess.run([sys.executable, COMPARE, f"x={a}", f"y={b}"], capture_output=True, text=True)
    line = r.stdout.splitlines()[-1].split() if r.stdout else []
    check(r.returncode == 0 and line[:4] == ["8", "1.000", "0.500", "2.00"] and "#wrong!" in line,
          f"one run each: values, ratio, #wrong flagged: {r.stdout!r}")
    check("spread" not in r.stdout, "no spread column with one run per label")
    r = subprocess.run([sys.executable, COMPARE, f"x={a}", f"y={tmp}/missing.json"],
                       capture_output=True, text=True)
    check(r.returncode == 2 and "missing.json" in r.stderr, f"a missing file: exit 2: {r.returncode}")

print("ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
