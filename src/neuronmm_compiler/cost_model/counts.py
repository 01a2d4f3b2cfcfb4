"""Count what a loop-nest program does: bytes per HBM tensor, DMA transfers with their bytes per
partition, TensorEngine and Vector/Scalar instructions, and what precedes the first matmul or
follows the last one (the prologue and epilogue that no engine overlap can hide).

Counting uses the closed-form evaluation of the program's loops (kernel_ir/program.py, instruction_counts), so the
figures equal what the interpreter measures running the emitted kernel (tests assert it) at a fraction of the cost.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..kernel_ir.program import (
    Activation,
    ActivationReduce,
    Alloc,
    BnAggr,
    BnStats,
    Comment,
    Copy,
    DmaCopy,
    Loop,
    Matmul,
    Memset,
    PeTranspose,
    Program,
    Ref,
    SendRecv,
    Stmt,
    TensorReduce,
    TensorScalar,
    TensorScalarReduce,
    TensorTensor,
    instruction_counts,
    visit_counts,
)
from .formulas import engine_us, matmul_cycles
from .params import ModelParams


def _extents(ref: Ref, env: Mapping[str, int]) -> list[int]:
    return [e.evaluate(env) for e in ref.shape]


@dataclass
class DmaClass:
    """Transfers that share direction, transposition and bytes per partition."""

    count: int = 0
    bytes: int = 0


@dataclass
class PsumUse:
    """One PSUM buffer's traffic: how often it is allocated, the TensorEngine cycles writing it, and the
    Vector/Scalar cycles and instructions reading it (its evictions)."""

    allocations: int = 0
    copies: int = 0
    pe_cycles: int = 0
    vector_cycles: int = 0
    scalar_cycles: int = 0
    evictions: int = 0


@dataclass
class ProgramCounts:
    """Aggregate instruction and traffic counts of one program."""

    hbm_bytes_read: dict[str, int] = field(default_factory=dict)
    hbm_bytes_written: dict[str, int] = field(default_factory=dict)
    dma: dict[tuple[str, bool, int], DmaClass] = field(default_factory=dict)  # (dir, transpose, bpp)
    matmuls: int = 0
    #: of ``flops``, those of nc_matmul_mx instructions (at the MX rate: the lower bound's, model.py)
    mx_flops: int = 0
    #: matmuls in a PE tile narrower than the array (nc_matmul tile_position / tile_size)
    pe_tiled_matmuls: int = 0
    flops: int = 0
    matmul_moving_columns: int = 0
    pe_cycles: int = 0
    transposes: int = 0
    vector_cycles: int = 0
    scalar_cycles: int = 0
    psum_evictions: int = 0
    sbuf_read_bytes_by_pe: int = 0
    psum_to_sbuf_bytes: int = 0
    psum: dict[str, PsumUse] = field(default_factory=dict)
    #: sendrecv exchanges with the other program of a logical core, and the bytes this program sends in them
    exchanges: int = 0
    exchange_bytes: int = 0

    @property
    def dma_transfers(self) -> int:
        return sum(c.count for c in self.dma.values())

    @property
    def dma_transposes(self) -> int:
        return sum(c.count for key, c in self.dma.items() if key[1])

    @property
    def total_hbm_bytes_read(self) -> int:
        return sum(self.hbm_bytes_read.values())

    @property
    def total_hbm_bytes_written(self) -> int:
        return sum(self.hbm_bytes_written.values())


def _engine_cycles(free_elems: int, inputs: int, params: ModelParams) -> float:
    per_element = min(inputs, 1) + max(inputs - 1, 0) * params.engine_extra_input_cycles
    return per_element * free_elems + params.engine_instruction_cycles + params.engine_access_cycles * (inputs + 1)


def _free(ref: Ref, env: Mapping[str, int]) -> tuple[int, int]:
    """(partitions, elements per partition) of a region."""
    extents = _extents(ref, env)
    return extents[0], math.prod(extents[1:])


def add_statement(counts: ProgramCounts, stmt: Stmt, env: Mapping[str, int], mult: int, params: ModelParams,
                  pe_columns: int | None = None) -> None:
    """Account ``mult`` executions of one leaf statement (``pe_columns``: the PE array's columns, the target's
    ``gemm_stationary_fmax``; a matmul in a narrower column tile then takes its share of the array's time,
    :func:`~.formulas.matmul_cycles`; None: every matmul as if it held the whole array)."""
    _adder(stmt)(counts, stmt, env, mult, params, pe_columns)


def _add_dma(counts: ProgramCounts, stmt: DmaCopy, env: Mapping[str, int], mult: int, params: ModelParams,
             pe_columns: int | None) -> None:
    load = stmt.is_load
    hbm, sbuf = (stmt.src, stmt.dst) if load else (stmt.dst, stmt.src)
    extents = _extents(hbm, env)
    nbytes = math.prod(extents) * hbm.buffer.itemsize
    _, per_partition = _free(sbuf, env)
    if stmt.slabs:  # one transfer of KT slabs: a partition's KT rows are apart in HBM, so the efficiency is that
        # of one row's bytes (conservative: AWS's chart is per transfer, trainium-facts.md; kernel_ir/coalesce.py)
        per_partition = extents[1]
    bpp = per_partition * sbuf.buffer.itemsize
    book = counts.hbm_bytes_read if load else counts.hbm_bytes_written
    book[hbm.buffer.name] = book.get(hbm.buffer.name, 0) + mult * nbytes
    key = ("load" if load else "store", stmt.transpose, bpp)
    cls = counts.dma.get(key)
    if cls is None:
        cls = counts.dma[key] = DmaClass()
    cls.count += mult
    cls.bytes += mult * nbytes


def _psum_use(counts: ProgramCounts, name: str) -> PsumUse:
    if (use := counts.psum.get(name)) is None:
        use = counts.psum[name] = PsumUse()
    return use


def _add_matmul(counts: ProgramCounts, stmt: Matmul, env: Mapping[str, int], mult: int, params: ModelParams,
                pe_columns: int | None) -> None:
    k, m = _extents(stmt.stationary, env)
    _, n = _extents(stmt.moving, env)
    factor = params.matmul_fp32_factor if stmt.moving.buffer.dtype == "float32" else 1
    counts.matmuls += mult
    counts.flops += mult * 2 * k * m * n
    counts.matmul_moving_columns += mult * n
    columns = None
    if stmt.tile is not None and pe_columns is not None and stmt.tile.cols < pe_columns:
        counts.pe_tiled_matmuls += mult
        columns = stmt.tile.cols
    cycles = mult * matmul_cycles(n, params.matmul_min_cycles, factor, columns, pe_columns,
                                  stmt.perf_mode == "double_row")
    counts.pe_cycles += cycles
    _psum_use(counts, stmt.dst.buffer.name).pe_cycles += cycles
    per_partition = m * stmt.stationary.buffer.itemsize + n * stmt.moving.buffer.itemsize
    counts.sbuf_read_bytes_by_pe += mult * k * per_partition


def _add_pe_transpose(counts: ProgramCounts, stmt: PeTranspose, env: Mapping[str, int], mult: int,
                      params: ModelParams, pe_columns: int | None) -> None:
    p, f = _extents(stmt.src, env)
    cycles = mult * max(p, min(params.transpose_min_cycles, f))
    counts.transposes += mult
    counts.pe_cycles += cycles
    if stmt.dst.buffer.memory == "psum":
        _psum_use(counts, stmt.dst.buffer.name).pe_cycles += cycles


def _add_engine_op(counts: ProgramCounts, stmt: Copy | TensorTensor | Activation, env: Mapping[str, int], mult: int,
                   params: ModelParams, pe_columns: int | None) -> None:
    partitions, free = _free(stmt.dst, env)
    inputs = 2 if isinstance(stmt, TensorTensor) else 1
    cycles = _engine_cycles(free, inputs, params)
    sources = (stmt.lhs, stmt.rhs) if isinstance(stmt, TensorTensor) else (stmt.src,)
    psum = next((src.buffer.name for src in sources if src.buffer.memory == "psum"), None)
    if psum is not None:
        counts.psum_evictions += mult
        counts.psum_to_sbuf_bytes += mult * partitions * free * 4
        use = _psum_use(counts, psum)
        use.evictions += mult
        if isinstance(stmt, Activation):
            use.scalar_cycles += mult * cycles
        else:
            use.vector_cycles += mult * cycles
    if isinstance(stmt, Activation):
        counts.scalar_cycles += mult * cycles
    else:
        counts.vector_cycles += mult * cycles


def _add_norm_op(counts: ProgramCounts, stmt: ActivationReduce | BnStats | BnAggr | TensorScalar | Memset,
                 env: Mapping[str, int], mult: int, params: ModelParams, pe_columns: int | None) -> None:
    # the norm prologue: one pass over each partition's elements of the source (the destination for a memset),
    # one input each (the [P, 1] scale/operand columns are per-partition registers, no second stream); the
    # reduction of activation_reduce rides on the activation (NKI ISA reference: max(MIN_II, N) + MIN_II
    # cycles, the same form as one activation)
    ref = stmt.dst if isinstance(stmt, Memset) else stmt.src
    _, free = _free(ref, env)
    cycles = mult * _engine_cycles(free, 0 if isinstance(stmt, Memset) else 1, params)
    if isinstance(stmt, ActivationReduce):
        counts.scalar_cycles += cycles
    else:
        counts.vector_cycles += cycles


def _add_reduction(counts: ProgramCounts, stmt: TensorScalarReduce | TensorReduce, env: Mapping[str, int], mult: int,
                   params: ModelParams, pe_columns: int | None) -> None:
    # a per-token absolute maximum (lowerings/row_scales.py): one VectorEngine pass over each partition's elements of
    # the source, as one tensor_scalar (the reduction rides on it: "at a small additional performance cost",
    # nki.isa.tensor_scalar_reduce; not separately priced, no page gives it); a source in PSUM is an eviction of it
    _, free = _free(stmt.src, env)
    cycles = mult * _engine_cycles(free, 1, params)
    counts.vector_cycles += cycles
    if stmt.src.buffer.memory == "psum":
        use = _psum_use(counts, stmt.src.buffer.name)
        use.evictions += mult
        use.vector_cycles += cycles
        counts.psum_evictions += mult


def _add_alloc(counts: ProgramCounts, stmt: Alloc, env: Mapping[str, int], mult: int, params: ModelParams,
               pe_columns: int | None) -> None:
    if stmt.buffer.memory == "psum":
        use = _psum_use(counts, stmt.buffer.name)
        use.allocations += mult
        use.copies = stmt.copies
    if stmt.zero:  # memset of the whole buffer on the VectorEngine
        free = math.prod(stmt.buffer.shape[1:])
        counts.vector_cycles += mult * _engine_cycles(free, 0, params)


def _add_sendrecv(counts: ProgramCounts, stmt: SendRecv, env: Mapping[str, int], mult: int, params: ModelParams,
                  pe_columns: int | None) -> None:
    # an SBUF-to-SBUF DMA to the other core (the default DMA-engine sendrecv)
    partitions, per_partition = _free(stmt.src, env)
    bpp = per_partition * stmt.src.buffer.itemsize
    key = ("exchange", False, bpp)
    cls = counts.dma.get(key)
    if cls is None:
        cls = counts.dma[key] = DmaClass()
    cls.count += mult
    cls.bytes += mult * partitions * bpp
    counts.exchanges += mult
    counts.exchange_bytes += mult * partitions * bpp


_Adder = Callable[[ProgramCounts, Any, Mapping[str, int], int, ModelParams, int | None], None]
#: How each kind of leaf statement is counted (looked up by its type: the counting loop runs ~10^5 times a search)
_ADDERS: dict[type, _Adder] = {
    DmaCopy: _add_dma, Matmul: _add_matmul, PeTranspose: _add_pe_transpose, Copy: _add_engine_op,
    TensorTensor: _add_engine_op, Activation: _add_engine_op, ActivationReduce: _add_norm_op, BnStats: _add_norm_op,
    BnAggr: _add_norm_op, TensorScalar: _add_norm_op, TensorScalarReduce: _add_reduction, TensorReduce: _add_reduction,
    Memset: _add_norm_op, Alloc: _add_alloc,
    SendRecv: _add_sendrecv, Comment: lambda *_: None,  # a comment counts nothing
}


def _adder(stmt: Stmt) -> _Adder:
    """The function counting ``stmt`` (:data:`_ADDERS`; a subclass of a statement kind counts as that kind)."""
    if (adder := _ADDERS.get(type(stmt))) is not None:
        return adder
    for kind, adder in _ADDERS.items():
        if isinstance(stmt, kind):
            return adder
    raise TypeError(f"cannot count {type(stmt).__name__}")  # loops never reach here


def register(kind: type, adder: _Adder, *, engine_work: bool = False) -> None:
    """Count statements of ``kind`` with ``adder`` (an instruction family kept in a module of its own, which registers
    itself when the package is imported: cost_model/counts_mx.py); ``engine_work``: an engine instruction that anchors
    the prologue of a program without matmuls (:data:`ENGINE_WORK`)."""
    global ENGINE_WORK
    _ADDERS[kind] = adder
    if engine_work:
        ENGINE_WORK = (*ENGINE_WORK, kind)


def count_program(program: Program, params: ModelParams, env: Mapping[str, int] | None = None,
                  pe_columns: int | None = None, memo: dict[int, frozenset[str]] | None = None) -> ProgramCounts:
    """The program's counts; ``env`` binds variables outside the loop nest (the program id of one program of a
    logical core); ``pe_columns`` as for :func:`add_statement`; ``memo`` as for ``kernel_ir.program.visit_counts``."""
    counts = ProgramCounts()
    adders = _ADDERS

    def visit(stmt: Stmt, at: dict[str, int], mult: int) -> None:
        (adders.get(type(stmt)) or _adder(stmt))(counts, stmt, at, mult, params, pe_columns)

    visit_counts(program.body, visit, env, memo)
    for param in program.params:
        counts.hbm_bytes_read.setdefault(param.name, 0)
    for out in program.outputs:
        counts.hbm_bytes_written.setdefault(out.name, 0)
    return counts


ENGINE_WORK = (Matmul, PeTranspose, Copy, TensorTensor, Activation, ActivationReduce, BnStats, BnAggr, TensorScalar,
               TensorScalarReduce, TensorReduce)


def _contains(loop: Loop, kinds: tuple[type, ...], memo: dict[int, bool]) -> bool:
    """Whether ``loop`` holds a statement of ``kinds`` (``memo``: loop id -> the answer, for one walk)."""
    found = memo.get(id(loop))
    if found is None:
        found = memo[id(loop)] = any(isinstance(s, kinds) or (isinstance(s, Loop) and _contains(s, kinds, memo))
                                     for s in loop.body)
    return found


def _edge(body: list[Stmt], env: dict[str, int], reverse: bool, anchor: tuple[type, ...],
          memo: dict[int, bool]) -> Iterator[tuple[Stmt, dict[str, int], int]]:
    """Statements executed before the first anchor instruction (or, reversed, after the last)."""
    for stmt in (reversed(body) if reverse else body):
        if isinstance(stmt, anchor):
            return
        if isinstance(stmt, Loop):
            trip = stmt.trip.evaluate(env)
            if trip <= 0:
                continue
            if _contains(stmt, anchor, memo):
                yield from _edge(stmt.body, {**env, stmt.var: trip - 1 if reverse else 0}, reverse, anchor, memo)
                return
            # The first instruction waits only for the first tiles its loop nests load; the epilogue's
            # loops (the last block's evictions and stores) all follow the last matmul.
            yield from instruction_counts([stmt], env) if reverse else _first_iteration(stmt, env)
        else:
            yield stmt, env, 1


def _first_iteration(loop: Loop, env: dict[str, int]) -> Iterator[tuple[Stmt, dict[str, int], int]]:
    """The statements of a loop nest's first iteration (each inner loop at its first iteration too)."""
    inner = {**env, loop.var: 0}
    for stmt in loop.body:
        if isinstance(stmt, Loop):
            if stmt.trip.evaluate(inner) > 0:
                yield from _first_iteration(stmt, inner)
        else:
            yield stmt, inner, 1


