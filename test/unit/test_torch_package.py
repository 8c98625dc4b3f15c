#!/usr/bin/env python3
"""CPU tests of the PyTorch package (python/nccl_mk). Usage:

    test_torch_package.py core  LIBRARY.so   # no torch needed: checks, loader, C error path
    test_torch_package.py torch LIBRARY.so   # needs torch (exit 77 without): ops, fake impls

Why two modes: CI has no torch (too big to install there), yet the argument rules and the
ctypes layer must be tested there; the torch glue is tested where torch is present.
"""

import ctypes
import importlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from checks import expect, finish  # test/unit/checks.py, beside this file


def raises_naming(fn, argument, what, exc=None):
    """fn() must raise ArgumentError (or exc) whose message names `argument`."""
    from nccl_mk import ArgumentError
    try:
        fn()
    except (exc or ArgumentError) as e:
        named = (f": {argument}:" in str(e)) if exc is None else (argument in str(e))
        expect(named, f"{what}: raises naming {argument!r} ({e})")
        return
    except Exception as e:  # wrong kind of error
        expect(False, f"{what}: raised {type(e).__name__} {e}, expected a named ArgumentError")
        return
    expect(False, f"{what}: did not raise")


def t(name, shape, dtype="bfloat16", device="cuda:0", contiguous=True, ptr=0x10000):
    from nccl_mk._checks import TensorInfo
    return TensorInfo(name, tuple(shape), dtype, device, contiguous, ptr,
                      4 if dtype == "float32" else 2)


def test_checks():
    from nccl_mk import _checks as c
    ok = c.check_all_gather_gemm(t("a_shard", (64, 256)), t("b", (128, 256), ptr=0x100000),
                                 t("out", (128, 128), ptr=0x200000),
                                 t("gathered", (128, 256), ptr=0x300000), 2)
    expect(ok == (128, 128, 256), f"all_gather_gemm good call gives (M, N, K) {ok}")
    ok = c.check_gemm_reduce_scatter(t("a", (128, 256)), t("b", (64, 256), ptr=0x100000),
                                     t("out", (64, 64), ptr=0x200000), 2)
    expect(ok == (128, 64, 256), f"gemm_reduce_scatter good call gives {ok}")
    ok = c.check_gemm_all_reduce(t("a", (3, 16)), t("b", (8, 16), ptr=0x100000), None)
    expect(ok == (3, 8, 16), f"gemm_all_reduce odd M, no out: {ok}")

    b = t("b", (128, 256), ptr=0x100000)
    ag = c.check_all_gather_gemm
    raises_naming(lambda: ag(t("a_shard", (64, 256), dtype="float32"), b, None, None, 2),
                  "a_shard", "float32 input")
    raises_naming(lambda: ag(t("a_shard", (64, 256), device="cpu"), b, None, None, 2),
                  "a_shard", "CPU input")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), t("b", (128, 256), device="cuda:1"),
                             None, None, 2), "b", "inputs on two GPUs")
    raises_naming(lambda: ag(t("a_shard", (64, 2, 128)), b, None, None, 2), "a_shard", "3-D input")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), t("b", (128, 256), contiguous=False),
                             None, None, 2), "b", "non-contiguous weight")
    raises_naming(lambda: ag(t("a_shard", (64, 256), ptr=0x10002), b, None, None, 2),
                  "a_shard", "misaligned input")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), t("b", (256, 128)), None, None, 2),
                  "b", "transposed weight (K mismatch)")
    raises_naming(lambda: ag(t("a_shard", (64, 250)), t("b", (128, 250)), None, None, 2),
                  "b", "K not a multiple of 8")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), t("b", (12, 256)), None, None, 2),
                  "b", "N not a multiple of 8")
    raises_naming(lambda: ag(t("a_shard", (0, 256)), b, None, None, 2), "a_shard", "M = 0")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), b, t("out", (64, 128), ptr=0x200000),
                             None, 2), "out", "out with the shard's rows, not M")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), b, t("out", (128, 128), dtype="float16",
                                                           ptr=0x200000), None, 2),
                  "out", "fp16 out")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), b, None,
                             t("gathered", (128, 128), ptr=0x300000), 2),
                  "gathered", "gathered of the wrong shape")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), b, t("out", (128, 128), ptr=0x100010),
                             None, 2), "out", "out overlapping b")
    raises_naming(lambda: ag(t("a_shard", (64, 256)), b, t("out", (128, 128), ptr=0x200000),
                             t("gathered", (128, 256), ptr=0x200000 + 128 * 128 * 2 - 16), 2),
                  "gathered", "gathered overlapping out")
    raises_naming(lambda: c.check_gemm_reduce_scatter(t("a", (127, 256)), b, None, 2),
                  "a", "M not a multiple of the ranks")
    raises_naming(lambda: c.check_gemm_reduce_scatter(t("a", (128, 256)), b,
                                                      t("out", (128, 128), ptr=0x200000), 2),
                  "out", "reduce-scatter out with all M rows")
    raises_naming(lambda: c.check_gemm_all_reduce(t("a", (128, 256)), b,
                                                  t("out", (64, 128), ptr=0x200000)),
                  "out", "all-reduce out too small")
    raises_naming(lambda: c.check_gemm_all_reduce(t("a", (2**31, 256)), b, None), "a",
                  "M beyond 2^31")
    raises_naming(lambda: c.check_fits("gemm_all_reduce", 32768, 8192, 8192, 16384, 28672,
                                       28672), "M", "shape beyond max_m inside capture")
    fake = t("a", (128, 256), ptr=None)
    ok = c.check_gemm_all_reduce(fake, t("b", (8, 256), ptr=None), t("out", (128, 8), ptr=None))
    expect(ok == (128, 8, 256), "fake tensors (no data pointer) pass the shape rules")


