"""Argument checks for the fused ops, on duck-typed tensor descriptions.

Why a module of its own, with no torch import: the C library rejects bad input too, but only
with an ncclResult_t and a WARN line in NCCL's log; a Python user needs an exception that
names the argument, raised before anything is launched. Keeping the rules here, on plain
shape/dtype/device/pointer facts, lets CI (no torch, no GPU) test every rule.

The rules are those of include/nccl_mk.h: bf16, 2-D row-major (contiguous) tensors on one
CUDA device, data pointers 16-byte aligned, C = A . B^T with B [N, K] like a Linear weight,
N and K positive multiples of 8, every dimension below 2^31, M a multiple of the rank count
where rows are split across ranks. Ring attention (ncclMkRingAttention) has its own rules,
with check_ring_attention below: 4-D [B, S_local, heads, D] tensors, an fp32 lse.
"""

from typing import List, NamedTuple, Optional, Sequence, Tuple

ALIGNMENT = 16
DIM_MULTIPLE = 8
MAX_DIM = 2**31 - 1
SUPPORTED_DTYPE = "bfloat16"
RA_HEAD_DIMS = (64, 128)
RA_MAX_BH = 65535          # B and H (grid dimensions)
RA_MAX_S_LOCAL = 2**30
RA_MIN_RANKS, RA_MAX_RANKS = 2, 8
RA_CHUNK_FLAGS = 4032      # the communicator's K/V chunk flags: one per peer and sequence at least


class TensorInfo(NamedTuple):
    """What the checks need to know about one tensor argument."""

    name: str                  # the argument's name, as the user wrote it
    shape: Tuple[int, ...]
    dtype: str                 # "bfloat16", "float32", ... (torch's name without "torch.")
    device: str                # "cuda:0", "cpu", ...
    contiguous: bool           # row-major with no gaps
    data_ptr: Optional[int]    # None where unknown (fake tensors): alignment/overlap unchecked
    itemsize: int = 2


class ArgumentError(ValueError):
    """A bad argument to a fused op; `argument` names it, `op` names the op."""

    def __init__(self, op: str, argument: str, message: str):
        super().__init__(f"nccl_mk.{op}: {argument}: {message}")
        self.op = op
        self.argument = argument


def _tensor(op: str, t: TensorInfo, layout: str = "(rows, cols)",
            dtype: str = SUPPORTED_DTYPE, alignment: int = ALIGNMENT) -> None:
    """Checks one tensor on its own: dtype, device, rank, contiguity, alignment. `layout`
    names the dimensions, and its entry count is the rank the tensor must have."""
    if t.dtype != dtype:
        raise ArgumentError(op, t.name, f"has dtype {t.dtype}; the fused ops take "
                            f"{dtype} only" if dtype == SUPPORTED_DTYPE else
                            f"has dtype {t.dtype}, must be {dtype}")
    if not t.device.startswith("cuda"):
        raise ArgumentError(op, t.name, f"is on {t.device}; the fused ops need CUDA tensors")
    ndim = layout.count(",") + 1
    if len(t.shape) != ndim:
        raise ArgumentError(op, t.name, f"must be {ndim}-D {layout}, got shape "
                            f"{tuple(t.shape)}")
    if not t.contiguous:
        raise ArgumentError(op, t.name, "is not contiguous (row-major); pass .contiguous()"
                            + (" (a weight is passed as [N, K], as stored by Linear, not w.t())"
                               if ndim == 2 else ""))
    if t.data_ptr is not None and t.data_ptr % alignment:
        raise ArgumentError(op, t.name, f"data pointer {t.data_ptr:#x} is not {alignment}-byte "
                            "aligned (a view that starts at an odd offset?); pass .clone()")


def _same_device(op: str, tensors: Sequence[TensorInfo]) -> None:
    first = tensors[0]
    for t in tensors[1:]:
        if t.device != first.device:
            raise ArgumentError(op, t.name, f"is on {t.device} but {first.name} is on "
                                f"{first.device}; all tensors must be on one GPU")


