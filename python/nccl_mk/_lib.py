"""Finding and calling libnccl-net-mk.so through ctypes (no torch import here).

Why ctypes and no compiled extension: the library already exports a plain C API
(include/nccl_mk.h), and a compiled extension would have to be rebuilt for every PyTorch
and Python version. Why the same file NCCL loads: one copy of the library per process keeps
one registry of fused-op communicators and one set of parameters.

Where the library is looked for, first match wins:
  1. the path given to nccl_mk.load(path);
  2. NCCL_NET_PLUGIN when it names a file (the copy NCCL itself loads as the net plugin);
  3. build/libnccl-net-mk.so of the repository this package sits in (a source checkout or
     `pip install -e ./python`), then ./build/ under the current directory;
  4. the dynamic linker's search path (LD_LIBRARY_PATH, ldconfig): "libnccl-net-mk.so".
"""

import ctypes
import os
import threading
from typing import List, Optional

LIBRARY_NAME = "libnccl-net-mk.so"
NCCL_BFLOAT16 = 9  # ncclDataType_t ncclBfloat16 (stable since NCCL 2.10)

RESULT_NAMES = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
NCCL_INVALID_USAGE = 5
NCCL_REMOTE_ERROR = 6

# What each code most likely means for a Python caller (include/nccl_mk.h's return codes).
_RESULT_HINTS = {
    1: "a CUDA allocation or launch failed",
    2: "a system call failed (allocation, CUDA IPC)",
    4: "the library rejected an argument (NCCL_DEBUG=WARN prints which)",
    5: "the communicator has no ncclMkCommInit, the GPU is not Hopper (sm_90), or inside "
       "graph capture the shape is larger than the prepared workspace",
    6: "an earlier fused call timed out waiting for a peer: the communicator is broken",
}


class NcclMkConfig(ctypes.Structure):
    """ncclMkConfig of include/nccl_mk.h, field for field (ctypes applies C's padding)."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_uint),
        ("max_m", ctypes.c_size_t),
        ("max_n", ctypes.c_size_t),
        ("max_k", ctypes.c_size_t),
        ("comm_sms", ctypes.c_int),
        ("chunk_bytes", ctypes.c_size_t),
        ("timeout_ms", ctypes.c_int),
        ("reserved", ctypes.c_int * 16),
    ]


class NcclMkError(RuntimeError):
    """A fused-op call returned an ncclResult_t other than ncclSuccess."""

    def __init__(self, op: str, code: int, detail: str = ""):
        name = RESULT_NAMES.get(code, "unknown ncclResult_t")
        text = f"{op} failed: {name} ({code})"
        hint = _RESULT_HINTS.get(code)
        if hint:
            text += f": {hint}"
        if detail:
            text += f"; {detail}"
        super().__init__(text)
        self.op = op
        self.code = code
        self.code_name = name


_VP = ctypes.c_void_p
_SZ = ctypes.c_size_t
_PROTOTYPES = {
    "ncclMkGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "ncclMkConfigDefaults": [ctypes.POINTER(NcclMkConfig)],
    "ncclMkCommInit": [_VP, ctypes.POINTER(NcclMkConfig)],
    "ncclMkCommRelease": [_VP],
    "ncclMkCommGetAsyncError": [_VP, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, _SZ],
    "ncclMkAllGatherGemm": [_VP, _VP, _VP, _VP, _SZ, _SZ, _SZ, ctypes.c_int, _VP, _VP],
    "ncclMkGemmReduceScatter": [_VP, _VP, _VP, _SZ, _SZ, _SZ, ctypes.c_int, _VP, _VP],
    "ncclMkGemmAllReduce": [_VP, _VP, _VP, _SZ, _SZ, _SZ, ctypes.c_int, _VP, _VP],
    # q, k, v, out, lse, batch, s_local, heads, kv_heads, d_head, causal, type, comm, stream
    "ncclMkRingAttention": [_VP, _VP, _VP, _VP, _VP, _SZ, _SZ, _SZ, _SZ, _SZ, ctypes.c_int,
                            ctypes.c_int, _VP, _VP],
    # q, k, v, out, lse, dout, dq, dk, dv, batch, s_local, heads, kv_heads, d_head, causal, type,
    # comm, stream
    "ncclMkRingAttentionBackward": [_VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _SZ, _SZ, _SZ,
                                    _SZ, _SZ, ctypes.c_int, ctypes.c_int, _VP, _VP],
}

_lock = threading.Lock()
_loaded = {"lib": None, "path": None}


def candidate_paths(cwd: Optional[str] = None) -> List[str]:
    """The places searched when nccl_mk.load() was not called, in order (see module doc)."""
    found = []
    plugin = os.environ.get("NCCL_NET_PLUGIN", "")
    if os.sep in plugin and os.path.isfile(plugin):
        found.append(plugin)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for base in (repo, cwd or os.getcwd()):
        path = os.path.join(base, "build", LIBRARY_NAME)
        if os.path.isfile(path) and path not in found:
            found.append(path)
    found.append(LIBRARY_NAME)
    return found


def _open(path: str) -> ctypes.CDLL:
    # RTLD_GLOBAL is not needed: the library finds NCCL itself (dlsym(RTLD_DEFAULT), then
    # dlopen("libnccl.so.2")), and nothing else resolves symbols against it.
    lib = ctypes.CDLL(path)
    for name, argtypes in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise OSError(f"{path} has no {name}: not an nccl-mk library, or too old") from None
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads the library once per process. With a path, that file (an error if a different
    file is already loaded: two copies would keep two registries); without, the first
    candidate that loads. Raises OSError listing every place tried."""
    with _lock:
        if path is not None:
            # A file (even a bare name in the current folder) by its absolute path; a bare
            # name that is no file goes to the dynamic linker's search.
            path = os.path.abspath(path) if os.sep in path or os.path.isfile(path) else path
            if _loaded["lib"] is not None and _loaded["path"] != path:
                raise OSError(f"nccl_mk: {_loaded['path']} is already loaded; cannot switch "
                              f"to {path} in the same process")
        if _loaded["lib"] is not None:
            return _loaded["lib"]
        errors = []
        for candidate in [path] if path is not None else candidate_paths():
            try:
                _loaded["lib"] = _open(candidate)
                _loaded["path"] = candidate
                return _loaded["lib"]
            except OSError as e:
                errors.append(f"  {candidate}: {e}")
        raise OSError("nccl_mk: cannot load " + LIBRARY_NAME + "; tried:\n" + "\n".join(errors)
                      + "\nBuild it (meson setup build && ninja -C build) and call "
                      "nccl_mk.load(path), or put its folder on LD_LIBRARY_PATH")


