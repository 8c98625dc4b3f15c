"""The fused ops as torch custom ops (namespace nccl_mk), and the Python functions over them.

Why custom ops: a registered op with a fake (meta) implementation is traced by
torch.compile as one opaque node with known output shapes, and its real implementation runs
on the current CUDA stream, so it is captured by CUDA graphs like any kernel. Functional
ops (new outputs) are what torch.compile prefers; the *_out ops write into caller buffers
(mutates_args), for users who manage their own memory.

Each real implementation checks every argument (nccl_mk._checks) before calling C, so a
bad call raises an ArgumentError naming the argument and leaves the outputs untouched.
The GEMM ops are forward only (no autograd formula). Ring attention has one: the functional
op's backward is nccl_mk::ring_attention_backward (ncclMkRingAttentionBackward), registered
with torch.library.register_autograd; the *_out form stays forward only.
"""

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _checks, _comm, _lib


def _info(name: str, t: Optional[Tensor], fake: bool = False) -> Optional[_checks.TensorInfo]:
    """The facts the checks need; fake tensors have no data pointer (not checked then)."""
    if t is None:
        return None
    return _checks.TensorInfo(name, tuple(t.shape), str(t.dtype).replace("torch.", ""),
                              str(t.device), t.is_contiguous(), None if fake else t.data_ptr(),
                              t.element_size())


def _ptr(t: Optional[Tensor]) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def _stream(device: torch.device) -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def _group_size(group_name: str) -> int:
    return _comm.group_from_name(group_name).size()


def _launch(op: str, c_name: str, a: Tensor, m: int, n: int, k: int, group_name: str, call):
    """Shared tail of every op: the prepared communicator, the capture limit, the C call on
    the current stream, the error with the communicator's async state."""
    group = _comm.group_from_name(group_name)
    state = _comm.get(group, a.device.index)
    capturing = _comm.check_capture_fits(state, op, m, n, k)
    rc = call(ctypes.c_void_p(state.ptr), _stream(a.device))
    _lib.check(f"nccl_mk.{op} ({c_name})", rc, state.ptr)
    if not capturing:
        state.shapes_run.add((op, m, n, k))


# ---- AllGather + GEMM --------------------------------------------------------------------

def _all_gather_gemm_into(a_shard: Tensor, b: Tensor, out: Tensor, gathered: Optional[Tensor],
                          group_name: str) -> None:
    m, n, k = _checks.check_all_gather_gemm(
        _info("a_shard", a_shard), _info("b", b), _info("out", out), _info("gathered", gathered),
        _group_size(group_name))
    lib = _lib.load()
    _launch("all_gather_gemm", "ncclMkAllGatherGemm", a_shard, m, n, k, group_name,
            lambda comm, stream: lib.ncclMkAllGatherGemm(
                _ptr(a_shard), _ptr(b), _ptr(out), _ptr(gathered), m, n, k,
                _lib.NCCL_BFLOAT16, comm, stream))


@torch.library.custom_op("nccl_mk::all_gather_gemm", mutates_args=())
def all_gather_gemm_op(a_shard: Tensor, b: Tensor, group_name: str,
                       return_gathered: bool) -> Tuple[Tensor, Tensor]:
    """(C [M, N], gathered A [M, K] or an empty tensor) for A_r [M/n, K], B [N, K]."""
    _checks.check_all_gather_gemm(_info("a_shard", a_shard), _info("b", b), None, None,
                                  _group_size(group_name))
    out_shape, gathered_shape = _checks.all_gather_gemm_shapes(a_shard.shape, b.shape,
                                                               _group_size(group_name))
    out = a_shard.new_empty(out_shape)
    gathered = a_shard.new_empty(gathered_shape if return_gathered else (0,))
    _all_gather_gemm_into(a_shard, b, out, gathered if return_gathered else None, group_name)
    return out, gathered


@all_gather_gemm_op.register_fake
def _(a_shard, b, group_name, return_gathered):
    _checks.check_all_gather_gemm(_info("a_shard", a_shard, True), _info("b", b, True), None,
                                  None, _group_size(group_name))
    m = a_shard.shape[0] * _group_size(group_name)
    return (a_shard.new_empty((m, b.shape[0])),
            a_shard.new_empty((m, a_shard.shape[1]) if return_gathered else (0,)))


