#!/usr/bin/env python3
"""scripts/ncu-l2.py on synthetic `ncu --page raw --csv` text: it finds the header and the units
row, gives each launch's L2 sectors by operation with their hits (from the lookup-hit counts, or
from the hit rate where only that was collected), prefers every unit's sectors to the L1TEX unit's,
converts the duration, sectors and bytes by their units (the prefix ncu picks by size), names a
unit it does not know and leaves that figure out, sums several launches, reads .xz files, says when a launch has
no L2 metrics, and refuses a CSV without the raw page's columns.

usage: test_ncu_l2.py <scripts/ncu-l2.py>
"""
import lzma
import pathlib
import sys
import tempfile

from checks import expect, finish, run_python as run  # test/unit/checks.py, beside this file

COLS = ["ID", "Process ID", "Kernel Name", "Grid Size", "gpu__time_duration.sum",
        "lts__t_sectors_op_read.sum", "lts__t_sectors_op_read_lookup_hit.sum",
        "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum",
        "lts__t_sectors_srcunit_tex_op_red.sum", "lts__t_sector_op_red_hit_rate.pct",
        "dram__bytes_read.sum", "dram__bytes_write.sum",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"]
UNITS = ["", "", "", "", "usecond", "sector", "sector", "sector", "sector", "sector", "%", "byte", "byte", "%"]


def page(rows, units=UNITS, cols=COLS):
    lines = ["==PROF== a line ncu prints before the table"]
    for r in [cols, units] + rows:
        lines.append(",".join(f'"{v}"' for v in r))
    return "\n".join(lines) + "\n"


def main():
    tool = sys.argv[1]
    one = ["0", "4242", "void mk_attn_bwd_kernel<Cfg<128>, 2, 1>(maps, params)", "(8336, 1, 1)", "13,720.5",
           "1,000,000", "940,000", "999", "1", "200,000", "50", "2,000,000,000", "1,000,000,000", "51.1"]
    two = ["1", "4242", "void mk_attn_bwd_kernel<Cfg<128>, 0, 0>(maps, params)", "(8192, 1, 1)", "1,750",
           "500,000", "490,000", "9", "1", "100,000", "90", "", "n/a", ""]
    with tempfile.TemporaryDirectory() as d:
        a = pathlib.Path(d, "a.csv")
        a.write_text(page([one]))
        rc, out = run(tool, str(a))
        expect(rc == 0 and "1 launch" in out and "mk_attn_bwd_kernel  grid (8336, 1, 1)" in out,
               "the launch, its name without template arguments, its grid", out)
        expect("13.720 ms" in out and "tensor pipe 51.1%" in out, "the duration converted from us, the tensor pipe", out)
        loads = next((l for l in out.splitlines() if l.strip().startswith("loads")), "")
        expect("1000000" in loads and "94.0%" in loads and "60000" in loads and "all units" in loads,
               "loads: every unit's sectors (not the L1TEX unit's), hits from the lookup count, misses", loads)
        reds = next((l for l in out.splitlines() if l.strip().startswith("reductions")), "")
        expect("200000" in reds and "50.0%" in reds and "100000" in reds and "L1TEX unit" in reds,
               "reductions: the L1TEX unit's sectors where no other, hits from the hit rate", reds)
        expect("DRAM read 2000.0 MB, written 1000.0 MB" in out, "DRAM's bytes", out)
        expect("stores" not in out and "atomics" not in out, "no line for an operation not collected", out)

        b = pathlib.Path(d, "b.csv.xz")
        with lzma.open(b, "wt") as f:
            f.write(page([one, two]))
        rc, out = run(tool, str(a), str(b))
        expect(rc == 0 and out.count("== ") == 2 and "2 launches" in out, "two files, the second .xz", out)
        total = out.split("all launches", 1)[1] if "all launches" in out else ""
        loads = next((l for l in total.splitlines() if l.strip().startswith("loads")), "")
        expect("1500000" in loads and "70000" in loads and "95.3%" in loads, "the launches' loads summed", total)
        expect("DRAM read 2000.0 MB" in total, "DRAM summed over the launches that have it", total)

        # ncu 2025's units, as the H100's page of session 71 had them: prefixes picked by size
        real = pathlib.Path(d, "real.csv")
        units = ["", "", "", "", "ms", "Ksector", "Ksector", "sector", "sector", "sector", "%",
                 "Gbyte", "Mbyte", "%"]
        real.write_text(page([one[:4] + ["13.9"] + one[5:11] + ["1.9", "1,576.3", "51.1"]], units))
        rc, out = run(tool, str(real))
        loads = next((l for l in out.splitlines() if l.strip().startswith("loads")), "")
        expect(rc == 0 and "13.900 ms" in out and "1000000000" in loads and "60000000" in loads,
               "ms and Ksector brought to ms and sectors", out)
        expect("DRAM read 1900.0 MB, written 1576.3 MB" in out, "Gbyte and Mbyte brought to bytes", out)
        odd = pathlib.Path(d, "odd.csv")
        odd.write_text(page([one], units[:4] + ["fortnight"] + units[5:]))
        rc, out = run(tool, str(odd))
        expect(rc == 0 and "unit 'fortnight' not known" in out and " ms" not in out.split("grid", 1)[-1].split("\n")[0],
               "a unit not known is named and its figure left out, not misread", out)

        bare = pathlib.Path(d, "bare.csv")
        bare.write_text(page([["0", "1", "void k()", "(1, 1, 1)", "5"]], ["", "", "", "", "msecond"], COLS[:5]))
        rc, out = run(tool, str(bare))
        expect(rc == 0 and "5.000 ms" in out and "no L2 metrics collected" in out, "a launch without L2 metrics", out)

        wrong = pathlib.Path(d, "wrong.csv")
        wrong.write_text('"Address","Source"\n"0x1","NOP"\n')
        rc, out = run(tool, str(wrong))
        expect(rc != 0 and "ncu --page raw --csv" in out, "a CSV without the raw page's columns refused", out)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
