#!/usr/bin/env python3
"""The collectives harness's timed pass (test/perf/coll/coll_perf.c) on a fake CUDA and NCCL
(test/unit/fake_cuda_nccl.c: one rank, a simulated clock in which side A's collective takes
10 us and side B's 8 us, both slowing by a drift of 1 + t / 20 ms; the call order on stderr).

With -A the sides take turns batch by batch after both warm-ups (A1 B1 A2 B2 ...), the side
that opens every turn being F at the first size and alternating per size; so the drift moves
A/B by at most one batch (within 0.5% of 10/8 here, where whole -n blocks one after the other
gave 1.238 and 1.262). Without -A the pass is side A's batches alone (one event before each,
one after the last), as before -A existed. The inputs a check fills land before the
collective reads them (the fake's legacy-stream writes land only when that stream is synced).

usage: test_coll_perf_fake_clock.py <all_reduce_perf built on fake_cuda_nccl.c>
"""
import json
import pathlib
import subprocess
import sys
import tempfile


def run(binary, args):
    r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=60)
    passes = [l for l in r.stderr.splitlines() if l.strip()]
    return r, passes


def ab_sides_take_turns_batch_by_batch(binary):
    r, passes = run(binary, "-b 8 -e 16 -f 2 -n 8 -w 2 -T 4 -c 0 -A 1".split())
    b_first, a_first = "BBAA|BBBB|AAAA|BBBB|AAAA|", "AABB|AAAA|BBBB|AAAA|BBBB|"
    want = [b_first, b_first, a_first, a_first]  # 8 B (out, in place), then 16 B
    return [] if r.returncode == 0 and passes == want else [f"rc {r.returncode}, passes {passes}, want {want}"]


def ab_without_batches_times_one_block_per_side(binary):
    r, passes = run(binary, "-b 8 -e 8 -n 8 -w 2 -c 0 -A 0".split())
    want = ["AABB|AAAAAAAA|BBBBBBBB|"] * 2
    return [] if r.returncode == 0 and passes == want else [f"rc {r.returncode}, passes {passes}, want {want}"]


def ab_ratio_holds_under_drift(binary):
    problems = []
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "ab.json"
        r, _ = run(binary, f"-b 8 -e 1K -f 2 -n 20 -w 2 -T 4 -A 0 -J {path}".split())
        if r.returncode != 0 or "Out of bounds values : 0 OK" not in r.stdout:
            return [f"rc {r.returncode}: {r.stdout[-800:]}"]
        rows = json.loads(path.read_text())
    for row in rows:
        missing = {"time_us_b", "busbw_b", "wrong_b", "time_us_mean_b"} - row.keys()
        ratio = row["time_us"] / row.get("time_us_b", float("nan"))
        if missing or not abs(ratio / 1.25 - 1) < 0.005:
            problems.append(f"{row['bytes']} B: A/B {ratio:.4f} (want 1.25 +- 0.5%), missing {missing}")
    if len(rows) != 8 or r.stdout.count("A/B") != 8:
        problems.append(f"{len(rows)} rows, {r.stdout.count('A/B')} printed A/B columns; want 8")
    return problems


def one_side_pass_is_side_a_batches_alone(binary):
    problems = []
    for args, want in (("-T 4", "AA|AAAA|AAAA|"), ("", "AA|AAAAAAAA|")):
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "a.json"
            r, passes = run(binary, f"-b 8 -e 8 -n 8 -w 2 -c 0 {args} -J {path}".split())
            rows = json.loads(path.read_text()) if r.returncode == 0 else [{}]
        if r.returncode != 0 or passes != [want] * 2 or "time_us_b" in rows[0] or "A/B" in r.stdout:
            problems.append(f"{args or 'no -T'}: rc {r.returncode}, passes {passes}, want {[want] * 2}")
    return problems


def checked_inputs_land_before_the_collective_reads_them(binary):
    """The fake's legacy-stream writes land only at that stream's sync: a fill or poison that
    did not wait for them would be read stale by the collective (session 49's wrong in-place
    elements under real NCCL). -X (one element corrupted) is the control: it must be caught."""
    problems = []
    for extra, want in (("", "Out of bounds values : 0 OK"), ("-X", "FAILED")):
        r, _ = run(binary, f"-b 8 -e 64K -f 4 -n 2 -w 1 -c 2 {extra}".split())
        if want not in r.stdout:
            problems.append(f"{extra or 'no -X'}: rc {r.returncode}, want '{want}': {r.stdout[-600:]}")
    return problems


def main(argv):
    failed = 0
    for fn in (ab_sides_take_turns_batch_by_batch, ab_without_batches_times_one_block_per_side,
               ab_ratio_holds_under_drift, one_side_pass_is_side_a_batches_alone,
               checked_inputs_land_before_the_collective_reads_them):
        problems = fn(argv[0])
        for p in problems:
            print(f"FAIL {fn.__name__}: {p}")
        failed += bool(problems)
        if not problems:
            print(f"ok {fn.__name__}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
