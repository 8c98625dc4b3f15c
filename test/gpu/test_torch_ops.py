#!/usr/bin/env python3
"""GPU tests of the PyTorch package (python/nccl_mk) on 2 GPUs, one process per GPU.

    python3 test/gpu/test_torch_ops.py [TEST ...]       # relaunches itself under torchrun
    torchrun --nproc-per-node 2 test/gpu/test_torch_ops.py [TEST ...]

Exit 0: every test passed on every rank; 1: a failure (each printed with its rank);
77: skipped (no torch, or fewer than 2 GPUs), with the reason. Needs the library built in
build/ (meson setup build && ninja -C build) or nccl_mk.load()-able. Tests, in order:
comm_is_the_groups_own, ops_match_sequential, bad_inputs_named_and_untouched,
graph_capture_replay, torch_compile, ring_attention_matches_sdpa,
ring_attention_backward_matches_sdpa. About 1-2 minutes (torch.compile dominates).
"""

import datetime
import os
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
for var, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ[var] = value  # this machine keeps NVLink multicast off (DESIGN.md)


def launch_or_skip():
    try:
        import torch
    except ImportError as e:
        print(f"SKIP: torch is not importable ({e})")
        sys.exit(77)
    from nccl_mk._shared_gpu import gpus_needed
    if torch.cuda.device_count() < gpus_needed(2):
        print(f"SKIP: {torch.cuda.device_count()} GPU(s) visible; these tests need 2 "
              "(MK_SHARE_GPU=1 under scripts/mps.sh shares one)")
        sys.exit(77)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           os.path.abspath(__file__)] + sys.argv[1:]
    print("running:", " ".join(cmd), flush=True)
    sys.exit(subprocess.call(cmd))


if "LOCAL_RANK" not in os.environ:
    launch_or_skip()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import nccl_mk  # noqa: E402
from nccl_mk import _comm  # noqa: E402
from nccl_mk._shared_gpu import claim_rank_device  # noqa: E402

LOCAL_RANK = int(os.environ["LOCAL_RANK"])
DEV = claim_rank_device(LOCAL_RANK)
BF16 = torch.bfloat16


def rand(*shape):
    return torch.randn(*shape, device=DEV, dtype=torch.float32).div_(8).to(BF16)


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def close(x, ref, what):
    err = rel_err(x, ref)
    assert err < 1e-2, f"{what}: relative error {err:.3g} >= 1e-2"


def ref_all_gather_gemm(a_shard, b):
    gathered = torch.empty(a_shard.shape[0] * WORLD, a_shard.shape[1], device=DEV, dtype=BF16)
    dist.all_gather_into_tensor(gathered, a_shard)
    return gathered.float() @ b.float().t(), gathered