@torch.library.custom_op("nccl_mk::all_gather_gemm_out", mutates_args=("out", "gathered"))
def all_gather_gemm_out_op(a_shard: Tensor, b: Tensor, out: Tensor, gathered: Optional[Tensor],
                           group_name: str) -> None:
    """Writes C into out and, when given, the gathered A into gathered."""
    _all_gather_gemm_into(a_shard, b, out, gathered, group_name)


@all_gather_gemm_out_op.register_fake
def _(a_shard, b, out, gathered, group_name):
    _checks.check_all_gather_gemm(_info("a_shard", a_shard, True), _info("b", b, True),
                                  _info("out", out, True), _info("gathered", gathered, True),
                                  _group_size(group_name))


# ---- GEMM + ReduceScatter ----------------------------------------------------------------

def _gemm_reduce_scatter_into(a: Tensor, b: Tensor, out: Tensor, group_name: str) -> None:
    m, n, k = _checks.check_gemm_reduce_scatter(_info("a", a), _info("b", b), _info("out", out),
                                                _group_size(group_name))
    lib = _lib.load()
    _launch("gemm_reduce_scatter", "ncclMkGemmReduceScatter", a, m, n, k, group_name,
            lambda comm, stream: lib.ncclMkGemmReduceScatter(
                _ptr(a), _ptr(b), _ptr(out), m, n, k, _lib.NCCL_BFLOAT16, comm, stream))


@torch.library.custom_op("nccl_mk::gemm_reduce_scatter", mutates_args=())
def gemm_reduce_scatter_op(a: Tensor, b: Tensor, group_name: str) -> Tensor:
    """This rank's rows [M/n, N] of the sum over ranks of A [M, K] . B [N, K]^T."""
    _checks.check_gemm_reduce_scatter(_info("a", a), _info("b", b), None, _group_size(group_name))
    out = a.new_empty(_checks.gemm_reduce_scatter_shape(a.shape, b.shape, _group_size(group_name)))
    _gemm_reduce_scatter_into(a, b, out, group_name)
    return out


