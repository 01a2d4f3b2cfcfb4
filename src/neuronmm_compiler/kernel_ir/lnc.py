"""Divide a kernel's work between the programs of a logical core (LNC=2 on trn2/trn3).

An LNC=2 kernel is one NKI kernel that both physical cores of the logical core run; each learns which
it is from ``nl.program_id(0)`` (0 or 1) and both see the same HBM ("Using Logical NeuronCores (LNC) with
NKI", Neuron docs, sections "Programming for multiple cores" and "Final Notes": kernel inputs and outputs
live in shared HBM; the SDK assumes both cores follow the same control flow). So the split is a
transformation of the loop nest, the same for every lowering:

* a lowering tags the loops whose iterations write disjoint parts of the outputs and carry nothing
  (:attr:`Loop.split`: the M or N block loop of a GEMM, the token-block loop of a fused kernel, ...);
* :func:`distribute` gives program ``p`` the iterations ``[p * T/P, (p + 1) * T/P)`` of every loop of the
  chosen family: the trip becomes ``T/P`` and the loop variable ``v`` reads ``v + (T/P) * pid`` inside the
  body, where ``pid`` (:data:`PROGRAM_ID`) is the program id. Trips and control flow stay the same for both
  programs (only offsets and the extents of a ragged last block depend on ``pid``), which is why a family's
  trip counts must divide evenly; a ragged last block stays exact through its ``min()`` extents.

What cannot be divided (no loop of the family, an odd trip, a store to HBM outside the divided loops that
both programs would write) is not an exception: the program comes back with :attr:`Program.split_error`
set, and the footprint check treats it as infeasible, so a search moves on to schedules that divide.
"""

from __future__ import annotations

from dataclasses import replace

from .expr import CeilDiv, Expr, Lin, Min, Mod, add, as_expr, ceil_div, minimum, scale, var
from .program import (
    Alloc,
    Buffer,
    Comment,
    DmaCopy,
    Loop,
    Point,
    Program,
    Ref,
    SendRecv,
    Span,
    Stmt,
    map_regions,
    refs_of,
    walk,
    with_fields,
)

__all__ = ["PROGRAM_ID", "distribute", "divisible_blocking", "exchanges", "halves"]

#: The loop-nest variable that holds ``nl.program_id(0)`` (the printers bind it at the top of the kernel).
PROGRAM_ID = "pid"


def distribute(program: Program, family: str, programs: int) -> Program:
    """``program`` with the loops of split family ``family`` divided between ``programs`` programs (the
    module docstring); ``programs`` 1 returns it unchanged."""
    if programs == 1:
        return program
    error = _why_not(program, family, programs)
    if error is not None:
        return replace(program, programs=programs, split=family, split_error=error)
    local = _local_buffers(program, family, programs)
    body = _rewrite(program.body, family, programs, local)
    if local:
        body = _replace_allocs(body, local)
    return replace(program, body=body, programs=programs, split=family)