# Ring attention: q, out [B=2, S_local=128, H=8, D=64]; k, v [2, 128, H_kv=2, 64]; lse
# [2, 8, 128] fp32. Each tensor at its own 1 MiB-spaced address, so none overlap.
RA_Q, RA_KV, RA_LSE = (2, 128, 8, 64), (2, 128, 2, 64), (2, 8, 128)


def ra_args(**change):
    """Good ring-attention arguments (q, k, v, out, lse, causal, nranks), some replaced."""
    args = dict(q=t("q", RA_Q, ptr=0x100000), k=t("k", RA_KV, ptr=0x200000),
                v=t("v", RA_KV, ptr=0x300000), out=t("out", RA_Q, ptr=0x400000),
                lse=t("lse", RA_LSE, dtype="float32", ptr=0x500000), causal=True, nranks=2)
    args.update(change)
    return args


def ring_attention_rejects(argument, what, **change):
    from nccl_mk import _checks as c
    raises_naming(lambda: c.check_ring_attention(**ra_args(**change)), argument,
                  f"ring_attention {what}")


def test_ring_attention_good_calls_give_the_shape():
    from nccl_mk import _checks as c
    ok = c.check_ring_attention(**ra_args())
    expect(ok == (2, 128, 8, 2, 64), f"ring_attention good causal call gives (B, S, H, H_kv, D) "
                                     f"{ok}")
    ok = c.check_ring_attention(**ra_args(out=None, lse=None, causal=False))
    expect(ok == (2, 128, 8, 2, 64), "ring_attention without out and lse passes")
    d128 = (1, 3, 4, 128)
    ok = c.check_ring_attention(**ra_args(q=t("q", d128), k=t("k", d128, ptr=0x200000),
                                          v=t("v", d128, ptr=0x300000), out=None, lse=None,
                                          causal=False, nranks=8))
    expect(ok == (1, 3, 4, 4, 128), "ring_attention D=128, odd S_local non-causal, 8 ranks, "
                                    f"H == H_kv passes: {ok}")
    ok = c.check_ring_attention(**ra_args(q=t("q", RA_Q, ptr=None), k=t("k", RA_KV, ptr=None),
                                          v=t("v", RA_KV, ptr=None), out=t("out", RA_Q, ptr=None),
                                          lse=t("lse", RA_LSE, dtype="float32", ptr=None)))
    expect(ok == (2, 128, 8, 2, 64), "ring_attention fake tensors (no pointer) pass")
    expect(c.ring_attention_lse_shape(RA_Q) == RA_LSE, "ring_attention lse is [B, H, S_local]")
    expect(c.ring_attention_workspace_bytes(2, 128, 2, 64, 4) == 3 * 2 * 2 * 128 * 2 * 64 * 2,
           "ring_attention workspace is (n - 1) x 2 x B x S x H_kv x D x 2 bytes")


