"""The public Python functions: group handling, output allocation, then the custom ops.

Why this thin layer: custom ops cannot take a ProcessGroup object, only its name, and a
Python user wants `group=None` and optional `out=` buffers. This code is also what
torch.compile traces, so it stays small: the group's name and size are turned into
constants (torch.compiler.assume_constant_result), everything else is in the ops.
"""

from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from . import _checks, _comm
from . import _ops as _registers_torch_ops_nccl_mk

assert _registers_torch_ops_nccl_mk  # imported for its side effect: torch.ops.nccl_mk.*


@torch.compiler.assume_constant_result
def _group_name(group: Optional[dist.ProcessGroup]) -> str:
    return _comm.resolve_group(group).group_name


@torch.compiler.assume_constant_result
def _group_size(group: Optional[dist.ProcessGroup]) -> int:
    return _comm.resolve_group(group).size()


def _rows_cols(t: Tensor) -> Tuple[int, int]:
    # A bad input gets a (0, 0) output here; the op then rejects the input by name.
    return (t.shape[0], t.shape[1]) if t.dim() == 2 else (0, 0)


def init(group: Optional[dist.ProcessGroup] = None, *, device=None, max_m: Optional[int] = None,
         max_n: Optional[int] = None, max_k: Optional[int] = None, comm_sms: int = 0,
         timeout_ms: int = 0) -> None:
    """Prepares `group` (default: world) on `device` (default: current) for the fused ops.

    Collective: every rank calls it at the same point. Optional: the first fused call does
    it with the library's defaults. Call it yourself to size the workspaces (max_m = total
    rows of C, max_n and max_k per rank; default: ncclMkConfigDefaults) and before any CUDA
    graph capture, where workspaces cannot be created or grown."""
    _comm.init(group, device, max_m, max_n, max_k, comm_sms, timeout_ms)


def release(group: Optional[dist.ProcessGroup] = None) -> None:
    """Frees the fused-op state of `group` (None: of every group); waits for queued work.
    Call before torch.distributed.destroy_process_group; what remains is freed at exit."""
    _comm.release(group)


def communicator(group: Optional[dist.ProcessGroup] = None, device=None) -> Optional[int]:
    """The ncclComm_t (as an int) given to ncclMkCommInit for `group`, None before init."""
    return _comm.prepared_pointer(group, device)


def all_gather_gemm(a_shard: Tensor, b: Tensor, group: Optional[dist.ProcessGroup] = None,
                    out: Optional[Tensor] = None, gathered: Optional[Tensor] = None,
                    return_gathered: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """C [M, N] = AllGather(a_shard) [M, K] . b^T, M = rows of a_shard x ranks.

    a_shard: this rank's rows [M / nranks, K]; b: [N, K] (this rank's weight shard).
    out: optional [M, N] output; gathered: optional [M, K] buffer that receives the gathered
    A (backward needs it). Returns out, or (out, gathered) with return_gathered=True."""
    name = _group_name(group)
    if out is None and gathered is None:
        c, g = torch.ops.nccl_mk.all_gather_gemm(a_shard, b, name, return_gathered)
        return (c, g) if return_gathered else c
    rows, k = _rows_cols(a_shard)
    m = rows * _group_size(group)
    if out is None:
        out = a_shard.new_empty((m, _rows_cols(b)[0]))
    if gathered is None and return_gathered:
        gathered = a_shard.new_empty((m, k))
    torch.ops.nccl_mk.all_gather_gemm_out(a_shard, b, out, gathered, name)
    return (out, gathered) if return_gathered else out


def gemm_reduce_scatter(a: Tensor, b: Tensor, group: Optional[dist.ProcessGroup] = None,
                        out: Optional[Tensor] = None) -> Tensor:
    """This rank's rows [M / nranks, N] of sum over ranks of a [M, K] . b [N, K]^T.

    Each rank holds its K-slice of the reduction (a row-parallel Linear)."""
    name = _group_name(group)
    if out is None:
        return torch.ops.nccl_mk.gemm_reduce_scatter(a, b, name)
    torch.ops.nccl_mk.gemm_reduce_scatter_out(a, b, out, name)
    return out


def gemm_all_reduce(a: Tensor, b: Tensor, group: Optional[dist.ProcessGroup] = None,
                    out: Optional[Tensor] = None) -> Tensor:
    """Sum over ranks of a [M, K] . b [N, K]^T, [M, N] on every rank."""
    name = _group_name(group)
    if out is None:
        return torch.ops.nccl_mk.gemm_all_reduce(a, b, name)
    torch.ops.nccl_mk.gemm_all_reduce_out(a, b, out, name)
    return out


def ring_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                   group: Optional[dist.ProcessGroup] = None, out: Optional[Tensor] = None,
                   return_lse: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention of this rank's queries over the whole sequence, split across the group.

    q [B, S_local, H, D]; k, v [B, S_local, H_kv, D] (bf16, contiguous; D 64 or 128; H a
    multiple of H_kv): this rank's S_local tokens of a sequence of ranks x S_local. Softmax
    scale 1 / sqrt(D). causal=False: any split (usually rank r holds tokens r x S_local ..);
    causal=True: the zigzag split, rank r holds chunks r and 2 x ranks - 1 - r of S_local / 2
    tokens, in that order (nccl_mk.zigzag_positions), S_local even. out: optional
    [B, S_local, H, D] output. Returns out, or (out, lse) with return_lse=True, lse
    [B, H, S_local] fp32 the natural log of the softmax denominators (for a backward pass).
    Needs 2 to 8 ranks on one host and NCCL_MK_FUSED=1 when the group is prepared.

    Differentiable (without out=): q.grad, k.grad and v.grad come from ncclMkRingAttentionBackward
    (this rank's queries' dq; dk, dv of the keys and values this rank holds, summed over every
    rank's queries: every rank must run the backward, as a collective); lse then carries no
    gradient. Its workspace is larger than the forward's (include/nccl_mk.h; a shortfall
    raises NcclMkError with both numbers)."""
    name = _group_name(group)
    if out is None:
        need_lse = return_lse or (torch.is_grad_enabled() and
                                  any(t.requires_grad for t in (q, k, v)))
        o, lse = torch.ops.nccl_mk.ring_attention(q, k, v, causal, name, need_lse)
        return (o, lse) if return_lse else o
    lse = None
    if return_lse:
        # A bad q gets a (0, 0, 0) lse here; the op then rejects q by name.
        shape = _checks.ring_attention_lse_shape(q.shape) if q.dim() == 4 else (0, 0, 0)
        lse = q.new_empty(shape, dtype=torch.float32)
    torch.ops.nccl_mk.ring_attention_out(q, k, v, out, lse, causal, name)
    return (out, lse) if return_lse else out
