"""The cost model's counts of the MX instructions (kernel_ir/mx.py; docs/mx.md, "Cost"), registered with
:mod:`.counts` when the package is imported: ``nc_matmul_mx`` at the MX rate, ``quantize_mx`` on the Vector Engine,
the interleaving copy as any engine copy, and the interleaved activation load as a DMA of single-element runs."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..ir.mx import MX_PACK
from ..kernel_ir.mx import Interleave, InterleavedLoad, MatmulMx, QuantizeMx
from ..targets import MX_MATMUL_SPEEDUP, MX_QUANTIZE_ELEMENTS_PER_CYCLE
from .counts import (
    DmaClass,
    ProgramCounts,
    _add_engine_op,
    _engine_cycles,
    _extents,
    _free,
    _psum_use,
    register,
)
from .formulas import matmul_cycles
from .params import ModelParams

__all__: list[str] = []


def _add_matmul_mx(counts: ProgramCounts, stmt: MatmulMx, env: Mapping[str, int], mult: int, params: ModelParams,
                   pe_columns: int | None) -> None:
    # nc_matmul_mx (kernel_ir/mx.py): each of the K partitions contracts 4 packed elements, four times the FLOPs of an
    # nc_matmul of the same tiles in the time of one (targets.py, MX_MATMUL_SPEEDUP: cycles x 4 / 4), the nc_matmul's
    # max(N, min_cycles) floor assumed (no page gives one for MX); it reads both scale tiles besides (1 byte each)
    k, m = _extents(stmt.stationary, env)
    _, n = _extents(stmt.moving, env)
    flops = mult * 2 * k * MX_PACK * m * n
    counts.matmuls += mult
    counts.flops += flops
    counts.mx_flops += flops
    counts.matmul_moving_columns += mult * n
    cycles = mult * matmul_cycles(n, params.matmul_min_cycles, MX_PACK / MX_MATMUL_SPEEDUP)
    counts.pe_cycles += cycles
    _psum_use(counts, stmt.dst.buffer.name).pe_cycles += cycles
    per_partition = m * (stmt.stationary.buffer.itemsize + 1) + n * (stmt.moving.buffer.itemsize + 1)
    counts.sbuf_read_bytes_by_pe += mult * k * per_partition


def _add_quantize_mx(counts: ProgramCounts, stmt: QuantizeMx, env: Mapping[str, int], mult: int, params: ModelParams,
                     pe_columns: int | None) -> None:
    # nisa.quantize_mx: 4 input elements per partition per cycle on the VectorEngine (targets.py,
    # MX_QUANTIZE_ELEMENTS_PER_CYCLE), one input and two outputs (the data and its scales: one access more)
    _, free = _free(stmt.src, env)
    cycles = _engine_cycles(-(-free // MX_QUANTIZE_ELEMENTS_PER_CYCLE), 1, params) + params.engine_access_cycles
    counts.vector_cycles += mult * cycles


def _add_interleaved_load(counts: ProgramCounts, stmt: InterleavedLoad, env: Mapping[str, int], mult: int,
                          params: ModelParams, pe_columns: int | None) -> None:
    # an activation block loaded into quantize_mx's layout through an access pattern whose runs are single elements:
    # priced at one element per partition per run (the efficiency of the curve's smallest transfers; kernel_ir/mx.py)
    nbytes = math.prod(_extents(stmt.src, env)) * stmt.src.buffer.itemsize
    counts.hbm_bytes_read[stmt.src.buffer.name] = counts.hbm_bytes_read.get(stmt.src.buffer.name, 0) + mult * nbytes
    cls = counts.dma.setdefault(("load", False, stmt.src.buffer.itemsize), DmaClass())
    cls.count += mult
    cls.bytes += mult * nbytes


register(MatmulMx, _add_matmul_mx)
register(QuantizeMx, _add_quantize_mx, engine_work=True)
register(Interleave, _add_engine_op, engine_work=True)
register(InterleavedLoad, _add_interleaved_load)