def test_ring_attention_rejects_bad_arguments_by_name():
    ring_attention_rejects("q", "fp16 q", q=t("q", RA_Q, dtype="float16", ptr=0x100000))
    ring_attention_rejects("k", "fp32 k", k=t("k", RA_KV, dtype="float32", ptr=0x200000))
    ring_attention_rejects("v", "CPU v", v=t("v", RA_KV, device="cpu", ptr=0x300000))
    ring_attention_rejects("v", "v on another GPU", v=t("v", RA_KV, device="cuda:1",
                                                        ptr=0x300000))
    ring_attention_rejects("out", "out on another GPU", out=t("out", RA_Q, device="cuda:1",
                                                              ptr=0x400000))
    ring_attention_rejects("q", "3-D q (heads not split out)",
                           q=t("q", (2, 128, 512), ptr=0x100000))
    ring_attention_rejects("k", "non-contiguous k", k=t("k", RA_KV, contiguous=False,
                                                        ptr=0x200000))
    ring_attention_rejects("q", "misaligned q", q=t("q", RA_Q, ptr=0x100002))
    ring_attention_rejects("q", "D=96", q=t("q", (2, 128, 8, 96), ptr=0x100000),
                           k=t("k", (2, 128, 2, 96), ptr=0x200000),
                           v=t("v", (2, 128, 2, 96), ptr=0x300000), out=None)
    ring_attention_rejects("k", "H not a multiple of H_kv", k=t("k", (2, 128, 3, 64),
                                                                ptr=0x200000),
                           v=t("v", (2, 128, 3, 64), ptr=0x300000))
    ring_attention_rejects("k", "k with other S_local than q", k=t("k", (2, 64, 2, 64),
                                                                   ptr=0x200000))
    ring_attention_rejects("k", "k with other D than q", k=t("k", (2, 128, 2, 128),
                                                             ptr=0x200000))
    ring_attention_rejects("v", "v shaped unlike k", v=t("v", (2, 128, 1, 64), ptr=0x300000))
    ring_attention_rejects("q", "odd S_local with causal",
                           q=t("q", (2, 127, 8, 64), ptr=0x100000),
                           k=t("k", (2, 127, 2, 64), ptr=0x200000),
                           v=t("v", (2, 127, 2, 64), ptr=0x300000), out=None, lse=None)
    ring_attention_rejects("q", "B = 0", q=t("q", (0, 128, 8, 64), ptr=0x100000),
                           k=t("k", (0, 128, 2, 64), ptr=0x200000),
                           v=t("v", (0, 128, 2, 64), ptr=0x300000), out=None, lse=None)
    ring_attention_rejects("q", "H beyond 65535", q=t("q", (1, 2, 65536, 64), ptr=0x100000),
                           k=t("k", (1, 2, 1, 64), ptr=0x200000),
                           v=t("v", (1, 2, 1, 64), ptr=0x300000), out=None, lse=None)
    ring_attention_rejects("out", "out of k's shape", out=t("out", RA_KV, ptr=0x400000))
    ring_attention_rejects("out", "out overlapping q", out=t("out", RA_Q, ptr=0x100000 + 64))
    ring_attention_rejects("lse", "bf16 lse", lse=t("lse", RA_LSE, ptr=0x500000))
    ring_attention_rejects("lse", "lse as [B, S_local, H]",
                           lse=t("lse", (2, 128, 8), dtype="float32", ptr=0x500000))
    ring_attention_rejects("lse", "lse not 4-byte aligned",
                           lse=t("lse", RA_LSE, dtype="float32", ptr=0x500002))
    ring_attention_rejects("lse", "lse overlapping out",
                           lse=t("lse", RA_LSE, dtype="float32", ptr=0x400000 + 4096))
    ring_attention_rejects("group", "one rank", nranks=1)
    ring_attention_rejects("group", "nine ranks", nranks=9)
    big = dict(q=t("q", (577, 2, 8, 64), ptr=None), k=t("k", (577, 2, 2, 64), ptr=None),
               v=t("v", (577, 2, 2, 64), ptr=None), out=None, lse=None, nranks=8)
    ring_attention_rejects("q", "B past the chunk flags on 8 ranks", **big)


def test_ring_attention_batch_limit_is_the_chunk_flags():
    from nccl_mk import _checks as c
    expect(c.ring_attention_max_batch(8) == 576 and c.ring_attention_max_batch(8, True) == 574 and
           c.ring_attention_max_batch(2) == 4032, "the largest B: 576 / 574 on 8 ranks, 4032 on 2")
    ok = c.check_ring_attention(**ra_args(q=t("q", (576, 2, 8, 64), ptr=None),
                                          k=t("k", (576, 2, 2, 64), ptr=None),
                                          v=t("v", (576, 2, 2, 64), ptr=None), out=None, lse=None,
                                          nranks=8))
    expect(ok[0] == 576, "B = 576 on 8 ranks passes")


