"""``nc_matmul``'s FP8 checks in the interpreter: ``nisa.matmul_perf_mode`` and the checks of a double-row
matmul (rules NKI-MATMUL-DOUBLE-ROW and NKI-MATMUL-TILE of verification/rules.py; docs/quantization.md), and the FP8
formats
a target's matmul takes (rules NKI-MATMUL-E4M3FN, NKI-FP8-E4M3-MODE)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import KernelLimitError, UnsupportedAPIError
from ..ir.fp8 import E4M3_MODE_RULE, E4M3FN_RULE, FP8_FORMATS
from .modules import StandInModule
from .ops import TILE_RULE, tensor_arg

if TYPE_CHECKING:
    from .machine import Machine

#: ``nisa.matmul_perf_mode``: ``none`` and ``double_row`` (NKI API reference, nki.isa.matmul_perf_mode).
MATMUL_PERF_MODE = StandInModule("nki.isa.matmul_perf_mode", {"none": "none", "double_row": "double_row"})
PERF_NONE = "none"
#: The rule ids of the double-row checks (verification/rules.py).
DOUBLE_ROW_RULE = "NKI-MATMUL-DOUBLE-ROW"
DOUBLE_ROW_TILE_RULE = TILE_RULE  # "column tiles are not combined with perf_mode double_row"


def check_fp8_formats(m: Machine, stationary: Any, moving: Any, what: str) -> None:
    """Rule NKI-MATMUL-E4M3FN: FP8 operands in formats the target's nc_matmul takes (float8_e4m3fn from
    NeuronCore-v4 on); rule NKI-FP8-E4M3-MODE: never float8_e4m3 with float8_e4m3fn in one matmul."""
    names = []
    for name, value in (("stationary", stationary), ("moving", moving)):
        operand = tensor_arg(value, f"{what} {name}")
        dtype = operand.dtype.name
        if dtype in FP8_FORMATS and dtype not in m.target.fp8_formats:
            raise KernelLimitError(f"{E4M3FN_RULE}: {what} {name} is {dtype} ({operand.describe()}); nc_matmul on "
                                   f"{m.target.name} ({m.target.core}) takes {', '.join(m.target.fp8_formats)} "
                                   "(float8_e4m3fn from NeuronCore-v4 on)")
        names.append(dtype)
    if {"float8_e4m3", "float8_e4m3fn"} <= set(names):
        raise KernelLimitError(f"{E4M3_MODE_RULE}: {what} mixes float8_e4m3 and float8_e4m3fn operands: legacy "
                               "e4m3 and OCP e4m3fn cannot be mixed in the same matmul")


def check_perf_mode(m: Machine, perf_mode: Any, stationary: Any, moving: Any,
                    tile: tuple[int, int, int, int] | None, what: str) -> None:
    """Rules NKI-MATMUL-DOUBLE-ROW (a target that documents it, FP8 operands) and NKI-MATMUL-TILE (not
    with column tiling); counts a double-row matmul."""
    if perf_mode in (None, PERF_NONE):
        return
    if perf_mode != "double_row":
        raise UnsupportedAPIError(f"{what}: perf_mode={perf_mode!r}; the subset knows nisa.matmul_perf_mode.none and "
                                  ".double_row")
    t = m.target
    if "double_row" not in t.matmul_perf_modes:
        raise KernelLimitError(f"{DOUBLE_ROW_RULE}: {what} perf_mode=double_row on {t.name} ({t.core}), which has no "
                               "performance mode (NeuronCore-v3 and v4 only)")
    for name, value in (("stationary", stationary), ("moving", moving)):
        operand = tensor_arg(value, f"{what} {name}")
        if operand.dtype.itemsize != 1:
            raise KernelLimitError(f"{DOUBLE_ROW_RULE}: {what} perf_mode=double_row packs FP8 element pairs; {name} "
                                   f"is {operand.dtype.name} ({operand.describe()})")
    if tile is not None and tile[3] < t.gemm_stationary_fmax:
        raise KernelLimitError(f"{DOUBLE_ROW_TILE_RULE}: {what} perf_mode=double_row in a PE column tile of {tile[3]} "
                               "columns: double_row cannot be combined with column tiling")
    m.counters.double_row_matmuls += 1