def _dims(op: str, m: int, n: int, k: int, m_name: str, n_name: str, k_name: str) -> None:
    """N and K positive multiples of 8, M positive, all below 2^31 (the kernel's int index)."""
    if m < 1:
        raise ArgumentError(op, m_name, f"has {m} rows; M must be at least 1")
    for value, name, what in ((n, n_name, "N"), (k, k_name, "K")):
        if value < DIM_MULTIPLE or value % DIM_MULTIPLE:
            raise ArgumentError(op, name, f"{what}={value} must be a positive multiple of "
                                f"{DIM_MULTIPLE}")
    for value, name, what in ((m, m_name, "M"), (n, n_name, "N"), (k, k_name, "K")):
        if value > MAX_DIM:
            raise ArgumentError(op, name, f"{what}={value} must be below 2^31")


def _k_matches(op: str, a: TensorInfo, b: TensorInfo) -> None:
    if a.shape[1] != b.shape[1]:
        hint = (" (b looks transposed: pass the weight as [N, K])"
                if b.shape[0] == a.shape[1] else "")
        raise ArgumentError(op, b.name, f"has K={b.shape[1]} (shape {tuple(b.shape)}) but "
                            f"{a.name} has K={a.shape[1]}; b is [N, K]{hint}")


def _extent(t: TensorInfo) -> Tuple[int, int]:
    size = t.itemsize
    for d in t.shape:
        size *= d
    return t.data_ptr, t.data_ptr + size


def _output(op: str, out: TensorInfo, expected: Tuple[int, ...],
            inputs: Sequence[TensorInfo], **rules) -> None:
    """An output: the tensor rules (`rules`: _tensor's layout/dtype/alignment), the expected
    shape, and no overlap with any input."""
    _tensor(op, out, **rules)
    if tuple(out.shape) != tuple(expected):
        raise ArgumentError(op, out.name, f"has shape {tuple(out.shape)}, expected "
                            f"{tuple(expected)}")
    if out.data_ptr is None:
        return
    lo, hi = _extent(out)
    for t in inputs:
        if t.data_ptr is None:
            continue
        t_lo, t_hi = _extent(t)
        if lo < t_hi and t_lo < hi:
            raise ArgumentError(op, out.name, f"overlaps {t.name} in memory; outputs must not "
                                "alias inputs")


def _nranks(nranks: int) -> None:
    if nranks < 1:
        raise ValueError(f"nccl_mk: the process group has {nranks} ranks")


def all_gather_gemm_shapes(a_shard: Sequence[int], b: Sequence[int],
                           nranks: int) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """Shapes of (out, gathered) for AllGather+GEMM: ([M, N], [M, K]), M = rows * nranks."""
    m = a_shard[0] * nranks
    return (m, b[0]), (m, a_shard[1])


def gemm_reduce_scatter_shape(a: Sequence[int], b: Sequence[int],
                              nranks: int) -> Tuple[int, int]:
    """Shape of this rank's output for GEMM+ReduceScatter: [M / nranks, N]."""
    return a[0] // nranks, b[0]


def gemm_all_reduce_shape(a: Sequence[int], b: Sequence[int]) -> Tuple[int, int]:
    """Shape of the output for GEMM+AllReduce: [M, N] on every rank."""
    return a[0], b[0]


