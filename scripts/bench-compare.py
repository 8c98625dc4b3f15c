#!/usr/bin/env python3
"""Prints busbw side by side from harness JSON files (-J) of the same collective and sizes,
with the ratio of the first to each of the others. A label may name several files (runs of
the same configuration, comma-separated): its cell is then their median busbw, and a
"spread" column per label gives max/min over its runs (how far one run may be trusted).

usage: bench-compare.py LABEL=file.json[,file.json...] LABEL=file.json[,...] [...]"""
import json
import statistics
import sys


def load(arg):
    """(label, {bytes: [record per run]})."""
    label, paths = arg.split("=", 1)
    by_size = {}
    for path in paths.split(","):
        with open(path) as f:
            for r in json.load(f):
                by_size.setdefault(r["bytes"], []).append(r)
    return label, by_size


def cell(records):
    """Median busbw over the runs, max/min spread, #wrong summed (negative: not checked)."""
    if not records:
        return float("nan"), float("nan"), 0
    bw = [r.get("busbw", float("nan")) for r in records]
    spread = max(bw) / min(bw) if min(bw) > 0 else float("nan")
    return statistics.median(bw), spread, sum(max(r.get("wrong", 0), 0) for r in records)


def table(runs):
    base_label, base = runs[0]
    multi = any(len(v) > 1 for _, r in runs for v in r.values())
    head = f"{'bytes':>12} " + " ".join(f"{l + ' busbw':>16}" for l, _ in runs)
    head += " " + " ".join(f"{base_label + '/' + l:>18}" for l, _ in runs[1:])
    if multi:
        head += " " + " ".join(f"{l + ' spread':>16}" for l, _ in runs)
    lines = [head]
    for size in sorted(base):
        cells = [cell(r.get(size, [])) for _, r in runs]
        bws = [c[0] for c in cells]
        ratios = [bws[0] / b if b else float("nan") for b in bws[1:]]
        line = f"{size:>12} " + " ".join(f"{b:>16.3f}" for b in bws)
        line += " " + " ".join(f"{x:>18.2f}" for x in ratios)
        if multi:
            line += " " + " ".join(f"{c[1]:>16.2f}" for c in cells)
        lines.append(line + ("  #wrong!" if sum(c[2] for c in cells) else ""))
    return lines


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    try:
        runs = [load(a) for a in sys.argv[1:]]
    except (OSError, ValueError, KeyError) as e:
        print(f"bench-compare: {e}", file=sys.stderr)
        return 2
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
