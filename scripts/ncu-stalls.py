#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction, from Nsight Compute's source page:
per file the share of each stall reason over all samples, then the instructions holding the most
samples with their two largest reasons. Two files (two builds of one kernel) print side by side
in turn, so a reason or an instruction that grew stands out. A file of several launches (ncu -c N)
prints each kernel once, its launches summed. Session 61 found this way that the
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


def read_sections(path):
    """[(kernel name, header, rows)] per kernel launch in the file. ncu's source page prints
    each launch's table twice in a row (seen with 2025 ncu on the H200 machine): an exact
    repeat of the table before it is dropped."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as f:
        text = f.read()
    rows = list(csv.reader(io.StringIO(text)))
    starts = [i for i, r in enumerate(rows) if r[:2] == ["Address", "Source"]]
    if not starts:
        sys.exit(f"ncu-stalls: {path}: no 'Address','Source' header (ncu --page source --csv output?)")
    sections = []
    for n, i in enumerate(starts):
        end = starts[n + 1] - 1 if n + 1 < len(starts) else len(rows)
        name = rows[i - 1][1] if i > 0 and rows[i - 1][:1] == ["Kernel Name"] else "?"
        body = [r for r in rows[i + 1:end] if r[:1] != ["Kernel Name"]]
        if sections and sections[-1][0] == name and sections[-1][2] == body:
            continue
        sections.append((name, rows[i], body))
    return sections


def number(v):
    v = v.replace(",", "").strip()
    return int(v) if v.isdigit() else 0


def load_section(head, rows):
    """[(offset, source, total samples, {reason: samples})] in address order."""
    col = {name: i for i, name in enumerate(head)}
    if "# Samples" not in col:
        sys.exit("ncu-stalls: no '# Samples' column (collect --section SourceCounters)")
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


def load(path):
    """Each launch of the file as load_section's list, launches of one kernel summed
    instruction by instruction (a call of several launches counts whole): [(name, insns)]."""
    merged = {}
    for name, head, rows in read_sections(path):
        insns = load_section(head, rows)
        if name not in merged:
            merged[name] = insns
            continue
        acc = merged[name]
        for i, (off, src, n, rs) in enumerate(insns):
            a = acc[i]
            merged[name][i] = (a[0], a[1], a[2] + n, {k: a[3].get(k, 0) + v for k, v in rs.items()})
    return list(merged.items())


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
        for name, insns in load(path):
            report(f"{path} [{name[:90]}]", insns, a.top, a.reason)


if __name__ == "__main__":
    main()