def check_all_gather_gemm(a_shard: TensorInfo, b: TensorInfo, out: Optional[TensorInfo],
                          gathered: Optional[TensorInfo], nranks: int) -> Tuple[int, int, int]:
    """Checks AllGather+GEMM's arguments; returns (M, N, K) with M the gathered rows."""
    op = "all_gather_gemm"
    _nranks(nranks)
    for t in (a_shard, b):
        _tensor(op, t)
    _same_device(op, [a_shard, b])
    _k_matches(op, a_shard, b)
    m, n, k = a_shard.shape[0] * nranks, b.shape[0], b.shape[1]
    _dims(op, m, n, k, a_shard.name, b.name, b.name)
    out_shape, gathered_shape = all_gather_gemm_shapes(a_shard.shape, b.shape, nranks)
    outputs = [t for t in (out, gathered) if t is not None]
    for t, shape in ((out, out_shape), (gathered, gathered_shape)):
        if t is not None:
            _output(op, t, shape, [a_shard, b])
    if len(outputs) == 2:
        _output(op, gathered, gathered_shape, [out])
    _same_device(op, [a_shard] + outputs)
    return m, n, k


def check_gemm_reduce_scatter(a: TensorInfo, b: TensorInfo, out: Optional[TensorInfo],
                              nranks: int) -> Tuple[int, int, int]:
    """Checks GEMM+ReduceScatter's arguments; returns (M, N, K), M the rows of a."""
    op = "gemm_reduce_scatter"
    _nranks(nranks)
    for t in (a, b):
        _tensor(op, t)
    _same_device(op, [a, b])
    _k_matches(op, a, b)
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    _dims(op, m, n, k, a.name, b.name, a.name)
    if m % nranks:
        raise ArgumentError(op, a.name, f"has M={m} rows, not a multiple of the {nranks} ranks "
                            "(each rank receives M / nranks rows)")
    if out is not None:
        _output(op, out, gemm_reduce_scatter_shape(a.shape, b.shape, nranks), [a, b])
        _same_device(op, [a, out])
    return m, n, k


def check_gemm_all_reduce(a: TensorInfo, b: TensorInfo,
                          out: Optional[TensorInfo]) -> Tuple[int, int, int]:
    """Checks GEMM+AllReduce's arguments; returns (M, N, K)."""
    op = "gemm_all_reduce"
    for t in (a, b):
        _tensor(op, t)
    _same_device(op, [a, b])
    _k_matches(op, a, b)
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    _dims(op, m, n, k, a.name, b.name, a.name)
    if out is not None:
        _output(op, out, gemm_all_reduce_shape(a.shape, b.shape), [a, b])
        _same_device(op, [a, out])
    return m, n, k


def check_fits(op: str, m: int, n: int, k: int, max_m: int, max_n: int, max_k: int) -> None:
    """Inside CUDA graph capture the workspaces cannot grow: the shape must fit the limits
    given to nccl_mk.init (outside capture the library grows them itself)."""
    for value, limit, what in ((m, max_m, "m"), (n, max_n, "n"), (k, max_k, "k")):
        if value > limit:
            raise ArgumentError(op, what.upper(), f"{what.upper()}={value} exceeds max_{what}="
                                f"{limit} given to nccl_mk.init, and workspaces cannot grow "
                                f"inside CUDA graph capture: call nccl_mk.init(group, "
                                f"max_{what}={value}) before capturing (or run the op once "
                                "outside capture)")


# ---- ring attention ----------------------------------------------------------------------

QO_LAYOUT = "[B, S_local, H, D]"
KV_LAYOUT = "[B, S_local, H_kv, D]"
LSE_LAYOUT = "[B, H, S_local]"


def ring_attention_lse_shape(q: Sequence[int]) -> Tuple[int, int, int]:
    """Shape of lse for q [B, S_local, H, D]: [B, H, S_local] (fp32)."""
    return q[0], q[2], q[1]


def zigzag_positions(rank: int, nranks: int, s_local: int) -> List[int]:
    """The whole-sequence token positions of rank's S_local rows under causal=True's zigzag
    split: the sequence is cut into 2 x nranks chunks of S_local / 2 tokens, and rank r holds
    chunks r and 2 x nranks - 1 - r, in that order."""
    if nranks < 1 or not 0 <= rank < nranks:
        raise ValueError(f"nccl_mk.zigzag_positions: rank {rank} of {nranks} ranks")
    if s_local < 2 or s_local % 2:
        raise ValueError(f"nccl_mk.zigzag_positions: s_local={s_local} must be even and positive")
    half = s_local // 2
    first, second = rank, 2 * nranks - 1 - rank
    return (list(range(first * half, first * half + half))
            + list(range(second * half, second * half + half)))


