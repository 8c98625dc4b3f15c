#!/usr/bin/env python3
"""Turns the collectives harness's JSON results into a tuning file (NCCL_MK_TUNER_FILE).

usage: tune-write.py [-o FILE] [--nnodes N] [--comment TEXT] ALGO/PROTO/NCHANNELS=RESULT.json ...
                     [fused=RESULT.json ...]

Each ALGO/PROTO/NCHANNELS argument names one harness run (build/test/perf/coll/<coll>_perf
-J RESULT.json) made with NCCL_ALGO=ALGO, NCCL_PROTO=PROTO and, when NCHANNELS > 0,
NCCL_MAX_NCHANNELS set to it (0: NCCL's own channel count). Every JSON row becomes one line
    collective nranks nnodes bytes algo proto nchannels time_us
(the format is documented in plugin/tuner_file.h). The out-of-place time is used; rows
with wrong results are dropped. Each fused=RESULT.json argument is a fused-op run
(build/test/perf/fused/<op>_perf -S COMM_SMS -J RESULT.json); over all of them, the fastest
correct row per op and shape becomes one line
    fused op m n k comm_sms chunk_bytes time_us
which the fused ops read for their defaults. Exits 1 when an argument is malformed or
nothing is left.
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
FUSED_HEADER = "# fused op m n k comm_sms chunk_bytes time_us"
# The harness's op names -> the tuning file's, and the bytes of one chunk (a 128-row block of
# the gathered A, or of the output for the reduce-scatter side).
FUSED_OPS = {"ag_gemm": ("allgather_gemm", lambda m, n, k: 128 * k * 2),
             "gemm_rs": ("gemm_reducescatter", lambda m, n, k: 128 * n * 2),
             "gemm_ar": ("gemm_allreduce", lambda m, n, k: 128 * n * 2)}


def fused_rows(path):
    """The JSON lines of one fused harness run."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fused_records(paths):
    """The fastest correct (comm_sms > 0) row per (op, m, n, k) over every run."""
    best = {}
    for path in paths:
        for row in fused_rows(path):
            op = FUSED_OPS.get(row.get("op"))
            sms, t = int(row.get("comm_sms", 0)), float(row.get("fused_ms", 0)) * 1000.0
            if not op or not row.get("ok") or sms < 1 or not (math.isfinite(t) and t > 0):
                print(f"tune-write: {path}: skipped fused row {row}", file=sys.stderr)
                continue
            key = (op[0], int(row["m"]), int(row["n"]), int(row["k"]))
            if key not in best or t < best[key][1]:
                best[key] = (sms, t, op[1](*key[1:]))
    return [(op, m, n, k, sms, chunk, t) for (op, m, n, k), (sms, t, chunk) in sorted(best.items())]


def format_fused(r):
    op, m, n, k, sms, chunk, t = r
    return f"fused {op} {m} {n} {k} {sms} {chunk} {t:.3f}"


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
    ap.add_argument("runs", nargs="+", metavar="ALGO/PROTO/NCHANNELS=FILE.json | fused=FILE.json")
    args = ap.parse_args(argv)
    if args.nnodes < 1:
        ap.error("--nnodes must be at least 1")
    records, fused = [], []
    try:
        for spec in args.runs:
            if spec.startswith("fused="):
                continue
            records += records_from(spec, args.nnodes)
        fused = fused_records([s[len("fused="):] for s in args.runs if s.startswith("fused=")])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"tune-write: {e}", file=sys.stderr)
        return 1
    if not records and not fused:
        print("tune-write: no usable measurement in the inputs", file=sys.stderr)
        return 1
    lines = [f"# {c}" for c in args.comment] + [HEADER]
    lines += [format_record(r) for r in sorted(records)]
    if fused:
        lines += [FUSED_HEADER] + [format_fused(r) for r in fused]
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(f"tune-write: {len(records)} measured point(s), {len(fused)} fused record(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
