"""The NKI 0.3+ dialect: ``import nki``, ``nki.language as nl``, ``nki.isa as nisa``, and ``nki.lnc``.

Every ISA call writes into ``dst=``; nothing returns a value. The exchange between the programs of a logical core
has both spellings: ``nisa.sendrecv(..., pipe_id)`` (NKI 0.3 to 0.7; deprecated by NKI 0.8.0) and
``nki.lnc.sendrecv(...)`` without ``pipe_id`` (NKI 0.8.0, Neuron 2.34: the nki.lnc API page, "LNC communication").
Which release a file may use which in is the rule book's to say (NKI-ISA-LNC-DEPRECATED, NKI-LNC-MODULE); both run
here the same way (interpreter/lnc.py). ``core_barrier`` is in neither namespace here: nmmc emits none.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError, KernelLimitError, UnsupportedAPIError
from . import mx, ops, reductions, scale_units
from . import perf_mode as perf_modes
from .machine import (
    BFLOAT16,
    FLOAT8_E4M3,
    FLOAT8_E4M3FN,
    FLOAT8_E5M2,
    FLOAT16,
    FLOAT32,
    HBM_BUFFERS,
    PSUM_BUFFER,
    SBUF_BUFFER,
    Machine,
)
from .modules import StandInModule, api, ds, jit, plain_range, tile_size
from .tensor import SBUF, Tensor, mark_written, require_written, write


def language_attrs(m: Machine) -> dict[str, Any]:
    """What ``nki.language`` and ``neuronxcc.nki.language`` share."""

    @api("nl.ndarray", m)
    def ndarray(shape: Any, dtype: Any, buffer: Any = SBUF_BUFFER, name: str = "") -> Tensor:
        return m.allocate(shape, dtype, buffer, name, zero=False)

    @api("nl.zeros", m)
    def zeros(shape: Any, dtype: Any, buffer: Any = SBUF_BUFFER, name: str = "") -> Tensor:
        return m.allocate(shape, dtype, buffer, name, zero=True)

    @api("nl.program_id", m)
    def program_id(axis: Any = 0) -> int:
        if axis != 0:
            raise UnsupportedAPIError(f"nl.program_id({axis!r}): a logical core's programs form one axis, 0")
        return m.program_id

    @api("nl.num_programs", m)
    def num_programs(axes: Any = 0) -> int:
        if axes not in (0, None):
            raise UnsupportedAPIError(f"nl.num_programs({axes!r}): a logical core's programs form one axis, 0")
        return m.programs

    attrs: dict[str, Any] = {
        "ndarray": ndarray, "zeros": zeros, "ds": ds, "tile_size": tile_size(m.target),
        "program_id": program_id, "num_programs": num_programs,
        "bfloat16": BFLOAT16, "float32": FLOAT32, "float16": FLOAT16,
        "float8_e4m3": FLOAT8_E4M3, "float8_e5m2": FLOAT8_E5M2, "float8_e4m3fn": FLOAT8_E4M3FN,
        "sbuf": SBUF_BUFFER, "psum": PSUM_BUFFER,
        "affine_range": plain_range, "sequential_range": plain_range, "static_range": plain_range,
    }
    attrs.update(HBM_BUFFERS)
    attrs.update(ops.make_ops())
    return attrs


def isa_attrs(m: Machine) -> dict[str, Any]:
    """``nki.isa`` of the 0.3 dialect."""
    counters = m.counters

    @api("nisa.dma_copy", m)
    def dma_copy(dst: Any, src: Any) -> None:
        out, source = ops.tensor_arg(dst, "nisa.dma_copy dst"), ops.tensor_arg(src, "nisa.dma_copy src")
        ops.dma(m, out, source, "nisa.dma_copy")
        if m.units is not None:
            m.units.dma(out, source, transpose=False, what="nisa.dma_copy")

    @api("nisa.dma_transpose", m)
    def dma_transpose(dst: Any, src: Any) -> None:
        out, source = ops.tensor_arg(dst, "nisa.dma_transpose dst"), ops.tensor_arg(src, "nisa.dma_transpose src")
        ops.dma(m, out, source, "nisa.dma_transpose", transpose=True)
        if m.units is not None:
            m.units.dma(out, source, transpose=True, what="nisa.dma_transpose")

    @api("nisa.sendrecv", m)
    def sendrecv(src: Any, dst: Any, send_to_rank: Any, recv_from_rank: Any, pipe_id: Any = 0,
                 dma_engine: Any = None) -> None:
        exchange(m, src, dst, send_to_rank, recv_from_rank, int(pipe_id), "nisa.sendrecv")

    @api("nisa.nc_matmul", m)
    def nc_matmul(dst: Any, stationary: Any, moving: Any, accumulate: bool | None = None, tile_position: Any = (),
                  tile_size: Any = (), perf_mode: Any = perf_modes.PERF_NONE) -> None:
        out = ops.psum_dst(dst, "nisa.nc_matmul")
        if out.dtype != FLOAT32:
            raise KernelLimitError(f"nisa.nc_matmul dst must be float32 (PSUM accumulates in fp32), "
                                   f"got {out.describe()}")
        tile = ops.pe_tile(m, stationary, tile_position, tile_size, "nisa.nc_matmul")
        ops.check_tile_dst(m, out, tile, "nisa.nc_matmul")
        perf_modes.check_fp8_formats(m, stationary, moving, "nisa.nc_matmul")
        perf_modes.check_perf_mode(m, perf_mode, stationary, moving, tile, "nisa.nc_matmul")
        result = ops.matmul(m, stationary, moving, "nisa.nc_matmul")
        if out.shape != result.shape:
            raise KernelError(f"nisa.nc_matmul: dst shape {list(out.shape)} != [M, N] = "
                              f"{list(result.shape)} of stationary.T @ moving")
        accumulates = accumulate is True
        if accumulate is None:
            alloc = out.alloc
            if alloc.fully_written:
                np.add(out.data, result, out=out.data)
                accumulates = True
            else:
                mask = alloc.written[out.key]
                if mask.all():
                    np.add(out.data, result, out=out.data)
                    accumulates = True
                elif not mask.any():
                    out.data[...] = result
                else:  # the hardware has one accumulate flag per instruction, not one per element
                    raise KernelError(f"nisa.nc_matmul into {out.describe()}, which is only partly written: "
                                      "one instruction either accumulates into the whole tile or overwrites it; "
                                      "write the tile whole first or pass accumulate=False")
                mark_written(out)
        elif accumulate is True:
            require_written(out, "nisa.nc_matmul dst (accumulate=True)")
            np.add(out.data, result, out=out.data)
        elif accumulate is False:
            write(out, result)
        else:
            raise UnsupportedAPIError(f"nisa.nc_matmul accumulate={accumulate!r}: use None, True or False")
        if m.units is not None:
            m.units.matmul(out, stationary, moving, accumulates=accumulates, what="nisa.nc_matmul")

    @api("nisa.nc_transpose", m)
    def nc_transpose(dst: Any, data: Any) -> None:
        out = ops.psum_dst(dst, "nisa.nc_transpose")
        result = ops.transpose(m, data, "nisa.nc_transpose")
        if out.shape != result.shape:
            raise KernelError(f"nisa.nc_transpose: dst shape {list(out.shape)} != [F, P] = "
                              f"{list(result.shape)}")
        if out.dtype != data.dtype:
            raise KernelError(f"nisa.nc_transpose: dst dtype {out.dtype} must equal the data dtype {data.dtype} "
                              "(a TensorE transpose does not cast)")
        write(out, result)
        if m.units is not None:
            m.units.copy(out, data, transpose=True)

    @api("nisa.tensor_copy", m)
    def tensor_copy(dst: Any, src: Any) -> None:
        out = ops.on_chip(dst, "nisa.tensor_copy dst")
        s = ops.copy_source(m, src, "nisa.tensor_copy")
        ops.same_shape(out, s, "nisa.tensor_copy")
        write(out, s.data)
        if m.units is not None:
            m.units.copy(out, s)

    @api("nisa.tensor_tensor", m)
    def tensor_tensor(dst: Any, data1: Any, data2: Any, op: Any) -> None:
        out = ops.on_chip(dst, "nisa.tensor_tensor dst")
        result = ops.binary(m, op, data1, data2, "nisa.tensor_tensor")
        if out.shape != result.shape:
            raise KernelError(f"nisa.tensor_tensor: dst shape {list(out.shape)} != input shape "
                              f"{list(result.shape)}")
        write(out, result)
        if m.units is not None:
            m.units.binary(out, op.name, data1, data2, "nisa.tensor_tensor")

    @api("nisa.activation", m)
    def activation(dst: Any, op: Any, data: Any, bias: Any = None, scale: Any = 1.0) -> None:
        out = ops.on_chip(dst, "nisa.activation dst")
        result = ops.activation(m, op, data, bias, scale, "nisa.activation")
        if out.shape != result.shape:
            raise KernelError(f"nisa.activation: dst shape {list(out.shape)} != data shape "
                              f"{list(result.shape)}")
        write(out, result)
        if m.units is not None:
            m.units.activation([out], op.name, data, bias, scale, "nisa.activation")

    @api("nisa.activation_reduce", m)
    def activation_reduce(dst: Any, op: Any, data: Any, reduce_op: Any, reduce_res: Any, bias: Any = None,
                          scale: Any = 1.0) -> None:
        out = ops.on_chip(dst, "nisa.activation_reduce dst")
        res = ops.on_chip(reduce_res, "nisa.activation_reduce reduce_res")
        result, total = ops.activation_reduce(m, op, data, reduce_op, bias, scale, "nisa.activation_reduce")
        if out.shape != result.shape:
            raise KernelError(f"nisa.activation_reduce: dst shape {list(out.shape)} != data shape "
                              f"{list(result.shape)}")
        if res.shape != total.shape:
            raise KernelError(f"nisa.activation_reduce: reduce_res must be [{total.shape[0]}, 1] (one value per "
                              f"partition of data), got {list(res.shape)}")
        write(out, result)
        write(res, total)
        if m.units is not None:
            m.units.activation([out, res], op.name, data, bias, scale, "nisa.activation_reduce")

    @api("nisa.bn_stats", m)
    def bn_stats(dst: Any, data: Any) -> None:
        out = ops.on_chip(dst, "nisa.bn_stats dst")
        result = ops.bn_stats(m, data, "nisa.bn_stats")
        if out.shape != result.shape:
            raise KernelError(f"nisa.bn_stats: dst must be [{result.shape[0]}, {ops.BN_STATS_WIDTH}] (six statistics "
                              f"per partition), got {list(out.shape)}")
        write(out, result)
        if m.units is not None:
            m.units.statistics(out, data, "nisa.bn_stats")

    @api("nisa.bn_aggr", m)
    def bn_aggr(dst: Any, data: Any) -> None:
        out = ops.on_chip(dst, "nisa.bn_aggr dst")
        result = ops.bn_aggr(m, data, "nisa.bn_aggr")
        if out.shape != result.shape:
            raise KernelError(f"nisa.bn_aggr: dst must be [{result.shape[0]}, {ops.BN_AGGR_WIDTH}] (mean, variance "
                              f"per partition), got {list(out.shape)}")
        write(out, result)
        if m.units is not None:
            m.units.statistics(out, data, "nisa.bn_aggr")

    @api("nisa.tensor_scalar", m)
    def tensor_scalar(dst: Any, data: Any, op0: Any, operand0: Any, reverse0: bool = False, op1: Any = None,
                      operand1: Any = None, reverse1: bool = False) -> None:
        if reverse0 or reverse1:
            raise UnsupportedAPIError("nisa.tensor_scalar reverse0/reverse1 are not in the subset nmmc emits")
        out = ops.on_chip(dst, "nisa.tensor_scalar dst")
        result = ops.tensor_scalar(m, data, op0, operand0, op1, operand1, "nisa.tensor_scalar")
        if out.shape != result.shape:
            raise KernelError(f"nisa.tensor_scalar: dst shape {list(out.shape)} != data shape {list(result.shape)}")
        write(out, result)
        if m.units is not None:
            steps = [(op0.name, operand0)] + ([(op1.name, operand1)] if op1 is not None else [])
            m.units.tensor_scalar(out, data, steps, "nisa.tensor_scalar")

    @api("nisa.tensor_scalar_reduce", m)
    def tensor_scalar_reduce(dst: Any, data: Any, op0: Any, operand0: Any, reduce_op: Any, reduce_res: Any) -> None:
        out = ops.on_chip(dst, "nisa.tensor_scalar_reduce dst")
        res = ops.on_chip(reduce_res, "nisa.tensor_scalar_reduce reduce_res")
        result, total = reductions.tensor_scalar_reduce(m, data, op0, operand0, reduce_op, "nisa.tensor_scalar_reduce")
        if out.shape != result.shape:
            raise KernelError(f"nisa.tensor_scalar_reduce: dst shape {list(out.shape)} != data shape "
                              f"{list(result.shape)}")
        if res.shape != total.shape:
            raise KernelError(f"nisa.tensor_scalar_reduce: reduce_res must be [{total.shape[0]}, 1] (one value per "
                              f"partition of data), got {list(res.shape)}")
        write(out, result)
        write(res, total)
        if m.units is not None:
            m.units.absmax(out, res, data, "nisa.tensor_scalar_reduce")

    @api("nisa.tensor_reduce", m)
    def tensor_reduce(dst: Any, op: Any, data: Any, axis: Any) -> None:
        out = ops.on_chip(dst, "nisa.tensor_reduce dst")
        result = reductions.tensor_reduce(m, op, data, axis, "nisa.tensor_reduce")
        if out.shape != result.shape:
            raise KernelError(f"nisa.tensor_reduce: dst must be [{result.shape[0]}, 1] (one value per partition), "
                              f"got {list(out.shape)}")
        write(out, result)
        if m.units is not None:
            m.units.reduce(out, data, "nisa.tensor_reduce")

    @api("nisa.memset", m)
    def memset(dst: Any, value: Any) -> None:
        out = ops.on_chip(dst, "nisa.memset dst")
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise UnsupportedAPIError(f"nisa.memset value must be a number, got {value!r:.60}")
        counters.memsets += 1
        write(out, np.float32(value))
        if m.units is not None:
            m.units.constant(out, float(value))

    return {
        "dma_copy": dma_copy, "dma_transpose": dma_transpose, "nc_matmul": nc_matmul,
        "nc_transpose": nc_transpose, "tensor_copy": tensor_copy, "tensor_tensor": tensor_tensor,
        "activation": activation, "memset": memset, "sendrecv": sendrecv,
        "activation_reduce": activation_reduce, "bn_stats": bn_stats, "bn_aggr": bn_aggr,
        "tensor_scalar": tensor_scalar, "tensor_scalar_reduce": tensor_scalar_reduce, "tensor_reduce": tensor_reduce,
        "matmul_perf_mode": perf_modes.MATMUL_PERF_MODE,
    }


def exchange(m: Machine, src: Any, dst: Any, send_to_rank: Any, recv_from_rank: Any, pipe: int, what: str) -> None:
    """One program's side of a sendrecv (``what``: the spelling called): src and dst in SBUF, on a logical core of
    two programs, each naming the other (interpreter/lnc.py pairs it with the other program's)."""
    src_t, dst_t = ops.tensor_arg(src, f"{what} src"), ops.tensor_arg(dst, f"{what} dst")
    for t, role in ((src_t, "src"), (dst_t, "dst")):
        if t.alloc.buffer != SBUF:
            raise KernelLimitError(f"{what} {role} must be in SBUF, got {t.describe()}")
    if m.turns is None:
        raise KernelLimitError(f"{what} exchanges with the other program of a logical core; this kernel runs "
                               "on one core (LNC=1: nothing to exchange with)")
    if send_to_rank != recv_from_rank:
        raise UnsupportedAPIError(f"{what}: send_to_rank={send_to_rank!r}, recv_from_rank="
                                  f"{recv_from_rank!r}; with two programs both name the other one")
    require_written(src_t, f"{what} src")
    m.counters.record_dma(src_t.data.nbytes // src_t.shape[0])
    units = None if m.units is None else scale_units.units_of(src_t)
    m.turns.sendrecv(m.program_id, src_t, dst_t, int(send_to_rank), pipe, units=units)


def lnc_attrs(m: Machine) -> dict[str, Any]:
    """``nki.lnc`` (NKI 0.8.0): ``sendrecv`` without ``pipe_id`` (messages pair by program order, which the
    interpreter's exchanges follow; nisa.sendrecv's pipe 0 is the same queue)."""

    @api("nki.lnc.sendrecv", m)
    def sendrecv(src: Any, dst: Any, send_to_rank: Any, recv_from_rank: Any) -> None:
        exchange(m, src, dst, send_to_rank, recv_from_rank, 0, "nki.lnc.sendrecv")

    return {"sendrecv": sendrecv}


def build_modules(m: Machine) -> dict[str, StandInModule]:
    """The ``nki``, ``nki.language``, ``nki.isa`` and ``nki.lnc`` stand-ins bound to ``m``."""
    language = StandInModule("nki.language", {**language_attrs(m), **reductions.unary_ops()})
    isa = StandInModule("nki.isa", isa_attrs(m))
    lnc = StandInModule("nki.lnc", lnc_attrs(m))
    language.__dict__.update(mx.language_attrs())  # the MX dtypes and instructions (interpreter/mx.py)
    isa.__dict__.update(mx.isa_attrs(m))
    top = StandInModule("nki", {"jit": jit, "language": language, "isa": isa, "lnc": lnc})
    return {"nki": top, "nki.language": language, "nki.isa": isa, "nki.lnc": lnc}