def loaded_path() -> Optional[str]:
    """The file loaded by load(), or None before the first load."""
    return _loaded["path"]


def version() -> str:
    """The library's version as "major.minor.patch"."""
    v = ctypes.c_int(0)
    check("ncclMkGetVersion", load().ncclMkGetVersion(ctypes.byref(v)))
    return f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}"


def default_config() -> NcclMkConfig:
    """A config filled by ncclMkConfigDefaults (the library's own defaults and size)."""
    cfg = NcclMkConfig()
    check("ncclMkConfigDefaults", load().ncclMkConfigDefaults(ctypes.byref(cfg)))
    if cfg.size != ctypes.sizeof(NcclMkConfig):
        raise OSError(f"nccl_mk: the library's ncclMkConfig has {cfg.size} bytes, this package's "
                      f"{ctypes.sizeof(NcclMkConfig)}: package and library versions differ")
    return cfg


def async_error(comm: int) -> Optional[str]:
    """None while the communicator is healthy (or unknown to the library); otherwise the
    library's one-line account of why it is broken (rank, op, tile, flag, expected, seen)."""
    result = ctypes.c_int(0)
    msg = ctypes.create_string_buffer(512)
    rc = load().ncclMkCommGetAsyncError(_VP(comm), ctypes.byref(result), msg, len(msg))
    if rc != 0 or result.value == 0:
        return None
    text = msg.value.decode(errors="replace")
    return text or RESULT_NAMES.get(result.value, str(result.value))


def check(op: str, rc: int, comm: Optional[int] = None) -> None:
    """Raises NcclMkError for rc != ncclSuccess, with the communicator's async error (from
    ncclMkCommGetAsyncError) when it reports the communicator broken."""
    if rc == 0:
        return
    detail = ""
    if comm:
        broken = async_error(comm)
        if broken:
            detail = f"ncclMkCommGetAsyncError: {broken}"
    raise NcclMkError(op, rc, detail)
