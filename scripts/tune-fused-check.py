#!/usr/bin/env python3
"""The fused ops' calibrated defaults against an exhaustive sweep of the same run.

usage: tune-fused-check.py TUNED.json SWEEP.json ...

TUNED.json is a fused harness run with comm_sms left to the library (-S 0, NCCL_MK_TUNER_FILE
set); each SWEEP.json the same op with one fixed count (-S N). Prints per shape the tuned time,
the best sweep time and its count, their ratio and whether the default is within 3% of the
best (the tuner issue's goal). Exits 1 when an input is unreadable or a shape is missing.
"""
import json
import sys

TOLERANCE = 1.03


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def shape(row):
    return (row["op"], int(row["m"]), int(row["n"]), int(row["k"]))


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        tuned = {shape(r): float(r["fused_ms"]) for r in rows(argv[0]) if r.get("ok")}
        best = {}
        for path in argv[1:]:
            for r in rows(path):
                if not r.get("ok"):
                    continue
                key, t = shape(r), float(r["fused_ms"])
                if key not in best or t < best[key][0]:
                    best[key] = (t, int(r["comm_sms"]))
    except (OSError, ValueError, KeyError) as e:
        print(f"tune-fused-check: {e}", file=sys.stderr)
        return 1
    print(f"{'op':8} {'M':>6} {'N':>6} {'K':>6} {'tuned ms':>9} {'best ms':>9} {'SMs':>4} {'ratio':>6}  within 3%")
    missing, within = 0, 0
    for key in sorted(best):
        if key not in tuned:
            print(f"{key[0]:8} {key[1]:6} {key[2]:6} {key[3]:6}  (no tuned run)")
            missing += 1
            continue
        t, (b, sms) = tuned[key], best[key]
        ok = t <= b * TOLERANCE
        within += ok
        print(f"{key[0]:8} {key[1]:6} {key[2]:6} {key[3]:6} {t:9.3f} {b:9.3f} {sms:4d} {t / b:6.3f}  {'yes' if ok else 'NO'}")
    print(f"# {within} of {len(best)} shapes within 3% of the best count")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
