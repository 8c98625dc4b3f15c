"""The process group's own NCCL communicator, prepared once for the fused ops.

Why the group's own communicator and never one of ours: a second communicator would cost a
second NCCL bootstrap, its own channels and memory, and could deadlock against the group's
collectives. PyTorch (2.8 and later) exposes the raw ncclComm_t as
ProcessGroupNCCL._comm_ptr() (C++ getCommPtr()): the communicator of the *current CUDA
device*, or 0 while none exists. One exists after
init_process_group("nccl", device_id=torch.device("cuda", local_rank)) (eager init) or after
the group's first collective on that device; where there is none yet, init() runs one small
all_reduce on the group to make PyTorch create it.

ncclMkCommInit is collective: every rank of the group must reach the first fused call (or
nccl_mk.init) on a group, in the same order relative to the group's other collectives.
The registry below is the package's only mutable state: one entry per (group, device).
"""

import atexit
import ctypes
import sys
import threading
from typing import Dict, Optional, Set, Tuple

import torch
import torch.distributed as dist

from . import _checks, _lib


class CommState:
    """A communicator prepared by ncclMkCommInit, and the shapes it is known to fit."""

    def __init__(self, group_name: str, device: int, ptr: int, nranks: int,
                 max_m: int, max_n: int, max_k: int):
        self.group_name = group_name
        self.device = device
        self.ptr = ptr
        self.nranks = nranks
        self.max_m, self.max_n, self.max_k = max_m, max_n, max_k
        # Shapes run outside capture: the library grew its workspaces for them, so they
        # also fit inside capture even when above the max_* given at init.
        self.shapes_run: Set[Tuple[str, int, int, int]] = set()


_registry: Dict[Tuple[str, int], CommState] = {}
_lock = threading.RLock()


def resolve_group(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    """The group to use: the one given, else the world group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("nccl_mk: torch.distributed is not initialised: call "
                           "torch.distributed.init_process_group('nccl', device_id=...) first")
    return group if group is not None else dist.group.WORLD


def group_from_name(name: str) -> dist.ProcessGroup:
    """The ProcessGroup for a group name (custom ops carry the name, not the object)."""
    from torch.distributed import distributed_c10d as c10d
    return c10d._resolve_process_group(name)


def _device_index(device) -> int:
    """A CUDA device index from None (the current device), an int, a str or a torch.device."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def comm_pointer(group: dist.ProcessGroup, device: int) -> int:
    """The raw ncclComm_t PyTorch holds for `group` on `device` (0 if not created yet)."""
    try:
        backend = group._get_backend(torch.device("cuda", device))
    except Exception as e:  # no NCCL backend on this group
        raise RuntimeError(f"nccl_mk: process group {group.group_name!r} has no NCCL backend "
                           f"for CUDA ({e}); create it with backend='nccl'") from None
    get_ptr = getattr(backend, "_comm_ptr", None)
    if get_ptr is None:
        raise RuntimeError(f"nccl_mk: {type(backend).__name__} does not expose _comm_ptr(): "
                           f"this PyTorch ({torch.__version__}) cannot hand its NCCL "
                           "communicator to nccl-mk; PyTorch 2.8 or later with the NCCL "
                           "backend is needed")
    with torch.cuda.device(device):
        return int(get_ptr())


def _ensure_comm_pointer(group: dist.ProcessGroup, device: int) -> int:
    ptr = comm_pointer(group, device)
    if ptr:
        return ptr
    # Lazy init: PyTorch makes the communicator at the group's first collective on a device.
    dist.all_reduce(torch.zeros(1, device=torch.device("cuda", device)), group=group)
    ptr = comm_pointer(group, device)
    if not ptr:
        raise RuntimeError(f"nccl_mk: process group {group.group_name!r} has no NCCL "
                           f"communicator on cuda:{device} even after a collective; are the "
                           "tensors on the device this rank's group uses?")
    return ptr


def _refuse_in_capture(what: str) -> None:
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"nccl_mk: {what} cannot run inside CUDA graph capture: call "
                           "nccl_mk.init(group) (or the op once) on every rank before capturing")