def _local_buffers(program: Program, family: str, programs: int) -> dict[Buffer, tuple[Buffer, int]]:
    """On-chip buffers a program only ever uses through divided loops, one slot per iteration: every reference
    indexes one axis, whose extent is the loop's trip, by exactly the loop variable (a weight block's K slots, the
    X^T strip a divided contraction reads). Each program keeps its own share of the slots there, indexed by its own
    iteration count: buffer -> (the buffer with that axis cut to the share, the axis). Nothing else is shrunk (a
    strip the programs exchange, or that later groups read whole, keeps its extent)."""
    found: dict[Buffer, int | None] = {}
    trips: dict[Buffer, int] = {}

    def visit(body: list[Stmt], inside: Loop | None) -> None:
        for stmt in body:
            if isinstance(stmt, Loop):
                divided = family in stmt.split and isinstance(stmt.trip, Lin) and stmt.trip.is_const
                visit(stmt.body, stmt if divided else inside)
                continue
            for ref in refs_of(stmt):
                buf = ref.buffer
                if buf.memory == "hbm":
                    continue
                axis = None
                if inside is not None:
                    slots = [a for a, ix in enumerate(ref.index)
                             if isinstance(ix, Point) and ix.index == var(inside.var)]
                    if len(slots) == 1 and buf.shape[slots[0]] == inside.trip.const:
                        axis = slots[0]
                trip = inside.trip.const if inside is not None else None
                if axis is None or found.get(buf, axis) != axis or trips.get(buf, trip) != trip:
                    found[buf] = None
                else:
                    found[buf], trips[buf] = axis, trip

    visit(program.body, None)
    out: dict[Buffer, tuple[Buffer, int]] = {}
    for buf, axis in found.items():
        if axis is not None:
            shape = tuple(n // programs if a == axis else n for a, n in enumerate(buf.shape))
            out[buf] = (replace(buf, shape=shape), axis)
    return out


def _replace_allocs(body: list[Stmt], local: dict[Buffer, tuple[Buffer, int]]) -> list[Stmt]:
    out: list[Stmt] = []
    for stmt in body:
        if isinstance(stmt, Loop):
            out.append(with_fields(stmt, {"body": _replace_allocs(stmt.body, local)}))
        elif isinstance(stmt, Alloc) and stmt.buffer in local:
            out.append(with_fields(stmt, {"buffer": local[stmt.buffer][0]}))
        else:
            out.append(stmt)
    return out


def halves(half: int, stride: int | None = None) -> tuple[Span, Span]:
    """(this program's, the other program's) ``half`` elements of an axis two programs share, starting at
    ``stride * pid``: what a ``sendrecv`` exchange sends from and receives into. ``stride`` defaults to ``half`` (the
    halves of ``2 * half`` elements); a larger one leaves ``stride - half`` elements in between that both programs
    computed (overlapping shares, :meth:`~.dims.Dim.overlapping_shares`) and neither sends."""
    stride = half if stride is None else stride
    return (Span(scale(var(PROGRAM_ID), stride), Lin(half)),
            Span(Lin(stride, ((PROGRAM_ID, -stride),)), Lin(half)))


def divisible_blocking(tiles: int, per_block: int, programs: int) -> int:
    """Tiles per block for a loop the programs divide: the largest count up to ``per_block`` that makes the blocks
    whole and their number a multiple of ``programs`` (each program then walks the same blocks of its own tiles);
    ``per_block`` itself when ``tiles`` does not divide between the programs."""
    if programs == 1 or tiles % programs:
        return per_block
    share = tiles // programs
    return max(d for d in range(1, min(per_block, share) + 1) if share % d == 0)


def _why_not(program: Program, family: str, programs: int) -> str | None:
    """Why ``program`` cannot be divided by ``family`` between ``programs`` programs, None when it can."""
    tagged = _outermost(program.body, family)
    if not tagged:
        return (f"nothing in kernel {program.name} divides by the '{family}' split between {programs} programs (that "
                "dimension has a single block under this schedule; for hidden and intermediate, no group whose "
                "contraction can be divided and its partial sums added)")
    for loop in tagged:
        trip = loop.trip
        if not (isinstance(trip, Lin) and trip.is_const) or trip.const % programs:
            return (f"loop {loop.var} of the '{family}' split has {trip.code()} iterations, which {programs} "
                    "programs cannot share evenly with the same control flow (LNC docs: both cores run the same "
                    "control flow)")
    inside = {id(stmt) for loop in tagged for stmt, _ in walk(loop.body)}
    for stmt, _ in walk(program.body):
        if (isinstance(stmt, DmaCopy) and stmt.dst.buffer.memory == "hbm" and id(stmt) not in inside
                and not _per_program(stmt.dst)):
            return (f"kernel {program.name} stores {stmt.dst.buffer.name} outside the '{family}' split loops: both "
                    "programs would write the same HBM elements")
    return None


def _per_program(ref: Ref) -> bool:
    """Whether a region is the program's own: its index reads the program id (a reduce-scatter's half)."""
    return any(PROGRAM_ID in e.variables() for ix in ref.index
               for e in ((ix.start, ix.size) if isinstance(ix, Span) else (ix.index,)))


def _outermost(body: list[Stmt], family: str) -> list[Loop]:
    out: list[Loop] = []
    for stmt in body:
        if isinstance(stmt, Loop):
            if family in stmt.split:
                out.append(stmt)
            else:
                out += _outermost(stmt.body, family)
    return out


def _rewrite(body: list[Stmt], family: str, programs: int, local: dict[Buffer, tuple[Buffer, int]]) -> list[Stmt]:
    out: list[Stmt] = []
    for stmt in body:
        if isinstance(stmt, Loop) and family in stmt.split:
            share = stmt.trip.const // programs  # checked by _why_not
            offset = scale(var(PROGRAM_ID), share)
            shifted = [_shift_stmt(s, stmt.var, offset, local) for s in stmt.body]
            note = f"{programs} programs: each its {share} of {stmt.trip.const}"
            out.append(with_fields(stmt, {"trip": Lin(share), "body": shifted, "comment": _note(stmt.comment, note)}))
        elif isinstance(stmt, Loop):
            out.append(with_fields(stmt, {"body": _rewrite(stmt.body, family, programs, local)}))
        else:
            out.append(stmt)
    return out


def _note(comment: str, note: str) -> str:
    return f"{comment} ({note})" if comment else note


def shift(expr: Expr, name: str, offset: Expr) -> Expr:
    """``expr`` with variable ``name`` read as ``name + offset``. A rotation slot (``Mod``) keeps the variable
    as it is: each program rotates its copies by its own iteration count."""
    if type(expr) is Lin:  # the common case, without building the variables' set
        coef = 0
        for term, value in expr.terms:
            if term == name:
                coef = value
        return expr if coef == 0 else add(expr, scale(offset, coef) if coef > 0 else _negate(scale(offset, -coef)))
    if isinstance(expr, Mod) or name not in expr.variables():
        return expr
    if isinstance(expr, CeilDiv):
        return ceil_div(shift(expr.num, name, offset), expr.den)
    if isinstance(expr, Min):
        return minimum(*(shift(arg, name, offset) for arg in expr.args))
    coef = dict(expr.terms).get(name, 0)
    return expr if coef == 0 else add(expr, scale(offset, coef) if coef > 0 else _negate(scale(offset, -coef)))


def _negate(expr: Expr) -> Expr:
    lin = as_expr(expr)
    assert isinstance(lin, Lin)
    return Lin(-lin.const, tuple((n, -c) for n, c in lin.terms))


def _shift_ref(ref: Ref, name: str, offset: Expr, local: dict[Buffer, tuple[Buffer, int]]) -> Ref:
    """``ref`` with ``name`` read as ``name + offset``; a buffer of the program's own slots (:func:`_local_buffers`)
    keeps its slot index and becomes the cut buffer."""
    buffer, keep = local.get(ref.buffer, (ref.buffer, -1))
    index = []
    for a, ix in enumerate(ref.index):  # a loop, not a generator: every region of every candidate passes here
        if a == keep:
            index.append(ix)
        elif isinstance(ix, Span):
            index.append(Span(shift(ix.start, name, offset), shift(ix.size, name, offset)))
        else:
            index.append(Point(shift(ix.index, name, offset)))
    return Ref(buffer, tuple(index))


def _shift_stmt(stmt: Stmt, name: str, offset: Expr, local: dict[Buffer, tuple[Buffer, int]]) -> Stmt:
    if isinstance(stmt, Loop):
        body = stmt.body if stmt.var == name else [_shift_stmt(s, name, offset, local) for s in stmt.body]  # shadowed
        return with_fields(stmt, {"trip": shift(stmt.trip, name, offset), "body": body})
    if isinstance(stmt, (Alloc, Comment)):
        return stmt
    return map_regions(stmt, lambda ref: _shift_ref(ref, name, offset, local), lambda e: shift(e, name, offset))


def exchanges(programs: list[Program]) -> bool:
    """Whether any of the programs exchanges values with the other program of its logical core (a sendrecv)."""
    return any(isinstance(stmt, SendRecv) for program in programs for stmt, _ in walk(program.body))
