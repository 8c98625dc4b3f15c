#!/usr/bin/env python3
"""scripts/sass-loops.py on synthetic `cuobjdump -sass` text: it finds the loop that holds the
wgmma (not the wait loop inside it, not code after it), counts its instructions, reads .xz
files, and --diff names the instructions one build's loop has and the other's lacks, with
registers and constants normalised away (so a mere renaming is no difference); --spills lists
the loops that hold local-memory instructions (and only those), marked by what else they hold.

usage: test_sass_loops.py <scripts/sass-loops.py>
"""
import lzma
import pathlib
import sys
import tempfile

from checks import expect, finish, run_python as run  # test/unit/checks.py, beside this file


def kernel(name, extra):
    """A function: a prologue, a step loop (HGMMA, a wait loop inside it, `extra` lines),
    an epilogue after it."""
    lines = [f"\t\tFunction : {name}", "        /*0000*/                   MOV R1, c[0x0][0x28] ;"]
    body = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;",
            "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R3 ;",
            "@!P0 BRA 0x0020 ;",  # the wait loop: back to its own try-wait
            "MUFU.EX2 R5, R6 ;"] + extra + ["ISETP.NE.AND P1, PT, R7, RZ, PT ;", "@P1 BRA 0x0010 ;"]
    addr = 0x10
    for b in body:
        lines.append(f"        /*{addr:04x}*/                   {b}")
        addr += 0x10
    lines.append(f"        /*{addr:04x}*/                   STG.E desc[UR6][R2.64], R9 ;")
    lines.append(f"        /*{addr + 0x10:04x}*/                   EXIT ;")
    return "\n".join(lines) + "\n"


def main():
    tool = sys.argv[1]

    with tempfile.TemporaryDirectory() as d:
        a = pathlib.Path(d, "a.sass")
        a.write_text(kernel("_Z1kILi0EE", ["FADD R8, R9, R10 ;"]) + kernel("_Z5otherv", []))
        b = pathlib.Path(d, "b.sass.xz")
        with lzma.open(b, "wt") as f:  # the same loop with other registers, and one more LDS
            f.write(kernel("_Z1kILi1EE", ["FADD R18, R19, R20 ;", "LDS.64 R12, [R4+0x40] ;"]))
        rc, out = run(tool, str(a), "--function", "_Z1k")
        expect(rc == 0 and "loop 0x10-0x70: 7 instructions" in out, "the step loop, 7 instructions", out)
        expect("HGMMA:1" in out and "_Z5other" not in out, "its histogram, only the function asked", out)
        rc, out = run(tool, str(a), "--function", "_Z1k", "--diff", str(b))
        expect(rc == 0 and "loop sizes: 7 / 8" in out, "both loops' sizes", out)
        expect("+   1  LDS.64 R, [R+X]" in out, "the extra load named", out)
        expect("FADD" not in out, "a renamed register is no difference", out)
        c = pathlib.Path(d, "c.sass")  # a spill in the step loop, one after it, none in _Z5other
        c.write_text(kernel("_Z1kILi2EE", ["LDL R11, [R1+0x8] ;", "STL [R1+0x8], R11 ;"]).replace(
            "STG.E desc", "STL [R1+0x10], R9 ;\n        /*0000*/  STG.E desc", 1) +
            kernel("_Z5otherv", ["LDG.E.64.STRONG.SYS R2, desc[UR4][R4.64] ;"]))
        rc, out = run(tool, str(c), "--spills")
        expect(rc == 0 and "_Z1kILi2EE: 3 local-memory instructions" in out, "the kernel's LDL/STL counted", out)
        expect("loop 0x10-0x80: 8 instructions, 2 LDL/STL  HGMMA" in out, "the step loop's two, marked HGMMA", out)
        expect("_Z5otherv: 0 local-memory instructions" in out and "SYS" not in out,
               "a loop without LDL/STL is not listed", out)
        rc, out = run(tool, str(a), "--function", "nothing")
        expect(rc != 0 and "no function matching 'nothing'" in out, "an unknown function is an error", out)
        rc, out = run(tool, str(a), "--diff", str(b))
        expect(rc != 0 and "one function on each side" in out, "--diff needs one function", out)
    finish()


if __name__ == "__main__":
    sys.exit(main())
