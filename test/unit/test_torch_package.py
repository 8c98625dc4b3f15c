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

FAILED = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILED.append(what)


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
    return TensorInfo(name, tuple(shape), dtype, device, contiguous, ptr, 2)


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
        test_loader(so)
        test_c_errors()
        test_without_torch()
    print(f"{len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