def ring_attention_max_batch(nranks: int, backward: bool = False) -> int:
    """The largest B the communicator's chunk flags allow: B x (nranks - 1), plus the
    backward's nranks words, at most RA_CHUNK_FLAGS (ring_attn.c mk_ra_comm_check)."""
    return (RA_CHUNK_FLAGS - (nranks if backward else 0)) // (nranks - 1)


def check_ring_attention(q: TensorInfo, k: TensorInfo, v: TensorInfo, out: Optional[TensorInfo],
                         lse: Optional[TensorInfo], causal: bool, nranks: int,
                         op: str = "ring_attention") -> Tuple[int, int, int, int, int]:
    """Checks ring attention's arguments; returns (B, S_local, H, H_kv, D).

    q, out [B, S_local, H, D]; k, v [B, S_local, H_kv, D]; bf16, contiguous, 16-byte aligned;
    lse [B, H, S_local] fp32, 4-byte aligned; D 64 or 128; H a multiple of H_kv; B and H in
    [1, 65535], B at most ring_attention_max_batch(nranks); S_local in [1, 2^30], even when
    causal; B x S_local below 2^31; every tensor on one GPU; 2 to 8 ranks (all on one host:
    checked by the library)."""
    _nranks(nranks)
    if not RA_MIN_RANKS <= nranks <= RA_MAX_RANKS:
        raise ArgumentError(op, "group", f"has {nranks} ranks; ring attention needs "
                            f"{RA_MIN_RANKS} to {RA_MAX_RANKS}, all on one host")
    _tensor(op, q, QO_LAYOUT)
    for t in (k, v):
        _tensor(op, t, KV_LAYOUT)
    _same_device(op, [q, k, v])
    b, s, h, d = q.shape
    if d not in RA_HEAD_DIMS:
        raise ArgumentError(op, q.name, f"has D={d} (shape {tuple(q.shape)}); D must be "
                            f"{' or '.join(map(str, RA_HEAD_DIMS))}")
    for value, what in ((b, "B"), (h, "H")):
        if not 1 <= value <= RA_MAX_BH:
            raise ArgumentError(op, q.name, f"has {what}={value} (shape {tuple(q.shape)}); "
                                f"{what} must be in [1, {RA_MAX_BH}]")
    max_b = ring_attention_max_batch(nranks, op == "ring_attention_backward")
    if b > max_b:
        raise ArgumentError(op, q.name, f"has B={b}; on {nranks} ranks B must be at most {max_b} "
                            "(the communicator's chunk flags; no setting raises it)")
    if not 1 <= s <= RA_MAX_S_LOCAL:
        raise ArgumentError(op, q.name, f"has S_local={s}; it must be in [1, 2^30]")
    if b * s > MAX_DIM:
        raise ArgumentError(op, q.name, f"has B x S_local = {b * s}; it must be below 2^31")
    if causal and s % 2:
        raise ArgumentError(op, q.name, f"has S_local={s}, odd; causal=True needs it even "
                            "(the zigzag split: two chunks of S_local / 2 tokens per rank)")
    if (k.shape[0], k.shape[1], k.shape[3]) != (b, s, d):
        raise ArgumentError(op, k.name, f"has shape {tuple(k.shape)}; with q {tuple(q.shape)} "
                            f"it must be [{b}, {s}, H_kv, {d}] {KV_LAYOUT}")
    h_kv = k.shape[2]
    if h_kv < 1 or h % h_kv:
        raise ArgumentError(op, k.name, f"has H_kv={h_kv} heads, but H={h} (q) must be a "
                            "positive multiple of H_kv (grouped-query attention)")
    if tuple(v.shape) != tuple(k.shape):
        raise ArgumentError(op, v.name, f"has shape {tuple(v.shape)}, expected k's "
                            f"{tuple(k.shape)}")
    inputs = [q, k, v]
    if out is not None:
        _output(op, out, tuple(q.shape), inputs, layout=QO_LAYOUT)
    if lse is not None:
        _output(op, lse, ring_attention_lse_shape(q.shape), inputs, layout=LSE_LAYOUT,
                dtype="float32", alignment=4)
        if out is not None:
            _output(op, lse, ring_attention_lse_shape(q.shape), [out], layout=LSE_LAYOUT,
                    dtype="float32", alignment=4)
    _same_device(op, inputs + [t for t in (out, lse) if t is not None])
    return b, s, h, h_kv, d


