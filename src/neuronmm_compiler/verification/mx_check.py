"""The static checks of the MX instructions (``nisa.nc_matmul_mx``, ``nisa.quantize_mx``; docs/mx.md), for
:mod:`.static_check`: NKI-MX-TARGET (a call on a core without them), NKI-MX-MATMUL-TILE (operand dtypes and memories,
and only row tiling: a ``tile_size`` column size of 128 and a ``tile_position`` column of 0), NKI-MX-QUANTIZE-TILE
(source bf16/fp16, destination an MXFP8 ``_x4`` type) and NKI-MX-SCALE-DTYPE (a scale tile of ``float8_e8m0fnu``
before the releases that document it). Operands whose dtype or memory the source does not show are not guessed
about; nmmc's interpreter checks every call as it runs (interpreter/mx.py)."""

from __future__ import annotations

import ast
from typing import Any

from ..ir.mx import X4_DTYPES
from .kernel_ast import const_int, kwarg

#: The scale dtypes of the MX instructions ("float8_e8m0fnu or uint8", nki.isa.nc_matmul_mx, "Data types").
SCALE_DTYPES = frozenset(("uint8", "float8_e8m0fnu"))
#: The FP8 E4M3 conversion mode of each E4M3 dtype (rule NKI-FP8-E4M3-MODE): float8_e4m3fn_x4 packs four OCP
#: float8_e4m3fn values ("4-packed quantized data types", nki.isa.nc_matmul_mx, "Data types"), so it is the OCP mode.
E4M3_MODES = {"float8_e4m3": "float8_e4m3", "float8_e4m3fn": "float8_e4m3fn", "float8_e4m3fn_x4": "float8_e4m3fn"}


def _operand(checker: Any, call: ast.Call, role: str, position: int) -> Any:
    return checker._resolve(kwarg(call, role, position))


def check_call(checker: Any, node: ast.Call, name: str | None) -> None:
    """An MX call of the nki dialect (anything else is left alone)."""
    if name not in ("nc_matmul_mx", "quantize_mx"):
        return
    if not checker.hw.mx_formats:
        checker.report("NKI-MX-TARGET", node, f"nisa.{name} on {checker.target} ({checker.hw.core}): 'Available only "
                       "on NeuronCore-v4 and newer'")
    if name == "nc_matmul_mx":
        _check_matmul(checker, node)
    else:
        _check_quantize(checker, node)


def _check_matmul(checker: Any, call: ast.Call) -> None:
    for role, position in (("stationary", 1), ("moving", 2)):
        buf = _operand(checker, call, role, position)
        if buf is not None and buf.dtype is not None and buf.dtype not in X4_DTYPES:
            checker.report("NKI-MX-MATMUL-TILE", call, f"nc_matmul_mx {role} dtype {buf.dtype} is not an MX _x4 type")
        if buf is not None and buf.buffer != "sbuf":
            checker.report("NKI-MX-MATMUL-TILE", call, f"nc_matmul_mx {role} is in {buf.buffer.upper()}, not SBUF")
    dst = _operand(checker, call, "dst", 0)
    if dst is not None and dst.buffer != "psum":
        checker.report("NKI-MX-MATMUL-TILE", call, f"nc_matmul_mx dst is in {dst.buffer.upper()}, not PSUM")
    size, position = kwarg(call, "tile_size", 5), kwarg(call, "tile_position", 6)
    columns = const_int(size.elts[1]) if isinstance(size, ast.Tuple) and len(size.elts) == 2 else None
    start = const_int(position.elts[1]) if isinstance(position, ast.Tuple) and len(position.elts) == 2 else None
    if (columns is not None and columns != checker.hw.gemm_stationary_fmax) or (start is not None and start != 0):
        checker.report("NKI-MX-MATMUL-TILE", call, "nc_matmul_mx in a column tile: it supports only row tiling "
                       "(tile_size column size 128, tile_position column 0)")
    for role, position in (("stationary_scale", 3), ("moving_scale", 4)):
        _check_scale(checker, call, _operand(checker, call, role, position), role)


def _check_quantize(checker: Any, call: ast.Call) -> None:
    src, dst = _operand(checker, call, "src", 1), _operand(checker, call, "dst", 0)
    if src is not None and src.dtype is not None and src.dtype not in ("bfloat16", "float16"):
        checker.report("NKI-MX-QUANTIZE-TILE", call, f"quantize_mx src dtype {src.dtype} (bf16/fp16 only)")
    if dst is not None and dst.dtype is not None and (dst.dtype not in X4_DTYPES or not X4_DTYPES[dst.dtype].on_chip):
        checker.report("NKI-MX-QUANTIZE-TILE", call, f"quantize_mx dst dtype {dst.dtype} (float8_e5m2_x4 or "
                       "float8_e4m3fn_x4 only: no FP4 output)")
    _check_scale(checker, call, _operand(checker, call, "dst_scale", 2), "dst_scale")


def _check_scale(checker: Any, call: ast.Call, buf: Any, role: str) -> None:
    if buf is None or buf.dtype is None:
        return
    if buf.dtype not in SCALE_DTYPES:
        checker.report("NKI-MX-SCALE-LAYOUT", call, f"an MX {role} of dtype {buf.dtype} (uint8 or float8_e8m0fnu)")
    elif buf.dtype == "float8_e8m0fnu":
        checker.report("NKI-MX-SCALE-DTYPE", call, f"an MX {role} of float8_e8m0fnu before the releases that take "
                       "it: uint8 there")