def edge_counts(program: Program, params: ModelParams, *, reverse: bool,
                env: Mapping[str, int] | None = None, pe_columns: int | None = None) -> ProgramCounts:
    """Counts of the prologue (``reverse=False``: what the first matmul waits for: the statements before it,
    of each loop nest before it only the first iteration, i.e. the first tiles it loads) or the epilogue
    (``reverse=True``: everything after the last one). A program without matmuls (an elementwise kernel)
    is anchored on its first/last engine instruction."""
    memo: dict[int, bool] = {}
    has_matmul = any(isinstance(s, Matmul) or (isinstance(s, Loop) and _contains(s, (Matmul,), memo))
                     for s in program.body)
    anchor: tuple[type, ...] = (Matmul,) if has_matmul else ENGINE_WORK
    counts = ProgramCounts()
    for stmt, at, mult in _edge(program.body, dict(env or {}), reverse, anchor, memo if has_matmul else {}):
        add_statement(counts, stmt, at, mult, params, pe_columns)
    return counts


def psum_stall_us(counts: ProgramCounts, f_pe: float, f_vec: float, f_act: float) -> float:
    """Microseconds the TensorEngine waits on PSUM evictions (``t_stall``, docs/cost_model.md §3b).

    Only a PSUM buffer of one explicit copy that several tiles reuse (``Alloc.copies == 1``) stalls: each
    tile's matmuls wait until the previous tile's eviction has read the copy out (a write-after-read
    hazard), so matmuls and evictions serialize, and every use but the first of each allocation costs one
    tile's worth of the shorter side, ``min(P, C) / E`` (``P`` the buffer's TensorEngine time, ``C`` its
    eviction time, ``E`` its evictions = tiles). A buffer allocated afresh per tile is rotated by the compiler
    and B >= 2 explicit copies rotate by construction: neither stalls."""
    total = 0.0
    for use in counts.psum.values():
        if use.copies != 1 or use.evictions <= use.allocations:
            continue
        produce = engine_us(use.pe_cycles, f_pe)
        consume = engine_us(use.vector_cycles, f_vec) + engine_us(use.scalar_cycles, f_act)
        total += (use.evictions - use.allocations) * min(produce, consume) / use.evictions
    return total


def dma_histogram(counts: ProgramCounts) -> dict[int, int]:
    """Bytes per partition of each transfer -> number of transfers (as the interpreter reports)."""
    out: dict[int, int] = defaultdict(int)
    for (_, _, bpp), cls in counts.dma.items():
        out[bpp] += cls.count
    return dict(sorted(out.items()))
