#!/usr/bin/env python3
"""scripts/tune-write.py against the plugin's own parser: two fake harness JSON files
(as build/test/perf/coll/*_perf -J writes them) go in, and the C parser
(tuner_file_dump, built from plugin/tuner_file.c) must read back exactly the expected
records with no skipped line. Then the negative controls: a corrupted line must be
reported as skipped, and bad input must make tune-write.py fail.

usage: test_tune_write.py <scripts/tune-write.py> <tuner_file_dump>
"""
import json
import pathlib
import subprocess
import sys
import tempfile


def harness_row(coll, nbytes, time_us, wrong=0):
    return {"collective": coll, "bytes": nbytes, "ranks": 2, "type": "float",
            "time_us": time_us, "algbw": nbytes / time_us / 1e3, "busbw": 1.0,
            "wrong": wrong, "time_us_inplace": time_us * 1.01, "busbw_inplace": 1.0}


RING = [harness_row("all_reduce", 8, 9.5), harness_row("all_reduce", 1048576, 21.25),
        harness_row("all_reduce", 4194304, 60.0, wrong=3)]
TREE = [harness_row("all_reduce", 8, 7.125), harness_row("all_reduce", 1048576, 30.0)]

EXPECTED = [
    "allreduce 2 1 8 ring simple 0 9.500",
    "allreduce 2 1 8 tree ll 8 7.125",
    "allreduce 2 1 1048576 ring simple 0 21.250",
    "allreduce 2 1 1048576 tree ll 8 30.000",
    "skipped 0",
]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    tune_write, dump = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        d = pathlib.Path(d)
        (d / "ring.json").write_text(json.dumps(RING))
        (d / "tree.json").write_text(json.dumps(TREE))
        out = d / "tuning.txt"
        w = run([sys.executable, tune_write, "-o", str(out), "--comment", "unit test",
                 f"Ring/Simple/0={d / 'ring.json'}", f"tree/ll/8={d / 'tree.json'}"])
        if w.returncode != 0:
            failures.append(f"tune-write failed: {w.stderr}")
        elif "wrong element" not in w.stderr:
            failures.append("the row with wrong results was not reported as skipped")
        got = run([dump, str(out)])
        # The model sorts by shape and configuration; compare as sets, in a stable order.
        if sorted(got.stdout.split("\n")[:-1]) != sorted(EXPECTED):
            failures.append(f"parsed back:\n{got.stdout}\nexpected:\n" + "\n".join(EXPECTED))

        # Negative control: the same check must notice a line the parser rejects.
        out.write_text(out.read_text() + "allreduce 2 1 64 ring simple 0 fast\n")
        if "skipped 1" not in run([dump, str(out)]).stdout:
            failures.append("a corrupted line was not reported as skipped")

        for bad in (["nonsense=x.json"], [f"ring/simple/99={d / 'ring.json'}"],
                    [f"ring/simple/0={d / 'missing.json'}"]):
            if run([sys.executable, tune_write, "-o", str(d / "x.txt")] + bad).returncode == 0:
                failures.append(f"tune-write accepted bad input {bad}")
        (d / "a2a.json").write_text(json.dumps([harness_row("alltoall", 8, 1.0)]))
        if run([sys.executable, tune_write, f"ring/simple/0={d / 'a2a.json'}"]).returncode == 0:
            failures.append("tune-write wrote a file with nothing NCCL tunes in it")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("tune-write.py output reads back through plugin/tuner_file.c")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
