"""Split multi-bank PSUM accumulators into a list of one-bank tiles, as the NKI rules require.

A schedule that keeps several matmul accumulators live at once (a block of N tiles, or a fused
kernel's stage-1 strip across a K-block loop) lowers them to one PSUM buffer ``(128, B, F)`` indexed
by a tile axis, ``F`` padded to a whole bank so that the buffer's size counts one bank per tile. NKI
bounds a PSUM tile's free size by one bank (2 KiB per partition: Tile-Size Constraint #2, rule
NKI-PSUM-TILE-FMAX in docs/nki-rules.md), and the legacy way around it, block dimensions before
``nl.par_dim``, is an error from SDK 2.25 (NKI-BLOCK-DIM). The Neuron migration guide's replacement for
block dimensions is "a standard Python list" of tensors, one per block, indexed by the loop variable
(aws-neuron/aws-neuron-sdk@81ce03ae:nki/migration/index.rst, "Removing block dimensions from NKI kernels:
Use a Python-like list": "the programs generated before and after migration are identical").

So the buffer becomes a list buffer (:attr:`~.program.Buffer.entries` = B) of ``(128, W)`` tiles, ``W``
the widest slice any access takes (the tile is allocated at the size used; every entry still starts on
its own bank), and each access's tile index becomes the list index (:attr:`~.program.Ref.entry`).
Loops stay rolled. A Python list takes a Python int: in the ``nki`` dialect every loop is a Python
``range``; in the ``neuronxcc`` dialect a loop whose variable indexes a list is printed as
``nl.static_range``, which NKI 0.1 unrolls during tracing, where ``affine_range``/``sequential_range``
variables are not unrolled until the compiler backend (rule NKI-LIST-INDEX-STATIC).

Only the printed program changes: the same instructions, the same banks, the same bytes; the cost
model counts the program before the split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from .expr import Lin
from .program import Alloc, Buffer, Loop, Point, Program, Ref, Span, Stmt, map_regions, refs_of, walk

#: The variable of the loop that fills a list buffer (the printer's); no lowering names a loop so.
ENTRY_VAR = "bank"


def split_psum_banks(program: Program, bank_bytes: int) -> Program:
    """``program`` with every PSUM buffer wider than ``bank_bytes`` per partition turned into a list of one-bank
    tiles (unchanged when there is none). Raises ValueError when a wide buffer is not a ``(P, tiles, F)`` stack of
    one-bank tiles selected by a point index (a lowering bug, not a user error)."""
    walked = list(walk(program.body))
    wide = {stmt.buffer for stmt, _ in walked if isinstance(stmt, Alloc) and stmt.buffer.memory == "psum"
            and stmt.buffer.bytes_per_partition > bank_bytes}
    if not wide:
        return program
    if any(isinstance(stmt, Loop) and stmt.var == ENTRY_VAR for stmt, _ in walked):
        raise ValueError(f"a loop variable is named {ENTRY_VAR!r}, the name of the list-filling loop")
    for buf in wide:
        if len(buf.shape) != 3 or buf.shape[2] * buf.itemsize > bank_bytes:
            raise ValueError(f"PSUM buffer {buf.name} {buf.shape} is not a stack of one-bank tiles")
    lists = {buf: Buffer(buf.name, (buf.shape[0], _width_used(buf, [ref for stmt, _ in walked for ref in refs_of(stmt)
                                                                    if ref.buffer == buf])),
                         buf.dtype, buf.memory, entries=buf.shape[1]) for buf in wide}
    return replace(program, body=_rewrite(program.body, lists))


def _width_used(buf: Buffer, refs: list[Ref]) -> int:
    """The widest free extent any access takes of a tile of ``buf`` (its whole width when a bound is not
    constant)."""
    widest = 0
    for ref in refs:
        tile, free = ref.index[1], ref.index[2]
        if not isinstance(tile, Point):
            raise ValueError(f"{ref.code()}: the PSUM tile is not selected by a point index")
        stop = free.stop if isinstance(free, Span) else None
        if not (isinstance(stop, Lin) and stop.is_const):
            return buf.shape[2]
        widest = max(widest, stop.const)
    return widest or buf.shape[2]


def _ref(ref: Ref, lists: Mapping[Buffer, Buffer]) -> Ref:
    listed = lists.get(ref.buffer)
    if listed is None:
        return ref
    tile, free = ref.index[1], ref.index[2]
    assert isinstance(tile, Point)  # checked by _width_used
    return Ref(listed, (ref.index[0], free), entry=tile.index)


def _rewrite(body: list[Stmt], lists: Mapping[Buffer, Buffer]) -> list[Stmt]:
    out: list[Stmt] = []
    for stmt in body:
        if isinstance(stmt, Loop):
            out.append(replace(stmt, body=_rewrite(stmt.body, lists)))
        elif isinstance(stmt, Alloc):
            listed = lists.get(stmt.buffer)
            out.append(stmt if listed is None else replace(stmt, buffer=listed))
        else:
            out.append(map_regions(stmt, lambda ref: _ref(ref, lists)))
    return out
