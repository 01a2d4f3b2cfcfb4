"""Drop the allocations no instruction uses.

A lowering allocates the temporaries an epilogue *may* need before it knows which ones the epilogue's instructions
will read or write (an FP8 epilogue whose scales were folded into an activation's ``scale=`` leaves its fp32
scratch and the gate's temporary untouched). An unused ``Alloc`` still prints as an ``nl.ndarray`` in the kernel a
user reads and still counts in the SBUF/PSUM footprint the schedule is checked against, so the lowering drops it
here, once, for every program it builds.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any

from .expr import CeilDiv, Lin, Min, Mod
from .program import Alloc, Buffer, Loop, Program, Ref, Stmt, with_fields

__all__ = ["drop_unused_allocs"]


_FIELDS: dict[type, tuple[str, ...]] = {}


_NO_BUFFERS = (Lin, Min, Mod, CeilDiv, int, float, str)


def _field_names(cls: type) -> tuple[str, ...]:
    """The fields of a dataclass type that may hold a Ref (none for a Buffer or a non-dataclass), cached per type:
    every candidate the search costs is pruned, and ``dataclasses.fields`` is slow."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = (tuple(f.name for f in fields(cls)) if is_dataclass(cls) and not issubclass(cls, Buffer)
                                else ())
    return names


def _buffers(value: Any, out: set[Buffer]) -> None:
    """Every buffer a value refers to (a Ref, or any dataclass, tuple or list holding one)."""
    if isinstance(value, Ref):
        out.add(value.buffer)
    elif isinstance(value, _NO_BUFFERS):  # an index expression, a number or a name holds no region
        return
    elif isinstance(value, (tuple, list)):
        for item in value:
            _buffers(item, out)
    else:
        for name in _field_names(type(value)):
            _buffers(getattr(value, name), out)


def _used(body: list[Stmt], out: set[Buffer]) -> None:
    for stmt in body:
        if isinstance(stmt, Loop):
            _used(stmt.body, out)
        elif not isinstance(stmt, Alloc):
            _buffers(stmt, out)


def _prune(body: list[Stmt], used: set[Buffer]) -> list[Stmt]:
    """``body`` without the unused allocations; the same list when it has none (compared by identity, not by
    value: the search prunes every candidate's program)."""
    kept: list[Stmt] = []
    changed = False
    for stmt in body:
        if isinstance(stmt, Alloc) and stmt.buffer not in used:
            changed = True
            continue
        if isinstance(stmt, Loop):
            inner = _prune(stmt.body, used)
            if inner is not stmt.body:
                changed = True
                stmt = with_fields(stmt, {"body": inner})
        kept.append(stmt)
    return kept if changed else body


def drop_unused_allocs(program: Program) -> Program:
    """``program`` without the ``Alloc`` of any on-chip buffer no statement refers to."""
    used: set[Buffer] = set()
    _used(program.body, used)
    body = _prune(program.body, used)
    return program if body is program.body else replace(program, body=body)
