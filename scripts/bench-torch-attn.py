#!/usr/bin/env python3
"""PyTorch's cuDNN attention on one GPU: the external compute ceiling of ring attention
(issues 11 and 12), on the per-GPU work of ring_attn_perf's shapes.

    python3 scripts/bench-torch-attn.py [--iters 20] [--warmup 5] [--json FILE] [--no-bwd]

For each shape, torch.nn.functional.scaled_dot_product_attention with only the cuDNN backend
enabled (SDPBackend.CUDNN_ATTENTION), bf16, [B, H, S, D] inputs, grouped-query heads through
enable_gqa: the forward, then (unless --no-bwd) the backward of the same call (dq, dk, dv from
dout), each the median of --iters after --warmup, timed with CUDA events. The per-GPU work of a
2-rank ring is queries of S_local = S / 2 against all S keys (non-causal) or the zigzag half
of a causal sequence; its FLOP rate is that of the whole-sequence call on one GPU, which is what
is run here (FLOPs = 4 B H S_q S_kv D, halved for causal; backward 2.5x the forward).
A shape whose cuDNN call fails (an old PyTorch, no cuDNN attention) prints the reason and the
run goes on. Run on the H200 machine by `scripts/gpu-check.sh ring` (sessions 19 and 20).

With our attention cores' benchmark library (build/test/perf/attn/libmk_attn_bench.so, found
there, under build-dev/, or given by --ours or MK_ATTN_BENCH_LIB), each shape also runs our
forward and backward core on the same inputs (in our [B, S, H, D] layout), interleaved with
cuDNN's iteration by iteration (the order alternating), and prints our TFLOP/s, the ratio to
cuDNN's of the same iterations, and the largest difference from cuDNN's out (forward) and dq,
dk, dv (backward), relative to the largest magnitude of cuDNN's; above --max-diff the run
exits 1. cuDNN's own rate moves 10-15% between calls of a session: only the interleaved ratio
is a fair comparison. --no-ours skips it.
"""

import argparse
import ctypes
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# (name, B, H, H_kv, D, S_q, S_kv, causal): the shapes of ring_attn_perf, per GPU on 2 ranks
SHAPES = [
    ("S=16384 causal", 1, 64, 8, 128, 16384, 16384, True),
    ("S_local=4096 non-causal", 16, 16, 16, 128, 4096, 8192, False),
    ("S=65536 causal", 1, 64, 8, 128, 65536, 65536, True),
]


def flops(b, h, d, s_q, s_kv, causal, bwd):
    f = 4.0 * b * h * s_q * s_kv * d
    if causal:
        f /= 2
    return 2.5 * f if bwd else f


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def timed_pair(fa, fb, iters, warmup):
    """Medians (ms) of fa and fb, timed in the same iterations, the order alternating."""
    for _ in range(warmup):
        fa()
        fb()
    pairs = []
    for i in range(iters):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        first, second = (fa, fb) if i % 2 == 0 else (fb, fa)
        ev[0].record()
        first()
        ev[1].record()
        second()
        ev[2].record()
        pairs.append((i % 2, ev))
    torch.cuda.synchronize()
    ta, tb = [], []
    for swapped, ev in pairs:
        t1, t2 = ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2])
        ta.append(t2 if swapped else t1)
        tb.append(t1 if swapped else t2)
    return statistics.median(ta), statistics.median(tb)


def find_ours(path):
    """Our benchmark library (ctypes), or None when there is none."""
    here = os.path.dirname(os.path.abspath(__file__))
    cands = [path] if path else [os.environ.get("MK_ATTN_BENCH_LIB", "")] + [
        os.path.join(here, "..", b, "test/perf/attn/libmk_attn_bench.so") for b in ("build", "build-dev")]
    for c in cands:
        if c and os.path.exists(c):
            lib = ctypes.CDLL(c)
            p, i = ctypes.c_void_p, ctypes.c_int
            lib.mk_bench_attn_fwd.argtypes = [p] * 5 + [i] * 7 + [p]
            lib.mk_bench_attn_bwd.argtypes = [p] * 12 + [i] * 7 + [p]
            lib.mk_bench_attn_fwd.restype = lib.mk_bench_attn_bwd.restype = i
            lib.mk_bench_attn_bwd_ws_floats.argtypes = [i] * 7
            lib.mk_bench_attn_bwd_ws_floats.restype = ctypes.c_longlong
            return lib
    if path:
        sys.exit(f"bench-torch-attn: no library at {path}")
    return None


def bhsd(t):
    """Our [B, S, H, D] tensor as torch's [B, H, S, D] view."""
    return t.transpose(1, 2)