@gemm_reduce_scatter_op.register_fake
def _(a, b, group_name):
    _checks.check_gemm_reduce_scatter(_info("a", a, True), _info("b", b, True), None,
                                      _group_size(group_name))
    return a.new_empty((a.shape[0] // _group_size(group_name), b.shape[0]))


@torch.library.custom_op("nccl_mk::gemm_reduce_scatter_out", mutates_args=("out",))
def gemm_reduce_scatter_out_op(a: Tensor, b: Tensor, out: Tensor, group_name: str) -> None:
    _gemm_reduce_scatter_into(a, b, out, group_name)


@gemm_reduce_scatter_out_op.register_fake
def _(a, b, out, group_name):
    _checks.check_gemm_reduce_scatter(_info("a", a, True), _info("b", b, True),
                                      _info("out", out, True), _group_size(group_name))


# ---- GEMM + AllReduce --------------------------------------------------------------------

def _gemm_all_reduce_into(a: Tensor, b: Tensor, out: Tensor, group_name: str) -> None:
    m, n, k = _checks.check_gemm_all_reduce(_info("a", a), _info("b", b), _info("out", out))
    lib = _lib.load()
    _launch("gemm_all_reduce", "ncclMkGemmAllReduce", a, m, n, k, group_name,
            lambda comm, stream: lib.ncclMkGemmAllReduce(
                _ptr(a), _ptr(b), _ptr(out), m, n, k, _lib.NCCL_BFLOAT16, comm, stream))


@torch.library.custom_op("nccl_mk::gemm_all_reduce", mutates_args=())
def gemm_all_reduce_op(a: Tensor, b: Tensor, group_name: str) -> Tensor:
    """The sum over ranks of A [M, K] . B [N, K]^T, [M, N] on every rank."""
    _checks.check_gemm_all_reduce(_info("a", a), _info("b", b), None)
    out = a.new_empty(_checks.gemm_all_reduce_shape(a.shape, b.shape))
    _gemm_all_reduce_into(a, b, out, group_name)
    return out


@gemm_all_reduce_op.register_fake
def _(a, b, group_name):
    _checks.check_gemm_all_reduce(_info("a", a, True), _info("b", b, True), None)
    return a.new_empty((a.shape[0], b.shape[0]))


@torch.library.custom_op("nccl_mk::gemm_all_reduce_out", mutates_args=("out",))
def gemm_all_reduce_out_op(a: Tensor, b: Tensor, out: Tensor, group_name: str) -> None:
    _gemm_all_reduce_into(a, b, out, group_name)


@gemm_all_reduce_out_op.register_fake
def _(a, b, out, group_name):
    _checks.check_gemm_all_reduce(_info("a", a, True), _info("b", b, True),
                                  _info("out", out, True))


# ---- ring attention ----------------------------------------------------------------------

def _ring_attention_check(op: str, c_name: str, rc: int, state, who: str, need: int,
                          holds: str) -> None:
    """The C call's result: ncclInvalidUsage explained with the workspace it needs (need
    bytes, `holds` saying for what) beside what the group was prepared with; else _lib.check."""
    if rc == _lib.NCCL_INVALID_USAGE:
        raise _lib.NcclMkError(
            f"nccl_mk.{op} ({c_name})", rc,
            f"{who} needs NCCL_MK_FUSED=1 at init, all ranks on one host, and at least {need} "
            f"bytes of workspace {holds} (nccl_mk.init's max_m x max(max_n, max_k) x 2 bytes; "
            f"prepared: {state.max_m} x {max(state.max_n, state.max_k)} x 2)")
    _lib.check(f"nccl_mk.{op} ({c_name})", rc, state.ptr)


def _ring_attention_into(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor],
                         causal: bool, group_name: str) -> None:
    nranks = _group_size(group_name)
    b, s, h, h_kv, d = _checks.check_ring_attention(
        _info("q", q), _info("k", k), _info("v", v), _info("out", out), _info("lse", lse),
        causal, nranks)
    lib = _lib.load()
    op, c_name = "ring_attention", "ncclMkRingAttention"
    group = _comm.group_from_name(group_name)
    state = _comm.get(group, q.device.index)
    # No capture limit to check here: the library never grows ring attention's workspace (a
    # too-small one is ncclInvalidUsage, outside capture as inside).
    comm = ctypes.c_void_p(state.ptr)
    rc = lib.ncclMkRingAttention(_ptr(q), _ptr(k), _ptr(v), _ptr(out), _ptr(lse), b, s, h, h_kv,
                                 d, int(bool(causal)), _lib.NCCL_BFLOAT16, comm,
                                 _stream(q.device))
    _ring_attention_check(op, c_name, rc, state, "ring attention",
                          _checks.ring_attention_workspace_bytes(b, s, h_kv, d, nranks),
                          "for the peers' K and V")


@torch.library.custom_op("nccl_mk::ring_attention", mutates_args=())
def ring_attention_op(q: Tensor, k: Tensor, v: Tensor, causal: bool, group_name: str,
                      return_lse: bool) -> Tuple[Tensor, Tensor]:
    """(out [B, S_local, H, D], lse [B, H, S_local] fp32 or an empty tensor) of attention of
    this rank's queries over the whole sequence's keys, split across the group's ranks."""
    _checks.check_ring_attention(_info("q", q), _info("k", k), _info("v", v), None, None,
                                 causal, _group_size(group_name))
    out = q.new_empty(q.shape)
    lse = q.new_empty(_checks.ring_attention_lse_shape(q.shape) if return_lse else (0,),
                      dtype=torch.float32)
    _ring_attention_into(q, k, v, out, lse if return_lse else None, causal, group_name)
    return out, lse


@ring_attention_op.register_fake
def _(q, k, v, causal, group_name, return_lse):
    _checks.check_ring_attention(_info("q", q, True), _info("k", k, True), _info("v", v, True),
                                 None, None, causal, _group_size(group_name))
    return (q.new_empty(q.shape),
            q.new_empty(_checks.ring_attention_lse_shape(q.shape) if return_lse else (0,),
                        dtype=torch.float32))


@torch.library.custom_op("nccl_mk::ring_attention_out", mutates_args=("out", "lse"))
def ring_attention_out_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor],
                          causal: bool, group_name: str) -> None:
    """Writes the attention output into out and, when given, the log-sum-exp into lse."""
    _ring_attention_into(q, k, v, out, lse, causal, group_name)


