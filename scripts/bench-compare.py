#!/usr/bin/env python3
"""Prints busbw side by side from harness JSON files (-J) of the same collective and sizes,
with the ratio of the first to each of the others.

usage: bench-compare.py LABEL=file.json LABEL=file.json [...]"""
import json
import sys


def load(arg):
    label, path = arg.split("=", 1)
    with open(path) as f:
        return label, {r["bytes"]: r for r in json.load(f)}


def main():
    runs = [load(a) for a in sys.argv[1:]]
    if len(runs) < 2:
        print(__doc__)
        return 2
    base_label, base = runs[0]
    head = f"{'bytes':>12} " + " ".join(f"{l + ' busbw':>16}" for l, _ in runs)
    head += " " + " ".join(f"{base_label + '/' + l:>18}" for l, _ in runs[1:])
    print(head)
    for size in sorted(base):
        cells = [r.get(size, {}).get("busbw", float("nan")) for _, r in runs]
        ratios = [cells[0] / c if c else float("nan") for c in cells[1:]]
        wrong = sum(max(r.get(size, {}).get("wrong", 0), 0) for _, r in runs)
        line = f"{size:>12} " + " ".join(f"{c:>16.3f}" for c in cells)
        line += " " + " ".join(f"{x:>18.2f}" for x in ratios)
        print(line + ("  #wrong!" if wrong else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
