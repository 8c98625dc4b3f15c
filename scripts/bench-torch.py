#!/usr/bin/env python3
"""nccl-mk's fused ops against PyTorch, in one run on the same inputs (DESIGN.md "How to
measure"):

    torchrun --nproc-per-node 2 scripts/bench-torch.py [--ops ag,rs,ar] [--rows 4096,8192]
             [--nk 8192x8192] [--iters 20] [--warmup 5] [--json FILE] [--no-symm]

Variants, interleaved iteration by iteration, timed with CUDA events on the current stream:
  ours      nccl_mk.all_gather_gemm / gemm_reduce_scatter / gemm_all_reduce
  seq       all_gather_into_tensor + matmul, matmul + reduce_scatter_tensor, matmul + all_reduce
  symm      torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter (async TP;
            none for all-reduce); if it fails, the reason is printed and the run goes on.
Times are the median over iterations, the slowest rank's; speedups are seq/ours and
symm/ours (> 1: ours is faster). Our output is checked against seq (relative error < 1e-2;
NaN fails). Shapes are per rank: AG+GEMM M x (N, K) with M the gathered rows, RS/AR M x
(N, K) with K this rank's slice. About 2-4 minutes for every shape on 2 x H200.
"""

import argparse
import datetime
import json
import os
import statistics
import sys

# This machine keeps NVLink multicast off (DESIGN.md); symm_mem must not try it either.
for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    if os.environ.get(_var, _value) != _value:
        print(f"bench-torch: overriding {_var}={os.environ[_var]} with {_value}", file=sys.stderr)
    os.environ[_var] = _value

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import nccl_mk  # noqa: E402
from nccl_mk._shared_gpu import claim_rank_device  # noqa: E402

AG_NK = "8192x8192,14336x8192,28672x8192"
RS_NK = "8192x8192,8192x14336,8192x28672"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="ag,rs,ar", help="subset of ag,rs,ar")
    p.add_argument("--rows", default="2048,4096,8192,16384",
                   help="M values (total rows of C); not --m, which torchrun would take as its own")
    p.add_argument("--nk", default=None,
                   help=f"NxK pairs (default: AG {AG_NK}; RS/AR {RS_NK})")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", default=None, help="write the rows as JSON to this file")
    p.add_argument("--no-symm", action="store_true", help="skip PyTorch's symm_mem ops")
    return p.parse_args()


def pairs(text):
    return [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item]


def rand(shape, dev):
    return torch.randn(*shape, device=dev, dtype=torch.float32).div_(8).to(torch.bfloat16)


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


class Variant:
    """One way to compute an op: a callable over one of two input sets (rotated)."""

    def __init__(self, name, fn):
        self.name, self.fn, self.times, self.error = name, fn, [], None