def ref_gemm_reduce_scatter(a, b):
    full = a.float() @ b.float().t()
    out = torch.empty(a.shape[0] // WORLD, b.shape[0], device=DEV)
    dist.reduce_scatter_tensor(out, full)
    return out


def ref_gemm_all_reduce(a, b):
    full = a.float() @ b.float().t()
    dist.all_reduce(full)
    return full


def gather_sequence(x_local, positions):
    """The whole sequence [B, S, heads, D] from every rank's rows; positions[r]: the
    sequence positions of rank r's rows."""
    parts = torch.empty((WORLD,) + tuple(x_local.shape), device=DEV, dtype=x_local.dtype)
    dist.all_gather_into_tensor(parts, x_local.contiguous())
    full = torch.empty((x_local.shape[0], x_local.shape[1] * WORLD) + tuple(x_local.shape[2:]),
                       device=DEV, dtype=x_local.dtype)
    for r in range(WORLD):
        full[:, positions[r]] = parts[r]
    return full


def rank_positions(s_local, causal):
    """The sequence positions of each rank's S_local rows: the zigzag split when causal,
    contiguous blocks otherwise."""
    if causal:
        return [torch.tensor(nccl_mk.zigzag_positions(r, WORLD, s_local), device=DEV)
                for r in range(WORLD)]
    return [torch.arange(r * s_local, (r + 1) * s_local, device=DEV) for r in range(WORLD)]


def ref_ring_attention(q, k, v, causal):
    """(out [B, S_local, H, D], lse [B, H, S_local]) of this rank's rows, from
    scaled_dot_product_attention (float32) on the gathered whole sequence."""
    positions = rank_positions(q.shape[1], causal)
    q_all, k_all, v_all = (gather_sequence(x, positions).float().transpose(1, 2)
                           for x in (q, k, v))  # [B, heads, S, D]
    group = q.shape[2] // k.shape[2]  # head h reads kv head h // group
    k_all = k_all.repeat_interleave(group, dim=1)
    v_all = v_all.repeat_interleave(group, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q_all, k_all, v_all,
                                                           is_causal=causal)
    scores = (q_all @ k_all.transpose(-1, -2)) / q.shape[3] ** 0.5
    if causal:
        s = scores.shape[-1]
        scores.masked_fill_(torch.ones(s, s, device=DEV, dtype=torch.bool).triu(1),
                            float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, S]
    mine = positions[dist.get_rank()]
    return out[:, :, mine].transpose(1, 2), lse[:, :, mine]


# ---- tests --------------------------------------------------------------------------------

def test_comm_is_the_groups_own():
    backend = dist.group.WORLD._get_backend(DEV)
    before = backend._comm_ptr()
    assert before, "PyTorch reports no communicator despite device_id in init_process_group"
    nccl_mk.init(max_m=8192, max_n=8192, max_k=8192)
    assert nccl_mk.communicator() == before, \
        f"ncclMkCommInit got {nccl_mk.communicator():#x}, PyTorch holds {before:#x}"
    assert _comm.is_prepared(before), "the library holds no state for PyTorch's communicator"
    assert backend._comm_ptr() == before, "PyTorch's communicator changed during init"
    nccl_mk.init()  # a second init is a no-op, not a second ncclMkCommInit
    assert nccl_mk.communicator() == before


def test_ops_match_sequential():
    for rows, n, k in ((136, 264, 392), (2048, 4096, 4096)):
        m = rows * WORLD
        a_shard, b = rand(rows, k), rand(n, k)
        ref, gathered_ref = ref_all_gather_gemm(a_shard, b)
        c, g = nccl_mk.all_gather_gemm(a_shard, b, return_gathered=True)
        close(c, ref, f"all_gather_gemm {m}x{n}x{k}")
        assert torch.equal(g, gathered_ref), "all_gather_gemm: gathered A differs"
        out = torch.full((m, n), float("nan"), device=DEV, dtype=BF16)
        assert nccl_mk.all_gather_gemm(a_shard, b, out=out) is out
        close(out, ref, f"all_gather_gemm out= {m}x{n}x{k} (poisoned with NaN first)")

        a = rand(m, k)
        close(nccl_mk.gemm_reduce_scatter(a, b), ref_gemm_reduce_scatter(a, b),
              f"gemm_reduce_scatter {m}x{n}x{k}")
        out = torch.full((rows, n), float("nan"), device=DEV, dtype=BF16)
        nccl_mk.gemm_reduce_scatter(a, b, out=out)
        close(out, ref_gemm_reduce_scatter(a, b), "gemm_reduce_scatter out=")

        a = rand(m + 1, k)  # any M for all-reduce
        close(nccl_mk.gemm_all_reduce(a, b), ref_gemm_all_reduce(a, b),
              f"gemm_all_reduce {m + 1}x{n}x{k}")
    torch.cuda.synchronize()


def test_bad_inputs_named_and_untouched():
    rows, n, k = 64, 128, 256
    a_shard, a, b = rand(rows, k), rand(rows * WORLD, k), rand(n, k)
    # another GPU of this process, where there is one (ranks sharing one GPU have none)
    other = torch.device("cuda", 1 - DEV.index) if torch.cuda.device_count() > 1 else None
    misaligned = torch.empty(rows * k + 1, device=DEV, dtype=BF16)[1:].view(rows, k)
    cases = [
        ("a_shard", lambda out: nccl_mk.all_gather_gemm(a_shard.float(), b, out=out)),
        ("a_shard", lambda out: nccl_mk.all_gather_gemm(a_shard.cpu(), b, out=out)),
        ("a_shard", lambda out: nccl_mk.all_gather_gemm(misaligned, b, out=out)),
        ("b", lambda out: nccl_mk.all_gather_gemm(a_shard, b.t().contiguous().t(), out=out)),
        ("b", lambda out: nccl_mk.all_gather_gemm(a_shard, b.to(other or "cpu"), out=out)),
        ("b", lambda out: nccl_mk.all_gather_gemm(a_shard, rand(n, k + 8), out=out)),
        ("out", lambda out: nccl_mk.all_gather_gemm(a_shard, b, out=out[:rows])),
        ("a", lambda out: nccl_mk.gemm_reduce_scatter(rand(rows * WORLD + 1, k), b)),
        ("out", lambda out: nccl_mk.gemm_reduce_scatter(a, b, out=out)),
        ("out", lambda out: nccl_mk.gemm_all_reduce(a, b, out=out.float())),
    ]
    for argument, call in cases:
        out = torch.full((rows * WORLD, n), 7.0, device=DEV, dtype=BF16)
        try:
            call(out)
        except nccl_mk.ArgumentError as e:
            assert e.argument == argument, f"expected {argument!r} named, got: {e}"
        else:
            raise AssertionError(f"a bad {argument!r} was accepted")
        assert bool((out == 7.0).all()), f"bad {argument!r}: the output was written"


def test_graph_capture_replay():
    rows, n, k = 256, 512, 1024
    a_shard, a, b = rand(rows, k), rand(rows * WORLD, k), rand(n, k)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, as torch.cuda.graph advises
        for _ in range(2):
            nccl_mk.all_gather_gemm(a_shard, b)
            nccl_mk.gemm_reduce_scatter(a, b)
            nccl_mk.gemm_all_reduce(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c_ag = nccl_mk.all_gather_gemm(a_shard, b)
        c_rs = nccl_mk.gemm_reduce_scatter(a, b)
        c_ar = nccl_mk.gemm_all_reduce(a, b)
    for replay in range(3):
        a_shard.copy_(rand(rows, k))
        a.copy_(rand(rows * WORLD, k))
        b.copy_(rand(n, k))
        graph.replay()
        close(c_ag, ref_all_gather_gemm(a_shard, b)[0], f"graph replay {replay}: all_gather_gemm")
        close(c_rs, ref_gemm_reduce_scatter(a, b), f"graph replay {replay}: gemm_reduce_scatter")
        close(c_ar, ref_gemm_all_reduce(a, b), f"graph replay {replay}: gemm_all_reduce")
    torch.cuda.synchronize()


class TensorParallelMLP(torch.nn.Module):
    """Sequence-parallel in, column-parallel up, row-parallel down: the ops' use case."""

    def __init__(self, hidden, ffn_per_rank):
        super().__init__()
        self.up = torch.nn.Parameter(rand(ffn_per_rank, hidden), requires_grad=False)
        self.down = torch.nn.Parameter(rand(hidden, ffn_per_rank), requires_grad=False)

    def forward(self, x_shard):
        h = torch.relu(nccl_mk.all_gather_gemm(x_shard, self.up))
        return nccl_mk.gemm_reduce_scatter(h, self.down), nccl_mk.gemm_all_reduce(h, self.down)


def test_torch_compile():
    torch._dynamo.reset()
    model = TensorParallelMLP(hidden=512, ffn_per_rank=1024)
    x_shard = rand(256, 512)
    with torch.no_grad():
        eager_rs, eager_ar = model(x_shard)
        h = torch.relu(ref_all_gather_gemm(x_shard, model.up)[0]).to(BF16)
        close(eager_rs, ref_gemm_reduce_scatter(h, model.down), "eager model, reduce-scatter")
        close(eager_ar, ref_gemm_all_reduce(h, model.down), "eager model, all-reduce")

        name = dist.group.WORLD.group_name  # a str constant for the traced function
        direct = torch.compile(lambda x, w: torch.ops.nccl_mk.gemm_all_reduce(x, w, name),
                               fullgraph=True)
        close(direct(h, model.down), eager_ar, "compiled torch.ops.nccl_mk.gemm_all_reduce")

        compiled = torch.compile(model, fullgraph=True)
        for _ in range(2):
            got_rs, got_ar = compiled(x_shard)
            close(got_rs, eager_rs, "compiled model, reduce-scatter")
            close(got_ar, eager_ar, "compiled model, all-reduce")
    torch.cuda.synchronize()


def test_ring_attention_matches_sdpa():
    # (B, S_local, H, H_kv, D): GQA at D = 128, plain multi-head at D = 64, an odd S_local
    # (non-causal only)
    for b, s_local, h, h_kv, d in ((2, 256, 8, 2, 128), (1, 384, 4, 4, 64), (1, 130, 2, 1, 64)):
        for causal in (False, True):
            q, k, v = rand(b, s_local, h, d), rand(b, s_local, h_kv, d), rand(b, s_local, h_kv, d)
            ref_out, ref_lse = ref_ring_attention(q, k, v, causal)
            what = f"ring_attention B={b} S_local={s_local} H={h} H_kv={h_kv} D={d} causal={causal}"
            out, lse = nccl_mk.ring_attention(q, k, v, causal=causal, return_lse=True)
            close(out, ref_out, what)
            assert (lse - ref_lse).abs().max().item() < 1e-2, f"{what}: lse differs"
            poisoned = torch.full_like(q, float("nan"))
            assert nccl_mk.ring_attention(q, k, v, causal=causal, out=poisoned) is poisoned
            close(poisoned, ref_out, f"{what}, out= (poisoned with NaN first)")
    # under CUDA graph capture, on the current stream, with fresh inputs at each replay
    q, k, v = rand(2, 256, 8, 128), rand(2, 256, 2, 128), rand(2, 256, 2, 128)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        nccl_mk.ring_attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = nccl_mk.ring_attention(q, k, v, causal=True)
    for replay in range(2):
        for x in (q, k, v):
            x.copy_(rand(*x.shape))
        graph.replay()
        close(out, ref_ring_attention(q, k, v, True)[0], f"ring_attention graph replay {replay}")
    # a bad argument is named before anything runs
    for argument, call in (("q", lambda: nccl_mk.ring_attention(q.float(), k, v)),
                           ("k", lambda: nccl_mk.ring_attention(q, rand(2, 256, 3, 128),
                                                                rand(2, 256, 3, 128))),
                           ("q", lambda: nccl_mk.ring_attention(q[:, :255].contiguous(),
                                                                k[:, :255].contiguous(),
                                                                v[:, :255].contiguous(),
                                                                causal=True))):
        try:
            call()
        except nccl_mk.ArgumentError as e:
            assert e.argument == argument, f"ring_attention: expected {argument!r} named: {e}"
        else:
            raise AssertionError(f"ring_attention: a bad {argument!r} was accepted")
    torch.cuda.synchronize()


def ref_ring_attention_grads(q, k, v, dout, causal):
    """(dq, dk, dv) of this rank's rows: float32 autograd through scaled_dot_product_attention
    on the gathered whole sequence, for the loss sum over every rank of out . dout."""
    positions = rank_positions(q.shape[1], causal)
    q_all, k_all, v_all = (gather_sequence(x.detach(), positions).float().requires_grad_()
                           for x in (q, k, v))  # [B, S, heads, D]
    dout_all = gather_sequence(dout, positions).float()
    group = q.shape[2] // k.shape[2]
    out = torch.nn.functional.scaled_dot_product_attention(
        q_all.transpose(1, 2), k_all.transpose(1, 2).repeat_interleave(group, dim=1),
        v_all.transpose(1, 2).repeat_interleave(group, dim=1), is_causal=causal)
    (out.transpose(1, 2) * dout_all).sum().backward()
    mine = positions[dist.get_rank()]
    return q_all.grad[:, mine], k_all.grad[:, mine], v_all.grad[:, mine]


def test_ring_attention_backward_matches_sdpa():
    # autograd through nccl_mk.ring_attention (ncclMkRingAttentionBackward) against float32
    # autograd of SDPA on the whole sequence: GQA at D = 128 and plain multi-head at D = 64
    for b, s_local, h, h_kv, d in ((2, 256, 8, 2, 128), (1, 384, 4, 4, 64)):
        for causal in (False, True):
            q, k, v = (rand(b, s_local, n, d).requires_grad_() for n in (h, h_kv, h_kv))
            dout = rand(b, s_local, h, d)
            out = nccl_mk.ring_attention(q, k, v, causal=causal)
            (out.float() * dout.float()).sum().backward()
            ref = ref_ring_attention_grads(q, k, v, dout, causal)
            what = f"ring_attention backward B={b} S_local={s_local} H={h} H_kv={h_kv} D={d} causal={causal}"
            for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref):
                close(got, want, f"{what} {name}")
    # a gradient through lse is refused by name, not silently wrong
    q, k, v = (rand(1, 128, n, 64).requires_grad_() for n in (2, 2, 2))
    out, lse = nccl_mk.ring_attention(q, k, v, return_lse=True)
    try:
        (out.float().sum() + lse.sum()).backward()
    except NotImplementedError as e:
        assert "lse" in str(e), f"the refusal must name lse: {e}"
    else:
        raise AssertionError("a gradient through lse was accepted")
    torch.cuda.synchronize()


TESTS = [test_comm_is_the_groups_own, test_ops_match_sequential,
         test_bad_inputs_named_and_untouched, test_graph_capture_replay, test_torch_compile,
         test_ring_attention_matches_sdpa, test_ring_attention_backward_matches_sdpa]


def main():
    global WORLD
    torch.cuda.set_device(DEV)
    dist.init_process_group("nccl", device_id=DEV, timeout=datetime.timedelta(seconds=180))
    WORLD = dist.get_world_size()
    rank = dist.get_rank()
    if rank == 0:
        print(nccl_mk.status(), flush=True)
    torch.manual_seed(1234 + rank)
    wanted = set(sys.argv[1:])
    failed = 0
    for test in TESTS:
        name = test.__name__[len("test_"):]
        if wanted and name not in wanted:
            continue
        try:
            test()
            status = "pass"
        except Exception as e:
            status = "FAIL"
            print(f"rank {rank}: {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        flag = torch.tensor([status != "pass"], device=DEV, dtype=torch.int32)
        dist.all_reduce(flag)  # a test fails if it failed on any rank
        failed += int(flag.item() > 0)
        if rank == 0:
            print(f"{'pass' if flag.item() == 0 else 'FAIL'} {name}", flush=True)
    nccl_mk.release()
    dist.destroy_process_group()
    if rank == 0:
        print(f"{failed} failed")
    sys.exit(1 if failed else 0)


WORLD = 0
if __name__ == "__main__":
    main()
