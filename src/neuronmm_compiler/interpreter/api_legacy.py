"""The NKI 0.1 dialect: ``import neuronxcc.nki as nki``, ``neuronxcc.nki.language as nl``,
``neuronxcc.nki.isa as nisa``.

Ops return values (temporaries: on-chip, not counted against capacity). Buffers are written with
``buf[idx] = value`` and PSUM accumulates with ``psum[idx] += nisa.nc_matmul(...)`` (see
:meth:`Machine.assign` and :meth:`Machine.accumulate`).
"""

from __future__ import annotations

from typing import Any

from ..errors import KernelError, KernelLimitError, UnsupportedAPIError
from . import ops
from .api_nki import language_attrs
from .machine import FLOAT32, Machine, ParDim
from .modules import StandInModule, api, jit
from .tensor import HBM, PSUM, SBUF, Tensor, require_written


def _hbm_source(m: Machine, src: Any, what: str) -> Tensor:
    s = ops.tensor_arg(src, f"{what} src")
    if s.alloc.buffer == PSUM:
        raise KernelLimitError(f"DMA cannot access PSUM: {what} reads {s.describe()}")
    if s.alloc.buffer != HBM:
        raise UnsupportedAPIError(f"{what} loads from HBM only, got {s.describe()}")
    if s.ndim == 0:
        raise KernelError(f"{what}: cannot load a 0-d view {s.describe()}")
    require_written(s, f"{what} source")
    return s


def _legacy_language(m: Machine) -> dict[str, Any]:
    attrs = language_attrs(m)
    counters = m.counters

    def par_dim(n: int) -> ParDim:
        return ParDim(n)

    @api("nl.load", m)
    def load(src: Any, dtype: Any = None) -> Tensor:
        s = _hbm_source(m, src, "nl.load")
        dt = s.dtype if dtype is None else m.dtype(dtype)
        value = m.temporary(s.data, dt, SBUF, "dma")
        s.alloc.bytes_read += s.data.nbytes
        counters.record_dma(value.data.nbytes // value.shape[0])
        return value

    @api("nl.load_transpose2d", m)
    def load_transpose2d(src: Any) -> Tensor:
        s = _hbm_source(m, src, "nl.load_transpose2d")
        if s.ndim != 2:
            raise KernelError(f"nl.load_transpose2d needs a 2-D source, got {list(s.shape)}")
        value = m.temporary(s.data.T, s.dtype, SBUF, "dma")
        s.alloc.bytes_read += s.data.nbytes
        counters.record_dma(value.data.nbytes // value.shape[0])
        counters.dma_transposes += 1
        return value

    @api("nl.store", m)
    def store(dst: Any, value: Any) -> None:
        ops.dma(m, ops.tensor_arg(dst, "nl.store dst"), ops.tensor_arg(value, "nl.store value"),
                "nl.store", allow_cast=True)

    def binary_call(op: ops.Op) -> Any:
        @api(f"nl.{op.name}", m)
        def call(x: Any, y: Any, dtype: Any = None) -> Tensor:
            result = ops.binary(m, op, x, y, f"nl.{op.name}")
            if dtype is None:
                dtype = x.dtype if x.dtype == y.dtype else FLOAT32
            return m.temporary(result, m.dtype(dtype), SBUF, "engine")
        return call

    def activation_call(op: ops.Op) -> Any:
        @api(f"nl.{op.name}", m)
        def call(x: Any, dtype: Any = None) -> Tensor:
            result = ops.activation(m, op, x, None, 1.0, f"nl.{op.name}")
            return m.temporary(result, x.dtype if dtype is None else m.dtype(dtype), SBUF, "engine")
        return call

    @api("nl.copy", m)
    def copy(x: Any, dtype: Any = None) -> Tensor:
        s = ops.copy_source(m, x, "nl.copy")
        return m.temporary(s.data, s.dtype if dtype is None else m.dtype(dtype), SBUF, "engine")

    for op in list(attrs.values()):
        if isinstance(op, ops.Op):
            if op.name == "copy":
                op.call = copy
            else:
                op.call = binary_call(op) if op.kind == "binary" else activation_call(op)
    attrs.update({"par_dim": par_dim, "load": load, "load_transpose2d": load_transpose2d, "store": store})
    return attrs


def _legacy_isa(m: Machine) -> dict[str, Any]:
    @api("nisa.nc_matmul", m)
    def nc_matmul(stationary: Any, moving: Any, tile_position: Any = (), tile_size: Any = ()) -> Tensor:
        # NKI 0.1 documents PE tiling with the same keywords (nc_matmul, PE tiling); the result is a new tile the
        # compiler places, so NKI-MATMUL-TILE-DST has no dst to check here
        ops.pe_tile(m, stationary, tile_position, tile_size, "nisa.nc_matmul")
        return m.temporary(ops.matmul(m, stationary, moving, "nisa.nc_matmul"), FLOAT32, PSUM, "pe")

    @api("nisa.nc_transpose", m)
    def nc_transpose(x: Any) -> Tensor:
        result = ops.transpose(m, x, "nisa.nc_transpose")
        return m.temporary(result, x.dtype, PSUM, "pe")

    @api("nisa.tensor_tensor", m)
    def tensor_tensor(data1: Any, data2: Any, op: Any, dtype: Any = None) -> Tensor:
        result = ops.binary(m, op, data1, data2, "nisa.tensor_tensor")
        if dtype is None:
            dtype = data1.dtype if data1.dtype == data2.dtype else FLOAT32
        return m.temporary(result, m.dtype(dtype), SBUF, "engine")

    @api("nisa.activation", m)
    def activation(op: Any, data: Any, bias: Any = None, scale: Any = 1.0, dtype: Any = None) -> Tensor:
        result = ops.activation(m, op, data, bias, scale, "nisa.activation")
        return m.temporary(result, data.dtype if dtype is None else m.dtype(dtype), SBUF, "engine")

    return {"nc_matmul": nc_matmul, "nc_transpose": nc_transpose, "tensor_tensor": tensor_tensor,
            "activation": activation}


def build_modules(m: Machine) -> dict[str, StandInModule]:
    """The ``neuronxcc``, ``neuronxcc.nki``, ``.language`` and ``.isa`` stand-ins bound to ``m``."""
    language = StandInModule("neuronxcc.nki.language", _legacy_language(m))
    isa = StandInModule("neuronxcc.nki.isa", _legacy_isa(m))
    nki = StandInModule("neuronxcc.nki", {"jit": jit, "language": language, "isa": isa})
    top = StandInModule("neuronxcc", {"nki": nki})
    return {"neuronxcc": top, "neuronxcc.nki": nki, "neuronxcc.nki.language": language,
            "neuronxcc.nki.isa": isa}
