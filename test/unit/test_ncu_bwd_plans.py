#!/usr/bin/env python3
"""scripts/ncu-bwd-plans.sh against a fake ncu (first on PATH) and a fake ring_bwd_emul: it profiles
each plan with ring_bwd_emul -p PLAN, one core launch for the one kernel and two for the merged
plan when causal, one for merged non-causal; asks for L2's sectors by operation and, when this
ncu refuses a metric, profiles again without them; keeps each plan's raw, source and details
pages and prints ncu-l2.py's table of both; fails naming what is missing without ncu or the binary.

usage: test_ncu_bwd_plans.py <scripts/ncu-bwd-plans.sh>
"""
import os
import pathlib
import subprocess
import sys
import tempfile

from checks import expect, finish  # test/unit/checks.py, beside this file

# The fake ncu: a profile (-o) appends its arguments to $FAKE_NCU_LOG and makes the report; with
# FAKE_NCU_REJECT set, a run with --metrics fails as ncu does on an unknown metric; an import (-i)
# prints its page: raw (a launch per profiled launch), source, details.
FAKE_NCU = r'''#!/usr/bin/env python3
import os, sys
args = sys.argv[1:]
if "-i" in args:
    rep = args[args.index("-i") + 1]
    page = args[args.index("--page") + 1]
    n = int(open(rep).read())
    if page == "raw":
        print('"ID","Kernel Name","Grid Size","gpu__time_duration.sum","lts__t_sectors_op_read.sum",'
              '"lts__t_sectors_op_read_lookup_hit.sum"')
        print('"","","","msecond","sector","sector"')
        for i in range(n):
            print(f'"{i}","void mk_attn_bwd_kernel<{i}>()","(64, 1, 1)","1.5","1,000","{900 + i}"')
    elif page == "source":
        print('"Kernel Name","void mk_attn_bwd_kernel()",')
        print('"Address","Source","# Samples","stall_wait"')
        print('"0x7f0000001000","  NOP","4","4"')
    else:
        print("details of " + rep)
    sys.exit(0)
with open(os.environ["FAKE_NCU_LOG"], "a") as f:
    f.write(" ".join(args) + "\n")
if os.environ.get("FAKE_NCU_REJECT") and "--metrics" in args:
    print("==ERROR== Failed to find metric lts__t_sectors_op_atom_lookup_hit.sum")
    sys.exit(1)
out = args[args.index("-o") + 1]
open(out + ".ncu-rep", "w").write(args[args.index("-c") + 1])
'''


def run(script, env, *args):
    p = subprocess.run(["bash", script, *args], env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    script = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        tools = pathlib.Path(d, "bin")
        tools.mkdir()
        ncu = tools / "ncu"
        ncu.write_text(FAKE_NCU)
        ncu.chmod(0o755)
        build = pathlib.Path(d, "build")
        emul = build / "test/perf/attn/ring_bwd_emul"
        emul.parent.mkdir(parents=True)
        emul.write_text("#!/bin/sh\nexit 0\n")
        emul.chmod(0o755)
        log = pathlib.Path(d, "ncu.log")
        env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}", FAKE_NCU_LOG=str(log))

        out = pathlib.Path(d, "out")
        rc, text = run(script, env, str(build), str(out))
        calls = log.read_text().splitlines() if log.exists() else []
        expect(rc == 0 and len(calls) == 2, "one profile per default plan (one, merged)", text + "\n".join(calls))
        one = next((c for c in calls if "-p one " in c), "")
        merged = next((c for c in calls if "-p merged " in c), "")
        expect("-c 1 " in one and "-c 2 " in merged, "one launch for the one kernel, two for merged causal", "\n".join(calls))
        expect(all("--metrics lts__t_sectors_op_read.sum," in c and "dram__bytes_write.sum" in c for c in calls),
               "L2's sectors by operation and DRAM's bytes asked for", "\n".join(calls))
        expect(all(c.endswith("1 1,64,8,128,16384,1") and "--clock-control base" in c for c in calls),
               "16K causal GQA by default, base clocks", "\n".join(calls))
        kept = sorted(p.name for p in out.iterdir()) if out.exists() else []
        expect(kept == ["merged-details.txt", "merged-raw.csv.xz", "merged-src.csv.xz", "one-details.txt",
                        "one-raw.csv.xz", "one-src.csv.xz"], "each plan's three pages kept", str(kept))
        expect(text.count("== ") >= 2 and "one-raw.csv.xz: 1 launch" in text and "merged-raw.csv.xz: 2 launches" in text,
               "ncu-l2.py's report of both plans", text)
        expect("90.0%" in text and "all launches" in text, "the loads' hits, the merged plan's launches summed", text)

        log.unlink()
        rc, text = run(script, env, str(build), str(out), "16,16,16,128,8192,0", "merged")
        calls = log.read_text().splitlines()
        expect(rc == 0 and len(calls) == 1 and "-c 1 " in calls[0] and "16,16,16,128,8192,0" in calls[0],
               "merged non-causal: one launch; the shape and plan given", text + "\n".join(calls))

        log.unlink()
        rc, text = run(script, dict(env, FAKE_NCU_REJECT="1"), str(build), str(out), "1,64,8,128,16384,1", "one")
        calls = log.read_text().splitlines()
        expect(rc == 0 and len(calls) == 2 and "--metrics" in calls[0] and "--metrics" not in calls[1],
               "a refused metric: profiled again without the additions", text + "\n".join(calls))
        expect("again without them" in text and "one-raw.csv.xz: 1 launch" in text, "said so, and reported", text)

        rc, text = run(script, env, str(pathlib.Path(d, "nobuild")), str(out))
        expect(rc != 0 and "not built" in text, "a build without ring_bwd_emul refused, named", text)
        if not any(os.path.exists(p + "/ncu") for p in ("/usr/bin", "/bin")):
            rc, text = run(script, dict(env, PATH="/usr/bin:/bin"), str(build), str(out))
            expect(rc != 0 and "no ncu on PATH" in text, "no ncu: refused, named", text)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