def test_ring_attention_lse_only_needs_4_byte_alignment():
    from nccl_mk import _checks as c
    ok = c.check_ring_attention(**ra_args(lse=t("lse", RA_LSE, dtype="float32", ptr=0x500004)))
    expect(ok[0] == 2, "ring_attention lse at a 4-byte (not 16-byte) boundary passes")


def rab_args(**change):
    """Good ring-attention backward arguments: the forward's plus dout, and (dq, dk, dv)."""
    args = dict(q=t("q", RA_Q, ptr=0x100000), k=t("k", RA_KV, ptr=0x200000),
                v=t("v", RA_KV, ptr=0x300000), out=t("out", RA_Q, ptr=0x400000),
                lse=t("lse", RA_LSE, dtype="float32", ptr=0x500000),
                dout=t("dout", RA_Q, ptr=0x600000),
                grads=(t("dq", RA_Q, ptr=0x700000), t("dk", RA_KV, ptr=0x800000),
                       t("dv", RA_KV, ptr=0x900000)), causal=True, nranks=2)
    args.update(change)
    return args


def test_ring_attention_backward_checks_name_the_argument():
    from nccl_mk import _checks as c
    ok = c.check_ring_attention_backward(**rab_args())
    expect(ok == (2, 128, 8, 2, 64), f"ring_attention_backward good call gives the shape, got {ok}")
    ok = c.check_ring_attention_backward(**rab_args(grads=None))
    expect(ok == (2, 128, 8, 2, 64), "ring_attention_backward without outputs (the op) passes")
    dq, dk, dv = rab_args()["grads"]
    for argument, what, change in (
            ("lse", "no lse", dict(lse=None)),
            ("lse", "lse as [B, S_local, H]", dict(lse=t("lse", (2, 128, 8), dtype="float32",
                                                       ptr=0x500000))),
            ("dout", "dout shaped like k", dict(dout=t("dout", RA_KV, ptr=0x600000))),
            ("dout", "fp32 dout", dict(dout=t("dout", RA_Q, dtype="float32", ptr=0x600000))),
            ("out", "out shaped like k", dict(out=t("out", RA_KV, ptr=0x400000))),
            ("k", "H not a multiple of H_kv", dict(k=t("k", (2, 128, 3, 64), ptr=0x200000),
                                                   v=t("v", (2, 128, 3, 64), ptr=0x300000))),
            ("dq", "dq overlapping dout", dict(grads=(t("dq", RA_Q, ptr=0x600000 + 64), dk, dv))),
            ("dk", "dk shaped like q", dict(grads=(dq, t("dk", RA_Q, ptr=0x800000), dv))),
            ("dv", "dv overlapping dk", dict(grads=(dq, dk, t("dv", RA_KV, ptr=0x800000 + 16)))),
            ("group", "one rank", dict(nranks=1))):
        raises_naming(lambda: c.check_ring_attention_backward(**rab_args(**change)), argument,
                      f"ring_attention_backward {what}")
    need = c.ring_attention_backward_workspace_bytes(2, 128, 8, 2, 64, 2)
    kv = 2 * 128 * 2 * 64
    expect(need == kv * 2 * 2 + 2 * 2 * kv * 4 + 2 * 8 * 128 * 4 + 2 * 128 * 8 * 64 * 4,
           f"ring_attention_backward workspace: peers' K/V, fp32 partials, delta, dq ({need})")


def test_zigzag_positions_give_chunks_r_and_2n_minus_1_minus_r():
    from nccl_mk import zigzag_positions
    expect(zigzag_positions(0, 2, 4) == [0, 1, 6, 7], "zigzag rank 0 of 2: chunks 0 and 3")
    expect(zigzag_positions(1, 2, 4) == [2, 3, 4, 5], "zigzag rank 1 of 2: chunks 1 and 2")
    every = sorted(p for r in range(4) for p in zigzag_positions(r, 4, 6))
    expect(every == list(range(24)), "zigzag over 4 ranks covers each position once")
    for bad in ((0, 2, 3), (2, 2, 4)):
        try:
            zigzag_positions(*bad)
            expect(False, f"zigzag_positions{bad} is refused")
        except ValueError:
            expect(True, f"zigzag_positions{bad} is refused with ValueError")


