#!/usr/bin/env python3
"""The tuner's check: NCCL alone against NCCL with the tuning file, per size, over rounds.

usage: tune-check.py [--goal 0.97] [--label NAME] [--keep-out FILE [--nnodes N]]
                     (--round NCCL.json TUNED.json | --ab AB.json) [...]

Each --round names two collectives-harness runs (-J) of the same collective and sizes, made
one after the other: NCCL_TUNER_PLUGIN=none, and the tuner with NCCL_MK_TUNER_FILE. Each
--ab names one harness run with -A (both sides in one process, NCCL_MK_TUNER_AB=1): time_us
is NCCL's side, time_us_b (wrong_b) the tuned side's. Per size
and round the ratio is NCCL's time / the tuned time, i.e. tuned busbw / NCCL busbw (> 1: the
file helps), taken from time_us, not from busbw, which the JSON rounds to 0.001 GB/s (a
ratio of 0.003 and 0.004 at 32 B would say nothing). Per size the rounds combine by their
median (with an even count, the geometric mean of the two middle ratios), so one round in
which a stall hit one side cannot decide the verdict with 3 rounds or more; the harness's -T
(the median batch of a run) already keeps a single stall out of each run's time.

Prints a table (each round's ratio beside the median, the sides' median times, and notes:
BELOW the goal, rounds that disagree by more than 10%, wrong results), then
    geomean: G over M sizes ...
    goal: N of M sizes >= 0.97 ...
A size with wrong results in any run never counts as meeting the goal. Exits 1 when an input
is unreadable or a size is missing from a run, else 0 (the goal is reported, not enforced).

--keep-out FILE writes a tuning-file "keep" record (collective nranks nnodes bytes keep: the
tuner then leaves NCCL's own choice around that size) for every size whose median over at
least 2 rounds is below the goal. Not only where every round lost: the burden of proof is on
the override, and on the network path NCCL-vs-NCCL rounds span 0.67-1.53 (tune-net,
2026-11-30, sizes where both sides ran NCCL's choice), so a real 10% loss rarely loses in
every round (16 MiB read 1.247 / 0.888 / 0.823 and escaped). Keeping NCCL's choice where the
file did not hold up costs nothing in expectation. The file is written even when empty.
"""
import argparse
import json
import math
import sys

SPREAD = 1.10  # rounds whose ratios at one size span more than this are flagged


def load(path):
    """bytes -> row of one harness JSON file."""
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        raise ValueError(f"{path}: not a list of harness rows")
    return {int(r["bytes"]): r for r in rows}


def load_ab(path):
    """(NCCL's rows, the tuned rows) of one harness -A run."""
    rows = load(path)
    for r in rows.values():
        if "time_us_b" not in r:
            raise ValueError(f"{path}: no time_us_b (not a harness -A run)")
    tuned = {b: dict(r, time_us=r["time_us_b"], wrong=r.get("wrong_b", 0),
                     time_us_mean=r.get("time_us_mean_b", r["time_us_b"])) for b, r in rows.items()}
    return rows, tuned


def ratio(nccl, tuned):
    """NCCL's time / the tuned time at one size of one round, or None when unusable."""
    tn, tt = float(nccl.get("time_us", -1)), float(tuned.get("time_us", -1))
    if not (math.isfinite(tn) and math.isfinite(tt)) or tn <= 0 or tt <= 0:
        return None
    return tn / tt


