#!/usr/bin/env python3
"""Turns the collectives harness's JSON results into a tuning file (NCCL_MK_TUNER_FILE).

usage: tune-write.py [-o FILE] [--nnodes N] [--comment TEXT] [--margin M]
                     ALGO/PROTO/NCHANNELS=RESULT.json ... [nccl=RESULT.json ...]
                     [fused=RESULT.json ...]
       tune-write.py --candidates FACTOR ALGO/PROTO/NCHANNELS=RESULT.json ...

Each ALGO/PROTO/NCHANNELS argument names one harness run (build/test/perf/coll/<coll>_perf
-J RESULT.json) made with NCCL_ALGO=ALGO, NCCL_PROTO=PROTO and, when NCHANNELS > 0,
NCCL_MAX_NCHANNELS set to it (0: NCCL's own channel count). Every JSON row becomes one line
    collective nranks nnodes bytes algo proto nchannels time_us
(the format is documented in plugin/tuner_file.h). The out-of-place time is used; rows
with wrong results are dropped. A configuration named more than once (tune.sh -R: repeats of
the calibration) gets the median of its repeats per size.

Each nccl=RESULT.json argument is a run of NCCL's own choice (nothing forced,
NCCL_TUNER_PLUGIN=none), repeats allowed. At a size where it was measured, the file keeps
NCCL's choice (a "keep" record) unless the gain there is clear: the fastest configuration's
median beats NCCL's median by more than --margin (default 0.03) AND every repeat of it was
faster than every repeat of NCCL's own (so no repeat contradicts the gain), and, when its
channel count is not 0, the same holds for its algorithm/protocol at NCCL's count, which the
tuner runs where it cannot pass the count (plugin/tuner_channels.h). Why: one calibration run
per configuration differs from the next by 20-35% on the network path (tune-net, 2026-11-30:
ring/simple at 16 MiB read 6348, 7337 and 8597 us at caps 0/4/8 that probably do not bind),
far more than a fixed margin could absorb, and the fastest of 18 such readings is biased low;
the spread over repeats is what measures that noise.

--candidates FACTOR prints, for each ALGO/PROTO/NCHANNELS run, "ALGO/PROTO/NCHANNELS MIN MAX":
the sizes from the first to the last at which it came within FACTOR of the fastest
configuration (tune.sh repeats only those), and writes nothing.

Each fused=RESULT.json argument is a fused-op run
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
KEEP_HEADER = ("# keep (calibration: no configuration clearly beat NCCL's own choice there): "
               "NCCL's own choice stands around the size")
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


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def collect(records):
    """(shape+size, config) -> its repeats' times, from records of every repeat."""
    samples = {}
    for coll, ranks, nnodes, nbytes, algo, proto, nch, t in records:
        samples.setdefault(((coll, ranks, nnodes, nbytes), (algo, proto, nch)), []).append(t)
    return samples


def combine_repeats(samples):
    """One record per configuration and size: the median of its repeats."""
    return [key + cfg + (median(ts),) for (key, cfg), ts in samples.items()]


def clear_gain(ts, nccl, margin):
    """The times ts of a configuration clearly beat NCCL's own times nccl: the medians differ by
    more than the margin, and no repeat of the one was slower than a repeat of the other."""
    return median(ts) * (1.0 + margin) < median(nccl) and max(ts) < min(nccl)


def keep_lines(samples, nccl_samples, margin):
    """Keep records for the sizes NCCL's own choice was measured at and no gain is clear."""
    by_size = {}
    for (key, cfg), ts in samples.items():
        by_size.setdefault(key, {})[cfg] = ts
    lines = []
    for key, nccl in sorted(nccl_samples.items()):
        cfgs = by_size.get(key, {})
        if not cfgs:
            continue
        best = min(cfgs, key=lambda c: median(cfgs[c]))
        algo, proto, nch = best
        runs = [best] + ([(algo, proto, 0)] if nch and (algo, proto, 0) in cfgs else [])
        if all(clear_gain(cfgs[c], nccl, margin) for c in runs):
            continue
        gain = median(nccl) / median(cfgs[best])
        lines.append(f"{key[0]} {key[1]} {key[2]} {key[3]} keep  # calibration: {algo}/{proto}/"
                     f"{nch} {median(cfgs[best]):.3f} us ({len(cfgs[best])}x), NCCL's own "
                     f"{median(nccl):.3f} us ({len(nccl)}x): {gain:.3f}x, not clear")
    return lines


def candidates(specs, factor):
    """Per configuration: the first and last size at which it came within factor of the
    fastest (over the configurations given), or nothing when it never did."""
    per_spec = [(spec.split("=", 1)[0], records_from(spec, 1)) for spec in specs]
    best = {}
    for _, recs in per_spec:
        for r in recs:
            key = r[:4]
            best[key] = min(best.get(key, r[7]), r[7])
    out = []
    for config, recs in per_spec:
        near = [r[3] for r in recs if r[7] <= factor * best[r[:4]]]
        if near:
            out.append(f"{config} {min(near)} {max(near)}")
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="tuning file to write (default: stdout)")
    ap.add_argument("--nnodes", type=int, default=1, help="nodes the runs spanned (default 1)")
    ap.add_argument("--comment", action="append", default=[], help="a '#' line for the header")
    ap.add_argument("--margin", type=float, default=0.03,
                    help="gain over NCCL's own choice that counts as clear (default 0.03)")
    ap.add_argument("--candidates", type=float, metavar="FACTOR",
                    help="print each run's sizes within FACTOR of the fastest; write nothing")
    ap.add_argument("runs", nargs="+",
                    metavar="ALGO/PROTO/NCHANNELS=FILE.json | nccl=FILE.json | fused=FILE.json")
    args = ap.parse_args(argv)
    if args.nnodes < 1:
        ap.error("--nnodes must be at least 1")
    if args.margin < 0:
        ap.error("--margin must be at least 0")
    records, nccl_records, fused = [], [], []
    try:
        if args.candidates is not None:
            print("\n".join(candidates([s for s in args.runs if "/" in s.split("=", 1)[0]],
                                       args.candidates)))
            return 0
        for spec in args.runs:
            if spec.startswith("fused="):
                continue
            if spec.startswith("nccl="):
                nccl_records += records_from("ring/simple/0=" + spec[len("nccl="):], args.nnodes)
                continue
            records += records_from(spec, args.nnodes)
        fused = fused_records([s[len("fused="):] for s in args.runs if s.startswith("fused=")])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"tune-write: {e}", file=sys.stderr)
        return 1
    if not records and not fused:
        print("tune-write: no usable measurement in the inputs", file=sys.stderr)
        return 1
    samples = collect(records)
    nccl = {key: ts for (key, _), ts in collect(nccl_records).items()}
    records = combine_repeats(samples)
    keeps = keep_lines(samples, nccl, args.margin)
    lines = [f"# {c}" for c in args.comment] + [HEADER]
    lines += [format_record(r) for r in sorted(records)]
    if keeps:
        lines += [KEEP_HEADER] + keeps
    if fused:
        lines += [FUSED_HEADER] + [format_fused(r) for r in fused]
    text = "\n".join(lines) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(f"tune-write: {len(records)} measured point(s), {len(keeps)} keep record(s) of "
          f"{len(nccl)} size(s) with NCCL's own choice measured, {len(fused)} fused record(s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
