"""Split multi-bank PSUM accumulators into one-bank tiles, as the NKI rules require.

A schedule that keeps several matmul accumulators live at once (a block of N tiles, or a fused
kernel's stage-1 strip across a K-block loop) lowers them to one PSUM buffer ``(128, B, F)`` indexed
by a tile axis. NKI bounds a PSUM tile's free size by one bank (2 KiB per partition: Tile-Size
Constraint #2, rule NKI-PSUM-TILE-FMAX in docs/nki-rules.md), and the legacy way around it, block
dimensions before ``nl.par_dim``, is an error from SDK 2.25 (NKI-BLOCK-DIM). The Neuron migration
guide's replacement for block dimensions is a separate tensor per block (nki/migration/index.rst,
"Removing block dimensions from NKI kernels: Use a Python-like list"); nmmc spells those tensors out
by name, ``acc_psum__b0`` ... ``acc_psum__b3``, and unrolls the loops whose variable selects the tile,
so that every access names its tile statically in either dialect (no list indexed by a loop variable,
which NKI 0.1's symbolic ``affine_range`` variables could not index).

Only the printed program changes: the same instructions, the same banks, the same bytes; the cost
model counts the program before the split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace

from .expr import Expr, Lin
from .program import Alloc, Buffer, Comment, Loop, Matmul, Point, Program, Ref, Span, Stmt


def split_psum_banks(program: Program, bank_bytes: int) -> Program:
    """``program`` with every PSUM buffer wider than ``bank_bytes`` per partition split into one-bank tiles
    (unchanged when there is none). Raises ValueError when a wide buffer is not a ``(P, tiles, F)`` stack of
    one-bank tiles indexed by constant trip loops (a lowering bug, not a user error)."""
    wide = {stmt.buffer.name: stmt.buffer for stmt in _allocs(program.body)
            if stmt.buffer.memory == "psum" and stmt.buffer.bytes_per_partition > bank_bytes}
    if not wide:
        return program
    for buf in wide.values():
        if len(buf.shape) != 3 or buf.shape[2] * buf.itemsize > bank_bytes:
            raise ValueError(f"PSUM buffer {buf.name} {buf.shape} is not a stack of one-bank tiles")
    return replace(program, body=_rewrite(program.body, wide, _unrolled(program.body, wide), {}, unrolling=False))


def bank_name(name: str, tile: int) -> str:
    """The name of tile ``tile`` of a split PSUM buffer (``__`` keeps it apart from every user name)."""
    return f"{name}__b{tile}"


def _allocs(body: list[Stmt]) -> list[Alloc]:
    out: list[Alloc] = []
    for stmt in body:
        if isinstance(stmt, Alloc):
            out.append(stmt)
        elif isinstance(stmt, Loop):
            out += _allocs(stmt.body)
    return out


def _refs(stmt: Stmt) -> list[Ref]:
    return [getattr(stmt, f.name) for f in fields(stmt) if isinstance(getattr(stmt, f.name), Ref)]  # type: ignore[arg-type]


def _tile_variables(body: list[Stmt], wide: Mapping[str, Buffer]) -> set[str]:
    """Loop variables that select a tile of a wide buffer somewhere in ``body``."""
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, Loop):
            names |= _tile_variables(stmt.body, wide)
        elif not isinstance(stmt, Alloc | Comment):
            for ref in _refs(stmt):
                if ref.buffer.name in wide and isinstance(ref.index[1], Point):
                    names |= ref.index[1].index.variables()
    return names


def _loops(body: list[Stmt]) -> list[Loop]:
    out: list[Loop] = []
    for stmt in body:
        if isinstance(stmt, Loop):
            out += [stmt, *_loops(stmt.body)]
    return out


def _unrolled(body: list[Stmt], wide: Mapping[str, Buffer]) -> frozenset[str]:
    """The loops to unroll: those selecting a tile, and (so that their trip counts become constants) every loop
    whose variable such a loop's trip count depends on (``min(6, 10 - 6 * f_blk)``)."""
    names = _tile_variables(body, wide)
    loops = _loops(body)
    while True:
        more = set().union(*(loop.trip.variables() for loop in loops if loop.var in names)) - names
        if not more:
            return frozenset(names)
        names |= more


def _substitute(value: Expr, env: Mapping[str, int]) -> Expr:
    return value.substitute(env) if env else value


def _ref(ref: Ref, wide: Mapping[str, Buffer], env: Mapping[str, int]) -> Ref:
    index = tuple(Span(_substitute(ix.start, env), _substitute(ix.size, env)) if isinstance(ix, Span)
                  else Point(_substitute(ix.index, env)) for ix in ref.index)
    if ref.buffer.name not in wide:
        return Ref(ref.buffer, index) if env else ref
    tile = index[1]
    if not (isinstance(tile, Point) and isinstance(tile.index, Lin) and tile.index.is_const):
        raise ValueError(f"{ref.code()}: the PSUM tile is not selected by a constant after unrolling")
    return Ref(_bank(ref.buffer, tile.index.const), (index[0], index[2]))


def _bank(buf: Buffer, tile: int) -> Buffer:
    return Buffer(bank_name(buf.name, tile), (buf.shape[0], buf.shape[2]), buf.dtype, buf.memory)


def _rewrite(body: list[Stmt], wide: Mapping[str, Buffer], unrolled: frozenset[str], env: Mapping[str, int], *,
             unrolling: bool) -> list[Stmt]:
    """``body`` with wide buffers split and the loops selecting their tiles unrolled (``unrolling``: inside such
    a loop already, whose comment said so)."""
    out: list[Stmt] = []
    for stmt in body:
        if isinstance(stmt, Loop):
            trip = _substitute(stmt.trip, env)
            if stmt.var not in unrolled:
                out.append(replace(stmt, trip=trip, body=_rewrite(stmt.body, wide, unrolled, env, unrolling=unrolling)))
                continue
            if not (isinstance(trip, Lin) and trip.is_const):
                raise ValueError(f"loop over {stmt.var} selects a PSUM tile but has no constant trip count")
            if stmt.comment:
                out.append(Comment(stmt.comment))
            if not unrolling:
                names = ", ".join(sorted({loop.var for loop in _loops([stmt])} & unrolled))
                out.append(Comment(f"loops over {names} unrolled: one PSUM tile per bank (NKI-PSUM-TILE-FMAX)"))
            for value in range(trip.const):
                out += _rewrite(stmt.body, wide, unrolled, {**env, stmt.var: value}, unrolling=True)
        elif isinstance(stmt, Alloc):
            if stmt.buffer.name in wide:
                out += [replace(stmt, buffer=_bank(stmt.buffer, tile), comment=stmt.comment if tile == 0 else "")
                        for tile in range(stmt.buffer.shape[1])]
            else:
                out.append(stmt)
        elif isinstance(stmt, Comment):
            out.append(stmt)
        else:
            changes: dict[str, object] = {f.name: _ref(getattr(stmt, f.name), wide, env) for f in fields(stmt)
                                          if isinstance(getattr(stmt, f.name), Ref)}
            if isinstance(stmt, Matmul) and stmt.tile is not None and env:
                changes["tile"] = stmt.tile.map(lambda e: _substitute(e, env))
            out.append(replace(stmt, **changes))
    return out