def median(values):
    """Median of positive ratios; an even count takes the geometric mean of the middle two
    (ratios are multiplicative: 0.5 and 2.0 combine to 1.0)."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        return None
    if n % 2:
        return v[n // 2]
    return math.sqrt(v[n // 2 - 1] * v[n // 2])


def plain_median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def human(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def combine(rounds):
    """Per size: (ratios per round (None where unusable), median ratio, median NCCL time,
    median tuned time, wrong results seen, missing from some run)."""
    sizes = sorted(set().union(*[set(n) | set(t) for n, t in rounds]))
    out = {}
    for size in sizes:
        ratios, tn, tt, wrong, missing = [], [], [], False, False
        for nccl, tuned in rounds:
            if size not in nccl or size not in tuned:
                ratios.append(None)
                missing = True
                continue
            wrong |= any(float(r.get("wrong", 0)) > 0 for r in (nccl[size], tuned[size]))
            ratios.append(ratio(nccl[size], tuned[size]))
            if ratios[-1] is not None:
                tn.append(float(nccl[size]["time_us"]))
                tt.append(float(tuned[size]["time_us"]))
        good = [r for r in ratios if r is not None]
        out[size] = (ratios, median(good), plain_median(tn) if tn else None,
                     plain_median(tt) if tt else None, wrong, missing or not good)
    return out


def notes_for(ratios, med, wrong, missing, goal):
    good = [r for r in ratios if r is not None]
    notes = []
    if missing:
        notes.append("missing")
    if wrong:
        notes.append("#wrong!")
    if med is not None and med < goal:
        notes.append("BELOW")
    if len(good) > 1 and max(good) / min(good) > SPREAD:
        notes.append("rounds disagree")
    return notes


def fmt(x, spec):
    return format(x, spec) if x is not None else format("-", ">" + spec[:spec.index(".")])


def print_table(label, table, nrounds, goal):
    print(f"== {label}: tuned / NCCL per size (NCCL's time / the tuned time; > 1: the file "
          f"helps), {nrounds} round(s), combined by their median")
    head = f"{'bytes':>12} {'nccl us':>10} {'tuned us':>10} "
    head += " ".join(f"{'round ' + str(r + 1):>8}" for r in range(nrounds))
    print(head + f" {'median':>8}  notes")
    for size, (ratios, med, tn, tt, wrong, missing) in table.items():
        line = f"{size:>12} {fmt(tn, '10.2f')} {fmt(tt, '10.2f')} "
        line += " ".join(fmt(r, "8.3f") for r in ratios)
        line += f" {fmt(med, '8.3f')}  " + " ".join(notes_for(ratios, med, wrong, missing, goal))
        print(line.rstrip())


def print_summary(table, nrounds, goal, mean_files):
    meds = {s: v[1] for s, v in table.items() if v[1] is not None}
    ok = [s for s, v in table.items() if v[1] is not None and v[1] >= goal and not v[4]]
    below = [s for s in table if s not in ok]
    noisy = sum(1 for v in table.values()
                if "rounds disagree" in notes_for(v[0], v[1], v[4], v[5], goal))
    if nrounds < 3:
        print(f"note: {nrounds} round(s): one bad round can still decide a size; the median "
              "needs 3 or more (tune.sh -r 3)")
    for path in mean_files:
        print(f"note: {path}: times are means over all iterations (harness without -T): one "
              "stall can decide a size")
    if noisy:
        print(f"note: at {noisy} size(s) the rounds' ratios span more than "
              f"{(SPREAD - 1) * 100:.0f}%: the median decides there")
    if meds:
        g = math.exp(sum(math.log(r) for r in meds.values()) / len(meds))
        print(f"geomean: {g:.3f} over {len(meds)} sizes (each the median of {nrounds} round(s))")
    detail = ", ".join(f"{human(s)} {fmt(table[s][1], '.3f')}" + (" wrong" if table[s][4] else "")
                       for s in below)
    print(f"goal: {len(ok)} of {len(table)} sizes >= {goal:g}" + (f" (not: {detail})" if below else ""))


def keep_records(table, rounds, goal, nnodes):
    """Tuning-file keep lines for the sizes whose median lost (see the top)."""
    lines = []
    for size, (ratios, med, _tn, _tt, wrong, missing) in table.items():
        good = [r for r in ratios if r is not None]
        if missing or wrong or len(good) < 2 or med is None or med >= goal:
            continue
        row = rounds[0][0][size]
        coll = str(row.get("collective", "")).replace("_", "").lower()
        lines.append(f"{coll} {int(row['ranks'])} {nnodes} {size} keep"
                     f"  # tuned / NCCL {' '.join(f'{r:.3f}' for r in good)}")
    return lines


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--goal", type=float, default=0.97, help="lowest acceptable ratio (0.97)")
    ap.add_argument("--label", default="check", help="name for the table's title")
    ap.add_argument("--keep-out", metavar="FILE", help="write keep records for consistent losses")
    ap.add_argument("--nnodes", type=int, default=1, help="nodes of the runs (keep records)")
    ap.add_argument("--round", nargs=2, action="append", default=[],
                    metavar=("NCCL.json", "TUNED.json"), dest="rounds")
    ap.add_argument("--ab", action="append", default=[], metavar="AB.json",
                    help="one harness -A run: both sides of a round")
    args = ap.parse_args(argv)
    if not args.rounds and not args.ab:
        ap.error("give at least one --round or --ab")
    try:
        rounds = [(load(n), load(t)) for n, t in args.rounds] + [load_ab(p) for p in args.ab]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"tune-check: {e}", file=sys.stderr)
        return 1
    files = list(args.rounds) + [(p, p) for p in args.ab]
    mean_files = sorted({p for pair, names in zip(rounds, files) for side, p in zip(pair, names)
                         if any(r.get("time_stat") != "median" for r in side.values())})
    table = combine(rounds)
    if not table:
        print("tune-check: no sizes in the inputs", file=sys.stderr)
        return 1
    print_table(args.label, table, len(rounds), args.goal)
    print_summary(table, len(rounds), args.goal, mean_files)
    if args.keep_out:
        keeps = keep_records(table, rounds, args.goal, args.nnodes)
        with open(args.keep_out, "w") as f:
            f.write("".join(line + "\n" for line in keeps))
        if keeps:
            print(f"keep: NCCL's own choice at {len(keeps)} size(s) where the file's median "
                  f"lost: {', '.join(human(int(l.split()[3])) for l in keeps)} ({args.keep_out})")
    return 1 if any(v[5] for v in table.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