def check_ring_attention_backward(q: TensorInfo, k: TensorInfo, v: TensorInfo, out: TensorInfo,
                                  lse: Optional[TensorInfo], dout: TensorInfo,
                                  grads: Optional[Sequence[TensorInfo]], causal: bool,
                                  nranks: int) -> Tuple[int, int, int, int, int]:
    """Checks the backward's arguments; returns (B, S_local, H, H_kv, D). The forward's
    rules for q, k, v, out and lse (required: the forward's log-sum-exp), dout like out, and
    when given grads = (dq, dk, dv): dq like q, dk and dv like k, none overlapping an input."""
    op = "ring_attention_backward"
    if lse is None:
        raise ArgumentError(op, "lse", "is required: the forward's log-sum-exp "
                            "(ring_attention(..., return_lse=True))")
    b, s, h, h_kv, d = check_ring_attention(q, k, v, None, None, causal, nranks, op)
    inputs = [q, k, v]
    _tensor(op, out, QO_LAYOUT)
    _tensor(op, dout, QO_LAYOUT)
    for t in (out, dout):
        if tuple(t.shape) != tuple(q.shape):
            raise ArgumentError(op, t.name, f"has shape {tuple(t.shape)}, expected q's "
                                f"{tuple(q.shape)}")
    _tensor(op, lse, LSE_LAYOUT, dtype="float32", alignment=4)
    if tuple(lse.shape) != ring_attention_lse_shape(q.shape):
        raise ArgumentError(op, lse.name, f"has shape {tuple(lse.shape)}, expected "
                            f"{ring_attention_lse_shape(q.shape)} {LSE_LAYOUT}")
    inputs += [out, lse, dout]
    if grads is not None:
        dq, dk, dv = grads
        _output(op, dq, tuple(q.shape), inputs, layout=QO_LAYOUT)
        for g in (dk, dv):
            _output(op, g, tuple(k.shape), inputs + [dq], layout=KV_LAYOUT)
        _output(op, dv, tuple(k.shape), [dk], layout=KV_LAYOUT)
        inputs += list(grads)
    _same_device(op, inputs)
    return b, s, h, h_kv, d


def ring_attention_backward_workspace_bytes(b: int, s_local: int, h: int, h_kv: int, d: int,
                                            nranks: int) -> int:
    """The fused workspace the backward needs (include/nccl_mk.h), each region rounded up to
    256 bytes: the peers' K and V, nranks fp32 dK/dV accumulators, delta and dq."""
    def up(x):
        return (x + 255) // 256 * 256
    kv = b * s_local * h_kv * d
    return (up((nranks - 1) * 2 * kv * 2) + up(nranks * 2 * kv * 4) + up(b * h * s_local * 4)
            + up(b * s_local * h * d * 4))


def ring_attention_workspace_bytes(b: int, s_local: int, h_kv: int, d: int, nranks: int) -> int:
    """The fused workspace ring attention needs for the peers' K and V (include/nccl_mk.h):
    (nranks - 1) x 2 x B x S_local x H_kv x D x 2 bytes."""
    return (nranks - 1) * 2 * b * s_local * h_kv * d * 2