def rel_diff(ours, ref):
    return ((ours.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


class Ours:
    """Our cores on copies of one shape's inputs in [B, S, H, D]."""

    def __init__(self, lib, shape, q, k, v):
        _, self.b, self.h, self.h_kv, self.d, self.s_q, self.s_kv, self.causal = shape
        self.lib = lib
        self.q, self.k, self.v = (t.detach().transpose(1, 2).contiguous() for t in (q, k, v))
        self.out = torch.empty_like(self.q)
        self.lse = torch.empty(self.b, self.h, self.s_q, device=q.device, dtype=torch.float32)
        self.dims = (self.b, self.s_q, self.s_kv, self.h, self.h_kv, self.d, int(self.causal))

    def fwd(self):
        rc = self.lib.mk_bench_attn_fwd(self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(),
                                        self.out.data_ptr(), self.lse.data_ptr(), *self.dims,
                                        torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"mk_bench_attn_fwd: {rc}")

    def prepare_bwd(self, dout):
        self.dout = dout.detach().transpose(1, 2).contiguous()
        self.dq, self.dk, self.dv = (torch.empty_like(t) for t in (self.q, self.k, self.v))
        self.delta = torch.empty_like(self.lse)
        self.dq_acc = torch.empty(self.q.shape, device=self.q.device, dtype=torch.float32)
        # grouped-query heads: the workspace that lets the core give each CTA one query head
        n = self.lib.mk_bench_attn_bwd_ws_floats(*self.dims)
        self.dkv_ws = torch.empty(n, device=self.q.device, dtype=torch.float32) if n else None

    def bwd(self):
        ptrs = (self.q, self.k, self.v, self.out, self.lse, self.dout, self.dq, self.dk, self.dv,
                self.delta, self.dq_acc)
        ws = self.dkv_ws.data_ptr() if self.dkv_ws is not None else None
        rc = self.lib.mk_bench_attn_bwd(*(t.data_ptr() for t in ptrs), ws, *self.dims,
                                        torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"mk_bench_attn_bwd: {rc}")


def run_shape(shape, args, lib=None):
    name, b, h, h_kv, d, s_q, s_kv, causal = shape
    dev = torch.device("cuda")
    q = torch.randn(b, h, s_q, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, h_kv, s_kv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, h_kv, s_kv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    row = {"shape": name, "B": b, "H": h, "H_kv": h_kv, "D": d, "S_q": s_q, "S_kv": s_kv,
           "causal": causal}

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h != h_kv)

    ours = Ours(lib, shape, q, k, v) if lib else None
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        if ours:
            ms, ms_ours = timed_pair(lambda: fwd(), ours.fwd, args.iters, args.warmup)
            row["ours_fwd_tflops"] = flops(b, h, d, s_q, s_kv, causal, False) / ms_ours / 1e9
            row["fwd_ratio"] = ms / ms_ours
        else:
            ms = timed(lambda: fwd(), args.iters, args.warmup)
        row["fwd_ms"] = ms
        row["fwd_tflops"] = flops(b, h, d, s_q, s_kv, causal, False) / ms / 1e9
        out = fwd()  # the timed calls' outputs were dropped; ours.out holds our last one
        if ours:
            row["fwd_diff"] = rel_diff(bhsd(ours.out), out)
        if not args.no_bwd:
            dout = torch.randn_like(out)

            def bwd():
                q.grad = k.grad = v.grad = None
                out.backward(dout, retain_graph=True)

            if ours:
                ours.prepare_bwd(dout)
                ms, ms_ours = timed_pair(bwd, ours.bwd, args.iters, args.warmup)
                row["ours_bwd_tflops"] = flops(b, h, d, s_q, s_kv, causal, True) / ms_ours / 1e9
                row["bwd_ratio"] = ms / ms_ours
                row["bwd_diff"] = max(rel_diff(bhsd(ours.dq), q.grad), rel_diff(bhsd(ours.dk), k.grad),
                                      rel_diff(bhsd(ours.dv), v.grad))
            else:
                ms = timed(bwd, args.iters, args.warmup)
            row["bwd_ms"] = ms
            row["bwd_tflops"] = flops(b, h, d, s_q, s_kv, causal, True) / ms / 1e9
    return row


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--no-bwd", action="store_true", help="forward only")
    ap.add_argument("--ours", help="our cores' benchmark library (default: found in the build)")
    ap.add_argument("--no-ours", action="store_true", help="cuDNN alone")
    ap.add_argument("--max-diff", type=float, default=0.05,
                    help="largest relative difference from cuDNN's results accepted (ours)")
    args = ap.parse_args(argv)
    lib = None if args.no_ours else find_ours(args.ours)
    print(f"# cuDNN attention (PyTorch {torch.__version__}) on {torch.cuda.get_device_name()}, "
          f"bf16, medians of {args.iters} (warm-up {args.warmup})"
          + (", ours interleaved (ratio = cuDNN ms / ours ms)" if lib else ""))
    print(f"# {'shape':<26} {'fwd ms':>8} {'fwd TFLOP/s':>12} {'bwd ms':>8} {'bwd TFLOP/s':>12}"
          + (f" {'ours fwd':>9} {'ratio':>6} {'diff':>8} {'ours bwd':>9} {'ratio':>6} {'diff':>8}" if lib else ""))
    rows, bad = [], 0
    for shape in SHAPES:
        try:
            r = run_shape(shape, args, lib)
        except Exception as e:  # no cuDNN attention here: say why, go on
            print(f"  {shape[0]:<26} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        rows.append(r)
        bwd = f"{r['bwd_ms']:8.3f} {r['bwd_tflops']:12.1f}" if "bwd_ms" in r else f"{'-':>8} {'-':>12}"
        mine = ""
        if lib:
            mine = f" {r['ours_fwd_tflops']:9.1f} {r['fwd_ratio']:6.3f} {r['fwd_diff']:8.1e}"
            mine += (f" {r['ours_bwd_tflops']:9.1f} {r['bwd_ratio']:6.3f} {r['bwd_diff']:8.1e}" if "bwd_ratio" in r
                     else f" {'-':>9} {'-':>6} {'-':>8}")
            bad += max(r["fwd_diff"], r.get("bwd_diff", 0.0)) > args.max_diff
        print(f"  {r['shape']:<26} {r['fwd_ms']:8.3f} {r['fwd_tflops']:12.1f} {bwd}{mine}")
        torch.cuda.empty_cache()
    if bad:
        print(f"# {bad} shape(s) differ from cuDNN by more than --max-diff {args.max_diff}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if rows and not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