def test_shared_gpu_ranks_need_one_gpu_only_under_mk_share_gpu():
    from nccl_mk import _shared_gpu
    old = os.environ.pop("MK_SHARE_GPU", None)
    try:
        expect(_shared_gpu.gpus_needed(2) == 2, "2 ranks need 2 GPUs without MK_SHARE_GPU")
        os.environ["MK_SHARE_GPU"] = "0"
        expect(not _shared_gpu.gpus_shared(), "MK_SHARE_GPU=0 shares nothing")
        os.environ["MK_SHARE_GPU"] = "1"
        expect(_shared_gpu.gpus_needed(2) == 1, "2 ranks need 1 GPU with MK_SHARE_GPU=1")
    finally:
        os.environ.pop("MK_SHARE_GPU", None)
        if old is not None:
            os.environ["MK_SHARE_GPU"] = old


def test_loader(so):
    import nccl_mk
    from nccl_mk import _lib
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "build"))
        fake = os.path.join(d, "build", _lib.LIBRARY_NAME)
        open(fake, "w").close()
        paths = _lib.candidate_paths(cwd=d)
        expect(fake in paths and paths[-1] == _lib.LIBRARY_NAME,
               f"search order has ./build then the linker path: {paths}")
        os.environ["NCCL_NET_PLUGIN"] = fake
        expect(_lib.candidate_paths(cwd="/")[0] == fake, "NCCL_NET_PLUGIN path comes first")
        del os.environ["NCCL_NET_PLUGIN"]
        try:
            _lib._open(fake)
            expect(False, "an empty file is refused")
        except OSError:
            expect(True, "an empty file is refused with OSError")

    lib = nccl_mk.load(so)
    expect(nccl_mk.loaded_path() == os.path.abspath(so), f"load(path) loads {so}")
    expect(nccl_mk.load() is lib, "a second load() returns the same library")
    try:
        nccl_mk.load("/nonexistent/libnccl-net-mk.so")
        expect(False, "switching libraries is refused")
    except OSError as e:
        expect("already loaded" in str(e), f"switching libraries is refused ({e})")
    expect(nccl_mk.version() == "0.1.0", f"version {nccl_mk.version()}")
    cfg = _lib.default_config()
    expect(cfg.size == ctypes.sizeof(_lib.NcclMkConfig),
           f"ncclMkConfig layout matches the library ({cfg.size} bytes)")
    # Only sanity here: the header documents 16384/28672/28672, the library fills 8192 each
    # (reported upstream); the package never relies on either value.
    expect(all(v >= 8 and v % 8 == 0 for v in (cfg.max_m, cfg.max_n, cfg.max_k)),
           f"config defaults are usable: {cfg.max_m}/{cfg.max_n}/{cfg.max_k}")


def test_c_errors():
    """The C error path without a GPU: a NULL communicator is ncclInvalidArgument."""
    import nccl_mk
    from nccl_mk import _lib
    lib = nccl_mk.load()
    null = ctypes.c_void_p(None)
    rc = lib.ncclMkGemmAllReduce(ctypes.c_void_p(16), ctypes.c_void_p(16), ctypes.c_void_p(16),
                                 8, 8, 8, _lib.NCCL_BFLOAT16, null, null)
    try:
        _lib.check("nccl_mk.gemm_all_reduce (ncclMkGemmAllReduce)", rc)
        expect(False, "a NULL comm raises")
    except nccl_mk.NcclMkError as e:
        expect(e.code == 4 and "gemm_all_reduce" in str(e) and "ncclInvalidArgument (4)" in str(e),
               f"NcclMkError names the op and the code: {e}")
    rc = lib.ncclMkCommInit(null, None)
    expect(rc == 4, f"ncclMkCommInit(NULL) is ncclInvalidArgument ({rc})")
    expect(_lib.async_error(0x1234) is None, "async_error of an unknown comm is None")
    expect(len(lib.ncclMkRingAttention.argtypes) == 14,
           "ncclMkRingAttention is declared with its 14 parameters")
    rc = lib.ncclMkRingAttention(ctypes.c_void_p(16), ctypes.c_void_p(16), ctypes.c_void_p(16),
                                 ctypes.c_void_p(16), None, 1, 128, 8, 2, 64, 1,
                                 _lib.NCCL_BFLOAT16, null, null)
    expect(rc == 4, f"ncclMkRingAttention through ctypes with a NULL comm is "
                    f"ncclInvalidArgument ({rc})")
    text = str(nccl_mk.NcclMkError("nccl_mk.x (ncclMkX)", 6, "ncclMkCommGetAsyncError: rank 1 ..."))
    expect("broken" in text and "ncclMkCommGetAsyncError: rank 1" in text,
           f"remote error carries the async message: {text}")


