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
"""

import argparse
import json
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


def run_shape(shape, args):
    name, b, h, h_kv, d, s_q, s_kv, causal = shape
    dev = torch.device("cuda")
    q = torch.randn(b, h, s_q, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, h_kv, s_kv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, h_kv, s_kv, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    row = {"shape": name, "B": b, "H": h, "H_kv": h_kv, "D": d, "S_q": s_q, "S_kv": s_kv,
           "causal": causal}

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h != h_kv)

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ms = timed(lambda: fwd(), args.iters, args.warmup)
        row["fwd_ms"] = ms
        row["fwd_tflops"] = flops(b, h, d, s_q, s_kv, causal, False) / ms / 1e9
        if not args.no_bwd:
            out = fwd()
            dout = torch.randn_like(out)

            def bwd():
                q.grad = k.grad = v.grad = None
                out.backward(dout, retain_graph=True)

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
    args = ap.parse_args(argv)
    print(f"# cuDNN attention (PyTorch {torch.__version__}) on {torch.cuda.get_device_name()}, "
          f"bf16, medians of {args.iters} (warm-up {args.warmup})")
    print(f"# {'shape':<26} {'fwd ms':>8} {'fwd TFLOP/s':>12} {'bwd ms':>8} {'bwd TFLOP/s':>12}")
    rows = []
    for shape in SHAPES:
        try:
            r = run_shape(shape, args)
        except Exception as e:  # no cuDNN attention here: say why, go on
            print(f"  {shape[0]:<26} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        rows.append(r)
        bwd = f"{r['bwd_ms']:8.3f} {r['bwd_tflops']:12.1f}" if "bwd_ms" in r else f"{'-':>8} {'-':>12}"
        print(f"  {r['shape']:<26} {r['fwd_ms']:8.3f} {r['fwd_tflops']:12.1f} {bwd}")
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
