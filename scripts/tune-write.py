#!/usr/bin/env python3
"""Turns the collectives harness's JSON results into a tuning file (NCCL_MK_TUNER_FILE).

usage: tune-write.py [-o FILE] [--nnodes N] [--comment TEXT] ALGO/PROTO/NCHANNELS=RESULT.json ...

Each argument names one harness run (build/test/perf/coll/<coll>_perf -J RESULT.json) made
with NCCL_ALGO=ALGO, NCCL_PROTO=PROTO and, when NCHANNELS > 0, NCCL_MIN/MAX_NCHANNELS set to
it (0: NCCL's own channel count). Every JSON row becomes one line
    collective nranks nnodes bytes algo proto nchannels time_us
(the format is documented in plugin/tuner_file.h). The out-of-place time is used; rows
with wrong results are dropped. Exits 1 when an argument is malformed or nothing is left.
"""
import argparse
import json
import math
import sys

COLLECTIVES = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce"}
ALGOS = {"tree": "tree", "ring": "ring", "collnetdirect": "collnet_direct",
         "collnetchain": "collnet_chain", "nvls": "nvls", "nvlstree": "nvls_tree", "pat": "pat"}
PROTOS = {"ll": "ll", "ll128": "ll128", "simple": "simple"}
MAX_CHANNELS = 64
HEADER = "# collective nranks nnodes bytes algo proto nchannels time_us"


def squash(name):
    """Names compare without case or '_', as the C parser does."""
    return str(name).replace("_", "").lower()


def parse_spec(spec):
    """'ring/simple/8=path.json' -> ('ring', 'simple', 8, 'path.json')."""
    try:
        config, path = spec.split("=", 1)
        algo, proto, nch = config.split("/")
        algo, proto, nch = ALGOS[squash(algo)], PROTOS[squash(proto)], int(nch)
    except (ValueError, KeyError):
        raise ValueError(f"'{spec}' is not ALGO/PROTO/NCHANNELS=FILE.json with known names")
    if not 0 <= nch <= MAX_CHANNELS:
        raise ValueError(f"'{spec}': NCHANNELS must be 0..{MAX_CHANNELS}")
    return algo, proto, nch, path


def row_record(row, nnodes, algo, proto, nch):
    """One tuning-file record from one JSON row, or (None, reason)."""
    coll = squash(row.get("collective", ""))
    if coll not in COLLECTIVES:
        return None, f"collective '{row.get('collective')}' is not one NCCL tunes"
    if row.get("wrong", 0):
        return None, f"{row.get('wrong')} wrong element(s) at {row.get('bytes')} bytes"
    ranks, nbytes, t = int(row["ranks"]), int(row["bytes"]), float(row["time_us"])
    if ranks < 1 or nnodes > ranks or nbytes < 1 or not (math.isfinite(t) and t > 0):
        return None, f"implausible row {row}"
    return (coll, ranks, nnodes, nbytes, algo, proto, nch, t), None


def records_from(spec, nnodes):
    algo, proto, nch, path = parse_spec(spec)
    with open(path) as f:
        rows = json.load(f)
    out = []
    for row in rows:
        rec, why = row_record(row, nnodes, algo, proto, nch)
        if rec:
            out.append(rec)
        else:
            print(f"tune-write: {path}: skipped: {why}", file=sys.stderr)
    return out


def format_record(r):
    coll, ranks, nnodes, nbytes, algo, proto, nch, t = r
    return f"{coll} {ranks} {nnodes} {nbytes} {algo} {proto} {nch} {t:.3f}"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="tuning file to write (default: stdout)")
    ap.add_argument("--nnodes", type=int, default=1, help="nodes the runs spanned (default 1)")
    ap.add_argument("--comment", action="append", default=[], help="a '#' line for the header")
    ap.add_argument("runs", nargs="+", metavar="ALGO/PROTO/NCHANNELS=FILE.json")
    args = ap.parse_args(argv)
    if args.nnodes < 1:
        ap.error("--nnodes must be at least 1")
    records = []
    try:
        for spec in args.runs:
            records += records_from(spec, args.nnodes)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"tune-write: {e}", file=sys.stderr)
        return 1
    if not records:
        print("tune-write: no usable measurement in the inputs", file=sys.stderr)
        return 1
    lines = [f"# {c}" for c in args.comment] + [HEADER]
    lines += [format_record(r) for r in sorted(records)]
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(f"tune-write: {len(records)} measured point(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
