#!/usr/bin/env python3
"""scripts/tune-check.py (tune.sh's NCCL-vs-tuned check) on synthetic harness outputs, as
build/test/perf/coll/*_perf -T K -J writes them: per-size ratios, their median over rounds,
the geometric mean and the goal line. The case that matters: one round in which a stall hit
one side (a 50x outlier, as the session-18 check saw at 32 B) must not decide any verdict,
and a real, consistent 5% loss must still be reported.

usage: test_tune_check.py <scripts/tune-check.py> [case ...]   (default: every case)
"""
import json
import math
import pathlib
import re
import subprocess
import sys
import tempfile

SIZES = [8, 32, 128, 512, 2048, 8192, 32768, 1 << 20, 1 << 24]
# NCCL's time per size (us) and how much the file speeds each size up (>1: helps).
BASE = {s: 10.0 + s / 40000.0 for s in SIZES}
GAIN = {s: (1.25 if s == 1 << 20 else 1.0) for s in SIZES}


def row(nbytes, time_us, wrong=0, stat="median"):
    r = {"collective": "all_reduce", "bytes": nbytes, "ranks": 2, "type": "float",
         "time_us": round(time_us, 3), "algbw": round(nbytes / time_us / 1e3, 3),
         "busbw": round(nbytes / time_us / 1e3, 3), "wrong": wrong,
         "time_us_inplace": round(time_us, 3), "busbw_inplace": 0.0}
    if stat == "median":
        r.update({"time_stat": "median", "batch": 5, "batches": 6, "time_us_mean": time_us})
    return r


def run_pair(jitter, nccl_scale=None, tuned_scale=None, gain=None, wrong=None, stat="median"):
    """(nccl rows, tuned rows) for one round; *_scale: {size: factor} on that side's time."""
    nccl_scale, tuned_scale, gain = nccl_scale or {}, tuned_scale or {}, gain or GAIN
    nccl, tuned = [], []
    for i, s in enumerate(SIZES):
        j = 1.0 + jitter * ((i % 3) - 1)  # +-jitter, different per size
        nccl.append(row(s, BASE[s] * j * nccl_scale.get(s, 1.0), stat=stat))
        tuned.append(row(s, BASE[s] / gain[s] * tuned_scale.get(s, 1.0),
                         wrong=(wrong or {}).get(s, 0), stat=stat))
    return nccl, tuned


