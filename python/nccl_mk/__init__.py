"""nccl-mk's fused communication + GEMM ops on torch tensors and ProcessGroups.

    import torch, torch.distributed as dist, nccl_mk
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    c = nccl_mk.all_gather_gemm(x_shard, w)       # C = AllGather(x_shard) . w^T
    y = nccl_mk.gemm_reduce_scatter(x, w)         # rows of this rank of sum_r x_r . w_r^T
    z = nccl_mk.gemm_all_reduce(x, w)             # sum_r x_r . w_r^T on every rank
    o = nccl_mk.ring_attention(q, k, v, causal=True)  # attention over the whole sequence

Tensors are bf16, 2-D, contiguous, 16-byte aligned, on this rank's GPU; w is [N, K] like a
Linear weight (ring_attention: 4-D [B, S_local, heads, D] tensors, see its doc). The ops run
on the group's own NCCL communicator (default: the world group) and on the current CUDA
stream; they can be captured in CUDA graphs and traced by
torch.compile (torch.ops.nccl_mk.*). The first fused call on a group (or nccl_mk.init) is
collective: every rank must make it. The GEMM ops are forward only (no autograd);
ring_attention's functional form is differentiable (ncclMkRingAttentionBackward).

The package imports without torch or a GPU; status() says what is missing.
"""

from ._checks import ArgumentError, zigzag_positions
from ._lib import NcclMkError, load, loaded_path, version

__all__ = ["ArgumentError", "NcclMkError", "load", "loaded_path", "version", "status",
           "available", "init", "release", "communicator", "all_gather_gemm",
           "gemm_reduce_scatter", "gemm_all_reduce", "ring_attention", "zigzag_positions"]

try:
    import torch
except ImportError as _e:
    _TORCH_ERROR = f"PyTorch is not installed ({_e}); nccl_mk's ops need torch"
else:
    _TORCH_ERROR = None


def status() -> str:
    """One line per requirement, saying what is present and what is missing."""
    lines = []
    if _TORCH_ERROR:
        lines.append(_TORCH_ERROR)
    else:
        lines.append(f"torch {torch.__version__}")
        if not torch.cuda.is_available():
            lines.append("no CUDA GPU is visible to this process: the fused ops cannot run here")
        else:
            major, minor = torch.cuda.get_device_capability()
            lines.append(f"{torch.cuda.device_count()} GPU(s), {torch.cuda.get_device_name()} "
                         f"(sm_{major}{minor})" + ("" if major == 9 else
                                                   ": the fused ops need Hopper (sm_90)"))
    try:
        load()
        lines.append(f"library {loaded_path()} version {version()}")
    except OSError as e:
        lines.append(str(e))
    return "\n".join(lines)


def available() -> bool:
    """True where torch, a Hopper GPU and the library are all present."""
    if _TORCH_ERROR or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability()[0] != 9:
        return False
    try:
        load()
    except OSError:
        return False
    return True


if _TORCH_ERROR is None:
    from ._api import (all_gather_gemm, communicator, gemm_all_reduce, gemm_reduce_scatter,
                       init, release, ring_attention)
else:
    def _needs_torch(*args, **kwargs):
        raise ImportError("nccl_mk: " + _TORCH_ERROR)

    all_gather_gemm = gemm_reduce_scatter = gemm_all_reduce = ring_attention = _needs_torch
    init = release = communicator = _needs_torch
