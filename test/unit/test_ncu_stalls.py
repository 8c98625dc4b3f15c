#!/usr/bin/env python3
"""scripts/ncu-stalls.py on synthetic `ncu --page source --csv` text: it finds the header after
the kernel-name line, totals each stall reason over all samples, ranks the instructions by their
samples (or by one reason's with --reason), names each one's largest reasons, reads .xz files, sums
a kernel's launches (ncu -c N) with each table's repeat dropped, and refuses a CSV without the
source page's columns.

usage: test_ncu_stalls.py <scripts/ncu-stalls.py>
"""
import lzma
import pathlib
import sys
import tempfile

from checks import expect, finish, run_python as run  # test/unit/checks.py, beside this file

HEAD = ["Address", "Source", "# Samples", "Instructions Executed", "stall_barrier", "stall_short_sb",
        "stall_wait", "stall_short_sb (Not Issued)"]


def page(rows):
    lines = ['"Kernel Name","void k(int)",']
    lines.append(",".join(f'"{h}"' for h in HEAD))
    for r in rows:
        lines.append(",".join(f'"{v}"' for v in r))
    return "\n".join(lines) + "\n"


def main():
    tool = sys.argv[1]

    rows = [  # address, source, samples, executed, barrier, short_sb, wait, short_sb not issued
        ["0x7f0000001000", "      LDS.64 R4, [R2]", "10", "100", "0", "0", "10", "0"],
        ["0x7f0000001010", "      @P0 BRA P1, 0x7f0000001100", "1,200", "100", "0", "1,100", "100", "900"],
        ["0x7f0000001020", "      WARPGROUP.DEPBAR.LE gsb0, 0x0", "790", "100", "700", "50", "40", "0"],
    ]
    with tempfile.TemporaryDirectory() as d:
        a = pathlib.Path(d, "a.csv")
        a.write_text(page(rows))
        rc, out = run(tool, str(a), "--top", "2")
        expect(rc == 0 and "2000 samples, 3 instructions" in out, "the totals", out)
        expect("short_sb 57.5%  barrier 35.0%  wait 7.5%" in out, "each reason's share, largest first", out)
        lines = [l for l in out.splitlines() if l.strip().startswith("0x")]
        expect(len(lines) == 2 and "0x10" in lines[0] and "BRA" in lines[0] and "DEPBAR" in lines[1],
               "the two instructions with the most samples, in order, offsets from the first", out)
        expect("short_sb 1100, wait 100" in lines[0] if lines else False, "an instruction's two largest reasons", out)
        expect("Not Issued" not in out and "900" not in out, "the not-issued columns are not reasons", out)
        rc, out = run(tool, str(a), "--top", "1", "--reason", "barrier")
        expect(rc == 0 and "DEPBAR" in out and "BRA" not in out.split("\n", 2)[2], "--reason ranks by that reason", out)
        b = pathlib.Path(d, "b.csv.xz")
        with lzma.open(b, "wt") as f:
            f.write(page(rows[:1]))
        rc, out = run(tool, str(a), str(b), "--top", "1")
        expect(rc == 0 and out.count("== ") == 2 and "b.csv.xz [void k(int)]: 10 samples" in out, "two files, .xz read",
               out)
        # ncu -c 2: each launch's table printed twice in a row; the repeat is dropped, the two
        # launches of one kernel summed instruction by instruction, another kernel apart
        m = pathlib.Path(d, "m.csv")
        second = [[r[0], r[1], "5", "50", "0", "0", "5", "0"] for r in rows]
        other = page(rows[:1]).replace("void k(int)", "void j(int)")
        m.write_text(page(rows) + page(rows) + page(second) + page(second) + other)
        rc, out = run(tool, str(m), "--top", "1")
        expect(rc == 0 and "[void k(int)]: 2015 samples, 3 instructions" in out, "a kernel's launches summed", out)
        expect("[void j(int)]: 10 samples" in out and out.count("== ") == 2, "another kernel apart", out)
        c = pathlib.Path(d, "c.csv")
        c.write_text('"ID","Kernel Name","Metric Name"\n"0","k","gpu__time_duration.sum"\n')
        rc, out = run(tool, str(c))
        expect(rc != 0 and "no 'Address','Source' header" in out, "a CSV of another page is refused", out)
    finish()


if __name__ == "__main__":
    sys.exit(main())
