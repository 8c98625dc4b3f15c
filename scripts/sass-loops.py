#!/usr/bin/env python3
"""The tensor-core loops of kernels in `cuobjdump -sass` output: per function, each loop (a
backward branch's range) that holds wgmma (HGMMA), its instruction count and opcode histogram;
with --diff, what one function's hottest loop has that another's lacks, registers and constants
normalised. Session 60 found that ptxas's order of an unchanged step loop moves the attention
backward's time by up to 4% with code beside it (bench/NOTES.md): compare the loops of two
builds before reading a figure as a change's effect.

With --spills, per function the loops that hold local-memory instructions (LDL/STL: spills,
and arrays the compiler keeps in local memory), innermost first, each with its count and what
else it holds (HGMMA: a tensor-core loop; UTMALDG: a TMA-loading producer; SYS: system-scope
accesses, i.e. flag waits or their abort checks), and the function's total: ptxas -v gives only
a kernel's spill bytes, not whether they sit in a hot loop.

usage: sass-loops.py FILE [--function SUBSTR] [--spills]
       sass-loops.py FILE --function SUBSTR --diff FILE2 [--function2 SUBSTR2]
FILE: `cuobjdump -sass` output, e.g. `cuobjdump -sass build-dev/test/perf/attn/attn_perf | xz >
$OUT/a.sass.xz` on the GPU machine, or here with scripts/sass-tools.sh's cuobjdump on an object
or binary built here; .xz files are read as they are.
"""
import argparse
import collections
import lzma
import re
import sys

INSN = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
FUNC = re.compile(r"Function : (\S+)")


def read_text(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return f.read()


def functions(text):
    """{mangled name: [(address, opcode, text)]} in file order."""
    out, name = {}, None
    for line in text.splitlines():
        m = FUNC.search(line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        m = INSN.match(line)
        if m and name:
            txt = m.group(2)
            bare = re.sub(r"^@!?U?P[T0-9]+\s+", "", txt)
            out[name].append((int(m.group(1), 16), bare.split()[0] if bare else "", txt))
    return out


def loops(insns):
    """(first, last) address of every backward branch's range, the narrowest first."""
    found = []
    for addr, op, txt in insns:
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", txt)
            if m and int(m.group(1), 16) < addr:
                found.append((int(m.group(1), 16), addr))
    return sorted(found, key=lambda r: r[1] - r[0])


def loop_body(insns, first, last):
    return [i for i in insns if first <= i[0] <= last]


def mma_loops(insns):
    """[(first, last, [insns])] of the loops that hold an HGMMA, the innermost first."""
    res = []
    for first, last in loops(insns):
        body = loop_body(insns, first, last)
        if any(op.startswith("HGMMA") for _, op, _ in body):
            res.append((first, last, body))
    return res


def normalised(txt):
    t = re.sub(r"\bU?R\d+\b", "R", txt)
    t = re.sub(r"\bU?P\d\b", "P", t)
    return re.sub(r"0x[0-9a-f]+", "X", t)


def histogram(body):
    return collections.Counter(op.split(".")[0] for _, op, _ in body)


def pick(funcs, sub, path):
    names = [n for n in funcs if not sub or sub in n]
    if not names:
        sys.exit(f"sass-loops: no function matching '{sub}' in {path}")
    return names


def report(funcs, names):
    for n in names:
        print(n)
        for first, last, body in mma_loops(funcs[n]):
            top = " ".join(f"{k}:{v}" for k, v in histogram(body).most_common(16))
            print(f"  loop {first:#x}-{last:#x}: {len(body)} instructions  {top}")


def is_spill(op):
    return op.startswith(("LDL", "STL"))


SPILL_MARKS = (("HGMMA", lambda op, t: op.startswith("HGMMA")),
               ("UTMALDG", lambda op, t: op.startswith("UTMALDG")),
               ("SYS", lambda op, t: ".SYS" in op))


def spill_report(funcs, names):
    for n in names:
        insns = funcs[n]
        print(f"{n}: {sum(1 for _, op, _ in insns if is_spill(op))} local-memory instructions")
        for first, last in loops(insns):  # one per backward branch: no range twice
            body = loop_body(insns, first, last)
            k = sum(1 for _, op, _ in body if is_spill(op))
            if not k:
                continue
            marks = [m for m, hit in SPILL_MARKS if any(hit(op, t) for _, op, t in body)]
            print(f"  loop {first:#x}-{last:#x}: {len(body)} instructions, {k} LDL/STL  {' '.join(marks)}".rstrip())


def diff(fa, fb):
    """Lines of the hottest (innermost) MMA loop of a and b that the other lacks, counted."""
    la, lb = mma_loops(fa), mma_loops(fb)
    if not la or not lb:
        sys.exit("sass-loops: a function without a loop holding HGMMA")
    a = collections.Counter(normalised(t) for _, _, t in la[0][2])
    b = collections.Counter(normalised(t) for _, _, t in lb[0][2])
    print(f"loop sizes: {sum(a.values())} / {sum(b.values())}")
    for sign, extra in (("-", a - b), ("+", b - a)):
        for line, n in extra.most_common():
            print(f"{sign} {n:3d}  {line}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--function", default="")
    ap.add_argument("--diff")
    ap.add_argument("--function2")
    ap.add_argument("--spills", action="store_true")
    a = ap.parse_args()
    fa = functions(read_text(a.file))
    names = pick(fa, a.function, a.file)
    if a.spills:
        spill_report(fa, names)
        return
    if not a.diff:
        report(fa, names)
        return
    fb = functions(read_text(a.diff))
    names_b = pick(fb, a.function2 if a.function2 is not None else a.function, a.diff)
    if len(names) != 1 or len(names_b) != 1:
        sys.exit(f"sass-loops: --diff needs one function on each side ({len(names)} / {len(names_b)} match)")
    diff(fa[names[0]], fb[names_b[0]])


if __name__ == "__main__":
    main()
