"""Coalescing a loop of slab loads into one DMA (``weight_dma=block``).

A weight block is loaded slab by slab: a loop ``for kt in range(KT)`` whose body is one DMA of ``P`` rows of a
row-major HBM array, rows ``r0 + kt * P ..``, into slot ``kt`` of an SBUF buffer. The same bytes move in one
transfer whose source is an access pattern (``[[C, P], [P * C, KT], [1, F]]``, :attr:`~.program.DmaCopy.slabs`), as
AWS's decode MLP loads a weight tile [HTile, I] into [128, HTile / 128, I] with one ``dma_copy``
(nki-library@d2ad3a5:src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py:163-181; rule
NKI-DMA-SLABS). The cost model then pays one DMA fixed cost for the block instead of one per slab; the
efficiency of its bytes stays that of one slab row (a partition's KT rows are not adjacent in HBM:
cost_model/counts.py).

The rewrite is a kernel-IR transformation: any lowering's program can go through it. Only loops whose body is exactly
such a load are rewritten, of a constant trip or of the ragged trip of a blocked contraction's last block (``min(KB,
K - KB * k_blk)`` whole slabs: 112 contraction tiles in blocks of 32 load 32, 32, 32 and 16); a ragged last slab, a
loop carrying other work, a transposing or pattern load, stay as they are.
"""

from __future__ import annotations

from dataclasses import replace

from .expr import Expr, Lin, Min, scale
from .lnc import PROGRAM_ID
from .program import DmaCopy, Loop, Point, Program, Ref, Span, Stmt, with_fields


def coalesce_slab_loads(program: Program) -> Program:
    """``program`` with every loop of slab loads (module docstring) replaced by one DMA."""
    return replace(program, body=_coalesce(program.body))


def _coalesce(body: list[Stmt]) -> list[Stmt]:
    out: list[Stmt] = []
    for stmt in body:
        if isinstance(stmt, Loop):
            merged = _slab_load(stmt)
            out.append(merged if merged is not None else with_fields(stmt, {"body": _coalesce(stmt.body)}))
        else:
            out.append(stmt)
    return out


def _coefficient(expr: Expr, name: str) -> tuple[int, Expr] | None:
    """(coefficient of ``name``, the rest) of an affine expression, or None when it is not affine."""
    if not isinstance(expr, Lin):
        return None
    coef = dict(expr.terms).get(name, 0)
    return coef, Lin(expr.const, tuple(t for t in expr.terms if t[0] != name))


def _slab_load(loop: Loop) -> DmaCopy | None:
    """The one DMA equivalent to ``loop``, or None when the loop is not a loop of slab loads."""
    body = loop.body
    if len(body) != 1 or not isinstance(body[0], DmaCopy):
        return None
    dma, trip, name = body[0], _slab_count(loop.trip), loop.var
    if trip is None or not dma.is_load or dma.transpose or dma.broadcast or dma.fold or dma.slabs:
        return None
    src, dst = dma.src, dma.dst
    if len(src.index) != 2 or not all(isinstance(ix, Span) for ix in src.index) or dst.entry is not None:
        return None
    rows, cols = src.index
    part = dst.index[0]
    if not (isinstance(part, Span) and isinstance(part.size, Lin) and part.size.is_const and rows.size == part.size):
        return None
    slab = part.size.const
    start = _coefficient(rows.start, name)
    if start is None or start[0] != slab or _uses(cols, name) or _uses(part, name):
        return None
    slots = [i for i, ix in enumerate(dst.index) if isinstance(ix, Point) and name in ix.index.variables()]
    if len(slots) != 1 or any(_uses(ix, name) for i, ix in enumerate(dst.index) if i != slots[0]):
        return None
    slot = _coefficient(dst.index[slots[0]].index, name)
    if slot is None or slot[0] != 1:
        return None
    index = list(dst.index)
    index[slots[0]] = Span(slot[1], trip)
    return DmaCopy(Ref(dst.buffer, tuple(index)), Ref(src.buffer, (Span(start[1], scale(trip, slab)), cols)),
                   slabs=True)


def _slab_count(trip: Expr) -> Expr | None:
    """The slabs a loop of slab loads moves, when one DMA can move them: a constant of at least 2, or the ragged
    count of a blocked contraction's blocks, ``min(KB, K - KB * k_blk)`` (each block whole slabs, the last one
    fewer), whose block variable the printers unroll at trace time (a min() of a loop variable), so every DMA's
    pattern count is a number. None otherwise: one slab, a count that is neither a constant nor a min() of affine
    forms, or one that depends on the program id of a logical core (a value of the launch, not of the trace: kept
    slab by slab)."""
    if isinstance(trip, Lin):
        return trip if trip.is_const and trip.const >= 2 else None
    if (isinstance(trip, Min) and all(isinstance(a, Lin) for a in trip.args) and PROGRAM_ID not in trip.variables()
            and any(a.is_const and a.const >= 2 for a in trip.args)):
        return trip
    return None


def _uses(index: Span | Point, name: str) -> bool:
    exprs = (index.start, index.size) if isinstance(index, Span) else (index.index,)
    return any(name in e.variables() for e in exprs)