def make_variants(op, m, n, k, dev, world, group_name, use_symm):
    sets = []
    for _ in range(2):  # two input sets, alternated, with fresh random values
        if op == "ag":
            sets.append((rand((m // world, k), dev), rand((n, k), dev)))
        else:
            sets.append((rand((m, k), dev), rand((n, k), dev)))
    if op == "ag":
        gathered = torch.empty(m, k, device=dev, dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)

        def seq(a, b):
            dist.all_gather_into_tensor(gathered, a)
            return gathered @ b.t()

        def symm(a, b):
            return torch.ops.symm_mem.fused_all_gather_matmul(a, [b.t()], 0, group_name)[1][0]
        ours = [Variant("ours", lambda a, b: nccl_mk.all_gather_gemm(a, b, out=out)),
                Variant("seq", seq)]
        if use_symm:
            ours.append(Variant("symm", symm))
    elif op == "rs":
        out = torch.full((m // world, n), float("nan"), device=dev, dtype=torch.bfloat16)
        rs_out = torch.empty(m // world, n, device=dev, dtype=torch.bfloat16)

        def seq(a, b):
            dist.reduce_scatter_tensor(rs_out, a @ b.t())
            return rs_out

        def symm(a, b):
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b.t(), "sum", 0, group_name)
        ours = [Variant("ours", lambda a, b: nccl_mk.gemm_reduce_scatter(a, b, out=out)),
                Variant("seq", seq)]
        if use_symm:
            ours.append(Variant("symm", symm))
    else:
        out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)

        def seq(a, b):
            c = a @ b.t()
            dist.all_reduce(c)
            return c
        ours = [Variant("ours", lambda a, b: nccl_mk.gemm_all_reduce(a, b, out=out)),
                Variant("seq", seq)]
    return ours, sets


def run_shape(op, m, n, k, args, dev, world, group_name, use_symm):
    variants, sets = make_variants(op, m, n, k, dev, world, group_name, use_symm)
    ours, seq = variants[0], variants[1]
    a, b = sets[0]
    err = rel_err(ours.fn(a, b).clone(), seq.fn(a, b))  # ours first: its output was poisoned
    for v in variants[2:]:
        try:
            v.fn(a, b)
            torch.cuda.synchronize()
        except Exception as e:  # PyTorch's async TP is optional here
            v.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    live = [v for v in variants if v.error is None]
    for i in range(args.warmup + args.iters):
        a, b = sets[i % 2]
        for v in live:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            v.fn(a, b)
            end.record()
            if i >= args.warmup:
                v.times.append((start, end))
    torch.cuda.synchronize()
    medians = {}
    for v in variants:
        ms = statistics.median(s.elapsed_time(e) for s, e in v.times) if v.times else -1.0
        t = torch.tensor([ms], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank defines the time
        medians[v.name] = t.item()
    bad = torch.tensor([0 if err < 1e-2 else 1], device=dev)
    dist.all_reduce(bad)
    flops = 2.0 * m * n * k
    row = {"op": op, "m": m, "n": n, "k": k, "ranks": world,
           "ours_ms": medians["ours"], "seq_ms": medians["seq"],
           "symm_ms": medians.get("symm", -1.0) if use_symm and op != "ar" else None,
           "rel_err": err, "wrong_ranks": int(bad.item()),
           "ours_tflops": flops / medians["ours"] / 1e9 if medians["ours"] > 0 else 0.0,
           "symm_error": next((v.error for v in variants if v.error), None)}
    row["speedup_vs_seq"] = row["seq_ms"] / row["ours_ms"] if row["ours_ms"] > 0 else 0.0
    if row["symm_ms"] and row["symm_ms"] > 0 and row["ours_ms"] > 0:
        row["speedup_vs_symm"] = row["symm_ms"] / row["ours_ms"]
    return row


def print_row(row):
    symm = f"{row['symm_ms']:9.3f}" if row.get("symm_ms") and row["symm_ms"] > 0 else "        -"
    vs_symm = f"{row['speedup_vs_symm']:7.3f}x" if "speedup_vs_symm" in row else "        -"
    print(f"{row['op']:>3} {row['m']:6d} {row['n']:6d} {row['k']:6d} {row['ours_ms']:9.3f} "
          f"{row['seq_ms']:9.3f} {symm} {row['speedup_vs_seq']:7.3f}x {vs_symm} "
          f"{row['ours_tflops']:8.1f} {row['rel_err']:9.2e} {row['wrong_ranks']:5d}", flush=True)
    if row.get("symm_error"):
        print(f"    symm_mem failed: {row['symm_error']}", flush=True)


def main():
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = claim_rank_device(local_rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=300))
    world, rank = dist.get_world_size(), dist.get_rank()
    group_name = dist.group.WORLD.group_name
    torch.manual_seed(4321 + rank)
    use_symm = not args.no_symm
    if use_symm:
        try:
            from torch.distributed._symmetric_memory import enable_symm_mem_for_group
            enable_symm_mem_for_group(group_name)
        except Exception as e:
            use_symm = False
            if rank == 0:
                print(f"symm_mem unavailable, skipped: {type(e).__name__}: {e}", flush=True)
    ms = [int(v) for v in args.rows.split(",")]
    ops = [o for o in args.ops.split(",") if o]
    if any(m % world for m in ms):
        sys.exit(f"bench-torch: every M must be a multiple of the {world} ranks")
    shapes = [(op, m, n, k) for op in ops
              for n, k in pairs(args.nk or (AG_NK if op == "ag" else RS_NK)) for m in ms]
    # Workspaces sized once for the largest shape (collective, before any timing).
    nccl_mk.init(max_m=max(ms), max_n=max(s[2] for s in shapes), max_k=max(s[3] for s in shapes))
    if rank == 0:
        print(nccl_mk.status())
        print(f"# {world} ranks, median of {args.iters} after {args.warmup} warm-up, times in ms "
              "(slowest rank); speedup = other / ours")
        print(" op      M      N      K      ours       seq      symm  vs seq  vs symm "
              "ours_TF/s   rel_err #wrong")
    rows = []
    for op, m, n, k in shapes:
        row = run_shape(op, m, n, k, args, dev, world, group_name, use_symm and op != "ar")
        rows.append(row)
        if rank == 0:
            print_row(row)
        torch.cuda.empty_cache()
    wrong = sum(r["wrong_ranks"] > 0 for r in rows)
    if rank == 0:
        print(f"# {len(rows)} shapes, {wrong} with wrong output")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": world, "iters": args.iters, "torch": torch.__version__,
                           "library": nccl_mk.loaded_path(), "rows": rows}, f, indent=1)
    nccl_mk.release()
    dist.destroy_process_group()
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
