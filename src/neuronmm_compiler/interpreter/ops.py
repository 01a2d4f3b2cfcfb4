"""Instruction semantics shared by both dialects: DMA, TensorE matmul/transpose, elementwise math.

Each function checks the operands (memory spaces, shapes, tile limits, written-ness), does the
arithmetic in float32 like the Vector/Scalar/Tensor engines, and counts the instruction. Writing
results is the caller's job (0.3 writes into ``dst=``, 0.1 returns a temporary).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KernelError, KernelLimitError, UnsupportedAPIError
from .tensor import HBM, PSUM, SBUF, Tensor, as_f32, require_written, write

if TYPE_CHECKING:
    from .machine import Machine


class Op:
    """An ``op=`` value such as ``nl.add`` or ``nl.silu``; in the 0.1 dialect also callable."""

    __slots__ = ("call", "fn", "kind", "name")

    def __init__(self, name: str, kind: str, fn: Callable[..., np.ndarray]):
        self.name = name
        self.kind = kind  # "binary" (tensor_tensor) or "activation"
        self.fn = fn
        self.call: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.call is None:
            raise UnsupportedAPIError(
                f"nl.{self.name} cannot be called in the NKI 0.3 subset; pass it as op= to "
                f"{'nisa.tensor_tensor' if self.kind == 'binary' else 'nisa.activation'}")
        return self.call(*args, **kwargs)

    def __repr__(self) -> str:
        return f"nl.{self.name}"


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + np.exp(-x))


def _exp(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(x)


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _square(x: np.ndarray) -> np.ndarray:
    return x * x


def _rsqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.float32(1.0) / np.sqrt(x)


BINARY_FUNCS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "multiply": np.multiply, "subtract": np.subtract, "maximum": np.maximum,
    "minimum": np.minimum, "divide": np.divide,
}
ACTIVATION_FUNCS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    # NKI's identity activation is ``nl.copy``; there is no ``nl.identity`` (rule NKI-ACTIVATION-OP in
    # verification/rules.py, from the activation function table of the NKI API reference)
    "silu": _silu, "exp": _exp, "copy": _identity, "square": _square, "rsqrt": _rsqrt,
}
#: Elements per partition of one ``nisa.bn_stats`` result and of a ``nisa.bn_aggr`` result (NKI ISA reference).
BN_STATS_WIDTH = 6
BN_AGGR_WIDTH = 2


def make_ops() -> dict[str, Op]:
    """Fresh ``Op`` objects for one module instance (their ``call`` is set per dialect)."""
    ops = {name: Op(name, "binary", fn) for name, fn in BINARY_FUNCS.items()}
    ops.update({name: Op(name, "activation", fn) for name, fn in ACTIVATION_FUNCS.items()})
    return ops


# --- operand checks ---------------------------------------------------------------------------
def tensor_arg(value: Any, what: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise UnsupportedAPIError(f"{what} must be a tensor, got {type(value).__name__} {value!r:.60}")
    return value


def on_chip(value: Any, what: str) -> Tensor:
    t = tensor_arg(value, what)
    if t.alloc.buffer == HBM:
        raise KernelLimitError(
            f"{what} is in HBM ({t.describe()}): compute engines read and write only SBUF/PSUM; "
            "move data with DMA first")
    return t


def same_shape(a: Tensor, b: Tensor, what: str) -> None:
    if a.shape != b.shape:
        raise KernelError(f"{what}: shape mismatch {list(a.shape)} vs {list(b.shape)} "
                          f"({a.describe()} vs {b.describe()})")


def op_arg(op: Any, kind: str, what: str) -> Op:
    if not isinstance(op, Op) or op.kind != kind:
        allowed = ", ".join(f"nl.{n}" for n in (BINARY_FUNCS if kind == "binary" else ACTIVATION_FUNCS))
        raise UnsupportedAPIError(f"{what}: op={op!r} is not supported; use one of {allowed}")
    return op


# --- DMA ----------------------------------------------------------------------------------------
def dma(m: Machine, dst: Tensor, src: Tensor, what: str, *, transpose: bool = False,
        allow_cast: bool = False) -> None:
    """One DMA transfer HBM->SBUF or SBUF->HBM (optionally a 2-D transposing load)."""
    if dst.alloc.buffer == PSUM or src.alloc.buffer == PSUM:
        side = dst if dst.alloc.buffer == PSUM else src
        raise KernelLimitError(f"DMA cannot access PSUM: {what} touches {side.describe()}; "
                               "evict PSUM to SBUF with a tensor copy first")
    if src.alloc.buffer == HBM and dst.alloc.buffer == SBUF:
        hbm, sbuf, reading = src, dst, True
    elif src.alloc.buffer == SBUF and dst.alloc.buffer == HBM and not transpose:
        hbm, sbuf, reading = dst, src, False
    else:
        direction = "HBM->SBUF" if transpose else "HBM->SBUF or SBUF->HBM"
        raise UnsupportedAPIError(f"{what}: DMA from {src.alloc.buffer} to {dst.alloc.buffer} is not in "
                                  f"the subset (only {direction})")
    if transpose:
        if src.ndim != 2 or dst.shape != src.shape[::-1]:
            raise KernelError(f"{what}: needs a 2-D source [a, b] and a destination [b, a], got "
                              f"{list(src.shape)} -> {list(dst.shape)}")
    elif dst.shape != src.shape:
        raise KernelError(f"{what}: shape mismatch, destination {list(dst.shape)} vs source "
                          f"{list(src.shape)} (DMA copies equal shapes)")
    if not allow_cast and dst.dtype != src.dtype:
        raise KernelError(f"{what}: dtype mismatch, destination {dst.dtype.name} vs source "
                          f"{src.dtype.name} (DMA does not cast)")
    require_written(src, f"{what} source")
    write(dst, src.data.T if transpose else src.data)
    nbytes = hbm.data.nbytes
    if reading:
        hbm.alloc.bytes_read += nbytes
    else:
        hbm.alloc.bytes_written += nbytes
    c = m.counters
    per_partition = sbuf.data.nbytes // sbuf.shape[0]
    run = hbm.contiguous_run()
    if run is not None and hbm.ndim > 2:  # several runs per partition (a block of slabs): the bytes of one, as the
        per_partition = run * hbm.dtype.itemsize  # cost model prices them (cost_model/counts.py)
    c.record_dma(per_partition)
    if transpose:
        c.dma_transposes += 1


# --- TensorE ----------------------------------------------------------------------------------
def _sbuf_operand(value: Any, what: str) -> Tensor:
    t = tensor_arg(value, what)
    if t.alloc.buffer != SBUF:
        raise KernelLimitError(f"{what} must be in SBUF (TensorE reads SBUF only), got {t.describe()}")
    if t.ndim != 2:
        raise KernelError(f"{what} must be a 2-D view [partition, free], got shape {list(t.shape)}")
    return t


def matmul(m: Machine, stationary: Any, moving: Any, what: str) -> np.ndarray:
    """Check and compute ``stationary.T @ moving`` in fp32; counts one nc_matmul."""
    st = _sbuf_operand(stationary, f"{what} stationary")
    mv = _sbuf_operand(moving, f"{what} moving")
    k, m_free = st.shape
    k2, n_free = mv.shape
    t = m.target
    if k != k2:
        raise KernelLimitError(f"{what}: partition (contraction) dims differ: stationary has {k}, "
                               f"moving has {k2}")
    if k > t.pmax:
        raise KernelLimitError(f"{what}: contraction dim K={k} exceeds pmax {t.pmax}")
    if m_free > t.gemm_stationary_fmax:
        raise KernelLimitError(f"{what}: stationary free size M={m_free} exceeds gemm_stationary_fmax "
                               f"{t.gemm_stationary_fmax}")
    if n_free > t.gemm_moving_fmax:
        raise KernelLimitError(f"{what}: moving free size N={n_free} exceeds gemm_moving_fmax "
                               f"{t.gemm_moving_fmax}")
    require_written(st, f"{what} stationary")
    require_written(mv, f"{what} moving")
    c = m.counters
    c.matmul_instructions += 1
    c.matmul_moving_columns += n_free
    return as_f32(st).T @ as_f32(mv)


#: The rule ids of the PE-tiling checks (verification/rules.py), named in the interpreter's messages.
TILE_RULE = "NKI-MATMUL-TILE"
TILE_DST_RULE = "NKI-MATMUL-TILE-DST"


def _pair(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise KernelLimitError(f"{TILE_RULE}: {what} must be a 2-tuple, got {value!r:.60}")
    try:
        return operator.index(value[0]), operator.index(value[1])
    except TypeError:
        raise KernelLimitError(f"{TILE_RULE}: {what} values must be integers, got {value!r:.60}") from None


def pe_tile(m: Machine, stationary: Any, tile_position: Any, tile_size: Any,
            what: str) -> tuple[int, int, int, int] | None:
    """Check the PE tile of an ``nc_matmul`` (rule NKI-MATMUL-TILE: both arguments or neither, documented sizes,
    starts multiples of their sizes inside the 128 x 128 array, the stationary fitting the tile); returns (start_row,
    start_column, row_size, column_size), or None for the whole array. Counts a matmul in a smaller tile."""
    given = [v is not None and v != () for v in (tile_position, tile_size)]
    if not any(given):
        return None
    if not all(given):
        raise KernelLimitError(f"{TILE_RULE}: {what} sets only one of tile_position and tile_size; tiling mode "
                               "needs both")
    row, col = _pair(tile_position, f"{what} tile_position")
    rows, cols = _pair(tile_size, f"{what} tile_size")
    t = m.target
    allowed = t.pe_tile_sizes
    array = t.gemm_stationary_fmax
    for name, size in (("row_size", rows), ("column_size", cols)):
        if size not in allowed:
            raise KernelLimitError(f"{TILE_RULE}: {what} tile_size {name} {size} is not a tile size {t.name} "
                                   f"({t.core}) documents: {', '.join(map(str, allowed))}")
    for name, start, size in (("start_row", row, rows), ("start_column", col, cols)):
        if start < 0 or start % size or start + size > array:
            raise KernelLimitError(f"{TILE_RULE}: {what} tile_position {name} {start} is not a multiple of its tile "
                                   f"size {size} inside the {array} x {array} PE array")
    st = _sbuf_operand(stationary, f"{what} stationary")
    k, m_free = st.shape
    if k > rows or m_free > cols:
        raise KernelLimitError(f"{TILE_RULE}: {what} stationary [{k}, {m_free}] does not fit tile_size "
                               f"({rows}, {cols}): partitions <= row_size, free size <= column_size")
    if rows < array or cols < array:
        m.counters.pe_tiled_matmuls += 1
    return row, col, rows, cols


def check_tile_dst(m: Machine, dst: Tensor, tile: tuple[int, int, int, int] | None, what: str) -> None:
    """Rule NKI-MATMUL-TILE-DST: a matmul in a column tile (narrower than the array) writes the PSUM partitions of
    its columns."""
    if tile is None or tile[3] >= m.target.gemm_stationary_fmax:
        return
    start = dst.box[0][0]
    if start != tile[1]:
        raise KernelLimitError(f"{TILE_DST_RULE}: {what} runs in PE columns {tile[1]}..{tile[1] + tile[3] - 1} but "
                               f"writes dst {dst.describe()} from partition {start}; a column tile's results land on "
                               "the PSUM partitions of its columns")


def transpose(m: Machine, data: Any, what: str) -> np.ndarray:
    """Check a TensorE transpose of ``data`` [P, F] (P, F <= pmax); counts it; returns [F, P]."""
    d = _sbuf_operand(data, f"{what} data")
    p, f = d.shape
    pmax = m.target.pmax
    if p > pmax or f > pmax:
        raise KernelLimitError(f"{what}: data [{p}, {f}] exceeds pmax {pmax} in a dim "
                               f"(the result [{f}, {p}] puts F on partitions)")
    require_written(d, f"{what} data")
    m.counters.transposes += 1
    return d.data.T


def psum_dst(value: Any, what: str) -> Tensor:
    t = tensor_arg(value, f"{what} dst")
    if t.alloc.buffer != PSUM:
        raise KernelLimitError(f"{what} writes PSUM only (TensorE output), dst is {t.describe()}")
    return t


# --- Vector / Scalar engines ------------------------------------------------------------------
def binary(m: Machine, op: Any, data1: Any, data2: Any, what: str) -> np.ndarray:
    """Elementwise ``op(data1, data2)`` in fp32; not both operands in PSUM."""
    o = op_arg(op, "binary", what)
    a = on_chip(data1, f"{what} data1")
    b = on_chip(data2, f"{what} data2")
    if a.alloc.buffer == PSUM and b.alloc.buffer == PSUM:
        raise KernelLimitError(f"{what}: both inputs are in PSUM ({a.describe()}, {b.describe()}); "
                               "at most one tensor_tensor operand may be in PSUM")
    same_shape(a, b, what)
    require_written(a, f"{what} data1")
    require_written(b, f"{what} data2")
    m.counters.tensor_tensor_ops += 1
    return o.fn(as_f32(a), as_f32(b))


def _per_partition(value: Any, data: Tensor, what: str) -> Any:
    """A bias/scale operand: a Python number, or a [P, 1] on-chip tensor broadcast along free dims."""
    if isinstance(value, (int, float, np.floating, np.integer)):
        return np.float32(value)
    t = on_chip(value, what)
    if t.shape != (data.shape[0], 1):
        raise KernelError(f"{what} must be [{data.shape[0]}, 1] (one value per partition), "
                          f"got {list(t.shape)}")
    require_written(t, what)
    return as_f32(t).reshape((data.shape[0],) + (1,) * (data.ndim - 1))


def activation(m: Machine, op: Any, data: Any, bias: Any, scale: Any, what: str) -> np.ndarray:
    """``op(data * scale + bias)`` in fp32."""
    o = op_arg(op, "activation", what)
    d = on_chip(data, f"{what} data")
    require_written(d, f"{what} data")
    x = as_f32(d)
    if not (isinstance(scale, (int, float)) and scale == 1.0):
        x = x * _per_partition(scale, d, f"{what} scale")
    if bias is not None:
        x = x + _per_partition(bias, d, f"{what} bias")
    m.counters.activations += 1
    return o.fn(x)


def copy_source(m: Machine, src: Any, what: str) -> Tensor:
    """Check a tensor-copy source and count the copy."""
    s = on_chip(src, f"{what} src")
    require_written(s, f"{what} src")
    m.counters.tensor_copies += 1
    return s


def _per_partition_tile(value: Any, data: Tensor, what: str) -> np.ndarray:
    """A [P, 1] on-chip operand of ``data`` [P, ...] (tensor_scalar, reduce_res) as fp32 [P, 1]."""
    return _per_partition(value, data, what)


def bn_stats(m: Machine, data: Any, what: str) -> np.ndarray:
    """``nisa.bn_stats``: per partition, (count, mean, variance * count) of the even and of the odd elements of
    ``data`` [P, F] (F <= bn_stats_fmax), in fp32: [P, 6]."""
    d = on_chip(data, f"{what} data")
    if d.ndim != 2:
        raise KernelError(f"{what}: data must be a 2-D tile [P, F], got {list(d.shape)}")
    if d.shape[1] > m.target.bn_stats_fmax:
        raise KernelLimitError(f"{what}: {d.shape[1]} elements per partition exceed bn_stats_fmax "
                               f"{m.target.bn_stats_fmax} (rule NKI-BN-STATS-FMAX); call it per chunk and aggregate "
                               "with nisa.bn_aggr")
    require_written(d, f"{what} data")
    x = as_f32(d).astype(np.float64)
    out = np.zeros((d.shape[0], BN_STATS_WIDTH), dtype=np.float64)
    for half, part in enumerate((x[:, 0::2], x[:, 1::2])):
        n = part.shape[1]
        if n:
            mean = part.mean(axis=1)
            out[:, 3 * half] = n
            out[:, 3 * half + 1] = mean
            out[:, 3 * half + 2] = ((part - mean[:, None]) ** 2).sum(axis=1)
    m.counters.vector_ops += 1
    return out.astype(np.float32)


def bn_aggr(m: Machine, data: Any, what: str) -> np.ndarray:
    """``nisa.bn_aggr``: (mean, variance) per partition from one or more bn_stats results: [P, 2], fp32."""
    d = on_chip(data, f"{what} data")
    if d.ndim != 2 or d.shape[1] % 3:
        raise KernelError(f"{what}: data must be [P, 3k] (bn_stats results), got {list(d.shape)}")
    require_written(d, f"{what} data")
    triples = as_f32(d).astype(np.float64).reshape(d.shape[0], -1, 3)
    count = triples[:, :, 0].sum(axis=1)
    if np.any(count <= 0):
        raise KernelError(f"{what}: a partition's bn_stats results count no element")
    mean = (triples[:, :, 0] * triples[:, :, 1]).sum(axis=1) / count
    m2 = (triples[:, :, 2] + triples[:, :, 0] * (triples[:, :, 1] - mean[:, None]) ** 2).sum(axis=1)
    m.counters.vector_ops += 1
    return np.stack([mean, m2 / count], axis=1).astype(np.float32)


def tensor_scalar(m: Machine, data: Any, op0: Any, operand0: Any, op1: Any, operand1: Any,
                  what: str) -> np.ndarray:
    """``(data op0 operand0) op1 operand1``, operands numbers or [P, 1] tiles broadcast along the free axis."""
    first = op_arg(op0, "binary", f"{what} op0")
    d = on_chip(data, f"{what} data")
    require_written(d, f"{what} data")
    x = first.fn(as_f32(d), _per_partition(operand0, d, f"{what} operand0"))
    if op1 is not None:
        second = op_arg(op1, "binary", f"{what} op1")
        if operand1 is None:
            raise KernelError(f"{what}: op1 given without operand1")
        x = second.fn(x, _per_partition(operand1, d, f"{what} operand1"))
    elif operand1 is not None:
        raise KernelError(f"{what}: operand1 given without op1")
    m.counters.vector_ops += 1
    return x


def activation_reduce(m: Machine, op: Any, data: Any, reduce_op: Any, bias: Any, scale: Any,
                      what: str) -> tuple[np.ndarray, np.ndarray]:
    """``nisa.activation_reduce``: the activation and the sum of its result along the free axis per partition
    ([P, 1]); the Scalar Engine's reduction registers only add (nl.add)."""
    r = op_arg(reduce_op, "binary", f"{what} reduce_op")
    if r.name != "add":
        raise UnsupportedAPIError(f"{what}: reduce_op=nl.{r.name}; the Scalar Engine reduction only adds "
                                  "(nl.add; rule NKI-ACTIVATION-REDUCE)")
    result = activation(m, op, data, bias, scale, what)
    return result, result.reshape(result.shape[0], -1).sum(axis=1, dtype=np.float32)[:, None]
