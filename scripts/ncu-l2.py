#!/usr/bin/env python3
"""What a kernel's L2 requests were, by kind, from Nsight Compute's raw page: per launch its time,
the L2 sectors of each operation (loads, stores, reductions, atomics) with how many hit, DRAM's
bytes, and the tensor pipe's activity where collected; then each file's launches summed. Two files
(two plans of one call, or two builds) print in turn, so the kind whose misses grew stands out.
Issue 12: the one-kernel ring backward's L2 hit rate is 94% against the merged plan's 98%
(session 68); which accesses miss (Q/dO loads, dQ reductions, the split's partials) says what to
change (bench/NOTES.md, session 70).

Make the CSV on the GPU machine (scripts/ncu-bwd-plans.sh does, for ring_bwd_emul's plans):
  ncu --clock-control base -k regex:KERNEL -c N --set full -o /tmp/rep BINARY ARGS
  ncu -i /tmp/rep.ncu-rep --page raw --csv | xz > $OUT/a-raw.csv.xz

usage: ncu-l2.py A.csv[.xz] [B.csv[.xz] ...]
"""
import csv
import io
import lzma
import re
import sys

OPS = ("read", "write", "red", "atom")
NAMES = {"read": "loads", "write": "stores", "red": "reductions", "atom": "atomics"}
# Every source's sectors first; the L1TEX unit's (the memory tables' columns) where those are absent.
SOURCES = (("lts__t_sectors_op_{}", "all units"), ("lts__t_sectors_srcunit_tex_op_{}", "L1TEX unit"))
TENSOR = re.compile(r"^sm__pipe_tensor_op_(gmma|hmma)_cycles_active\.avg\.pct_of_peak_sustained_(active|elapsed)$")


def number(text):
    """ncu's numbers carry thousands separators; '' or 'n/a' is no value."""
    t = text.replace(",", "").strip()
    try:
        return float(t)
    except ValueError:
        return None


def read_launches(path):
    """[{column: text}] per launch row; the header row names the columns, the row after it their
    units (skipped: its first cell is empty where a launch's is its ID)."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as f:
        rows = [r for r in csv.reader(io.StringIO(f.read())) if r]
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "ID" in r), None)
    if head is None:
        sys.exit(f"ncu-l2: {path}: no header with 'ID' and 'Kernel Name' (ncu --page raw --csv output?)")
    names = rows[head]
    units = dict(zip(names, rows[head + 1])) if len(rows) > head + 1 and not rows[head + 1][0].strip() else {}
    launches = [dict(zip(names, r)) for r in rows[head + 1:] if r[0].strip() and number(r[0]) is not None]
    for launch in launches:
        launch["_units"] = units
    return launches


# ncu writes a column's unit with a prefix it picks by size ("ms", "Gbyte", "Ksector"; older
# versions "msecond"): each figure is brought to its base unit (ms, byte, sector) before use.
TO_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
         "s": 1e3, "second": 1e3}
PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def in_base(value, unit, column):
    """value in its column's base unit; None (with a warning) for a unit this tool does not know."""
    if unit in TO_MS:
        return value * TO_MS[unit]
    for base in ("byte", "sector"):
        if unit.endswith(base) and unit[: -len(base)] in PREFIX:
            return value * PREFIX[unit[: -len(base)]]
    if unit in ("", "%"):
        return value
    print(f"ncu-l2: {column}: unit '{unit}' not known, figure left out", file=sys.stderr)
    return None


def pick(launch, *columns):
    for c in columns:
        v = number(launch[c]) if c in launch else None
        if v is not None:
            return c, in_base(v, launch["_units"].get(c, ""), c)
    return None, None


def l2_of(launch):
    """{op: (sectors, hits or None, source)} for the ops found, the launch's figures."""
    out = {}
    for op in OPS:
        for pattern, source in SOURCES:
            base = pattern.format(op)
            _, sectors = pick(launch, base + ".sum")
            if sectors is None:
                continue
            _, hits = pick(launch, base + "_lookup_hit.sum")
            if hits is None:
                _, rate = pick(launch, f"lts__t_sector_op_{op}_hit_rate.pct")
                hits = sectors * rate / 100 if rate is not None else None
            out[op] = (sectors, hits, source)
            break
    return out


def short_name(name):
    """The kernel's name without its template arguments and parameters."""
    return re.split(r"[<(]", name.replace("void ", "", 1), maxsplit=1)[0].strip()


def launch_line(launch):
    _, ms = pick(launch, "gpu__time_duration.sum")
    tensor = next((number(v) for k, v in launch.items() if TENSOR.match(k) and number(v) is not None), None)
    parts = [short_name(launch.get("Kernel Name", "?")), f"grid {launch.get('Grid Size', '?')}"]
    if ms is not None:
        parts.append(f"{ms:.3f} ms")
    if tensor is not None:
        parts.append(f"tensor pipe {tensor:.1f}%")
    return "  ".join(parts)


def table(l2, dram):
    lines = [f"    {'kind':<11} {'sectors':>14} {'hit':>7} {'missed':>14}  source"]
    for op, (sectors, hits, source) in l2.items():
        hit = f"{100 * hits / sectors:6.1f}%" if hits is not None and sectors else "      -"
        missed = f"{sectors - hits:14.0f}" if hits is not None else f"{'-':>14}"
        lines.append(f"    {NAMES[op]:<11} {sectors:14.0f} {hit} {missed}  {source}")
    if any(v is not None for v in dram):
        r, w = (f"{v / 1e6:.1f} MB" if v is not None else "-" for v in dram)
        lines.append(f"    DRAM read {r}, written {w}")
    return lines


def summed(launches):
    """Every launch's sectors, hits and DRAM bytes added, per op (hits only where every launch had them)."""
    total, dram = {}, [None, None]
    for launch in launches:
        for op, (sectors, hits, source) in l2_of(launch).items():
            s, h, _ = total.get(op, (0.0, 0.0, source))
            total[op] = (s + sectors, None if h is None or hits is None else h + hits, source)
        for i, col in enumerate(("dram__bytes_read.sum", "dram__bytes_write.sum")):
            _, v = pick(launch, col)
            if v is not None:
                dram[i] = (dram[i] or 0.0) + v
    return total, dram


def report(path):
    launches = read_launches(path)
    print(f"== {path}: {len(launches)} launch{'es' if len(launches) != 1 else ''}")
    for launch in launches:
        print("  " + launch_line(launch))
        dram = tuple(pick(launch, c)[1] for c in ("dram__bytes_read.sum", "dram__bytes_write.sum"))
        l2 = l2_of(launch)
        print("\n".join(table(l2, dram)) if l2 or any(v is not None for v in dram) else "    no L2 metrics collected")
    if len(launches) > 1:
        total, dram = summed(launches)
        print("  all launches")
        print("\n".join(table(total, tuple(dram))))


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[-1])
        return 2
    for path in sys.argv[1:]:
        report(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
