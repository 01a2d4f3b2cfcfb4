"""The static check of ``nc_matmul``'s PE tiling (rules NKI-MATMUL-TILE, NKI-MATMUL-TILE-DST of
:mod:`~neuronmm_compiler.verification.rules`), for :mod:`.static_check`: where ``tile_position`` and ``tile_size`` are
literal tuples, their sizes against the target's documented tile sizes, their starts' alignment, the stationary
fitting the tile, no column tile with ``perf_mode`` double_row, and (nki dialect) ``dst`` starting at the tile's
start column. nmmc's interpreter checks the same on every call, whatever the values' form."""

from __future__ import annotations

import ast
from typing import Any

from .kernel_ast import const_int, kwarg, subscript_elements

TILE, TILE_DST = "NKI-MATMUL-TILE", "NKI-MATMUL-TILE-DST"


def check_pe_tile(checker: Any, call: ast.Call, stationary: ast.AST | None, dst: ast.AST | None) -> None:
    """Report the PE tiling rules on an ``nc_matmul`` call through ``checker`` (the static checker: its ``report``,
    ``target``, hardware ``hw`` and ``_tile_shape``); ``dst``: the destination expression (nki dialect) or None."""
    position, size = kwarg(call, "tile_position"), kwarg(call, "tile_size")
    given = [node is not None and not (isinstance(node, ast.Tuple) and not node.elts) for node in (position, size)]
    if not any(given):
        return
    if not all(given):
        checker.report(TILE, call, "nc_matmul sets only one of tile_position and tile_size")
        return
    starts, sizes = _const_pair(position), _const_pair(size)
    if sizes is None:
        return
    allowed, array = checker.hw.pe_tile_sizes, checker.hw.gemm_stationary_fmax
    for name, value in zip(("row_size", "column_size"), sizes, strict=True):
        if value is not None and value not in allowed:
            checker.report(TILE, call, f"tile_size {name} {value} is not a tile size {checker.target} documents "
                           f"({', '.join(map(str, allowed))})")
    if starts is not None:
        for name, start, value in zip(("start_row", "start_column"), starts, sizes, strict=True):
            if start is not None and value and (start % value or start + value > array):
                checker.report(TILE, call, f"tile_position {name} {start} is not a multiple of its tile size "
                               f"{value} inside the {array} x {array} PE array")
    shape = checker._tile_shape(stationary) or (None, None)
    for limit, extent, what in zip(sizes, shape, ("partitions", "free size"), strict=True):
        if limit is not None and extent is not None and extent > limit:
            checker.report(TILE, call, f"nc_matmul stationary {what} {extent} exceeds its tile size {limit}")
    narrow = sizes[1] is not None and sizes[1] < array
    mode = kwarg(call, "perf_mode")
    if narrow and mode is not None and "double_row" in ast.unparse(mode):
        checker.report(TILE, call, "perf_mode double_row with a column tile")
    column = starts[1] if starts is not None else None
    begin = _partition_start(dst)
    if narrow and column is not None and begin is not None and begin != column:
        checker.report(TILE_DST, call, f"nc_matmul in PE column tile {column} writes dst from partition {begin}, "
                       f"not {column}")


def _const_pair(node: ast.AST | None) -> tuple[int | None, int | None] | None:
    """The two values of a literal 2-tuple (each None when not a constant), else None."""
    if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == 2:
        return const_int(node.elts[0]), const_int(node.elts[1])
    return None


def _partition_start(dst: ast.AST | None) -> int | None:
    """The first partition a subscripted ``dst`` writes, when its first index is a slice with a constant start."""
    if not isinstance(dst, ast.Subscript):
        return None
    elts = subscript_elements(dst)
    first = elts[0] if elts else None
    if not isinstance(first, ast.Slice):
        return None
    return const_int(first.lower) if first.lower is not None else 0