def check(tool, d, rounds, extra=()):
    args = [sys.executable, tool, "--label", "all_reduce"] + list(extra)
    for k, (nccl, tuned) in enumerate(rounds):
        n, t = d / f"nccl-{k}.json", d / f"tuned-{k}.json"
        n.write_text(json.dumps(nccl))
        t.write_text(json.dumps(tuned))
        args += ["--round", str(n), str(t)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def table(out):
    """bytes -> (round ratios, median, notes) from the printed table."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+([\d.-]+)\s+([\d.-]+)\s+(.*)$", line)
        if not m:
            continue
        cells = m.group(4).split()
        nums = []
        for c in cells:
            if re.fullmatch(r"[\d.]+|-", c):
                nums.append(None if c == "-" else float(c))
            else:
                break
        rows[int(m.group(1))] = (nums[:-1], nums[-1], " ".join(cells[len(nums):]))
    return rows


def goal_line(out):
    lines = out.strip().splitlines()
    return lines[-1] if lines else ""


def geomean(out):
    m = re.search(r"^geomean: ([\d.]+) over (\d+) sizes", out, re.M)
    return (float(m.group(1)), int(m.group(2))) if m else (None, None)


def case_outlier_round_does_not_decide(tool, d):
    """Round 2: the tuned side stalled at 32 B (ratio 0.02) and NCCL's side at 512 B
    (ratio 50). The median over 3 rounds must be ~1.0 at both sizes; the goal line and the
    geomean must be those of the clean rounds."""
    rounds = [run_pair(0.01), run_pair(0.01, nccl_scale={512: 50.0}, tuned_scale={32: 50.0}),
              run_pair(0.01)]
    r = check(tool, d, rounds)
    problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {r.stderr}"]
    t = table(r.stdout)
    for size, bad in ((32, 0.02), (512, 50.0)):
        ratios, med, notes = t.get(size, ([], None, ""))
        if len(ratios) != 3 or ratios[1] is None or abs(ratios[1] - bad) > bad * 0.05:
            problems.append(f"{size} B: round 2 should show the outlier {bad}: {ratios}")
        if med is None or abs(med - 1.0) > 0.03:
            problems.append(f"{size} B: median {med} was moved by the outlier round")
        if "rounds disagree" not in notes:
            problems.append(f"{size} B: the disagreeing rounds are not flagged: {notes!r}")
    if goal_line(r.stdout) != f"goal: {len(SIZES)} of {len(SIZES)} sizes >= 0.97":
        problems.append(f"goal line: {goal_line(r.stdout)!r}")
    g, n = geomean(r.stdout)
    want = math.exp(math.log(1.25) / len(SIZES))
    if n != len(SIZES) or g is None or abs(g - want) > 0.01:
        problems.append(f"geomean {g} over {n}, want ~{want:.3f} over {len(SIZES)}")
    return problems, r.stdout


def case_consistent_loss_is_reported(tool, d):
    """The file makes 8 KiB 5% slower in every round: one size below the goal, named."""
    gain = {**GAIN, 8192: 1 / 1.05}
    rounds = [run_pair(0.005, gain=gain) for _ in range(3)]
    r = check(tool, d, rounds)
    problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {r.stderr}"]
    ratios, med, notes = table(r.stdout).get(8192, ([], None, ""))
    if med is None or abs(med - 1 / 1.05) > 0.01 or "BELOW" not in notes:
        problems.append(f"8 KiB: median {med}, notes {notes!r}")
    want = f"goal: {len(SIZES) - 1} of {len(SIZES)} sizes >= 0.97 (not: 8 KiB 0.95"
    if not goal_line(r.stdout).startswith(want):
        problems.append(f"goal line: {goal_line(r.stdout)!r}, want it to start {want!r}")
    return problems, r.stdout


def case_two_rounds_warn_and_wrong_results_fail(tool, d):
    """With 2 rounds the median cannot reject an outlier: say so. A size with wrong results
    never meets the goal, however fast. Mean-mode inputs (no -T) are named."""
    rounds = [run_pair(0.0, wrong={128: 3}), run_pair(0.0, stat="mean")]
    r = check(tool, d, rounds)
    problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {r.stderr}"]
    if "note: 2 round(s)" not in r.stdout:
        problems.append("no note that 2 rounds cannot reject an outlier")
    if r.stdout.count("times are means") != 2:
        problems.append("the two mean-mode files are not both named")
    if "#wrong!" not in table(r.stdout).get(128, ([], None, ""))[2]:
        problems.append("128 B: wrong results not flagged")
    if not goal_line(r.stdout).startswith(f"goal: {len(SIZES) - 1} of {len(SIZES)}"):
        problems.append(f"goal line: {goal_line(r.stdout)!r}")
    return problems, r.stdout


def case_even_rounds_combine_geometrically(tool, d):
    """4 rounds at one size with ratios 0.5, 1, 1, 2 (middle two: 1 and 1) -> 1.0; and the
    geometric mean of the middle two when they differ (0.8 and 1.25 -> 1.0)."""
    rounds = [run_pair(0.0, tuned_scale={32: f}) for f in (2.0, 1.0, 1.0, 0.5)]
    rounds[1] = run_pair(0.0, tuned_scale={32: 1.25, 128: 1.25})
    rounds[2] = run_pair(0.0, tuned_scale={32: 0.8, 128: 0.8})
    r = check(tool, d, rounds)
    problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {r.stderr}"]
    t = table(r.stdout)
    for size in (32, 128):
        med = t.get(size, ([], None, ""))[1]
        if med is None or abs(med - 1.0) > 0.005:
            problems.append(f"{size} B: median {med}, want 1.000")
    return problems, r.stdout


def case_bad_inputs_fail(tool, d):
    """A size missing from one run, or an unreadable file: exit 1."""
    nccl, tuned = run_pair(0.0)
    r = check(tool, d, [(nccl, tuned[:-1])])
    problems = [] if r.returncode == 1 else [f"missing size: exit {r.returncode}"]
    if "missing" not in r.stdout:
        problems.append("the missing size is not marked")
    bad = subprocess.run([sys.executable, tool, "--round", str(d / "none.json"),
                          str(d / "none.json")], capture_output=True, text=True, timeout=60)
    if bad.returncode != 1 or "tune-check:" not in bad.stderr:
        problems.append(f"unreadable input: exit {bad.returncode}, {bad.stderr!r}")
    return problems, r.stdout


def case_median_losses_get_keep_records_noisy_gains_do_not(tool, d):
    """A 10% loss at 8 KiB in all 3 rounds gets a keep record, and so does 2 KiB, whose rounds
    read 1.247 / 0.888 / 0.823 (tune-net's 16 MiB, 2026-11-30: the median lost though one round
    won); a size that lost 20% in one round and gained in the others (median > 1) does not, nor
    does the 1 MiB gain; one round gives none."""
    rounds = [run_pair(0.01, tuned_scale={8192: 1.10, 512: s, 2048: 1 / r})
              for s, r in ((1.2, 1.247), (0.95, 0.888), (0.97, 0.823))]
    out = d / "keep.txt"
    r = check(tool, d, rounds, extra=["--keep-out", str(out), "--nnodes", "1"])
    problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {r.stderr}"]
    lines = [l.split("#")[0].split() for l in out.read_text().splitlines()] if out.exists() else None
    if lines != [["allreduce", "2", "1", s, "keep"] for s in ("2048", "8192")]:
        problems.append(f"keep records {lines}, want allreduce 2 1 2048 keep and 8192 keep")
    if "keep: NCCL's own choice at 2 size(s)" not in r.stdout:
        problems.append("no keep line in the output")
    one = check(tool, d, rounds[:1], extra=["--keep-out", str(out)])
    if one.returncode != 0 or out.read_text() != "":
        problems.append("one round must not give keep records (nothing tells a loss from noise)")
    return problems, r.stdout


def case_ab_runs_read_both_sides_from_one_file(tool, d):
    """A harness -A run per round (time_us: NCCL's side, time_us_b: the tuned one) gives the
    same table as the two-file rounds; a file without time_us_b is refused."""
    rounds = [run_pair(0.01) for _ in range(3)]
    args = [sys.executable, tool, "--label", "all_reduce"]
    for k, (nccl, tuned) in enumerate(rounds):
        ab = [dict(n, time_us_b=t["time_us"], wrong_b=t["wrong"]) for n, t in zip(nccl, tuned)]
        f = d / f"ab-{k}.json"
        f.write_text(json.dumps(ab))
        args += ["--ab", str(f)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {r.stderr}"]
    ratios, med, _ = table(r.stdout).get(1 << 20, ([], None, ""))
    if med is None or abs(med - 1.25) > 0.01:
        problems.append(f"1 MiB: median {med}, want the file's 1.25")
    if goal_line(r.stdout) != f"goal: {len(SIZES)} of {len(SIZES)} sizes >= 0.97":
        problems.append(f"goal line {goal_line(r.stdout)!r}")
    plain = d / "plain.json"
    plain.write_text(json.dumps(rounds[0][0]))
    bad = subprocess.run([sys.executable, tool, "--ab", str(plain)], capture_output=True, text=True,
                         timeout=60)
    if bad.returncode != 1 or "time_us_b" not in bad.stderr:
        problems.append(f"a file without time_us_b: exit {bad.returncode}, {bad.stderr!r}")
    return problems, r.stdout


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def main(argv):
    tool, names = argv[0], argv[1:] or list(CASES)
    failed = 0
    for name in names:
        with tempfile.TemporaryDirectory() as d:
            problems, out = CASES[name](tool, pathlib.Path(d))
        for p in problems:
            print(f"FAIL {name}: {p}")
        if problems:
            print(out)
            failed += 1
        else:
            print(f"ok {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
