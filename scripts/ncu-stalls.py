#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction, from Nsight Compute's source page:
per file the share of each stall reason over all samples, then the instructions holding the most
samples with their two largest reasons. Two files (two builds of one kernel) print side by side
in turn, so a reason or an instruction that grew stands out. Session 61 found this way that the
backward's step waited at its mask branch for all eight lse loads (bench/NOTES.md).

Make the CSV on the GPU machine (one launch of the kernel; -k picks it):
  ncu --clock-control base -k regex:mk_attn_bwd_kernel -c 1 --section SourceCounters -o /tmp/rep BINARY ARGS
  ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass | xz > $OUT/a.csv.xz

usage: ncu-stalls.py A.csv[.xz] [B.csv[.xz]] [--top N] [--reason NAME]
  --reason: rank the instructions by that reason's samples (e.g. short_sb) instead of all
"""
import argparse
import collections
import csv
import io
import lzma
import sys


def read_rows(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as f:
        text = f.read()
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if r[:2] == ["Address", "Source"]), None)
    if start is None:
        sys.exit(f"ncu-stalls: {path}: no 'Address','Source' header (ncu --page source --csv output?)")
    return rows[start], rows[start + 1:]


def number(v):
    v = v.replace(",", "").strip()
    return int(v) if v.isdigit() else 0


def load(path):
    """[(offset, source, total samples, {reason: samples})] in address order."""
    head, rows = read_rows(path)
    col = {name: i for i, name in enumerate(head)}
    if "# Samples" not in col:
        sys.exit(f"ncu-stalls: {path}: no '# Samples' column (collect --section SourceCounters)")
    reasons = [n for n in head if n.startswith("stall_") and "Not Issued" not in n]
    out, base = [], None
    for r in rows:
        if len(r) < len(head):
            continue
        addr = int(r[col["Address"]], 16)
        base = addr if base is None else base
        out.append((addr - base, r[col["Source"]].strip(), number(r[col["# Samples"]]),
                    {n[len("stall_"):]: number(r[col[n]]) for n in reasons}))
    return out


def report(path, insns, top, reason):
    total = sum(n for _, _, n, _ in insns) or 1
    by_reason = collections.Counter()
    for _, _, _, rs in insns:
        by_reason.update(rs)
    print(f"== {path}: {total} samples, {len(insns)} instructions")
    print("   " + "  ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(10)))
    key = (lambda x: x[3].get(reason, 0)) if reason else (lambda x: x[2])
    for off, src, n, rs in sorted(insns, key=key, reverse=True)[:top]:
        big = ", ".join(f"{k} {v}" for k, v in sorted(rs.items(), key=lambda kv: -kv[1])[:2] if v)
        print(f"   {off:#7x}  {src[:60]:60s} {n:8d}  {big}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--reason")
    a = ap.parse_args()
    if len(a.files) > 2:
        sys.exit("ncu-stalls: one or two files")
    for path in a.files:
        report(path, load(path), a.top, a.reason)


if __name__ == "__main__":
    main()