@ring_attention_out_op.register_fake
def _(q, k, v, out, lse, causal, group_name):
    _checks.check_ring_attention(_info("q", q, True), _info("k", k, True), _info("v", v, True),
                                 _info("out", out, True), _info("lse", lse, True), causal,
                                 _group_size(group_name))


# ---- ring attention backward -------------------------------------------------------------

def _ring_attention_backward_into(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                  dout: Tensor, dq: Tensor, dk: Tensor, dv: Tensor, causal: bool,
                                  group_name: str) -> None:
    nranks = _group_size(group_name)
    b, s, h, h_kv, d = _checks.check_ring_attention_backward(
        _info("q", q), _info("k", k), _info("v", v), _info("out", out), _info("lse", lse),
        _info("dout", dout), (_info("dq", dq), _info("dk", dk), _info("dv", dv)), causal, nranks)
    lib = _lib.load()
    op, c_name = "ring_attention_backward", "ncclMkRingAttentionBackward"
    state = _comm.get(_comm.group_from_name(group_name), q.device.index)
    rc = lib.ncclMkRingAttentionBackward(
        _ptr(q), _ptr(k), _ptr(v), _ptr(out), _ptr(lse), _ptr(dout), _ptr(dq), _ptr(dk), _ptr(dv),
        b, s, h, h_kv, d, int(bool(causal)), _lib.NCCL_BFLOAT16, ctypes.c_void_p(state.ptr),
        _stream(q.device))
    _ring_attention_check(op, c_name, rc, state, "the ring attention backward",
                          _checks.ring_attention_backward_workspace_bytes(b, s, h, h_kv, d, nranks),
                          "(the peers' K and V, fp32 dK/dV partials, delta and dq)")


@torch.library.custom_op("nccl_mk::ring_attention_backward", mutates_args=())
def ring_attention_backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                               dout: Tensor, causal: bool,
                               group_name: str) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of ring attention: dq of this rank's queries, dk and dv of the keys and
    values it holds, summed over every rank's queries."""
    _checks.check_ring_attention_backward(_info("q", q), _info("k", k), _info("v", v),
                                          _info("out", out), _info("lse", lse),
                                          _info("dout", dout), None, causal,
                                          _group_size(group_name))
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    _ring_attention_backward_into(q, k, v, out, lse, dout, dq, dk, dv, causal, group_name)
    return dq, dk, dv


@ring_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, causal, group_name):
    _checks.check_ring_attention_backward(
        _info("q", q, True), _info("k", k, True), _info("v", v, True), _info("out", out, True),
        _info("lse", lse, True), _info("dout", dout, True), None, causal, _group_size(group_name))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _ring_attention_setup_context(ctx, inputs, output):
    q, k, v, causal, group_name, return_lse = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.group_name = causal, group_name
    ctx.set_materialize_grads(False)


def _ring_attention_backward(ctx, dout, dlse):
    if dlse is not None:
        raise NotImplementedError("nccl_mk.ring_attention: no gradient flows through lse; use "
                                  "the output only in the loss")
    if dout is None:
        return None, None, None, None, None, None
    q, k, v, out, lse = ctx.saved_tensors
    if lse.numel() == 0:
        raise RuntimeError("nccl_mk.ring_attention: the backward needs the forward's lse; call "
                           "nccl_mk.ring_attention(), which asks for it when a gradient is needed")
    dq, dk, dv = torch.ops.nccl_mk.ring_attention_backward(
        q, k, v, out, lse, dout.contiguous(), ctx.causal, ctx.group_name)
    return dq, dk, dv, None, None, None


torch.library.register_autograd("nccl_mk::ring_attention", _ring_attention_backward,
                                setup_context=_ring_attention_setup_context)