def init(group: Optional[dist.ProcessGroup] = None, device=None, max_m: Optional[int] = None,
         max_n: Optional[int] = None, max_k: Optional[int] = None, comm_sms: int = 0,
         timeout_ms: int = 0) -> CommState:
    """Prepares `group`'s communicator on `device` for the fused ops (ncclMkCommInit).

    Collective: every rank of the group calls it (or makes its first fused call) at the
    same point. max_m (total rows of C), max_n and max_k (per rank) size the workspaces;
    None keeps the library's defaults (ncclMkConfigDefaults). A second call on a prepared
    group returns the existing state if it fits the requested limits."""
    group = resolve_group(group)
    dev = _device_index(device)
    key = (group.group_name, dev)
    with _lock:
        state = _registry.get(key)
        if state is not None:
            for asked, have, what in ((max_m, state.max_m, "max_m"), (max_n, state.max_n, "max_n"),
                                      (max_k, state.max_k, "max_k")):
                if asked is not None and asked > have:
                    raise ValueError(f"nccl_mk.init: {what}={asked}, but group "
                                     f"{group.group_name!r} was prepared with {what}={have}; "
                                     "call nccl_mk.release(group) on every rank first")
            return state
        _refuse_in_capture("nccl_mk.init (ncclMkCommInit)")
        ptr = _ensure_comm_pointer(group, dev)
        cfg = _lib.default_config()
        for name, value in (("max_m", max_m), ("max_n", max_n), ("max_k", max_k),
                            ("comm_sms", comm_sms), ("timeout_ms", timeout_ms)):
            if value is not None and (value < 0 or (name.startswith("max") and value < 1)):
                raise ValueError(f"nccl_mk.init: {name}={value} must be positive")
            if value:
                setattr(cfg, name, int(value))
        with torch.cuda.device(dev):
            rc = _lib.load().ncclMkCommInit(ctypes.c_void_p(ptr), ctypes.byref(cfg))
        _lib.check("nccl_mk.init (ncclMkCommInit)", rc, ptr)
        state = CommState(group.group_name, dev, ptr, group.size(), cfg.max_m, cfg.max_n,
                          cfg.max_k)
        _registry[key] = state
        return state


def get(group: dist.ProcessGroup, device: int) -> CommState:
    """The prepared state for a call: made at first use, and checked against the pointer
    PyTorch holds now (a communicator PyTorch aborted and re-created is not ours)."""
    with _lock:
        state = _registry.get((group.group_name, device)) or init(group, device)
    now = comm_pointer(group, device)
    if now != state.ptr:
        raise RuntimeError(f"nccl_mk: process group {group.group_name!r} now holds communicator "
                           f"{now:#x}, not {state.ptr:#x} prepared by nccl_mk.init (was it "
                           "aborted and re-created?); call nccl_mk.release(group) and "
                           "nccl_mk.init(group) on every rank")
    return state


def check_capture_fits(state: CommState, op: str, m: int, n: int, k: int) -> bool:
    """True when capturing. Inside capture, a shape beyond the prepared workspaces fails
    here with the limit named, rather than in the library with ncclInvalidUsage."""
    capturing = torch.cuda.is_current_stream_capturing()
    if capturing and (op, m, n, k) not in state.shapes_run:
        _checks.check_fits(op, m, n, k, state.max_m, state.max_n, state.max_k)
    return capturing


def release(group: Optional[dist.ProcessGroup] = None) -> None:
    """Frees what init made for `group` (every device; None: every group), after the
    device's queued work finishes. Not collective. Call it before
    torch.distributed.destroy_process_group; what is left is released at exit."""
    if group is None:
        _release_where(lambda key: True)
    else:
        _release_where(lambda key: key[0] == group.group_name)


def _release_where(match) -> None:
    with _lock:
        keys = [key for key in _registry if match(key)]
        for key in keys:
            state = _registry.pop(key)
            torch.cuda.synchronize(state.device)  # in-flight kernels still use the workspaces
            rc = _lib.load().ncclMkCommRelease(ctypes.c_void_p(state.ptr))
            _lib.check("nccl_mk.release (ncclMkCommRelease)", rc)


@atexit.register
def _release_all_at_exit() -> None:
    try:
        _release_where(lambda key: True)
    except Exception as e:  # exit must not fail because a GPU is already gone
        print(f"nccl_mk: release at exit failed: {e}", file=sys.stderr)


def is_prepared(ptr: int) -> bool:
    """Whether the library holds fused-op state for this ncclComm_t (tests use it to show
    that the pointer given to ncclMkCommInit is PyTorch's own)."""
    result = ctypes.c_int(0)
    rc = _lib.load().ncclMkCommGetAsyncError(ctypes.c_void_p(ptr), ctypes.byref(result), None, 0)
    return rc == 0


def prepared_pointer(group: Optional[dist.ProcessGroup] = None, device=None) -> Optional[int]:
    """The ncclComm_t given to ncclMkCommInit for (group, device), or None if not prepared."""
    state = _registry.get((resolve_group(group).group_name, _device_index(device)))
    return state.ptr if state else None
