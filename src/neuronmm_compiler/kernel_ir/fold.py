"""Fold the loops that run once.

A lowering writes a loop per blocked dimension whatever its trip: one block of output columns is
``for n_blk in range(1)``, and dividing a loop of two blocks between the two programs of a logical core
(:func:`~.lnc.distribute`) leaves each program ``for o_blk in range(1)`` with indexes like
``OUT_TILE * o_blk + OUT_TILE * pid``. Such a loop does nothing a reader or the compiler needs: its body
runs once with the variable at 0. :func:`fold_unit_loops` replaces it by that body, the variable read as 0
(``OUT_TILE * pid``), so the kernel a user reads holds only the loops that iterate.

Nothing the cost model counts changes: a loop's one iteration is its body once, for the instruction counts
and for the prologue and epilogue edges alike (:mod:`~neuronmm_compiler.cost_model.counts`). What can
change is the liveness of a buffer allocated before the loop and used inside it, which
:meth:`~.program.Program.live_intervals` keeps to the loop's end (later iterations use it again): with no
later iteration it ends at its last use, as the interpreter measures the emitted kernel. A loop's comment
stays, as a comment line where the loop was.
"""

from __future__ import annotations

from dataclasses import replace

from .expr import CeilDiv, Expr, Lin, Min, Mod, ceil_div, minimum, modulo
from .program import Comment, Loop, Point, Program, Ref, Span, Stmt, map_regions, with_fields

__all__ = ["fold_unit_loops"]


def fold_unit_loops(program: Program) -> Program:
    """``program`` with every loop of constant trip 1 replaced by its body, the loop variable read as 0."""
    body = _fold(program.body, ())
    return program if body is program.body else replace(program, body=body)


def _fold(body: list[Stmt], zero: tuple[str, ...]) -> list[Stmt]:
    """``body`` with its unit loops folded and the variables ``zero`` (folded loops around it) read as 0; the same
    list when nothing changes (the search lowers every candidate: most have no unit loop)."""
    if not zero and not any(isinstance(stmt, Loop) for stmt in body):
        return body
    out: list[Stmt] = []
    changed = bool(zero)
    for stmt in body:
        if isinstance(stmt, Loop) and stmt.runs_once:
            changed = True
            if stmt.comment:
                out.append(Comment(stmt.comment))
            out += _fold(stmt.body, (*zero, stmt.var))
        elif isinstance(stmt, Loop):
            inner = tuple(name for name in zero if name != stmt.var)  # an inner loop of the same name shadows
            folded = _fold(stmt.body, inner)
            trip = _zeroed(stmt.trip, zero)
            if folded is not stmt.body or trip is not stmt.trip:
                changed = True
                stmt = with_fields(stmt, {"body": folded, "trip": trip})
            out.append(stmt)
        else:
            out.append(_statement(stmt, zero) if zero else stmt)
    return out if changed else body


def _zeroed(expr: Expr, zero: tuple[str, ...]) -> Expr:
    """``expr`` with the variables ``zero`` read as 0 (the same object when it reads none of them). Dropping a
    term keeps the constant as it was, so a named size (``OUT_TILE``) still prints by its name."""
    if not zero or not any(name in expr.variables() for name in zero):
        return expr
    if isinstance(expr, Lin):
        return Lin(expr.const, tuple((name, coef) for name, coef in expr.terms if name not in zero))
    if isinstance(expr, Min):
        return minimum(*(_zeroed(arg, zero) for arg in expr.args))
    if isinstance(expr, Mod):
        return modulo(_zeroed(expr.arg, zero), expr.modulus)
    assert isinstance(expr, CeilDiv)
    return ceil_div(_zeroed(expr.num, zero), expr.den)


def _ref(ref: Ref, zero: tuple[str, ...]) -> Ref:
    index = tuple(Span(_zeroed(ix.start, zero), _zeroed(ix.size, zero)) if isinstance(ix, Span)
                  else Point(_zeroed(ix.index, zero)) for ix in ref.index)
    entry = None if ref.entry is None else _zeroed(ref.entry, zero)
    return Ref(ref.buffer, index, entry)


def _statement(stmt: Stmt, zero: tuple[str, ...]) -> Stmt:
    return map_regions(stmt, lambda ref: _ref(ref, zero), lambda expr: _zeroed(expr, zero))
