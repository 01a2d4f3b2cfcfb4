"""Scale units of MX tiles (rule NMMC-MX-SCALE-PAIR, verification/rules.py; docs/mx.md, "Verification").

The FP8 check (:mod:`.scale_units`) follows each scale as a unit through the kernel. An MX tile's scales vary along
the contraction, so the unit is per MX *tensor*: the scales of an MX weight input ``w`` are the unit ``w_scale`` (its
elements, ``w / scale``, carry ``w_scale^-1``; the argument ``w_scale`` carries ``w_scale^+1``), and each
``nisa.quantize_mx`` makes a unit of its own, named after its scale tile's allocation: it reads a value in the graph's
own units and writes its elements with ``^-1``, its scales with ``^+1``. ``nisa.nc_matmul_mx`` dequantizes each operand
with the scale tile it is given, so each operand's elements and scales must cancel (the scales of the tensor the
elements were quantized with, once); its product then carries no scale. A scale tile given to the wrong operand (the
weight's scales applied to the activation: the weight's scale twice, the activation's never) fails here, naming both.
"""

from __future__ import annotations

from typing import Any

from ..errors import KernelLimitError
from .scale_units import MASK, ScaleUnits, _add, _weight, set_units, units_of
from .tensor import Tensor

__all__ = ["PAIR_RULE", "matmul_mx", "quantize_mx"]

PAIR_RULE = "NMMC-MX-SCALE-PAIR"


def _unit(units: ScaleUnits, name: str) -> int:
    """The weight of the unit ``name``, registered on first use (an on-chip quantization's)."""
    if name not in units.weights:
        units.weights[name] = _weight(name)
        units.quantized.add((-units.weights[name]) & MASK)
    return units.weights[name]


def quantize_mx(units: ScaleUnits, dst: Tensor, dst_scale: Tensor, src: Tensor, what: str) -> None:
    """``quantize_mx``: ``src`` in the graph's own units; ``dst`` ^-1 and ``dst_scale`` ^+1 of a new unit."""
    units._scalar_free(units_of(src), f"{what} quantizes {src.describe()}, scaled by {{}}; quantize_mx reads values in "
                                      "the graph's own units")
    w = _unit(units, f"quantize_mx:{dst_scale.alloc.name}")
    set_units(dst, (-w) & MASK)
    set_units(dst_scale, w)


def _operand(units: ScaleUnits, data: Tensor, scale: Any, role: str, what: str) -> None:
    u_data, u_scale = units_of(data), units_of(scale)
    for u in (u_data, u_scale):
        if not isinstance(u, int):
            raise KernelLimitError(f"{PAIR_RULE}: {what} {role}: its elements carry different scale units (an MX "
                                   "operand is one quantized tensor's elements, with that tensor's scales)")
    total = _add(u_data, u_scale)
    if total != 0:
        text = units.describe(total)
        raise KernelLimitError(f"{PAIR_RULE}: {what} dequantizes {role} {data.describe()} with scales that are not its "
                               f"own: the product is scaled by {text} ({units.describe(u_data)} elements, "
                               f"{units.describe(u_scale)} scales); each MX operand is dequantized by its own scales, "
                               "once")


def matmul_mx(units: ScaleUnits, dst: Tensor, stationary: Tensor, moving: Tensor, stationary_scale: Any,
              moving_scale: Any, *, accumulates: bool, what: str) -> None:
    """``nc_matmul_mx``: each operand's elements and scales cancel; the product carries no scale."""
    _operand(units, stationary, stationary_scale, "stationary", what)
    _operand(units, moving, moving_scale, "moving", what)
    result: Any = 0
    if accumulates:
        result = units._match(units_of(dst), 0, f"{what} accumulating into {dst.describe()}")
    set_units(dst, result)