def test_without_torch():
    import nccl_mk
    if nccl_mk._TORCH_ERROR is None:
        print("skip the no-torch stubs: torch is installed")
        return
    try:
        nccl_mk.gemm_all_reduce(None, None)
        expect(False, "ops without torch raise")
    except ImportError as e:
        expect("torch" in str(e), f"ops without torch raise ImportError: {e}")
    try:
        nccl_mk.ring_attention(None, None, None, causal=True)
        expect(False, "ring_attention without torch raises")
    except ImportError as e:
        expect("torch" in str(e), f"ring_attention without torch raises ImportError: {e}")
    expect("PyTorch is not installed" in nccl_mk.status(), "status() says torch is missing")
    expect(not nccl_mk.available(), "available() is False without torch")


def test_torch_ops():
    import torch
    import torch.distributed as dist
    import nccl_mk
    from torch._subclasses.fake_tensor import FakeTensorMode

    print(nccl_mk.status())
    if not torch.cuda.is_available():
        expect("no CUDA GPU" in nccl_mk.status(), "status() says no GPU is present")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    name = dist.group.WORLD.group_name
    ops = torch.ops.nccl_mk
    with FakeTensorMode():
        a = torch.empty(64, 256, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available()
                        else "meta")
        b = torch.empty(128, 256, dtype=torch.bfloat16, device=a.device)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        a, b = mode.from_tensor(a), mode.from_tensor(b)
        c, g = ops.all_gather_gemm(a, b, name, True)
        expect(tuple(c.shape) == (64, 128) and tuple(g.shape) == (64, 256),
               f"fake all_gather_gemm shapes {tuple(c.shape)} {tuple(g.shape)}")
        c, g = ops.all_gather_gemm(a, b, name, False)
        expect(tuple(g.shape) == (0,), "fake all_gather_gemm without gathered returns empty")
        expect(tuple(ops.gemm_reduce_scatter(a, b, name).shape) == (64, 128),
               "fake gemm_reduce_scatter shape")
        expect(tuple(ops.gemm_all_reduce(a, b, name).shape) == (64, 128), "fake gemm_all_reduce")
        ring_dev = a.device
    with FakeTensorMode():
        q = torch.empty(2, 128, 8, 64, dtype=torch.bfloat16, device=ring_dev)
        kv = torch.empty(2, 128, 2, 64, dtype=torch.bfloat16, device=ring_dev)
    # ring attention needs 2+ ranks: its fake impl is checked by the 2-GPU test
    # (test/gpu/test_torch_ops.py, torch.compile); here only its one-rank refusal.
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        q, kv = mode.from_tensor(q), mode.from_tensor(kv)
        raises_naming(lambda: ops.ring_attention(q, kv, kv, True, name, True), "group",
                      "fake ring_attention on a one-rank group")
    a = torch.randn(64, 256).to(torch.bfloat16)
    b = torch.randn(128, 256).to(torch.bfloat16)
    raises_naming(lambda: nccl_mk.gemm_all_reduce(a, b), "a", "CPU tensors are rejected")
    raises_naming(lambda: nccl_mk.all_gather_gemm(a.float(), b), "a_shard", "fp32 is rejected")
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("core", "torch"):
        sys.exit(__doc__)
    mode, so = sys.argv[1], sys.argv[2]
    if mode == "torch":
        try:
            importlib.import_module("torch")
        except ImportError as e:
            print(f"SKIP: torch is not importable here ({e}); run on a machine with PyTorch")
            sys.exit(77)
        test_torch_ops()
    else:
        test_checks()
        test_ring_attention_good_calls_give_the_shape()
        test_ring_attention_rejects_bad_arguments_by_name()
        test_ring_attention_lse_only_needs_4_byte_alignment()
        test_ring_attention_batch_limit_is_the_chunk_flags()
        test_ring_attention_backward_checks_name_the_argument()
        test_zigzag_positions_give_chunks_r_and_2n_minus_1_minus_r()
        test_shared_gpu_ranks_need_one_gpu_only_under_mk_share_gpu()
        test_loader(so)
        test_c_errors()
        test_without_torch()
    finish()


if __name__ == "__main__":
    main()
